"""Which security mechanism a tcp listener uses (``NULL`` or ``CURVE``), read from the
greeting ZeroMQ's protocol (ZMTP 3) opens every connection with: the one thing a client
whose handshake was closed with no detail needs to know to tell a refusal from a
listener that stopped (``TcpNode``).

A greeting is 64 bytes: a 10-byte signature, the version (3.1), the mechanism's name in
20 bytes, whether the end is the server, and filler. Each end sends its signature, then
its version once it read the other's signature, then the rest once it read the other's
version; an end compares the mechanisms once it read the whole greeting of the other,
and on a mismatch closes at once, without sending what it had not sent yet.

The race it guards against is that last step: a listener that reads a client's version
and mechanism in one piece (not scheduled in between, as on a loaded machine) closes
before it sent its mechanism, and the client sees no mismatch. So the probe here offers
the mechanism the client does *not* use: a listener using that one answers the whole
greeting, whatever the order, and its answer names its mechanism; a listener using the
client's own mechanism, or one stopping, may close first, which tells only that it is
not a mismatch to report. The probe closes before any command, so the listener counts
an opened and closed connection, nothing else.

``nothing_listens`` is the plainest probe: a connect the host refuses at once means no
listener at that port (its node was killed or stopped), where ZeroMQ's own connect would
retry in silence until its timeout.
"""

from __future__ import annotations

import socket

__all__ = ["MECHANISM_CURVE", "MECHANISM_NULL", "listener_mechanism", "nothing_listens"]

MECHANISM_NULL = b"NULL"
MECHANISM_CURVE = b"CURVE"
SIGNATURE = b"\xff" + bytes(7) + b"\x01\x7f"  # padding, and a routing id of 0 bytes + 1
VERSION = b"\x03\x01"
GREETING_BYTES = 64
MECHANISM_AT = len(SIGNATURE) + len(VERSION)
MECHANISM_BYTES = 20


def listener_mechanism(endpoint: str, ours: bytes, timeout_s: float) -> bytes | None:
    """The mechanism the listener at ``endpoint`` (``tcp://host:port``) names in its
    greeting, offered the other one than ``ours``; None when it closed first or did not
    answer within ``timeout_s`` (it uses ``ours``, or it is away)."""
    offered = MECHANISM_NULL if ours == MECHANISM_CURVE else MECHANISM_CURVE
    greeting = SIGNATURE + VERSION + offered.ljust(MECHANISM_BYTES, b"\0")
    greeting = greeting.ljust(GREETING_BYTES, b"\0")  # as a client; filler
    try:
        with socket.create_connection(_address(endpoint), timeout=timeout_s) as probe:
            probe.sendall(greeting)
            answer = b""
            while len(answer) < GREETING_BYTES:
                chunk = probe.recv(GREETING_BYTES - len(answer))
                if not chunk:
                    return None
                answer += chunk
    except (OSError, ValueError):
        return None
    return answer[MECHANISM_AT : MECHANISM_AT + MECHANISM_BYTES].rstrip(b"\0")


def nothing_listens(endpoint: str, timeout_s: float) -> bool:
    """Whether the host of ``endpoint`` refuses a connection to its port: no listener is
    there. False when one accepts, or when the host does not answer within ``timeout_s``
    (it may be slow or unreachable: not told apart from a listener here)."""
    try:
        with socket.create_connection(_address(endpoint), timeout=timeout_s):
            return False
    except ConnectionRefusedError:
        return True
    except (OSError, ValueError):
        return False


def _address(endpoint: str) -> tuple[str, int]:
    """``tcp://host:port`` (``[::1]:port`` for IPv6) as a socket address."""
    host, _, port = endpoint.removeprefix("tcp://").rpartition(":")
    return host.strip("[]"), int(port)

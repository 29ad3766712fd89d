"""What a producer or consumer imports: ``connect`` and the ``Connection`` it returns, the
two transports a connection talks through (``ipc_node`` for a node on this machine,
``tcp_node`` for one across the network), CURVE keys, and the Spark data source (``spark``,
which needs the ``spark`` extra and is imported only when asked for).

Nothing here imports the queue engine or the broker's processes: a client process loads the
wire vocabulary (``warren.queues.protocol``) and these modules only.
"""

from __future__ import annotations

import os
from typing import Any

from warren.actors.errors import InvalidSpec

from .connection import Connection
from .ipc_node import RemoteNode
from .tcp_node import TcpNode

__all__ = ["Connection", "connect"]


def connect(
    target: str | os.PathLike[str],
    *,
    key_file: str | os.PathLike[str] | None = None,
    **options: Any,
) -> Connection:
    """A connection to a node: ``"tcp://host:5673"`` reaches one listening there (with
    ``key_file``, a key from ``warren keys``, when it wants CURVE); a directory names the
    node running on that data directory on this machine (in the node's own process, use
    ``node.connect()``). ``NodeNotRunning`` when none answers. ``options`` go to
    ``Connection`` (``max_in_flight``, ``call_timeout_s`` ...), but ``connect_timeout_s``
    (10), how long a tcp connect waits for the listener's first answer."""
    if isinstance(target, str) and target.startswith("tcp://"):
        _check_tcp_address(target)
        node = TcpNode(
            target,
            key_file=key_file,
            **{k: options.pop(k) for k in ("connect_timeout_s",) if k in options},
        )
        return Connection(node, on_close=node.close, **options)
    if key_file is not None:
        raise ValueError(
            "key_file is for a tcp:// address; a node on this machine is "
            "reached through its data directory without one"
        )
    return Connection(RemoteNode(target), **options)


def _check_tcp_address(target: str) -> None:
    """``tcp://HOST:PORT`` with a port in 1..65535 (``[::1]:PORT`` for IPv6), or
    ``InvalidSpec`` saying so: ZeroMQ's own refusal is a bare "Invalid argument"."""
    host, _, port = target.removeprefix("tcp://").rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidSpec("address", target, "tcp://HOST:PORT, with a port in 1..65535")

"""What a producer or consumer imports: ``connect`` and the ``Connection`` it returns, the
two transports a connection talks through (``ipc_node`` for a node on this machine,
``tcp_node`` for one across the network), CURVE keys, and the Spark data source (``spark``,
which needs the ``spark`` extra and is imported only when asked for).

Nothing here imports the queue engine or the broker's processes: a client process loads the
wire vocabulary (``warren.queues.protocol``) and these modules only.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from typing import Any

from warren.actors.errors import InvalidSpec

from ..errors import InvalidArgument, NodeNotRunning
from .connection import Connection
from .consuming import check_timeout
from .ipc_node import CONNECT_TIMEOUT_MS, RemoteNode
from .keys import ClientKey
from .tcp_node import CONNECT_TIMEOUT_S, TcpNode

__all__ = ["Connection", "connect"]

WAIT_POLL_S = 0.2  # how often connect(wait=...) tries a node that is not running yet
CLUSTER_CONNECT_TIMEOUT_S = 2.0  # how long each node of a cluster is given to answer


def connect(
    target: str | os.PathLike[str] | list[str] | tuple[str, ...],
    *,
    key_file: str | os.PathLike[str] | None = None,
    key: ClientKey | None = None,
    wait: float = 0.0,
    **options: Any,
) -> Connection:
    """A connection to a node: ``"tcp://host:5673"`` reaches one listening there (with
    ``key_file``, a key from ``warren keys``, when it wants CURVE, or ``key``, the same
    read by ``warren.queues.client.keys.parse_client_key``); a directory names the
    node running on that data directory on this machine (in the node's own process, use
    ``node.connect()``); a list of ``tcp://`` addresses names the nodes of a cluster, and
    the connection is made to the one that serves (its leader: a follower refuses,
    ``NotLeader``), and made again to whichever leads after a failover (each address is
    given ``connect_timeout_s``, 2 s by default there, before the next is tried).
    ``NodeNotRunning`` when none answers. ``options`` go to
    ``Connection`` (``max_in_flight``, ``call_timeout_s`` ...), but ``connect_timeout_s``
    (10), how long a tcp connect waits for the listener's first answer. ``wait``: for up
    to this many seconds, a node that is not running (yet: starting, recovering, being
    restarted) is waited for, and the connection made as soon as it serves.

    The connection recovers by itself when the node goes away (``recover=True``, the
    default; see ``warren.queues.client.recovery`` and docs/broker.md): it connects
    again, declares again what it declared, sends again the publishes in doubt and
    subscribes its consumers again. ``recovery_interval_s``, ``recovery_timeout_s``,
    ``on_disconnect`` and ``on_recovery`` go to ``Connection``. With ``recover=False``
    the loss of the node closes it with ``ConnectionClosed``."""
    deadline = time.monotonic() + wait
    while True:
        try:
            return _connect(target, key_file=key_file, key=key, options=dict(options))
        except NodeNotRunning:
            if time.monotonic() >= deadline:
                raise
            time.sleep(WAIT_POLL_S)


def _connect(
    target: str | os.PathLike[str] | list[str] | tuple[str, ...],
    *,
    key_file: str | os.PathLike[str] | None,
    key: ClientKey | None,
    options: dict[str, Any],
) -> Connection:
    if isinstance(target, (list, tuple)):
        return _connect_cluster(list(target), key_file=key_file, key=key, options=options)
    if isinstance(target, str) and target.startswith("tcp://"):
        _check_tcp_address(target)
        endpoint = target
        connect_timeout_s = options.pop("connect_timeout_s", CONNECT_TIMEOUT_S)
        check_timeout(connect_timeout_s, "connect_timeout_s")

        def reconnect_tcp(timeout_s: float = math.inf) -> TcpNode:
            return TcpNode(
                endpoint,
                key_file=key_file,
                key=key,
                connect_timeout_s=min(connect_timeout_s, timeout_s),
            )

        return _over_tcp(reconnect_tcp, options)
    if key_file is not None or key is not None:
        raise InvalidArgument(
            f"{'key_file' if key_file is not None else 'key'} is for a tcp:// address; a "
            f"node on this machine is reached through its data directory without one"
        )
    data_dir = target

    def reconnect_ipc(timeout_s: float = math.inf) -> RemoteNode:
        return RemoteNode(data_dir, connect_timeout_s=min(CONNECT_TIMEOUT_MS / 1000, timeout_s))

    return Connection(reconnect_ipc(), reconnect=reconnect_ipc, **options)


def _connect_cluster(
    endpoints: list[str],
    *,
    key_file: str | os.PathLike[str] | None,
    key: ClientKey | None,
    options: dict[str, Any],
) -> Connection:
    """A connection to whichever of ``endpoints`` serves, tried in turn, the one that
    served last first (see ``connect``)."""
    if not endpoints:
        raise InvalidSpec("target", endpoints, "name at least one node: tcp://HOST:PORT")
    for endpoint in endpoints:
        if not isinstance(endpoint, str) or not endpoint.startswith("tcp://"):
            raise InvalidSpec("target", endpoint, "a cluster's nodes are tcp://HOST:PORT")
        _check_tcp_address(endpoint)
    connect_timeout_s = options.pop("connect_timeout_s", CLUSTER_CONNECT_TIMEOUT_S)
    check_timeout(connect_timeout_s, "connect_timeout_s")
    order = list(dict.fromkeys(endpoints))

    def reconnect_cluster(timeout_s: float = math.inf) -> TcpNode:
        refusals = []
        for endpoint in list(order):
            try:
                node = TcpNode(
                    endpoint,
                    key_file=key_file,
                    key=key,
                    connect_timeout_s=min(connect_timeout_s, timeout_s),
                )
            except NodeNotRunning as exc:  # a follower (NotLeader), a node down or starting
                refusals.append(f"{endpoint}: {exc}")
                continue
            order.remove(endpoint)
            order.insert(0, endpoint)
            return node
        raise NodeNotRunning("no node of the cluster serves: " + "; ".join(refusals))

    return _over_tcp(reconnect_cluster, options)


def _over_tcp(reconnect: Callable[..., TcpNode], options: dict[str, Any]) -> Connection:
    """A connection over the transport ``reconnect()`` opens, which it opens again to
    recover."""
    node = reconnect()
    try:
        return Connection(node, on_close=node.close, reconnect=reconnect, **options)
    except BaseException:  # a bad option: the transport just opened is closed
        node.close()
        raise


def _check_tcp_address(target: str) -> None:
    """``tcp://HOST:PORT`` with a port in 1..65535 (``[::1]:PORT`` for IPv6), or
    ``InvalidSpec`` saying so: ZeroMQ's own refusal is a bare "Invalid argument"."""
    host, _, port = target.removeprefix("tcp://").rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidSpec("address", target, "tcp://HOST:PORT, with a port in 1..65535")

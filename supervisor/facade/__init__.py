"""Warren: RabbitMQ's message persistence layer as Erlang-style actors in Python.

This is the ``warren`` package itself: the entry points most programs need, importable
from the top (``from warren import Node``). The parts live in its subpackages:

- ``warren.actors``: the actor runtime (process actors over ZeroMQ, refs, monitors);
- ``warren.supervisor``: supervision trees, resource alarms and the broker ``Node``;
- ``warren.store``: the shared message store, its actors and ``StoreClient``;
- ``warren.queues``: the queues, and ``connect``'s ``Connection``.

The repository keeps one top-level folder per part; ``setup.py`` installs this folder
as the ``warren`` package and each part beneath it, so Warren claims one top-level
import name only.
"""

import os
from typing import Any

from warren.queues.client.connection import Connection
from warren.queues.client.ipc_node import RemoteNode
from warren.queues.client.tcp_node import TcpNode
from warren.queues.message import Message
from warren.store.client import StoreClient, StoreRestarted
from warren.supervisor.node.alarms import AlarmLimits
from warren.supervisor.node.node import Node

__all__ = [
    "AlarmLimits",
    "Connection",
    "Message",
    "Node",
    "StoreClient",
    "StoreRestarted",
    "connect",
]


def connect(
    target: str | os.PathLike, *, key_file: str | os.PathLike | None = None, **options: Any
) -> Connection:
    """A connection to a node: ``"tcp://host:5673"`` reaches one listening there (with
    ``key_file``, a key from ``warren keys``, when it wants CURVE); a directory names the
    node running on that data directory on this machine (in the node's own process, use
    ``node.connect()``). ``NodeNotRunning`` when none answers. ``options`` go to
    ``Connection`` (``max_in_flight``, ``call_timeout_s`` ...), but ``connect_timeout_s``
    (10), how long a tcp connect waits for the listener's first answer."""
    if isinstance(target, str) and target.startswith("tcp://"):
        node = TcpNode(
            target,
            key_file=key_file,
            **{k: options.pop(k) for k in ("connect_timeout_s",) if k in options},
        )
        return Connection(node, **options)
    if key_file is not None:
        raise ValueError(
            "key_file is for a tcp:// address; a node on this machine is "
            "reached through its data directory without one"
        )
    return Connection(RemoteNode(target), **options)

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

from warren.queues.connection import Connection
from warren.queues.message import Message
from warren.queues.remote_node import RemoteNode
from warren.store.client import StoreClient, StoreRestarted
from warren.supervisor.alarms import AlarmLimits
from warren.supervisor.node import Node

__all__ = ["AlarmLimits", "Connection", "Message", "Node", "StoreClient", "StoreRestarted",
           "connect"]


def connect(data_dir: str | os.PathLike) -> Connection:
    """A connection to the node running on ``data_dir`` on this machine (in this process,
    use ``node.connect()``); ``NodeNotRunning`` when none answers there."""
    return Connection(RemoteNode(data_dir))

"""Warren: RabbitMQ's message persistence layer as Erlang-style actors in Python.

This is the ``warren`` package itself: the entry points most programs need, importable
from the top (``from warren import Node``). The parts live in its subpackages:

- ``warren.actors``: the actor runtime (process actors over ZeroMQ, refs, monitors);
- ``warren.supervisor``: supervision trees, resource alarms and the broker ``Node``;
- ``warren.store``: the shared message store, its actors and ``StoreClient``;
- ``warren.queues``: the queues.

The repository keeps one top-level folder per part; ``setup.py`` installs this folder
as the ``warren`` package and each part beneath it, so Warren claims one top-level
import name only.
"""

from warren.store.client import StoreClient, StoreRestarted
from warren.supervisor.alarms import AlarmLimits
from warren.supervisor.node import Node

__all__ = ["AlarmLimits", "Node", "StoreClient", "StoreRestarted"]

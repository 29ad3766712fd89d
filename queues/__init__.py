"""Queues: each queue's index, its own store for small messages, and the variable queue
that moves messages between RAM and disk (alpha, beta, gamma, delta).

``VariableQueue`` is the engine a queue process (``warren.queues.broker.queue_actor``)
wraps (``warren.queues.engine.variable_queue`` has the design); ``QueueIndex`` and
``QueueStore`` are its files; ``walk_ref_counts`` gives the persistent store the reference
counts its dirty recovery needs. ``warren.queues.client.connection`` is the client API
(``warren.connect``, ``Node.connect``); ``warren.queues.broker.listener`` and
``warren.queues.client.tcp_node`` carry it over tcp, ``warren.queues.broker.dedup``
deduplicates producers, ``warren.queues.client.spark`` is the Spark data source (it
imports pyspark: the ``spark`` extra).
"""

from typing import TYPE_CHECKING

from warren.actors.lazy import lazy_face

if TYPE_CHECKING:  # what the names are, for type checkers and editors
    from .client import connect
    from .client.connection import Connection
    from .engine.queue_index import Entry, QueueIndex
    from .engine.queue_store import QueueStore
    from .engine.ref_counts import QueueRefCounts, node_ref_counts, walk_ref_counts
    from .engine.variable_queue import Delivery, MessageInfo, SharedStoreClient, VariableQueue
    from .errors import (
        AccessRefused,
        Blocked,
        ConnectionClosed,
        CorruptMessage,
        InvalidMessage,
        KeyFileError,
        MessageTooLarge,
        Nacked,
        NodeNotRunning,
        NotFound,
        OutOfSequence,
        PreconditionFailed,
        QueueClosed,
        QueueDown,
        QueueError,
        QueueLocked,
        UnknownDeliveryTag,
        Unroutable,
        WarrenWriteError,
    )
    from .message import Message, decode, encode


_EXPORTS = {
    "Blocked": ".errors",
    "connect": ".client",
    "Connection": ".client.connection",
    "ConnectionClosed": ".errors",
    "CorruptMessage": ".errors",
    "decode": ".message",
    "Delivery": ".engine.variable_queue",
    "encode": ".message",
    "Entry": ".engine.queue_index",
    "InvalidMessage": ".errors",
    "KeyFileError": ".errors",
    "Message": ".message",
    "MessageInfo": ".engine.variable_queue",
    "MessageTooLarge": ".errors",
    "Nacked": ".errors",
    "node_ref_counts": ".engine.ref_counts",
    "AccessRefused": ".errors",
    "NodeNotRunning": ".errors",
    "NotFound": ".errors",
    "OutOfSequence": ".errors",
    "PreconditionFailed": ".errors",
    "QueueClosed": ".errors",
    "QueueDown": ".errors",
    "QueueError": ".errors",
    "QueueIndex": ".engine.queue_index",
    "QueueLocked": ".errors",
    "QueueRefCounts": ".engine.ref_counts",
    "QueueStore": ".engine.queue_store",
    "SharedStoreClient": ".engine.variable_queue",
    "UnknownDeliveryTag": ".errors",
    "Unroutable": ".errors",
    "VariableQueue": ".engine.variable_queue",
    "walk_ref_counts": ".engine.ref_counts",
    "WarrenWriteError": ".errors",
}
__getattr__, __dir__ = lazy_face(__name__, _EXPORTS)
del lazy_face, TYPE_CHECKING
__all__ = sorted(_EXPORTS)

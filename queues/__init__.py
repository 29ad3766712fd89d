"""Queues: each queue's index, its own store for small messages, and the variable queue
that moves messages between RAM and disk (alpha, beta, gamma, delta).

``VariableQueue`` is the engine a queue process (``warren.queues.broker.queue_actor``) wraps (``warren.queues.engine.variable_queue``
has the design); ``QueueIndex`` and ``QueueStore`` are its files; ``walk_ref_counts``
gives the persistent store the reference counts its dirty recovery needs.
``warren.queues.client.connection`` is the client API (``warren.connect``, ``Node.connect``);
``warren.queues.broker.listener`` and ``warren.queues.client.tcp_node`` carry it over tcp,
``warren.queues.broker.dedup`` deduplicates producers, ``warren.queues.client.spark`` is the Spark data
source (it imports pyspark: the ``spark`` extra).
"""

from .engine.queue_index import Entry, QueueIndex
from .engine.queue_store import QueueStore
from .engine.ref_counts import QueueRefCounts, node_ref_counts, walk_ref_counts
from .engine.variable_queue import Delivery, MessageInfo, SharedStoreClient, VariableQueue
from .errors import (
    Blocked,
    ConnectionClosed,
    CorruptMessage,
    InvalidMessage,
    MessageTooLarge,
    Nacked,
    NotFound,
    OutOfSequence,
    PreconditionFailed,
    QueueClosed,
    QueueDown,
    QueueError,
    QueueLocked,
    UnknownDeliveryTag,
    Unroutable,
)
from .message import Message, decode, encode

__all__ = [
    "Blocked",
    "ConnectionClosed",
    "CorruptMessage",
    "Delivery",
    "Entry",
    "InvalidMessage",
    "Message",
    "MessageInfo",
    "MessageTooLarge",
    "Nacked",
    "NotFound",
    "OutOfSequence",
    "PreconditionFailed",
    "QueueClosed",
    "QueueDown",
    "QueueError",
    "QueueIndex",
    "QueueLocked",
    "QueueRefCounts",
    "QueueStore",
    "SharedStoreClient",
    "UnknownDeliveryTag",
    "Unroutable",
    "VariableQueue",
    "decode",
    "encode",
    "node_ref_counts",
    "walk_ref_counts",
]

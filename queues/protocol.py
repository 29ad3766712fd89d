"""The messages between a queue's clients (``warren.queues.client.connection``) and its process
(``warren.queues.broker.queue_actor``).

Every message is a frozen dataclass registered with the actor runtime's codec; a list of
encoded messages travels as one msgpack frame (bodies of 64 KiB or more as frames of
their own). ``consumer`` names a connection: the deliveries a connection holds unacked are
its own, and go back to the queue when it closes or its process dies.

    Publish(payloads, persistent, msg_ids, expiration_ms, producer, sequence)
                                       ask → the number taken, answered once every one
                                       of them is confirmed (DESIGN §5); fewer than sent
                                       when the queue is full (overflow reject-publish:
                                       the last ones are refused); ``expiration_ms`` is the
                                       messages' TTL;
                                       ``msg_ids`` (16 bytes each, or None) name the messages
                                       in the shared store: one id for a message routed to
                                       several queues, written there once;
                                       ``producer`` and ``sequence`` (the first message's;
                                       the others follow one by one) deduplicate: a repeat
                                       is confirmed, counted as taken, and not enqueued
                                       (``warren.queues.broker.dedup``)
    Fetch(consumer, pid, count, ack_required)
                                       ask → list[Delivered] (up to ``count``; [] when empty)
    Settle(consumer, tags, action)     tell (or ask → the tags ignored); action "ack",
                                       "requeue" or "reject" (reject: drop); a tag the
                                       consumer does not hold is ignored and counted
    Subscribe(consumer, pid, active)   tell: a consumer of the connection starts (active)
                                       or stops; an auto-delete queue goes when its last
                                       one stops
    Release(consumer)                  tell: requeue what the consumer holds and end its
                                       subscriptions (it closed)
    Purge()                            ask → the number of messages purged
    QueueStats()                       ask → dict
    DeleteQueue()                      ask → the number of messages deleted; the queue then
                                       refuses everything until its process is stopped
"""

from __future__ import annotations

from dataclasses import dataclass

from warren.actors import message

SETTLE_ACTIONS = ("ack", "requeue", "reject")
MAX_PRODUCER_BYTES = 1024  # a deduplicating producer's id
MAX_SEQUENCE = 2**63 - 1  # a producer's sequence numbers: a signed 64-bit int


@message
@dataclass(frozen=True)
class Publish:
    payloads: list[bytes]
    persistent: bool
    msg_ids: list[bytes] | None = None
    expiration_ms: int | None = None
    producer: bytes | None = None
    sequence: int | None = None


@message
@dataclass(frozen=True)
class Fetch:
    consumer: bytes
    pid: int
    count: int
    ack_required: bool


@message
@dataclass(frozen=True)
class Delivered:
    seq_id: int
    payload: bytes
    delivery_count: int


@message
@dataclass(frozen=True)
class Settle:
    consumer: bytes
    tags: list[int]
    action: str


@message
@dataclass(frozen=True)
class Subscribe:
    consumer: bytes
    pid: int
    active: bool


@message
@dataclass(frozen=True)
class Release:
    consumer: bytes


@message
@dataclass(frozen=True)
class Purge:
    pass


@message
@dataclass(frozen=True)
class QueueStats:
    pass


@message
@dataclass(frozen=True)
class DeleteQueue:
    pass

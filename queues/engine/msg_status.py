"""The values a ``VariableQueue`` (``warren.queues.engine.variable_queue``) keeps per
message and hands out: ``MsgStatus`` (one message's place in RAM), ``Delta`` (the run of
messages with nothing in RAM), ``RamFigures`` (running totals over the statuses), the
``MessageInfo``, ``Delivery`` and ``Fetched`` it answers with, and ``SharedStoreClient``,
what it needs of a shared store.

``RamFigures`` keeps the queue's byte totals and its gamma count as running figures,
updated where a status enters or leaves one of the queue's deques (q1 to q4) or its
pending-ack tables, as RabbitMQ's vqstate keeps ``ram_bytes`` and ``unacked_bytes``: a
queue's ``stats()`` (each ``queue_stats`` and each scrape of a busy queue) then costs the
same at any depth, where a walk of every status cost 26 ms at 100,000 messages. The
figures cover what they are told of and nothing more, so the queue tells them of every
move, and of a flag (``body_on_disk``, ``index_on_disk``) only while the status is out
of its deques and tables: a flag changed in place would leave them wrong.

Regions. A status is "in RAM" in q1, q4 and the pending acks whose body is in RAM (its
payload is set; its body may be on disk as well), "paged" in q2, q3 and the pending acks
paged out (its body is on disk only); gammas are the paged statuses of q2 and q3 whose
index entry is on disk too.
"""

from __future__ import annotations

import collections
from bisect import insort
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from warren.store import Settlement

from ..errors import MessageTooLarge
from ..message import Message
from .queue_index import Entry

__all__ = [
    "Delivery",
    "Delta",
    "Fetched",
    "MessageInfo",
    "MsgStatus",
    "RamFigures",
    "SharedStoreClient",
    "merge_in_order",
]


class SharedStoreClient(Protocol):
    """What the queue needs of a shared store: ``LocalStoreClient`` and ``StoreClient``."""

    client_ref: bytes

    @property
    def recovered_clean(self) -> bool: ...  # the store it registered with stopped clean
    @property
    def store_start(self) -> str: ...  # that store's start token

    def write(self, msg_id: bytes, body: bytes) -> int: ...
    def remove(self, msg_ids: Iterable[bytes]) -> None: ...
    def read_many(self, msg_ids: list[bytes]) -> list[bytes | None]: ...
    def claim_many(
        self, msg_ids: list[bytes], predecessors: list[bytes], written_since: str | None
    ) -> list[bool]: ...
    def settled(self, wait: bool = True) -> Settlement: ...
    def close(self) -> None: ...
    def delete_and_terminate(self) -> None: ...


@dataclass(frozen=True, slots=True)
class MessageInfo:
    """What is known of a message without reading it (for TTL predicates)."""

    seq_id: int
    expiry_ms: int  # 0: never expires
    size: int
    persistent: bool


@dataclass(frozen=True, slots=True)
class Delivery:
    """A fetched message. ``seq_id`` is its ack tag; ``delivery_count`` counts the
    deliveries before this one (requeues, and crashes that left it unacked)."""

    seq_id: int
    message: Message
    redelivered: bool
    delivery_count: int
    msg_id: bytes


class Fetched(NamedTuple):
    """A fetched message, still encoded."""

    seq_id: int
    payload: bytes
    delivery_count: int
    msg_id: bytes


class MsgStatus:
    """One message's place in RAM: alpha while ``payload`` is set, else beta or gamma."""

    __slots__ = (
        "seq_id",
        "msg_id",
        "payload",
        "size",
        "persistent",
        "expiry_ms",
        "shared",
        "store_offset",
        "body_on_disk",
        "index_on_disk",
        "delivery_count",
    )

    def __init__(
        self,
        seq_id: int,
        msg_id: bytes,
        payload: bytes | None,
        size: int,
        persistent: bool,
        expiry_ms: int,
        shared: bool,
        store_offset: int = 0,
        on_disk: bool = False,
    ) -> None:
        self.seq_id = seq_id
        self.msg_id = msg_id
        self.payload = payload
        self.size = size
        self.persistent = persistent
        self.expiry_ms = expiry_ms
        self.shared = shared
        self.store_offset = store_offset
        self.body_on_disk = self.index_on_disk = on_disk
        self.delivery_count = 0

    @classmethod
    def from_entry(cls, entry: Entry) -> MsgStatus:
        return cls(
            entry.seq_id,
            entry.msg_id,
            None,
            entry.size,
            entry.persistent,
            entry.expiry_ms,
            entry.shared,
            entry.store_offset,
            True,
        )

    def info(self) -> MessageInfo:
        return MessageInfo(self.seq_id, self.expiry_ms, self.size, self.persistent)


class Delta:
    """The messages with nothing in RAM: ``count`` index entries with ``start <= seq id <
    end`` (not every seq id in the range is one: some were acked, some are pending acks)."""

    __slots__ = ("start", "end", "count", "bytes")

    def __init__(self, start: int = 0, end: int = 0, count: int = 0, size: int = 0) -> None:
        self.start, self.end, self.count, self.bytes = start, end, count, size

    def is_empty(self) -> bool:
        return self.start >= self.end

    def add(self, status: MsgStatus) -> None:
        if self.is_empty():
            self.start, self.end = status.seq_id, status.seq_id + 1
        else:
            self.start = min(self.start, status.seq_id)
            self.end = max(self.end, status.seq_id + 1)
        self.count += 1
        self.bytes += status.size

    def add_range(self, start: int, end: int, count: int, size: int) -> None:
        """Add ``count`` messages of ``size`` bytes in all, with seq ids from ``start`` up
        to ``end``, none of them below the range's start."""
        if self.is_empty():
            self.start = start
        self.end = max(self.end, end)
        self.count += count
        self.bytes += size

    def __repr__(self) -> str:
        return f"Delta(start={self.start}, end={self.end}, count={self.count})"


class RamFigures:
    """Running totals over the statuses in RAM (the module docstring's Regions)."""

    __slots__ = ("ram_bytes", "ram_bytes_on_disk", "paged_bytes", "gammas")

    def __init__(self) -> None:
        self.ram_bytes = 0  # bodies in RAM: q1, q4, pending acks in RAM
        self.ram_bytes_on_disk = 0  # of those, the bodies also on disk
        self.paged_bytes = 0  # bodies on disk only: q2, q3, pending acks paged out
        self.gammas = 0  # statuses of q2 and q3 whose index entry is on disk

    def add_in_ram(self, status: MsgStatus) -> None:
        self.ram_bytes += status.size
        if status.body_on_disk:
            self.ram_bytes_on_disk += status.size

    def drop_in_ram(self, status: MsgStatus) -> None:
        self.ram_bytes -= status.size
        if status.body_on_disk:
            self.ram_bytes_on_disk -= status.size

    def add_paged(self, status: MsgStatus, waiting: bool = True) -> None:
        """A paged status joins q2 or q3 (``waiting``), or the pending acks."""
        self.paged_bytes += status.size
        if waiting and status.index_on_disk:
            self.gammas += 1

    def drop_paged(self, status: MsgStatus, waiting: bool = True) -> None:
        self.paged_bytes -= status.size
        if waiting and status.index_on_disk:
            self.gammas -= 1

    def disk_bytes(self, delta: Delta) -> int:
        """Bytes of the bodies on disk, delta's included."""
        return self.ram_bytes_on_disk + self.paged_bytes + delta.bytes


def merge_in_order(queue: collections.deque, status: MsgStatus) -> None:
    """Insert ``status`` into ``queue`` (sorted by seq id); requeues usually go in front."""
    if not queue or status.seq_id < queue[0].seq_id:
        queue.appendleft(status)
    elif status.seq_id > queue[-1].seq_id:
        queue.append(status)
    else:
        items = list(queue)
        insort(items, status, key=lambda s: s.seq_id)
        queue.clear()
        queue.extend(items)


def checked_batch(payloads: list[bytes], msg_ids: list[bytes] | None, limit: int) -> list[int]:
    """The sizes of a batch about to be published to a queue whose messages may encode to
    ``limit`` bytes at most; ``MessageTooLarge`` (for one over it) or ``ValueError`` (ids
    that do not match the bodies) before anything of it is taken."""
    sizes = [len(payload) for payload in payloads]
    if sizes and max(sizes) > limit:
        raise MessageTooLarge(
            f"a message of the batch encodes to {max(sizes)} bytes, above "
            f"this queue's maximum of {limit}; nothing was published"
        )
    if msg_ids is not None and len(msg_ids) != len(payloads):
        raise ValueError(f"{len(msg_ids)} msg_ids for {len(payloads)} messages")
    return sizes

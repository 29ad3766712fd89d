"""``VariableQueue``: one queue's messages, moved between RAM and disk as memory allows
(RabbitMQ's backing queue, in its alpha/beta/gamma/delta design: docs/queue-engine.md).

States. Every message in the queue is in one of four states:

- alpha: its encoded message is in RAM (and maybe on disk too);
- beta: its message is on disk only, its position (``MsgStatus``) in RAM, no index entry;
- gamma: a beta whose index entry is on disk as well;
- delta: nothing in RAM; it is an entry in a run of the index, ``Delta``.

Queues. The messages are held, oldest first, in ``q4 · q3 · delta · q2 · q1``: q4 and q1
hold alphas, q3 and q2 betas and gammas, delta a range of seq ids with a count::

    fetch <- [q4: alphas] [q3: betas, gammas] [delta] [q2: betas, gammas] [q1: alphas] <- publish
                            ^ loaded one segment at a time when q3 drains

A publish goes to q4 while everything else is empty, else to q1; a fetch takes q4's head,
else q3's; when q3 drains, the next segment of delta is read into q3 (as gammas), and
when delta empties q2 joins q3, then q1 moves to q4. A lazy queue publishes straight to
delta (message and index entry written, nothing of it kept in RAM); switching a queue to
lazy pages every message out; switching back lets new messages stay in RAM again.

Paging. The node sets a RAM duration target (seconds; infinity by default, 0 under a
memory alarm). With the ingress and egress rates (``update_rates``, every few seconds) it
gives ``target_ram_count``, the messages (alphas and pending acks) RAM may hold. Each
operation pages at most ``page_batch`` messages: pending acks to disk first, then alphas
to betas (q1's oldest to q2, or to q3 while delta is empty; q4's newest to q3's front);
and once betas exceed the permitted count by ``io_batch_size`` (RabbitMQ's
msg_store_io_batch_size), betas to delta (q2 first, then q3's newest), writing their index
entries. ``reduce_memory_use`` runs one more batch and says whether more is left.

Storage. A message whose encoding (properties plus body) is below ``embed_msgs_below``
goes to the queue's own store (``QueueStore``), a larger one to the shared store:
``msg_store_persistent`` for a persistent message in a durable queue, else
``msg_store_transient``. Both are reached through a store client (``LocalStoreClient`` for
a ``MessageStore`` in this process, ``StoreClient`` for a store actor) with the same calls.
Persistent messages in a durable queue have their message and index entry written on
arrival; transient ones only when paged. Those for the queue's own store, while nothing is
to be paged (the RAM target is infinite), wait in a batch instead, up to ``WRITE_BATCH``:
the next sync, or the next call that reads the store or the index or publishes otherwise,
hands the batch to both in one pass per step (``_write_unwritten``), not message by
message; their statuses already count them as written. A ``publish_many`` of at least
``WRITE_AT_ONCE_BYTES`` (a producer's frame) that the sync follows is written at once
instead, its statuses made after the write (a lazy queue, which keeps none, writes it all
the same).

Confirms. ``sync()`` is the group commit: it fdatasyncs each segment file written since
the last (the index's slots and the queue's own store's records share them), asks the
persistent store client how far its writes are settled (waiting for it, or not), and
returns the seq ids that became confirmed, each once: a persistent message of a durable
queue once its message and its index entry are on disk; any other message at the first
sync after its publish. A batch written at once has the device start on it right away
(``SegmentFiles.start_writeback``), so that its writing overlaps the making of its
statuses and the rest of the queue process's pass, and the sync waits for less: a call
of publish_many of 100 × 1 KiB takes 0.1–0.15 ms less (of about 1.4) than with its
records written just before the fdatasync. Only a caller whose sync comes next asks for
it: frames written one by one while more wait in the mailbox would each start a small
writeback of their own, costing more than the overlap gains.

Recovery. ``terminate()`` writes the recovery terms; the next open starts from them
without reading the index, or scans every segment after a crash (``queue_recovery``).

Races this module guards against (one thread of control; a queue process owns it):

- a crash between a publish and its sync: nothing was confirmed; what reached the disk
  is checked entry by entry at the next open;
- an ack or requeue of a tag twice, or of a tag never fetched: ``UnknownDeliveryTag``
  before anything changes;
- a requeue while the queue pages: a requeued message goes back by seq id into q4, q3 or
  delta, whichever holds its neighbours, so order is kept;
- a pending ack whose seq id lies inside delta's range: skipped when delta is read.
"""

from __future__ import annotations

import collections
import logging
import math
import os
import time
from collections.abc import Callable, Iterable
from itertools import repeat
from typing import Any

from isal.isal_zlib import crc32

from warren.store import replicated_io
from warren.store.disk_faults import slow_sync

from ..errors import CorruptMessage, MessageTooLarge, QueueClosed, UnknownDeliveryTag
from ..message import MAX_MESSAGE_BYTES, Message, decode, encode
from .collector import collect_only_the_young_automatically, collector_is_generational
from .msg_status import (
    Delivery,
    Delta,
    Fetched,
    MessageInfo,
    MsgStatus,
    RamFigures,
    SharedStoreClient,
    checked_batch,
    merge_in_order,
)
from .queue_index import (
    DEFAULT_SEGMENT_ENTRY_COUNT,
    QueueIndex,
    pack_slot,
    pack_slots,
)
from .queue_recovery import recover
from .queue_store import QueueStore
from .recovery_terms import save_terms
from .segments import SegmentFiles

# The values it hands out (``msg_status``) and the collector's settings (``collector``)
# are named here too: callers import them from this module.
__all__ = [
    "Delivery",
    "Fetched",
    "MessageInfo",
    "SharedStoreClient",
    "VariableQueue",
    "collect_only_the_young_automatically",
    "collector_is_generational",
]

log = logging.getLogger("warren.queues")

EMBED_MSGS_BELOW = 4096  # bytes: queue_index_embed_msgs_below
IO_BATCH_SIZE = 4096  # msg_store_io_batch_size: betas to delta
PAGE_BATCH = 8000  # messages paged per operation (2 × credit)
RATE_SMOOTHING = 0.5  # weight of the newest rate sample
RATE_AT_REST = 0.01  # messages a second below which a rate with nothing new is taken as 0
WRITE_BATCH = 1024  # persistent publishes held before they are handed to store and index
WRITE_AT_ONCE_BYTES = 32 * 2**10  # a publish_many of this many bytes is written at once


class VariableQueue:
    """One queue's messages; see the module docstring.

    ``VariableQueue(directory, persistent_store=f, transient_store=g, ...)``: ``f`` and
    ``g`` take a client ref (bytes) and return a store client on ``msg_store_persistent``
    and ``msg_store_transient`` (``lambda ref: LocalStoreClient(store, ref)``, or
    ``lambda ref: StoreClient(store_actor, ref)``). ``shared_store_clean`` says whether
    the persistent store recovered from a clean stop (a dirty one means a full scan here);
    None: as its client says (``recovered_clean``, learnt when it registered).
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        persistent_store: Callable[[bytes], SharedStoreClient],
        transient_store: Callable[[bytes], SharedStoreClient],
        durable: bool = True,
        lazy: bool = False,
        segment_entry_count: int = DEFAULT_SEGMENT_ENTRY_COUNT,
        embed_msgs_below: int = EMBED_MSGS_BELOW,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        io_batch_size: int = IO_BATCH_SIZE,
        page_batch: int = PAGE_BATCH,
        shared_store_clean: bool | None = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        for name, value, low in (
            ("embed_msgs_below", embed_msgs_below, 0),
            ("max_message_bytes", max_message_bytes, 1),
            ("io_batch_size", io_batch_size, 1),
            ("page_batch", page_batch, 1),
        ):
            if type(value) is not int or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        self.directory = os.fspath(directory)
        self.durable = durable
        self.lazy = lazy
        self.embed_msgs_below = embed_msgs_below
        self.max_message_bytes = max_message_bytes
        self.io_batch_size = io_batch_size
        self.page_batch = page_batch
        self._clock = clock
        self._id_prefix = os.urandom(8)
        self._index = QueueIndex(self.directory, segment_entry_count=segment_entry_count)
        self.segment_entry_count = segment_entry_count
        self._store = QueueStore(
            self.directory, self._index.files, segment_entry_count=segment_entry_count
        )
        self._index.records_before_slots(self._store.flush)
        self.q1: collections.deque[MsgStatus] = collections.deque()
        self.q2: collections.deque[MsgStatus] = collections.deque()
        self.delta = Delta()
        self.q3: collections.deque[MsgStatus] = collections.deque()
        self.q4: collections.deque[MsgStatus] = collections.deque()
        self._ram_pending: dict[int, MsgStatus] = {}  # fetched, unacked, payload in RAM
        self._disk_pending: dict[int, MsgStatus] = {}  # fetched, unacked, paged out
        self._figures = RamFigures()  # told of every move in and out of the above
        self._delivery_counts: dict[int, int] = {}  # of requeued messages in delta
        # Persistent messages await the index's fsync: those in this queue's own store
        # alone (``_index_unsynced``), those in the shared store (``_shared_unsynced``)
        # its settlement too (``_unconfirmed``: parts not yet durable, 2 then 1).
        self._unconfirmed: dict[int, int] = {}
        self._index_unsynced: list[int] = []
        self._shared_unsynced: list[int] = []
        self._store_unsettled: collections.deque[tuple[int, int]] = collections.deque()
        self._confirmed: list[int] = []  # due at the next sync
        self._removes_unsent = False  # shared-store removes since it
        # Persistent publishes for this queue's own store not yet handed to the store and
        # the index (``_write_unwritten``), and their statuses unless the queue is lazy.
        self._unwritten_payloads: list[bytes] = []
        self._unwritten_msg_ids: list[bytes] = []
        self._unwritten_expiries: list[int] = []
        self._unwritten_statuses: list[MsgStatus] = []
        self._persistent_count = 0  # in the queue or pending acks
        self._persistent_bytes = 0
        self._target_ram_count: float = math.inf
        self._duration_target: float = math.inf
        self._batching = durable  # persistent publishes wait in a batch: no paging due
        self._rates = {"ingress": 0.0, "egress": 0.0, "ack": 0.0}
        self._since_rates = {"ingress": 0, "egress": 0, "ack": 0}  # ingress: from seq ids
        self._rates_at = clock()
        self._closed = False
        self.counters = {
            "recovered": 0,
            "dropped_transient": 0,
            "dropped_missing": 0,
            "dropped_corrupt": 0,
            "torn_slots": 0,
            "bad_segments": 0,
            "corrupt_on_read": 0,
            "missing_on_read": 0,
            "store_write_failed": 0,
            "delta_lost": 0,
            "written_ahead": 0,  # batches publish_many wrote ahead of their sync
        }
        try:
            self._open(persistent_store, transient_store, shared_store_clean)
        except BaseException:
            self.abandon()
            raise
        self._rates_seq_id = self.next_seq_id  # every publish takes the next seq id

    # ------------------------------------------------------------------ recovery

    def _open(
        self,
        persistent_store: Callable[[bytes], SharedStoreClient],
        transient_store: Callable[[bytes], SharedStoreClient],
        shared_store_clean: bool | None,
    ) -> None:
        recovered = recover(
            self.directory,
            self._index,
            self._store,
            persistent_store=persistent_store,
            transient_store=transient_store,
            shared_store_clean=shared_store_clean,
            counters=self.counters,
        )
        self._persistent, self._transient = recovered.persistent, recovered.transient
        self.next_seq_id = recovered.next_seq_id
        self._persistent_count = recovered.persistent_count
        self._persistent_bytes = recovered.persistent_bytes
        self._delivery_counts = recovered.delivery_counts
        self._redeliver_below = recovered.redeliver_below
        self.transient_threshold = self.next_seq_id
        if self._persistent_count:
            low = self._index.bounds()[0]
            self.delta = Delta(
                low, self.next_seq_id, self._persistent_count, self._persistent_bytes
            )
        elif self._index.bounds() != (0, 0):  # only transient entries are left
            self.delta = Delta(self._index.bounds()[0], self.next_seq_id)
        self.counters["recovered"] = self._persistent_count
        self.recovered_clean = recovered.clean

    # ------------------------------------------------------------------ publishing

    def publish(
        self, message: Message, *, expiry_ms: int | None = None, msg_id: bytes | None = None
    ) -> int:
        """Add ``message``; its seq id. ``expiry_ms`` is an absolute deadline (ms) for
        TTL predicates, ``msg_id`` the shared-store id (a fresh one if None)."""
        return self.publish_encoded(
            encode(message), persistent=message.persistent, expiry_ms=expiry_ms, msg_id=msg_id
        )

    def publish_encoded(
        self,
        payload: bytes,
        *,
        persistent: bool,
        expiry_ms: int | None = None,
        msg_id: bytes | None = None,
    ) -> int:
        """``publish`` for a message already encoded (``warren.queues.message.encode``)."""
        if self._closed:  # tested here: a method call per publish costs more
            self._check_open()
        size = len(payload)
        if size > self.max_message_bytes:
            raise MessageTooLarge(
                f"the message encodes to {size} bytes, above this queue's "
                f"maximum of {self.max_message_bytes}; send a smaller one"
            )
        if msg_id is not None and (type(msg_id) is not bytes or len(msg_id) != 16):
            raise ValueError(f"msg_id must be 16 bytes, got {msg_id!r}")
        if persistent and size < self.embed_msgs_below and self._batching:
            # The common case, kept to appends: ``_write_unwritten`` writes the batch.
            seq_id = self.next_seq_id
            self.next_seq_id = seq_id + 1
            if msg_id is None:  # unique: this open's random prefix, the seq id
                msg_id = self._id_prefix + seq_id.to_bytes(8, "big")
            expiry = expiry_ms or 0
            self._unwritten_payloads.append(payload)
            self._unwritten_msg_ids.append(msg_id)
            self._unwritten_expiries.append(expiry)
            if self.lazy:
                delta = self.delta
                if delta.start >= delta.end:  # empty
                    delta.start = seq_id
                delta.end = seq_id + 1
                delta.count += 1
                delta.bytes += size
            else:
                status = MsgStatus(seq_id, msg_id, payload, size, True, expiry, False, 0, True)
                self._unwritten_statuses.append(status)
                figures = self._figures
                figures.ram_bytes += size
                figures.ram_bytes_on_disk += size
                if self.q1 or self.q2 or self.q3 or self.delta.start < self.delta.end:
                    self.q1.append(status)
                else:
                    self.q4.append(status)
            if len(self._unwritten_payloads) >= WRITE_BATCH:
                self._write_unwritten()
            return seq_id
        self._write_unwritten()
        seq_id = self.next_seq_id
        if msg_id is None:
            msg_id = self._id_prefix + seq_id.to_bytes(8, "big")
        self.next_seq_id = seq_id + 1
        persistent = self.durable and bool(persistent)
        shared = size >= self.embed_msgs_below
        status = MsgStatus(seq_id, msg_id, payload, size, persistent, expiry_ms or 0, shared)
        if persistent:
            if shared:
                self._write_body(status)
                self._unconfirmed[seq_id] = 2
                self._shared_unsynced.append(seq_id)
            else:
                status.store_offset = self._store.write(seq_id, payload)
                status.body_on_disk = True
                self._index_unsynced.append(seq_id)
            self._index.publish_slot(
                seq_id, pack_slot(msg_id, shared, status.store_offset, size, True, status.expiry_ms)
            )
            status.index_on_disk = True
            self._persistent_count += 1
            self._persistent_bytes += size
        else:
            self._confirmed.append(seq_id)
        if self.lazy:
            self._to_delta(status)
        else:
            if self.q1 or self.q2 or self.q3 or not self.delta.is_empty():
                self.q1.append(status)
            else:
                self.q4.append(status)
            self._figures.add_in_ram(status)
        if self._target_ram_count != math.inf:
            self._page(self.page_batch)
        return seq_id

    def publish_many(
        self,
        payloads: list[bytes],
        *,
        persistent: bool = True,
        expiry_ms: int | None = None,
        msg_ids: list[bytes] | None = None,
        sync_follows: bool = False,
    ) -> range:
        """``publish_encoded`` of a batch with one persistence and expiry (what a queue
        process takes from one producer's frame); their seq ids. ``msg_ids`` names the
        messages in the shared store (a message routed to several queues has one id, so
        it is written once there). A message over the
        maximum size refuses the whole batch before anything changes. Persistent
        messages for this queue's own store join the batch of ``publish_encoded``'s common
        case (the module docstring's Storage); ``sync_follows``, the caller's word that
        its next call is ``sync``, has a batch of ``WRITE_AT_ONCE_BYTES`` or more written
        at once instead."""
        self._check_open()
        embed = self.embed_msgs_below
        sizes = checked_batch(payloads, msg_ids, self.max_message_bytes)
        first = self.next_seq_id
        if not payloads or not persistent or not self._batching or max(sizes) >= embed:
            for payload, msg_id in zip(payloads, msg_ids or repeat(None), strict=False):
                self.publish_encoded(
                    payload, persistent=persistent, expiry_ms=expiry_ms, msg_id=msg_id
                )
            return range(first, self.next_seq_id)
        # One pass per step, each a comprehension or map over the batch: per-message Python
        # work is what this path is for.
        end = first + len(payloads)
        seq_ids = range(first, end)
        prefix, expiry, count = self._id_prefix, expiry_ms or 0, len(payloads)
        if msg_ids is None:
            msg_ids = [prefix + seq_id.to_bytes(8, "big") for seq_id in seq_ids]
        self.next_seq_id = end
        self._unwritten_payloads += payloads
        self._unwritten_msg_ids += msg_ids
        self._unwritten_expiries += repeat(expiry, count)
        if self.lazy:  # straight to delta: nothing of them stays in RAM
            self.delta.add_range(first, end, count, sum(sizes))
            self._write_published(count, sum(sizes), sync_follows)
            return seq_ids
        offsets: list[int] | None = None
        try:
            offsets = self._write_published(count, sum(sizes), sync_follows)
        finally:
            statuses = list(
                map(
                    MsgStatus,
                    seq_ids,
                    msg_ids,
                    payloads,
                    sizes,
                    repeat(True, count),
                    repeat(expiry, count),
                    repeat(False, count),
                    repeat(0, count) if offsets is None else offsets,
                    repeat(True, count),
                )
            )
            if offsets is None:
                self._unwritten_statuses += statuses
            if self.q1 or self.q2 or self.q3 or not self.delta.is_empty():
                self.q1.extend(statuses)
            else:
                self.q4.extend(statuses)
            size = sum(sizes)  # each status's body counts as written: see Storage
            self._figures.ram_bytes += size
            self._figures.ram_bytes_on_disk += size
        return seq_ids

    def _write_published(self, count: int, size: int, sync_follows: bool) -> list[int] | None:
        """Write the batch of ``count`` messages (``size`` bytes) just added to the unwritten
        ones, if it is to go now: at once when the sync follows and it is large, the device
        set to work on it meanwhile (the module docstring's Confirms), or with the rest when
        the unwritten batch is full; its records' offsets once the store has taken it, else
        None. A disk error leaves it unwritten (the store and the index did not take it) or
        in their buffers, and the next sync writes it again (raising as any sync does if the
        disk still refuses): the batch is published whatever fails, nothing of it confirmed
        before."""
        to_come = 0 if self.lazy else count  # statuses publish_many makes with the offsets
        offsets = None
        try:
            if sync_follows and size >= WRITE_AT_ONCE_BYTES:
                offsets = self._write_unwritten(statuses_to_come=to_come)[-count:]
                self._flushed_files().start_writeback()
                self.counters["written_ahead"] += 1
            elif len(self._unwritten_payloads) >= WRITE_BATCH:
                offsets = self._write_unwritten(statuses_to_come=to_come)[-count:]
        except OSError as exc:
            log.warning(
                "%s: a batch's write failed (%s); the next sync writes it", self.directory, exc
            )
        return offsets

    def _write_unwritten(self, statuses_to_come: int = 0) -> list[int]:
        """Hand the batch of persistent publishes for this queue's own store to the store
        and the index, one pass per step (their seq ids run up to ``next_seq_id``: a
        publish outside the batch writes it first); their records' offsets. Their statuses
        say on disk from their publish: whatever reads or removes from the store or the
        index calls this first. The last ``statuses_to_come`` have none yet (``publish_many``
        makes them with the offsets). A failed write (a disk error) raises with the batch
        left whole, for the next call."""
        payloads = self._unwritten_payloads
        if not payloads:
            return []
        count = len(payloads)
        first = self.next_seq_id - count
        sizes = list(map(len, payloads))
        offsets = self._store.write_many(first, payloads)
        msg_ids, expiries = self._unwritten_msg_ids, self._unwritten_expiries
        try:
            slots = pack_slots(msg_ids, False, offsets, sizes, True, expiries)
            self._index.publish_slots(first, slots)
        except BaseException:
            self._store.remove(range(first, first + count))
            raise
        statuses = self._unwritten_statuses  # none in a lazy queue
        if statuses:
            made = offsets[: count - statuses_to_come]
            for status, offset in zip(statuses, made, strict=True):
                status.store_offset = offset
        self._unwritten_payloads, self._unwritten_msg_ids = [], []
        self._unwritten_expiries, self._unwritten_statuses = [], []
        self._index_unsynced.extend(range(first, first + count))
        self._persistent_count += count
        self._persistent_bytes += sum(sizes)
        return offsets

    def _flushed_files(self) -> SegmentFiles:
        """The store's and the index's buffers written out; the segment files they share,
        to sync (one fdatasync each) or start writing back."""
        self._store.flushed_files()
        return self._index.flushed_files()

    def _client(self, status: MsgStatus) -> SharedStoreClient:
        return self._persistent if status.persistent else self._transient

    def _write_body(self, status: MsgStatus) -> None:
        if status.body_on_disk:
            return
        payload = status.payload
        assert payload is not None  # a body not on disk is in RAM
        if status.shared:
            # The shared store's records carry no checksum (RabbitMQ's format): the index
            # keeps the body's CRC-32 where an embedded body keeps its offset.
            status.store_offset = crc32(payload)
            ticket = self._client(status).write(status.msg_id, payload)
            if status.persistent:
                self._store_unsettled.append((ticket, status.seq_id))
        else:
            status.store_offset = self._store.write(status.seq_id, payload)
        status.body_on_disk = True

    def _write_index(self, status: MsgStatus) -> None:
        if status.index_on_disk:
            return
        self._index.publish_slot(
            status.seq_id,
            pack_slot(
                status.msg_id,
                status.shared,
                status.store_offset,
                status.size,
                status.persistent,
                status.expiry_ms,
            ),
        )
        status.index_on_disk = True

    # ------------------------------------------------------------------ confirms

    def sync(self, wait: bool = True) -> list[int]:
        """Group commit; the seq ids confirmed since the last call, each once. Without
        ``wait``, shared-store writes not yet settled are confirmed by a later call."""
        self._check_open()
        slow_sync()
        self._write_unwritten()
        with replicated_io.one_commit():  # the writes, even where no fsync covers them
            self._flushed_files().sync()
        confirmed, self._confirmed = self._confirmed, []
        confirmed += self._index_unsynced  # in this queue's own store: durable now
        for seq_id in self._shared_unsynced:
            self._count_down(seq_id, confirmed)
        self._index_unsynced, self._shared_unsynced = [], []
        if self._removes_unsent:  # a store client batches removes: send them now
            self._removes_unsent = False
            self._transient.settled(False)
            if not self._store_unsettled:
                self._persistent.settled(False)
        if self._store_unsettled:
            settlement = self._persistent.settled(wait)
            if settlement.failed:
                self.counters["store_write_failed"] += len(settlement.failed)
                log.error(
                    "%s: the shared store refused %d writes (disk full); those messages "
                    "are dropped when their turn comes",
                    self.directory,
                    len(settlement.failed),
                )
            unsettled = self._store_unsettled
            while unsettled and unsettled[0][0] < settlement.up_to:
                self._count_down(unsettled.popleft()[1], confirmed)
        confirmed.sort()
        return confirmed

    def _count_down(self, seq_id: int, confirmed: list[int]) -> None:
        left = self._unconfirmed[seq_id] - 1
        if left:
            self._unconfirmed[seq_id] = left
        else:
            del self._unconfirmed[seq_id]
            confirmed.append(seq_id)

    def needs_sync(self) -> bool:
        """True while a sync would confirm something, or send removes to a store."""
        return bool(
            self._unconfirmed
            or self._confirmed
            or self._index_unsynced
            or self._shared_unsynced
            or self._unwritten_payloads
            or self._removes_unsent
        )

    # ------------------------------------------------------------------ fetching

    def fetch(self, ack_required: bool = True) -> Delivery | None:
        """The oldest message, or None when the queue is empty. With ``ack_required`` it
        awaits ``ack`` or ``requeue`` under its seq id; without, it is gone now. A
        message whose record fails its check is dropped and ``CorruptMessage`` raised."""
        fetched = self.fetch_encoded(ack_required)
        if fetched is None:
            return None
        try:
            message = decode(fetched.payload)
        except CorruptMessage as exc:
            if ack_required:
                self.ack([fetched.seq_id])
            self.counters["corrupt_on_read"] += 1
            raise CorruptMessage(f"{self.directory}: message {fetched.seq_id}: {exc}") from None
        return Delivery(
            fetched.seq_id,
            message,
            fetched.delivery_count > 0,
            fetched.delivery_count,
            fetched.msg_id,
        )

    def fetch_encoded(self, ack_required: bool = True, below: float = math.inf) -> Fetched | None:
        """``fetch`` without decoding: what a queue process sends on to its consumer. None
        too while the oldest message's seq id is not below ``below`` (the queue process
        holds its deduplicated messages until their producer record is written)."""
        self._check_open()
        while True:
            status = self._pop_head(below)
            if status is None:
                return None
            payload = status.payload
            if payload is None:
                try:
                    payload = self._read_payload(status)
                except CorruptMessage as exc:
                    self.counters["corrupt_on_read"] += 1
                    log.error("%s; the message is dropped", exc)
                    self._remove([status])
                    raise
                if payload is None:
                    self.counters["missing_on_read"] += 1
                    # The queue holds a reference (a recovery keeps only the entries it
                    # claimed one for), so the store lost it.
                    log.error(
                        "%s: message %d is missing from the shared store; dropped",
                        self.directory,
                        status.seq_id,
                    )
                    self._remove([status])
                    continue
            self._since_rates["egress"] += 1
            if ack_required:
                if status.payload is None:
                    self._disk_pending[status.seq_id] = status
                    self._figures.add_paged(status, waiting=False)
                else:
                    self._ram_pending[status.seq_id] = status
                    self._figures.add_in_ram(status)
            else:
                self._remove([status])
            if self._target_ram_count != math.inf:
                self._page(self.page_batch)
            return Fetched(status.seq_id, payload, status.delivery_count, status.msg_id)

    def _read_payload(self, status: MsgStatus) -> bytes | None:
        """The body from disk; None if the shared store has lost it; ``CorruptMessage``
        if it fails its size or CRC check."""
        if status.shared:
            payload = self._client(status).read_many([status.msg_id])[0]
            if payload is not None and (
                len(payload) != status.size
                or (status.store_offset and crc32(payload) != status.store_offset)
            ):
                raise CorruptMessage(
                    f"{self.directory}: the body of seq id {status.seq_id} "
                    f"in the shared store fails its size or CRC check"
                )
            return payload
        self._write_unwritten()
        return self._store.read(status.seq_id, status.store_offset, status.size)

    def peek(self) -> MessageInfo | None:
        """What is known of the oldest message without reading it; None when empty."""
        self._check_open()
        status = self._head()
        return None if status is None else status.info()

    def _head(self) -> MsgStatus | None:
        if self.q4:
            return self.q4[0]
        if not self.q3:
            self._load_delta()
            if not self.q3 and self.q1:
                self.q4, self.q1 = self.q1, self.q4
                return self.q4[0]
        return self.q3[0] if self.q3 else None

    def _pop_head(self, below: float = math.inf) -> MsgStatus | None:
        status = self._head()
        if status is None or status.seq_id >= below:
            return None
        if self.q4:
            status = self.q4.popleft()
            self._figures.drop_in_ram(status)
        else:
            status = self.q3.popleft()
            self._figures.drop_paged(status)
        return status

    def _load_delta(self) -> None:
        """Read delta into q3, one segment at a time, until q3 holds something; when delta
        holds no more messages, read the rest of its range (entries to drop) and let q2
        join q3."""
        self._write_unwritten()
        delta, n = self.delta, self.segment_entry_count
        while (not self.q3 or delta.count == 0) and not delta.is_empty():
            stop = min(delta.end, (delta.start // n + 1) * n)
            entries = self._index.read(delta.start, stop)
            delta.start = stop
            dropped = []
            for entry in entries:
                seq_id = entry.seq_id
                if seq_id in self._ram_pending or seq_id in self._disk_pending:
                    continue
                status = MsgStatus.from_entry(entry)
                if not entry.persistent and seq_id < self.transient_threshold:
                    dropped.append(status)  # its store was wiped by the restart
                    continue
                count = self._delivery_counts.pop(seq_id, 0)
                if seq_id < self._redeliver_below:
                    count = max(count, 1)
                status.delivery_count = count
                self.q3.append(status)
                self._figures.add_paged(status)
                delta.count -= 1
                delta.bytes -= entry.size
            if dropped:
                self.counters["dropped_transient"] += len(dropped)
                self._remove(dropped)
        if delta.is_empty() and delta.count:
            log.error(
                "%s: delta's range ended with %d messages unaccounted for; the index lost them",
                self.directory,
                delta.count,
            )
            self.counters["delta_lost"] += delta.count
            delta.count = 0
        if delta.count == 0:
            self.delta = Delta()
            self.q3.extend(self.q2)
            self.q2.clear()

    # ------------------------------------------------------------------ acks

    def ack(self, seq_ids: Iterable[int]) -> None:
        """Forget fetched messages for good. ``UnknownDeliveryTag`` (and nothing changes)
        for a seq id that awaits no ack."""
        statuses = self._take_pending(seq_ids)
        self._since_rates["ack"] += len(statuses)
        self._remove(statuses)

    def requeue(self, seq_ids: Iterable[int], *, delivered: bool = True) -> None:
        """Put fetched messages back, in seq-id order before newer ones, flagged
        redelivered with their delivery count raised by one; with ``delivered`` False,
        as they were (messages the queue took out itself and puts back unseen)."""
        statuses = sorted(self._take_pending(seq_ids), key=lambda s: s.seq_id)
        if not statuses:
            return  # nothing moved: no paging due (a dead-letter round hands back none)
        for status in statuses:
            status.delivery_count += delivered
            self._requeue_one(status)
        if self._target_ram_count != math.inf:
            self._page(self.page_batch)

    def _take_pending(self, seq_ids: Iterable[int]) -> list[MsgStatus]:
        self._check_open()
        seq_ids = list(seq_ids)
        if len(set(seq_ids)) != len(seq_ids):
            raise UnknownDeliveryTag(f"seq ids repeated in one call: {seq_ids}")
        for seq_id in seq_ids:
            if seq_id not in self._ram_pending and seq_id not in self._disk_pending:
                raise UnknownDeliveryTag(
                    f"seq id {seq_id!r} awaits no ack: never fetched, or already acked or requeued"
                )
        statuses = []
        figures = self._figures
        for seq_id in seq_ids:
            status = self._ram_pending.pop(seq_id, None)
            if status is not None:
                figures.drop_in_ram(status)
            else:
                status = self._disk_pending.pop(seq_id)
                figures.drop_paged(status, waiting=False)
            statuses.append(status)
        return statuses

    def pending_payload(self, seq_id: int) -> bytes | None:
        """The encoded message of a fetch awaiting its ack (None if its body is gone)."""
        status = self._ram_pending.get(seq_id) or self._disk_pending.get(seq_id)
        if status is None:
            raise UnknownDeliveryTag(f"seq id {seq_id!r} awaits no ack")
        if status.payload is not None:
            return status.payload
        try:
            return self._read_payload(status)
        except CorruptMessage:
            self.counters["corrupt_on_read"] += 1
            return None

    def _requeue_one(self, status: MsgStatus) -> None:
        seq_id, delta = status.seq_id, self.delta
        if not delta.is_empty() and seq_id >= delta.start:
            self._to_delta(status)
        elif (self.q3 and seq_id > self.q3[0].seq_id) or (self.lazy and not self.q4):
            # Among the betas, or at the head of a lazy queue: a lazy queue keeps nothing
            # in RAM, so its requeued message goes back to q3 with its body left on disk
            # (RabbitMQ's requeue/2 for lazy queues), not read back into q4.
            self._to_beta(status)
            merge_in_order(self.q3, status)
            self._figures.add_paged(status)
        else:
            if status.payload is None:
                try:
                    status.payload = self._read_payload(status)
                except CorruptMessage:
                    self.counters["corrupt_on_read"] += 1
                    self._remove([status])
                    return
                if status.payload is None:
                    self.counters["missing_on_read"] += 1
                    self._remove([status])
                    return
            merge_in_order(self.q4, status)
            self._figures.add_in_ram(status)

    def _remove(self, statuses: list[MsgStatus]) -> None:
        """Drop the messages' index entries, records and shared-store references."""
        self._write_unwritten()
        self._index.ack(s.seq_id for s in statuses if s.index_on_disk)
        self._store.remove(s.seq_id for s in statuses if s.body_on_disk and not s.shared)
        persistent = [s.msg_id for s in statuses if s.shared and s.body_on_disk and s.persistent]
        transient = [s.msg_id for s in statuses if s.shared and s.body_on_disk and not s.persistent]
        if persistent or transient:
            # The index forgets them on file before a store may drop their bodies (a
            # store client sends its removes whenever its batch fills): killed between
            # the two, the queue would recover entries whose bodies the store no longer
            # holds, and fail to read them later.
            self._index.flush()
        if persistent:
            self._persistent.remove(persistent)
        if transient:
            self._transient.remove(transient)
        if persistent or transient:
            self._removes_unsent = True
        for status in statuses:
            if status.persistent:
                self._persistent_count -= 1
                self._persistent_bytes -= status.size

    # ------------------------------------------------------------------ TTL, purge

    def drop_while(self, predicate: Callable[[MessageInfo], bool]) -> MessageInfo | None:
        """Drop messages from the head while ``predicate`` holds (expired ones, for
        TTL); the first message it refused (left in place), or None when empty."""
        self._check_open()
        while True:
            status = self._head()
            if status is None or not predicate(status.info()):
                return None if status is None else status.info()
            head = self._pop_head()
            assert head is not None  # _head() has just found it
            self._remove([head])

    def fetch_while(self, predicate: Callable[[MessageInfo], bool]) -> list[Delivery]:
        """Fetch (awaiting acks) from the head while ``predicate`` holds: expired messages
        for dead-lettering, acked once they are re-published."""
        deliveries: list[Delivery] = []
        while True:
            info = self.peek()
            if info is None or not predicate(info):
                return deliveries
            delivery = self.fetch(ack_required=True)
            if delivery is not None:
                deliveries.append(delivery)

    def purge(self) -> int:
        """Drop every message waiting in the queue (not those awaiting acks); how many."""
        self._check_open()
        waiting = self._take_waiting()
        purged = len(waiting)
        self._remove(waiting)
        delta, n = self.delta, self.segment_entry_count
        start = delta.start
        while start < delta.end:
            stop = min(delta.end, (start // n + 1) * n)
            statuses = [
                MsgStatus.from_entry(e)
                for e in self._index.read(start, stop)
                if e.seq_id not in self._ram_pending and e.seq_id not in self._disk_pending
            ]
            stale = [
                s for s in statuses if not s.persistent and s.seq_id < self.transient_threshold
            ]
            purged += len(statuses) - len(stale)
            self._remove(statuses)
            start = stop
        self.delta = Delta()
        self._delivery_counts.clear()
        return purged

    def _take_waiting(self) -> list[MsgStatus]:
        """Empty q4, q3, q2 and q1; their statuses, oldest first."""
        figures = self._figures
        for status in self.q4:
            figures.drop_in_ram(status)
        for status in self.q1:
            figures.drop_in_ram(status)
        for status in self.q3:
            figures.drop_paged(status)
        for status in self.q2:
            figures.drop_paged(status)
        waiting = [*self.q4, *self.q3, *self.q2, *self.q1]
        for queue in (self.q1, self.q2, self.q3, self.q4):
            queue.clear()
        return waiting

    # ------------------------------------------------------------------ memory

    def set_ram_duration_target(self, seconds: float) -> None:
        """How many seconds of messages RAM should hold (``math.inf``: no limit; 0 under
        a memory alarm); pages one batch at once, the rest with later operations or
        ``reduce_memory_use``."""
        if not (seconds == math.inf or (isinstance(seconds, (int, float)) and seconds >= 0)):
            raise ValueError(f"the RAM duration target must be >= 0 or math.inf, got {seconds!r}")
        self._duration_target = seconds
        self._update_target()
        self.reduce_memory_use()

    def _update_target(self) -> None:
        if self._duration_target == math.inf:
            self._target_ram_count = math.inf
        else:
            self._target_ram_count = int(self._duration_target * sum(self._rates.values()))
        self._batching = self.durable and self._target_ram_count == math.inf

    def update_rates(self) -> None:
        """Fold the operations since the last call into the smoothed rates (call every
        few seconds; RabbitMQ does every 5) and recompute the RAM target."""
        now = self._clock()
        elapsed = now - self._rates_at
        if elapsed <= 0:
            return
        self._since_rates["ingress"] = self.next_seq_id - self._rates_seq_id
        self._rates_seq_id = self.next_seq_id
        for name, count in self._since_rates.items():
            sample = count / elapsed
            rate = RATE_SMOOTHING * sample + (1 - RATE_SMOOTHING) * self._rates[name]
            self._rates[name] = 0.0 if not count and rate < RATE_AT_REST else rate
            self._since_rates[name] = 0
        self._rates_at = now
        self._update_target()

    def resume_rates(self) -> None:
        """Start the rates' next interval now: the caller stopped folding them at rest
        (``rates_at_rest``), and the time since held no operation but the one that woke
        it."""
        self._rates_at = self._clock()

    def rates_at_rest(self) -> bool:
        """Whether every rate is 0 (decayed below ``RATE_AT_REST`` with no operation in
        the last interval) and no operation came since: folding more would change nothing."""
        return (
            not any(self._rates.values())
            and not any(self._since_rates.values())
            and self.next_seq_id == self._rates_seq_id
        )

    def ram_duration(self) -> float:
        """Seconds of messages in RAM at the current rates (inf when idle)."""
        rate = sum(self._rates.values())
        in_ram = len(self.q1) + len(self.q4) + len(self._ram_pending)
        return math.inf if rate == 0 else in_ram / rate

    def reduce_memory_use(self) -> bool:
        """Page one batch towards the target; True if more is left to page."""
        self._check_open()
        return self._page(self.page_batch)

    def _page(self, limit: int) -> bool:
        target = self._target_ram_count
        if target == math.inf:
            return False
        figures = self._figures
        excess = len(self.q1) + len(self.q4) + len(self._ram_pending) - target
        quota = min(excess, limit)
        while quota > 0 and self._ram_pending:
            seq_id = next(iter(self._ram_pending))
            status = self._ram_pending.pop(seq_id)
            figures.drop_in_ram(status)
            self._write_body(status)
            status.payload = None
            self._disk_pending[seq_id] = status
            figures.add_paged(status, waiting=False)
            quota -= 1
        while quota > 0 and self.q1:
            status = self.q1.popleft()
            figures.drop_in_ram(status)
            self._to_beta(status)
            (self.q2 if not self.delta.is_empty() else self.q3).append(status)
            figures.add_paged(status)
            quota -= 1
        while quota > 0 and self.q4:
            status = self.q4.pop()
            figures.drop_in_ram(status)
            self._to_beta(status)
            self.q3.appendleft(status)
            figures.add_paged(status)
            quota -= 1
        betas = len(self.q2) + len(self.q3)
        surplus = betas - self._permitted_betas()
        if surplus > 0 and (surplus >= self.io_batch_size or target == 0):
            moved = min(surplus, limit)
            while moved and self.q2:
                status = self.q2.popleft()
                figures.drop_paged(status)
                self._to_delta(status)
                moved -= 1
            while moved and self.q3:
                status = self.q3.pop()
                figures.drop_paged(status)
                self._to_delta(status)
                moved -= 1
            surplus -= min(surplus, limit)
        excess = len(self.q1) + len(self.q4) + len(self._ram_pending) - target
        return excess > 0 or (surplus > 0 and (surplus >= self.io_batch_size or target == 0))

    def _permitted_betas(self) -> float:
        """Betas and gammas allowed to stay in RAM: at a target of 0, what is left of q3's
        first segment; else RabbitMQ's max(N, B - B²/(B + target)), B = betas + delta."""
        target, n = self._target_ram_count, self.segment_entry_count
        if target == 0:
            return min(len(self.q3), n - self.q3[0].seq_id % n) if self.q3 else 0
        betas = len(self.q2) + len(self.q3) + self.delta.count
        return max(n, betas - betas * betas / (betas + target)) if betas else 0

    def _to_beta(self, status: MsgStatus) -> None:
        self._write_body(status)
        status.payload = None

    def _to_delta(self, status: MsgStatus) -> None:
        self._write_body(status)
        self._write_index(status)
        status.payload = None
        if status.delivery_count:
            self._delivery_counts[status.seq_id] = status.delivery_count
        self.delta.add(status)

    def set_lazy(self, lazy: bool) -> None:
        """Switch modes while in use: to lazy pages every waiting message to delta."""
        self._check_open()
        self._write_unwritten()  # its statuses are kept in the default mode only
        self.lazy = bool(lazy)
        if not self.lazy:
            return
        # Everything written before anything moves: a failed write leaves the queue whole.
        figures = self._figures
        for queue, drop, add in (
            (self.q4, figures.drop_in_ram, figures.add_in_ram),
            (self.q3, figures.drop_paged, figures.add_paged),
            (self.q2, figures.drop_paged, figures.add_paged),
            (self.q1, figures.drop_in_ram, figures.add_in_ram),
        ):
            for status in queue:
                drop(status)  # its flags change: the figures see it out and back in
                try:
                    self._write_body(status)
                    self._write_index(status)
                finally:
                    add(status)
        for status in self._take_waiting():
            self._to_delta(status)

    # ------------------------------------------------------------------ views

    def msg_ids_from(self, seq_id: int) -> set[bytes]:
        """The ids of the index's entries from ``seq_id`` on (what a recovered queue holds
        that its producer log may not name yet)."""
        self._write_unwritten()
        return {entry.msg_id for entry in self._index.read(seq_id, self.next_seq_id)}

    def __len__(self) -> int:
        return len(self.q1) + len(self.q2) + self.delta.count + len(self.q3) + len(self.q4)

    @property
    def depth(self) -> int:
        """Messages waiting plus messages awaiting acks."""
        return len(self) + len(self._ram_pending) + len(self._disk_pending)

    @property
    def pending_acks(self) -> int:
        return len(self._ram_pending) + len(self._disk_pending)

    def stats(self) -> dict[str, Any]:
        """Counts per state and per queue (each set adds up to ``len``), pending acks in
        RAM and on disk, RAM and disk bytes, the target and the rates: running figures,
        so a call costs the same at any depth (``msg_status.RamFigures``)."""
        figures, paged = self._figures, len(self.q2) + len(self.q3)
        return {
            "len": len(self),
            "depth": self.depth,
            "alpha": len(self.q1) + len(self.q4),
            "beta": paged - figures.gammas,
            "gamma": figures.gammas,
            "delta": self.delta.count,
            "q1": len(self.q1),
            "q2": len(self.q2),
            "q3": len(self.q3),
            "q4": len(self.q4),
            "pending_acks_ram": len(self._ram_pending),
            "pending_acks_disk": len(self._disk_pending),
            "ram_bytes": figures.ram_bytes,
            "disk_bytes": figures.disk_bytes(self.delta),
            "unconfirmed": len(self._unconfirmed)
            + len(self._index_unsynced)
            + len(self._unwritten_payloads),
            "persistent": self._persistent_count + len(self._unwritten_payloads),
            "mode": "lazy" if self.lazy else "default",
            "target_ram_count": self._target_ram_count,
            "rates": dict(self._rates),
        }

    # ------------------------------------------------------------------ ending

    def terminate(self) -> None:
        """Clean stop: make everything durable, write the recovery terms, release. If
        that fails (a full disk, a failed fdatasync), the files are released as a crash
        would leave them, with no terms: the next open recovers dirty."""
        if self._closed:
            return
        try:
            self._write_unwritten()
            transient_in_store = [
                s.seq_id
                for s in self._all_statuses()
                if not s.persistent and s.body_on_disk and not s.shared and not s.index_on_disk
            ]
            self._store.remove(transient_in_store)
            self._persistent.settled(True)
            self._store.close()
            self._index.close()
        except BaseException:
            self.abandon()
            raise
        delivery_counts = dict(self._delivery_counts)
        for status in self._all_statuses():
            if status.persistent and status.delivery_count:
                delivery_counts[status.seq_id] = status.delivery_count
        for status in [*self._ram_pending.values(), *self._disk_pending.values()]:
            if status.persistent:
                delivery_counts[status.seq_id] = status.delivery_count + 1
        save_terms(
            self.directory,
            self.segment_entry_count,
            next_seq_id=self.next_seq_id,
            persistent_count=self._persistent_count,
            persistent_bytes=self._persistent_bytes,
            segments=self._index.segment_counts(),
            store_segments=self._store.live_counts,
            delivery_counts=delivery_counts,
            persistent_ref=self._persistent.client_ref.hex(),
        )
        # The persistent client stays registered: the store's clean-shutdown files name
        # it, and the next clean start checks them against these terms' ref.
        self._persistent.close()
        self._transient.delete_and_terminate()
        self._closed = True

    def _all_statuses(self) -> list[MsgStatus]:
        return [
            *self.q4,
            *self.q3,
            *self.q2,
            *self.q1,
            *self._ram_pending.values(),
            *self._disk_pending.values(),
        ]

    def delete(self) -> None:
        """Delete the queue: every message, its files and its shared-store references."""
        self._check_open()
        self._remove(self._take_pending([*self._ram_pending, *self._disk_pending]))
        self.purge()
        self._persistent.settled(True)
        self._index.delete()
        self._store.delete()
        self._persistent.delete_and_terminate()
        self._transient.delete_and_terminate()
        self.abandon()
        for name in os.listdir(self.directory):
            replicated_io.unlink(os.path.join(self.directory, name))
        os.rmdir(self.directory)

    def abandon(self) -> None:
        """Release the files without writing anything more, as a crash would (tests)."""
        self._closed = True
        for part in ("_store", "_index"):
            if hasattr(self, part):
                getattr(self, part).abandon()

    def _check_open(self) -> None:
        if self._closed:
            raise QueueClosed(f"queue {self.directory!r} is closed")

    def __repr__(self) -> str:
        return (
            f"VariableQueue({self.directory!r}, len={len(self)}, "
            f"mode={'lazy' if self.lazy else 'default'})"
        )

"""``QueueIndex``: where each message of one queue is, by sequence id, in fixed-slot
segment files that also hold the queue's own store's records (``QueueStore``).

Layout (RabbitMQ's v2 index, chosen over v1's journal plus segments): the entry of seq
id S lives in segment ``S // N`` (file ``<seg>.qi``, N = ``segment_entry_count``, default
2048) at offset ``64 + (S % N) * 48``. Fixed slots make an ack one overwrite in place, and
a flush one write per run of adjacent slots, so nothing is ever replayed or copied: v1
appended publishes, delivers and acks to a journal that it had to rewrite into the segments
every 32,768 entries, the throughput stall of RabbitMQ issue #227. Deliveries are not
recorded (the variable queue keeps delivery counts in its recovery terms, and a dirty start
flags every recovered message redelivered).

A segment file is its header, its N slots (written as zeros when the file is created:
RabbitMQ preallocates its index segments too) and then, from ``records_at(N)``, the
records of the queue's own store for those seq ids (``queue_store`` has their format).
RabbitMQ keeps the two in separate files (``.qi`` and ``.qs``), and so did Warren's
format version 1: one file is what lets a group commit fdatasync a segment once, its
slots and its records together, instead of twice (``upgrade`` turns a queue directory of
version 1 into version 2 when the queue opens).

Segment header, 64 bytes::

    magic "WQIX" | version u8 = 2 | entry_count u32 | first_seq u64 | zeros | crc32 u32 (at 60)

Slot, 48 bytes (all big-endian)::

    status u8 (1 = present) | flags u8 (bit0 persistent, bit1 body in the shared store) |
    0 u16 | size u32 | expiry_ms u64 (0 = none) | msg_id 16 | store_offset u64 |
    0 u32 | crc32 of the 44 bytes before u32

``size`` is the encoded message's length; ``store_offset`` is where its record starts in
the same file (in its record area), or, for a body in the shared store (whose records have
no checksum), the body's CRC-32, checked when it is read back. An all-zero slot, or
one past the end of the file, is absent. A slot whose CRC fails is a torn write: dropped
and counted. An ack overwrites the slot with zeros; there is no fsync for acks (an ack
lost with a crash redelivers the message: at-least-once).

Write buffer. ``publish`` buffers the slot; ``ack`` of a buffered slot removes it, so an
entry published and acked before it was flushed is never written. The buffer is written
out (``flush``) when it holds ``segment_entry_count`` entries or half as many acks, and at
``sync``, which then fdatasyncs every segment written since the last sync (the store's
records with them), and the directory when a segment file was created or deleted. Each
segment's count of unacked entries is kept in memory (from the recovery terms after a
clean stop, from a scan after a dirty one); the segment file is deleted the moment it
reaches 0, unless the queue's own records in it are still live (a transient message paged
out has a record and no entry): its slots are then all written as zeros, so that no acked
entry of it reads present again.

Races this module guards against (one thread of control; a queue process owns it):

- a second queue object on the same directory, in this or another process: refused with
  ``QueueLocked`` (an exclusive flock on ``.lock``, released by the kernel on death);
- a crash between a flush and the next sync: the slots written may or may not be on disk;
  nothing was confirmed for them, and recovery checks every slot it finds;
- a crash in the middle of a slot write: the slot's CRC fails, it is dropped and counted;
- a crash after a flush wrote slots whose records were still in the store's buffer: the
  entries would point at nothing and recover as corrupt; a flush writes those records
  first (``records_before_slots``), so a kill leaves at most records without a slot;
- a crash after a segment's last ack but before its unlink reached the disk: the file
  comes back with its entries; they are redelivered (at-least-once), never lost.
"""

from __future__ import annotations

import errno
import logging
import os
import struct
from bisect import bisect_left
from collections.abc import Callable, Iterable
from itertools import repeat
from typing import NamedTuple

from isal.isal_zlib import crc32

from warren.store import replicated_io
from warren.store.locks import lock_exclusive

from ..errors import QueueClosed, QueueLocked, UnknownDeliveryTag
from . import segments
from .segments import HEADER_BYTES, SegmentFiles, header_fields, write_vectors

__all__ = ["DEFAULT_SEGMENT_ENTRY_COUNT", "Entry", "QueueIndex", "RecoveredIndex"]

log = logging.getLogger("warren.queues")

DEFAULT_SEGMENT_ENTRY_COUNT = 2048  # RabbitMQ 3.10+ (16384 before: 25-35 % more memory)
MAX_SEGMENT_ENTRY_COUNT = 2**20
INDEX_SUFFIX = ".qi"
LOCK_FILE = ".lock"
MAGIC = b"WQIX"
VERSION = 2
SLOT_BYTES = 48
SLOT_PRESENT = 1  # a slot's status byte: an entry is there
_SLOT = struct.Struct(">BBHIQ16sQ4x")  # the 44 bytes the slot's CRC covers
# The same 44 bytes packed with status and flags as one u16 (fewer arguments per slot),
# then the whole slot with its CRC.
_SLOT_HEAD = struct.Struct(">H2xIQ16sQ4x")
_SLOT_WITH_CRC = struct.Struct(">44sI")
_CRC = struct.Struct(">I")
_EMPTY_SLOT = bytes(SLOT_BYTES)
# Format version 1 kept the per-queue store's records in <seg>.qs, after a header of the
# same shape as the index's with this magic: ``upgrade`` reads them.
V1_STORE_SUFFIX = ".qs"
_V1_STORE_MAGIC = b"WQST"
UPGRADE_SUFFIX = ".upgrade"  # a version 2 file being written aside
_PERSISTENT = 1
_SHARED = 2


class Entry(NamedTuple):
    """One message's place: ``shared`` bodies are in the shared store under ``msg_id``;
    the others in the per-queue store at ``store_offset`` of segment ``seq_id // N``."""

    seq_id: int
    msg_id: bytes
    shared: bool
    store_offset: int
    size: int
    persistent: bool
    expiry_ms: int


class RecoveredIndex(NamedTuple):
    """What a dirty scan found and dropped."""

    entries: int
    deleted_segments: list[int]  # deleted with their files (bad header, or nothing kept)
    torn: int  # slots whose CRC failed
    bad_segments: int  # files with a corrupt header, deleted


def pack_slot(
    msg_id: bytes, shared: bool, store_offset: int, size: int, persistent: bool, expiry_ms: int
) -> bytes:
    """The 48 bytes of an entry's slot."""
    body = _SLOT_HEAD.pack(
        _status_and_flags(shared, persistent), size, expiry_ms, msg_id, store_offset
    )
    return _SLOT_WITH_CRC.pack(body, crc32(body))


def pack_slots(
    msg_ids: list[bytes],
    shared: bool,
    store_offsets: Iterable[int],
    sizes: Iterable[int],
    persistent: bool,
    expiries: Iterable[int],
) -> list[bytes]:
    """``pack_slot`` of many entries with one ``shared`` and ``persistent`` between them,
    a pass of C calls per step rather than a Python call per entry."""
    head = repeat(_status_and_flags(shared, persistent), len(msg_ids))
    bodies = list(map(_SLOT_HEAD.pack, head, sizes, expiries, msg_ids, store_offsets))
    return list(map(_SLOT_WITH_CRC.pack, bodies, map(crc32, bodies)))


def _status_and_flags(shared: bool, persistent: bool) -> int:
    """A present slot's first two bytes as one big-endian u16."""
    return SLOT_PRESENT << 8 | (_PERSISTENT if persistent else 0) | (_SHARED if shared else 0)


def unpack_slot(seq_id: int, slot: bytes) -> Entry:
    """The entry in ``slot``, which the caller has seen is present (its status byte is not
    0); ValueError if torn."""
    body = slot[:44]
    if slot[0] != SLOT_PRESENT or _CRC.unpack_from(slot, 44)[0] != crc32(body):
        raise ValueError("torn slot")
    _, flags, _, size, expiry, msg_id, offset = _SLOT.unpack(body)
    return Entry(
        seq_id, msg_id, bool(flags & _SHARED), offset, size, bool(flags & _PERSISTENT), expiry
    )


def records_at(entry_count: int) -> int:
    """Where the records of a segment file of ``entry_count`` slots begin."""
    return HEADER_BYTES + entry_count * SLOT_BYTES


def slot_area(data: bytes, entry_count: int) -> bytes:
    """The whole slots of a segment file's ``data`` (a file cut short has fewer)."""
    end = min(len(data), records_at(entry_count))
    return data[: end - (end - HEADER_BYTES) % SLOT_BYTES]


def segment_header(segment: int, entry_count: int, version: int = VERSION) -> bytes:
    return segments.segment_header(MAGIC, version, segment, entry_count)


def usable_entry_count(
    header: bytes, segment: int, versions: tuple[int, ...] = (1, VERSION)
) -> int | None:
    """The entry count a segment file's header states, when the header is one a queue
    keeps: this file kind, one of ``versions`` (the slots of both versions lie alike), for
    this segment, and whole (its CRC holds); None for anything else, which a queue's
    recovery deletes with its entries. The one rule both the index's recovery and the
    shared store's reference walker go by."""
    fields = header_fields(header)
    if fields is None or fields[0] != MAGIC or fields[1] not in versions:
        return None
    count = fields[2]
    return count if header[:HEADER_BYTES] == segment_header(segment, count, fields[1]) else None


class QueueIndex:
    """One queue's index directory, locked; see the module docstring.

    Open it, then either ``recover_clean(segment_counts)`` (from the recovery terms) or
    ``recover_dirty(keep)``; a new queue's empty directory needs neither.
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        segment_entry_count: int = DEFAULT_SEGMENT_ENTRY_COUNT,
    ) -> None:
        if (
            type(segment_entry_count) is not int
            or not 1 <= segment_entry_count <= MAX_SEGMENT_ENTRY_COUNT
        ):
            raise ValueError(
                f"segment_entry_count must be an int in 1..{MAX_SEGMENT_ENTRY_COUNT}, "
                f"got {segment_entry_count!r}"
            )
        self.directory = os.fspath(directory)
        self.segment_entry_count = segment_entry_count
        os.makedirs(self.directory, exist_ok=True)
        self._dir_fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
        self._lock_fd = replicated_io.open(
            LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644, dir_fd=self._dir_fd
        )
        if not lock_exclusive(self._lock_fd):
            os.close(self._lock_fd)
            os.close(self._dir_fd)
            raise QueueLocked(
                f"queue directory {self.directory!r} is open in another queue"
            ) from None
        self._segments: dict[int, int] = {}  # segment -> unacked entries
        self._buffer: dict[int, bytes] = {}  # seq id -> packed slot, or an ack's zeros
        self._buffered_acks = 0
        self.records_at = records_at(segment_entry_count)
        self.files = SegmentFiles(
            self._dir_fd,
            INDEX_SUFFIX,
            lambda segment: segment_header(segment, segment_entry_count),
            self.records_at,
        )
        self.files.add_user(lambda segment: segment in self._segments)
        self._write_records_first: Callable[[], None] = _nothing
        self._closed = False
        self.torn_slots = 0
        self._refuse_other_entry_count()

    def _refuse_other_entry_count(self) -> None:
        """Segments written with another entry count would all read as corrupt and be
        deleted: refuse to open them instead. The first segment whose header is usable
        decides (one queue writes every segment with the same count); a damaged one
        before it says nothing."""
        for segment in sorted(self.files.on_disk):
            header = self.files.read_all(segment, HEADER_BYTES)
            count = usable_entry_count(header, segment)
            if count is None:
                continue
            if count != self.segment_entry_count:
                self._release()
                raise ValueError(
                    f"{self.directory} holds segments of {count} entries; open "
                    f"it with segment_entry_count={count}, not "
                    f"{self.segment_entry_count}"
                )
            return

    # ------------------------------------------------------------------ recovery

    def upgrade(self) -> tuple[int, int]:
        """Rewrite each segment of format version 1 (slots in ``<seg>.qi``, records in
        ``<seg>.qs`` after a header of its own) as one file of version 2, before anything
        reads them; how many, and how many segment files have a header neither version
        uses (recovery deletes those: a queue must not trust counts that name them). Each
        new file is written aside, fdatasync'd and renamed over the old index file; the
        directory is fsynced before the old store files go. A crash leaves either layout
        whole: a file written aside is deleted at the next open, and a store file whose
        index file is already version 2 too. A store file without a usable index segment is
        deleted (no entry can reach its records)."""
        names = os.listdir(self._dir_fd)
        for name in names:
            if name.endswith(UPGRADE_SUFFIX):
                replicated_io.unlink(name, dir_fd=self._dir_fd)
        n, upgraded, unusable = self.segment_entry_count, 0, 0
        for segment in sorted(self.files.on_disk):
            header = self.files.read_all(segment, HEADER_BYTES)
            if usable_entry_count(header, segment, (1,)) == n:
                self._write_upgraded(segment, self.files.read_all(segment))
                upgraded += 1
            elif usable_entry_count(header, segment, (VERSION,)) != n:
                unusable += 1
        stale = [
            name
            for name in names
            if name.endswith(V1_STORE_SUFFIX) and name[: -len(V1_STORE_SUFFIX)].isdigit()
        ]
        if upgraded or stale:
            replicated_io.fsync(self._dir_fd)  # every rename durable before an old store file goes
        for name in stale:
            replicated_io.unlink(name, dir_fd=self._dir_fd)
        if stale:
            replicated_io.fsync(self._dir_fd)
        return upgraded, unusable

    def _write_upgraded(self, segment: int, index_data: bytes) -> None:
        n, first = self.segment_entry_count, segment * self.segment_entry_count
        store_data = _read_or_empty(f"{segment}{V1_STORE_SUFFIX}", self._dir_fd)
        records = b""
        if store_data[:HEADER_BYTES] == segments.segment_header(_V1_STORE_MAGIC, 1, segment, n):
            records = store_data[HEADER_BYTES:]
        shift = self.records_at - HEADER_BYTES  # where version 2 puts the same records
        area = bytearray(slot_area(index_data, n).ljust(self.records_at, b"\0"))
        area[:HEADER_BYTES] = segment_header(segment, n)
        for at in range(HEADER_BYTES, self.records_at, SLOT_BYTES):
            if area[at] == 0:
                continue
            try:
                entry = unpack_slot(
                    first + (at - HEADER_BYTES) // SLOT_BYTES, bytes(area[at : at + SLOT_BYTES])
                )
            except ValueError:
                continue  # torn: recovery drops it
            if not entry.shared:
                area[at : at + SLOT_BYTES] = pack_slot(
                    entry.msg_id,
                    False,
                    entry.store_offset + shift,
                    entry.size,
                    entry.persistent,
                    entry.expiry_ms,
                )
        aside = f"{segment}{INDEX_SUFFIX}{UPGRADE_SUFFIX}"
        fd = replicated_io.open(
            aside, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644, dir_fd=self._dir_fd
        )
        try:
            if replicated_io.pwritev(fd, [area, records], 0) != len(area) + len(records):
                raise OSError(errno.ENOSPC, f"{aside}: short write; the segment stays as it was")
            replicated_io.fdatasync(fd)
        finally:
            os.close(fd)
        replicated_io.rename(
            aside, self.files.name(segment), src_dir_fd=self._dir_fd, dst_dir_fd=self._dir_fd
        )

    def recover_clean(self, segment_counts: dict[int, int]) -> None:
        """Take the unacked counts the recovery terms saved; files they do not name are
        left over from before and deleted."""
        self._segments = {int(s): int(c) for s, c in segment_counts.items() if int(c) > 0}
        for segment in self.files.on_disk - set(self._segments):
            self.files.delete(segment)

    def recover_dirty(self, keep: Callable[[list[Entry]], Iterable[bool]]) -> RecoveredIndex:
        """Scan every segment: drop torn slots, and the entries ``keep`` refuses (it sees
        each segment's entries in seq order); delete segments with a bad header or nothing
        left. The counts are then exact."""
        n = self.segment_entry_count
        entries = torn = bad = 0
        deleted = []
        for segment in sorted(self.files.on_disk):
            data = self.files.read_all(segment, self.records_at)
            if usable_entry_count(data, segment, (VERSION,)) != n:
                log.warning(
                    "%s: %s has a corrupt header; deleted with its entries",
                    self.directory,
                    self.files.name(segment),
                )
                bad += 1
                self.files.delete(segment)
                deleted.append(segment)
                continue
            found: list[Entry] = []
            drop: list[int] = []
            first = segment * n
            cut_short = (len(data) - HEADER_BYTES) % SLOT_BYTES
            if cut_short and data[len(data) - cut_short] != 0:
                torn += 1  # the file ends in a slot cut short: it is gone
            for rel in range((len(data) - HEADER_BYTES) // SLOT_BYTES):
                at = HEADER_BYTES + rel * SLOT_BYTES
                if data[at] == 0:
                    continue
                try:
                    found.append(unpack_slot(first + rel, data[at : at + SLOT_BYTES]))
                except ValueError:
                    torn += 1
                    drop.append(first + rel)
            kept = 0
            for entry, keep_it in zip(found, keep(found), strict=True):
                if keep_it:
                    kept += 1
                else:
                    drop.append(entry.seq_id)
            if kept == 0:
                self.files.delete(segment)
                deleted.append(segment)
                continue
            if drop:
                fd = self.files.for_writing(segment)
                for seq_id in drop:  # one zero byte marks the slot absent
                    replicated_io.pwrite(fd, b"\0", HEADER_BYTES + (seq_id - first) * SLOT_BYTES)
            self._segments[segment] = kept
            entries += kept
        if torn:
            log.warning("%s: %d torn index slots dropped", self.directory, torn)
        self.torn_slots += torn
        self.sync()
        return RecoveredIndex(entries, deleted, torn, bad)

    # ------------------------------------------------------------------ changes

    def publish(self, entry: Entry) -> None:
        """Add ``entry`` (buffered until the next flush)."""
        self.publish_slot(
            entry.seq_id,
            pack_slot(
                entry.msg_id,
                entry.shared,
                entry.store_offset,
                entry.size,
                entry.persistent,
                entry.expiry_ms,
            ),
        )

    def publish_slot(self, seq_id: int, slot: bytes) -> None:
        """``publish`` of an entry already packed (``pack_slot``)."""
        if self._closed:
            raise QueueClosed(f"queue index {self.directory!r} is closed")
        segments, buffer = self._segments, self._buffer
        segment = seq_id // self.segment_entry_count
        segments[segment] = segments.get(segment, 0) + 1
        buffer[seq_id] = slot
        if len(buffer) >= self.segment_entry_count:
            self.flush()

    def publish_slots(self, first_seq_id: int, slots: list[bytes]) -> None:
        """``publish_slot`` of consecutive seq ids from ``first_seq_id``. A full buffer is
        written out first, so a failed write raises before any of them is taken."""
        if self._closed:
            raise QueueClosed(f"queue index {self.directory!r} is closed")
        n, segments, buffer = self.segment_entry_count, self._segments, self._buffer
        if len(buffer) >= n:
            self.flush()
        end = first_seq_id + len(slots)
        for segment in range(first_seq_id // n, (end - 1) // n + 1):
            inside = min(end, (segment + 1) * n) - max(first_seq_id, segment * n)
            segments[segment] = segments.get(segment, 0) + inside
        buffer.update(zip(range(first_seq_id, end), slots, strict=True))

    def ack(self, seq_ids: Iterable[int]) -> list[int]:
        """Remove the entries; the segments this emptied (their files are deleted unless
        the queue's own records in them are still live)."""
        if self._closed:
            raise QueueClosed(f"queue index {self.directory!r} is closed")
        n = self.segment_entry_count
        emptied = []
        for seq_id in seq_ids:
            segment = seq_id // n
            count = self._segments.get(segment, 0)
            if count == 0:
                raise UnknownDeliveryTag(f"seq id {seq_id} has no entry in the index")
            if self._buffer.pop(seq_id, None) is None:
                self._buffer[seq_id] = _EMPTY_SLOT
                self._buffered_acks += 1
            if count == 1:
                del self._segments[segment]
                emptied.append(segment)
                self._forget_buffered(segment)
                self.files.delete_unused(segment)
                if segment in self.files.on_disk:  # kept for the store's records
                    fd = self.files.for_writing(segment)
                    replicated_io.pwrite(fd, bytes(self.records_at - HEADER_BYTES), HEADER_BYTES)
            else:
                self._segments[segment] = count - 1
        if self._buffered_acks >= n // 2:
            self.flush()
        return emptied

    def _forget_buffered(self, segment: int) -> None:
        n = self.segment_entry_count
        for seq_id in [s for s in self._buffer if s // n == segment]:
            if self._buffer.pop(seq_id) is _EMPTY_SLOT:
                self._buffered_acks -= 1

    def records_before_slots(self, flush_records: Callable[[], None]) -> None:
        """Have every flush call ``flush_records`` (the queue store's ``flush``) before it
        writes a slot, so that no slot on file points at a record still in a buffer."""
        self._write_records_first = flush_records

    def flush(self) -> None:
        """Write the buffer out: one write (``write_vectors``) per run of adjacent slots,
        after the records they point at."""
        if not self._buffer:
            return
        self._write_records_first()
        n, buffer = self.segment_entry_count, self._buffer
        keys = sorted(buffer)
        start = 0
        while start < len(keys):  # each segment's slots in turn
            segment_end = (keys[start] // n + 1) * n
            stop = bisect_left(keys, segment_end, start)
            if keys[stop - 1] - keys[start] == stop - 1 - start:  # one run: no gap
                self._write_run(keys[start], list(map(buffer.__getitem__, keys[start:stop])))
            else:
                self._write_runs(keys[start:stop])
            start = stop
        buffer.clear()
        self._buffered_acks = 0

    def _write_runs(self, keys: list[int]) -> None:
        run_start, previous = keys[0], keys[0] - 1
        run: list[bytes] = []
        for seq_id in keys:
            if seq_id != previous + 1:
                self._write_run(run_start, run)
                run_start, run = seq_id, []
            run.append(self._buffer[seq_id])
            previous = seq_id
        self._write_run(run_start, run)

    def _write_run(self, first: int, slots: list[bytes]) -> None:
        """Write consecutive slots; a short write raises, leaving the buffer whole for the
        next flush."""
        segment, rel = divmod(first, self.segment_entry_count)
        write_vectors(self.files.for_writing(segment), slots, HEADER_BYTES + rel * SLOT_BYTES)

    def sync(self) -> None:
        """Flush, then fdatasync what was written since the last sync (and the directory
        when files came or went); every entry published before is then durable."""
        self.flushed_files().sync()

    def flushed_files(self) -> SegmentFiles:
        """Flush; the files whose ``sync`` makes every entry written durable (the first
        half of ``sync``, for a caller that syncs them with others)."""
        if self._closed:
            raise QueueClosed(f"queue index {self.directory!r} is closed")
        self.flush()
        return self.files

    # ------------------------------------------------------------------ reads

    def read(self, start: int, end: int) -> list[Entry]:
        """The entries with ``start <= seq id < end``, in seq order."""
        if self._closed:
            raise QueueClosed(f"queue index {self.directory!r} is closed")
        n = self.segment_entry_count
        found: dict[int, Entry] = {}
        seq_id = start
        while seq_id < end:
            segment = seq_id // n
            stop = min(end, (segment + 1) * n)
            if self._segments.get(segment) and segment in self.files.on_disk:
                found.update(self._read_slots(segment, seq_id, stop))
            seq_id = stop
        for seq_id, slot in self._buffer.items():
            if start <= seq_id < end:
                if slot is _EMPTY_SLOT:
                    found.pop(seq_id, None)
                else:
                    found[seq_id] = unpack_slot(seq_id, slot)
        return [found[s] for s in sorted(found)]

    def _read_slots(self, segment: int, start: int, stop: int) -> dict[int, Entry]:
        n = self.segment_entry_count
        rel = start - segment * n
        fd = self.files.written.get(segment)
        if fd is not None:
            data = os.pread(fd, (stop - start) * SLOT_BYTES, HEADER_BYTES + rel * SLOT_BYTES)
        else:
            fd = self.files.open_for_reading(segment)
            try:
                data = (
                    os.pread(fd, (stop - start) * SLOT_BYTES, HEADER_BYTES + rel * SLOT_BYTES)
                    if fd is not None
                    else b""
                )
            finally:
                if fd is not None:
                    os.close(fd)
        entries: dict[int, Entry] = {}
        for i in range(len(data) // SLOT_BYTES):
            at = i * SLOT_BYTES
            if data[at] == 0:
                continue
            try:
                entry = unpack_slot(start + i, data[at : at + SLOT_BYTES])
            except ValueError:
                self.torn_slots += 1
                log.error("%s: index slot of seq id %d is torn; skipped", self.directory, start + i)
                continue
            entries[start + i] = entry
        return entries

    def bounds(self) -> tuple[int, int]:
        """(first seq id of the oldest segment, end of the newest); (0, 0) when empty."""
        if not self._segments:
            return (0, 0)
        n = self.segment_entry_count
        return (min(self._segments) * n, (max(self._segments) + 1) * n)

    def segment_counts(self) -> dict[int, int]:
        """Unacked entries per segment (what the recovery terms save)."""
        return dict(self._segments)

    def __len__(self) -> int:
        return sum(self._segments.values())

    # ------------------------------------------------------------------ ending

    def close(self) -> None:
        """Flush and fsync everything, then release the directory."""
        if self._closed:
            return
        try:
            self.sync()
        finally:
            self._release()

    def delete(self) -> None:
        """Delete every segment file; the index is then empty and still open."""
        self._buffer.clear()
        self._buffered_acks = 0
        self._segments.clear()
        self.files.delete_all()

    def _release(self) -> None:
        self._closed = True
        self.files.close()
        os.close(self._lock_fd)
        os.close(self._dir_fd)

    def abandon(self) -> None:
        """Drop everything unwritten and release the directory, as a crash would."""
        if not self._closed:
            self._release()

    def __repr__(self) -> str:
        return (
            f"QueueIndex({self.directory!r}, segments={len(self._segments)}, "
            f"buffered={len(self._buffer)})"
        )


def _nothing() -> None:
    """No records to write first (an index without a queue store)."""


def _read_or_empty(name: str, dir_fd: int) -> bytes:
    try:
        fd = os.open(name, os.O_RDONLY, dir_fd=dir_fd)
    except FileNotFoundError:
        return b""
    with open(fd, "rb") as file:
        return file.read()

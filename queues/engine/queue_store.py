"""``QueueStore``: one queue's own store for small messages (RabbitMQ's per-queue store v2).

Messages below ``embed_msgs_below`` (4096 bytes, properties plus body) live here instead
of the shared store: one queue, one writer, no reference counts. The records of seq ids
``seg*N .. seg*N+N-1`` are appended, in write order, to the record area of the index's
segment file ``<seg>.qi`` (``queue_index``: the store shares the index's ``SegmentFiles``,
so a group commit fdatasyncs each segment once, its slots and its records together)::

    size u32 | crc32 u32 of the data | data (the encoded message, ``size`` bytes)

The index keeps each record's offset and size. A read checks both the size and the CRC:
a record that fails never reaches a consumer (``CorruptMessage``; recovery drops it, logs
and counts it). There is no per-message removal on disk: a segment file is deleted when
its last index entry and its last record are both gone (``SegmentFiles.delete_unused``: a
transient message paged out has a record and no entry).

Writes are buffered (up to ``max_cache_bytes``, 512,000 as RabbitMQ's, which one batch
of ``write_many`` may overrun) as runs of records of consecutive seq ids laid back to back;
the flush computes their headers a run at a time and writes each run with one pwritev
(headers and data as they are, no copy); the index's ``sync`` fdatasyncs the files they
went to. A record written and removed before the flush is never written.

Races this module guards against (one thread of control; a queue process owns it):

- a crash after a write but before its sync: the record may be missing, short or torn;
  its index entry was not confirmed either, and recovery's CRC check drops it;
- a segment file deleted and a later one of the same number: the store's next record
  there starts after whatever the new file holds, and a read never goes through a
  descriptor of the deleted file (``SegmentFiles.reader`` drops it with the file);
- a crash after a segment's last entry and record went but before the unlink reached
  the disk: the index's recovery deletes a segment file without an entry to keep.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable
from itertools import accumulate
from typing import TypeVar

from isal.isal_zlib import crc32

from ..errors import CorruptMessage, QueueClosed
from .queue_index import DEFAULT_SEGMENT_ENTRY_COUNT, records_at
from .segments import SegmentFiles, write_vectors

__all__ = ["QueueStore"]

MAX_CACHE_BYTES = 512_000  # classic_queue_store_v2_max_cache_size
RECORD = struct.Struct(">II")
RECORD_HEADER_BYTES = RECORD.size


class _Run:
    """Buffered records of consecutive seq ids from ``first``, back to back in one segment
    from ``offset`` to ``end``."""

    __slots__ = ("segment", "first", "offset", "end", "datas")

    def __init__(self, segment: int, first: int, offset: int, end: int, datas: list[bytes]) -> None:
        self.segment = segment
        self.first = first
        self.offset = offset
        self.end = end
        self.datas = datas


class QueueStore:
    """One queue's small-message records, in the segment files ``files`` (the index's, of
    the queue's directory ``directory``)."""

    def __init__(
        self,
        directory: str | os.PathLike,
        files: SegmentFiles,
        *,
        segment_entry_count: int = DEFAULT_SEGMENT_ENTRY_COUNT,
        max_cache_bytes: int = MAX_CACHE_BYTES,
    ) -> None:
        self.directory = os.fspath(directory)
        self.segment_entry_count = segment_entry_count
        self.max_cache_bytes = max_cache_bytes
        self._records_at = records_at(segment_entry_count)
        self._live: dict[int, int] = {}  # segment -> records not yet removed
        self._ends: dict[int, int] = {}  # segment -> offset of its next record
        self._runs: list[_Run] = []  # in the order written
        self._buffer: dict[int, bytes] = {}  # seq id -> data of each buffered record
        self._buffer_bytes = 0
        self._removed_from_runs = False  # since the last flush: runs have gaps
        self._files = files
        files.add_user(lambda segment: segment in self._live)
        self._closed = False

    # ------------------------------------------------------------------ recovery

    def recover(self, live: dict[int, int]) -> None:
        """Take each segment's live record count (from the recovery terms, or counted from
        the index by a scan)."""
        self._live = {int(s): int(c) for s, c in live.items() if int(c) > 0}

    def valid_records(self, segment: int, places: list[tuple[int, int]]) -> list[bool]:
        """Whether a whole record with a good CRC is at each (offset, size): one read of
        the segment file (recovery's check)."""
        view = memoryview(self._files.read_all(segment))  # slices of a view copy nothing
        return [
            offset >= self._records_at and _record_at(view, offset, size) is not None
            for offset, size in places
        ]

    # ------------------------------------------------------------------ changes

    def write(self, seq_id: int, data: bytes) -> int:
        """Buffer ``data`` as the record of ``seq_id``; the offset the index keeps."""
        if self._closed:
            raise QueueClosed(f"queue store {self.directory!r} is closed")
        segment = seq_id // self.segment_entry_count
        offset = self._ends.get(segment)
        if offset is None:
            offset = self._end_on_disk(segment)
        self._buffer[seq_id] = data
        self._add_run(segment, seq_id, offset, offset + RECORD_HEADER_BYTES + len(data), [data])
        if self._buffer_bytes >= self.max_cache_bytes:
            self.flush()
        return offset

    def write_many(self, first_seq_id: int, datas: list[bytes]) -> list[int]:
        """``write`` of consecutive seq ids from ``first_seq_id``; their offsets. A full
        buffer is written out first, so a failed write raises before any of them is taken."""
        if self._closed:
            raise QueueClosed(f"queue store {self.directory!r} is closed")
        if self._buffer_bytes >= self.max_cache_bytes:
            self.flush()
        n = self.segment_entry_count
        offsets: list[int] = []
        start = 0
        while start < len(datas):  # one run per segment the seq ids fall in
            seq_id = first_seq_id + start
            segment = seq_id // n
            stop = min(len(datas), start + (segment + 1) * n - seq_id)
            offsets += self._append_run(segment, seq_id, datas[start:stop])
            start = stop
        return offsets

    def _append_run(self, segment: int, first_seq_id: int, datas: list[bytes]) -> list[int]:
        begin = self._ends.get(segment)
        if begin is None:
            begin = self._end_on_disk(segment)
        offsets = list(accumulate(map(RECORD_HEADER_BYTES.__add__, map(len, datas)), initial=begin))
        self._buffer.update(zip(range(first_seq_id, first_seq_id + len(datas)), datas, strict=True))
        self._add_run(segment, first_seq_id, begin, offsets.pop(), datas)
        return offsets

    def _add_run(self, segment: int, first: int, offset: int, end: int, datas: list[bytes]) -> None:
        """Buffer ``datas`` (a list the run may keep) as the records from ``offset`` to
        ``end`` of ``first`` on: the last run, if they carry it on, else a new one."""
        runs = self._runs
        last = runs[-1] if runs else None
        if (
            last is not None
            and last.end == offset
            and last.segment == segment
            and last.first + len(last.datas) == first
        ):
            last.datas += datas
            last.end = end
        else:
            runs.append(_Run(segment, first, offset, end, datas))
        self._ends[segment] = end
        self._live[segment] = self._live.get(segment, 0) + len(datas)
        self._buffer_bytes += end - offset

    def _end_on_disk(self, segment: int) -> int:
        """Where a segment's next record goes when this open has not written it yet: after
        whatever an earlier open (or the index, creating the file) left there."""
        if segment not in self._files.on_disk:
            return self._records_at
        size = os.stat(self._files.name(segment), dir_fd=self._files.dir_fd).st_size
        return max(self._records_at, size)

    def remove(self, seq_ids: Iterable[int]) -> None:
        """Forget the records (written or buffered); a segment's file goes with the last
        of its records and of its index entries (``SegmentFiles.delete_unused``)."""
        n, buffer = self.segment_entry_count, self._buffer
        for seq_id in seq_ids:
            segment = seq_id // n
            data = buffer.pop(seq_id, None)
            if data is not None:
                self._buffer_bytes -= RECORD_HEADER_BYTES + len(data)
                self._removed_from_runs = True
            count = self._live.get(segment, 0) - 1
            if count > 0:
                self._live[segment] = count
                continue
            self._live.pop(segment, None)
            self._ends.pop(segment, None)
            for other in [s for s in buffer if s // n == segment]:
                self._buffer_bytes -= RECORD_HEADER_BYTES + len(buffer.pop(other))
                self._removed_from_runs = True
            self._files.delete_unused(segment)

    def flush(self) -> None:
        if not self._runs:
            return
        for run in self._runs:
            if self._removed_from_runs:
                self._write_kept_records(run)
            else:
                self._write_records(run.segment, run.offset, run.datas)
        self._runs.clear()
        self._buffer.clear()
        self._buffer_bytes = 0
        self._removed_from_runs = False

    def _write_kept_records(self, run: _Run) -> None:
        """Write the records of ``run`` still buffered, each stretch of them in one go."""
        buffer, offset = self._buffer, run.offset
        start = offset
        kept: list[bytes] = []
        for seq_id, data in enumerate(run.datas, run.first):
            if buffer.get(seq_id) is data:
                if not kept:
                    start = offset  # a stretch begins
                kept.append(data)
            elif kept:
                self._write_records(run.segment, start, kept)
                kept = []
            offset += RECORD_HEADER_BYTES + len(data)
        if kept:
            self._write_records(run.segment, start, kept)

    def _write_records(self, segment: int, offset: int, datas: list[bytes]) -> None:
        """Write records of ``datas`` back to back from ``offset``: their headers, computed
        here a pass at a time, and their data, as they are."""
        vectors = [b""] * (2 * len(datas))
        vectors[0::2] = map(RECORD.pack, map(len, datas), map(crc32, datas))
        vectors[1::2] = datas
        write_vectors(self._files.for_writing(segment), vectors, offset)

    def sync(self) -> None:
        """Flush, then fdatasync every file written since the last sync."""
        self.flushed_files().sync()

    def flushed_files(self) -> SegmentFiles:
        """Flush; the files whose ``sync`` makes everything written durable (the first
        half of ``sync``, for a caller that syncs them with the index's slots)."""
        if self._closed:
            raise QueueClosed(f"queue store {self.directory!r} is closed")
        self.flush()
        return self._files

    # ------------------------------------------------------------------ reads

    def read(self, seq_id: int, offset: int, size: int) -> bytes:
        """The data of ``seq_id``'s record; ``CorruptMessage`` if it is not intact."""
        if self._closed:
            raise QueueClosed(f"queue store {self.directory!r} is closed")
        buffered = self._buffer.get(seq_id)
        if buffered is not None:
            return buffered
        segment = seq_id // self.segment_entry_count
        fd = self._files.reader(segment)
        record = (
            os.pread(fd, RECORD_HEADER_BYTES + size, offset)
            if fd is not None and offset >= self._records_at
            else b""
        )
        data = _record_at(record, 0, size)
        if data is None:
            raise CorruptMessage(
                f"{self.directory}/{self._files.name(segment)}: the record of seq id "
                f"{seq_id} at offset {offset} is missing or fails its size or CRC check"
            )
        return data

    @property
    def live_counts(self) -> dict[int, int]:
        """Live records per segment (what the recovery terms save)."""
        return dict(self._live)

    # ------------------------------------------------------------------ ending

    def close(self) -> None:
        """Write out and sync everything (the index closes the files)."""
        if self._closed:
            return
        try:
            self.sync()
        finally:
            self._closed = True

    def delete(self) -> None:
        """Forget every record (the index deletes the files)."""
        self._runs.clear()
        self._buffer.clear()
        self._buffer_bytes = 0
        self._removed_from_runs = False
        self._live.clear()
        self._ends.clear()

    def abandon(self) -> None:
        """Write nothing more, as a crash would."""
        self._closed = True


_Data = TypeVar("_Data", bytes, memoryview)


def _record_at(data: _Data, offset: int, size: int) -> _Data | None:
    """The record's data if a whole record of ``size`` bytes with a good CRC is there."""
    if offset < 0 or offset + RECORD_HEADER_BYTES + size > len(data):
        return None
    length, crc = RECORD.unpack_from(data, offset)
    start = offset + RECORD_HEADER_BYTES
    payload = data[start : start + size]
    if length != size or crc32(payload) != crc:
        return None
    return payload

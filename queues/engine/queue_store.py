"""``QueueStore``: one queue's own store for small messages (RabbitMQ's per-queue store v2).

Messages below ``embed_msgs_below`` (4096 bytes, properties plus body) live here instead
of the shared store: one queue, one writer, no reference counts. Segment ``<seg>.qs``
holds the messages of seq ids ``seg*N .. seg*N+N-1``, as the index's ``<seg>.qi`` does.

File: a 64-byte header (magic "WQST", version, entry count, first seq id, CRC-32 at 60),
then records appended in write order::

    size u32 | crc32 u32 of the data | data (the encoded message, ``size`` bytes)

The index keeps each record's offset and size. A read checks both the size and the CRC:
a record that fails never reaches a consumer (``CorruptMessage``; recovery drops it, logs
and counts it). There is no per-message removal on disk: a segment file is deleted when
its last live record goes (``remove``), which is when its index segment empties for every
message the index holds.

Writes are buffered (up to ``max_cache_bytes``, 512,000 as RabbitMQ's, which one batch
of ``write_many`` may overrun) as runs of records of consecutive seq ids laid back to back;
the flush computes their headers a run at a time and writes each run with one pwritev
(headers and data as they are, no copy); ``sync`` writes the buffer and fdatasyncs the
files it touched. A record written and removed before the flush is never written.

Races this module guards against (one thread of control; a queue process owns it):

- a crash after a write but before its sync: the record may be missing, short or torn;
  its index entry was not confirmed either, and recovery's CRC check drops it;
- a crash after the last record of a segment was removed but before the unlink reached
  the disk: recovery deletes segment files no index entry points into.
"""

from __future__ import annotations

import logging
import os
import struct
from collections.abc import Iterable
from itertools import accumulate
from typing import TypeVar

from isal.isal_zlib import crc32

from ..errors import CorruptMessage, QueueClosed
from .queue_index import DEFAULT_SEGMENT_ENTRY_COUNT
from .segments import HEADER_BYTES, SegmentFiles, segment_header

__all__ = ["QueueStore"]

log = logging.getLogger("warren.queues")

STORE_SUFFIX = ".qs"
MAGIC = b"WQST"
VERSION = 1
MAX_CACHE_BYTES = 512_000  # classic_queue_store_v2_max_cache_size
RECORD = struct.Struct(">II")
RECORD_HEADER_BYTES = RECORD.size
_MAX_VECTORS = 1024  # IOV_MAX on Linux: buffers per pwritev


def store_header(segment: int, entry_count: int) -> bytes:
    return segment_header(MAGIC, VERSION, segment, entry_count)


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
    """One queue's small-message segments, in ``directory`` (the queue's directory)."""

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        segment_entry_count: int = DEFAULT_SEGMENT_ENTRY_COUNT,
        max_cache_bytes: int = MAX_CACHE_BYTES,
    ) -> None:
        self.directory = os.fspath(directory)
        self.segment_entry_count = segment_entry_count
        self.max_cache_bytes = max_cache_bytes
        os.makedirs(self.directory, exist_ok=True)
        self._dir_fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
        self._live: dict[int, int] = {}  # segment -> records not yet removed
        self._ends: dict[int, int] = {}  # segment -> offset of its next record
        self._runs: list[_Run] = []  # in the order written
        self._buffer: dict[int, bytes] = {}  # seq id -> data of each buffered record
        self._buffer_bytes = 0
        self._removed_from_runs = False  # since the last flush: runs have gaps
        self._read_fd: tuple[int, int] | None = None  # (segment, fd)
        self._files = SegmentFiles(
            self._dir_fd, STORE_SUFFIX, lambda segment: store_header(segment, segment_entry_count)
        )
        self._closed = False

    # ------------------------------------------------------------------ recovery

    def recover(self, live: dict[int, int]) -> None:
        """Take each segment's live record count (from the recovery terms, or counted from
        the index by a scan); delete segment files without any."""
        self._live = {int(s): int(c) for s, c in live.items() if int(c) > 0}
        for segment in self._files.on_disk - set(self._live):
            self._delete_file(segment)

    def valid_records(self, segment: int, places: list[tuple[int, int]]) -> list[bool]:
        """Whether a whole record with a good CRC is at each (offset, size): one read of
        the segment file (recovery's check)."""
        data = self._files.read_all(segment)
        if data[:HEADER_BYTES] != store_header(segment, self.segment_entry_count):
            return [False] * len(places)
        view = memoryview(data)  # slices of a view copy nothing
        return [_record_at(view, offset, size) is not None for offset, size in places]

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
        whatever an earlier open left there."""
        if segment not in self._files.on_disk:
            return HEADER_BYTES
        return max(HEADER_BYTES, os.stat(self._files.name(segment), dir_fd=self._dir_fd).st_size)

    def remove(self, seq_ids: Iterable[int]) -> None:
        """Forget the records (written or buffered); a segment file goes with its last."""
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
            if segment in self._files.on_disk:
                self._delete_file(segment)

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
        _write_vectors(self._files.for_writing(segment), vectors, offset)

    def sync(self) -> None:
        """Flush, then fdatasync every file written since the last sync."""
        self.flushed_files().sync()

    def flushed_files(self) -> SegmentFiles:
        """Flush; the files whose ``sync`` makes everything written durable (the first
        half of ``sync``, for a caller that syncs them with others)."""
        if self._closed:
            raise QueueClosed(f"queue store {self.directory!r} is closed")
        self.flush()
        return self._files

    def _delete_file(self, segment: int) -> None:
        if self._read_fd is not None and self._read_fd[0] == segment:
            os.close(self._read_fd[1])
            self._read_fd = None
        self._files.delete(segment)

    # ------------------------------------------------------------------ reads

    def read(self, seq_id: int, offset: int, size: int) -> bytes:
        """The data of ``seq_id``'s record; ``CorruptMessage`` if it is not intact."""
        if self._closed:
            raise QueueClosed(f"queue store {self.directory!r} is closed")
        buffered = self._buffer.get(seq_id)
        if buffered is not None:
            return buffered
        segment = seq_id // self.segment_entry_count
        fd = self._files.written.get(segment)
        if fd is None:
            fd = self._reader(segment)
        record = os.pread(fd, RECORD_HEADER_BYTES + size, offset) if fd is not None else b""
        data = _record_at(record, 0, size)
        if data is None:
            raise CorruptMessage(
                f"{self.directory}/{segment}{STORE_SUFFIX}: the record of seq id {seq_id} "
                f"at offset {offset} is missing or fails its size or CRC check"
            )
        return data

    def _reader(self, segment: int) -> int | None:
        if self._read_fd is not None:
            if self._read_fd[0] == segment:
                return self._read_fd[1]
            os.close(self._read_fd[1])
            self._read_fd = None
        fd = self._files.open_for_reading(segment)
        if fd is not None:
            self._read_fd = (segment, fd)
        return fd

    @property
    def live_counts(self) -> dict[int, int]:
        """Live records per segment (what the recovery terms save)."""
        return dict(self._live)

    # ------------------------------------------------------------------ ending

    def close(self) -> None:
        if self._closed:
            return
        try:
            self.sync()
        finally:
            self.abandon()

    def delete(self) -> None:
        """Delete every segment file."""
        self._runs.clear()
        self._buffer.clear()
        self._buffer_bytes = 0
        self._removed_from_runs = False
        self._live.clear()
        self._ends.clear()
        if self._read_fd is not None:
            os.close(self._read_fd[1])
            self._read_fd = None
        self._files.delete_all()

    def abandon(self) -> None:
        """Release every file without writing anything more, as a crash would."""
        if self._closed:
            return
        self._closed = True
        self._files.close()
        if self._read_fd is not None:
            os.close(self._read_fd[1])
            self._read_fd = None
        os.close(self._dir_fd)


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


def _write_vectors(fd: int, vectors: list[bytes], offset: int) -> None:
    """pwritev all of ``vectors`` at ``offset``, IOV_MAX buffers at a time; a short write
    (which a regular file gives only when something is wrong) raises."""
    for at in range(0, len(vectors), _MAX_VECTORS):
        chunk = vectors[at : at + _MAX_VECTORS]
        expected = sum(map(len, chunk))
        written = os.pwritev(fd, chunk, offset)
        if written != expected:
            raise OSError(f"short write: {written} of {expected} bytes at offset {offset}")
        offset += written

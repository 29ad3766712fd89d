"""The files of quorum queues' log (seed 002 A4.3, Ra's log): one write-ahead log for the
whole node, a queue's segment files, and its snapshot.

Entries. Every command of a quorum queue is an entry of its log: an ``index`` (1, 2, ...
per queue), a ``term`` (the cluster's epoch; 1 on a lone node) and a command
(``warren.queues.engine.quorum_queue``). On disk an entry is a record::

    crc32 u32 | length u32 | index u64 | term u64 | owner length u16 | owner | command

big-endian; ``length`` counts what follows the first eight bytes, and the CRC covers the
same bytes. ``owner`` is the queue's directory, relative to the node's data directory
(the WAL tells the queues' records apart by it); a segment holds the records as the WAL
did, owner and all, so that moving them there is a copy (a queue's records in its own
files may also have an empty owner).

WAL (``WalFiles``). ``<quorum dir>/wal/<n:08d>.wal``: the one process that writes it
(``warren: wal``) appends the records every quorum queue hands it, fdatasyncs once for all
of them (group commit), and only then answers: an entry is durable once in the WAL. A
file past ``WAL_MAX_BYTES`` is closed and a new one begun; the closed one's entries are
written to the segment files of their queues (``SegmentWriter``), which are
fdatasync'd before the WAL file is deleted. At its start the process reads every WAL
file left (``read_wal``) into segments the same way before any quorum queue starts.

Segments. ``<queue dir>/log/<first index:020d>.segment``, at most ``SEGMENT_ENTRIES``
records each, in index order, written only by the WAL's process (entries that follow a
gap, which damage left, begin a new file: a file's entries never skip). A queue reads them
(``read_segments``) when it starts, and deletes the files wholly below what it still
needs once a snapshot covers them (``delete_segments_below``; never the newest, which the
WAL's process may be appending to).

Snapshot (``write_snapshot``, ``read_snapshot``). ``<queue dir>/snapshot``: the queue's
state at an index, written to a temporary file, fdatasync'd and renamed over the last: a
torn one is never read, an older one stays whole until then::

    crc32 u32 | header length u32 | header (JSON) | columns

big-endian; the CRC covers what follows it. The header holds the scalars, the columns the
live messages' figures packed by the queue (``quorum_queue``): a snapshot of a deep queue
is written often enough that a per-message JSON encoding was most of a queue's work.

Races guarded against:
- a crash in the middle of a record (a torn tail) or a flipped bit: reading stops at the
  first record whose length or CRC does not hold; what follows was never confirmed in
  the WAL (a group commit confirms only what its fdatasync covered), and a segment's
  torn tail is written again from the WAL, which is deleted only after the segments'
  fdatasync;
- a crash while a closed WAL file's entries go to segments: the file is still there at
  the next start and written again; entries a segment has already (an index not above
  its last) are skipped;
- a queue deleted while its entries are in the WAL: its tombstone drops them (from the
  memtable at once, from a WAL file read again up to it), so none is written to a
  segment after the queue's directory went; the directory itself says nothing (a
  cluster's follower gets no empty one, and an unsynced one may go with a crash), so
  a queue's entries make it when it is missing.
"""

from __future__ import annotations

import json
import logging
import os
import re
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

from isal.isal_zlib import crc32

from warren.store import replicated_io

from ..durable_files import fsync_directory

log = logging.getLogger(__name__)

HEADER = struct.Struct(">IIQQH")  # crc, length, index, term, owner length
FRAME = struct.Struct(">II")  # the header's first two: crc, length
HEADER_TAIL = struct.Struct(">QQH")  # and the rest, where the CRC begins
WAL_MAX_BYTES = 64 * 1024 * 1024  # a WAL file is closed past this (Ra's wal_max_size_bytes)
SEGMENT_ENTRIES = 4096  # records per segment file (Ra's segment_max_entries)
QUORUM_DIRECTORY = "quorum"  # in the node's data directory: the WAL's files under it
WAL_DIRECTORY = "wal"
OWNER = re.compile(r"queues/[A-Za-z0-9_.~-]+")  # a queue's directory (``definitions``)
TOMBSTONE = b"forget"  # with index 0: the queue's records before it are no more
LOG_DIRECTORY = "log"
WAL_SUFFIX = ".wal"
SEGMENT_SUFFIX = ".segment"
SNAPSHOT_FILE = "snapshot"
SNAPSHOT_WORD = struct.Struct(">I")  # a snapshot's CRC, and its header's length


@dataclass(frozen=True, slots=True)
class Entry:
    index: int
    term: int
    command: bytes


def pack_entry(index: int, term: int, command: bytes, owner: bytes = b"") -> bytes:
    """One record (the module docstring's layout)."""
    frame, body = entry_parts(index, term, owner, (command,))
    return frame + body


def entry_parts(
    index: int, term: int, owner: bytes, command: tuple[bytes, ...]
) -> tuple[bytes, bytes]:
    """One record of the command whose parts are ``command``, as its frame (CRC and
    length) and the rest, which the frame's CRC covers: joined, they are the record
    (one copy of a message's body fewer than ``pack_entry``)."""
    body = b"".join((HEADER_TAIL.pack(index, term, len(owner)), owner, *command))
    return FRAME.pack(crc32(body), len(body)), body


def _walk(
    view: memoryview, checked: bool = True, offset: int = 0
) -> Iterator[tuple[int, int, int, int, int]]:
    """(start, owner start, owner end, body end, index) of each whole, correct record of
    ``view`` from ``offset`` (where one begins), in order, up to the first torn or
    corrupt one (without ``checked``, of records known correct: their CRCs are not
    computed again)."""
    end = len(view)
    while offset + HEADER.size <= end:
        crc, length, index, _, owner_length = HEADER.unpack_from(view, offset)
        body_end = offset + 8 + length
        if length < HEADER.size - 8 + owner_length or body_end > end:
            return
        if checked and crc32(view[offset + 8 : body_end]) != crc:
            return
        yield offset, offset + HEADER.size, offset + HEADER.size + owner_length, body_end, index
        offset = body_end


def unpack_records(data: bytes | memoryview) -> Iterator[tuple[bytes, Entry]]:
    """(owner, entry) of each whole record of ``data``, in order, up to the first torn or
    corrupt one."""
    view = memoryview(data)
    for start, owner_start, owner_end, body_end, index in _walk(view):
        term = HEADER.unpack_from(view, start)[3]
        yield (
            bytes(view[owner_start:owner_end]),
            Entry(index, term, bytes(view[owner_end:body_end])),
        )


def split_records(
    data: bytes | memoryview, checked: bool = True
) -> Iterator[tuple[bytes, int, memoryview]]:
    """(owner, index, the record whole) of each whole record of ``data``, in order, up
    to the first torn or corrupt one (``checked``: as ``_walk``)."""
    view = memoryview(data)
    for start, owner_start, owner_end, body_end, index in _walk(view, checked):
        yield bytes(view[owner_start:owner_end]), index, view[start:body_end]


def record_start(data: bytes, offset: int) -> int:
    """Where the record that byte ``offset`` of ``data`` lies in begins (past the whole,
    correct records: where they end)."""
    start = 0
    for record, _, _, body_end, _ in _walk(memoryview(data)):
        start = record if offset < body_end else body_end
        if offset < body_end:
            break
    return start


def valid_length(data: bytes, owner: bytes | None = None) -> int:
    """How many leading bytes of ``data`` are whole, correct records (of ``owner`` only,
    when given)."""
    view, valid = memoryview(data), 0
    for _, owner_start, owner_end, body_end, _ in _walk(view):
        if owner is not None and view[owner_start:owner_end] != owner:
            break
        valid = body_end
    return valid


# ---------------------------------------------------------------------- the WAL


class WalFiles:
    """The node's WAL files in ``directory``: the one being written and those before it."""

    def __init__(self, directory: str, max_bytes: int = WAL_MAX_BYTES) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        os.makedirs(directory, exist_ok=True)
        self.left = self.files()  # what an earlier run left, oldest first
        number = int(os.path.basename(self.left[-1])[:8]) + 1 if self.left else 1
        self._fd = -1
        self.size = 0
        self._open(number)
        self.syncs = 0
        self.bytes_written = 0

    def files(self) -> list[str]:
        return sorted(
            os.path.join(self.directory, name)
            for name in os.listdir(self.directory)
            if name.endswith(WAL_SUFFIX) and name[:8].isdigit()
        )

    def _open(self, number: int) -> None:
        self.path = os.path.join(self.directory, f"{number:08d}{WAL_SUFFIX}")
        self._fd = replicated_io.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.size = 0
        fsync_directory(self.directory)

    def append(self, records: list[bytes]) -> None:
        written = replicated_io.write(self._fd, b"".join(records))
        self.size += written
        self.bytes_written += written

    def sync(self) -> None:
        replicated_io.fdatasync(self._fd)
        self.syncs += 1

    @property
    def full(self) -> bool:
        return self.size >= self.max_bytes

    def roll(self) -> str:
        """Close the file being written (synced) and begin the next; the closed one's path."""
        closed = self.path
        replicated_io.fdatasync(self._fd)
        os.close(self._fd)
        self._open(int(os.path.basename(closed)[:8]) + 1)
        return closed

    def remove(self, path: str) -> None:
        replicated_io.unlink(path)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class Wal:
    """The node's WAL as its process runs it: the files, each queue's records in the file
    being written (its memtable), and the move of a closed file's entries to segments.
    ``owner`` is a queue's directory relative to ``data_dir``."""

    def __init__(
        self,
        data_dir: str,
        max_bytes: int = WAL_MAX_BYTES,
        segment_entries: int = SEGMENT_ENTRIES,
    ) -> None:
        self.data_dir = data_dir
        self.files = WalFiles(os.path.join(data_dir, QUORUM_DIRECTORY, WAL_DIRECTORY), max_bytes)
        self.segments = SegmentWriter(segment_entries)
        self._memtables: dict[str, list[bytes]] = {}
        self._unwritten: list[bytes] = []
        self.unsynced = 0  # batches written since the last fdatasync
        self.records_synced = 0
        self.segment_writes = 0
        for path in self.files.left:  # what a run before left: into segments first
            for owner, records in read_wal(path).items():
                self._to_segments(owner, records)
            self.files.remove(path)

    def add(self, owner: str, records: bytes) -> None:
        """Take a queue's records for the next ``commit``; ``ValueError`` (nothing taken)
        for an owner that is not a queue's directory or bytes that are not whole, correct
        records."""
        check_owner(owner)
        if valid_length(records, owner.encode()) != len(records):
            raise ValueError(
                f"records of {owner}: not whole, correct records of that queue; none taken"
            )
        self._unwritten.append(records)
        self._memtables.setdefault(owner, []).append(records)

    def commit(self, sync: bool = True) -> int:
        """Write what ``add`` took and, with ``sync``, fdatasync once (covering what
        earlier commits without it wrote); then, when the file is full, move its entries
        to their queues' segments and delete it. How many batches it wrote."""
        unwritten, self._unwritten = self._unwritten, []
        if unwritten:
            self.files.append(unwritten)
            self.unsynced += len(unwritten)
        if sync and self.unsynced:
            self.files.sync()
            self.records_synced += self.unsynced
            self.unsynced = 0
        if self.files.full:
            closed = self.files.roll()  # fdatasync'd
            self.records_synced += self.unsynced
            self.unsynced = 0
            memtables, self._memtables = self._memtables, {}
            for owner, blobs in memtables.items():
                self._to_segments(
                    owner,
                    [
                        (index, record)
                        for blob in blobs  # checked when taken
                        for _, index, record in split_records(blob, checked=False)
                    ],
                )
            self.files.remove(closed)
        return len(unwritten)

    def entries(self, owner: str) -> bytes:
        """The queue's records in the file being written (call after a commit)."""
        check_owner(owner)
        return b"".join(self._memtables.get(owner, ()))

    def forget(self, owner: str) -> None:
        """The queue is being deleted: its records here are dropped, and a tombstone is
        taken for the next ``commit``, once which a WAL file read again (``read_wal``)
        holds none of them either: a queue declared again under the same name starts a
        log of its own."""
        check_owner(owner)
        self._memtables.pop(owner, None)
        self.segments.forget(os.path.join(self.data_dir, owner))
        self._unwritten.append(pack_entry(0, 0, TOMBSTONE, owner.encode()))

    def _to_segments(self, owner: str, records: list[tuple[int, memoryview]]) -> None:
        try:
            check_owner(owner)
        except ValueError as exc:
            log.error("WAL: %s; its entries are dropped", exc)
            return
        self.segment_writes += 1
        self.segments.write(os.path.join(self.data_dir, owner), records)

    def close(self) -> None:
        self.files.close()


def check_owner(owner: str) -> None:
    """``ValueError`` unless ``owner`` names a queue's directory (``queues/<one name>``)."""
    if OWNER.fullmatch(owner) is None or owner.endswith(("/.", "/..")):
        raise ValueError(f"{owner!r} is not a queue's directory")


def read_wal(path: str) -> dict[str, list[tuple[int, memoryview]]]:
    """Each queue's records in a WAL file (by queue directory), in the order written, with
    their indexes."""
    with open(path, "rb") as file:
        data = file.read()
    records: dict[str, list[tuple[int, memoryview]]] = {}
    for owner, index, record in split_records(data):
        name = owner.decode(errors="replace")  # a bad name is refused where it is used
        if index == 0:  # a tombstone (an entry's index is 1 or more)
            records.pop(name, None)  # the queue was deleted: what came before is not its
            continue
        records.setdefault(name, []).append((index, record))
    return records


# ---------------------------------------------------------------------- segments


def segment_files(queue_directory: str) -> list[tuple[int, str]]:
    """(first index, path) of each segment file of a queue, in index order."""
    directory = os.path.join(queue_directory, LOG_DIRECTORY)
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(
        (int(name[:20]), os.path.join(directory, name))
        for name in names
        if name.endswith(SEGMENT_SUFFIX) and name[:20].isdigit()
    )


class _SegmentTail(NamedTuple):
    path: str
    records: int  # records in it
    size: int  # bytes of whole records
    last_index: int


def _tail_of(queue_directory: str) -> _SegmentTail | None:
    """The newest segment of a queue as it is on disk (a torn tail not counted)."""
    files = segment_files(queue_directory)
    if not files:
        return None
    first, path = files[-1]
    with open(path, "rb") as file:
        data = file.read()
    size = valid_length(data)
    entries = [entry for _, entry in unpack_records(data[:size])]
    last = entries[-1].index if entries else first - 1
    return _SegmentTail(path, len(entries), size, last)


class SegmentWriter:
    """Writes queues' entries to their segment files (the WAL's process alone does),
    remembering each queue's newest segment between calls."""

    def __init__(self, max_entries: int = SEGMENT_ENTRIES) -> None:
        self.max_entries = max_entries
        self._tails: dict[str, _SegmentTail | None] = {}

    def last_index(self, queue_directory: str) -> int:
        """The highest index a queue's segments hold (0: none)."""
        if queue_directory not in self._tails:
            self._tails[queue_directory] = _tail_of(queue_directory)
        tail = self._tails[queue_directory]
        return tail.last_index if tail is not None else 0

    def forget(self, queue_directory: str) -> None:
        self._tails.pop(queue_directory, None)

    def write(self, queue_directory: str, records: Iterable[tuple[int, memoryview]]) -> int:
        """Append the records (index, record as the WAL holds it) above the segments' last
        index, fdatasync'd, copied as they are; how many went.
        The queue's directory is made when it is missing: the log, not the directory,
        says a queue lives (a cluster's follower gets no empty directory, and a crash may
        lose one never synced), and a deleted queue's entries never come here (its
        tombstone dropped them)."""
        last = self.last_index(queue_directory)
        fresh: list[tuple[int, memoryview]] = []
        for index, record in records:
            if index <= last:
                continue  # a segment holds it already
            if fresh and index != fresh[-1][0] + 1:
                log.error(
                    "%s: entry %d does not follow %d; it and what follows are not written",
                    queue_directory,
                    index,
                    fresh[-1][0],
                )
                break
            fresh.append((index, record))
        if not fresh:
            return 0
        log_directory = os.path.join(queue_directory, LOG_DIRECTORY)
        if not os.path.isdir(log_directory):
            made = not os.path.isdir(queue_directory)
            os.makedirs(log_directory, exist_ok=True)
            fsync_directory(queue_directory)
            if made:
                fsync_directory(os.path.dirname(queue_directory))
        tail = self._tails[queue_directory]
        if fresh[0][0] != last + 1:
            # the queue went on past entries a damaged file lost: a segment of their own,
            # so that the gap stays one (its start reads it as lost, never reused)
            log.error(
                "%s: entries %d to %d are lost (damaged); the log goes on at %d",
                queue_directory,
                last + 1,
                fresh[0][0] - 1,
                fresh[0][0],
            )
            tail = None
        written = 0
        while written < len(fresh):
            if tail is None or tail.records >= self.max_entries:
                name = f"{fresh[written][0]:020d}{SEGMENT_SUFFIX}"
                path = os.path.join(log_directory, name)
                tail = _SegmentTail(path, 0, 0, fresh[written][0] - 1)
                fd = replicated_io.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                fsync_directory(log_directory)
            else:
                fd = replicated_io.open(tail.path, os.O_WRONLY, 0o644)
            try:
                room = self.max_entries - tail.records
                batch = fresh[written : written + room]
                replicated_io.ftruncate(fd, tail.size)  # a torn tail goes
                joined = b"".join([record for _, record in batch])
                size = tail.size + replicated_io.pwrite(fd, joined, tail.size)
                replicated_io.fdatasync(fd)
            finally:
                os.close(fd)
            tail = _SegmentTail(tail.path, tail.records + len(batch), size, batch[-1][0])
            written += len(batch)
        self._tails[queue_directory] = tail
        return written


def read_segments(
    queue_directory: str, from_index: int = 1, damaged: list[str] | None = None
) -> Iterator[Entry]:
    """A queue's entries from ``from_index`` on, in index order, as its segments hold them
    (each file read up to its first torn or corrupt record; such a file's path goes to
    ``damaged``)."""
    files = segment_files(queue_directory)
    for number, (_, path) in enumerate(files):
        if number + 1 < len(files) and files[number + 1][0] <= from_index:
            continue  # wholly below
        yield from _read_segment(path, from_index, damaged)


def segment_holding(queue_directory: str, index: int) -> str | None:
    """The path of the segment file that would hold ``index`` (None when none does)."""
    files = segment_files(queue_directory)
    for (first, path), (after, _) in zip(files, [*files[1:], (index + 1, "")], strict=True):
        if first <= index < after:
            return path
    return None


class SegmentRecords:
    """The records of one segment file, for a reader that takes a few of them (a quorum
    queue reading bodies back): the file is read from its start only as far as the
    records asked for (``FIRST_READ_BYTES``, then twice as much each time, never past
    its size when opened, ``key``'s), and walked by the records' lengths alone, up to
    the first one cut short or whose index does not follow the one before. No CRC is
    computed by the walk, but each record's when its command is taken (``command``), so
    that a reader taking a few records of a 4 MiB file pays for those."""

    FIRST_READ_BYTES = 512 * 1024

    def __init__(self, path: str) -> None:
        self.key = (path, os.path.getsize(path))  # a reader finds a grown file by it
        self._data = b""
        self._spans: dict[int, tuple[int, int, int]] = {}  # index -> start, command, end
        self._walked_to = 0  # where the next record begins
        self._last: int | None = None  # the last index walked
        self._ended = False

    def command(self, index: int) -> bytes | None:
        """The command of record ``index``; None when the file does not hold it whole
        and correct (not yet, or damaged)."""
        span = self.span(index)
        return None if span is None else _checked_command(self._data, span)

    def span(self, index: int) -> tuple[int, int, int] | None:
        """Where record ``index`` lies, walking on to it; None when the file lacks it."""
        while not self._ended and (self._last is None or self._last < index):
            self._walk_on(index)
        return self._spans.get(index)

    def _walk_on(self, wanted: float) -> None:
        for start, _, owner_end, body_end, index in _walk(
            memoryview(self._data), False, self._walked_to
        ):
            if self._last is not None and index != self._last + 1:
                self._ended = True
                return
            self._spans[index] = (start, owner_end, body_end)
            self._last, self._walked_to = index, body_end
            if index >= wanted:
                return
        # the walk stopped at the end of what was read, or at a record cut short
        path, size = self.key
        if len(self._data) >= size:
            self._ended = True
            return
        with open(path, "rb") as file:
            data = file.read(min(size, max(self.FIRST_READ_BYTES, 2 * len(self._data))))
        if len(data) <= len(self._data):
            self._ended = True  # cut since it was opened: what was read stays as read
            return
        self._data = data


def last_whole_index(path: str) -> int | None:
    """The index of the last whole record of a segment file whose indexes follow each
    other from its first, found by the records' headers alone (read one by one: a
    segment of large bodies is never read whole); None when it holds none."""
    last = None
    with open(path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        offset = 0
        while offset + HEADER.size <= size:
            header = os.pread(file.fileno(), HEADER.size, offset)
            if len(header) < HEADER.size:
                break
            _, length, index, _, owner_length = HEADER.unpack(header)
            body_end = offset + 8 + length
            if length < HEADER.size - 8 + owner_length or body_end > size:
                break
            if last is not None and index != last + 1:
                break
            last, offset = index, body_end
    return last


def _checked_command(data: bytes, span: tuple[int, int, int]) -> bytes | None:
    """The command of the record ``span`` (start, command start, end) locates in
    ``data``; None when the record fails its CRC."""
    start, command_at, end = span
    crc, _ = FRAME.unpack_from(data, start)
    if crc32(memoryview(data)[start + FRAME.size : end]) != crc:
        return None
    return data[command_at:end]


def _read_segment(path: str, from_index: int, damaged: list[str] | None) -> Iterator[Entry]:
    """The file's entries from ``from_index`` on (the records below it are stepped over
    by their lengths, their CRCs not computed), up to the first record cut short or
    failing its CRC."""
    with open(path, "rb") as file:
        data = file.read()
    view, read_to = memoryview(data), 0
    for start, _, owner_end, body_end, index in _walk(view, checked=False):
        if index >= from_index:
            command = _checked_command(data, (start, owner_end, body_end))
            if command is None:
                break
            yield Entry(index, HEADER.unpack_from(view, start)[3], command)
        read_to = body_end
    if damaged is not None and read_to != len(data):
        damaged.append(path)


def delete_segments_below(queue_directory: str, index: int) -> int:
    """Delete the segment files whose every entry is below ``index`` (never the newest);
    how many went."""
    files = segment_files(queue_directory)
    deleted = 0
    for (_, path), (next_first, _) in zip(files, files[1:], strict=False):
        if next_first <= index:
            replicated_io.unlink(path)
            deleted += 1
    return deleted


# ---------------------------------------------------------------------- snapshots


def write_snapshot(path: str, header: dict[str, Any], columns: bytes = b"") -> None:
    """Write ``header`` (JSON) and ``columns`` as the snapshot at ``path``, durably, whole
    or not at all."""
    encoded = json.dumps(header, separators=(",", ":")).encode()
    body = SNAPSHOT_WORD.pack(len(encoded)) + encoded + columns
    temporary = path + ".tmp"
    fd = replicated_io.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        replicated_io.write(fd, SNAPSHOT_WORD.pack(crc32(body)) + body)
        replicated_io.fdatasync(fd)
    finally:
        os.close(fd)
    replicated_io.rename(temporary, path)
    fsync_directory(os.path.dirname(path))


def read_snapshot(path: str) -> tuple[dict[str, Any], memoryview] | None:
    """The snapshot at ``path``: its header and its columns; None when there is none.
    ``ValueError`` for one that fails its check (a snapshot is renamed into place whole: a
    bad one is damage, not a crash)."""
    try:
        with open(path, "rb") as file:
            data = file.read()
    except FileNotFoundError:
        return None
    if len(data) < SNAPSHOT_WORD.size:
        raise ValueError(f"{path}: {len(data)} bytes, shorter than its CRC")
    (crc,) = SNAPSHOT_WORD.unpack_from(data)
    body = data[SNAPSHOT_WORD.size :]
    if crc32(body) != crc:
        raise ValueError(f"{path}: fails its CRC")
    if body[:1] == b"{":  # an earlier version's: JSON alone (a header is never 2 GiB)
        legacy: dict[str, Any] = json.loads(body)
        return legacy, memoryview(b"")
    try:
        (length,) = SNAPSHOT_WORD.unpack_from(body)
        end = SNAPSHOT_WORD.size + length
        header: dict[str, Any] = json.loads(body[SNAPSHOT_WORD.size : end])
    except (ValueError, struct.error):
        raise ValueError(f"{path}: its CRC holds but its header is not this version's") from None
    return header, memoryview(body)[end:]

"""``StreamLog``: the append-only log of one stream (RabbitMQ's stream queue type), in
Osiris's on-disk format; ``StreamReader``: a reader of that log that opens the files
itself, as a reader in another process does.

What it owns: one directory holding the stream's segment files
``<first offset, 20 digits>.segment``, each with an index file of the same name
``.index``, a ``.lock`` file that keeps a second writer out, and an ``.identity`` file
holding a random id made when the directory is (a reader that kept an offset across a
restart, such as a Spark query's checkpoint, tells by it a stream deleted and declared
again under the same name from the one it read). Every record has an
offset; offsets grow by one a record and never repeat. Records are written in chunks (one
``append`` is one chunk); a chunk's id is the offset of its first record, and a segment
file is named after the id of its first chunk.

On-disk format (Osiris's ``osiris_log``; every integer big-endian, timestamps in
milliseconds, signed)::

    segment file:  "OSIL" | version u32 = 1 | chunk | chunk | ...
    index file:    "OSII" | version u32 = 1 | index record | index record | ...

    chunk header, 48 bytes:
      0  magic u4 = 5 | version u4 = 0      (byte 0 is 0x50)
      1  chunk type u8: 0 user, 1 tracking delta, 2 tracking snapshot
      2  number of entries u16
      4  number of records u32              (the offsets the chunk takes)
      8  timestamp i64
     16  epoch u64
     24  chunk id u64                       (the chunk's first offset)
     32  CRC-32 of the data u32             (the data only, not the filter or trailer)
     36  data length u32
     40  trailer length u32
     44  filter (bloom) size u8 | reserved 24 bits = 0
    then the filter (filter size bytes), the data (entries), the trailer.

    simple entry:     0 u1 | body length u31 | body
    sub-batch entry:  1 u1 | compression u3 | 0 u4 | records u16 | uncompressed length u32
                      | length u32 | body (simple entries when compression is 0)

    index record, 29 bytes: chunk id u64 | timestamp i64 | epoch u64 | chunk position in
    the segment file u32 | chunk type u8

A user chunk holds one simple entry per record. A tracking delta chunk holds one simple
entry whose body is a list of ``type u8 | id size u8 | id | value u64`` (type 0: a
producer's last sequence, 1: a consumer's offset); a user chunk may carry the same list
as its trailer (the producer sequences of its records). A tracking snapshot chunk holds
one simple entry with the whole tracking state, where a producer's value is the chunk id
that last recorded it followed by its sequence (u64 u64). Tracking chunks take one offset
each and are never delivered to readers.

Protocol. ``append`` writes the chunk to the segment, then its index record, with plain
``write``s (the page cache); ``sync`` fdatasyncs the segment written since the last sync
(and the directory when files came or went) and then moves ``committed_offset`` to the
last offset: a group commit. ``begin_sync``, ``PendingSync.run`` and ``commit`` are the
same in three steps, so that the flush can run on another thread while the writer appends
on: ``begin_sync`` notes the last offset and duplicates the descriptors to flush (the
writer may close its own at a rollover meanwhile), ``run`` flushes them (an fdatasync
covers every write made before it began, whichever descriptor made it), and ``commit``
moves the committed offset to the noted one, never back. The newest segment's index
is not synced there: recovery walks the newest segment and rebuilds its index from it,
so an index left behind its segment by a power cut costs a rebuild, never a confirmed
record, and a commit costs one flush, not two. With ``sync=False`` the page cache is the policy:
``sync`` moves the committed offset without an fdatasync, so what was committed survives
the writer's death but not the machine's. A segment is closed before it would exceed
``max_segment_size_bytes`` or hold ``max_segment_chunks`` chunks (its first chunk always
goes in, whatever its size); under ``sync=True`` it is fdatasync'd then, so every segment
but the newest is whole on disk. The next segment starts with a snapshot of the tracking
state (when there is any), so that retention, which deletes whole segments oldest first,
never loses tracking.

Races this module guards against:

- writer against readers in other processes: a reader delivers a chunk only when its last
  offset is at or below the committed offset it is given (a number or a callable; the
  writer publishes the value only after the chunk and its index record are written, and
  synced under ``sync=True``), so it never reads a chunk still being written. It learns
  the committed offset from whoever owns the writer (a shared counter, a message, a small
  file); this module takes it as an argument and never guesses it from file sizes.
  Partial index records at an index file's end are ignored.
- retention against readers: retention unlinks the index first, then the segment. A
  reader keeps reading a segment it has open (the kernel frees the disk when it closes
  it); a reader that needs a segment which is gone moves on to the new first chunk, as
  Osiris's readers do. A reader created with an offset that is no longer in the stream
  raises ``OffsetOutOfRange``.
- a crash in the middle of an append: on open, the newest segment's chunks are walked
  from its start; the walk stops at the first chunk whose header is not whole or does not
  follow its predecessor (magic, version, type, chunk id), chunks at the end whose CRC
  fails are dropped as torn, and the file is truncated after the last good chunk. The
  index is compared with the walk and cut and rebuilt where it is behind, torn or wrong.
  An older segment is checked at its end only (its last index record must point at a
  chunk ending at the file's end) and walked the same way when it is not, except that a
  chunk at its end whose CRC fails is kept as damage: only the newest segment can end in
  a torn write. A chunk whose
  CRC fails with good chunks after it is damage, not a torn write: it is kept, and a
  reader raises ``StreamCorrupt`` there rather than deliver its bytes. An older
  segment's index records before its last are not checked, so a reader that positions
  itself by one checks the chunk header it points at, and finds its chunk from the
  headers when the two disagree (a damaged record never makes an intact chunk unread).
- a crash during rollover or retention: an index without its segment is deleted; a
  segment without an index is deleted when it is older than every indexed one (retention
  stopped between its two unlinks) and gets its index rebuilt otherwise.
- a failed flush: Linux may drop the pages an fdatasync could not write, or mark them
  clean, so a later flush can succeed with them gone. After one fails, ``begin_sync`` and
  ``commit`` raise: nothing more is committed until the stream is reopened and recovers
  from what the files show.

Tracking is rebuilt on open from the newest segment that starts with a snapshot (or from
the oldest segment when none does), replaying the deltas and user-chunk trailers after
it. The offsets tracking chunks take are kept as well (from the index records, which
recovery reads anyway), so that ``user_records`` counts the records a range holds, as a
reader gets them, without reading a chunk. The writer holds an exclusive ``flock`` on
``.lock``: a second writer raises ``StreamLocked``.
"""

from __future__ import annotations

import logging
import os
import struct
import time
import uuid
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterator, Mapping, Sequence
from itertools import chain, repeat
from typing import Literal, NamedTuple

from isal.isal_zlib import crc32

from warren.store import replicated_io
from warren.store.locks import lock_exclusive

from ..errors import OffsetOutOfRange, StreamCorrupt, StreamError, StreamLocked
from ..protocol import MAX_ENTRIES_PER_CHUNK, Timestamp

__all__ = [
    "ChunkHeader",
    "IndexRecord",
    "OffsetOutOfRange",
    "PendingSync",
    "SegmentInfo",
    "StreamCorrupt",
    "StreamError",
    "StreamLocked",
    "StreamLog",
    "StreamReader",
    "Timestamp",
    "check_chunk",
    "chunk_bodies",
    "chunk_ranges",
    "Tracking",
    "entry_bodies",
    "numbered_files",
    "read_index",
    "unpack_chunk",
    "verified_data",
    "walk_chunks",
]

log = logging.getLogger("warren.queues")

LOG_HEADER = b"OSIL" + (1).to_bytes(4, "big")
INDEX_HEADER = b"OSII" + (1).to_bytes(4, "big")
FILE_HEADER_BYTES = 8
SEGMENT_SUFFIX = ".segment"
INDEX_SUFFIX = ".index"
LOCK_FILE = ".lock"
IDENTITY_FILE = ".identity"

# osiris.hrl's ?MAGIC and ?VERSION. The format comment in osiris_log.erl draws the
# version nibble as 1, but every chunk Osiris writes carries 0, and so do ours.
CHUNK_MAGIC = 5
CHUNK_VERSION = 0
CHUNK_MAGIC_AND_VERSION = CHUNK_MAGIC << 4 | CHUNK_VERSION
CHUNK_USER = 0
CHUNK_TRACKING_DELTA = 1
CHUNK_TRACKING_SNAPSHOT = 2
CHUNK_HEADER = struct.Struct(">BBHIqQQIIIB3x")
CHUNK_HEADER_BYTES = CHUNK_HEADER.size  # 48
INDEX_RECORD = struct.Struct(">QqQIB")
INDEX_RECORD_BYTES = INDEX_RECORD.size  # 29
_ZERO_INDEX_RECORD = bytes(INDEX_RECORD_BYTES)

TRACKING_SEQUENCE = 0
TRACKING_OFFSET = 1
TRACKING_TIMESTAMP = 2  # read and ignored: this writer never records one
MAX_TRACKING_ID_BYTES = 255

SIMPLE_ENTRY_HEADER_BYTES = 4
SUB_BATCH_HEADER_BYTES = 11
MAX_RECORD_BYTES = 2**31 - 1
MAX_SEGMENT_BYTES = 2**32 - 1  # index records hold a chunk's position in 32 bits
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_I64 = struct.Struct(">q")
_SUB_BATCH = struct.Struct(">HII")
_SUB_BATCH_BIT = 0x80000000


class ChunkHeader(NamedTuple):
    """A chunk's 48-byte header and where the chunk starts in its segment file."""

    chunk_type: int
    entry_count: int
    record_count: int
    timestamp_ms: int
    epoch: int
    chunk_id: int
    data_crc: int
    data_bytes: int
    trailer_bytes: int
    filter_bytes: int
    position: int

    @property
    def data_position(self) -> int:
        return self.position + CHUNK_HEADER_BYTES + self.filter_bytes

    @property
    def end(self) -> int:
        return self.data_position + self.data_bytes + self.trailer_bytes

    @property
    def next_offset(self) -> int:
        return self.chunk_id + self.record_count

    def index_record(self) -> IndexRecord:
        return IndexRecord(
            self.chunk_id, self.timestamp_ms, self.epoch, self.position, self.chunk_type
        )


class IndexRecord(NamedTuple):
    chunk_id: int
    timestamp_ms: int
    epoch: int
    position: int
    chunk_type: int


class SegmentInfo(NamedTuple):
    first_offset: int
    segment_path: str
    index_path: str
    size_bytes: int  # the segment and its index


class Tracking(NamedTuple):
    """Producer id -> last sequence, consumer name -> offset."""

    producers: dict[str, int]
    consumers: dict[str, int]


Start = Literal["first", "last", "next"] | int | Timestamp
Record = tuple[int, int, bytes]  # offset, timestamp_ms, body


def segment_file_name(first_offset: int) -> str:
    return f"{first_offset:020d}{SEGMENT_SUFFIX}"


def index_file_name(first_offset: int) -> str:
    return f"{first_offset:020d}{INDEX_SUFFIX}"


def numbered_files(directory: str, suffix: str) -> list[int]:
    """The first offsets of the files named ``<20 digits><suffix>``, sorted."""
    found = []
    for name in os.listdir(directory):
        stem = name[: -len(suffix)]
        if name.endswith(suffix) and len(stem) == 20 and stem.isdigit():
            found.append(int(stem))
    return sorted(found)


def pack_chunk(
    chunk_type: int,
    data: bytes,
    entry_count: int,
    record_count: int,
    timestamp_ms: int,
    epoch: int,
    chunk_id: int,
    trailer: bytes = b"",
) -> bytes:
    """A whole chunk: header, an empty filter, data, trailer."""
    header = CHUNK_HEADER.pack(
        CHUNK_MAGIC_AND_VERSION,
        chunk_type,
        entry_count,
        record_count,
        timestamp_ms,
        epoch,
        chunk_id,
        crc32(data),
        len(data),
        len(trailer),
        0,
    )
    return header + data + trailer


def parse_chunk_header(raw: bytes, position: int) -> ChunkHeader | None:
    """The header in ``raw`` (a chunk starting at ``position``), or None when it is short
    or not a chunk header (wrong magic or version, unknown type)."""
    if len(raw) < CHUNK_HEADER_BYTES:
        return None
    fields = CHUNK_HEADER.unpack_from(raw)
    if fields[0] != CHUNK_MAGIC_AND_VERSION or fields[1] > CHUNK_TRACKING_SNAPSHOT:
        return None
    return ChunkHeader._make((*fields[1:], position))


def encode_simple_entries(records: Sequence[bytes]) -> bytes:
    """One simple entry per record: its length (top bit 0) then its bytes."""
    parts: list[bytes] = [b""] * (2 * len(records))
    parts[::2] = map(_U32.pack, map(len, records))
    parts[1::2] = records
    return b"".join(parts)


def decode_entries(data: bytes) -> list[bytes]:
    """The record bodies of a chunk's data, simple entries and uncompressed sub-batches.
    Raises ValueError when the framing does not fit the data."""
    bodies: list[bytes] = []
    append = bodies.append
    unpack = _U32.unpack_from
    position, end = 0, len(data)
    try:
        while position < end:
            (head,) = unpack(data, position)
            if head & _SUB_BATCH_BIT:
                bodies.extend(_decode_sub_batch(data, position))
                position += SUB_BATCH_HEADER_BYTES + unpack(data, position + 7)[0]
                continue
            position += SIMPLE_ENTRY_HEADER_BYTES
            append(data[position : position + head])
            position += head
    except struct.error:
        raise ValueError(f"an entry header is cut at byte {position}") from None
    # a slice past the end is cut short silently: only the last entry can have been
    if position > end:
        raise ValueError(f"the last entry runs past the data by {position - end} bytes")
    return bodies


def _decode_sub_batch(data: bytes, position: int) -> list[bytes]:
    if len(data) - position < SUB_BATCH_HEADER_BYTES:
        raise ValueError(f"a sub-batch header is cut at byte {position}")
    compression = data[position] >> 4 & 0x7
    record_count, _uncompressed, length = _SUB_BATCH.unpack_from(data, position + 1)
    start = position + SUB_BATCH_HEADER_BYTES
    if start + length > len(data):
        raise ValueError(f"a sub-batch of {length} bytes runs past the data at byte {start}")
    if compression != 0:
        raise StreamError(f"sub-batch compression {compression} is not supported (only 0, none)")
    bodies = decode_entries(data[start : start + length])
    if len(bodies) != record_count:
        raise ValueError(f"a sub-batch says {record_count} records and holds {len(bodies)}")
    return bodies


def chunk_bodies(header: ChunkHeader, data: bytes, where: str) -> list[bytes]:
    """The record bodies of a chunk whose header is ``header`` and data ``data``;
    ``StreamCorrupt`` (naming ``where``) when the data is cut short, fails its CRC, or
    does not hold the records the header says."""
    if len(data) != header.data_bytes:
        raise StreamCorrupt(f"{where}: its data is cut short")
    if crc32(data) != header.data_crc:
        raise StreamCorrupt(f"{where}: its data fails its CRC")
    return entry_bodies(header, data, where)


def entry_bodies(header: ChunkHeader, data: bytes, where: str) -> list[bytes]:
    """The record bodies of a chunk's data whose CRC was checked: ``StreamCorrupt``
    (naming ``where``) when its framing does not hold the records the header says."""
    try:
        bodies = decode_entries(data)
    except ValueError as error:
        raise StreamCorrupt(f"{where}: {error}") from None
    if len(bodies) != header.record_count:
        raise StreamCorrupt(
            f"{where}: it says {header.record_count} records and holds {len(bodies)}"
        )
    return bodies


def check_chunk(raw: bytes, where: str) -> ChunkHeader:
    """A whole chunk's header, its data checked against its CRC, the entries not
    decoded (``entry_bodies`` does that, or a reader that parses the data itself):
    ``StreamCorrupt`` naming ``where`` and the chunk when the header is not one, the
    chunk is cut short or its data fails its CRC."""
    header = parse_chunk_header(raw, 0)
    if header is None:
        raise StreamCorrupt(f"{where}: not a chunk header")
    if len(raw) < header.end:
        raise StreamCorrupt(f"{where}: it is cut short")
    data = memoryview(raw)[header.data_position : header.data_position + header.data_bytes]
    if crc32(data) != header.data_crc:
        raise StreamCorrupt(f"{where} (chunk {header.chunk_id}): its data fails its CRC")
    return header


def unpack_chunk(raw: bytes, where: str) -> tuple[ChunkHeader, list[bytes]]:
    """A whole chunk's header and record bodies, checked as a reader of the files checks
    them (``chunk_bodies``): for chunks that travelled, such as ``StreamChunks``'s."""
    header = check_chunk(raw, where)
    data = raw[header.data_position : header.data_position + header.data_bytes]
    return header, entry_bodies(header, data, f"{where} (chunk {header.chunk_id})")


def _encode_tracking_id(name: str) -> bytes:
    raw = name.encode("utf-8", "surrogateescape")
    if len(raw) > MAX_TRACKING_ID_BYTES:
        raise ValueError(f"tracking id {name!r} is over {MAX_TRACKING_ID_BYTES} bytes")
    return bytes((len(raw),)) + raw


def _encode_tracking_delta(producers: Mapping[str, int], consumers: Mapping[str, int]) -> bytes:
    parts: list[bytes] = []
    for kind, values in ((TRACKING_SEQUENCE, producers), (TRACKING_OFFSET, consumers)):
        for name, value in values.items():
            parts += (bytes((kind,)), _encode_tracking_id(name), _U64.pack(value))
    return b"".join(parts)


class _TrackingState:
    """Producers (id -> (chunk id that recorded it, sequence)) and consumers (name ->
    offset), as Osiris's tracking keeps them."""

    def __init__(self) -> None:
        self.producers: dict[str, tuple[int, int]] = {}
        self.consumers: dict[str, int] = {}

    def __bool__(self) -> bool:
        return bool(self.producers or self.consumers)

    def public(self) -> Tracking:
        return Tracking(
            {name: sequence for name, (_, sequence) in self.producers.items()},
            dict(self.consumers),
        )

    def snapshot(self) -> bytes:
        parts: list[bytes] = []
        for name, (chunk_id, sequence) in self.producers.items():
            parts += (bytes((TRACKING_SEQUENCE,)), _encode_tracking_id(name))
            parts += (_U64.pack(chunk_id), _U64.pack(sequence))
        for name, offset in self.consumers.items():
            parts += (bytes((TRACKING_OFFSET,)), _encode_tracking_id(name), _U64.pack(offset))
        return b"".join(parts)

    def apply(self, body: bytes, chunk_id: int, snapshot: bool) -> None:
        """Apply a delta (values recorded by ``chunk_id``) or replace the whole state with a
        snapshot. Raises ValueError when the body does not parse; nothing is applied then."""
        producers: dict[str, tuple[int, int]] = {}
        consumers: dict[str, int] = {}
        position = 0
        while position < len(body):
            if len(body) - position < 2:
                raise ValueError(f"a tracking entry is cut at byte {position}")
            kind, id_size = body[position], body[position + 1]
            start = position + 2 + id_size
            value_bytes = 16 if kind == TRACKING_SEQUENCE and snapshot else 8
            if start + value_bytes > len(body):
                raise ValueError(f"a tracking entry runs past the body at byte {position}")
            name = body[position + 2 : start].decode("utf-8", "surrogateescape")
            position = start + value_bytes
            if kind == TRACKING_SEQUENCE and snapshot:
                producers[name] = (
                    _U64.unpack_from(body, start)[0],
                    _U64.unpack_from(body, start + 8)[0],
                )
            elif kind == TRACKING_SEQUENCE:
                producers[name] = (chunk_id, _U64.unpack_from(body, start)[0])
            elif kind == TRACKING_OFFSET:
                consumers[name] = _U64.unpack_from(body, start)[0]
            elif kind != TRACKING_TIMESTAMP:
                raise ValueError(f"unknown tracking type {kind}")
        if snapshot:
            self.producers, self.consumers = producers, consumers
        else:
            self.producers.update(producers)
            self.consumers.update(consumers)


def read_index(path: str) -> list[IndexRecord]:
    """The whole records of an index file, up to the first all-zero one; [] when the file
    is missing or its header is not (yet) written."""
    try:
        with open(path, "rb") as file:
            raw = file.read()
    except FileNotFoundError:
        return []
    if raw[:FILE_HEADER_BYTES] != INDEX_HEADER:
        return []
    whole = (len(raw) - FILE_HEADER_BYTES) // INDEX_RECORD_BYTES * INDEX_RECORD_BYTES
    body = raw[FILE_HEADER_BYTES : FILE_HEADER_BYTES + whole]
    zero = body.find(_ZERO_INDEX_RECORD)
    while zero >= 0 and zero % INDEX_RECORD_BYTES:
        zero = body.find(_ZERO_INDEX_RECORD, zero + 1)
    if zero >= 0:
        body = body[:zero]
    return [IndexRecord(*fields) for fields in INDEX_RECORD.iter_unpack(body)]


def _tracking_offsets(records: list[IndexRecord]) -> list[int]:
    """The offsets the tracking chunks of a segment's index records take."""
    return [record.chunk_id for record in records if record.chunk_type != CHUNK_USER]


def chunk_ranges(
    directory: str | os.PathLike[str], start: int, end: int, target_bytes: int
) -> list[tuple[int, int]]:
    """``[start, end)`` cut into ranges ``[from, to)`` on chunk boundaries, each holding
    about ``target_bytes`` of chunks (at least one chunk), found from the index files
    alone. Offsets retention already deleted are left out; ``end`` must be at most one
    past the committed offset (a chunk being written is not looked at)."""
    directory = os.fspath(directory)
    ranges: list[tuple[int, int]] = []
    low, size = start, 0
    firsts = numbered_files(directory, SEGMENT_SUFFIX)
    for segment, first in enumerate(firsts):
        records = read_index(os.path.join(directory, index_file_name(first)))
        try:
            file_size = os.stat(os.path.join(directory, segment_file_name(first))).st_size
        except FileNotFoundError:  # deleted by retention since the listing
            continue
        following_segment = firsts[segment + 1] if segment + 1 < len(firsts) else end
        for position, record in enumerate(records):
            if record.chunk_id >= end:
                break
            if position + 1 < len(records):
                after = records[position + 1]
                next_id, chunk_end = after.chunk_id, after.position
            else:
                next_id, chunk_end = following_segment, file_size
            if next_id <= low:
                continue
            if size == 0:  # a range's first chunk: from it, when retention took ``start``
                low = max(low, record.chunk_id)
            size += chunk_end - record.position
            if size >= target_bytes and next_id < end:
                ranges.append((low, next_id))
                low, size = next_id, 0
    if low < end:
        ranges.append((low, end))
    return ranges


def _read_header_at(fd: int, position: int) -> ChunkHeader | None:
    return parse_chunk_header(os.pread(fd, CHUNK_HEADER_BYTES, position), position)


def walk_chunks(fd: int, file_size: int, first_chunk_id: int) -> Iterator[ChunkHeader]:
    """The chunks of a segment file from its start, while each header is whole, follows
    its predecessor and its chunk fits in the file. CRCs are not checked here."""
    position, expected = FILE_HEADER_BYTES, first_chunk_id
    while position + CHUNK_HEADER_BYTES <= file_size:
        header = _read_header_at(fd, position)
        if header is None or header.chunk_id != expected or header.end > file_size:
            return
        yield header
        position, expected = header.end, header.next_offset


def verified_data(fd: int, header: ChunkHeader) -> bytes | None:
    """The chunk's data, or None when it is short or fails its CRC."""
    data = os.pread(fd, header.data_bytes, header.data_position)
    if len(data) != header.data_bytes or crc32(data) != header.data_crc:
        return None
    return data


def _write_all(fd: int, parts: list[bytes]) -> None:
    total = sum(map(len, parts))
    written = replicated_io.writev(fd, parts)
    if written != total:  # a short write on a regular file: write the rest
        rest = memoryview(b"".join(parts))[written:]
        while rest:
            rest = rest[replicated_io.write(fd, rest) :]


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class PendingSync:
    """One group commit between ``StreamLog.begin_sync`` and ``StreamLog.commit``: the
    offset it makes durable and the descriptors (its own duplicates) it flushes."""

    __slots__ = ("offset", "_flush", "_failed", "done")

    def __init__(
        self,
        offset: int,
        flush: list[tuple[Callable[[int], None], int]],
        failed: Callable[[OSError], None],
    ) -> None:
        self.offset, self._flush, self._failed, self.done = offset, flush, failed, False

    def run(self) -> PendingSync:
        """Flush and close the duplicates (the only blocking step; any thread); an
        OSError means nothing it covers may be confirmed, nor anything after it."""
        try:
            with replicated_io.one_commit():  # the writes, even where no flush is asked
                for flush, fd in self._flush:
                    flush(fd)
        except OSError as exc:
            self._failed(exc)
            raise
        finally:
            for _flush, fd in self._flush:
                os.close(fd)
            self._flush = []
        self.done = True
        return self


class StreamLog:
    """The writer of one stream directory (see the module docstring)."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        max_segment_size_bytes: int = 500_000_000,
        max_segment_chunks: int = 256_000,
        sync: bool = True,
        epoch: int = 0,
    ) -> None:
        if not 0 < max_segment_size_bytes <= MAX_SEGMENT_BYTES:
            raise ValueError(f"max_segment_size_bytes must be in 1..{MAX_SEGMENT_BYTES}")
        if max_segment_chunks < 1:
            raise ValueError("max_segment_chunks must be at least 1")
        self.directory = os.fspath(directory)
        self.max_segment_size_bytes = max_segment_size_bytes
        self.max_segment_chunks = max_segment_chunks
        self.sync_policy = sync
        self.epoch = epoch
        os.makedirs(self.directory, exist_ok=True)
        self._lock_fd = replicated_io.open(
            os.path.join(self.directory, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644
        )
        if not lock_exclusive(self._lock_fd):
            os.close(self._lock_fd)
            raise StreamLocked(f"stream {self.directory} is open in another writer") from None
        self._dir_fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
        self._segment_firsts: list[int] = []
        self._segment_fd = -1
        self._index_fd = -1
        self._segment_bytes = 0
        self._segment_chunks = 0
        self._next_offset = 0
        self._committed_offset = -1
        self._unsynced = False
        self._directory_unsynced = False
        self._flush_failed: OSError | None = None  # a failed flush: no commit after it
        self._tracking = _TrackingState()
        # The offsets tracking chunks take, ascending: offsets that hold no user record.
        self._tracking_offsets = array("Q")
        self._closed = False
        try:
            self.identity = self._identity()
            self._recover()
        except BaseException:
            self.abandon()
            raise

    # -- properties ---------------------------------------------------------------------

    @property
    def first_offset(self) -> int:
        """The first chunk's id (the next offset when the stream is empty)."""
        return self._segment_firsts[0]

    @property
    def last_offset(self) -> int:
        """The last offset written (-1 when nothing ever was)."""
        return self._next_offset - 1

    @property
    def committed_offset(self) -> int:
        """The last offset made durable by ``sync`` (-1 before any): readers stop there."""
        return self._committed_offset

    def tracking(self) -> Tracking:
        return self._tracking.public()

    @property
    def segment_count(self) -> int:
        """How many segments the stream has (no file is looked at)."""
        return len(self._segment_firsts)

    def segments(self) -> list[SegmentInfo]:
        infos = []
        for first in self._segment_firsts:
            segment = os.path.join(self.directory, segment_file_name(first))
            index = os.path.join(self.directory, index_file_name(first))
            size = os.stat(segment).st_size + os.stat(index).st_size
            infos.append(SegmentInfo(first, segment, index, size))
        return infos

    def size_bytes(self) -> int:
        """The bytes of every segment and index file."""
        return sum(info.size_bytes for info in self.segments())

    def user_records(self, start: int, end: int) -> int:
        """How many user records the offsets ``[start, end)`` hold: the offsets less those
        tracking chunks take (offsets retention deleted or not yet written hold none)."""
        start, end = max(start, self.first_offset), min(end, self._next_offset)
        if start >= end:
            return 0
        offsets = self._tracking_offsets
        return end - start - (bisect_left(offsets, end) - bisect_left(offsets, start))

    def reader(self, start: Start = "first") -> StreamReader:
        """A reader of this log that stops at this writer's committed offset."""
        return StreamReader(self.directory, start, lambda: self._committed_offset)

    # -- writing ------------------------------------------------------------------------

    def append(
        self,
        records: Sequence[bytes],
        timestamp_ms: int | None = None,
        *,
        producer_sequences: Mapping[str, int] | None = None,
    ) -> tuple[int, int]:
        """Append one user chunk with a simple entry per record; returns the offsets of its
        first and last record. ``producer_sequences`` (producer id -> last sequence) goes
        in the chunk's trailer, recorded with the records it deduplicates."""
        self._check_open()
        if not records:
            raise ValueError("append needs at least one record")
        if len(records) > MAX_ENTRIES_PER_CHUNK:
            raise ValueError(f"a chunk holds at most {MAX_ENTRIES_PER_CHUNK} records")
        if max(map(len, records)) > MAX_RECORD_BYTES:
            raise ValueError(f"a record holds at most {MAX_RECORD_BYTES} bytes")
        producers = dict(producer_sequences or {})
        trailer = _encode_tracking_delta(producers, {})
        data = encode_simple_entries(records)
        chunk_id = self._write_chunk(CHUNK_USER, data, len(records), timestamp_ms, trailer)
        for name, sequence in producers.items():
            self._tracking.producers[name] = (chunk_id, sequence)
        return chunk_id, chunk_id + len(records) - 1

    def append_tracking(
        self,
        producers: Mapping[str, int] | None = None,
        consumers: Mapping[str, int] | None = None,
        timestamp_ms: int | None = None,
    ) -> int:
        """Append a tracking delta chunk (producer id -> last sequence, consumer name ->
        offset); it takes one offset, returned, and is never delivered to readers."""
        self._check_open()
        producers, consumers = dict(producers or {}), dict(consumers or {})
        if not producers and not consumers:
            raise ValueError("append_tracking needs a producer or a consumer")
        body = _encode_tracking_delta(producers, consumers)
        chunk_id = self._write_chunk(
            CHUNK_TRACKING_DELTA, encode_simple_entries([body]), 1, timestamp_ms
        )
        self._tracking.apply(body, chunk_id, snapshot=False)
        return chunk_id

    def sync(self) -> int:
        """Group commit: fdatasync the segment written since the last sync (not under
        ``sync=False``), then move the committed offset to the last offset; returns it."""
        return self.commit(self.begin_sync().run())

    def begin_sync(self) -> PendingSync:
        """The first step of ``sync``: what a flush must cover to commit the last offset
        (nothing to flush under ``sync=False``). Run it on any thread, then ``commit``."""
        self._check_open()
        self._check_flushes()
        flush: list[tuple[Callable[[int], None], int]] = []
        if self.sync_policy:
            if self._unsynced:  # not the index: see the module docstring
                flush.append((replicated_io.fdatasync, os.dup(self._segment_fd)))
            if self._directory_unsynced:
                flush.append((replicated_io.fsync, os.dup(self._dir_fd)))
        self._unsynced = False
        self._directory_unsynced = False
        return PendingSync(self.last_offset, flush, self._note_failed_flush)

    def commit(self, pending: PendingSync) -> int:
        """The last step of ``sync``, after ``pending.run()`` returned: readers may now
        read up to its offset. Returns the committed offset."""
        self._check_flushes()
        if not pending.done:
            raise StreamError("commit of a sync that has not run")
        self._committed_offset = max(self._committed_offset, pending.offset)
        return self._committed_offset

    def _write_chunk(
        self,
        chunk_type: int,
        data: bytes,
        record_count: int,
        timestamp_ms: int | None,
        trailer: bytes = b"",
    ) -> int:
        size = CHUNK_HEADER_BYTES + len(data) + len(trailer)
        if self._segment_chunks and (
            self._segment_bytes + size > self.max_segment_size_bytes
            or self._segment_chunks >= self.max_segment_chunks
        ):
            self._roll_over()
        entry_count = record_count if chunk_type == CHUNK_USER else 1
        return self._write_chunk_here(
            chunk_type, data, entry_count, record_count, timestamp_ms, trailer
        )

    def _write_chunk_here(
        self,
        chunk_type: int,
        data: bytes,
        entry_count: int,
        record_count: int,
        timestamp_ms: int | None,
        trailer: bytes = b"",
    ) -> int:
        timestamp = _now_ms() if timestamp_ms is None else timestamp_ms
        chunk_id, position = self._next_offset, self._segment_bytes
        header = CHUNK_HEADER.pack(
            CHUNK_MAGIC_AND_VERSION,
            chunk_type,
            entry_count,
            record_count,
            timestamp,
            self.epoch,
            chunk_id,
            crc32(data),
            len(data),
            len(trailer),
            0,
        )
        self._unsynced = True
        _write_all(self._segment_fd, [header, data, trailer] if trailer else [header, data])
        replicated_io.write(
            self._index_fd, INDEX_RECORD.pack(chunk_id, timestamp, self.epoch, position, chunk_type)
        )
        self._segment_bytes += CHUNK_HEADER_BYTES + len(data) + len(trailer)
        self._segment_chunks += 1
        self._next_offset += record_count
        if chunk_type != CHUNK_USER:
            self._tracking_offsets.append(chunk_id)
        return chunk_id

    def _roll_over(self) -> None:
        if self.sync_policy:
            try:
                replicated_io.fdatasync(self._segment_fd)
                replicated_io.fdatasync(self._index_fd)
            except OSError as exc:
                self._note_failed_flush(exc)
                raise
        self._close_files()
        self._create_segment(self._next_offset)
        if self._tracking:
            self._write_snapshot()

    def _write_snapshot(self) -> None:
        body = encode_simple_entries([self._tracking.snapshot()])
        self._write_chunk_here(CHUNK_TRACKING_SNAPSHOT, body, 1, 1, None)

    def _create_segment(self, first: int) -> None:
        """Create the index then the segment (so that a segment never lacks its index but
        after retention), each with its header, and make them the ones written."""
        self._index_fd = replicated_io.open(
            index_file_name(first), os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644, dir_fd=self._dir_fd
        )
        replicated_io.write(self._index_fd, INDEX_HEADER)
        self._segment_fd = replicated_io.open(
            segment_file_name(first),
            os.O_RDWR | os.O_CREAT | os.O_TRUNC,
            0o644,
            dir_fd=self._dir_fd,
        )
        replicated_io.write(self._segment_fd, LOG_HEADER)
        self._segment_firsts.append(first)
        self._segment_bytes = FILE_HEADER_BYTES
        self._segment_chunks = 0
        self._unsynced = True
        self._directory_unsynced = True

    # -- retention ----------------------------------------------------------------------

    def apply_retention(
        self,
        max_bytes: int | None = None,
        max_age_s: float | None = None,
        now: float | None = None,
    ) -> list[int]:
        """Delete whole segments, oldest first, while the stream is above ``max_bytes`` or
        the segment's last chunk is older than ``max_age_s`` (against ``now``, seconds since
        the epoch); the newest segment always stays. Returns the deleted segments' first
        offsets."""
        self._check_open()
        now_ms = (time.time() if now is None else now) * 1000
        infos = self.segments()
        total = sum(info.size_bytes for info in infos)
        deleted = []
        while len(infos) > 1:
            oldest = infos[0]
            too_big = max_bytes is not None and total > max_bytes
            too_old = (
                max_age_s is not None and self._newest_timestamp(oldest) < now_ms - max_age_s * 1000
            )
            if not (too_big or too_old):
                break
            replicated_io.unlink(oldest.index_path)
            replicated_io.unlink(oldest.segment_path)
            deleted.append(oldest.first_offset)
            total -= oldest.size_bytes
            infos.pop(0)
        if deleted:
            self._segment_firsts = self._segment_firsts[len(deleted) :]
            del self._tracking_offsets[: bisect_left(self._tracking_offsets, self.first_offset)]
            if self.sync_policy:
                replicated_io.fsync(self._dir_fd)
            log.info("stream %s: retention deleted segments %s", self.directory, deleted)
        return deleted

    @staticmethod
    def _newest_timestamp(info: SegmentInfo) -> int:
        records = read_index(info.index_path)
        return records[-1].timestamp_ms if records else -(2**63)

    # -- closing ------------------------------------------------------------------------

    def close(self) -> None:
        """Sync, then release the files and the lock (released as well when the sync
        fails)."""
        if self._closed:
            return
        try:
            self.sync()
        finally:
            self.abandon()

    def abandon(self) -> None:
        """Release the files and the lock without syncing (what a crash leaves behind)."""
        if self._closed:
            return
        self._closed = True
        self._close_files()
        os.close(self._dir_fd)
        os.close(self._lock_fd)

    def __enter__(self) -> StreamLog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _close_files(self) -> None:
        for fd in (self._segment_fd, self._index_fd):
            if fd >= 0:
                os.close(fd)
        self._segment_fd = self._index_fd = -1

    def _check_open(self) -> None:
        if self._closed:
            raise StreamError(f"stream {self.directory} is closed")

    def _note_failed_flush(self, exc: OSError) -> None:
        self._flush_failed = exc

    def _check_flushes(self) -> None:
        if self._flush_failed is not None:
            raise StreamError(
                f"stream {self.directory}: a flush failed ({self._flush_failed}); nothing "
                f"more is committed: reopen it to recover from what is on disk"
            )

    def _identity(self) -> str:
        """The directory's random id: read, or made and written (before the recovery's
        sync, which makes its name durable) when the directory has none."""
        path = os.path.join(self.directory, IDENTITY_FILE)
        try:
            with open(path, encoding="ascii") as file:
                found = file.read().strip()
        except (FileNotFoundError, UnicodeDecodeError):
            found = ""
        if len(found) == 32 and all(c in "0123456789abcdef" for c in found):
            return found
        identity = uuid.uuid4().hex
        temporary = f"{IDENTITY_FILE}.new"
        fd = replicated_io.open(
            temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644, dir_fd=self._dir_fd
        )
        try:
            _write_all(fd, [identity.encode(), b"\n"])
            if self.sync_policy:
                replicated_io.fsync(fd)
        finally:
            os.close(fd)
        replicated_io.rename(
            temporary, IDENTITY_FILE, src_dir_fd=self._dir_fd, dst_dir_fd=self._dir_fd
        )
        self._directory_unsynced = True
        return identity

    # -- recovery -----------------------------------------------------------------------

    def _recover(self) -> None:
        segments = numbered_files(self.directory, SEGMENT_SUFFIX)
        indexes = numbered_files(self.directory, INDEX_SUFFIX)
        for first in sorted(set(indexes) - set(segments)):
            log.warning("stream %s: deleting index %d without its segment", self.directory, first)
            replicated_io.unlink(index_file_name(first), dir_fd=self._dir_fd)
            self._directory_unsynced = True
        oldest_indexed = min(set(indexes) & set(segments), default=None)
        for first in segments:
            if oldest_indexed is not None and first < oldest_indexed:
                log.warning(
                    "stream %s: deleting segment %d left by retention", self.directory, first
                )
                replicated_io.unlink(segment_file_name(first), dir_fd=self._dir_fd)
                self._directory_unsynced = True
        segments = [s for s in segments if oldest_indexed is None or s >= oldest_indexed]
        if not segments:
            self._create_segment(0)
            self.sync()
            return
        next_offset, chunks, size, walked = segments[0], 0, FILE_HEADER_BYTES, False
        tracking_offsets: dict[int, list[int]] = {}  # per segment
        for position, first in enumerate(segments):
            if first != next_offset:
                for orphan in segments[position:]:
                    log.error(
                        "stream %s: segment %d does not follow offset %d: deleting it",
                        self.directory,
                        orphan,
                        next_offset,
                    )
                    replicated_io.unlink(index_file_name(orphan), dir_fd=self._dir_fd)
                    replicated_io.unlink(segment_file_name(orphan), dir_fd=self._dir_fd)
                self._directory_unsynced = True
                break
            self._segment_firsts.append(first)
            walked = position == len(segments) - 1
            next_offset, chunks, size, tracking_offsets[first] = self._recover_segment(
                first, walk=walked
            )
        last = self._segment_firsts[-1]
        if not walked:
            next_offset, chunks, size, tracking_offsets[last] = self._recover_segment(
                last, walk=True
            )
        for first in self._segment_firsts:
            self._tracking_offsets.extend(tracking_offsets[first])
        self._next_offset = next_offset
        self._segment_chunks, self._segment_bytes = chunks, size
        self._segment_fd = os.open(segment_file_name(last), os.O_RDWR, dir_fd=self._dir_fd)
        self._index_fd = os.open(index_file_name(last), os.O_RDWR, dir_fd=self._dir_fd)
        os.lseek(self._segment_fd, 0, os.SEEK_END)
        os.lseek(self._index_fd, 0, os.SEEK_END)
        self._recover_tracking()
        if self._segment_chunks == 0 and self._tracking:
            self._write_snapshot()
        self._unsynced = True
        self.sync()

    def _recover_segment(self, first: int, walk: bool) -> tuple[int, int, int, list[int]]:
        """Check (``walk``: walk every chunk of) one segment and repair its tail and its
        index; returns its next offset, its number of chunks, its size and the offsets of
        its tracking chunks."""
        segment_fd = os.open(segment_file_name(first), os.O_RDWR, dir_fd=self._dir_fd)
        index_fd = replicated_io.open(
            index_file_name(first), os.O_RDWR | os.O_CREAT, 0o644, dir_fd=self._dir_fd
        )
        try:
            size = os.fstat(segment_fd).st_size
            if os.pread(segment_fd, FILE_HEADER_BYTES, 0) != LOG_HEADER:
                if size > FILE_HEADER_BYTES:
                    raise StreamCorrupt(f"{segment_file_name(first)} does not start with OSIL")
                replicated_io.pwrite(segment_fd, LOG_HEADER, 0)  # created, then the crash
                size = FILE_HEADER_BYTES
            index_path = os.path.join(self.directory, index_file_name(first))
            records = read_index(index_path)
            index_size = os.fstat(index_fd).st_size
            if not walk and records:
                last = _read_header_at(segment_fd, records[-1].position)
                if (
                    last is not None
                    and last.index_record() == records[-1]
                    and last.end == size
                    and index_size == FILE_HEADER_BYTES + INDEX_RECORD_BYTES * len(records)
                ):
                    return last.next_offset, len(records), size, _tracking_offsets(records)
            chain = list(walk_chunks(segment_fd, size, first))
            # Only the newest segment can end in a torn write: an older one was synced
            # whole before the next began, so a chunk failing its CRC there is damage,
            # kept for readers to refuse (cutting it would orphan every later segment).
            while walk and chain and verified_data(segment_fd, chain[-1]) is None:
                torn = chain.pop()
                log.warning(
                    "stream %s: dropping torn chunk %d at the end of segment %d",
                    self.directory,
                    torn.chunk_id,
                    first,
                )
            end = chain[-1].end if chain else FILE_HEADER_BYTES
            if end < size:
                log.warning(
                    "stream %s: truncating segment %d from %d to %d bytes",
                    self.directory,
                    first,
                    size,
                    end,
                )
                replicated_io.ftruncate(segment_fd, end)
                replicated_io.fdatasync(segment_fd)
            rebuilt = [h.index_record() for h in chain]
            self._repair_index(index_fd, index_size, records, rebuilt)
            next_offset = chain[-1].next_offset if chain else first
            return next_offset, len(chain), end, _tracking_offsets(rebuilt)
        finally:
            os.close(segment_fd)
            os.close(index_fd)

    def _repair_index(
        self, index_fd: int, index_size: int, found: list[IndexRecord], expected: list[IndexRecord]
    ) -> None:
        """Make the index hold exactly ``expected``, keeping the prefix already right."""
        good = 0
        for on_disk, wanted in zip(found, expected, strict=False):
            if on_disk != wanted:
                break
            good += 1
        good_size = FILE_HEADER_BYTES + good * INDEX_RECORD_BYTES
        if (
            good == len(expected) == len(found)
            and index_size == good_size
            and os.pread(index_fd, FILE_HEADER_BYTES, 0) == INDEX_HEADER
        ):
            return
        log.warning(
            "stream %s: rebuilding an index from record %d (%d records, %d on disk)",
            self.directory,
            good,
            len(expected),
            len(found),
        )
        replicated_io.ftruncate(index_fd, good_size)
        replicated_io.pwrite(index_fd, INDEX_HEADER, 0)
        rebuilt = b"".join(INDEX_RECORD.pack(*record) for record in expected[good:])
        replicated_io.pwrite(index_fd, rebuilt, good_size)
        replicated_io.fdatasync(index_fd)

    def _recover_tracking(self) -> None:
        start = 0
        for position in range(len(self._segment_firsts) - 1, -1, -1):
            path = os.path.join(self.directory, index_file_name(self._segment_firsts[position]))
            records = read_index(path)
            if records and records[0].chunk_type == CHUNK_TRACKING_SNAPSHOT:
                start = position
                break
        for first in self._segment_firsts[start:]:
            fd = os.open(segment_file_name(first), os.O_RDONLY, dir_fd=self._dir_fd)
            try:
                for header in walk_chunks(fd, os.fstat(fd).st_size, first):
                    self._replay_tracking(fd, header)
            finally:
                os.close(fd)

    def _replay_tracking(self, fd: int, header: ChunkHeader) -> None:
        try:
            if header.chunk_type == CHUNK_USER:
                if header.trailer_bytes:
                    trailer = os.pread(
                        fd, header.trailer_bytes, header.data_position + header.data_bytes
                    )
                    self._tracking.apply(trailer, header.chunk_id, snapshot=False)
                return
            data = verified_data(fd, header)
            if data is None:
                raise ValueError("its CRC fails")
            (body,) = decode_entries(data)
            snapshot = header.chunk_type == CHUNK_TRACKING_SNAPSHOT
            self._tracking.apply(body, header.chunk_id, snapshot=snapshot)
        except ValueError as error:
            log.error(
                "stream %s: skipping the tracking of chunk %d: %s",
                self.directory,
                header.chunk_id,
                error,
            )


class StreamReader:
    """Reads a stream directory's user records in offset order, from ``start`` up to the
    committed offset: ``committed_offset`` is the writer's (a number, or a callable asked
    before each chunk); it must be a value the writer published, the last offset of a
    chunk it wrote and synced. Iterating yields ``(offset, timestamp_ms, body)`` and stops
    at the committed offset; iterating again later goes on from there.

    ``start``: "first"; "last" (the last committed user chunk's first offset); "next" (the
    offset after the committed one); an offset (from the chunk holding it, records before
    it skipped; from the first offset up to the one after the committed offset, else
    ``OffsetOutOfRange``); or ``Timestamp(ms)``, the first chunk at or after it, found
    through the indexes (the next offset when there is none).

    A chunk whose CRC or framing fails raises ``StreamCorrupt``, and the reader stays
    before it. When retention deletes the segment the reader needs next, it moves on to
    the new first chunk.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        start: Start = "first",
        committed_offset: int | Callable[[], int] = -1,
    ) -> None:
        self.directory = os.fspath(directory)
        if callable(committed_offset):
            self._committed = committed_offset
        else:
            fixed = committed_offset
            self._committed = lambda: fixed
        self._fd = -1
        self._segment_first = -1
        self._position = 0
        self._next_chunk_id = 0
        self._skip_below = 0
        self._closed = False
        for _attempt in range(10):
            target = self._resolve(start)
            if self._position_at(target):
                return
        raise StreamError(f"stream {self.directory}: segments keep vanishing under the reader")

    @property
    def next_offset(self) -> int:
        """The offset the next record delivered will have at the least."""
        return max(self._next_chunk_id, self._skip_below)

    def __iter__(self) -> Iterator[Record]:
        return chain.from_iterable(iter(self.read_chunk, None))

    def read_chunk(self) -> list[Record] | None:
        """The records of the next committed user chunk, None when there is none yet."""
        while True:
            header = self._next_user_header()
            if header is None:
                return None
            bodies = self._bodies_of(header)
            self._position, self._next_chunk_id = header.end, header.next_offset
            skip = self._skip_below - header.chunk_id
            if skip >= len(bodies):
                continue
            first = header.chunk_id
            if skip > 0:
                bodies, first = bodies[skip:], first + skip
            return list(zip(range(first, header.next_offset), repeat(header.timestamp_ms), bodies))

    def read_raw_chunk(self) -> bytes | None:
        """The next committed user chunk as the file holds it, header to trailer, whole
        (records below the start included), unchecked: whoever receives it checks it
        (``unpack_chunk``). None when there is none yet."""
        header = self._next_user_header()
        if header is None:
            return None
        raw = os.pread(self._fd, header.end - header.position, header.position)
        self._position, self._next_chunk_id = header.end, header.next_offset
        return raw

    def _next_user_header(self) -> ChunkHeader | None:
        """The header of the next committed user chunk (tracking chunks are stepped
        over); None when it is not committed yet."""
        if self._closed:
            raise StreamError("reader is closed")
        while True:
            committed = self._committed()
            if self._next_chunk_id > committed:
                return None
            header = self._next_header()
            if header is None:
                continue  # moved to another segment: check the committed offset again
            if header.next_offset - 1 > committed:
                return None
            if header.chunk_type == CHUNK_USER:
                return header
            self._position, self._next_chunk_id = header.end, header.next_offset

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def __enter__(self) -> StreamReader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _bodies_of(self, header: ChunkHeader) -> list[bytes]:
        where = f"chunk {header.chunk_id} of segment {self._segment_first} in {self.directory}"
        return chunk_bodies(
            header, os.pread(self._fd, header.data_bytes, header.data_position), where
        )

    def _next_header(self) -> ChunkHeader | None:
        """The header of the committed chunk ``_next_chunk_id``; None after moving to the
        next segment (or past retention) because the current one ended."""
        raw = os.pread(self._fd, CHUNK_HEADER_BYTES, self._position)
        if not raw:
            self._move_to_next_segment()
            return None
        header = parse_chunk_header(raw, self._position)
        if header is None or header.chunk_id != self._next_chunk_id:
            raise StreamCorrupt(
                f"segment {self._segment_first} in {self.directory}: no chunk header for "
                f"chunk {self._next_chunk_id} at byte {self._position}"
            )
        return header

    def _move_to_next_segment(self) -> None:
        wanted = self._next_chunk_id
        try:
            fd = os.open(os.path.join(self.directory, segment_file_name(wanted)), os.O_RDONLY)
        except FileNotFoundError:
            firsts = numbered_files(self.directory, SEGMENT_SUFFIX)
            if not firsts or firsts[0] <= wanted:
                raise StreamCorrupt(
                    f"stream {self.directory}: chunk {wanted} is committed but no segment holds it"
                ) from None
            log.info(
                "stream %s: reader moves from %d to the first offset %d (retention)",
                self.directory,
                wanted,
                firsts[0],
            )
            self._next_chunk_id = firsts[0]
            return
        self._switch_to(fd, wanted, FILE_HEADER_BYTES)

    def _switch_to(self, fd: int, segment_first: int, position: int) -> None:
        if self._fd >= 0:
            os.close(self._fd)
        self._fd, self._segment_first, self._position = fd, segment_first, position

    def _resolve(self, start: Start) -> int:
        committed = self._committed()
        firsts = numbered_files(self.directory, SEGMENT_SUFFIX)
        if not firsts:
            raise StreamError(f"{self.directory} holds no stream segment")
        first, after_committed = firsts[0], max(firsts[0], committed + 1)
        if isinstance(start, Timestamp):
            return self._first_at_or_after(firsts, start.ms, committed, after_committed)
        if start == "first":
            return first
        if start == "next":
            return after_committed
        if start == "last":
            return self._last_user_chunk(firsts, committed, after_committed)
        if isinstance(start, int) and not isinstance(start, bool):
            if not first <= start <= after_committed:
                raise OffsetOutOfRange(
                    f"offset {start} is not in stream {self.directory}: it holds offsets "
                    f"{first} to {after_committed - 1} (and {after_committed} next)"
                )
            return start
        raise ValueError(
            f"a reader starts at 'first', 'last', 'next', an offset or a Timestamp, not {start!r}"
        )

    def _index(self, first: int) -> list[IndexRecord]:
        return read_index(os.path.join(self.directory, index_file_name(first)))

    def _last_user_chunk(self, firsts: list[int], committed: int, fallback: int) -> int:
        for first in reversed(firsts):
            for record in reversed(self._index(first)):
                if record.chunk_id <= committed and record.chunk_type == CHUNK_USER:
                    return record.chunk_id
        return fallback

    def _first_at_or_after(
        self, firsts: list[int], timestamp_ms: int, committed: int, fallback: int
    ) -> int:
        for first in firsts:
            records = self._index(first)
            if not records or records[-1].timestamp_ms < timestamp_ms:
                continue
            for record in records:
                if record.chunk_id > committed:
                    return fallback
                if record.timestamp_ms >= timestamp_ms:
                    return record.chunk_id
        return fallback

    def _position_at(self, target: int) -> bool:
        """Open the segment holding ``target`` at the last indexed chunk at or before it
        (found from the chunk headers when the header there disagrees with its index
        record); False when the segment vanished meanwhile (retention: resolve again)."""
        firsts = numbered_files(self.directory, SEGMENT_SUFFIX)
        holding = [first for first in firsts if first <= target]
        segment_first = holding[-1] if holding else firsts[0]
        records = self._index(segment_first)
        chunk_ids = [record.chunk_id for record in records]
        found = bisect_right(chunk_ids, target)
        position, chunk_id = FILE_HEADER_BYTES, segment_first
        if found:
            position, chunk_id = records[found - 1].position, chunk_ids[found - 1]
        try:
            fd = os.open(
                os.path.join(self.directory, segment_file_name(segment_first)), os.O_RDONLY
            )
        except FileNotFoundError:
            return False
        header = _read_header_at(fd, position)
        if header is None or header.chunk_id != chunk_id:
            # Only a segment's last index record is checked at recovery: one damaged before
            # it (a flipped bit) would send the reader to the wrong chunk, and refuse offsets
            # of intact chunks as corrupt.
            position, chunk_id = FILE_HEADER_BYTES, segment_first
            for header in walk_chunks(fd, os.fstat(fd).st_size, segment_first):
                if header.chunk_id > target:
                    break
                position, chunk_id = header.position, header.chunk_id
        self._switch_to(fd, segment_first, position)
        self._next_chunk_id, self._skip_below = chunk_id, target
        return True

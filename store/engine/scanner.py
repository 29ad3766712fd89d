"""Find the records in a ``.rdq`` file without trusting anything but the bytes.

Used by dirty recovery, by the GC's plan and by ``warren store inspect``. The scanner walks
the file record by record; where the bytes at the current offset are not a record (a torn
write, zero padding, a damaged region) it resynchronises, and it does so with C-speed
searches, never a byte-by-byte Python loop:

- a record starts with its size field, a u64 far below 2**40, so a record can only start
  where three zero bytes stand: ``find(b"\\0\\0\\0")`` jumps to the next candidate;
- at eight zero bytes (size 0) it skips the whole zero run with one regex search and tries
  the last seven offsets before the first non-zero byte, the only ones where a size field
  can still begin (this finds a record whose size has leading zeros right after a hole);
- a candidate is a record when ``size >= 16``, the record fits in the file, and its last
  byte is 0xFF. A size field pointing past the end of the file, even by one byte, is not a
  record, so a fake header near the end never hides the real records after it;
- of those seven offsets after a zero run, more than one can pass: one byte before a record
  of 4 KiB or more, the zero byte and the first seven bytes of its size field read as a
  size 256 times smaller, a candidate inside the record's body that passes whenever the
  body holds 0xFF at its end (one time in 256); one byte after a record's start, its size
  field read with a byte of its id passes as often where the file is long enough. The
  bytes cannot tell which reading is the record, so what follows each decides: the end
  of the file, another record or the header of a torn one (a crash's last append) are
  what follows a real record; zeros (a hole, or a body's own zeros) less surely; other
  bytes not at all. The first candidate stands unless a later one of the seven is
  followed by something more telling than it is. Left ambiguous, and then decided for
  the wrong reading about once in 256: a record after a hole followed by damaged bytes
  whose shifted reading ends before zeros, and a body of zeros around the shorter
  reading's end whose record is itself followed by zeros.

Every record found is reported, duplicates of one msg_id included: the store writes an id
again after its count reached 0, and recovery keeps the last copy (highest file, then
highest offset). Non-zero bytes that belong to no record are reported as damaged regions.
"""

from __future__ import annotations

import mmap
import os
import re
from array import array
from dataclasses import dataclass, field

from .records import HEADER_BYTES, MAX_BODY_BYTES, OK_MARKER, RECORD_OVERHEAD, SIZE_FIELD

_NON_ZERO = re.compile(rb"[^\x00]")
_RECORD_START = b"\x00\x00\x00"


@dataclass
class ScanResult:
    """What a scan found, in ascending offset order."""

    msg_ids: list[bytes] = field(default_factory=list)
    # Machine-word arrays, not lists: a million records would otherwise leave a million
    # short-lived int objects behind in the allocator's pools, next to the long-lived index.
    offsets: array[int] = field(default_factory=lambda: array("Q"))
    total_sizes: array[int] = field(default_factory=lambda: array("Q"))
    damaged: list[tuple[int, int]] = field(default_factory=list)  # (offset, length)
    end_of_records: int = 0  # offset just past the last record (0 when none)
    size: int = 0  # bytes scanned

    @property
    def records(self) -> list[tuple[bytes, int, int]]:
        """(msg_id, offset, total_size) triples."""
        return list(zip(self.msg_ids, self.offsets, self.total_sizes, strict=True))


def scan_buffer(buf: bytes | mmap.mmap) -> ScanResult:
    """Scan an in-memory image of one file."""
    result = ScanResult(size=len(buf))
    msg_ids, offsets, sizes = result.msg_ids, result.offsets, result.total_sizes
    unpack_size = SIZE_FIELD.unpack_from
    find = buf.find
    length = len(buf)
    pos = 0
    gap_start = -1
    zero_run_end = -1  # after a zero run, its first non-zero byte
    while pos + RECORD_OVERHEAD <= length:
        (size,) = unpack_size(buf, pos)
        end = pos + size + 9
        if size >= 16 and end <= length and buf[end - 1] == OK_MARKER:
            if pos < zero_run_end:
                pos, end = _likeliest_reading(buf, pos, end, zero_run_end)
            zero_run_end = -1
            if gap_start >= 0:
                _note_gap(buf, gap_start, pos, result.damaged)
                gap_start = -1
            msg_ids.append(buf[pos + 8 : pos + HEADER_BYTES])
            offsets.append(pos)
            sizes.append(end - pos)
            pos = end
            continue
        if gap_start < 0:
            gap_start = pos
        if size == 0:
            non_zero = _NON_ZERO.search(buf, pos + 8)
            if non_zero is None:
                pos = length
                break
            zero_run_end = non_zero.start()
            pos = max(pos + 1, zero_run_end - 7)
            continue
        pos = find(_RECORD_START, pos + 1)
        if pos < 0:
            pos = length
            break
    if gap_start < 0:
        gap_start = pos
    if gap_start < length:
        _note_gap(buf, gap_start, length, result.damaged)
    if offsets:
        result.end_of_records = offsets[-1] + sizes[-1]
    return result


def scan_file(path: str | os.PathLike, *, mapped: bool = True) -> ScanResult:
    """Scan a file through a read-only mapping (no copy of the file into memory), or,
    with ``mapped=False``, from a copy: for a file another process may shrink under us
    (touching a mapping past a file's end raises SIGBUS)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return ScanResult()
        if not mapped:
            return scan_buffer(f.read())
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as view:
            view.madvise(mmap.MADV_SEQUENTIAL)
            return scan_buffer(view)


def _record_end(buf: bytes | mmap.mmap, pos: int) -> int:
    """The end of the record starting at ``pos``, or 0 where none does."""
    if pos + RECORD_OVERHEAD > len(buf):
        return 0
    (size,) = SIZE_FIELD.unpack_from(buf, pos)
    end = pos + size + 9
    if size >= 16 and end <= len(buf) and buf[end - 1] == OK_MARKER:
        return end
    return 0


# What stands where a candidate record ends, from the least to the most telling of a record
# boundary: bytes no record leaves behind, zeros (a hole, or a body's own zeros), then the
# end of the file, another record, or the header of a torn record (a crash's last append).
_NOT_A_BOUNDARY, _ZEROS, _A_BOUNDARY = 0, 1, 2
_MAX_SIZE_FIELD = 16 + MAX_BODY_BYTES


def _what_follows(buf: bytes | mmap.mmap, end: int) -> int:
    """How much what stands at ``end`` looks like what follows a record."""
    head = buf[end : end + SIZE_FIELD.size]
    if len(head) < SIZE_FIELD.size:
        # the end of the file, or a size field cut short: it starts with three zeros
        return _A_BOUNDARY if not any(head[:3]) else _NOT_A_BOUNDARY
    (size,) = SIZE_FIELD.unpack(head)
    if size == 0:
        return _ZEROS
    if not 16 <= size <= _MAX_SIZE_FIELD:
        return _NOT_A_BOUNDARY
    record_end = end + size + 9
    if record_end > len(buf) or buf[record_end - 1] == OK_MARKER:
        return _A_BOUNDARY  # a torn last record, or a whole one
    return _NOT_A_BOUNDARY


def _likeliest_reading(
    buf: bytes | mmap.mmap, first: int, first_end: int, zero_run_end: int
) -> tuple[int, int]:
    """Of the records that the offsets from ``first`` (a record ending at ``first_end``)
    up to ``zero_run_end`` (the first non-zero byte after a hole) can start, the (start,
    end) to take: the first, unless a later one is followed by something more telling."""
    follows = _what_follows(buf, first_end)
    if follows == _A_BOUNDARY:
        return first, first_end
    for later in range(first + 1, zero_run_end):
        later_end = _record_end(buf, later)
        if later_end and _what_follows(buf, later_end) > follows:
            return later, later_end
    return first, first_end


def _note_gap(buf: bytes | mmap.mmap, start: int, end: int, damaged: list[tuple[int, int]]) -> None:
    """Record [start, end) as damaged unless it is only zero padding."""
    if _NON_ZERO.search(buf, start, end) is not None:
        damaged.append((start, end - start))

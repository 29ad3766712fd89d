"""The message index: msg_id -> (ref_count, file, offset, total_size), packed in one int.

Memory and collector pauses decide how the index is held. A dict of lists costs about
211 bytes a message and, at a million entries, a 100 ms full collection (every list is a
GC-tracked container). Here the key is the msg_id as an int (``int.from_bytes``: a 48-byte
block, where a 16-byte ``bytes`` takes a 64-byte one, CPython aligning blocks to 16) and
the value a single int below 2**120 (four 30-bit digits, a 48-byte block): with the dict's
own table about 137 bytes a message, and no GC-tracked object per entry, so the cyclic
collector never walks the index.

Layout, low bits first::

    ref_count  19 bits   up to 524,287 references (fan-out to that many queues)
    adoptable   1 bit    recovered by a dirty start without reference counts and not
                         written or removed since: the next write adopts the record
    total_size 36 bits   a record of up to 64 GiB
    offset     36 bits   an offset of up to 64 GiB inside one file
    file       28 bits   file numbers up to 268 million; the top value means "pending"

A pending entry names a record still in the write buffer (not yet handed to write(2));
its body lives in the store's pending map and its offset is assigned when it is flushed.
Only entries with references exist: a remove that drops the count to 0 deletes the entry,
so a later write of the same id appends a fresh record (no resurrection of dead records).
"""

from __future__ import annotations

from typing import NamedTuple, TypeGuard

REF_BITS = 20
SIZE_BITS = 36
OFFSET_BITS = 36
FILE_BITS = 28

REF_MASK = (1 << (REF_BITS - 1)) - 1
ADOPTABLE = 1 << (REF_BITS - 1)  # inside the ref field, above any count
SIZE_SHIFT = REF_BITS
SIZE_MASK = (1 << SIZE_BITS) - 1
OFFSET_SHIFT = SIZE_SHIFT + SIZE_BITS
OFFSET_MASK = (1 << OFFSET_BITS) - 1
FILE_SHIFT = OFFSET_SHIFT + OFFSET_BITS
FILE_MASK = (1 << FILE_BITS) - 1

MAX_REF_COUNT = REF_MASK
MAX_FILE = FILE_MASK - 1
MAX_OFFSET = OFFSET_MASK
PENDING_FILE = FILE_MASK
# Clearing the location fields keeps ref_count and total_size.
LOCATION_CLEAR = ~((OFFSET_MASK << OFFSET_SHIFT) | (FILE_MASK << FILE_SHIFT))


class Location(NamedTuple):
    """One index entry, unpacked."""

    ref_count: int
    file: int
    offset: int
    total_size: int

    @property
    def pending(self) -> bool:
        return self.file == PENDING_FILE


def unpack(value: int) -> Location:
    return Location(
        value & REF_MASK,
        value >> FILE_SHIFT,
        (value >> OFFSET_SHIFT) & OFFSET_MASK,
        (value >> SIZE_SHIFT) & SIZE_MASK,
    )


def size_of(value: int) -> int:
    return (value >> SIZE_SHIFT) & SIZE_MASK


_PLACE_MASK = (OFFSET_MASK << OFFSET_SHIFT) | (FILE_MASK << FILE_SHIFT)


def is_at(value: int | None, file: int, offset: int) -> TypeGuard[int]:
    """Whether an index entry (None: no entry) names this place: the record a scan found
    there, or a GC copied from there, is the one the index holds."""
    return value is not None and value & _PLACE_MASK == (file << FILE_SHIFT) | (
        offset << OFFSET_SHIFT
    )


def relocate(value: int, file: int, offset: int) -> int:
    """The same entry (refs, size) at another place."""
    return (value & LOCATION_CLEAR) | (offset << OFFSET_SHIFT) | (file << FILE_SHIFT)

"""GC by combining two logically adjacent files, done as copy, then switch.

The three steps, and who runs them:

1. plan (the store, ``warren.store.engine.gc``): pick ``Dst`` and its right neighbour
   ``Src`` (both non-current, not locked, their valid data fits in one file), lock both,
   and stage the valid records of each, (msg_id, offset, total_size) in offset order,
   from a scan (the GC process scans in a node) checked against the index.
2. rewrite (``rewrite_combine`` below; the GC process in a node): copy Dst's valid
   records, then Src's, into ``Dst.rdt``, validating every record it copies, and
   fdatasync it, a megabyte at a time. It reads only files that no longer change (neither
   is current) and writes only the temporary file, so it never touches a byte the index
   can point at and the store keeps serving reads, writes and removes meanwhile.
3. apply (the store): in one step, the staged index values (kept right through removes
   and new references during the copy) replace the old ones, ``Dst.rdt`` is renamed over
   ``Dst.rdq``, the directory fsynced, ``Src.rdq`` deleted, the directory fsynced again.

Crash at any point and nothing live is lost: before the rename the old files are intact
and the start deletes the stray ``.rdt``; after the rename Dst holds a copy of everything
live in both, and Src still holds its own until it is unlinked. Dirty recovery keeps the
last copy of each id (highest file, then offset); a record moved from Src keeps its
newest copy in Src until Src is gone, and Src is untouched, so the winner is always a
live copy. Data only moves left, into the older file.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass

from .. import replicated_io
from ..errors import CorruptRecord
from .records import HEADER, OK_MARKER, data_file_name, temp_file_name

WRITE_CHUNK_BYTES = 2**20  # the copy is written out, and fdatasync'd, in chunks of this size

Record = tuple[bytes, int, int]  # (msg_id, offset, total_size)


@dataclass(frozen=True)
class CombinePlan:
    """What the store hands the GC: both files and their valid records."""

    dst: int
    src: int
    dst_records: tuple[Record, ...]
    src_records: tuple[Record, ...]


@dataclass(frozen=True)
class RewriteResult:
    """What the GC reports back: each record's offset in the new Dst, and its size."""

    dst_offsets: tuple[int, ...]
    src_offsets: tuple[int, ...]
    file_size: int


def rewrite_combine(directory: str | os.PathLike, plan: CombinePlan) -> RewriteResult:
    """Write and fdatasync ``Dst.rdt`` holding the plan's records, Dst's first."""
    directory = os.fspath(directory)
    temp_path = os.path.join(directory, temp_file_name(plan.dst))
    out = replicated_io.open(temp_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        written = 0
        offsets = []
        for file, records in ((plan.dst, plan.dst_records), (plan.src, plan.src_records)):
            new_offsets, written = _copy_records(
                os.path.join(directory, data_file_name(file)), records, out, written
            )
            offsets.append(tuple(new_offsets))
        replicated_io.fdatasync(out)
    finally:
        os.close(out)
    return RewriteResult(offsets[0], offsets[1], written)


def _copy_records(
    path: str, records: tuple[Record, ...], out: int, written: int
) -> tuple[list[int], int]:
    """Append ``records`` of ``path`` to ``out``, validating each; new offsets and size."""
    new_offsets: list[int] = []
    buffer = bytearray()
    if not records:
        return new_offsets, written
    with (
        open(path, "rb") as source,
        mmap.mmap(source.fileno(), 0, access=mmap.ACCESS_READ) as mapped,
    ):
        for msg_id, offset, size in records:
            end = offset + size
            if (
                end > len(mapped)
                or mapped[end - 1] != OK_MARKER
                or HEADER.unpack_from(mapped, offset) != (size - 9, msg_id)
            ):
                raise CorruptRecord(
                    f"{path} has no valid record of {msg_id.hex()} at offset {offset}"
                )
            new_offsets.append(written + len(buffer))
            buffer += mapped[offset:end]
            if len(buffer) >= WRITE_CHUNK_BYTES:
                written += _write_all(out, buffer)
                # At once: on ext4 (data=ordered) the store's own fdatasync commits the
                # journal, which first flushes every file's dirty data; a copy left dirty
                # by the megabyte would make each group commit wait for it.
                replicated_io.fdatasync(out)
                buffer.clear()
    written += _write_all(out, buffer)
    return new_offsets, written


def _write_all(fd: int, data: bytearray) -> int:
    view = memoryview(data)
    while view:
        view = view[replicated_io.write(fd, view) :]
    return len(data)

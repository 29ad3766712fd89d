"""``warren store inspect`` of a queue's directory (``<data_dir>/queues/<name>``): what its
segment files hold, read without opening the queue (no lock taken, nothing changed, so
it may run beside the node that owns the queue).

Each ``<seg>.qi`` file (``warren.queues.engine.queue_index`` has the layout) is its
header, its slots and the records of the queue's own store. A slot is absent (all
zeros: never written, or acked), present (a message waiting or unacked, its body in the
shared store or in this file's records), or torn (its CRC fails: a write cut by a
crash, dropped when the queue recovers). A header the queue would not keep (another
kind of file, a corrupt or foreign header) is reported, and its slots are not read:
the queue's recovery deletes such a file with its entries.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from warren.queues.durable_files import is_temporary_of
from warren.queues.engine.queue_index import (
    INDEX_SUFFIX,
    LOCK_FILE,
    SLOT_BYTES,
    slot_area,
    unpack_slot,
    usable_entry_count,
)
from warren.queues.engine.recovery_terms import STORE_CLIENTS_FILE, TERMS_FILE
from warren.queues.engine.segments import HEADER_BYTES, segment_numbers

from ..tables import Column, counted, format_table

__all__ = ["format_queue_inspection", "is_queue_directory"]

QUEUES_DIR = "queues"  # where a node keeps its queues' directories


@dataclass(frozen=True)
class SegmentReport:
    """What one segment file holds."""

    segment: int
    size_bytes: int
    entry_count: int | None  # None: a header the queue would not keep
    present: int  # messages: waiting or unacked
    shared: int  # of which the body is in the shared store
    persistent: int
    torn: int  # slots whose CRC fails
    record_bytes: int  # the queue's own store's records after the slots


def is_queue_directory(directory: str) -> bool:
    """A directory of segment files, or an empty queue's: its recovery terms (a clean
    stop), or its lock and store clients alone in a node's ``queues`` directory (with
    the temporary copy of either that a queue killed while writing it leaves)."""
    with os.scandir(directory) as entries:
        names = {entry.name for entry in entries}
    if any(name.endswith(INDEX_SUFFIX) and name[:-3].isdigit() for name in names):
        return True
    replaced_whole = (TERMS_FILE, STORE_CLIENTS_FILE)
    if names and all(
        name == LOCK_FILE
        or name in replaced_whole
        or any(is_temporary_of(name, target) for target in replaced_whole)
        for name in names
    ):
        parent = os.path.basename(os.path.dirname(os.path.abspath(directory)))
        return TERMS_FILE in names or parent == QUEUES_DIR
    return False


def inspect_queue_directory(directory: str) -> list[SegmentReport]:
    """Every segment file of ``directory``, in order."""
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return [_segment(dir_fd, segment) for segment in segment_numbers(dir_fd, INDEX_SUFFIX)]
    finally:
        os.close(dir_fd)


def _segment(dir_fd: int, segment: int) -> SegmentReport:
    fd = os.open(f"{segment}{INDEX_SUFFIX}", os.O_RDONLY, dir_fd=dir_fd)
    with os.fdopen(fd, "rb") as file:
        data = file.read()
    count = usable_entry_count(data[:HEADER_BYTES], segment)
    if count is None:
        return SegmentReport(segment, len(data), None, 0, 0, 0, 0, 0)
    slots = slot_area(data, count)
    present = shared = persistent = torn = 0
    first_seq = segment * count
    for index, at in enumerate(range(HEADER_BYTES, len(slots), SLOT_BYTES)):
        slot = slots[at : at + SLOT_BYTES]
        if not any(slot):
            continue
        try:
            entry = unpack_slot(first_seq + index, slot)
        except ValueError:
            torn += 1
            continue
        present += 1
        shared += entry.shared
        persistent += entry.persistent
    records = max(0, len(data) - HEADER_BYTES - count * SLOT_BYTES)
    return SegmentReport(segment, len(data), count, present, shared, persistent, torn, records)


_COLUMNS = (
    Column("segment", ">"),
    Column("bytes", ">"),
    Column("slots", ">"),
    Column("messages", ">"),
    Column("in shared store", ">"),
    Column("persistent", ">"),
    Column("torn", ">"),
    Column("record bytes", ">"),
)


def format_queue_inspection(directory: str) -> str:
    """What a queue directory's segment files hold, as a person reads it."""
    reports = inspect_queue_directory(directory)
    rows = [
        [
            f"{r.segment}{INDEX_SUFFIX}",
            f"{r.size_bytes:,}",
            "bad header" if r.entry_count is None else f"{r.entry_count:,}",
            f"{r.present:,}",
            f"{r.shared:,}",
            f"{r.persistent:,}",
            f"{r.torn:,}",
            f"{r.record_bytes:,}",
        ]
        for r in reports
    ]
    stopped = os.path.exists(os.path.join(directory, TERMS_FILE))
    lines = [
        f"queue directory {directory} ("
        + (
            "stopped cleanly: its recovery terms are there"
            if stopped
            else "open, or not stopped cleanly"
        )
        + ")"
    ]
    if rows:
        lines.append(format_table(_COLUMNS, rows))
    messages = sum(r.present for r in reports)
    total = sum(r.size_bytes for r in reports)
    lines.append(
        f"{counted(len(reports), 'segment file')}, {counted(messages, 'message')} "
        f"(waiting or unacked), {total:,} bytes on disk"
    )
    torn = sum(r.torn for r in reports)
    bad = sum(r.entry_count is None for r in reports)
    if torn or bad:
        lines.append(
            f"the queue's next recovery drops {counted(torn, 'torn slot')} and deletes "
            f"{counted(bad, 'file')} with a header it does not keep"
        )
    return "\n".join(lines)

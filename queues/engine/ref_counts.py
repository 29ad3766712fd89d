"""Reference counts for the shared store's dirty recovery, read from the queue indexes.

When ``msg_store_persistent`` starts dirty, its own files cannot tell how many queues
still hold each message; the queues' index files can. ``walk_ref_counts`` reads the
segment files of every durable queue directory given and yields ``(msg_id, 1)`` for
every entry that is present (unacked), persistent and in the shared store; the store
sums them. Queue processes are not asked (they are stopped while the store recovers),
and their locks are not taken: the files are only read. A node with a ``queues``
directory and no queue in it (every one deleted) walks nothing: its store's messages are
then all garbage, where a node that never had a queue (no such directory) gives the
store no walk, which then counts every message it finds once.

``client_refs`` holds the persistent client refs the queues' recovery terms name (the
queues that stopped cleanly), for the store's clean-start check: only of a queue whose
clean stop still holds (``recovery_terms.clean_stop_holds``: its segment files as the
stop left them). A queue whose files were cut since recovers dirty and drops what is
gone; its ref missing, the store recovers dirty too and takes this walk's counts, which
leave out what the queue drops, instead of its own saved counts, which do not.

A segment whose header the queue's own recovery would not keep is skipped (the same rule,
``queue_index.usable_entry_count``: a reference the walker counted for a segment the queue
then deletes would keep its message in the store for good); a torn slot is skipped; both
are counted in ``skipped``.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Iterator

from .queue_index import (
    HEADER_BYTES,
    INDEX_SUFFIX,
    SLOT_BYTES,
    SLOT_PRESENT,
    slot_area,
    unpack_slot,
    usable_entry_count,
)
from .recovery_terms import TERMS_FILE, TERMS_VERSION, clean_stop_holds
from .segments import segment_numbers

__all__ = [
    "QUEUES_DIR",
    "QueueRefCounts",
    "node_clean_clients",
    "node_message_count",
    "node_ref_counts",
    "walk_ref_counts",
]

log = logging.getLogger("warren.queues")

QUEUES_DIR = "queues"  # a node's queue directories live in <data_dir>/queues/


class QueueRefCounts:
    """An iterable of (msg_id, count) over the queue directories, and their clean refs."""

    def __init__(self, queue_directories: Iterable[str | os.PathLike]) -> None:
        self.directories = [os.fspath(d) for d in queue_directories]
        self.client_refs = frozenset(filter(None, map(_persistent_ref, self.directories)))
        self.skipped = 0

    def __iter__(self) -> Iterator[tuple[bytes, int]]:
        for directory in self.directories:
            yield from self._walk(directory)

    def _walk(self, directory: str) -> Iterator[tuple[bytes, int]]:
        for first, data in _usable_segments(directory, self):
            for at in range(HEADER_BYTES, len(data), SLOT_BYTES):
                if data[at] == 0:
                    continue
                try:
                    entry = unpack_slot(
                        first + (at - HEADER_BYTES) // SLOT_BYTES, data[at : at + SLOT_BYTES]
                    )
                except ValueError:
                    self.skipped += 1
                    continue
                if entry.persistent and entry.shared:
                    yield entry.msg_id, 1


def _usable_segments(
    directory: str, counts: QueueRefCounts | None = None
) -> Iterator[tuple[int, bytes]]:
    """(first seq id, whole slots) of each index segment of ``directory`` that the
    queue's own recovery keeps (the files of both formats: their slots lie alike); a
    skipped one is counted in ``counts.skipped``."""
    try:
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
        return
    try:
        for segment in segment_numbers(dir_fd, INDEX_SUFFIX):
            with open(
                f"{segment}{INDEX_SUFFIX}",
                "rb",
                opener=lambda name, flags: os.open(name, flags, dir_fd=dir_fd),
            ) as f:
                data = f.read()
            count = usable_entry_count(data, segment)
            if count is None:  # the queue's own recovery deletes this segment
                if counts is not None:
                    counts.skipped += 1
                continue
            yield segment * count, slot_area(data, count)
    finally:
        os.close(dir_fd)


def walk_ref_counts(queue_directories: Iterable[str | os.PathLike]) -> QueueRefCounts:
    """(msg_id, count) for every persistent, unacked, shared-store entry of the queues in
    ``queue_directories``; ``.client_refs`` names the refs of the queues' clean stops."""
    return QueueRefCounts(queue_directories)


def node_ref_counts(data_dir: str) -> QueueRefCounts | None:
    """The walk over a node's queue directories, or None when the node never had a queue
    (no ``queues`` directory: its store is then used directly, and recovers with its own
    stand-in counts). A node whose queues were all deleted walks none: every message left
    in its store is garbage (the bodies of a queue whose delete a crash cut short)."""
    directories = _queue_directories(data_dir)
    return None if directories is None else walk_ref_counts(directories)


def node_clean_clients(data_dir: str) -> frozenset[bytes] | None:
    """The persistent client refs of the node's queues that stopped cleanly, which the
    store's clean-shutdown files must name exactly for a clean start (a queue that
    crashed since leaves its old ref there: the store then rebuilds its counts from the
    queue indexes); None when the node never had a queue."""
    directories = _queue_directories(data_dir)
    return None if directories is None else QueueRefCounts(directories).client_refs


def node_message_count(data_dir: str) -> int:
    """How many messages the node's queue indexes hold (present slots of usable
    segments, torn ones included): what a node that is starting recovers, about."""
    return sum(
        slots[HEADER_BYTES::SLOT_BYTES].count(SLOT_PRESENT)
        for directory in _queue_directories(data_dir) or ()
        for _first, slots in _usable_segments(directory)
    )


def _queue_directories(data_dir: str) -> list[str] | None:
    """Every directory in ``<data_dir>/queues``; None when there is no such directory."""
    root = os.path.join(data_dir, QUEUES_DIR)
    try:
        names = sorted(os.listdir(root))
    except FileNotFoundError:
        return None
    return [os.path.join(root, n) for n in names if os.path.isdir(os.path.join(root, n))]


def _persistent_ref(directory: str) -> bytes | None:
    """The persistent client ref of the queue's clean stop, if that stop still holds."""
    try:
        with open(os.path.join(directory, TERMS_FILE), "rb") as file:
            terms = json.loads(file.read())
        if terms.get("version") != TERMS_VERSION or not clean_stop_holds(terms, directory):
            return None
        return bytes.fromhex(terms["persistent_ref"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None

"""``warren store inspect DIR``: what a store directory holds, changing nothing.

Reads every ``.rdq`` file with the scanner and reports, per file, its records, valid and
garbage bytes, damaged regions, and how often it was compacted (its ``N.compacted``
marker); and any compaction a crash left unapplied (its journal, rolled back at the next
open). Which records are valid comes from the clean-shutdown
index when one is present and intact (what a clean start would load); otherwise from the
rule dirty recovery uses without reference counts: the last copy of each id is valid,
unless the removal log names it.
It takes no lock and writes nothing, so it may run beside a live store (its figures are
then a moment's view). Anything named like a data file that is not a regular file (a
directory called ``3.rdq``) is listed and otherwise ignored. The ``warren`` command
(``warren.supervisor.cli.main``) prints the report as a table.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..errors import StoreDirectoryError
from . import compaction, snapshot
from . import index as idx
from .records import TEMP_SUFFIX, data_file_name, data_file_number
from .recovery import LOCK_FILE
from .removal_log import read_entries
from .scanner import scan_file


@dataclass
class FileReport:
    file: int
    size: int
    records: int
    valid_records: int = 0
    valid_bytes: int = 0
    damaged: list[tuple[int, int]] = field(default_factory=list)
    compactions: int = 0  # times compacted in place
    compacted_bytes: int = 0  # bytes those compactions cut off

    @property
    def garbage_bytes(self) -> int:
        return self.size - self.valid_bytes


@dataclass
class StoreReport:
    directory: str
    validity_source: str  # "clean-shutdown index" or the dirty-recovery rule
    files: list[FileReport]
    stray_temp_files: list[str]
    snapshot_problem: str | None
    not_files: list[str] = field(default_factory=list)  # named like data files, but not files
    unfinished_compactions: list[str] = field(default_factory=list)  # journals left

    @property
    def message_count(self) -> int:
        return sum(f.valid_records for f in self.files)


def inspect_store(directory: str | os.PathLike) -> StoreReport:
    """Report on ``directory``; ``StoreDirectoryError`` if it is not a store's directory
    (missing, not a directory, unreadable, or holding neither data files nor a store's
    lock file)."""
    directory = os.fspath(directory)
    if not os.path.isdir(directory):
        raise StoreDirectoryError(f"{directory!r} is not a store directory")
    try:
        names = os.listdir(directory)
    except OSError as exc:
        raise StoreDirectoryError(f"cannot read {directory!r}: {exc.strerror}") from None
    numbers = {n: number for n in names if (number := data_file_number(n)) is not None}
    not_files = sorted(n for n in numbers if not os.path.isfile(os.path.join(directory, n)))
    files = sorted(number for n, number in numbers.items() if n not in not_files)
    if not files and LOCK_FILE not in names:
        raise StoreDirectoryError(
            f"{directory!r} is not a store directory: it holds no "
            f".rdq data files and no {LOCK_FILE}"
        )
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        compacted = {file: compaction.read_marker(dir_fd, file) for file in files}
        try:
            saved = snapshot.read(dir_fd)
            problem = snapshot.mismatch(saved, dir_fd, files)
            saved_index = None if problem else saved.index
        except snapshot.SnapshotInvalid as exc:
            saved_index = None
            problem = str(exc) if snapshot.present(dir_fd) else None
    finally:
        os.close(dir_fd)
    reports: list[FileReport] = []
    last_copy: dict[bytes, tuple[int, int, int]] = {}  # msg_id -> (file, offset, size)
    for file in files:
        # A copy, not a mapping: a store starting beside us may truncate its current file.
        found = scan_file(os.path.join(directory, data_file_name(file)), mapped=False)
        reports.append(
            FileReport(
                file,
                found.size,
                len(found.offsets),
                damaged=found.damaged,
                compactions=compacted[file][0],
                compacted_bytes=compacted[file][1],
            )
        )
        for msg_id, offset, size in zip(
            found.msg_ids, found.offsets, found.total_sizes, strict=True
        ):
            last_copy[msg_id] = (file, offset, size)
    by_file = {r.file: r for r in reports}
    if saved_index is not None:
        source = "clean-shutdown index"
        places = ((v >> idx.FILE_SHIFT, idx.size_of(v)) for v in saved_index.values())
    else:
        source = "last copy of each id, less the removal log"
        for file, offset, msg_id in read_entries(directory, files):
            if last_copy.get(msg_id, (None, None))[:2] == (file, offset):
                del last_copy[msg_id]
        places = ((file, size) for file, _offset, size in last_copy.values())
    for file, size in places:
        if file in by_file:
            by_file[file].valid_records += 1
            by_file[file].valid_bytes += size
    stray = sorted(n for n in names if n.endswith(TEMP_SUFFIX))
    journals = sorted(n for n in names if n.endswith(compaction.JOURNAL_SUFFIX))
    return StoreReport(directory, source, reports, stray, problem, not_files, journals)

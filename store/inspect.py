"""``warren store inspect DIR``: what a store directory holds, changing nothing.

Reads every ``.rdq`` file with the scanner and reports, per file, its records, valid and
garbage bytes and damaged regions. Which records are valid comes from the clean-shutdown
index when one is present and intact (what a clean start would load); otherwise from the
rule dirty recovery uses without reference counts: the last copy of each id is valid.
It takes no lock and writes nothing, so it may run beside a live store (its figures are
then a moment's view).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from . import index as idx
from . import snapshot
from .records import TEMP_SUFFIX, data_file_name, data_file_number
from .scanner import scan_file


@dataclass
class FileReport:
    file: int
    size: int
    records: int
    valid_records: int = 0
    valid_bytes: int = 0
    damaged: list[tuple[int, int]] = field(default_factory=list)

    @property
    def garbage_bytes(self) -> int:
        return self.size - self.valid_bytes


@dataclass
class StoreReport:
    directory: str
    validity_source: str                  # "clean-shutdown index" or "last copy of each id"
    files: list[FileReport]
    stray_temp_files: list[str]
    snapshot_problem: str | None

    @property
    def message_count(self) -> int:
        return sum(f.valid_records for f in self.files)


def inspect_store(directory: str | os.PathLike) -> StoreReport:
    directory = os.fspath(directory)
    if not os.path.isdir(directory):
        raise NotADirectoryError(f"{directory!r} is not a store directory")
    names = os.listdir(directory)
    files = sorted(n for n in map(data_file_number, names) if n is not None)
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        saved = snapshot.read(dir_fd)
        problem = snapshot.mismatch(saved, dir_fd, files)
        saved_index = None if problem else saved.index
    except snapshot.SnapshotInvalid as exc:
        saved_index = None
        problem = str(exc) if snapshot.present(dir_fd) else None
    finally:
        os.close(dir_fd)
    reports, last_copy = [], {}
    for file in files:
        # A copy, not a mapping: a store starting beside us may truncate its current file.
        found = scan_file(os.path.join(directory, data_file_name(file)), mapped=False)
        reports.append(FileReport(file, found.size, len(found.offsets), damaged=found.damaged))
        for msg_id, offset, size in zip(found.msg_ids, found.offsets, found.total_sizes):
            last_copy[msg_id] = (file, offset, size)
    by_file = {r.file: r for r in reports}
    if saved_index is not None:
        source = "clean-shutdown index"
        places = ((v >> idx.FILE_SHIFT, idx.size_of(v)) for v in saved_index.values())
    else:
        source = "last copy of each id"
        places = ((file, size) for file, _offset, size in last_copy.values())
    for file, size in places:
        if file in by_file:
            by_file[file].valid_records += 1
            by_file[file].valid_bytes += size
    stray = sorted(n for n in names if n.endswith(TEMP_SUFFIX))
    return StoreReport(directory, source, reports, stray, problem)


def format_report(report: StoreReport) -> str:
    lines = [f"store {report.directory}",
             f"valid records judged by: {report.validity_source}"]
    if report.snapshot_problem:
        lines.append(f"clean-shutdown files present but unusable: {report.snapshot_problem}")
    lines.append(f"{'file':>10} {'bytes':>12} {'records':>8} {'valid':>8} "
                 f"{'valid bytes':>12} {'garbage':>12}  damaged regions")
    for f in report.files:
        damaged = ", ".join(f"{length} B at {offset}" for offset, length in f.damaged) or "-"
        lines.append(f"{data_file_name(f.file):>10} {f.size:>12,} {f.records:>8,} "
                     f"{f.valid_records:>8,} {f.valid_bytes:>12,} {f.garbage_bytes:>12,}  {damaged}")
    total = sum(f.size for f in report.files)
    valid = sum(f.valid_bytes for f in report.files)
    lines.append(f"{len(report.files)} files, {report.message_count:,} messages, "
                 f"{total:,} bytes on disk, {valid:,} valid, {total - valid:,} garbage")
    if report.stray_temp_files:
        lines.append(f"left by an unfinished combine (deleted at next open): "
                     f"{', '.join(report.stray_temp_files)}")
    return "\n".join(lines)

"""The file summary: one entry per ``.rdq`` file, as in rabbit_msg_store's file_summary.

``left``/``right`` link the files in logical order (gaps appear as files are deleted or
combined away); the current file is the one with no right neighbour. ``locked`` marks a
file that a GC job is combining: it is not chosen again, and not deleted when it empties
(the job's apply or abandon deals with it). ``stats()`` adds ``readers``: whether a reader
in another process holds the file's slot of the shared lock table right now (1 or 0: the
kernel's locks can be seen, not counted).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(slots=True)
class FileSummary:
    valid_total_size: int = 0  # bytes of records with references
    file_size: int = 0  # bytes written to the file
    left: int | None = None  # the next older file
    right: int | None = None  # the next younger file; None for the current file
    locked: bool = False
    removes: int = 0  # removes that dropped a record of the file, since the store started

    def as_dict(self) -> dict[str, int | bool | None]:
        return asdict(self)

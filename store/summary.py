"""The file summary: one entry per ``.rdq`` file, as in rabbit_msg_store's file_summary.

``left``/``right`` link the files in logical order (gaps appear as files are deleted or
combined away); the current file is the one with no right neighbour. ``locked`` marks a
file that a GC job is combining: it is not chosen again, and not deleted when it empties
(the job's apply or abandon deals with it). ``readers`` counts direct readers in other
processes; the in-process engine has none.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(slots=True)
class FileSummary:
    valid_total_size: int = 0     # bytes of records with references
    file_size: int = 0            # bytes written to the file
    left: int | None = None       # the next older file
    right: int | None = None      # the next younger file; None for the current file
    locked: bool = False
    readers: int = 0

    def as_dict(self) -> dict:
        return asdict(self)

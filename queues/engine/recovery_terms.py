"""A queue's recovery terms (``recovery.json``, written by ``VariableQueue.terminate``) and
the one rule that says whether its clean stop still holds, which both the queue's own
start and the shared store's reference walker (``ref_counts``) go by.

A clean stop holds while the terms read, are of this version, and the segment files are
as the stop left them: the same names and sizes (``file_sizes``), and every header one the
queue keeps (``queue_index.usable_entry_count``). A segment file cut or grown since (a torn
copy, a restored backup) or with a damaged header makes the queue recover dirty, dropping
the entries that are gone; the shared store must then not start from the reference counts
its own clean stop saved, which still count those entries (a message would stay in the
store for good), but from the walker's, which counts only what the queue will keep. So the
walker names a queue's persistent client ref as clean only when its clean stop holds, and
the store, missing it, recovers dirty.
"""

from __future__ import annotations

import os
from typing import Any

from .queue_index import INDEX_SUFFIX, V1_STORE_SUFFIX, usable_entry_count
from .segments import HEADER_BYTES

__all__ = ["TERMS_FILE", "TERMS_VERSION", "clean_stop_holds", "segment_file_sizes"]

TERMS_FILE = "recovery.json"
TERMS_VERSION = 1


def segment_file_sizes(directory: str) -> dict[str, int]:
    """The size of each segment file of the queue directory, by name."""
    return {
        entry.name: entry.stat().st_size
        for entry in os.scandir(directory)
        if entry.name.endswith((INDEX_SUFFIX, V1_STORE_SUFFIX))
    }


def clean_stop_holds(terms: dict[str, Any], directory: str) -> bool:
    """Whether the segment files of ``directory`` are as the clean stop that wrote
    ``terms`` left them (see the module docstring)."""
    if terms.get("file_sizes") != segment_file_sizes(directory):
        return False
    count = terms.get("segment_entry_count")
    for name in terms["file_sizes"]:
        stem = name.removesuffix(INDEX_SUFFIX)
        if name.endswith(INDEX_SUFFIX) and stem.isdigit():
            with open(os.path.join(directory, name), "rb") as file:
                header = file.read(HEADER_BYTES)
            if usable_entry_count(header, int(stem)) != count:
                return False
    return True

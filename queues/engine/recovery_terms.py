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

The queue's store clients (``store_clients``): the persistent client refs whose references
the queue's index may rely on, one hex ref a line. An open names its new ref there before
its client writes anything, and only that ref once its recovery has claimed the references
of the refs named before (``MessageStore.claim``): a queue killed at any point leaves every
ref that holds one of its references named, so the next recovery claims them all. Written
without fsync: only a queue process that dies while the store runs on needs it (a store
that restarts counts the references from the indexes, and knows no holders).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from ..durable_files import write_atomically
from .queue_index import INDEX_SUFFIX, V1_STORE_SUFFIX, usable_entry_count
from .segments import HEADER_BYTES

__all__ = [
    "STORE_CLIENTS_FILE",
    "TERMS_FILE",
    "TERMS_VERSION",
    "clean_stop_holds",
    "name_store_clients",
    "segment_file_sizes",
    "store_clients",
]

TERMS_FILE = "recovery.json"
STORE_CLIENTS_FILE = "store_clients"

log = logging.getLogger(__name__)
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


def store_clients(directory: str) -> list[bytes]:
    """The persistent client refs the queue's earlier opens named; [] when there are none
    or the file does not read as refs."""
    path = os.path.join(directory, STORE_CLIENTS_FILE)
    try:
        with open(path, "rb") as file:
            return [bytes.fromhex(line.decode()) for line in file.read().split()]
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        # Only references recovered at the store's start can be claimed then.
        log.warning("%s does not read (%s); its refs are not claimed", path, exc)
        return []


def name_store_clients(directory: str, refs: list[bytes]) -> None:
    """Name ``refs`` as the queue's store clients (see the module docstring)."""
    data = "".join(f"{ref.hex()}\n" for ref in refs).encode()
    write_atomically(os.path.join(directory, STORE_CLIENTS_FILE), data, durable=False)

"""A queue's recovery terms (``recovery.json``, written by ``VariableQueue.terminate``
through ``save_terms``, taken by its next open through ``take_terms``) and the one rule
that says whether its clean stop still holds, which both the queue's own start and the
shared store's reference walker (``ref_counts``) go by.

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
the queue's index may rely on, one hex ref a line, after a line ``store START SINCE``: the
start token of the store they were made with and the first seq id the queue took since
that start. An open names its new ref there before its recovery claims the references of
the refs named before (``MessageStore.claim``), and only that ref once it has: a queue
killed at any point leaves every ref that holds one of its references named, so the next
recovery claims them all. Only the entries below SINCE may claim a reference the store
recovered at its start (of no known holder): a newer entry's reference was written since,
and is its own or another queue's. Written without fsync: only a queue process that dies
while the store runs on needs it (a store that restarts starts anew: SINCE then is the
queue's next seq id).
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any, NamedTuple

from warren.store import replicated_io

from ..durable_files import fsync_directory, write_atomically
from .queue_index import INDEX_SUFFIX, V1_STORE_SUFFIX, usable_entry_count
from .segments import HEADER_BYTES

__all__ = [
    "STORE_CLIENTS_FILE",
    "StoreClients",
    "TERMS_FILE",
    "TERMS_VERSION",
    "clean_stop_holds",
    "name_store_clients",
    "save_terms",
    "segment_file_sizes",
    "store_clients",
    "take_terms",
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


def save_terms(directory: str, segment_entry_count: int, **terms: Any) -> None:
    """Write the recovery terms of a clean stop of the queue in ``directory``: ``terms``
    (next_seq_id, persistent_count and persistent_bytes, segments, store_segments,
    delivery_counts, persistent_ref), the version, the layout and the file sizes."""
    terms.update(
        version=TERMS_VERSION,
        segment_entry_count=segment_entry_count,
        file_sizes=segment_file_sizes(directory),
    )
    write_atomically(os.path.join(directory, TERMS_FILE), json.dumps(terms).encode())


def take_terms(directory: str, segment_entry_count: int) -> dict[str, Any] | None:
    """The recovery terms of a clean stop, deleted from disk (a crash from now on is a
    dirty stop); None if there are none, they do not read, or they are of another
    version or layout."""
    path = os.path.join(directory, TERMS_FILE)
    try:
        with open(path, "rb") as file:
            terms = json.loads(file.read())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("%s: recovery terms unreadable (%s); recovering dirty", directory, exc)
        terms = None
    replicated_io.unlink(path)
    fsync_directory(directory)
    if terms is not None and (
        not isinstance(terms, dict)
        or terms.get("version") != TERMS_VERSION
        or terms.get("segment_entry_count") != segment_entry_count
    ):
        log.warning("%s: recovery terms of another version or layout; recovering dirty", directory)
        return None
    return terms


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


class StoreClients(NamedTuple):
    """What ``store_clients`` holds: the start token of the store the queue last opened
    against, the first seq id the queue took since that start (None: not known yet, the
    open that would have said died first), and the persistent client refs whose
    references the queue's index may rely on."""

    store_start: str | None
    since: int | None
    refs: list[bytes]


def store_clients(directory: str) -> StoreClients:
    """The queue's store clients as its earlier opens named them; none when there are
    none or the file does not read."""
    path = os.path.join(directory, STORE_CLIENTS_FILE)
    try:
        with open(path, "rb") as file:
            head, *refs = file.read().decode().splitlines()
        word, start, since = head.split(" ")
        if word != "store":
            raise ValueError(f"a first line of {head!r}")
        first = None if since == "-" else int(since)
        return StoreClients(start, first, [bytes.fromhex(ref) for ref in refs])
    except FileNotFoundError:
        return StoreClients(None, None, [])
    except (OSError, ValueError) as exc:
        # Only references recovered at the store's start can be claimed then.
        log.warning("%s does not read (%s); its refs are not claimed", path, exc)
        return StoreClients(None, None, [])


def name_store_clients(directory: str, clients: StoreClients) -> None:
    """Write ``clients`` as the queue's store clients (see the module docstring)."""
    since = "-" if clients.since is None else str(clients.since)
    lines = [f"store {clients.store_start} {since}", *(ref.hex() for ref in clients.refs)]
    data = "".join(f"{line}\n" for line in lines).encode()
    write_atomically(os.path.join(directory, STORE_CLIENTS_FILE), data, durable=False)

"""Opening a queue's directory: what ``VariableQueue`` holds again after a clean stop or a
crash (``recover``), as the seq ids, counts and store clients it starts from.

Clean. ``VariableQueue.terminate`` writes the recovery terms (``recovery_terms``: next seq
id, the persistent count and bytes, per-segment counts, delivery counts, the persistent
client ref). An open that finds them, with a clean shared store and segment files as the
stop left them, starts without reading the index: everything is in delta, and transient
entries met while loading it are dropped. The terms are deleted at open, so a crash
afterwards always recovers dirty.

Dirty. Without terms (a crash), after a dirty shared store, or with terms whose segment
files changed since the clean stop (cut or grown, a damaged header), every segment is
scanned. Dropped: entries of transient messages; entries whose shared-store message holds
no reference of this queue (one batched claim: the body may be there for another queue,
while this queue's write died with it; ``recovery_terms`` names the refs it claims from);
entries whose own record fails its size or CRC check. Every recovered message is flagged
redelivered. The shared store's reference walker then does not name this queue's client
ref as clean: the store recovers dirty as well and counts only the references the scan
keeps, so a torn slot's message does not stay in the store for good.

Races this module guards against (one thread of control; the queue's process owns it):

- a queue killed during its recovery, before or after it claimed its predecessors'
  references: the new ref is named beside the old ones before any claim, and alone only
  once the claims are done, so the next open claims from all of them;
- an entry written since the shared store's start: it never takes a reference the store
  recovered at that start (of no known holder), only one it was written with;
- an entry whose body never reached the shared store (killed between its index write and
  its store write): never confirmed, dropped, and logged at INFO as a crash's cost.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from .msg_status import SharedStoreClient
from .queue_index import Entry, QueueIndex
from .queue_store import QueueStore
from .recovery_terms import (
    StoreClients,
    name_store_clients,
    segment_file_sizes,
    store_clients,
    take_terms,
)

__all__ = ["Recovered", "recover"]

log = logging.getLogger("warren.queues")


class Recovered(NamedTuple):
    """Where an opened queue starts: its store clients, its next seq id, its persistent
    messages (all in the index) and what a dirty recovery flags redelivered."""

    persistent: SharedStoreClient
    transient: SharedStoreClient
    next_seq_id: int
    persistent_count: int
    persistent_bytes: int
    delivery_counts: dict[int, int]
    redeliver_below: int
    clean: bool


def recover(
    directory: str,
    index: QueueIndex,
    store: QueueStore,
    *,
    persistent_store: Callable[[bytes], SharedStoreClient],
    transient_store: Callable[[bytes], SharedStoreClient],
    shared_store_clean: bool | None,
    counters: dict[str, int],
) -> Recovered:
    """Recover ``index`` and ``store`` of the queue directory ``directory`` (see the module
    docstring), counting what was dropped in ``counters``; None for ``shared_store_clean``:
    as the persistent store's client says."""
    started = time.monotonic()
    had_files = any(name.endswith(".qi") for name in os.listdir(directory))
    terms = take_terms(directory, index.segment_entry_count)
    persistent_ref = bytes.fromhex(terms["persistent_ref"]) if terms else os.urandom(16)
    persistent = persistent_store(persistent_ref)
    transient = transient_store(os.urandom(16))
    if shared_store_clean is None:
        shared_store_clean = persistent.recovered_clean
    store_start = persistent.store_start
    named = store_clients(directory)
    since = named.since if named.store_start == store_start else None
    if had_files and persistent_ref not in named.refs:  # before a claim moves any to it
        name_store_clients(
            directory, StoreClients(named.store_start, named.since, [*named.refs, persistent_ref])
        )
    clean_terms = _trusted(directory, index, terms if shared_store_clean else None)
    if clean_terms is not None:
        index.recover_clean({int(s): c for s, c in clean_terms["segments"].items()})
        store.recover({int(s): c for s, c in clean_terms["store_segments"].items()})
        recovered = Recovered(
            persistent,
            transient,
            clean_terms["next_seq_id"],
            clean_terms["persistent_count"],
            clean_terms["persistent_bytes"],
            {int(s): c for s, c in clean_terms["delivery_counts"].items()},
            redeliver_below=0,
            clean=True,
        )
    else:
        recovered = _recover_dirty(
            directory, index, store, persistent, transient, named.refs, store_start, since, counters
        )
    clients = StoreClients(
        store_start, recovered.next_seq_id if since is None else since, [persistent_ref]
    )
    if clients != named:  # what the predecessors held is this client's now
        name_store_clients(directory, clients)
    if terms is not None or had_files:
        log.info(
            "%s: recovered %d messages (%d bytes) %s in %.3f s; dropped %d transient, "
            "%d missing from the shared store, %d failing their CRC, %d torn index "
            "slots, %d corrupt segments",
            directory,
            recovered.persistent_count,
            recovered.persistent_bytes,
            "clean" if recovered.clean else "dirty",
            time.monotonic() - started,
            counters["dropped_transient"],
            counters["dropped_missing"],
            counters["dropped_corrupt"],
            counters["torn_slots"],
            counters["bad_segments"],
        )
    return recovered


def _trusted(
    directory: str, index: QueueIndex, terms: dict[str, Any] | None
) -> dict[str, Any] | None:
    """``terms`` if the segment files are still as they describe (the index upgraded from
    the previous format first), else None: recover dirty."""
    if terms is not None and terms.get("file_sizes") != segment_file_sizes(directory):
        # Cut or grown since the clean stop (a torn copy, a restored backup): the counts
        # in the terms may name entries that are gone. Only a scan knows.
        log.warning(
            "%s: segment files changed size since the clean stop; recovering dirty", directory
        )
        terms = None
    upgraded, unusable = index.upgrade()
    if upgraded:
        log.info(
            "%s: %d segments of the previous format rewritten as one file each",
            directory,
            upgraded,
        )
    if unusable and terms is not None:
        log.warning(
            "%s: %d segment files have a damaged header; recovering dirty", directory, unusable
        )
        terms = None
    return terms


def _recover_dirty(
    directory: str,
    index: QueueIndex,
    store: QueueStore,
    persistent: SharedStoreClient,
    transient: SharedStoreClient,
    predecessors: list[bytes],
    store_start: str,
    since: int | None,
    counters: dict[str, int],
) -> Recovered:
    """Scan every segment (see the module docstring); the entries it keeps from the
    shared store are those it claims there: from ``predecessors``, and (entries below
    ``since``, taken before the store's start ``store_start``) from what the store
    recovered at that start."""
    store_live: dict[int, int] = {}
    shared: list[Entry] = []
    kept_bytes = 0
    n = index.segment_entry_count

    def keep(entries: list[Entry]) -> list[bool]:
        nonlocal kept_bytes
        verdicts = []
        in_store = [(i, e) for i, e in enumerate(entries) if e.persistent and not e.shared]
        valid = (
            store.valid_records(
                entries[0].seq_id // n, [(e.store_offset, e.size) for _, e in in_store]
            )
            if in_store
            else []
        )
        valid_at = {i: ok for (i, _), ok in zip(in_store, valid, strict=True)}
        for i, entry in enumerate(entries):
            if not entry.persistent:
                counters["dropped_transient"] += 1
                verdicts.append(False)
            elif entry.shared:
                shared.append(entry)
                verdicts.append(True)
            elif valid_at[i]:
                segment = entry.seq_id // n
                store_live[segment] = store_live.get(segment, 0) + 1
                kept_bytes += entry.size
                verdicts.append(True)
            else:
                counters["dropped_corrupt"] += 1
                verdicts.append(False)
        return verdicts

    recovered = index.recover_dirty(keep)
    counters["torn_slots"] += recovered.torn
    counters["bad_segments"] += recovered.bad_segments
    if counters["dropped_corrupt"]:
        log.warning(
            "%s: %d messages failed their size or CRC check; dropped",
            directory,
            counters["dropped_corrupt"],
        )
    missing: list[Entry] = []
    newer = [e for e in shared if since is not None and e.seq_id >= since]
    older = [e for e in shared if since is None or e.seq_id < since]
    for entries, written_since in ((older, None), (newer, store_start)):
        if entries:
            ids = [e.msg_id for e in entries]
            held = persistent.claim_many(ids, predecessors, written_since)
            missing += [e for e, found in zip(entries, held, strict=True) if not found]
    if missing:
        index.ack(e.seq_id for e in missing)
        index.sync()
        counters["dropped_missing"] += len(missing)
        # Indexed before this queue's write reached the shared store (the body may be
        # there, another queue's reference), so never confirmed (a confirm waits for
        # both): the expected cost of a crash. Data the store had and lost is its own
        # warning, in its recovery.
        log.info(
            "%s: %d messages had no reference of this queue in the shared store when "
            "it stopped (never confirmed); dropped",
            directory,
            len(missing),
        )
    store.recover(store_live)
    high = index.bounds()[1]
    return Recovered(
        persistent,
        transient,
        next_seq_id=high,
        persistent_count=recovered.entries - len(missing),
        persistent_bytes=kept_bytes + sum(e.size for e in shared) - sum(e.size for e in missing),
        delivery_counts={},
        redeliver_below=high,
        clean=False,
    )

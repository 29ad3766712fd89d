"""Confirm latency while the GC combines files of small messages, against the same with
no GC running, measured in one run.

    python -m bench gc [--quick]

A store actor (in a real node) holds four files of 100-byte messages; two in three are
then removed, so combines are due. A probe client writes one message every 5 ms and waits
for its confirm, first while nothing else happens (the baseline), then while the GC
combines the files; each latency counts from when the write was due. Small messages are
the GC's worst case: the work per combine grows with the number of records, not their
bytes.
"""

from __future__ import annotations

import os
import shutil
import time

from warren.store.client import StoreClient
from warren.store.protocol import StoreStats
from warren.supervisor import Node

from .table import Row, median, percentile, render, scratch_directory

BODY_BYTES = 100
FILE_BYTES = 16 * 2**20
TARGET_P99_MS = 50.0
PROBE_INTERVAL_S = 0.005


def probe(client: StoreClient, until) -> list[float]:
    """Confirm latencies (ms) of one write every ``PROBE_INTERVAL_S``, until ``until()``
    says stop. Each is measured from when it was due, not from when it went out: a write
    held up behind a stalled store counts the stall, as a steady producer would see it
    (without this, one stall would cost only the one write waiting through it)."""
    latencies = []
    body = os.urandom(BODY_BYTES)
    due = time.perf_counter()
    while not until():
        wait_s = due - time.perf_counter()
        if wait_s > 0:
            time.sleep(wait_s)
        msg_id = os.urandom(16)
        client.write(msg_id, body)
        client.settle()
        latencies.append((time.perf_counter() - due) * 1000)
        client.remove([msg_id])
        due += PROBE_INTERVAL_S
    return latencies


def main(argv: list[str]) -> str:
    scale = 4 if "--quick" in argv else 1
    root = scratch_directory("warren-bench-gc-")
    try:
        with Node(os.path.join(root, "node"), file_size_limit=FILE_BYTES // scale) as node:
            store = node.store()
            loader = StoreClient(store)
            count = 4 * (FILE_BYTES // scale) // (BODY_BYTES + 25)
            ids = [os.urandom(16) for _ in range(count)]
            body = os.urandom(BODY_BYTES)
            for msg_id in ids:
                loader.write(msg_id, body)
            loader.settle()
            prober = StoreClient(store)
            quiet_until = time.monotonic() + 3
            quiet = probe(prober, lambda: time.monotonic() > quiet_until)
            loader.remove([m for n, m in enumerate(ids) if n % 3])
            loader.settle()
            runs_before = store.ask(StoreStats())["gc_runs"]

            def combined() -> bool:
                figures = store.ask(StoreStats())
                return (
                    figures["gc_runs"] > runs_before
                    and not figures["gc_job_in_flight"]
                    and figures["garbage_fraction"] <= 0.5
                )

            started = time.monotonic()
            during = probe(prober, lambda: combined() or time.monotonic() - started > 120)
            figures = store.ask(StoreStats())
            loader.terminate()
            prober.terminate()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    runs = figures["gc_runs"] - runs_before
    note = (
        f"{runs} combines of {FILE_BYTES // scale // 2**20} MiB files of "
        f"{BODY_BYTES} B messages; {len(during)} confirms during them"
    )
    rows = [
        Row(
            "confirm p50 while the GC combines",
            median(during),
            "ms",
            median(quiet),
            note="baseline: the same probe, no GC running",
        ),
        Row(
            "confirm p99 while the GC combines",
            percentile(during, 99),
            "ms",
            percentile(quiet, 99),
            note=f"target <= {TARGET_P99_MS:g} ms: "
            f"{'met' if percentile(during, 99) <= TARGET_P99_MS else 'MISSED'}",
        ),
        Row("confirm max while the GC combines", max(during), "ms", max(quiet), note=note),
        Row(
            "longest hold of the store's loop by one GC step",
            figures["longest_gc_slice_ms"],
            "ms",
            note="a staging slice or the switch; target about 20 ms",
        ),
    ]
    return render("confirm latency during GC (store actor, 100 B messages)", rows)

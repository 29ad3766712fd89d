"""The queue engine against raw appends and the store engine, measured in the same run.

    python -m bench queue [--quick]

- publish+sync then fetch+ack of 100 B, 1 KiB and 16 KiB messages, in a default and a
  lazy queue (``VariableQueue.publish_many`` in batches of 100, as a queue process takes
  them from a producer's frame, and ``publish_encoded`` one at a time, for 1 KiB; a sync
  every 1,000 publishes), against appending the same encoded messages to
  one file through a 1 MiB buffered writer with an fdatasync every 1,000 (raw appends),
  and against ``MessageStore.write`` with a sync every 1,000 (the store engine);
- a backlog of 1,000,000 × 1 KiB messages, in a fresh process each: published with a RAM
  target of infinity (every message an alpha) and of 0 (every message in delta), the time
  and the RSS it adds per message; then the time to recover it after a clean stop
  (recovery terms) and after a dirty one (the object dropped: a full index scan, every
  record's CRC checked).

``--quick`` shrinks every volume by 8x (figures get noisier).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time

import psutil

from warren.queues import Message, VariableQueue, encode
from warren.store import LocalStoreClient, MessageStore

from .table import Row, render

MIB = 2**20
SIZES = [(100, 200_000), (1024, 100_000), (16384, 20_000)]
PUBLISHES_PER_SYNC = 1000
PUBLISH_BATCH = 100
BACKLOG = 1_000_000
PUBLISH_TARGET = 0.3          # of raw appends, 1 KiB
DELTA_BYTES_TARGET = 10       # RAM per message in delta
DIRTY_RECOVERY_TARGET_S = 5.0


def open_queue(root: str, lazy: bool = False) -> tuple[VariableQueue, MessageStore, MessageStore]:
    persistent = MessageStore(os.path.join(root, "msg_store_persistent"))
    transient = MessageStore(os.path.join(root, "msg_store_transient"))
    queue = VariableQueue(os.path.join(root, "queues", "q"), lazy=lazy,
                          persistent_store=lambda ref: LocalStoreClient(persistent, ref),
                          transient_store=lambda ref: LocalStoreClient(transient, ref),
                          shared_store_clean=persistent.recovered_clean)
    return queue, persistent, transient


def raw_appends(root: str, payload: bytes, count: int) -> float:
    started = time.perf_counter()
    with open(os.path.join(root, "raw"), "wb", buffering=MIB) as file:
        for n in range(count):
            file.write(payload)
            if n % PUBLISHES_PER_SYNC == PUBLISHES_PER_SYNC - 1:
                file.flush()
                os.fdatasync(file.fileno())
        file.flush()
        os.fdatasync(file.fileno())
    return count / (time.perf_counter() - started)


def store_engine(root: str, payload: bytes, count: int) -> float:
    store = MessageStore(os.path.join(root, "engine"))
    ids = [n.to_bytes(16, "big") for n in range(count)]
    started = time.perf_counter()
    for n in range(count):
        store.write(ids[n], payload)
        if n % PUBLISHES_PER_SYNC == PUBLISHES_PER_SYNC - 1:
            store.sync()
    store.sync()
    rate = count / (time.perf_counter() - started)
    store.close()
    return rate


def queue_round(root: str, payload: bytes, count: int, lazy: bool,
                batch: int = PUBLISH_BATCH) -> tuple[float, float]:
    """(publish+sync, fetch+ack) in messages per second; ``batch`` 1: one at a time."""
    queue, persistent, transient = open_queue(root, lazy)
    payloads = [payload] * batch
    started = time.perf_counter()
    for n in range(0, count, batch):
        if batch == 1:
            queue.publish_encoded(payload, persistent=True)
        else:
            queue.publish_many(payloads)
        if (n + batch) % PUBLISHES_PER_SYNC == 0:
            queue.sync()
    queue.sync()
    publish = count / (time.perf_counter() - started)
    started = time.perf_counter()
    fetched = 0
    while (delivery := queue.fetch()) is not None:
        queue.ack([delivery.seq_id])
        fetched += 1
        if fetched % PUBLISHES_PER_SYNC == 0:
            queue.sync()
    queue.sync()
    consume = fetched / (time.perf_counter() - started)
    assert fetched == count, (fetched, count)
    queue.terminate()
    persistent.close()
    transient.close()
    return publish, consume


def throughput_rows(scale: int) -> list[Row]:
    rows = []
    for size, count in SIZES:
        count //= scale
        payload = encode(Message(b"x" * size))
        for lazy in (False, True):
            root = tempfile.mkdtemp(prefix="warren-bench-queue-")
            try:
                raw = raw_appends(root, payload, count)
                engine = store_engine(root, payload, count) if not lazy else None
                publish, consume = queue_round(root, payload, count, lazy)
                single = (queue_round(root, payload, count, lazy, batch=1)[0]
                          if size == 1024 and not lazy else None)
            finally:
                shutil.rmtree(root)
            mode = "lazy" if lazy else "default"
            target = PUBLISH_TARGET if size == 1024 else None
            rows.append(Row(f"publish+sync {size} B, {mode}", publish, "msg/s", raw, target,
                            "vs raw appends"))
            if engine is not None:
                rows.append(Row("  same, vs the store engine", publish, "msg/s", engine))
            if single is not None:
                rows.append(Row("  one at a time", single, "msg/s", raw, None,
                                "publish_encoded, vs raw appends"))
            rows.append(Row(f"fetch+ack {size} B, {mode}", consume, "msg/s", raw, None,
                            "vs raw appends"))
    return rows


def backlog_child(root: str, count: int, target: float, stop: str) -> dict:
    """In a fresh process: publish the backlog at ``target``; RSS and time; then stop."""
    process = psutil.Process()
    payload = encode(Message(b"x" * 1024))
    queue, persistent, transient = open_queue(root)
    queue.set_ram_duration_target(target)
    rss_before = process.memory_info().rss
    started = time.perf_counter()
    for n in range(count):
        # a bytes object of its own per message, as messages arriving from a socket have
        queue.publish_encoded(payload[:-8] + n.to_bytes(8, "big"), persistent=True)
        if n % PUBLISHES_PER_SYNC == PUBLISHES_PER_SYNC - 1:
            queue.sync()
    queue.sync()
    while queue.reduce_memory_use():
        pass
    elapsed = time.perf_counter() - started
    stats = queue.stats()
    rss_per_message = (process.memory_info().rss - rss_before) / count
    if stop == "clean":
        queue.terminate()
        persistent.close()
    else:
        queue.abandon()
        persistent.close()
    transient.close()
    return {"elapsed": elapsed, "rss_per_message": rss_per_message,
            "alpha": stats["alpha"], "delta": stats["delta"]}


def recover_child(root: str) -> dict:
    started = time.perf_counter()
    queue, persistent, transient = open_queue(root)
    elapsed = time.perf_counter() - started
    length = len(queue)
    clean = queue.recovered_clean
    queue.terminate()
    persistent.close()
    transient.close()
    return {"elapsed": elapsed, "len": length, "clean": clean}


def in_child(function: str, *args) -> dict:
    code = (f"import json, sys; from bench.bench_queue import {function}; "
            f"print(json.dumps({function}(*json.loads(sys.argv[1]))))")
    result = subprocess.run([sys.executable, "-c", code, json.dumps(args)], check=True,
                            capture_output=True, text=True,
                            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return json.loads(result.stdout.strip().splitlines()[-1])


def backlog_rows(scale: int) -> list[Row]:
    count = BACKLOG // scale
    rows = []
    for target, stop in ((math.inf, "clean"), (0, "dirty")):
        root = tempfile.mkdtemp(prefix="warren-bench-backlog-")
        try:
            built = in_child("backlog_child", root, count, target, stop)
            state = "alpha" if target == math.inf else "delta"
            # At a target of 0 the head segment stays in q3 as gammas: no alpha is left.
            assert built["alpha"] == (count if state == "alpha" else 0), built
            rows.append(Row(f"{count:,} x 1 KiB published, all in {state}",
                            count / built["elapsed"], "msg/s"))
            rss = built["rss_per_message"]
            rows.append(Row(f"  RAM per message in {state}", rss, "B", note=ceiling(
                rss, DELTA_BYTES_TARGET, "B") if state == "delta" else ""))
            recovered = in_child("recover_child", root)
            assert recovered["len"] == count and recovered["clean"] == (stop == "clean")
            seconds = recovered["elapsed"]
            rows.append(Row(f"  recovery after a {stop} stop", seconds, "s", note=ceiling(
                seconds * BACKLOG / count, DIRTY_RECOVERY_TARGET_S, "s for 1M")
                if stop == "dirty" else ""))
        finally:
            shutil.rmtree(root)
    return rows


def ceiling(figure: float, limit: float, unit: str) -> str:
    """A note for a target that is an upper bound (the table's targets are floors)."""
    return f"{'MISSED ' if figure > limit else ''}target <= {limit:g} {unit}"


def main(argv: list[str]) -> str:
    scale = 8 if "--quick" in argv else 1
    return "\n\n".join([
        render("Queue engine: publish+sync and fetch+ack (sync every 1,000)",
               throughput_rows(scale)),
        render("Queue engine: a 1 KiB backlog, paging and recovery", backlog_rows(scale)),
    ])

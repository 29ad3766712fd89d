"""The store engine against raw Python file I/O, measured in the same run.

    python -m bench store [--quick]

- write+sync: MessageStore.write + sync() every N messages, against appending the same
  records to one file through a 1 MiB buffered writer with fdatasync every N messages;
- random reads by id against os.pread of the same records at known offsets;
- dirty recovery of 1 GiB of 1 KiB messages against a raw sequential read of the same
  files, both from a cold cache (each file's pages dropped with posix_fadvise DONTNEED,
  which needs no privileges; a machine-wide drop_caches would also drop everything else);
- a GC pass (compactions, then combines), in MB moved per second;
- what the removal log costs a workload that removes everything it writes;
- index memory per message at 1,000,000 messages, and a full collection's pause.

``--quick`` shrinks every volume by 8x (figures get noisier).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import time
from functools import partial

from warren.store import MessageStore
from warren.store.engine.records import encode_record

from .table import Row, Stopwatch, best_of_alternating, render, scale_of, scratch_directory

MIB = 2**20
WRITE_SIZES = [(100, 200_000), (1024, 100_000), (4096, 50_000), (65536, 4_000)]
WRITE_TARGETS = {1024: 0.5, 65536: 0.8}
MESSAGES_PER_SYNC = 1000
SYNC_BYTES_CAP = 16 * MIB


def ids(count: int, seed: int = 0) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(16) for _ in range(count)]


def drop_cache(paths) -> None:
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def rdq_paths(directory: str) -> list[str]:
    return sorted(
        (os.path.join(directory, n) for n in os.listdir(directory) if n.endswith(".rdq")),
        key=lambda p: int(os.path.basename(p)[:-4]),
    )


def raw_writes(root, size, message_ids, body, per_sync) -> float:
    """The records appended to one file, fdatasynced every ``per_sync`` and at the end."""
    count = len(message_ids)
    path = os.path.join(root, f"raw-{size}.rdq")
    with Stopwatch() as watch:
        with open(path, "wb", buffering=MIB) as f:
            for n, mid in enumerate(message_ids, 1):
                f.write(encode_record(mid, body))
                if n % per_sync == 0 or n == count:
                    f.flush()
                    os.fdatasync(f.fileno())
    os.unlink(path)
    return watch.seconds


def engine_writes(root, size, message_ids, body, per_sync) -> float:
    """The messages written to a MessageStore, synced every ``per_sync`` and at the end."""
    count = len(message_ids)
    directory = os.path.join(root, f"store-{size}")
    with MessageStore(directory, auto_gc=False) as store, Stopwatch() as watch:
        for n, mid in enumerate(message_ids, 1):
            store.write(mid, body)
            if n % per_sync == 0 or n == count:
                store.sync()
    shutil.rmtree(directory)
    return watch.seconds


def bench_writes(root: str, scale: int) -> list[Row]:
    rows = []
    for size, count in WRITE_SIZES:
        count //= scale
        per_sync = max(1, min(MESSAGES_PER_SYNC, SYNC_BYTES_CAP // size))
        body = os.urandom(size)
        message_ids = ids(count, seed=size)
        raw_seconds, engine_seconds = best_of_alternating(
            partial(raw_writes, root, size, message_ids, body, per_sync),
            partial(engine_writes, root, size, message_ids, body, per_sync),
        )
        label = f"{size} B" if size < 1024 else f"{size // 1024} KiB"
        rows.append(
            Row(
                f"write+sync {label} (sync every {per_sync})",
                count / engine_seconds,
                "msgs/s",
                count / raw_seconds,
                WRITE_TARGETS.get(size),
                f"{count * (size + 25) / engine_seconds / 1e6:,.0f} MB/s",
            )
        )
    return rows


def bench_random_reads(root: str, scale: int) -> list[Row]:
    count = 100_000 // scale
    reads = 200_000 // scale
    directory = os.path.join(root, "reads")
    message_ids = ids(count, seed=7)
    with MessageStore(directory, auto_gc=False) as store:
        for mid in message_ids:
            store.write(mid, os.urandom(1024))
        store.sync()
        order = [random.Random(3).choice(message_ids) for _ in range(reads)]
        places = [store.location(mid) for mid in order]
        fds = {
            file: os.open(os.path.join(directory, f"{file}.rdq"), os.O_RDONLY)
            for file in {p.file for p in places}
        }
        known = [(fds[p.file], p.total_size, p.offset) for p in places]

        def raw() -> float:
            pread = os.pread
            with Stopwatch() as watch:
                for fd, size, offset in known:
                    pread(fd, size, offset)
            return watch.seconds

        def engine() -> float:
            read = store.read
            with Stopwatch() as watch:
                for mid in order:
                    read(mid)
            return watch.seconds

        try:
            raw_seconds, engine_seconds = best_of_alternating(raw, engine)
        finally:
            for fd in fds.values():
                os.close(fd)
    shutil.rmtree(directory)
    return [
        Row(
            "random read by id, 1 KiB (page cache)",
            reads / engine_seconds,
            "msgs/s",
            reads / raw_seconds,
            0.5,
            "baseline: os.pread at known offsets",
        )
    ]


RECOVER_IN_A_FRESH_PROCESS = """
import gc, json, sys, time
import psutil
from warren.store import MessageStore
process = psutil.Process()
gc.collect()
before = process.memory_info().rss
started = time.perf_counter()
store = MessageStore(sys.argv[1], auto_gc=False)
seconds = time.perf_counter() - started
gc.collect()
rss_growth = process.memory_info().rss - before
index = store._index
accounted = sys.getsizeof(index) + sum(
    sys.getsizeof(k) + sys.getsizeof(v) for k, v in index.items()
)
started = time.perf_counter()
gc.collect()
print(json.dumps({"seconds": seconds, "rss_growth": rss_growth, "accounted": accounted,
                  "gc_pause": time.perf_counter() - started,
                  "messages": store.stats()["message_count"]}))
store._release()
"""


def bench_recovery_and_memory(root: str, scale: int) -> list[Row]:
    count = 1_000_000 // scale
    directory = os.path.join(root, "recovery")
    body = os.urandom(1024)
    store = MessageStore(directory, auto_gc=False)
    for n, mid in enumerate(ids(count, seed=11), 1):
        store.write(mid, body)
        if n % 10_000 == 0:
            store.sync()
    store.sync()
    store._release()  # stop as a crash would: no clean-shutdown files
    paths = rdq_paths(directory)
    total_bytes = sum(os.path.getsize(p) for p in paths)

    drop_cache(paths)
    with Stopwatch() as raw:
        for path in paths:
            with open(path, "rb", buffering=0) as f:
                while f.read(4 * MIB):
                    pass
    drop_cache(paths)
    measured = json.loads(
        subprocess.run(
            [sys.executable, "-c", RECOVER_IN_A_FRESH_PROCESS, directory],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    shutil.rmtree(directory)
    assert measured["messages"] == count, (measured["messages"], count)
    engine_seconds = measured["seconds"]
    gib = total_bytes / 2**30
    return [
        Row(
            f"dirty recovery, {gib:.2f} GiB of 1 KiB msgs (cold)",
            total_bytes / engine_seconds / 1e6,
            "MB/s",
            total_bytes / raw.seconds / 1e6,
            0.3,
            f"{engine_seconds:.2f} s vs raw read {raw.seconds:.2f} s",
        ),
        Row(
            f"index memory per message at {count:,}",
            measured["rss_growth"] / count,
            "bytes",
            note=f"RSS growth of a fresh process; objects alone "
            f"{measured['accounted'] / count:.0f} B; target <= 150",
        ),
        Row("full gc.collect() pause with that index", measured["gc_pause"] * 1000, "ms"),
    ]


def bench_gc(root: str, scale: int) -> list[Row]:
    count = 200_000 // scale
    body = os.urandom(1024)
    message_ids = ids(count, seed=13)
    rows = []
    for gc, jobs in (("compact", "compactions"), ("combine", "combines")):
        directory = os.path.join(root, f"gc-{gc}")
        with MessageStore(directory, file_size_limit=4 * MIB, auto_gc=False, gc=gc) as store:
            for mid in message_ids:
                store.write(mid, body)
            store.sync()
            for n, mid in enumerate(message_ids):
                if n % 3:
                    store.remove(mid)
            store.sync()
            with Stopwatch() as collecting:
                runs = store.collect_garbage()
            moved = store.stats()["gc_bytes_moved"]
        shutil.rmtree(directory)
        rows.append(
            Row(
                f"GC: {runs} {jobs} of 4 MiB files, 1/3 valid",
                moved / collecting.seconds / 1e6,
                "MB/s moved",
                note=f"{moved / 1e6:,.0f} MB in {collecting.seconds:.2f} s",
            )
        )
    return rows


def bench_removal_log(root: str, scale: int) -> list[Row]:
    """What the removal log costs an ack-heavy workload: write 1 KiB, sync, remove them,
    sync, in rounds of 1000, against the same with the log's appends skipped."""
    count = 100_000 // scale
    body = os.urandom(1024)
    message_ids = ids(count, seed=17)

    def run(logged: bool) -> float:
        directory = os.path.join(root, f"removals-{logged}")
        with MessageStore(directory, auto_gc=False) as store:
            if not logged:
                store._removals.note = lambda *_: None  # the baseline: no entries kept
            with Stopwatch() as watch:
                for start in range(0, count, MESSAGES_PER_SYNC):
                    batch = message_ids[start : start + MESSAGES_PER_SYNC]
                    for mid in batch:
                        store.write(mid, body)
                    store.sync()
                    for mid in batch:
                        store.remove(mid)
                    store.sync()
        shutil.rmtree(directory)
        return watch.seconds

    baseline, logged = best_of_alternating(lambda: run(False), lambda: run(True))
    return [
        Row(
            "write, sync, remove, sync 1 KiB with the removal log",
            count / logged,
            "msgs/s",
            count / baseline,
            note="baseline: the same with the log's appends skipped",
        )
    ]


def main(argv: list[str]) -> str:
    scale, _ = scale_of(argv)
    root = scratch_directory()
    try:
        started = time.perf_counter()
        rows = bench_writes(root, scale)
        rows += bench_removal_log(root, scale)
        rows += bench_random_reads(root, scale)
        rows += bench_gc(root, scale)
        rows += bench_recovery_and_memory(root, scale)
        title = (
            f"store engine vs raw Python I/O ({time.perf_counter() - started:.0f} s, "
            f"{'quick' if scale > 1 else 'full'} volumes)"
        )
        return render(title, rows)
    finally:
        shutil.rmtree(root, ignore_errors=True)

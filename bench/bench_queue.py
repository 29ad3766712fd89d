"""The queue engine (``VariableQueue``) against raw Python file I/O and the store engine,
measured in the same run.

    python -m bench queue [--quick]

- publish+sync then fetch+ack of 100 B, 1 KiB and 16 KiB bodies (110, 1,035 and 16,395
  bytes encoded; the first two go to the queue's own store, 16 KiB to the shared store),
  in a default and a lazy queue: every message persistent, a sync every 1,000 publishes,
  each delivery acked on its own. Publishes go one at a time (``publish_encoded``, as a
  queue process takes them off the wire, already encoded) and, in the default queue, in
  batches of 100 (``publish_many``, one producer's frame) where the batch path applies,
  with the garbage collector set as a queue process sets it (no automatic full
  collections). Each publish+sync is run alternately with its baseline, raw appends (best
  of 3 on each side): the same encoded messages appended to one file through a 1 MiB
  buffered writer with an fdatasync every 1,000 (the queue also writes an 8-byte record
  header and a 48-byte index slot per message). The store engine is run alternately with
  raw appends too: ``MessageStore.write`` with a sync every 1,000, then ``read`` +
  ``remove`` of each message, which is fetch+ack's baseline; its own baseline is the raw
  read-back of the appended file in message-sized reads. Target: publish+sync of 1 KiB >=
  0.3 of raw appends.
- a backlog of 1,000,000 × 1 KiB messages, published (sync every 1,000) in a fresh
  process with a RAM duration target of infinity (every message an alpha) and, in
  another, of 0 (paged as it goes, then ``reduce_memory_use`` until nothing is due): the
  time against raw appends of the same messages, and the RSS growth per message, taken
  before the first publish and after the last (each message its own bytes object, as one
  read from a socket). Target: <= 10 bytes per message in delta.
- the time to reopen that backlog (the constructor; the shared stores stay open, as a
  node's would while one queue restarts) after ``terminate()`` (clean: the recovery terms
  stand in for the index) and after ``abandon()`` (dirty: every index slot and every
  record's CRC checked), the dirty one from the page cache and from a cold cache (each
  file's pages dropped with posix_fadvise DONTNEED), against a raw read of the same files
  in the same cache state. Target: a dirty recovery of 1M messages <= 5 s.

``--quick`` shrinks every volume by 8x (figures get noisier; the recovery target scales
with the message count).
"""

from __future__ import annotations

import gc
import json
import math
import os
import shutil
import subprocess
import sys
import time
from functools import partial

import psutil

from warren.queues import Message, VariableQueue, encode
from warren.queues.engine.variable_queue import (
    EMBED_MSGS_BELOW,
    collect_only_the_young_automatically,
)
from warren.store import LocalStoreClient, MessageStore

from .bench_store import drop_cache
from .table import Row, Stopwatch, best_of_alternating, render, scale_of, scratch_directory

MIB = 2**20
SIZES = [(100, 200_000), (1024, 100_000), (16384, 20_000)]
PUBLISHES_PER_SYNC = 1000
PUBLISH_BATCH = 100
PUBLISH_TARGET = {1024: 0.3}  # of raw appends
BACKLOG = 1_000_000
BACKLOG_BODY = 1024
DELTA_BYTES_TARGET = 10  # RSS per message in delta
DIRTY_RECOVERY_TARGET_S = 5.0  # for BACKLOG messages
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def label(size: int) -> str:
    """A body size as the rows name it: 100 B, 1 KiB."""
    return f"{size} B" if size < 1024 else f"{size // 1024} KiB"


def payloads(size: int, count: int) -> list[bytes]:
    """``count`` distinct encoded messages of a ``size``-byte body: one random template
    whose last 8 bytes (the end of the body, so each still decodes) carry a counter."""
    template = encode(Message(os.urandom(size)))[:-8]
    return [template + n.to_bytes(8, "big") for n in range(count)]


class Pass:
    """One side of an alternating comparison with two timed phases: calling it runs
    ``run`` (which returns the seconds of its write phase and of its read phase, or None
    when it has none), keeps the fastest read phase in ``fastest_read`` and returns the
    write phase's seconds to ``best_of_alternating``."""

    def __init__(self, run) -> None:
        self.run = run
        self.fastest_read = math.inf

    def __call__(self) -> float:
        write_seconds, read_seconds = self.run()
        if read_seconds is not None:
            self.fastest_read = min(self.fastest_read, read_seconds)
        return write_seconds


def raw_pass(root: str, messages: list[bytes]) -> tuple[float, float]:
    """Raw appends with an fdatasync every ``PUBLISHES_PER_SYNC``, then the raw read-back."""
    path = os.path.join(root, "raw")
    count = len(messages)
    with Stopwatch() as appends:
        with open(path, "wb", buffering=MIB) as file:
            for n, message in enumerate(messages, 1):
                file.write(message)
                if n % PUBLISHES_PER_SYNC == 0 or n == count:
                    file.flush()
                    os.fdatasync(file.fileno())
    with Stopwatch() as reads:
        with open(path, "rb", buffering=MIB) as file:
            for message in messages:
                file.read(len(message))
    os.unlink(path)
    return appends.seconds, reads.seconds


def store_pass(root: str, messages: list[bytes]) -> tuple[float, float]:
    """``MessageStore.write`` with a sync every ``PUBLISHES_PER_SYNC``, then ``read`` and
    ``remove`` of each message in order."""
    directory = os.path.join(root, "store")
    count = len(messages)
    ids = [n.to_bytes(16, "big") for n in range(count)]
    with MessageStore(directory) as store:
        with Stopwatch() as writes:
            for n, (msg_id, message) in enumerate(zip(ids, messages, strict=True), 1):
                store.write(msg_id, message)
                if n % PUBLISHES_PER_SYNC == 0 or n == count:
                    store.sync()
        with Stopwatch() as reads:
            for msg_id in ids:
                store.read(msg_id)
                store.remove(msg_id)
            store.sync()
    shutil.rmtree(directory)
    return writes.seconds, reads.seconds


class Stores:
    """msg_store_persistent and msg_store_transient as engines in this process, and the
    queue ``q`` over them, all under ``root``."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.persistent = MessageStore(os.path.join(root, "msg_store_persistent"))
        self.transient = MessageStore(os.path.join(root, "msg_store_transient"))
        self.queue_directory = os.path.join(root, "queues", "q")

    def open_queue(self, lazy: bool = False) -> VariableQueue:
        return VariableQueue(
            self.queue_directory,
            lazy=lazy,
            persistent_store=lambda ref: LocalStoreClient(self.persistent, ref),
            transient_store=lambda ref: LocalStoreClient(self.transient, ref),
        )

    def close(self) -> None:
        self.persistent.close()
        self.transient.close()


def queue_pass(
    root: str, messages: list[bytes], lazy: bool, batch: int | None
) -> tuple[float, float | None]:
    """Publish every message (one at a time, or ``batch`` per ``publish_many``) with a sync
    every ``PUBLISHES_PER_SYNC``, then, for one-at-a-time publishes, fetch and ack each
    until the queue is empty (the batched publishes leave the same queue behind: its drain
    would measure the same thing again)."""
    directory = os.path.join(root, "queue")
    stores = Stores(directory)
    queue = stores.open_queue(lazy)
    count = confirmed = 0
    drain = None
    collector = collect_only_the_young_automatically()  # as the queue's own process runs
    try:
        with Stopwatch() as publishes:
            if batch is None:
                for message in messages:
                    queue.publish_encoded(message, persistent=True)
                    count += 1
                    if count % PUBLISHES_PER_SYNC == 0:
                        confirmed += len(queue.sync())
            else:
                for start in range(0, len(messages), batch):
                    count += len(queue.publish_many(messages[start : start + batch]))
                    if count % PUBLISHES_PER_SYNC == 0:
                        confirmed += len(queue.sync())
            confirmed += len(queue.sync())
        assert confirmed == len(messages), f"{confirmed} of {len(messages)} confirmed"
        if batch is None:
            fetched = 0
            with Stopwatch() as drain:
                while (delivery := queue.fetch(ack_required=True)) is not None:
                    queue.ack([delivery.seq_id])
                    fetched += 1
                queue.sync()
            assert fetched == len(messages), f"{fetched} of {len(messages)} fetched"
        queue.terminate()
    finally:
        gc.set_threshold(*collector)
        queue.abandon()  # a no-op after terminate; releases on a failure
        stores.close()
    shutil.rmtree(directory)
    return publishes.seconds, None if drain is None else drain.seconds


def throughput_rows(root: str, scale: int) -> list[Row]:
    rows = []
    for size, count in SIZES:
        count //= scale
        messages = payloads(size, count)
        own_store = len(messages[0]) < EMBED_MSGS_BELOW  # else publish_many falls back
        name = label(size)

        def compare(run, messages=messages) -> tuple[Pass, Pass, float, float]:
            """Alternate raw passes with ``run``: (raw, subject, their fastest writes)."""
            raw, subject = Pass(partial(raw_pass, root, messages)), Pass(run)
            raw_seconds, subject_seconds = best_of_alternating(raw, subject)
            return raw, subject, raw_seconds, subject_seconds

        s_raw, store, s_raw_seconds, store_seconds = compare(partial(store_pass, root, messages))
        for lazy in (False, True):
            mode = "lazy" if lazy else "default"
            _, queue, raw_seconds, queue_seconds = compare(
                partial(queue_pass, root, messages, lazy, None)
            )
            rows.append(
                Row(
                    f"publish+sync {name}, {mode}",
                    count / queue_seconds,
                    "msgs/s",
                    count / raw_seconds,
                    PUBLISH_TARGET.get(size),
                    f"one at a time; {store_seconds / queue_seconds:.2f} of the store engine",
                )
            )
            if not lazy and own_store:
                _, _, b_raw_seconds, batched_seconds = compare(
                    partial(queue_pass, root, messages, lazy, PUBLISH_BATCH)
                )
                rows.append(
                    Row(
                        f"publish+sync {name}, {mode}, batches of {PUBLISH_BATCH}",
                        count / batched_seconds,
                        "msgs/s",
                        count / b_raw_seconds,
                        PUBLISH_TARGET.get(size),
                        f"publish_many; {store_seconds / batched_seconds:.2f} of the store engine",
                    )
                )
            rows.append(
                Row(
                    f"fetch+ack {name}, {mode}",
                    count / queue.fastest_read,
                    "msgs/s",
                    count / store.fastest_read,
                    None,
                    "baseline: the store engine's read+remove",
                )
            )
        rows.append(
            Row(
                f"store engine write+sync {name}",
                count / store_seconds,
                "msgs/s",
                count / s_raw_seconds,
                None,
                "baseline: raw appends",
            )
        )
        rows.append(
            Row(
                f"store engine read+remove {name}",
                count / store.fastest_read,
                "msgs/s",
                count / s_raw.fastest_read,
                None,
                "baseline: raw read-back",
            )
        )
    return rows


def backlog_messages(count: int):
    """The backlog's messages, each made when it is published (its own bytes object, as
    one read from a socket), from one template as ``payloads`` does."""
    template = encode(Message(os.urandom(BACKLOG_BODY)))[:-8]
    return (template + n.to_bytes(8, "big") for n in range(count))


def raw_backlog_seconds(root: str, count: int) -> float:
    """Raw appends of the backlog's messages, made the same way, with the same syncs."""
    path = os.path.join(root, "raw")
    with Stopwatch() as appends:
        with open(path, "wb", buffering=MIB) as file:
            for n, message in enumerate(backlog_messages(count), 1):
                file.write(message)
                if n % PUBLISHES_PER_SYNC == 0 or n == count:
                    file.flush()
                    os.fdatasync(file.fileno())
    os.unlink(path)
    return appends.seconds


def read_files(directory: str) -> float:
    """Seconds to read every file in ``directory`` sequentially, 4 MiB at a time."""
    with Stopwatch() as watch:
        for name in sorted(os.listdir(directory)):
            with open(os.path.join(directory, name), "rb", buffering=0) as file:
                while file.read(4 * MIB):
                    pass
    return watch.seconds


def build_backlog(root: str, count: int, target: float, recover: bool) -> dict:
    """Run in a fresh process (``--child``): publish the backlog at RAM target ``target``,
    then measure the RSS it added and, if ``recover``, the reopening times."""
    process = psutil.Process()
    stores = Stores(root)
    queue = stores.open_queue()
    queue.set_ram_duration_target(target)
    gc.collect()
    rss_before = process.memory_info().rss
    published = 0
    with Stopwatch() as publishes:
        for message in backlog_messages(count):
            queue.publish_encoded(message, persistent=True)
            published += 1
            if published % PUBLISHES_PER_SYNC == 0:
                queue.sync()
        queue.sync()
        while queue.reduce_memory_use():
            pass
    gc.collect()
    rss_growth = process.memory_info().rss - rss_before
    stats = queue.stats()
    result = {
        "seconds": publishes.seconds,
        "rss_growth": rss_growth,
        "stats": {k: stats[k] for k in ("len", "alpha", "beta", "gamma", "delta")},
    }
    if recover:
        directory = stores.queue_directory
        result["bytes"] = sum(
            os.path.getsize(os.path.join(directory, name)) for name in os.listdir(directory)
        )
        queue.terminate()
        with Stopwatch() as clean:
            queue = stores.open_queue()
        result["clean"] = {
            "seconds": clean.seconds,
            "clean": queue.recovered_clean,
            "len": len(queue),
        }
        for cache in ("warm", "cold"):
            queue.abandon()
            if cache == "cold":
                drop_cache(os.path.join(directory, name) for name in os.listdir(directory))
            raw_seconds = read_files(directory)
            if cache == "cold":
                drop_cache(os.path.join(directory, name) for name in os.listdir(directory))
            with Stopwatch() as dirty:
                queue = stores.open_queue()
            result[cache] = {
                "seconds": dirty.seconds,
                "clean": queue.recovered_clean,
                "len": len(queue),
                "raw_seconds": raw_seconds,
            }
    queue.terminate()
    stores.close()
    return result


def in_fresh_process(**arguments) -> dict:
    """``build_backlog(**arguments)`` in a new interpreter, so that nothing this process
    allocated before weighs on its RSS figures."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.bench_queue", "--child", json.dumps(arguments)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
    )
    if done.returncode:
        raise RuntimeError(f"the backlog process failed ({done.returncode}):\n{done.stderr}")
    return json.loads(done.stdout)


def at_most(figure: float, limit: float, unit: str) -> str:
    """A note for a target that is a ceiling (the table's own targets are floors)."""
    return f"{'MISSED ' if figure > limit else ''}target <= {limit:.3g} {unit}"


def backlog_rows(root: str, scale: int) -> list[Row]:
    count = BACKLOG // scale
    message_bytes = len(next(backlog_messages(1)))
    needed = 3 * count * (message_bytes + 64)  # a raw file or a queue, with margin
    free = shutil.disk_usage(root).free
    if free < needed:
        raise RuntimeError(
            f"the backlog needs {needed / 1e9:.1f} GB free in {root}, "
            f"{free / 1e9:.1f} GB are; set WARREN_BENCH_DIR elsewhere"
        )
    rows = []
    for target in (math.inf, 0):
        raw_seconds = raw_backlog_seconds(root, count)
        directory = os.path.join(root, f"backlog-{target}")
        built = in_fresh_process(root=directory, count=count, target=target, recover=target == 0)
        shutil.rmtree(directory)
        stats, per_message = built["stats"], built["rss_growth"] / count
        assert stats["len"] == count, stats
        if target == math.inf:
            assert stats["alpha"] == count, stats
            rows.append(
                Row(
                    f"publish+sync {count:,} x 1 KiB, RAM target inf",
                    count / built["seconds"],
                    "msgs/s",
                    count / raw_seconds,
                    None,
                    f"{built['seconds']:.1f} s; baseline: raw appends",
                )
            )
            rows.append(
                Row(
                    f"RSS per message, {count:,} in alpha",
                    per_message,
                    "bytes",
                    note=f"{message_bytes:,} B of it the message, "
                    f"{per_message - message_bytes:,.0f} B the rest",
                )
            )
            continue
        assert stats["alpha"] == 0 and stats["delta"] + stats["gamma"] == count, stats
        rows.append(
            Row(
                f"publish+sync {count:,} x 1 KiB, RAM target 0",
                count / built["seconds"],
                "msgs/s",
                count / raw_seconds,
                None,
                f"{built['seconds']:.1f} s (paging included); baseline: raw appends",
            )
        )
        rows.append(
            Row(
                f"RSS per message, {stats['delta']:,} of {count:,} in delta",
                per_message,
                "bytes",
                note=f"{at_most(per_message, DELTA_BYTES_TARGET, 'B')}; "
                f"{stats['gamma']:,} gammas left: q3's head segment",
            )
        )
        clean = built["clean"]
        assert clean["clean"] and clean["len"] == count, clean
        rows.append(
            Row(
                "reopen after a clean stop",
                clean["seconds"],
                "s",
                note="recovery terms: no index read",
            )
        )
        limit = DIRTY_RECOVERY_TARGET_S * count / BACKLOG
        gigabytes = built["bytes"] / 1e9
        for cache in ("warm", "cold"):
            dirty = built[cache]
            assert not dirty["clean"] and dirty["len"] == count, dirty
            rows.append(
                Row(
                    f"reopen after a dirty stop, {cache} cache",
                    dirty["seconds"],
                    "s",
                    note=f"{at_most(dirty['seconds'], limit, 's')}; raw read of the "
                    f"{gigabytes:.2f} GB of files {dirty['raw_seconds']:.2f} s",
                )
            )
    return rows


def main(argv: list[str]) -> str:
    scale, volumes = scale_of(argv)
    root = scratch_directory()
    try:
        started = time.perf_counter()
        throughput = throughput_rows(root, scale)
        first = time.perf_counter() - started
        backlog = backlog_rows(root, scale)
        second = time.perf_counter() - started - first
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return "\n\n".join(
        [
            render(
                f"queue engine: publish+sync, fetch+ack (sync every {PUBLISHES_PER_SYNC:,}) "
                f"vs raw Python I/O ({first:.0f} s, {volumes} volumes)",
                throughput,
            ),
            render(
                f"queue engine: a 1 KiB backlog in RAM and in delta, its recovery "
                f"({second:.0f} s, {volumes} volumes)",
                backlog,
            ),
        ]
    )


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        print(json.dumps(build_backlog(**json.loads(sys.argv[2]))))
    else:
        print(main(sys.argv[1:]))

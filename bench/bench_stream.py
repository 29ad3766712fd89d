"""The stream log (``StreamLog``) against raw Python file appends, measured in the same run.

    python -m bench stream [--quick]

- append+sync of 1 KiB records in chunks of 100 and of 1,000: ``append`` of each chunk,
  with a ``sync`` (fdatasync of segment and index, then the committed offset moves)
  whenever 25 ms have passed since the last one, and one at the end. Baseline: the same
  records, joined per chunk, appended to one file with ``os.write`` and an fdatasync
  every 25 ms and at the end (no framing, no CRC, no index). The two are run alternately,
  best of 3 each. Target: >= 0.35 of the baseline.
- reading 1,000,000 records of 100 bytes (chunks of 1,000) from the start with a
  ``StreamReader`` that checks every chunk's CRC, from the page cache. Target: >= 300,000
  records/s (an absolute figure: there is no baseline).

Through a node (a ``warren: stream`` process, the client's ``Connection``):

- publish with confirms, one producer, 1 KiB, in batches of 100 and of 1,000 (a batch is
  one chunk) kept in flight with ``publish_many_async`` (a window of 16,000 messages,
  ``Connection(max_in_flight=...)``; the stream's group commit covers what arrived
  together). Baseline: the raw
  appends above. Targets: >= 150,000 msgs/s and >= 0.35 of the baseline. And, for
  reference, ``publish_many`` of 100 waiting for each confirm.
- consume from the start of a 1,000,000-message stream of 1 KiB: one reader process
  (``consume(offset="first")``, every body touched), then two at once. Targets: >= 300,000
  msgs/s for one, two together >= 1.5x one.
- the stream process's RSS holding 1M and then 10M messages of 100 B (within 5 MiB of
  each other), and the time from SIGKILLing it with 10M on disk to its successor
  answering (<= 1 s).

``--quick`` shrinks every volume by 8x.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import psutil

from warren.queues.engine.stream_log import StreamLog, StreamReader
from warren.supervisor import Node

from .table import Row, best_of_alternating, render, scale_of, scratch_directory

RECORD_BYTES = 1024
SYNC_EVERY_S = 0.025
APPEND_RECORDS = 64_000
READ_RECORDS = 1_000_000
READ_RECORD_BYTES = 100
READ_CHUNK = 1_000
READ_TARGET = 300_000
PUBLISH_TARGET = 150_000
PUBLISH_RATIO_TARGET = 0.35
PUBLISH_WINDOW = 16_000  # unconfirmed messages a producer keeps in flight (16 MiB of 1 KiB)
CONSUME_RECORDS = 1_000_000
TWO_READERS_TARGET = 1.5
RSS_RECORDS = (1_000_000, 10_000_000)
RSS_RECORD_BYTES = 100
RSS_TARGET_MIB = 5
RESTART_TARGET_S = 1.0
READER = """
import sys, time
from warren import connect
connection = connect(sys.argv[1])
last = int(sys.argv[2])
print("ready", flush=True)
sys.stdin.readline()
started = time.perf_counter()
count = size = 0
for delivery in connection.consume("events", offset="first"):
    count += 1
    size += len(delivery.body)
    if delivery.offset >= last:
        break
print(count, time.perf_counter() - started, flush=True)
"""


def _chunks(records: int, per_chunk: int, size: int) -> list[list[bytes]]:
    return [
        [os.urandom(8) * (size // 8) for _ in range(per_chunk)] for _ in range(records // per_chunk)
    ]


def raw_appends(directory: str, chunks: list[list[bytes]]) -> float:
    path = os.path.join(directory, "raw")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        started = last_sync = time.perf_counter()
        for chunk in chunks:
            os.write(fd, b"".join(chunk))
            if time.perf_counter() - last_sync >= SYNC_EVERY_S:
                os.fdatasync(fd)
                last_sync = time.perf_counter()
        os.fdatasync(fd)
        return time.perf_counter() - started
    finally:
        os.close(fd)
        os.unlink(path)


def stream_appends(directory: str, chunks: list[list[bytes]]) -> float:
    path = os.path.join(directory, "stream")
    log = StreamLog(path)
    try:
        started = last_sync = time.perf_counter()
        for chunk in chunks:
            log.append(chunk)
            if time.perf_counter() - last_sync >= SYNC_EVERY_S:
                log.sync()
                last_sync = time.perf_counter()
        log.sync()
        return time.perf_counter() - started
    finally:
        log.abandon()
        shutil.rmtree(path)


def append_rows(root: str, scale: int) -> list[Row]:
    rows = []
    for per_chunk in (100, 1_000):
        chunks = _chunks(APPEND_RECORDS // scale, per_chunk, RECORD_BYTES)
        records = per_chunk * len(chunks)
        raw, stream = best_of_alternating(
            lambda chunks=chunks: raw_appends(root, chunks),
            lambda chunks=chunks: stream_appends(root, chunks),
        )
        rows.append(
            Row(
                f"append+sync 1 KiB records, chunks of {per_chunk:,}",
                records / stream,
                "rec/s",
                baseline=records / raw,
                target=0.35,
                note="baseline: raw appends, fdatasync every 25 ms",
            )
        )
    return rows


def read_row(root: str, scale: int) -> Row:
    path = os.path.join(root, "read")
    total = READ_RECORDS // scale
    chunk = [os.urandom(READ_RECORD_BYTES) for _ in range(READ_CHUNK)]
    with StreamLog(path, sync=False) as log:
        for _ in range(total // READ_CHUNK):
            log.append(chunk)
        committed = log.sync()
    started = time.perf_counter()
    with StreamReader(path, "first", committed) as reader:
        count = sum(1 for _ in reader)
    seconds = time.perf_counter() - started
    shutil.rmtree(path)
    assert count == total, (count, total)
    figure = count / seconds
    met = "met" if figure >= READ_TARGET else "MISSED"
    return Row(
        f"read {count:,} records of 100 B from the start",
        figure,
        "rec/s",
        note=f"target >= {READ_TARGET:,} rec/s: {met}",
    )


def met(figure: float, target: float, floor: bool = True) -> str:
    ok = figure >= target if floor else figure <= target
    return f"target {'>=' if floor else '<='} {target:,g}: {'met' if ok else 'MISSED'}"


def publish_rows(root: str, scale: int) -> list[Row]:
    """A producer keeping batches in flight (``publish_many_async`` in a window of
    ``PUBLISH_WINDOW`` messages), and one waiting for each batch's confirm."""
    rows = []
    with Node(os.path.join(root, "publish")) as node:
        connection = node.connect(max_in_flight=PUBLISH_WINDOW)
        for per_call, pipelined in ((100, True), (1_000, True), (100, False)):
            stream = f"publish-{per_call}-{pipelined}"
            connection.declare_queue(stream, type="stream")
            chunks = _chunks(APPEND_RECORDS // scale, per_call, RECORD_BYTES)
            records = per_call * len(chunks)

            def publish(
                chunks: list[list[bytes]] = chunks,
                stream: str = stream,
                pipelined: bool = pipelined,
            ) -> float:
                started = time.perf_counter()
                if pipelined:
                    sent = [connection.publish_many_async(stream, chunk) for chunk in chunks]
                    for confirm in sent:
                        confirm.result()
                else:
                    for chunk in chunks:
                        connection.publish_many(stream, chunk)
                return time.perf_counter() - started

            raw, broker = best_of_alternating(
                lambda chunks=chunks: raw_appends(root, chunks), publish
            )
            figure = records / broker
            how = f"publish_many_async, batches of {per_call:,}"
            if not pipelined:
                how = f"publish_many {per_call:,}/call, each waited for"
            rows.append(
                Row(
                    f"stream publish+confirm 1 KiB, {how}",
                    figure,
                    "msgs/s",
                    baseline=records / raw,
                    target=PUBLISH_RATIO_TARGET if pipelined else None,
                    note=met(figure, PUBLISH_TARGET) if pipelined else "baseline: raw appends",
                )
            )
        connection.close()
    return rows


def _start_reader(data_dir: str, last: int) -> subprocess.Popen:
    reader = subprocess.Popen(
        [sys.executable, "-c", READER, data_dir, str(last)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert reader.stdout is not None and reader.stdout.readline().strip() == "ready"
    return reader


def _read_together(data_dir: str, last: int, readers: int) -> float:
    """Records per second of ``readers`` reader processes started at once, together."""
    started = [_start_reader(data_dir, last) for _ in range(readers)]
    for reader in started:
        assert reader.stdin is not None
        reader.stdin.write("go\n")
        reader.stdin.flush()
    total, longest = 0, 0.0
    for reader in started:
        out, _ = reader.communicate(timeout=600)
        count, seconds = out.split()
        total, longest = total + int(count), max(longest, float(seconds))
    return total / longest


def consume_rows(root: str, scale: int) -> list[Row]:
    data_dir = os.path.join(root, "consume")
    records = CONSUME_RECORDS // scale
    with Node(data_dir) as node:
        connection = node.connect()
        connection.declare_queue("events", type="stream")
        body = os.urandom(RECORD_BYTES)
        for _ in range(records // 1000):
            connection.publish_many("events", [body] * 1000)
        last = connection.queue_stats("events")["last_offset"]
        connection.close()
        one = max(_read_together(data_dir, last, 1) for _ in range(2))
        two = _read_together(data_dir, last, 2)
    return [
        Row(
            f"stream consume 1 KiB from the start of {records:,}, one reader",
            one,
            "msgs/s",
            note=met(one, READ_TARGET),
        ),
        Row(
            "stream consume, two readers together",
            two,
            "msgs/s",
            baseline=one,
            target=TWO_READERS_TARGET,
            note="baseline: one reader",
        ),
    ]


def _fill(connection: object, stream: str, upto: int) -> None:
    body = os.urandom(RSS_RECORD_BYTES)
    stats = connection.queue_stats(stream)  # type: ignore[attr-defined]
    for _ in range((upto - stats["last_offset"] - 1) // 1000):
        connection.publish_many(stream, [body] * 1000)  # type: ignore[attr-defined]


def _rss_mib(node: Node, stream: str) -> float:
    ref = node.actors.whereis(f"stream {stream}")
    assert ref is not None
    return psutil.Process(ref.pid).memory_info().rss / 2**20


def length_rows(root: str, scale: int) -> list[Row]:
    small, large = (n // scale for n in RSS_RECORDS)
    with Node(os.path.join(root, "length")) as node:
        connection = node.connect()
        connection.declare_queue("events", type="stream")
        _fill(connection, "events", small)
        rss_small = _rss_mib(node, "events")
        _fill(connection, "events", large)
        rss_large = _rss_mib(node, "events")
        held = connection.queue_stats("events")["last_offset"] + 1
        ref = node.actors.whereis("stream events")
        assert ref is not None
        killed = time.perf_counter()
        os.kill(ref.pid, signal.SIGKILL)
        while True:
            try:
                stats = connection.queue_stats("events")
                break
            except Exception:  # between incarnations: ask again
                time.sleep(0.005)
        restart = time.perf_counter() - killed
        assert stats["last_offset"] + 1 == held
        connection.close()
    growth = rss_large - rss_small
    return [
        Row(
            f"stream process RSS, {small:,} then {large:,} x 100 B",
            growth,
            "MiB more",
            note=f"{rss_small:.1f} -> {rss_large:.1f} MiB; {met(growth, RSS_TARGET_MIB, False)}",
        ),
        Row(
            f"stream serving again after SIGKILL, {held:,} on disk",
            restart,
            "s",
            note=met(restart, RESTART_TARGET_S, False),
        ),
    ]


def main(argv: list[str]) -> str:
    scale, volumes = scale_of(argv)
    root = scratch_directory()
    try:
        started = time.perf_counter()
        rows = append_rows(root, scale)
        rows.append(read_row(root, scale))
        rows += publish_rows(root, scale)
        rows += consume_rows(root, scale)
        rows += length_rows(root, scale)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return render(
        f"streams: the log against raw Python I/O, then through a node "
        f"({time.perf_counter() - started:.0f} s, {volumes} volumes)",
        rows,
    )

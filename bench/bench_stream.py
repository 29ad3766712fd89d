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

``--quick`` shrinks every volume by 8x.
"""

from __future__ import annotations

import os
import shutil
import time

from warren.queues.engine.stream_log import StreamLog, StreamReader

from .table import Row, best_of_alternating, render, scale_of, scratch_directory

RECORD_BYTES = 1024
SYNC_EVERY_S = 0.025
APPEND_RECORDS = 64_000
READ_RECORDS = 1_000_000
READ_RECORD_BYTES = 100
READ_CHUNK = 1_000
READ_TARGET = 300_000


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


def main(argv: list[str]) -> str:
    scale, volumes = scale_of(argv)
    root = scratch_directory()
    try:
        started = time.perf_counter()
        rows = append_rows(root, scale)
        rows.append(read_row(root, scale))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return render(
        f"stream log: append+sync and read vs raw Python I/O "
        f"({time.perf_counter() - started:.0f} s, {volumes} volumes)",
        rows,
    )

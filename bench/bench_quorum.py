"""Quorum queues against classic queues measured in the same run, and against RabbitMQ
3.10's quorum queue on this machine.

    python -m bench quorum [--quick]

- one queue, 1 KiB, RabbitMQ's publisher workload (one ``publish_async`` per message,
  1,000 in flight; then consume with prefetch 100 and one ack each): a quorum queue's
  figures against a classic queue's (target: at least 1.0), and against RabbitMQ 3.10's
  quorum queue driven by pika here (20.4k–22.9k publish, 9.8k–12.5k consume; target
  2x the upper figure);
- 100 queues, one producer thread each (four producer processes of 25), ``publish_many``
  of 20 a call, each waiting for its confirm: the aggregate confirmed msgs/s of quorum
  queues against classic queues (target 2x: one WAL fdatasync for every queue that wrote,
  against one per queue), with the disk's flushes a second for both (the device's
  completed flush requests, ``/proc/diskstats``);
- a node SIGKILLed (every process) with 1,000,000 × 1 KiB messages across 100 quorum
  queues: the time from the next ``Node(...)`` to a message fetched from every queue
  (target 2 s), with the snapshots the queues had written.

``--quick`` shrinks the volumes by 8x.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time

import psutil

from warren import connect
from warren.supervisor import Node

from .bench_broker import publish_and_consume
from .table import Row, render, scale_of, scratch_directory
from .together import time_together

COUNT = 40_000
RABBITMQ_QUORUM_PUBLISH = 22_900  # msgs/s, the upper end measured here (reference/anchors.md)
RABBITMQ_QUORUM_CONSUME = 12_500
QUEUES = 100
PRODUCERS = 4
PER_QUEUE = 2_000
BATCH = 20
BACKLOG = 1_000_000

PRODUCER = """
import sys, threading
from warren import connect
data_dir, kind, count, batch = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
names = sys.argv[5:]
body = b"x" * 1024
connections = [connect(data_dir) for _ in names]
for connection, name in zip(connections, names):
    connection.declare_queue(name, type=kind)
print("ready", flush=True)
sys.stdin.readline()

def produce(connection, name):
    for _ in range(count // batch):
        connection.publish_many(name, [body] * batch)

threads = [threading.Thread(target=produce, args=pair) for pair in zip(connections, names)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print("done", flush=True)
"""


def disk_flushes(path: str) -> int:
    """Flush requests the device holding ``path`` has completed (``/proc/diskstats``'
    field 19; 0 where the kernel does not count them)."""
    device = os.stat(path).st_dev
    major, minor = os.major(device), os.minor(device)
    with open("/proc/diskstats") as stats:
        for line in stats:
            fields = line.split()
            if (int(fields[0]), int(fields[1])) == (major, minor):
                return int(fields[18]) if len(fields) > 18 else 0
    # a partition's flushes are counted on its disk: take the whole device's
    with open("/proc/diskstats") as stats:
        for line in stats:
            fields = line.split()
            if int(fields[0]) == major and len(fields) > 18:
                return int(fields[18])
    return 0


def many_queues(data_dir: str, kind: str, per_queue: int) -> tuple[float, float]:
    """Aggregate msgs/s of ``QUEUES`` queues of ``kind`` published to together, and the
    disk's flushes a second meanwhile."""
    names = [f"{kind}-{n}" for n in range(QUEUES)]
    share = QUEUES // PRODUCERS
    processes = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                PRODUCER,
                data_dir,
                kind,
                str(per_queue),
                str(BATCH),
                *names[i * share : (i + 1) * share],
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(PRODUCERS)
    ]
    try:
        flushes = disk_flushes(data_dir)
        elapsed = time_together(processes)
        flushed = disk_flushes(data_dir) - flushes
    finally:
        for process in processes:
            process.kill()
            process.wait()
            process.stdin.close()
            process.stdout.close()
    return QUEUES * (per_queue // BATCH * BATCH) / elapsed, flushed / elapsed


def recovery(root: str, count: int) -> tuple[float, int, int]:
    """Seconds from ``Node(...)`` to a message fetched from each of ``QUEUES`` quorum
    queues after a SIGKILL of every process of a node holding ``count`` × 1 KiB across
    them; how many it then holds, and the snapshots written before the kill."""
    data_dir = os.path.join(root, "backlog")
    node = subprocess.Popen(
        [sys.executable, "-m", "warren.supervisor.cli", "node", "--data-dir", data_dir],
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        connection = connect(data_dir, wait=60)
        names = [f"q{n}" for n in range(QUEUES)]
        for name in names:
            connection.declare_queue(name, type="quorum")
        per_queue = count // QUEUES
        batch = min(500, per_queue)
        for name in names:
            for _ in range(per_queue // batch):
                connection.publish_many(name, [b"x" * 1024] * batch)
        snapshots = sum(connection.queue_stats(n)["snapshots_written"] for n in names)
        connection.close()
        family = [psutil.Process(node.pid), *psutil.Process(node.pid).children(recursive=True)]
        for process in family:
            with contextlib.suppress(psutil.NoSuchProcess):  # one that ended meanwhile
                process.send_signal(signal.SIGKILL)
        psutil.wait_procs(family, timeout=10)
    finally:
        node.kill()
        node.wait()
    started = time.perf_counter()
    with Node(data_dir) as restarted:
        connection = restarted.connect()
        for name in names:
            connection.get(name, ack=False)
        elapsed = time.perf_counter() - started
        held = sum(connection.queue_stats(n)["depth"] for n in names) + QUEUES
    return elapsed, held, snapshots


def main(argv: list[str]) -> str:
    scale, word = scale_of(argv)
    root = scratch_directory()
    rows: list[Row] = []
    try:
        body = b"x" * 1024
        with Node(os.path.join(root, "one")) as node:
            node.declare_queue("classic")
            node.declare_queue("quorum", type="quorum")
            classic = publish_and_consume(node, "classic", body, COUNT // scale)
            quorum = publish_and_consume(node, "quorum", body, COUNT // scale)
        rows += [
            Row("one queue, publish+confirm 1 KiB (vs classic)", quorum[0], "msg/s", classic[0], 1),
            Row("one queue, consume+ack 1 KiB (vs classic)", quorum[1], "msg/s", classic[1], 1),
            Row(
                "one queue, publish+confirm (vs RabbitMQ's quorum queue)",
                quorum[0],
                "msg/s",
                RABBITMQ_QUORUM_PUBLISH,
                2,
            ),
            Row(
                "one queue, consume+ack (vs RabbitMQ's quorum queue)",
                quorum[1],
                "msg/s",
                RABBITMQ_QUORUM_CONSUME,
                2,
            ),
        ]
        figures = {}
        for kind in ("classic", "quorum"):
            data_dir = os.path.join(root, f"many-{kind}")
            with Node(data_dir):
                figures[kind] = many_queues(data_dir, kind, PER_QUEUE // scale)
        rows += [
            Row(
                f"{QUEUES} queues published together (vs classic)",
                figures["quorum"][0],
                "msg/s",
                figures["classic"][0],
                2,
            ),
            Row("  disk flushes a second, classic", figures["classic"][1], "/s"),
            Row("  disk flushes a second, quorum", figures["quorum"][1], "/s"),
        ]
        elapsed, held, snapshots = recovery(root, BACKLOG // scale)
        rows.append(
            Row(
                f"restart after kill -9, {held:,} msgs in {QUEUES} quorum queues",
                elapsed,
                "s",
                note=f"target <= 2 s; {snapshots} snapshots before the kill",
            )
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return render(f"quorum queues ({word})", rows)

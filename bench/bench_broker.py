"""The broker end to end: publish with confirms and consume with acks through the client
API, against the bare one-hop pipeline measured in the same run.

    python -m bench broker [--quick]

- the baseline: a process that appends each received publish to a file, fdatasyncs when
  its mailbox is empty and only then answers (producer → ZeroMQ → process → batched
  fsync → confirm), driven exactly as a queue is, with the same window of publishes in
  flight (``Connection``'s 256);
- RabbitMQ's own publisher workload: persistent publish+confirm with one ``publish_async``
  per message and a window of 1,000 unconfirmed (``max_in_flight=1000``) into a durable
  queue, then consume+ack (prefetch 100, one ack per message), 1 KiB and 16 KiB, one
  producer into one queue;
- confirm latency under that load: a second process publishes one message at a time
  (``publish``, waiting for each confirm) into the same queue while the workload runs
  four times; the target is on the publishes begun during the window-1,000 publishing
  (the consume+ack phase is reported apart);
- the CPU time per message of the producer's process (with the node it embeds) and of the
  queue's process, over the 1 KiB ``publish_async`` run and the ``publish_many`` run of
  100 a call;
- ``publish_many`` of 100 bodies a call (each call waits for its confirm, so every 100
  messages pay a round trip and the queue's fdatasync), and of every body in one
  call (sent in Publishes of up to 500, pipelined in the connection's window);
- four producer processes into four queues at once;
- confirm latency (one ``publish`` at a time) and end-to-end latency (publish, then get
  and ack the message), p50 and p99;
- a node SIGKILLed (every process of it) with 200,000 × 1 KiB messages in a queue: the
  time from the next ``Node(...)`` to the first message fetched;
- the PSS of an idle queue process (median of 8).

Targets (RabbitMQ 3.10 driven by pika on this machine: 15,000 publishes/s with 1,000 in
flight, 14,400 consumes/s, 6.8 s to restart with the backlog): publish+confirm 1 KiB ≥
30,000 msgs/s and ≥ 0.5 of the bare pipeline, publish_many ≥ 80,000 msgs/s, consume+ack
≥ 28,800 msgs/s (twice RabbitMQ), confirm p99 under load ≤ 5 ms, restart ≤ 2 s, idle
queue ≤ 8 MiB. ``--quick`` shrinks the volumes by 8x.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

import psutil

from warren.actors import Node as ActorNode
from warren.actors import ProcessActor
from warren.actors.flow import MAX_IN_FLIGHT_REQUESTS
from warren.supervisor import Node

from .table import Row, median, percentile, render
from .together import time_together

SIZES = {"1 KiB": 1024, "16 KiB": 16384}
COUNTS = {"1 KiB": 40_000, "16 KiB": 10_000}
LATENCY_SAMPLES = 1000
LOADED_ROUNDS = 4  # publisher workloads the latency probe runs under
BACKLOG = 200_000
WINDOW = 1000  # unconfirmed messages a producer keeps in flight
MANY_BATCH = 100  # bodies per publish_many
PUBLISH_TARGET = 30_000
PUBLISH_RATIO_TARGET = 0.5
PUBLISH_MANY_TARGET = 80_000
CONSUME_TARGET = 28_800
LOADED_P99_TARGET_MS = 5.0
RESTART_TARGET_S = 2.0
IDLE_PSS_TARGET_MIB = 8.0


class FsyncSink(ProcessActor):
    """The baseline's receiving end: append, fdatasync when idle, then answer."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.waiting: list[Any] = []

    def on_start(self) -> None:
        self.file = open(self.path, "ab", buffering=2**20)

    def on_receive(self, message: Any) -> None:
        reply = self.defer_reply()
        for payload in message:
            self.file.write(payload)
        self.waiting.append(reply)

    def on_idle(self) -> None:
        if self.waiting:
            self.file.flush()
            os.fdatasync(self.file.fileno())
            waiting, self.waiting = self.waiting, []
            for reply in waiting:
                reply.send(None)

    def on_stop(self) -> None:
        self.file.close()


def baseline_rate(root: str, body: bytes, count: int) -> float:
    """Publishes per second through the bare pipeline, with the connection's window."""
    with ActorNode(name="bench-baseline") as actors:
        sink = actors.spawn(FsyncSink, os.path.join(root, "sink"), name="sink")
        window: list[Any] = []
        started = time.perf_counter()
        for _ in range(count):
            if len(window) >= MAX_IN_FLIGHT_REQUESTS:
                window.pop(0).get(timeout=60)
            window.append(sink.ask_async([body]))
        for future in window:
            future.get(timeout=60)
        return count / (time.perf_counter() - started)


class CpuPerMessage:
    """The CPU time (user and system) per message, in µs, that this process (the producer,
    with the node it embeds) and a queue's process spend over a ``with`` block: figures a
    busy disk disturbs far less than the rates."""

    def __init__(self, node: Node, queue: str) -> None:
        self._processes = [psutil.Process(), psutil.Process(node.queue(queue).pid)]
        self._seconds = [0.0, 0.0]

    def _now(self) -> list[float]:
        return [sum(process.cpu_times()[:2]) for process in self._processes]

    def __enter__(self) -> CpuPerMessage:
        self._seconds = self._now()
        return self

    def __exit__(self, *_: object) -> None:
        self._seconds = [now - then for now, then in zip(self._now(), self._seconds, strict=True)]

    def rows(self, what: str, count: int) -> list[Row]:
        producer, queue = (seconds / count * 1e6 for seconds in self._seconds)
        return [
            Row(f"CPU per message of {what}: producer process", producer, "µs"),
            Row(f"CPU per message of {what}: queue process", queue, "µs"),
        ]


def publish_and_consume(
    node: Node,
    queue: str,
    body: bytes,
    count: int,
    phases: list[tuple[float, ...]] | None = None,
    cpu: CpuPerMessage | None = None,
) -> tuple[float, float]:
    """RabbitMQ's publisher workload: one ``publish_async`` per message, ``WINDOW`` in
    flight; then one ack per message with prefetch 100. ``phases`` gets the monotonic
    times the publishes began, the consume began and it ended; ``cpu`` measures the
    publishes."""
    connection = node.connect(max_in_flight=WINDOW)
    started = time.monotonic()
    with cpu or contextlib.nullcontext():
        for _ in range(count):
            connection.publish_async(queue, body)
        connection.wait_for_confirms(timeout=300)
    consuming = time.monotonic()
    publish = count / (consuming - started)
    published, started = started, consuming
    consumed = 0
    with connection.consume(queue, prefetch=100) as consumer:
        for delivery in consumer:
            delivery.ack()
            consumed += 1
            if consumed == count:
                break
    ended = time.monotonic()
    consume = count / (ended - started)
    if phases is not None:
        phases.append((published, consuming, ended))
    connection.close()
    return publish, consume


def publish_many_rate(
    node: Node, queue: str, body: bytes, count: int, batch: int, cpu: CpuPerMessage | None = None
) -> float:
    """``publish_many`` calls of ``batch`` bodies each, every call waiting for its
    confirm before the next; ``cpu`` measures them."""
    connection = node.connect()
    started = time.perf_counter()
    with cpu or contextlib.nullcontext():
        for _ in range(count // batch):
            connection.publish_many(queue, [body] * batch)
    rate = count // batch * batch / (time.perf_counter() - started)
    connection.purge_queue(queue)
    connection.close()
    return rate


PROBE = """
import json, select, sys, time
from warren import connect
connection = connect(sys.argv[1])
body = b"x" * 1024
print("ready", flush=True)
sys.stdin.readline()
samples = []
while len(samples) < 100_000:
    started = time.monotonic()
    connection.publish(sys.argv[2], body)
    samples.append((started, time.monotonic() - started))
    if len(samples) % 16 == 0 and select.select([sys.stdin], [], [], 0)[0]:
        break
print(json.dumps(samples), flush=True)
"""


def latency_under_load(
    node: Node, queue: str, body: bytes, count: int, rounds: int
) -> tuple[list[float], list[float]]:
    """Confirm latencies of one-at-a-time publishes from another process while this one
    runs the publisher workload into the same queue ``rounds`` times: those begun while
    the window-1,000 publishes ran, and those begun during the consume+ack that follows
    each (the monotonic clock is the same in both processes)."""
    probe = subprocess.Popen(
        [sys.executable, "-c", PROBE, node.data_dir, queue],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    phases: list[tuple[float, ...]] = []  # (publishing, consuming, done) times
    try:
        probe.stdout.readline()
        probe.stdin.write("go\n")
        probe.stdin.flush()
        for _ in range(rounds):
            publish_and_consume(node, queue, body, count, phases)
        probe.stdin.write("stop\n")
        probe.stdin.flush()
        samples = json.loads(probe.stdout.readline())
    finally:
        probe.kill()
        probe.wait()
        probe.stdin.close()
        probe.stdout.close()
    node.connect().purge_queue(queue)
    publishing = [s for t, s in samples if any(a <= t < b for a, b, _ in phases)]
    consuming = [s for t, s in samples if any(b <= t < c for _, b, c in phases)]
    return publishing, consuming


def latencies(node: Node, queue: str, body: bytes, samples: int) -> tuple[list, list]:
    connection = node.connect()
    confirm, end_to_end = [], []
    for _ in range(samples):
        started = time.perf_counter()
        connection.publish(queue, body)
        confirmed = time.perf_counter()
        connection.get(queue).ack()
        confirm.append(confirmed - started)
        end_to_end.append(time.perf_counter() - started)
    connection.close()
    return confirm, end_to_end


PRODUCER = """
import sys, time
from warren import connect
data_dir, queue, count, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
connection = connect(data_dir)
print("ready", flush=True)
sys.stdin.readline()
body = b"x" * size
for _ in range(count):
    connection.publish_async(queue, body)
connection.wait_for_confirms(timeout=300)
print("done", flush=True)
"""


def four_producers(node: Node, size: int, count: int) -> float:
    queues = [f"four-{n}" for n in range(4)]
    for queue in queues:
        node.declare_queue(queue)
    producers = [
        subprocess.Popen(
            [sys.executable, "-c", PRODUCER, node.data_dir, queue, str(count // 4), str(size)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for queue in queues
    ]
    try:
        return count // 4 * 4 / time_together(producers)
    finally:
        for producer in producers:
            producer.kill()
            producer.wait()
            producer.stdin.close()
            producer.stdout.close()


def restart_with_backlog(root: str, count: int) -> tuple[float, int]:
    """Seconds from ``Node(...)`` to the first message fetched, after SIGKILLing every
    process of a node holding ``count`` × 1 KiB; and how many it then holds."""
    data_dir = os.path.join(root, "backlog")
    node = subprocess.Popen(
        [sys.executable, "-m", "warren.supervisor.cli", "node", "--data-dir", data_dir],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        node.stdout.readline()  # the status table follows
        from warren import connect

        deadline = time.monotonic() + 60
        while True:
            try:
                connection = connect(data_dir)
                break
            except ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        connection.declare_queue("backlog")
        for _ in range(count // 1000):
            connection.publish_many("backlog", [b"x" * 1024] * 1000)
        family = [psutil.Process(node.pid), *psutil.Process(node.pid).children(recursive=True)]
        for process in family:
            process.send_signal(signal.SIGKILL)
        psutil.wait_procs(family, timeout=10)
    finally:
        node.kill()
        node.wait()
        node.stdout.close()
    started = time.perf_counter()
    with Node(data_dir) as restarted:
        connection = restarted.connect()
        connection.get("backlog").ack()
        elapsed = time.perf_counter() - started
        held = connection.queue_stats("backlog")["messages_ready"] + 1
    return elapsed, held


def idle_queue_pss(node: Node) -> float:
    for n in range(8):
        node.declare_queue(f"idle-{n}")
    time.sleep(0.5)
    return (
        median(
            [psutil.Process(node.queue(f"idle-{n}").pid).memory_full_info().pss for n in range(8)]
        )
        / 2**20
    )


def met(figure: float, target: float, floor: bool = True) -> str:
    ok = figure >= target if floor else figure <= target
    return f"target {'>=' if floor else '<='} {target:,g}: {'met' if ok else 'MISSED'}"


def main(argv: list[str]) -> str:
    scale = 8 if "--quick" in argv else 1
    root = tempfile.mkdtemp(prefix="warren-bench-broker-")
    rows: list[Row] = []
    started = time.monotonic()
    try:
        with Node(os.path.join(root, "data")) as node:
            for label, size in SIZES.items():
                count = COUNTS[label] // scale
                body = b"x" * size
                baseline = baseline_rate(root, body, count)
                queue = f"one-{size}"
                node.declare_queue(queue)
                cpu = CpuPerMessage(node, queue)
                publish, consume = publish_and_consume(node, queue, body, count, cpu=cpu)
                one_kib = size == 1024
                rows.append(
                    Row(
                        f"publish+confirm {label}, publish_async each, window {WINDOW:,}",
                        publish,
                        "msgs/s",
                        baseline,
                        PUBLISH_RATIO_TARGET if one_kib else None,
                        "baseline: the bare pipeline; "
                        + (met(publish, PUBLISH_TARGET) if one_kib else ""),
                    )
                )
                if one_kib:
                    rows += cpu.rows("that publish", count)
                rows.append(
                    Row(
                        f"consume+ack {label}, prefetch 100, an ack each",
                        consume,
                        "msgs/s",
                        None,
                        None,
                        met(consume, CONSUME_TARGET) if one_kib else "",
                    )
                )
            node.declare_queue("many")
            many_count = COUNTS["1 KiB"] // scale * 2
            cpu = CpuPerMessage(node, "many")
            many = publish_many_rate(node, "many", b"x" * 1024, many_count, MANY_BATCH, cpu)
            rows.append(
                Row(
                    f"publish_many 1 KiB, {MANY_BATCH} bodies a call",
                    many,
                    "msgs/s",
                    None,
                    None,
                    met(many, PUBLISH_MANY_TARGET),
                )
            )
            rows += cpu.rows("that publish_many", many_count // MANY_BATCH * MANY_BATCH)
            rows.append(
                Row(
                    f"publish_many 1 KiB, {many_count:,} bodies in one call",
                    publish_many_rate(node, "many", b"x" * 1024, many_count, many_count),
                    "msgs/s",
                )
            )
            node.declare_queue("loaded")
            loaded, consuming = latency_under_load(
                node, "loaded", b"x" * 1024, COUNTS["1 KiB"] // scale, LOADED_ROUNDS
            )
            rows.append(
                Row("confirm latency during the window-1,000 load, p50", median(loaded) * 1e3, "ms")
            )
            p99 = percentile(loaded, 99) * 1000
            rows.append(
                Row(
                    f"confirm latency during the window-1,000 load, p99 ({len(loaded):,} "
                    f"publishes)",
                    p99,
                    "ms",
                    None,
                    None,
                    met(p99, LOADED_P99_TARGET_MS, floor=False),
                )
            )
            rows.append(
                Row(
                    f"confirm latency during the consume+ack after it, p99 ({len(consuming):,} "
                    f"publishes)",
                    percentile(consuming, 99) * 1000,
                    "ms",
                )
            )
            rows.append(
                Row(
                    "publish+confirm 1 KiB, 4 producers → 4 queues",
                    four_producers(node, 1024, COUNTS["1 KiB"] // scale),
                    "msgs/s",
                )
            )
            node.declare_queue("latency")
            confirm, end_to_end = latencies(node, "latency", b"x" * 1024, LATENCY_SAMPLES // scale)
            for name, samples in (("confirm", confirm), ("end to end", end_to_end)):
                rows.append(Row(f"{name} latency 1 KiB, p50", median(samples) * 1000, "ms"))
                rows.append(Row(f"{name} latency 1 KiB, p99", percentile(samples, 99) * 1000, "ms"))
            pss = idle_queue_pss(node)
            rows.append(
                Row(
                    "idle queue process, PSS",
                    pss,
                    "MiB",
                    None,
                    None,
                    met(pss, IDLE_PSS_TARGET_MIB, floor=False),
                )
            )
        elapsed, held = restart_with_backlog(root, BACKLOG // scale)
        rows.append(
            Row(
                f"restart after SIGKILL with {held:,} x 1 KiB, to the first message",
                elapsed,
                "s",
                None,
                None,
                met(elapsed, RESTART_TARGET_S, floor=False),
            )
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return render(
        f"broker: publish, consume, latency, restart "
        f"({time.monotonic() - started:.0f} s{', quick volumes' if scale > 1 else ''})",
        rows,
    )

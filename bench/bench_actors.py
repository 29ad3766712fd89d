"""Actor runtime benchmark: tell throughput and ask latency between two processes.

Everything is measured in one run against raw pyzmq doing the same job with the same
batching, so the ratios hold even though this machine's absolute figures drift:

- tell, one message per call, against PUSH/PULL with one frame per message;
- tell_many with 100 messages per call, against PUSH/PULL with 100 messages packed into
  one msgpack frame;
- ask round trip, against a DEALER/ROUTER echo;
- spawn to ready (no baseline: a fresh interpreter costs 70–95 ms here).

Both payload sizes (100 B and 4 KiB) travel as bytes. Each throughput figure is the best
of ``ROUNDS`` rounds; the receiver confirms that it has handled every message (the raw one
with a "done" frame, the actor by answering an ask queued behind the tells).
"""

from __future__ import annotations

import multiprocessing
import os
import tempfile
import time
from typing import Any

import msgpack
import zmq

from actors import Node, ProcessActor
from bench.table import Row, median, percentile, render

ROUNDS = 3
BATCH = 100
ASK_SAMPLES = 3000
SPAWN_SAMPLES = 20
SIZES = {"100 B": 100, "4 KiB": 4096}
# Messages per round: enough for a few hundred milliseconds each at the expected rates.
SINGLE_COUNT = {"100 B": 200_000, "4 KiB": 100_000}
BATCHED_COUNT = {"100 B": 1_000_000, "4 KiB": 300_000}
# Targets, as ratios to the raw pyzmq baseline measured in the same run.
TARGET_BATCHED = 0.5
TARGET_SINGLE = 0.3
TARGET_ASK_LATENCY = 2.0


class Sink(ProcessActor):
    """Counts what it is told; an ask answers with the count so far."""

    max_batch = 4096

    def __init__(self) -> None:
        self.count = 0

    def on_receive_batch(self, messages: list[Any]) -> None:
        self.count += len(messages)

    def on_receive(self, message: Any) -> Any:
        if message == "count":
            return self.count
        return message


def _raw_sink(pull_endpoint: str, done_endpoint: str, batched: bool) -> None:
    context = zmq.Context()
    pull = context.socket(zmq.PULL)
    pull.bind(pull_endpoint)
    done = context.socket(zmq.PUSH)
    done.connect(done_endpoint)
    while True:
        header = pull.recv()
        if header == b"stop":
            break
        expected = int(header)
        count = 0
        while count < expected:
            frame = pull.recv()
            count += len(msgpack.unpackb(frame)) if batched else 1
        done.send(b"done")
    context.destroy(linger=0)


def _raw_echo(endpoint: str) -> None:
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.bind(endpoint)
    while True:
        identity, body = router.recv_multipart()
        if body == b"stop":
            break
        router.send_multipart([identity, body])
    context.destroy(linger=0)


def _raw_tell(directory: str, payload: bytes, count: int, batched: bool) -> float:
    context = zmq.Context()
    pull_endpoint = f"ipc://{directory}/raw-pull"
    done_endpoint = f"ipc://{directory}/raw-done"
    done = context.socket(zmq.PULL)
    done.bind(done_endpoint)
    child = multiprocessing.get_context("spawn").Process(
        target=_raw_sink, args=(pull_endpoint, done_endpoint, batched))
    child.start()
    push = context.socket(zmq.PUSH)
    push.connect(pull_endpoint)
    frame = msgpack.packb([payload] * BATCH) if batched else payload
    frames = count // BATCH if batched else count
    best = float("inf")
    try:
        for _ in range(ROUNDS):
            push.send(str(count).encode())
            start = time.perf_counter()
            send = push.send
            for _ in range(frames):
                send(frame)
            done.recv()
            best = min(best, time.perf_counter() - start)
        push.send(b"stop")
    finally:
        child.join(10)
        if child.is_alive():
            child.kill()
            child.join()
        context.destroy(linger=0)
    return count / best


def _actor_tell(node: Node, payload: bytes, count: int, batched: bool) -> float:
    sink = node.spawn(Sink)
    best = float("inf")
    try:
        batch = [payload] * BATCH
        for _ in range(ROUNDS):
            before = sink.ask("count")
            start = time.perf_counter()
            if batched:
                tell_many = sink.tell_many
                for _ in range(count // BATCH):
                    tell_many(batch)
            else:
                tell = sink.tell
                for _ in range(count):
                    tell(payload)
            assert sink.ask("count", timeout=120) == before + count
            best = min(best, time.perf_counter() - start)
    finally:
        sink.stop()
    return count / best


def _raw_ask(directory: str) -> list[float]:
    context = zmq.Context()
    endpoint = f"ipc://{directory}/raw-echo"
    child = multiprocessing.get_context("spawn").Process(target=_raw_echo, args=(endpoint,))
    child.start()
    dealer = context.socket(zmq.DEALER)
    dealer.connect(endpoint)
    samples = []
    try:
        for i in range(ASK_SAMPLES + 100):
            start = time.perf_counter()
            dealer.send(msgpack.packb(i))
            msgpack.unpackb(dealer.recv())
            if i >= 100:
                samples.append(time.perf_counter() - start)
        dealer.send(b"stop")
    finally:
        child.join(10)
        if child.is_alive():
            child.kill()
            child.join()
        context.destroy(linger=0)
    return samples


def _actor_ask(node: Node) -> list[float]:
    sink = node.spawn(Sink)
    samples = []
    try:
        ask = sink.ask
        for i in range(ASK_SAMPLES + 100):
            start = time.perf_counter()
            ask(i)
            if i >= 100:
                samples.append(time.perf_counter() - start)
    finally:
        sink.stop()
    return samples


def _spawn_times(node: Node) -> list[float]:
    samples = []
    for _ in range(SPAWN_SAMPLES):
        start = time.perf_counter()
        ref = node.spawn(Sink)
        samples.append(time.perf_counter() - start)
        ref.stop()
    return samples


def main(argv: list[str]) -> str:
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="warren-bench-") as directory, \
            Node("bench", preload=("bench.bench_actors",)) as node:
        for label, size in SIZES.items():
            payload = os.urandom(size)
            raw_single = _raw_tell(directory, payload, SINGLE_COUNT[label], batched=False)
            ours_single = _actor_tell(node, payload, SINGLE_COUNT[label], batched=False)
            rows.append(Row(f"tell {label}, one per call", ours_single, "msgs/s", raw_single,
                            TARGET_SINGLE, "baseline: PUSH/PULL, one frame per message"))
            raw_batched = _raw_tell(directory, payload, BATCHED_COUNT[label], batched=True)
            ours_batched = _actor_tell(node, payload, BATCHED_COUNT[label], batched=True)
            rows.append(Row(f"tell_many {label}, {BATCH} per call", ours_batched, "msgs/s",
                            raw_batched, TARGET_BATCHED,
                            f"baseline: PUSH/PULL, {BATCH} packed per frame"))
        raw_ask = _raw_ask(directory)
        ours_ask = _actor_ask(node)
        for label, pct in (("median", 50.0), ("p99", 99.0)):
            ours = percentile(ours_ask, pct) * 1e6
            raw = percentile(raw_ask, pct) * 1e6
            verdict = "met" if ours <= TARGET_ASK_LATENCY * raw else "MISSED"
            rows.append(Row(f"ask round trip, {label}", ours, "µs", raw, None,
                            f"baseline: DEALER/ROUTER echo; target <= "
                            f"{TARGET_ASK_LATENCY}x baseline: {verdict}"))
        spawns = _spawn_times(node)
        rows.append(Row("spawn to ready, median", median(spawns) * 1e3, "ms",
                        note="forkserver child: mailboxes bound, on_start done"))
        rows.append(Row("spawn to ready, p99", percentile(spawns, 99.0) * 1e3, "ms"))
    return render("actors: two processes on one machine (ipc)", rows)

"""A cluster of three nodes on one etcd member, against one node, in the same run.

    python -m bench cluster [--quick]

- the baseline: one ``warren node`` (not in a cluster) on this machine, reached over tcp;
- the subject: three ``warren node --cluster`` on this machine (the leader ships every
  write to both followers, which fdatasync it before the confirm), reached with
  ``connect([...])`` naming all three;
- the workload on each: persistent publish+confirm of 1 KiB bodies with one
  ``publish_async`` per message and 1,000 unconfirmed in flight into a durable queue,
  then 1 KiB records into a stream in batches of 100 with 16,000 records in flight
  (``publish_many_async``), and with each batch waited for (``publish_many``);
- failover: every process of the leader killed at once (its machine lost), and the time
  from the kill to the first confirm on the new leader, through the same client, which
  finds the new leader by itself; the lease is 10 s, which bounds it (etcd expires the
  dead leader's lease, a follower campaigns at its next step, starts its queues as after
  a kill, and the first commit waits until the dead node is out of its ISR: 5 s).

Targets (docs/cluster.md; RabbitMQ 3.10's quorum queues here did 20-23k publish with
pika): each replicated publish rate at least 0.5 of the single node's, failover at most
15 s. ``--quick`` shrinks the volumes by 8x and runs one failover instead of three.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil

from warren import connect
from warren.supervisor.cluster.local_etcd import ETCD, local_etcd
from warren.supervisor.node.node import answers_status, query_status

from .table import Row, median, render, scale_of, scratch_directory

COUNT = 20_000
RECORDS = 40_000
BODY = b"x" * 1024
WINDOW = 1000
STREAM_BATCH = 100  # records a publish_many
STREAM_WINDOW = 16_000  # stream records in flight (16 MiB of 1 KiB), as bench stream's
RATIO_TARGET = 0.5
FAILOVER_TARGET_S = 15.0
WARREN = [sys.executable, "-m", "warren.supervisor.cli"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_until(predicate, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("the cluster did not come up in time")
        time.sleep(0.2)


class NodeRun:
    """One ``warren node`` in a process group of its own, listening on ``endpoint``
    (kept when it is started again)."""

    def __init__(self, data_dir: str, *options: str) -> None:
        self.data_dir, self.options = data_dir, options
        self.endpoint = f"tcp://127.0.0.1:{free_port()}"
        self.start()

    def start(self) -> None:
        self.process = subprocess.Popen(
            [*WARREN, "node", "--data-dir", self.data_dir, "--listen", self.endpoint]
            + list(self.options),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        wait_until(lambda: answers_status(self.data_dir))

    def cluster(self) -> dict:
        return query_status(self.data_dir).get("cluster") or {}

    def lose_machine(self) -> None:
        family = psutil.Process(self.process.pid).children(recursive=True)
        for process in [psutil.Process(self.process.pid), *family]:
            with contextlib.suppress(psutil.Error):
                process.kill()
        self.process.wait()
        psutil.wait_procs(family, timeout=30)

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def workload(target: str | list[str], count: int, records: int) -> tuple[float, float, float]:
    """publish+confirm msgs/s into a durable queue, then stream records/s with batches
    in flight and with each batch waited for."""
    with connect(target, wait=120, max_in_flight=WINDOW) as connection:
        connection.declare_queue("bench")
        started = time.monotonic()
        for _ in range(count):
            connection.publish_async("bench", BODY)
        connection.wait_for_confirms(timeout=600)
        publish = count / (time.monotonic() - started)
        connection.purge_queue("bench")
    batch = [BODY] * STREAM_BATCH
    with connect(target, wait=120, max_in_flight=STREAM_WINDOW) as connection:
        connection.declare_queue("events", type="stream")
        started = time.monotonic()
        sent = [connection.publish_many_async("events", batch) for _ in range(records // 100)]
        for confirm in sent:
            confirm.result(timeout=600)
        pipelined = records / (time.monotonic() - started)
        started = time.monotonic()
        for _ in range(records // 100 // 4):
            connection.publish_many("events", batch)
        waited = records / 4 / (time.monotonic() - started)
    return publish, pipelined, waited


def cluster_nodes(root: str, etcd: str, count: int = 3) -> list[NodeRun]:
    nodes = []
    for i in range(count):
        nodes.append(
            NodeRun(
                os.path.join(root, f"n{i}"),
                *("--name", f"n{i}", "--cluster", "bench", "--etcd", etcd),
                *("--peer", f"tcp://127.0.0.1:{free_port()}"),
            )
        )
    wait_until(lambda: all(len(n.cluster().get("isr", [])) == count for n in nodes))
    return nodes


def failover(nodes: list[NodeRun], connection) -> float:
    """Seconds from the leader's machine lost to the first confirm after it; the lost
    node is then started again and synced, for the next round."""
    leader = next(n for n in nodes if n.cluster().get("role") == "leader")
    connection.publish("bench", BODY)
    killed = time.monotonic()
    leader.lose_machine()
    connection.publish("bench", BODY)
    seconds = time.monotonic() - killed
    leader.start()
    wait_until(lambda: all(len(n.cluster().get("isr", [])) == len(nodes) for n in nodes))
    return seconds


def main(argv: list[str]) -> str:
    scale, word = scale_of(argv)
    count, records = COUNT // scale, RECORDS // scale
    rounds = 1 if scale > 1 else 3
    root = scratch_directory("warren-bench-cluster-")
    rows: list[Row] = []
    try:
        single = NodeRun(os.path.join(root, "single"))
        try:
            lone_publish, lone_stream, lone_waited = workload(single.endpoint, count, records)
        finally:
            single.stop()
        if ETCD is None:
            raise SystemExit("bench cluster needs etcd (Debian's etcd-server)")
        with local_etcd(Path(root, "etcd"), size=1) as etcd:
            nodes = cluster_nodes(root, etcd.endpoints[0])
            try:
                everyone = [n.endpoint for n in nodes]
                publish, stream, waited = workload(everyone, count, records)
                rows.append(
                    Row(
                        "replicated publish+confirm, 1 KiB, 1,000 in flight, durable queue",
                        publish,
                        "msgs/s",
                        lone_publish,
                        RATIO_TARGET,
                        "baseline: one node",
                    )
                )
                rows.append(
                    Row(
                        "replicated stream publish+confirm, 1 KiB, batches of 100 in flight",
                        stream,
                        "records/s",
                        lone_stream,
                        RATIO_TARGET,
                        "baseline: one node",
                    )
                )
                rows.append(
                    Row(
                        "replicated stream publish_many of 100, each batch waited for",
                        waited,
                        "records/s",
                        lone_waited,
                        note="a commit's round trip a batch",
                    )
                )
                times = []
                with connect(
                    everyone, wait=120, recovery_timeout_s=300, idempotent=True
                ) as connection:
                    for _ in range(rounds):
                        times.append(failover(nodes, connection))
                rows.append(
                    Row(
                        f"failover: leader's machine lost to the next confirm (median of "
                        f"{len(times)}, worst {max(times):.1f} s)",
                        median(times),
                        "s",
                        note=f"lease 10 s; target <= {FAILOVER_TARGET_S:g} s",
                    )
                )
            finally:
                for node in nodes:
                    node.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return render(f"cluster: three nodes on one machine ({word})", rows)

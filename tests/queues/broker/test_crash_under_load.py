"""Crash tests under load: producers and a consumer in processes of their own while the
queue, the persistent store and the GC are SIGKILLed; every confirmed message must then
be consumed at least once, whole, and a message seen twice must be flagged redelivered
(unless its producer sent it twice: a publish in doubt is sent again). And what an idle
queue process costs: its memory, and how often it wakes."""

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from warren import connect
from warren.queues import NotFound
from warren.queues.broker.queue_actor import RATES_INTERVAL_S
from warren.supervisor import Node
from warren.supervisor.chaos.faults import kill_processes
from warren.supervisor.chaos.workload import Producer, audit

from ...waiting import wait_for
from ..helpers import drained, store_messages

ROOT = Path(__file__).resolve().parents[3]
PER_PRODUCER = 600


def start(*arguments):
    process = subprocess.Popen(
        [sys.executable, "-m", "warren.supervisor.chaos.roles", *map(str, arguments)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout.readline().strip() == "ready"
    return process


def lines(path):
    return path.read_text().split("\n")[:-1] if path.exists() else []


def kill_and_wait(node, victim):
    """SIGKILL the actor ``victim`` names (once it runs: a kill before may still be
    restarting it) and wait for its successor."""
    wait_for(lambda: node.actors.whereis(victim) is not None, timeout=60)
    old = node.actors.whereis(victim).pid
    os.kill(old, signal.SIGKILL)

    def back():
        ref = node.actors.whereis(victim)
        return ref is not None and ref.pid != old

    wait_for(back, timeout=60)


@pytest.mark.slow
def test_every_confirmed_message_is_consumed_whatever_is_killed_under_load(tmp_path):
    data = tmp_path / "data"
    confirmed_paths = [tmp_path / f"confirmed-{i}" for i in range(2)]
    consumed_path = tmp_path / "consumed"
    children = []
    with Node(data, file_size_limit=256 * 1024) as node:
        node.declare_queue("orders")
        try:
            children = [
                start("produce", data, "orders", f"p{i}", path, "--count", PER_PRODUCER)
                for i, path in enumerate(confirmed_paths)
            ]
            children.append(start("consume", data, consumed_path, "orders"))
            victims = ("queue orders", "msg_store_persistent", "msg_store_gc", "queue orders")
            for round_, victim in enumerate(victims, 1):  # every 150 confirms, a kill
                wait_for(
                    lambda round_=round_: (
                        sum(len(lines(p)) for p in confirmed_paths) >= 150 * round_
                    ),
                    timeout=120,
                )
                kill_and_wait(node, victim)
            for producer in children[:2]:
                producer.wait(timeout=300)

            def drained():
                try:
                    stats = node.connect().queue_stats("orders")
                except NotFound:
                    return False
                return stats["depth"] == 0

            wait_for(drained, timeout=120)
        finally:
            for child in children:
                child.kill()
                child.wait()
                child.stdout.close()
    result = audit(
        [Producer(f"p{i}", str(p), ("orders",)) for i, p in enumerate(confirmed_paths)],
        [str(consumed_path)],
    )
    assert result.confirmed == 2 * PER_PRODUCER
    assert not result.lost, f"{len(result.lost)} confirmed messages never consumed"
    assert not result.unflagged and result.wrong_bodies == 0


def test_an_idle_queue_process_costs_a_few_mib(tmp_path):
    with Node(tmp_path / "data") as node:
        for n in range(8):
            node.declare_queue(f"q{n}")
        time.sleep(0.5)  # settled after its start; the bound is far above what a start adds
        pss = [psutil.Process(node.queue(f"q{n}").pid).memory_full_info().pss for n in range(8)]
        # Reported in bench/README.md; the bound only catches a gross regression.
        assert max(pss) < 64 * 2**20, [p // 2**20 for p in pss]
        print(f"idle queue PSS: {sorted(pss)[4] / 2**20:.1f} MiB (median of 8)")


def test_a_declared_queue_adds_no_thread_to_the_node(tmp_path):
    with Node(tmp_path / "data") as node:
        node.declare_queue("first")  # queue_sup's own first event: its thread starts
        before = threading.active_count()
        for n in range(20):
            node.declare_queue(f"q{n}")
        # each queue has a supervisor of its own, whose thread starts at its first event
        assert threading.active_count() == before


def test_an_idle_queue_process_sleeps_between_its_heartbeats_and_wakes_its_rates_to_work(
    tmp_path,
):
    with Node(tmp_path / "data") as node:
        node.declare_queue("idle")
        time.sleep(RATES_INTERVAL_S + 1)  # no operation: its rates are at rest
        main_thread = psutil.Process(node.queue("idle").pid)
        woken = main_thread.num_ctx_switches().voluntary
        time.sleep(10)
        # Two pings (the node's heartbeat, every 5 s), each maybe beside the loop's own
        # check: it used to turn every second and fold its rates every five seconds.
        assert main_thread.num_ctx_switches().voluntary - woken <= 6
        with node.connect() as conn:
            conn.publish_many("idle", [b"order"] * 10)

            def ingress() -> float:
                return conn.queue_stats("idle")["rates"]["ingress"]

            wait_for(lambda: ingress() > 0)  # its rate timer runs again
            # ten in the first interval after the rest (half of 2 a second, smoothed),
            # not spread over the sixteen seconds at rest (0.3)
            assert 0.4 < ingress() <= 1.0


def test_a_whole_node_killed_keeps_every_confirmed_message_and_flags_the_unacked(tmp_path):
    data = tmp_path / "data"
    node_process = subprocess.Popen(
        [sys.executable, "-m", "tests.supervisor.node_child", str(data), "--queue", "orders"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    family = []
    try:
        family = [psutil.Process(int(pid)) for pid in node_process.stdout.readline().split()]
        connection = connect(data)
        bodies = [b"order %d" % n + b"x" * (n % 3 * 3000) for n in range(500)]
        connection.publish_many("orders", bodies)
        unacked = connection.get("orders")
        kill_processes(family)  # every process of the node at once (some die of it first)
    finally:
        for process in family:
            try:
                process.wait(timeout=10)
            except psutil.Error:
                pass
        node_process.kill()
        node_process.wait()
        node_process.stdout.close()
    with Node(data) as node:
        fresh = node.connect()
        first = fresh.get("orders", ack=False)
        assert (first.body, first.redelivered) == (unacked.body, True)
        rest = [fresh.get("orders", ack=False).body for _ in range(499)]
        assert [first.body, *rest] == bodies
        assert fresh.get("orders") is None


def test_a_fanned_out_message_keeps_both_references_across_a_store_crash(tmp_path):
    with Node(tmp_path / "data") as node:
        node.declare_exchange("orders", kind="fanout")
        for name in ("billing", "shipping"):
            node.declare_queue(name)
            node.bind_queue(name, "orders")
        connection = node.connect()
        bodies = [b"%d" % n + b"y" * 6000 for n in range(50)]
        for body in bodies:
            connection.publish("", body, exchange="orders")
        kill_and_wait(node, "msg_store_persistent")
        wait_for(
            lambda: (
                node.queue_state("billing") == "running"
                and node.queue_state("shipping") == "running"
            ),
            timeout=60,
        )
        fresh = node.connect()
        assert store_messages(node) == 50
        for name in ("billing", "shipping"):
            assert drained(fresh, name) == bodies, name
        wait_for(lambda: store_messages(node) == 0)


def test_a_producer_killed_mid_batch_leaves_its_confirmed_messages_and_a_healthy_queue(tmp_path):
    data = tmp_path / "data"
    ledger = tmp_path / "confirmed"
    with Node(data) as node:
        node.declare_queue("orders")
        code = (
            "import sys; from warren import connect; c = connect(sys.argv[1]); "
            "print('ready', flush=True)\n"
            "with open(sys.argv[2], 'a', buffering=1) as out:\n"
            "    for n in range(10**6):\n"
            "        c.publish_many('orders', [b'%d-%d' % (n, i) for i in range(200)])\n"
            "        out.write('%d\\n' % n)\n"
        )
        producer = subprocess.Popen(
            [sys.executable, "-c", code, str(data), str(ledger)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert producer.stdout.readline().strip() == "ready"
            wait_for(lambda: len(lines(ledger)) >= 5)
        finally:
            producer.kill()
            producer.wait()
            producer.stdout.close()
        batches = len(lines(ledger))
        connection = node.connect()
        ready = connection.queue_stats("orders")["messages_ready"]
        assert ready >= 200 * batches  # confirmed ones, and maybe part of the next
        connection.publish("orders", b"after")
        assert connection.queue_stats("orders")["messages_ready"] == ready + 1

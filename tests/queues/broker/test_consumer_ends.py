"""A consumer's end, as its queue sees it: acks that reached the queue before the end are
applied, what was never acked comes back flagged redelivered, whether the consumer was
SIGTERMed, SIGKILLed or left unreaped, and a closed connection hands back at once."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from warren import connect
from warren.supervisor import Node

from ...waiting import wait_for

ROOT = Path(__file__).resolve().parents[3]
TAKEN = 10  # deliveries each killed consumer holds
ACKED = 4  # of which it acks this many just before it dies


@pytest.fixture
def node(tmp_path):
    with Node(
        tmp_path / "data",
        listen="tcp://127.0.0.1:*",
        listener_options={"consumer_silence_s": 6.0},  # above the client's 5 s beat
    ) as running:
        yield running


def start_consumer(target, queue):
    return subprocess.Popen(
        [sys.executable, "-m", "tests.queues.acking_child", str(target), queue, str(TAKEN)],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def ack_while_the_queue_is_stopped_then_kill(child, queue_pid, signum):
    """Have ``child`` ack its first ACKED deliveries while the queue's process is stopped
    (so the acks wait in the queue's socket), kill the child, and let the queue run on
    only then: the queue meets the acks and the consumer's end together."""
    os.kill(queue_pid, signal.SIGSTOP)
    try:
        child.stdin.write(f"ack {ACKED}\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "acked"
        os.kill(child.pid, signum)
        wait_for(lambda: psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE)
    finally:
        os.kill(queue_pid, signal.SIGCONT)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=["TERM", "KILL"])
def test_acks_sent_just_before_two_consumers_die_in_turn_are_never_redelivered(node, signum):
    node.declare_queue("jobs")
    local = node.connect()
    bodies = [f"m{n}" for n in range(30)]
    local.publish_many("jobs", [b.encode() for b in bodies])
    queue_pid = node.queue("jobs").pid
    acked: list[str] = []
    children = []
    try:
        for target in (node.data_dir, node.listen_endpoint):  # local, then over tcp
            child = start_consumer(target, "jobs")
            children.append(child)
            taken = child.stdout.readline().split()
            assert len(taken) == TAKEN
            ack_while_the_queue_is_stopped_then_kill(child, queue_pid, signum)
            acked += taken[:ACKED]
            if target == node.data_dir:
                # noticed through its connection while still a zombie (never reaped yet)
                wait_for(lambda: local.queue_stats("jobs")["messages_unacked"] == 0, timeout=10)
                assert psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE
            else:
                child.wait()  # a tcp consumer is released by the listener when silent
                wait_for(lambda: local.queue_stats("jobs")["messages_unacked"] == 0, timeout=60)
        drained = []
        while (delivery := local.get("jobs")) is not None:
            drained.append(delivery)
            delivery.ack()
    finally:
        for child in children:
            child.kill()
            child.wait()
            child.stdin.close()
            child.stdout.close()
    drained_bodies = [d.body.decode() for d in drained]
    assert not set(acked) & set(drained_bodies), "an acked message was delivered again"
    assert sorted(acked + drained_bodies) == sorted(bodies)
    held_unacked = {d.body.decode() for d in drained if d.redelivered}
    assert len(held_unacked) >= TAKEN - ACKED


@pytest.mark.parametrize("transport", ["local", "tcp"])
def test_a_closed_connection_hands_its_deliveries_back_before_close_returns(node, transport):
    node.declare_queue("jobs")
    local = node.connect()
    local.publish_many("jobs", [b"a", b"b", b"c"])
    target = node.data_dir if transport == "local" else node.listen_endpoint
    consumer = connect(target)
    assert [consumer.get("jobs").body for _ in range(2)] == [b"a", b"b"]
    assert local.queue_stats("jobs")["messages_unacked"] == 2
    consumer.close()
    stats = local.queue_stats("jobs")
    assert (stats["messages_unacked"], stats["messages_ready"]) == (0, 3)
    again = local.get("jobs")
    assert (again.body, again.redelivered) == (b"a", True)

"""The faults of ``warren.supervisor.chaos.faults`` land, each with its effect observed, and a
seed gives the same schedule every time; damaged files never deliver wrong bytes."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from warren.queues.errors import NotFound
from warren.supervisor import ChildSpec, Node
from warren.supervisor.chaos.faults import (
    FaultMissed,
    damage_file,
    is_alive,
    kill_process,
    kill_processes,
    matching,
    node_processes,
    schedule,
    stop_process,
)
from warren.supervisor.chaos.workload import body_of, checked_id

from ...waiting import the_spare, wait_for
from ..sample_actors import Worker

ROOT = Path(__file__).resolve().parents[3]
# What a queue's stats count of the messages recovery and reads dropped.
DROP_COUNTERS = (
    "dropped_missing",
    "dropped_corrupt",
    "torn_slots",
    "bad_segments",
    "corrupt_on_read",
    "missing_on_read",
)


def queue_pid(node, name):
    try:
        return node.queue(name).pid
    except NotFound:
        return None  # between its death and its restart


def test_a_seed_gives_the_same_schedule_and_another_seed_another():
    first = schedule(7, 60, ["kill", "stop", "node", "torn", "flip"])
    assert first == schedule(7, 60, ["kill", "stop", "node", "torn", "flip"])
    assert first != schedule(8, 60, ["kill", "stop", "node", "torn", "flip"])
    assert all(0 < f.at_s < 60 for f in first) and len(first) >= 15
    assert {f.kind for f in first} == {"kill", "stop", "node", "torn", "flip"}
    assert all(bool(f.pattern) == (f.kind in ("kill", "stop")) for f in first)


@pytest.mark.parametrize(
    "kinds, duration, message",
    [
        (["kill", "meteor"], 10, "unknown fault kinds \\['meteor'\\]"),
        ([], 10, "unknown fault kinds"),
        (["kill"], 0, "positive number of seconds"),
    ],
)
def test_a_bad_schedule_is_refused_with_what_is_wrong(kinds, duration, message):
    with pytest.raises(ValueError, match=message):
        schedule(1, duration, kinds)


def worker_pid(node):
    ref = node.actors.whereis("worker")
    return None if ref is None else ref.pid


def test_kill_and_stop_land_and_the_supervisor_restarts_the_victim(tmp_path):
    # Queues and stores get 60 s of missed heartbeats (a slow disk); the application's
    # worker the default 5 s, so a stopped one is replaced within seconds.
    with Node(tmp_path / "data", children=(ChildSpec("worker", Worker),)) as node:
        node.declare_queue("orders")
        node.connect().publish("orders", b"kept")
        processes = node_processes(os.getpid())
        with pytest.raises(FaultMissed, match="no process of the node matches 'nothing'"):
            kill_process(processes, "nothing", 1)
        old = queue_pid(node, "orders")
        assert kill_process(processes, "queue ord*", 1) == "warren: queue orders"
        wait_for(lambda: queue_pid(node, "orders") not in (None, old), timeout=30)
        stopped = worker_pid(node)
        name, victim = stop_process(node_processes(os.getpid()), "work*", 2)
        assert name == "warren: worker"
        try:
            wait_for(lambda: victim.status() == psutil.STATUS_STOPPED, timeout=10)
            # A stopped actor answers no heartbeat: its supervisor kills it and starts
            # another.
            wait_for(lambda: worker_pid(node) not in (None, stopped), timeout=30)
            assert not is_alive(victim)
        finally:
            if is_alive(victim):
                victim.resume()
        assert node.connect().get("orders").body == b"kept"


def test_no_pattern_picks_the_forkservers_spare_child(tmp_path):
    # The spare, forked ahead of the next spawn, is titled like an actor but is none: a
    # kill of it takes down no actor, and a stop of it is never acted on.
    with Node(tmp_path / "data") as node:
        node.declare_queue("orders")
        spare = the_spare(node.actors.forkserver_pid)
        processes = node_processes(os.getpid())
        for pattern in ("*", "s*", "spare"):
            assert spare not in matching(processes, pattern), pattern
        assert "warren: queue orders" in {p.cmdline()[0] for p in matching(processes, "*")}
        with pytest.raises(FaultMissed, match="no process of the node matches 'spare'"):
            kill_process(processes, "spare", 1)
        assert is_alive(spare)


class EndsOnceListed(psutil.Process):
    """A process whose title reads once, when the fault lists it; it ends (killed, not
    reaped: a zombie) before the fault signals it, the window a supervisor's own kill of
    its victim opens."""

    def cmdline(self) -> list[str]:
        title = super().cmdline()
        os.kill(self.pid, signal.SIGKILL)
        wait_for(lambda: self.status() == psutil.STATUS_ZOMBIE)
        return title


@pytest.mark.parametrize("fault", [kill_process, stop_process])
def test_a_victim_that_ends_between_being_listed_and_signalled_is_a_fault_missed(fault):
    child = subprocess.Popen(["bash", "-c", 'exec -a "warren: queue orders" sleep 600'])
    try:
        wait_for(lambda: psutil.Process(child.pid).cmdline()[:1] == ["warren: queue orders"])
        with pytest.raises(FaultMissed, match="warren: queue orders exited before the SIG"):
            fault([EndsOnceListed(child.pid)], "queue *", 1)
    finally:
        child.kill()
        child.wait()


def test_the_node_fault_kills_every_process_of_the_node_at_once(tmp_path):
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.supervisor.node_child", str(tmp_path / "data")],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        listed = {int(pid) for pid in child.stdout.readline().split()}
        family = node_processes(child.pid)
        assert {p.pid for p in family} >= listed
        assert kill_processes(family) == []
        assert not [p for p in family if is_alive(p)]
    finally:
        child.kill()
        child.wait()
        child.stdout.close()


@pytest.mark.parametrize("kind", ["torn", "flip"])
def test_a_damaged_file_of_a_stopped_node_never_delivers_wrong_bytes(tmp_path, kind):
    data = tmp_path / "data"
    ids = [f"order-{n}" for n in range(60)]  # bodies on either side of 4 KiB
    with Node(data) as node:
        node.declare_queue("orders")
        node.declare_queue("audit", lazy=True)
        connection = node.connect()
        for queue in ("orders", "audit"):
            connection.publish_many(queue, [body_of(i) for i in ids])
    for seed in range(4):
        path, offset = damage_file(data, kind, seed)
        assert os.path.exists(path) and offset >= 0
    kept, noticed = 0, 0
    with Node(data) as node:
        connection = node.connect()
        for queue in ("orders", "audit"):
            delivered = []
            while (delivery := connection.get(queue, ack=False)) is not None:
                delivered.append(checked_id(delivery.body))  # raises on wrong bytes
            assert set(delivered) <= set(ids) and len(delivered) == len(set(delivered))
            assert node.queue_state(queue) == "running"
            kept += len(delivered)
            stats = connection.queue_stats(queue)
            noticed += sum(stats[k] for k in DROP_COUNTERS)
    # The damage cost messages, and the queues that lost them said so.
    assert kept < 2 * len(ids) and noticed > 0


def test_damage_needs_a_file_to_damage(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(FaultMissed, match="no store or queue file"):
        damage_file(tmp_path / "empty", "flip", 1)
    with pytest.raises(ValueError, match="not 'melt'"):
        damage_file(tmp_path / "empty", "melt", 1)


def test_a_torn_write_lands_only_on_a_streams_newest_segment_and_index(tmp_path):
    # A stream syncs a segment whole before it starts the next: only the newest can end
    # in a write the disk did not finish. A flipped bit may land in any of them.
    stream = tmp_path / "queues" / "events"
    stream.mkdir(parents=True)
    files = [
        stream / f"{first:020d}{suffix}"
        for first in (0, 120, 250)
        for suffix in (".segment", ".index")
    ]

    def damaged(kind, seed):
        for path in files:  # whole again: a cut file could not be cut again
            path.write_bytes(b"x" * 5000)
        return damage_file(tmp_path, kind, seed)[0]

    newest = {str(path) for path in files[-2:]}
    assert {damaged("torn", seed) for seed in range(20)} == newest
    assert {damaged("flip", seed) for seed in range(40)} == {str(path) for path in files}

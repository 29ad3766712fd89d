"""The Warren node: one per data directory, its tree and status, the command line, and
nothing left behind when its process is killed."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
import zmq

from warren import connect
from warren.queues.broker.listener import ListenerActor, with_free_port
from warren.queues.errors import ConnectionClosed, NodeNotRunning
from warren.supervisor import AlarmLimits, ChildSpec, Node, NodeLocked, query_status
from warren.supervisor.chaos.faults import is_alive, kill_processes
from warren.supervisor.errors import NotANodeDirectory

from ...waiting import the_spare, wait_for
from ..sample_actors import Worker

ROOT = Path(__file__).resolve().parents[3]
WARREN = [sys.executable, "-m", "warren.supervisor.cli"]


def test_only_one_node_runs_on_a_data_directory(tmp_path):
    with Node(tmp_path / "data"):
        with pytest.raises(NodeLocked, match="already runs"):
            Node(tmp_path / "data")
    with Node(tmp_path / "data"):
        pass


def test_status_shows_the_tree_with_pids_restarts_memory_and_alarms(tmp_path):
    with Node(tmp_path / "data", children=(ChildSpec("worker", Worker),)) as node:
        pid = node.app.which_children()[0]["pid"]
        os.kill(pid, signal.SIGKILL)
        wait_for(
            lambda: (
                node.app.which_children()[0]["pid"] != pid
                and node.app.which_children()[0]["state"] == "running"
            )
        )
        status = node.status()
        assert status["state"] == "running" and status["alarms"] == []
        tree = status["tree"]
        assert [c["id"] for c in tree["children"]] == [
            "gc_sup",
            "msg_store_persistent",
            "msg_store_transient",
            "wal",
            "queue_sup",
            "app_sup",
        ]
        assert tree["children"][0]["children"][0]["id"] == "msg_store_gc"
        worker = tree["children"][5]["children"][0]
        assert worker["restarts"] == 1 and worker["rss_bytes"] > 0
        assert status["stores"]["msg_store_persistent"]["message_count"] == 0
        assert status["stores"]["msg_store_transient"]["transient"] is True
        queried = query_status(tmp_path / "data")
        assert [c["id"] for c in queried["tree"]["children"]] == [c["id"] for c in tree["children"]]


@contextlib.contextmanager
def warren_node(data: str, *options: str):
    """``warren node --data-dir DATA [OPTIONS]`` as a process, killed at the end if still
    running."""
    node = subprocess.Popen(
        [*WARREN, "node", "--data-dir", data, *options],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield node
    finally:
        if node.poll() is None:
            node.kill()
            node.wait()
        node.stdout.close()
        node.stderr.close()


def test_the_spare_child_is_no_queue_nor_in_the_tree_and_becomes_the_next_queue(tmp_path):
    with Node(tmp_path / "data") as node:
        node.declare_queue("orders")
        spare = the_spare(node.actors.forkserver_pid).pid
        assert node.list_queues() == ["orders"]
        assert spare not in node.root.actor_pids()
        assert spare not in node._pids()  # nor in the memory the alarm sums
        node.declare_queue("invoices")
        assert node.queue("invoices").pid == spare
        assert psutil.Process(spare).cmdline()[0] == "warren: queue invoices"
        next_spare = the_spare(node.actors.forkserver_pid)
    gone, alive = psutil.wait_procs([next_spare], timeout=10)
    assert alive == []


def test_warren_node_and_warren_status_on_the_command_line(tmp_path):
    data = str(tmp_path / "data")
    with warren_node(data) as node:
        assert node.stdout.readline().startswith("node warren")
        wait_for(lambda: os.path.exists(os.path.join(data, "node.json")))
        shown = subprocess.run(
            [*WARREN, "status", "--data-dir", data],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert shown.returncode == 0, shown.stderr
        assert "app_sup (one_for_one)" in shown.stdout and "alarms: none" in shown.stdout
        assert "msg_store_persistent: 0 messages" in shown.stdout
        second = subprocess.run(
            [*WARREN, "node", "--data-dir", data],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert second.returncode == 2 and "already runs" in second.stderr
        node.send_signal(signal.SIGTERM)
        assert node.wait(timeout=60) == 0
    gone = subprocess.run(
        [*WARREN, "status", "--data-dir", data],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert gone.returncode == 1 and "no node is running" in gone.stderr


def test_a_node_never_starts_in_a_stranger_directory_nor_deletes_what_it_did_not_write(
    tmp_path,
):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(NotANodeDirectory, match="is not a node's data directory"):
        Node(tmp_path)
    assert os.listdir(tmp_path) == ["notes.txt"]
    data = tmp_path / "data"
    with Node(data):
        pass
    transient = data / "msg_store_transient"
    (transient / "5.rdq").write_bytes(b"\0" * 100)  # a store file of an earlier life
    (transient / "keep-me.txt").write_text("someone else's")
    (transient / "7.rdq.txt").write_text("a name close to a store file's")
    with Node(data):
        names = set(os.listdir(transient))
        assert {"keep-me.txt", "7.rdq.txt"} <= names and "5.rdq" not in names
    assert {"keep-me.txt", "7.rdq.txt"} <= set(os.listdir(transient))


def test_a_client_retrying_through_a_kill_of_every_node_process_is_served_once_it_restarts(
    tmp_path,
):
    """Every process of the node SIGKILLed at once; a client retries connect() in a loop:
    each attempt ends within seconds (NodeNotRunning), and the first after the restarted
    node is ready is served."""
    data = str(tmp_path / "data")
    attempts: list[tuple[float, float, str]] = []  # (started, ended, outcome)
    served = threading.Event()
    stop = threading.Event()

    def retry() -> None:
        while not stop.is_set():
            began = time.monotonic()
            try:
                with connect(data) as client:
                    client.declare_queue("jobs")
                attempts.append((began, time.monotonic(), "served"))
                served.set()
                return
            except NodeNotRunning:
                attempts.append((began, time.monotonic(), "not running"))
                time.sleep(0.1)  # pacing of the retries

    with warren_node(data) as first:
        assert first.stdout.readline().startswith("node warren")
        family = [psutil.Process(first.pid), *psutil.Process(first.pid).children(recursive=True)]
        assert not kill_processes(family)
        first.wait()
    client = threading.Thread(target=retry)
    client.start()
    try:
        wait_for(lambda: attempts)  # the client met a node file naming dead processes
        assert not served.is_set()
        with warren_node(data) as second:
            assert second.stdout.readline().startswith("node warren")
            ready = time.monotonic()
            assert served.wait(timeout=10)
            second.send_signal(signal.SIGTERM)
            assert second.wait(timeout=60) == 0
    finally:
        stop.set()
        client.join(timeout=30)
    assert attempts[-1][2] == "served" and attempts[-1][1] - ready < 2.0
    assert all(ended - began < 6.0 for began, ended, _ in attempts), attempts
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in family)


def warren_status(data: str, *options: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*WARREN, "status", "--data-dir", data, *options],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_status_says_starting_while_a_node_recovers_and_stale_pid_once_it_is_killed(tmp_path):
    data = str(tmp_path / "data")
    with Node(data) as first:
        first.declare_queue("jobs")
        first.connect().publish_many("jobs", [b"job"] * 5)
    with warren_node(data, "--children", "tests.supervisor.sample_actors:gated_worker") as node:
        wait_for(lambda: os.path.exists(os.path.join(data, "node.json")))
        shown = warren_status(data)
        assert shown.returncode == 0, shown.stderr
        assert f"(pid {node.pid}): starting (recovering 5 messages)" in shown.stdout
        assert json.loads(warren_status(data, "--json").stdout)["state"] == "starting"
        with pytest.raises(NodeNotRunning, match="is starting"):
            connect(data)
        waiting: list = []
        waiter = threading.Thread(target=lambda: waiting.append(connect(data, wait=60)))
        waiter.start()
        open(f"{data}.gate", "w").close()
        assert node.stdout.readline().startswith("node warren")
        waiter.join(timeout=60)
        assert waiting[0].queue_stats("jobs")["messages_ready"] == 5
        waiting[0].close()
        assert ": running;" in warren_status(data).stdout
        node.kill()
        node.wait()
    shown = warren_status(data)
    assert shown.returncode == 1
    assert shown.stderr.strip().startswith(
        f"warren: the node on {data} is not running (stale pid {node.pid}"
    )


def test_a_node_process_killed_with_sigkill_leaves_no_actor_behind(node_process, tmp_path):
    node, pids = node_process(str(tmp_path / "data"))
    descendants = [psutil.Process(pid) for pid in pids[1:]]
    assert len(descendants) == 7  # forkserver, GC, two stores, the WAL, two application actors
    node.send_signal(signal.SIGKILL)
    node.wait(timeout=30)
    wait_for(lambda: not any(map(is_alive, descendants)))
    with open(tmp_path / "data" / "node.json") as f:
        left_behind = os.path.dirname(json.load(f)["status_endpoint"][len("ipc://") :])
    assert os.path.isdir(left_behind)
    with Node(tmp_path / "data"):  # the next node cleans up after it
        assert not os.path.exists(left_behind)


def test_a_node_killed_in_the_middle_of_declares_keeps_every_queue_it_answered(
    node_process, tmp_path
):
    data = str(tmp_path / "data")
    node, _ = node_process(data, "--declare-forever", "q")
    answered = [node.stdout.readline().strip() for _ in range(40)]
    node.send_signal(signal.SIGKILL)  # in the middle of a declare, most likely
    node.wait(timeout=30)
    answered += node.stdout.read().split()  # those it answered since
    with Node(data) as restarted:  # the definitions load, nothing of them corrupt
        declared = restarted.list_queues()
        assert set(answered) <= set(declared)
        assert len(set(declared) - set(answered)) <= 1  # the one it was declaring
        for name in declared:
            wait_for(lambda name=name: restarted.queue_state(name) == "running")
        restarted.declare_queue("after")
    with Node(data) as again:
        assert set(again.list_queues()) == {*declared, "after"}


@pytest.fixture
def alarmed(tmp_path):
    """A node whose memory alarm is raised (a 1-byte limit), and its one worker, told."""
    tight = AlarmLimits(memory_limit_bytes=1, check_interval_s=0.1)
    with Node(
        tmp_path / "data", children=(ChildSpec("worker", Worker),), alarm_limits=tight
    ) as node:
        worker = node.actors.whereis("worker")
        wait_for(lambda: worker.ask("alarms") == [["memory", True]])
        yield node, worker


def test_every_actor_is_told_when_an_alarm_is_raised_and_when_it_clears(alarmed):
    node, worker = alarmed
    assert node.status()["alarms"] == ["memory"]
    node.alarms.limits = AlarmLimits(memory_limit_bytes=2**62, check_interval_s=0.1)
    wait_for(lambda: worker.ask("alarms") == [["memory", True], ["memory", False]])
    assert node.status()["alarms"] == []


def test_a_node_whose_root_gives_up_stops_and_warren_node_exits_3(tmp_path):
    data = str(tmp_path / "data")
    with warren_node(data) as node:
        assert node.stdout.readline().startswith("node warren")

        def transient_pid():
            try:
                children = query_status(data)["tree"]["children"]
            except OSError:
                return None  # the node is gone, or going
            return next(
                (
                    c["pid"]
                    for c in children
                    if c["id"] == "msg_store_transient" and c["state"] == "running"
                ),
                None,
            )

        killed: set[int] = set()
        while node.poll() is None and len(killed) < 10:  # the root allows 3 in 60 s
            wait_for(lambda: node.poll() is not None or transient_pid() not in (None, *killed))
            pid = transient_pid()
            if pid is not None and pid not in killed:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
        assert len(killed) == 4
        assert node.wait(timeout=120) == 3
        assert "gave up" in node.stderr.read()


def test_an_actor_restarted_while_an_alarm_is_raised_is_told_of_it(alarmed):
    node, worker = alarmed
    old = worker.ask("pid")
    os.kill(old, signal.SIGKILL)
    wait_for(
        lambda: (
            node.app.which_children()[0]["pid"] not in (old, None)
            and node.app.which_children()[0]["state"] == "running"
        )
    )
    wait_for(lambda: worker.ask("alarms") == [["memory", True]])


def test_malformed_status_requests_are_answered_and_the_node_keeps_answering(tmp_path):
    with Node(tmp_path / "data") as node:
        context = zmq.Context.instance()
        for frames in ([b"status", b"extra"], [b"bogus"], [b""], [b"\xff" * 5000]):
            asker = context.socket(zmq.REQ)
            asker.linger = 0
            asker.rcvtimeo = 5000
            try:
                asker.connect(node.status_endpoint)
                asker.send_multipart(frames)
                assert "error" in json.loads(asker.recv())
            finally:
                asker.close()
        junk = context.socket(zmq.DEALER)  # no envelope: answered all the same
        junk.linger = 0
        junk.rcvtimeo = 5000
        try:
            junk.connect(node.status_endpoint)
            junk.send_multipart([b"no", b"envelope"])
            assert "error" in json.loads(junk.recv())
        finally:
            junk.close()
        assert query_status(tmp_path / "data")["state"] == "running"
        assert node.counters["malformed_status_requests"] == 5


def declare_while_the_node_is_killed(node, endpoint: str) -> tuple[BaseException | None, float]:
    """A remote client's declare, through the listener at ``endpoint``, in flight when
    the ``node`` process is killed (stopped first, so that the call is surely waiting
    for it): what the declare raised, and how long after the kill."""
    outcome: list[BaseException] = []
    with connect(endpoint, recover=False) as client:
        client.declare_queue("before")

        def declare() -> None:
            try:
                client.declare_queue("in flight")
            except BaseException as exc:
                outcome.append(exc)

        node.send_signal(signal.SIGSTOP)  # the node takes the call and cannot answer it
        caller = threading.Thread(target=declare)
        caller.start()
        node.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        caller.join(timeout=120)
        return (outcome or [None])[0], time.monotonic() - killed_at


def test_a_tcp_call_in_flight_when_the_node_is_killed_ends_in_connection_closed_at_once(
    node_process, tmp_path
):
    """The client is told at once, as a local one is, not after its listener's silence
    (15 s) or the call's whole timeout (60 s): the node's death stops the listener, which
    answers the calls it was making for its clients before it goes."""
    data = tmp_path / "data"
    node, pids = node_process(str(data), "--listen", "tcp://127.0.0.1:*")
    family = [psutil.Process(pid) for pid in pids]
    endpoint = json.loads((data / "node.json").read_text())["listen_endpoint"]
    error, told_after_s = declare_while_the_node_is_killed(node, endpoint)
    assert isinstance(error, ConnectionClosed), error
    assert "the node went away (the listener stopped before the node answered" in str(error)
    assert told_after_s < 20, f"told after {told_after_s:.1f} s"
    node.wait(timeout=30)
    wait_for(lambda: not any(map(is_alive, family)), timeout=60)


def test_a_listener_that_outlives_its_killed_node_ends_the_call_in_flight_at_once(
    node_process, tmp_path
):
    """A listener that nothing stops yet (here one run in the test's process) sees the
    node's pid gone while it waits for the node's answer, as a local client does."""
    data = tmp_path / "data"
    node, pids = node_process(str(data))
    family = [psutil.Process(pid) for pid in pids]
    found = json.loads((data / "node.json").read_text())
    endpoint = with_free_port("tcp://127.0.0.1:*")
    listener = ListenerActor(
        str(data), endpoint, control_endpoint=found["status_endpoint"], node_pid=found["pid"]
    )
    listener.on_start()
    try:
        error, told_after_s = declare_while_the_node_is_killed(node, endpoint)
    finally:
        listener.on_stop()
    assert isinstance(error, ConnectionClosed), error
    assert f"is not running (its pid {found['pid']} is gone)" in str(error)
    assert told_after_s < 20, f"told after {told_after_s:.1f} s"
    node.wait(timeout=30)
    wait_for(lambda: not any(map(is_alive, family)), timeout=60)

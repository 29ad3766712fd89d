"""The crash-recovery harness as a user meets it: ``warren chaos`` on Warren's own
workload, the ``warren_chaos`` fixture on an application of its own (the example ledger,
and a broken one the harness must catch), disk faults that land, bad input refused
before anything starts, and no process left behind when the harness is interrupted."""

import contextlib
import itertools
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from warren.queues.broker.dedup import message_ids
from warren.queues.engine import ra_log
from warren.queues.engine.queue_index import (
    HEADER_BYTES,
    SLOT_BYTES,
    records_at,
    segment_header,
)
from warren.queues.errors import Blocked
from warren.store.disk_faults import ENVIRONMENT_VARIABLE, write_faults
from warren.supervisor import Node
from warren.supervisor.chaos import broker_run
from warren.supervisor.chaos import faults as chaos_faults
from warren.supervisor.chaos import run as chaos_run
from warren.supervisor.chaos.broker_run import ChaosWorkload, pattern_limits
from warren.supervisor.chaos.faults import Fault, is_alive, kill_processes, node_processes
from warren.supervisor.chaos.run import ChaosResult, NodeUnderTest, check_data_dir, run_faults
from warren.supervisor.chaos.workload import body_of, produce

from ...waiting import wait_for
from .interrupting import interrupt_run

ROOT = Path(__file__).resolve().parents[3]
WARREN = [sys.executable, "-m", "warren.supervisor.cli"]
sys.path.insert(0, str(ROOT))
from examples import chaos_ledger  # noqa: E402  (the example is the application under test)

NODE_CRASHES = ("node", "torn", "flip")  # faults that kill the whole node


def missed_only_while_the_node_restarted(events: list[dict], kind: str) -> bool:
    """Whether every fault of ``kind`` the run made and missed was due while the node was
    still restarting from a crash of the whole node, or found it away (a full disk that
    began before the crash), as the run's own record shows."""
    restarts = [
        (e["at_s"], e["at_s"] + e["recovery_s"])
        for e in events
        if e["kind"] in NODE_CRASHES and e["recovery_s"] is not None
    ]
    missed = [e for e in events if e["kind"] == kind and not e["landed"]]
    return all(
        "the node was away" in e["detail"]
        or any(start <= e["at_s"] <= end for start, end in restarts)
        for e in missed
    )


def warren(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*WARREN, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


# ------------------------------------------------------------------ the fixture


def test_the_ledger_keeps_every_deposit_through_kills_stops_and_node_kills(warren_chaos):
    report = warren_chaos.run(
        "examples.chaos_ledger:children",
        check=chaos_ledger.check,
        kinds=("kill", "stop", "node"),
        patterns=("ledger", "teller"),
        duration_s=8,
        seed=11,
        every_s=(0.7, 1.5),
        sample=chaos_ledger.deposits,
    )
    assert report["ok"], warren_chaos.text(report)
    assert report["faults"] >= 4 and report["invariant_failures"] == []
    # every victim was replaced (by its supervisor, or by a node kill that came first:
    # how many restarts a supervisor made before a node kill is a race, not a promise)
    landed = [e for e in report["events"] if e["landed"]]
    assert landed and all(e["recovery_s"] is not None for e in landed)
    assert report["node_starts"] >= 1
    assert report["samples"][-1][1]["confirmed"] > 0  # deposits went on
    run = Path(warren_chaos.directory) / "chaos-1"
    assert json.loads((run / "report" / "report.json").read_text())["ok"] is True
    assert (run / "report" / "throughput.png").stat().st_size > 10_000
    assert "PASSED" in (run / "report" / "report.txt").read_text()


def test_a_ledger_that_answers_before_it_writes_is_caught_losing_deposits(warren_chaos):
    report = warren_chaos.run(
        "examples.chaos_ledger:broken_children",
        check=chaos_ledger.check,
        kinds=("kill",),
        patterns=("ledger",),
        duration_s=5,
        seed=3,
    )
    assert not report["ok"]
    assert report["faults"] >= 1
    assert any(
        "was acknowledged but is not in the ledger" in line for line in report["invariant_failures"]
    )
    assert "FAILED: seed 3, 5 s: the application's check failed (" in warren_chaos.text(report)


def test_the_same_seed_lands_the_same_faults_on_the_same_actors(warren_chaos):
    runs = [
        warren_chaos.run(
            "examples.chaos_ledger:children",
            check=chaos_ledger.check,
            kinds=("kill", "stop"),
            patterns=("ledger", "teller"),
            duration_s=4,
            seed=5,
            every_s=(0.5, 1.0),
        )
        for _ in range(2)
    ]
    landed = [[(e["kind"], e["target"]) for e in run["events"]] for run in runs]
    assert landed[0] == landed[1] and len(landed[0]) >= 3
    assert all(run["ok"] for run in runs)


def test_a_frozen_actor_its_supervisor_never_replaces_fails_the_run(warren_chaos):
    report = warren_chaos.run(
        "tests.supervisor.sample_actors:unwatched_worker",
        check=lambda data_dir: [],
        kinds=("stop",),
        patterns=("worker",),
        duration_s=1.5,
        seed=1,
        every_s=(0.5, 1.0),
    )
    assert not report["ok"] and report["events"]
    assert all("its supervisor had not replaced it" in e["detail"] for e in report["events"])
    assert any("did not replace it" in problem for problem in report["problems"])


def test_a_stop_lands_only_once_its_victim_is_ready_and_its_heartbeat_watches_it(
    tmp_path, monkeypatch
):
    # A supervisor pings a child once its start is done; a start is bounded by its
    # start_timeout_s. Seed 2144887954 stopped a queue the node was still recovering
    # after a torn file: nothing watched its heartbeat yet, and the run failed on a
    # promise Warren never made.
    data = tmp_path / "data"
    gate = Path(f"{data}.gate")  # the worker's start ends once this exists
    gate.touch()
    gated = "tests.supervisor.sample_actors:gated_worker"
    node = NodeUnderTest(data, options=("--children", gated))
    stop_process = chaos_faults.stop_process
    refused: list[str] = []

    def stop_then_let_it_start(processes, pattern, seed, **options):
        # the restarted worker finishes its start only once a stop was tried on it
        starting = [p for p in chaos_faults.matching(processes, pattern) if p.pid != first]
        try:
            return stop_process(processes, pattern, seed, **options)
        except chaos_faults.FaultMissed as missed:
            refused.append(str(missed))
            raise
        finally:
            if starting:
                gate.touch()

    monkeypatch.setattr(chaos_faults, "stop_process", stop_then_let_it_start)
    monkeypatch.setattr(chaos_run, "VICTIM_WAIT_S", 120.0)  # the kill's, however slow
    try:
        node.start()
        first = node.actor_pids()["worker"]
        gate.unlink()
        kill, stop = Fault(0.1, "kill", "worker", 1), Fault(0.2, "stop", "worker", 1)
        result = run_faults(node, [kill, stop], duration_s=0.3)
    finally:
        node.close()
    assert result.problems == []
    assert [(e.kind, e.landed) for e in result.events] == [("kill", True), ("stop", True)]
    assert result.events[1].recovery_s is not None and not result.events[1].detail
    assert any("is still starting: no heartbeat watches it yet" in r for r in refused)


@contextlib.contextmanager
def gate_opened_once_logged(gate: Path, words: str) -> Iterator[None]:
    """``gate`` (a gated worker's start ends once it exists) is made once the harness logs
    ``words``: what holds a supervisor up ends once the harness has acted on it."""

    class OpenTheGate(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if words in record.getMessage():
                gate.touch()

    handler = OpenTheGate()
    logger = logging.getLogger("warren.chaos")
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)


def a_stop_beside_a_gated_restart(
    tmp_path,
    children: str,
    opens_on: str,
    shown: Callable[[dict | None], dict | None] | None = None,
) -> ChaosResult:
    """Run a kill of ``gated`` (its restart blocks until its gate opens) and then a stop of
    ``idle`` on a node of ``children``; the gate opens once the harness logs ``opens_on``.
    ``shown`` rewrites the node's status as the harness reads it."""
    data = tmp_path / "data"
    gate = Path(f"{data}.gate")  # the gated worker's start ends once this exists
    gate.touch()
    node = NodeUnderTest(data, options=("--children", f"tests.supervisor.sample_actors:{children}"))
    if shown is not None:
        status = node.status
        node.status = lambda: shown(status())  # type: ignore[method-assign]
    try:
        node.start()
        gate.unlink()
        kill, stop = Fault(0.1, "kill", "gated", 1), Fault(0.2, "stop", "idle", 1)
        with gate_opened_once_logged(gate, opens_on):
            return run_faults(node, [kill, stop], duration_s=0.3)
    finally:
        gate.touch()  # whatever the outcome, the node can stop
        node.close()


def test_a_stop_whose_supervisor_is_busy_starting_a_sibling_is_waited_for(tmp_path):
    # A supervisor acts on one event at a time: one starting a child (a recovery, bounded
    # by its start_timeout_s) acts on a hung sibling once that start is done. On a loaded
    # machine that can be past twice the heartbeat timeout (seed 38545210: node restarts
    # of 5-12 s): no broken promise while its status shows the start under way.
    result = a_stop_beside_a_gated_restart(
        tmp_path, "worker_beside_gated_starter", opens_on="its supervisor is busy"
    )
    assert result.problems == []
    stop_event = result.events[1]
    assert (stop_event.kind, stop_event.landed) == ("stop", True)
    assert "its supervisor was busy (app_sup starting gated for " in stop_event.detail
    assert stop_event.recovery_s is not None  # killed and replaced once the start was done


def test_another_supervisor_busy_excuses_no_stop_its_victims_supervisor_never_acts_on(tmp_path):
    # Only the victim's own supervisor acts on its hang: another one busy starting its own
    # child (a queue's recovery, under the queue's supervisor) holds nothing up. The
    # victim has no heartbeat, as under a supervisor that never acts on a hang: the run
    # fails it at twice the heartbeat timeout, not once nothing else of the node restarts.
    result = a_stop_beside_a_gated_restart(
        tmp_path, "unwatched_worker_beside_gated_supervisor", opens_on="did not replace it"
    )
    kill_event, stop_event = result.events
    assert stop_event.landed and "waited" not in stop_event.detail
    assert "its supervisor had not replaced it" in stop_event.detail
    [problem] = result.problems
    assert problem.startswith(f"stop at {stop_event.at_s:.2f} s: idle (pid ")
    assert "did not replace it (heartbeat timeout 5 s: a hung actor is killed" in problem
    assert "busy" not in problem
    assert kill_event.recovery_s is not None  # gated_sup was busy until the run had failed


def test_a_supervisor_busy_beyond_what_that_may_take_is_no_excuse(tmp_path):
    # A start ends within its start_timeout_s (the child is killed then), so a supervisor
    # still busy past it holds a hung sibling up for no reason the run may excuse. Warren's
    # spawn sees to that bound: the node is shown with one of 1 s, as an overrun would be.
    def overrun(status):
        for supervisor in supervisors(status and status.get("tree")):
            if supervisor.get("busy"):
                supervisor["busy"]["bound_s"] = 1.0
        return status

    result = a_stop_beside_a_gated_restart(
        tmp_path, "worker_beside_gated_starter", opens_on="did not replace it", shown=overrun
    )
    stop_event = result.events[1]
    assert "its supervisor had not replaced it" in stop_event.detail
    [problem] = result.problems
    assert problem.startswith(f"stop at {stop_event.at_s:.2f} s: idle (pid ")
    assert re.search(
        r"did not replace it \(its supervisor app_sup was starting gated for [\d.]+ s, "
        r"beyond the 1 s that may take",
        problem,
    ), problem


MALFORMED_BUSY = {
    "without busy": lambda busy: None,
    "busy a word": lambda busy: "starting",
    "busy an empty map": lambda busy: {},
    "busy with a word for a time": lambda busy: {**busy, "for_s": "long", "bound_s": None},
}


def test_a_status_with_no_or_a_malformed_busy_shows_no_busy_supervisor(tmp_path):
    # A node of another version, or a status damaged on its way: the run goes on and
    # judges the stop as it would a supervisor shown busy with nothing. Each read of a
    # status showing a busy supervisor gets the next of the malformed shapes, in turn.
    shapes = itertools.cycle(MALFORMED_BUSY)
    served: list[str] = []

    def malformed(status):
        for supervisor in supervisors(status and status.get("tree")):
            if supervisor.get("busy"):
                served.append(next(shapes))
                busy = MALFORMED_BUSY[served[-1]](supervisor.pop("busy"))
                if busy is not None:
                    supervisor["busy"] = busy
        return status

    result = a_stop_beside_a_gated_restart(
        tmp_path, "worker_beside_gated_starter", opens_on="did not replace it", shown=malformed
    )
    kill_event, stop_event = result.events
    assert "its supervisor had not replaced it" in stop_event.detail
    [problem] = result.problems
    assert "did not replace it (heartbeat timeout 5 s: a hung actor is killed" in problem
    assert kill_event.recovery_s is not None
    assert set(served) == set(MALFORMED_BUSY), served  # each shape was read at least once


def supervisors(entry: dict | None) -> Iterator[dict]:
    """Every supervisor entry of a node's tree."""
    if entry is not None and entry.get("kind") == "supervisor":
        yield entry
        for child in entry["children"]:
            yield from supervisors(child)


def test_a_node_that_gives_up_a_start_a_kill_struck_is_started_again(tmp_path, monkeypatch):
    # A child killed before it is ready fails its supervisor's start, and so the node's
    # (exit 4): a service manager starts it again, and so does the harness. Seed
    # 350394154 killed a store while the node started, and the node stayed down.
    data = tmp_path / "data"
    gate = Path(f"{data}.gate")  # the worker's start ends once this exists
    gate.touch()
    node = NodeUnderTest(
        data, options=("--children", "tests.supervisor.sample_actors:gated_worker")
    )
    kill_process = chaos_faults.kill_process

    def kill_then_let_it_start(*args, **options):
        killed = kill_process(*args, **options)
        gate.touch()  # the next start of the node goes through
        return killed

    monkeypatch.setattr(chaos_faults, "kill_process", kill_then_let_it_start)
    # the kill waits for the worker to be spawned again, however long the node's start
    monkeypatch.setattr(chaos_run, "VICTIM_WAIT_S", 120.0)
    try:
        node.start()
        gate.unlink()
        faults = [Fault(0.1, "node", "", 1), Fault(0.2, "kill", "worker", 1)]
        result = run_faults(node, faults, duration_s=0.3)
        wait_for(node.healthy, timeout=120)
    finally:
        node.close()
    assert result.problems == []
    restart, kill = result.events
    assert restart.recovery_s is not None and kill.recovery_s is not None
    assert "the node, still starting, gave up (exit 4) and was started again" in kill.detail
    assert node.starts == 3


def test_a_node_that_exits_on_its_own_is_a_problem_of_the_run(tmp_path):
    node = NodeUnderTest(tmp_path / "data")
    try:
        node.start()
        os.kill(node.pid, signal.SIGKILL)  # not a fault of the schedule
        # a slow disk for a second or more: the run goes on, and sees the node gone
        result = run_faults(node, [Fault(0.5, "slow", "", 1)], duration_s=0.6)
        wait_for(node.healthy, timeout=120)  # started again
    finally:
        node.close()
    assert any("the node exited on its own" in problem for problem in result.problems)


def test_a_pattern_that_matches_no_process_is_refused_before_any_fault(warren_chaos):
    with pytest.raises(ValueError, match="matches no process of the node"):
        warren_chaos.run(
            "examples.chaos_ledger:children",
            check=chaos_ledger.check,
            patterns=("ledgr",),
            duration_s=5,
            seed=1,
        )


# ------------------------------------------------------------------ disk faults


@pytest.fixture
def disk_faults(tmp_path, monkeypatch):
    """A node whose disk faults a file in tmp_path decides."""
    path = tmp_path / "disk-faults"
    write_faults(path)
    monkeypatch.setenv(ENVIRONMENT_VARIABLE, str(path))
    return path


def test_a_slow_disk_delays_every_confirm_until_it_ends(tmp_path, disk_faults):
    with Node(tmp_path / "data") as node:
        node.declare_queue("orders")
        connection = node.connect()
        write_faults(disk_faults, sync_delay_s=1.0)
        started = time.monotonic()
        for n in range(2):
            connection.publish("orders", b"slow %d" % n)
        assert time.monotonic() - started >= 2.0  # every commit waited
        write_faults(disk_faults)
        started = time.monotonic()
        for n in range(10):
            connection.publish("orders", b"fast %d" % n)
        # none did any more: ten slow commits would take 10 s, ten fast ones a loaded
        # machine's few seconds at the most
        assert time.monotonic() - started < 10 * 1.0
        assert node.queue_state("orders") == "running"


def test_a_full_disk_raises_the_disk_alarm_holds_publishers_and_clears(tmp_path, disk_faults):
    with Node(tmp_path / "data") as node:
        node.declare_queue("orders")
        connection = node.connect(call_timeout_s=1.5)
        write_faults(disk_faults, disk_full=True)
        wait_for(lambda: "disk" in node.active_alarms(), timeout=10)
        with pytest.raises(Blocked):
            connection.publish("orders", b"refused while full")
        write_faults(disk_faults)
        wait_for(lambda: not node.active_alarms(), timeout=10)
        connection.publish("orders", b"taken again")
        assert [connection.get("orders").body] == [b"taken again"]


@pytest.mark.parametrize("disk_free_limit, alarmed", [("50MB", True), ("0", False)])
def test_a_full_disk_the_node_never_alarms_on_is_a_problem_of_the_run(
    tmp_path, disk_free_limit, alarmed, monkeypatch
):
    # A limit of 0 bytes never trips: a node that ignores its disk must fail the run.
    full = Fault(0.5, "full", "", 2)  # seed 2: held for 2.9 s
    if not alarmed:  # its alarm due well within the hold (the node checks every second)
        monkeypatch.setattr(chaos_run, "DISK_ALARM_DUE_S", 1.0)
    node = NodeUnderTest(tmp_path / "data", options=("--disk-free-limit", disk_free_limit))
    try:
        node.start()
        result = run_faults(node, [full], duration_s=1.0)
    finally:
        node.close()
    [event] = result.events
    assert event.landed is alarmed
    assert bool(result.problems) is not alarmed
    if not alarmed:
        assert "the disk alarm did not go off" in result.problems[0]


# ------------------------------------------------------------------ warren chaos


def test_warren_chaos_rides_through_every_kind_of_fault_and_reports_it(tmp_path):
    # The short seeded run CI makes (make chaos runs a long one).
    report_dir = tmp_path / "report"
    run = warren(
        "chaos",
        "--data-dir",
        str(tmp_path / "data"),
        "--duration",
        "20",
        "--seed",
        "341",
        "--faults",
        "kill,stop,node,torn,flip,full,slow",
        "--every",
        "1..2",
        "--producers",
        "4",  # the fourth publishes to the quorum queue
        "--consumers",
        "2",
        "--size",
        "1KiB..16KiB",
        "--report",
        str(report_dir),
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads((report_dir / "report.json").read_text())
    for key in ("faults", "confirmed", "consumed", "lost", "duplicates", "wrong_bodies"):
        assert isinstance(report[key], int), key
    assert report["faults"] >= 5 and report["confirmed"] > 0  # a loaded machine confirms few
    assert report["lost"] == 0 and report["wrong_bodies"] == 0 and report["misrouted"] == 0
    assert report["unflagged_duplicates"] == 0 and report["healthy"] is True
    assert report["counts_backwards"] == 0 and report["problems"] == []
    # every confirmed message consumed, or destroyed by damage, or (of the stream) deleted
    # by retention before its reader got there
    assert report["consumed"] >= report["confirmed"] - report["destroyed"] - report["trimmed"]
    # the roles worked through the faults (how much depends on the machine's load)
    assert report["stream_confirmed"] > 20 and report["stream_read"] > 20
    # every victim replaced: by its supervisor, or by the node's start after a node kill
    # that came first (how many restarts the supervisors made first is a race)
    landed = [e for e in report["events"] if e["landed"] and e["kind"] not in ("full", "slow")]
    assert landed and all(e["recovery_s"] is not None for e in landed)
    assert report["recovery_p50_s"] is not None and report["node_starts"] >= 2
    assert (report_dir / "throughput.png").stat().st_size > 10_000
    assert "PASSED: seed 341" in run.stdout
    # every kind was tried, and landed unless it fell due only while the node restarted
    for kind in ("kill", "stop", "node", "torn", "flip", "full", "slow"):
        assert any(e["kind"] == kind for e in report["events"]), kind
        assert kind in report["faults_by_kind"] or missed_only_while_the_node_restarted(
            report["events"], kind
        ), [e for e in report["events"] if e["kind"] == kind]


@pytest.mark.parametrize(
    "args, complaint",
    [
        (["--faults", "kill,meteor"], "unknown fault kinds ['meteor']"),
        (["--duration", "0"], "more than 0 seconds"),
        (["--duration", "inf"], "and finite"),
        (["--every", "2..0.5"], "0 < FROM <= TO"),
        (["--patterns", "queue nothing"], "matches no process of the node"),
        (["--size", "64KiB..1KiB"], "0 < FROM <= TO"),
        (["--producers", "0"], "--producers must be at least 1"),
    ],
)
def test_bad_chaos_input_is_refused_before_anything_starts(tmp_path, args, complaint):
    data_dir = tmp_path / "data"
    refused = warren("chaos", "--data-dir", str(data_dir), *args)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert complaint in refused.stderr and "Traceback" not in refused.stderr
    assert not data_dir.exists()  # nothing was started or made


def test_chaos_refuses_a_directory_that_is_not_a_nodes_or_one_a_node_holds(tmp_path):
    stranger = tmp_path / "photos"
    stranger.mkdir()
    (stranger / "cat.jpg").write_bytes(b"\xff\xd8")
    refused = warren("chaos", "--data-dir", str(stranger))
    assert refused.returncode == 2 and "is not a node's data directory" in refused.stderr
    assert sorted(os.listdir(stranger)) == ["cat.jpg"]
    with Node(tmp_path / "busy"):
        refused = warren("chaos", "--data-dir", str(tmp_path / "busy"))
    assert refused.returncode == 2 and "a node runs on" in refused.stderr
    # What an earlier run left before its node could start does not make a stranger.
    retried = tmp_path / "retried"
    (retried / "chaos-run").mkdir(parents=True)
    (retried / "chaos-node.log").write_text("usage: unknown module 'myap.tree'\n")
    assert check_data_dir(retried) == str(retried)


def test_a_node_that_will_not_start_ends_the_run_with_one_line_and_its_log(tmp_path):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / "msg_store_persistent").write_text("a file where the store's directory goes")
    failed = warren("chaos", "--data-dir", str(data_dir), "--duration", "5")
    assert failed.returncode == 4 and "Traceback" not in failed.stderr
    assert "exited with 4 while starting" in failed.stderr
    assert "msg_store_persistent" in (data_dir / "chaos-run" / "node.log").read_text()


STOP_IN_A_FORKED_CHILD = """
import os, signal
from warren.supervisor.chaos.run import harness_signals

with harness_signals():
    child = os.fork()
    if child == 0:  # as a workload process is, in its preexec_fn, before its exec
        try:
            os.kill(os.getpid(), signal.{signal})
            for _ in range(1000):  # a handler runs between two bytecodes
                pass
        except KeyboardInterrupt:
            os._exit(3)
        os._exit(0)
    print(os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]))
"""


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_in_a_child_before_its_exec_ends_it_as_the_signal_would(signum):
    # A stop to the whole group during a spawn reaches the child too, which runs the
    # harness's handler until its exec: raising there failed the spawn, and the run
    # ended in a SubprocessError (exit 1) rather than its interrupt (130); ignoring it
    # would let the child exec and run on, unknown to a harness that is stopping.
    script = STOP_IN_A_FORKED_CHILD.format(signal=signal.Signals(signum).name)
    ran = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert (ran.returncode, ran.stdout) == (0, f"{-signum}\n"), ran.stderr


@pytest.mark.parametrize(
    "signum, to_group",
    [
        (signal.SIGINT, False),
        (signal.SIGTERM, False),
        (signal.SIGHUP, False),
        (signal.SIGINT, True),  # Ctrl-C in the terminal: the whole foreground group
        (signal.SIGTERM, True),  # systemd's stop: every process of the group at once
        (signal.SIGHUP, True),  # a closed terminal
    ],
)
def test_an_interrupted_chaos_run_leaves_no_process_behind(tmp_path, signum, to_group):
    options = ["--data-dir", str(tmp_path / "data"), "--duration", "60", "--seed", "1"]
    # running: the node, its actors and the workload's producers and consumers
    interrupt_run([*options, "--faults", "kill"], signum, to_group=to_group, running_at_least=12)


def test_a_sigkilled_harness_takes_its_node_and_workload_along(tmp_path):
    harness = subprocess.Popen(
        [
            *WARREN,
            "chaos",
            "--data-dir",
            str(tmp_path / "data"),
            "--duration",
            "60",
            "--seed",
            "1",
            "--faults",
            "kill",
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    family: list[psutil.Process] = []
    try:
        wait_for(lambda: len(node_processes(harness.pid)) >= 12, timeout=60)
        family = node_processes(harness.pid)
        harness.kill()
        harness.wait()
        # The node and the workload die with it (PR_SET_PDEATHSIG); the node's actors
        # follow their forkserver as soon as it sees the node gone.
        wait_for(lambda: not [p for p in family if is_alive(p)], timeout=40)
    finally:
        if harness.poll() is None:
            harness.kill()
            harness.wait()
        kill_processes([p for p in family if is_alive(p)])


# ------------------------------------------------------------------ the verdict can fail


def _write(path: Path, lines: list[str]) -> None:
    path.write_text("".join(line + "\n" for line in lines))


def test_the_audit_names_lost_unflagged_misrouted_and_wrong_messages(tmp_path):
    workload = ChaosWorkload(
        str(tmp_path), "tcp://127.0.0.1:1", producers=2, consumers=1, sizes=(1024, 2048)
    )
    p0, p1 = workload.producer(0).name, workload.producer(1).name  # default, lazy
    _write(tmp_path / "producer0.ledger", [f"{p0}-{n}" for n in range(4)])
    _write(tmp_path / "producer0.ledger.resent", [f"{p0}-3"])
    _write(tmp_path / "producer1.ledger", [f"{p1}-0", f"{p1}-1"])
    _write(
        tmp_path / "consumer0.ledger",
        [
            f"chaos.default {p0}-0 0",
            f"chaos.default {p0}-0 1",  # a flagged redelivery: fine
            f"chaos.default {p0}-1 0",
            f"chaos.default {p0}-1 0",  # twice, unflagged: a failure
            f"chaos.default {p0}-3 0",
            f"chaos.default {p0}-3 0",  # sent twice in doubt: fine
            f"chaos.lazy {p1}-0 0",
            f"chaos.fanout.1 {p1}-1 0",  # the second went astray
            "chaos.lazy ? wrong",  # a wrong body: a failure
            "chaos.lazy 0a0a0ap0-7 0",  # an earlier run's: counted
        ],
    )
    audit = workload.audit()
    assert not audit.ok
    assert audit.lost == [f"chaos.default {p0}-2", f"chaos.lazy {p1}-1"]
    assert audit.unflagged == [f"chaos.default {p0}-1"] and audit.duplicates == 3
    assert audit.misrouted == [f"chaos.fanout.1 {p1}-1"]
    assert audit.wrong_bodies == 1 and audit.confirmed == 6 and audit.consumed == 10


def test_a_quorum_queue_delivery_count_that_goes_back_is_a_broken_promise(tmp_path):
    workload = ChaosWorkload(
        str(tmp_path), "tcp://127.0.0.1:1", producers=4, consumers=2, sizes=(1024, 2048)
    )
    p0, p3 = workload.producer(0).name, workload.producer(3).name  # default, quorum
    _write(tmp_path / "producer0.ledger", [f"{p0}-0"])
    _write(tmp_path / "producer3.ledger", [f"{p3}-{n}" for n in range(3)])
    for n in (1, 2):
        _write(tmp_path / f"producer{n}.ledger", [])
    _write(
        tmp_path / "consumer0.ledger",
        [
            f"chaos.default {p0}-0 0 3",
            f"chaos.default {p0}-0 1 1",  # a classic queue's counts start again: fine
            f"chaos.quorum {p3}-0 0 0",
            f"chaos.quorum {p3}-0 1 2",
            f"chaos.quorum {p3}-0 1 1",  # the queue forgot a delivery: a failure
            f"chaos.quorum {p3}-1 0 0",
            f"chaos.quorum {p3}-1 1 1",
            f"chaos.quorum {p3}-2 0 4",
        ],
    )
    # Another consumer's ledger is not in time order with the first's: held to its own.
    _write(tmp_path / "consumer1.ledger", [f"chaos.quorum {p3}-2 1 1"])
    audit = workload.audit()
    assert audit.backwards == [f"chaos.quorum {p3}-0"] and not audit.ok
    assert audit.counts()["counts_backwards"] == 1 and not audit.lost and not audit.unflagged


def test_a_damaged_quorum_log_excuses_what_it_held_and_the_counts_it_raised(tmp_path):
    workload = ChaosWorkload(
        str(tmp_path), "tcp://127.0.0.1:1", producers=4, consumers=1, sizes=(100, 200)
    )
    p3 = workload.producer(3).name
    _write(tmp_path / "producer3.ledger", [f"{p3}-{n}" for n in range(8)])
    for n in range(3):
        _write(tmp_path / f"producer{n}.ledger", [])
    _write(
        tmp_path / "consumer0.ledger",
        [f"chaos.quorum {p3}-0 0 2", f"chaos.quorum {p3}-0 1 1"],  # went back: excused below
    )
    owner = b"queues/chaos.quorum"

    def records(first: int, ids: range, directory: Path, name: str) -> tuple[Path, list[bytes]]:
        directory.mkdir(parents=True, exist_ok=True)
        packed = [
            ra_log.pack_entry(first + i, 1, b"E" + body_of(f"{p3}-{n}", 150), owner)
            for i, n in enumerate(ids)
        ]
        (directory / name).write_bytes(b"".join(packed))
        return directory / name, packed

    # A segment: a flip in the record of 2 takes 2 and 3, the rest of the file.
    segment, packed = records(
        1, range(1, 4), tmp_path / "queues" / "chaos.quorum" / "log", "1.segment"
    )
    workload.note_damage(str(segment), "flip", len(packed[0]) + 40)
    # A WAL file: a cut at the end of the record of 5 takes 5 and 6, not 4.
    wal, packed = records(4, range(4, 7), tmp_path / "quorum" / "wal", "00000001.wal")
    workload.note_damage(str(wal), "torn", len(packed[0]) + len(packed[1]) - 1)
    # The snapshot: the one before it, or the log it kept, holds what it held.
    snapshot, _ = records(7, range(7, 8), tmp_path / "queues" / "chaos.quorum", "snapshot")
    workload.note_damage(str(snapshot), "flip", 10)
    audit = workload.audit()
    assert audit.destroyed == [f"chaos.quorum {p3}-{n}" for n in (2, 3, 5, 6)]
    assert audit.lost == [f"chaos.quorum {p3}-{n}" for n in (1, 4, 7)]
    assert not audit.backwards


class _StoppedMidPublish(BaseException):
    """What a producer's SIGTERM raises (``roles._Stop``): out of any publish."""


def test_a_publish_a_stop_interrupts_is_noted_in_doubt_as_it_may_have_gone_twice(tmp_path):
    # A recovering connection sends a publish in doubt again before the call returns:
    # stopped then (the run's end), the producer never hears how often it went, and a
    # queue that lost the first one's trace (acked before its confirm, then a node
    # kill) delivers both unflagged.
    class Connection:
        recoveries = 0

        def publish(self, routing_key, body, **options):
            if options["sequence"] == 2:
                raise _StoppedMidPublish
            return None

    ledger = str(tmp_path / "producer0.ledger")
    with pytest.raises(_StoppedMidPublish):
        produce(Connection(), "q", "p0", None, ledger, deduplicate=True)
    assert (tmp_path / "producer0.ledger").read_text().split() == ["p0-0", "p0-1"]
    assert (tmp_path / "producer0.ledger.resent").read_text().split() == ["p0-2"]


def test_a_drain_a_stuck_consumer_never_ends_names_the_queues_left_and_its_stacks(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(broker_run, "DRAIN_IDLE_S", 2.0)
    monkeypatch.setattr(broker_run, "STREAM_DRAIN_IDLE_S", 0.0)
    with Node(tmp_path / "data", listen="tcp://127.0.0.1:*") as node:
        workload = ChaosWorkload(
            str(tmp_path / "run"), node.listen_endpoint, producers=1, consumers=1, sizes=(10, 20)
        )
        workload.declare()
        workload.start()
        try:
            consumer = psutil.Process(workload._consumers[0].pid)
            consumer.suspend()  # stuck: it takes nothing more
            wait_for(lambda: workload.sample()["confirmed"] >= 10, timeout=60)
            workload.stop_producers()
            workload.drain()
            consumer.resume()  # it writes its stacks on the SIGUSR1 the drain sent
            log = tmp_path / "run" / "workload.log"
            wait_for(lambda: "most recent call first" in log.read_text(), timeout=30)
        finally:
            workload.close()
    assert any(
        re.search(r"took nothing for 2 s while queues held messages \(chaos.default \d+\)", p)
        for p in workload.problems
    ), workload.problems


def test_only_what_a_damaged_file_held_is_counted_destroyed_rather_than_lost(tmp_path):
    workload = ChaosWorkload(
        str(tmp_path), "tcp://127.0.0.1:1", producers=1, consumers=1, sizes=(100, 200)
    )
    p0 = workload.producer(0).name
    _write(tmp_path / "producer0.ledger", [f"{p0}-{n}" for n in range(12)])
    _write(tmp_path / "consumer0.ledger", [])
    # The shared store: a cut in the fourth of four bodies takes it and what follows.
    bodies = tmp_path / "msg_store_persistent" / "1.rdq"
    bodies.parent.mkdir()
    chunks = [b"HEAD" + body_of(f"{p0}-{n}", 150) for n in range(4)]
    bodies.write_bytes(b"".join(chunks))
    workload.note_damage(str(bodies), "torn", len(b"".join(chunks[:3])) + 60)
    # A queue's segment files, of five slots then the queue's own records. In the slots:
    # a flip in the slot of 4 takes 4 alone; a cut in the slot of 7 takes 7 and 8.
    index = tmp_path / "queues" / "chaos.default" / "0.qi"
    index.parent.mkdir(parents=True)
    slots = b"".join(
        bytes(16) + message_ids(p0.encode(), n, 1)[0] + bytes(16) for n in (4, 5, 6, 7, 8)
    )
    index.write_bytes(segment_header(0, 5) + slots)
    workload.note_damage(str(index), "flip", HEADER_BYTES + 20)
    workload.note_damage(str(index), "torn", HEADER_BYTES + 3 * SLOT_BYTES + 5)
    # In the records: a flip inside the body of 9 takes it (or its neighbour 10, where
    # the bit may fall in 10's framing), not 11; a flipped header takes the whole file,
    # but only for its queue.
    own = tmp_path / "queues" / "chaos.default" / "1.qi"
    records = [b"HEAD" + body_of(f"{p0}-{n}", 150) for n in (9, 10, 11)]
    own.write_bytes(segment_header(1, 5) + bytes(5 * SLOT_BYTES) + b"".join(records))
    workload.note_damage(str(own), "flip", records_at(5) + 30)
    other = tmp_path / "queues" / "chaos.lazy" / "0.qi"
    other.parent.mkdir()
    other.write_bytes(
        segment_header(0, 5) + bytes(5 * SLOT_BYTES) + b"HEAD" + body_of(f"{p0}-0", 150)
    )
    workload.note_damage(str(other), "flip", 10)
    audit = workload.audit()
    assert audit.destroyed == [f"chaos.default {p0}-{n}" for n in (10, 3, 4, 7, 8, 9)]
    assert audit.lost == [f"chaos.default {p0}-{n}" for n in (0, 1, 11, 2, 5, 6)]


def test_a_node_missing_an_actor_it_must_have_is_not_healthy(tmp_path):
    node = NodeUnderTest(tmp_path / "data")
    try:
        node.start()
        assert node.healthy()
        node.expect(["msg_store_persistent", "queue orders"])  # never declared
        assert not node.healthy()
        node.expect(["msg_store_persistent", "msg_store_gc"])
        assert node.healthy()
        family = node.processes()
    finally:
        node.close()
    assert not [p for p in family if is_alive(p)]


def test_fault_patterns_get_limits_under_their_supervisors_intensity():
    assert pattern_limits(("queue *", "stream *", "msg_store_*")) == {
        "queue *": (3, 60.0),
        "stream *": (3, 60.0),  # a stream has a supervisor of its own, as a queue does
        "msg_store_*": (2, 60.0),
    }
    # the stores and the WAL are the root's children: they share its spare restarts
    assert pattern_limits(("queue chaos.quorum", "msg_store_*", "wal")) == {
        "queue chaos.quorum": (3, 60.0),
        "msg_store_*": (1, 60.0),
        "wal": (1, 60.0),
    }
    with pytest.raises(ValueError, match="matches no process"):
        pattern_limits(("queue orders",))

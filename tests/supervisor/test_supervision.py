"""OTP's supervision semantics with real processes SIGKILLed, SIGSTOPped and stopped."""

import contextlib
import os
import signal
import threading
import time

import psutil
import pytest

from warren.actors.node import EXIT_AFTER_KILL_S
from warren.supervisor import ChildSpec, Supervisor, SupervisorFlags, SupervisorSpec
from warren.supervisor.errors import SupervisorError

from ..waiting import wait_for
from .sample_actors import (
    FailsToStart,
    GatedStarter,
    MeetsAtStart,
    SlowStarter,
    SlowToStop,
    Worker,
)


def pids(supervisor) -> dict[str, int]:
    return {c["id"]: c["pid"] for c in supervisor.which_children()}


def all_running(supervisor) -> bool:
    return all(c["state"] == "running" for c in supervisor.which_children())


def three(strategy, **child_options):
    return SupervisorSpec(
        "sup",
        SupervisorFlags(strategy, intensity=5, period_s=10),
        children=tuple(ChildSpec(n, Worker, (n,), **child_options) for n in ("a", "b", "c")),
    )


@pytest.mark.parametrize(
    "strategy,restarted",
    [
        ("one_for_one", {"b"}),
        ("one_for_all", {"a", "b", "c"}),
        ("rest_for_one", {"b", "c"}),
    ],
)
def test_a_killed_child_restarts_exactly_the_children_its_strategy_names(
    actor_node, strategy, restarted
):
    with Supervisor(actor_node, three(strategy)) as supervisor:
        before = pids(supervisor)
        os.kill(before["b"], signal.SIGKILL)
        wait_for(lambda: pids(supervisor)["b"] != before["b"] and all_running(supervisor))
        after = pids(supervisor)
        assert {n for n in before if after[n] != before[n]} == restarted
        assert all(not psutil.pid_exists(before[n]) for n in restarted)
        assert actor_node.whereis("b").ask("pid") == after["b"]


def test_an_old_ref_reaches_the_restarted_child(actor_node):
    with Supervisor(actor_node, three("one_for_one")) as supervisor:
        old_ref = actor_node.whereis("a")
        old_pid = old_ref.ask("pid")
        os.kill(old_pid, signal.SIGKILL)
        wait_for(lambda: pids(supervisor)["a"] != old_pid and all_running(supervisor))
        assert old_ref.ask("pid") == pids(supervisor)["a"]


def test_simple_one_for_one_children_are_added_and_restarted_alone(actor_node):
    spec = SupervisorSpec(
        "pool",
        SupervisorFlags("simple_one_for_one", intensity=5),
        children=(ChildSpec("conn", Worker),),
    )
    with Supervisor(actor_node, spec) as supervisor:
        first = supervisor.start_child(("one",))
        second = supervisor.start_child(("two",))
        before = pids(supervisor)
        assert set(before) == {"conn-1", "conn-2"}
        os.kill(first.pid, signal.SIGKILL)
        wait_for(lambda: pids(supervisor)["conn-1"] != before["conn-1"] and all_running(supervisor))
        assert pids(supervisor)["conn-2"] == second.pid


def test_restart_intensity_exceeded_stops_every_child_and_fails_the_supervisor(actor_node):
    failures = []
    spec = SupervisorSpec(
        "sup",
        SupervisorFlags("one_for_one", intensity=1, period_s=30),
        children=(ChildSpec("a", Worker), ChildSpec("b", Worker)),
    )
    supervisor = Supervisor(actor_node, spec, on_failure=failures.append).start()
    try:
        first = pids(supervisor)
        os.kill(first["a"], signal.SIGKILL)
        wait_for(lambda: pids(supervisor)["a"] != first["a"] and all_running(supervisor))
        os.kill(pids(supervisor)["a"], signal.SIGKILL)
        wait_for(lambda: supervisor.state == "failed")
        assert "more than 1 restarts" in failures[0]
        wait_for(lambda: not psutil.pid_exists(first["b"]))
    finally:
        supervisor.stop()


def test_a_failed_child_supervisor_is_restarted_by_its_parent(actor_node):
    inner = SupervisorSpec(
        "inner", SupervisorFlags("one_for_one", intensity=0), children=(ChildSpec("x", Worker),)
    )
    outer = SupervisorSpec(
        "outer",
        SupervisorFlags("one_for_one", intensity=3, period_s=30),
        children=(ChildSpec("y", Worker), inner),
    )
    with Supervisor(actor_node, outer) as supervisor:
        x_before = actor_node.whereis("x").ask("pid")
        y_before = actor_node.whereis("y").ask("pid")
        os.kill(x_before, signal.SIGKILL)
        wait_for(
            lambda: (
                actor_node.whereis("x") is not None
                and supervisor.status()["children"][1]["state"] == "running"
                and supervisor.status()["children"][1]["children"][0]["state"] == "running"
                and supervisor.status()["children"][1]["children"][0]["pid"] != x_before
            )
        )
        assert supervisor.status()["children"][1]["restarts"] == 1
        assert actor_node.whereis("y").ask("pid") == y_before


def test_temporary_children_are_not_restarted_and_transient_ones_only_after_a_crash(actor_node):
    spec = SupervisorSpec(
        "sup",
        SupervisorFlags("one_for_one", intensity=5),
        children=(
            ChildSpec("temp", Worker, restart="temporary"),
            ChildSpec("trans", Worker, restart="transient"),
            ChildSpec("trans2", Worker, restart="transient"),
            ChildSpec("trans3", Worker, restart="transient"),
        ),
    )
    with Supervisor(actor_node, spec) as supervisor:
        before = pids(supervisor)
        os.kill(before["temp"], signal.SIGKILL)
        actor_node.whereis("trans").tell("quit")  # a normal exit
        actor_node.whereis("trans2").tell("crash")  # an abnormal one
        actor_node.whereis("trans3").tell("fail")  # a stop of its own, as a failure
        wait_for(
            lambda: (
                "temp" not in pids(supervisor)
                and pids(supervisor)["trans2"] != before["trans2"]
                and pids(supervisor)["trans3"] != before["trans3"]
                and [c["state"] for c in supervisor.which_children()]
                == ["stopped", "running", "running"]
            )
        )
        assert not psutil.pid_exists(before["trans"])


def test_children_stop_in_reverse_start_order(actor_node, tmp_path):
    journal = str(tmp_path / "journal")
    spec = SupervisorSpec(
        "sup",
        children=tuple(ChildSpec(n, Worker, (n, journal)) for n in ("first", "second", "third")),
    )
    Supervisor(actor_node, spec).start().stop()
    assert open(journal).read().split() == ["third", "second", "first"]


def test_a_child_that_ignores_its_stop_is_killed_after_its_shutdown_timeout(actor_node):
    spec = SupervisorSpec(
        "sup", children=(ChildSpec("stubborn", Worker, ("stubborn", None, 60.0), shutdown_s=0.5),)
    )
    supervisor = Supervisor(actor_node, spec).start()
    pid = pids(supervisor)["stubborn"]
    started = time.monotonic()
    supervisor.stop()
    assert not psutil.pid_exists(pid)
    assert time.monotonic() - started < 10


def test_a_sigstopped_child_is_found_hung_and_restarted(actor_node):
    spec = SupervisorSpec(
        "sup",
        SupervisorFlags("one_for_one", intensity=5),
        children=(ChildSpec("sleepy", Worker, heartbeat_interval_s=0.2, heartbeat_timeout_s=1.0),),
    )
    with Supervisor(actor_node, spec) as supervisor:
        before = pids(supervisor)["sleepy"]
        os.kill(before, signal.SIGSTOP)
        wait_for(lambda: pids(supervisor)["sleepy"] != before and all_running(supervisor))
        assert not psutil.pid_exists(before)


def test_a_child_added_at_run_time_is_watched_refused_twice_and_forgotten_once_stopped(
    actor_node,
):
    spec = SupervisorSpec("sup", SupervisorFlags("one_for_one", intensity=5), children=())
    late = ChildSpec("late", Worker, heartbeat_interval_s=0.2, heartbeat_timeout_s=1.0)
    with Supervisor(actor_node, spec) as supervisor:
        first = supervisor.start_child(late)
        with pytest.raises(SupervisorError, match="exists already"):
            supervisor.start_child(late)
        os.kill(first.pid, signal.SIGSTOP)  # its heartbeats find it hung
        wait_for(lambda: pids(supervisor)["late"] != first.pid and all_running(supervisor))
        assert not psutil.pid_exists(first.pid)
        supervisor.terminate_child("late")
        assert supervisor.which_children() == []
        again = supervisor.start_child(late)  # its name is free again
        assert pids(supervisor) == {"late": again.pid}


def test_a_slow_restart_is_not_mistaken_for_a_hang(actor_node):
    spec = SupervisorSpec(
        "sup",
        SupervisorFlags("one_for_one", intensity=5),
        children=(
            ChildSpec(
                "recovering", SlowStarter, (3.0,), heartbeat_interval_s=0.3, heartbeat_timeout_s=1.5
            ),
        ),
    )
    with Supervisor(actor_node, spec) as supervisor:
        first = pids(supervisor)["recovering"]
        os.kill(first, signal.SIGKILL)  # the restart takes 3 s in on_start
        wait_for(lambda: pids(supervisor)["recovering"] != first and all_running(supervisor))
        second = pids(supervisor)["recovering"]
        time.sleep(1.5)  # five heartbeat intervals, answered
        assert pids(supervisor)["recovering"] == second
        assert supervisor.which_children()[0]["restarts"] == 1


def test_a_supervisor_shows_the_child_it_is_busy_starting_and_how_long_that_may_take(
    actor_node, tmp_path
):
    # A supervisor acts on one event at a time: while it starts a child (a recovery) a
    # hung sibling waits. Its status says so, so that a late kill can be told from none.
    gate = tmp_path / "gate"  # the gated child's start ends once this exists
    gate.touch()
    inner = SupervisorSpec(
        "inner",
        SupervisorFlags("one_for_one", intensity=5),
        children=(
            ChildSpec("gated", GatedStarter, (str(gate),), start_timeout_s=120),
            ChildSpec("quick", Worker, start_timeout_s=30),
        ),
    )
    spec = SupervisorSpec(
        "outer",
        SupervisorFlags("rest_for_one", intensity=5),
        children=(ChildSpec("first", Worker), inner),
    )
    with Supervisor(actor_node, spec) as supervisor:
        assert supervisor.status()["busy"] is None
        gate.unlink()
        os.kill(pids(supervisor)["first"], signal.SIGKILL)  # inner is restarted after it

        def busy_starting_inner() -> bool:
            busy = supervisor.status()["busy"]
            return busy is not None and busy["action"] == "starting" and busy["child"] == "inner"

        wait_for(busy_starting_inner, timeout=60)
        status = supervisor.status()
        # a nested supervisor's start: its children's starts, one after another
        assert status["busy"]["bound_s"] == 150 and status["busy"]["for_s"] >= 0
        nested = status["children"][1]["busy"]
        assert (nested["action"], nested["child"], nested["bound_s"]) == ("starting", "gated", 120)
        gate.touch()
        wait_for(lambda: supervisor.status()["busy"] is None and all_running(supervisor))
        assert supervisor.status()["children"][1]["busy"] is None


def test_a_supervisor_shows_the_child_it_is_busy_stopping_and_how_long_that_may_take(
    actor_node, tmp_path
):
    began = tmp_path / "began"  # the slow child's on_stop has begun
    slow = ChildSpec(
        "slow", SlowToStop, ("slow", str(tmp_path / "journal"), 600.0, str(began)), shutdown_s=60
    )
    supervisor = Supervisor(
        actor_node, SupervisorSpec("sup", children=(ChildSpec("idle", Worker), slow))
    ).start()
    pid = pids(supervisor)["slow"]
    # its children's stops one after another: idle's default shutdown_s is 5 s
    assert supervisor.stop_bound_s() == (2 * 5 + EXIT_AFTER_KILL_S) + (2 * 60 + EXIT_AFTER_KILL_S)
    stopping = threading.Thread(target=supervisor.stop)
    try:
        stopping.start()
        wait_for(began.exists)
        busy = supervisor.status()["busy"]
        # a stop request, SIGTERM after shutdown_s, SIGKILL after as long again, its exit
        bound_s = 2 * 60 + EXIT_AFTER_KILL_S
        assert (busy["action"], busy["child"], busy["bound_s"]) == ("stopping", "slow", bound_s)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)  # its on_stop would outlast the test
        stopping.join()
    assert supervisor.status()["busy"] is None


def test_a_brutal_kill_whose_exit_never_shows_ends_its_stop_within_the_bound_shown(actor_node):
    # The forkserver stopped by a signal neither kills the child nor reports an exit: the
    # supervisor waits for that exit no longer than the bound a watcher reads for the stop
    # (the chaos harness calls a stop past it one that never ends).
    spec = SupervisorSpec("sup", children=(ChildSpec("brutal", Worker, shutdown_s="brutal_kill"),))
    supervisor = Supervisor(actor_node, spec).start()
    pid = pids(supervisor)["brutal"]
    forkserver = psutil.Process(actor_node.forkserver_pid)
    stopping = threading.Thread(target=supervisor.stop)
    forkserver.suspend()
    try:
        stopping.start()
        wait_for(lambda: supervisor.status()["busy"] is not None or not stopping.is_alive())
        busy = supervisor.status()["busy"]
        assert busy is not None, "the stop ended without waiting for the exit"
        assert (busy["action"], busy["child"], busy["bound_s"]) == (
            "stopping",
            "brutal",
            EXIT_AFTER_KILL_S,
        )
        # well past the bound, and well short of a wait longer than it
        stopping.join(timeout=EXIT_AFTER_KILL_S + 15)
        assert not stopping.is_alive(), "the stop outlasted its bound"
        assert psutil.pid_exists(pid)  # the kill is still waiting for the forkserver
    finally:
        forkserver.resume()
        stopping.join()
    wait_for(lambda: not psutil.pid_exists(pid))  # the forkserver now kills and reaps it


def test_a_child_that_cannot_start_fails_the_start_and_stops_its_elder_siblings(actor_node):
    spec = SupervisorSpec(
        "sup", children=(ChildSpec("fine", Worker), ChildSpec("broken", FailsToStart))
    )
    supervisor = Supervisor(actor_node, spec)
    with pytest.raises(SupervisorError, match="broken failed to start"):
        supervisor.start()
    assert actor_node.actors() == []


def test_children_started_together_recover_side_by_side_and_then_run_as_any(actor_node, tmp_path):
    """Two children each of whose starts waits for the other's to have begun: started
    in turn they never would; ``start_together`` starts them side by side (as a node
    recovers its queues), after which each is supervised as usual."""
    left, right = str(tmp_path / "left"), str(tmp_path / "right")
    spec = SupervisorSpec(
        "queues",
        SupervisorFlags("one_for_one", intensity=5, start_together=2),
        children=(
            ChildSpec("left", MeetsAtStart, (left, right), start_timeout_s=60),
            ChildSpec("right", MeetsAtStart, (right, left), start_timeout_s=60),
            ChildSpec("after", Worker),
        ),
    )
    with Supervisor(actor_node, spec) as supervisor:
        assert all_running(supervisor) and supervisor.status()["busy"] is None
        before = pids(supervisor)
        os.kill(before["right"], signal.SIGKILL)
        wait_for(lambda: all_running(supervisor) and pids(supervisor)["right"] != before["right"])
        assert pids(supervisor)["left"] == before["left"]  # one_for_one: right alone


def test_a_child_that_cannot_start_beside_others_fails_the_start_and_leaves_none(actor_node):
    spec = SupervisorSpec(
        "queues",
        SupervisorFlags("one_for_one", start_together=3),
        children=(
            ChildSpec("fine", Worker),
            ChildSpec("broken", FailsToStart),
            *(ChildSpec(f"later {n}", Worker) for n in range(5)),
        ),
    )
    supervisor = Supervisor(actor_node, spec)
    with pytest.raises(SupervisorError, match="broken failed to start"):
        supervisor.start()
    assert actor_node.actors() == []


def test_a_child_whose_name_is_taken_fails_a_start_beside_others_and_leaves_none(actor_node):
    """A bad argument (here a name another actor holds) is no crash of the start: the
    children started beside it are stopped, and the rest never start."""
    holder = actor_node.spawn(Worker, name="taken")
    spec = SupervisorSpec(
        "queues",
        SupervisorFlags("one_for_one", start_together=2),
        children=tuple(ChildSpec(name, Worker) for name in ("fine", "taken", "a", "b", "c")),
    )
    with pytest.raises(SupervisorError, match="taken failed to start"):
        Supervisor(actor_node, spec).start()
    assert actor_node.actors() == [holder]


def test_a_child_stopped_by_a_signal_is_killed_when_its_supervisor_stops_it(actor_node):
    # A queue SIGSTOPped just before a store crash makes the node restart its queues: the
    # queue's supervisor stops it, and a stopped process acts on no stop request. It must
    # not hold the restart up for its whole shutdown_s (seed 274990805).
    frozen = ChildSpec(
        "frozen", Worker, shutdown_s=600, heartbeat_interval_s=0.2, heartbeat_timeout_s=1.0
    )
    supervisor = Supervisor(actor_node, SupervisorSpec("sup", children=(frozen,))).start()
    pid = pids(supervisor)["frozen"]
    os.kill(pid, signal.SIGSTOP)
    wait_for(lambda: psutil.Process(pid).status() == psutil.STATUS_STOPPED)
    stopping = threading.Thread(target=supervisor.stop)
    try:
        stopping.start()
        stopping.join(30)  # far below the child's shutdown_s
        assert not stopping.is_alive(), "the stop waited on a child that runs no code"
        assert not psutil.pid_exists(pid)
    finally:
        if psutil.pid_exists(pid):
            os.kill(pid, signal.SIGCONT)  # so that a stop still waiting ends
        stopping.join()


def test_a_child_stopped_by_a_signal_once_its_stop_began_is_killed(actor_node, tmp_path):
    # The kernel shows a SIGSTOP only once the process has run to take it: on a loaded
    # machine, one waiting for a core or in an fsync still shows running when its
    # supervisor begins to stop it (a store's crash restarting the queues). It must be
    # killed once it shows stopped, not waited for up to its shutdown_s (seed 38545210).
    began = tmp_path / "began"
    slow = ChildSpec(
        "slow",
        SlowToStop,
        ("slow", str(tmp_path / "journal"), 20.0, str(began)),
        shutdown_s=600,
        heartbeat_interval_s=0.2,
        heartbeat_timeout_s=1.0,
    )
    supervisor = Supervisor(actor_node, SupervisorSpec("sup", children=(slow,))).start()
    pid = pids(supervisor)["slow"]
    stopping = threading.Thread(target=supervisor.stop)
    try:
        stopping.start()
        wait_for(began.exists)  # its stop began while it ran: it is in its on_stop
        os.kill(pid, signal.SIGSTOP)
        stopping.join(15)  # far below the child's shutdown_s and its on_stop
        assert not stopping.is_alive(), "the stop waited on a child that runs no code"
        assert not psutil.pid_exists(pid)
    finally:
        if psutil.pid_exists(pid):
            os.kill(pid, signal.SIGCONT)  # so that a stop still waiting ends
        stopping.join()


def test_a_child_in_a_long_on_stop_is_waited_for_though_it_answers_no_ping(actor_node, tmp_path):
    # systemd stops a node by signalling every process at once: each actor is in its
    # on_stop (a store writing its recovery files) when its supervisor comes to stop it,
    # silent for longer than its heartbeat timeout, and must be let finish.
    journal = str(tmp_path / "journal")
    slow = ChildSpec(
        "slow",
        SlowToStop,
        ("slow", journal, 3.0),
        shutdown_s=60,
        heartbeat_interval_s=0.2,
        heartbeat_timeout_s=1.0,
    )
    supervisor = Supervisor(actor_node, SupervisorSpec("sup", children=(slow,))).start()
    os.kill(pids(supervisor)["slow"], signal.SIGTERM)
    supervisor.stop()
    assert open(journal).read().split() == ["slow"]  # its on_stop ran to its end


@pytest.mark.parametrize("death,reason", [("segfault", "killed by SIGSEGV"), ("exit 3", "exit 3")])
def test_a_child_that_segfaults_or_exits_with_a_code_is_restarted_and_says_why(
    actor_node, death, reason, caplog
):
    spec = SupervisorSpec(
        "sup",
        SupervisorFlags("one_for_one", intensity=5),
        children=(ChildSpec("fragile", Worker, restart="transient"),),
    )
    with caplog.at_level("INFO", logger="warren.supervisor"):
        with Supervisor(actor_node, spec) as supervisor:
            before = pids(supervisor)["fragile"]
            actor_node.whereis("fragile").tell(death)
            wait_for(lambda: pids(supervisor)["fragile"] != before and all_running(supervisor))
    assert f"child fragile exited: {reason}" in caplog.text


def test_hung_children_do_not_get_their_healthy_siblings_killed(actor_node):
    spec = SupervisorSpec(
        "sup",
        SupervisorFlags("one_for_one", intensity=20),
        children=tuple(
            ChildSpec(f"w{n}", Worker, heartbeat_interval_s=0.2, heartbeat_timeout_s=2.0)
            for n in range(8)
        ),
    )
    with Supervisor(actor_node, spec) as supervisor:
        before = pids(supervisor)
        stopped = [f"w{n}" for n in range(4)]
        for name in stopped:
            os.kill(before[name], signal.SIGSTOP)
        wait_for(
            lambda: (
                all(pids(supervisor)[n] != before[n] for n in stopped) and all_running(supervisor)
            )
        )
        time.sleep(1.5)  # several more heartbeat rounds
        after = pids(supervisor)
        assert all(after[f"w{n}"] == before[f"w{n}"] for n in range(4, 8))
        assert [c["restarts"] for c in supervisor.which_children()] == [1] * 4 + [0] * 4


def test_a_child_that_stops_on_its_own_signal_while_its_tree_stops_is_not_restarted(
    actor_node, tmp_path
):
    """systemd signals every process of a node at once: children stop on their own while
    the tree's stop is still working through the others, and none may come back."""
    journal = tmp_path / "journal"
    spec = SupervisorSpec(
        "root",
        SupervisorFlags("one_for_one", intensity=5, period_s=10),
        children=(
            SupervisorSpec(
                "inner",
                SupervisorFlags("one_for_one", intensity=5, period_s=10),
                children=(ChildSpec("early", Worker, ("early", str(journal))),),
            ),
            ChildSpec("slow", Worker, ("slow", str(journal), 3.0)),
        ),
    )  # stopped first, slowly
    root = Supervisor(actor_node, spec).start()
    early = actor_node.whereis("early").pid
    stopping = threading.Thread(target=root.stop)
    stopping.start()
    try:
        wait_for(lambda: journal.exists() and "slow" in journal.read_text())
        os.kill(early, signal.SIGTERM)
    finally:
        stopping.join()
    assert journal.read_text().split() == ["slow", "early"]

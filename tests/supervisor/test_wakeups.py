"""A supervisor at rest sleeps until something is due: the next ping, the moment a child
would turn hung, a delayed restart. Nothing polls, and every deadline is still kept. Its
event thread starts at its first event, and no event is lost or left unanswered for it."""

import collections
import os
import signal
import threading
import time

import psutil
import pytest

from warren.supervisor import (
    ChildSpec,
    Supervisor,
    SupervisorError,
    SupervisorFlags,
    SupervisorSpec,
)
from warren.supervisor.chaos.faults import is_alive
from warren.supervisor.supervisor import RETRY_DELAY_S, TERMINATED_RESTART_DELAY_S

from ..waiting import wait_for
from .sample_actors import FailsToStart, FailsWhileBlocked, SlowToStop, Worker


def pid(supervisor, child_id):
    return {c["id"]: c["pid"] for c in supervisor.which_children()}[child_id]


def state(supervisor, child_id):
    return {c["id"]: c["state"] for c in supervisor.which_children()}[child_id]


def test_an_idle_supervisor_wakes_only_when_a_ping_is_due(actor_node, monkeypatch):
    beats: collections.Counter[str] = collections.Counter()
    events: list[str] = []
    beat_children, next_event = Supervisor._beat_children, Supervisor._next_event

    def counted_beat(self, now):
        beats[self.id] += 1
        return beat_children(self, now)

    def counted_event(self):
        event = next_event(self)
        events.append(f"{self.id}: {event.kind}")
        return event

    monkeypatch.setattr(Supervisor, "_beat_children", counted_beat)
    monkeypatch.setattr(Supervisor, "_next_event", counted_event)
    beating = SupervisorSpec(
        "beating",
        children=(ChildSpec("w", Worker, heartbeat_interval_s=0.5, heartbeat_timeout_s=1.2),),
    )
    quiet = SupervisorSpec(
        "quiet",
        children=(ChildSpec("q", Worker, heartbeat_interval_s=None, heartbeat_timeout_s=None),),
    )
    with Supervisor(actor_node, beating) as one, Supervisor(actor_node, quiet) as other:
        first = pid(one, "w")
        time.sleep(0.3)
        beats.clear()
        events.clear()
        started = time.monotonic()
        wait_for(lambda: beats["beating"] >= 5)  # five pings; twice the heartbeat timeout
        # one beat per ping (0.5 s apart; the first may be due at once), where a 50 ms
        # poll would have made five in a quarter of a second
        assert time.monotonic() - started >= 4 * 0.5 - 0.1, beats
        assert beats["quiet"] == 0, beats  # no heartbeat at all: never woken
        assert events == []  # no event, no timer: both event threads slept throughout
        # the pongs were read, late as they were: the child was not taken for hung
        assert pid(one, "w") == first and state(one, "w") == "running"
        assert state(other, "q") == "running"
        threads = [t.name for t in threading.enumerate()]
        assert threads.count("warren-heartbeats") == 1  # one for every supervisor
        assert not [name for name in threads if name.startswith("heartbeats ")]


def supervisor_threads(supervisor_id: str) -> list[str]:
    return [t.name for t in threading.enumerate() if t.name == f"supervisor {supervisor_id}"]


def test_a_supervisor_holds_no_thread_until_its_first_event_and_then_acts_on_it(actor_node):
    spec = SupervisorSpec(
        "resting", SupervisorFlags("one_for_one", intensity=5), (ChildSpec("w", Worker),)
    )
    with Supervisor(actor_node, spec) as supervisor:
        assert supervisor_threads("resting") == []  # started its child, nothing to act on
        before = pid(supervisor, "w")  # answered without a thread: a read under its lock
        os.kill(before, signal.SIGKILL)  # the child's exit: its first event
        wait_for(lambda: pid(supervisor, "w") != before and state(supervisor, "w") == "running")
        assert supervisor_threads("resting") == ["supervisor resting"]
    assert supervisor_threads("resting") == []  # joined at the stop


def test_a_child_that_dies_while_its_supervisor_starts_is_restarted_once_the_start_ends(
    actor_node, monkeypatch
):
    monitor = actor_node.monitor

    def dying_first(ref, notify=None):
        # the child dies as soon as it is ready, and the node has heard of it before the
        # supervisor monitors it: its Down comes at once, inside start()
        monkeypatch.setattr(actor_node, "monitor", monitor)
        actor_node.kill(ref)
        wait_for(lambda: all(alive.pid != ref.pid for alive in actor_node.actors()))
        return monitor(ref, notify)

    monkeypatch.setattr(actor_node, "monitor", dying_first)
    spec = SupervisorSpec(
        "starting", SupervisorFlags("one_for_one", intensity=5), (ChildSpec("w", Worker),)
    )
    with Supervisor(actor_node, spec) as supervisor:
        # the exit waited for the end of start(), then was acted on: not dropped as an
        # exit of a child still starting, which left it "running" under a dead pid
        wait_for(lambda: supervisor.which_children()[0]["restarts"] == 1)
        wait_for(lambda: state(supervisor, "w") == "running")
        assert is_alive(psutil.Process(pid(supervisor, "w")))


def test_a_supervisor_whose_start_fails_leaves_no_thread(actor_node):
    spec = SupervisorSpec(
        "failing",
        SupervisorFlags("one_for_one"),
        (ChildSpec("a", Worker), ChildSpec("b", FailsToStart)),
    )
    for _ in range(3):
        with pytest.raises(SupervisorError):
            Supervisor(actor_node, spec).start()  # stops "a", whose exit is its first event
    assert supervisor_threads("failing") == []


def test_a_call_made_while_its_supervisor_stops_is_answered_that_it_stopped(actor_node, tmp_path):
    began = tmp_path / "began"
    spec = SupervisorSpec(
        "stopping",
        SupervisorFlags("one_for_one", intensity=5),
        (
            ChildSpec("a", Worker),
            ChildSpec(
                "slow",
                SlowToStop,
                ("slow", str(tmp_path / "journal"), 3.0, str(began)),
                shutdown_s=10,
            ),
        ),
    )
    supervisor = Supervisor(actor_node, spec).start()
    supervisor.follow_child_spec("a", lambda: spec.children[0])  # its event thread runs
    stopper = threading.Thread(target=supervisor.stop)
    stopper.start()
    try:
        wait_for(began.exists)  # the event thread is gone; its children are being stopped
        with pytest.raises(SupervisorError, match="stopped"):
            supervisor.terminate_child("a")  # used to wait for ever
    finally:
        stopper.join()


def test_a_hung_child_is_killed_within_its_timeout_less_one_interval_and_its_timeout(
    actor_node,
):
    interval, timeout = 0.2, 1.0
    spec = SupervisorSpec(
        "sup",
        SupervisorFlags("one_for_one", intensity=5),
        children=(
            ChildSpec("sleepy", Worker, heartbeat_interval_s=interval, heartbeat_timeout_s=timeout),
        ),
    )
    with Supervisor(actor_node, spec) as supervisor:
        time.sleep(3 * interval)  # a few pings answered
        before = pid(supervisor, "sleepy")
        victim = psutil.Process(before)
        os.kill(before, signal.SIGSTOP)
        stopped = time.monotonic()
        wait_for(lambda: not is_alive(victim))
        killed_after = time.monotonic() - stopped
        # The last ping it answered went out about one interval before it stopped (two
        # when a loaded machine delayed an answer): killed a timeout after that ping, not
        # at its first missed ping.
        assert timeout - 2 * interval - 0.1 <= killed_after <= timeout + 1.0
        wait_for(
            lambda: pid(supervisor, "sleepy") != before and state(supervisor, "sleepy") == "running"
        )


def test_a_child_stopped_by_its_own_sigterm_comes_back_after_the_delay(actor_node):
    spec = SupervisorSpec(
        "sup", SupervisorFlags("one_for_one", intensity=5), children=(ChildSpec("w", Worker),)
    )
    with Supervisor(actor_node, spec) as supervisor:
        before = pid(supervisor, "w")
        os.kill(before, signal.SIGTERM)
        terminated = time.monotonic()
        wait_for(lambda: state(supervisor, "w") == "stopped")
        wait_for(lambda: pid(supervisor, "w") != before and state(supervisor, "w") == "running")
        assert time.monotonic() - terminated >= TERMINATED_RESTART_DELAY_S
        assert supervisor.which_children()[0]["restarts"] == 1


def test_a_restart_that_fails_is_retried_until_it_starts(actor_node, tmp_path):
    blocker = tmp_path / "blocker"
    spec = SupervisorSpec(
        "sup",
        SupervisorFlags("one_for_one", intensity=20, period_s=10),
        children=(ChildSpec("w", FailsWhileBlocked, (str(blocker),)),),
    )
    with Supervisor(actor_node, spec) as supervisor:
        before = pid(supervisor, "w")
        blocker.touch()
        os.kill(before, signal.SIGKILL)
        wait_for(lambda: supervisor.which_children()[0]["restarts"] >= 3)  # retried
        assert state(supervisor, "w") != "running"
        blocker.unlink()
        unblocked = time.monotonic()
        wait_for(lambda: state(supervisor, "w") == "running")
        assert time.monotonic() - unblocked <= RETRY_DELAY_S + 5  # the next retry starts it
        assert pid(supervisor, "w") != before
        assert supervisor.state == "running"

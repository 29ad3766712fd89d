"""The control channel is served before the data mailbox, and batches are bounded."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tests.actors.sample_actors import Recorder, ShortPasses
from tests.waiting import all_threads_asleep, wait_for
from warren.actors import ActorRef, Node, Pong


def test_a_heartbeat_is_answered_ahead_of_a_long_data_backlog(node: Node) -> None:
    ref = node.spawn(Recorder, max_batch=1)
    for _ in range(200):
        ref.tell(("sleep", 0.02))
    pong = ref.ping(timeout=20)
    assert isinstance(pong, Pong) and pong.pid == ref.pid
    assert pong.received < 200


def test_stats_count_what_the_actor_received(node: Node) -> None:
    ref = node.spawn(Recorder)
    ref.tell_many(["a", "b", "c"])
    ref.tell("d")
    ref.ask("seen", timeout=10)
    stats = ref.stats(timeout=10)
    assert stats["received"] == 3 and stats["asks"] == 1 and stats["dropped_stale"] == 0


def test_a_pass_that_leaves_messages_waiting_is_counted_as_backlogged(node: Node) -> None:
    keeping_up = node.spawn(Recorder)
    keeping_up.tell_many(["a", "b", "c"])
    keeping_up.ask("seen", timeout=10)
    behind = node.spawn(Recorder, max_batch=1)
    for _ in range(20):
        behind.tell(("sleep", 0.01))
    behind.ask("seen", timeout=10)  # answered after the naps, in the mailbox's order
    assert behind.stats(timeout=10)["backlogged_passes"] > 0
    assert keeping_up.stats(timeout=10)["backlogged_passes"] == 0


def test_figures_are_the_counters_the_answer_to_a_question_and_the_process_usage(
    node: Node,
) -> None:
    ref = node.spawn(Recorder)
    ref.ask("seen", timeout=10)
    counters, answer, usage = ref.figures_async("label", process=True).get(10)
    assert counters["asks"] == 1 and answer == "recorder"
    assert usage["rss_bytes"] > 0 and usage["cpu_seconds"] > 0
    counters, answer, usage = ref.figures_async(("raise", "ValueError", "no figures")).get(10)
    assert answer is None and usage is None, "what the question raised is no figures"
    assert ref.ask("label", timeout=10) == "recorder", "and the actor carries on"


def test_a_stop_request_overtakes_queued_messages(node: Node) -> None:
    ref = node.spawn(Recorder, max_batch=1)
    for _ in range(200):
        ref.tell(("sleep", 0.02))
    down = ref.stop(timeout=20)
    assert down.exitcode == 0


def test_on_idle_runs_after_the_told_messages_are_handled(node: Node) -> None:
    ref = node.spawn(Recorder)
    ref.tell_many(list(range(50)))
    ref.tell("last")
    wait_for(lambda: 51 in ref.ask("idle_marks", timeout=10))


def test_a_pass_ended_by_its_message_bound_with_nothing_behind_reaches_on_idle(
    node: Node, tmp_path: Path
) -> None:
    ref = node.spawn(Recorder, max_batch=2)
    release = tmp_path / "release"
    blocked = ref.ask_async(("block_until", str(release)))
    ref.tell("told")  # the pass's second message and its last: nothing comes after it
    release.touch()
    assert blocked.get(10) == "released"
    # on_idle is not to wait for the next message or the idle poll (5 s from the pass):
    # it has run by the time the process first sleeps after the pass
    wait_for(lambda: all_threads_asleep(ref.pid))
    assert ref.ask("idle_marks", timeout=10) == [1]


def nap_through(ref: ActorRef, labels: Iterable[object], seconds: float) -> list[object]:
    """Ask ``ref`` for a nap of ``seconds`` per label, all queued at once; the answers."""
    naps = [ref.ask_async(("nap", seconds, label)) for label in labels]
    return [nap.get(timeout=30) for nap in naps]


def idle_marks_while_busy(ref: ActorRef, naps: int) -> list[int]:
    """Where a ``ShortPasses`` ran ``on_idle`` before its last nap was handled."""
    return [mark for mark in ref.ask("idle_marks", timeout=10) if mark < naps]


def test_a_pass_bound_reaches_on_idle_while_the_mailbox_stays_busy(node: Node) -> None:
    ref = node.spawn(ShortPasses)
    assert nap_through(ref, range(100), 0.001) == list(range(100))
    marks = idle_marks_while_busy(ref, 100)
    assert len(marks) >= 20, f"on_idle ran only after {marks} of 100 naps"


def test_a_pass_ended_by_its_byte_budget_after_the_pass_bound_reaches_on_idle(
    node: Node,
) -> None:
    ref = node.spawn(ShortPasses)
    nap_through(ref, [b"x" * (9 * 2**20)] * 5, 0.002)  # over the 8 MiB a pass takes
    assert len(idle_marks_while_busy(ref, 5)) >= 3


def test_passes_ended_by_the_pass_bound_are_not_counted_as_falling_behind(
    node: Node,
) -> None:
    ref = node.spawn(ShortPasses)
    nap_through(ref, range(100), 0.001)
    assert ref.stats(timeout=10)["backlogged_passes"] == 0


def test_call_later_runs_on_the_actors_thread_after_the_delay(node: Node) -> None:
    ref = node.spawn(Recorder)
    assert ref.ask(("remind_me", 0.05, "reminder"), timeout=10) == "scheduled"
    wait_for(lambda: ref.ask("seen", timeout=10) == ["reminder"])


def test_an_actor_can_stop_another_through_its_ref(node: Node) -> None:
    stopper = node.spawn(Recorder)
    target = node.spawn(Recorder)
    down = stopper.ask(("stop_other", target), timeout=30)
    assert (down.ref, down.exitcode) == (target, 0)
    assert node.monitor(target).down == down


def test_an_alarm_reaches_on_alarm_in_order_while_the_actor_is_busy(node: Node) -> None:
    ref = node.spawn(Recorder, name="alarmed")
    ref.tell(("sleep", 0.3))
    ref.tell_many(list(range(500)))
    ref.alarm("memory", True)
    ref.alarm("memory", False)
    wait_for(lambda: ref.ask("alarms") == [["memory", True], ["memory", False]])
    assert ref.ask("seen")[-1] == 499

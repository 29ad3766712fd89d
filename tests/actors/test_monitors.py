"""Monitors and links: deaths of every kind are reported, to the node and to actors."""

from __future__ import annotations

import os
import signal

import pytest

from tests.actors.sample_actors import Recorder, Watcher
from tests.waiting import wait_for
from warren.actors import EXIT_CRASHED, EXIT_LINKED, EXIT_NORMAL, ActorDeadError, Down, Exit, Node


def test_a_monitor_reports_sigkill_with_the_signal(node: Node) -> None:
    ref = node.spawn(Recorder)
    monitor = node.monitor(ref)
    os.kill(ref.pid, signal.SIGKILL)
    down = monitor.wait(10)
    assert down == Down(ref, None, signal.SIGKILL)
    assert down.reason == "killed by SIGKILL"


def test_a_monitor_reports_a_clean_stop_as_normal(node: Node) -> None:
    ref = node.spawn(Recorder)
    monitor = node.monitor(ref)
    ref.stop(timeout=10)
    assert monitor.wait(10) == Down(ref, EXIT_NORMAL, None)


def test_a_monitor_of_a_dead_incarnation_fires_at_once_with_the_real_reason(node: Node) -> None:
    ref = node.spawn(Recorder)
    os.kill(ref.pid, signal.SIGKILL)
    node.monitor(ref).wait(10)
    late = node.monitor(ref)
    assert late.down == Down(ref, None, signal.SIGKILL)


def test_a_monitor_of_an_incarnation_the_node_never_knew_fires_at_once(node: Node) -> None:
    ref = node.spawn(Recorder)
    import dataclasses

    ghost = dataclasses.replace(ref, incarnation=ref.incarnation + 7)
    down = node.monitor(ghost).down
    assert down is not None and down.reason == "no such process"


def test_a_monitor_callback_receives_the_down(node: Node) -> None:
    ref = node.spawn(Recorder)
    received: list[Down] = []
    node.monitor(ref, notify=received.append)
    os.kill(ref.pid, signal.SIGKILL)
    wait_for(lambda: received)
    assert received[0].signal == signal.SIGKILL


def test_a_cancelled_monitor_does_not_call_back(node: Node) -> None:
    ref = node.spawn(Recorder)
    received: list[Down] = []
    monitor = node.monitor(ref, notify=received.append)
    node.demonitor(monitor)
    watched = node.monitor(ref)
    os.kill(ref.pid, signal.SIGKILL)
    watched.wait(10)
    assert received == []


def test_an_actor_that_monitors_receives_down_as_a_message(node: Node) -> None:
    watcher = node.spawn(Watcher)
    target = node.spawn(Recorder)
    assert watcher.ask(("monitor", target), timeout=10) == "monitoring"
    os.kill(target.pid, signal.SIGKILL)
    wait_for(lambda: watcher.ask("downs", timeout=10))
    assert watcher.ask("downs", timeout=10) == [Down(target, None, signal.SIGKILL)]


def test_an_actor_finds_and_monitors_named_actors_in_one_request(node: Node) -> None:
    watcher = node.spawn(Watcher)
    first = node.spawn(Recorder, name="first")
    second = node.spawn(Recorder, name="second")
    found = watcher.ask(("monitor_named", ["first", "nobody", "second"]), timeout=10)
    assert found == [first, None, second]
    os.kill(second.pid, signal.SIGKILL)
    wait_for(lambda: watcher.ask("downs", timeout=10))
    assert watcher.ask("downs", timeout=10) == [Down(second, None, signal.SIGKILL)]
    first.stop(timeout=10)
    wait_for(lambda: len(watcher.ask("downs", timeout=10)) == 2)
    assert watcher.ask("downs", timeout=10)[1] == Down(first, EXIT_NORMAL, None)


def test_an_actor_asks_the_node_to_find_and_monitor_named_actors_and_works_meanwhile(
    node: Node,
) -> None:
    # Given an actor and two named ones
    watcher = node.spawn(Watcher)
    first = node.spawn(Recorder, name="first")
    second = node.spawn(Recorder, name="second")
    # When it sends the request, asks one of them something, then takes the node's answer
    answered, found = watcher.ask(
        ("monitor_named_async", ["first", "nobody", "second"], first, "label"), timeout=20
    )
    # Then it got both answers, the refs as monitor_named gives them, and monitors them
    assert answered == "recorder"
    assert found == [first, None, second]
    os.kill(second.pid, signal.SIGKILL)
    wait_for(lambda: watcher.ask("downs", timeout=10))
    assert watcher.ask("downs", timeout=10) == [Down(second, None, signal.SIGKILL)]


def test_an_actor_that_monitored_a_dead_actor_knows_it_is_dead(node: Node) -> None:
    watcher = node.spawn(Watcher)
    target = node.spawn(Recorder)
    watcher.ask(("monitor", target), timeout=10)
    os.kill(target.pid, signal.SIGKILL)
    wait_for(lambda: watcher.ask("downs", timeout=10))
    with pytest.raises(ActorDeadError):
        watcher.ask(("ask_other", target, "label"), timeout=20)


def test_a_linked_actor_dies_with_its_partner(node: Node) -> None:
    first = node.spawn(Recorder)
    second = node.spawn(Recorder)
    second_down = node.monitor(second)
    first.ask(("link", second), timeout=10)
    first.tell(("crash",))
    down = second_down.wait(10)
    assert down is not None and down.exitcode == EXIT_LINKED


def test_a_clean_stop_does_not_take_linked_actors_with_it(node: Node) -> None:
    first = node.spawn(Recorder)
    second = node.spawn(Recorder)
    node.link(first, second)
    first.stop(timeout=10)
    assert second.ask("label", timeout=10) == "recorder"


def test_an_actor_that_traps_exits_receives_exit_and_lives_on(node: Node) -> None:
    trapper = node.spawn(Watcher)
    doomed = node.spawn(Recorder)
    node.link(trapper, doomed)
    doomed.tell(("crash",))
    wait_for(lambda: trapper.ask("downs", timeout=10))
    assert trapper.ask("downs", timeout=10) == [Exit(doomed, EXIT_CRASHED, None)]

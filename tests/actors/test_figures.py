"""An actor's published figures: the answer to a node's figures question that its loop
keeps in a file for the node to read without asking, withheld while it may be stale
(handled since, a loop stopped, a torn write, another incarnation's file)."""

from __future__ import annotations

import os
import time

import msgpack
import psutil
import zmq

from tests.actors.sample_actors import Recorder
from tests.waiting import wait_for
from warren.actors import Node
from warren.actors._runtime import runtime
from warren.actors.figures import (
    HEADER,
    LIVE_S,
    SLOT_BYTES,
    FiguresSlot,
    SlotReader,
    slot_path,
)

USAGE = {"cpu_seconds": 0.5, "rss_bytes": 4096}


def usage() -> dict[str, float]:
    return dict(USAGE)


def make_slot(runtime_dir: str, incarnation: int = 1, pid: int = 4242) -> tuple[str, FiguresSlot]:
    control = f"ipc://{runtime_dir}/0123456789abcdef.ctl"
    slot = FiguresSlot.create(control, incarnation, pid)
    assert slot is not None
    return control, slot


def test_an_answer_published_is_read_back_whole_with_its_sequence(runtime_dir: str) -> None:
    control, slot = make_slot(runtime_dir)
    reader = SlotReader()
    slot.stamp(time.monotonic())
    assert reader.read(control, 4242, 1, time.monotonic()) is None, "nothing published yet"
    assert slot.publish({"received": 3}, {"messages_ready": 2}, usage)
    seq, answer = reader.read(control, 4242, 1, time.monotonic())
    assert answer == [{"received": 3}, {"messages_ready": 2}, USAGE]
    assert reader.read(control, 4242, 1, time.monotonic()) == (seq, answer)
    assert slot.publish({"received": 3}, {"messages_ready": 2}, usage)
    assert reader.read(control, 4242, 1, time.monotonic())[0] == seq, "unchanged: no new seq"
    assert slot.publish({"received": 4}, {"messages_ready": 3}, usage)
    newer, answer = reader.read(control, 4242, 1, time.monotonic())
    assert newer > seq and answer[1] == {"messages_ready": 3}
    reader.close()
    slot.close()
    assert not os.path.exists(slot_path(control))


def test_a_dirty_slot_or_a_loop_that_stopped_turning_is_not_read(runtime_dir: str) -> None:
    control, slot = make_slot(runtime_dir)
    reader = SlotReader()
    turned_at = time.monotonic()
    slot.stamp(turned_at)
    slot.publish({"received": 1}, None, usage)
    slot.mark_dirty()
    assert reader.read(control, 4242, 1, turned_at) is None
    slot.mark_clean()
    assert reader.read(control, 4242, 1, turned_at) is not None
    assert reader.read(control, 4242, 1, turned_at + LIVE_S + 1) is None
    reader.close()
    slot.close()


def test_a_torn_answer_fails_its_check_and_is_not_read(runtime_dir: str) -> None:
    control, slot = make_slot(runtime_dir)
    reader = SlotReader()
    slot.stamp(time.monotonic())
    slot.publish({"received": 1}, {"depth": 7}, usage)
    with open(slot_path(control), "r+b") as figures:
        figures.seek(HEADER.size + 3)
        byte = figures.read(1)
        figures.seek(HEADER.size + 3)
        figures.write(bytes([byte[0] ^ 0xFF]))
    assert reader.read(control, 4242, 1, time.monotonic()) is None
    reader.close()
    slot.close()


def test_another_incarnations_file_is_not_read_and_its_successors_is(runtime_dir: str) -> None:
    control, first = make_slot(runtime_dir, incarnation=1, pid=100)
    reader = SlotReader()
    first.stamp(time.monotonic())
    first.publish({"received": 9}, None, usage)
    assert reader.read(control, 100, 1, time.monotonic()) is not None
    assert reader.read(control, 101, 2, time.monotonic()) is None, "the successor is not there"
    _, second = make_slot(runtime_dir, incarnation=2, pid=101)
    second.stamp(time.monotonic())
    second.publish({"received": 1}, None, usage)
    _, answer = reader.read(control, 101, 2, time.monotonic())
    assert answer[0] == {"received": 1}
    first.close()  # the path is the successor's now: left alone
    assert os.path.exists(slot_path(control))
    assert reader.read(control, 100, 1, time.monotonic()) is None
    reader.close()
    second.close()


def test_an_answer_too_large_for_the_file_is_not_published(runtime_dir: str) -> None:
    control, slot = make_slot(runtime_dir)
    reader = SlotReader()
    slot.stamp(time.monotonic())
    assert not slot.publish({}, {"blob": "x" * SLOT_BYTES}, usage)
    assert reader.read(control, 4242, 1, time.monotonic()) is None
    assert not slot.publish({}, {"not msgpack": object()}, usage)
    assert reader.read(control, 4242, 1, time.monotonic()) is None
    reader.close()
    slot.close()


def test_a_tcp_endpoint_has_no_figures_file() -> None:
    assert slot_path("tcp://127.0.0.1:5000") is None
    assert FiguresSlot.create("tcp://127.0.0.1:5000", 1, os.getpid()) is None


def test_an_actor_asked_once_publishes_its_answer_and_withholds_it_while_it_changes(
    node: Node,
) -> None:
    ref = node.spawn(Recorder)
    reader = SlotReader()

    def published() -> tuple[int, list] | None:
        return reader.read(ref.control, ref.pid, ref.incarnation, time.monotonic())

    assert published() is None, "nothing before the first request"
    counters, answer, _ = ref.figures_async("seen", process=True).get(10)
    seq, figures = published()
    assert figures[:2] == [counters, answer] == [counters, []]
    assert figures[2]["rss_bytes"] > 0
    ref.tell("first")
    ref.ask("label", timeout=10)
    wait_for(lambda: (published() or (0, None))[0] > seq)  # once it has gone quiet
    seq, figures = published()
    assert figures[1] == ["first"] and figures[0]["received"] == counters["received"] + 2
    reader.close()


def test_a_control_frame_of_no_known_kind_marks_the_figures_stale_and_the_actor_goes_on(
    node: Node,
) -> None:
    ref = node.spawn(Recorder)
    reader = SlotReader()
    ref.figures_async("seen").get(10)
    assert reader.read(ref.control, ref.pid, ref.incarnation, time.monotonic()) is not None
    fuzzer = runtime().context.socket(zmq.DEALER)
    try:
        fuzzer.linger = 0
        fuzzer.connect(ref.control)
        for kind in ([1], {"a": 1}, "ping", 99):
            fuzzer.send(msgpack.packb([kind, 0, 0, None]))
        wait_for(lambda: ref.stats(timeout=10)["malformed"] == 4)
    finally:
        fuzzer.close()
    assert ref.ping(timeout=10).incarnation == ref.incarnation
    wait_for(lambda: reader.read(ref.control, ref.pid, ref.incarnation, time.monotonic()))
    _, figures = reader.read(ref.control, ref.pid, ref.incarnation, time.monotonic())
    assert figures[0]["malformed"] == 4, "published again with what it counted"
    reader.close()


def test_an_idle_actor_sleeps_past_live_s_and_is_still_read_without_being_asked(
    node: Node,
) -> None:
    ref = node.spawn(Recorder)  # no supervisor: nothing pings it
    reader = SlotReader()
    ref.figures_async("seen").get(10)
    wait_for(lambda: reader.read(ref.control, ref.pid, ref.incarnation, time.monotonic()))
    main_thread = psutil.Process(ref.pid)
    woken = main_thread.num_ctx_switches().voluntary
    time.sleep(LIVE_S + 1)  # idle: its loop sleeps until its next check, five seconds on
    # it woke once a second before it slept this long (and stamped each turn)
    assert main_thread.num_ctx_switches().voluntary - woken <= 1
    # asleep, it stamped when it will have turned by: read, not asked
    assert reader.read(ref.control, ref.pid, ref.incarnation, time.monotonic()) is not None
    reader.close()

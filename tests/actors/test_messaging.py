"""tell, ask, ask_async and batches between processes, over ipc and over tcp."""

from __future__ import annotations

import pytest

from tests.actors.sample_actors import Point, Put, Recorder, Relay
from warren.actors import AskTimeout, Node, RemoteError


def test_a_told_message_is_seen_by_a_later_ask(node: Node, transport: str) -> None:
    ref = node.spawn(Recorder, transport=transport)
    ref.tell("hello")
    ref.tell({"n": 1})
    assert ref.ask("seen", timeout=10) == ["hello", {"n": 1}]


def test_tcp_actors_bind_to_loopback_by_default(node: Node) -> None:
    ref = node.spawn(Recorder, transport="tcp")
    assert ref.address.startswith("tcp://127.0.0.1:")


def test_an_ask_returns_the_actors_answer(node: Node, transport: str) -> None:
    ref = node.spawn(Recorder, "labelled", transport=transport)
    assert ref.ask("label", timeout=10) == "labelled"
    assert ref.ask(Point(1, 2), timeout=10) == Point(2, 1)


def test_ask_async_returns_a_future_that_any_thread_can_resolve(node: Node, transport: str) -> None:
    import threading

    ref = node.spawn(Recorder, "async", transport=transport)
    futures = [ref.ask_async(i) for i in range(5)]
    results: list[object] = []
    reader = threading.Thread(target=lambda: results.extend(f.get(10) for f in futures))
    reader.start()
    reader.join(20)
    assert results == [0, 1, 2, 3, 4]
    assert futures[0].get(10) == 0


def test_tell_many_arrives_as_one_batch_in_order(node: Node, transport: str) -> None:
    ref = node.spawn(Recorder, transport=transport)
    ref.tell_many(list(range(100)))
    assert ref.ask("seen", timeout=10) == list(range(100))
    assert ref.ask("batch_sizes", timeout=10) == [100]


def test_a_handler_sees_whether_more_messages_wait_behind_its_own(
    node: Node, transport: str
) -> None:
    ref = node.spawn(Recorder, transport=transport)
    assert ref.ask("mailbox_empty", timeout=10) is True
    first = ref.ask_async(("wait_for_more", 10))
    last = ref.ask_async("mailbox_empty")
    assert first.get(20) == "more waits"
    assert last.get(20) is True  # the pass's last: its on_idle comes next


def test_an_exception_in_an_ask_reaches_the_caller_and_the_actor_carries_on(
    node: Node, transport: str
) -> None:
    ref = node.spawn(Recorder, transport=transport)
    with pytest.raises(ValueError, match="bad input") as raised:
        ref.ask(("raise", "ValueError", "bad input"), timeout=10)
    assert isinstance(raised.value, RemoteError)
    assert raised.value.type_name == "ValueError"
    assert "bad input" in raised.value.remote_traceback
    assert ref.ask("label", timeout=10) == "recorder"


def test_an_exception_of_a_user_type_arrives_as_remote_error_with_its_name(node: Node) -> None:
    ref = node.spawn(Recorder)
    with pytest.raises(RemoteError, match="RuntimeError: something"):
        ref.ask(("raise", "Custom", "something"), timeout=10)


def test_an_ask_that_is_not_answered_in_time_raises_ask_timeout(node: Node) -> None:
    ref = node.spawn(Recorder)
    with pytest.raises(AskTimeout):
        ref.ask(("sleep", 0.6), timeout=0.2)
    assert ref.ask("label", timeout=10) == "recorder"


def test_a_late_answer_to_a_timed_out_ask_is_dropped_not_returned_to_the_next(node: Node) -> None:
    ref = node.spawn(Recorder)
    with pytest.raises(AskTimeout):
        ref.ask(("sleep", 0.5), timeout=0.1)
    assert ref.ask("label", timeout=10) == "recorder"


def test_large_bodies_round_trip_intact(node: Node, transport: str) -> None:
    ref = node.spawn(Recorder, transport=transport)
    body = bytes(range(256)) * 8192
    assert ref.ask(Put("big", body), timeout=10) == len(body)
    assert ref.ask(("get", "big"), timeout=10) == body


def test_refs_travel_inside_messages_and_the_receiver_can_use_them(
    node: Node, transport: str
) -> None:
    first = node.spawn(Recorder, "first", transport=transport)
    second = node.spawn(Recorder, "second", transport=transport)
    assert first.ask(("ask_other", second, "label"), timeout=10) == "second"
    assert first.ask(("tell_other", second, "note"), timeout=10) == "told"
    assert second.ask("seen", timeout=10) == ["note"]
    assert first.ask("ref", timeout=10) == first


def test_an_answer_that_cannot_be_encoded_becomes_a_codec_error_for_the_caller(node: Node) -> None:
    ref = node.spawn(Recorder)
    with pytest.raises(RemoteError, match="CodecError"):
        ref.ask("unanswerable", timeout=10)


def test_an_actor_can_answer_an_ask_later_from_another_thread(node: Node) -> None:
    ref = node.spawn(Recorder)
    assert ref.ask("later", timeout=10) == "from another thread"


INTRUDER = """
import sys, zmq
from warren.actors import wire
from warren.actors.codec import Encoder
socket = zmq.Context().socket(zmq.DEALER)
socket.linger = 0
socket.connect(sys.argv[1])
socket.send_multipart(Encoder().encode([wire.TELL, 0, 0, "intruder"]))
socket.send_multipart(Encoder().encode([wire.ASK, 0, 1, "seen"]))
print("answered" if socket.poll(3000) else "silent", flush=True)
"""


@pytest.mark.parametrize("curve", [False, True])
def test_a_curve_node_keeps_its_tcp_actors_from_other_processes(
    runtime_dir: str, curve: bool
) -> None:
    import subprocess
    import sys

    from tests.actors.conftest import PRELOAD

    with Node("guarded", runtime_dir=runtime_dir, preload=PRELOAD, curve=curve) as node:
        ref = node.spawn(Recorder, transport="tcp")
        ref.tell("from the node")
        outsider = subprocess.run(
            [sys.executable, "-c", INTRUDER, ref.address],
            capture_output=True,
            text=True,
            timeout=60,
        )
        seen = ref.ask("seen", timeout=10)
    if curve:
        assert outsider.stdout.strip() == "silent"
        assert seen == ["from the node"]
    else:  # what curve=True prevents
        assert outsider.stdout.strip() == "answered"
        assert seen == ["from the node", "intruder"]


def test_an_actor_answers_from_an_awaited_answer_as_it_comes_and_serves_meanwhile(
    node: Node,
) -> None:
    relay = node.spawn(Relay, "relay")
    peer = node.spawn(Recorder, "peer")
    assert relay.ask(("relay", peer, "label"), timeout=10) == ["relayed", "peer"]
    # the peer answers only when told to: the relay serves meanwhile, and is woken by it
    never = node.spawn(Recorder, "never")
    pending = relay.ask_async(("relay", never, ("defer",)))
    assert relay.ask("label", timeout=10) == "relay"
    assert not pending.arrived()
    answered = relay.ask_async(("relay", peer, "later"))
    assert answered.get(10) == ["relayed", "from another thread"]

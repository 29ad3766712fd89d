"""Hostile and mistaken input: clear errors or counted drops, never a dead or hung actor."""

from __future__ import annotations

import array
import contextlib
import fcntl
import os
import pickle
import random
import termios
import threading
from collections.abc import Iterator
from pathlib import Path

import msgpack
import psutil
import pytest
import zmq

from tests.actors.sample_actors import Mute, NeverRegistered, Put, Recorder, SmallMailbox, Span
from tests.waiting import the_spare, wait_for
from warren.actors import (
    ActorDeadError,
    CodecError,
    FrameTooLarge,
    MailboxFull,
    Node,
    RemoteError,
    UnhandledMessage,
    _forkserver,
    codec,
    register_message,
    wire,
)
from warren.actors._runtime import runtime


def _fuzz_frames(rng: random.Random) -> list[list[bytes]]:
    samples: list[list[bytes]] = [
        [b""],
        [b"\xc1"],
        [b"\x00" * 3],
        [msgpack.packb([2, 0, "id", "x"])],
        [msgpack.packb([3, 0, 0, "not a list"])],
        [msgpack.packb([99, 0, 0, None])],
        [msgpack.packb([1, 0, 0, msgpack.ExtType(3, b"\0\0\0\7")])],
        [msgpack.packb([1, 0, 0, msgpack.ExtType(2, b"\x91\x01")])],
        [msgpack.packb({"a": 1})],
        [msgpack.packb([1, 0, 0])],
    ]
    samples += [
        [rng.randbytes(rng.randrange(1, 64)) for _ in range(rng.randrange(1, 4))]
        for _ in range(300)
    ]
    return samples


@pytest.mark.parametrize("channel", ["address", "control"])
def test_random_frames_leave_the_actor_alive_and_answering(node: Node, channel: str) -> None:
    ref = node.spawn(Recorder)
    fuzzer = runtime().context.socket(zmq.DEALER)
    try:
        fuzzer.linger = 0
        fuzzer.connect(getattr(ref, channel))
        for frames in _fuzz_frames(random.Random(1234)):
            fuzzer.send_multipart(frames)
        ref.tell("still here")
        assert ref.ask("seen", timeout=20) == ["still here"]
        wait_for(lambda: ref.stats(timeout=10)["malformed"] > 0)
        assert ref.ping(timeout=10).incarnation == ref.incarnation
    finally:
        fuzzer.close()


def test_a_message_of_a_type_the_actor_does_not_know_gets_a_clear_error(node: Node) -> None:
    ref = node.spawn(Recorder)
    register_message(NeverRegistered)  # registered here, after the actor's process forked
    with pytest.raises(RemoteError, match="CodecError"):
        ref.ask(NeverRegistered(1), timeout=10)
    ref.tell(NeverRegistered(2))
    ref.tell_many(["kept", NeverRegistered(3)])
    assert ref.ask("seen", timeout=10) == ["kept"]
    assert ref.stats(timeout=10)["unknown_type"] == 3


def test_an_unencodable_message_is_refused_before_it_leaves(node: Node) -> None:
    ref = node.spawn(Recorder)
    with pytest.raises(CodecError):
        ref.tell(object())


def test_an_oversized_message_is_refused_with_a_clear_error(node: Node) -> None:
    ref = node.spawn(Recorder)
    from warren.actors import wire

    with pytest.raises(FrameTooLarge):
        ref.tell(b"x" * (wire.MAX_MESSAGE_BYTES + 1))
    assert ref.ask("label", timeout=10) == "recorder"


def test_a_message_over_the_actors_own_limit_gets_an_error_answer(node: Node) -> None:
    ref = node.spawn(SmallMailbox)
    with pytest.raises(FrameTooLarge):
        ref.ask(b"x" * 100_000, timeout=10)
    assert ref.stats(timeout=10)["oversized"] == 1
    assert ref.ask("label", timeout=10) == "recorder"


def test_a_full_mailbox_pushes_back_on_the_sender_and_loses_nothing(node: Node, tmp_path) -> None:
    release = tmp_path / "release"
    ref = node.spawn(Recorder, mailbox_size=20)
    blocked = ref.ask_async(("block_until", str(release)))
    accepted = 0
    with pytest.raises(MailboxFull):
        for accepted in range(100_000):
            ref.tell(accepted, timeout=0.2)
    release.write_text("go")
    assert blocked.get(timeout=20) == "released"
    assert ref.ask("seen", timeout=20) == list(range(accepted))


def test_a_tell_to_a_dead_pinned_ref_raises_in_a_process_that_saw_the_death(node: Node) -> None:
    ref = node.spawn(Recorder).pin()
    ref.stop(timeout=10)
    with pytest.raises(ActorDeadError):
        ref.tell("anyone there?")


def test_random_frames_at_the_node_service_leave_it_spawning_and_watching(node: Node) -> None:
    fuzzer = runtime().context.socket(zmq.DEALER)
    try:
        fuzzer.linger = 0
        fuzzer.connect(node.endpoint)
        for frames in _fuzz_frames(random.Random(99)):
            fuzzer.send_multipart(frames)
        fuzzer.send_multipart([msgpack.packb([20, 0, ["token", "x", "y", "pid"]])])
        ref = node.spawn(Recorder)
        wait_for(lambda: node.counters["malformed"] > 0)
        assert ref.ask("label", timeout=10) == "recorder"
        assert node.monitor(ref).down is None
    finally:
        fuzzer.close()


def test_a_tell_the_actor_does_not_handle_is_counted_and_the_rest_of_the_batch_handled(
    node: Node,
) -> None:
    ref = node.spawn(Recorder)
    ref.tell_many(["before", ("refuse", "not for me"), "after"])
    ref.tell(("refuse", "nor this"))
    assert ref.ask("seen", timeout=10) == ["before", "after"]
    assert ref.stats(timeout=10)["unhandled"] == 2
    assert ref.ping(timeout=10).incarnation == ref.incarnation


def test_an_ask_the_actor_does_not_handle_gets_that_error(node: Node) -> None:
    ref = node.spawn(Recorder)
    with pytest.raises(UnhandledMessage, match="not for me"):
        ref.ask(("refuse", "not for me"), timeout=10)
    assert ref.ping(timeout=10).incarnation == ref.incarnation


def test_a_request_that_needs_an_answer_sent_by_tell_is_counted_not_a_crash(node: Node) -> None:
    ref = node.spawn(Recorder)
    ref.tell(("defer",))
    wait_for(lambda: ref.stats(timeout=10)["unhandled"] == 1)
    assert ref.ping(timeout=10).incarnation == ref.incarnation


def test_an_exception_after_defer_reply_reaches_the_caller(node: Node) -> None:
    ref = node.spawn(Recorder)
    with pytest.raises(ValueError, match="broke after deferring"):
        ref.ask(("defer_then_raise", "broke after deferring"), timeout=10)


@contextlib.contextmanager
def raw_sender(ref) -> Iterator[zmq.Socket]:
    """A bare DEALER to ``ref``'s mailbox, for frames no ref would send."""
    sender = runtime().context.socket(zmq.DEALER)
    sender.linger = 0
    try:
        sender.connect(ref.address)
        yield sender
    finally:
        sender.close()


def raw_message(kind: int, cls: type, *values) -> bytes:
    """A message of the registered type ``cls`` with exactly these field values."""
    body = [msgpack.ExtType(1, codec._names_by_type[cls].encode()), *values]
    return msgpack.packb([kind, 0, 7, body])


def error_answer(sender: zmq.Socket) -> list:
    assert sender.poll(10_000), "no answer to a malformed ask"
    kind, request_id, error = msgpack.unpackb(sender.recv())
    assert (kind, request_id) == (wire.REPLY_ERROR, 7)
    return error


def test_a_message_with_the_wrong_number_of_fields_gets_an_error_naming_them(node: Node) -> None:
    ref = node.spawn(Recorder)
    with raw_sender(ref) as sender:
        sender.send(raw_message(wire.ASK, Put, "k"))
        type_name, text, _ = error_answer(sender)
        assert type_name == "CodecError" and "takes 2 fields, the message carried 1" in text
        sender.send(raw_message(wire.TELL, Put, "k"))
        wait_for(lambda: ref.stats(timeout=10)["malformed"] == 2)
    assert ref.ping(timeout=10).incarnation == ref.incarnation


def test_a_message_whose_constructor_refuses_its_fields_gets_an_error_naming_the_type(
    node: Node,
) -> None:
    ref = node.spawn(Recorder)
    with raw_sender(ref) as sender:
        sender.send(raw_message(wire.ASK, Span, 5, 1))
        type_name, text, _ = error_answer(sender)
        assert type_name == "CodecError"
        assert "Span" in text and "low 5 is above high 1" in text
        sender.send(raw_message(wire.TELL, Span, 5, 1))
        wait_for(lambda: ref.stats(timeout=10)["malformed"] == 2)
    assert ref.ask(Span(1, 5), timeout=10) == 4


def test_an_actor_that_handles_nothing_refuses_an_ask_and_counts_a_tell(node: Node) -> None:
    ref = node.spawn(Mute)
    with pytest.raises(UnhandledMessage, match="Mute does not handle a str"):
        ref.ask("anything", timeout=10)
    ref.tell("anything")
    wait_for(lambda: ref.stats(timeout=10)["unhandled"] == 1)
    assert ref.ping(timeout=10).incarnation == ref.incarnation


class _Plants:
    """Unpickled, it would create the file its path names: what a forged order could do."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_spawn_order_without_the_nodes_signature_is_never_unpickled(node: Node, tmp_path) -> None:
    import pickle
    import time

    from warren.actors import _forkserver

    planted = tmp_path / "planted"
    order = pickle.dumps(_Plants(str(planted)))
    endpoint = node.endpoint.encode()
    forged = (
        _forkserver.SPAWN_HEAD.pack(99, len(endpoint))
        + endpoint
        + bytes(_forkserver.SIGNATURE_BYTES)
        + order
    )
    node._forkserver._send(_forkserver.SPAWN, forged)
    time.sleep(1.0)  # what is not to happen: a child forked for it would have unpickled it
    assert not planted.exists()
    # The server refused that one and goes on: the node still spawns.
    assert node.spawn(Recorder, "after").ask("label", timeout=10) == "after"


class MakesADirectory:
    """Unpickled, it makes a directory: a mark that a spare ran what it was given."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple:
        return (os.mkdir, (self.path,))


def _pipes(pid: int) -> dict[str, str]:
    """The pipes process ``pid`` holds beside its standard streams: descriptor by pipe."""
    found = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(FileNotFoundError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if int(fd) > 2 and target.startswith("pipe:"):
                found[target] = fd
    return found


def _order_pipe(node: Node, spare: psutil.Process) -> int:
    """A descriptor that writes to ``spare``'s order pipe, as any process of the user can
    open it: the one pipe the spare shares with its forkserver (which writes to it)."""
    server = _pipes(node.forkserver_pid)
    (fd,) = [fd for pipe, fd in _pipes(spare.pid).items() if pipe in server]
    return os.open(f"/proc/{spare.pid}/fd/{fd}", os.O_WRONLY)


def _stray_orders(node: Node, marker: str) -> dict[str, bytes]:
    endpoint = node.endpoint.encode()
    pickled = pickle.dumps(MakesADirectory(marker))
    unsigned = _forkserver.SPAWN_HEAD.pack(7, len(endpoint)) + endpoint + b"\0" * 32 + pickled
    return {
        "garbage": b"\xff" * 64,
        "cut short": _forkserver.ORDER_LENGTH.pack(1000) + unsigned[:10],
        "not signed": _forkserver.ORDER_LENGTH.pack(len(unsigned)) + unsigned,
    }


STRAY_ORDERS = ["garbage", "cut short", "not signed"]


@pytest.mark.parametrize("stray", STRAY_ORDERS)
def test_a_spare_refuses_a_stray_order_runs_nothing_and_spawns_go_on(
    node: Node, tmp_path: Path, stray: str
) -> None:
    first = node.spawn(Recorder, name="first")
    down = node.monitor(first)
    spare = the_spare(node.forkserver_pid)
    marker = str(tmp_path / "ran")
    pipe = _order_pipe(node, spare)
    try:
        os.write(pipe, _stray_orders(node, marker)[stray])
    finally:
        os.close(pipe)
    gone, alive = psutil.wait_procs([spare], timeout=30)
    assert alive == []
    assert not os.path.exists(marker)
    second = node.spawn(Recorder, name="second")  # forked at once, then a new spare
    assert second.ask("pid", timeout=10) == second.pid != spare.pid
    third = node.spawn(Recorder, name="third")
    assert third.ask("pid", timeout=10) == third.pid
    assert sorted(r.name for r in node.actors()) == ["first", "second", "third"]
    assert down.down is None  # the spare's end is nobody's Down


@pytest.mark.parametrize("stray", STRAY_ORDERS)
def test_a_stray_order_ahead_of_the_nodes_order_costs_no_spawn(
    node: Node, tmp_path: Path, stray: str
) -> None:
    # The spare is stopped: the stray bytes and the node's order both wait in its pipe,
    # the one ahead of the other; the spare, let go, refuses what it reads, and the
    # order handed to it is forked afresh.
    node.spawn(Recorder, name="first")
    spare = the_spare(node.forkserver_pid)
    marker = str(tmp_path / "ran")
    stray_bytes = _stray_orders(node, marker)[stray]
    pipe = _order_pipe(node, spare)
    spawned: list = []
    try:
        spare.suspend()
        wait_for(lambda: spare.status() == psutil.STATUS_STOPPED)
        os.write(pipe, stray_bytes)
        spawning = threading.Thread(
            target=lambda: spawned.append(node.spawn(Recorder, name="second")), daemon=True
        )
        spawning.start()
        wait_for(lambda: _unread(pipe) > len(stray_bytes))  # the node's order is behind
    finally:
        spare.resume()
        os.close(pipe)
    spawning.join(60)
    (second,) = spawned
    assert second.ask("pid", timeout=10) == second.pid != spare.pid
    gone, alive = psutil.wait_procs([spare], timeout=30)
    assert alive == []
    assert not os.path.exists(marker)
    assert sorted(r.name for r in node.actors()) == ["first", "second"]


def _unread(pipe: int) -> int:
    """How many bytes wait in the pipe ``pipe`` writes to."""
    unread = array.array("i", [0])
    fcntl.ioctl(pipe, termios.FIONREAD, unread)
    return unread[0]

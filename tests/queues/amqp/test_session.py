"""One connection's protocol, driven by a real client (pika) over a real socket, and by
hand-made frames where a client would never send them.

No node runs here: ``sessions.serving`` serves each connection with a ``Session`` in a
thread, and a recording handler stands for the translator to Warren's processes."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field

import pamqp.base
import pamqp.commands as commands
import pika
import pika.exceptions
import pika.frame
import pika.spec
import pytest
from pamqp import encode

from warren.queues.amqp import frames
from warren.queues.amqp.frames import AmqpError, Frame
from warren.queues.amqp.session import FINISHED, OPEN, Session

from .sessions import guest_only, serving, start_ok


def _parameters(port: int, **options: object) -> pika.ConnectionParameters:
    options.setdefault("credentials", pika.PlainCredentials("guest", "guest"))
    return pika.ConnectionParameters("127.0.0.1", port, **options)


def test_pika_connects_opens_channels_and_closes_cleanly() -> None:
    with serving(version="9.9.9") as served:
        connection = pika.BlockingConnection(_parameters(served.port, heartbeat=30))
        server_properties = connection._impl.server_properties
        assert server_properties["product"] == "Warren"
        assert server_properties["version"] == "9.9.9"  # what its owner said
        assert server_properties["capabilities"]["publisher_confirms"] is True
        channels = [connection.channel() for _ in range(3)]
        channels[1].close()
        (session,) = served.sessions
        assert session.user == "guest" and session.state == OPEN
        assert session.channels == {channels[0].channel_number, channels[2].channel_number}
        assert session.heartbeat_s == 30 and session.frame_max == 131072
        connection.close()
        assert session.state == FINISHED


def test_a_wrong_password_is_refused_with_access_refused() -> None:
    with serving() as served:
        with pytest.raises(pika.exceptions.ProbableAuthenticationError, match="ACCESS_REFUSED"):
            pika.BlockingConnection(
                _parameters(served.port, credentials=pika.PlainCredentials("guest", "nope"))
            )
        assert served.sessions[0].user is None


def test_another_virtual_host_is_refused_with_not_allowed() -> None:
    with serving() as served:
        with pytest.raises(pika.exceptions.ProbableAccessDeniedError, match="530.*billing"):
            pika.BlockingConnection(_parameters(served.port, virtual_host="billing"))


def test_a_client_may_lower_channel_max_and_frame_max_but_not_raise_them() -> None:
    with serving(channel_max=10, frame_max=8192) as served:
        connection = pika.BlockingConnection(_parameters(served.port, channel_max=4))
        assert served.sessions[0].channel_max == 4 and served.sessions[0].frame_max == 8192
        connection.close()
    session = _tuned_session()
    session.receive(_method(0, commands.Connection.TuneOk(3000, 4096, 0)))
    assert _closed_with(session) == frames.NOT_ALLOWED
    session = _tuned_session()
    session.receive(_method(0, commands.Connection.TuneOk(10, 2048, 0)))
    assert _closed_with(session) == frames.NOT_ALLOWED


@dataclass
class Recording:
    """A handler that keeps what reaches it, and refuses queues named ``missing``."""

    contents: list[tuple[int, str, bytes, bytes]] = field(default_factory=list)
    closed: list[int] = field(default_factory=list)
    closing: list = field(default_factory=list)
    hold_close: bool = False

    def method(self, channel: int, method: Frame) -> None:
        decoded = frames.decode_method(method)
        if isinstance(decoded, commands.Queue.Declare) and decoded.queue == "missing":
            raise AmqpError(frames.NOT_FOUND, "NOT_FOUND - no queue 'missing'", 50, 10)
        raise AmqpError(frames.NOT_IMPLEMENTED, "NOT_IMPLEMENTED", *frames.ids_of(decoded))

    def content(
        self, channel: int, publish: Frame, header: frames.ContentHeader, body: bytes
    ) -> None:
        routing_key = frames.decode_publish(publish.payload).routing_key
        self.contents.append((channel, routing_key, header.properties, body))

    def channel_closed(self, channel: int) -> None:
        self.closed.append(channel)

    def connection_closing(self, then) -> None:
        if self.hold_close:
            self.closing.append(then)  # answered when the test says
        else:
            then()


def test_a_publish_reaches_the_handler_whole_with_its_property_bytes() -> None:
    recording = Recording()
    properties = pika.spec.BasicProperties(delivery_mode=2, headers={"a": 1}, expiration="5")
    with serving(lambda: recording, frame_max=4096) as served:
        connection = pika.BlockingConnection(_parameters(served.port))
        channel = connection.channel()
        body = b"0123456789" * 1000  # three body frames at 4 KiB
        channel.basic_publish("", "jobs", body, properties)
        channel.basic_publish("", "empty", b"")
        connection.close()
    expected_properties = pika.frame.Header(1, 0, properties).marshal()[7 + 12 : -1]
    assert recording.contents == [
        (channel.channel_number, "jobs", expected_properties, body),
        (channel.channel_number, "empty", b"\x00\x00", b""),
    ]
    assert recording.closed == [channel.channel_number]


def test_a_channel_error_closes_that_channel_only() -> None:
    recording = Recording()
    with serving(lambda: recording) as served:
        connection = pika.BlockingConnection(_parameters(served.port))
        doomed, kept = connection.channel(), connection.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
            doomed.queue_declare("missing")
        assert closed.value.reply_code == frames.NOT_FOUND
        kept.basic_publish("", "after", b"still here")
        another = connection.channel()  # the connection goes on
        another.basic_publish("", "later", b"")
        connection.close()
    assert [routing_key for _, routing_key, _, _ in recording.contents] == ["after", "later"]
    assert recording.closed[0] == doomed.channel_number


def test_a_method_in_the_middle_of_a_publishs_content_closes_the_connection() -> None:
    session = _open_session(Recording())
    publish = pika.frame.Method(1, pika.spec.Basic.Publish(routing_key="q")).marshal()
    session.receive(publish + pika.frame.Method(1, pika.spec.Basic.Qos(prefetch_count=1)).marshal())
    assert _closed_with(session) == frames.UNEXPECTED_FRAME


def test_a_body_longer_than_its_header_said_closes_the_connection() -> None:
    session = _open_session(Recording())
    session.receive(
        pika.frame.Method(1, pika.spec.Basic.Publish(routing_key="q")).marshal()
        + pika.frame.Header(1, 3, pika.spec.BasicProperties()).marshal()
        + pika.frame.Body(1, b"four").marshal()
    )
    assert _closed_with(session) == frames.FRAME_ERROR


def test_frames_on_a_channel_never_opened_close_the_connection() -> None:
    session = _open_session(Recording())
    session.receive(pika.frame.Method(9, pika.spec.Basic.Publish(routing_key="q")).marshal())
    assert _closed_with(session) == frames.CHANNEL_ERROR


def test_guest_is_let_in_from_loopback_only() -> None:
    for host, let_in in (("127.0.0.1", True), ("::1", True), ("10.1.2.3", False)):
        session = Session(host, guest_only)
        session.receive(frames.PROTOCOL_HEADER)
        session.take_output()
        session.receive(start_ok("PLAIN", b"\x00guest\x00guest"))
        assert (session.user == "guest") is let_in, host
        if not let_in:
            assert b"loopback only" in session.take_output()


def test_amqplain_logs_in_as_plain_does() -> None:
    session = Session("127.0.0.1", guest_only)
    session.receive(frames.PROTOCOL_HEADER)
    response = encode.field_table({"LOGIN": "guest", "PASSWORD": "guest"})[4:]
    session.receive(start_ok("AMQPLAIN", response))
    assert session.user == "guest"


def test_another_protocol_version_is_answered_with_ours_and_closed() -> None:
    with serving() as served:
        with socket.create_connection(("127.0.0.1", served.port), timeout=10) as sock:
            sock.sendall(b"AMQP\x01\x01\x00\x0a")
            answer = sock.recv(64)
            assert answer == frames.PROTOCOL_HEADER
            assert sock.recv(64) == b""  # the server closed it


def test_heartbeats_are_sent_when_quiet_and_a_silent_client_is_dropped() -> None:
    session = _tuned_session(now=100.0)
    session.receive(_method(0, commands.Connection.TuneOk(10, 4096, 4)), now=100.0)
    session.receive(_method(0, commands.Connection.Open()), now=100.0)
    session.take_output()
    session.tick(101.0)
    assert session.take_output() == b""  # half the interval has not passed
    session.tick(102.0)
    assert session.take_output() == frames.heartbeat_frame()
    session.receive(frames.heartbeat_frame(), now=105.0)  # the client's beat
    session.tick(112.9)
    assert not session.finished
    session.tick(113.1)  # more than two intervals since it was last heard
    assert session.finished and session.take_output() == b""


# ----------------------------------------------------------------------------- helpers


def _method(channel: int, method: pamqp.base.Frame) -> bytes:
    return frames.method_frame(channel, method)


def _tuned_session(now: float = 0.0) -> Session:
    session = Session("127.0.0.1", guest_only, channel_max=10, frame_max=8192, now=now)
    session.receive(frames.PROTOCOL_HEADER, now)
    session.receive(start_ok("PLAIN", b"\x00guest\x00guest"), now)
    session.take_output()
    return session


def _open_session(handler: Recording) -> Session:
    session = Session("127.0.0.1", guest_only, handler, channel_max=10, frame_max=8192)
    session.receive(frames.PROTOCOL_HEADER)
    session.receive(start_ok("PLAIN", b"\x00guest\x00guest"))
    session.receive(_method(0, commands.Connection.TuneOk(10, 8192, 0)))
    session.receive(_method(0, commands.Connection.Open()))
    session.receive(_method(1, commands.Channel.Open()))
    assert session.state == OPEN and session.channels == {1}
    session.take_output()
    return session


def _closed_with(session: Session) -> int:
    """The reply code of the Connection.Close the session sent last."""
    data = bytearray(session.take_output())
    read, _ = frames.split_frames(data, 1 << 20)
    closes = [
        frames.decode_method(f)
        for f in read
        if f.kind == frames.FRAME_METHOD and frames.method_id(f.payload) == (10, 50)
    ]
    assert closes, "the session sent no Connection.Close"
    code = closes[-1].reply_code
    assert isinstance(code, int)
    return code


def test_a_clients_close_is_answered_once_its_handler_let_go_and_nothing_after_it_counts():
    recording = Recording(hold_close=True)
    session = _open_session(recording)
    session.receive(_method(0, commands.Connection.Close(200, "bye", 0, 0)))
    assert recording.closed == [1] and len(recording.closing) == 1
    session.receive(_method(1, commands.Queue.Declare(queue="late")))  # after its Close
    assert session.take_output() == b"" and not session.finished
    recording.closing[0]()  # the handler deleted its exclusive queues
    data = bytearray(session.take_output())
    read, _ = frames.split_frames(data, 1 << 20)
    assert [frames.method_id(f.payload) for f in read] == [(10, 51)]  # CloseOk alone
    assert session.finished


def test_a_clients_close_is_answered_even_when_its_handler_never_lets_go() -> None:
    for end_it in ("tick", "server close"):
        session = _open_session(Recording(hold_close=True))
        session.receive(_method(0, commands.Connection.Close(200, "bye", 0, 0)), 10.0)
        session.tick(12.0)
        assert session.take_output() == b""  # its handler may still delete its queues
        if end_it == "tick":
            session.tick(16.0)  # a worker held up by the node: answered all the same
        else:  # the worker failed meanwhile: the client closing hears CloseOk, not Close
            session.close_connection(AmqpError(frames.CONNECTION_FORCED, "node gone"))
        read, _ = frames.split_frames(bytearray(session.take_output()), 1 << 20)
        assert [frames.method_id(f.payload) for f in read] == [(10, 51)], end_it
        assert session.finished


def test_a_client_that_never_answers_the_servers_close_is_dropped() -> None:
    session = _open_session(Recording())
    session.receive(pika.frame.Method(9, pika.spec.Basic.Publish(routing_key="q")).marshal(), 5.0)
    assert _closed_with(session) == frames.CHANNEL_ERROR
    session.tick(30.0)
    assert not session.finished
    session.tick(36.0)
    assert session.finished and session.peer_gone


def test_exclusive_queues_are_owned_even_when_the_disk_refuses_their_file(tmp_path) -> None:
    from warren.queues.amqp.shared import EXCLUSIVE_FILE, ExclusiveQueues

    owners = ExclusiveQueues(str(tmp_path))
    (tmp_path / (EXCLUSIVE_FILE + ".tmp")).mkdir()  # the file cannot be written
    mine, theirs = object(), object()
    assert owners.claim("reply", mine)
    assert owners.locked_for("reply", theirs) and not owners.claim("reply", theirs)
    (tmp_path / (EXCLUSIVE_FILE + ".tmp")).rmdir()  # the disk takes it again
    assert owners.claim("other", mine)
    assert ExclusiveQueues(str(tmp_path)).left_by_a_crash() == ["other", "reply"]


def test_channel_max_counts_the_open_channels_whatever_their_numbers() -> None:
    with serving(channel_max=2) as served:
        connection = pika.BlockingConnection(_parameters(served.port))
        connection.channel(65535)
        connection.channel(7)
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as refused:
            connection.channel(8)
        assert refused.value.reply_code == frames.NOT_ALLOWED
        assert "reached the negotiated channel_max (2)" in refused.value.reply_text


def test_a_method_that_meets_its_queue_deleted_meanwhile_is_answered_not_found():
    """A consume racing the delete of its (auto-delete, expiring) queue: the queue's
    process answers QueueClosed; the client hears 404 on its channel, as from RabbitMQ,
    not 541, which closes its whole connection."""
    from warren.queues.amqp.translator import _amqp_error
    from warren.queues.errors import QueueClosed

    error = _amqp_error(QueueClosed("queue replies was deleted"), (60, 20))
    assert (error.code, error.class_id, error.method_id) == (frames.NOT_FOUND, 60, 20)

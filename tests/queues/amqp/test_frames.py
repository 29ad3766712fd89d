"""The hand-coded frames against an independent codec: pika's, a client people use.

What pika sends (a publish with every property) must be read as pika meant it; what the
server sends (a delivery, a get, a confirm) must be read by pika as the server meant it,
with the properties' bytes passed through untouched. Bad frames are refused with the
reply code RabbitMQ closes the connection with."""

from __future__ import annotations

import datetime
import decimal
import struct

import pika.frame
import pika.spec
import pytest

from warren.queues.amqp import frames
from warren.queues.amqp.frames import AmqpError
from warren.queues.amqp_envelope import encode_short_string

EVERY_PROPERTY = pika.spec.BasicProperties(
    content_type="application/json",
    content_encoding="utf-8",
    headers={
        "retries": 3,
        "nested": {"list": [1, "two", decimal.Decimal("3.50")]},
        "flag": True,
        "bin": b"\x00\xff",
    },
    delivery_mode=2,
    priority=7,
    correlation_id="c-1",
    reply_to="replies",
    expiration="60000",
    message_id="m-1",
    timestamp=1_700_000_000,
    type="task",
    user_id="guest",
    app_id="tests",
    cluster_id="",
)


def _published(body: bytes, properties: pika.spec.BasicProperties, frame_max: int) -> bytes:
    """A publish as pika puts it on the wire, its body cut to ``frame_max``."""
    method = pika.spec.Basic.Publish(exchange="orders", routing_key="eu.new", mandatory=True)
    data = pika.frame.Method(3, method).marshal()
    data += pika.frame.Header(3, len(body), properties).marshal()
    step = frame_max - 8
    for start in range(0, len(body), step):
        data += pika.frame.Body(3, body[start : start + step]).marshal()
    return data


def _pika_frames(data: bytes) -> list[pika.frame.Frame]:
    read = []
    while data:
        used, frame = pika.frame.decode_frame(data)
        assert frame is not None, "pika could not read a whole frame"
        read.append(frame)
        data = data[used:]
    return read


def test_a_publish_as_pika_sends_it_is_read_with_its_properties_kept_as_sent() -> None:
    body = bytes(range(256)) * 40  # 10 KiB: three body frames at 4 KiB
    wire = bytearray(_published(body, EVERY_PROPERTY, 4096))
    read, used = frames.split_frames(wire, 4096)
    assert used == len(wire)
    assert [f.kind for f in read] == [1, 2, 3, 3, 3] and {f.channel for f in read} == {3}
    assert frames.method_id(read[0].payload) == frames.PUBLISH
    publish = frames.decode_publish(read[0].payload)
    assert (publish.exchange, publish.routing_key, publish.mandatory, publish.immediate) == (
        "orders",
        "eu.new",
        True,
        False,
    )
    header = frames.decode_content_header(read[1].payload)
    assert header.body_size == len(body)
    assert b"".join(f.payload for f in read[2:]) == body
    # the properties are the very bytes pika encoded after the fixed fields
    assert header.properties == read[1].payload[12:]
    values = frames.read_properties(
        header.properties,
        ("delivery_mode", "expiration", "priority", "reply_to", "timestamp", "headers"),
    )
    assert values["delivery_mode"] == 2 and values["expiration"] == "60000"
    assert values["priority"] == 7 and values["reply_to"] == "replies"
    assert values["timestamp"] == datetime.datetime(2023, 11, 14, 22, 13, 20, tzinfo=datetime.UTC)
    headers = values["headers"]
    assert headers == {
        "retries": 3,
        "nested": {"list": [1, "two", decimal.Decimal("3.50")]},
        "flag": True,
        "bin": b"\x00\xff",
    }
    assert [name for name, _, _ in frames.property_spans(header.properties)] == [
        name for name, _ in frames.PROPERTIES
    ]


def test_absent_properties_read_as_none_and_an_empty_header_has_none() -> None:
    wire = bytearray(_published(b"x", pika.spec.BasicProperties(), 4096))
    read, _ = frames.split_frames(wire, 4096)
    header = frames.decode_content_header(read[1].payload)
    assert header.properties == b"\x00\x00"
    assert frames.read_properties(header.properties, ("delivery_mode",)) == {"delivery_mode": None}
    assert list(frames.property_spans(header.properties)) == []


def test_a_frame_arriving_in_pieces_is_read_only_once_whole() -> None:
    wire = _published(b"hello", EVERY_PROPERTY, 4096)
    buffer = bytearray()
    seen = []
    for byte in wire:
        buffer.append(byte)
        read, used = frames.split_frames(buffer, 4096)
        del buffer[:used]
        seen += read
    assert [f.kind for f in seen] == [1, 2, 3] and not buffer
    assert seen[2].payload == b"hello"


@pytest.mark.parametrize("frame_max", [4096, 131072])
def test_a_delivery_reads_in_pika_with_the_publishers_properties_and_whole_body(
    frame_max: int,
) -> None:
    body = b"\xab" * 300_000
    wire = bytearray(_published(b"", EVERY_PROPERTY, 4096))
    properties = frames.decode_content_header(frames.split_frames(wire, 4096)[0][1].payload)
    data = frames.deliver_frames(
        5,
        encode_short_string("ctag-1"),
        2**40 + 7,
        True,
        encode_short_string("orders"),
        encode_short_string("eu.new"),
        properties.properties,
        body,
        frame_max,
    )
    read = _pika_frames(data)
    deliver, header, *bodies = read
    assert isinstance(deliver.method, pika.spec.Basic.Deliver)
    assert (deliver.channel_number, deliver.method.consumer_tag, deliver.method.delivery_tag) == (
        5,
        "ctag-1",
        2**40 + 7,
    )
    assert deliver.method.redelivered is True
    assert (deliver.method.exchange, deliver.method.routing_key) == ("orders", "eu.new")
    assert header.body_size == len(body)
    assert header.properties.headers == EVERY_PROPERTY.headers
    assert header.properties.expiration == "60000" and header.properties.delivery_mode == 2
    assert b"".join(b.fragment for b in bodies) == body
    assert all(len(b.fragment) <= frame_max - 8 for b in bodies)


def test_an_empty_body_is_delivered_without_body_frames() -> None:
    data = frames.get_ok_frames(
        1, 9, False, b"\x00", encode_short_string("q"), 41, b"\x00\x00", b"", 4096
    )
    get_ok, header = _pika_frames(data)
    assert isinstance(get_ok.method, pika.spec.Basic.GetOk)
    assert (get_ok.method.delivery_tag, get_ok.method.message_count) == (9, 41)
    assert (get_ok.method.exchange, get_ok.method.routing_key) == ("", "q")
    assert header.body_size == 0


def test_confirms_read_in_pika_and_a_clients_settles_are_read_here() -> None:
    (ack,) = _pika_frames(frames.confirm_frame(2, 17, multiple=True))
    (nack,) = _pika_frames(frames.confirm_frame(2, 18, multiple=False, nack=True))
    assert isinstance(ack.method, pika.spec.Basic.Ack)
    assert (ack.method.delivery_tag, ack.method.multiple) == (17, True)
    assert isinstance(nack.method, pika.spec.Basic.Nack)
    assert (nack.method.delivery_tag, nack.method.multiple, nack.method.requeue) == (
        18,
        False,
        False,
    )
    for method, expected in (
        (pika.spec.Basic.Ack(delivery_tag=5, multiple=True), (5, True, False)),
        (pika.spec.Basic.Nack(delivery_tag=6, multiple=True, requeue=False), (6, True, False)),
        (pika.spec.Basic.Nack(delivery_tag=7, multiple=False, requeue=True), (7, False, True)),
        (pika.spec.Basic.Reject(delivery_tag=8, requeue=True), (8, False, True)),
        (pika.spec.Basic.Reject(delivery_tag=9, requeue=False), (9, False, False)),
    ):
        (frame,), _ = frames.split_frames(bytearray(pika.frame.Method(1, method).marshal()), 4096)
        assert frames.decode_settle(frame.payload) == expected


def test_other_methods_go_through_the_maintained_codec_both_ways() -> None:
    declare = pika.spec.Queue.Declare(
        queue="jobs",
        durable=True,
        arguments={"x-message-ttl": 60000, "x-dead-letter-exchange": "dlx"},
    )
    (frame,), _ = frames.split_frames(bytearray(pika.frame.Method(4, declare).marshal()), 4096)
    decoded = frames.decode_method(frame)
    assert decoded.name == "Queue.Declare"
    assert (decoded.queue, decoded.durable, decoded.exclusive) == ("jobs", True, False)
    assert decoded.arguments == {"x-message-ttl": 60000, "x-dead-letter-exchange": "dlx"}
    assert frames.ids_of(decoded) == (50, 10)
    import pamqp.commands

    (answer,) = _pika_frames(frames.method_frame(4, pamqp.commands.Queue.DeclareOk("jobs", 3, 1)))
    assert isinstance(answer.method, pika.spec.Queue.DeclareOk)
    assert (answer.method.queue, answer.method.message_count, answer.method.consumer_count) == (
        "jobs",
        3,
        1,
    )


def _head(kind: int, channel: int, size: int) -> bytes:
    return struct.pack(">BHI", kind, channel, size)


def test_a_frame_over_frame_max_is_refused_from_its_head_alone() -> None:
    with pytest.raises(AmqpError) as refused:
        frames.split_frames(bytearray(_head(3, 1, 4089)), 4096)  # the body never needs to come
    assert refused.value.code == frames.FRAME_ERROR
    read, used = frames.split_frames(bytearray(_head(3, 1, 4088) + b"x" * 4088 + b"\xce"), 4096)
    assert used == 4096 and len(read[0].payload) == 4088


def test_a_frame_without_its_end_octet_is_a_frame_error() -> None:
    with pytest.raises(AmqpError) as refused:
        frames.split_frames(bytearray(_head(3, 1, 2) + b"ab\x00"), 4096)
    assert refused.value.code == frames.FRAME_ERROR


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param(b"\x00\x3c\x00\x28\x00\x00\x05ab", id="a short string past the end"),
        pytest.param(b"\x00\x3c\x00\x28\x00\x00\x00\x00", id="no flags octet"),
        pytest.param(b"\x00\x3c", id="no method id"),
    ],
)
def test_a_malformed_publish_is_a_syntax_error(payload: bytes) -> None:
    with pytest.raises(AmqpError) as refused:
        frames.method_id(payload)
        frames.decode_publish(payload)
    assert refused.value.code == frames.SYNTAX_ERROR


@pytest.mark.parametrize(
    ("properties", "code"),
    [
        pytest.param(b"\x00\x01", frames.SYNTAX_ERROR, id="a continuation flag"),
        pytest.param(b"\x00\x02", frames.SYNTAX_ERROR, id="the unused flag"),
        pytest.param(b"\x80\x00\x09ab", frames.SYNTAX_ERROR, id="content type past the end"),
        pytest.param(b"\x20\x00\x00\x00\x10\x00", frames.SYNTAX_ERROR, id="a table past the end"),
        pytest.param(b"\x10\x00\x02\x07", frames.SYNTAX_ERROR, id="bytes after the last"),
        pytest.param(b"\x00", frames.SYNTAX_ERROR, id="half a flag word"),
    ],
)
def test_malformed_properties_are_refused_with_their_header(properties: bytes, code: int) -> None:
    payload = struct.pack(">HHQ", 60, 0, 1) + properties
    with pytest.raises(AmqpError) as refused:
        frames.decode_content_header(payload)
    assert refused.value.code == code


def test_a_content_header_of_another_class_is_an_unexpected_frame() -> None:
    with pytest.raises(AmqpError) as refused:
        frames.decode_content_header(struct.pack(">HHQ", 50, 0, 1) + b"\x00\x00")
    assert refused.value.code == frames.UNEXPECTED_FRAME


def test_a_table_that_does_not_decode_is_a_syntax_error() -> None:
    with pytest.raises(AmqpError) as refused:
        frames.decode_table(b"\x03keyZ\x00")  # 'Z' is no field type
    assert refused.value.code == frames.SYNTAX_ERROR


def test_a_short_string_longer_than_255_bytes_is_refused_when_encoded() -> None:
    assert encode_short_string("é") == b"\x02\xc3\xa9"
    with pytest.raises(ValueError, match="at most 255 bytes"):
        encode_short_string("x" * 256)

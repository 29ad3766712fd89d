"""AMQP 0-9-1 frames: split from a byte stream, and the hot methods coded by hand.

A frame is ``type:u8 channel:u16 size:u32 payload 0xCE``; a method frame's payload
starts with ``class:u16 method:u16``. What a broker does for every message is coded here
with ``struct``: ``Basic.Publish`` and the content header after it, whose properties are
kept as the bytes the client sent (RabbitMQ's ``properties_bin``) and only walked for the
few a broker reads (``delivery_mode``, ``expiration``, ``headers``); ``Basic.Deliver`` and
``Basic.GetOk`` with their content; ``Basic.Ack``, ``Nack`` and ``Reject`` both ways (a
client's acks, the server's confirms). Every other method, some seventy rarely sent,
goes through pamqp (``decode_method``, ``method_frame``).

Nothing a peer sends is trusted: every length is checked against the end of its frame
and a frame's size against the negotiated ``frame_max``. A frame the server cannot read
raises ``AmqpError`` with the reply code RabbitMQ closes the connection with: 501
(``FRAME_ERROR``: a size over the maximum, a missing end octet) or 502 (``SYNTAX_ERROR``:
a field that runs past its frame, an unknown method or property flag).
"""

from __future__ import annotations

import datetime
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pamqp.base
import pamqp.exceptions
import pamqp.frame

from ..errors import AmqpError

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"

FRAME_METHOD = 1
FRAME_HEADER = 2
FRAME_BODY = 3
FRAME_HEARTBEAT = 8
FRAME_END = 0xCE
# The spec's floor for frame_max: every peer must take frames this long.
FRAME_MIN_SIZE = 4096

# Reply codes (AMQP 0-9-1's constants, as RabbitMQ sends them).
NO_ROUTE = 312
CONNECTION_FORCED = 320
ACCESS_REFUSED = 403
NOT_FOUND = 404
RESOURCE_LOCKED = 405
PRECONDITION_FAILED = 406
FRAME_ERROR = 501
SYNTAX_ERROR = 502
COMMAND_INVALID = 503
CHANNEL_ERROR = 504
UNEXPECTED_FRAME = 505
RESOURCE_ERROR = 506
NOT_ALLOWED = 530
NOT_IMPLEMENTED = 540
INTERNAL_ERROR = 541

# Method ids (class, method) of the hot path.
BASIC = 60
PUBLISH = (BASIC, 40)
DELIVER = (BASIC, 60)
GET_OK = (BASIC, 71)
ACK = (BASIC, 80)
REJECT = (BASIC, 90)
NACK = (BASIC, 120)

_HEAD = struct.Struct(">BHI")
_HEAD_SIZE = _HEAD.size
_METHOD_ID = struct.Struct(">HH")
_TAG_BITS = struct.Struct(">QB")
_CONTENT_HEAD = struct.Struct(">HHQ")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_HEARTBEAT = _HEAD.pack(FRAME_HEARTBEAT, 0, 0) + bytes([FRAME_END])


@dataclass(slots=True)
class Frame:
    """One frame read from a peer."""

    kind: int
    channel: int
    payload: bytes


def split_frames(buffer: bytearray, frame_max: int) -> tuple[list[Frame], int]:
    """The whole frames at the start of ``buffer``, and how many bytes they took; a frame
    longer than ``frame_max`` (its head and end included) or without its end octet
    raises ``AmqpError`` 501 as soon as its head is read."""
    frames = []
    position, available = 0, len(buffer)
    limit = frame_max - _HEAD_SIZE - 1
    while available - position >= _HEAD_SIZE:
        kind, channel, size = _HEAD.unpack_from(buffer, position)
        if size > limit:
            raise AmqpError(
                FRAME_ERROR, f"frame of {size} bytes over the negotiated frame_max {frame_max}"
            )
        end = position + _HEAD_SIZE + size
        if end >= available:
            break
        if buffer[end] != FRAME_END:
            raise AmqpError(FRAME_ERROR, f"frame on channel {channel} does not end in 0xCE")
        frames.append(Frame(kind, channel, bytes(buffer[position + _HEAD_SIZE : end])))
        position = end + 1
    return frames, position


def method_id(payload: bytes) -> tuple[int, int]:
    """A method frame's (class, method)."""
    if len(payload) < _METHOD_ID.size:
        raise AmqpError(SYNTAX_ERROR, "method frame shorter than its class and method ids")
    return _METHOD_ID.unpack_from(payload)


def _short_string(payload: bytes, position: int) -> tuple[str, int]:
    """The shortstr at ``position`` and the position after it."""
    if position >= len(payload):
        raise AmqpError(SYNTAX_ERROR, "a short string runs past the end of its frame")
    end = position + 1 + payload[position]
    if end > len(payload):
        raise AmqpError(SYNTAX_ERROR, "a short string runs past the end of its frame")
    try:
        return payload[position + 1 : end].decode(), end
    except UnicodeDecodeError:
        raise AmqpError(SYNTAX_ERROR, "a short string is not UTF-8") from None


@dataclass(slots=True)
class Publish:
    """``Basic.Publish``'s arguments."""

    exchange: str
    routing_key: str
    mandatory: bool
    immediate: bool


def decode_publish(payload: bytes) -> Publish:
    """``Basic.Publish`` from its method frame's payload (ids, ticket, then fields)."""
    exchange, position = _short_string(payload, 6)
    routing_key, position = _short_string(payload, position)
    if position >= len(payload):
        raise AmqpError(SYNTAX_ERROR, "Basic.Publish ends before its flags", *PUBLISH)
    bits = payload[position]
    return Publish(exchange, routing_key, bool(bits & 1), bool(bits & 2))


def decode_settle(payload: bytes) -> tuple[int, bool, bool]:
    """``Basic.Ack``, ``Nack`` or ``Reject``: (delivery tag, multiple, requeue); an ack's
    requeue and a reject's multiple are False."""
    if len(payload) < 4 + _TAG_BITS.size:
        raise AmqpError(SYNTAX_ERROR, "an ack, nack or reject frame is cut short")
    _, method = _METHOD_ID.unpack_from(payload)
    tag, bits = _TAG_BITS.unpack_from(payload, 4)
    if method == ACK[1]:
        return tag, bool(bits & 1), False
    if method == NACK[1]:
        return tag, bool(bits & 1), bool(bits & 2)
    return tag, False, bool(bits & 1)


def confirm_frame(channel: int, delivery_tag: int, multiple: bool, nack: bool = False) -> bytes:
    """The server's publisher confirm: ``Basic.Ack`` (or ``Nack``, not requeued)."""
    method = NACK if nack else ACK
    payload = _METHOD_ID.pack(*method) + _TAG_BITS.pack(delivery_tag, int(multiple))
    return _HEAD.pack(FRAME_METHOD, channel, len(payload)) + payload + bytes([FRAME_END])


# --------------------------------------------------------------------------- content


@dataclass(slots=True)
class ContentHeader:
    """A content header: the body's size and the properties as the client sent them
    (their flag words, then the values)."""

    body_size: int
    properties: bytes


def decode_content_header(payload: bytes) -> ContentHeader:
    """A content header frame's payload; its class must be Basic's (60)."""
    if len(payload) < _CONTENT_HEAD.size + 2:
        raise AmqpError(SYNTAX_ERROR, "content header shorter than its fixed fields")
    class_id, _weight, body_size = _CONTENT_HEAD.unpack_from(payload)
    if class_id != BASIC:
        raise AmqpError(UNEXPECTED_FRAME, f"content header of class {class_id}, not Basic's")
    properties = payload[_CONTENT_HEAD.size :]
    for _ in property_spans(properties):
        pass  # walked once here, so that a malformed one is refused with its publish
    return ContentHeader(body_size, properties)


# Basic's properties in flag order (bit 15 first): how each value is laid out.
_SHORT, _TABLE, _OCTET, _TIMESTAMP = "shortstr", "table", "octet", "timestamp"
PROPERTIES: tuple[tuple[str, str], ...] = (
    ("content_type", _SHORT),
    ("content_encoding", _SHORT),
    ("headers", _TABLE),
    ("delivery_mode", _OCTET),
    ("priority", _OCTET),
    ("correlation_id", _SHORT),
    ("reply_to", _SHORT),
    ("expiration", _SHORT),
    ("message_id", _SHORT),
    ("timestamp", _TIMESTAMP),
    ("type", _SHORT),
    ("user_id", _SHORT),
    ("app_id", _SHORT),
    ("cluster_id", _SHORT),
)
_LAYOUTS = dict(PROPERTIES)
_BIT = {name: 1 << (15 - index) for index, (name, _) in enumerate(PROPERTIES)}
# The properties laid out before the headers (shortstrs both)
_BEFORE_HEADERS = tuple(_BIT[name] for name in ("content_type", "content_encoding"))
_I64 = struct.Struct(">q")


def with_long_header(properties: bytes, name: bytes, value: int) -> bytes:
    """``properties`` (a content header's flag word and values, as the publisher sent
    them) with header ``name`` (an encoded shortstr) set to ``value``, a signed 64-bit
    long: appended to the headers table (a value of that name the publisher sent is read
    before it, so this one wins), or a table of it alone where there was none. The rest
    is copied as it is, never decoded."""
    (flags,) = _U16.unpack_from(properties)
    entry = name + b"l" + _I64.pack(value)
    position = 2
    for bit in _BEFORE_HEADERS:  # skip the ones present
        if flags & bit:
            position += 1 + properties[position]
    if flags & _BIT["headers"]:
        (size,) = _U32.unpack_from(properties, position)
        end = position + 4 + size
        return (
            properties[:position]
            + _U32.pack(size + len(entry))
            + properties[position + 4 : end]
            + entry
            + properties[end:]
        )
    return (
        _U16.pack(flags | _BIT["headers"])
        + properties[2:position]
        + _U32.pack(len(entry))
        + entry
        + properties[position:]
    )


_UNUSED_FLAGS = 0b11  # bit 1 is no property; bit 0 says another flag word follows


def property_spans(properties: bytes) -> Iterator[tuple[str, int, int]]:
    """Each property present: its name and where its value lies in ``properties``
    (a shortstr's or table's length prefix included)."""
    if len(properties) < 2:
        raise AmqpError(SYNTAX_ERROR, "content header without its property flags")
    (flags,) = _U16.unpack_from(properties)
    if flags & _UNUSED_FLAGS:
        raise AmqpError(SYNTAX_ERROR, f"property flags {flags:#06x} name no Basic property")
    position, end = 2, len(properties)
    for bit, (name, layout) in zip(range(15, 1, -1), PROPERTIES, strict=True):
        if not flags & (1 << bit):
            continue
        if layout == _SHORT:
            size = 1 + properties[position] if position < end else end + 1
        elif layout == _TABLE:
            size = 4 + _U32.unpack_from(properties, position)[0] if position + 4 <= end else end
        else:
            size = 1 if layout == _OCTET else 8
        if position + size > end:
            raise AmqpError(SYNTAX_ERROR, f"property {name} runs past the end of its header")
        yield name, position, position + size
        position += size
    if position != end:
        raise AmqpError(SYNTAX_ERROR, "bytes left over after the last property")


def read_properties(properties: bytes, wanted: tuple[str, ...]) -> dict[str, Any]:
    """The values of the properties ``wanted``, in one walk (None for one absent): an
    octet as an int, a shortstr as str, a table as a dict, the timestamp as an aware
    datetime."""
    found: dict[str, Any] = dict.fromkeys(wanted)
    for name, start, end in property_spans(properties):
        if name not in found:
            continue
        layout = _LAYOUTS[name]
        if layout == _OCTET:
            found[name] = properties[start]
        elif layout == _SHORT:
            found[name] = _short_string(properties, start)[0]
        elif layout == _TIMESTAMP:
            seconds = int.from_bytes(properties[start:end], "big")
            found[name] = datetime.datetime.fromtimestamp(seconds, datetime.UTC)
        else:
            found[name] = decode_table(properties[start + 4 : end])
    return found


def decode_table(data: bytes) -> dict[str, Any]:
    """A field table's entries (without its length prefix), through pamqp's decoder,
    which knows RabbitMQ's field types."""
    from pamqp import decode

    try:
        consumed, table = decode.field_table(_U32.pack(len(data)) + data)
    except (ValueError, TypeError, struct.error, pamqp.exceptions.PAMQPException) as exc:
        raise AmqpError(SYNTAX_ERROR, f"a field table does not decode: {exc}") from None
    if consumed != len(data) + 4:
        raise AmqpError(SYNTAX_ERROR, "a field table's entries do not fill its length")
    return table


def content_frames(channel: int, properties: bytes, body: bytes, frame_max: int) -> list[bytes]:
    """The content header and body frames of a message, its bodies cut to ``frame_max``."""
    head = _CONTENT_HEAD.pack(BASIC, 0, len(body)) + properties
    frames = [_HEAD.pack(FRAME_HEADER, channel, len(head)), head, b"\xce"]
    step = frame_max - _HEAD_SIZE - 1
    for start in range(0, len(body), step):
        piece = body[start : start + step]
        frames += (_HEAD.pack(FRAME_BODY, channel, len(piece)), piece, b"\xce")
    return frames


def deliver_frames(
    channel: int,
    consumer_tag: bytes,
    delivery_tag: int,
    redelivered: bool,
    exchange: bytes,
    routing_key: bytes,
    properties: bytes,
    body: bytes,
    frame_max: int,
) -> bytes:
    """``Basic.Deliver`` and its content; the tag, exchange and routing key are already
    encoded shortstrs (``encode_short_string``)."""
    method = b"".join(
        (
            _METHOD_ID.pack(*DELIVER),
            consumer_tag,
            _TAG_BITS.pack(delivery_tag, int(redelivered)),
            exchange,
            routing_key,
        )
    )
    head = _HEAD.pack(FRAME_METHOD, channel, len(method))
    return b"".join((head, method, b"\xce", *content_frames(channel, properties, body, frame_max)))


def get_ok_frames(
    channel: int,
    delivery_tag: int,
    redelivered: bool,
    exchange: bytes,
    routing_key: bytes,
    message_count: int,
    properties: bytes,
    body: bytes,
    frame_max: int,
) -> bytes:
    """``Basic.GetOk`` and its content (the exchange and key encoded shortstrs)."""
    method = b"".join(
        (
            _METHOD_ID.pack(*GET_OK),
            _TAG_BITS.pack(delivery_tag, int(redelivered)),
            exchange,
            routing_key,
            _U32.pack(message_count),
        )
    )
    head = _HEAD.pack(FRAME_METHOD, channel, len(method))
    return b"".join((head, method, b"\xce", *content_frames(channel, properties, body, frame_max)))


def heartbeat_frame() -> bytes:
    return _HEARTBEAT


# --------------------------------------------------------------------------- the rest


def decode_method(frame: Frame) -> pamqp.base.Frame:
    """Any method frame, through pamqp."""
    data = _HEAD.pack(frame.kind, frame.channel, len(frame.payload)) + frame.payload + b"\xce"
    try:
        _, _, method = pamqp.frame.unmarshal(data)
    except (ValueError, TypeError, KeyError, struct.error, pamqp.exceptions.PAMQPException):
        class_id, method_number = method_id(frame.payload)
        raise AmqpError(
            SYNTAX_ERROR,
            f"method {class_id}.{method_number} does not decode",
            class_id,
            method_number,
        ) from None
    if not isinstance(method, pamqp.base.Frame):
        raise AmqpError(SYNTAX_ERROR, "a method frame holds no method")
    return method


def ids_of(method: pamqp.base.Frame | type[pamqp.base.Frame]) -> tuple[int, int]:
    """A pamqp method's (class, method) ids."""
    return method.index >> 16, method.index & 0xFFFF


def method_frame(channel: int, method: pamqp.base.Frame) -> bytes:
    """Any method, framed for ``channel``, through pamqp."""
    return pamqp.frame.marshal(method, channel)

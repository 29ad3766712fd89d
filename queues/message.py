"""A message: its properties and body, and its one encoding (msgpack), used on disk and on
the wire.

Encoding: a msgpack array ``[1, message_id, headers, expiration_ms, timestamp_ms,
content_type, persistent, body]`` (the leading 1 is the format version); a message
published over AMQP also keeps its publish as the bytes its publisher sent (``amqp``:
the exchange and routing key as AMQP short strings, then the properties' flag word and
values, RabbitMQ's ``properties_bin``), in ``[2, ..., persistent, amqp, body]``, so that a
delivery over AMQP carries them back unchanged (their field types included, which
msgpack cannot all hold). A message without them encodes as before, byte for byte. The
body is always last. Headers are a
map from str to anything msgpack encodes (str, bytes, int, float, bool, None, lists and
maps of those). Nothing else is accepted: a property that does not encode is refused
with an ``InvalidMessage`` naming it, before anything is stored; bytes that do not decode
into this shape raise ``CorruptMessage``.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgpack

from .errors import CorruptMessage, InvalidMessage

__all__ = [
    "FORMAT_VERSION",
    "MAX_MESSAGE_BYTES",
    "Message",
    "body_encoder",
    "body_prefix",
    "decode",
    "encode",
]

FORMAT_VERSION = 1
AMQP_FORMAT_VERSION = 2  # with the AMQP publish's bytes before the body
MAX_MESSAGE_BYTES = 128 * 2**20  # RabbitMQ's max_message_size: a message, encoded
_FIELDS = 8
_AMQP_FIELDS = 9
_EMPTY_BODY = b"\xc4\x00"  # msgpack's bin 8 of length 0
_U8, _U16, _U32 = (struct.Struct(f">{c}").pack for c in "BHI")


@dataclass(slots=True)
class Message:
    """One message. ``expiration_ms`` is a per-message TTL (AMQP's ``expiration``),
    ``timestamp_ms`` the publisher's clock, ``persistent`` asks for it to survive a restart
    (in a durable queue)."""

    body: bytes
    message_id: str | None = None
    headers: dict[str, Any] | None = None
    expiration_ms: int | None = None
    timestamp_ms: int | None = None
    content_type: str | None = None
    persistent: bool = True
    amqp: bytes | None = None


def _check(message: Message) -> None:
    if not isinstance(message.body, (bytes, bytearray, memoryview)):
        raise InvalidMessage(f"body must be bytes, got {type(message.body).__name__}")
    for name, kind in (("message_id", str), ("content_type", str)):
        value = getattr(message, name)
        if value is not None and not isinstance(value, kind):
            raise InvalidMessage(f"{name} must be a str or None, got {value!r}")
    for name in ("expiration_ms", "timestamp_ms"):
        value = getattr(message, name)
        if value is not None and (type(value) is not int or not 0 <= value < 2**63):
            raise InvalidMessage(f"{name} must be a non-negative int or None, got {value!r}")
    if not isinstance(message.persistent, bool):
        raise InvalidMessage(f"persistent must be a bool, got {message.persistent!r}")
    if message.amqp is not None and type(message.amqp) is not bytes:
        raise InvalidMessage(f"amqp must be bytes or None, got {type(message.amqp).__name__}")
    headers = message.headers
    if headers is not None:
        if not isinstance(headers, dict):
            raise InvalidMessage(f"headers must be a dict or None, got {type(headers).__name__}")
        for key in headers:
            if not isinstance(key, str):
                raise InvalidMessage(f"header names must be str, got {key!r}")


def encode(message: Message) -> bytes:
    """The message's bytes; ``InvalidMessage`` if a property does not encode."""
    _check(message)
    fields = [
        FORMAT_VERSION,
        message.message_id,
        message.headers,
        message.expiration_ms,
        message.timestamp_ms,
        message.content_type,
        message.persistent,
        bytes(message.body),
    ]
    if message.amqp is not None:
        fields[0] = AMQP_FORMAT_VERSION
        fields.insert(-1, message.amqp)
    try:
        return msgpack.packb(
            fields,
            use_bin_type=True,
            strict_types=False,
        )
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidMessage(f"headers do not encode: {exc}") from None


def body_prefix(properties: Message) -> bytes:
    """The bytes every encoding of a message with ``properties`` (whatever its body)
    starts with: the body comes after them, as msgpack's bin 8, 16 or 32 (a marker byte
    0xc4, 0xc5 or 0xc6, the body's length in 1, 2 or 4 big-endian bytes, the body).
    ``InvalidMessage`` if a property does not encode."""
    empty = encode(dataclasses.replace(properties, body=b""))
    assert empty.endswith(_EMPTY_BODY), "the body is the encoding's last field"
    return empty[: -len(_EMPTY_BODY)]


def body_encoder(properties: Message) -> Callable[[Any], bytes]:
    """``encode`` for messages that differ from ``properties`` only in their body (a
    batch published with one set of properties): the properties are checked and packed
    once, and each body then costs its length prefix and a copy. The bytes are
    ``encode``'s, exactly."""
    prefix = body_prefix(properties)

    def encode_body(body: Any) -> bytes:
        if type(body) is not bytes:
            if not isinstance(body, (bytearray, memoryview)):
                raise InvalidMessage(f"body must be bytes, got {type(body).__name__}")
            body = bytes(body)
        size = len(body)
        # msgpack's bin 8, 16 or 32 prefix, written here: a packb call per body costs more
        # than the rest of the encoding
        if size < 0x100:
            return b"".join((prefix, b"\xc4", _U8(size), body))
        if size < 0x10000:
            return b"".join((prefix, b"\xc5", _U16(size), body))
        return b"".join((prefix, b"\xc6", _U32(size), body))

    return encode_body


def decode(data: bytes) -> Message:
    """The message encoded in ``data``; ``CorruptMessage`` if it is not one."""
    try:
        fields = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except (
        ValueError,
        TypeError,
        msgpack.ExtraData,
        msgpack.FormatError,
        msgpack.StackError,
    ) as exc:
        raise CorruptMessage(f"not an encoded message: {exc}") from None
    if type(fields) is not list or len(fields) not in (_FIELDS, _AMQP_FIELDS):
        raise CorruptMessage("not an encoded message: wrong shape or version")
    if type(fields[-1]) is not bytes:
        raise CorruptMessage("not an encoded message: wrong shape or version")
    amqp = None
    if len(fields) == _AMQP_FIELDS and fields[0] == AMQP_FORMAT_VERSION:
        amqp = fields.pop(7)
        if type(amqp) is not bytes:
            raise CorruptMessage("not an encoded message: its AMQP publish is not bytes")
    elif len(fields) != _FIELDS or fields[0] != FORMAT_VERSION:
        raise CorruptMessage("not an encoded message: wrong shape or version")
    _, message_id, headers, expiration_ms, timestamp_ms, content_type, persistent, body = fields
    message = Message(
        body,
        message_id,
        headers,
        expiration_ms,
        timestamp_ms,
        content_type,
        persistent,
        amqp,
    )
    if (
        headers is None
        and expiration_ms is None
        and content_type is None
        and type(persistent) is bool
        and (message_id is None or type(message_id) is str)
        and (timestamp_ms is None or (type(timestamp_ms) is int and 0 <= timestamp_ms < 2**63))
    ):
        return message  # the plain case, checked here at a third of ``_check``'s cost
    try:
        _check(message)
    except InvalidMessage as exc:
        raise CorruptMessage(f"not an encoded message: {exc}") from None
    return message

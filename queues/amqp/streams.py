"""Streams over AMQP 0-9-1, as RabbitMQ serves them to AMQP clients.

A stream is declared with ``x-queue-type: stream`` (durable, not exclusive, not
auto-delete; its retention in ``x-max-length-bytes``, ``x-max-age``,
``x-stream-max-segment-size-bytes``) and read with ``basic.consume``: from the
``x-stream-offset`` argument (``first``, ``last``, ``next``, an offset, an AMQP timestamp
or an interval such as ``"1h"``; ``next`` when absent), each delivery carrying its offset
in the ``x-stream-offset`` header. Reading takes nothing away: an ack only gives the
consumer its credit back (``basic.qos``'s prefetch, which a stream consumer must have,
with manual acks), a nack or reject likewise, and nothing is redelivered when a channel
closes. ``basic.get`` is refused (540), as RabbitMQ refuses it.

This module holds what the translator needs for it: the consume argument read as a
``StreamConsumer`` start (``consume_offset``), the credit and the unacked entries of one
consumer (``StreamCredit``, ``HeldRecord``), and the properties of a delivery with its
offset header added (``with_offset_header``), written as bytes into the properties the
publisher sent (no decode and encode of the rest).

Races: none of its own; the translator's worker thread alone uses these objects. A
record acked after its consumer was cancelled gives credit to nothing (harmless).
"""

from __future__ import annotations

import datetime
from typing import Any

from ..amqp_envelope import encode_short_string
from ..client.stream import StreamDelivery
from ..errors import InvalidArgument
from .frames import with_long_header

__all__ = [
    "OFFSET_HEADER",
    "HeldRecord",
    "StreamCredit",
    "consume_offset",
    "with_offset_header",
]

OFFSET_HEADER = "x-stream-offset"
_OFFSET_NAME = encode_short_string(OFFSET_HEADER)


def consume_offset(arguments: dict[str, Any]) -> object:
    """Where a ``basic.consume`` of a stream starts, as ``Connection.consume`` takes it;
    ``InvalidArgument`` for a value of another AMQP type (the value itself is checked
    where the stream resolves it)."""
    value = arguments.get(OFFSET_HEADER, "next")
    if isinstance(value, bytes):  # a long string that is not UTF-8, as the codec gives it
        value = value.decode("utf-8", "replace")
    if isinstance(value, bool) or not isinstance(value, (str, int, datetime.datetime)):
        raise InvalidArgument(
            f"{OFFSET_HEADER} is first, last, next, an offset, a timestamp or an interval "
            f"such as '1h'; got {value!r}"
        )
    return value


class StreamCredit:
    """How many more records a stream consumer may be sent before the client acks some:
    its prefetch, less what it holds unacked."""

    __slots__ = ("left",)

    def __init__(self, prefetch: int) -> None:
        self.left = prefetch


class HeldRecord:
    """A stream record delivered and not yet acked: what the channel keeps under its
    delivery tag. Settling it, any way, gives its consumer's credit back."""

    __slots__ = ("record", "_credit")

    redelivered = False  # a stream's records are read, never delivered again

    def __init__(self, record: StreamDelivery, credit: StreamCredit) -> None:
        self.record = record
        self._credit: StreamCredit | None = credit
        credit.left -= 1

    @property
    def message(self) -> Any:
        return self.record.message

    @property
    def body(self) -> bytes:
        return self.record.body

    def ack(self) -> None:
        self._settle()

    def nack(self, requeue: bool = True) -> None:
        self._settle()

    def _settle(self) -> None:
        if self._credit is not None:
            self._credit.left += 1
            self._credit = None


def with_offset_header(properties: bytes, offset: int) -> bytes:
    """``properties`` (a content header's flag word and values) with ``offset`` as the
    ``x-stream-offset`` header (``frames.with_long_header``)."""
    return with_long_header(properties, _OFFSET_NAME, offset)

"""The AMQP publish a message keeps (``Message.amqp``): the exchange and routing key it
was published with (AMQP short strings) and its properties as the publisher sent them
(RabbitMQ's ``properties_bin``: the flag word, then the values). ``split`` reads it back
for a delivery; ``dead_lettered`` writes it anew for a dead letter, as RabbitMQ does:

- the exchange and routing key become the dead-letter exchange and the key it was routed
  with there (what a consumer of the dead letters sees in ``basic.deliver``);
- the ``expiration`` property goes (a dead letter does not expire again), kept in the
  death's ``original-expiration``;
- the ``x-death`` header (an array of tables, the latest death first) gains the death:
  ``count`` 1, ``reason``, ``queue``, ``time`` (a timestamp, in seconds), ``exchange``
  and ``routing-keys`` of the publish; a death of the same queue, reason and exchange
  already there is counted up instead and moves to the front; ``x-first-death-queue``,
  ``-reason`` and ``-exchange`` are set by the first death.

Properties are decoded and encoded again by pamqp on this path alone (a dead letter is
rare; pamqp is imported there, so that the queue processes, forked at each declare, do
not carry it), so a header's integer may come back in another AMQP integer type of the same
value; a delivery never decodes them.
"""

from __future__ import annotations

import datetime
import struct
from typing import Any

from .errors import CorruptMessage

__all__ = ["dead_lettered", "encode_short_string", "envelope", "split"]

_FLAGS = struct.Struct(">H")


def split(amqp: bytes) -> tuple[bytes, bytes, bytes] | None:
    """The exchange and routing key (each still a short string, its length first) and
    the properties of a kept publish; None if it does not read."""
    exchange_end = 1 + amqp[0] if amqp else 0
    key_end = exchange_end + 1 + amqp[exchange_end] if 0 < exchange_end < len(amqp) else 0
    if not key_end or key_end + _FLAGS.size > len(amqp):
        return None
    return amqp[:exchange_end], amqp[exchange_end:key_end], amqp[key_end:]


def envelope(exchange: str, routing_key: str, properties: bytes) -> bytes:
    """A kept publish of ``properties`` (already encoded) to ``exchange`` with
    ``routing_key``."""
    return encode_short_string(exchange) + encode_short_string(routing_key) + properties


def dead_lettered(
    amqp: bytes, *, queue: str, reason: str, exchange: str, routing_key: str, now_s: int
) -> bytes:
    """The kept publish of a message that died in ``queue`` for ``reason`` and goes to
    ``exchange`` with ``routing_key`` (see the module docstring); ``CorruptMessage`` if
    the publish does not read."""
    # pamqp, here alone: a queue process that never dead-letters an AMQP message (every
    # queue forked, every declare) does not load its ~20 modules
    import pamqp.commands as commands
    import pamqp.exceptions

    parts = split(amqp)
    if parts is None:
        raise CorruptMessage("a message's AMQP publish does not read")
    old_exchange, old_key, raw = parts
    properties = commands.Basic.Properties()
    try:
        (flags,) = _FLAGS.unpack_from(raw)
        properties.unmarshal(flags, raw[_FLAGS.size :])
    except (ValueError, TypeError, struct.error, pamqp.exceptions.PAMQPException) as exc:
        raise CorruptMessage(f"a message's AMQP properties do not read: {exc}") from None
    death: dict[str, Any] = {
        "count": 1,
        "reason": reason,
        "queue": queue,
        "time": datetime.datetime.fromtimestamp(now_s, datetime.UTC),
        "exchange": _text(old_exchange),
        "routing-keys": [_text(old_key)],
    }
    if properties.expiration is not None:
        death["original-expiration"] = properties.expiration
        properties.expiration = None
    headers = dict(properties.headers or {})
    earlier = headers.get("x-death")
    deaths = [d for d in earlier if isinstance(d, dict)] if isinstance(earlier, list) else []
    same = [d for d in deaths if all(d.get(k) == death[k] for k in ("queue", "reason", "exchange"))]
    if same:
        death = {**same[0], "count": _count(same[0]) + 1}
        deaths.remove(same[0])
    headers["x-death"] = [death, *deaths]
    for field in ("queue", "reason", "exchange"):
        headers.setdefault(f"x-first-death-{field}", death[field])
    properties.headers = headers
    return envelope(exchange, routing_key, properties.marshal())


def _count(death: dict[str, Any]) -> int:
    count = death.get("count")
    return count if type(count) is int and count > 0 else 1


def encode_short_string(value: str) -> bytes:
    """An AMQP shortstr: one length octet, then up to 255 bytes of UTF-8."""
    data = value.encode()
    if len(data) > 255:
        raise ValueError(f"a short string holds at most 255 bytes, not {len(data)}")
    return bytes([len(data)]) + data


def _text(short: bytes) -> str:
    return short[1:].decode(errors="replace")

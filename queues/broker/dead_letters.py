"""``DeadLetters``: a queue's dead messages (expired, rejected, dropped by max-length)
republished to its dead-letter exchange, and acked in the queue once confirmed there.

Each dead message gets an ``x-death`` header (a list, newest first, of
``{"queue", "reason", "time_ms"}``) and loses its per-message expiration. It is routed
with the queue's dead-letter routing key when it has one, else with its own: the routing
key its AMQP publisher gave it, or the queue's name for a message of Warren's client
(which keeps none). A message published over AMQP has its AMQP publish rewritten too, as
RabbitMQ does (``amqp_envelope.dead_lettered``: the exchange and key it goes to now, and
RabbitMQ's ``x-death`` and ``x-first-death-*`` headers in its AMQP headers).

The queue publishes like any producer, through a connection to its node, without
waiting: the confirms are collected by ``settled()``, which the queue calls from a
timer, so a dead-letter exchange that routes back to the same queue cannot deadlock it.
A publish the exchange routes nowhere is confirmed and the message dropped (as RabbitMQ
does); one that is nacked is dropped and logged, and so is one that can never be sent
(no such exchange, as RabbitMQ drops it; a message that does not decode or is too large;
one nacked at once, as by a bound queue that stays down). One that cannot be sent now
(the node stopping, a queue of the exchange restarting, an alarm) is handed back with
those after it: the queue puts them back, unseen (neither redelivered nor counted as a
delivery), and tries again at its next round. ``send`` raises for none of them, so that
a queue dead-lettering never fails the publish or the timer that made it do so.

Each dead letter settled is counted under its reason, RabbitMQ's: ``dead_lettered_expired``
(a TTL), ``dead_lettered_rejected`` (a consumer's reject without requeue) and
``dead_lettered_maxlen`` (dropped from the head by ``max_length``) and
``dead_lettered_delivery_limit`` (a quorum queue's message returned more often than its
``delivery_limit``). A nacked one is counted
once, in ``dead_letters_nacked``, whatever its reason.

At most ``MAX_PENDING`` dead messages are in flight; beyond that ``room()`` is 0 and the
queue leaves its expired messages in place until the next round. ``room()`` is 0 too
while the node is starting (it serves no calls yet, and a queue recovers while the node
starts), and while the node's alarm blocks publishers: expired messages wait, rather
than the queue crashing on its first expiry or waiting on the alarm.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

from warren.actors import WarrenError

from ..amqp_envelope import dead_lettered, split
from ..client.connection import Confirm, Connection
from ..client.ipc_node import RemoteNode
from ..errors import (
    ConnectionClosed,
    CorruptMessage,
    MessageTooLarge,
    Nacked,
    NodeNotRunning,
    NotFound,
    QueueRestarting,
)
from ..message import Message, decode

__all__ = ["REASONS", "DeadLetters"]

log = logging.getLogger("warren.queues")

MAX_PENDING = 1000
REASONS = (
    "expired",
    "rejected",
    "maxlen",
    "delivery_limit",
)  # what ``send`` takes, as x-death names it


class DeadLetters:
    def __init__(
        self, data_dir: str, queue_name: str, exchange: str, routing_key: str | None = None
    ) -> None:
        self.data_dir = data_dir
        self.queue_name = queue_name
        self.exchange = exchange
        self.routing_key = routing_key  # None: each message's own
        self._connection: Connection | None = None
        # (its confirm, seq id in the queue, its reason)
        self._pending: list[tuple[Confirm, int, str]] = []
        self._unsent: list[int] = []  # seq ids of dead letters dropped unsent: settled
        self.counters = {f"dead_lettered_{reason}": 0 for reason in REASONS}
        self.counters["dead_letters_nacked"] = 0

    def room(self) -> int:
        if self._connection is None:
            try:
                self._connection = Connection(RemoteNode(self.data_dir), linger_s=0)
            except NodeNotRunning:
                return 0
        if self._connection.blocked:
            return 0
        return max(0, MAX_PENDING - len(self._pending))

    def send(self, dead: list[tuple[int, bytes]], reason: str) -> list[int]:
        """Republish each (seq id, encoded message), dead for ``reason`` (one of
        ``REASONS``); ack them later, when ``settled``. The seq ids it could not send
        now, for the caller to put back (see the module docstring)."""
        if reason not in REASONS:
            raise ValueError(f"a dead letter's reason is one of {REASONS}, not {reason!r}")
        now_ms = int(time.time() * 1000)
        death = {"queue": self.queue_name, "reason": reason, "time_ms": now_ms}
        for index, (seq_id, payload) in enumerate(dead):
            try:
                if self._connection is None:
                    self._connection = Connection(RemoteNode(self.data_dir), linger_s=0)
                routing_key, message = self._dead_letter(payload, death)
                confirm = self._connection.publish_message(
                    routing_key, message, exchange=self.exchange, mandatory=False
                )
            except (CorruptMessage, MessageTooLarge, Nacked) as exc:
                self._drop(seq_id, exc)  # a nack (a bound queue that stays down) included
            except NotFound as exc:
                if isinstance(exc, QueueRestarting):
                    return self._hand_back(dead[index:], exc)
                self._drop(seq_id, exc)  # no such exchange
            except WarrenError as exc:
                return self._hand_back(dead[index:], exc)
            else:
                self._pending.append((confirm, seq_id, reason))
        return []

    def _drop(self, seq_id: int, reason: Exception) -> None:
        """A dead letter that can never be sent: dropped, and settled at the next round."""
        self.counters["dead_letters_nacked"] += 1
        log.error("queue %s: a dead letter cannot be sent (%s); dropped", self.queue_name, reason)
        self._unsent.append(seq_id)

    def _hand_back(self, dead: list[tuple[int, bytes]], reason: Exception) -> list[int]:
        """What cannot be sent now (``reason``): its seq ids, to be put back."""
        log.warning(
            "queue %s: %d dead letters wait (%s); sent again later",
            self.queue_name,
            len(dead),
            reason,
        )
        if isinstance(reason, (ConnectionClosed, NodeNotRunning)) and self._connection:
            self._connection.close()
            self._connection = None  # the next round connects again
        return [seq_id for seq_id, _ in dead]

    @property
    def pending(self) -> int:
        """Dead letters sent and not settled yet (``settled`` must be called again)."""
        return len(self._pending) + len(self._unsent)

    def settled(self) -> list[int]:
        """The seq ids whose dead letters are settled (confirmed, or nacked or unsent and
        dropped)."""
        done, waiting = self._unsent, []
        self._unsent = []
        for confirm, seq_id, reason in self._pending:
            if not confirm.done():
                waiting.append((confirm, seq_id, reason))
                continue
            try:
                confirm.result(0)
                self.counters[f"dead_lettered_{reason}"] += 1
            except Nacked as exc:
                self.counters["dead_letters_nacked"] += 1
                log.error(
                    "queue %s: a dead letter was not taken (%s); dropped", self.queue_name, exc
                )
            done.append(seq_id)
        self._pending = waiting
        return done

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()

    def _dead_letter(self, payload: bytes, death: dict[str, Any]) -> tuple[str, Message]:
        """The routing key and message of ``payload`` as a dead letter: ``death`` first in
        its ``x-death`` (a list; a header of that name that is not one is replaced), no
        expiration, and its AMQP publish rewritten (see the module docstring)."""
        message = decode(payload)
        headers = dict(message.headers or {})
        earlier = headers.get("x-death")
        headers["x-death"] = [death, *(earlier if isinstance(earlier, list) else [])]
        routing_key = self.routing_key
        amqp = message.amqp
        if amqp is not None:
            parts = split(amqp)
            if parts is None:
                raise CorruptMessage("a message's AMQP publish does not read")
            if routing_key is None:
                routing_key = parts[1][1:].decode(errors="replace")
            amqp = dead_lettered(
                amqp,
                queue=self.queue_name,
                reason=death["reason"],
                exchange=self.exchange,
                routing_key=routing_key,
                now_s=death["time_ms"] // 1000,
            )
        changed = dataclasses.replace(message, headers=headers, expiration_ms=None, amqp=amqp)
        return (self.queue_name if routing_key is None else routing_key), changed

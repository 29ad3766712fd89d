"""``PublishingCalls``: a ``Connection``'s publishing role.

``publish`` waits for its confirm, ``publish_async`` returns a ``Confirm`` at once and
lets its message linger up to ``linger_s`` in the ``Publish`` being filled,
``publish_many`` / ``publish_many_async`` / ``publish_messages`` cut batches into
Publishes of at most ``PUBLISH_BATCH`` messages (a chunk each, into a stream), and
``wait_for_confirms`` / ``flush`` settle what is in flight. A message is routed here,
from its exchange's bindings (cached for ``ROUTES_TTL_S``). At most ``max_in_flight``
messages and ``max_in_flight_bytes`` are unconfirmed (``_make_room`` waits for the
oldest confirms); while the node's memory or disk alarm is raised (``blocked``, read at
most every ``ALARMS_READ_EVERY_S``) a publish waits, up to ``call_timeout_s``, then
raises ``Blocked``; while a cluster's leader raises its replication alarm (fewer in-sync
copies than ``min_insync``) the publishes awaiting their confirms are nacked too. The
frames, confirms and the flusher are ``warren.queues.client.publishing``'s; the lock,
the frame being filled and recovery are ``ConnectionCore``'s.

Races it guards against: a node that goes away while a publish waits for its confirm
(``_answers_of`` recovers, which sends the publish again with its producer and
sequence, and waits for the new answers; a repeat is dropped by dedup); a queue that
restarts while the node lives, with a publish in doubt (the publish is nacked: publish
it again); an interrupt from another thread while the node's alarm holds a publish
(``ConnectionCore.interrupt``: ``Blocked``, which no recovery catches, so the message
is never sent later behind the caller's back); a refused publish under the
connection's own producer id (that producer is retired, so the next publish does not
look like a gap in its sequence).
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Iterable
from typing import Any

from .. import errors
from ..errors import Nacked
from ..message import MAX_MESSAGE_BYTES, Message, body_encoder, encode
from ..protocol import MAX_ENTRIES_PER_CHUNK, REPLICATION_ALARM, QueueRef
from ..routing import route
from .connection_core import NODE_ERRORS, ConnectionCore, exclusive
from .publishing import (
    ASYNC_BATCH_BYTES,
    PUBLISH_BATCH,
    STREAM_WINDOW_SHARE,
    BatchConfirm,
    Confirm,
    OutgoingPublish,
    byte_batches,
    flusher,
    new_message,
    producer_bytes,
    publish_stamp,
    read_ahead_chunks,
)
from .queue_refs import is_stream_ref

ROUTES_TTL_S = 1.0  # how long an exchange's bindings are routed with
ALARMS_READ_EVERY_S = 0.1  # how stale a publisher's view of the alarms may be


class PublishingCalls(ConnectionCore):
    """The publish calls of a ``Connection`` (see the module docstring)."""

    def publish(
        self,
        routing_key: str,
        body: bytes,
        *,
        exchange: str = "",
        persistent: bool = True,
        headers: dict[str, Any] | None = None,
        message_id: str | None = None,
        expiration_ms: int | None = None,
        mandatory: bool = True,
        timeout: float | None = None,
        producer_id: str | bytes | None = None,
        sequence: int | None = None,
    ) -> None:
        """Publish one message to the queue ``routing_key`` names (the default exchange)
        or through ``exchange``; return once every queue it went to confirmed it.

        With ``producer_id`` and ``sequence``, each queue takes the message only if the
        sequence is above the highest it took from that producer, and confirms a repeat
        without enqueueing it: a producer that re-sends the same messages under the same
        sequences, in increasing order, adds no duplicates (``warren.queues.broker.dedup``). Such
        a message carries no publish timestamp: every attempt must be the same bytes."""
        message = new_message(body, message_id, headers, expiration_ms, producer_id, persistent)
        # Sent at once, not left to linger: the call waits for it anyway.
        self._send_message(
            routing_key, message, exchange, mandatory, producer_id, sequence, linger=False
        ).result(timeout if timeout is not None else self.call_timeout_s)

    def publish_async(
        self,
        routing_key: str,
        body: bytes,
        *,
        exchange: str = "",
        persistent: bool = True,
        headers: dict[str, Any] | None = None,
        message_id: str | None = None,
        expiration_ms: int | None = None,
        mandatory: bool = True,
        producer_id: str | bytes | None = None,
        sequence: int | None = None,
    ) -> Confirm:
        """Publish one message; its ``Confirm``, to wait on later. ``Unroutable`` if the
        exchange routes it nowhere and ``mandatory`` (else it is dropped, confirmed)."""
        return self.publish_message(
            routing_key,
            new_message(body, message_id, headers, expiration_ms, producer_id, persistent),
            exchange=exchange,
            mandatory=mandatory,
            producer_id=producer_id,
            sequence=sequence,
        )

    def publish_message(
        self,
        routing_key: str,
        message: Message,
        *,
        exchange: str = "",
        mandatory: bool = True,
        producer_id: str | bytes | None = None,
        sequence: int | None = None,
    ) -> Confirm:
        """``publish_async`` of a ``Message`` as it is (a dead letter keeps its properties)."""
        return self._send_message(
            routing_key, message, exchange, mandatory, producer_id, sequence, linger=True
        )

    def _send_message(
        self,
        routing_key: str,
        message: Message,
        exchange: str,
        mandatory: bool,
        producer_id: str | bytes | None,
        sequence: int | None,
        *,
        linger: bool,
    ) -> Confirm:
        """Add the message to the Publish being filled; with ``linger``, it may wait there
        up to ``linger_s`` for others to share its frame, else the frame is sent now."""
        producer = producer_bytes(producer_id, sequence)
        payload = self._check_size(encode(message))
        size = len(payload)

        def add() -> tuple[Confirm, bool]:
            queues = self._route(exchange, routing_key, mandatory)
            refs = [self._ref(queue) for queue in queues]
            if self.blocked:
                self._flush()
                self._wait_while_blocked()
            auto = self._auto_producer(producer, refs)
            publish = self._filling
            sent_a_frame = False
            if publish is not None and (
                not publish.takes(
                    queues,
                    message.persistent,
                    message.expiration_ms,
                    *(self._auto_producers.peek(queues) if auto else (producer, sequence)),
                )
                or len(publish.payloads) >= self._batch
                or publish.bytes + size > ASYNC_BATCH_BYTES
                or self._in_flight.full_for(len(publish.payloads) + 1, publish.bytes + size)
                or time.monotonic() - publish.started >= self.linger_s
            ):
                self._flush()
                publish = None
                sent_a_frame = True
            if publish is None:
                self._make_room(1, size)
                publish = self._filling = OutgoingPublish(
                    queues,
                    refs,
                    message.persistent,
                    message.expiration_ms,
                    *(self._auto_producers.peek(queues) if auto else (producer, sequence)),
                )
                if linger and self.linger_s:
                    flusher().watch(self, publish.started + self.linger_s)
            publish.payloads.append(payload)
            publish.bytes += size
            if auto:
                self._auto_producers.advance(queues, 1)
            if not (linger and self.linger_s):
                self._flush()
            return Confirm(self, publish, len(publish.payloads) - 1), sent_a_frame

        confirm, sent_a_frame = self._recovering(add)
        if sent_a_frame:
            os.sched_yield()
        return confirm

    def publish_many(
        self,
        routing_key: str,
        bodies: Iterable[bytes],
        *,
        exchange: str = "",
        persistent: bool = True,
        headers: dict[str, Any] | None = None,
        expiration_ms: int | None = None,
        mandatory: bool = True,
        timeout: float | None = None,
        producer_id: str | bytes | None = None,
        sequence: int | None = None,
    ) -> int:
        """Publish every body (all with ``routing_key``); return once all are confirmed;
        how many. With ``producer_id``, ``sequence`` is the first body's; the others
        follow one by one (see ``publish``)."""
        return self.publish_many_async(
            routing_key,
            bodies,
            exchange=exchange,
            persistent=persistent,
            headers=headers,
            expiration_ms=expiration_ms,
            mandatory=mandatory,
            producer_id=producer_id,
            sequence=sequence,
            awaited=True,
        ).result(timeout)

    def publish_many_async(
        self,
        routing_key: str,
        bodies: Iterable[bytes],
        *,
        exchange: str = "",
        persistent: bool = True,
        headers: dict[str, Any] | None = None,
        expiration_ms: int | None = None,
        mandatory: bool = True,
        producer_id: str | bytes | None = None,
        sequence: int | None = None,
        awaited: bool = False,
    ) -> BatchConfirm:
        """``publish_many`` without waiting: the batch is sent (waiting only for room in
        the window of unconfirmed messages) and its ``BatchConfirm`` returned, so that a
        producer keeps several batches in flight (a stream's group commit then makes one
        fdatasync cover them). ``awaited=True`` says the caller waits for this confirm
        before it publishes more (as ``publish_many`` does): a queue with nothing else to
        handle then writes the batch ahead of its group commit, which shortens that wait
        and would only add writes for a producer keeping batches in flight."""
        encode_body = body_encoder(
            Message(
                b"",
                None,
                headers,
                expiration_ms,
                publish_stamp(producer_id),
                None,
                bool(persistent),
            )
        )
        properties = (bool(persistent), expiration_ms)
        return self._send_runs(
            routing_key,
            ((*properties, [encode_body(b) for b in chunk]) for chunk in read_ahead_chunks(bodies)),
            exchange,
            mandatory,
            producer_id,
            sequence,
            bool(awaited),
        )

    def publish_messages(
        self,
        routing_key: str,
        messages: Iterable[Message],
        *,
        exchange: str = "",
        mandatory: bool = True,
        timeout: float | None = None,
        producer_id: str | bytes | None = None,
        sequence: int | None = None,
    ) -> int:
        """``publish_many`` of ``Message`` objects, each with its own properties; sent
        in batches of consecutive messages that share persistence and TTL."""
        runs = itertools.groupby(messages, lambda m: (m.persistent, m.expiration_ms))
        return self._send_runs(
            routing_key,
            (
                (*properties, [encode(m) for m in chunk])
                for properties, run in runs
                for chunk in read_ahead_chunks(run)
            ),
            exchange,
            mandatory,
            producer_id,
            sequence,
            awaited=True,
        ).result(timeout)

    def _send_runs(
        self,
        routing_key: str,
        runs: Iterable[tuple[bool, int | None, list[bytes]]],
        exchange: str,
        mandatory: bool,
        producer_id: str | bytes | None,
        sequence: int | None,
        awaited: bool,
    ) -> BatchConfirm:
        """Send runs of encoded messages, each run with its persistence and TTL, in
        Publishes of at most ``PUBLISH_BATCH`` messages (when every queue routed to is a
        stream, each Publish is a chunk: a quarter of the window, ``max_in_flight``, up to
        a chunk's limit) and ``PUBLISH_BATCH_BYTES``; their confirm. Each run is checked
        whole before any of it is sent. ``awaited``: the caller waits for the confirm
        before it sends more (``Publish.awaited``). Not made again whole after a
        recovery (``runs`` is read once): what it sent is in the window, sent again by
        the recovery, and it goes on with the rest."""
        producer = producer_bytes(producer_id, sequence)
        with self._lock:
            return self._send_runs_locked(
                routing_key, runs, exchange, mandatory, producer, sequence, awaited
            )

    def _send_runs_locked(
        self,
        routing_key: str,
        runs: Iterable[tuple[bool, int | None, list[bytes]]],
        exchange: str,
        mandatory: bool,
        producer: bytes | None,
        sequence: int | None,
        awaited: bool,
    ) -> BatchConfirm:
        def prepare() -> tuple[list[str], list[QueueRef]]:
            self._flush()
            queues = self._route(exchange, routing_key, mandatory)
            return queues, [self._ref(queue) for queue in queues]

        queues, refs = self._recovering(prepare)
        auto = self._auto_producer(producer, refs)
        most = PUBLISH_BATCH
        if all(map(is_stream_ref, refs)):
            share = self.max_in_flight // STREAM_WINDOW_SHARE
            most = min(MAX_ENTRIES_PER_CHUNK, max(PUBLISH_BATCH, share))
        sent: list[OutgoingPublish] = []
        count = 0
        for persistent, expiration_ms, payloads in runs:
            sizes = list(map(len, payloads))
            if max(sizes) > MAX_MESSAGE_BYTES:
                self._check_size(payloads[sizes.index(max(sizes))])
            for start, stop in byte_batches(sizes, most):
                publish = OutgoingPublish(
                    queues,
                    refs,
                    persistent,
                    expiration_ms,
                    producer,
                    None if sequence is None else sequence + count,
                    awaited,
                )
                publish.payloads = payloads[start:stop]
                publish.bytes = sum(sizes[start:stop])
                if self.blocked:
                    self._wait_while_blocked()
                self._make_room(stop - start, publish.bytes)
                if auto:
                    publish.producer, publish.sequence = self._auto_producers.peek(queues)
                    self._auto_producers.advance(queues, stop - start)
                self._filling = publish
                self._flush()
                sent.append(publish)
                count += stop - start
        return BatchConfirm(self, sent, count)

    @exclusive
    def wait_for_confirms(self, timeout: float | None = None) -> None:
        """Wait until every publish of this connection is confirmed; ``Nacked`` names the
        first that was not (the others are still waited for)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        nacked: Nacked | None = None
        while self._in_flight:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            nacked = nacked or self._settle_oldest(left)
        if nacked is not None:
            raise nacked

    @exclusive
    def flush(self) -> None:
        """Send the messages ``publish_async`` keeps waiting for more to share their frame
        now, rather than within ``linger_s`` (a wait for a confirm, and every other call
        of the connection, sends them first anyway)."""

    def _check_size(self, payload: bytes) -> bytes:
        self._check_open()
        if len(payload) > MAX_MESSAGE_BYTES:
            raise errors.MessageTooLarge(
                f"the message encodes to {len(payload)} bytes, "
                f"above the maximum of {MAX_MESSAGE_BYTES}"
            )
        return payload

    def _route(self, exchange: str, routing_key: str, mandatory: bool) -> list[str]:
        """The queues a message goes to: its exchange's, else its alternate exchange's,
        and so on while none routes it (each exchange once: a loop of them ends); the
        exchanges' bindings are cached for ``ROUTES_TTL_S`` (and dropped by this
        connection's own declarations). An alternate exchange that does not exist
        routes nothing, as RabbitMQ's."""
        self._check_open()
        if exchange == "":
            return [routing_key]
        queues: list[str] = []
        tried = set()
        name = exchange
        while name and name not in tried and not queues:
            tried.add(name)
            try:
                _, kind, bindings, name = self._exchange_routes(name)
            except errors.NotFound:
                if len(tried) == 1:
                    raise  # the exchange published to: the publisher hears of it
                break
            queues = route(kind, bindings, routing_key)
        if not queues and mandatory:
            raise errors.Unroutable(
                f"exchange {exchange!r} routes {routing_key!r} to no "
                f"queue; bind one, or publish with mandatory=False"
            )
        return queues

    def _exchange_routes(self, name: str) -> tuple[float, str, list, str]:
        cached = self._routes.get(name)
        if cached is None or time.monotonic() - cached[0] > ROUTES_TTL_S:
            table = self._node.exchange(name)
            cached = self._routes[name] = (
                time.monotonic(),
                table["kind"],
                table["bindings"],
                table.get("alternate_exchange", ""),  # none from a node before them
            )
        return cached

    @property
    def blocked(self) -> bool:
        """True while a resource alarm of the node holds publishers back."""
        now = time.monotonic()
        if now - self._alarms_read_at > ALARMS_READ_EVERY_S:
            with self._lock:
                try:
                    self._alarms = self._node.active_alarms()
                except NODE_ERRORS:
                    pass  # the node went away: the publishes' confirms say so, and recover
            self._alarms_read_at = now
        return bool(self._alarms)

    def _short_of_copies(self) -> bool:
        """True while the node (a cluster's leader) holds fewer in-sync copies than its
        ``min_insync``: what it has not confirmed yet waits for a follower."""
        return self.blocked and REPLICATION_ALARM in self._alarms

    def _wait_while_blocked(self) -> None:
        deadline = time.monotonic() + self.call_timeout_s
        while self.blocked:
            if self._interrupted.is_set():  # Blocked, not a node error: nothing recovers
                raise errors.Blocked(
                    f"the connection was interrupted while the node's "
                    f"{' and '.join(self._alarms)} alarm held this publish; what it had not "
                    f"sent yet was not sent"
                )
            if time.monotonic() >= deadline:
                raise errors.Blocked(
                    f"the node's {' and '.join(self._alarms)} alarm has held this publish for "
                    f"{self.call_timeout_s:g} s; free the resource (consume messages, free "
                    f"disk space) and publish again"
                )
            self._interrupted.wait(ALARMS_READ_EVERY_S)

    def _make_room(self, messages: int, size: int) -> None:
        """Wait for the oldest confirms until a Publish of ``messages`` and ``size`` bytes
        fits the window."""
        while self._in_flight.full_for(messages, size):
            self._settle_oldest(self.call_timeout_s)

    def _await_publish(
        self, publish: OutgoingPublish, index: int | None, timeout: float | None
    ) -> None:
        """Wait for ``publish``'s answers; ``Nacked`` unless message ``index`` (None: all
        of them) was confirmed by every queue."""
        with self._lock:
            if publish is self._filling:
                self._flush()
            self._answers_of(publish, timeout)
            refusal = publish.refusal(index)
        if refusal is not None:
            raise refusal

    def _settle_oldest(self, timeout: float | None) -> Nacked | None:
        """Wait for the oldest Publish in flight and take it out of the window; why it was
        not confirmed, if it was not (its own publisher learns it from its ``Confirm``)."""
        publish = self._in_flight.oldest()
        self._answers_of(publish, timeout)
        self._in_flight.pop_oldest()
        return publish.refusal(None)

    def _answers_of(self, publish: OutgoingPublish, timeout: float | None) -> None:
        """Wait for ``publish``'s answers; when the node went away meanwhile, recover
        (which sends it again) and wait for the new ones. A refused publish retires the
        connection's own producer of its queues (``AutoProducers``)."""
        while True:
            try:
                publish.answers(timeout, self)
                break
            except NODE_ERRORS as exc:
                if not self._lost(exc):
                    raise
        if publish.refusal(None) is not None:
            self._auto_producers.retire(publish.queues, publish.producer)

"""``Connection``: what a producer or consumer uses to talk to a node's queues.

A publish goes straight from this process to the queue's process (one hop) as one
``Publish`` of encoded messages, and is answered once every message of it is confirmed.
Through an exchange, the message is routed here, from the exchange's bindings (cached
for a second), and sent to each queue it goes to; its confirm comes when every one of
them has confirmed it. A message routed to several queues carries one id to all of them,
so the shared store holds one copy with a reference per queue.
``publish`` waits for that; ``publish_async`` returns a ``Confirm`` at once;
``publish_many`` sends batches and waits for all of them, and marks them so
(``Publish.awaited``): a queue with nothing else to handle writes such a batch before
making its messages' statuses, ahead of its group commit (``docs/queue-engine.md``).

Frames carry many messages, as RabbitMQ's writer batches frames: consecutive
``publish_async`` calls to the same queues with the same properties fill one ``Publish``
(up to ``ASYNC_BATCH`` messages), which is sent when it is full, when anything else is
asked of the connection (a wait for a confirm included), or, for a producer that stopped
calling, by a flusher thread once it is ``linger_s`` (2 ms) old. That thread is the only
one besides the user's: it sends on the user's thread's channel, under the connection's
lock, which every call that uses the transport holds, so what a connection sends keeps
the order of its calls. A publish that sent the frame being filled before adding its
message yields the processor (``sched_yield``) once it has let go of the connection: a
producer calling in a loop keeps its core, and on a machine whose cores are all busy a
thread woken to carry a frame or a confirm (this process's ZeroMQ I/O thread, a queue's,
another client's) otherwise waits for the scheduler's next tick, 4 ms at 250 Hz: measured
under a window-1,000 producer on two cores, another publisher's confirm p99 4.6–6.0 →
3.4–4.3 ms at the same rates. The call costs under a microsecond where nothing else
waits. At most ``max_in_flight`` messages (4000, RabbitMQ's credit) or
``max_in_flight_bytes`` (32 MiB) are unconfirmed per connection, in at most
``MAX_IN_FLIGHT_REQUESTS`` publishes: a publish beyond that waits for the oldest confirms
first. While the node's memory or disk alarm is raised (``blocked``), a publish waits, up
to ``call_timeout_s``, then raises ``Blocked``.

Consumers fetch: ``get`` takes one message; ``consume(queue, prefetch=N)`` iterates,
holding at most N deliveries unacked. Every delivery awaiting an ack is this
connection's; ``Delivery.ack``, ``nack`` and ``reject`` settle it (``multiple=True``
settles every earlier one the connection holds from that queue too). Settles are sent
without waiting (the connection checks its tags itself). A connection that
closes hands its unacked deliveries back to their queues before ``close`` returns; one
whose process ends (killed, or a zombie not reaped yet) has them requeued by the queue as
soon as the kernel closes its sockets, after the acks it sent before it ended.

When the node goes away (killed, restarted, its tcp listener restarted), a connection
made by ``connect`` recovers by itself (``warren.queues.client.recovery``): it connects
again, declares again what it declared, sends again the publishes in doubt and
subscribes its consumers again; each call that found the loss is made again, or goes
on, once it recovered. Without recovery the loss closes the connection:
``ConnectionClosed``, whichever call found it.

The parts: ``warren.queues.client.publishing`` (frames, confirms, the flusher),
``warren.queues.client.consuming`` (deliveries, consumers, settles),
``warren.queues.client.queue_refs`` (asking one queue incarnation) and recovery; this
module is the connection itself, which holds their state under its lock.

Errors (``warren.queues.errors``): ``NotFound`` for an unknown queue, ``Nacked`` for a
publish the queue did not confirm (it was deleted, or it restarted with the message in
doubt while the node lived: publish it again), ``UnknownDeliveryTag`` for an ack of a
delivery this connection does not hold, ``MessageTooLarge``, ``InvalidMessage``,
``Unroutable``, ``Blocked``, ``ConnectionClosed`` (closed, or its node went away and it
did not recover). A ``Connection`` is used from one thread; open one per thread or
process.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple, TypeVar, cast

from warren.actors import ActorDeadError, ActorError, RemoteError
from warren.actors.flow import MAX_IN_FLIGHT, MAX_IN_FLIGHT_BYTES, CreditWindow

from .. import errors
from ..errors import (
    ConnectionClosed,
    InvalidArgument,
    Nacked,
    NodeNotRunning,
    QueueError,
    local_error,
)
from ..message import MAX_MESSAGE_BYTES, Message, body_encoder, decode, encode
from ..protocol import (
    MAX_ENTRIES_PER_CHUNK,
    Fetch,
    LastSequence,
    NodeHandle,
    Purge,
    QueryOffset,
    QueueDefinition,
    QueueRef,
    QueueStats,
    Release,
    Settle,
    StoreOffset,
    Subscribe,
    check_tracking_name,
    server_named_queue,
)
from ..routing import route
from .consuming import SETTLE_BATCH, Consumer, Delivery, PendingSettles, check_timeout
from .publishing import (
    ASYNC_BATCH,
    ASYNC_BATCH_BYTES,
    BUSY_DOUBLINGS,
    BUSY_RECHECK_S,
    LINGER_S,
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
from .queue_refs import await_answer, is_stream_ref
from .recovery import (
    RECOVERY_INTERVAL_S,
    RECOVERY_TIMEOUT_S,
    AutoProducers,
    NodeLost,
    Topology,
    backoff,
    check_recovery_options,
    notify,
)
from .stream import StreamConsumer

__all__ = ["BatchConfirm", "Confirm", "Connection", "Consumer", "Delivery", "QueueDeclared"]

log = logging.getLogger("warren.queues")

CALL_TIMEOUT_S = 60.0
ROUTES_TTL_S = 1.0  # how long an exchange's bindings are routed with
CLOSE_WAIT_S = 2.0  # how long close waits for its queues to confirm they took its settles
ALARMS_READ_EVERY_S = 0.1  # how stale a publisher's view of the alarms may be
# what a call raises when the node it went to is no longer there (or a queue restarted)
NODE_ERRORS = (NodeNotRunning, ConnectionClosed, ActorDeadError)


class QueueDeclared(NamedTuple):
    """What a declare answers (AMQP's declare-ok): the queue, how many messages are ready
    in it, how many consumers are subscribed; the counts are None while the queue's
    process does not answer (restarting, or down after repeated crashes)."""

    queue: str
    message_count: int | None
    consumer_count: int | None


Call = TypeVar("Call", bound=Callable[..., Any])
Result = TypeVar("Result")


def _exclusive(call: Call) -> Call:
    """A call of the connection that uses its transport: it holds the connection's lock
    (the flusher thread sends nothing meanwhile) and sends what ``publish_async`` keeps
    first, so that everything the connection sends stays in the order it was called.
    A call that finds the node gone is made again once the connection recovered (each
    such call changes nothing twice: see ``Connection._recovering``)."""

    @functools.wraps(call)
    def exclusive(self: Connection, *args: Any, **kwargs: Any) -> Any:
        return self._recovering(functools.partial(call, self, *args, **kwargs), flush=True)

    return cast(Call, exclusive)


class Connection:
    def __init__(
        self,
        node: NodeHandle,
        *,
        max_in_flight: int = MAX_IN_FLIGHT,
        max_in_flight_bytes: int = MAX_IN_FLIGHT_BYTES,
        call_timeout_s: float = CALL_TIMEOUT_S,
        linger_s: float = LINGER_S,
        on_close: Callable[[], None] | None = None,
        reconnect: Callable[[float], NodeHandle] | None = None,
        recover: bool = True,
        idempotent: bool = False,
        recovery_interval_s: float = RECOVERY_INTERVAL_S,
        recovery_timeout_s: float = RECOVERY_TIMEOUT_S,
        on_disconnect: Callable[[Exception], None] | None = None,
        on_recovery: Callable[[Connection], None] | None = None,
    ) -> None:
        """``linger_s``: how long a message of ``publish_async`` may wait in the
        connection for more to share its frame (0: each goes at once, alone).
        ``on_close`` runs once when the connection closes: ``connect`` passes the
        transport it opened for this connection, which nothing else uses.

        Recovery (``warren.queues.client.recovery``): ``reconnect(timeout_s)`` opens a
        new transport to the same node, waiting at most ``timeout_s`` for its first
        answer (``connect`` passes one); with it and ``recover``
        (the default), a connection whose node went away connects again, waiting
        ``recovery_interval_s`` (doubling) between attempts for up to
        ``recovery_timeout_s``, and rebuilds what it had. ``on_disconnect(error)`` runs
        when the loss is found, ``on_recovery(connection)`` once it recovered. Without
        recovery, the loss closes the connection and raises ``ConnectionClosed``.
        A publish in doubt is sent again when it has a producer id, the application's
        or, with ``idempotent``, the connection's own (``AutoProducers``): a queue drops
        the repeat. Without one it is ``Nacked`` (it may or may not have been taken)."""
        if type(linger_s) not in (int, float) or not 0 <= linger_s <= 1:
            raise InvalidArgument(f"linger_s must be a number of seconds in 0..1, got {linger_s!r}")
        for value, what in (
            (max_in_flight, "max_in_flight"),
            (max_in_flight_bytes, "max_in_flight_bytes"),
        ):
            if type(value) is not int or value < 1:
                raise InvalidArgument(f"{what} must be an int >= 1, got {value!r}")
        check_timeout(call_timeout_s, "call_timeout_s")
        check_recovery_options(recovery_interval_s, recovery_timeout_s)
        self._node = node
        self._on_close = on_close
        self._reconnect = reconnect
        self.recover = bool(recover) and reconnect is not None
        self.idempotent = bool(idempotent)
        self.recovery_interval_s = recovery_interval_s
        self.recovery_timeout_s = recovery_timeout_s
        self.on_disconnect = on_disconnect
        self.on_recovery = on_recovery
        self.recoveries = 0  # how many times it recovered
        self._recovering_now = False
        self._topology = Topology()
        self._auto_producers = AutoProducers()
        # the consumers to start again after a recovery (a cancelled one leaves itself)
        self._consumers: weakref.WeakSet[Consumer | StreamConsumer] = weakref.WeakSet()
        self.session = 0  # its sessions with a node: one more at each recovery
        self.max_in_flight = max_in_flight
        self.max_in_flight_bytes = max_in_flight_bytes
        self.call_timeout_s = call_timeout_s
        self.consumer_id = os.urandom(16)
        self._pid = os.getpid()
        self._refs: dict[str, QueueRef] = {}
        self.linger_s = linger_s
        self._in_flight: CreditWindow[OutgoingPublish] = CreditWindow(
            max_in_flight, max_in_flight_bytes
        )
        self._filling: OutgoingPublish | None = None  # what publish_async fills, not sent yet
        self._settling: PendingSettles | None = None  # what acks, nacks and rejects fill
        self._busy_rechecks = 0  # the flusher found the connection in use this many times
        self._batch = max(1, min(ASYNC_BATCH, max_in_flight // 4))
        # Held by every call that uses the transport, and by the flusher thread while it
        # sends a lingering Publish: the one thing the connection shares with a thread.
        self._lock = threading.RLock()
        self._held: dict[str, dict[int, Delivery]] = {}  # queue -> tag -> delivery
        self._subscribed: set[str] = set()  # queues it has consumed from
        self._settled: set[str] = set()  # queues it sent settles to
        # exchange -> (read at, kind, bindings, alternate exchange)
        self._routes: dict[str, tuple[float, str, list, str]] = {}
        self._alarms: list[str] = []
        self._alarms_read_at = float("-inf")
        self._closed = False

    # ------------------------------------------------------------------ declarations

    @_exclusive
    def declare_queue(self, name: str, *, passive: bool = False, **arguments: Any) -> QueueDeclared:
        """Create the queue unless it exists (``PreconditionFailed`` if it exists with
        other arguments). The arguments are ``QueueDefinition``'s: ``durable`` (True),
        ``lazy`` (False), ``message_ttl_ms``, ``max_length``, ``overflow`` ("drop-head"
        or "reject-publish"), ``dead_letter_exchange``, ``dead_letter_routing_key``
        (None: each message's own), ``auto_delete`` (False), ``expires_ms`` (None: the
        queue never expires; else it deletes itself once unused that long); a bad
        one raises here, before anything is sent. ``passive=True`` creates nothing and
        raises ``NotFound`` unless the queue exists. Returns the queue's ``QueueDeclared``
        (its name, ready messages and consumers), as AMQP's declare-ok does. A queue
        declared with the name ``""`` is given one (``amq.gen-...``, as RabbitMQ names
        it): ``QueueDeclared.queue`` says which."""
        self._check_open()
        if name == "" and not passive:
            name = server_named_queue()
        if not passive:
            QueueDefinition(name, **arguments)
        answer = self._node.declare_queue(name, passive=passive, **arguments)
        if not passive:
            self._topology.queue_declared(name, arguments)
        return QueueDeclared(answer["queue"], answer["message_count"], answer["consumer_count"])

    @_exclusive
    def delete_queue(self, name: str) -> int:
        self._check_open()
        self._refs.pop(name, None)
        self._routes.clear()
        self._topology.queue_deleted(name)
        return self._node.delete_queue(name)

    @_exclusive
    def declare_exchange(
        self,
        name: str,
        kind: str = "direct",
        durable: bool = True,
        *,
        auto_delete: bool = False,
        internal: bool = False,
        alternate_exchange: str = "",
    ) -> None:
        """``direct``, ``fanout`` or ``topic`` (the default exchange ``""`` always exists);
        ``auto_delete``: it goes with its last binding; ``internal``: AMQP clients may
        not publish to it; ``alternate_exchange``: where a message it routes to no queue
        goes instead (and on, to that one's, while none routes it)."""
        self._check_open()
        options: dict[str, Any] = {
            "durable": durable,
            "auto_delete": auto_delete,
            "internal": internal,
            "alternate_exchange": alternate_exchange,
        }
        self._node.declare_exchange(name, kind=kind, **options)
        self._topology.exchange_declared(name, kind, options)

    @_exclusive
    def bind_queue(self, queue: str, exchange: str, routing_key: str = "") -> None:
        self._check_open()
        self._node.bind_queue(queue, exchange, routing_key)
        self._topology.bound(queue, exchange, routing_key)
        self._routes.pop(exchange, None)

    @_exclusive
    def unbind_queue(self, queue: str, exchange: str, routing_key: str = "") -> None:
        """Undo ``bind_queue`` (nothing happens for a binding that is not there)."""
        self._check_open()
        self._topology.unbound(queue, exchange, routing_key)
        self._node.unbind_queue(queue, exchange, routing_key)
        self._routes.pop(exchange, None)

    @_exclusive
    def delete_exchange(self, name: str) -> None:
        """Delete an exchange and its bindings; the queues it routed to stay."""
        self._check_open()
        self._topology.exchange_deleted(name)
        self._node.delete_exchange(name)
        self._routes.pop(name, None)

    @_exclusive
    def forget_routes(self) -> None:
        """Drop the exchanges' bindings this connection routes with (each is kept for
        ``ROUTES_TTL_S``): the next publish through an exchange reads them from the node.
        For a process that hears of another connection's binding (the AMQP port, whose
        clients bind for each other)."""
        self._routes.clear()

    @_exclusive
    def list_exchanges(self) -> list[dict[str, Any]]:
        """Every declared exchange as ``{"name", "kind", "durable"}``."""
        self._check_open()
        return self._node.list_exchanges()

    @_exclusive
    def list_bindings(self) -> list[dict[str, str]]:
        """Every binding as ``{"exchange", "queue", "routing_key"}``."""
        self._check_open()
        return self._node.list_bindings()

    @_exclusive
    def list_queues(self) -> list[str]:
        self._check_open()
        return self._node.list_queues()

    @_exclusive
    def queue_state(self, name: str) -> str:
        """``running``, ``restarting`` or ``crashed`` (it kept crashing and stays down)."""
        self._check_open()
        return self._node.queue_state(name)

    @_exclusive
    def purge_queue(self, name: str) -> int:
        return self._ask(name, Purge())

    @_exclusive
    def queue_stats(self, name: str) -> dict[str, Any]:
        return self._ask(name, QueueStats())

    # ------------------------------------------------------------------ publishing

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

    @_exclusive
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

    @_exclusive
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

    def _wait_while_blocked(self) -> None:
        deadline = time.monotonic() + self.call_timeout_s
        while self.blocked:
            if time.monotonic() >= deadline:
                raise errors.Blocked(
                    f"the node's {' and '.join(self._alarms)} alarm has held this publish for "
                    f"{self.call_timeout_s:g} s; free the resource (consume messages, free "
                    f"disk space) and publish again"
                )
            time.sleep(ALARMS_READ_EVERY_S)

    def _make_room(self, messages: int, size: int) -> None:
        """Wait for the oldest confirms until a Publish of ``messages`` and ``size`` bytes
        fits the window."""
        while self._in_flight.full_for(messages, size):
            self._settle_oldest(self.call_timeout_s)

    def _flush(self) -> None:
        """Send the Publish being filled, if any (into the window it made room in), and
        the Settle being filled. A Settle that cannot be sent is dropped: its queue is
        gone or unreachable, and requeues the deliveries itself (at least once, never
        lost)."""
        publish = self._filling
        if publish is not None:
            self._filling = None
            publish.send(self)
            self._in_flight.add(publish, len(publish.payloads), publish.bytes)
        settles = self._settling
        if settles is not None:
            self._settling = None
            try:
                settles.ref.tell(
                    Settle(self.consumer_id, sorted(settles.tags), settles.action),
                    self.call_timeout_s,
                    settles.channel,
                )
            except (ActorError, QueueError, OSError) as exc:
                log.warning(
                    "%d %s settles of queue %s were not sent (%s); it redelivers those messages",
                    len(settles.tags),
                    settles.action,
                    settles.queue,
                    exc,
                )

    def _flush_lingering(self) -> None:
        """The flusher thread's call: send the Publish and Settle being filled once the
        older is ``linger_s`` old, unless the connection is in use (its user sends them
        then)."""
        if not self._lock.acquire(blocking=False):
            # In use: a wait that holds the lock sent everything first, and a publish
            # sends what it finds older than linger_s; look again, ever less often.
            self._busy_rechecks = min(self._busy_rechecks + 1, BUSY_DOUBLINGS)
            wait = min(self.linger_s * 2**self._busy_rechecks, BUSY_RECHECK_S)
            flusher().watch(self, time.monotonic() + wait)
            return
        self._busy_rechecks = 0
        try:
            filling = [f for f in (self._filling, self._settling) if f is not None]
            if not filling or self._closed:
                return
            due = min(f.started for f in filling) + self.linger_s
            if due > time.monotonic():
                flusher().watch(self, due)
                return
            self._flush()
        finally:
            self._lock.release()

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
                publish.answers(timeout, self._queue_died)
                break
            except NODE_ERRORS as exc:
                if not self._lost(exc):
                    raise
        if publish.refusal(None) is not None:
            self._auto_producers.retire(publish.queues, publish.producer)

    # ------------------------------------------------------------------ consuming

    @_exclusive
    def get(self, queue: str, *, ack: bool = True) -> Delivery | None:
        """The next message of ``queue``, or None when it is empty; with ``ack`` it
        awaits ``Delivery.ack`` (or nack, reject)."""
        if self.is_stream(queue):
            raise errors.UnsupportedOperation(
                f"{queue!r} is a stream: read it with consume({queue!r}, offset=...)"
            )
        deliveries = self._fetch(queue, 1, ack)
        return deliveries[0] if deliveries else None

    @_exclusive
    def consume(
        self,
        queue: str,
        prefetch: int = 100,
        *,
        inactivity_timeout: float | None = None,
        offset: object = None,
        name: str | None = None,
        **stream_options: Any,
    ) -> Consumer | StreamConsumer:
        """Iterate over ``queue``'s messages, at most ``prefetch`` unacked at a time. The
        iteration waits for the next message for ever, or, with ``inactivity_timeout``,
        ends (and the consumer is cancelled) once no message came for that many seconds:
        ``for delivery in connection.consume(q, inactivity_timeout=5)`` drains a queue
        and stops. ``Consumer.get(timeout)`` takes one message at a time instead.

        A stream is read instead (``StreamConsumer``, ``warren.queues.client.stream``):
        from ``offset`` ("first", "last", "next" by default, an offset, a datetime, a
        ``Timestamp`` or an interval like "1h"), nothing taken away, no ack; ``name``
        makes it a named consumer, which stores its offset on the node (every
        ``store_every`` records and ``store_interval_s`` seconds) and resumes after it."""
        if type(prefetch) is not int or prefetch < 1:
            raise InvalidArgument(f"prefetch must be an int >= 1, got {prefetch!r}")
        if inactivity_timeout is not None:
            check_timeout(inactivity_timeout, "inactivity_timeout")
        if self.is_stream(queue):
            if name is not None:
                check_tracking_name(name)
            reader = StreamConsumer(
                self,
                queue,
                self._ref(queue),
                "next" if offset is None else offset,
                name=name,
                prefetch=prefetch,
                inactivity_timeout=inactivity_timeout,
                **stream_options,
            )
            self._consumers.add(reader)
            return reader
        if offset is not None or name is not None or stream_options:
            raise errors.UnsupportedOperation(
                f"queue {queue!r} is a classic queue: offset, name and "
                f"{', '.join(stream_options) or 'the store options'} are for streams"
            )
        self._subscribe(queue, True, prefetch)
        consumer = Consumer(self, queue, prefetch, inactivity_timeout)
        self._consumers.add(consumer)
        return consumer

    # ------------------------------------------------------------------ streams

    @_exclusive
    def store_offset(self, stream: str, name: str, offset: int) -> None:
        """Store ``offset`` as the last one consumer ``name`` processed: a named consumer
        resumes after it. It is durable with the stream's next group commit."""
        if type(offset) is not int or offset < 0:
            raise errors.InvalidArgument(f"a stream offset is an int >= 0, got {offset!r}")
        self._ask(self._stream_only(stream), StoreOffset(check_tracking_name(name), offset))

    @_exclusive
    def query_offset(self, stream: str, name: str) -> int | None:
        """The offset stored for consumer ``name``, None when there is none."""
        return self._ask(self._stream_only(stream), QueryOffset(check_tracking_name(name)))

    @_exclusive
    def reset_offset(self, stream: str, name: str) -> None:
        """Forget consumer ``name``'s offset: it next starts where ``consume`` says."""
        self._ask(self._stream_only(stream), StoreOffset(check_tracking_name(name), None))

    @_exclusive
    def last_sequence(self, stream: str, producer_id: str | bytes) -> int | None:
        """The last sequence ``stream`` took from ``producer_id`` (None: none yet): a
        producer that restarts publishes on from the one after it."""
        producer = producer_bytes(producer_id, 0)
        assert producer is not None  # a producer id was given
        return self._ask(self._stream_only(stream), LastSequence(producer))

    @_exclusive
    def is_stream(self, queue: str) -> bool:
        """Whether ``queue`` is a stream (declared with type="stream")."""
        return is_stream_ref(self._ref(queue))

    def _stream_only(self, queue: str) -> str:
        if not self.is_stream(queue):
            raise errors.UnsupportedOperation(
                f"queue {queue!r} is a classic queue: stored offsets and sequences are a "
                f"stream's (declare one with type='stream')"
            )
        return queue

    @_exclusive
    def _request(self, queue: str, request: Any) -> Any:
        """``_ask`` for a caller outside the connection (a stream consumer)."""
        return self._ask(queue, request)

    @_exclusive
    def _tell(self, queue: str, message: Any) -> None:
        """Send without an answer; lost if the process is restarting (what is told this
        way may be: a stored offset sent again later)."""
        try:
            self._ref(queue).tell(message, timeout=self.call_timeout_s)
        except ActorError:
            self._forget(queue)

    @_exclusive
    def _subscribe(self, queue: str, active: bool, prefetch: int = 0) -> None:
        self._ref(queue).tell(
            Subscribe(self.consumer_id, self._pid, active, prefetch), timeout=self.call_timeout_s
        )
        if active:
            self._subscribed.add(queue)

    @_exclusive
    def _fetch(self, queue: str, count: int, ack: bool) -> list[Delivery]:
        return self._deliveries(queue, self._ask(queue, self._fetch_request(count, ack)), ack)

    @_exclusive
    def _fetch_async(self, queue: str, count: int) -> tuple[QueueRef, Any]:
        """Ask for up to ``count`` deliveries awaiting acks without waiting for them (a
        consumer's next fetch, sent while it hands out the last one's): its answer for
        ``_fetched``."""
        ref = self._ref(queue)
        return ref, ref.ask_async(self._fetch_request(count, True), timeout=self.call_timeout_s)

    @_exclusive
    def _fetched(self, queue: str, asked: tuple[QueueRef, Any]) -> list[Delivery]:
        """The deliveries ``_fetch_async`` asked for; none from a queue that restarted
        meanwhile (the fetch died with it, and it has every message back)."""
        ref, future = asked
        try:
            answer = await_answer(ref, future, self.call_timeout_s)
        except NODE_ERRORS as exc:  # first: a stopping queue's answer is a RemoteError too
            # The fetch died with the queue, or with the node (recover first): either
            # way the queue has every message back.
            lost = (
                self._queue_died(queue)
                if isinstance(exc, ActorDeadError)
                else NodeLost(str(exc))
                if self._node_gone(exc)
                else None
            )
            if lost is not None and not self._lost(lost):
                raise lost from exc
            if lost is None and not isinstance(exc, ActorDeadError):
                raise
            return []
        except RemoteError as exc:
            raise local_error(exc.type_name, exc.message, exc.remote_traceback) from None
        return self._deliveries(queue, answer, True)

    def _fetch_request(self, count: int, ack: bool) -> Fetch:
        return Fetch(self.consumer_id, self._pid, count, ack)

    def _deliveries(self, queue: str, answer: list[Any], ack: bool) -> list[Delivery]:
        deliveries = [
            Delivery(self, queue, d.seq_id, decode(d.payload), d.delivery_count, ack)
            for d in answer
        ]
        if ack:
            held = self._held.setdefault(queue, {})
            for delivery in deliveries:
                held[delivery.delivery_tag] = delivery
        return deliveries

    def held(self, queue: str) -> int:
        """Deliveries of ``queue`` this connection holds unacked."""
        return len(self._held.get(queue, ()))

    def _settle(self, delivery: Delivery, action: str, multiple: bool) -> None:
        """Settle the delivery (and the earlier ones, ``multiple``). Consecutive settles of
        one queue with the same action share a ``Settle``, sent as publishes are: when it
        is full, at the connection's next call, or within ``linger_s``."""
        with self._lock:
            self._check_open()
            if delivery.session != self.session:
                return  # held by a session before a recovery: the node requeued it
            queue = delivery.queue
            held = self._held.get(queue, {})
            if delivery.delivery_tag not in held:
                raise errors.UnknownDeliveryTag(
                    f"delivery {delivery.delivery_tag} of queue {queue!r} is not awaiting "
                    f"an ack from this connection (already settled, or fetched without ack)"
                )
            tags = (
                [t for t in held if t <= delivery.delivery_tag]
                if multiple
                else [delivery.delivery_tag]
            )
            settles = self._settling
            if settles is not None and (
                settles.queue != queue
                or settles.action != action
                or len(settles.tags) >= SETTLE_BATCH
            ):
                self._flush()
                settles = None
            if settles is None:
                settles = self._settling = PendingSettles(queue, self._ref(queue), action)
                if self.linger_s:
                    flusher().watch(self, settles.started + self.linger_s)
            settles.tags += tags
            self._settled.add(queue)
            for tag in tags:
                del held[tag]
            if not self.linger_s:
                self._flush()

    @_exclusive
    def _give_back(self, queue: str, tags: list[int]) -> None:
        """Requeue deliveries fetched but never handed to the application."""
        self._ref(queue).tell(
            Settle(self.consumer_id, sorted(tags), "requeue"), timeout=self.call_timeout_s
        )
        held = self._held.get(queue, {})
        for tag in tags:
            held.pop(tag, None)

    # ------------------------------------------------------------------ plumbing

    def _ref(self, queue: str) -> QueueRef:
        self._check_open()
        ref = self._refs.get(queue)
        if ref is None:
            # Pinned: what this connection sends reaches the incarnation it knows, or
            # nothing (its successor drops it), so a request the connection gives up as
            # lost cannot still be applied by the next incarnation behind its back.
            ref = self._refs[queue] = self._node.queue(queue).pin()
        return ref

    def _ask(self, queue: str, request: Any) -> Any:
        """Ask the queue; once more of its next incarnation if it restarted meanwhile
        (what is asked this way changes nothing twice: a fetch lost with the old one
        delivered nothing, the restarted queue has every message back)."""
        for attempt in (1, 2):
            ref = self._ref(queue)
            try:
                return await_answer(
                    ref, ref.ask_async(request, timeout=self.call_timeout_s), self.call_timeout_s
                )
            except ActorDeadError:  # first: a stopping queue's answer is a RemoteError too
                lost = self._queue_died(queue)
                if lost is not None:
                    raise lost from None
                if attempt == 2:
                    raise Nacked(
                        f"queue {queue!r} restarted twice during one call; try again"
                    ) from None
            except RemoteError as exc:
                raise local_error(exc.type_name, exc.message, exc.remote_traceback) from None

    def _forget(self, queue: str) -> None:
        """Drop the cached ref of a queue that restarted: the next call asks the node."""
        self._refs.pop(queue, None)

    # ------------------------------------------------------------------ recovery

    def _recovering(self, call: Callable[[], Result], flush: bool = False) -> Result:
        """``call()`` under the connection's lock (after sending what ``publish_async``
        keeps, with ``flush``); when it finds the node gone, recover and call it again,
        or close and raise ``ConnectionClosed``. Only for calls that change nothing
        twice: a declaration, a read, a fetch (lost with the node: the node has every
        message back), a subscribe."""
        with self._lock:
            while True:
                try:
                    if flush:
                        self._flush()
                    return call()
                except NODE_ERRORS as exc:
                    if not self._lost(exc):
                        raise

    def _auto_producer(self, producer: bytes | None, refs: list[QueueRef]) -> bool:
        """Whether a publish to ``refs`` gets the connection's own producer id: when the
        application gave none, the connection recovers and is ``idempotent``, and no
        queue is a stream."""
        return (
            producer is None
            and self.idempotent
            and self.recover
            and not any(map(is_stream_ref, refs))
        )

    def _node_gone(self, error: BaseException | None = None) -> bool:
        """Whether the node (the tcp listener) this connection spoke to went away, as
        opposed to one of its queues restarting."""
        if isinstance(error, NodeLost):
            return True
        gone = getattr(self._node, "gone", None)
        return gone is not None and bool(gone())

    def _queue_died(self, queue: str) -> NodeLost | None:
        """A queue's process went away before it answered: forget its ref; the
        ``NodeLost`` to raise if the whole node went away with it."""
        self._forget(queue)
        if self._node_gone():
            return NodeLost(f"the node went away while queue {queue!r} was answering")
        return None

    def _lost(self, error: BaseException) -> bool:
        """``error`` came from a call to the node or a queue: True once the connection
        recovered from the node going away (make the call again); False when it is not
        that (raise ``error`` on); ``ConnectionClosed`` when the connection does not
        recover, or gave up."""
        if self._closed or self._recovering_now or not self._node_gone(error):
            return False
        notify(self.on_disconnect, error)
        if not self.recover:
            self._abandon()
            how = (
                "connect again (connect(..., recover=True) does it by itself)"
                if self._reconnect is not None
                else "connect again"
            )
            raise ConnectionClosed(
                f"the node went away ({error}); this connection is closed: {how}"
            ) from error
        self._recover(error)
        return True

    def _abandon(self) -> None:
        """Close a connection whose node went away: nothing to hand back (the node
        requeued what it held), nothing more to wait for."""
        self._closed = True
        self._filling = self._settling = None
        self._in_flight.clear()
        self._held.clear()
        if self._on_close is not None:
            self._on_close()

    def _recover(self, error: BaseException) -> None:
        """Connect again and rebuild (``warren.queues.client.recovery``); or close and
        raise ``ConnectionClosed`` after ``recovery_timeout_s``."""
        assert self._reconnect is not None, "recover is set only with a reconnect"
        log.warning("the node went away (%s); recovering the connection", error)
        deadline = time.monotonic() + self.recovery_timeout_s
        waits = backoff(self.recovery_interval_s)
        self._recovering_now = True
        try:
            while True:
                try:
                    # an attempt waits for the node no longer than the recovery has left
                    self._new_session(deadline - time.monotonic())
                    break
                except errors.PreconditionFailed as exc:
                    # the restarted node holds a queue this connection declared with other
                    # arguments: no attempt can change that
                    self._abandon()
                    raise ConnectionClosed(
                        f"the node went away and, back, refuses what this connection "
                        f"declared ({exc}); this connection is closed"
                    ) from exc
                except (QueueError, ActorError, OSError, TimeoutError) as exc:
                    error = exc  # the node is away, or starting, again: another attempt
                wait = next(waits)
                log.warning(
                    "a recovery attempt failed (%s: %s); the next in %.1f s",
                    type(error).__name__,
                    error,
                    wait,
                )
                if time.monotonic() + wait >= deadline:
                    self._abandon()
                    raise ConnectionClosed(
                        f"the node went away and did not come back within "
                        f"{self.recovery_timeout_s:g} s ({error}); this connection is closed"
                    ) from error
                time.sleep(wait)
        finally:
            self._recovering_now = False
        self.recoveries += 1
        log.warning("the connection recovered (recovery %d)", self.recoveries)
        notify(self.on_recovery, self)

    def _new_session(self, connect_timeout_s: float) -> None:
        """One attempt at recovery: a new transport (which waits for the node's first
        answer at most ``connect_timeout_s``), what was declared, the publishes in
        doubt, the consumers. What fails here fails the attempt."""
        if self._on_close is not None:
            self._on_close()  # the old transport: what it still queues must not go out
        assert self._reconnect is not None
        self._node = self._reconnect(connect_timeout_s)
        self._on_close = getattr(self._node, "close", None)
        self._refs.clear()
        self._routes.clear()
        self._alarms_read_at = float("-inf")
        self.session += 1
        self.consumer_id = os.urandom(16)  # the node requeued what the old one held
        self._held.clear()
        self._settled.clear()
        self._subscribed.clear()
        self._settling = None
        self._topology.declare_on(self._node)
        for publish in self._in_flight:
            if publish.answered and publish.lost is None:
                continue
            if publish.producer is not None:
                publish.resend(self)
            else:  # sent again, it could be taken twice: its publisher decides
                publish.fail(
                    Nacked(
                        "the node went away before confirming this publish; the connection "
                        "recovered, but the message is in doubt: publish it again (with a "
                        "producer_id, or connect(..., idempotent=True), the connection "
                        "sends it again itself, without duplicates)"
                    )
                )
        for consumer in list(self._consumers):
            consumer._recovered()

    def _consumer_done(self, consumer: Consumer | StreamConsumer) -> None:
        self._consumers.discard(consumer)

    def _check_open(self) -> None:
        if self._closed:
            raise ConnectionClosed("this connection is closed; open a new one")

    @_exclusive
    def close(self) -> None:
        """Hand every unacked delivery back to its queue, after the acks sent before (a
        round trip to each queue it settled with makes sure they arrived: a process that
        exits right after closing must not leave its last acks in a socket, to be
        redelivered); later calls raise ``ConnectionClosed``. Unconfirmed publishes are
        not waited for."""
        if self._closed:
            return
        touched = sorted(
            self._subscribed | self._settled | {q for q, held in self._held.items() if held}
        )
        answers = []
        for queue in touched:
            try:
                ref = self._ref(queue)
                ref.tell(Release(self.consumer_id), timeout=1.0)
                answers.append(ref.ask_async(QueueStats(), timeout=CLOSE_WAIT_S))
            except (ActorError, QueueError, OSError):
                pass  # the queue requeues them itself when it notices
        deadline = time.monotonic() + CLOSE_WAIT_S
        for answer in answers:
            try:
                answer.get(timeout=max(0.0, deadline - time.monotonic()))
            except (ActorError, QueueError, OSError, TimeoutError):
                pass  # gone or silent: it requeues what it holds when it notices
        self._settled.clear()
        self._held.clear()
        self._subscribed.clear()
        self._closed = True
        if self._on_close is not None:
            self._on_close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

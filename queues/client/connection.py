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

Errors (``warren.queues.errors``): ``NotFound`` for an unknown queue, ``Nacked`` for a
publish the queue did not confirm (it was deleted, or it restarted with the message in
doubt: publish it again), ``UnknownDeliveryTag`` for an ack of a delivery this
connection does not hold, ``MessageTooLarge``, ``InvalidMessage``, ``Unroutable``,
``Blocked``, ``ConnectionClosed``. A ``Connection`` is used from one thread; open one per
thread or process.
"""

from __future__ import annotations

import atexit
import collections
import functools
import itertools
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple, TypeVar, cast

from warren.actors import ActorDeadError, ActorError, ActorRef, AskTimeout, RemoteError
from warren.actors.flow import MAX_IN_FLIGHT, MAX_IN_FLIGHT_BYTES, CreditWindow
from warren.actors.process import process_exists

from .. import errors
from ..errors import ConnectionClosed, Nacked, QueueError, local_error
from ..message import MAX_MESSAGE_BYTES, Message, body_encoder, decode, encode
from ..protocol import (
    MAX_ENTRIES_PER_CHUNK,
    MAX_PRODUCER_BYTES,
    MAX_SEQUENCE,
    STREAM_ACTOR_PREFIX,
    Fetch,
    LastSequence,
    NodeHandle,
    Publish,
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
)
from ..routing import route
from .stream import StreamConsumer
from .tcp_node import RemoteQueue

__all__ = ["BatchConfirm", "Confirm", "Connection", "Consumer", "Delivery", "QueueDeclared"]

log = logging.getLogger("warren.queues")

PUBLISH_BATCH = 500  # messages per Publish from publish_many, to a queue
# and to streams only: a Publish is one chunk of the stream, so a batch is kept whole up
# to a quarter of the connection's window (four share it) and a chunk's limit
STREAM_WINDOW_SHARE = 4
PUBLISH_BATCH_BYTES = 4 * 2**20
READ_AHEAD = 4096  # messages publish_many takes from its iterable at a time, at most
READ_AHEAD_STEP = 64  # and in steps of this many, stopping at PUBLISH_BATCH_BYTES
LINGER_S = 0.002  # how long publish_async's messages wait for more to share their frame
ASYNC_BATCH = 64  # publish_async's messages per frame, at most
ASYNC_BATCH_BYTES = 256 * 2**10
SETTLE_BATCH = 1000  # tags per Settle, at most
BUSY_RECHECK_S = 0.05  # the longest the flusher waits to look again at a busy connection
BUSY_DOUBLINGS = 8  # how many times that wait doubles from linger_s (reaching the above)
EXIT_FLUSH_WAIT_S = 1.0  # how long an exiting process waits for a busy connection to flush
CALL_TIMEOUT_S = 60.0
ROUTES_TTL_S = 1.0  # how long an exchange's bindings are routed with
RESTART_CHECK_S = 1.0  # how often a wait looks whether its queue restarted
CLOSE_WAIT_S = 2.0  # how long close waits for its queues to confirm they took its settles
ALARMS_READ_EVERY_S = 0.1  # how stale a publisher's view of the alarms may be
IDLE_POLL_S = (0.001, 0.05)  # a consumer's wait between empty fetches: from, to


class QueueDeclared(NamedTuple):
    """What a declare answers (AMQP's declare-ok): the queue, how many messages are ready
    in it, how many consumers are subscribed; the counts are None while the queue's
    process does not answer (restarting, or down after repeated crashes)."""

    queue: str
    message_count: int | None
    consumer_count: int | None


class Confirm:
    """The confirm of one ``publish_async``: ``result(timeout)`` returns once every queue
    the message was routed to confirmed it, or raises ``Nacked``."""

    __slots__ = ("_connection", "_index", "_publish")

    def __init__(self, connection: Connection, publish: _Publish, index: int) -> None:
        self._connection = connection
        self._publish = publish
        self._index = index  # the message's place in its Publish

    def result(self, timeout: float | None = None) -> None:
        self._connection._await_publish(self._publish, self._index, timeout)

    def done(self) -> bool:
        try:
            self.result(timeout=0)
        except TimeoutError:
            return False
        except Nacked:
            pass
        return True


class BatchConfirm:
    """The confirm of one ``publish_many_async``: ``result(timeout)`` returns how many
    messages the batch held once every queue confirmed every one of them, or raises
    ``Nacked`` (the connection's ``call_timeout_s`` when no timeout is given)."""

    __slots__ = ("_connection", "_publishes", "count")

    def __init__(self, connection: Connection, publishes: list[_Publish], count: int) -> None:
        self._connection = connection
        self._publishes = publishes
        self.count = count

    def result(self, timeout: float | None = None) -> int:
        wait = timeout if timeout is not None else self._connection.call_timeout_s
        deadline = time.monotonic() + wait
        for publish in self._publishes:
            self._connection._await_publish(publish, None, max(0.0, deadline - time.monotonic()))
        return self.count


class _Settles:
    """The tags of consecutive settles of one queue with one action, not sent yet."""

    __slots__ = ("action", "channel", "queue", "ref", "started", "tags")

    def __init__(self, queue: str, ref: QueueRef, action: str) -> None:
        self.queue = queue
        self.ref = ref
        self.channel = _sender(ref)  # the filling thread's, as for a Publish
        self.action = action
        self.tags: list[int] = []
        self.started = time.monotonic()


class _Publish:
    """One ``Publish`` of a connection. ``publish_async`` fills it: its messages wait in
    the connection, at most ``linger_s``, for more to share their frame. It is then sent
    to each of its queues, on the channels of the thread that filled it (so that the
    flusher thread sending it keeps that thread's order), and awaited: each queue answers
    how many of its messages it took."""

    __slots__ = (
        "_answers",
        "_failed",
        "_sent",
        "awaited",
        "bytes",
        "channels",
        "expiration_ms",
        "payloads",
        "persistent",
        "producer",
        "queues",
        "refs",
        "sequence",
        "started",
    )

    def __init__(
        self,
        queues: list[str],
        refs: list[QueueRef],
        persistent: bool,
        expiration_ms: int | None,
        producer: bytes | None,
        sequence: int | None,
        awaited: bool = False,
    ) -> None:
        self.queues = queues
        self.refs = refs
        self.awaited = awaited  # its caller waits for its confirm before sending more
        self.channels = [_sender(ref) for ref in refs]
        self.persistent = persistent
        self.expiration_ms = expiration_ms
        self.producer = producer
        self.sequence = sequence  # the first message's, with a producer
        self.payloads: list[bytes] = []
        self.bytes = 0
        self.started = time.monotonic()
        self._sent: list[tuple[str, QueueRef, Any]] = []  # (queue, ref, future) per queue
        self._failed: list[tuple[str, int | Nacked]] = []  # the queues it could not reach
        self._answers: list[tuple[str, int | Nacked]] | None = None  # per queue, once known

    def takes(
        self,
        queues: list[str],
        persistent: bool,
        expiration_ms: int | None,
        producer: bytes | None,
        sequence: int | None,
    ) -> bool:
        """Whether a message so published can join this Publish's frame."""
        return (
            queues == self.queues
            and persistent == self.persistent
            and expiration_ms == self.expiration_ms
            and producer == self.producer
            and (self.sequence is None or sequence == self.sequence + len(self.payloads))
        )

    def send(self, connection: Connection) -> None:
        """Ask each queue; a queue it cannot reach gets its answer now, a ``Nacked``."""
        # One id per message for all its queues: the shared store keeps one copy of a
        # large message, with a reference per queue (a producer's messages have ids the
        # queues derive from their sequences).
        msg_ids = (
            [os.urandom(16) for _ in self.payloads]
            if len(self.queues) > 1 and self.producer is None
            else None
        )
        publish = Publish(
            self.payloads,
            self.persistent,
            msg_ids,
            self.expiration_ms,
            self.producer,
            self.sequence,
            self.awaited,
        )
        timeout = connection.call_timeout_s
        failed: list[tuple[str, int | Nacked]] = []
        for queue, ref, channel in zip(self.queues, self.refs, self.channels, strict=True):
            try:
                try:
                    future = ref.ask_async(publish, timeout, channel)
                except ActorDeadError:  # known dead already: ask the node again
                    connection._forget(queue)
                    ref = connection._ref(queue)
                    future = ref.ask_async(publish, timeout, _same_mailbox(ref, channel))
                self._sent.append((queue, ref, future))
            except ActorDeadError:
                failed.append((queue, Nacked(f"queue {queue!r} is restarting; publish again")))
            except (ActorError, QueueError, OSError) as exc:
                failed.append(
                    (queue, Nacked(f"the publish could not be sent to queue {queue!r}: {exc}"))
                )
        self._failed = failed

    def answers(
        self, timeout: float | None, on_restart: Callable[[str], None]
    ) -> list[tuple[str, int | Nacked]]:
        """Per queue, how many of the messages it took, or why it took none."""
        if self._answers is not None:
            return self._answers
        deadline = None if timeout is None else time.monotonic() + timeout
        answers: list[tuple[str, int | Nacked]] = []
        for queue, ref, future in self._sent:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                answers.append((queue, await_answer(ref, future, left)))
            except TimeoutError:
                raise TimeoutError(
                    f"no confirm from queue {queue!r} within {timeout} s; it may still come"
                ) from None
            except ActorDeadError:
                on_restart(queue)
                answers.append(
                    (
                        queue,
                        Nacked(
                            f"queue {queue!r} restarted before confirming; the message is in "
                            f"doubt: publish it again"
                        ),
                    )
                )
            except RemoteError as exc:
                refused = local_error(exc.type_name, exc.message)  # OutOfSequence as itself
                if not isinstance(refused, Nacked):
                    refused = Nacked(f"queue {queue!r} refused the publish: {exc.message}")
                answers.append((queue, refused))
        self._answers = answers = answers + self._failed
        return answers

    @property
    def answered(self) -> bool:
        return self._answers is not None

    def refusal(self, index: int | None) -> Nacked | None:
        """Why message ``index`` (None: any of them) was not confirmed, once answered."""
        assert self._answers is not None, "answers() first"
        size = len(self.payloads)
        for queue, answer in self._answers:
            if isinstance(answer, Nacked):
                return answer
            if answer < size and (index is None or index >= answer):
                what = (
                    f"{size - answer} of {size} messages refused, the last ones"
                    if index is None
                    else "the message was refused"
                )
                return Nacked(
                    f"queue {queue!r} is full (max_length, overflow reject-publish): {what}; "
                    f"publish again later"
                )
        return None


class Delivery:
    """One message delivered to this connection."""

    def __init__(
        self,
        connection: Connection,
        queue: str,
        seq_id: int,
        message: Message,
        delivery_count: int,
        ack_required: bool,
    ) -> None:
        self._connection = connection
        self.queue = queue
        self.delivery_tag = seq_id
        self.message = message
        self.body = message.body
        self.headers = message.headers or {}
        self.message_id = message.message_id
        self.delivery_count = delivery_count
        self.redelivered = delivery_count > 0
        self.ack_required = ack_required

    def ack(self, multiple: bool = False) -> None:
        self._connection._settle(self, "ack", multiple)

    def nack(self, requeue: bool = True, multiple: bool = False) -> None:
        self._connection._settle(self, "requeue" if requeue else "reject", multiple)

    def reject(self, requeue: bool = True) -> None:
        self._connection._settle(self, "requeue" if requeue else "reject", False)

    def __repr__(self) -> str:
        return (
            f"Delivery(queue={self.queue!r}, tag={self.delivery_tag}, "
            f"redelivered={self.redelivered}, {len(self.body)} bytes)"
        )


Call = TypeVar("Call", bound=Callable[..., Any])


def _exclusive(call: Call) -> Call:
    """A call of the connection that uses its transport: it holds the connection's lock
    (the flusher thread sends nothing meanwhile) and sends what ``publish_async`` keeps
    first, so that everything the connection sends stays in the order it was called."""

    @functools.wraps(call)
    def exclusive(self: Connection, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            self._flush()
            return call(self, *args, **kwargs)

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
    ) -> None:
        """``linger_s``: how long a message of ``publish_async`` may wait in the
        connection for more to share its frame (0: each goes at once, alone).
        ``on_close`` runs once when the connection closes: ``connect`` passes the
        transport it opened for this connection, which nothing else uses."""
        if type(linger_s) not in (int, float) or not 0 <= linger_s <= 1:
            raise ValueError(f"linger_s must be a number of seconds in 0..1, got {linger_s!r}")
        self._node = node
        self._on_close = on_close
        self.max_in_flight = max_in_flight
        self.max_in_flight_bytes = max_in_flight_bytes
        self.call_timeout_s = call_timeout_s
        self.consumer_id = os.urandom(16)
        self._pid = os.getpid()
        self._refs: dict[str, QueueRef] = {}
        self.linger_s = linger_s
        self._in_flight: CreditWindow[_Publish] = CreditWindow(max_in_flight, max_in_flight_bytes)
        self._filling: _Publish | None = None  # what publish_async fills, not sent yet
        self._settling: _Settles | None = None  # what acks, nacks and rejects fill
        self._busy_rechecks = 0  # the flusher found the connection in use this many times
        self._batch = max(1, min(ASYNC_BATCH, max_in_flight // 4))
        # Held by every call that uses the transport, and by the flusher thread while it
        # sends a lingering Publish: the one thing the connection shares with a thread.
        self._lock = threading.RLock()
        self._held: dict[str, dict[int, Delivery]] = {}  # queue -> tag -> delivery
        self._subscribed: set[str] = set()  # queues it has consumed from
        self._settled: set[str] = set()  # queues it sent settles to
        self._routes: dict[str, tuple[float, str, list]] = {}  # exchange -> (at, kind, bindings)
        self._alarms: list[str] = []
        self._alarms_read_at = float("-inf")
        self._closed = False

    # ------------------------------------------------------------------ declarations

    @_exclusive
    def declare_queue(self, name: str, *, passive: bool = False, **arguments: Any) -> QueueDeclared:
        """Create the queue unless it exists (``PreconditionFailed`` if it exists with
        other arguments). The arguments are ``QueueDefinition``'s: ``durable`` (True),
        ``lazy`` (False), ``message_ttl_ms``, ``max_length``, ``overflow`` ("drop-head"
        or "reject-publish"), ``dead_letter_exchange``, ``auto_delete`` (False); a bad
        one raises here, before anything is sent. ``passive=True`` creates nothing and
        raises ``NotFound`` unless the queue exists. Returns the queue's ``QueueDeclared``
        (its name, ready messages and consumers), as AMQP's declare-ok does."""
        self._check_open()
        if not passive:
            QueueDefinition(name, **arguments)
        answer = self._node.declare_queue(name, passive=passive, **arguments)
        return QueueDeclared(answer["queue"], answer["message_count"], answer["consumer_count"])

    @_exclusive
    def delete_queue(self, name: str) -> int:
        self._check_open()
        self._refs.pop(name, None)
        self._routes.clear()
        return self._node.delete_queue(name)

    @_exclusive
    def declare_exchange(self, name: str, kind: str = "direct", durable: bool = True) -> None:
        """``direct``, ``fanout`` or ``topic`` (the default exchange ``""`` always exists)."""
        self._check_open()
        self._node.declare_exchange(name, kind=kind, durable=durable)

    @_exclusive
    def bind_queue(self, queue: str, exchange: str, routing_key: str = "") -> None:
        self._check_open()
        self._node.bind_queue(queue, exchange, routing_key)
        self._routes.pop(exchange, None)

    @_exclusive
    def unbind_queue(self, queue: str, exchange: str, routing_key: str = "") -> None:
        """Undo ``bind_queue`` (nothing happens for a binding that is not there)."""
        self._check_open()
        self._node.unbind_queue(queue, exchange, routing_key)
        self._routes.pop(exchange, None)

    @_exclusive
    def delete_exchange(self, name: str) -> None:
        """Delete an exchange and its bindings; the queues it routed to stay."""
        self._check_open()
        self._node.delete_exchange(name)
        self._routes.pop(name, None)

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
        message = _new_message(body, message_id, headers, expiration_ms, producer_id, persistent)
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
            _new_message(body, message_id, headers, expiration_ms, producer_id, persistent),
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
        producer = _producer(producer_id, sequence)
        payload = self._check_size(encode(message))
        size = len(payload)
        sent_a_frame = False
        with self._lock:
            queues = self._route(exchange, routing_key, mandatory)
            if self.blocked:
                self._flush()
                self._wait_while_blocked()
            publish = self._filling
            if publish is not None and (
                not publish.takes(
                    queues, message.persistent, message.expiration_ms, producer, sequence
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
                publish = self._filling = _Publish(
                    queues,
                    [self._ref(queue) for queue in queues],
                    message.persistent,
                    message.expiration_ms,
                    producer,
                    sequence,
                )
                if linger and self.linger_s:
                    _flusher().watch(self, publish.started + self.linger_s)
            publish.payloads.append(payload)
            publish.bytes += size
            if not (linger and self.linger_s):
                self._flush()
            confirm = Confirm(self, publish, len(publish.payloads) - 1)
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
            Message(b"", None, headers, expiration_ms, _stamp(producer_id), None, bool(persistent))
        )
        properties = (bool(persistent), expiration_ms)
        return self._send_runs(
            routing_key,
            ((*properties, [encode_body(b) for b in chunk]) for chunk in _chunks(bodies)),
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
                for chunk in _chunks(run)
            ),
            exchange,
            mandatory,
            producer_id,
            sequence,
            awaited=True,
        ).result(timeout)

    @_exclusive
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
        before it sends more (``Publish.awaited``)."""
        producer = _producer(producer_id, sequence)
        queues = self._route(exchange, routing_key, mandatory)
        refs = [self._ref(queue) for queue in queues]
        most = PUBLISH_BATCH
        if all(map(_is_stream_ref, refs)):
            share = self.max_in_flight // STREAM_WINDOW_SHARE
            most = min(MAX_ENTRIES_PER_CHUNK, max(PUBLISH_BATCH, share))
        sent: list[_Publish] = []
        count = 0
        for persistent, expiration_ms, payloads in runs:
            sizes = list(map(len, payloads))
            if max(sizes) > MAX_MESSAGE_BYTES:
                self._check_size(payloads[sizes.index(max(sizes))])
            for start, stop in _byte_batches(sizes, most):
                publish = _Publish(
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
        """The queues a message goes to; the exchange's bindings are cached for
        ``ROUTES_TTL_S`` (and dropped by this connection's own declarations)."""
        self._check_open()
        if exchange == "":
            return [routing_key]
        cached = self._routes.get(exchange)
        if cached is None or time.monotonic() - cached[0] > ROUTES_TTL_S:
            table = self._node.exchange(exchange)
            cached = self._routes[exchange] = (time.monotonic(), table["kind"], table["bindings"])
        queues = route(cached[1], cached[2], routing_key)
        if not queues and mandatory:
            raise errors.Unroutable(
                f"exchange {exchange!r} routes {routing_key!r} to no "
                f"queue; bind one, or publish with mandatory=False"
            )
        return queues

    @property
    def blocked(self) -> bool:
        """True while a resource alarm of the node holds publishers back."""
        now = time.monotonic()
        if now - self._alarms_read_at > ALARMS_READ_EVERY_S:
            with self._lock:
                self._alarms = self._node.active_alarms()
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
            _flusher().watch(self, time.monotonic() + wait)
            return
        self._busy_rechecks = 0
        try:
            filling = [f for f in (self._filling, self._settling) if f is not None]
            if not filling or self._closed:
                return
            due = min(f.started for f in filling) + self.linger_s
            if due > time.monotonic():
                _flusher().watch(self, due)
                return
            self._flush()
        finally:
            self._lock.release()

    def _await_publish(self, publish: _Publish, index: int | None, timeout: float | None) -> None:
        """Wait for ``publish``'s answers; ``Nacked`` unless message ``index`` (None: all
        of them) was confirmed by every queue."""
        with self._lock:
            if publish is self._filling:
                self._flush()
            publish.answers(timeout, self._forget)
            refusal = publish.refusal(index)
        if refusal is not None:
            raise refusal

    def _settle_oldest(self, timeout: float | None) -> Nacked | None:
        """Wait for the oldest Publish in flight and take it out of the window; why it was
        not confirmed, if it was not (its own publisher learns it from its ``Confirm``)."""
        publish = self._in_flight.oldest()
        publish.answers(timeout, self._forget)
        self._in_flight.pop_oldest()
        return publish.refusal(None)

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
            raise ValueError(f"prefetch must be an int >= 1, got {prefetch!r}")
        if inactivity_timeout is not None:
            _check_timeout(inactivity_timeout, "inactivity_timeout")
        if self.is_stream(queue):
            if name is not None:
                check_tracking_name(name)
            return StreamConsumer(
                self,
                queue,
                self._ref(queue),
                "next" if offset is None else offset,
                name=name,
                prefetch=prefetch,
                inactivity_timeout=inactivity_timeout,
                **stream_options,
            )
        if offset is not None or name is not None or stream_options:
            raise errors.UnsupportedOperation(
                f"queue {queue!r} is a classic queue: offset, name and "
                f"{', '.join(stream_options) or 'the store options'} are for streams"
            )
        self._subscribe(queue, True, prefetch)
        return Consumer(self, queue, prefetch, inactivity_timeout)

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
        producer = _producer(producer_id, 0)
        assert producer is not None  # a producer id was given
        return self._ask(self._stream_only(stream), LastSequence(producer))

    @_exclusive
    def is_stream(self, queue: str) -> bool:
        """Whether ``queue`` is a stream (declared with type="stream")."""
        return _is_stream_ref(self._ref(queue))

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
        except RemoteError as exc:
            raise local_error(exc.type_name, exc.message, exc.remote_traceback) from None
        except ActorDeadError:
            self._forget(queue)
            return []
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
                settles = self._settling = _Settles(queue, self._ref(queue), action)
                if self.linger_s:
                    _flusher().watch(self, settles.started + self.linger_s)
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
            except RemoteError as exc:
                raise local_error(exc.type_name, exc.message, exc.remote_traceback) from None
            except ActorDeadError:
                self._forget(queue)
                if attempt == 2:
                    raise Nacked(
                        f"queue {queue!r} restarted twice during one call; try again"
                    ) from None

    def _forget(self, queue: str) -> None:
        """Drop the cached ref of a queue that restarted: the next call asks the node."""
        self._refs.pop(queue, None)

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


class Consumer:
    """An iterator over one queue's deliveries, with at most ``prefetch`` unacked; a
    context manager whose exit requeues what was not acked."""

    def __init__(
        self,
        connection: Connection,
        queue: str,
        prefetch: int,
        inactivity_timeout: float | None = None,
    ) -> None:
        self.connection = connection
        self.queue = queue
        self.prefetch = prefetch
        self.inactivity_timeout = inactivity_timeout
        self._ready: collections.deque[Delivery] = collections.deque()
        self._ahead: tuple[QueueRef, Any] | None = None  # the fetch sent ahead, unanswered
        self._fetch_at = max(1, prefetch // 2)  # how much free prefetch sends the next
        self._closed = False

    def __iter__(self) -> Iterator[Delivery]:
        return self

    def __next__(self) -> Delivery:
        if self.inactivity_timeout is None:
            delivery = self._next_within(None)
        else:
            delivery = self._next_within(time.monotonic() + self.inactivity_timeout)
            if delivery is None and not self._closed:
                self.cancel()
        if delivery is None:
            raise StopIteration
        return delivery

    def get(self, timeout: float) -> Delivery | None:
        """The next delivery, waiting up to ``timeout`` seconds (0: look once); None when
        none came, or the consumer was cancelled. Each delivery awaits its ack."""
        _check_timeout(timeout, "timeout", zero=True)
        return self._next_within(time.monotonic() + timeout)

    def _next_within(self, deadline: float | None) -> Delivery | None:
        """The next delivery; None at ``deadline``. The next fetch goes out as soon as
        half the prefetch is free, while the deliveries at hand are handed out, so the
        queue reads messages while the application works (its answer is taken once they
        are used up); an empty queue is polled ever less often (``IDLE_POLL_S``)."""
        wait = IDLE_POLL_S[0]
        while not self._closed:
            if self._ahead is None:
                room = self.prefetch - self.connection.held(self.queue)
                if room >= self._fetch_at or (room > 0 and not self._ready):
                    self._ahead = self.connection._fetch_async(self.queue, room)
            if self._ready:
                break
            if self._ahead is not None:
                asked, self._ahead = self._ahead, None
                self._ready.extend(self.connection._fetched(self.queue, asked))
                if self._ready:
                    break
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            time.sleep(wait if left is None else min(wait, left))
            wait = min(wait * 2, IDLE_POLL_S[1])
        return self._ready.popleft() if self._ready else None

    def cancel(self) -> None:
        """Stop iterating; deliveries fetched but not yet handed out go back now."""
        if self._closed:
            return
        self._closed = True
        if self._ahead is not None:
            asked, self._ahead = self._ahead, None
            try:
                self._ready.extend(self.connection._fetched(self.queue, asked))
            except (QueueError, TimeoutError):
                pass  # what it fetched goes back when the connection closes
        if self._ready:
            self.connection._give_back(self.queue, [d.delivery_tag for d in self._ready])
            self._ready.clear()
        self.connection._subscribe(self.queue, False)

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc_info) -> None:
        self.cancel()


def await_answer(ref: QueueRef, future: Any, timeout: float | None) -> Any:
    """``future``'s answer. A plain process cannot monitor the queue, so while it waits it
    looks, every ``RESTART_CHECK_S``, whether the incarnation ``ref`` names still lives:
    ``ActorDeadError`` once its process is gone or another incarnation answers at its
    address (the request died with it); ``TimeoutError`` after ``timeout``."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        wait = (
            RESTART_CHECK_S
            if deadline is None
            else max(0.0, min(RESTART_CHECK_S, deadline - time.monotonic()))
        )
        try:
            return future.get(timeout=wait)
        except AskTimeout:
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"{ref.name} did not answer within {timeout} s") from None
            if not _alive(ref, future):
                raise ActorDeadError(f"{ref.name} incarnation {ref.incarnation} is gone") from None


def _alive(ref: QueueRef, future: Any) -> bool:
    if isinstance(ref, RemoteQueue):
        return ref.alive(future)  # the listener looks, on the node's machine
    assert isinstance(ref, ActorRef), "a queue ref is an ActorRef or a RemoteQueue"
    if not process_exists(ref.pid):  # the node runs on this machine
        return False
    try:
        return ref.unpin().ping(timeout=RESTART_CHECK_S).incarnation == ref.incarnation
    except ActorError:
        return True  # busy, or between incarnations: wait on


def _check_timeout(value: Any, what: str, *, zero: bool = False) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
        or (value == 0 and not zero)
    ):
        bound = ">= 0" if zero else "> 0"
        raise ValueError(f"{what} must be a finite number of seconds {bound}, got {value!r}")


def _new_message(
    body: bytes,
    message_id: str | None,
    headers: dict[str, Any] | None,
    expiration_ms: int | None,
    producer_id: str | bytes | None,
    persistent: bool,
) -> Message:
    """What ``publish`` and ``publish_async`` send: stamped now unless deduplicated."""
    return Message(
        body, message_id, headers, expiration_ms, _stamp(producer_id), None, bool(persistent)
    )


def _stamp(producer_id: str | bytes | None) -> int | None:
    """The publish timestamp a message gets: now, but none for a deduplicated one. Its
    shared-store id is derived from (producer, sequence), the same for every attempt, and
    the store keeps one copy per id: an attempt stamped a moment later would be other
    bytes under that id, and a queue taking the second attempt (a fanout whose first
    attempt reached only some queues) would read the first's bytes and find them failing
    its CRC."""
    return None if producer_id is not None else int(time.time() * 1000)


def _producer(producer_id: str | bytes | None, sequence: int | None) -> bytes | None:
    """A producer id as the queues take it; ValueError for a half-given or bad pair."""
    if producer_id is None and sequence is None:
        return None
    producer = producer_id.encode() if isinstance(producer_id, str) else producer_id
    if type(producer) is not bytes or not 0 < len(producer) <= MAX_PRODUCER_BYTES:
        raise ValueError(
            f"producer_id must be a str or bytes of 1 to {MAX_PRODUCER_BYTES} "
            f"bytes, with a sequence; got {producer_id!r}"
        )
    if type(sequence) is not int or not 0 <= sequence <= MAX_SEQUENCE:
        raise ValueError(
            f"sequence must be an int in 0..{MAX_SEQUENCE} with a producer_id "
            f"(the message's place in what that producer sends); got {sequence!r}"
        )
    return producer


def _sender(ref: QueueRef) -> Any:
    """The channel this thread sends to ``ref`` on (None for a queue behind a listener,
    whose connection has one socket whichever thread sends)."""
    return ref.channel() if isinstance(ref, ActorRef) else None


def _same_mailbox(ref: QueueRef, channel: Any) -> Any:
    """``channel`` for the incarnation ``ref`` names, if it lives at the same address."""
    return (
        channel
        if channel is not None and channel.endpoint == getattr(ref, "address", None)
        else None
    )


class _Flusher:
    """The thread that sends a connection's lingering Publish once it is ``linger_s`` old,
    for a producer that stopped publishing without waiting for its confirms: one per
    process, started with the first Publish that lingers (and anew in a forked child)."""

    def __init__(self) -> None:
        self._pid = os.getpid()
        self._due: dict[Connection, float] = {}  # connection -> when to look at it
        self._changed = threading.Condition()
        threading.Thread(target=self._run, name="warren-flusher", daemon=True).start()
        atexit.register(self._flush_all)

    def _flush_all(self) -> None:
        """At exit: send what every connection still keeps, as a message handed to
        ZeroMQ goes out at exit (within the sockets' linger), so that a process that
        publishes and exits loses nothing it published. Not in a forked child, which
        inherits the registration but not the parent's connections."""
        if os.getpid() != self._pid:
            return
        with self._changed:
            connections = list(self._due)
            self._due.clear()
        for connection in connections:
            if connection._lock.acquire(timeout=EXIT_FLUSH_WAIT_S):
                try:
                    connection._flush()
                except Exception:
                    log.exception("sending a lingering publish at exit failed")
                finally:
                    connection._lock.release()

    def watch(self, connection: Connection, at: float) -> None:
        with self._changed:
            known = self._due.get(connection)
            if known is None or at < known:
                self._due[connection] = at
                self._changed.notify()

    def _run(self) -> None:
        while True:
            with self._changed:
                while True:
                    now = time.monotonic()
                    due = [c for c, at in self._due.items() if at <= now]
                    if due:
                        break
                    self._changed.wait(min(self._due.values()) - now if self._due else None)
                for connection in due:
                    del self._due[connection]
            for connection in due:
                try:
                    connection._flush_lingering()
                except Exception:  # a connection's failure is its Confirms'; never the thread's
                    log.exception("sending a lingering publish failed")


_the_flusher: tuple[int, _Flusher] | None = None
_flusher_lock = threading.Lock()


def _flusher() -> _Flusher:
    global _the_flusher
    with _flusher_lock:
        if _the_flusher is None or _the_flusher[0] != os.getpid():
            _the_flusher = (os.getpid(), _Flusher())
        return _the_flusher[1]


def _is_stream_ref(ref: QueueRef) -> bool:
    if isinstance(ref, RemoteQueue):
        return ref.stream
    return ref.name.startswith(STREAM_ACTOR_PREFIX)


def _chunks(items: Iterable[Any]) -> Iterator[list[Any]]:
    """``items`` in lists of at most ``READ_AHEAD`` and about ``PUBLISH_BATCH_BYTES``
    (``READ_AHEAD_STEP`` at a time), taken as they are needed: a producer's generator is
    never read far ahead, in messages or in bytes."""
    items = iter(items)
    while True:
        chunk: list[Any] = []
        size = 0
        while len(chunk) < READ_AHEAD and size < PUBLISH_BATCH_BYTES:
            step = list(itertools.islice(items, READ_AHEAD_STEP))
            if not step:
                break
            chunk += step
            size += _size(step)
        if not chunk:
            return
        yield chunk


def _size(items: list[Any]) -> int:
    """The bytes of ``items``, bodies or ``Message``s (anything else counts nothing here:
    encoding it raises the error that names it)."""
    try:
        return sum(map(len, items))
    except TypeError:
        return sum(
            len(item.body) if isinstance(item, Message) else len(item)
            for item in items
            if isinstance(item, (bytes, bytearray, memoryview, Message))
        )


def _byte_batches(sizes: list[int], most: int) -> Iterator[tuple[int, int]]:
    """(start, stop) of consecutive messages of ``sizes`` that share a Publish of at most
    ``most`` messages and ``PUBLISH_BATCH_BYTES`` (a larger message goes alone)."""
    if len(sizes) <= most and sum(sizes) <= PUBLISH_BATCH_BYTES:
        yield 0, len(sizes)
        return
    start, total = 0, 0
    for at, size in enumerate(sizes):
        if at > start and (total + size > PUBLISH_BATCH_BYTES or at - start == most):
            yield start, at
            start, total = at, 0
        total += size
    yield start, len(sizes)

"""``ConsumingCalls``: a ``Connection``'s consuming role.

``get`` fetches one message; ``consume`` returns a ``Consumer`` (a classic queue: it
fetches ahead up to its prefetch) or a ``StreamConsumer`` (a stream: read from an
offset, nothing taken away); the stream calls store, query and reset a named consumer's
offset and read a producer's last sequence. Every delivery awaiting an ack is held by
the connection (``_held``, by queue and tag); ``Delivery.ack``, ``nack`` and
``reject`` come back here (``_settle``), and consecutive settles of one queue share a
``Settle`` frame, sent as publishes are. The deliveries and consumers are
``warren.queues.client.consuming``'s and ``warren.queues.client.stream``'s.

Races it guards against: a fetch lost with a queue that restarted or a node that went
away (nothing was delivered: the queue has every message back, and after a recovery
the fetch is made again); a settle of a delivery held before a recovery (the node
requeued it: the settle is dropped, not sent to the new session); an ack of a tag this
connection does not hold (``UnknownDeliveryTag``, nothing sent).
"""

from __future__ import annotations

import math
import time
from typing import Any

from warren.actors import ActorDeadError, ActorError, ActorRef, RemoteError

from .. import errors
from ..errors import InvalidArgument, local_error
from ..message import decode
from ..protocol import (
    Fetch,
    LastSequence,
    QueryOffset,
    QueueRef,
    Settle,
    StoreOffset,
    Subscribe,
    check_tracking_name,
)
from ..routing import SUPER_STREAM
from .connection_core import NODE_ERRORS, ConnectionCore, exclusive
from .consuming import SETTLE_BATCH, Consumer, Delivery, PendingSettles, check_timeout
from .publishing import flusher, producer_bytes
from .queue_refs import await_answer, is_stream_ref, process_gone
from .recovery import NodeLost
from .stream import StreamConsumer
from .super_stream import SuperStreamConsumer

ANSWER_SLICE_S = 0.05  # the longest a consumer's wait for a long poll holds the lock
PROCESS_LOOKS_KEPT = 4096  # queue processes whose last look is remembered, at most


class ConsumingCalls(ConnectionCore):
    """The consuming calls of a ``Connection`` (see the module docstring)."""

    @exclusive
    def get(self, queue: str, *, ack: bool = True) -> Delivery | None:
        """The next message of ``queue``, or None when it is empty; with ``ack`` it
        awaits ``Delivery.ack`` (or nack, reject)."""
        if self.is_stream(queue):
            raise errors.UnsupportedOperation(
                f"{queue!r} is a stream: read it with consume({queue!r}, offset=...)"
            )
        deliveries = self._fetch(queue, 1, ack)
        return deliveries[0] if deliveries else None

    @exclusive
    def consume(
        self,
        queue: str,
        prefetch: int = 100,
        *,
        inactivity_timeout: float | None = None,
        offset: object = None,
        name: str | None = None,
        **stream_options: Any,
    ) -> Consumer | StreamConsumer | SuperStreamConsumer:
        """Iterate over ``queue``'s messages, at most ``prefetch`` unacked at a time. The
        iteration waits for the next message for ever, or, with ``inactivity_timeout``,
        ends (and the consumer is cancelled) once no message came for that many seconds:
        ``for delivery in connection.consume(q, inactivity_timeout=5)`` drains a queue
        and stops. ``Consumer.get(timeout)`` takes one message at a time instead.

        A stream is read instead (``StreamConsumer``, ``warren.queues.client.stream``):
        from ``offset`` ("first", "last", "next" by default, an offset, a datetime, a
        ``Timestamp`` or an interval like "1h"), nothing taken away, no ack; ``name``
        makes it a named consumer, which stores its offset on the node (every
        ``store_every`` records and ``store_interval_s`` seconds) and resumes after it;
        ``single_active=True`` makes it one member of group ``name``, which reads only
        while it is the group's active member.

        A super stream is read over all its partitions (``SuperStreamConsumer``,
        ``warren.queues.client.super_stream``), or one, by its stream's name; with
        ``single_active`` its partitions are shared among the group's members."""
        if type(prefetch) is not int or prefetch < 1:
            raise InvalidArgument(f"prefetch must be an int >= 1, got {prefetch!r}")
        if inactivity_timeout is not None:
            check_timeout(inactivity_timeout, "inactivity_timeout")
        partitions = self._partitions_if_none_is_named(queue)
        if partitions is not None:
            if name is not None:
                check_tracking_name(name)
            over_all = SuperStreamConsumer(
                self,
                queue,
                partitions,
                "next" if offset is None else offset,
                name=name,
                prefetch=prefetch,
                inactivity_timeout=inactivity_timeout,
                **stream_options,
            )
            self._consumers.update(over_all.consumers)
            return over_all
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
        consumer = Consumer(self, queue, prefetch, inactivity_timeout)
        if self._subscribe(queue, True, prefetch, consumer.serial):
            self._turns.setdefault(queue, []).append(consumer)
        self._consumers.add(consumer)
        return consumer

    # ------------------------------------------------------------------ streams

    @exclusive
    def partitions(self, super_stream: str) -> list[str]:
        """The partition streams of ``super_stream``, in order (``name-0`` first);
        ``NotFound`` if it is no super stream."""
        partitions = self._partitions_if_none_is_named(super_stream)
        if partitions is None:
            raise errors.NotFound(
                f"no super stream {super_stream!r} on this node (declare one with "
                f"declare_queue({super_stream!r}, type='super-stream', partitions=N))"
            )
        return partitions

    def _partitions_if_none_is_named(self, name: str) -> list[str] | None:
        """The partitions of super stream ``name`` if no queue has that name (a queue's
        name comes first, and costs no question to the node once its ref is known)."""
        if name in self._refs:
            return None
        try:
            self._ref(name)
            return None
        except errors.NotFound as exc:
            if isinstance(exc, errors.QueueRestarting):
                raise
        try:
            exchange = self._node.exchange(name)
        except errors.NotFound:
            return None
        if exchange["kind"] != SUPER_STREAM:
            return None
        return [queue for queue, _ in sorted(exchange["bindings"], key=lambda b: int(b[1]))]

    @exclusive
    def store_offset(self, stream: str, name: str, offset: int) -> None:
        """Store ``offset`` as the last one consumer ``name`` processed: a named consumer
        resumes after it. It is durable with the stream's next group commit."""
        if type(offset) is not int or offset < 0:
            raise errors.InvalidArgument(f"a stream offset is an int >= 0, got {offset!r}")
        self._ask(self._stream_only(stream), StoreOffset(check_tracking_name(name), offset))

    @exclusive
    def query_offset(self, stream: str, name: str) -> int | None:
        """The offset stored for consumer ``name``, None when there is none."""
        return self._ask(self._stream_only(stream), QueryOffset(check_tracking_name(name)))

    @exclusive
    def reset_offset(self, stream: str, name: str) -> None:
        """Forget consumer ``name``'s offset: it next starts where ``consume`` says."""
        self._ask(self._stream_only(stream), StoreOffset(check_tracking_name(name), None))

    @exclusive
    def last_sequence(self, stream: str, producer_id: str | bytes) -> int | None:
        """The last sequence ``stream`` took from ``producer_id`` (None: none yet): a
        producer that restarts publishes on from the one after it."""
        producer = producer_bytes(producer_id, 0)
        assert producer is not None  # a producer id was given
        return self._ask(self._stream_only(stream), LastSequence(producer))

    @exclusive
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

    @exclusive
    def _request(self, queue: str, request: Any) -> Any:
        """``_ask`` for a caller outside the connection (a stream consumer)."""
        return self._ask(queue, request)

    @exclusive
    def _tell(self, queue: str, message: Any) -> None:
        """Send without an answer; lost if the process is restarting (what is told this
        way may be: a stored offset sent again later)."""
        try:
            self._ref(queue).tell(message, timeout=self.call_timeout_s)
        except ActorError:
            self._forget(queue)

    @exclusive
    def _subscribe(self, queue: str, active: bool, prefetch: int = 0, serial: int = 0) -> bool:
        """Consumer number ``serial`` starts (asked: once this returns the queue counts
        it, whichever way the next call goes, as AMQP's consume-ok; a passive declare
        goes through the node, not the queue's path) or stops (told). True when the
        queue takes turns by consumer (a single active consumer)."""
        subscribe = Subscribe(self.consumer_id, self._pid, active, prefetch, serial)
        if not active:
            self._ref(queue).tell(subscribe, timeout=self.call_timeout_s)
            return False
        by_consumer = bool(self._ask(queue, subscribe))
        self._subscribed.add(queue)
        return by_consumer

    @exclusive
    def _fetch(self, queue: str, count: int, ack: bool) -> list[Delivery]:
        return self._deliveries(queue, self._ask(queue, self._fetch_request(count, ack)), ack)

    @exclusive
    def _fetch_async(self, queue: str, count: int, wait_ms: int = 0) -> tuple[QueueRef, Any]:
        """Ask for up to ``count`` deliveries awaiting acks without waiting for them (a
        consumer's next fetch, sent while it hands out the last one's; with ``wait_ms``,
        one the queue answers when messages come: a long poll): its answer for
        ``_fetched``."""
        ref = self._ref(queue)
        request = Fetch(self.consumer_id, self._pid, count, True, wait_ms)
        return ref, ref.ask_async(request, timeout=self.call_timeout_s)

    def _answered(self, asked: tuple[QueueRef, Any], timeout: float) -> bool:
        """Whether the answer to ``asked`` came (or its wait ended otherwise: ``_fetched``
        says how) within ``timeout`` seconds. What ``publish_async`` and the settles keep
        is sent before a wait (an ack, or a request whose reply the consumer waits for,
        must not wait out the poll). A local queue's process that is gone ends the wait
        (a stopped or killed queue never answers): looked for at most every
        ``ANSWER_SLICE_S`` (a look at /proc costs more than the look at the socket, and
        the AMQP port looks at every consumer's socket often). One behind a listener is
        asked after every ``RESTART_CHECK_S`` whether it lives (``await_answer``), as a
        restarted listener forgot the poll. The lock is let go between slices, for the
        flusher."""
        ref, future = asked
        deadline = time.monotonic() + timeout
        if timeout > 0:
            with self._lock:
                self._flush()
        elif isinstance(ref, ActorRef) and not future.arrived():  # a look, made often
            return self._queue_process_gone(ref)
        while True:
            with self._lock:
                left = max(0.0, deadline - time.monotonic())
                try:
                    if isinstance(ref, ActorRef):
                        future.get(timeout=min(ANSWER_SLICE_S, left))
                    else:
                        await_answer(ref, future, left)
                except TimeoutError:
                    if isinstance(ref, ActorRef) and self._queue_process_gone(ref):
                        return True  # _fetched says so
                    if time.monotonic() >= deadline:
                        return False
                    continue
                except Exception:  # the answer is an error, or the queue died: _fetched says
                    return True
                return True

    def _queue_process_gone(self, ref: ActorRef) -> bool:
        """Whether queue ``ref``'s process has ended, looked for at most every
        ``ANSWER_SLICE_S``."""
        now = time.monotonic()
        if now - self._process_looks.get(ref.pid, -math.inf) < ANSWER_SLICE_S:
            return False
        if len(self._process_looks) > PROCESS_LOOKS_KEPT:
            self._process_looks.clear()
        self._process_looks[ref.pid] = now
        return process_gone(ref)

    @exclusive
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
            Delivery(self, queue, d.seq_id, decode(d.payload), d.delivery_count, ack, d.served_ns)
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

    @exclusive
    def _give_back(self, queue: str, tags: list[int]) -> None:
        """Requeue deliveries fetched but never handed to the application."""
        self._ref(queue).tell(
            Settle(self.consumer_id, sorted(tags), "requeue"), timeout=self.call_timeout_s
        )
        held = self._held.get(queue, {})
        for tag in tags:
            held.pop(tag, None)

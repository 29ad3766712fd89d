"""``Translator``: one AMQP connection's channels served by Warren's own client.

Each AMQP connection gets a worker thread holding one Warren ``Connection`` to the node
(a ``Connection`` is used from one thread). The gateway thread, which owns the socket and
the ``Session``, hands the worker what the client sent (``method``, ``content``,
``channel_closed``: a queue of tasks, in the client's order); the worker answers through
``post``, which the gateway runs on its own thread. Between tasks the worker serves its
consumers (each a Warren ``Consumer`` of the channel's prefetch) and sends the confirms
that came in, oldest first. A consumer's fetch waits in its empty queue until messages
come (a long poll): an idle worker sleeps on those answers' sockets and on a wake-up the
gateway writes when it hands over a task, so a delivery leaves as soon as its queue
took the message (one queue's before another's it took later, unless both answers come
within one wake-up: then in channel order).

What a channel holds, as RabbitMQ's does: its delivery tags (counted from 1, one
sequence for its deliveries and gets), the deliveries awaiting an ack, its consumers by
tag, its prefetch (``Basic.Qos``: each consumer, the live ones too, takes at most that
many unacked; 0 is no limit, ``UNLIMITED_PREFETCH`` here), and in confirm mode its publishes'
sequence numbers with their ``Confirm``s. A channel that closes, or the connection,
hands its unacked deliveries back to their queues (redelivered), as RabbitMQ does.

Messages: a publish becomes a Warren ``Message`` whose ``amqp`` keeps the exchange,
routing key and properties as the client sent them; ``delivery_mode`` 2 makes it
persistent and ``expiration`` its TTL, the only properties read. A delivery of such a
message carries them back unchanged; one published by a Warren client gets properties
made from its own (content type, message id, headers, delivery mode, expiration), its
routing key the queue's name.

Prefetch: each consumer is a Warren ``Consumer`` of its channel's prefetch, and Warren
counts what one connection holds of a queue: two consumers of one queue on one AMQP
connection share their prefetch (they get fewer messages than RabbitMQ would give them,
never more). A consumer without acks takes ``NO_ACK_PREFETCH`` ahead, and each of its
deliveries is settled once the gateway took it for the client's socket.

Streams (``streams``): a consumer of a stream is a ``StreamConsumer`` from its
``x-stream-offset``, sent at most its prefetch of records unacked (its ``StreamCredit``);
its deliveries are kept as ``HeldRecord``s, whose settling only gives the credit back.

Refusals: a publish its queue does not take (it restarts) is nacked, never confirmed; a
publish routed nowhere is confirmed (and returned when mandatory). After a channel
error, what the client sent on that channel before it heard of it is dropped; after a
connection error, everything.

Races: the worker posts a delivery for a channel by its number and the number of times
that number was closed (``Session.closes``): the gateway drops one meant for a channel
closed since, and the worker, told of the close after, requeues what it had delivered
there (one without acks too: it is settled only once the gateway took it). Every answer
of a method is posted in the order the methods came.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import logging
import os
import queue as queue_module
import secrets
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

import pamqp.base
import pamqp.commands as commands
import zmq

from warren.actors.process import drain_wake_pipe

from ..amqp_envelope import encode_short_string, envelope, split
from ..client.connection import Confirm, Connection
from ..client.consuming import IDLE_POLL_S, LATE_ANSWER_S, Consumer, Delivery
from ..client.stream import StreamConsumer, StreamDelivery
from ..client.super_stream import SuperStreamConsumer
from ..errors import (
    AccessRefused,
    ConnectionClosed,
    InvalidArgument,
    InvalidMessage,
    MessageTooLarge,
    NodeNotRunning,
    NotFound,
    PreconditionFailed,
    QueueClosed,
    QueueError,
    QueueRestarting,
    Unroutable,
)
from ..message import Message
from ..protocol import server_named_queue
from . import frames
from .frames import AmqpError, ContentHeader, Frame
from .session import Session
from .shared import ExclusiveConsumers, ExclusiveQueues, TopologyChanges
from .streams import HeldRecord, StreamCredit, consume_offset, with_offset_header

log = logging.getLogger("warren.amqp")

# How long the worker waits for the oldest confirm before it looks at the client again.
CONFIRM_WAIT_S = 0.005
TX_COMMIT_WAIT_S = 60.0  # the longest a commit waits for its publishes' confirms
UNLIMITED_PREFETCH = 1000
# What a consumer without acks takes from its queue ahead of its client: each is settled
# once the gateway took it, so this bounds what the port holds for a slow client.
NO_ACK_PREFETCH = 100
# How many of a client's tasks the worker runs before it sends the confirms and
# deliveries due meanwhile.
TASKS_BETWEEN_SERVING = 64
# How long a consumer's fetch waits in its empty queue (a long poll). Long: between a
# poll's empty answer and the next one's arrival, a message its queue takes waits, and a
# message another queue takes just after may go out first. A queue that dies meanwhile
# is noticed at the worker's next look (``LATE_ANSWER_S``) by its process's absence.
CONSUMER_POLL_MS = 30_000
# How often the deliveries held past their queue's consumer timeout are looked for.
ACK_TIMEOUT_CHECK_S = 1.0
# What a client may have sent that its worker has not taken yet before the port stops
# reading its socket (the worker waits on the node: a publish under an alarm, a declare).
BACKLOG_PAUSE_BYTES = 8 * 2**20
# What the port holds for a client that has not read it yet before its consumers are
# given no more (a consumer without acks, or with a large prefetch, and a slow client).
OUTBOX_LIMIT_BYTES = 4 * 2**20  # what a consumer without a prefetch (0) takes at most
# Queue arguments Warren takes, and the definition field each fills.
QUEUE_ARGUMENTS = {
    "x-message-ttl": "message_ttl_ms",
    "x-max-length": "max_length",
    "x-max-length-bytes": "max_length_bytes",
    "x-overflow": "overflow",
    "x-dead-letter-exchange": "dead_letter_exchange",
    "x-dead-letter-routing-key": "dead_letter_routing_key",
    "x-expires": "expires_ms",
    "x-consumer-timeout": "consumer_timeout_ms",
    "x-max-age": "max_age",  # a stream's, as the two below
    "x-stream-max-segment-size-bytes": "max_segment_size_bytes",
    "x-delivery-limit": "delivery_limit",  # a quorum queue's, as the two below
    "x-dead-letter-strategy": "dead_letter_strategy",
    "x-single-active-consumer": "single_active_consumer",
}
EXCHANGE_KINDS = ("direct", "fanout", "topic")
# The methods whose queue "" is the channel's last declared one
NAMING_A_QUEUE = (
    commands.Queue.Bind,
    commands.Queue.Unbind,
    commands.Queue.Purge,
    commands.Queue.Delete,
    commands.Basic.Consume,
    commands.Basic.Get,
)
UNSERVED_EXCHANGE_KINDS = ("headers",)  # RabbitMQ's, not Warren's (yet): 540
SETTLES = (frames.ACK, frames.NACK, frames.REJECT)

Post = Callable[[Callable[[], None]], None]


@dataclasses.dataclass
class _Channel:
    """What one open channel holds (see the module docstring)."""

    next_tag: Any = dataclasses.field(default_factory=lambda: itertools.count(1))
    unacked: dict[int, Delivery | HeldRecord] = dataclasses.field(default_factory=dict)
    consumers: dict[str, tuple[Consumer | StreamConsumer, bool]] = dataclasses.field(
        default_factory=dict
    )
    # a stream consumer's credit, by consumer tag (a queue's counts its unacked itself)
    credits: dict[str, StreamCredit] = dataclasses.field(default_factory=dict)
    # the consumers of quorum queues, whose redeliveries carry x-delivery-count
    counting: set[str] = dataclasses.field(default_factory=set)
    prefetch: int = 0
    no_ack: set[int] = dataclasses.field(default_factory=set)  # tags settled once sent
    confirming: bool = False
    published: int = 0  # the sequence number of the last publish, in confirm mode
    # A publish's sequence number and its Confirm; None: confirmed at once (routed
    # nowhere); a QueueError: refused (nacked)
    confirms: collections.deque[tuple[int, Confirm | QueueError | None]] = dataclasses.field(
        default_factory=collections.deque
    )
    # In a transaction (tx.select): the publishes and settles since the last commit or
    # rollback, as the client sent them; None: the channel is not transactional.
    tx: list[tuple[str, tuple[Any, ...]]] | None = None
    last_queue: str = ""  # the queue declared last: what a method naming the queue "" means
    # The consumer timeout (ms) of each consumer whose queue has one, by consumer tag, and
    # each delivery of such a queue not acked yet: tag -> (deadline, timeout ms)
    timeouts: dict[str, int] = dataclasses.field(default_factory=dict)
    ack_deadlines: dict[int, tuple[float, int]] = dataclasses.field(default_factory=dict)


class Translator:
    """One AMQP connection's worker (see the module docstring)."""

    def __init__(
        self,
        connect: Callable[[], Connection],
        post: Post,
        topology: TopologyChanges,
        exclusive: ExclusiveQueues,
        exclusive_consumers: ExclusiveConsumers,
        count_published: Callable[[], None],
    ) -> None:
        self._connect = connect
        self._count_published = count_published
        self._post = post
        self._topology = topology
        self._exclusive = exclusive
        self._exclusive_consumers = exclusive_consumers
        self._topology_seen = topology.count
        # exchange -> internal, as last read from the node (read again on a name it does
        # not hold, and once the port's clients changed the topology)
        self._internal: dict[str, bool] = {}
        # Set by the gateway before the client's first byte. Used in what is posted (on
        # the gateway's thread), but for its frame_max, fixed before any channel opens.
        self.session: Session | None = None
        self._tasks: queue_module.SimpleQueue[tuple[str, tuple[Any, ...], int]] = (
            queue_module.SimpleQueue()
        )
        # Written by the gateway when it hands a task to the worker asleep on its
        # consumers' long polls (``_sleeping``); closed under the lock by the worker.
        self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._wake_lock = threading.Lock()
        self._sleeping = False
        self._poller = zmq.Poller()  # the wake-up and the sockets in _polled
        self._poller.register(self._wake_fd, zmq.POLLIN)
        self._polled: set[Any] = set()
        # The bytes the client sent that the worker has not taken (see ``backlogged``),
        # and what the gateway runs once they fall to half the limit.
        self._backlog = 0
        self._backlog_lock = threading.Lock()
        self.on_drained: Callable[[], None] = lambda: None
        self._channels: dict[int, _Channel] = {}
        self._failed: set[int] = set()  # channels closed by an error, until the client's CloseOk
        self._closing = False  # the connection is being closed by an error
        # Bytes posted for the client and not yet handed to the gateway's buffer: with
        # what waits in that buffer (``outbox``, set by the gateway), deliveries stop
        # past ``OUTBOX_LIMIT_BYTES`` until the client reads.
        self._posted_bytes = 0
        self._posted_lock = threading.Lock()
        self.outbox: Callable[[], int] = lambda: 0
        self._closes: collections.Counter[int] = collections.Counter()
        self._timeouts_checked_at = time.monotonic()
        self._connection: Connection | None = None
        self._stop_asked = False
        self._thread = threading.Thread(target=self._run, name="warren-amqp-worker", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ the gateway's side

    def method(self, channel: int, method: Frame) -> None:
        self._put("method", (channel, method), len(method.payload))

    def content(self, channel: int, publish: Frame, header: ContentHeader, body: bytes) -> None:
        self._put("content", (channel, publish, header, body), len(body))

    def channel_closed(self, channel: int) -> None:
        self._put("channel_closed", (channel,), 0)

    def connection_closing(self, then: Callable[[], None]) -> None:
        """The client closes: its exclusive queues are deleted, then ``then`` posted
        (at once, if the worker has ended)."""
        if self.running:
            self._put("closing", (then,), 0)
        else:
            then()

    def stop(self) -> None:
        """The connection is gone: hand back what it held, close, end the thread (a
        publish it has waiting out the node's alarm ends at once)."""
        self._stop_asked = True  # a worker still connecting interrupts its connection itself
        connection = self._connection
        if connection is not None:
            connection.interrupt()
        self._put("stop", (), 0)

    @property
    def backlogged(self) -> bool:
        """Whether the client sent more than ``BACKLOG_PAUSE_BYTES`` the worker has not
        taken yet: its socket is not read until ``on_drained`` says so."""
        return self._backlog > BACKLOG_PAUSE_BYTES

    def _put(self, kind: str, args: tuple[Any, ...], size: int) -> None:
        with self._backlog_lock:
            self._backlog += size
        self._tasks.put((kind, args, size))
        if self._sleeping:  # read after the put: a worker that looked before it, sleeps
            with self._wake_lock:
                if self._wake_fd >= 0:
                    os.eventfd_write(self._wake_fd, 1)

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    # ------------------------------------------------------------ the worker

    def _run(self) -> None:
        try:
            self._serve()
        finally:
            with self._wake_lock:
                os.close(self._wake_fd)
                self._wake_fd = -1

    def _serve(self) -> None:
        try:
            self._connection = self._connect()
            if self._stop_asked:  # stop() came before the connection was there to interrupt
                self._connection.interrupt()
        except Exception as exc:  # the node gone, or out of descriptors: the client hears
            self._close_connection(AmqpError(frames.CONNECTION_FORCED, f"the node: {exc}"))
            return
        idle = IDLE_POLL_S[0]
        try:
            while True:
                task = self._next_task(idle)
                taken = 0
                while task is not None:  # what the client sent already, first
                    kind, args, size = task
                    self._taken(size)
                    if kind == "stop":
                        return
                    self._task(kind, args)
                    taken += 1
                    if taken % TASKS_BETWEEN_SERVING == 0:  # a publisher that never stops
                        self._send_confirms()  # still hears of its confirms
                        self._deliver()
                        self._expire_unacked()
                    task = None if self._outbox_full() else self._take_now()
                busy = self._deliver() | self._send_confirms()
                idle = IDLE_POLL_S[0] if busy else min(idle * 2, IDLE_POLL_S[1])
                self._expire_unacked()
        except (ConnectionClosed, NodeNotRunning) as exc:
            self._close_connection(
                AmqpError(frames.CONNECTION_FORCED, f"the node went away: {exc}")
            )
        except Exception as exc:  # a bug: the client hears of it rather than waiting
            log.exception("the AMQP connection's worker failed")
            self._close_connection(
                AmqpError(frames.INTERNAL_ERROR, f"INTERNAL_ERROR - {type(exc).__name__}")
            )
        finally:
            self._finish()

    def _taken(self, size: int) -> None:
        with self._backlog_lock:
            was = self._backlog
            self._backlog -= size
            drained = was > BACKLOG_PAUSE_BYTES // 2 >= self._backlog
        if drained:
            self._post(self.on_drained)

    def _take_now(self) -> tuple[str, tuple[Any, ...], int] | None:
        try:
            return self._tasks.get_nowait()
        except queue_module.Empty:
            return None

    def _outbox_full(self) -> bool:
        """Whether ``OUTBOX_LIMIT_BYTES`` wait for the client to read: the worker then takes
        nothing more it sent (a get, a returned publish would add to it), and the
        gateway stops reading it once its backlog fills."""
        return self._outbox_bytes() >= OUTBOX_LIMIT_BYTES

    def _next_task(self, idle: float) -> tuple[str, tuple[Any, ...], int] | None:
        """The client's next task; None after a wait for the oldest confirm (at most
        ``CONFIRM_WAIT_S``), with consumers once one's long poll is answered (or after
        ``idle`` seconds: ``_wait_for_task``), or while the client does not read what it
        was sent."""
        if self._outbox_full():
            time.sleep(IDLE_POLL_S[1])
            return None
        task = self._take_now()
        if task is not None:
            return task
        confirming = [c.confirms[0][1] for c in self._channels.values() if c.confirms]
        if confirming:
            oldest = confirming[0]
            if isinstance(oldest, Confirm):
                assert self._connection is not None
                self._connection.flush()  # what it waits behind goes first, not at linger
                try:
                    oldest.result(CONFIRM_WAIT_S)
                except (TimeoutError, QueueError):
                    pass  # not yet, or refused: _send_confirms tells the client which
            return None
        # consumers to serve, or deliveries that may outlive their consumer timeout
        if any(c.consumers or c.ack_deadlines for c in self._channels.values()):
            return self._wait_for_task(idle)
        return self._tasks.get()

    def _wait_for_task(self, idle: float) -> tuple[str, tuple[Any, ...], int] | None:
        """The client's next task, or None once a consumer's long poll is answered, or
        after ``idle`` seconds with a stream consumer or a consumer timeout to look at
        (else ``LATE_ANSWER_S``: a long poll's queue may have died). The gateway wakes
        a worker asleep here when it hands it a task."""
        timed = False
        polls: list[Consumer] = []
        sockets: set[Any] = set()
        for channel in self._channels.values():
            timed = timed or bool(channel.ack_deadlines)
            for consumer, _ in channel.consumers.values():
                if isinstance(consumer, StreamConsumer):
                    timed = True
                elif (socket := consumer.answer_socket()) is not None:
                    polls.append(consumer)
                    sockets.add(socket)
        # Consumers of one queue share its socket, and a look at one may have read
        # another's answer (looked at already) off it, which then stays quiet: looked at
        # twice more.
        shared = len(sockets) < len(polls)
        if shared and any(consumer.answered() for _ in range(2) for consumer in polls):
            return self._take_now()
        poller = self._poller  # kept: one made per wait cost more than the wait's work
        for gone in self._polled - sockets:
            poller.unregister(gone)
        for new in sockets - self._polled:
            poller.register(new, zmq.POLLIN)
        self._polled = sockets
        self._sleeping = True
        try:
            task = self._take_now()
            if task is None:
                poller.poll(int((idle if timed else LATE_ANSWER_S) * 1000))
                drain_wake_pipe(self._wake_fd)
                task = self._take_now()
        finally:
            self._sleeping = False
        return task

    def _finish(self) -> None:
        for number in list(self._channels):
            self._forget(number)
        if self._connection is not None:
            self._delete_exclusive_queues()
            try:
                self._connection.close()
            except QueueError:
                pass  # the node is gone: its queues requeue what this process held

    def _delete_exclusive_queues(self) -> None:
        assert self._connection is not None
        for name in self._exclusive.owned_by(self):
            try:
                self._connection.delete_queue(name)
            except NotFound:
                pass  # deleted already
            except QueueError:
                break  # the node is gone: its next start drops transient queues
            self._exclusive.release(name)

    def _task(self, kind: str, args: tuple[Any, ...]) -> None:
        if kind == "closing":  # its channels' closes came first
            self._delete_exclusive_queues()
            self._post(args[0])
            return
        if kind == "channel_closed":
            self._forget(args[0])
            self._closes[args[0]] += 1
            self._failed.discard(args[0])
            return
        if kind == "sent":
            self._sent_without_ack(*args)
            return
        channel_number = args[0]
        if self._closing or channel_number in self._failed:
            return  # what the client sent after an error, before it heard of it: dropped
        channel = self._channels.get(channel_number)
        if channel is None:
            channel = self._channels[channel_number] = _Channel()
        if channel.tx is not None and (
            kind == "content" or frames.method_id(args[1].payload) in SETTLES
        ):
            channel.tx.append((kind, args))  # done at the commit
            return
        try:
            if kind == "content":
                self._publish(channel_number, channel, *args[1:])
            elif frames.method_id(args[1].payload) in SETTLES:
                self._settle(channel, args[1].payload)
            else:
                self._method(channel_number, channel, frames.decode_method(args[1]))
        except AmqpError as error:
            self._fail(channel_number, error)
        except (ConnectionClosed, NodeNotRunning):
            raise
        except QueueError as exc:
            ids = frames.PUBLISH if kind == "content" else frames.method_id(args[1].payload)
            self._fail(channel_number, _amqp_error(exc, ids))

    def _expire_unacked(self) -> None:
        """Close each channel that holds a delivery unacked past its queue's consumer
        timeout (406, as RabbitMQ's consumer_timeout does; the channel's close requeues
        its deliveries). Looked for every ``ACK_TIMEOUT_CHECK_S``."""
        now = time.monotonic()
        if now - self._timeouts_checked_at < ACK_TIMEOUT_CHECK_S:
            return
        self._timeouts_checked_at = now
        for number, channel in list(self._channels.items()):
            deadlines = channel.ack_deadlines
            for tag in [t for t in deadlines if t not in channel.unacked]:
                del deadlines[tag]  # settled
            late = [timeout for deadline, timeout in deadlines.values() if deadline <= now]
            if late and number not in self._failed:
                deadlines.clear()
                text = (
                    f"PRECONDITION_FAILED - delivery acknowledgement on channel {number} "
                    f"timed out. Timeout value used: {late[0]} ms"
                )
                self._fail(number, AmqpError(frames.PRECONDITION_FAILED, text))

    def _fail(self, channel: int, error: AmqpError) -> None:
        if error.code >= 500:
            self._close_connection(error)
        else:
            self._failed.add(channel)
            closes = self._closes[channel]
            self._post(lambda: self._require_session().close_channel_if(channel, closes, error))

    def _close_connection(self, error: AmqpError) -> None:
        self._closing = True
        if self._connection is not None:
            # before the client hears of it: a client that connects again at once may
            # declare its exclusive queues anew, as on RabbitMQ
            self._delete_exclusive_queues()
        self._post(lambda: self._require_session().close_connection(error))

    def _send(self, channel: int, data: bytes, sent: list[int] | None = None) -> None:
        """Post ``data`` for ``channel``; ``sent``: no-ack deliveries it carries, acked
        once the gateway took the data (requeued if the channel closed first)."""
        closes = self._closes[channel]
        with self._posted_lock:
            self._posted_bytes += len(data)

        def send() -> None:
            with self._posted_lock:
                self._posted_bytes -= len(data)
            if self._require_session().send_on(channel, closes, data) and sent:
                self._put("sent", (channel, sent), 0)

        self._post(send)

    def _sent_without_ack(self, number: int, tags: list[int]) -> None:
        """No-ack deliveries (by tag) that reached the client's buffer: settled now."""
        channel = self._channels.get(number)
        if channel is None:
            return  # closed since: requeued with the rest of its unacked
        for tag in tags:
            channel.no_ack.discard(tag)
            delivery = channel.unacked.pop(tag, None)
            if delivery is not None:
                try:
                    delivery.ack()
                except QueueError:
                    pass  # its queue is gone, or restarted: nothing left to settle

    def _answer(self, channel: int, method: pamqp.base.Frame, nowait: bool = False) -> None:
        if not nowait:
            self._send(channel, frames.method_frame(channel, method))

    def _forget(self, number: int) -> None:
        """The channel closed: its consumers end, its unacked go back to their queues."""
        channel = self._channels.pop(number, None)
        if channel is None:
            return
        for consumer, _ in channel.consumers.values():
            self._exclusive_consumers.release(consumer)
            try:
                consumer.cancel()
            except QueueError:
                pass  # its queue is gone, or the node: nothing of it to hand back
        for delivery in channel.unacked.values():
            try:
                delivery.nack(requeue=True)
            except QueueError:
                pass  # the queue requeues it when this connection closes

    # ------------------------------------------------------------ methods

    def _method(self, number: int, channel: _Channel, method: pamqp.base.Frame) -> None:
        connection = self._connection
        assert connection is not None, "_run connects first"
        ids = frames.ids_of(method)
        if isinstance(method, NAMING_A_QUEUE) and method.queue == "":  # AMQP's shortcut
            if not channel.last_queue:
                raise AmqpError(frames.NOT_FOUND, "NOT_FOUND - no previously declared queue", *ids)
            method.queue = channel.last_queue
        queue = getattr(method, "queue", None)
        if queue and self._exclusive.locked_for(queue, self):
            raise AmqpError(
                frames.RESOURCE_LOCKED,
                f"RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '{queue}' "
                "in vhost '/'",
                *ids,
            )
        if isinstance(method, commands.Queue.Declare):
            channel.last_queue = self._declare_queue(number, method)
        elif isinstance(method, commands.Queue.Delete):
            self._delete_queue(number, method)
        elif isinstance(method, commands.Queue.Purge):
            count = connection.purge_queue(method.queue)
            self._answer(number, commands.Queue.PurgeOk(count), method.nowait)
        elif isinstance(method, commands.Queue.Bind | commands.Queue.Unbind):
            if method.exchange == "":
                raise AmqpError(
                    frames.ACCESS_REFUSED,
                    "ACCESS_REFUSED - operation not permitted on the default exchange",
                    *ids,
                )
            if isinstance(method, commands.Queue.Bind):
                connection.bind_queue(method.queue, method.exchange, method.routing_key)
                self._topology.changed()
                self._answer(number, commands.Queue.BindOk(), method.nowait)
            else:
                try:
                    connection.unbind_queue(method.queue, method.exchange, method.routing_key)
                except QueueRestarting:
                    raise  # a NotFound, but the queue is there
                except NotFound:
                    pass  # its queue or exchange is gone, and the binding with it: as RabbitMQ
                self._topology.changed()
                self._answer(number, commands.Queue.UnbindOk())
        elif isinstance(method, commands.Exchange.Declare):
            self._declare_exchange(number, method)
        elif isinstance(method, commands.Exchange.Delete):
            self._delete_exchange(number, method)
        elif isinstance(method, commands.Basic.Qos):
            if method.prefetch_size:  # as RabbitMQ, which has no byte prefetch either
                raise AmqpError(
                    frames.NOT_IMPLEMENTED, "NOT_IMPLEMENTED - prefetch_size != 0", *ids
                )
            _apply_prefetch(channel, method.prefetch_count)
            self._answer(number, commands.Basic.QosOk())
        elif isinstance(method, commands.Basic.Consume):
            self._consume(number, channel, method)
        elif isinstance(method, commands.Basic.Cancel):
            found = channel.consumers.pop(method.consumer_tag or "", None)
            channel.credits.pop(method.consumer_tag or "", None)
            channel.timeouts.pop(method.consumer_tag or "", None)
            channel.counting.discard(method.consumer_tag or "")
            if found is not None:
                self._exclusive_consumers.release(found[0])
                found[0].cancel()
            self._answer(number, commands.Basic.CancelOk(method.consumer_tag), method.nowait)
        elif isinstance(method, commands.Basic.Get):
            self._get(number, channel, method)
        elif isinstance(method, commands.Basic.Recover):
            for tag in [t for t in channel.unacked if t not in channel.no_ack]:
                channel.unacked.pop(tag).nack(requeue=True)
            self._answer(number, commands.Basic.RecoverOk())
        elif isinstance(method, commands.Confirm.Select):
            if channel.tx is not None:
                raise AmqpError(
                    frames.PRECONDITION_FAILED,
                    "PRECONDITION_FAILED - cannot switch from tx to confirm mode",
                    *ids,
                )
            channel.confirming = True
            self._answer(number, commands.Confirm.SelectOk(), method.nowait)
        elif isinstance(method, commands.Tx.Select | commands.Tx.Commit | commands.Tx.Rollback):
            self._transaction(number, channel, method)
        else:
            raise AmqpError(
                frames.NOT_IMPLEMENTED, f"NOT_IMPLEMENTED - {method.name} is not served", *ids
            )

    def _transaction(self, number: int, channel: _Channel, method: pamqp.base.Frame) -> None:
        """``tx.select`` makes the channel transactional: its publishes and settles wait
        for ``tx.commit``, which does them in order and answers once every publish is
        confirmed (on disk, for a persistent message), or closes the channel (406) when a
        queue refused one, or ``tx.rollback``, which drops them (the deliveries stay
        unacked, as RabbitMQ's)."""
        ids = frames.ids_of(method)
        if isinstance(method, commands.Tx.Select):
            if channel.confirming:
                raise AmqpError(
                    frames.PRECONDITION_FAILED,
                    "PRECONDITION_FAILED - cannot switch from confirm to tx mode",
                    *ids,
                )
            if channel.tx is None:
                channel.tx = []
            self._answer(number, commands.Tx.SelectOk())
            return
        if channel.tx is None:
            raise AmqpError(
                frames.PRECONDITION_FAILED,
                "PRECONDITION_FAILED - channel is not transactional",
                *ids,
            )
        pending, channel.tx = channel.tx, []
        if isinstance(method, commands.Tx.Rollback):
            self._answer(number, commands.Tx.RollbackOk())
            return
        confirms = []
        for kind, args in pending:
            if kind == "content":
                confirms.append(self._publish(args[0], channel, *args[1:]))
            else:
                self._settle(channel, args[1].payload)
        refused: list[QueueError] = []
        for confirm in confirms:
            if isinstance(confirm, QueueError):
                refused.append(confirm)  # not taken at all (its queue restarting)
            elif isinstance(confirm, Confirm):
                try:
                    confirm.result(TX_COMMIT_WAIT_S)
                except QueueError as exc:  # refused by its queue (full, deleted)
                    refused.append(exc)
        if refused:  # a commit-ok would say they are all safe
            raise AmqpError(
                frames.PRECONDITION_FAILED,
                f"PRECONDITION_FAILED - {len(refused)} of the commit's {len(confirms)} "
                f"publishes were not taken ({refused[0]}): publish them again",
                *ids,
            )
        assert self._connection is not None
        self._connection.flush()  # the commit's settles leave before its commit-ok
        self._answer(number, commands.Tx.CommitOk())

    def _declare_queue(self, number: int, method: commands.Queue.Declare) -> str:
        """Declare the queue; its name (made by the server for ``""``)."""
        connection = self._connection
        assert connection is not None
        ids = frames.ids_of(method)
        name = method.queue or server_named_queue()
        if method.passive:
            declared = connection.declare_queue(name, passive=True)
        else:
            if name.startswith("amq.") and method.queue:
                raise AmqpError(
                    frames.ACCESS_REFUSED,
                    f"ACCESS_REFUSED - queue name '{name}' contains reserved prefix 'amq.*'",
                    *ids,
                )
            arguments = _queue_arguments(method.arguments or {}, ids)
            if arguments.get("type") == "stream":
                _check_stream_properties(name, method, ids)
            owned = name in self._exclusive.owned_by(self)
            if (
                (method.exclusive and not owned and name in connection.list_queues())
                or (method.exclusive and not self._exclusive.claim(name, self))
                or (owned and not method.exclusive)
            ):  # another's, a queue that is no one's (not taken over), or a declare of this
                # connection's exclusive queue as not exclusive: the property must match
                raise AmqpError(
                    frames.RESOURCE_LOCKED,
                    f"RESOURCE_LOCKED - cannot obtain exclusive access to locked queue "
                    f"'{name}' in vhost '/'",
                    *ids,
                )
            try:
                declared = connection.declare_queue(
                    name,
                    # an exclusive queue lives as long as its connection: never durable
                    durable=method.durable and not method.exclusive,
                    auto_delete=method.auto_delete,
                    **arguments,
                )
            except QueueError:
                if method.exclusive:
                    self._exclusive.release(name)
                raise
        ok = commands.Queue.DeclareOk(
            name, declared.message_count or 0, declared.consumer_count or 0
        )
        self._answer(number, ok, method.nowait)
        return name

    def _delete_queue(self, number: int, method: commands.Queue.Delete) -> None:
        """Delete the queue; one that is not there is deleted already (0 messages), as
        RabbitMQ answers."""
        connection = self._connection
        assert connection is not None
        try:
            count = self._delete_existing_queue(method)
        except QueueRestarting:
            raise  # a NotFound, but the queue is there
        except NotFound:
            count = 0  # gone already: the delete's outcome all the same
        self._exclusive.release(method.queue)
        self._topology.changed()
        self._answer(number, commands.Queue.DeleteOk(count), method.nowait)

    def _delete_existing_queue(self, method: commands.Queue.Delete) -> int:
        connection = self._connection
        assert connection is not None
        if method.if_unused or method.if_empty:
            stats = connection.queue_stats(method.queue)
            if method.if_unused and stats.get("consumers"):
                raise AmqpError(
                    frames.PRECONDITION_FAILED,
                    f"PRECONDITION_FAILED - queue '{method.queue}' in use",
                    *frames.ids_of(method),
                )
            if method.if_empty and stats.get("messages_ready"):
                raise AmqpError(
                    frames.PRECONDITION_FAILED,
                    f"PRECONDITION_FAILED - queue '{method.queue}' not empty",
                    *frames.ids_of(method),
                )
        return connection.delete_queue(method.queue)

    def _delete_exchange(self, number: int, method: commands.Exchange.Delete) -> None:
        """Delete the exchange; one that is not there is deleted already, as RabbitMQ
        answers (``if_unused``: 406 while it has bindings)."""
        connection = self._connection
        assert connection is not None
        ids = frames.ids_of(method)
        name = method.exchange
        if name == "" or name.startswith("amq."):
            raise AmqpError(
                frames.ACCESS_REFUSED,
                f"ACCESS_REFUSED - exchange '{name}' may not be deleted",
                *ids,
            )
        if method.if_unused and any(b["exchange"] == name for b in connection.list_bindings()):
            raise AmqpError(
                frames.PRECONDITION_FAILED, f"PRECONDITION_FAILED - exchange '{name}' in use", *ids
            )
        try:
            connection.delete_exchange(name)
        except NotFound:
            pass  # gone already: the delete's outcome all the same
        self._topology.changed()
        self._answer(number, commands.Exchange.DeleteOk(), method.nowait)

    def _declare_exchange(self, number: int, method: commands.Exchange.Declare) -> None:
        connection = self._connection
        assert connection is not None
        ids = frames.ids_of(method)
        name = method.exchange
        if name == "":
            raise AmqpError(
                frames.ACCESS_REFUSED,
                "ACCESS_REFUSED - operation not permitted on the default exchange",
                *ids,
            )
        if method.passive:
            known = {exchange["name"] for exchange in connection.list_exchanges()}
            if name not in known:
                raise AmqpError(frames.NOT_FOUND, f"NOT_FOUND - no exchange '{name}'", *ids)
        elif name.startswith("amq."):
            raise AmqpError(
                frames.ACCESS_REFUSED,
                f"ACCESS_REFUSED - exchange name '{name}' contains reserved prefix 'amq.*'",
                *ids,
            )
        elif method.exchange_type in UNSERVED_EXCHANGE_KINDS or (
            method.exchange_type.startswith("x-")
        ):
            raise AmqpError(
                frames.NOT_IMPLEMENTED,
                f"NOT_IMPLEMENTED - exchange type '{method.exchange_type}'",
                *ids,
            )
        elif method.exchange_type not in EXCHANGE_KINDS:
            raise AmqpError(
                frames.PRECONDITION_FAILED,
                f"PRECONDITION_FAILED - invalid exchange type '{method.exchange_type}'",
                *ids,
            )
        else:  # other arguments are taken and have no effect, as RabbitMQ's unknown ones
            alternate = (method.arguments or {}).get("alternate-exchange", "")
            if not isinstance(alternate, str):
                raise AmqpError(
                    frames.PRECONDITION_FAILED,
                    f"PRECONDITION_FAILED - invalid arg 'alternate-exchange' for exchange "
                    f"'{name}' in vhost '/': {alternate!r} is not a string",
                    *ids,
                )
            connection.declare_exchange(
                name,
                method.exchange_type,
                durable=method.durable,
                auto_delete=method.auto_delete,
                internal=method.internal,
                alternate_exchange=alternate,
            )
            self._topology.changed()
        self._answer(number, commands.Exchange.DeclareOk(), method.nowait)

    def _consume(self, number: int, channel: _Channel, method: commands.Basic.Consume) -> None:
        connection = self._connection
        assert connection is not None
        tag = method.consumer_tag or f"amq.ctag-{secrets.token_urlsafe(16)}"
        if tag in channel.consumers:
            raise AmqpError(
                frames.NOT_ALLOWED,
                f"NOT_ALLOWED - attempt to reuse consumer tag '{tag}'",
                *frames.ids_of(method),
            )
        if connection.is_stream(method.queue):
            self._consume_stream(number, channel, method, tag)
            return
        prefetch = NO_ACK_PREFETCH if method.no_ack else channel.prefetch or UNLIMITED_PREFETCH
        exclusive = self._exclusive_consumers
        with exclusive.guard(method.queue):
            stats = connection.queue_stats(method.queue)  # before a consumer exists to leak
            in_use = exclusive.holder(method.queue) is not None or (
                method.exclusive and stats.get("consumers")
            )
            if in_use:
                raise AmqpError(
                    frames.ACCESS_REFUSED,
                    f"ACCESS_REFUSED - queue '{method.queue}' in vhost '/' in exclusive use",
                    *frames.ids_of(method),
                )
            consumer = connection.consume(method.queue, prefetch=prefetch)
            assert not isinstance(consumer, SuperStreamConsumer)  # is_stream named a queue
            if method.exclusive:
                exclusive.hold(method.queue, consumer)
        timeout = stats.get("consumer_timeout_ms")
        if timeout and not method.no_ack:
            channel.timeouts[tag] = timeout
        else:  # a tag used before, by a consumer the server cancelled
            channel.timeouts.pop(tag, None)
        if stats.get("type") == "quorum":
            channel.counting.add(tag)
        else:
            channel.counting.discard(tag)
        channel.consumers[tag] = (consumer, method.no_ack)
        self._answer(number, commands.Basic.ConsumeOk(tag), method.nowait)

    def _consume_stream(
        self, number: int, channel: _Channel, method: commands.Basic.Consume, tag: str
    ) -> None:
        """A consumer of a stream, as RabbitMQ takes one (``streams``): with a prefetch
        and manual acks, from its ``x-stream-offset``."""
        connection = self._connection
        assert connection is not None
        ids = frames.ids_of(method)
        refused = (
            "consumer prefetch count is not set for stream queue"
            if not channel.prefetch
            else "a stream queue takes consumers with manual acks (no_ack=false)"
            if method.no_ack
            else "exclusive consume is not supported for stream queues"
            if method.exclusive
            else ""
        )
        if refused:
            raise AmqpError(
                frames.PRECONDITION_FAILED,
                f"PRECONDITION_FAILED - {refused}: '{method.queue}'",
                *ids,
            )
        offset = consume_offset(method.arguments or {})
        consumer = connection.consume(method.queue, prefetch=channel.prefetch, offset=offset)
        assert not isinstance(consumer, SuperStreamConsumer)  # is_stream named a stream
        channel.consumers[tag] = (consumer, False)
        channel.credits[tag] = StreamCredit(channel.prefetch)
        self._answer(number, commands.Basic.ConsumeOk(tag), method.nowait)

    def _get(self, number: int, channel: _Channel, method: commands.Basic.Get) -> None:
        connection = self._connection
        assert connection is not None
        if connection.is_stream(method.queue):
            raise AmqpError(
                frames.NOT_IMPLEMENTED,
                f"NOT_IMPLEMENTED - basic.get not supported by stream queues '{method.queue}'",
                *frames.ids_of(method),
            )
        delivery = connection.get(method.queue, ack=True)
        if delivery is None:
            self._answer(number, commands.Basic.GetEmpty())
            return
        stats = connection.queue_stats(method.queue)
        left = stats.get("messages_ready", 0)
        tag = next(channel.next_tag)
        exchange, routing_key, properties = _publish_of(delivery)
        if stats.get("type") == "quorum":
            properties = with_delivery_count(properties, delivery)
        channel.unacked[tag] = delivery
        timeout = stats.get("consumer_timeout_ms")
        if timeout and not method.no_ack:
            channel.ack_deadlines[tag] = (time.monotonic() + timeout / 1000, timeout)
        if method.no_ack:
            channel.no_ack.add(tag)  # settled once the gateway took it, as a consumer's
        data = frames.get_ok_frames(
            number,
            tag,
            delivery.redelivered,
            exchange,
            routing_key,
            left,
            properties,
            delivery.body,
            self._frame_max(),
        )
        self._send(number, data, [tag] if method.no_ack else None)

    def _settle(self, channel: _Channel, payload: bytes) -> None:
        """A client's ack, nack or reject (by hand: one comes for each message)."""
        ids = frames.method_id(payload)
        tag, multiple, requeue = frames.decode_settle(payload)
        if multiple:
            tags = [
                t for t in channel.unacked if (tag == 0 or t <= tag) and t not in channel.no_ack
            ]
        elif tag in channel.unacked and tag not in channel.no_ack:
            tags = [tag]
        else:
            tags = []
        if not tags and not (multiple and tag == 0):  # "all of none" is no error
            raise AmqpError(
                frames.PRECONDITION_FAILED,
                f"PRECONDITION_FAILED - unknown delivery tag {tag}",
                *ids,
            )
        for settled in tags:
            delivery = channel.unacked.pop(settled)
            try:
                if ids == frames.ACK:
                    delivery.ack()
                else:
                    delivery.nack(requeue=requeue)
            except (NotFound, QueueClosed):
                pass  # its queue was deleted: nothing left to settle

    # ------------------------------------------------------------ publishing

    def _publish(
        self, number: int, channel: _Channel, publish: Frame, header: ContentHeader, body: bytes
    ) -> Confirm | QueueError | None:
        """Publish to the node; the publish's confirm (None: routed nowhere; an error: not
        taken)."""
        connection = self._connection
        assert connection is not None
        sent = frames.decode_publish(publish.payload)
        if sent.immediate:
            raise AmqpError(
                frames.NOT_IMPLEMENTED, "NOT_IMPLEMENTED - immediate=true", *frames.PUBLISH
            )
        read = frames.read_properties(header.properties, ("delivery_mode", "expiration"))
        message = Message(
            body,
            expiration_ms=_expiration_ms(read["expiration"]),
            persistent=read["delivery_mode"] == 2,
            amqp=envelope(sent.exchange, sent.routing_key, header.properties),
        )
        if sent.exchange and self._topology.count != self._topology_seen:
            self._topology_seen = self._topology.count
            self._internal.clear()
            connection.forget_routes()
        if sent.exchange and self._is_internal(sent.exchange):
            raise AmqpError(
                frames.ACCESS_REFUSED,
                f"ACCESS_REFUSED - cannot publish to internal exchange '{sent.exchange}' in "
                "vhost '/'",
                *frames.PUBLISH,
            )
        if channel.confirming:
            channel.published += 1
        confirm: Confirm | QueueError | None = None
        try:
            confirm = connection.publish_message(
                sent.routing_key, message, exchange=sent.exchange, mandatory=True
            )
            self._count_published()
        except QueueRestarting as exc:  # first: it is a NotFound, but the queue exists
            confirm = exc  # not taken: nacked, and the client publishes it again
        except (Unroutable, NotFound) as exc:
            if (
                isinstance(exc, NotFound)
                and sent.exchange != ""
                and sent.exchange not in {e["name"] for e in connection.list_exchanges()}
            ):
                raise AmqpError(
                    frames.NOT_FOUND, f"NOT_FOUND - no exchange '{sent.exchange}'", *frames.PUBLISH
                ) from None
            if sent.mandatory:
                self._return(number, sent.exchange, sent.routing_key, header.properties, body)
        except (InvalidMessage, MessageTooLarge) as exc:
            raise AmqpError(
                frames.PRECONDITION_FAILED, f"PRECONDITION_FAILED - {exc}", *frames.PUBLISH
            ) from None
        if channel.confirming:
            channel.confirms.append((channel.published, confirm))
        return confirm

    def _is_internal(self, exchange: str) -> bool:
        """Whether ``exchange`` is internal (False for one the node does not have: its
        publish fails as such)."""
        if exchange not in self._internal:
            connection = self._connection
            assert connection is not None
            self._internal = {e["name"]: e["internal"] for e in connection.list_exchanges()}
        return self._internal.get(exchange, False)

    def _return(
        self, number: int, exchange: str, routing_key: str, properties: bytes, body: bytes
    ) -> None:
        method = frames.method_frame(
            number, commands.Basic.Return(frames.NO_ROUTE, "NO_ROUTE", exchange, routing_key)
        )
        content = frames.content_frames(number, properties, body, self._frame_max())
        self._send(number, method + b"".join(content))

    def _send_confirms(self) -> bool:
        """Confirm, oldest first, each publish whose queues confirmed it (or refused it:
        a nack); True when any was sent."""
        sent = False
        for number, channel in self._channels.items():
            acked_up_to = 0
            while channel.confirms:
                sequence, confirm = channel.confirms[0]
                if isinstance(confirm, Confirm) and not confirm.done():
                    break
                channel.confirms.popleft()
                try:
                    if isinstance(confirm, QueueError):
                        raise confirm
                    if confirm is not None:
                        confirm.result(0)
                except QueueError:
                    if acked_up_to:
                        self._send(number, frames.confirm_frame(number, acked_up_to, True))
                        acked_up_to = 0
                    self._send(number, frames.confirm_frame(number, sequence, False, nack=True))
                else:
                    acked_up_to = sequence
                sent = True
            if acked_up_to:
                self._send(number, frames.confirm_frame(number, acked_up_to, True))
        return sent

    # ------------------------------------------------------------ consuming

    def _deliver(self) -> bool:
        """Hand each consumer what its queue has for it now, while the client takes what
        it was sent (``OUTBOX_LIMIT_BYTES``); True when any came. The consumers' first
        deliveries go out oldest served first (``Delivery.served_ns``): what two queues
        took in turn (a broadcast, then a task) reaches the client in that order, whatever
        their channels, also when both answers came within one wake-up."""
        firsts: list[tuple[int, int, _Channel, str, Delivery | StreamDelivery]] = []
        for number, channel in list(self._channels.items()):
            for tag in list(channel.consumers):
                got = self._take(number, channel, tag)
                if got is not None:
                    served = got.served_ns if isinstance(got, Delivery) else 0
                    firsts.append((served, number, channel, tag, got))
        firsts.sort(key=lambda first: first[0])
        for _, number, channel, tag, got in firsts:
            self._hand_over(number, channel, tag, got)
        delivered = bool(firsts)
        for number, channel in list(self._channels.items()):
            for tag in list(channel.consumers):
                while (got := self._take(number, channel, tag)) is not None:
                    self._hand_over(number, channel, tag, got)
                    delivered = True
        return delivered

    def _take(self, number: int, channel: _Channel, tag: str) -> Delivery | StreamDelivery | None:
        """Consumer ``tag``'s next delivery, while the client takes what it was sent and a
        stream consumer's client has credit. A consumer whose queue is gone is cancelled,
        and its client told (``Basic.Cancel``)."""
        if self._outbox_bytes() >= OUTBOX_LIMIT_BYTES:
            return None
        consumer, _ = channel.consumers[tag]
        credit = channel.credits.get(tag)
        if credit is not None and credit.left <= 0:
            return None  # a stream consumer's client holds its prefetch unacked
        try:
            if isinstance(consumer, Consumer):
                return consumer.take(CONSUMER_POLL_MS)
            return consumer.get(0)
        except QueueRestarting:
            return None  # between two incarnations: the next look asks the new one
        except (NotFound, QueueClosed):  # deleted, or being deleted
            del channel.consumers[tag]
            channel.credits.pop(tag, None)
            channel.timeouts.pop(tag, None)
            channel.counting.discard(tag)
            self._exclusive_consumers.release(consumer)
            self._cancelled(number, tag)
            return None

    def _hand_over(
        self, number: int, channel: _Channel, tag: str, got: Delivery | StreamDelivery
    ) -> None:
        """Send consumer ``tag`` its delivery ``got`` as ``Basic.Deliver``, under the
        channel's next delivery tag."""
        _, no_ack = channel.consumers[tag]
        delivery_tag = next(channel.next_tag)
        exchange, routing_key, properties = _publish_of(got)
        delivery: Delivery | HeldRecord
        if isinstance(got, StreamDelivery):
            credit = channel.credits[tag]
            properties = with_offset_header(properties, got.offset)
            delivery = HeldRecord(got, credit)
        else:
            if tag in channel.counting:
                properties = with_delivery_count(properties, got)
            delivery = got
        channel.unacked[delivery_tag] = delivery
        timeout = channel.timeouts.get(tag)
        if timeout:
            channel.ack_deadlines[delivery_tag] = (time.monotonic() + timeout / 1000, timeout)
        if no_ack:
            channel.no_ack.add(delivery_tag)
        data = frames.deliver_frames(
            number,
            encode_short_string(tag),
            delivery_tag,
            delivery.redelivered,
            exchange,
            routing_key,
            properties,
            delivery.body,
            self._frame_max(),
        )
        self._send(number, data, [delivery_tag] if no_ack else None)

    def _cancelled(self, number: int, tag: str) -> None:
        """Tell a client that asked for it (``consumer_cancel_notify``) that the server
        cancelled its consumer ``tag``, as RabbitMQ does when the queue is deleted."""
        capabilities = self._require_session().client_properties.get("capabilities")
        if isinstance(capabilities, dict) and capabilities.get("consumer_cancel_notify"):
            self._send(number, frames.method_frame(number, commands.Basic.Cancel(tag)))

    def _outbox_bytes(self) -> int:
        with self._posted_lock:
            return self._posted_bytes + self.outbox()

    def _frame_max(self) -> int:
        return self._require_session().frame_max

    def _require_session(self) -> Session:
        assert self.session is not None, "the gateway sets it before the client's first byte"
        return self.session


def _apply_prefetch(channel: _Channel, prefetch: int) -> None:
    """A new ``basic.qos`` prefetch: for the consumers the channel starts from now on, and,
    where RabbitMQ cannot (rabbitmq-server#11948), for its live ones too (a consumer
    without acks keeps ``NO_ACK_PREFETCH``; a stream consumer's credit grows or shrinks
    by the change; 0, no limit, leaves a stream consumer's as it was)."""
    for tag, (consumer, no_ack) in channel.consumers.items():
        credit = channel.credits.get(tag)
        if credit is not None:
            if prefetch:
                credit.left += prefetch - consumer.prefetch
                consumer.prefetch = prefetch
        elif not no_ack:
            assert isinstance(consumer, Consumer)
            consumer.set_prefetch(prefetch or UNLIMITED_PREFETCH)
    channel.prefetch = prefetch


DELIVERY_COUNT_HEADER = encode_short_string("x-delivery-count")


def with_delivery_count(properties: bytes, delivery: Delivery) -> bytes:
    """A quorum queue's delivery's properties with RabbitMQ's ``x-delivery-count``: how
    many of its deliveries ended without an ack, on a redelivery (none on the first)."""
    if not delivery.delivery_count:
        return properties
    return frames.with_long_header(properties, DELIVERY_COUNT_HEADER, delivery.delivery_count)


def _publish_of(delivery: Delivery | StreamDelivery) -> tuple[bytes, bytes, bytes]:
    """The exchange and routing key (encoded shortstrs) and properties to deliver a
    message with: as its AMQP publisher sent them, or made from a Warren client's (what
    of those AMQP cannot carry, a message id over 255 bytes or a header it has no type
    for, is left out, and logged)."""
    message = delivery.message
    if message.amqp is not None:
        parts = split(message.amqp)
        if parts is not None:
            return parts
        log.warning("a message's AMQP publish does not read: delivered with its own properties")
    delivery_mode = 2 if message.persistent else 1
    try:
        properties = commands.Basic.Properties(
            content_type=message.content_type,
            headers=message.headers,
            delivery_mode=delivery_mode,
            expiration=None if message.expiration_ms is None else str(message.expiration_ms),
            message_id=message.message_id,
        ).marshal()
    except (TypeError, ValueError, struct.error) as exc:
        log.warning("a message's properties do not fit AMQP (%s): delivered without them", exc)
        properties = commands.Basic.Properties(delivery_mode=delivery_mode).marshal()
    queue = delivery.stream if isinstance(delivery, StreamDelivery) else delivery.queue
    return b"\x00", encode_short_string(queue), properties


def _expiration_ms(expiration: str | None) -> int | None:
    if expiration is None:
        return None
    if not (expiration.isascii() and expiration.isdigit()):
        raise AmqpError(
            frames.PRECONDITION_FAILED,
            f"PRECONDITION_FAILED - invalid expiration '{expiration}': not a non-negative "
            "integer of milliseconds",
            *frames.PUBLISH,
        )
    return int(expiration)


def _check_stream_properties(
    name: str, method: commands.Queue.Declare, ids: tuple[int, int]
) -> None:
    """A stream is durable, not exclusive and not auto-delete (406 otherwise), as on
    RabbitMQ: it outlives its publishers and readers by design."""
    for wrong, property_name in (
        (not method.durable, "non-durable"),
        (method.exclusive, "exclusive"),
        (method.auto_delete, "auto-delete"),
    ):
        if wrong:
            raise AmqpError(
                frames.PRECONDITION_FAILED,
                f"PRECONDITION_FAILED - invalid property '{property_name}' for queue "
                f"'{name}' in vhost '/'",
                *ids,
            )


def _queue_arguments(arguments: dict[str, Any], ids: tuple[int, int]) -> dict[str, Any]:
    """A queue's definition fields from its ``x-`` arguments; 406 for one Warren does not
    take, as RabbitMQ answers one it does not know the value of."""
    fields: dict[str, Any] = {}
    for key, value in arguments.items():
        if key == "x-queue-type":
            if value not in ("classic", "stream", "quorum"):
                raise AmqpError(
                    frames.PRECONDITION_FAILED,
                    f"PRECONDITION_FAILED - invalid arg 'x-queue-type': '{value}'",
                    *ids,
                )
            fields["type"] = value
        elif key in QUEUE_ARGUMENTS:
            fields[QUEUE_ARGUMENTS[key]] = value
        elif key == "x-max-priority":  # a feature not served, not a bad argument
            raise AmqpError(
                frames.NOT_IMPLEMENTED, "NOT_IMPLEMENTED - priority queues (x-max-priority)", *ids
            )
        else:
            raise AmqpError(
                frames.PRECONDITION_FAILED,
                f"PRECONDITION_FAILED - queue argument '{key}' is not supported",
                *ids,
            )
    return fields


def _amqp_error(exc: QueueError, ids: tuple[int, int]) -> AmqpError:
    """The error a Warren error is, as RabbitMQ would answer the same case, naming the
    method (``ids``) that met it."""
    if isinstance(exc, NotFound | QueueClosed):  # QueueClosed: deleted as it was asked
        return AmqpError(frames.NOT_FOUND, f"NOT_FOUND - {exc}", *ids)
    if isinstance(exc, AccessRefused):
        return AmqpError(frames.ACCESS_REFUSED, f"ACCESS_REFUSED - {exc}", *ids)
    if isinstance(exc, PreconditionFailed | InvalidArgument):
        return AmqpError(frames.PRECONDITION_FAILED, f"PRECONDITION_FAILED - {exc}", *ids)
    return AmqpError(frames.INTERNAL_ERROR, f"INTERNAL_ERROR - {type(exc).__name__}: {exc}", *ids)

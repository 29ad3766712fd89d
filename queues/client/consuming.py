"""Consuming from classic queues: ``Delivery`` (one message a connection holds until it
is settled), ``Consumer`` (an iterator over one queue's deliveries, at most ``prefetch``
unacked, fetching ahead while the application works) and ``PendingSettles`` (the tags
of consecutive acks, nacks or rejects, sent together as publishes are).

A delivery belongs to the connection's session that fetched it: after the connection
recovered from its node going away, the node has requeued what the old session held, so
settling a delivery of an earlier session does nothing (it comes again, flagged
redelivered), as RabbitMQ's recovering clients ignore acks of stale delivery tags.
"""

from __future__ import annotations

import collections
import math
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ..errors import InvalidArgument, NotFound, QueueError, QueueRestarting
from ..message import Message
from ..protocol import QueueRef
from .queue_refs import sender

if TYPE_CHECKING:
    from .connection_consuming import ConsumingCalls

__all__ = ["SETTLE_BATCH", "Consumer", "Delivery", "PendingSettles", "check_timeout"]

SETTLE_BATCH = 1000  # tags per Settle, at most
IDLE_POLL_S = (0.001, 0.05)  # a consumer's wait for room in its prefetch: from, to
LONG_POLL_MS = 2000  # how long a consumer's fetch waits in an empty queue for messages
# How late a long poll's answer may be (a busy queue) before the consumer waits for it
# as for any answer, looking whether the queue still lives (a SIGKILLed queue never
# answers; its restarted incarnation does not know the poll).
LATE_ANSWER_S = 1.0


class PendingSettles:
    """The tags of consecutive settles of one queue with one action, not sent yet."""

    __slots__ = ("action", "channel", "queue", "ref", "started", "tags")

    def __init__(self, queue: str, ref: QueueRef, action: str) -> None:
        self.queue = queue
        self.ref = ref
        self.channel = sender(ref)  # the filling thread's, as for a Publish
        self.action = action
        self.tags: list[int] = []
        self.started = time.monotonic()


class Delivery:
    """One message delivered to this connection."""

    def __init__(
        self,
        connection: ConsumingCalls,
        queue: str,
        seq_id: int,
        message: Message,
        delivery_count: int,
        ack_required: bool,
        served_ns: int = 0,
    ) -> None:
        self._connection = connection
        self.session = connection.session  # settled only within it
        self.queue = queue
        self.delivery_tag = seq_id
        self.message = message
        self.body = message.body
        self.headers = message.headers or {}
        self.message_id = message.message_id
        self.delivery_count = delivery_count
        self.redelivered = delivery_count > 0
        self.ack_required = ack_required
        # when its queue handed it out (the machine's monotonic clock, in ns): what two
        # queues of one node took in turn can be handed on in that order
        self.served_ns = served_ns

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


class Consumer:
    """An iterator over one queue's deliveries, with at most ``prefetch`` unacked; a
    context manager whose exit requeues what was not acked."""

    def __init__(
        self,
        connection: ConsumingCalls,
        queue: str,
        prefetch: int,
        inactivity_timeout: float | None = None,
    ) -> None:
        self.connection = connection
        self.queue = queue
        self.inactivity_timeout = inactivity_timeout
        self._ready: collections.deque[Delivery] = collections.deque()
        self._ahead: tuple[QueueRef, Any] | None = None  # the fetch sent ahead, unanswered
        self._ahead_due = math.inf  # when a long poll's answer is late (see LATE_ANSWER_S)
        self._closed = False
        self.serial = next(connection._consumer_serials)  # its number, for its queue
        self.set_prefetch(prefetch)

    def set_prefetch(self, prefetch: int) -> None:
        """Take at most ``prefetch`` unacked from now on (what is held beyond it stays
        held: no more is fetched until acks bring it under)."""
        if type(prefetch) is not int or prefetch < 1:
            raise InvalidArgument(f"prefetch must be an int >= 1, got {prefetch!r}")
        self.prefetch = prefetch
        self._fetch_at = max(1, prefetch // 2)  # how much free prefetch sends the next fetch

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
        check_timeout(timeout, "timeout", zero=True)
        return self._next_within(time.monotonic() + timeout)

    def take(self, wait_ms: int = LONG_POLL_MS) -> Delivery | None:
        """A delivery that has come, without waiting; meanwhile the next fetch, once the
        prefetch has room, waits in the queue for messages (a long poll of ``wait_ms``)
        and ``answer_socket`` says where its answer will come: for a thread that serves
        many consumers (the AMQP port's worker) and sleeps until one has something."""
        return self._next_within(time.monotonic(), wait_ms)

    def answer_socket(self) -> Any | None:
        """The socket the answer to this consumer's long poll comes on, to wait on with
        others (a ``zmq.Poller``) before ``take``; None when none is out, or the queue is
        reached through a listener (no socket of this thread's: look every so often).
        Consumers of one queue on one connection share it: ``answered`` first."""
        if self._ahead is None:
            return None
        return getattr(self._ahead[1], "socket", None)

    def answered(self) -> bool:
        """Whether the answer to this consumer's long poll is here, without waiting: a
        look at another consumer of the same queue may have read it off their shared
        socket, which then stays quiet."""
        return self._ahead is not None and self.connection._answered(self._ahead, 0)

    def _next_within(self, deadline: float | None, wait_ms: int | None = None) -> Delivery | None:
        """The next delivery; None at ``deadline``. The next fetch goes out as soon as
        half the prefetch is free, while the deliveries at hand are handed out, so the
        queue reads messages while the application works (its answer is taken once they
        are used up). A fetch waits in an empty queue until messages come (a long poll of
        ``wait_ms``, else what is left until ``deadline`` up to ``LONG_POLL_MS``: 0 looks
        once), so a consumer hears of a publish at once and an idle one costs the queue
        a fetch every ``LONG_POLL_MS``. With its prefetch held unacked, it looks for room
        ever less often (``IDLE_POLL_S``)."""
        wait = IDLE_POLL_S[0]
        while not self._closed:
            now = time.monotonic()
            if self._ahead is None:
                self._fetch_ahead(deadline, wait_ms)
            if self._ready:
                break
            if self._ahead is not None:
                if now < self._ahead_due:  # a long poll: its answer may take until then
                    look = self._ahead_due - now
                    if deadline is not None:
                        look = max(0.0, min(look, deadline - now))
                    if not self.connection._answered(self._ahead, look):
                        if deadline is not None and time.monotonic() >= deadline:
                            return None
                        continue
                asked, self._ahead = self._ahead, None
                self._take_in(self.connection._fetched(self.queue, asked))
                if self._ready or deadline is None or time.monotonic() < deadline:
                    continue
                if wait_ms is not None:  # the next long poll waits while the caller is away
                    self._fetch_ahead(deadline, wait_ms)
                return None
            left = None if deadline is None else deadline - now
            if left is not None and left <= 0:
                return None
            time.sleep(wait if left is None else min(wait, left))
            wait = min(wait * 2, IDLE_POLL_S[1])
        return self._ready.popleft() if self._ready else None

    def _take_in(self, fetched: list[Delivery]) -> None:
        """Keep what a fetch brought, but what is beyond the prefetch (lowered while the
        fetch waited in the queue, whose room it asked for): that goes back at once."""
        over = min(len(fetched), self.connection.held(self.queue) - self.prefetch)
        if over > 0:
            self.connection._give_back(self.queue, [d.delivery_tag for d in fetched[-over:]])
            fetched = fetched[:-over]
        self._ready.extend(fetched)

    def _fetch_ahead(self, deadline: float | None, wait_ms: int | None) -> None:
        """Send the next fetch, when half the prefetch is free or nothing is at hand (see
        ``_next_within``). Nothing while another consumer of this connection has the
        turn of a single-active-consumer queue: it waits as for room."""
        if not self.connection._has_turn(self):
            return
        room = self.prefetch - self.connection.held(self.queue)
        if room >= self._fetch_at or (room > 0 and not self._ready):
            now = time.monotonic()
            poll_ms = wait_ms
            if poll_ms is None:
                left_ms = LONG_POLL_MS if deadline is None else (deadline - now) * 1000
                poll_ms = max(0, min(LONG_POLL_MS, int(left_ms)))
            try:
                self._ahead = self.connection._fetch_async(self.queue, room, poll_ms)
            except QueueRestarting:
                return  # between two incarnations: the next look asks the new one
            self._ahead_due = now + poll_ms / 1000 + LATE_ANSWER_S if poll_ms else now

    def _recovered(self) -> None:
        """The connection recovered on a new node: what it fetched is back in the queue
        there (it comes again, flagged redelivered); subscribe again."""
        self._ready.clear()
        self._ahead = None
        try:
            self.connection._subscribe(self.queue, True, self.prefetch, self.serial)
        except NotFound as exc:
            if isinstance(exc, QueueRestarting):
                raise  # the node is still starting it: the recovery tries again
            # gone from the restarted node (a non-durable queue another connection
            # declared): the next fetch raises NotFound to the application

    def cancel(self) -> None:
        """Stop iterating; deliveries fetched but not yet handed out go back now. The
        queue hears of the stop first: it answers a long poll at once (with nothing)."""
        if self._closed:
            return
        self._closed = True
        self.connection._consumer_done(self)
        self.connection._subscribe(self.queue, False, serial=self.serial)
        if self._ahead is not None:
            asked, self._ahead = self._ahead, None
            try:
                self._ready.extend(self.connection._fetched(self.queue, asked))
            except (QueueError, TimeoutError):
                pass  # what it fetched goes back when the connection closes
        if self._ready:
            tags = [d.delivery_tag for d in self._ready]
            self._ready.clear()
            try:
                self.connection._give_back(self.queue, tags)
            except NotFound:
                pass  # an auto-delete queue that went with its last consumer, messages too

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc_info) -> None:
        self.cancel()


def check_timeout(value: Any, what: str, *, zero: bool = False) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
        or (value == 0 and not zero)
    ):
        bound = ">= 0" if zero else "> 0"
        raise InvalidArgument(f"{what} must be a finite number of seconds {bound}, got {value!r}")

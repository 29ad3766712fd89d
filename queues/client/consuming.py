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
IDLE_POLL_S = (0.001, 0.05)  # a consumer's wait between empty fetches: from, to


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
        self._closed = False
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

    def _recovered(self) -> None:
        """The connection recovered on a new node: what it fetched is back in the queue
        there (it comes again, flagged redelivered); subscribe again."""
        self._ready.clear()
        self._ahead = None
        try:
            self.connection._subscribe(self.queue, True, self.prefetch)
        except NotFound as exc:
            if isinstance(exc, QueueRestarting):
                raise  # the node is still starting it: the recovery tries again
            # gone from the restarted node (a non-durable queue another connection
            # declared): the next fetch raises NotFound to the application

    def cancel(self) -> None:
        """Stop iterating; deliveries fetched but not yet handed out go back now."""
        if self._closed:
            return
        self._closed = True
        self.connection._consumer_done(self)
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

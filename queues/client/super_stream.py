"""``SuperStreamConsumer``: one consumer over every partition of a super stream
(``Connection.consume("invoices")``), each partition read by a ``StreamConsumer`` of
its own with the same start, name and options.

Records come partition by partition, each partition's in its offsets' order (a super
stream orders records per partition, as Kafka orders a topic's per partition): the
consumer hands out what one partition has read ahead before it asks the next, so a
busy partition costs the idle ones one question each per chunk, not per record. Each
``StreamDelivery`` names its partition (``delivery.stream``) and its offset there.

With ``single_active=True`` and a ``name``, its partitions' consumers share one member
id in group ``name``: N programs consuming the super stream under one name split its
partitions between them (``warren.queues.broker.single_active``), each partition read by
one of them at a time, and the partitions of one that stops or dies pass to the others.

Races: as each partition's ``StreamConsumer``'s (a partition's stream restarting, a
recovery of the connection): a partition waits for its stream alone, the others read on.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from .stream import StreamConsumer, StreamDelivery, next_or_stop

if TYPE_CHECKING:
    from .connection_consuming import ConsumingCalls

__all__ = ["SuperStreamConsumer"]

IDLE_WAIT_S = 0.05  # how long one partition is waited on when none had a record


class SuperStreamConsumer:
    """An iterator over a super stream's records, partition after partition; a context
    manager whose exit cancels every partition's consumer."""

    def __init__(
        self,
        connection: ConsumingCalls,
        super_stream: str,
        partitions: list[str],
        offset: object,
        *,
        name: str | None,
        prefetch: int,
        inactivity_timeout: float | None,
        **options: Any,
    ) -> None:
        self.super_stream = super_stream
        self.inactivity_timeout = inactivity_timeout
        self.member = secrets.token_hex(8)  # its id in group ``name``, on every partition
        member = self.member
        self.consumers: list[StreamConsumer] = []
        try:
            for partition in partitions:
                self.consumers.append(
                    StreamConsumer(
                        connection,
                        partition,
                        connection._ref(partition),
                        offset,
                        name=name,
                        prefetch=prefetch,
                        inactivity_timeout=None,
                        member=member,
                        **options,
                    )
                )
        except BaseException:
            self.cancel()
            raise
        self.single_active = bool(self.consumers) and self.consumers[0].single_active
        self._turn = 0  # the partition read from now
        self._last: StreamConsumer | None = None  # the one that handed out the last record
        self._closed = False

    @property
    def partitions(self) -> list[str]:
        return [consumer.stream for consumer in self.consumers]

    def __iter__(self) -> Iterator[StreamDelivery]:
        return self

    def __next__(self) -> StreamDelivery:
        return next_or_stop(self)

    def get(self, timeout: float) -> StreamDelivery | None:
        """The next record of any partition, waiting up to ``timeout`` seconds (0: look
        once at each); None when none came or the consumer is cancelled."""
        return self._next_within(time.monotonic() + timeout)

    def _next_within(self, deadline: float | None) -> StreamDelivery | None:
        count = len(self.consumers)
        if self.single_active:  # every member's turn kept, not only the one read
            for consumer in self.consumers:
                consumer.beat_if_due()
        while not self._closed:
            for _ in range(count):
                consumer = self.consumers[self._turn]
                delivery = consumer.get(0)
                if delivery is None or not consumer.buffered:
                    self._turn = (self._turn + 1) % count  # drained: the next one's turn
                if delivery is not None:
                    self._last = consumer
                    return delivery
            left = IDLE_WAIT_S if deadline is None else deadline - time.monotonic()
            if left <= 0:
                return None
            consumer = self.consumers[self._turn]
            delivery = consumer.get(min(left, IDLE_WAIT_S))
            if delivery is not None:
                self._last = consumer
                return delivery
            self._turn = (self._turn + 1) % count
        return None

    def cancel(self, processed_last: bool = True) -> None:
        """Cancel every partition's consumer (see ``StreamConsumer.cancel``): with
        ``processed_last=False``, the last record handed out counts as not processed."""
        self._closed = True
        for consumer in self.consumers:
            consumer.cancel(processed_last or consumer is not self._last)

    def __enter__(self) -> SuperStreamConsumer:
        return self

    def __exit__(self, exc_type: object, *exc_info: object) -> None:
        self.cancel(processed_last=exc_type is None)

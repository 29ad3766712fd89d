"""``QuorumQueueActor``: one quorum queue as an OS process (``warren: queue <name>``), a
``QueueActor`` whose engine is a ``QuorumQueue`` (``warren.queues.engine.quorum_queue``)
logging through the node's WAL (``warren: wal``, ``warren.queues.broker.wal_actor``)
instead of the message stores.

It takes the messages a classic queue takes, with the same answers; what differs:

- Starting: it monitors the WAL (not the stores), asks it for the entries it holds for
  this queue that are not in its segments yet (``WalEntries``), and recovers from its
  snapshot, its segments and those. A ``Down`` of the WAL stops it as a store's would;
  the node's root restarts it after the WAL (rest_for_one).
- Confirms: a sync hands the commands logged since the last to the WAL and, when they
  hold enqueues, asks for its group commit (``WalAppend``) without waiting: the queue
  goes on, and the WAL's answer wakes it (the loop watches the socket it comes on) to
  confirm the publishes it covered; an append unanswered for ``WAL_TIMEOUT_S`` stops the
  queue. Deliveries and settles alone go unanswered (``WalWrite``): the WAL writes them
  at once and fdatasyncs them with its next waited commit (200 ms later at most). A sync
  that fails (the WAL gone, its disk full) stops the queue at once without a clean
  stop: the commands it had applied but not logged were never confirmed, and a log
  must not go on past a gap.
- Delivery limit: deliveries returned past the queue's ``delivery_limit`` are
  dead-lettered with reason ``delivery_limit`` (or dropped without a dead-letter
  exchange). Those the dead-letter exchange cannot take now stay out of the queue and are
  tried again every ``EXPIRY_CHECK_S``. Both dead-letter strategies keep a message here
  until the exchange's queues confirmed it (``at-most-once`` promises less than that).
- Single active consumer: with ``single_active_consumer``, turns go by consumer, in the
  order they subscribed (each ``Subscribe`` names its connection and the connection's
  number for that consumer, ``serial``); only the connection of the first consumer
  consuming now gets deliveries (a ``Fetch`` of another subscriber finds nothing, or is
  parked), and the connection hands them to that consumer alone
  (``warren.queues.client.consuming``). When it stops, or its connection's process ends,
  the next consumer in order takes over (another connection's, or the same one's), its
  parked fetches served at once. A connection that only gets (``basic.get``, no
  subscription) is served as ever.
- Deleting: the WAL drops the queue's entries and writes a tombstone, fdatasync'd
  (``WalForget``), before its directory goes: a queue declared again under the name
  never reads the old one's entries.

Races: a quorum queue restarted alone while its last entries are still in the WAL's file
reads them back from the WAL, which writes what waits before it answers; one restarted
with the WAL (the root's restart) finds them in its segments, as the WAL's start moved
every file left into them.
"""

from __future__ import annotations

import collections
import logging
import os
from typing import Any

import zmq

from warren.actors import ActorError, ActorRef, Future

from ..engine import ra_log
from ..engine.quorum_queue import QuorumQueue
from ..protocol import DeleteQueue, Fetch, Release, Subscribe
from .queue_actor import EXPIRY_CHECK_S, Engine, QueueActor
from .wal_actor import WAL_NAME, WalAppend, WalEntries, WalForget, WalWrite

log = logging.getLogger("warren.queues")

PAGE_OUT_LOOK_S = 0.1  # a queue past its RAM limit looks at its segments this often
WAL_TIMEOUT_S = 60.0  # how long an append waits for the WAL's group commit (a slow disk)


class _WalCommit:
    """The WAL's answer to an append: ``get`` waits for it at most ``WAL_TIMEOUT_S``."""

    def __init__(self, future: Future) -> None:
        self._future = future

    def arrived(self) -> bool:
        return self._future.arrived()

    def get(self) -> object:
        return self._future.get(WAL_TIMEOUT_S)


class QuorumQueueActor(QueueActor):
    """A quorum queue (the module docstring)."""

    _wal: ActorRef | None = None
    _owner = ""  # the queue's directory, relative to the node's data directory
    _retry_armed = False
    _wal_socket: zmq.Socket | None = None
    _watching_wal = False
    _paging_out = False  # a page_out is due on a timer
    # the consumers of a single-active-consumer queue, (connection, serial), in the order
    # they subscribed: the first one's connection is served
    _turns: list[tuple[bytes, int]]

    def _open_engine(self) -> Engine:
        (wal,) = self.monitor_named([WAL_NAME])
        if wal is None:
            raise RuntimeError(f"queue {self.queue_name}: the node's WAL is not running")
        if self.data_dir is None:
            raise ValueError(f"quorum queue {self.queue_name}: it needs the node's data_dir")
        # pinned: never an incarnation after the one whose unwaited writes it may have lost
        wal = self._wal = wal.pin()
        self._stores = [wal]  # what a clean stop checks still answers
        owner = os.path.relpath(self.directory, self.data_dir)
        term, held = wal.ask(WalEntries(owner), timeout=WAL_TIMEOUT_S)

        def append(records: list[bytes], durable: bool) -> _WalCommit | None:
            if not durable:
                wal.tell(WalWrite(owner, b"".join(records)))
                return None
            future = wal.ask_async(WalAppend(owner, b"".join(records)))
            self._wal_socket = future.socket  # every answer of the WAL comes on it
            self.when_readable(future.socket, self._wal_answered)
            if not self._watching_wal:
                self._watching_wal = True
                self.call_later(WAL_TIMEOUT_S, self._watch_wal)
            return _WalCommit(future)

        self._owner = owner
        return QuorumQueue(
            self.directory,
            append,
            owner=owner.encode(),
            term=term,
            wal_entries=[entry for _, entry in ra_log.unpack_records(held)],
            delivery_limit=self.definition.delivery_limit,
        )

    @property
    def _quorum(self) -> QuorumQueue:
        queue = self._engine
        assert isinstance(queue, QuorumQueue), "a quorum queue's engine"
        return queue

    def on_start(self) -> None:
        self._turns = []
        super().on_start()
        if not self._deleted:
            self._returned()  # what it recovered past the limit

    def _wal_answered(self) -> None:
        """The WAL answered an append: the publishes it made durable are confirmed now."""
        if self._deleted or self._no_clean_stop or self._wal_socket is None:
            return
        self._sync()
        if self._no_clean_stop:
            return  # the sync failed: the queue is stopping
        self._serve_parked()  # what the producer log named is no longer held back
        if self._quorum.awaiting_wal:
            self.when_readable(self._wal_socket, self._wal_answered)

    def _watch_wal(self) -> None:
        """Every ``WAL_TIMEOUT_S`` while appends are out: one out that long (a WAL alive
        but stuck, a disk that no longer answers) stops the queue, as a waited append
        that timed out would."""
        self._watching_wal = False
        if self._deleted or self._no_clean_stop:
            return
        waited = self._quorum.waited_for_wal_s()
        if waited is None:
            return
        if waited >= WAL_TIMEOUT_S:
            log.error(
                "queue %s: the WAL has not answered an append for %.0f s; stopping to recover",
                self.queue_name,
                waited,
            )
            self._stop_without_a_clean_close()
            return
        self._watching_wal = True
        self.call_later(WAL_TIMEOUT_S - waited, self._watch_wal)

    def _sync(self) -> None:
        try:
            super()._sync()
        except (ActorError, OSError) as exc:
            log.error(
                "queue %s: the WAL did not take its log (%s); stopping to recover",
                self.queue_name,
                exc,
            )
            self._stop_without_a_clean_close()
            return
        if not self._paging_out and self._quorum.over_ram_limit():
            self._paging_out = True
            self.call_later(PAGE_OUT_LOOK_S, self._page_out)

    def _page_out(self) -> None:
        """While its bodies in RAM are past the limit, every ``PAGE_OUT_LOOK_S``: those a
        segment holds leave RAM (also when nothing is published meanwhile: the WAL's
        rollover, which another queue's writes may bring, puts more in the segments)."""
        self._paging_out = False
        if self._deleted or self._no_clean_stop:
            return
        queue = self._quorum
        queue.page_out()
        if queue.over_ram_limit():
            self._paging_out = True
            self.call_later(PAGE_OUT_LOOK_S, self._page_out)

    # ------------------------------------------------------------------ delivery limit

    def _returned(self) -> None:
        queue = self._quorum
        over = queue.take_over_limit()
        if not over:
            return
        self.counters["delivery_limit_reached"] = self.counters.get(
            "delivery_limit_reached", 0
        ) + len(over)
        if self._dead is None:
            queue.ack(over)  # dropped, as RabbitMQ drops it without a dead-letter exchange
            return
        unsent = over
        if self._dead.room() >= len(over):
            payloads = []
            for tag in over:
                payload = queue.pending_payload(tag)
                if payload is None:
                    queue.lose_body(tag)  # damage took it from the log: nothing to send
                else:
                    payloads.append((tag, payload))
            unsent = self._dead.send(payloads, "delivery_limit")
        if unsent:
            queue.over_limit.extend(unsent)
            if not self._retry_armed:
                self._retry_armed = True
                self.call_later(EXPIRY_CHECK_S, self._retry_over_limit)
        self._arm_expiry_tick()  # the dead letters' confirms settle them here

    def _retry_over_limit(self) -> None:
        self._retry_armed = False
        if not self._deleted:
            self._returned()

    # ------------------------------------------------------------------ single active consumer

    def _active_consumer(self) -> bytes | None:
        return self._turns[0][0] if self._turns else None

    def _take(self, message: Fetch) -> list[Any]:
        if (
            self.definition.single_active_consumer
            and message.consumer in self._subscribers
            and message.consumer != self._active_consumer()
        ):
            return []  # waiting for its turn
        return super()._take(message)

    def _serve_parked(self) -> None:
        if not self.definition.single_active_consumer:
            super()._serve_parked()
            return
        # a waiting subscriber's parked fetch stays parked, and is passed over: the
        # active one's, behind it, is served now
        active = self._active_consumer()
        waiting = [
            p
            for p in self._parked
            if p.fetch.consumer not in self._subscribers or p.fetch.consumer == active
        ]
        kept = [p for p in self._parked if p not in waiting]
        self._parked = collections.deque(waiting)
        try:
            super()._serve_parked()
        finally:
            self._parked.extend(kept)

    def _subscribe(self, message: Subscribe) -> bool:
        active = self._active_consumer()
        super()._subscribe(message)
        turn = (message.consumer, message.serial)
        if message.active:
            self._turns.append(turn)
        elif turn in self._turns:
            self._turns.remove(turn)
        self._forget_turns()
        if self._active_consumer() != active:
            self._serve_parked()  # the next in line takes over
        return self.definition.single_active_consumer

    def _release(self, message: Release) -> None:
        active = self._active_consumer()
        super()._release(message)
        self._forget_turns()
        if self._active_consumer() != active:
            self._serve_parked()

    def _forget_turns(self) -> None:
        """Drop the turns of connections that consume no more (released, or every one of
        their consumers stopped)."""
        self._turns = [turn for turn in self._turns if turn[0] in self._subscribers]

    # ------------------------------------------------------------------ deleting

    def _delete(self, message: DeleteQueue) -> int:
        if self._wal is not None:  # its tombstone durable before its directory goes
            self._wal.ask(WalForget(self._owner), timeout=WAL_TIMEOUT_S)
        return super()._delete(message)

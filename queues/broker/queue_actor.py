"""``QueueActor``: one queue as an OS process (``warren: queue <name>``), wrapping the
queue engine (``VariableQueue``) with its own clients of the node's two stores.

Supervised by the node's ``queue_sup`` (one_for_one): a queue that crashes is restarted
alone and recovers from disk (its unacked messages come back flagged redelivered); a
store crash restarts every queue after it (the node's root is rest_for_one).

Messages accepted (``warren.queues.protocol``), and what each gets back:

    Publish(payloads, persistent, msg_ids, expiration_ms, producer, sequence, awaited)
                                   → the batch's size, once every message is confirmed:
                                     group commit when the mailbox is empty or after
                                     ``MAX_PASS_S`` of handling it still is not, at the
                                     latest ``sync_interval_ms`` later while shared-store
                                     writes are unsettled (an ``awaited`` Publish the
                                     mailbox's emptiness shows to be the pass's last is
                                     written at once: ``publish_many``'s
                                     ``sync_follows``). With a producer, repeats of
                                     sequences it already took are dropped (and counted
                                     as taken), and its publishes are answered in order,
                                     once its producer log names them
                                     (``warren.queues.broker.dedup``)
    Fetch(consumer, pid, count, ack_required, wait_ms)
                                   → up to ``count`` Delivered; those needing an ack are
                                     held for ``consumer`` (its process ``pid``); none
                                     from a deduplicated message its producer log does
                                     not name yet on (``warren.queues.broker.dedup``).
                                     With ``wait_ms``, one that finds nothing is parked
                                     (see Long polls)
    Settle(consumer, tags, action) (tell, or ask → the tags ignored) settles the tags the
                                     consumer holds; any other tag is ignored, logged and
                                     counted (``foreign_tags``): one connection cannot
                                     settle another's deliveries
    Subscribe(consumer, pid, active, prefetch)
                                   (tell) a consumer starts or stops; an ``auto_delete``
                                   queue deletes itself when the last one stops,
                                   its tombstone first: a process killed in the
                                   middle is restarted only to finish the delete
                                   (see Auto-delete in ``definitions``); an
                                   ``expires_ms`` one when unused that long (no
                                   consumer, Fetch or declare), the same way
    Release(consumer)              (tell) requeue what the consumer holds, end its
                                   subscriptions
    Purge()                        → messages purged
    QueueStats(declare)            → the engine's stats, the consumers and the name;
                                     ``consumer_details``: each connection that consumes
                                     or holds deliveries, its pid (the listener's for a
                                     remote one), its consumers, the prefetch its last
                                     one subscribed with and its deliveries unacked;
                                     ``declare``: a declare's, a use of the queue
    DeleteQueue()                  → messages deleted; every later request is refused

A message of another type, or whose fields are not what this list says, raises
``UnhandledMessage`` before anything of it is applied (an ask gets it as its error; a
tell is logged and counted): a stray or hostile message never restarts a queue.

Consumers: a consumer's deliveries go back to the queue, flagged redelivered, when its
process has ended: as soon as the process's last connection to this mailbox closes
(``on_peer_gone``: the kernel closes a dead process's sockets, so a zombie or a process
whose pid was reused since counts as ended at once), and, as a backstop, when a check
every ``consumer_check_s`` (run only while the queue has consumers) finds the process
gone (no such pid, another process's start time under it, or a zombie) with no
connection left open. A consumer SIGKILLed
mid-flight loses nothing, and an ack that reached this mailbox before the consumer's
end is applied before its deliveries are requeued, so a message acked by a consumer
that then died is never delivered again.

Long polls: a parked Fetch is answered, oldest first, after the pass (``on_idle``) or
the timer (a sync, an expiry tick) that left messages for it, so a consumer hears of a
publish as soon as the queue took it, without asking again and again; with [] when its
``wait_ms`` runs out, when its consumer stops (``Subscribe`` inactive: a cancel waits
for no poll) or is released (its process ended). A queue that stops fails it with
``ActorDeadError``, as the asks still in its mailbox (the consumer forgets this
incarnation and asks the next); a deleted one with ``QueueClosed``, as any request
after the delete.

Policies, from the queue's definition: ``message_ttl_ms`` (and a publish's own
``expiration_ms``, the shorter wins) expires messages at the head, every
``EXPIRY_CHECK_S`` and before each fetch. The tick runs only while the queue may hold a
message with an expiry (one was published since the queue was last empty, or the head
it recovered has one) or dead letters wait for their confirms: an idle queue of a node
of a thousand does not wake four times a second for nothing. Recovered messages with an
expiry behind a head without one wait for a fetch, as RabbitMQ's wait to reach the head.
``max_length`` drops the oldest messages (``overflow="drop-head"``) or refuses the newest
(``"reject-publish"``: the Publish answer counts what was taken). With a
``dead_letter_exchange``, expired, dropped and rejected (``Settle`` "reject") messages are
republished there (``warren.queues.broker.dead_letters``) and acked here once confirmed
there.

Garbage collection: the queue leaves Python's automatic collections in its process to
the youngest generation and runs a full one itself at most every
``FULL_COLLECTION_EVERY_S`` (counted from its start too), on the rates tick, when a
young collection has run since the last (what a young one leaves waits for it; at rest,
until the queue works again, as nothing new comes meanwhile); a Python
whose collector walks its old generation incrementally (CPython 3.14.0 to 3.14.4) is
left as it is. A collection of an older generation walks every object the collector
tracks there, and a queue holds one ``MsgStatus`` per message in RAM: the automatic full
ones (each time the oldest generation has grown by a quarter) cost a queue taking
``publish_many`` batches of 100 into a growing backlog a tenth of its CPU, three pauses
of about 55 ms by 300,000 messages; the automatic ones of the middle generation (every
tenth young one) walk the 8,000 or so statuses that came since the last, a pause of 3 to
5 ms every few thousand messages in which every publish waits for its confirm (nearly
all the confirms above the 99th percentile under a window-1,000 load). Message statuses
never form reference cycles (reference counting frees them); the young collections still
take the short-lived cycles of a queue's own work, and the full one what outlives them.

Alarms: under the node's memory alarm the queue's RAM duration target drops to 0 and it
pages out; when the alarm clears the target is infinity again. The rates are folded in
every ``RATES_INTERVAL_S`` (RabbitMQ: 5 s) while the queue works. Once they have decayed
to nothing with no operation since (``VariableQueue.rates_at_rest``), the rate timer
stops, as RabbitMQ stops it when a queue hibernates; the next operation starts it again
(looked for after each pass that handled messages, and at each expiry tick): an idle
queue of a node of a thousand does not wake every five seconds to fold zeros. A message
handled that moves no rate (a ``QueueStats``, a re-declare's question) leaves it at rest.

A store that goes down (a ``Down`` from the monitor the queue holds on each store) makes
the queue stop at once, without a clean stop: the node restarts it after the store, and
it recovers dirty, checking its entries against the store.

Starting: the queue asks the node for both stores' refs and monitors (``monitor_named``),
registers with both and opens its files. Given ``stores`` (where the node's stores live,
as the node knew them when it made the queue's spec: a declare's), it sends that request
first and opens its files while the node answers, registering with the stores at those
addresses meanwhile (a round trip to the node, a millisecond or two of each declare, off
its path). A store that restarted in between (its registration answered by another
incarnation than the one monitored) fails the start: the node restarts the queue after
the store anyway.

Races: a confirm is sent only after the sync that made the whole batch durable, so a
queue killed with confirms pending leaves its publishers an ActorDeadError (their batch
is in doubt: re-send it), never a false confirm. A store error in the middle of a
handler (the store client gave up on a silent or dead store) stops the queue at once
without a sync: carrying on would let the next sync confirm an index entry whose body
the store never took. So does a disk error (an OSError: a full disk under a batch that
goes message by message): the batch would be half taken, and a deduplicating producer's
accepted sequence already raised past the messages left out, so its retry would have
them dropped as repeats; the restart recovers both from disk. The pass ends there: what
waits in the mailbox is answered ActorDeadError (an ask: clients send it again to the
restarted queue) or dropped (a tell).

A Settle names its consumer, so one connection cannot ack another's deliveries; it
travels on the same socket as that connection's fetches, so a fetch after an ack sees the
ack applied.
"""

from __future__ import annotations

import collections
import functools
import gc
import logging
import math
import time
from collections.abc import Callable
from typing import Any, ClassVar, TypedDict

import psutil

from warren.actors import (
    ActorDeadError,
    ActorError,
    ActorRef,
    DeferredReply,
    Down,
    ProcessActor,
    UnhandledMessage,
    WarrenError,
)
from warren.store.client import StoreClient
from warren.store.errors import StoreError

from ..engine.quorum_queue import QuorumQueue
from ..engine.variable_queue import (
    MessageInfo,
    VariableQueue,
    collect_only_the_young_automatically,
    collector_is_generational,
)
from ..errors import CorruptMessage, OutOfSequence, QueueClosed, UnsupportedOperation
from ..protocol import (
    MAX_SEQUENCE,
    STREAM_MESSAGES,
    DeleteQueue,
    Delivered,
    Fetch,
    Publish,
    Purge,
    QueueDefinition,
    QueueStats,
    Release,
    Settle,
    Subscribe,
)
from .dead_letters import DeadLetters
from .dedup import ProducerLog, message_ids
from .definitions import is_marked_deleted, mark_deleted

__all__ = ["QueueActor"]

log = logging.getLogger("warren.queues")

# How soon a queue looks again for the shared store's settlement of its writes, while
# confirms wait on it (the store answers its own group commit; no fsync happens here).
SYNC_INTERVAL_MS = 2
# How long a queue whose mailbox stays busy handles messages between two group commits
# (seconds): the loop's pass bound (``max_pass_s``).
MAX_PASS_S = 0.00025
CONSUMER_CHECK_S = 2.0  # how often dead consumers' deliveries are requeued
RATES_INTERVAL_S = 5.0  # RAM_DURATION_UPDATE_INTERVAL
EXPIRY_CHECK_S = 0.25  # how often expired messages at the head are dropped
FULL_COLLECTION_EVERY_S = 60.0  # the most often a queue runs a full garbage collection
STORE_PING_S = 1.0  # how long a stopping queue waits for its stores' answer
STORES = ("msg_store_persistent", "msg_store_transient")  # the node's stores, by name
Engine = VariableQueue | QuorumQueue  # a classic queue's, a quorum queue's


class _StoreClientOptions(TypedDict):
    unavailable_after_s: float
    call_timeout_s: float
    unavailable_once_dead: bool


# A queue gives up on a silent store sooner than an application would, and on a dead one
# at once: the node restarts the queue after the store anyway (rest_for_one), stopping it
# before the store starts again, so a queue waiting for the next store in a handler would
# only hold that restart up until its stop timeout.
STORE_CLIENT_OPTIONS: _StoreClientOptions = {
    "unavailable_after_s": 5.0,
    "call_timeout_s": 5.0,
    "unavailable_once_dead": True,
}


class _Parked:
    """A Fetch that found nothing, its answer deferred until messages come or ``until``
    (monotonic seconds)."""

    __slots__ = ("fetch", "reply", "until")

    def __init__(self, fetch: Fetch, reply: DeferredReply, until: float) -> None:
        self.fetch, self.reply, self.until = fetch, reply, until


class _Batch:
    """A Publish awaiting its confirms: ``left`` of its messages are unconfirmed; a
    deduplicated one names its producer, the highest sequence it accepted and the seq id
    it holds consumers back from: its first message's until its producer record is
    written (infinity then, or when it took none)."""

    __slots__ = ("reply", "size", "left", "producer", "high", "holds_from")

    def __init__(
        self, reply: Any, size: int, left: int, producer: bytes | None = None, high: int = -1
    ) -> None:
        self.reply, self.size, self.left = reply, size, left
        self.producer, self.high = producer, high
        self.holds_from: float = math.inf


class QueueActor(ProcessActor):
    """One queue process; see the module docstring."""

    max_pass_s = MAX_PASS_S

    def __init__(
        self,
        definition: QueueDefinition,
        directory: str,
        *,
        data_dir: str | None = None,
        stores: tuple[ActorRef, ActorRef] | None = None,
        queue_options: dict[str, Any] | None = None,
        sync_interval_ms: float = SYNC_INTERVAL_MS,
        consumer_check_s: float = CONSUMER_CHECK_S,
    ) -> None:
        self.definition = definition
        self.queue_name = definition.name
        self.directory = directory
        self.data_dir = data_dir
        self.stores = stores  # the persistent and the transient store, as found ahead
        self.queue_options = dict(queue_options or {})
        self.sync_interval_s = sync_interval_ms / 1000
        self.consumer_check_s = consumer_check_s
        self.queue: Engine | None = None
        self._confirms: dict[int, _Batch] = {}  # seq id -> its batch
        self._producers: ProducerLog | None = None
        self._accepted: dict[bytes, int] = {}  # producer -> highest sequence taken
        self._recovered_ids: set[bytes] = set()  # entries the producer log may not name
        # A producer's batches are answered in the order they came, once its log record
        # says so: producer -> its batches not yet answered.
        self._producer_batches: dict[bytes, collections.deque[_Batch]] = {}
        # The deduplicated batches holding messages back, in seq order, and the lowest seq
        # id of a message their producer log does not name yet: no message from there on
        # is fetched or expired until it does (infinity: none).
        self._holding: collections.deque[_Batch] = collections.deque()
        self._hold_from: float = math.inf
        self._sync_armed = False
        self._held: dict[bytes, set[int]] = {}  # consumer -> tags awaiting its ack
        self._parked: collections.deque[_Parked] = collections.deque()  # oldest first
        self._park_timer_at = math.inf  # when the timer for the parked fetches runs
        self._owners: dict[bytes, tuple[int, float]] = {}  # consumer -> (pid, started)
        self._consumer_check_armed = False  # the check runs only while there are owners
        self._subscribers: dict[bytes, int] = {}  # connection -> its active consumers
        self._prefetch: dict[bytes, int] = {}  # connection -> its last consumer's prefetch
        self._deleted = False
        self._no_clean_stop = False
        # expires_ms: the last use (a consumer, a get, a declare), monotonic, and whether
        # the check that deletes the queue unused that long is scheduled
        self._used_at = time.monotonic()
        self._unused_check_armed = False
        self._dead: DeadLetters | None = None
        self._may_expire = False  # messages with an expiry may be in the queue
        self._expiry_armed = False  # the expiry tick is scheduled
        self._rates_armed = False  # the rate timer is scheduled
        self._rates_resting = True  # it is not, the rates at rest (see Alarms)
        self._stores: list[ActorRef] = []  # pinned: the incarnations we work with
        # monotonic time of the last full garbage collection, or of the start
        self._collected_at = time.monotonic()
        self._collects_fully = False  # set by on_start
        self.counters = {
            "published": 0,
            "delivered": 0,
            "released": 0,
            "foreign_tags": 0,
            "expired": 0,
            "dropped_over_max_length": 0,
            "rejected_publishes": 0,
            "repeats_dropped": 0,
            "confirmed": 0,
            "redelivered": 0,
            "acknowledged": 0,
        }

    # ------------------------------------------------------------------ lifecycle

    def on_start(self) -> None:
        self.queue = self._open_engine()
        self._producers = ProducerLog(self.directory)
        if self._producers.existed:
            self._recovered_ids = self.queue.msg_ids_from(self._producers.low_water)
            self._producers.record_recovered(self._recovered_ids)
        self._accepted = dict(self._producers.high)
        if self.definition.dead_letter_exchange is not None:
            if self.data_dir is None:
                raise ValueError(
                    f"queue {self.queue_name}: a dead-letter exchange needs the node's data_dir"
                )
            self._dead = DeadLetters(
                self.data_dir,
                self.queue_name,
                self.definition.dead_letter_exchange,
                self.definition.dead_letter_routing_key,
            )
        # with an incremental collector, left as it is, the process runs no full collection
        self._collects_fully = collector_is_generational()
        collect_only_the_young_automatically()
        self._arm_rates()
        if self.definition.deletes_itself and is_marked_deleted(self.directory):
            log.warning(
                "queue %s: finishing the delete it began itself before it ended",
                self.queue_name,
            )
            self._delete_for_good()
            return
        self._arm_unused_check()
        head = self.queue.peek()  # with an expiry, the messages it recovered may expire
        self._may_expire = head is not None and head.expiry_ms > 0
        self._arm_expiry_tick()

    def _open_engine(self) -> Engine:
        """The queue's engine, recovered, with ``_stores`` the actors it works with."""
        # the stores' refs and their monitors in one round trip to the node, answered
        # while the queue opens when it knows where the stores live (see Starting)
        monitoring = None
        if self.stores is None:
            persistent, transient = self._monitored(self.monitor_named(list(STORES)))
        else:
            monitoring = self.monitor_named_async(list(STORES))
            persistent, transient = self.stores
        clients: list[StoreClient] = []

        def client_of(store: ActorRef, ref: bytes) -> StoreClient:
            # registered with both stores in one round trip: each answer is taken at
            # its first use, the persistent store's at once, the transient one's below
            clients.append(StoreClient(store, ref, register_now=False, **STORE_CLIENT_OPTIONS))
            return clients[-1]

        queue = VariableQueue(
            self.directory,
            durable=self.definition.durable,
            lazy=self.definition.lazy,
            persistent_store=functools.partial(client_of, persistent),
            transient_store=functools.partial(client_of, transient),
            shared_store_clean=None,  # as the persistent store answers the registration
            **self.queue_options,
        )
        for client in clients:
            client.registered()  # a store that does not answer fails the start, as before
        if monitoring is not None:
            persistent, transient = self._monitored(monitoring.get())
            self._check_registered(clients, (persistent, transient))
        self._stores = [persistent.pin(), transient.pin()]
        return queue

    def _monitored(self, found: list[ActorRef | None]) -> tuple[ActorRef, ActorRef]:
        """Both stores as ``monitor_named`` found them; a start fails without either."""
        persistent, transient = found
        if persistent is None or transient is None:
            for store in (persistent, transient):
                if store is not None:
                    self.demonitor(store)
            raise RuntimeError(f"queue {self.queue_name}: the node's stores are not running")
        return persistent, transient

    def _check_registered(self, clients: list[StoreClient], stores: tuple[ActorRef, ...]) -> None:
        """Fail the start unless the stores given ahead (``stores``) are the node's, and
        each client registered with the incarnation monitored, not one that restarted
        between its registration and the monitor."""
        given = [store.address for store in self.stores or ()]
        if given != [store.address for store in stores]:
            for store in stores:
                self.demonitor(store)
            raise RuntimeError(
                f"queue {self.queue_name}: the stores it was given ({', '.join(given)}) are "
                f"not the node's ({', '.join(store.address for store in stores)})"
            )
        monitored = {store.address: store for store in stores}
        for client in clients:
            running = monitored[client.store.address]
            if client.incarnation != running.incarnation:
                for store in stores:
                    self.demonitor(store)
                raise RuntimeError(
                    f"queue {self.queue_name}: {running.name} restarted while the queue "
                    f"started (it registered with incarnation {client.incarnation}, "
                    f"incarnation {running.incarnation} runs now)"
                )

    def on_stop(self) -> None:
        gone = ActorDeadError(f"queue {self.queue_name} has stopped")
        parked, self._parked = self._parked, collections.deque()
        for entry in parked:  # as the asks still queued: the consumer asks the next one
            entry.reply.fail(gone)
        if self._dead is not None:
            self._dead.close()
        if self._producers is not None and (self.queue is None or self._deleted):
            self._producers.close()
        if self.queue is None or self._deleted:
            return
        if self._no_clean_stop or not self._stores_answer():
            # The node restarts this queue (after the store, when that went down); its
            # next start recovers dirty. Nothing is lost that a publisher was told is safe.
            self.queue.abandon()
            return
        try:
            self._answer(self.queue.sync(wait=True))
            self._producer_log.close()
            self.queue.terminate()
        except (StoreError, ActorError) as exc:
            # The store died before its Down reached us (a tree stopping everything after
            # it); the next start recovers dirty against the restarted store.
            log.warning("queue %s: no clean stop, the store is gone (%s)", self.queue_name, exc)
            self.queue.abandon()

    # The engine and the producer log are set by ``on_start``, which runs before any
    # message, timer or ``on_stop`` (a failed start ends the process without them).

    @property
    def _engine(self) -> Engine:
        assert self.queue is not None, "on_start sets the queue engine"
        return self.queue

    @property
    def _producer_log(self) -> ProducerLog:
        assert self._producers is not None, "on_start sets the producer log"
        return self._producers

    def _stores_answer(self) -> bool:
        """Whether both stores' incarnations this queue started with still answer (a tree
        stopping everything after a dead store stops us before its Down arrives)."""
        try:
            for store in self._stores:
                store.ping(timeout=STORE_PING_S)
        except ActorError:
            return False
        return True

    def on_alarm(self, resource: str, raised: bool) -> None:
        if resource == "memory" and self.queue is not None and not self._deleted:
            self.queue.set_ram_duration_target(0 if raised else math.inf)

    def on_idle(self) -> None:
        if self.queue is not None and not self._deleted:
            self._arm_rates()  # when what it handled moved the rates
            self._serve_parked()  # a delivery goes before the confirm, as RabbitMQ's
            if self.queue.needs_sync():
                self._sync()
                self._serve_parked()  # what the producer log named is no longer held back

    # ------------------------------------------------------------------ messages

    def on_receive_batch(self, messages: list[Any]) -> None:
        """Tells, in order; those that come after the queue deleted itself (an auto-delete
        queue's last consumer went: its other consumers' releases, settles of what they
        held) have nothing left to apply to and are dropped, where raising would end the
        process as a crash."""
        for index, message in enumerate(messages):
            if self._deleted:
                log.debug(
                    "queue %s: %d tells after its delete dropped",
                    self.queue_name,
                    len(messages) - index,
                )
                return
            super().on_receive_batch([message])

    def on_receive(self, message: Any) -> Any:
        handler = self._handlers.get(type(message))
        if isinstance(message, STREAM_MESSAGES):
            raise UnsupportedOperation(
                f"queue {self.queue_name!r} is a classic queue: {type(message).__name__} is "
                f"a stream's (declare one with type='stream')"
            )
        if handler is None:
            raise UnhandledMessage(
                f"queue {self.queue_name} does not handle {type(message).__name__}"
            )
        problem = _malformed(message)
        if problem is not None:
            raise UnhandledMessage(f"malformed {type(message).__name__}: {problem}")
        if self._deleted:
            raise QueueClosed(f"queue {self.queue_name} was deleted")
        try:
            answer = getattr(self, handler)(message)
        except StoreError:
            self._stop_without_a_clean_close()
            raise
        except WarrenError:
            raise  # another actor or the node failed a call (dead-lettering): not our disk
        except OSError:
            self._stop_without_a_clean_close()
            raise
        self._arm_expiry_tick()  # a message may have brought an expiry or a dead letter
        return answer

    def _stop_without_a_clean_close(self) -> None:
        """A store call or a write failed in the middle of a change (a publish whose index
        entry is written but whose body's settlement the store client gave up, a batch
        half taken when the disk filled): the engine may be half way, and a later sync
        would confirm what the store never took. Never carry on from there: stop now
        (the pass ends after this ask, no sync runs) without a clean close, as a failure,
        so that the queue is restarted, transient (auto_delete) or not, and recovers
        dirty. The asker gets the error."""
        self._no_clean_stop = True
        self.stop(abnormal=True)

    def _publish(self, message: Publish) -> None:
        queue = self._engine
        payloads, msg_ids = message.payloads, message.msg_ids
        sequences: list[int] = []  # with a producer: those of ``payloads``
        repeats, high = 0, -1
        if message.producer is not None:
            payloads, msg_ids, sequences, repeats, high = self._without_repeats(message)
        reply = self.defer_reply()
        if self.definition.max_length is not None and self.definition.overflow == "reject-publish":
            room = max(0, self.definition.max_length - len(queue))
            self.counters["rejected_publishes"] += max(0, len(payloads) - room)
            payloads = payloads[:room]
            msg_ids = msg_ids[:room] if msg_ids is not None else None
        ttls = [t for t in (message.expiration_ms, self.definition.message_ttl_ms) if t is not None]
        expiry = _now_ms() + min(ttls) if ttls else None
        seq_ids = queue.publish_many(
            payloads,
            persistent=message.persistent,
            msg_ids=msg_ids,
            expiry_ms=expiry,
            sync_follows=message.awaited and self.mailbox_empty(),
        )
        if message.producer is not None:
            # The highest taken, once taken (a batch refused whole, a message too large,
            # leaves the producer where it was): of the new messages kept, or of the
            # repeats found among the recovered entries (durable, not yet in the log).
            if payloads:
                high = max(high, sequences[len(payloads) - 1])
            if high > self._accepted.get(message.producer, -1):
                self._accepted[message.producer] = high
        if expiry is not None and seq_ids:
            self._may_expire = True
        self.counters["published"] += len(seq_ids)
        batch = _Batch(reply, len(seq_ids) + repeats, len(seq_ids), message.producer, high)
        if message.producer is not None and seq_ids:  # the newest seq ids: above any held
            batch.holds_from = seq_ids[0]
            self._holding.append(batch)
            self._hold_from = min(self._hold_from, seq_ids[0])
        if message.producer is not None:
            self._producer_batches.setdefault(message.producer, collections.deque()).append(batch)
            if not seq_ids:
                self._answer([])
        elif not seq_ids:
            reply.send(0)
        for seq_id in seq_ids:
            self._confirms[seq_id] = batch
        self._drop_over_max_length()

    def _without_repeats(
        self, message: Publish
    ) -> tuple[list[bytes], list[bytes], list[int], int, int]:
        """The messages of a deduplicated publish that are new: their payloads, ids and
        sequences; how many were repeats; the highest sequence of a repeat found among
        the recovered entries (durable, but not yet in the producer log)."""
        producer, first = message.producer, message.sequence
        # on_receive checked the fields: a publish with a producer has its sequence
        assert producer is not None and first is not None
        self._producer_log.begin()
        accepted = self._accepted.get(producer, -1)
        if first > accepted + 1:
            raise OutOfSequence(
                f"queue {self.queue_name}: producer {producer!r} sent sequence {first} "
                f"after {accepted}, the highest this queue took from it; nothing was taken: "
                f"send again from {accepted + 1} (a producer's sequences start at 0 and go "
                f"up by one)"
            )
        # Those up to ``accepted`` are repeats without a look; the rest are new unless the
        # index recovered them.
        start = min(accepted + 1 - first, len(message.payloads))
        repeats, high = start, -1
        recovered = self._recovered_ids
        payloads: list[bytes] = []
        msg_ids: list[bytes] = []
        sequences: list[int] = []
        ids = message_ids(producer, first + start, len(message.payloads) - start)
        for sequence, payload, msg_id in zip(
            range(first + start, first + len(message.payloads)),
            message.payloads[start:],
            ids,
            strict=True,
        ):
            if msg_id in recovered:
                repeats += 1
                high = sequence
            else:
                payloads.append(payload)
                msg_ids.append(msg_id)
                sequences.append(sequence)
        self.counters["repeats_dropped"] += repeats
        return payloads, msg_ids, sequences, repeats, high

    def _fetch(self, message: Fetch) -> list[Delivered]:
        self._used_at = time.monotonic()
        out = self._take(message)
        if not out and message.wait_ms:
            until = self._used_at + message.wait_ms / 1000
            self._parked.append(_Parked(message, self.defer_reply(), until))
            if until < self._park_timer_at:  # else the timer armed runs first
                self._arm_park_timer(until)
        return out

    def _take(self, message: Fetch) -> list[Delivered]:
        """What ``message`` fetches now, held for its consumer when it acks."""
        self._expire()
        queue = self._engine
        below = self._hold_from
        # without dead letters _expire dropped an expired head, unless the hold keeps it back
        may_be_left = self._dead is not None and self._may_expire
        if may_be_left and (head := queue.peek()) is not None and 0 < head.expiry_ms:
            if head.expiry_ms <= _now_ms():  # left for the dead-letter exchange's next round
                below = min(below, head.seq_id)  # never delivered; nor what is behind it
        out = []
        served_ns = time.monotonic_ns()
        for _ in range(message.count):
            try:
                fetched = queue.fetch_encoded(message.ack_required, below)
            except CorruptMessage:
                continue  # dropped, logged and counted: never delivered
            if fetched is None:
                break
            out.append(
                Delivered(fetched.seq_id, fetched.payload, fetched.delivery_count, served_ns)
            )
        if message.ack_required and out:
            self._held.setdefault(message.consumer, set()).update(d.seq_id for d in out)
            if message.consumer not in self._owners:
                self._owners[message.consumer] = (message.pid, _started(message.pid))
                self._arm_consumer_check()
        self.counters["delivered"] += len(out)
        self.counters["redelivered"] += sum(1 for d in out if d.delivery_count)
        return out

    def _settle(self, message: Settle) -> list[int]:
        held = self._held.get(message.consumer, set())
        tags = list(dict.fromkeys(message.tags))
        foreign = [tag for tag in tags if tag not in held]
        if foreign:  # the client checks first: a bug or a hostile peer
            self.counters["foreign_tags"] += len(foreign)
            log.warning(
                "queue %s: %d delivery tags in a %s are not held by that connection; ignored",
                self.queue_name,
                len(foreign),
                message.action,
            )
            tags = [tag for tag in tags if tag in held]
        queue = self._engine
        if message.action == "requeue":
            queue.requeue(tags)
        elif message.action == "reject" and self._dead is not None:
            # acked once the dead-letter exchange confirmed them (``_expiry_tick``); what
            # cannot be sent now (nothing while an alarm blocks publishers) goes back
            unsent = tags
            if self._dead.room() >= len(tags):
                payloads = [(t, self._rejected_payload(t)) for t in tags]
                unsent = self._dead.send(payloads, "rejected")
            queue.requeue(unsent)
        else:
            queue.ack(tags)
            if message.action == "ack":
                self.counters["acknowledged"] += len(tags)
        held.difference_update(tags)
        if message.action != "ack":
            self._returned()
        return foreign

    def _returned(self) -> None:
        """After deliveries went back to the queue: a classic queue has nothing to do (a
        quorum queue's may have passed their delivery limit)."""

    def _rejected_payload(self, tag: int) -> bytes:
        payload = self._engine.pending_payload(tag)
        if payload is None:  # its body is gone, or fails its check: nothing to republish
            raise CorruptMessage(
                f"queue {self.queue_name}: delivery {tag} cannot be dead-lettered, its body "
                f"is lost or corrupt"
            )
        return payload

    def _release(self, message: Release) -> None:
        self._used_at = time.monotonic()
        self._unpark(lambda entry: entry.fetch.consumer == message.consumer)
        held = self._held.pop(message.consumer, set())
        self._owners.pop(message.consumer, None)
        self._prefetch.pop(message.consumer, None)
        if held:
            self._engine.requeue(sorted(held))
            self.counters["released"] += len(held)
            self._returned()
            self._serve_parked()  # also when a timer found its process ended
        if self._subscribers.pop(message.consumer, 0):
            self._maybe_auto_delete()

    def _subscribe(self, message: Subscribe) -> bool:
        """Count the consumer in (or out); whether turns go by consumer (a quorum queue's
        single active consumer: ``QuorumQueueActor``)."""
        self._used_at = time.monotonic()
        if not message.active:  # answered, so that the consumer's cancel waits for none
            self._unpark(lambda entry: entry.fetch.consumer == message.consumer)
        count = self._subscribers.get(message.consumer, 0) + (1 if message.active else -1)
        if message.active and message.consumer not in self._owners:
            self._owners[message.consumer] = (message.pid, _started(message.pid))
            self._arm_consumer_check()
        if message.active:
            self._prefetch[message.consumer] = message.prefetch
        if count > 0:
            self._subscribers[message.consumer] = count
        else:
            self._prefetch.pop(message.consumer, None)
            if self._subscribers.pop(message.consumer, None) is not None:
                self._maybe_auto_delete()
        return False

    def _maybe_auto_delete(self) -> None:
        """An auto-delete queue whose last consumer stopped deletes itself."""
        if self.definition.auto_delete and not self._subscribers and not self._deleted:
            self._delete_itself("its last consumer stopped (auto_delete)")

    def _arm_unused_check(self) -> None:
        """Schedule the check that deletes an ``expires_ms`` queue unused that long, for
        when that would be; unless it is scheduled already."""
        expires_ms = self.definition.expires_ms
        if expires_ms is None or self._unused_check_armed or self._deleted:
            return
        self._unused_check_armed = True
        due = self._used_at + expires_ms / 1000 - time.monotonic()
        self.call_later(max(due, 0.0), self._unused_check)

    def _unused_check(self) -> None:
        self._unused_check_armed = False
        expires_ms = self.definition.expires_ms
        if self._deleted or expires_ms is None:
            return
        if self._subscribers:
            self._used_at = time.monotonic()  # in use: its time starts from its last consumer
        elif time.monotonic() - self._used_at >= expires_ms / 1000:
            self._delete_itself(f"unused for {expires_ms} ms (expires_ms)")
            if self._deleted:
                return
            self._used_at = time.monotonic()  # its tombstone failed: again a period on
        self._arm_unused_check()

    def _delete_itself(self, why: str) -> None:
        """Delete this queue that deletes itself (see ``QueueDefinition.deletes_itself``),
        messages and files, and end its process, for good: the node then forgets its
        definition. Its tombstone first: from then on the delete is decided (see
        Auto-delete in ``definitions``). One that cannot be written leaves it as it is."""
        log.info("queue %s: %s; deleting it", self.queue_name, why)
        try:
            mark_deleted(self.directory, self.queue_name)
        except OSError as exc:
            log.error(
                "queue %s stays for now: its tombstone could not be written (%s)",
                self.queue_name,
                exc,
            )
            return
        self._delete_for_good()

    def _delete_for_good(self) -> None:
        """Delete this queue, whose tombstone is written, and end the process
        normally: its transient restart does not start it again. The tombstone stays
        until the node has dropped the definition (see Auto-delete in ``definitions``)."""
        self._delete(DeleteQueue())
        self.stop()

    def _purge(self, message: Purge) -> int:
        return self._engine.purge()

    def _stats(self, message: QueueStats) -> dict[str, Any]:
        if message.declare:
            self._used_at = time.monotonic()
        queue = self._engine
        stats = queue.stats()
        stats.update(queue.counters)  # what recovery and reads dropped, and why
        if self._dead is not None:
            stats.update(self._dead.counters)
        stats.update(
            name=self.queue_name,
            durable=self.definition.durable,
            consumer_timeout_ms=self.definition.consumer_timeout_ms,
            consumers=sum(self._subscribers.values()),
            consumer_details=self._consumer_details(),
            messages_ready=stats["len"],
            messages_unacked=stats["depth"] - stats["len"],
            **self.counters,
        )
        return stats

    def _consumer_details(self) -> list[dict[str, Any]]:
        """Each connection that consumes from this queue or holds its deliveries (a
        ``get`` with acks), by its id's first 8 bytes in hex."""
        return [
            {
                "connection": consumer[:8].hex(),
                "pid": self._owners[consumer][0] if consumer in self._owners else None,
                "consumers": self._subscribers.get(consumer, 0),
                "prefetch_count": self._prefetch.get(consumer, 0),
                "unacked": len(self._held.get(consumer, ())),
            }
            for consumer in sorted(
                self._subscribers.keys() | {c for c, tags in self._held.items() if tags}
            )
        ]

    def _delete(self, message: DeleteQueue) -> int:
        queue = self._engine
        count = queue.depth
        parked, self._parked = self._parked, collections.deque()
        for entry in parked:
            entry.reply.fail(QueueClosed(f"queue {self.queue_name} was deleted"))
        waiting = set(self._confirms.values()).union(*self._producer_batches.values())
        for batch in waiting:
            batch.reply.fail(
                QueueClosed(f"queue {self.queue_name} was deleted before confirming this publish")
            )
        self._confirms.clear()
        self._producer_batches.clear()
        self._holding.clear()
        self._hold_from = math.inf
        self._producer_log.close()
        queue.delete()
        self._deleted = True
        return count

    def _down(self, message: Down) -> None:
        log.warning(
            "queue %s: %s went down (%s); stopping, to be restarted after it",
            self.queue_name,
            message.ref.name,
            message.reason,
        )
        self._no_clean_stop = True
        self.stop()

    # each message's handler, by name: a subclass's override handles it there
    _handlers: ClassVar[dict[type, str]] = {
        Publish: "_publish",
        Fetch: "_fetch",
        Settle: "_settle",
        Release: "_release",
        Subscribe: "_subscribe",
        Purge: "_purge",
        QueueStats: "_stats",
        DeleteQueue: "_delete",
        Down: "_down",
    }

    # ------------------------------------------------------------------ long polls

    def _serve_parked(self) -> None:
        """Answer the parked fetches, oldest first, while the queue has messages for them
        (none while the head is held back: the next sync's call serves them)."""
        while self._parked and not self._deleted and len(self._engine):
            entry = self._parked[0]
            out = self._take(entry.fetch)
            if not out:
                return
            self._parked.popleft()
            entry.reply.send(out)

    def _unpark(self, which: Callable[[_Parked], bool]) -> None:
        """Answer the parked fetches ``which`` picks with nothing."""
        kept: collections.deque[_Parked] = collections.deque()
        for entry in self._parked:
            if which(entry):
                entry.reply.send([])
            else:
                kept.append(entry)
        self._parked = kept

    def _arm_park_timer(self, at: float) -> None:
        """Run ``_park_timer`` at ``at`` (monotonic seconds), in place of the timer armed
        for later (which then does nothing when it runs)."""
        self._park_timer_at = at
        self.call_later(max(0.0, at - time.monotonic()), lambda: self._park_timer(at))

    def _park_timer(self, at: float) -> None:
        """Answer the parked fetches whose wait ended; run again when the next one's
        does."""
        if at != self._park_timer_at:
            return  # superseded by a timer armed for earlier
        self._park_timer_at = math.inf
        now = time.monotonic()
        self._unpark(lambda entry: entry.until <= now)
        if self._parked:
            self._arm_park_timer(min(entry.until for entry in self._parked))

    # ------------------------------------------------------------------ confirms

    def _sync(self) -> None:
        queue = self._engine
        self._answer(queue.sync(wait=False))
        if not self._deleted:
            self._drop_over_max_length()  # what the answers stopped holding may go now
            self._arm_expiry_tick()  # for the dead letters' confirms
        if queue.needs_sync() and not self._sync_armed:
            self._sync_armed = True
            self.call_later(self.sync_interval_s, self._sync_timer)

    def _sync_timer(self) -> None:
        self._sync_armed = False
        if not self._deleted and self._engine.needs_sync():
            self._sync()
            self._serve_parked()  # what the producer log named is no longer held back

    def _answer(self, confirmed: list[int]) -> None:
        """Answer the publishes whose messages are all confirmed now. A deduplicated
        producer's are answered in the order they came, after the producer log names
        their sequences (``warren.queues.broker.dedup``)."""
        confirms = self._confirms
        for seq_id in confirmed:
            batch = confirms.pop(seq_id, None)
            if batch is not None:
                batch.left -= 1
                if batch.left == 0 and batch.producer is None:
                    batch.reply.send(batch.size)
                    self.counters["confirmed"] += batch.size
        if not self._producer_batches:
            return
        highs: list[tuple[bytes, int]] = []
        answered: list[_Batch] = []
        for producer, batches in list(self._producer_batches.items()):
            high = -1
            while batches and batches[0].left == 0:
                batch = batches.popleft()
                high = max(high, batch.high)
                answered.append(batch)
            if high >= 0:
                highs.append((producer, high))
            if not batches:
                del self._producer_batches[producer]
        if highs:
            low_water = min(confirms) if confirms else self._engine.next_seq_id
            self._producer_log.record(highs, low_water)
        for batch in answered:
            batch.holds_from = math.inf  # named by the log: a consumer may have it
            batch.reply.send(batch.size)
            self.counters["confirmed"] += batch.size
        holding = self._holding
        while holding and holding[0].holds_from == math.inf:
            holding.popleft()
        self._hold_from = holding[0].holds_from if holding else math.inf

    # ------------------------------------------------------------------ TTL, max-length

    def _expire(self) -> None:
        """Drop, or dead-letter, the expired messages at the head (RabbitMQ expires a
        queue's messages at its head only)."""
        now = _now_ms()
        queue = self._engine
        hold_from = self._hold_from

        def expired(info: MessageInfo) -> bool:
            return 0 < info.expiry_ms <= now and info.seq_id < hold_from

        if self._dead is None:
            before = len(queue)
            queue.drop_while(expired)
            self.counters["expired"] += before - len(queue)
            return
        dead: list[tuple[int, bytes]] = []
        room = self._dead.room()
        while len(dead) < room and (info := queue.peek()) is not None and expired(info):
            # that head only: one whose body is missing from the shared store is dropped,
            # and the next message may be unexpired, or held (see _hold_from)
            fetched = queue.fetch_encoded(ack_required=True, below=info.seq_id + 1)
            if fetched is None:  # dropped: the next head is checked in turn
                continue
            dead.append((fetched.seq_id, fetched.payload))
        back = self._dead.send(dead, "expired")
        queue.requeue(back, delivered=False)  # at the head again, for the next round
        self.counters["expired"] += len(dead) - len(back)

    def _drop_over_max_length(self) -> None:
        """With ``overflow="drop-head"``, drop the oldest messages beyond ``max_length``,
        or dead-letter them. A message held for its producer's record (see
        ``_hold_from``) is dead-lettered only once the record names it: a queue killed
        before would otherwise have it sent on, and then again when its producer,
        never confirmed, sends it again. Until then the queue is over its length."""
        excess = self._over_max_length()
        if not excess:
            return
        queue = self._engine
        dead_letters = self._dead is not None
        below = self._hold_from if dead_letters else math.inf
        # none while the node starts (a queue recovered over its length): the expiry tick
        # tries again, as it does for expired messages
        room = self._dead.room() if self._dead is not None else excess
        dead: list[tuple[int, bytes]] = []
        for _ in range(min(excess, room)):
            info = queue.peek()
            if info is None or info.seq_id >= below:
                break
            # that head only: one whose body is missing from the shared store is dropped
            # as it is, and counts towards the excess (see _expire)
            fetched = queue.fetch_encoded(ack_required=dead_letters, below=info.seq_id + 1)
            self.counters["dropped_over_max_length"] += 1
            if fetched is not None and dead_letters:
                dead.append((fetched.seq_id, fetched.payload))
        if self._dead is not None:
            back = self._dead.send(dead, "maxlen")
            queue.requeue(back, delivered=False)  # over the length: the expiry tick's again
            self.counters["dropped_over_max_length"] -= len(back)

    def _over_max_length(self) -> int:
        """How many messages a drop-head queue holds beyond its ``max_length`` (0 for
        any other queue)."""
        max_length = self.definition.max_length
        if max_length is None or self.definition.overflow != "drop-head":
            return 0
        return max(0, len(self._engine) - max_length)

    def _arm_expiry_tick(self) -> None:
        """Schedule the expiry tick, unless it is already or nothing needs it: no message
        that may expire is held, no dead letter waits for its confirm, and the queue
        holds no message beyond its max-length (one recovered over it, or waiting for
        the dead-letter exchange)."""
        if self._expiry_armed or self._deleted:
            return
        if (
            self._may_expire
            or (self._dead is not None and self._dead.pending)
            or self._over_max_length()
        ):
            self._expiry_armed = True
            self.call_later(EXPIRY_CHECK_S, self._expiry_tick)

    def _expiry_tick(self) -> None:
        self._expiry_armed = False
        if self._deleted:
            return
        self._arm_rates()  # when what it did meanwhile moved the rates
        self._expire()
        self._drop_over_max_length()
        if self._dead is not None:
            done = self._dead.settled()
            if done:
                self._engine.ack(done)
        if self._engine.depth == 0:  # nothing held, ready or unacked, can expire now
            self._may_expire = False
        self._arm_expiry_tick()
        self._serve_parked()  # behind a head dead-lettered now

    # ------------------------------------------------------------------ timers

    def on_peer_gone(self, pid: int) -> None:
        self._release_ended(lambda owner_pid: owner_pid == pid)

    def _arm_consumer_check(self) -> None:
        """Run the consumers' check in ``consumer_check_s``, unless it is due already: an
        idle queue without consumers does not wake for it."""
        if not self._consumer_check_armed:
            self._consumer_check_armed = True
            self.call_later(self.consumer_check_s, self._check_consumers)

    def _check_consumers(self) -> None:
        # a process whose connection is still open may have acks on their way in: its
        # end is handled when that connection closes (on_peer_gone)
        self._consumer_check_armed = False
        self._release_ended(lambda pid: not self.peer_connected(pid))
        if self._owners:
            self._arm_consumer_check()

    def _release_ended(self, candidate: Callable[[int], bool]) -> None:
        """Requeue what the consumers of ended processes held, among ``candidate`` pids."""
        for consumer, (pid, started) in list(self._owners.items()):
            if candidate(pid) and _started(pid) != started:
                log.info(
                    "queue %s: consumer process %d has ended; requeueing %d deliveries",
                    self.queue_name,
                    pid,
                    len(self._held.get(consumer, ())),
                )
                self._release(Release(consumer))

    def _arm_rates(self) -> None:
        """Schedule the rate timer, unless it is already or the rates are at rest; after
        a rest, the rates' next interval starts now (the time at rest held no operation)."""
        if self._rates_armed or self._engine.rates_at_rest():
            return
        if self._rates_resting:
            self._rates_resting = False
            self._engine.resume_rates()
        self._rates_armed = True
        self.call_later(RATES_INTERVAL_S, self._update_rates)

    def _update_rates(self) -> None:
        self._rates_armed = False
        if self._deleted:
            return
        self._engine.update_rates()
        now = time.monotonic()
        if (
            self._collects_fully
            and any(gc.get_count()[1:])
            and now - self._collected_at >= FULL_COLLECTION_EVERY_S
        ):
            gc.collect()
            self._collected_at = now
        if self._engine.rates_at_rest():
            self._rates_resting = True
        else:
            self._arm_rates()


def _now_ms() -> int:
    return int(time.time() * 1000)


def _started(pid: int) -> float:
    """The process's start time; 0.0 when it does not exist or has ended unreaped (a
    zombie), so that an ended process, and a new one under its pid, differ from it."""
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return 0.0
        return process.create_time()
    except psutil.Error:
        return 0.0


def _malformed(message: Any) -> str | None:
    """What is wrong with a Publish beyond what its fields' own checks say (the codec
    applied those on decode), or None."""
    if not isinstance(message, Publish):
        return None
    if message.msg_ids is not None and len(message.msg_ids) != len(message.payloads):
        return "msg_ids must be None or one 16-byte id per payload"
    if (message.producer is None) != (message.sequence is None):
        return "producer and sequence go together: the first message's sequence, with a producer"
    if message.sequence is not None:
        if message.sequence > MAX_SEQUENCE - len(message.payloads):
            return "sequence must be an int >= 0 (the first message's) with a producer"
        if message.msg_ids is not None:
            return "msg_ids must be None with a producer: the queue derives them"
    return None

"""``ConnectionCore``: what every call of a ``Connection`` stands on, whatever its role.

It holds the connection's state with its node (the transport, the cached refs of queue
incarnations, the window of unconfirmed publishes, the deliveries it holds, what it
declared), the lock every call that uses the transport holds, and the frames being
filled (``_flush``: a ``Publish`` of ``publish_async`` and a ``Settle`` of acks, sent
before anything else the connection sends, so that it all leaves in the order it was
called; ``_flush_lingering`` is the flusher thread's way in). ``exclusive`` marks a
call that takes the lock and sends those frames first.

Recovery (``warren.queues.client.recovery``) lives here too: a call that finds the node
gone (``NODE_ERRORS``) asks ``_lost``, which closes the connection with
``ConnectionClosed`` or connects again (``_recover``, ``_new_session``) and has the call
made again. Races it guards against: the flusher thread sending while the user's thread
calls (the lock; the flusher never waits for it, it looks again later); a queue that
restarted between two calls (refs are pinned to one incarnation: what a lost request
asked is never applied by the next one behind the connection's back); a node lost in
the middle of a recovery (``_recovering_now``: the attempt fails, the next one starts
over); a close racing the flusher (a closed connection sends nothing more).

The roles built on it: ``warren.queues.client.connection_publishing`` (publish calls,
confirms, alarms) and ``warren.queues.client.connection_consuming`` (get, consume,
settles, a stream's offsets and sequences); ``warren.queues.client.connection`` puts
them together with the declarations.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Self, TypeVar, cast

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
from ..protocol import NodeHandle, QueueRef, QueueStats, Release, Settle
from .consuming import Consumer, Delivery, PendingSettles, check_timeout
from .publishing import (
    ASYNC_BATCH,
    BUSY_DOUBLINGS,
    BUSY_RECHECK_S,
    LINGER_S,
    OutgoingPublish,
    flusher,
)
from .queue_refs import await_answer, is_stream_ref, known_gone
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

if TYPE_CHECKING:
    from .connection import Connection

log = logging.getLogger("warren.queues")

CALL_TIMEOUT_S = 60.0
CLOSE_WAIT_S = 2.0  # how long close waits for its queues to confirm they took its settles
# what a call raises when the node it went to is no longer there (or a queue restarted)
NODE_ERRORS = (NodeNotRunning, ConnectionClosed, ActorDeadError)


Call = TypeVar("Call", bound=Callable[..., Any])
Result = TypeVar("Result")


def exclusive(call: Call) -> Call:
    """A call of the connection that uses its transport: it holds the connection's lock
    (the flusher thread sends nothing meanwhile) and sends what ``publish_async`` keeps
    first, so that everything the connection sends stays in the order it was called.
    A call that finds the node gone is made again once the connection recovered (each
    such call changes nothing twice: see ``ConnectionCore._recovering``)."""

    @functools.wraps(call)
    def exclusively(self: ConnectionCore, *args: Any, **kwargs: Any) -> Any:
        return self._recovering(functools.partial(call, self, *args, **kwargs), flush=True)

    return cast(Call, exclusively)


class ConnectionCore:
    """A connection's state and what every call stands on (see the module docstring)."""

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
        # This connection's consumers of each single-active-consumer queue, in the order
        # they started: when the queue serves this connection, only the first fetches.
        self._turns: dict[str, list[Consumer]] = {}
        self._consumer_serials = itertools.count(1)  # each consumer's number for its queue
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
        # sends a lingering Publish: what the connection shares with a thread, beside
        # the event ``interrupt`` sets.
        self._lock = threading.RLock()
        self._held: dict[str, dict[int, Delivery]] = {}  # queue -> tag -> delivery
        # queue process pid -> when a long poll's wait last looked whether it lives
        self._process_looks: dict[int, float] = {}
        self._subscribed: set[str] = set()  # queues it has consumed from
        self._settled: set[str] = set()  # queues it sent settles to
        # exchange -> (read at, kind, bindings, alternate exchange)
        self._routes: dict[str, tuple[float, str, list, str]] = {}
        self._alarms: list[str] = []
        self._alarms_read_at = float("-inf")
        self._closed = False
        # Set from any thread by ``interrupt``: a publish waiting out the node's alarms ends.
        self._interrupted = threading.Event()

    # ------------------------------------------------------------------ frames being filled

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

    # ------------------------------------------------------------------ plumbing

    def _ref(self, queue: str) -> QueueRef:
        self._check_open()
        ref = self._refs.get(queue)
        if ref is None or known_gone(ref):  # gone (another connection saw it): the one now
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
        if isinstance(consumer, Consumer) and consumer in self._turns.get(consumer.queue, ()):
            self._turns[consumer.queue].remove(consumer)
            if not self._turns[consumer.queue]:
                del self._turns[consumer.queue]

    def _has_turn(self, consumer: Consumer) -> bool:
        """Whether ``consumer`` may fetch: its queue has no single active consumer, or
        it is the first of this connection's consumers of the queue."""
        turns = self._turns.get(consumer.queue)
        return not turns or turns[0] is consumer

    def interrupt(self) -> None:
        """End a publish that waits for the node's resource alarm to clear, now or later,
        with ``Blocked`` (what it had not sent is not sent): for a server stopping the
        thread that uses this connection, which would otherwise wait up to
        ``call_timeout_s``. The one method another thread may call; the connection's own
        thread still closes it."""
        self._interrupted.set()

    def _check_open(self) -> None:
        if self._closed:
            raise ConnectionClosed("this connection is closed; open a new one")

    @exclusive
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

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

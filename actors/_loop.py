"""The loop of an actor process: bind the mailboxes, start the actor, serve, tear down.

Runs on the main thread of the process the forkserver forked for one actor incarnation,
in three phases:

setup     bind the data ROUTER and the control ROUTER (ROUTER_MANDATORY, ROUTER_HANDOVER,
          bounded HWM and linger), build the actor, run ``on_start``, then tell the node
          READY (or FAILED, and exit ``EXIT_START_FAILED``). A caller's ``spawn`` returns
          on READY, so a ref is never handed out before its mailbox is bound.
running   one poll over [control, data, wake pipe, the sockets the actor watches for an
          answer it awaits (``when_readable``: its callback runs once, the socket then
          unwatched)]. Each pass serves every waiting
          control message first (PING, STATS, FIGURES, STOP, and DOWN/EXIT from the
          node), then drains up to ``max_batch`` data messages (and about
          ``MAX_BATCH_BYTES``, and for at most the class's ``max_pass_s``): runs of
          tells go to ``on_receive_batch`` as one list, each ask to ``on_receive`` in its
          place in the order. Then ``on_idle`` if the mailbox was found empty (at a
          bound too, with nothing behind it) or the pass had run ``max_pass_s`` when it
          ended (the clock is read before each further
          message, so a run of tells delivered at the end may take longer), then due
          timers. A pass that left messages waiting after ``max_batch`` messages or the
          byte budget is counted (``backlogged_passes``), and so is one ended by the clock
          once ``max_batch`` messages were taken since the mailbox was last empty: ZeroMQ
          keeps the mailbox's queue and tells no length, but this says the actor falls
          behind (a busy queue ends a pass on the clock every quarter of a millisecond,
          which alone says nothing).
          FIGURES (a node's metrics) runs ``on_receive`` with the question it carries
          between two passes, ahead of the queued data, as a read of the actor's state
          now; what it raises is logged and answered None, never a crash.
          Published figures (``warren.actors.figures``; an actor whose class says
          ``figures_from_loop`` and whose control socket is ipc gets a figures file at
          setup, dirty): the answer to a FIGURES request is also written to the
          incarnation's figures file, and its question kept. From
          then on, before a pass handles anything that may change the answer (data,
          posted calls, timers, ``on_idle``, a control message other than PING, STATS
          or FIGURES) the file is marked dirty, once; and after a pass, when no message
          has been handled for ``_QUIET_S`` (a pass of timers alone is quiet), the loop
          answers the question itself and publishes what changed, or marks the file
          clean when nothing did. A busy actor so spends nothing on it (the node asks
          it instead) and an idle one is read by the node without a round trip. Before
          each poll the loop stamps the file with the moment it will have turned by at
          the latest (the poll's timeout from now), when that is ``STAMP_S`` past its
          last stamp: a busy loop stamps four times a second, an idle one once per
          sleep. The node takes a loop silent for ``LIVE_S`` past its stamp for stopped
          (what it handles in the meantime marks the file dirty first).
          An idle loop sleeps until something is due, ``_IDLE_POLL_MS`` at most (then it
          checks its parent): RabbitMQ's queues hibernate, and a node of a thousand
          actors that each woke every second spent a tenth of a core on nothing. What
          wakes an idle actor of a node is its supervisor's heartbeat.
teardown  ``on_stop`` (clean stops) or nothing more (``on_failure`` ran at the crash); asks
          still queued are answered with NotDelivered (an ActorDeadError: the actor
          took nothing of them) and tells still queued are counted as dropped;
          sockets close with a bounded linger, and the figures file is removed.

Races and bad input, each with its answer:
- A frame that does not decode or has the wrong shape, a registered message with the
  wrong number of fields or values its constructor refuses, is counted (``malformed``)
  and logged; one that names a type this process has not registered, likewise
  (``unknown_type``). An ask among them, when its request id is readable, gets an error
  answer naming the type and what was wrong; a tell is dropped (from a batch, it alone).
  Nothing a peer sends raises out of here.
- A message stamped with another incarnation (a pinned ref to a predecessor) is dropped
  and counted (``dropped_stale``); an ask is answered ``NotDelivered`` at once, so the
  asker knows nothing of it was applied (rather than waiting to find the incarnation
  gone, the request in doubt).
- A reply to a caller that has gone is refused by ROUTER_MANDATORY (EHOSTUNREACH) or
  finds its pipe full (EAGAIN): counted as ``unroutable`` and logged, never blocking (a
  caller gone is an everyday event, a client that ended or a process restarted with a
  request out: logged at INFO; a full pipe, a caller that does not read, at WARNING).
- A busy actor still answers heartbeats between passes because control is served first;
  a pass handles at most ``max_batch`` messages.
- SIGTERM and SIGHUP only set the stop flag (the wake pipe, registered with
  ``signal.set_wakeup_fd``, interrupts a poll), as a stop request does: the handler call
  in progress always runs to its end, so a signal can never leave a multi-step change
  half done (a store that was combining files would otherwise close "cleanly" over a
  half-applied combine). The loop stops after the current pass, ``on_stop`` runs and the
  exit is ``EXIT_TERMINATED``; the supervisor restarts the actor as after any exit. A
  handler that never returns is ended by its supervisor's SIGKILL after ``shutdown_s``: a
  dirty end, never a wrong one. SIGINT is ignored: Ctrl-C is the node's to act on. (Actors
  live in their forkserver's process group, so signals to the node's group do not reach
  them at all.)
- A message the actor does not handle (its code raises ``UnhandledMessage``: an unknown
  type, fields of the wrong shape, a request sent by tell that needs an answer) is answered
  with that error when it came as an ask, and logged and counted (``unhandled``) when it
  came as a tell; never a crash. Any other exception from a tell crashes the actor.
- An exception raised after ``defer_reply()`` whose handle was not used yet is sent through
  the handle (and logged), so the caller never waits out its timeout.
- A busy actor does not answer heartbeats while one handler call runs (the loop is in the
  actor's code): a supervisor tells "busy" from "hung" by the length of the silence, so
  handlers should hand long work to a thread or split it with ``call_later``.
- The node's process may die without a word: PR_SET_PDEATHSIG kills us when the
  forkserver dies, and the loop also checks ``getppid`` whenever the poll times out.
- A deferred reply answered from another thread is queued and the wake pipe written, so
  the sockets are only ever touched by this thread.
- The node reads the figures file while the actor changes: the file is marked dirty
  before the change is handled, so a read sees it dirty (and asks), or reads the answer
  of a moment before the change. Figures that change off the loop's thread (the
  listener's gateway) would be read stale: such an actor's class sets
  ``figures_from_loop`` false and has no file.
"""

from __future__ import annotations

import collections
import errno
import functools
import heapq
import itertools
import logging
import os
import resource
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psutil
import zmq

from . import wire
from ._node_client import NodeClient
from ._runtime import runtime
from .actor import ProcessActor
from .codec import Decoder, Encoder, UnknownMessage, find_unknown
from .errors import (
    ActorError,
    CodecError,
    FrameTooLarge,
    NotDelivered,
    UnhandledMessage,
)
from .exitcodes import (
    EXIT_CRASHED,
    EXIT_LINKED,
    EXIT_NORMAL,
    EXIT_PARENT_GONE,
    EXIT_START_FAILED,
    EXIT_STOPPED_ABNORMALLY,
    EXIT_TERMINATED,
)
from .figures import STAMP_S, FiguresSlot
from .messages import Down, Exit, Pong
from .peers import PeerWatch, watch_connections
from .process import drain_wake_pipe
from .ref import ActorRef, Future

logger = logging.getLogger("warren.actors")

# Longest poll when nothing is due (milliseconds): how often an idle actor checks its parent.
# Its figures file then says when it will have turned by (see "running"), so a stopped
# actor is asked within this and ``LIVE_S``.
_IDLE_POLL_MS = 5000
# How long the loop waits after its last turn that handled messages before it checks its
# published figures (seconds): a busy actor is asked by the node instead.
_QUIET_S = 0.5


@dataclass(frozen=True)
class SpawnOrder:
    """Everything a forked child needs to become an actor (pickled once, by the node)."""

    actor_class: type[ProcessActor]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    name: str
    incarnation: int
    address: str
    control: str
    node: str
    token: int
    options: dict[str, Any] = field(default_factory=dict)


class _Deferred:
    """One ask's answer, given later (``ProcessActor.defer_reply``)."""

    def __init__(self, loop: ActorLoop, identity: bytes, request_id: int) -> None:
        self._loop = loop
        self._identity = identity
        self._request_id = request_id
        self._used = False

    @property
    def used(self) -> bool:
        return self._used

    def send(self, value: Any) -> None:
        self._finish(wire.REPLY_OK, value)

    def fail(self, exception: BaseException) -> None:
        self._finish(wire.REPLY_ERROR, _describe(exception))

    def _finish(self, kind: int, value: Any) -> None:
        if self._used:
            raise ActorError("this ask was answered already")
        self._used = True
        self._loop.call_soon_threadsafe(
            lambda: self._loop.reply(self._identity, kind, self._request_id, value)
        )


def _describe(exception: BaseException) -> list[str]:
    remote_tb = "".join(traceback.format_exception(exception))
    return [type(exception).__name__, str(exception), remote_tb]


class _Crash(Exception):
    """Raised inside the loop to leave it after an unhandled exception in the actor."""


@dataclass
class Mailboxes:
    """An actor's two ROUTER sockets and a monitor of the data one, made by a spare ahead
    of its order (``make``), bound by the loop at its setup with the order's options."""

    data: zmq.Socket
    control: zmq.Socket
    events: zmq.Socket

    @classmethod
    def make(cls) -> Mailboxes:
        context = runtime().context
        made: list[zmq.Socket] = []
        try:
            made.append(context.socket(zmq.ROUTER))
            made.append(context.socket(zmq.ROUTER))
            made.append(watch_connections(made[0]))
        except BaseException:  # out of descriptors: close what was made
            for socket in made:
                socket.close(linger=0)
            raise
        return cls(*made)

    def unwatch(self) -> None:
        """Drop the monitor: the actor hears of no peer's end (``on_peer_gone``)."""
        self.data.disable_monitor()
        self.events.close(linger=0)


class ActorLoop:
    """The running phase's state; implements ``ActorServices`` for the actor."""

    def __init__(self, order: SpawnOrder, made: Mailboxes | None = None) -> None:
        self._order = order
        self._made = made  # by a spare, ahead of the order
        self._runtime = runtime()
        if "curve" in order.options:  # this actor's node keeps tcp to its own
            self._runtime.curve = tuple(order.options["curve"])
        # A node request that waits when the actor is told to stop is given up (the node
        # may be dead: its forkserver asks every actor to stop then).
        self._node = NodeClient(order.node, abandon=lambda: self._stopping)
        self._encoder = Encoder()
        self._decoder = Decoder()
        self._thread_id = threading.get_ident()
        self._parent_pid = os.getppid()
        cls = order.actor_class
        self._max_batch = int(order.options.get("max_batch", cls.max_batch))
        self._max_pass_s = cls.max_pass_s
        self._max_bytes = int(order.options.get("max_message_bytes", cls.max_message_bytes))
        self._mailbox_size = int(order.options.get("mailbox_size", cls.mailbox_size))
        self._trap_exits = bool(cls.trap_exits)
        self._stopping = False
        self._exit_code = EXIT_NORMAL
        self._injected: list[Any] = []
        self._received_since_empty = 0  # messages taken since the mailbox was last empty
        self._posted: collections.deque[Callable[[], None]] = collections.deque()
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._timer_ids = itertools.count()
        self._poller = zmq.Poller()
        # sockets of the actor's own (an answer it awaits) and what to run once each has
        # something to read (``when_readable``)
        self._readable: dict[zmq.Socket, Callable[[], None]] = {}
        self._current_ask: tuple[bytes, int] | None = None
        self._deferred: _Deferred | None = None
        self._delivered_since_idle = False
        self._peers: PeerWatch | None = None
        self.counters = {
            "received": 0,
            "batches": 0,
            "asks": 0,
            "dropped_stale": 0,
            "malformed": 0,
            "unknown_type": 0,
            "unhandled": 0,
            "oversized": 0,
            "unroutable": 0,
            "dropped_at_stop": 0,
            "backlogged_passes": 0,
        }
        self._process: psutil.Process | None = None  # this process, read for FIGURES
        # The published figures (warren.actors.figures): the file, the question of the
        # last FIGURES request (the loop answers it itself from then on), whether anything
        # was handled since the figures were last checked, the start of the last turn that
        # handled messages, when to check them next, the turn last stamped (by when).
        self._slot: FiguresSlot | None = None
        self._question: Any = _NO_QUESTION
        self._touched = True
        self._busy_at = 0.0
        self._check_at: float | None = None
        self._stamped = 0.0
        # Both set by _setup, before anything else reads them.
        self.actor: ProcessActor
        self.ref: ActorRef

    # -- setup ---------------------------------------------------------------------------

    def run(self) -> int:
        """Run the three phases; return the process's exit code."""
        wake_read, wake_write = os.pipe()
        os.set_blocking(wake_read, False)
        os.set_blocking(wake_write, False)
        self._wake_read, self._wake_write = wake_read, wake_write
        signal.set_wakeup_fd(wake_write, warn_on_full_buffer=False)
        signal.signal(signal.SIGTERM, self._on_stop_signal)
        signal.signal(signal.SIGHUP, self._on_stop_signal)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            if not self._setup():
                return EXIT_START_FAILED
            try:
                self._serve()
            except _Crash:
                pass
            return self._teardown()
        finally:
            if self._slot is not None:
                self._slot.close()
            self._runtime.context.destroy(linger=wire.LINGER_MS)

    def _bind(self, endpoint: str, made: zmq.Socket | None) -> zmq.Socket:
        socket = made if made is not None else self._runtime.context.socket(zmq.ROUTER)
        socket.linger = wire.LINGER_MS
        socket.router_mandatory = 1
        socket.router_handover = 1
        socket.rcvhwm = self._mailbox_size
        socket.maxmsgsize = max(self._max_bytes, wire.MAX_MESSAGE_BYTES)
        if self._runtime.curve is not None and endpoint.startswith("tcp://"):
            socket.curve_server = True
            socket.curve_publickey, socket.curve_secretkey = self._runtime.curve
        socket.bind(endpoint)
        return socket

    def _setup(self) -> bool:
        order = self._order
        started = False
        made = self._made
        # Watched from before the bind, made ahead or not: a peer that connects while the
        # actor is made (one reconnecting to a restarted actor) is heard of too.
        watched = order.address.startswith("ipc://") and (
            order.actor_class.on_peer_gone is not ProcessActor.on_peer_gone
        )
        try:
            if made is None:
                made = Mailboxes.make() if watched else None
            elif not watched:
                made.unwatch()
            self._data = self._bind(order.address, made.data if made else None)
            self._control = self._bind(order.control, made.control if made else None)
            self.ref = ActorRef(
                order.name,
                self._endpoint(self._data),
                self._endpoint(self._control),
                order.incarnation,
                os.getpid(),
                order.node,
            )
            self.actor = order.actor_class(*order.args, **order.kwargs)
            self.actor.ref = self.ref
            self.actor._services = self
            if order.actor_class.figures_from_loop:
                self._slot = self._make_slot()
            if watched and made is not None:
                self._peers = PeerWatch(self._data, made.events)
            started = True
            self.actor.on_start()
        except Exception as exc:
            if started:
                self._call_on_failure()
            self._node.failed(order.token, *_describe(exc))
            return False
        self._node.ready(order.token, self.ref.address, self.ref.control, self.ref.pid)
        return True

    def _make_slot(self) -> FiguresSlot | None:
        """This incarnation's figures file; None (the node asks every time) when it
        cannot be made."""
        try:
            return FiguresSlot.create(self._order.control, self._order.incarnation, os.getpid())
        except OSError as exc:
            logger.debug("%s: no figures file: %s", self._order.name, exc)
            return None

    @staticmethod
    def _endpoint(socket: zmq.Socket) -> str:
        endpoint = socket.last_endpoint
        return endpoint.decode() if isinstance(endpoint, bytes) else str(endpoint)

    # -- running -------------------------------------------------------------------------

    def _serve(self) -> None:
        poller = self._poller
        poller.register(self._control, zmq.POLLIN)
        poller.register(self._data, zmq.POLLIN)
        poller.register(self._wake_read, zmq.POLLIN)
        peers = self._peers
        if peers is not None:
            poller.register(peers.events, zmq.POLLIN)
        control, data = self._control, self._data
        slot = self._slot
        now = 0.0
        while not self._stopping:
            timeout_ms = self._poll_timeout_ms()
            if slot is not None:
                turned_by = time.monotonic() + timeout_ms / 1000  # at the latest
                if turned_by > self._stamped + STAMP_S:
                    slot.stamp(turned_by)
                    self._stamped = turned_by
            events = dict(poller.poll(timeout_ms))
            if self._stopping:
                break
            if not events and os.getppid() != self._parent_pid:
                self._stopping = True
                self._exit_code = EXIT_PARENT_GONE
                break
            if slot is not None:
                now = time.monotonic()
            busy = False
            if control in events:
                self._serve_control()
                if self._stopping:
                    break
            if self._wake_read in events or self._posted:
                busy = True
                if not self._touched:
                    self._touch()
                self._run_posted()
            if peers is not None and peers.events in events:
                peers.read_events()
            if self._readable:
                busy |= self._run_readable(events)
            if data in events or self._injected or (peers is not None and peers.has_gone):
                busy = True
                if not self._touched:
                    self._touch()
                self._drain_data()
            elif self._delivered_since_idle:
                self._delivered_since_idle = False
                self._touch()
                self._guard(self.actor.on_idle)
            if self._timers:
                self._run_timers()
            if slot is not None and self._touched and self._question is not _NO_QUESTION:
                if not busy:
                    self._settle(now)
                else:
                    self._busy_at = now
                    if self._check_at is None:
                        self._check_at = now + _QUIET_S

    def _run_readable(self, events: dict[Any, int]) -> bool:
        """Run the callbacks of the watched sockets that have something to read; whether
        one ran."""
        ready = [socket for socket in self._readable if socket in events]
        for socket in ready:
            callback = self._readable.pop(socket)
            self._poller.unregister(socket)
            self._touch()
            self._guard(callback)
        return bool(ready)

    def _touch(self) -> None:
        """The actor is about to handle something that may change its figures: the
        published ones are no longer to be read (``figures``, "Protocol")."""
        if not self._touched:
            self._touched = True
            if self._slot is not None:
                self._slot.mark_dirty()

    def _settle(self, now: float) -> None:
        """After a turn that handled no message: check the published figures once the
        actor has handled none for ``_QUIET_S`` (a turn of timers alone is quiet), so that
        a busy actor spends nothing on them (the node asks it instead) and an idle one is
        read without being asked."""
        if now - self._busy_at < _QUIET_S:
            self._check_at = self._busy_at + _QUIET_S
            return
        self._check_at = None
        self._touched = False
        question = self._question
        answer = None if question is None else self._answer_figures(question)
        if question is not None and answer is None:
            return  # no figures of its kind (a deleted queue): it stays dirty, and is asked
        assert self._slot is not None, "only a loop with a figures file settles"
        self._slot.publish(dict(self.counters), answer, self._process_usage)

    def _poll_timeout_ms(self) -> int:
        if self._injected or self._posted:
            return 0
        due = self._timers[0][0] if self._timers else None
        if self._check_at is not None and (due is None or self._check_at < due):
            due = self._check_at
        if due is None:
            return _IDLE_POLL_MS
        wait_s = due - time.monotonic()
        return max(0, min(_IDLE_POLL_MS, int(wait_s * 1000) + 1))

    def _receive(self, socket: zmq.Socket) -> list[Any]:
        """One message as [routing id, header, *bodies]; raises zmq.Again when none waits.

        Two plain receives and the header frame's ``more`` flag, rather than
        ``recv_multipart``, whose per-call option queries cost more than the rest of a
        small message's handling. The header and bodies stay ``zmq.Frame``s: the codec
        reads them through the buffer protocol, without a copy. (``_drain_data`` inlines
        this for its hot path.)
        """
        identity = socket.recv(zmq.NOBLOCK)
        header = socket.recv(zmq.NOBLOCK, copy=False)
        frames: list[Any] = [identity, header]
        if header.more:
            frames += self._rest(socket)
        return frames

    @staticmethod
    def _rest(socket: zmq.Socket) -> list[Any]:
        bodies = []
        more = True
        while more:
            body = socket.recv(zmq.NOBLOCK, copy=False)
            bodies.append(body)
            more = body.more
        return bodies

    def _drain_data(self) -> None:
        recv = self._data.recv
        decode = self._decoder.decode
        incarnation = self._order.incarnation
        max_bytes = self._max_bytes
        noblock = zmq.NOBLOCK
        tell, batch, ask = wire.TELL, wire.BATCH, wire.ASK
        tells: list[Any] = self._injected
        self._injected = []
        empty = False
        received = 0
        budget = wire.MAX_BATCH_BYTES
        deadline = None if self._max_pass_s is None else time.monotonic() + self._max_pass_s
        for _ in range(self._max_batch):
            if budget < 0:
                break
            if deadline is not None and received and time.monotonic() >= deadline:
                break
            try:
                identity = recv(noblock)
            except zmq.Again:
                empty = True
                break
            received += 1
            header = recv(noblock, copy=False)
            frames = [header]
            budget -= len(header)
            if header.more:
                frames += self._rest(self._data)
            if len(frames) > 1 or len(header) > max_bytes:
                size = sum(len(f) for f in frames)
                budget -= size - len(header)
                if size > max_bytes:
                    self._refuse_oversized(identity, frames)
                    continue
            try:
                kind, stamp, request_id, body = decode(frames)
            except (CodecError, ValueError, TypeError, IndexError):
                self._count_malformed("data")
                continue
            if stamp and stamp != incarnation:
                self.counters["dropped_stale"] += 1
                if kind == ask and type(request_id) is int:
                    self._refuse_stale(identity, request_id, stamp)
                continue
            if self._decoder.saw_unknown:
                body = self._drop_unknown(identity, kind, request_id, body)
                if body is None:
                    continue
            if kind == tell:
                tells.append(body)
            elif kind == batch and type(body) is list:
                tells.extend(body)
            elif kind == ask and type(request_id) is int:
                if tells:
                    self._deliver(tells)
                    tells = []
                self._answer(identity, request_id, body)
                if self._stopping:
                    break
            else:
                self._count_malformed("data")
        self.counters["received"] += received
        if tells:
            self._deliver(tells)
        # The pass ended at a bound (the byte budget, max_batch or the clock) or stopped;
        # at a bound with nothing behind it, the mailbox is as empty as if it had been
        # found so (else on_idle would wait for the next message or the idle poll's end).
        timed_out = not empty and deadline is not None and time.monotonic() >= deadline
        if not empty and not self._stopping and self.mailbox_empty():
            empty = True
        self._received_since_empty = 0 if empty else self._received_since_empty + received
        if (
            not empty
            and not self._stopping
            and (not timed_out or self._received_since_empty >= self._max_batch)
        ):
            self.counters["backlogged_passes"] += 1
            self._received_since_empty = 0
        if (empty or timed_out) and self._delivered_since_idle and not self._stopping:
            self._delivered_since_idle = False
            self._guard(self.actor.on_idle)
        if empty and self._peers is not None and self._peers.has_gone and not self._stopping:
            # only now: everything a gone peer sent before its end has been handled
            for pid in self._peers.take_gone():
                self._guard(functools.partial(self.actor.on_peer_gone, pid))

    def _refuse_oversized(self, identity: bytes, frames: list[Any]) -> None:
        self.counters["oversized"] += 1
        logger.warning(
            "%s: refused a message of %d bytes (limit %d)",
            self._order.name,
            sum(len(f) for f in frames),
            self._max_bytes,
        )
        try:
            kind, _stamp, request_id, _body = self._decoder.decode(frames)
        except (CodecError, ValueError, TypeError, IndexError):
            return
        if kind == wire.ASK and type(request_id) is int:
            self.reply(
                identity,
                wire.REPLY_ERROR,
                request_id,
                _describe(FrameTooLarge(f"message exceeds {self._max_bytes} bytes")),
            )

    def _drop_unknown(self, identity: bytes, kind: Any, request_id: Any, body: Any) -> Any:
        """Strip messages this process cannot build (an unregistered type, or fields that
        do not fit); answer an ask with the reason."""
        if kind == wire.BATCH and type(body) is list:
            kept = []
            for message in body:
                unknown = find_unknown(message)
                if unknown is None:
                    kept.append(message)
                else:
                    self._count_unknown(unknown)
            return kept
        unknown = find_unknown(body) or UnknownMessage("?")
        self._count_unknown(unknown)
        if kind == wire.ASK and type(request_id) is int:
            self.reply(
                identity,
                wire.REPLY_ERROR,
                request_id,
                _describe(
                    UnhandledMessage(unknown.reason)
                    if unknown.answer == "UnhandledMessage"
                    else CodecError(unknown.reason)
                ),
            )
        return None

    def _count_unknown(self, unknown: UnknownMessage) -> None:
        self.counters["malformed" if unknown.malformed else "unknown_type"] += 1
        logger.warning(
            "%s: dropped a %s it cannot build: %s",
            self._order.name,
            unknown.type_name,
            unknown.reason,
        )

    def _count_malformed(self, where: str) -> None:
        self.counters["malformed"] += 1
        logger.warning("%s: dropped a malformed %s frame", self._order.name, where)

    def _deliver(self, tells: list[Any]) -> None:
        self.counters["batches"] += 1
        self._delivered_since_idle = True
        try:
            self.actor.on_receive_batch(tells)
        except UnhandledMessage as exc:
            self.unhandled(tells, exc)
        except Exception:
            self._crash()

    def _refuse_stale(self, identity: bytes, request_id: int, stamp: int) -> None:
        """Answer an ask a pinned ref sent to an incarnation before this one:
        ``NotDelivered`` (nothing of it was taken; the asker may send it here again)."""
        gone = NotDelivered(
            f"{self._order.name}: incarnation {stamp} is gone and never had this request; "
            f"incarnation {self._order.incarnation} took nothing of it"
        )
        self.reply(identity, wire.REPLY_ERROR, request_id, _describe(gone))

    def _answer(self, identity: bytes, request_id: int, message: Any) -> None:
        self.counters["asks"] += 1
        self._delivered_since_idle = True
        self._current_ask = (identity, request_id)
        self._deferred = None
        try:
            result = self.actor.on_receive(message)
        except Exception as exc:
            deferred = self._deferred
            if deferred is None:
                self.reply(identity, wire.REPLY_ERROR, request_id, _describe(exc))
            else:
                logger.error(
                    "%s: %s raised after deferring its answer",
                    self._order.name,
                    type(message).__name__,
                    exc_info=True,
                )
                if not deferred.used:
                    deferred.fail(exc)
        else:
            if self._deferred is None:
                self.reply(identity, wire.REPLY_OK, request_id, result)
        finally:
            self._current_ask = None

    def reply(
        self,
        identity: bytes,
        kind: int,
        request_id: int,
        value: Any,
        socket: zmq.Socket | None = None,
    ) -> None:
        """Send an answer; an answer nobody can receive is counted, never waited for."""
        try:
            frames = self._encoder.encode([kind, request_id, value])
        except CodecError as exc:
            frames = self._encoder.encode([wire.REPLY_ERROR, request_id, _describe(exc)])
        try:
            (socket or self._data).send_multipart(
                [identity, *frames], zmq.NOBLOCK, copy=len(frames) == 1
            )
        except zmq.ZMQError as exc:
            if exc.errno not in (errno.EHOSTUNREACH, errno.EAGAIN):
                raise
            self._touch()
            self.counters["unroutable"] += 1
            logger.log(
                wire.unroutable_log_level(exc.errno),
                "%s: an answer could not be routed (%s)",
                self._order.name,
                exc.strerror,
            )

    def _serve_control(self) -> None:
        incarnation = self._order.incarnation
        while True:
            try:
                frames = self._receive(self._control)
            except zmq.Again:
                return
            try:
                kind, stamp, request_id, body = self._decoder.decode(frames[1:])
            except (CodecError, ValueError, TypeError, IndexError):
                self._touch()
                self._count_malformed("control")
                continue
            if stamp and stamp != incarnation:
                self._touch()
                self.counters["dropped_stale"] += 1
                continue
            if type(kind) is not int or kind not in _READS:
                self._touch()
            answer = self._control_answer(kind, body)
            if answer is not _NO_ANSWER and type(request_id) is int and request_id:
                self.reply(frames[0], wire.REPLY_OK, request_id, answer, self._control)

    def _control_answer(self, kind: Any, body: Any) -> Any:
        if kind == wire.PING:
            return Pong(self._order.incarnation, os.getpid(), self.counters["received"])
        if kind == wire.STATS:
            return dict(self.counters)
        if kind == wire.FIGURES and type(body) is list and len(body) == 2:
            question, process = body
            counters = dict(self.counters)
            answer = None if question is None else self._answer_figures(question)
            usage = self._process_usage() if process is True else None
            if self._slot is not None and (question is None or answer is not None):
                # Published as well (the usage only when asked for: reading it costs more
                # than the rest): the node reads it from now on until the actor handles
                # something, and the loop answers this question itself.
                self._question = question
                self._touched = False
                self._check_at = None
                self._slot.publish(counters, answer, lambda: usage, always=usage is not None)
            return [counters, answer, usage]
        if kind == wire.STOP:
            self._stopping = True
            return None
        if kind == wire.DOWN and isinstance(body, Down):
            self._runtime.mark_dead(body.ref.address, body.ref.incarnation)
            self._injected.append(body)
            return _NO_ANSWER
        if (
            kind == wire.ALARM
            and type(body) is list
            and len(body) == 2
            and type(body[0]) is str
            and type(body[1]) is bool
        ):
            resource, raised = body
            self._posted.append(lambda: self.actor.on_alarm(resource, raised))
            return _NO_ANSWER
        if kind == wire.EXIT and isinstance(body, Exit):
            if self._trap_exits:
                self._injected.append(body)
            else:
                self._stopping = True
                self._exit_code = EXIT_LINKED
            return _NO_ANSWER
        self._count_malformed("control")
        return _NO_ANSWER

    def _answer_figures(self, question: Any) -> Any:
        """The actor's answer to a FIGURES question; None when it raised (a deleted queue's
        refusal): a scrape goes without this actor's figures, and the actor carries on."""
        try:
            return self.actor.on_receive(question)
        except Exception as exc:
            logger.debug(
                "%s: no figures for %s: %s", self._order.name, type(question).__name__, exc
            )
            return None

    def _process_usage(self) -> dict[str, float]:
        """CPU seconds (user and system) and RSS of this process, read by the process
        itself: a node of a thousand actors does not read a thousand /proc files a scrape."""
        if self._process is None:
            self._process = psutil.Process()
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return {
            "cpu_seconds": usage.ru_utime + usage.ru_stime,
            "rss_bytes": self._process.memory_info().rss,
        }

    def _run_posted(self) -> None:
        drain_wake_pipe(self._wake_read)
        while self._posted:
            self._guard(self._posted.popleft())

    def _run_timers(self) -> None:
        now = time.monotonic()
        # A stop (a signal) during one timer ends the pass: the next due timer may be one
        # that waits on the node, which may be what is gone.
        while self._timers and self._timers[0][0] <= now and not self._stopping:
            self._touch()
            _due, _id, callback = heapq.heappop(self._timers)
            self._guard(callback)

    def _guard(self, callback: Callable[[], None]) -> None:
        try:
            callback()
        except Exception:
            self._crash()

    def _crash(self) -> None:
        logger.error("%s: crashed", self._order.name, exc_info=True)
        self._call_on_failure()
        self._exit_code = EXIT_CRASHED
        raise _Crash

    def _call_on_failure(self) -> None:
        try:
            self.actor.on_failure(*sys.exc_info())
        except Exception:
            logger.exception("%s: on_failure raised", self._order.name)

    def _on_stop_signal(self, _signum: int, _frame: object) -> None:
        # Never raise here: the actor's code may be in the middle of a multi-step change.
        self._stopping = True
        if self._exit_code == EXIT_NORMAL:
            self._exit_code = EXIT_TERMINATED

    # -- teardown ------------------------------------------------------------------------

    def _teardown(self) -> int:
        if self._exit_code != EXIT_CRASHED:
            try:
                self.actor.on_stop()
            except Exception:
                logger.exception("%s: on_stop raised", self._order.name)
                self._exit_code = EXIT_CRASHED
        gone = NotDelivered(f"{self._order.name} stopped before it took this request")
        while True:
            try:
                frames = self._receive(self._data)
            except zmq.Again:
                break
            try:
                kind, _stamp, request_id, _body = self._decoder.decode(frames[1:])
            except (CodecError, ValueError, TypeError, IndexError):
                continue
            if kind == wire.ASK and type(request_id) is int:
                self.reply(frames[0], wire.REPLY_ERROR, request_id, _describe(gone))
            else:
                self.counters["dropped_at_stop"] += 1
        if self._peers is not None:
            self._peers.close()
        if self.counters["dropped_at_stop"]:
            logger.warning(
                "%s: %d messages were still queued at stop",
                self._order.name,
                self.counters["dropped_at_stop"],
            )
        return self._exit_code

    # -- ActorServices -------------------------------------------------------------------

    def call_soon_threadsafe(self, callback: Callable[[], None]) -> None:
        if threading.get_ident() == self._thread_id:
            callback()
            return
        self._posted.append(callback)
        try:
            os.write(self._wake_write, b"\0")
        except BlockingIOError:
            pass  # the pipe is full, so a wake-up is already pending

    def defer_reply(self) -> _Deferred:
        if self._current_ask is None:
            raise UnhandledMessage("this message needs an answer: send it with ask, not tell")
        self._deferred = _Deferred(self, *self._current_ask)
        return self._deferred

    def unhandled(self, message: Any, error: UnhandledMessage) -> None:
        self.counters["unhandled"] += 1
        logger.warning(
            "%s: ignored a %s it does not handle: %s",
            self._order.name,
            type(message).__name__,
            error,
        )

    def when_readable(self, socket: zmq.Socket, callback: Callable[[], None]) -> None:
        if socket not in self._readable:
            self._poller.register(socket, zmq.POLLIN)
        self._readable[socket] = callback

    def call_later(self, delay_s: float, callback: Callable[[], None]) -> None:
        heapq.heappush(self._timers, (time.monotonic() + delay_s, next(self._timer_ids), callback))

    def stop(self, abnormal: bool = False) -> None:
        self._stopping = True
        if abnormal and self._exit_code == EXIT_NORMAL:
            self._exit_code = EXIT_STOPPED_ABNORMALLY

    def monitor(self, target: ActorRef) -> None:
        self._node.monitor(self.ref, target)

    def demonitor(self, target: ActorRef) -> None:
        self._node.demonitor(self.ref, target)

    def link(self, other: ActorRef) -> None:
        self._node.link(self.ref, other)

    def whereis(self, name: str) -> ActorRef | None:
        return self._node.whereis(name)

    def monitor_named(self, names: list[str]) -> list[ActorRef | None]:
        return self._node.monitor_named(self.ref, names)

    def monitor_named_async(self, names: list[str]) -> Future:
        return Future(*self._node.send_monitor_named(self.ref, names), None)

    def register(self, name: str) -> None:
        self._node.register(name, self.ref)

    def peer_connected(self, pid: int) -> bool | None:
        return None if self._peers is None else self._peers.connected(pid)

    def mailbox_empty(self) -> bool:
        events = self._data.get(zmq.EVENTS)
        assert isinstance(events, int), "ZMQ_EVENTS is an int option"
        return not events & zmq.POLLIN


_NO_ANSWER = object()
_NO_QUESTION = object()  # no FIGURES request yet: the loop publishes nothing by itself
_READS = frozenset((wire.PING, wire.STATS, wire.FIGURES))  # control that changes nothing

"""Supervisors: OTP's restart semantics over actor processes.

A ``Supervisor`` owns the children of one ``SupervisorSpec`` (see ``warren.supervisor.specs`` for
every option, its allowed values and default). It lives in the node's process: one thread
of its own (the event thread), started at its first event, and a share of the process's
one heartbeat thread, no process of its own. A supervisor with nothing to act on holds
no thread: a node's supervisor of each queue has none until its queue exits or it is
asked something (starting a thread took a declare 0.2 ms at the median and 1.1 on
average, waiting for the new thread to take the interpreter's lock, and a node of a
thousand queues held a thousand threads). Its children are actor processes spawned through the
node's ``warren.actors.Node`` (the forkserver's children), and nested supervisors, which are
``Supervisor`` objects of their own. Why no process per supervisor: every actor process is
already a child of the node's forkserver and dies with the node, so a supervisor process
would add a hop and a failure point without isolating anything.

Lifecycle:

- ``start()`` starts the children in order, each ready (``on_start`` done, recovery done)
  before the next starts (or ``start_together`` at a time, for independent
  ``one_for_one`` children, on threads of a pool that ends with the start); a child that
  fails to start stops the ones already started, in reverse, and ``start()`` raises
  ``SupervisorError``.
- ``stop()`` stops the children in reverse order: a stop request, SIGTERM after the
  child's ``shutdown_s``, SIGKILL after ``shutdown_s`` more (``"brutal_kill"``: SIGKILL at
  once). Nested supervisors stop their own children first. A child stopped by a signal
  (SIGSTOP, a debugger) is killed at once instead: it could not act on the request, and
  would hold a restart of its siblings up for its whole ``shutdown_s``. That is checked
  all along the stop, not only as it begins: the kernel shows a SIGSTOP only once the
  process has run to take it (one waiting for a core or in an fsync shows running for a
  while), and one may come during the stop. (A child that answers no ping is not
  killed for that alone: in its ``on_stop`` it answers none either.)

Watching (the event thread): every child incarnation is monitored; its ``Down`` (exit code
or signal, SIGKILL included) arrives within the node's reaping latency. The heartbeat
thread keeps one ping out to each ready child on its control channel, every
``heartbeat_interval_s``, without waiting on any (a hung child delays nobody's heartbeat;
the control channel is served between the actor's batches); a ping unanswered after an
interval is dropped for the next one. A child none of whose pings sent in the last
``heartbeat_timeout_s`` was answered within its interval is hung (SIGSTOPped, deadlocked,
one handler call running too long): the heartbeat thread tells the event thread, which
kills it with SIGKILL, and that then counts as its crash. Heartbeats begin only once a
child is ready: a long start is bounded by ``start_timeout_s`` alone. Time the
supervisor's own process was held (the heartbeat thread woke more than ``HELD_S`` after
it meant to: a SIGSTOP of the whole node, a paused container, a machine too starved to
run it) counts against no child running before it: each one's silence is shortened by
it (never past now), so that a node resumed after a pause longer than the heartbeat
timeout does not kill every actor it has; a child hung all along is found one timeout
later than it would have been. (A suspended machine needs none of this: the monotonic
clock heartbeats are timed by stands still meanwhile.) A hold that lands while the
thread beats, rather than while it waits, is not seen.

Nothing polls: an idle supervisor costs nothing between the moments something is due, so at
rest the supervisors of a node with many queues (one each) cost it their pings and nothing
more. The event thread, once started, blocks on its queue of events (``stop()`` puts a
wake-up there)
until the next of its own timers is due (the delayed restarts below). The heartbeat thread
(``_Heartbeats``) is one per process, shared by every running supervisor: it owns the
schedule of when each is next due (a child's next ping, or the moment one would turn hung),
sleeps until the earliest, and then beats the supervisors due, with those due within
``COALESCE_S`` (their pings go that much early, so that the pings of many supervisors go
out together: a few wake-ups a second, not one per queue). It never blocks on a child (a
ping is sent without waiting for room). It reads a ping's answer when it next needs it, not
when it arrives: a pong is credited at the time its ping was sent, so reading it late
neither hides a hang nor makes one. A supervisor is watched from ``start()`` until its stop
or failure; its event thread tells the heartbeat thread after every event it handles (a
child may have started or gone). The thread starts with the first supervisor watched and
ends when none is left.

On a child's exit: ``temporary`` children are never restarted; ``transient`` ones only
after an abnormal exit (not exit 0); ``permanent`` ones always. A restart is counted;
more than ``intensity`` restarts within ``period_s`` and the supervisor stops all its
children (reverse order), marks itself failed and tells its parent, which treats it as
the failure of that child. The strategy decides what restarts:

- one_for_one / simple_one_for_one: that child alone (same address, next incarnation:
  old refs reach it);
- one_for_all: every other child is stopped (reverse order), then all start in order;
- rest_for_one: the children started after it are stopped (reverse order), then it and
  they start again in order.

Once a supervisor begins to stop, neither it nor any supervisor below it restarts a
child again, whatever the exit: a node-wide stop must not turn into restarts (nor, past
the intensity, into a failed node). A child that exited on a signal of its own (exit code
``EXIT_TERMINATED``: an operator's kill, or systemd stopping every process of the node
at once) is restarted only ``TERMINATED_RESTART_DELAY_S`` later, so that when the whole
node is being stopped, the node's own stop begins before any such restart.

A restart that fails to start counts as a restart too and is retried after
``RETRY_DELAY_S``, until the intensity gives out.

What a supervisor is busy with: its event thread acts on one event at a time, so while
it starts a child (a recovery: up to that child's ``start_timeout_s``) or stops one (up
to twice its ``shutdown_s``, then ``EXIT_AFTER_KILL_S`` for a killed child's exit), a
hung sibling is killed only once that is done.
``status()`` shows it (``busy``: the child, ``starting`` or ``stopping``, for how long,
and ``bound_s``, how long that may take; None when idle), so that a watcher (the chaos
harness) can tell a late kill held up by a sibling's recovery from a supervisor that
never acts. A nested supervisor's start is bounded by its children's starts one after
another, its stop by their stops.

Restart counts: every supervisor of a tree shares the root's ``RestartCounts``, which
counts, per actor name, every start after the first, when the start is made (a
restart, a start retried, a start of a supervisor restarted above it). A node's metrics
read them there: sampling the running actors' incarnations missed every restart of a
queue that crash-looped and gave up between two scrapes, and forgot the count of a child
no longer running. A name started again after it was removed (a queue deleted and
declared again) counts one more. As in OTP, a supervisor that is itself
restarted starts from its spec: children added with ``start_child`` are not brought back
(whoever added them adds them again, as a queue's declaration is replayed).

Races and their answers: a ``Down`` can arrive for an incarnation the supervisor has
already replaced or is stopping on purpose — events name the incarnation and are applied
only to the child's current, running incarnation; so is the heartbeat thread's word that
a child is hung, and the event thread kills it only if no pong has been credited since.
A pong from an incarnation already replaced is not credited to its successor. Monitor
callbacks run on the node's service thread and the heartbeat thread only enqueue; all
decisions are taken on the event thread, one at a time, so two deaths never interleave
their restarts. A wake-up of the heartbeat thread that comes while it is beating is not
lost: it clears its flag before reading what changed, and a supervisor notes its change
before setting the flag. A supervisor forgotten while the heartbeat thread beats it may
get one more ping out, or one more report of a hung child, which its event thread, gone,
never acts on. The per-supervisor heartbeat state (pings out, hung reports) is touched
by the heartbeat thread alone; a child's ``last_ping``/``last_pong`` are written by it
once the child runs, and by the event thread only while the child starts.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import logging
import math
import os
import queue
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import psutil

from warren.actors import (
    EXIT_TERMINATED,
    ActorError,
    ActorRef,
    AskTimeout,
    Down,
    Future,
    Monitor,
)
from warren.actors import Node as ActorNode
from warren.actors.node import EXIT_AFTER_KILL_S

from .errors import SupervisorError
from .specs import ChildSpec, SupervisorSpec

log = logging.getLogger("warren.supervisor")

RETRY_DELAY_S = 0.5  # before retrying a restart whose start failed
# A child that stopped on a SIGTERM of its own is restarted only this long after (seconds):
# when a whole node is stopped by a signal to every process (systemd's control-group
# kill), the children see it before the node does, and must not be restarted meanwhile.
TERMINATED_RESTART_DELAY_S = 1.0
# A ping due within this long (seconds; at most a quarter of the child's interval) is sent
# with the ones due now: the heartbeats of a node's many supervisors go out together.
COALESCE_S = 0.05
# The heartbeat thread woke this much later than it meant to: its process was held.
HELD_S = 1.0
# A supervisor whose beat raised (a bug, or a runtime closed under it) is beaten again
# this long after (seconds), rather than taking every other supervisor's heartbeat down.
BEAT_RETRY_S = 1.0


class RestartCounts:
    """How many times each actor of a tree was started again (see the module docstring);
    thread-safe: the supervisors' event threads count, a node's metrics read."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._starts: dict[str, int] = {}  # actor name -> starts, the first included

    def starting(self, name: str) -> None:
        """The actor ``name`` is being started (again, unless this is its first)."""
        with self._lock:
            self._starts[name] = self._starts.get(name, 0) + 1

    def of(self, name: str) -> int:
        """The restarts of the actor ``name``: its starts after the first."""
        with self._lock:
            return max(0, self._starts.get(name, 0) - 1)

    def total(self) -> int:
        """The restarts of every actor the tree ever started."""
        with self._lock:
            return sum(starts - 1 for starts in self._starts.values())


@dataclass(eq=False)  # children are compared by identity
class _Child:
    spec: ChildSpec | SupervisorSpec
    name: str
    args: tuple = ()  # extra start arguments (simple_one_for_one)
    ref: ActorRef | None = None
    supervisor: Supervisor | None = None
    monitor: Monitor | None = None
    state: str = "stopped"  # starting, running, stopping, stopped, failed
    restarts: int = 0
    ready_at: float = 0.0
    last_pong: float = 0.0
    last_ping: float = 0.0
    generation: int = 0  # bumped at every (re)start: names events
    spec_of: Callable[[], ChildSpec | SupervisorSpec] | None = None  # its spec at a restart


@dataclass
class _Event:
    kind: str = field(compare=False)
    child: _Child | None = field(default=None, compare=False)
    generation: int = field(default=0, compare=False)
    reason: str = field(default="", compare=False)
    abnormal: bool = field(default=True, compare=False)
    call: Callable[[], Any] | None = field(default=None, compare=False)
    reply: queue.Queue[tuple[bool, Any]] | None = field(default=None, compare=False)
    terminated: bool = field(default=False, compare=False)  # the child's own SIGTERM


class Supervisor:
    """One supervisor of the tree. See the module docstring."""

    def __init__(
        self,
        node: ActorNode,
        spec: SupervisorSpec,
        *,
        on_failure: Callable[[str], None] | None = None,
        restart_counts: RestartCounts | None = None,
    ) -> None:
        if not isinstance(spec, SupervisorSpec):
            raise SupervisorError(f"spec must be a SupervisorSpec, got {spec!r}")
        self.node = node
        self.spec = spec
        self.id = spec.id
        self._on_failure = on_failure
        # shared by the whole tree: the root's, handed to every supervisor below it
        self.restart_counts = restart_counts if restart_counts is not None else RestartCounts()
        self._children: list[_Child] = []
        # The same children by name, and those with heartbeats (dicts: in start order),
        # so that adding a child or beating them costs the same whatever their number (a
        # node's queue_sup holds a supervisor per queue, none with a heartbeat).
        self._named: dict[str, _Child] = {}
        self._beating: dict[_Child, None] = {}
        self._lock = threading.RLock()
        self._events: queue.Queue[_Event] = queue.Queue()
        self._restart_times: collections.deque[float] = collections.deque()
        self._dynamic = 0
        self._threads: list[threading.Thread] = []  # the event thread, from the first event
        self._thread_lock = threading.Lock()  # starting it, against stop() reading it
        # The event thread's timers: (due, order, event), the earliest first.
        self._timers: list[tuple[float, int, _Event]] = []
        self._timer_order = itertools.count()
        # Touched by the heartbeat thread alone: the ping out to each child (its future,
        # the ref pinged, when sent) and the children reported hung (-> last_pong then).
        self._pings: dict[_Child, tuple[Future, ActorRef, float]] = {}
        self._hung_reported: dict[_Child, float] = {}
        self._stopping = threading.Event()
        self._no_restarts = threading.Event()  # this supervisor or one above is stopping
        self._stopped = threading.Event()  # every child stopped, threads done
        self.state = "stopped"
        self.failure: str | None = None
        # (starting|stopping, child name, since (monotonic), bound in seconds), or None:
        # set by whichever thread starts or stops a child, read by status()
        self._busy: tuple[str, str, float, float] | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> Supervisor:
        """Start every child in order; raise SupervisorError if one cannot start."""
        template_only = self.spec.flags.strategy == "simple_one_for_one"
        with self._lock:
            self._children, self._named, self._beating = [], {}, {}
        for spec in () if template_only else self.spec.children:
            self._add(_Child(spec, spec.id))
        try:
            self._start_children(list(self._children))
        except SupervisorError:
            self._stop_children(reversed(self._children))
            with self._thread_lock:
                self._answer_queued()  # the exits of those stopped: nothing acts on them
            raise
        _HEARTBEATS.watch(self)  # before the thread may act: a failure there forgets it
        with self._thread_lock:
            self.state = "running"
            if not self._events.empty():  # what came while the children started
                self._start_event_thread()
        return self

    def stop(self) -> None:
        """Stop every child, in reverse start order, then the supervisor's threads. When a
        stop is already under way (another caller's, or a failure's), wait for it."""
        if self._stopping.is_set():
            if threading.current_thread() not in self._threads:
                self._stopped.wait()
            return
        self._refuse_restarts()
        self._stopping.set()
        _HEARTBEATS.forget(self)
        with self._thread_lock:
            threads = list(self._threads)  # none starts from now on (see _post)
        self._events.put(_Event("wake"))
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join()
        with self._thread_lock:
            self._answer_queued()  # had no thread taken them
        self._stop_children(reversed(self._children))
        if self.state != "failed":
            self.state = "stopped"
        self._stopped.set()

    def stop_bound_s(self) -> float:
        """How long ``stop()`` may take: its children's stops, one after another (each its
        stop request, SIGTERM and SIGKILL, then ``EXIT_AFTER_KILL_S`` for its exit)."""
        with self._lock:
            children = list(self._children)
        return sum(_stop_bound_s(child) for child in children)

    def _refuse_restarts(self) -> None:
        """From now on no child of this subtree is restarted (the subtree is stopping)."""
        self._no_restarts.set()
        with self._lock:
            nested = [c.supervisor for c in self._children if c.supervisor is not None]
        for supervisor in nested:
            supervisor._refuse_restarts()

    def __enter__(self) -> Supervisor:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    # ------------------------------------------------------------------ requests

    def start_child(self, spec_or_args: ChildSpec | SupervisorSpec | tuple = ()) -> ActorRef | None:
        """Add a child: for simple_one_for_one, the template started with extra
        ``args``; otherwise a new spec appended after the others. Returns its ref (None
        for a nested supervisor)."""

        def add() -> ActorRef | None:
            if self.spec.flags.strategy == "simple_one_for_one":
                if not isinstance(spec_or_args, tuple):
                    raise SupervisorError("simple_one_for_one takes start arguments, not a spec")
                template = self.spec.children[0]
                self._dynamic += 1
                child = _Child(template, f"{template.id}-{self._dynamic}", spec_or_args)
            else:
                if not isinstance(spec_or_args, (ChildSpec, SupervisorSpec)):
                    raise SupervisorError(f"start_child takes a spec here, got {spec_or_args!r}")
                if spec_or_args.id in self._named:
                    raise SupervisorError(f"a child {spec_or_args.id!r} exists already")
                child = _Child(spec_or_args, spec_or_args.id)
            self._start_child(child)
            self._add(child)
            return child.ref

        return self._call(add)

    def terminate_child(self, child_id: str) -> None:
        """Stop a child and forget it (it is not restarted)."""

        def terminate() -> None:
            child = self._find(child_id)
            self._stop_children([child])
            self._remove(child)

        self._call(terminate)

    def follow_child_spec(
        self, child_id: str, spec_of: Callable[[], ChildSpec | SupervisorSpec]
    ) -> None:
        """Start the child ``child_id`` from ``spec_of()`` at each restart: a supervisor
        whose children change at run time (the node's queues) is restarted with all of
        them, not with the ones it started with, and its spec is made then, not at each
        change (a node of thousands of queues would make it at every declare).
        ``spec_of`` runs on this supervisor's event thread."""

        def follow() -> None:
            self._find(child_id).spec_of = spec_of

        self._call(follow)

    def child_supervisor(self, child_id: str) -> Supervisor:
        """The supervisor running as child ``child_id`` (a SupervisorSpec child);
        KeyError if there is no such child, ValueError if it is an actor."""
        with self._lock:
            child = self._named[child_id]
        if child.supervisor is None:
            raise ValueError(f"{child_id} is an actor, not a supervisor")
        return child.supervisor

    def which_children(self) -> list[dict[str, Any]]:
        """id, pid, state, restarts and incarnation of each child, in start order."""
        with self._lock:
            return [
                {
                    "id": c.name,
                    "pid": c.ref.pid if c.ref else None,
                    "state": c.state,
                    "restarts": c.restarts,
                    "incarnation": c.ref.incarnation if c.ref else None,
                    "ref": c.ref,
                }
                for c in self._children
            ]

    def status(self) -> dict[str, Any]:
        """This supervisor and its subtree, with each actor's RSS and CPU."""
        with self._lock:
            children = list(self._children)
        rows = []
        for child in children:
            if child.supervisor is not None:
                sub = child.supervisor.status()
                sub["restarts"] = child.restarts
                rows.append(sub)
                continue
            row = {
                "id": child.name,
                "kind": "worker",
                "state": child.state,
                "pid": child.ref.pid if child.ref else None,
                "restarts": child.restarts,
                "incarnation": child.ref.incarnation if child.ref else None,
                "rss_bytes": None,
                "cpu_percent": None,
            }
            if child.ref is not None and child.state == "running":
                try:
                    process = psutil.Process(child.ref.pid)
                    row["rss_bytes"] = process.memory_info().rss
                    row["cpu_percent"] = process.cpu_percent(interval=None)
                except psutil.Error:
                    pass  # exited since: the next status shows its restart
            rows.append(row)
        busy = self._busy
        return {
            "id": self.id,
            "kind": "supervisor",
            "strategy": self.spec.flags.strategy,
            "state": self.state,
            "failure": self.failure,
            "busy": None
            if busy is None
            else {
                "action": busy[0],
                "child": busy[1],
                "for_s": round(time.monotonic() - busy[2], 3),
                "bound_s": busy[3],
            },
            "children": rows,
        }

    def actor_pids(self) -> list[int]:
        """Pids of every running actor in this subtree."""
        return [ref.pid for ref in self.actor_refs()]

    def actor_refs(self) -> list[ActorRef]:
        """Refs of every running actor in this subtree."""
        with self._lock:
            children = list(self._children)
        refs = []
        for child in children:
            if child.supervisor is not None:
                refs += child.supervisor.actor_refs()
            elif child.ref is not None and child.state == "running":
                refs.append(child.ref)
        return refs

    def _call(self, function: Callable[[], Any]) -> Any:
        """Run ``function`` on the event thread (where every decision is taken)."""
        if self.state != "running":
            raise SupervisorError(f"supervisor {self.id} is {self.state}")
        reply: queue.Queue[tuple[bool, Any]] = queue.Queue()
        self._post(_Event("call", call=function, reply=reply))
        ok, value = reply.get()
        if not ok:
            raise value
        return value

    def _find(self, child_id: str) -> _Child:
        child = self._named.get(child_id)
        if child is None:
            raise SupervisorError(f"supervisor {self.id} has no child {child_id!r}")
        return child

    def _add(self, child: _Child) -> None:
        """Make ``child`` the last of the children (the event thread, or ``start``)."""
        with self._lock:
            self._children.append(child)
            self._named[child.name] = child
            self._note_heartbeats(child)

    def _note_heartbeats(self, child: _Child) -> None:
        """Beat ``child`` if its spec asks for heartbeats (under the lock)."""
        if getattr(child.spec, "heartbeat_interval_s", None) is not None:
            self._beating[child] = None
        else:
            self._beating.pop(child, None)

    def _remove(self, child: _Child) -> None:
        """Forget ``child`` (the event thread)."""
        with self._lock:
            self._children.remove(child)
            del self._named[child.name]
            self._beating.pop(child, None)

    # ------------------------------------------------------------------ starting and stopping

    def _start_children(self, children: list[_Child]) -> None:
        """Start ``children`` in order, ``start_together`` at a time (see the flags): a
        failure starts no child not yet begun, and raises once the starts under way
        have ended (each child then started or failed: the caller stops those started)."""
        together = min(self.spec.flags.start_together, len(children))
        if together <= 1:
            for child in children:
                self._start_child(child)
            return
        failures: list[SupervisorError] = []

        def start(child: _Child) -> None:
            if failures:
                return
            try:
                self._start_child(child, note_busy=False)
            except SupervisorError as exc:
                failures.append(exc)
            except Exception as exc:  # a bad argument (InvalidSpec): the same clean-up
                failures.append(
                    SupervisorError(f"{self.id}: child {child.name} failed to start: {exc}")
                )
                failures[-1].__cause__ = exc

        bound_s = sum(_start_bound_s(child.spec) for child in children)
        self._busy = ("starting", f"{len(children)} children", time.monotonic(), bound_s)
        try:
            with ThreadPoolExecutor(together, thread_name_prefix=f"start {self.id}") as pool:
                for done in [pool.submit(start, child) for child in children]:
                    done.result()
        finally:
            self._busy = None
        if failures:
            raise failures[0]

    def _start_child(self, child: _Child, note_busy: bool = True) -> None:
        """Start one child; ``note_busy``: it is what the supervisor is busy with (a
        start side by side with others is covered by the one note of them all)."""
        child.generation += 1
        generation = child.generation
        child.state = "starting"
        if child.spec_of is not None:
            child.spec = child.spec_of()
            with self._lock:
                if self._named.get(child.name) is child:  # a child, not one being added
                    self._note_heartbeats(child)
        spec = child.spec
        if note_busy:
            self._busy = ("starting", child.name, time.monotonic(), _start_bound_s(spec))
        try:
            if isinstance(spec, SupervisorSpec):
                child.supervisor = Supervisor(
                    self.node,
                    spec,
                    on_failure=lambda reason: self._post(
                        _Event("exit", child, generation, f"supervisor failed: {reason}")
                    ),
                    restart_counts=self.restart_counts,
                )
                child.supervisor.start()
            else:
                self.restart_counts.starting(child.name)
                if child.ref is not None:
                    child.ref = self.node.restart(child.ref, start_timeout_s=spec.start_timeout_s)
                else:
                    child.ref = self.node.spawn(
                        spec.actor,
                        *spec.args,
                        *child.args,
                        name=child.name,
                        start_timeout_s=spec.start_timeout_s,
                        **spec.kwargs,
                    )
                child.monitor = self.node.monitor(
                    child.ref,
                    lambda down: self._post(
                        _Event(
                            "exit",
                            child,
                            generation,
                            down.reason,
                            _abnormal(down),
                            terminated=down.exitcode == EXIT_TERMINATED,
                        )
                    ),
                )
        except (ActorError, SupervisorError) as exc:
            child.state = "failed"
            raise SupervisorError(f"{self.id}: child {child.name} failed to start: {exc}") from exc
        finally:
            if note_busy:
                self._busy = None
        now = time.monotonic()
        child.ready_at = child.last_pong = child.last_ping = now
        child.state = "running"

    def _stop_children(self, children: Iterable[_Child]) -> None:
        for child in list(children):
            if child.state in ("stopped", "failed") and child.supervisor is None:
                continue
            child.state = "stopping"
            child.generation += 1  # whatever Down comes now is expected
            self._busy = ("stopping", child.name, time.monotonic(), _stop_bound_s(child))
            try:
                if child.supervisor is not None:
                    child.supervisor.stop()
                elif child.ref is not None:
                    self._stop_actor(child)
            finally:
                self._busy = None
            child.state = "stopped"

    def _stop_actor(self, child: _Child) -> None:
        spec, ref = child.spec, child.ref
        assert ref is not None, "only a started actor is stopped"
        try:
            if isinstance(spec.shutdown_s, str):  # BRUTAL_KILL, the only word allowed
                self.node.kill(ref)
                if child.monitor is not None:
                    child.monitor.wait(EXIT_AFTER_KILL_S)
            else:
                self.node.stop(
                    ref,
                    timeout=spec.shutdown_s,
                    kill_if=lambda pid: self._frozen_while_stopped(child, pid),
                )
        except ActorError as exc:
            log.error("%s: stopping %s failed: %s", self.id, child.name, exc)

    def _frozen_while_stopped(self, child: _Child, pid: int) -> bool:
        """Whether ``child``, being stopped, is stopped by a signal (so to be killed): at
        the start of its stop or at any moment of it, as the kernel may show a SIGSTOP
        late (the process still running, or in an fsync) or it may come later."""
        if not _stopped_by_signal(pid):
            return False
        log.warning(
            "%s: %s (pid %d) is stopped by a signal (SIGSTOP, a debugger): killing it "
            "rather than waiting up to %g s for a stop it cannot act on",
            self.id,
            child.name,
            pid,
            child.spec.shutdown_s,
        )
        return True

    # ------------------------------------------------------------------ the event thread

    def _post(self, event: _Event) -> None:
        """Hand ``event`` to the event thread, started here at the first event once the
        supervisor runs (before, the event waits for ``start()`` to end, as a child's
        exit did when the thread started there: the children are still being started).
        Once it stops, nothing acts on an event: a call is answered that it stopped, and
        anything else dropped."""
        with self._thread_lock:
            if not self._stopping.is_set():
                self._events.put(event)
                if not self._threads and self.state == "running":
                    self._start_event_thread()
                return
        if event.reply is not None:
            event.reply.put((False, SupervisorError(f"supervisor {self.id} stopped")))

    def _start_event_thread(self) -> None:
        """(Under ``_thread_lock``.) Start the event thread."""
        thread = threading.Thread(
            target=self._event_loop, daemon=True, name=f"supervisor {self.id}"
        )
        thread.start()
        self._threads.append(thread)

    def _answer_queued(self) -> None:
        """(Under ``_thread_lock``, the supervisor stopping or its start failed.) Empty the
        queue of events: a caller waiting on a call is answered that it stopped."""
        while not self._events.empty():
            event = self._events.get_nowait()
            if event.reply is not None:
                event.reply.put((False, SupervisorError(f"supervisor {self.id} stopped")))

    def _event_loop(self) -> None:
        while not self._stopping.is_set():
            event = self._next_event()
            try:
                self._handle(event)
            except Exception:  # supervision must go on; the next event may succeed
                log.exception("%s: handling %s failed", self.id, event)
            _HEARTBEATS.changed(self)  # a child may have started, stopped or gone
        with self._thread_lock:  # no event comes after this (see _post)
            self._answer_queued()

    def _next_event(self) -> _Event:
        """The next event: a timer that is due, else the queue's next, waited for no
        longer than until the earliest timer is due (without a timer, as long as it takes:
        ``stop()`` enqueues a wake-up)."""
        while True:
            timeout = None
            if self._timers:
                timeout = self._timers[0][0] - time.monotonic()
                if timeout <= 0:
                    return heapq.heappop(self._timers)[2]
            try:
                return self._events.get(timeout=timeout)
            except queue.Empty:
                continue  # the timer is due

    def _later(self, delay_s: float, event: _Event) -> None:
        """Handle ``event`` ``delay_s`` from now (on the event thread, which alone calls this)."""
        due = time.monotonic() + delay_s
        heapq.heappush(self._timers, (due, next(self._timer_order), event))

    def _handle(self, event: _Event) -> None:
        if event.kind == "call":
            call, reply = event.call, event.reply
            assert call is not None and reply is not None  # _call() sets both
            try:
                reply.put((True, call()))
            except Exception as exc:  # handed to the caller, who raises it
                reply.put((False, exc))
        elif event.kind == "exit":
            self._child_exited(event)
        elif event.kind in ("retry", "restart_terminated"):
            child = event.child
            assert child is not None  # both kinds are made for a child
            if child.generation == event.generation and (
                event.kind == "retry" or child.state == "stopped"
            ):
                self._restart(child)
        elif event.kind == "hung":
            child = event.child
            assert child is not None  # the heartbeat thread names the child
            if child.generation == event.generation and child.state == "running":
                self._kill_if_hung(child)

    def _kill_if_hung(self, child: _Child) -> None:
        """Kill ``child`` unless a pong was credited since the heartbeat thread found it hung."""
        timeout = getattr(child.spec, "heartbeat_timeout_s", None)
        silent_s = time.monotonic() - child.last_pong
        if timeout is None or silent_s < timeout:
            return
        ref = child.ref
        assert ref is not None  # only an actor child has a heartbeat; running, its ref
        log.warning(
            "%s: %s (pid %d) missed heartbeats for %.1f s: killing it",
            self.id,
            child.name,
            ref.pid,
            silent_s,
        )
        child.state = "hung"
        self.node.kill(ref)

    def _child_exited(self, event: _Event) -> None:
        child = event.child
        assert child is not None  # an exit event is made for a child
        if (
            child.generation != event.generation
            or child.state not in ("running", "hung")
            or self._stopping.is_set()
            or self._named.get(child.name) is not child  # removed since
        ):
            return
        abnormal = event.abnormal or child.state == "hung"
        log.info("%s: child %s exited: %s", self.id, child.name, event.reason)
        child.state = "stopped"
        restart = child.spec.restart
        if restart == "temporary" or (restart == "transient" and not abnormal):
            if restart == "temporary":
                self._remove(child)
            return
        if event.terminated:
            self._later(
                TERMINATED_RESTART_DELAY_S,
                _Event("restart_terminated", child, child.generation),
            )
            return
        self._restart(child)

    def _restart(self, child: _Child) -> None:
        if self._no_restarts.is_set():
            log.info("%s: %s is not restarted: the tree is stopping", self.id, child.name)
            return
        now = time.monotonic()
        self._restart_times.append(now)
        while self._restart_times and now - self._restart_times[0] > self.spec.flags.period_s:
            self._restart_times.popleft()
        if len(self._restart_times) > self.spec.flags.intensity:
            self._fail(
                f"more than {self.spec.flags.intensity} restarts in "
                f"{self.spec.flags.period_s} s (last: {child.name})"
            )
            return
        child.restarts += 1
        strategy = self.spec.flags.strategy
        index = self._children.index(child)
        if strategy in ("one_for_one", "simple_one_for_one"):
            to_start = [child]
        elif strategy == "one_for_all":
            to_start = list(self._children)
        else:
            to_start = self._children[index:]
        others = [c for c in to_start if c is not child]
        self._stop_children(reversed(others))
        for other in others:
            other.restarts += 1
        for restarting in to_start:
            try:
                self._start_child(restarting)
            except SupervisorError as exc:
                log.error("%s", exc)
                self._later(RETRY_DELAY_S, _Event("retry", restarting, restarting.generation))
                return

    def _fail(self, reason: str) -> None:
        log.error("%s: giving up: %s", self.id, reason)
        self._stopping.set()
        _HEARTBEATS.forget(self)
        self._stop_children(reversed(self._children))
        self.state = "failed"
        self.failure = reason
        self._stopped.set()
        if self._on_failure is not None:
            self._on_failure(reason)

    # ------------------------------------------------------------------ heartbeats

    def _beat_children(self, now: float) -> float:
        """(The heartbeat thread.) Beat every child at ``now`` (see ``_beat``); return
        when this supervisor is next due, ``math.inf`` when none of its children is."""
        with self._lock:
            children = list(self._beating)
        due = math.inf
        for child in children:
            due = min(due, self._beat(child, now))
        for gone in (self._pings.keys() | self._hung_reported.keys()) - set(children):
            self._pings.pop(gone, None)  # removed since (terminated, or temporary)
            self._hung_reported.pop(gone, None)
        return due

    def _excuse_silence(self, held_s: float, since: float, now: float) -> None:
        """(The heartbeat thread.) The silence of every child running since before
        ``since`` is ``held_s`` shorter (never past ``now``): this process was held
        that long, and could neither ping nor hear it. A child started since (its
        ``last_pong`` is its start) owes nothing to the pause."""
        with self._lock:
            children = list(self._beating)
        for child in children:
            if child.state == "running" and child.last_pong <= since:
                child.last_pong = min(child.last_pong + held_s, now)

    def _beat(self, child: _Child, now: float) -> float:
        """One child's heartbeat at ``now``: credit its ping's answer, send the next ping
        when one is due (or due within ``COALESCE_S``), tell the event thread when the
        child is hung. Return when the child is next due: its next ping (the expiry of
        the one out), or the moment it would turn hung; ``math.inf`` for a child without
        heartbeats or not running."""
        interval = getattr(child.spec, "heartbeat_interval_s", None)
        timeout = getattr(child.spec, "heartbeat_timeout_s", None)
        ref = child.ref
        if interval is None or timeout is None or child.state != "running" or ref is None:
            self._pings.pop(child, None)
            self._hung_reported.pop(child, None)
            return math.inf
        early = min(COALESCE_S, interval / 4)
        if child in self._pings:
            future, pinged, sent = self._pings.pop(child)
            try:
                future.get(timeout=0)
            except AskTimeout:
                if now + early - sent < interval:
                    self._pings[child] = (future, pinged, sent)  # not answered yet: still out
                # else expired unanswered: the next ping replaces it
            except ActorError:
                pass  # gone: its Down is on the way
            else:
                if pinged is child.ref:  # not an incarnation replaced since
                    child.last_pong = max(child.last_pong, sent)
        if child not in self._pings and now + early - child.last_ping >= interval:
            child.last_ping = now
            try:
                # timeout 0: a full control mailbox must not hold up every supervisor's beat
                self._pings[child] = (ref.pin().ping_async(timeout=0), ref, now)
            except ActorError:
                pass  # its control mailbox is full or it is gone
        due = child.last_ping + interval
        if self._hung_reported.get(child) != child.last_pong:
            if now - child.last_pong >= timeout:
                self._hung_reported[child] = child.last_pong
                self._post(_Event("hung", child, child.generation))
            else:
                due = min(due, child.last_pong + timeout)
        return due


def _start_bound_s(spec: ChildSpec | SupervisorSpec) -> float:
    """How long starting ``spec`` may take: an actor's ``start_timeout_s``; a nested
    supervisor's children, started one after another (a ``simple_one_for_one`` one starts
    none: they are added later)."""
    if isinstance(spec, ChildSpec):
        return spec.start_timeout_s
    if spec.flags.strategy == "simple_one_for_one":
        return 0.0
    return sum(_start_bound_s(c) for c in spec.children)


def _stop_bound_s(child: _Child) -> float:
    """How long stopping ``child`` may take: an actor's stop request, SIGTERM after its
    ``shutdown_s`` and SIGKILL after as long again (at once for ``"brutal_kill"``), then
    its exit (``EXIT_AFTER_KILL_S``); a nested supervisor's ``stop_bound_s()``."""
    if child.supervisor is not None:
        return child.supervisor.stop_bound_s()
    shutdown_s = child.spec.shutdown_s
    return EXIT_AFTER_KILL_S + (0.0 if isinstance(shutdown_s, str) else 2 * shutdown_s)


def _stopped_by_signal(pid: int) -> bool:
    """Whether process ``pid`` is stopped (SIGSTOP, SIGTSTP, a debugger's stop): it runs
    no code until resumed, so it acts on no stop request. A process in its ``on_stop``
    answers no ping either, but runs: only the kernel's word tells the two apart."""
    try:
        status = psutil.Process(pid).status()
    except psutil.Error:
        return False  # gone already: its stop finds that out
    return status in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)


class _Heartbeats:
    """The process's heartbeat thread, shared by every running supervisor (see the module
    docstring). It owns the schedule: each watched supervisor and when it is next due."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._due: dict[Supervisor, float] = {}  # the supervisors watched -> next due
        self._changed: set[Supervisor] = set()  # to beat at the next wake-up
        self._thread: threading.Thread | None = None

    def watch(self, supervisor: Supervisor) -> None:
        """Beat ``supervisor``'s children from now on (at once, then as they are due)."""
        with self._lock:
            self._due[supervisor] = math.inf
            self._changed.add(supervisor)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, daemon=True, name="warren-heartbeats"
                )
                self._thread.start()
        self._wake.set()

    def changed(self, supervisor: Supervisor) -> None:
        """``supervisor``'s children changed: beat it at once."""
        with self._lock:
            if supervisor not in self._due:
                return
            self._changed.add(supervisor)
        self._wake.set()

    def forget(self, supervisor: Supervisor) -> None:
        """Beat ``supervisor`` no more."""
        with self._lock:
            self._due.pop(supervisor, None)
            self._changed.discard(supervisor)
        self._wake.set()  # with nothing left to watch, the thread ends

    def _run(self) -> None:
        schedule: list[tuple[float, int, Supervisor]] = []  # (due, order, supervisor)
        order = itertools.count()
        wait_s: float | None = None
        planned = math.inf  # when this thread meant to wake up at the latest
        while True:
            self._wake.wait(wait_s)
            self._wake.clear()  # before reading what changed: no wake-up is lost
            now = time.monotonic()
            with self._lock:
                if not self._due:
                    self._thread = None
                    return
                watched = list(self._due)
            if now - planned > HELD_S:
                # This thread, and so its process, was held (a SIGSTOP of the node, a
                # paused container, a starved machine): time nobody could ping the
                # children in is not theirs.
                log.warning(
                    "heartbeats: this process was held %.1f s (stopped, or starved of "
                    "CPU): its children's silence meanwhile is not held against them",
                    now - planned,
                )
                for supervisor in watched:
                    supervisor._excuse_silence(now - planned, planned, now)
            with self._lock:
                ready, self._changed = self._changed, set()
                while schedule and schedule[0][0] <= now + COALESCE_S:
                    due, _, supervisor = heapq.heappop(schedule)
                    if self._due.get(supervisor) == due:  # else rescheduled, or forgotten
                        ready.add(supervisor)
            for supervisor in ready:
                now = time.monotonic()
                try:
                    due = supervisor._beat_children(now)
                except Exception:  # the others' heartbeats must go on
                    log.exception("%s: heartbeats failed", supervisor.id)
                    due = now + BEAT_RETRY_S
                with self._lock:
                    if supervisor in self._due:
                        self._due[supervisor] = due
                        if due != math.inf:
                            heapq.heappush(schedule, (due, next(order), supervisor))
            wait_s = None if not schedule else max(0.0, schedule[0][0] - time.monotonic())
            planned = math.inf if wait_s is None else time.monotonic() + wait_s

    def _after_fork(self) -> None:
        """A forked child has none of its parent's threads, and watches nothing."""
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._due = {}
        self._changed = set()
        self._thread = None


_HEARTBEATS = _Heartbeats()
os.register_at_fork(after_in_child=_HEARTBEATS._after_fork)


def _abnormal(down: Down) -> bool:
    return down.signal is not None or down.exitcode not in (0, None)

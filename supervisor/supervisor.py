"""Supervisors: OTP's restart semantics over actor processes.

A ``Supervisor`` owns the children of one ``SupervisorSpec`` (see ``warren.supervisor.specs`` for
every option, its allowed values and default). It lives in the node's process: two
threads, no process of its own. Its children are actor processes spawned through the
node's ``warren.actors.Node`` (the forkserver's children), and nested supervisors, which are
``Supervisor`` objects of their own. Why no process per supervisor: every actor process is
already a child of the node's forkserver and dies with the node, so a supervisor process
would add a hop and a failure point without isolating anything.

Lifecycle:

- ``start()`` starts the children in order, each ready (``on_start`` done, recovery done)
  before the next starts; a child that fails to start stops the ones already started, in
  reverse, and ``start()`` raises ``SupervisorError``.
- ``stop()`` stops the children in reverse order: a stop request, SIGTERM after the
  child's ``shutdown_s``, SIGKILL after ``shutdown_s`` more (``"brutal_kill"``: SIGKILL at
  once). Nested supervisors stop their own children first.

Watching (the event thread): every child incarnation is monitored; its ``Down`` (exit code
or signal, SIGKILL included) arrives within the node's reaping latency. The heartbeat
thread keeps one ping out to each ready child on its control channel, every
``heartbeat_interval_s``, without waiting on any (a hung child delays nobody's heartbeat;
the control channel is served between the actor's batches); a child with no answer for
``heartbeat_timeout_s`` is hung (SIGSTOPped, deadlocked, one handler call running too
long) and is killed with SIGKILL, which then counts as its crash. Heartbeats begin only
once a child is ready: a long start is bounded by ``start_timeout_s`` alone.

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
``RETRY_DELAY_S``, until the intensity gives out. As in OTP, a supervisor that is itself
restarted starts from its spec: children added with ``start_child`` are not brought back
(whoever added them adds them again, as a queue's declaration is replayed).

Races and their answers: a ``Down`` can arrive for an incarnation the supervisor has
already replaced or is stopping on purpose — events name the incarnation and are applied
only to the child's current, running incarnation. Monitor callbacks run on the node's
service thread and only enqueue; all decisions are taken on the event thread, one at a
time, so two deaths never interleave their restarts.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import psutil

from warren.actors import EXIT_TERMINATED, ActorError, ActorRef, AskTimeout, Down, Future, Monitor
from warren.actors import Node as ActorNode

from .errors import SupervisorError
from .specs import ChildSpec, SupervisorSpec

log = logging.getLogger("warren.supervisor")

RETRY_DELAY_S = 0.5  # before retrying a restart whose start failed
# A child that stopped on a SIGTERM of its own is restarted only this long after (seconds):
# when a whole node is stopped by a signal to every process (systemd's control-group
# kill), the children see it before the node does, and must not be restarted meanwhile.
TERMINATED_RESTART_DELAY_S = 1.0
TICK_S = 0.1  # how often the event thread looks for hung children
HEARTBEAT_POLL_S = 0.05


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
    ) -> None:
        if not isinstance(spec, SupervisorSpec):
            raise SupervisorError(f"spec must be a SupervisorSpec, got {spec!r}")
        self.node = node
        self.spec = spec
        self.id = spec.id
        self._on_failure = on_failure
        self._children: list[_Child] = []
        self._lock = threading.RLock()
        self._events: queue.Queue[_Event] = queue.Queue()
        self._restart_times: collections.deque[float] = collections.deque()
        self._dynamic = 0
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()
        self._no_restarts = threading.Event()  # this supervisor or one above is stopping
        self._stopped = threading.Event()  # every child stopped, threads done
        self.state = "stopped"
        self.failure: str | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> Supervisor:
        """Start every child in order; raise SupervisorError if one cannot start."""
        template_only = self.spec.flags.strategy == "simple_one_for_one"
        with self._lock:
            self._children = (
                [] if template_only else [_Child(spec, spec.id) for spec in self.spec.children]
            )
        for child in list(self._children):
            try:
                self._start_child(child)
            except SupervisorError:
                self._stop_children(reversed(self._children))
                raise
        self.state = "running"
        self._threads = [
            threading.Thread(target=self._event_loop, daemon=True, name=f"supervisor {self.id}"),
            threading.Thread(
                target=self._heartbeat_loop, daemon=True, name=f"heartbeats {self.id}"
            ),
        ]
        for thread in self._threads:
            thread.start()
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
        self._events.put(_Event("wake"))
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join()
        self._stop_children(reversed(self._children))
        if self.state != "failed":
            self.state = "stopped"
        self._stopped.set()

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
                if any(c.spec.id == spec_or_args.id for c in self._children):
                    raise SupervisorError(f"a child {spec_or_args.id!r} exists already")
                child = _Child(spec_or_args, spec_or_args.id)
            self._start_child(child)
            with self._lock:
                self._children.append(child)
            return child.ref

        return self._call(add)

    def terminate_child(self, child_id: str) -> None:
        """Stop a child and forget it (it is not restarted)."""

        def terminate() -> None:
            child = self._find(child_id)
            self._stop_children([child])
            with self._lock:
                self._children.remove(child)

        self._call(terminate)

    def update_child_spec(self, spec: ChildSpec | SupervisorSpec) -> None:
        """Start the child of ``spec.id`` from ``spec`` at its next (re)start: a supervisor
        whose children change at run time (the node's queues) is restarted with all of
        them, not with the ones it started with."""

        def update() -> None:
            self._find(spec.id).spec = spec

        self._call(update)

    def child_supervisor(self, child_id: str) -> Supervisor:
        """The supervisor running as child ``child_id`` (a SupervisorSpec child);
        KeyError if there is no such child, ValueError if it is an actor."""
        with self._lock:
            for child in self._children:
                if child.name == child_id:
                    if child.supervisor is None:
                        raise ValueError(f"{child_id} is an actor, not a supervisor")
                    return child.supervisor
        raise KeyError(child_id)

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
        return {
            "id": self.id,
            "kind": "supervisor",
            "strategy": self.spec.flags.strategy,
            "state": self.state,
            "failure": self.failure,
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
        self._events.put(_Event("call", call=function, reply=reply))
        ok, value = reply.get()
        if not ok:
            raise value
        return value

    def _find(self, child_id: str) -> _Child:
        for child in self._children:
            if child.name == child_id:
                return child
        raise SupervisorError(f"supervisor {self.id} has no child {child_id!r}")

    # ------------------------------------------------------------------ starting and stopping

    def _start_child(self, child: _Child) -> None:
        child.generation += 1
        generation = child.generation
        child.state = "starting"
        spec = child.spec
        try:
            if isinstance(spec, SupervisorSpec):
                child.supervisor = Supervisor(
                    self.node,
                    spec,
                    on_failure=lambda reason: self._events.put(
                        _Event("exit", child, generation, f"supervisor failed: {reason}")
                    ),
                )
                child.supervisor.start()
            else:
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
                    lambda down: self._events.put(
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
        now = time.monotonic()
        child.ready_at = child.last_pong = child.last_ping = now
        child.state = "running"

    def _stop_children(self, children: Iterable[_Child]) -> None:
        for child in list(children):
            if child.state in ("stopped", "failed") and child.supervisor is None:
                continue
            child.state = "stopping"
            child.generation += 1  # whatever Down comes now is expected
            if child.supervisor is not None:
                child.supervisor.stop()
            elif child.ref is not None:
                self._stop_actor(child)
            child.state = "stopped"

    def _stop_actor(self, child: _Child) -> None:
        spec, ref = child.spec, child.ref
        assert ref is not None, "only a started actor is stopped"
        try:
            if isinstance(spec.shutdown_s, str):  # BRUTAL_KILL, the only word allowed
                self.node.kill(ref)
                if child.monitor is not None:
                    child.monitor.wait(30)
            else:
                self.node.stop(ref, timeout=spec.shutdown_s)
        except ActorError as exc:
            log.error("%s: stopping %s failed: %s", self.id, child.name, exc)

    # ------------------------------------------------------------------ the event thread

    def _event_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                event = self._events.get(timeout=TICK_S)
            except queue.Empty:
                event = None
            try:
                self._handle(event)
                self._kill_hung_children()
            except Exception:  # supervision must go on; the next event may succeed
                log.exception("%s: handling %s failed", self.id, event)
        while not self._events.empty():  # callers waiting on a call get an answer
            event = self._events.get_nowait()
            if event.reply is not None:
                event.reply.put((False, SupervisorError(f"supervisor {self.id} stopped")))

    def _handle(self, event: _Event | None) -> None:
        if event is None:
            return
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

    def _kill_hung_children(self) -> None:
        now = time.monotonic()
        with self._lock:
            children = list(self._children)
        for child in children:
            timeout = getattr(child.spec, "heartbeat_timeout_s", None)
            if timeout is not None and child.state == "running" and now - child.last_pong > timeout:
                ref = child.ref
                assert ref is not None  # only an actor child has a heartbeat; running, its ref
                log.warning(
                    "%s: %s (pid %d) missed heartbeats for %.1f s: killing it",
                    self.id,
                    child.name,
                    ref.pid,
                    now - child.last_pong,
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
            or child not in self._children
        ):
            return
        abnormal = event.abnormal or child.state == "hung"
        log.info("%s: child %s exited: %s", self.id, child.name, event.reason)
        child.state = "stopped"
        restart = child.spec.restart
        if restart == "temporary" or (restart == "transient" and not abnormal):
            if restart == "temporary":
                with self._lock:
                    self._children.remove(child)
            return
        if event.terminated:
            later = _Event("restart_terminated", child, child.generation)
            timer = threading.Timer(TERMINATED_RESTART_DELAY_S, self._events.put, (later,))
            timer.daemon = True
            timer.start()
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
                retry = _Event("retry", restarting, restarting.generation)
                threading.Timer(RETRY_DELAY_S, self._events.put, (retry,)).start()
                return

    def _fail(self, reason: str) -> None:
        log.error("%s: giving up: %s", self.id, reason)
        self._stopping.set()
        self._stop_children(reversed(self._children))
        self.state = "failed"
        self.failure = reason
        self._stopped.set()
        if self._on_failure is not None:
            self._on_failure(reason)

    # ------------------------------------------------------------------ the heartbeat thread

    def _heartbeat_loop(self) -> None:
        """Keep one ping out to each ready child; never wait on any one of them."""
        out: dict[_Child, tuple[Future, ActorRef, float]] = {}
        while not self._stopping.wait(HEARTBEAT_POLL_S):
            with self._lock:
                children = list(self._children)
            for child in children:
                interval = getattr(child.spec, "heartbeat_interval_s", None)
                ref = child.ref
                if interval is None or child.state != "running" or ref is None:
                    out.pop(child, None)
                    continue
                now = time.monotonic()
                if child in out:
                    future, pinged, sent = out[child]
                    try:
                        future.get(timeout=0)
                    except AskTimeout:
                        if now - sent < interval:
                            continue  # not answered yet; the event thread judges
                    except ActorError:
                        pass  # gone: its Down is on the way
                    else:
                        if pinged is child.ref:
                            child.last_pong = now
                    del out[child]
                if now - child.last_ping >= interval:
                    child.last_ping = now
                    try:
                        out[child] = (ref.pin().ping_async(timeout=interval), ref, now)
                    except ActorError:
                        continue  # its control mailbox is full or it is gone


def _abnormal(down: Down) -> bool:
    return down.signal is not None or down.exitcode not in (0, None)

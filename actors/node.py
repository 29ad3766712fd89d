"""``Node``: owns a set of actor processes — their forkserver, addresses, registry and deaths.

A node is an object in the application's process (the "node process"). It owns:

- a private runtime directory for ipc mailboxes (``warren.actors.runtime_dir``), removed at
  close when the node created it;
- one forkserver process that forks every actor process (``warren.actors._forkserver``,
  driven through ``warren.actors._forkserver_client``);
- the node service (``warren.actors._service``): a ROUTER at ``ipc://<runtime dir>/node``
  and one thread that reads it together with the forkserver's reports. Actor processes
  report READY/FAILED there and ask for monitors, links, registry look-ups and stops;
- a ``Registry`` of names (per node: two nodes never see each other's names);
- the incarnation table (``warren.actors._lives``): for each address, the incarnation
  living there, its pid, its monitors and links, and the ``Down`` of every incarnation
  that has exited.

This module is the public API over those parts.

Spawning: ``spawn`` validates its arguments, pickles a ``SpawnOrder`` and hands it to the
forkserver (with the endpoints of this node's live actors its arguments name: the next
spare connects to those on ipc ahead, see ``_forkserver``), then waits until the child
reports READY (mailboxes bound, ``on_start`` done)
or FAILED (``SpawnError`` with the remote type name and message), or until
``start_timeout_s`` (the child is killed and ``SpawnError`` raised). ``restart`` spawns
the same order again at the same addresses under the next incarnation number; old
unpinned refs reach the new incarnation.

Stopping: ``stop`` sends a stop request on the control channel, sends SIGTERM after
``timeout`` seconds, SIGKILL after ``timeout`` more, and returns the ``Down``. Neither the
request nor the SIGTERM interrupts the actor's code: the handler call in progress runs to
its end, then ``on_stop``. A caller can name a state in which the process cannot act on
either (``kill_if``: a supervisor's check that the kernel shows it stopped by a signal):
it is checked at once and every ``STOP_CHECK_S`` while the stop waits, and the process
is sent SIGKILL as soon as it holds, since a process can be stopped by a signal (or seen
so only) after its stop began. ``close`` stops every actor (requests first, in parallel; then
SIGKILL through the forkserver), stops the forkserver and the service thread, and removes
the runtime directory: after ``close`` no process of this node exists.

Keeping tcp actors to the node: ``Node(curve=True)`` makes a CURVE key pair in memory and
gives it to every actor it spawns (inside the pickled spawn order, through the
forkserver's private pipe). Its tcp actors bind as CURVE servers with it, and its
processes (the node's own included) connect to tcp endpoints with it, so a process that
is not the node's cannot complete a handshake with them: its frames never reach the
actor. One node per process may do this (the key pair is the process's).

Logging: every actor process logs to the node process's stderr at ``log_level`` (default:
the level of the node process's root logger when the node is created), each line with its
time, level, the actor's name and pid, and the logger's name.

Races and their answers:
- Signals go through the forkserver, which signals only its own unreaped children, so a
  pid recycled after an exit is never hit.
- ``Down``/``Exit`` notices to actors are sent without waiting: a full control mailbox is
  logged and counted (``undeliverable_notices``), never waited on by the service thread.
- The forkserver dying (it should not) kills every actor (PDEATHSIG); the node reports a
  ``Down`` for each and refuses further spawns.
- The races of a spawn against its own exit are in ``warren.actors._lives``; those of the
  service thread in ``warren.actors._service``.
"""

from __future__ import annotations

import itertools
import logging
import pickle
import shutil
import signal
import time
from collections.abc import Callable
from typing import Any

import zmq

from . import _forkserver, wire
from ._forkserver_client import ForkserverClient
from ._lives import Ended, Life, Lives
from ._loop import SpawnOrder
from ._runtime import runtime
from ._service import NodeService
from .actor import ProcessActor
from .errors import ActorError, InvalidSpec, SpawnError
from .messages import Down, Exit
from .monitor import Monitor, Notify
from .ref import ActorRef
from .registry import Registry
from .runtime_dir import check_private, create_runtime_dir, ipc_endpoint

logger = logging.getLogger("warren.actors")

# How long spawn waits for READY (seconds).
DEFAULT_START_TIMEOUT_S = 30.0
# How long a stop waits at each step: request, then SIGTERM (seconds).
DEFAULT_STOP_TIMEOUT_S = 5.0
# How long we wait for the exit of a process sent SIGKILL (seconds): a process in an
# fsync on a slow disk dies only after it. A supervisor waits as long after a brutal kill
# and counts it in the bound a watcher is given for a stop.
EXIT_AFTER_KILL_S = 10.0
# How often a stop with ``kill_if`` checks it while it waits (seconds).
STOP_CHECK_S = 0.25
_TRANSPORTS = ("ipc", "tcp")


class Node:
    """Spawns, watches and stops actor processes (see the module docstring)."""

    def __init__(
        self,
        name: str = "warren",
        runtime_dir: str | None = None,
        preload: tuple[str, ...] = (),
        start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
        log_level: int | str | None = None,
        curve: bool = False,
    ) -> None:
        if _forkserver.importing_main():
            raise SpawnError(
                "a Node was started while the forkserver imported the main "
                'script: start nodes under `if __name__ == "__main__":`'
            )
        if not name or not isinstance(name, str):
            raise InvalidSpec("name", name, "must be a non-empty string")
        if start_timeout_s <= 0:
            raise InvalidSpec("start_timeout_s", start_timeout_s, "must be positive")
        if log_level is None:
            log_level = logging.getLogger().getEffectiveLevel()
        elif isinstance(log_level, str) and log_level.upper() in logging.getLevelNamesMapping():
            log_level = logging.getLevelNamesMapping()[log_level.upper()]
        if type(log_level) is not int:
            raise InvalidSpec(
                "log_level",
                log_level,
                "a logging level: DEBUG, INFO, WARNING, ERROR, or its number",
            )
        self.log_level = log_level
        self.name = name
        self.registry = Registry()
        self.start_timeout_s = start_timeout_s
        self._runtime = runtime()
        if curve and self._runtime.curve is not None:
            raise InvalidSpec(
                "curve",
                curve,
                "one node of a process may keep its tcp "
                "actors to itself; this process has one already",
            )
        self._owns_dir = runtime_dir is None
        if runtime_dir is None:
            runtime_dir = create_runtime_dir()
        else:
            check_private(runtime_dir)
        self.runtime_dir = runtime_dir
        self._curve: tuple[bytes, bytes] | None = None
        self._lives = Lives()
        self._tokens = itertools.count(1)
        self._names_seen = itertools.count(1)
        self._closed = False
        self.counters = {"undeliverable_notices": 0, "malformed": 0}
        try:
            self.endpoint = ipc_endpoint(runtime_dir, f"node:{name}", "node")
            if curve:
                self._curve = self._runtime.curve = zmq.curve_keypair()
            self._forkserver = ForkserverClient(name, preload, log_level)
            try:
                self._service = NodeService(self)
                self._service.start()
            except BaseException:
                self._forkserver.close()
                raise
        except BaseException:  # nothing of this node stays: its directory, its CURVE keys
            self._release_process_resources()
            raise
        self._runtime.nodes[self.endpoint] = self

    @property
    def forkserver_pid(self) -> int:
        """The pid of this node's forkserver (the parent of every actor process)."""
        return self._forkserver.pid

    # -- spawning ------------------------------------------------------------------------

    def spawn(
        self,
        actor_class: type[ProcessActor],
        *args: Any,
        name: str | None = None,
        transport: str = "ipc",
        host: str = "127.0.0.1",
        mailbox_size: int | None = None,
        max_batch: int | None = None,
        title: str | None = None,
        start_timeout_s: float | None = None,
        **kwargs: Any,
    ) -> ActorRef:
        """Start ``actor_class(*args, **kwargs)`` in a new process; return its ref once ready.

        ``name`` registers the actor (default: the class name and a number). ``transport``
        is ``"ipc"`` (a socket in the runtime directory, which only this user can reach)
        or ``"tcp"`` (a free port on ``host``, loopback unless told otherwise; any local
        user can reach it unless the node was made with ``curve=True``). ``mailbox_size`` and
        ``max_batch`` override the class's. ``title`` replaces the name in the process title.
        """
        if not (isinstance(actor_class, type) and issubclass(actor_class, ProcessActor)):
            raise InvalidSpec("actor_class", actor_class, "must be a ProcessActor subclass")
        if transport not in _TRANSPORTS:
            raise InvalidSpec("transport", transport, f"must be one of {_TRANSPORTS}")
        if name is None:
            name = f"{actor_class.__name__}-{next(self._names_seen)}"
        if not isinstance(name, str) or not name:
            raise InvalidSpec("name", name, "must be a non-empty string")
        held = self.registry.whereis(name)
        if held is not None:
            raise InvalidSpec("name", name, f"is already registered to {held!r}")
        options: dict[str, Any] = {}
        for option, value in (("mailbox_size", mailbox_size), ("max_batch", max_batch)):
            if value is not None:
                if not isinstance(value, int) or value < 1:
                    raise InvalidSpec(option, value, "must be a positive integer")
                options[option] = value
        if title is not None:
            options["title"] = title
        if self._curve is not None:
            options["curve"] = self._curve
        if transport == "ipc":
            address = ipc_endpoint(self.runtime_dir, name, "data")
            control = ipc_endpoint(self.runtime_dir, name, "ctl")
        else:
            address = control = f"tcp://{host}:*"
        return self._spawn_order(
            actor_class, args, kwargs, name, address, control, options, start_timeout_s
        )

    def restart(self, ref: ActorRef, start_timeout_s: float | None = None) -> ActorRef:
        """Spawn ``ref``'s actor again, same arguments and addresses, next incarnation.

        The incarnation ``ref`` names must have exited (stop it first).
        """
        life = self._lives.newest_at(ref.address)
        if life is None:
            raise InvalidSpec("ref", ref, "was not spawned by this node")
        if life.down is None:
            raise InvalidSpec("ref", ref, "is still alive: stop it before restarting it")
        order = life.order
        return self._spawn_order(
            order.actor_class,
            order.args,
            order.kwargs,
            order.name,
            life.ref.address,
            life.ref.control,
            order.options,
            start_timeout_s,
        )

    def _spawn_order(
        self,
        actor_class: type[ProcessActor],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        name: str,
        address: str,
        control: str,
        options: dict[str, Any],
        start_timeout_s: float | None,
    ) -> ActorRef:
        if self._closed:
            raise SpawnError(f"node {self.name} is closed")
        timeout = self.start_timeout_s if start_timeout_s is None else start_timeout_s
        token = next(self._tokens)
        incarnation = self._lives.next_incarnation(address)
        order = SpawnOrder(
            actor_class,
            tuple(args),
            dict(kwargs),
            name,
            incarnation,
            address,
            control,
            self.endpoint,
            token,
            options,
        )
        try:
            pickled = pickle.dumps(order)
        except Exception as exc:
            raise InvalidSpec("args", args, f"cannot be handed to a child: {exc}") from exc
        peers = self._live_peers(args, kwargs)
        pending = self._lives.expect(token, order)
        try:
            self._forkserver.spawn(token, self.endpoint, pickled, peers)
        except OSError as exc:
            self._lives.give_up(token)
            raise SpawnError(f"{name}: the forkserver refused the order: {exc}") from exc
        if not pending.done.wait(timeout):
            self._lives.give_up(token)
            if pending.pid:
                self._forkserver.signal(pending.pid, signal.SIGKILL)
            raise SpawnError(f"{name} was not ready within {timeout} s")
        if pending.error is not None or pending.ref is None:
            raise SpawnError(f"{name} failed to start: {pending.error}")
        return pending.ref

    def _live_peers(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, ...]:
        """The endpoints of this node's live actors that a spawn order's arguments name
        (``_forkserver.peer_refs``), each once: a dead one's would have a spare try to
        connect again and again for nothing."""
        endpoints: dict[str, None] = {}
        for ref in _forkserver.peer_refs(args, kwargs):
            life = self._lives.newest_at(ref.address)
            if life is not None and life.down is None:
                endpoints[ref.address] = None
        return tuple(endpoints)

    def _report_ready(self, token: int, address: str, control: str, pid: int) -> None:
        """A spawned process is ready (the service heard its READY): hand out its ref."""
        ready = self._lives.ready(token, address, control, pid, self.endpoint)
        if ready is None:
            return
        pending, life = ready
        self._runtime.mark_alive(address, life.ref.incarnation)
        self.registry.register(life.order.name, life.ref, replace=True)
        pending.ref = life.ref
        pending.done.set()

    # -- watching ------------------------------------------------------------------------

    def monitor(self, target: ActorRef, notify: Notify | ActorRef | None = None) -> Monitor:
        """Watch ``target``'s incarnation; see ``warren.actors.monitor`` for ``notify``."""
        if isinstance(notify, ActorRef):
            watcher = notify
            monitor = Monitor(
                target, lambda down: self._notify_actor(watcher, wire.DOWN, down), watcher
            )
        else:
            monitor = Monitor(target, notify)
        down = self._lives.watch(target, monitor)
        if down is not None:
            monitor.resolve(down)
        return monitor

    def demonitor(self, monitor: Monitor) -> None:
        """Cancel ``monitor``: its notify is not called any more."""
        monitor.cancel()
        self._lives.unwatch(monitor)

    def link(self, first: ActorRef, second: ActorRef) -> None:
        """When either incarnation dies abnormally, the other gets an ``Exit``.

        An actor that does not trap exits stops on it (``EXIT_LINKED``). Linking to an
        incarnation that is already dead sends the ``Exit`` at once.
        """
        for receiver, down in self._lives.link(first, second):
            if _abnormal(down):
                self._notify_actor(receiver, wire.EXIT, Exit(down.ref, down.exitcode, down.signal))

    def whereis(self, name: str) -> ActorRef | None:
        """The ref registered under ``name`` in this node, or ``None``."""
        return self.registry.whereis(name)

    def monitor_named(self, watcher: ActorRef, names: list[str]) -> list[ActorRef | None]:
        """For each name, the ref registered under it now, whose incarnation ``watcher``
        then monitors (its ``Down`` at once if that one has exited since); ``None``, and
        nothing monitored, for a name nobody holds."""
        refs = [self.registry.whereis(name) for name in names]
        for ref in refs:
            if ref is not None:
                self.monitor(ref, notify=watcher)
        return refs

    def actors(self) -> list[ActorRef]:
        """Refs of every incarnation alive now."""
        return [life.ref for life in self._lives.alive()]

    def _report_down(self, ended: Ended) -> None:
        """An incarnation has exited (the service heard it from the forkserver): forget its
        name, resolve its monitors, and send an ``Exit`` to its links if it died abnormally."""
        life, down = ended.life, ended.down
        self._runtime.mark_dead(life.ref.address, life.ref.incarnation)
        self.registry.unregister(life.ref.name, life.ref)
        life.exited.set()
        for monitor in ended.monitors:
            monitor.resolve(down)
        if _abnormal(down):
            notice = Exit(life.ref, down.exitcode, down.signal)
            for other in ended.links:
                self._notify_actor(other, wire.EXIT, notice)

    def _notify_actor(self, receiver: ActorRef, kind: int, notice: Down | Exit) -> None:
        channel = self._runtime.channel(receiver.control)
        try:
            channel.send([kind, receiver.incarnation, 0, notice], 0)
        except ActorError:
            self.counters["undeliverable_notices"] += 1
            logger.warning(
                "node %s: could not tell %s that %s is down",
                self.name,
                receiver.name,
                notice.ref.name,
            )

    # -- stopping ------------------------------------------------------------------------

    def stop(
        self,
        ref: ActorRef,
        timeout: float = DEFAULT_STOP_TIMEOUT_S,
        kill_if: Callable[[int], bool] | None = None,
    ) -> Down:
        """Stop request, SIGTERM after ``timeout`` s, SIGKILL after ``timeout`` s more;
        SIGKILL at once whenever ``kill_if(pid)`` holds (see the module docstring)."""
        life = self._lives.to_stop(ref)
        if isinstance(life, Down):
            return life
        if kill_if is None or not self._killed_if(life, kill_if):
            self._request_stop(life)
        for signum, wait_s in (
            (signal.SIGTERM, timeout),
            (signal.SIGKILL, timeout),
            (None, EXIT_AFTER_KILL_S),
        ):
            if self._exited_within(life, wait_s, kill_if):
                break
            if signum is not None:
                self._forkserver.signal(life.ref.pid, signum)
        if life.down is None:
            raise ActorError(f"{life.ref.name} (pid {life.ref.pid}) did not exit")
        return life.down

    def _exited_within(
        self, life: Life, wait_s: float, kill_if: Callable[[int], bool] | None
    ) -> bool:
        """Whether ``life`` exits within ``wait_s``; with ``kill_if``, checked every
        ``STOP_CHECK_S`` meanwhile, SIGKILLed when it holds."""
        if kill_if is None:
            return life.exited.wait(wait_s)
        deadline = time.monotonic() + wait_s
        while not life.exited.wait(max(0.0, min(STOP_CHECK_S, deadline - time.monotonic()))):
            if self._killed_if(life, kill_if):
                return life.exited.wait(EXIT_AFTER_KILL_S)
            if time.monotonic() >= deadline:
                return False
        return True

    def _killed_if(self, life: Life, kill_if: Callable[[int], bool]) -> bool:
        """SIGKILL ``life``'s process if ``kill_if`` holds for it; whether it did."""
        if not kill_if(life.ref.pid):
            return False
        self._forkserver.signal(life.ref.pid, signal.SIGKILL)
        return True

    def _request_stop(self, life: Life) -> None:
        channel = self._runtime.channel(life.ref.control)
        try:
            channel.send([wire.STOP, life.ref.incarnation, 0, None], 0)
        except ActorError:
            logger.warning(
                "node %s: %s's control mailbox is full; escalating", self.name, life.ref.name
            )

    def kill(self, ref: ActorRef, signum: int = signal.SIGKILL) -> None:
        """Send ``signum`` to ``ref``'s process if it is still alive."""
        self._forkserver.signal(ref.pid, signum)

    def close(self, timeout: float = DEFAULT_STOP_TIMEOUT_S) -> None:
        """Stop every actor, then the forkserver and the service thread (idempotent)."""
        if self._closed:
            return
        self._closed = True
        lives = self._lives.alive()
        for life in lives:
            self._request_stop(life)
        deadline = time.monotonic() + timeout
        for life in lives:
            if not life.exited.wait(max(0.0, deadline - time.monotonic())):
                self._forkserver.signal(life.ref.pid, signal.SIGKILL)
        for life in lives:
            life.exited.wait(EXIT_AFTER_KILL_S)
        self._service.stop(EXIT_AFTER_KILL_S)
        self._forkserver.close()
        self._runtime.nodes.pop(self.endpoint, None)
        every_life = self._lives.newest()
        self._runtime.forget(
            [self.endpoint]
            + [life.ref.address for life in every_life]
            + [life.ref.control for life in every_life]
        )
        self._release_process_resources()

    def _release_process_resources(self) -> None:
        """Give back what this node holds in its process beyond its children: the CURVE
        keys of the process's runtime, and the runtime directory it made."""
        if self._curve is not None and self._runtime.curve == self._curve:
            self._runtime.curve = None
        if self._owns_dir:
            shutil.rmtree(self.runtime_dir, ignore_errors=True)

    def __enter__(self) -> Node:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Node {self.name} {self.runtime_dir}>"


def _abnormal(down: Down) -> bool:
    return down.signal is not None or (down.exitcode is not None and down.exitcode != 0)

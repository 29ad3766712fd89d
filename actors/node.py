"""``Node``: owns a set of actor processes — their forkserver, addresses, registry and deaths.

A node is an object in the application's process (the "node process"). It owns:

- a private runtime directory for ipc mailboxes (``warren.actors.runtime_dir``), removed at close
  when the node created it;
- one forkserver process (``warren.actors._forkserver``) that forks every actor process;
- the node service: a ROUTER at ``ipc://<runtime dir>/node`` and one thread that reads it,
  together with the forkserver's reports. Actor processes report READY/FAILED there and
  ask for monitors, links, registry look-ups and stops;
- a ``Registry`` of names (per node: two nodes never see each other's names);
- the table of incarnations: for each address, the incarnation living there, its pid,
  its monitors and links, and the ``Down`` of every incarnation that has exited.

Spawning: ``spawn`` validates its arguments, pickles a ``SpawnOrder`` and hands it to the
forkserver, then waits until the child reports READY (mailboxes bound, ``on_start`` done)
or FAILED (``SpawnError`` with the remote type name and message), or until
``start_timeout_s`` (the child is killed and ``SpawnError`` raised). ``restart`` spawns
the same order again at the same addresses under the next incarnation number; old
unpinned refs reach the new incarnation.

Stopping: ``stop`` sends a stop request on the control channel, sends SIGTERM after
``timeout`` seconds, SIGKILL after ``timeout`` more, and returns the ``Down``. ``close``
stops every actor (requests first, in parallel; then SIGKILL through the forkserver),
stops the forkserver and the service thread, and removes the runtime directory: after
``close`` no process of this node exists.

Races and their answers:
- An actor may exit before its READY is read (READY and the forkserver's report travel on
  different sockets): an exit of a still-pending spawn fails the spawn after a short grace
  period that lets a FAILED message carrying the exception arrive first.
- Signals go through the forkserver, which signals only its own unreaped children, so a
  pid recycled after an exit is never hit.
- The service thread never blocks: monitors' callbacks run there and must be short; a stop
  requested by an actor process runs on a thread of its own; ``Down``/``Exit`` notices to
  actors are sent without waiting (a full control mailbox is logged and counted).
- The forkserver dying (it should not) kills every actor (PDEATHSIG); the node reports a
  ``Down`` for each and refuses further spawns.
- A process forked from the node process (a Spark worker, say) closes its inherited copy
  of the forkserver socket at once, so the forkserver still sees the node's EOF.
"""

from __future__ import annotations

import collections
import functools
import itertools
import logging
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import zmq

from warren.actors import _forkserver, _wire
from warren.actors._loop import SpawnOrder
from warren.actors._runtime import drain_wake_pipe, runtime
from warren.actors.actor import ProcessActor
from warren.actors.codec import Decoder, Encoder
from warren.actors.errors import ActorError, CodecError, InvalidSpec, SpawnError
from warren.actors.exitcodes import describe
from warren.actors.messages import Down, Exit
from warren.actors.monitor import Monitor, Notify
from warren.actors.ref import ActorRef
from warren.actors.registry import Registry
from warren.actors.runtime_dir import check_private, create_runtime_dir, ipc_endpoint

logger = logging.getLogger("warren.actors")

# Modules every forkserver imports before its first fork, so children start warm.
DEFAULT_PRELOAD = ("warren.actors", "warren.actors._loop", "zmq", "msgpack", "pykka", "psutil",
                   "setproctitle")
# How long spawn waits for READY (seconds).
DEFAULT_START_TIMEOUT_S = 30.0
# How long a stop waits at each step: request, then SIGTERM (seconds).
DEFAULT_STOP_TIMEOUT_S = 5.0
# How long we wait for the exit of a process sent SIGKILL (seconds).
_KILL_WAIT_S = 10.0
# How long an exit that beat its READY/FAILED waits for a FAILED message (seconds).
_EXIT_BEFORE_READY_GRACE_S = 0.2
# How long the forkserver may take to import its preloads (seconds).
_FORKSERVER_BOOT_TIMEOUT_S = 60.0
_TRANSPORTS = ("ipc", "tcp")

_live_nodes: weakref.WeakSet[Node] = weakref.WeakSet()


@dataclass
class _Pending:
    """A spawn between the order and READY/FAILED."""

    order: SpawnOrder
    done: threading.Event = field(default_factory=threading.Event)
    pid: int = 0
    ref: ActorRef | None = None
    error: str | None = None
    exit_status: int | None = None


@dataclass
class _Life:
    """One incarnation that has reported READY."""

    ref: ActorRef
    order: SpawnOrder
    exited: threading.Event = field(default_factory=threading.Event)
    down: Down | None = None
    monitors: list[Monitor] = field(default_factory=list)
    links: list[ActorRef] = field(default_factory=list)


class Node:
    """Spawns, watches and stops actor processes (see the module docstring)."""

    def __init__(self, name: str = "warren", runtime_dir: str | None = None,
                 preload: tuple[str, ...] = (),
                 start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
                 log_level: int | str | None = None) -> None:
        if _forkserver.importing_main():
            raise SpawnError("a Node was started while the forkserver imported the main "
                             "script: start nodes under `if __name__ == \"__main__\":`")
        if not name or not isinstance(name, str):
            raise InvalidSpec("name", name, "must be a non-empty string")
        if start_timeout_s <= 0:
            raise InvalidSpec("start_timeout_s", start_timeout_s, "must be positive")
        if log_level is None:
            log_level = logging.getLogger().getEffectiveLevel()
        elif isinstance(log_level, str) and log_level.upper() in logging.getLevelNamesMapping():
            log_level = logging.getLevelNamesMapping()[log_level.upper()]
        if type(log_level) is not int:
            raise InvalidSpec("log_level", log_level, "a logging level: DEBUG, INFO, "
                              "WARNING, ERROR, or its number")
        self.log_level = log_level
        self.name = name
        self.registry = Registry()
        self.start_timeout_s = start_timeout_s
        self._owns_dir = runtime_dir is None
        if runtime_dir is None:
            runtime_dir = create_runtime_dir()
        else:
            check_private(runtime_dir)
        self.runtime_dir = runtime_dir
        self.endpoint = ipc_endpoint(runtime_dir, f"node:{name}", "node")
        self._runtime = runtime()
        self._lock = threading.Lock()
        self._tokens = itertools.count(1)
        self._pending: dict[int, _Pending] = {}
        self._lives_by_pid: dict[int, _Life] = {}
        self._lives_by_address: dict[str, _Life] = {}
        self._downs: dict[tuple[str, int], Down] = {}
        self._incarnations: dict[str, int] = {}
        self._names_seen = itertools.count(1)
        self._posted: collections.deque[Callable[[], None]] = collections.deque()
        self._closed = False
        self._service_done = False
        self._forkserver_gone = False
        self.counters = {"undeliverable_notices": 0, "malformed": 0}
        self._router = self._runtime.context.socket(zmq.ROUTER)
        self._router.linger = _wire.LINGER_MS
        self._router.router_mandatory = 1
        self._router.router_handover = 1
        self._router.bind(self.endpoint)
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_read, False)
        os.set_blocking(self._wake_write, False)
        try:
            self._start_forkserver(preload)
        except BaseException:
            self._router.close(linger=0)
            self._close_pipe()
            raise
        self._fs_lock = threading.Lock()
        self._thread = threading.Thread(target=self._service, name=f"warren-node-{name}",
                                        daemon=True)
        self._thread.start()
        self._runtime.nodes[self.endpoint] = self
        _live_nodes.add(self)

    # -- forkserver ----------------------------------------------------------------------

    def _start_forkserver(self, preload: tuple[str, ...]) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        bootstrap = f"from warren.actors._forkserver import serve; serve({theirs.fileno()})"
        self._forkserver = subprocess.Popen([sys.executable, "-c", bootstrap],
                                            pass_fds=[theirs.fileno()], close_fds=True,
                                            stdin=subprocess.DEVNULL)
        theirs.close()
        self._fs_socket = ours
        main_path = getattr(sys.modules.get("__main__"), "__file__", None)
        if main_path is not None and not os.path.isfile(main_path):
            main_path = None
        boot = pickle.dumps((list(sys.path), list(DEFAULT_PRELOAD) + list(preload),
                             main_path, f"warren: forkserver {self.name}", os.getpid(),
                             self.log_level))
        ours.sendall(_forkserver.HEADER.pack(len(boot), _forkserver.BOOT) + boot)
        ours.settimeout(_FORKSERVER_BOOT_TIMEOUT_S)
        try:
            report = ours.recv(_forkserver.REPORT.size, socket.MSG_WAITALL)
        except OSError:
            report = b""
        ours.settimeout(None)
        if len(report) != _forkserver.REPORT.size:
            self._forkserver.kill()
            self._forkserver.wait()
            ours.close()
            raise SpawnError(f"the forkserver of node {self.name} did not start; its error "
                             f"is on stderr (a preload module {list(preload)} failed, or the "
                             f"main script starts a node without an "
                             f"`if __name__ == \"__main__\":` guard)")
        self._fs_buffer = bytearray()

    def _fs_send(self, kind: int, payload: bytes) -> None:
        with self._fs_lock:
            if self._forkserver_gone:
                raise SpawnError(f"the forkserver of node {self.name} is gone")
            self._fs_socket.sendall(_forkserver.HEADER.pack(len(payload), kind) + payload)

    def _signal(self, pid: int, signum: int) -> None:
        try:
            self._fs_send(_forkserver.KILL, _forkserver.KILL_BODY.pack(pid, signum))
        except (OSError, SpawnError):
            logger.warning("node %s: could not signal pid %d", self.name, pid)

    # -- spawning ------------------------------------------------------------------------

    def spawn(self, actor_class: type[ProcessActor], *args: Any, name: str | None = None,
              transport: str = "ipc", host: str = "127.0.0.1",
              mailbox_size: int | None = None, max_batch: int | None = None,
              title: str | None = None, start_timeout_s: float | None = None,
              **kwargs: Any) -> ActorRef:
        """Start ``actor_class(*args, **kwargs)`` in a new process; return its ref once ready.

        ``name`` registers the actor (default: the class name and a number). ``transport``
        is ``"ipc"`` (a socket in the runtime directory) or ``"tcp"`` (a free port on
        ``host``, loopback unless told otherwise). ``mailbox_size`` and ``max_batch``
        override the class's. ``title`` replaces the name in the process title.
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
        if transport == "ipc":
            address = ipc_endpoint(self.runtime_dir, name, "data")
            control = ipc_endpoint(self.runtime_dir, name, "ctl")
        else:
            address = control = f"tcp://{host}:*"
        return self._spawn_order(actor_class, args, kwargs, name, address, control, options,
                                 start_timeout_s)

    def restart(self, ref: ActorRef, start_timeout_s: float | None = None) -> ActorRef:
        """Spawn ``ref``'s actor again, same arguments and addresses, next incarnation.

        The incarnation ``ref`` names must have exited (stop it first).
        """
        with self._lock:
            life = self._lives_by_address.get(ref.address)
        if life is None:
            raise InvalidSpec("ref", ref, "was not spawned by this node")
        if life.down is None:
            raise InvalidSpec("ref", ref, "is still alive: stop it before restarting it")
        order = life.order
        return self._spawn_order(order.actor_class, order.args, order.kwargs, order.name,
                                 life.ref.address, life.ref.control, order.options,
                                 start_timeout_s)

    def _spawn_order(self, actor_class: type[ProcessActor], args: tuple[Any, ...],
                     kwargs: dict[str, Any], name: str, address: str, control: str,
                     options: dict[str, Any], start_timeout_s: float | None) -> ActorRef:
        if self._closed:
            raise SpawnError(f"node {self.name} is closed")
        timeout = self.start_timeout_s if start_timeout_s is None else start_timeout_s
        token = next(self._tokens)
        with self._lock:
            incarnation = self._incarnations.get(address, 0) + 1
            if not address.endswith(":*"):
                self._incarnations[address] = incarnation
        order = SpawnOrder(actor_class, tuple(args), dict(kwargs), name, incarnation,
                           address, control, self.endpoint, token, options)
        try:
            pickled = pickle.dumps(order)
        except Exception as exc:
            raise InvalidSpec("args", args, f"cannot be handed to a child: {exc}") from exc
        node_endpoint = self.endpoint.encode()
        pending = _Pending(order)
        with self._lock:
            self._pending[token] = pending
        try:
            self._fs_send(_forkserver.SPAWN, _forkserver.SPAWN_HEAD.pack(
                token, len(node_endpoint)) + node_endpoint + pickled)
        except OSError as exc:
            with self._lock:
                self._pending.pop(token, None)
            raise SpawnError(f"{name}: the forkserver refused the order: {exc}") from exc
        if not pending.done.wait(timeout):
            with self._lock:
                self._pending.pop(token, None)
            if pending.pid:
                self._signal(pending.pid, signal.SIGKILL)
            raise SpawnError(f"{name} was not ready within {timeout} s")
        if pending.error is not None or pending.ref is None:
            raise SpawnError(f"{name} failed to start: {pending.error}")
        return pending.ref

    # -- watching ------------------------------------------------------------------------

    def monitor(self, target: ActorRef, notify: Notify | ActorRef | None = None) -> Monitor:
        """Watch ``target``'s incarnation; see ``warren.actors.monitor`` for ``notify``."""
        if isinstance(notify, ActorRef):
            watcher = notify
            monitor = Monitor(target, lambda down: self._notify_actor(watcher, _wire.DOWN, down),
                              watcher)
        else:
            monitor = Monitor(target, notify)
        with self._lock:
            life = self._life_of(target)
            down = self._down_of(target, life)
            if down is None and life is not None:
                life.monitors.append(monitor)
        if down is not None:
            monitor.resolve(down)
        return monitor

    def demonitor(self, monitor: Monitor) -> None:
        """Cancel ``monitor``: its notify is not called any more."""
        monitor.cancel()
        with self._lock:
            life = self._life_of(monitor.target)
            if life is not None and monitor in life.monitors:
                life.monitors.remove(monitor)

    def link(self, first: ActorRef, second: ActorRef) -> None:
        """When either incarnation dies abnormally, the other gets an ``Exit``.

        An actor that does not trap exits stops on it (``EXIT_LINKED``). Linking to an
        incarnation that is already dead sends the ``Exit`` at once.
        """
        notices: list[tuple[ActorRef, Down]] = []
        with self._lock:
            for one, other in ((first, second), (second, first)):
                life = self._life_of(one)
                down = self._down_of(one, life)
                if down is not None:
                    if _abnormal(down):
                        notices.append((other, down))
                elif life is not None:
                    life.links.append(other)
        for receiver, down in notices:
            self._notify_actor(receiver, _wire.EXIT, Exit(down.ref, down.exitcode, down.signal))

    def whereis(self, name: str) -> ActorRef | None:
        """The ref registered under ``name`` in this node, or ``None``."""
        return self.registry.whereis(name)

    def actors(self) -> list[ActorRef]:
        """Refs of every incarnation alive now."""
        with self._lock:
            return [life.ref for life in self._lives_by_pid.values()]

    def _life_of(self, ref: ActorRef) -> _Life | None:
        life = self._lives_by_address.get(ref.address)
        if life is None or life.ref.incarnation != ref.incarnation:
            return None
        return life

    def _down_of(self, ref: ActorRef, life: _Life | None) -> Down | None:
        """The incarnation's Down, or None while ``life`` (its record) is alive."""
        if life is not None:
            return life.down
        return self._remembered_down(ref)

    def _remembered_down(self, ref: ActorRef) -> Down:
        """The Down of a past incarnation ("no such process" for one never seen)."""
        return self._downs.get((ref.address, ref.incarnation), Down(ref, None, None))

    def _notify_actor(self, receiver: ActorRef, kind: int, notice: Down | Exit) -> None:
        channel = self._runtime.channel(receiver.control)
        try:
            channel.send(channel.encoder.encode([kind, receiver.incarnation, 0, notice]), 0)
        except ActorError:
            self.counters["undeliverable_notices"] += 1
            logger.warning("node %s: could not tell %s that %s is down", self.name,
                           receiver.name, notice.ref.name)

    # -- stopping ------------------------------------------------------------------------

    def stop(self, ref: ActorRef, timeout: float = DEFAULT_STOP_TIMEOUT_S) -> Down:
        """Stop request, SIGTERM after ``timeout`` s, SIGKILL after ``timeout`` s more."""
        with self._lock:
            life = self._lives_by_address.get(ref.address)
            if life is not None and ref.pinned and life.ref.incarnation != ref.incarnation:
                life = None
            if life is None:
                return self._remembered_down(ref)
        if life.down is not None:
            return life.down
        channel = self._runtime.channel(life.ref.control)
        try:
            channel.send(channel.encoder.encode(
                [_wire.STOP, life.ref.incarnation, 0, None]), 0)
        except ActorError:
            logger.warning("node %s: %s's control mailbox is full; escalating", self.name,
                           life.ref.name)
        for signum, wait_s in ((signal.SIGTERM, timeout), (signal.SIGKILL, timeout),
                               (None, _KILL_WAIT_S)):
            if life.exited.wait(wait_s):
                break
            if signum is not None:
                self._signal(life.ref.pid, signum)
        if life.down is None:
            raise ActorError(f"{life.ref.name} (pid {life.ref.pid}) did not exit")
        return life.down

    def kill(self, ref: ActorRef, signum: int = signal.SIGKILL) -> None:
        """Send ``signum`` to ``ref``'s process if it is still alive."""
        self._signal(ref.pid, signum)

    def close(self, timeout: float = DEFAULT_STOP_TIMEOUT_S) -> None:
        """Stop every actor, then the forkserver and the service thread (idempotent)."""
        if self._closed:
            return
        self._closed = True
        with self._lock:
            lives = list(self._lives_by_pid.values())
        for life in lives:
            channel = self._runtime.channel(life.ref.control)
            try:
                channel.send(channel.encoder.encode(
                    [_wire.STOP, life.ref.incarnation, 0, None]), 0)
            except ActorError:
                pass  # a full control mailbox: the SIGKILL below still stops it
        deadline = time.monotonic() + timeout
        for life in lives:
            if not life.exited.wait(max(0.0, deadline - time.monotonic())):
                self._signal(life.ref.pid, signal.SIGKILL)
        for life in lives:
            life.exited.wait(_KILL_WAIT_S)
        self._service_done = True
        self._post(lambda: None)
        self._thread.join(_KILL_WAIT_S)
        try:
            self._fs_socket.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # the forkserver already closed its end
        self._fs_socket.close()
        try:
            self._forkserver.wait(_KILL_WAIT_S)
        except subprocess.TimeoutExpired:
            self._forkserver.kill()
            self._forkserver.wait()
        self._close_pipe()
        self._runtime.nodes.pop(self.endpoint, None)
        with self._lock:
            every_life = list(self._lives_by_address.values())
        self._runtime.forget([self.endpoint] + [life.ref.address for life in every_life]
                             + [life.ref.control for life in every_life])
        if self._owns_dir:
            shutil.rmtree(self.runtime_dir, ignore_errors=True)

    def _close_pipe(self) -> None:
        for fd in (self._wake_read, self._wake_write):
            try:
                os.close(fd)
            except OSError:
                pass  # closed already

    def __enter__(self) -> Node:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Node {self.name} {self.runtime_dir}>"

    # -- the service thread --------------------------------------------------------------

    def _post(self, callback: Callable[[], None]) -> None:
        self._posted.append(callback)
        try:
            os.write(self._wake_write, b"\0")
        except (BlockingIOError, OSError):
            pass  # full: a wake-up is pending already; closed: the thread has ended

    def _service(self) -> None:
        poller = zmq.Poller()
        poller.register(self._router, zmq.POLLIN)
        poller.register(self._fs_socket.fileno(), zmq.POLLIN)
        poller.register(self._wake_read, zmq.POLLIN)
        decoder, encoder = Decoder(), Encoder()
        fs_fd = self._fs_socket.fileno()
        timers: list[tuple[float, Callable[[], None]]] = []
        while True:
            wait_ms = 1000
            if timers:
                wait_ms = max(0, int((min(t for t, _ in timers) - time.monotonic()) * 1000) + 1)
            events = dict(poller.poll(wait_ms))
            try:
                if self._router in events:
                    self._serve_requests(decoder, encoder, timers)
                if fs_fd in events and not self._forkserver_gone:
                    self._read_forkserver(timers)
                if self._wake_read in events:
                    drain_wake_pipe(self._wake_read)
                while self._posted:
                    self._posted.popleft()()
                now = time.monotonic()
                for due, callback in [t for t in timers if t[0] <= now]:
                    timers.remove((due, callback))
                    callback()
            except Exception:
                logger.exception("node %s: the service thread caught an error", self.name)
            if self._service_done:
                break
        self._router.close(linger=_wire.LINGER_MS)

    def _read_forkserver(self, timers: list[tuple[float, Callable[[], None]]]) -> None:
        data = self._fs_socket.recv(65536)
        if not data:
            self._forkserver_lost()
            return
        buffer = self._fs_buffer
        buffer += data
        size = _forkserver.REPORT.size
        while len(buffer) >= size:
            kind, token, pid, status = _forkserver.REPORT.unpack_from(buffer)
            del buffer[:size]
            if kind == _forkserver.FORKED:
                with self._lock:
                    pending = self._pending.get(token)
                    if pending is not None:
                        pending.pid = pid
            elif kind == _forkserver.EXITED:
                self._exited(pid, status, timers)

    def _forkserver_lost(self) -> None:
        with self._fs_lock:
            self._forkserver_gone = True
        logger.error("node %s: the forkserver has gone; its actors were killed", self.name)
        with self._lock:
            pids = list(self._lives_by_pid)
            pending = list(self._pending.values())
        for pid in pids:
            self._exited(pid, -signal.SIGKILL, [])
        for spawn in pending:
            spawn.error = "the forkserver has gone"
            spawn.done.set()

    def _exited(self, pid: int, status: int, timers: list[tuple[float, Callable[[], None]]]
                ) -> None:
        exitcode, signum = (None, -status) if status < 0 else (status, None)
        with self._lock:
            life = self._lives_by_pid.pop(pid, None)
            if life is None:
                for token, pending in self._pending.items():
                    if pending.pid == pid:
                        pending.exit_status = status
                        timers.append((time.monotonic() + _EXIT_BEFORE_READY_GRACE_S,
                                       functools.partial(self._fail_pending, token)))
                return
            down = Down(life.ref, exitcode, signum)
            life.down = down
            self._downs[(life.ref.address, life.ref.incarnation)] = down
            monitors, life.monitors = life.monitors, []
            links = list(life.links)
        self._runtime.mark_dead(life.ref.address, life.ref.incarnation)
        self.registry.unregister(life.ref.name, life.ref)
        life.exited.set()
        for monitor in monitors:
            monitor.resolve(down)
        if _abnormal(down):
            notice = Exit(life.ref, exitcode, signum)
            for other in links:
                self._notify_actor(other, _wire.EXIT, notice)

    def _fail_pending(self, token: int) -> None:
        with self._lock:
            pending = self._pending.pop(token, None)
        if pending is None:
            return
        status = pending.exit_status or 0
        reason = describe(None, -status) if status < 0 else describe(status, None)
        pending.error = f"the process exited before it was ready ({reason})"
        pending.done.set()

    def _serve_requests(self, decoder: Decoder, encoder: Encoder,
                        timers: list[tuple[float, Callable[[], None]]]) -> None:
        while True:
            try:
                frames = self._router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                kind, request_id, body = decoder.decode(frames[1:])
                answer = self._answer(frames[0], kind, request_id, body, timers)
            except (CodecError, ValueError, TypeError, KeyError, IndexError,
                    AttributeError) as exc:
                self.counters["malformed"] += 1
                logger.warning("node %s: dropped a malformed request: %s", self.name, exc)
                continue
            if answer is not _NO_ANSWER:
                self._reply(encoder, frames[0], request_id, _wire.REPLY_OK, answer)

    def _reply(self, encoder: Encoder, identity: bytes, request_id: int, kind: int,
               value: Any) -> None:
        try:
            self._router.send_multipart([identity, *encoder.encode([kind, request_id, value])],
                                        zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            logger.warning("node %s: an answer could not be routed (%s)", self.name,
                           exc.strerror)

    def _answer(self, identity: bytes, kind: int, request_id: int, body: Any,
                timers: list[tuple[float, Callable[[], None]]]) -> Any:
        if kind == _wire.READY:
            token, address, control, pid = body
            self._ready(token, str(address), str(control), int(pid))
            return _NO_ANSWER
        if kind == _wire.FAILED:
            token, type_name, text, remote_tb = body
            with self._lock:
                pending = self._pending.pop(token, None)
            if pending is not None:
                pending.error = f"{type_name}: {text}"
                if remote_tb:
                    logger.error("node %s: %s failed to start:\n%s", self.name,
                                 pending.order.name, remote_tb)
                pending.done.set()
            return _NO_ANSWER
        if kind == _wire.MONITOR:
            watcher, target = body
            self.monitor(target, notify=watcher)
            return None
        if kind == _wire.DEMONITOR:
            watcher, target = body
            with self._lock:
                life = self._life_of(target)
                monitors = list(life.monitors) if life is not None else []
            for monitor in monitors:
                if monitor.watcher == watcher:
                    self.demonitor(monitor)
            return None
        if kind == _wire.LINK:
            first, second = body
            self.link(first, second)
            return None
        if kind == _wire.WHEREIS:
            return self.registry.whereis(str(body))
        if kind == _wire.REGISTER:
            name, ref = body
            self.registry.register(str(name), ref)
            return None
        if kind == _wire.STOP_ACTOR:
            ref, timeout = body
            encoder = Encoder()

            def stop_and_answer() -> None:
                down = self.stop(ref, float(timeout))
                self._post(lambda: self._reply(encoder, identity, request_id,
                                               _wire.REPLY_OK, down))

            threading.Thread(target=stop_and_answer, daemon=True,
                             name=f"warren-stop-{ref.name}").start()
            return _NO_ANSWER
        raise ValueError(f"unknown request kind {kind!r}")

    def _ready(self, token: int, address: str, control: str, pid: int) -> None:
        with self._lock:
            pending = self._pending.pop(token, None)
            if pending is None:
                return
            order = pending.order
            if order.address.endswith(":*"):
                self._incarnations[address] = order.incarnation
            ref = ActorRef(order.name, address, control, order.incarnation, pid,
                           self.endpoint)
            if pending.exit_status is not None:
                pending.error = "the process exited right after it was ready"
                pending.done.set()
                return
            life = _Life(ref, order)
            self._lives_by_pid[pid] = life
            self._lives_by_address[address] = life
        self._runtime.mark_alive(address, order.incarnation)
        self.registry.register(order.name, ref, replace=True)
        pending.ref = ref
        pending.done.set()


_NO_ANSWER = object()


def _abnormal(down: Down) -> bool:
    return down.signal is not None or (down.exitcode is not None and down.exitcode != 0)


def _forget_inherited_forkservers() -> None:
    for node in list(_live_nodes):
        try:
            node._fs_socket.close()
        except OSError:
            pass  # nothing to close in this child


os.register_at_fork(after_in_child=_forget_inherited_forkservers)

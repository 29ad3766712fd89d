"""The node service: one thread per node that hears its actor processes and its forkserver.

It polls three things: a ROUTER at ``ipc://<runtime dir>/node``, where actor processes
report READY/FAILED and ask for monitors, links, registry look-ups and stops
(``warren.actors._node_client`` is the other end; requests are ``[kind, request_id,
body]`` and answers the ordinary reply frames); the forkserver's socket, whose reports
say that a child was forked or has exited (exact code or signal); and a wake pipe, through
which other threads post callbacks that must run here (answers to be sent: only this
thread touches the ROUTER).

What it does with each: READY records the life in the node's incarnation table and
hands the ref to the waiting ``spawn``; FAILED fails that spawn with the remote error;
EXITED records the ``Down``, resolves the monitors and sends an ``Exit`` to each link of
an abnormal death; EOF from the forkserver (it should never die) reports every actor
down and refuses further spawns.

Races and bad input, each with its answer:
- The thread never blocks: monitors' callbacks run here and must be short; a stop
  requested by an actor process runs on a thread of its own and posts its answer back;
  ``Down``/``Exit`` notices to actors are sent without waiting (a full control mailbox
  is logged and counted by the node).
- An exit that beats its READY fails the spawn only after ``EXIT_BEFORE_READY_GRACE_S``,
  so a FAILED message carrying the exception, sent just before the exit, is read first.
- A request of any shape that does not decode, or names an unknown kind, is dropped,
  logged and counted (``malformed``); an exception while serving is logged and the loop
  goes on: nothing a peer sends ends this thread.
"""

from __future__ import annotations

import collections
import functools
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import zmq

from . import _forkserver, wire
from ._lives import Ended, Pending
from .codec import Decoder, Encoder
from .errors import CodecError
from .exitcodes import describe
from .process import drain_wake_pipe

if TYPE_CHECKING:
    from .node import Node

logger = logging.getLogger("warren.actors")

# How long an exit that beat its READY/FAILED waits for a FAILED message (seconds).
EXIT_BEFORE_READY_GRACE_S = 0.2
# Longest poll when no timer is due (milliseconds).
_IDLE_POLL_MS = 1000

_NO_ANSWER = object()


class NodeService:
    """The service thread of one ``Node`` (see the module docstring)."""

    def __init__(self, node: Node) -> None:
        self._node = node
        self._lives = node._lives
        self._forkserver = node._forkserver
        self._router = node._runtime.context.socket(zmq.ROUTER)
        self._router.linger = wire.LINGER_MS
        self._router.router_mandatory = 1
        self._router.router_handover = 1
        self._router.bind(node.endpoint)
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_read, False)
        os.set_blocking(self._wake_write, False)
        self._posted: collections.deque[Callable[[], None]] = collections.deque()
        self._timers: list[tuple[float, Callable[[], None]]] = []
        self._done = False
        self._thread = threading.Thread(
            target=self._serve, name=f"warren-node-{node.name}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float) -> None:
        """End the thread (it closes the ROUTER on its way out) and the wake pipe."""
        self._done = True
        self.post(lambda: None)
        self._thread.join(timeout)
        for fd in (self._wake_read, self._wake_write):
            try:
                os.close(fd)
            except OSError:
                pass  # closed already

    def post(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` on the service thread (from any thread)."""
        self._posted.append(callback)
        try:
            os.write(self._wake_write, b"\0")
        except (BlockingIOError, OSError):
            pass  # full: a wake-up is pending already; closed: the thread has ended

    # -- the loop ------------------------------------------------------------------------

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self._router, zmq.POLLIN)
        poller.register(self._forkserver.fileno(), zmq.POLLIN)
        poller.register(self._wake_read, zmq.POLLIN)
        decoder, encoder = Decoder(), Encoder()
        fs_fd = self._forkserver.fileno()
        timers = self._timers
        while True:
            wait_ms = _IDLE_POLL_MS
            if timers:
                wait_ms = max(0, int((min(t for t, _ in timers) - time.monotonic()) * 1000) + 1)
            events = dict(poller.poll(wait_ms))
            try:
                if self._router in events:
                    self._serve_requests(decoder, encoder)
                if fs_fd in events and not self._forkserver.gone:
                    self._read_forkserver()
                if self._wake_read in events:
                    drain_wake_pipe(self._wake_read)
                while self._posted:
                    self._posted.popleft()()
                now = time.monotonic()
                for due, callback in [t for t in timers if t[0] <= now]:
                    timers.remove((due, callback))
                    callback()
            except Exception:
                logger.exception("node %s: the service thread caught an error", self._node.name)
            if self._done:
                break
        self._router.close(linger=wire.LINGER_MS)

    # -- the forkserver's reports --------------------------------------------------------

    def _read_forkserver(self) -> None:
        reports = self._forkserver.read_reports()
        if reports is None:
            self._forkserver_lost()
            return
        for kind, token, pid, status in reports:
            if kind == _forkserver.FORKED:
                self._lives.forked(token, pid)
            elif kind == _forkserver.EXITED:
                self._exited(pid, status)

    def _forkserver_lost(self) -> None:
        self._forkserver.mark_gone()
        logger.error("node %s: the forkserver has gone; its actors were killed", self._node.name)
        for pid in self._lives.every_pid():
            self._exited(pid, -signal.SIGKILL)
        for pending in self._lives.every_pending():
            pending.fail("the forkserver has gone")

    def _exited(self, pid: int, status: int) -> None:
        ended = self._lives.exited(pid, status)
        if isinstance(ended, Pending):
            self._timers.append(
                (
                    time.monotonic() + EXIT_BEFORE_READY_GRACE_S,
                    functools.partial(self._fail_pending, ended.token),
                )
            )
        elif isinstance(ended, Ended):
            self._node._report_down(ended)

    def _fail_pending(self, token: int) -> None:
        pending = self._lives.give_up(token)
        if pending is None:
            return
        status = pending.exit_status or 0
        reason = describe(None, -status) if status < 0 else describe(status, None)
        pending.fail(f"the process exited before it was ready ({reason})")

    # -- requests ------------------------------------------------------------------------

    def _serve_requests(self, decoder: Decoder, encoder: Encoder) -> None:
        while True:
            try:
                frames = self._router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                kind, request_id, body = decoder.decode(frames[1:])
                answer = self._answer(frames[0], kind, request_id, body)
            except (CodecError, ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
                self._node.counters["malformed"] += 1
                logger.warning("node %s: dropped a malformed request: %s", self._node.name, exc)
                continue
            if answer is not _NO_ANSWER:
                self._reply(encoder, frames[0], request_id, wire.REPLY_OK, answer)

    def _reply(
        self, encoder: Encoder, identity: bytes, request_id: int, kind: int, value: Any
    ) -> None:
        try:
            self._router.send_multipart(
                [identity, *encoder.encode([kind, request_id, value])], zmq.NOBLOCK
            )
        except zmq.ZMQError as exc:
            logger.log(
                wire.unroutable_log_level(exc.errno),
                "node %s: an answer could not be routed (%s)",
                self._node.name,
                exc.strerror,
            )

    def _answer(self, identity: bytes, kind: int, request_id: int, body: Any) -> Any:
        node = self._node
        if kind == wire.READY:
            token, address, control, pid = body
            node._report_ready(token, str(address), str(control), int(pid))
            return _NO_ANSWER
        if kind == wire.FAILED:
            token, type_name, text, remote_tb = body
            pending = self._lives.give_up(token)
            if pending is not None:
                if remote_tb:
                    logger.error(
                        "node %s: %s failed to start:\n%s", node.name, pending.order.name, remote_tb
                    )
                pending.fail(f"{type_name}: {text}")
            return _NO_ANSWER
        if kind == wire.MONITOR:
            watcher, target = body
            node.monitor(target, notify=watcher)
            return None
        if kind == wire.DEMONITOR:
            watcher, target = body
            for monitor in self._lives.monitors_of(target):
                if monitor.watcher == watcher:
                    node.demonitor(monitor)
            return None
        if kind == wire.LINK:
            first, second = body
            node.link(first, second)
            return None
        if kind == wire.WHEREIS:
            return node.registry.whereis(str(body))
        if kind == wire.MONITOR_NAMED:
            watcher, names = body
            return node.monitor_named(watcher, [str(name) for name in names])
        if kind == wire.REGISTER:
            name, ref = body
            node.registry.register(str(name), ref)
            return None
        if kind == wire.STOP_ACTOR:
            ref, timeout = body
            encoder = Encoder()

            def stop_and_answer() -> None:
                down = node.stop(ref, float(timeout))
                self.post(lambda: self._reply(encoder, identity, request_id, wire.REPLY_OK, down))

            threading.Thread(
                target=stop_and_answer, daemon=True, name=f"warren-stop-{ref.name}"
            ).start()
            return _NO_ANSWER
        raise ValueError(f"unknown request kind {kind!r}")

"""Process-wide runtime state: the ZeroMQ context, the senders' sockets, what is known dead.

One ``Runtime`` exists per process and is created on first use (and again after a fork:
a forked child never touches its parent's context, whose I/O threads did not survive the
fork). It owns:

- ``Channel``s: one DEALER per (thread, endpoint). ZeroMQ sockets are not thread-safe, so
  each thread sends on its own sockets; each channel also has a lock so that a ``Future``
  resolved on another thread reads replies safely. Replies come back on the DEALER that
  sent the request and are matched by request id. A reply nobody waits for any more (its
  ask timed out) is dropped and counted in ``stale_replies``.
- What this process knows about lives and deaths, per address: the newest incarnation
  seen and whether it is alive. The node's process learns this from its forkserver; an
  actor process learns it from the ``Down`` messages of its own monitors. A pinned ref to
  an older incarnation, or any ref to an address whose newest incarnation is dead, is
  known dead: asks to it fail with ``ActorDeadError`` rather than waiting for a timeout.
- The nodes that live in this process, so that a ref's operations that need its node
  (stop, monitor) are direct calls there and requests to the node service elsewhere.
- The CURVE key pair of a node that keeps its tcp actors to its own processes: each
  such actor binds as a CURVE server with it, and every process of the node connects to
  tcp endpoints with it as client and server key. A process outside the node has neither
  key, so its handshake fails and nothing it sends reaches the actor.

Races: a thread that ends leaves its channels open until ``forget`` closes them (a node
closing forgets the endpoints of its actors); ``forget`` takes each channel's lock, so it
never closes a socket under a thread that is using it, and a closed channel is replaced
on that thread's next send.
"""

from __future__ import annotations

import itertools
import os
import resource
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

import zmq
import zmq.backend

# messages registers Pong, Down and Exit with the codec: a process that talks to actors
# must decode their answers whatever else it imported (the package faces are lazy).
from . import messages as _registers_replies  # noqa: F401
from . import wire
from .codec import Decoder, Encoder
from .errors import (
    ActorDeadError,
    AskTimeout,
    FrameTooLarge,
    MailboxFull,
    NotDelivered,
    remote_error,
)

if TYPE_CHECKING:
    from .ref import ActorRef


# The backend's send, without pyzmq's Python wrapper around it (which only adds the
# draft routing_id/group arguments): a third of a one-frame send's cost, per message.
_plain_send = zmq.backend.Socket.send

# Frames at least this long (bytes) are sent without copying them. Below it a copy is
# cheaper: a zero-copy send wakes pyzmq's garbage-collector thread when ZeroMQ releases
# the buffer, and that thread competes for the GIL and the cores (measured: a 400 KiB
# batch frame went ~2x slower zero-copy on two cores).
_ZERO_COPY_BYTES = 1024 * 1024


class NodeOps(Protocol):
    """What a ref needs from its node: the in-process ``Node`` or a remote client of it."""

    def stop(self, ref: ActorRef, timeout: float = ...) -> Any: ...


class Channel:
    """One DEALER to one endpoint, sending for one thread."""

    def __init__(self, runtime: Runtime, endpoint: str) -> None:
        self.endpoint = endpoint
        self.lock = threading.Lock()
        self.encoder = Encoder()
        self.decoder = Decoder()
        self.closed = False
        self._runtime = runtime
        # Replies that arrived for a request another caller on this channel awaits.
        self._replies: dict[int, tuple[int, Any]] = {}
        self._awaited: set[int] = set()
        socket = runtime.context.socket(zmq.DEALER)
        socket.linger = wire.LINGER_MS
        socket.sndhwm = wire.DEFAULT_MAILBOX_SIZE
        socket.copy_threshold = _ZERO_COPY_BYTES
        if runtime.curve is not None and endpoint.startswith("tcp://"):
            public, secret = runtime.curve
            socket.curve_publickey, socket.curve_secretkey = public, secret
            socket.curve_serverkey = public
        socket.connect(endpoint)
        self.socket = socket
        self._receive_timeout_ms = -1

    def send(self, header: list[Any], timeout: float | None) -> None:
        """Encode and send one message; block up to ``timeout`` seconds on a full mailbox.
        Every send encodes under the channel's lock: the encoder is the channel's, and
        another thread may be sending on this channel."""
        with self.lock:
            self._send_locked(self.encoder.encode(header), timeout)

    def send_message(self, kind: int, stamp: int, message: Any, timeout: float | None) -> None:
        """Encode and send a tell or batch: the hot path, with one try before the checks."""
        # acquire/release rather than ``with``: measurably cheaper per message here.
        lock = self.lock
        lock.acquire()
        try:
            frames = self.encoder.encode([kind, stamp, 0, message])
            if len(frames) == 1 and len(frames[0]) < _ZERO_COPY_BYTES:
                try:
                    _plain_send(self.socket, frames[0], zmq.NOBLOCK)
                    return
                except zmq.Again:
                    pass  # the mailbox is full: the slow path waits for room
            self._send_locked(frames, timeout)
        finally:
            lock.release()

    def send_request(
        self, kind: int, stamp: int, request_id: int, body: Any, timeout: float | None
    ) -> None:
        """Encode and send a request whose reply a ``Future`` waits for."""
        with self.lock:
            frames = self.encoder.encode([kind, stamp, request_id, body])
            self._awaited.add(request_id)
            self._send_locked(frames, timeout)

    def _send_locked(self, frames: list[Any], timeout: float | None) -> None:
        if len(frames) > 1 and sum(len(f) for f in frames) > wire.MAX_MESSAGE_BYTES:
            raise FrameTooLarge(
                f"message of {sum(len(f) for f in frames)} bytes exceeds {wire.MAX_MESSAGE_BYTES}"
            )
        if len(frames[0]) > wire.MAX_MESSAGE_BYTES:
            raise FrameTooLarge(
                f"message of {len(frames[0])} bytes exceeds {wire.MAX_MESSAGE_BYTES}"
            )
        socket = self.socket
        try:
            self._send_now(frames)
            return
        except zmq.Again:
            if timeout == 0:
                raise MailboxFull(f"mailbox at {self.endpoint} is full") from None
        # The HWM is reached: wait for room, then try once more (pushback, never a drop).
        if socket.poll(None if timeout is None else int(timeout * 1000), zmq.POLLOUT):
            self._send_now(frames)
            return
        raise MailboxFull(f"mailbox at {self.endpoint} stayed full for {timeout} s")

    def _send_now(self, frames: list[Any]) -> None:
        if len(frames) == 1:
            header = frames[0]
            # Large frames go without a copy (ZeroMQ keeps a reference until sent);
            # small ones are cheaper copied than tracked.
            self.socket.send(header, zmq.NOBLOCK, copy=len(header) < _ZERO_COPY_BYTES)
        else:
            self.socket.send_multipart(frames, zmq.NOBLOCK, copy=False)

    def request(
        self,
        header: list[Any],
        request_id: int,
        timeout: float | None,
        target: ActorRef | None,
        abandon: Callable[[], bool] | None = None,
    ) -> Any:
        """Send a request and wait for its reply (see ``wait``)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.lock:
            self._send_locked(self.encoder.encode(header), timeout)
        return self.wait(request_id, deadline, target, abandon)

    def may_hold(self, request_id: int) -> bool:
        """Whether the reply to ``request_id`` was kept for it, or the socket has a
        message to read (which may be it)."""
        with self.lock:
            if request_id in self._replies:
                return True
            return bool(int(self.socket.getsockopt(zmq.EVENTS)) & zmq.POLLIN)

    def expect(self, request_id: int) -> None:
        """Keep the reply to ``request_id`` when another caller receives it first."""
        with self.lock:
            self._awaited.add(request_id)

    def wait(
        self,
        request_id: int,
        deadline: float | None,
        target: ActorRef | None,
        abandon: Callable[[], bool] | None = None,
    ) -> Any:
        """Return the reply's value, raise the remote error, ActorDeadError or AskTimeout.

        ``abandon``, checked as often as ``target``'s death, ends the wait early with
        ActorDeadError when it returns true."""
        runtime = self._runtime
        while True:
            with self.lock:
                if self.closed:
                    raise ActorDeadError(f"{self.endpoint}: the channel was closed")
                reply = self._replies.pop(request_id, None)
                if reply is None:
                    # Even past the deadline (a zero timeout: "is it there yet?"), read what
                    # has arrived before saying no.
                    now = time.monotonic()
                    slice_s = wire.DEATH_CHECK_INTERVAL_S
                    if deadline is not None:
                        slice_s = max(0.0, min(slice_s, deadline - now))
                    reply = self._receive_reply(request_id, int(slice_s * 1000) + (slice_s > 0))
                    if reply is None and deadline is not None and time.monotonic() >= deadline:
                        self._awaited.discard(request_id)
                        raise AskTimeout(f"no reply from {self.endpoint} in time")
                if reply is not None:
                    self._awaited.discard(request_id)
            if reply is not None:
                kind, value = reply
                if kind == wire.REPLY_OK:
                    return value
                type_name, text, remote_tb = value
                if type_name == NotDelivered.__name__:  # the runtime's refusal, not the actor's
                    raise NotDelivered(str(text))
                raise remote_error(str(type_name), str(text), str(remote_tb))
            if target is not None and runtime.known_down(target):
                with self.lock:
                    self._awaited.discard(request_id)
                raise ActorDeadError(f"{target.name} (incarnation {target.incarnation}) is dead")
            if abandon is not None and abandon():
                with self.lock:
                    self._awaited.discard(request_id)
                raise ActorDeadError(f"the request to {self.endpoint} was abandoned")

    def _receive_reply(self, request_id: int, wait_ms: int) -> tuple[int, Any] | None:
        """Receive replies for up to ``wait_ms``; return the one for ``request_id``.

        A blocking receive with a receive timeout, rather than a poll: a poll builds a
        poller per call, which costs more than the round trip's own work.
        """
        socket = self.socket
        while True:
            if wait_ms != self._receive_timeout_ms:
                socket.rcvtimeo = self._receive_timeout_ms = wait_ms
            try:
                header = socket.recv(0, copy=False)
            except zmq.Again:
                return None
            frames = [header]
            more = header.more
            while more:
                body = socket.recv(0, copy=False)
                frames.append(body)
                more = body.more
            wait_ms = 0
            try:
                kind, reply_id, value = self.decoder.decode(frames)
            except (ValueError, TypeError):
                self._runtime.count("malformed_replies")
                continue
            if reply_id == request_id:
                return kind, value
            if reply_id in self._awaited:
                self._replies[reply_id] = (kind, value)
            else:
                self._runtime.count("stale_replies")

    def close(self) -> None:
        with self.lock:
            if not self.closed:
                self.closed = True
                self.socket.close(linger=0)


def channel_to(endpoint: str) -> Channel:
    """This thread's channel to ``endpoint`` (the runtime's, inlined for the hot path)."""
    current = _runtime if _runtime is not None else _create_runtime()
    channels = getattr(current._local, "channels", None)
    if channels is not None:
        channel = channels.get(endpoint)
        if channel is not None and not channel.closed:
            return channel
    return current.channel(endpoint)


class Runtime:
    """The per-process state described in the module docstring."""

    def __init__(self) -> None:
        self.context = zmq.Context()
        # A DEALER per (thread, actor endpoint): a node of a thousand queues holds
        # thousands, past ZeroMQ's default of 1,023 sockets. Each costs about two file
        # descriptors (its mailbox, its connection), so the process's limit decides.
        sockets = self.context.get(zmq.SOCKET_LIMIT)
        open_files, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if open_files != resource.RLIM_INFINITY:
            sockets = min(sockets, open_files // 2)
        self.context.max_sockets = max(self.context.max_sockets, sockets)
        self.request_ids = itertools.count(1)
        self.nodes: dict[str, NodeOps] = {}
        self.counters: dict[str, int] = {}
        self._local = threading.local()
        self._lock = threading.Lock()
        self._channels: list[Channel] = []
        # address -> (newest incarnation seen, alive)
        self._lives: dict[str, tuple[int, bool]] = {}
        # The CURVE key pair of the node this process belongs to, when that node keeps its
        # tcp actors to itself (``Node(curve=True)``): every tcp channel uses it.
        self.curve: tuple[bytes, bytes] | None = None

    def channel(self, endpoint: str) -> Channel:
        """This thread's DEALER to ``endpoint``, connected on first use."""
        channels: dict[str, Channel] | None = getattr(self._local, "channels", None)
        if channels is None:
            channels = self._local.channels = {}
        channel = channels.get(endpoint)
        if channel is None or channel.closed:
            channel = channels[endpoint] = Channel(self, endpoint)
            with self._lock:
                self._channels.append(channel)
        return channel

    def forget(self, endpoints: Iterable[str]) -> None:
        """Close every thread's channels to these endpoints."""
        gone = set(endpoints)
        with self._lock:
            doomed = [c for c in self._channels if c.endpoint in gone]
            self._channels = [c for c in self._channels if c.endpoint not in gone]
        for channel in doomed:
            channel.close()

    def count(self, counter: str, by: int = 1) -> None:
        self.counters[counter] = self.counters.get(counter, 0) + by

    def mark_alive(self, address: str, incarnation: int) -> None:
        with self._lock:
            known = self._lives.get(address)
            if known is None or incarnation >= known[0]:
                self._lives[address] = (incarnation, True)

    def mark_dead(self, address: str, incarnation: int) -> None:
        with self._lock:
            known = self._lives.get(address)
            if known is None or incarnation >= known[0]:
                self._lives[address] = (incarnation, False)

    def known_down(self, ref: ActorRef) -> bool:
        """True when this process knows ``ref`` can no longer be answered."""
        known = self._lives.get(ref.address)
        if known is None:
            return False
        incarnation, alive = known
        if ref.pinned:
            return ref.incarnation < incarnation or (ref.incarnation == incarnation and not alive)
        return not alive


_runtime: Runtime | None = None
_runtime_lock = threading.Lock()


def runtime() -> Runtime:
    """This process's runtime, created on first use (and anew in a forked child)."""
    current = _runtime
    if current is not None:
        return current
    return _create_runtime()


def _create_runtime() -> Runtime:
    global _runtime
    with _runtime_lock:
        if _runtime is None:
            _runtime = Runtime()
        return _runtime


def _forget_parent_runtime() -> None:
    # A forked child must not touch its parent's context: its I/O threads did not survive.
    global _runtime, _runtime_lock
    _runtime = None
    _runtime_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_parent_runtime)

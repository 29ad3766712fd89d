"""``AmqpActor`` (``warren: amqp``): the node's AMQP 0-9-1 port.

The node runs one when told to (``warren node --amqp 127.0.0.1:5672``,
``Node(amqp=...)``). Its gateway thread owns the listening socket and every client's
socket, each with its ``Session`` (the protocol) and ``Translator`` (a worker thread with
a Warren connection to the node): it reads, lets the session frame and answer what it
can, hands the rest to the translator, and writes what both have to send, without
blocking on any one client (what a client does not take yet waits in its buffer, and
that client's socket is watched for room). The actor's own loop answers its supervisor
and ``AmqpStats``.

Races: a translator's answers and deliveries reach the gateway through ``post`` (a
queue of callables and a wake-up pipe), so only the gateway thread touches a session
and a socket. A client that goes (its socket closes, or the session finishes) has its
translator stopped: it hands back what the client held unacked and closes its Warren
connection; the queues requeue what it held if the whole process dies instead.

Bad input: what the session refuses closes that client with RabbitMQ's code; a client
that sends a protocol header of another version is answered with ours and closed.
"""

from __future__ import annotations

import collections
import logging
import os
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from warren.actors import ProcessActor, UnhandledMessage, message

from ..client.connection import Connection
from ..client.ipc_node import RemoteNode
from ..errors import NotFound
from . import session as session_module
from .session import Session
from .shared import ExclusiveQueues, TopologyChanges
from .translator import Translator

log = logging.getLogger("warren.amqp")

TICK_S = 1.0  # how often sessions are looked at for heartbeats
READ_BYTES = 256 * 1024
PORT_DIRECTORY = "amqp"  # the port's own files, in the node's data directory
LOOPBACK_HOSTS = ("127.0.0.1", "::1", "localhost")
GUEST_PASSWORD = "guest"


@message
@dataclass(frozen=True)
class AmqpStats:
    """ask → {"endpoint", "connections", "connections_opened", "connections_closed"}."""


def check_amqp_address(address: str, *, insecure: bool) -> tuple[str, int]:
    """``host:port`` as (host, port); ValueError unless the host is loopback or
    ``insecure`` says the network is the user's alone (port 0: any free one)."""
    if not isinstance(address, str):
        raise ValueError(f"the AMQP port is host:port, such as 127.0.0.1:5672; got {address!r}")
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"the AMQP port is host:port, with a port in 0..65535; got {address!r}")
    if host not in LOOPBACK_HOSTS and not insecure:
        raise ValueError(
            f"{address} is not a loopback address: anyone who reaches it could publish and "
            "consume (TLS is not served yet); pass --insecure if the network is yours alone"
        )
    return host, int(port)


def free_port(host: str, port: int) -> int:
    """``port``, or one free now when it is 0: a restarted AMQP port binds the same one
    as the first, so that its clients reconnect to it."""
    if port:
        return port
    with socket.socket(_family(host)) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def guest_only(user: str, password: str) -> bool:
    """The users let in: ``guest`` (from loopback only, which the session checks)."""
    return user == session_module.GUEST and password == GUEST_PASSWORD


@dataclass(eq=False)
class _Client:
    sock: socket.socket
    session: Session
    translator: Translator
    pending: bytearray  # what the client has not taken yet
    paused: bool = False  # not read: its worker has not taken what it sent
    told_blocked: bool = False  # sent connection.blocked, not unblocked since
    # While an alarm is raised: how many publishes the client had made when it was
    # raised (or 0, connected since). Told it is blocked at its next publish, as
    # RabbitMQ tells a connection: one that does not publish is not blocked.
    blocking_from: int | None = None


class AmqpActor(ProcessActor):
    """The AMQP port's process; see the module docstring."""

    figures_from_loop = False  # its counters change on the gateway thread

    def __init__(self, data_dir: str, host: str, port: int, version: str) -> None:
        """``version``: Warren's, which the port announces to clients."""
        self.data_dir = data_dir
        self.host = host
        self.port = port
        self.version = version
        self._gateway: _Gateway | None = None
        self._thread: threading.Thread | None = None

    def on_start(self) -> None:
        self._gateway = _Gateway(self.data_dir, self.host, self.port, self.version)
        self._thread = threading.Thread(target=self._gateway.run, name="warren-amqp", daemon=True)
        self._thread.start()

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, AmqpStats):
            gateway = self._gateway
            assert gateway is not None, "on_start sets the gateway"
            host, port = gateway.bound
            return {
                "endpoint": f"{host}:{port}" if ":" not in host else f"[{host}]:{port}",
                "connections": len(gateway.clients),
                **gateway.counters,
            }
        raise UnhandledMessage(f"the AMQP port does not handle {type(message).__name__}")

    def on_alarm(self, resource: str, raised: bool) -> None:
        if self._gateway is not None:
            self._gateway.alarm(resource, raised)

    def on_stop(self) -> None:
        self._close()

    def on_failure(self, *exc_info: object) -> None:
        self._close()

    def _close(self) -> None:
        if self._gateway is not None:
            self._gateway.stopping.set()
            self._gateway.wake()
            if self._thread is not None:
                self._thread.join(timeout=5)
            self._gateway.close()


class _Gateway:
    """The gateway thread's state; every socket and session here is used by it alone."""

    def __init__(self, data_dir: str, host: str, port: int, version: str) -> None:
        self.data_dir = data_dir
        self.version = version
        self.stopping = threading.Event()
        self.counters = {"connections_opened": 0, "connections_closed": 0}
        self.clients: dict[socket.socket, _Client] = {}
        self._listener = socket.create_server((host, port), family=_family(host), backlog=128)
        self._listener.setblocking(False)
        self.bound: tuple[str, int] = self._listener.getsockname()[:2]
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_read, False)
        os.set_blocking(self._wake_write, False)
        self._selector.register(self._wake_read, selectors.EVENT_READ)
        self._posted: collections.deque[Callable[[], None]] = collections.deque()
        self._dirty: set[_Client] = set()
        self._unwatched: set[_Client] = set()
        self.alarms: set[str] = set()  # the node's resource alarms raised now
        self._topology = TopologyChanges()
        self._exclusive = ExclusiveQueues(os.path.join(data_dir, PORT_DIRECTORY))

    def wake(self) -> None:
        try:
            os.write(self._wake_write, b"\x00")
        except BlockingIOError:
            pass  # a wake-up is pending already

    def run(self) -> None:
        self._delete_left_exclusive_queues()
        next_tick = time.monotonic() + TICK_S
        while not self.stopping.is_set():
            timeout = max(0.0, next_tick - time.monotonic())
            for key, events in self._selector.select(timeout):
                if key.fileobj is self._listener:
                    self._accept()
                elif key.fileobj == self._wake_read:
                    self._drain_wake()
                else:
                    client = key.data
                    if events & selectors.EVENT_WRITE:
                        self._dirty.add(client)
                    if events & selectors.EVENT_READ:
                        self._read(client)
            while self._posted:
                self._posted.popleft()()
            now = time.monotonic()
            if now >= next_tick:
                next_tick = now + TICK_S
                for client in list(self.clients.values()):
                    client.session.tick(now)
                    self._dirty.add(client)
            for client in list(self._dirty):
                self._flush(client, now)
            self._dirty.clear()

    def close(self) -> None:
        for client in list(self.clients.values()):
            self._drop(client)
        self._selector.close()
        self._listener.close()
        os.close(self._wake_read)
        os.close(self._wake_write)

    def _delete_left_exclusive_queues(self) -> None:
        """Delete the exclusive queues of the connections an earlier run of the port had
        when it died (before anyone is served: the clients meanwhile wait in the
        listening socket's backlog)."""
        left = self._exclusive.left_by_a_crash()
        if not left:
            return
        connection = self._connect()
        try:
            for name in left:
                try:
                    connection.delete_queue(name)
                except NotFound:
                    pass  # gone with a node restart, or deleted by hand
        finally:
            connection.close()
        log.info("deleted %d exclusive queue(s) of connections that died with the port", len(left))

    def _drain_wake(self) -> None:
        try:
            while os.read(self._wake_read, 4096):
                pass
        except BlockingIOError:
            pass

    def _accept(self) -> None:
        try:
            sock, address = self._listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        client: _Client | None = None

        def post(callback: Callable[[], None]) -> None:
            def run() -> None:
                callback()
                if client is not None and client.sock in self.clients:
                    self._dirty.add(client)

            self._posted.append(run)
            self.wake()

        translator = Translator(self._connect, post, self._topology, self._exclusive)
        session = Session(
            address[0], guest_only, translator, version=self.version, now=time.monotonic()
        )
        translator.session = session  # before anything it is handed can need it
        client = _Client(sock, session, translator, bytearray())
        if self.alarms:
            client.blocking_from = 0

        def drained() -> None:
            client.paused = False

        translator.on_drained = drained
        self.clients[sock] = client
        self.counters["connections_opened"] += 1
        self._selector.register(sock, selectors.EVENT_READ, client)

    def _connect(self) -> Connection:
        return Connection(RemoteNode(self.data_dir), linger_s=0, recover=False)

    def _read(self, client: _Client) -> None:
        try:
            data = client.sock.recv(READ_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(client)
            return
        client.session.receive(data, time.monotonic())
        client.paused = client.translator.backlogged
        self._dirty.add(client)

    def alarm(self, resource: str, raised: bool) -> None:
        """Post a change of the node's alarms (from the actor's thread); every open
        client that asked for them hears ``connection.blocked`` or ``unblocked``."""

        def change() -> None:
            was = bool(self.alarms)
            if raised:
                self.alarms.add(resource)
            else:
                self.alarms.discard(resource)
            if was != bool(self.alarms):
                for client in self.clients.values():
                    client.blocking_from = client.session.publishes if self.alarms else None
            self._dirty.update(self.clients.values())

        self._posted.append(change)
        self.wake()

    def _flush(self, client: _Client, now: float) -> None:
        if client.sock not in self.clients:
            return
        blocked = (
            client.blocking_from is not None and client.session.publishes > client.blocking_from
        )
        if client.told_blocked != blocked and client.session.hears_of_blocks:
            client.session.blocked(
                f"low on {' and '.join(sorted(self.alarms))}" if blocked else None
            )
            client.told_blocked = blocked
        client.pending += client.session.take_output(now)
        if client.pending:
            try:
                sent = client.sock.send(client.pending)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError:
                self._drop(client)
                return
            del client.pending[:sent]
        if client.session.finished and not client.pending:
            self._drop(client)
            return
        events = (0 if client.paused else selectors.EVENT_READ) | (
            selectors.EVENT_WRITE if client.pending else 0
        )
        self._watch(client, events)

    def _watch(self, client: _Client, events: int) -> None:
        """Watch the client's socket for ``events``; for none, not at all (until its
        worker catches up: a paused client with nothing to send)."""
        watched = client not in self._unwatched
        if not events:
            if watched:
                self._selector.unregister(client.sock)
                self._unwatched.add(client)
        elif watched:
            self._selector.modify(client.sock, events, client)
        else:
            self._selector.register(client.sock, events, client)
            self._unwatched.discard(client)

    def _drop(self, client: _Client) -> None:
        if self.clients.pop(client.sock, None) is None:
            return
        self.counters["connections_closed"] += 1
        if client in self._unwatched:
            self._unwatched.discard(client)
        else:
            self._selector.unregister(client.sock)
        client.sock.close()
        client.translator.stop()


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET

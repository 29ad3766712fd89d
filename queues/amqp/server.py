"""``AmqpActor`` (``warren: amqp``): the node's AMQP 0-9-1 port.

The node runs one when told to (``warren node --amqp 127.0.0.1:5672``,
``Node(amqp=...)``). Its gateway thread owns the listening socket and every client's
socket, each with its ``Session`` (the protocol) and ``Translator`` (a worker thread with
a Warren connection to the node): it reads, lets the session frame and answer what it
can, hands the rest to the translator, and writes what both have to send, without
blocking on any one client (what a client does not take yet waits in its buffer, and
that client's socket is watched for room). The actor's own loop answers its supervisor
and ``AmqpStats``. Logins are checked against the node's users (``users``).

TLS (``TlsFiles``): every accepted socket is wrapped and its handshake moved on, without
blocking, each time the socket is ready, before a byte of AMQP; a client not through it
within the session's handshake time is dropped. Records OpenSSL has already decrypted
are read at once (the selector does not see them), and a write it could not finish is
repeated with the same bytes before anything newer, as OpenSSL requires.

Flow: a client whose worker has not taken more than ``BACKLOG_PAUSE_BYTES`` of what it
sent is not read until the worker catches up (its sends then wait, as RabbitMQ's credit
flow makes them wait), and a client's consumers get nothing more while
``OUTBOX_LIMIT_BYTES`` wait for it to read. A translator and its node connection are made
when the client's connection opens: a socket that never logs in costs neither, and is
closed after the handshake timeout.

Races: a translator's answers and deliveries reach the gateway through ``post`` (a
queue of callables and a wake-up pipe), so only the gateway thread touches a session
and a socket. A client that goes (its socket closes, its session finishes and its last
frames left or waited ``CLOSE_LINGER_S``, or it missed its heartbeats) has its
translator stopped: it hands back what the client held unacked and closes its Warren
connection; the queues requeue what it held if the whole process dies instead. A
stopping port tells its clients (320 CONNECTION_FORCED) and waits for the workers.

Bad input: what the session refuses closes that client with RabbitMQ's code; a client
that sends a protocol header of another version is answered with ours and closed. A bug
met while serving one client closes that client (541); one in the gateway's own loop
ends the process, which its supervisor restarts, rather than leave a port that accepts
and never answers.
"""

from __future__ import annotations

import collections
import concurrent.futures
import functools
import logging
import os
import resource
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from warren.actors import UnhandledMessage, message
from warren.actors.process import drain_wake_pipe

from ..broker.gateway_actor import GatewayActor
from ..broker.listener import LOOPBACK_HOSTS, host_and_port, with_free_port
from ..client.connection import Connection
from ..client.ipc_node import RemoteNode
from ..errors import NodeStarting, NotFound
from . import frames
from .frames import AmqpError
from .session import Session
from .shared import ExclusiveConsumers, ExclusiveQueues, TopologyChanges
from .translator import Translator
from .users import Users

log = logging.getLogger("warren.amqp")

TICK_S = 1.0  # how often sessions are looked at for heartbeats
CLOSE_LINGER_S = 5.0  # how long a closed client's last frames may wait to leave
STOP_WORKERS_S = 5.0  # how long a stopping port waits for its workers, all together
# The exchanges every AMQP broker has, declared by the port when missing.
STANDARD_EXCHANGES = (("amq.direct", "direct"), ("amq.fanout", "fanout"), ("amq.topic", "topic"))
NODE_START_POLL_S = 0.05  # how often the starting port looks whether the node serves
DESCRIPTORS_KEPT = 64  # a connection is refused while fewer descriptors than this are left
READ_BYTES = 256 * 1024
TLS_WRITE_BYTES = 256 * 1024  # the most one TLS write takes (a retry repeats the same)
LOGIN_CHECK_THREADS = 2  # the threads running scrypt for logins (it releases the GIL)
LOGIN_CHECKS_WAITING = 64  # logins being checked at most; one more is refused at once
PORT_DIRECTORY = "amqp"  # the port's own files, in the node's data directory


@message
@dataclass(frozen=True)
class AmqpStats:
    """ask → {"endpoint", "connections", "output_waiting_bytes" (what clients have not
    read yet), "connections_opened", "connections_closed", "clients_failed",
    "refused_for_descriptors", "logins_refused_busy", "messages_published" (handed to
    the node)}."""


def check_amqp_address(
    address: object, *, tls: TlsFiles | None = None, insecure: bool = False
) -> tuple[str, int]:
    """``(host, port)`` of ``HOST:PORT`` (port 0: any free one); ValueError for anything
    else, and for a host other than loopback unless the port speaks TLS (``tls``) or
    ``insecure`` says the network is the operator's (passwords then cross it in clear)."""
    host, port = host_and_port(
        address, "the AMQP port", "such as 127.0.0.1:5672 (port 0: any free one)"
    )
    if host not in LOOPBACK_HOSTS and tls is None and not insecure:
        raise ValueError(
            f"{address} is not a loopback address: serve AMQP there over TLS (a certificate "
            "and key: --amqp-certfile and --amqp-keyfile), or pass --insecure if the network "
            "is yours alone (passwords would cross it in clear)"
        )
    return host, port


@dataclass(frozen=True)
class TlsFiles:
    """The certificate chain and private key (PEM files) the AMQP port serves TLS with."""

    certfile: str
    keyfile: str

    def context(self) -> ssl.SSLContext:
        """A server context with them loaded; ValueError naming the file that is wrong."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            # never a pass phrase prompt: it would stop the node's processes at the terminal
            context.load_cert_chain(self.certfile, self.keyfile, password=_no_pass_phrase)
        except _KeyEncrypted:
            raise ValueError(
                f"{self.keyfile} is encrypted: give the key without a pass phrase "
                "(openssl pkey -in KEY -out PLAIN), readable by the node's user alone"
            ) from None
        except FileNotFoundError as exc:
            raise ValueError(f"no such file: {exc.filename}") from None
        except PermissionError as exc:
            raise ValueError(f"permission denied reading {exc.filename}") from None
        except ssl.SSLError as exc:
            raise ValueError(
                f"{self.certfile} and {self.keyfile} are not a PEM certificate chain and its "
                f"private key ({exc.reason or exc})"
            ) from None
        except OSError as exc:  # a directory, an I/O error
            raise ValueError(
                f"cannot read {exc.filename or self.certfile}: {exc.strerror}"
            ) from None
        return context


class _KeyEncrypted(Exception):
    """The TLS key asks for a pass phrase."""


def _no_pass_phrase() -> bytes:
    raise _KeyEncrypted


def free_port(host: str, port: int) -> int:
    """``port``, or one free now when it is 0: a restarted AMQP port binds the same one
    as the first, so that its clients reconnect to it."""
    return port or int(with_free_port(f"tcp://{host}:*").rpartition(":")[2])


@dataclass(eq=False)
class _Client:
    sock: socket.socket
    session: Session
    pending: bytearray  # what the client has not taken yet
    translator: Translator | None = None  # once its connection is open
    finished_at: float | None = None  # when its session finished
    paused: bool = False  # not read: its worker has not taken what it sent
    told_blocked: bool = False  # sent connection.blocked, not unblocked since
    # While an alarm is raised: how many publishes the client had made when it was
    # raised (or 0, connected since). Told it is blocked at its next publish, as
    # RabbitMQ tells a connection: one that does not publish is not blocked.
    blocking_from: int | None = None
    tls_handshaking: bool = False  # a TLS client whose handshake is not done yet
    tls_retry: int = 0  # the length of a TLS write to repeat, as OpenSSL requires


class AmqpActor(GatewayActor):
    """The AMQP port's process; see the module docstring."""

    figures_from_loop = False  # its counters change on the gateway thread

    def __init__(
        self, data_dir: str, host: str, port: int, version: str, tls: TlsFiles | None = None
    ) -> None:
        """``version``: Warren's, which the port announces to clients; ``tls``: serve TLS
        alone, with that certificate and key."""
        self.data_dir = data_dir
        self.host = host
        self.port = port
        self.version = version
        self.tls = tls
        self._gateway: _Gateway | None = None

    def on_start(self) -> None:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != hard:  # each client costs descriptors: take all this process may have
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        self._gateway = _Gateway(self.data_dir, self.host, self.port, self.version, self.tls)
        self.start_gateway(self._gateway, "warren-amqp")

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, AmqpStats):
            gateway = self._gateway
            assert gateway is not None, "on_start sets the gateway"
            host, port = gateway.bound
            return {
                "endpoint": f"{host}:{port}" if ":" not in host else f"[{host}]:{port}",
                "connections": len(gateway.clients),
                "output_waiting_bytes": sum(len(c.pending) for c in list(gateway.clients.values())),
                **gateway.counters,
            }
        raise UnhandledMessage(f"the AMQP port does not handle {type(message).__name__}")

    def on_alarm(self, resource: str, raised: bool) -> None:
        if self._gateway is not None:
            self._gateway.alarm(resource, raised)


class _Gateway:
    """The gateway thread's state; every socket and session here is used by it alone."""

    def __init__(
        self, data_dir: str, host: str, port: int, version: str, tls: TlsFiles | None
    ) -> None:
        self.data_dir = data_dir
        self.version = version
        self._tls_context = tls.context() if tls is not None else None
        self._users = Users(data_dir)
        self._login_checks = concurrent.futures.ThreadPoolExecutor(
            LOGIN_CHECK_THREADS, thread_name_prefix="warren-amqp-login"
        )
        self._logins_checking = 0
        self.stopping = threading.Event()
        self.counters = {
            "connections_opened": 0,
            "connections_closed": 0,
            "clients_failed": 0,
            "refused_for_descriptors": 0,
            "logins_refused_busy": 0,
            "messages_published": 0,
        }
        self._published_lock = threading.Lock()  # the clients' workers count publishes
        self.clients: dict[socket.socket, _Client] = {}
        self._listener = socket.create_server((host, port), family=_family(host), backlog=128)
        self._listener.setblocking(False)
        self.bound: tuple[str, int] = self._listener.getsockname()[:2]
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._wake_read, self._wake_write = os.pipe()
        # A byte is in the pipe, or about to be, that the gateway has not drained yet:
        # a post then writes none (a worker posts a frame per delivery). Set by posters,
        # cleared by the gateway once drained and before it runs what was posted.
        self._wake_pending = False
        os.set_blocking(self._wake_read, False)
        os.set_blocking(self._wake_write, False)
        self._selector.register(self._wake_read, selectors.EVENT_READ)
        # What other threads hand the gateway: a callable, and the client it is for
        # (dropped if that client is gone meanwhile), or None.
        self._posted: collections.deque[tuple[_Client | None, Callable[[], None]]] = (
            collections.deque()
        )
        self._accepting = True  # the listening socket is watched (not when out of fds)
        self._stopped: list[Translator] = []  # workers told to stop, joined at close
        self._dirty: set[_Client] = set()
        self._unwatched: set[_Client] = set()
        self.alarms: set[str] = set()  # the node's resource alarms raised now
        self._topology = TopologyChanges()
        self._exclusive = ExclusiveQueues(os.path.join(data_dir, PORT_DIRECTORY))
        self._exclusive_consumers = ExclusiveConsumers()

    def stop(self) -> None:
        self.stopping.set()
        self.wake()

    def wake(self) -> None:
        if self._wake_pending:
            return
        self._wake_pending = True
        try:
            os.write(self._wake_write, b"\x00")
        except BlockingIOError:
            pass  # a wake-up is pending already

    def run(self) -> None:
        self._prepare()
        self._serve()

    def _serve(self) -> None:
        next_tick = time.monotonic() + TICK_S
        while not self.stopping.is_set():
            timeout = max(0.0, next_tick - time.monotonic())
            for key, events in self._selector.select(timeout):
                if key.fileobj is self._listener:
                    self._accept()
                elif key.fileobj == self._wake_read:
                    drain_wake_pipe(self._wake_read)
                    self._wake_pending = False
                else:
                    client = key.data
                    if events & selectors.EVENT_WRITE:
                        self._dirty.add(client)
                    if events & selectors.EVENT_READ:
                        self._guarded(client, self._read)
            while self._posted:
                posted_for, callback = self._posted.popleft()
                if posted_for is None:
                    callback()
                elif posted_for.sock in self.clients:
                    self._guarded(posted_for, _run_posted(callback))
                    self._dirty.add(posted_for)
            now = time.monotonic()
            if now >= next_tick:
                next_tick = now + TICK_S
                self._tick(now)
            for client in list(self._dirty):
                self._guarded(client, functools.partial(self._flush, now=now))
            self._dirty.clear()

    def _tick(self, now: float) -> None:
        if not self._accepting:
            self._accepting = True
            self._selector.register(self._listener, selectors.EVENT_READ)
        for client in list(self.clients.values()):
            if client.paused:
                client.session.heard(now)  # its beats wait behind what it sent, unread
            client.session.tick(now)
            self._dirty.add(client)

    def _guarded(self, client: _Client, step: Callable[[_Client], None]) -> None:
        """Run one client's step; a bug in it closes that client alone (541)."""
        try:
            step(client)
        except Exception as exc:
            log.exception("amqp: serving a client failed; it is closed")
            self.counters["clients_failed"] += 1
            client.session.close_connection(
                AmqpError(frames.INTERNAL_ERROR, f"INTERNAL_ERROR - {type(exc).__name__}")
            )
            try:
                self._flush(client, now=time.monotonic())
            except Exception:
                self._drop(client)

    def close(self) -> None:
        """Tell every client the node shuts down (320), stop their workers, close."""
        shutdown = AmqpError(frames.CONNECTION_FORCED, "CONNECTION_FORCED - shutdown")
        for client in list(self.clients.values()):
            client.session.close_connection(shutdown)
            try:
                client.sock.send(client.pending + client.session.take_output())
            except OSError:
                pass  # it hears of it from the socket's close
            self._drop(client)
        deadline = time.monotonic() + STOP_WORKERS_S
        for translator in self._stopped:
            translator.join(max(0.0, deadline - time.monotonic()))
        # a check still running posts its answer through the wake-up pipe: it ends first
        self._login_checks.shutdown(wait=True, cancel_futures=True)
        self._selector.close()
        self._listener.close()
        if not any(translator.running for translator in self._stopped):
            # a worker still waiting on the node may post yet: its pipe stays open
            os.close(self._wake_read)
            os.close(self._wake_write)

    def _prepare(self) -> None:
        """Before anyone is served (the clients meanwhile wait in the listening socket's
        backlog), once the node serves (the port starts with the node's tree, before the
        node answers calls): declare the exchanges AMQP says every broker has
        (``amq.direct``, ``amq.fanout``, ``amq.topic``; durable), and delete the
        exclusive queues of the connections an earlier run of the port had when it died."""
        while not self.stopping.is_set():
            try:
                self._prepare_now()
                return
            except NodeStarting:
                time.sleep(NODE_START_POLL_S)

    def _prepare_now(self) -> None:
        left = self._exclusive.left_by_a_crash()
        connection = self._connect()
        try:
            declared = {exchange["name"] for exchange in connection.list_exchanges()}
            for name, kind in STANDARD_EXCHANGES:
                if name not in declared:
                    connection.declare_exchange(name, kind, durable=True)
            for name in left:
                try:
                    connection.delete_queue(name)
                except NotFound:
                    pass  # gone with a node restart, or deleted by hand
        finally:
            connection.close()
        if left:
            self._exclusive.forget_left()
            log.info(
                "deleted %d exclusive queue(s) of connections that died with the port", len(left)
            )

    def _accept(self) -> None:
        try:
            sock, address = self._listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:  # out of descriptors: look again at the next tick
            log.warning("amqp: cannot accept a connection: %s", exc)
            self._selector.unregister(self._listener)
            self._accepting = False
            return
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:  # reset already
            sock.close()
            return
        if _descriptors_left() < DESCRIPTORS_KEPT:
            # each client costs a few descriptors (its socket, its connection to the
            # node's sockets); past the limit ZeroMQ aborts the whole process
            log.warning(
                "amqp: refused a connection: fewer than %d descriptors left", DESCRIPTORS_KEPT
            )
            self.counters["refused_for_descriptors"] += 1
            sock.close()
            return
        if self._tls_context is not None:
            try:
                sock = self._tls_context.wrap_socket(
                    sock, server_side=True, do_handshake_on_connect=False
                )
            except OSError:  # reset already
                sock.close()
                return

        def authenticate(user: str, password: str) -> bool | None:
            return self._authenticate(client, user, password)

        session = Session(address[0], authenticate, version=self.version, now=time.monotonic())
        client = _Client(sock, session, bytearray(), tls_handshaking=self._tls_context is not None)
        session.on_open = lambda: self._serve_channels(client)
        if self.alarms:
            client.blocking_from = 0
        self.clients[sock] = client
        self.counters["connections_opened"] += 1
        self._selector.register(sock, selectors.EVENT_READ, client)

    def _authenticate(self, client: _Client, user: str, password: str) -> bool | None:
        """The client's login: answered at once when the users know it without scrypt,
        else checked by a login thread and told to its session when done (None), or
        refused when too many logins are being checked already."""
        verdict = self._users.answer(user, password)
        if verdict is not None:
            return verdict
        if self._logins_checking >= LOGIN_CHECKS_WAITING:
            self.counters["logins_refused_busy"] += 1
            log.warning(
                "amqp: refused a login of %r: %d logins are being checked already",
                user,
                LOGIN_CHECKS_WAITING,
            )
            return False
        check = self._users.slow_check(user, password)
        self._logins_checking += 1

        def checked(done: concurrent.futures.Future[bool]) -> None:
            matched = not done.cancelled() and done.exception() is None and done.result()

            def tell() -> None:
                self._logins_checking -= 1
                self._users.remember(check, matched)
                if client.sock in self.clients:
                    client.session.login_checked(matched)
                    self._dirty.add(client)

            self._posted.append((None, tell))
            self.wake()

        self._login_checks.submit(check.run).add_done_callback(checked)
        return None

    def _serve_channels(self, client: _Client) -> Translator:
        """The worker of a client whose connection just opened (none before: a socket
        that never logs in costs no thread and no connection to the node)."""

        def post(callback: Callable[[], None]) -> None:
            self._posted.append((client, callback))
            self.wake()

        def drained() -> None:
            client.paused = False

        translator = Translator(
            self._connect,
            post,
            self._topology,
            self._exclusive,
            self._exclusive_consumers,
            self._count_published,
        )
        translator.session = client.session
        translator.on_drained = drained
        translator.outbox = lambda: len(client.pending)
        client.translator = translator
        return translator

    def _count_published(self) -> None:
        """One more message a client's worker handed to the node (on that worker)."""
        with self._published_lock:
            self.counters["messages_published"] += 1

    def _connect(self) -> Connection:
        return Connection(RemoteNode(self.data_dir), recover=False)

    def _read(self, client: _Client) -> None:
        if client.tls_handshaking:
            self._dirty.add(client)  # its flush moves the handshake on
            return
        try:
            data = _receive(client.sock)
        except (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(client)
            return
        client.session.receive(data, time.monotonic())
        client.paused = client.translator is not None and client.translator.backlogged
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

        self._posted.append((None, change))
        self.wake()

    def _flush(self, client: _Client, *, now: float) -> None:
        if client.sock not in self.clients:
            return
        if client.tls_handshaking and not self._tls_handshake(client):
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
                sent = _send(client)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError:
                self._drop(client)
                return
            del client.pending[:sent]
        if client.session.finished:
            if client.finished_at is None:
                client.finished_at = now
            # a closed client's last frames get a moment to leave; a vanished one none
            if (
                not client.pending
                or client.session.peer_gone
                or now - client.finished_at > CLOSE_LINGER_S
            ):
                self._drop(client)
                return
        events = (0 if client.paused else selectors.EVENT_READ) | (
            selectors.EVENT_WRITE if client.pending else 0
        )
        self._watch(client, events)

    def _tls_handshake(self, client: _Client) -> bool:
        """Move a TLS client's handshake on; whether it is done. One that fails, or is
        not done when the session's handshake time is up, is dropped."""
        assert isinstance(client.sock, ssl.SSLSocket)
        if client.session.finished:
            self._drop(client)
            return False
        try:
            client.sock.do_handshake()
        except ssl.SSLWantReadError:
            self._watch(client, selectors.EVENT_READ)
            return False
        except ssl.SSLWantWriteError:
            self._watch(client, selectors.EVENT_WRITE)
            return False
        except OSError as exc:  # not TLS, a certificate it refuses, a reset
            log.info("amqp: a TLS handshake from %s failed: %s", client.session.peer_host, exc)
            self._drop(client)
            return False
        client.tls_handshaking = False
        return True

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
        if client.translator is not None:
            client.translator.stop()
            # the ones that ended need no join at close: only those still running stay
            self._stopped = [t for t in self._stopped if t.running]
            self._stopped.append(client.translator)


def _descriptors_left() -> int:
    """How many more files this process may open (its limit less those open)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return DESCRIPTORS_KEPT
    return soft - len(os.listdir("/proc/self/fd"))


def _receive(sock: socket.socket) -> bytes:
    """What ``sock`` has for us, TLS records already decrypted included (the selector
    does not see those)."""
    data = sock.recv(READ_BYTES)
    if isinstance(sock, ssl.SSLSocket):
        while data and (more := sock.pending()):
            data += sock.recv(more)
    return data


def _send(client: _Client) -> int:
    """Send what the client has pending; how much went. A TLS write that could not finish
    is repeated with the same bytes, as OpenSSL requires, before anything newer."""
    sock = client.sock
    if not isinstance(sock, ssl.SSLSocket):
        return sock.send(client.pending)
    size = client.tls_retry or min(len(client.pending), TLS_WRITE_BYTES)
    try:
        sent = sock.send(bytes(client.pending[:size]))
    except (ssl.SSLWantWriteError, ssl.SSLWantReadError):
        client.tls_retry = size
        return 0
    client.tls_retry = 0
    return sent


def _run_posted(callback: Callable[[], None]) -> Callable[[_Client], None]:
    """A callback posted for a client, as a step of that client's (``_guarded``)."""
    return lambda _client: callback()


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET

"""``ListenerActor`` (``warren: listener``): remote clients over tcp, as if they were local.

The node runs one listener when it is told to listen (``warren node --listen
tcp://127.0.0.1:5673``). A remote ``Connection`` (``warren.queues.client.tcp_node``) talks to it
through one DEALER; the listener forwards what it may to the node and to the queues'
processes, and the answers back. Its gateway thread owns a ROUTER bound to the address and
a DEALER to each queue it forwards to; the actor's own loop only answers its supervisor.

Wire protocol, every message one list encoded by the actor runtime's codec (msgpack,
registered message types only: nothing a peer sends is ever unpickled or imported):

    ["call", id, op, {args}]          a node call of ``NODE_CALLS`` (declare_queue,
                                      exchange, queue ...); ``queue`` answers
                                      {"name", "incarnation"}, never a ref
    ["ask", id, boot, queue, incarnation, message]
    ["tell", 0, boot, queue, incarnation, message]
                                      a queue's or a stream's message (``CLIENT_MESSAGES``) for that
                                      incarnation of the queue (an older one is dropped by
                                      the queue, as a pinned ref's would be), through the
                                      listener whose boot the client knows: one for an
                                      earlier listener (left in the client's socket while
                                      the node was down, and delivered to the restarted
                                      node, whose queues count incarnations from 1 again)
                                      is refused and counted (``stale``)
    ["alive", id, queue, incarnation] → [whether that incarnation still lives, boot]
    ["boot", id]                      → boot: this listener process's random id; a client
                                      that sees it change knows its requests in flight
                                      were lost with the listener before
    ["beat", 0, [consumer ids]]       the client's consumers are still there
    answers: [REPLY_OK | REPLY_ERROR, id, value]; an error's value is
             [type name, message, ""]; ``NodeLost`` says the node went away (its
             process is gone) or the listener stopped before the node answered: the
             client's ``NodeLost``, which it recovers from or closes on at once

Hostile or broken peers: a frame that does not decode, or is not one of these shapes, is
answered with an error when it carries an id and dropped otherwise, and counted
(``malformed``); a message type outside ``CLIENT_MESSAGES`` is refused (``refused``);
frames over ``MAX_FRAME_BYTES`` make ZeroMQ drop the connection. Refs and addresses never
come from a peer: queues are named, and the listener looks their addresses up itself. A
``Fetch`` or ``Subscribe`` carries the listener's pid, not the peer's, so a queue watches
the listener; a remote consumer unheard of (no request, no beat) for
``consumer_silence_s`` (30) is released by the listener (its deliveries go back to their
queues), and if the listener dies its queues requeue what every remote consumer held.

Connections: a ZeroMQ monitor on the ROUTER reports each tcp connection accepted and
each one closed, by file descriptor; the listener counts them (``connections_opened``,
``connections_closed``) and says how many are open (``connections``): a remote client
holds one, and a second while it consumes (its consumers' beats go on a socket of their
own). A connection a CURVE handshake refuses is opened and closed like any other.

Authentication: with ``curve``, the ROUTER is a CURVE server with the node's key pair
(``warren.queues.client.keys``) and a ZAP handler lets in only the public keys of
``authorized_keys`` (read again when it changes); a refused key is logged.

Races: node calls can block (a declare spawns a process, a queue may recover for
seconds), so they run on a small pool of threads, whose answers come back to the gateway
through a queue and a wake-up pipe; a queue's mailbox that stays full answers the ask
with an error after ``SEND_TIMEOUT_S`` rather than stalling everyone for long. A node
that dies in the middle of a call (even SIGKILL): the listener knows the node's pid
(``node_pid``) and its call looks every quarter second whether it lives, as a local
client's does, so the call ends at once in ``NodeLost`` instead of waiting out its
timeout; and the listener, stopped by the node's death at the same moment, answers
``NodeLost`` to every call still waiting for the node before it closes its socket.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import os
import queue as queue_module
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import zmq
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils.monitor import recv_monitor_message

from warren.actors import UnhandledMessage, message, wire
from warren.actors.codec import Decoder, Encoder, find_unknown
from warren.actors.errors import CodecError
from warren.actors.process import drain_wake_pipe, process_exists

from .. import errors
from ..client.ipc_node import RemoteNode, read_alarms
from ..client.keys import AUTHORIZED_FILE, authorized_keys, node_keys
from ..client.recovery import NodeLost
from ..protocol import (
    NODE_CALLS,
    STREAM_ACTOR_PREFIX,
    STREAM_MESSAGES,
    Fetch,
    Publish,
    Purge,
    QueueStats,
    Release,
    Settle,
    Subscribe,
)
from .gateway_actor import GatewayActor

__all__ = [
    "CLIENT_MESSAGES",
    "ListenerActor",
    "ListenerStats",
    "check_listen_address",
    "with_free_port",
]

log = logging.getLogger("warren.queues")

CLIENT_MESSAGES = (Publish, Fetch, Settle, Subscribe, Release, Purge, QueueStats, *STREAM_MESSAGES)
MAX_FRAME_BYTES = wire.MAX_MESSAGE_BYTES + 2**20
CONSUMER_SILENCE_S = 30.0  # a remote consumer unheard of this long is released
SWEEP_S = 5.0  # how often silent consumers are looked for
SEND_TIMEOUT_S = 5.0  # how long a full queue mailbox may hold the gateway
NODE_CALL_THREADS = 4
LAST_ANSWERS_LINGER_MS = 1000  # how long a stopping listener's last answers may take to go
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]", "::1")


@message
@dataclasses.dataclass(frozen=True)
class ListenerStats:
    """Ask → the listener's counters and the address it is bound to."""


def check_listen_address(endpoint: str, *, curve: bool, insecure: bool) -> None:
    """ValueError unless ``endpoint`` is ``tcp://host:port`` that may be bound as asked:
    anything but loopback needs ``curve`` or an explicit ``insecure``."""
    if not isinstance(endpoint, str) or not endpoint.startswith("tcp://"):
        raise ValueError(f"listen on a tcp address, tcp://host:port; got {endpoint!r}")
    host, _, port = endpoint[len("tcp://") :].rpartition(":")
    if not host or not (port == "*" or port.isdigit() and 0 < int(port) < 65536):
        raise ValueError(
            f"listen on tcp://host:port with a port in 1..65535 (or *, any free "
            f"one); got {endpoint!r}"
        )
    if host not in LOOPBACK_HOSTS and not curve and not insecure:
        raise ValueError(
            f"{endpoint} is not a loopback address: anyone who reaches it could "
            f"publish and consume. Pass --curve (clients then need a key from "
            f"`warren keys`), or --insecure if the network is yours alone"
        )


def host_and_port(address: object, what: str, example: str) -> tuple[str, int]:
    """``(host, port)`` of a ``HOST:PORT`` address with a port in 0..65535 (the host's
    IPv6 brackets taken off); ValueError naming ``what``, with ``example``, otherwise."""
    if not isinstance(address, str) or "/" in address or ":" not in address:
        raise ValueError(f"{what} is HOST:PORT, {example}; got {address!r}")
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"{what} is HOST:PORT with a port in 0..65535, {example}; got {address!r}")
    return host.strip("[]"), int(port)


def with_free_port(endpoint: str) -> str:
    """``endpoint`` with its port ``*`` replaced by one free now: a restarted listener
    binds the same port as the first, so that its clients reconnect to it."""
    host, _, port = endpoint.rpartition(":")
    if port != "*":
        return endpoint
    with socket.socket(
        socket.AF_INET6 if ":" in host[len("tcp://") :] else socket.AF_INET
    ) as probe:
        probe.bind((host[len("tcp://") :].strip("[]"), 0))
        return f"{host}:{probe.getsockname()[1]}"


class ListenerActor(GatewayActor):
    """The listener process; see the module docstring."""

    figures_from_loop = False  # its counters and connections change on the gateway thread

    def __init__(
        self,
        data_dir: str,
        endpoint: str,
        *,
        control_endpoint: str,
        node_pid: int | None = None,
        curve: bool = False,
        consumer_silence_s: float = CONSUMER_SILENCE_S,
    ) -> None:
        """``node_pid``: the node's process, which a call to the node watches (without
        it, a call to a node that died waits out its timeout)."""
        self.data_dir = data_dir
        self.endpoint = endpoint
        self.control_endpoint = control_endpoint
        self.node_pid = node_pid
        self.curve = curve
        self.consumer_silence_s = consumer_silence_s
        self._gateway: _Gateway | None = None

    def on_start(self) -> None:
        self._gateway = _Gateway(
            self.data_dir,
            self.endpoint,
            self.control_endpoint,
            self.node_pid,
            self.curve,
            self.consumer_silence_s,
        )
        self.start_gateway(self._gateway, "warren-gateway")

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, ListenerStats):
            gateway = self._gateway
            assert gateway is not None, "on_start sets the gateway"
            return {
                "endpoint": gateway.bound,
                "curve": self.curve,
                "clients_consuming": len(gateway.consumers),
                "connections": len(gateway.connections),
                **gateway.counters,
            }
        raise UnhandledMessage(f"the listener does not handle {type(message).__name__}")


class _Gateway:
    """The gateway thread's state; every socket here is used by that thread alone."""

    def __init__(
        self,
        data_dir: str,
        endpoint: str,
        control_endpoint: str,
        node_pid: int | None,
        curve: bool,
        consumer_silence_s: float,
    ) -> None:
        self.data_dir = data_dir
        self.consumer_silence_s = consumer_silence_s
        self.stopping = threading.Event()
        self.counters = {
            "requests": 0,
            "malformed": 0,
            "refused": 0,
            "unanswerable": 0,
            "released_consumers": 0,
            "clients_refused": 0,
            "stale": 0,
            "connections_opened": 0,
            "connections_closed": 0,
        }
        self.connections: set[int] = set()  # file descriptors of the tcp connections open
        self.consumers: dict[bytes, tuple[float, set[str]]] = {}  # id -> (heard at, queues)
        self._context = zmq.Context()
        self._auth: ThreadAuthenticator | None = None
        self._router = self._context.socket(zmq.ROUTER)
        self._router.linger = 0
        self._router.router_mandatory = 1
        self._router.maxmsgsize = MAX_FRAME_BYTES
        if curve:
            public, secret = node_keys(data_dir)
            self._auth = ThreadAuthenticator(self._context, log=log)
            self._auth.start()
            self._auth.configure_curve_callback(
                "*", credentials_provider=_Authorized(data_dir, self.counters)
            )
            self._router.curve_server = True
            self._router.curve_publickey = public
            self._router.curve_secretkey = secret
        try:
            self._router.bind(endpoint)
        except zmq.ZMQError as exc:
            self.close()
            raise OSError(f"the listener cannot bind {endpoint}: {exc}") from None
        self.bound = self._router.getsockopt_string(zmq.LAST_ENDPOINT)
        self._connection_events = self._router.get_monitor_socket(
            zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED
        )
        self._node = RemoteNode(data_dir, endpoint=control_endpoint, pid=node_pid)
        self._calls_waiting: dict[tuple[bytes, int], str] = {}  # (client, id) -> op, in the pool
        self._pool = concurrent.futures.ThreadPoolExecutor(
            NODE_CALL_THREADS, thread_name_prefix="warren-node-call"
        )
        self._done: queue_module.SimpleQueue = queue_module.SimpleQueue()
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_read, False)
        self._decoder = Decoder()
        self._encoder = Encoder()
        self._addresses: dict[str, str] = {}  # queue -> its data address
        self._dealers: dict[str, zmq.Socket] = {}  # address -> DEALER
        self._forwarded: dict[int, tuple[bytes, int]] = {}  # our id -> (client, its id)
        self._ids = iter(range(1, 2**62))
        self._pid = os.getpid()
        self.boot = os.urandom(8)
        self._poller = zmq.Poller()
        self._poller.register(self._router, zmq.POLLIN)
        self._poller.register(self._wake_read, zmq.POLLIN)
        self._poller.register(self._connection_events, zmq.POLLIN)

    # ------------------------------------------------------------------ the loop

    def run(self) -> None:
        swept_at = time.monotonic()
        while not self.stopping.is_set():
            events = dict(self._poller.poll(100))
            if events.get(self._router):
                self._serve_clients()
            for dealer in [d for d in self._dealers.values() if events.get(d)]:
                self._forward_answers(dealer)
            if events.get(self._wake_read):
                self._send_node_answers()
            if events.get(self._connection_events):
                self._count_connections()
            if time.monotonic() - swept_at > min(SWEEP_S, self.consumer_silence_s / 2):
                swept_at = time.monotonic()
                self._release_silent_consumers()
        self._answer_calls_left()

    def _count_connections(self) -> None:
        while True:
            try:
                event = recv_monitor_message(self._connection_events, zmq.NOBLOCK)
            except zmq.Again:
                return
            fd = event["value"]
            if event["event"] == zmq.EVENT_ACCEPTED:
                self.connections.add(fd)
                self.counters["connections_opened"] += 1
            elif fd in self.connections:
                self.connections.discard(fd)
                self.counters["connections_closed"] += 1

    def _serve_clients(self) -> None:
        for _ in range(1000):
            try:
                frames = self._router.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self.counters["requests"] += 1
            client = frames[0].bytes
            try:
                request = self._decoder.decode(frames[1:])
            except (CodecError, ValueError, TypeError) as exc:
                self._malformed(client, None, f"the request does not decode: {exc}")
                continue
            self._serve(client, request)

    def _serve(self, client: bytes, request: Any) -> None:
        if (
            type(request) is not list
            or len(request) < 2
            or type(request[0]) is not str
            or type(request[1]) is not int
        ):
            self._malformed(client, None, "a request is a list [op, id, ...]")
            return
        op, request_id = request[0], request[1]
        if self._decoder.saw_unknown:
            unknown = find_unknown(request)
            self._refuse(
                client,
                request_id,
                "UnhandledMessage",
                unknown.reason
                if unknown is not None and unknown.malformed
                else "the request holds a message type the listener does not know",
            )
            return
        try:
            if op in ("ask", "tell") and len(request) == 6:
                if request[2] != self.boot:
                    # Sent to the listener before this one (queued in the client's socket
                    # while the node was down): the client has been told it was lost.
                    self.counters["stale"] += 1
                    if op == "ask":
                        self._refuse(
                            client,
                            request_id,
                            "ListenerRestarted",
                            "the listener restarted before this request reached "
                            "it; nothing of it was done",
                        )
                    return
                self._forward(client, op, request_id, *request[3:])
            elif (
                op == "call"
                and len(request) == 4
                and type(request[2]) is str
                and type(request[3]) is dict
            ):
                self._call(client, request_id, request[2], request[3])
            elif op == "alive" and len(request) == 4:
                queue, incarnation = request[2], request[3]
                if type(queue) is not str or type(incarnation) is not int:
                    raise ValueError("alive takes a queue name and an incarnation")
                self._in_pool(client, request_id, "alive", self._alive, queue, incarnation)
            elif op == "boot" and len(request) == 2:
                self._answer(client, wire.REPLY_OK, request_id, self.boot)
            elif op == "beat" and len(request) == 3 and type(request[2]) is list:
                now = time.monotonic()
                for consumer in request[2]:
                    if consumer in self.consumers:
                        self.consumers[consumer] = (now, self.consumers[consumer][1])
            else:
                self._malformed(client, request_id, f"no request {op!r} of {len(request)} parts")
        except (ValueError, TypeError) as exc:
            self._malformed(client, request_id, str(exc))

    # ------------------------------------------------------------------ queues

    def _forward(
        self, client: bytes, op: str, request_id: int, queue: Any, incarnation: Any, message: Any
    ) -> None:
        if type(queue) is not str or type(incarnation) is not int or incarnation < 1:
            raise ValueError("a queue message names the queue and its incarnation (>= 1)")
        if type(message) not in CLIENT_MESSAGES:
            self._refuse(
                client,
                request_id,
                "UnhandledMessage",
                f"a remote client may not send {type(message).__name__}",
            )
            return
        if isinstance(message, (Fetch, Subscribe)):
            message = dataclasses.replace(message, pid=self._pid)
            if type(message.consumer) is bytes and (
                isinstance(message, Subscribe) or message.ack_required
            ):
                self.consumers[message.consumer] = (
                    time.monotonic(),
                    self.consumers.get(message.consumer, (0, set()))[1] | {queue},
                )
        elif isinstance(message, Release):
            self.consumers.pop(message.consumer, None)
        address = self._addresses.get(queue)
        if address is None:
            # Rare (once per queue): ask the node here rather than through the pool, so
            # this request cannot overtake the ones after it.
            try:
                address = self._addresses[queue] = self._node.queue(queue).address
            except errors.QueueError as exc:
                self._refuse(client, request_id, type(exc).__name__, str(exc))
                return
        if op == "ask":
            ours = next(self._ids)
            self._forwarded[ours] = (client, request_id)
            frames = self._encoder.encode([wire.ASK, incarnation, ours, message])
        else:
            frames = self._encoder.encode([wire.TELL, incarnation, 0, message])
        if not self._send_to_queue(address, frames) and op == "ask":
            del self._forwarded[ours]
            self._refuse(
                client,
                request_id,
                "MailboxFull",
                f"queue {queue!r} did not take the request within {SEND_TIMEOUT_S} s",
            )

    def _send_to_queue(self, address: str, frames: list[Any]) -> bool:
        dealer = self._dealers.get(address)
        if dealer is None:
            dealer = self._dealers[address] = self._context.socket(zmq.DEALER)
            dealer.linger = wire.LINGER_MS
            dealer.sndhwm = wire.DEFAULT_MAILBOX_SIZE
            dealer.connect(address)
            self._poller.register(dealer, zmq.POLLIN)
        try:
            dealer.send_multipart(frames, zmq.NOBLOCK, copy=False)
            return True
        except zmq.Again:
            if dealer.poll(int(SEND_TIMEOUT_S * 1000), zmq.POLLOUT):
                dealer.send_multipart(frames, zmq.NOBLOCK, copy=False)
                return True
            return False

    def _forward_answers(self, dealer: zmq.Socket) -> None:
        while True:
            try:
                frames = dealer.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            try:
                kind, ours, value = self._decoder.decode(frames)
            except (CodecError, ValueError, TypeError):
                self.counters["malformed"] += 1
                continue
            waiting = self._forwarded.pop(ours, None)
            if waiting is not None:
                self._answer(waiting[0], kind, waiting[1], value)

    def _release_silent_consumers(self) -> None:
        now = time.monotonic()
        for consumer, (heard_at, queues) in list(self.consumers.items()):
            if now - heard_at > self.consumer_silence_s:
                del self.consumers[consumer]
                self.counters["released_consumers"] += 1
                log.info(
                    "listener: a remote consumer was silent for %.0f s; its deliveries "
                    "go back to %s",
                    now - heard_at,
                    ", ".join(sorted(queues)),
                )
                frames = self._encoder.encode([wire.TELL, 0, 0, Release(consumer)])
                for queue in queues:
                    if queue in self._addresses:
                        self._send_to_queue(self._addresses[queue], frames)

    # ------------------------------------------------------------------ the node

    def _call(self, client: bytes, request_id: int, op: str, args: dict) -> None:
        if op not in NODE_CALLS:
            self._refuse(
                client,
                request_id,
                "ValueError",
                f"no call {op!r}; the calls are {sorted(NODE_CALLS)}",
            )
        elif op == "active_alarms":
            self._answer(client, wire.REPLY_OK, request_id, read_alarms(self.data_dir))
        else:
            self._in_pool(client, request_id, op, self._node_call, op, args)

    def _node_call(self, op: str, args: dict) -> Any:
        if op == "queue":
            ref = self._node.queue(**args)
            return {
                "name": args.get("name"),
                "incarnation": ref.incarnation,
                "address": ref.address,
                "stream": ref.name.startswith(STREAM_ACTOR_PREFIX),
            }
        return getattr(self._node, op)(**args)

    def _alive(self, queue: str, incarnation: int) -> list:
        try:
            ref = self._node.queue(queue)
        except errors.NodeNotRunning:
            if self._node.gone():
                raise  # answered NodeLost
            return [True, self.boot]  # slow to answer: wait on
        except errors.NotFound:
            return [False, self.boot]
        except errors.QueueError:
            return [True, self.boot]  # between incarnations: wait on
        if ref.incarnation != incarnation:
            return [False, self.boot]
        return [process_exists(ref.pid), self.boot]

    def _in_pool(
        self, client: bytes, request_id: int, op: str, function: Callable[..., Any], *args: Any
    ) -> None:
        def run() -> None:
            try:
                result = (wire.REPLY_OK, function(*args))
            except errors.NodeNotRunning as exc:
                name = NodeLost.__name__ if self._node.gone() else type(exc).__name__
                result = (wire.REPLY_ERROR, [name, str(exc), ""])
            except Exception as exc:  # every call is answered, whatever it holds
                result = (wire.REPLY_ERROR, [type(exc).__name__, str(exc), ""])
            self._done.put((client, request_id, result))
            os.write(self._wake_write, b"x")

        self._calls_waiting[client, request_id] = op
        self._pool.submit(run)

    def _answer_calls_left(self) -> None:
        """The listener stops (with its node, most often): every call still waiting for
        the node is answered ``NodeLost`` now, or its client would wait for an answer
        that never comes until it takes the listener's silence for its death."""
        self._send_node_answers()
        for (client, request_id), op in self._calls_waiting.items():
            text = f"the listener stopped before the node answered {op}"
            self._answer(client, wire.REPLY_ERROR, request_id, [NodeLost.__name__, text, ""])
        if self._calls_waiting:
            self._router.linger = LAST_ANSWERS_LINGER_MS  # sent before the socket closes
        self._calls_waiting.clear()

    def _send_node_answers(self) -> None:
        drain_wake_pipe(self._wake_read)
        while True:
            try:
                client, request_id, (kind, value) = self._done.get_nowait()
            except queue_module.Empty:
                return
            self._calls_waiting.pop((client, request_id), None)
            if (
                kind == wire.REPLY_OK
                and isinstance(value, dict)
                and "address" in value
                and "incarnation" in value
            ):
                self._addresses[value["name"]] = value.pop("address")
            self._answer(client, kind, request_id, value)

    # ------------------------------------------------------------------ answers

    def _answer(self, client: bytes, kind: int, request_id: int, value: Any) -> None:
        try:
            self._router.send_multipart(
                [client, *self._encoder.encode([kind, request_id, value])], zmq.NOBLOCK, copy=False
            )
        except zmq.ZMQError:  # the client has gone, or reads nothing
            self.counters["unanswerable"] += 1

    def _refuse(self, client: bytes, request_id: int, type_name: str, text: str) -> None:
        self.counters["refused"] += 1
        self._answer(client, wire.REPLY_ERROR, request_id, [type_name, text, ""])

    def _malformed(self, client: bytes, request_id: int | None, text: str) -> None:
        self.counters["malformed"] += 1
        log.warning("listener: a malformed request: %s", text)
        if request_id is not None:
            self._answer(client, wire.REPLY_ERROR, request_id, ["ValueError", text, ""])

    def stop(self) -> None:
        self.stopping.set()

    def close(self) -> None:
        if getattr(self, "_pool", None) is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        if getattr(self, "_connection_events", None) is not None:
            self._router.disable_monitor()
            self._connection_events.close(linger=0)
        self._router.close()  # its linger: 0, or time for the last answers
        for dealer in getattr(self, "_dealers", {}).values():
            dealer.close(linger=0)
        if self._auth is not None:
            self._auth.stop()
        self._context.term()


class _Authorized:
    """ZAP's CURVE check: the public keys of ``authorized_keys``, read again when the file
    changes; every refusal is logged and counted."""

    def __init__(self, data_dir: str, counters: dict[str, int]) -> None:
        self.path = os.path.join(data_dir, AUTHORIZED_FILE)
        self.data_dir = data_dir
        self.counters = counters
        self._stamp: tuple[int, int] | None = None
        self._keys: dict[bytes, str] = {}

    def callback(self, domain: str, key: bytes) -> bool:
        try:
            status = os.stat(self.path)
            stamp = (status.st_mtime_ns, status.st_size)
        except FileNotFoundError:
            stamp = None
        if stamp != self._stamp:
            self._keys = authorized_keys(self.data_dir)
            self._stamp = stamp
        if key in self._keys:
            return True
        self.counters["clients_refused"] += 1
        log.warning("listener: refused a client whose key %s is not in %s", key.decode(), self.path)
        return False

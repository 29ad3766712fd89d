"""``Node``: one Warren broker node — the supervision tree on a data directory.

``Node(data_dir)`` takes the data directory's lock (one node per directory: a second gets
``NodeLocked``), starts the actor runtime (its forkserver and private ipc directory), and
boots the tree of the design, with the children that exist so far::

    node (rest_for_one)
    ├── cluster_sup (one_for_one) with ``cluster=``: the coordinator (``warren.supervisor.
    │   └── coordinator           cluster``), first, so no other child's crash restarts it
    ├── gc_sup (one_for_one)      a GC crash restarts the GC alone
    │   └── msg_store_gc
    ├── msg_store_persistent      <data_dir>/msg_store_persistent
    ├── msg_store_transient       <data_dir>/msg_store_transient, emptied at every start
    ├── wal                       quorum queues' write-ahead log, <data_dir>/quorum/wal
    │                             (``warren.queues.broker.wal_actor``)
    ├── queue_sup (one_for_one)   one child per declared queue or stream
    ├── app_sup (one_for_one)     the application's own children, ``Node(children=...)``
    └── listener                  with ``listen="tcp://127.0.0.1:5673"``: remote clients
                                  (``warren.queues.broker.listener``; ``curve=True`` requires
                                  their keys; a port ``*`` is any free one, kept across
                                  the listener's restarts, and ``listen_endpoint`` says
                                  which)
    └── amqp                      with ``amqp="127.0.0.1:5672"``: AMQP 0-9-1 clients
                                  (``warren.queues.amqp.server``; port 0 is any free
                                  one, kept across restarts; ``amqp_endpoint`` says which;
                                  TLS with ``amqp_certfile`` and ``amqp_keyfile``)

With ``http="127.0.0.1:15692"`` the node also serves its figures over HTTP from its own
process, for Prometheus, as JSON and as a management page (``warren.supervisor.node.
http_endpoint``): bound before the tree starts (a port in use fails the start at once),
port 0 any free one, ``http_endpoint`` the address, stopped first when the node closes.

A store crash restarts everything after it (its clients' state is stale; a persistent
store's crash also restarts, so empties, the transient store). The stores get minutes to
stop and to start (``STORE_SHUTDOWN_S``, ``STORE_START_TIMEOUT_S``): writing or reading
the recovery files of a large store takes time, and a store killed while writing them
recovers dirty. ``ref_counts`` is a picklable function the persistent store calls at a
dirty start for its reference counts; by default a walker over the queue indexes in
``<data_dir>/queues/`` (``warren.queues.node_ref_counts``), which leaves the store its own
stand-in counts when the node never had a queue.

It then checks the resource alarms every ``check_interval_s`` and tells every actor of
each change (``ProcessActor.on_alarm``), and an actor (re)started while an alarm is raised
within one interval of its start, and answers ``warren status`` on a ZeroMQ ROUTER
socket in its runtime directory, whose address it writes to ``<data_dir>/node.json``.

``close()`` (or leaving the ``with``) stops the tree in reverse order, then the runtime,
and releases the lock. No supervisor of the tree restarts anything once the stop has
begun, so actors that stopped on a signal of their own meanwhile (systemd signals every
process of the node at once) stay stopped.

Running until a signal: ``run_until_signalled()`` is what a program that runs a node in
the foreground calls (``warren node`` does) on its main thread. It installs handlers for
SIGTERM, SIGINT and SIGHUP (``STOP_SIGNALS``), waits until one arrives or the root
supervisor gives up, stops the node in order (``close``), restores the previous handlers
and returns the signal's number (``None`` when the node failed). The handlers stay in
place until the node is closed, so a second Ctrl-C while the stores write their recovery
files does not cut the stop short. A signal that arrives while the node is being built
is not lost if the caller blocked ``STOP_SIGNALS`` first (``signal.pthread_sigmask``):
``run_until_signalled`` unblocks them, and a pending one is delivered at once. The
forkserver and the actors live in a process group of their own, so a signal to the
node's group (a terminal's Ctrl-C, ``timeout``, ``kill -- -PGID``) reaches this process
alone; an actor that gets a SIGTERM or SIGHUP of its own stops in order.

If the root supervisor gives up (its restart intensity exceeded), the node stops
everything and ``failed`` is set; ``warren node`` then exits with ``EXIT_NODE_FAILED``.

A node killed with SIGKILL cannot clean up: the next node on the same data directory,
holding the lock and so sure the other is dead, removes the ipc directory it left, and
finishes the queue deletes it left undone (before the stores start: see Deletes in
``warren.queues.broker.definitions``). A deleted queue never comes back: ``delete_queue``
writes its tombstone, saves the definitions without it, then removes its messages and
files; a refused save leaves the queue whole (its tombstone, to the next start: the
save may have reached the disk all the same), and a crash
or a refused removal after the save leaves the files to the next declare of the name or
the next start, which remove them rather than recover them. A queue that deleted itself
(``auto_delete``, or unused for its ``expires_ms``) does not come back either: it writes
the same tombstone first, and its process, restarted or started at boot in the middle of
that delete, finishes it.

Races: the lock is taken before anything else is created, so a second node never binds
over the first one's ipc paths; ``node.json`` is written after the status socket is
bound and removed before it closes, so a ``warren status`` that finds the file but no
answer reports the node as not answering rather than hanging (its request has a timeout).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import functools
import json
import logging
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import zmq

from warren.actors import ActorError, ActorRef, ProcessActor
from warren.actors import Node as ActorNode
from warren.actors.process import process_exists
from warren.actors.runtime_dir import create_runtime_dir
from warren.queues.amqp.server import (
    AmqpActor,
    AmqpStats,
    TlsFiles,
    check_amqp_address,
    free_port,
)
from warren.queues.amqp.session import is_loopback
from warren.queues.amqp.users import USERS_FILE
from warren.queues.broker.definitions import (
    DEFINITIONS_FILE,
    Definitions,
    ExchangeDefinition,
    mark_deleted,
    queue_directory,
)
from warren.queues.broker.listener import (
    ListenerActor,
    ListenerStats,
    check_listen_address,
    host_and_port,
    with_free_port,
)
from warren.queues.broker.queue_actor import STORES, QueueActor
from warren.queues.broker.quorum_actor import QuorumQueueActor
from warren.queues.broker.stream_actor import StreamActor
from warren.queues.broker.wal_actor import WAL_NAME, WalActor
from warren.queues.client.connection import Connection
from warren.queues.client.ipc_node import NODE_FILE, write_alarms
from warren.queues.client.keys import NODE_PUBLIC_FILE
from warren.queues.engine.ref_counts import (
    node_clean_clients,
    node_message_count,
    node_ref_counts,
)
from warren.queues.errors import (
    InvalidArgument,
    NodeStarting,
    NotFound,
    NotLeader,
    QueueDown,
    QueueError,
    QueueRestarting,
)
from warren.queues.protocol import (
    NODE_CALLS,
    REPLICATION_ALARM,
    STREAM_ACTOR_PREFIX,
    SUPER_STREAM_TYPE,
    DeleteQueue,
    QueueDefinition,
    QueueStats,
    check_name,
    declared_queue,
    super_stream_partitions,
)
from warren.queues.routing import EXCHANGE_KINDS
from warren.store import replicated_io
from warren.store.engine.message_store import DEFAULT_GC, FILE_SIZE_LIMIT_BYTES, GC_MODES
from warren.store.gc_actor import GCActor
from warren.store.protocol import StoreStats
from warren.store.replication_link import committer_to
from warren.store.store_actor import MessageStoreActor

from ..cluster.coordinator import (
    COORDINATOR_NAME,
    CoordinatorStats,
    FollowData,
    LeadData,
    Resync,
    checked_node_id,
    coordinator_spec,
)
from ..cluster.election import LEASE_TTL_S
from ..cluster.settings import MIN_INSYNC, ClusterSettings
from ..cluster.tcp_proxy import TcpProxy
from ..errors import InvalidSpec, NodeLocked, NotANodeDirectory, SupervisorError
from ..specs import (
    HEARTBEAT_INTERVAL_S,
    STORE_SHUTDOWN_S,
    ChildSpec,
    SupervisorFlags,
    SupervisorSpec,
    check_seconds,
)
from ..supervisor import RestartCounts, Supervisor
from ..tables import counted
from ..version import __version__
from .alarms import AlarmChange, AlarmLimits, ResourceMonitor
from .http_endpoint import HttpEndpoint, check_http_address
from .metrics import NodeFigures

log = logging.getLogger("warren.node")

LOCK_FILE = "node.lock"
# Room the node keeps in its data directory for its own small files (the node file, the
# alarms): a node started on a disk full to the last byte gives it up to write them.
RESERVE_FILE = "node.reserve"
RESERVE_BYTES = 64 * 1024
# What a node's data directory holds: a directory with files but none of these is not one
# (the key files are there once `warren keys` ran, even before the node's first start).
# A directory holding one of them is a node's (the AMQP users may be added before its start).
NODE_FILES = (LOCK_FILE, DEFINITIONS_FILE, "msg_store_persistent", NODE_PUBLIC_FILE, USERS_FILE)
STATUS_TIMEOUT_MS = 5000
SIGNAL_LOOK_S = 0.5  # how often run_until_signalled looks for a stop signal's handler
STATS_TIMEOUT_S = 2.0
ROOT_FLAGS = SupervisorFlags("rest_for_one", intensity=3, period_s=60.0)
SUB_FLAGS = SupervisorFlags("one_for_one", intensity=10, period_s=60.0)
# queue_sup: the queues recover side by side at a start (see SupervisorFlags)
QUEUES_STARTED_TOGETHER = 8
QUEUE_SUP_FLAGS = SupervisorFlags(
    "one_for_one", intensity=10, period_s=60.0, start_together=QUEUES_STARTED_TOGETHER
)
STORE_START_TIMEOUT_S = 600.0
# The stores, the GC and the queues do their disk work on their loop thread (an fsync, a
# combine's copy): a slow disk must not make them look hung (seconds; ``Node``'s
# ``heartbeat_timeout_s``, which a crash-recovery harness lowers to see a frozen one
# replaced within its run).
STORE_HEARTBEAT_TIMEOUT_S = 60.0
# Their beats: one every twelfth of that timeout, at least HEARTBEAT_INTERVAL_S apart (5 s
# by default). Pinged every second, a thousand queues cost the node's process a twentieth
# of a core, and each queue a wake-up a second; hung is still a dozen beats missed.
BEATS_PER_HEARTBEAT_TIMEOUT = 12
# What the runtime's close gives actors still alive after the tree stopped (seconds).
STORE_CLOSE_TIMEOUT_S = 60.0
LISTENER_NAME = "listener"  # the actor remote clients reach (Node(listen=...))
AMQP_NAME = "amqp"  # the AMQP 0-9-1 port's actor (Node(amqp=...))
CLUSTER_SUP = "cluster_sup"  # the coordinator's supervisor (Node(cluster=...))
COMMIT_SOCKET = "replication"  # in the runtime directory: where the node's writers commit
LEADERSHIP_LOOK_S = 0.2  # how often a node in a cluster looks whether it leads
# In a cluster, the supervisor of the node's data part (stores, queues, listeners, the
# application's children): temporary under the root, so that when it gives up (its
# restarts refused once the node no longer leads) the node follows on, and starts it
# again once it leads.
DATA_SUP = "data"
# What other processes may call on the node through its control socket (warren.connect).
QUEUE_SUP_PREFIX = "queue_sup "  # each queue's own supervisor, under queue_sup
QUEUE_ACTORS: dict[str, type[ProcessActor]] = {  # each type of queue's process
    "classic": QueueActor,
    "quorum": QuorumQueueActor,
    "stream": StreamActor,
}
QUEUE_FLAGS = SupervisorFlags("one_for_one", intensity=3, period_s=60.0)
QUEUE_PREFIX = "queue "  # a queue's actor name, and so its title: "warren: queue orders"
# How the error of a change the disk refused ends: it did not happen; for a delete of a
# queue that deletes itself (auto_delete, expires_ms) whose save failed, the tombstone it
# keeps decides the delete.
NOTHING_CHANGED = "nothing changed, try again once the disk is writable"
DELETED_AT_NEXT_START = (
    "the queue deletes itself and stays marked deleted (the save may have reached the "
    "disk): it serves on, and its delete completes at the queue's next start (a restart "
    "of its process or of the node), messages and all"
)
# What ``run_until_signalled`` stops on: a service manager's stop, Ctrl-C, a closed terminal.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
PRELOAD = (
    "warren.store",
    "warren.store.replication_link",  # in a cluster, it enables the forks' journals
    "warren.store.store_actor",
    "warren.store.gc_actor",
    "warren.store.protocol",
    "warren.queues.broker.queue_actor",
    "warren.queues.broker.stream_actor",
    "warren.queues.broker.listener",
)


class Node:
    """A Warren node on ``data_dir``; see the module docstring."""

    def __init__(
        self,
        data_dir: str | os.PathLike,
        *,
        name: str = "warren",
        children: Iterable[ChildSpec | SupervisorSpec] = (),
        alarm_limits: AlarmLimits | None = None,
        file_size_limit: int = FILE_SIZE_LIMIT_BYTES,
        sync_policy: str = "fsync",
        store_gc: str = DEFAULT_GC,
        ref_counts: Callable[[], Iterable[tuple[bytes, int]] | None] | None = None,
        preload: tuple[str, ...] = (),
        log_level: int | str | None = None,
        listen: str | None = None,
        curve: bool = False,
        insecure: bool = False,
        listener_options: dict[str, Any] | None = None,
        heartbeat_timeout_s: float = STORE_HEARTBEAT_TIMEOUT_S,
        http: str | None = None,
        amqp: str | None = None,
        amqp_certfile: str | None = None,
        amqp_keyfile: str | None = None,
        cluster: str | None = None,
        etcd: str | Sequence[str] | None = None,
        peer: str | None = None,
        cluster_ttl_s: int = LEASE_TTL_S,
        min_insync: int = MIN_INSYNC,
        peer_listen: str | None = None,
    ) -> None:
        starting_at = time.monotonic()
        self.started_at = time.time()  # when the node began to start, in epoch seconds
        if not os.fspath(data_dir):
            raise InvalidSpec("data_dir", data_dir, "must name a directory")
        if listen is not None:
            try:
                check_listen_address(listen, curve=curve, insecure=insecure)
            except ValueError as exc:
                raise InvalidSpec("listen", listen, str(exc)) from None
        elif curve:
            raise InvalidSpec("curve", curve, "CURVE protects a listener: pass listen too")
        if store_gc not in GC_MODES:
            raise InvalidSpec("store_gc", store_gc, f"expected one of {', '.join(GC_MODES)}")
        if http is not None:
            try:
                check_http_address(http, insecure=insecure)
            except ValueError as exc:
                raise InvalidSpec("http", http, str(exc)) from None
        amqp_address: tuple[str, int] | None = None
        amqp_tls = amqp_tls_files(amqp, amqp_certfile, amqp_keyfile)
        if amqp is not None:
            try:
                amqp_address = check_amqp_address(amqp, tls=amqp_tls, insecure=insecure)
            except ValueError as exc:
                raise InvalidSpec("amqp", amqp, str(exc)) from None
        cluster_settings = None
        if cluster is not None:
            try:
                cluster_settings = ClusterSettings.checked(
                    cluster, etcd, peer, cluster_ttl_s, min_insync, peer_listen
                )
            except ValueError as exc:
                raise InvalidSpec("cluster", cluster, str(exc)) from None
        elif etcd is not None or peer is not None or peer_listen is not None:
            raise InvalidSpec(
                "cluster", cluster, "etcd, peer and peer_listen go with a cluster's name"
            )
        # In a cluster the AMQP port keeps one port for the node's life: while the node
        # leads, its address is told to the others, whose AMQP ports forward to it.
        self._amqp_forwarded_from: tuple[str, int] | None = None
        if cluster_settings is not None and amqp_address is not None:
            amqp_address = (amqp_address[0], free_port(*amqp_address))
            cluster_settings = dataclasses.replace(
                cluster_settings, amqp=amqp_reached_at(amqp_address, cluster_settings.peer)
            )
            self._amqp_forwarded_from = amqp_address
        self._amqp_forwarder: TcpProxy | None = None
        # the leader's epoch and AMQP address it forwards to (a new epoch: new connections)
        self._amqp_forwarding_to: tuple[int | None, str] | None = None
        self._amqp_refused: str | None = None  # the last target refused, logged once
        check_seconds("heartbeat_timeout_s", heartbeat_timeout_s, at_least=2)  # beats: 1 s
        self._heartbeat_timeout_s = float(heartbeat_timeout_s)
        self._heartbeat_interval_s = max(
            HEARTBEAT_INTERVAL_S, self._heartbeat_timeout_s / BEATS_PER_HEARTBEAT_TIMEOUT
        )
        self.data_dir = os.path.abspath(os.fspath(data_dir))
        check_node_directory(self.data_dir)
        self.cluster = cluster_settings.cluster if cluster_settings else None
        if cluster_settings is not None:  # EtcdUnavailable, ClusterMismatch: nothing written
            node_id = checked_node_id(cluster_settings, self.data_dir, name)
        if ref_counts is None:
            ref_counts = functools.partial(node_ref_counts, self.data_dir)
        self.name = name
        self.limits = alarm_limits or AlarmLimits()
        os.makedirs(self.data_dir, exist_ok=True)
        self._lock_fd = os.open(
            os.path.join(self.data_dir, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644
        )
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise NodeLocked(f"a node already runs on {self.data_dir}") from None
        coordinator: tuple[SupervisorSpec, ...] = ()
        # In a cluster the node makes its runtime directory itself: the processes it
        # starts commit their writes to a socket there (see Leadership below).
        self._runtime_dir: str | None = None
        self._commit_endpoint: str | None = None
        if cluster_settings is not None:
            try:
                heartbeats = (self._heartbeat_interval_s, self._heartbeat_timeout_s)
                self._runtime_dir = create_runtime_dir()
                self._commit_endpoint = f"ipc://{self._runtime_dir}/{COMMIT_SOCKET}"
                coordinator_child = coordinator_spec(
                    cluster_settings,
                    self.data_dir,
                    name,
                    node_id,
                    heartbeats,
                    self._commit_endpoint,
                )
            except BaseException:
                if self._runtime_dir is not None:
                    shutil.rmtree(self._runtime_dir, ignore_errors=True)
                os.close(self._lock_fd)
                raise
            # First, under a supervisor of its own: the root restarts what comes after a
            # crashed child, and a restarted coordinator gives its lease (and the
            # leadership) back, so a store's or the listener's crash must not reach it.
            coordinator = (SupervisorSpec(CLUSTER_SUP, SUB_FLAGS, children=(coordinator_child,)),)
        self._remove_leftovers()
        self._opened_definitions: Definitions | None = None
        self._definitions_lock = threading.Lock()
        self._data_lock = threading.Lock()  # a start or a stop of the data part at a time
        self._data_running = False  # the processes that write the data directory run
        self._data_starting = False  # they are being started (a leader's recovery)
        self._led_epoch: int | None = None  # the epoch they were started under
        self._data_epoch: int | None = None  # the leadership the data part last started in
        if cluster_settings is None:
            self._open_definitions()
        self.failed = threading.Event()
        self._stop_wanted = threading.Event()  # a stop signal arrived, or the root failed
        self._closing = threading.Event()
        self._started = threading.Event()  # the whole tree is up: calls are served
        # How many messages the start recovers (``_recovering``): counted once, at the first
        # question, not at every poll of every client waiting for the start.
        self._recovering_count: int | None = None
        self.counters = {"malformed_status_requests": 0, "refused_control_calls": 0}
        self.actors: ActorNode | None = None
        self.listen_endpoint: str | None = None  # where remote clients connect
        self.amqp_endpoint: str | None = None  # where AMQP clients connect, host:port
        self.amqp_tls = amqp_tls is not None  # whether they connect with TLS alone
        self.http_endpoint: str | None = None  # where the figures are served over HTTP
        self.start_duration_s: float | None = None  # how long the start took
        self._http: HttpEndpoint | None = None
        self.root: Supervisor | None = None
        self._status_socket: zmq.Socket[bytes] | None = None
        self._threads: list[threading.Thread] = []
        try:
            with _replicated_environment(self.data_dir, self._commit_endpoint):
                self.actors = ActorNode(
                    name=name,
                    runtime_dir=self._runtime_dir,
                    preload=PRELOAD + tuple(preload),
                    log_level=log_level,
                )
            if self._commit_endpoint is not None:
                replicated_io.enable(self.data_dir, committer_to(self._commit_endpoint))
            store_options = {
                "file_size_limit": file_size_limit,
                "sync_policy": sync_policy,
                "gc": store_gc,
            }
            stores = tuple(
                ChildSpec(
                    store,
                    MessageStoreActor,
                    (os.path.join(self.data_dir, store),),
                    {
                        **store_options,
                        "transient": store == "msg_store_transient",
                        "ref_counts": ref_counts if store == "msg_store_persistent" else None,
                        "clean_clients": (
                            functools.partial(node_clean_clients, self.data_dir)
                            if store == "msg_store_persistent"
                            else None
                        ),
                    },
                    shutdown_s=STORE_SHUTDOWN_S,
                    start_timeout_s=STORE_START_TIMEOUT_S,
                    heartbeat_interval_s=self._heartbeat_interval_s,
                    heartbeat_timeout_s=self._heartbeat_timeout_s,
                )
                for store in STORES
            )
            self.status_endpoint = f"ipc://{self.actors.runtime_dir}/status"
            self.alarms = ResourceMonitor(self.data_dir, self.limits, self._pids)
            # Answer from the start: `warren status` says the node is starting, and a
            # client's call is told so at once (connect(wait=...) waits for the start).
            status_socket: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.ROUTER)
            self._status_socket = status_socket
            status_socket.linger = 0
            status_socket.router_mandatory = 1
            status_socket.bind(self.status_endpoint)
            self._start_thread(self._serve_status, "warren-status")
            if http is not None:
                self._http = HttpEndpoint(
                    http,
                    NodeFigures(
                        self,
                        queue_prefix=QUEUE_PREFIX,
                        stream_prefix=STREAM_ACTOR_PREFIX,
                        stores=STORES,
                        listener=LISTENER_NAME,
                        amqp=AMQP_NAME,
                        wal=WAL_NAME,
                        coordinator=COORDINATOR_NAME,
                    ),
                )
                self.http_endpoint = self._http.endpoint
            self._with_room(self._write_node_file)

            def data_children() -> tuple[ChildSpec | SupervisorSpec, ...]:
                listener = (
                    ()
                    if listen is None
                    else (
                        ChildSpec(
                            LISTENER_NAME,
                            ListenerActor,
                            (self.data_dir, with_free_port(listen)),
                            {
                                "control_endpoint": self.status_endpoint,
                                "node_pid": os.getpid(),
                                "curve": curve,
                                **(listener_options or {}),
                            },
                        ),
                    )
                )
                amqp_port = (
                    ()
                    if amqp_address is None
                    else (
                        ChildSpec(
                            AMQP_NAME,
                            AmqpActor,
                            (
                                self.data_dir,
                                amqp_address[0],
                                free_port(*amqp_address),
                                __version__,
                                amqp_tls,
                            ),
                        ),
                    )
                )
                return (
                    SupervisorSpec(
                        "gc_sup",
                        SUB_FLAGS,
                        children=(
                            ChildSpec(
                                "msg_store_gc",
                                GCActor,
                                heartbeat_interval_s=self._heartbeat_interval_s,
                                heartbeat_timeout_s=self._heartbeat_timeout_s,
                            ),
                        ),
                    ),
                    *stores,
                    ChildSpec(
                        WAL_NAME,
                        WalActor,
                        (self.data_dir,),
                        {"term": self._led_epoch or 1},  # a cluster's epoch: the log's term
                        shutdown_s=STORE_SHUTDOWN_S,
                        start_timeout_s=STORE_START_TIMEOUT_S,
                        heartbeat_interval_s=self._heartbeat_interval_s,
                        heartbeat_timeout_s=self._heartbeat_timeout_s,
                    ),
                    self._queue_sup_spec(),
                    SupervisorSpec("app_sup", SUB_FLAGS, children=tuple(children)),
                    *listener,
                    *amqp_port,
                )

            self._data_children = data_children
            self._serves = (listen is not None, amqp is not None)
            spec = SupervisorSpec(
                "node",
                ROOT_FLAGS,
                children=coordinator if cluster_settings is not None else data_children(),
            )
            self.root = Supervisor(
                self.actors,
                spec,
                on_failure=self._root_failed,
                restart_counts=(
                    _ResyncOnRestart(self) if cluster_settings is not None else RestartCounts()
                ),
            ).start()
            self._start_thread(self._watch_resources, "warren-alarms")
            if cluster_settings is None:
                self._data_started()
            else:
                self._start_thread(self._follow_leadership, "warren-leadership")
            self._with_room(functools.partial(write_alarms, self.data_dir, self.alarms.active))
            self.start_duration_s = time.monotonic() - starting_at
            self._started.set()
            self._with_room(self._write_node_file)
            self._keep_reserve()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ public

    @property
    def app(self) -> Supervisor:
        """The supervisor of the application's own children (``start_child`` adds more)."""
        return self._supervisor("app_sup")

    def store(self, name: str = "msg_store_persistent") -> ActorRef:
        """The ref of a store actor (follows its restarts)."""
        ref = self._actor_node.whereis(name)
        if ref is None:
            raise KeyError(f"no {name} is running")
        return ref

    # ------------------------------------------------------------------ queues

    def declare_queue(self, name: str, *, passive: bool = False, **arguments: Any) -> dict:
        """Create the queue (a process under ``queue_sup``) unless it exists; a durable
        one is kept in the definitions and started at every boot. Re-declaring with other
        arguments raises ``PreconditionFailed``. An ``auto_delete`` queue deletes itself
        when its last consumer stops (one that never had a consumer stays), an
        ``expires_ms`` one once unused that long (a declare counts as a use). The
        arguments are ``QueueDefinition``'s (``durable``, ``lazy``, ``message_ttl_ms``,
        ``max_length``, ``overflow``, ``dead_letter_exchange``, ``dead_letter_routing_key``,
        ``auto_delete``, ``expires_ms``; with
        ``type="stream"``, a stream's: ``max_length_bytes``, ``max_age``,
        ``max_segment_size_bytes``, ``sync_policy``; its process is ``warren: stream NAME``).
        ``passive`` creates nothing: ``NotFound`` unless the queue exists. Either way the
        answer is AMQP's declare-ok: ``{"queue", "message_count", "consumer_count"}``
        (the messages ready, the consumers subscribed), the counts None while the queue's
        process does not answer (restarting, or down): declaring a queue that exists
        succeeds whatever state its process is in."""
        if passive:
            if arguments:
                raise TypeError("a passive declare takes no queue arguments")
            partitions = self._definitions.partitions(name)
            if partitions is not None:
                return self._super_stream_declared(name, partitions)
            if name not in self._definitions.queues:
                raise NotFound(f"no queue {name!r} on this node (a passive declare creates none)")
            return self._declared(name)
        if arguments.get("type") == SUPER_STREAM_TYPE:
            return self._declare_super_stream(name, super_stream_partitions(name, arguments))
        definition = declared_queue(check_name(name), arguments)
        existing = self._definitions.queues.get(name)
        if existing is not None and existing.super_stream is not None and definition.is_stream:
            # a partition declared again as the stream it is (an AMQP client's habit)
            definition = dataclasses.replace(
                definition, super_stream=existing.super_stream, partition=existing.partition
            )
        created_empty = False
        with self._definitions_lock:
            if self._deleted_itself(name):  # a new queue of the name, not the one gone
                self._forget_deleted_itself(name)
            self._finish_delete_before(name, f"queue {name!r} was not declared")
            if self._definitions.add_queue(definition):
                # Nothing on disk to recover: the queue starts empty, and its counts
                # need no question to its process (a directory left without a
                # definition may hold messages: that queue is asked).
                created_empty = not os.path.exists(queue_directory(self.data_dir, name))
                # On disk before its process starts: a failed save leaves nothing to undo
                # but the definition (see _definitions_changed), and a crash after it
                # starts the queue at the next boot.
                self._definitions_changed(f"queue {name!r} was not declared")
                try:
                    if not definition.durable:
                        self._definitions.mark_transient(name)
                    self._supervisor("queue_sup").start_child(self._queue_spec(definition))
                except BaseException:
                    self._definitions.remove_queue(name)
                    self._taken_back(f"queue {name!r} stays declared")
                    raise
        if created_empty:
            return {"queue": name, "message_count": 0, "consumer_count": 0}
        return self._declared(name)

    def _declare_super_stream(self, name: str, partitions: list[QueueDefinition]) -> dict:
        """Declare super stream ``name`` with its partition streams (see Super streams in
        ``warren.queues.broker.definitions``): saved at once, then each partition's
        process started; one that does not start takes the whole declare back."""
        with self._definitions_lock:
            for partition in partitions:
                self._finish_delete_before(
                    partition.name, f"super stream {name!r} was not declared"
                )
            if self._definitions.add_super_stream(name, partitions):
                self._definitions_changed(f"super stream {name!r} was not declared")
                queue_sup = self._supervisor("queue_sup")
                started: list[str] = []
                try:
                    for partition in partitions:
                        queue_sup.start_child(self._queue_spec(partition))
                        started.append(QUEUE_SUP_PREFIX + partition.name)
                except BaseException:
                    for child in started:
                        queue_sup.terminate_child(child)
                    for partition in partitions:
                        self._definitions.remove_queue(partition.name)
                    self._definitions.remove_exchange(name)
                    self._taken_back(f"super stream {name!r} stays declared")
                    raise
        return self._super_stream_declared(name, [p.name for p in partitions])

    def _finish_delete_before(self, name: str, undone: str) -> None:
        """Before queue ``name`` is declared (under the definitions lock): what a delete
        of that name left is not recovered, but removed; an ``OSError`` beginning with
        ``undone`` when the disk refuses."""
        if name in self._definitions.queues:
            return
        try:
            self._definitions.finish_delete(name)
        except OSError as exc:
            left = f"the files a delete of {name!r} left in {self.data_dir}"
            raise _refused(exc, undone, f"remove {left}") from exc

    def _taken_back(self, otherwise: str) -> None:
        """Save a declare taken back (its process did not start); a failed save is
        logged, ``otherwise`` saying what then stays (started at the next boot)."""
        try:
            self._definitions_changed(otherwise)
        except OSError as exc:
            log.error("node %s: %s", self.name, exc)

    def _super_stream_declared(self, name: str, partitions: list[str]) -> dict:
        """A super stream's declare-ok: its records and consumers over every partition
        (None while one does not answer), and its partitions in order."""
        answers = [self._declared(partition) for partition in partitions]
        counts = {
            count: None
            if any(answer[count] is None for answer in answers)
            else sum(answer[count] for answer in answers)
            for count in ("message_count", "consumer_count")
        }
        return {"queue": name, **counts, "partitions": partitions}

    def _declared(self, name: str) -> dict:
        try:
            stats = self.queue(name).ask(QueueStats(declare=True), timeout=STATS_TIMEOUT_S)
        except (QueueError, ActorError):  # between incarnations, down, or silent
            return {"queue": name, "message_count": None, "consumer_count": None}
        return {
            "queue": name,
            "message_count": stats["messages_ready"],
            "consumer_count": stats["consumers"],
        }

    def delete_queue(self, name: str) -> int:
        """Delete the queue, its bindings, its messages and its files; how many messages
        it held. Done for good once its definition's removal is saved: its tombstone,
        written before that save, has the files removed at the next declare of the name
        or the next boot if a crash or the disk stops their removal (see Deletes in
        ``warren.queues.broker.definitions``). A super stream is deleted whole: its
        exchange first (no publish routes by a count of partitions that is shrinking),
        then its partitions one by one; a delete cut short is finished by the next
        delete of the name."""
        with self._definitions_lock:
            partitions = self._definitions.partitions(name)
            if partitions is not None:
                self._definitions.remove_exchange(name)
                self._definitions_changed(f"super stream {name!r} was not deleted")
            elif name not in self._definitions.queues:
                partitions = self._definitions.left_partitions(name) or None
            if partitions is None:
                self._definitions.refuse_reshaping(name, None, f"deleting queue {name!r}")
        if partitions is None:
            return self._delete_one(name)
        return sum(self._delete_one(partition) for partition in partitions)

    def _delete_one(self, name: str) -> int:
        undone = f"queue {name!r} was not deleted"
        with self._definitions_lock:
            if name not in self._definitions.queues:
                raise NotFound(f"no queue {name!r} on this node; nothing to delete")
            try:
                ref: ActorRef | None = self.queue(name)  # QueueRestarting: try again
            except QueueDown:  # nothing runs to delete its messages: its files go
                ref = None
            try:
                mark_deleted(queue_directory(self.data_dir, name), name)
            except OSError as exc:
                raise _refused(
                    exc, undone, f"write the queue's tombstone in {self.data_dir}"
                ) from exc
            # Off the disk before its messages go: a failed save leaves the queue whole,
            # and its tombstone (see Deletes: the save may be on the disk all the same),
            # which the next start of a queue that deletes itself takes for a decided delete.
            deletes_itself = self._definitions.queues[name].deletes_itself
            self._definitions.remove_queue(name)
            if deletes_itself:
                self._definitions_changed(f"{undone} yet", DELETED_AT_NEXT_START)
            else:
                self._definitions_changed(undone)
            count = 0
            if ref is not None:
                try:
                    count = ref.ask(DeleteQueue())
                except (QueueError, ActorError) as exc:  # deleted all the same, below
                    log.warning(
                        "node %s: queue %s did not count its messages: %s", self.name, name, exc
                    )
            queue_sup = self._supervisor("queue_sup")
            if any(c["id"] == QUEUE_SUP_PREFIX + name for c in queue_sup.which_children()):
                queue_sup.terminate_child(QUEUE_SUP_PREFIX + name)
            try:
                self._definitions.finish_delete(name)
            except OSError as exc:  # deleted all the same: its tombstone stays
                log.error(
                    "node %s: queue %s is deleted, but its files could not be removed (%s); "
                    "the next declare of its name, or the node's next start, removes them",
                    self.name,
                    name,
                    exc,
                )
            return count

    def declare_exchange(
        self,
        name: str,
        *,
        kind: str = "direct",
        durable: bool = True,
        auto_delete: bool = False,
        internal: bool = False,
        alternate_exchange: str = "",
    ) -> None:
        """Create an exchange (``direct``, ``fanout`` or ``topic``) unless it exists: an
        ``auto_delete`` one goes with its last binding, an ``internal`` one takes no
        publish from an AMQP client, and what it routes to no queue goes to its
        ``alternate_exchange`` if it has one (it need not exist yet; ``ExchangeDefinition``)."""
        if alternate_exchange:
            check_name(alternate_exchange, "alternate exchange")
        if kind not in EXCHANGE_KINDS:
            raise InvalidArgument(
                f"exchange kind must be one of {EXCHANGE_KINDS}, got {kind!r} (a super "
                f"stream is declared with declare_queue(name, type='super-stream', ...))"
            )
        definition = ExchangeDefinition(
            check_name(name, "exchange"),
            kind,
            bool(durable),
            bool(auto_delete),
            bool(internal),
            alternate_exchange,
        )
        with self._definitions_lock:
            if self._definitions.add_exchange(definition):
                self._definitions_changed(f"exchange {name!r} was not declared")

    def bind_queue(self, queue: str, exchange: str, routing_key: str = "") -> None:
        """Route ``exchange``'s messages with ``routing_key`` to ``queue``."""
        with self._definitions_lock:
            self._definitions.refuse_reshaping(
                queue, exchange, f"binding {queue!r} to {exchange!r}"
            )
            if self._definitions.bind(queue, exchange, routing_key):
                self._definitions_changed(f"queue {queue!r} was not bound to {exchange!r}")

    def unbind_queue(self, queue: str, exchange: str, routing_key: str = "") -> None:
        """Stop routing ``exchange``'s messages with ``routing_key`` to ``queue``."""
        with self._definitions_lock:
            self._definitions.refuse_reshaping(
                queue, exchange, f"unbinding {queue!r} from {exchange!r}"
            )
            if self._definitions.unbind(queue, exchange, routing_key):
                self._definitions_changed(f"queue {queue!r} was not unbound from {exchange!r}")

    def delete_exchange(self, name: str) -> None:
        """Delete an exchange and its bindings; the queues it routed to stay."""
        with self._definitions_lock:
            self._definitions.refuse_reshaping(None, name, f"deleting exchange {name!r}")
            self._definitions.remove_exchange(name)
            self._definitions_changed(f"exchange {name!r} was not deleted")

    def list_exchanges(self) -> list[dict[str, Any]]:
        with self._definitions_lock:
            return self._definitions.list_exchanges()

    def list_bindings(self) -> list[dict[str, str]]:
        with self._definitions_lock:
            return self._definitions.list_bindings()

    def exchanges_and_bindings(self) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
        """Every exchange (the default one ``""`` first) and every binding, as
        ``list_exchanges`` and ``list_bindings`` say them. A copy taken at once without
        the definitions lock, as ``queue_types``: the management page asks for it. None
        on a follower, which holds no definitions of its own."""
        definitions = self._opened_definitions
        if definitions is None:
            return [], []
        exchanges = dict(definitions.exchanges)
        bindings = sorted(set(definitions.bindings))
        default = dataclasses.asdict(ExchangeDefinition("", "direct"))
        return [default] + [dataclasses.asdict(exchanges[n]) for n in sorted(exchanges) if n], [
            {"exchange": e, "queue": q, "routing_key": k} for e, q, k in bindings
        ]

    def exchange(self, name: str) -> dict[str, Any]:
        """An exchange's kind and bindings, which publishers route with."""
        with self._definitions_lock:
            return self._definitions.exchange(name)

    def active_alarms(self) -> list[str]:
        """The resource alarms raised now (publishers are held while any is)."""
        return sorted(self.alarms.active)

    def queue(self, name: str) -> ActorRef:
        """The ref of a queue's process (follows its restarts); ``NotFound`` for a queue
        never declared, ``QueueRestarting`` (a ``NotFound``) for one between two
        incarnations, ``QueueDown`` for one that kept crashing and stays down."""
        if name not in self._definitions.queues:
            raise NotFound(f"no queue {name!r} on this node; declare it first")
        ref = self._actor_node.whereis(self._actor_name(name))
        if ref is None and self.queue_state(name) == "crashed":
            raise QueueDown(
                f"queue {name!r} crashed {QUEUE_FLAGS.intensity + 1} times within "
                f"{QUEUE_FLAGS.period_s:g} s and stays down (see the node's log); "
                f"restart the node, or delete the queue and declare it again"
            )
        if ref is None and self._deleted_itself(name):  # the node forgets it in a moment
            raise NotFound(f"no queue {name!r} on this node: it deleted itself")
        if ref is None:
            raise QueueRestarting(f"queue {name!r} is restarting; try again in a moment")
        return ref

    def queue_state(self, name: str) -> str:
        """``running``, ``restarting``, or ``crashed`` (it kept crashing; it stays down)."""
        for child in self._supervisor("queue_sup").which_children():
            if child["id"] == QUEUE_SUP_PREFIX + name:
                running = self._actor_node.whereis(self._actor_name(name)) is not None
                return "running" if running else "restarting"
        return "crashed"

    def list_queues(self) -> list[str]:
        return sorted(self._definitions.queues)

    def queue_types(self) -> dict[str, str]:
        """Every declared queue's type: ``classic``, or ``stream`` (none on a follower,
        which holds no definitions of its own: its figures are scraped all the same)."""
        # A copy, taken at once without the definitions lock: a scrape asks for this,
        # and must not wait behind a declare that is starting the queue's process.
        definitions = self._opened_definitions
        declared = dict(definitions.queues) if definitions is not None else {}
        return {name: definition.type for name, definition in sorted(declared.items())}

    def _actor_name(self, name: str) -> str:
        """The actor name of a declared queue's process (or stream's), and so its title."""
        definition = self._definitions.queues.get(name)
        stream = definition is not None and definition.is_stream
        return (STREAM_ACTOR_PREFIX if stream else QUEUE_PREFIX) + name

    def connect(self, **options: Any) -> Connection:
        """A client connection from this process (``warren.connect`` from any other);
        ``options`` are ``Connection``'s (``max_in_flight``, ``call_timeout_s``)."""
        return Connection(self, **options)

    def _forget_auto_deleted(self) -> None:
        """Drop the definitions of queues that deleted themselves (auto-delete, expired:
        their process ended and their directory is gone), then the tombstone each wrote
        first (see Auto-delete in ``warren.queues.broker.definitions``); nothing on a
        follower."""
        with self._definitions_lock:
            if self._opened_definitions is None:
                return
            for name in [n for n in self._definitions.queues if self._deleted_itself(n)]:
                self._forget_deleted_itself(name)

    def _deleted_itself(self, name: str) -> bool:
        """Whether queue ``name`` deleted itself (its process ended for good and its
        directory is gone) and the node has not dropped its definition yet."""
        definition = self._definitions.queues.get(name)
        return (
            definition is not None
            and definition.deletes_itself
            and not os.path.exists(queue_directory(self.data_dir, name))
            and self._actor_node.whereis(QUEUE_PREFIX + name) is None
        )

    def _forget_deleted_itself(self, name: str) -> None:
        """Drop the definition of ``name``, which ``_deleted_itself`` (under the
        definitions lock)."""
        queue_sup = self._supervisor("queue_sup")
        if any(c["id"] == QUEUE_SUP_PREFIX + name for c in queue_sup.which_children()):
            queue_sup.terminate_child(QUEUE_SUP_PREFIX + name)
        self._definitions.remove_queue(name)
        self._definitions_changed(f"queue {name!r}, deleted by itself, is kept for now")
        log.info("node %s: queue %s deleted itself", self.name, name)
        try:
            self._definitions.finish_delete(name)  # its tombstone, last
        except OSError as exc:  # the next declare of the name, or boot
            log.error("node %s: queue %s keeps its tombstone: %s", self.name, name, exc)

    def _definitions_changed(self, undone: str, then: str = NOTHING_CHANGED) -> None:
        """Keep the durable definitions on disk in step with the definitions (under the
        definitions lock); a restart of queue_sup reads them itself (``_queue_sup_spec``).
        A save that fails (a full disk, an I/O error) undoes the change in memory too, and
        raises an ``OSError`` that begins with ``undone`` and ends with ``then``: an answer
        of ok always means the change is on disk, and the call can simply be made again."""
        try:
            self._definitions.save()
        except OSError as exc:
            raise _refused(exc, undone, f"write its definitions in {self.data_dir}", then) from exc

    def _queue_sup_spec(self) -> SupervisorSpec:
        """queue_sup with every queue declared now: what a restart of it starts (made on
        the root's event thread, from a copy of the definitions taken at once, without
        their lock: a declare holding it may be waiting on queue_sup)."""
        definitions = list(self._definitions.queues.values())
        return SupervisorSpec(
            "queue_sup",
            QUEUE_SUP_FLAGS,
            children=tuple(self._queue_spec(d) for d in definitions),
        )

    def _queue_spec(self, definition: QueueDefinition) -> SupervisorSpec:
        """A queue under a small supervisor of its own: a queue that keeps crashing
        exhausts that one (which, temporary, is not restarted), never queue_sup."""
        options: dict[str, Any] = {"data_dir": self.data_dir}
        stores = [self._actor_node.whereis(store) for store in STORES]
        if definition.type == "classic" and None not in stores:  # see QueueActor's Starting
            options["stores"] = tuple(store.unpin() for store in stores if store is not None)
        if definition.is_stream and self._led_epoch is not None:
            options["epoch"] = self._led_epoch  # in each chunk's header: Osiris's (epoch, offset)
        queue = ChildSpec(
            (STREAM_ACTOR_PREFIX if definition.is_stream else QUEUE_PREFIX) + definition.name,
            QUEUE_ACTORS[definition.type],
            (definition, queue_directory(self.data_dir, definition.name)),
            options,
            # a queue that deleted itself ends its process normally, for good
            restart="transient" if definition.deletes_itself else "permanent",
            shutdown_s=STORE_SHUTDOWN_S,
            start_timeout_s=STORE_START_TIMEOUT_S,
            heartbeat_interval_s=self._heartbeat_interval_s,
            heartbeat_timeout_s=self._heartbeat_timeout_s,
        )
        return SupervisorSpec(
            QUEUE_SUP_PREFIX + definition.name,
            QUEUE_FLAGS,
            children=(queue,),
            restart="temporary",
            shutdown_s=STORE_SHUTDOWN_S,
        )

    def store_stats(self) -> dict[str, dict[str, Any] | None]:
        """Each store's figures; None for a store that does not answer right now."""
        figures: dict[str, dict[str, Any] | None] = {}
        for name in STORES:
            try:
                figures[name] = self.store(name).ask(StoreStats(), timeout=STATS_TIMEOUT_S)
            except (KeyError, ActorError):
                figures[name] = None
        return figures

    def amqp_stats(self) -> dict[str, Any] | None:
        """The AMQP port's figures (``AmqpStats``: its connections, what they published,
        ...); None without an AMQP port, or while it does not answer."""
        if self.amqp_endpoint is None:
            return None
        ref = self._actor_node.whereis(AMQP_NAME)
        if ref is None:
            return None
        try:
            return ref.ask(AmqpStats(), timeout=STATS_TIMEOUT_S)
        except ActorError:
            return None

    def cluster_status(self) -> dict[str, Any] | None:
        """The node's view of its cluster (``CoordinatorStats``); None outside a cluster
        or while its coordinator does not answer."""
        ref = self._actor_node.whereis(COORDINATOR_NAME)
        if ref is None:
            return None
        try:
            return ref.ask(CoordinatorStats(), timeout=STATS_TIMEOUT_S)
        except ActorError:
            return None

    @property
    def state(self) -> str:
        """``starting`` (the tree is being built), ``running``, or ``failed`` (the root
        supervisor gave up)."""
        if not self._started.is_set():
            return "starting"
        if self.failed.is_set():
            return "failed"
        if self.cluster is not None and not self._data_running:
            return "starting" if self._data_starting else "following"
        return "running"

    @property
    def management_page(self) -> str | None:
        """The management page's URL, when the node serves HTTP."""
        return None if self.http_endpoint is None else f"{self.http_endpoint}/"

    def _recovering(self) -> int:
        """About how many messages the start recovers (every segment read once: two
        threads asking at once both count, and agree)."""
        if self._recovering_count is None:
            self._recovering_count = node_message_count(self.data_dir)
        return self._recovering_count

    def status(self) -> dict[str, Any]:
        """The tree (pid, state, restarts, RSS, CPU of every actor), the stores' figures,
        each queue's state, the alarms, and where the node listens."""
        if not self._started.is_set():
            return {
                "node": self.name,
                "pid": os.getpid(),
                "data_dir": self.data_dir,
                "state": "starting",
                "recovering": self._recovering(),
                "alarms": sorted(self.alarms.active),
                "http_endpoint": self.http_endpoint,
                "listen_endpoint": self.listen_endpoint,
                "amqp_endpoint": self.amqp_endpoint,
                "amqp_tls": self.amqp_tls,
                "management_page": self.management_page,
                "cluster_name": self.cluster,
            }
        amqp = self.amqp_stats()
        return {
            "node": self.name,
            "pid": os.getpid(),
            "data_dir": self.data_dir,
            "state": self.state,
            "http_endpoint": self.http_endpoint,
            "listen_endpoint": self.listen_endpoint,
            "amqp_endpoint": self.amqp_endpoint,
            "amqp_tls": self.amqp_tls,
            "management_page": self.management_page,
            "tree": self.root.status() if self.root else None,
            "stores": self.store_stats() if self.root else {},
            "amqp_connections": (amqp or {}).get("connections"),
            "cluster_name": self.cluster,
            "cluster": self.cluster_status(),
            "queues": (
                {name: self.queue_state(name) for name in self.list_queues()}
                if self.root and self._data_running
                else {}
            ),
            "alarms": sorted(self.alarms.active),
            "readings": dict(self.alarms.readings),
        }

    def run_until_signalled(self, signals: Iterable[int] = STOP_SIGNALS) -> int | None:
        """Run until one of ``signals`` arrives, then stop the node in order; the signal's
        number, or ``None`` if the root supervisor gave up first (``failed`` is set).

        Call it from the main thread, where Python runs signal handlers. The handlers
        stay until the node is closed; the previous ones are restored on return.
        """
        if threading.current_thread() is not threading.main_thread():
            raise SupervisorError(
                "run_until_signalled must be called from the main thread, "
                "where Python runs signal handlers"
            )
        signals = tuple(signals)
        received: list[int] = []

        def stop_on(signum: int, _frame: object) -> None:
            received.append(signum)  # a second one is noted, and changes nothing
            self._stop_wanted.set()

        previous = {signum: signal.signal(signum, stop_on) for signum in signals}
        blocked = signal.pthread_sigmask(signal.SIG_UNBLOCK, signals)
        try:
            # Woken now and then: Python runs a signal's handler in this thread at its next
            # bytecode, and a signal the kernel gave another thread interrupts no wait here.
            while not self._stop_wanted.wait(SIGNAL_LOOK_S):
                pass
            if received:
                log.warning(
                    "node %s: %s received: stopping in order",
                    self.name,
                    signal.Signals(received[0]).name,
                )
            self.close()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        return received[0] if received else None

    def close(self) -> None:
        """Stop the tree (reverse order), the runtime, and release the data directory;
        each step runs even when one before it failed."""
        if self._closing.is_set():
            return
        self._closing.set()
        try:
            try:
                os.unlink(os.path.join(self.data_dir, NODE_FILE))
            except FileNotFoundError:
                pass
            if self._http is not None:
                self._http.close()
            if self._commit_endpoint is not None and self.actors is not None:
                # before the threads are joined: a leader's start may be waiting on a
                # commit, which the cluster may hold until a follower comes
                self._refuse_commits()
            for thread in self._threads:
                thread.join()
            # the leadership thread has ended (a start it held the data lock for, waiting
            # on a commit, was let go above): nothing forwards any more
            self._forward_amqp_to(None)
            if self._status_socket is not None and not self._status_socket.closed:
                self._status_socket.close()
            if self.root is not None:
                self.root.stop()
        finally:
            try:
                if self.actors is not None:
                    self.actors.close(timeout=STORE_CLOSE_TIMEOUT_S)
            finally:
                if self._opened_definitions is not None:
                    self._opened_definitions.close()
                if self._commit_endpoint is not None:
                    replicated_io.disable()
                if self._runtime_dir is not None:
                    shutil.rmtree(self._runtime_dir, ignore_errors=True)
                os.close(self._lock_fd)

    def __enter__(self) -> Node:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------ internals

    # __init__ starts the runtime and the tree; they stay None only when it fails, and
    # the close it then runs checks for that itself.

    @property
    def _actor_node(self) -> ActorNode:
        assert self.actors is not None, "__init__ starts the actor runtime"
        return self.actors

    @property
    def _tree(self) -> Supervisor:
        assert self.root is not None, "__init__ starts the tree"
        return self.root

    @property
    def _data_tree(self) -> Supervisor:
        """The supervisor of the stores, queues, listeners and the application's children:
        the root, or in a cluster its temporary ``data`` child (KeyError while it does
        not run: a follower)."""
        if self.cluster is None:
            return self._tree
        return self._tree.child_supervisor(DATA_SUP)

    def _supervisor(self, child_id: str) -> Supervisor:
        return self._data_tree.child_supervisor(child_id)

    @property
    def _definitions(self) -> Definitions:
        """The node's definitions; ``NotLeader`` on a follower (it reads none)."""
        definitions = self._opened_definitions
        if definitions is None:
            raise NotLeader(self._follower_says())
        return definitions

    def _open_definitions(self) -> None:
        definitions = Definitions(self.data_dir)
        definitions.finish_deletes()  # before the store counts the queues' references
        definitions.remove_transient_queues()
        self._opened_definitions = definitions

    # ------------------------------------------------------------------ leadership

    # In a cluster, the processes that write the data directory (the stores and the GC,
    # the queues, the app's children, the listener and the AMQP port: the "data part")
    # run only while the node leads; a follower's directory is its coordinator's
    # replica. ``_follow_leadership`` looks at the coordinator's role: on "leader" it
    # asks the coordinator for the directory (``LeadData``: the replica's server is
    # closed, writes are shipped from then on) and starts the data part, which recovers
    # as after a SIGKILL; on any other role it stops the data part (its commits are
    # refused already: it confirms nothing more) and gives the directory back
    # (``FollowData``).

    def _follower_says(self) -> str:
        status = self.cluster_status() or {}
        leader = status.get("leader")
        where = f"; {leader} leads at {status.get('leader_peer')}" if leader else ""
        return f"node {self.name} does not lead cluster {self.cluster}{where}"

    def _follow_leadership(self) -> None:
        while not self._closing.wait(LEADERSHIP_LOOK_S):
            try:
                self._look_at_leadership()
            except Exception:  # looked at again at the next turn
                log.exception("node %s: a look at the leadership failed", self.name)

    def _look_at_leadership(self) -> None:
        status = self.cluster_status() or {}
        role, epoch = status.get("role"), status.get("epoch")
        shipping = (status.get("replication") or {}).get("mode")
        coordinator = self._actor_node.whereis(COORDINATOR_NAME)
        with self._data_lock:
            if self._closing.is_set() or coordinator is None or not status:
                return
            if self._data_running and not self._data_alive():
                # its supervisor gave up (a restart refused: the node had stopped
                # leading, or its disk): started again below while the node leads
                log.warning("node %s: its data part gave up: stopping it", self.name)
                self._stop_data(coordinator)
            elif self._data_running and (
                role != "leader" or epoch != self._led_epoch or shipping != "leader"
            ):
                # deposed, led again at another epoch between two looks, or a coordinator
                # restarted under the running processes: none of their commits is taken
                log.warning(
                    "node %s: leads no more at epoch %s (%s, epoch %s): stopping its queues",
                    self.name,
                    self._led_epoch,
                    role,
                    epoch,
                )
                self._stop_data(coordinator)
            elif not self._data_running and role == "leader":
                answer = coordinator.ask(LeadData(), timeout=STATS_TIMEOUT_S * 15)
                if not answer["leading"]:
                    return
                self._forward_amqp_to(None)  # the port is the data part's own from now on
                self._led_epoch = answer["epoch"]
                log.info("node %s: leads at epoch %s: starting", self.name, self._led_epoch)
                self._data_starting = True
                try:
                    self._start_data()
                except Exception:
                    log.exception("node %s: the start as leader failed", self.name)
                    self._stop_data(coordinator)
                finally:
                    self._data_starting = False
            elif not self._data_running and (
                shipping == "idle" or (shipping == "leader" and role != "leader")
            ):
                # a coordinator (re)started while none of the node's processes writes, or
                # one that took the directory for a start that never came (a LeadData
                # answered too late): the directory is the replica's
                coordinator.ask(FollowData(serve=True), timeout=STATS_TIMEOUT_S * 15)
            if not self._data_running and not self._closing.is_set():
                leader, leader_amqp = status.get("leader"), status.get("leader_amqp")
                known = leader not in (None, self.name) and isinstance(leader_amqp, str)
                self._forward_amqp_to((epoch, str(leader_amqp)) if known else None)

    def _forward_amqp_to(self, target: tuple[int | None, str] | None) -> None:
        """On a follower with an AMQP port: forward its AMQP clients to the leader's port
        (``target``: the leader's epoch and host:port), as LavinMQ's followers do, so a
        client of any node reaches the leader; None: forward nothing (no leader known,
        or this node leads). Another leader or epoch closes the connections forwarded
        so far: their clients connect again, and reach the leader of now. Refused: a
        target that is this node's own port, and a leader reached on loopback from a
        port bound elsewhere (its clients would reach the leader as loopback ones,
        ``guest`` among them). Under the data lock, or once no thread looks."""
        if self._amqp_forwarded_from is None or target == self._amqp_forwarding_to:
            return
        if self._amqp_forwarder is not None:
            self._amqp_forwarder.close()
            self._amqp_forwarder, self._amqp_forwarding_to = None, None
        if target is None:
            return
        leader_amqp = target[1]
        try:
            upstream = host_and_port(leader_amqp, "a leader's AMQP address", "10.0.0.1:5672")
            own_host = self._amqp_forwarded_from[0]
            if upstream == self._amqp_forwarded_from or (
                is_loopback(upstream[0]) and not is_loopback(own_host)
            ):
                raise ValueError(
                    f"the leader's AMQP port {leader_amqp} is this port, or reached on "
                    f"loopback while this one listens on {own_host}"
                )
            self._amqp_forwarder = TcpProxy(upstream, "amqp", listen=self._amqp_forwarded_from)
        except (OSError, ValueError) as exc:  # the port busy yet (the data part's): again
            if self._amqp_refused != f"{leader_amqp}: {exc}":
                self._amqp_refused = f"{leader_amqp}: {exc}"
                log.warning("node %s: does not forward AMQP clients to %s", self.name, exc)
            return
        self._amqp_forwarding_to, self._amqp_refused = target, None
        log.info("node %s: forwards its AMQP clients to the leader at %s", self.name, leader_amqp)

    def _start_data(self) -> None:
        restarts = self._tree.restart_counts
        if isinstance(restarts, _ResyncOnRestart) and self._led_epoch != self._data_epoch:
            restarts.new_leadership()  # else a start again within one leadership: resynced
        self._data_epoch = self._led_epoch
        with self._definitions_lock:
            self._open_definitions()
        self._tree.start_child(
            SupervisorSpec(DATA_SUP, ROOT_FLAGS, self._data_children(), restart="temporary")
        )
        self._data_started()
        self._with_room(self._write_node_file)

    def _data_started(self) -> None:
        self._data_tree.follow_child_spec("queue_sup", self._queue_sup_spec)
        listen, amqp = self._serves
        if listen:
            listener_ref = self._actor_node.whereis(LISTENER_NAME)
            assert listener_ref is not None, "the tree has just started the listener"
            self.listen_endpoint = listener_ref.ask(ListenerStats())["endpoint"]
        if amqp:
            amqp_ref = self._actor_node.whereis(AMQP_NAME)
            assert amqp_ref is not None, "the tree has just started the AMQP port"
            self.amqp_endpoint = amqp_ref.ask(AmqpStats())["endpoint"]
        self._data_running = True

    def _data_alive(self) -> bool:
        return any(
            child["id"] == DATA_SUP and child["state"] == "running"
            for child in self._tree.which_children()
        )

    def _stop_data(self, coordinator: ActorRef) -> None:
        self._data_running = False
        try:
            self._tree.terminate_child(DATA_SUP)
        except Exception as exc:  # never started, or gave up: nothing of it runs
            log.debug("node %s: its data part was not running: %s", self.name, exc)
        with self._definitions_lock:
            if self._opened_definitions is not None:
                self._opened_definitions.close()
                self._opened_definitions = None
        self.listen_endpoint = self.amqp_endpoint = None
        if not self._closing.is_set():
            self._with_room(self._write_node_file)
            coordinator.ask(FollowData(serve=True), timeout=STATS_TIMEOUT_S * 15)

    def _refuse_commits(self) -> None:
        """At the node's stop: the coordinator refuses every commit from now on (and
        serves no replica), so the data part stops without waiting for followers (its
        stores, refused their last writes, recover as after a kill at the next start)."""
        coordinator = self._actor_node.whereis(COORDINATOR_NAME)
        if coordinator is None:
            return
        try:
            coordinator.ask(FollowData(serve=False), timeout=STATS_TIMEOUT_S * 15)
        except ActorError as exc:
            log.warning("node %s: its coordinator did not answer at the stop: %s", self.name, exc)

    def _start_thread(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, daemon=True, name=name)
        self._threads.append(thread)
        thread.start()

    def _pids(self) -> list[int]:
        pids = [os.getpid()]
        if self.actors is not None:
            pids.append(self.actors.forkserver_pid)
        return pids + (self.root.actor_pids() if self.root else [])

    def _root_failed(self, reason: str) -> None:
        log.error("node %s: the root supervisor gave up (%s); stopping", self.name, reason)
        self.failed.set()
        self._stop_wanted.set()

    def _watch_resources(self) -> None:
        told: dict[str, tuple[int, frozenset[str]]] = {}  # address -> (incarnation, raised)
        while not self._closing.wait(self.limits.check_interval_s):
            try:
                changes = self.alarms.check() + self._replication_alarm()
                for change in changes:
                    log.warning(
                        "node %s: %s alarm %s (%d against a limit of %d)",
                        self.name,
                        change.resource,
                        "raised" if change.raised else "cleared",
                        change.value,
                        change.limit,
                    )
                if changes:
                    self._with_room(
                        functools.partial(write_alarms, self.data_dir, self.alarms.active)
                    )
                    if "disk" not in self.alarms.active:
                        self._keep_reserve()  # room again: keep it for the next full disk
                self._tell_alarms(told)
                self._forget_auto_deleted()
            except Exception:  # the watch must outlive one bad reading; logged
                log.exception("node %s: checking the resource alarms failed", self.name)

    def _replication_alarm(self) -> list[AlarmChange]:
        """A leader's ``replication`` alarm: raised while its ISR holds fewer nodes than
        ``min_insync`` (its commits wait: no confirm may rest on fewer copies), so that
        publishers are held back, as by a full disk, until a follower has caught up."""
        if self.cluster is None:
            return []
        status = self.cluster_status() if self._data_running else {}
        if status is None:  # the coordinator did not answer in time: nothing known
            return []
        shipping = status.get("replication") or {}
        in_sync, needed = len(status.get("isr") or ()), shipping.get("min_insync", 0)
        short = shipping.get("mode") == "leader" and in_sync < needed
        if short == (REPLICATION_ALARM in self.alarms.active):
            return []
        (self.alarms.active.add if short else self.alarms.active.discard)(REPLICATION_ALARM)
        return [AlarmChange(REPLICATION_ALARM, short, in_sync, needed)]

    def _tell_alarms(self, told: dict[str, tuple[int, frozenset[str]]]) -> None:
        """Bring every actor's view of the alarms up to date: a change is told to all, and
        an actor restarted (or started) while an alarm is raised hears of it too."""
        active = frozenset(self.alarms.active)
        for ref in self._tree.actor_refs():
            incarnation, heard = told.get(ref.address, (ref.incarnation, frozenset()))
            if incarnation != ref.incarnation:
                heard = frozenset()
            try:
                for resource in sorted(active - heard):
                    ref.alarm(resource, True)
                for resource in sorted(heard - active):
                    ref.alarm(resource, False)
            except ActorError as exc:  # an actor going away; its successor is told next time
                log.info("node %s: could not tell %s of the alarms: %s", self.name, ref.name, exc)
                continue
            told[ref.address] = (ref.incarnation, active)

    def _serve_status(self) -> None:
        """Answer ``warren status``: a REQ socket's one frame, ``status``. The socket is a
        ROUTER, not a REP: a REP drops a request without an envelope only once the poll
        has said it is readable, so a blocking receive would then wait forever, and a
        REP's state machine is at a peer's mercy. Any other request, of any shape, gets
        an error answer (to its envelope, or to its sender when it has none) and is
        counted; nothing a peer sends ends or stalls this thread."""
        status_socket = self._status_socket
        assert status_socket is not None, "bound before this thread starts"
        poller = zmq.Poller()
        poller.register(status_socket, zmq.POLLIN)
        while not self._closing.is_set():
            if not poller.poll(100):
                continue
            try:
                frames = status_socket.recv_multipart(zmq.NOBLOCK)
            except zmq.ZMQError as exc:  # Again: nothing after all
                log.debug("node %s: the status socket: %s", self.name, exc)
                continue
            envelope, request = _split_envelope(frames)
            if request == [b"status"]:
                try:
                    reply = json.dumps(self.status(), default=str).encode()
                except Exception as exc:  # answered, so the asker is not left waiting
                    log.exception("node %s: a status request failed", self.name)
                    reply = json.dumps({"error": str(exc)}).encode()
            elif len(request) == 2 and request[0] == b"call":
                reply = self._control_call(request[1])
            else:
                self.counters["malformed_status_requests"] += 1
                log.warning(
                    "node %s: refused a status request of %d frames (%r...)",
                    self.name,
                    len(request),
                    request[0][:40] if request else b"",
                )
                reply = json.dumps(
                    {"error": "a request is one frame, b'status', or two, b'call' and a JSON call"}
                ).encode()
            try:
                status_socket.send_multipart([*envelope, reply], zmq.NOBLOCK)
            except zmq.ZMQError as exc:  # the asker has gone, or reads nothing
                log.warning("node %s: a status answer could not be sent: %s", self.name, exc)
        status_socket.close()

    def _control_call(self, body: bytes) -> bytes:
        """A client's call on the node (``warren.connect``): ``{"op": name, "args": {...}}``
        answered ``{"ok": result}`` or ``{"error": type name, "message": text}``."""
        try:
            call = json.loads(body)
            op, args = call["op"], call.get("args", {})
            if op not in NODE_CALLS or not isinstance(args, dict):
                raise ValueError(f"no call {op!r}; the calls are {sorted(NODE_CALLS)}")
            if not self._started.is_set() or self._data_starting:
                raise NodeStarting(
                    f"the node on {self.data_dir} is starting (recovering "
                    f"{counted(self._recovering(), 'message')}); "
                    f"connect(wait=...) waits for it"
                )
            if not self._data_running:
                raise NotLeader(self._follower_says())
            result = getattr(self, op)(**args)
            if isinstance(result, ActorRef):
                result = dataclasses.asdict(result)
            return json.dumps({"ok": result}).encode()
        except Exception as exc:  # every call is answered, whatever it holds
            if not isinstance(exc, (QueueError, ValueError, TypeError, KeyError)):
                log.exception("node %s: a control call failed", self.name)
            else:
                self.counters["refused_control_calls"] += 1
            return json.dumps({"error": type(exc).__name__, "message": str(exc)}).encode()

    def _remove_leftovers(self) -> None:
        """A node that was killed (SIGKILL) left its node file and its ipc directory; we hold
        the lock now, so it is dead: remove both."""
        path = os.path.join(self.data_dir, NODE_FILE)
        try:
            with open(path) as f:
                endpoint = json.load(f).get("status_endpoint", "")
        except (OSError, ValueError, AttributeError):
            return
        runtime_dir = os.path.dirname(endpoint.removeprefix("ipc://"))
        if endpoint.startswith("ipc://") and os.path.basename(runtime_dir).startswith("warren-"):
            log.info(
                "node %s: removing %s, left by a node that did not stop", self.name, runtime_dir
            )
            shutil.rmtree(runtime_dir, ignore_errors=True)
        os.unlink(path)

    def _with_room(self, write: Callable[[], None]) -> None:
        """Write one of the node's own small files; on a disk with no room left (ENOSPC),
        give up the reserve (``RESERVE_FILE``) and try once more, so that a node starts,
        and publishes its disk alarm, on a disk full to the last byte."""
        try:
            write()
        except OSError as exc:
            reserve = os.path.join(self.data_dir, RESERVE_FILE)
            if exc.errno != errno.ENOSPC or not os.path.exists(reserve):
                raise
            log.warning("node %s: the disk is full; using the room kept for its files", self.name)
            os.unlink(reserve)
            write()

    def _keep_reserve(self) -> None:
        """Keep ``RESERVE_BYTES`` allocated in ``RESERVE_FILE`` (none while the disk has
        no room for it: it is made again once the disk alarm clears)."""
        try:
            fd = os.open(os.path.join(self.data_dir, RESERVE_FILE), os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                os.posix_fallocate(fd, 0, RESERVE_BYTES)
            finally:
                os.close(fd)
        except OSError as exc:
            log.info("node %s: no room kept for its files (%s)", self.name, exc)

    def _write_node_file(self) -> None:
        path = os.path.join(self.data_dir, NODE_FILE)
        with open(path + ".tmp", "w") as f:
            json.dump(
                {
                    "name": self.name,
                    "pid": os.getpid(),
                    "status_endpoint": self.status_endpoint,
                    "listen_endpoint": self.listen_endpoint,
                    "http_endpoint": self.http_endpoint,
                    "amqp_endpoint": self.amqp_endpoint,
                },
                f,
            )
        os.rename(path + ".tmp", path)


def _refused(exc: OSError, undone: str, what: str, then: str = NOTHING_CHANGED) -> OSError:
    """The error of a change the disk refused (``exc``): it begins with ``undone``, says
    what the node could not do, then what follows (``then``: by default, that nothing
    changed and the call may be made again)."""
    reason = exc.strerror or str(exc)
    return OSError(exc.errno, f"{undone}: the node could not {what} ({reason}); {then}")


def _split_envelope(frames: list[bytes]) -> tuple[list[bytes], list[bytes]]:
    """A ROUTER's message as (envelope, request): the envelope ends with the empty frame a
    REQ socket puts before its request; a message without one is answered to its
    sender's identity alone."""
    for index, frame in enumerate(frames[1:], start=1):
        if not frame:
            return frames[: index + 1], frames[index + 1 :]
    return frames[:1], frames[1:]


def amqp_tls_files(amqp: str | None, certfile: str | None, keyfile: str | None) -> TlsFiles | None:
    """The AMQP port's TLS files, checked to load (``InvalidSpec`` naming what is wrong),
    or None for a port without TLS."""
    if certfile is None and keyfile is None:
        return None
    if certfile is None or keyfile is None:
        name, value = ("amqp_keyfile", keyfile) if certfile is None else ("amqp_certfile", certfile)
        raise InvalidSpec(name, value, "TLS needs both a certificate file and a key file")
    if amqp is None:
        raise InvalidSpec("amqp_certfile", certfile, "TLS is for the AMQP port: pass amqp too")
    tls = TlsFiles(os.path.abspath(certfile), os.path.abspath(keyfile))
    try:
        tls.context()
    except ValueError as exc:
        raise InvalidSpec("amqp_certfile", certfile, str(exc)) from None
    return tls


def check_node_directory(
    data_dir: str | os.PathLike, *, beside: Iterable[str] = (), must_exist: bool = False
) -> None:
    """Refuse (``NotANodeDirectory``) a directory that holds files, other than the names
    ``beside``, but none of a node's (``NODE_FILES``); with ``must_exist``, a missing one
    too. A new or empty directory is a node's to be."""
    path = os.fspath(data_dir)
    try:
        entries = set(os.listdir(path)) - set(beside)
    except FileNotFoundError:
        if must_exist:
            raise NotANodeDirectory(
                f"{path} does not exist; name a node's data directory"
            ) from None
        return
    except NotADirectoryError:
        raise NotANodeDirectory(f"{path} is not a directory") from None
    if entries and not entries & set(NODE_FILES):
        raise NotANodeDirectory(
            f"{path} is not a node's data directory (it has files, but none of "
            f"{', '.join(NODE_FILES)}): give a new or empty directory, or a node's"
        )


def answers_status(data_dir: str | os.PathLike, timeout_ms: int = 1000) -> bool:
    """Whether a node runs on ``data_dir``, has started (its tree and, in a cluster,
    its coordinator run) and answers ``warren status`` (whatever its role in a cluster:
    a follower serves no client, but answers this)."""
    try:
        return "tree" in query_status(data_dir, timeout_ms=timeout_ms)  # not the start's
    except OSError:
        return False


def query_status(data_dir: str | os.PathLike, timeout_ms: int = STATUS_TIMEOUT_MS) -> dict:
    """Ask the node running on ``data_dir`` for its status; OSError if none answers."""
    path = os.path.join(os.fspath(data_dir), NODE_FILE)
    try:
        with open(path) as f:
            info = json.load(f)
    except (OSError, ValueError) as exc:
        raise OSError(f"no node is running on {data_dir} ({exc})") from exc
    pid = info.get("pid") if isinstance(info, dict) else None
    if isinstance(pid, int) and not process_exists(pid):
        raise OSError(
            f"the node on {data_dir} is not running (stale pid {pid}: it ended without "
            f"cleaning up); `warren node --data-dir {data_dir}` starts it again"
        )
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    socket = context.socket(zmq.REQ)
    socket.linger = 0
    socket.rcvtimeo = socket.sndtimeo = timeout_ms
    try:
        socket.connect(info["status_endpoint"])
        socket.send(b"status")
        return json.loads(socket.recv())
    except zmq.ZMQError as exc:
        raise OSError(
            f"the node on {data_dir} (pid {info.get('pid')}) does not answer: {exc}"
        ) from exc
    finally:
        socket.close()


@contextlib.contextmanager
def _replicated_environment(data_dir: str, commit_endpoint: str | None) -> Iterator[None]:
    """The environment under which the runtime's forkserver starts: in a cluster, every
    process it starts records its writes under ``data_dir`` and commits them at
    ``commit_endpoint`` (``warren.store.replicated_io``); this process's own environment
    is left as it was."""
    if commit_endpoint is None:
        yield
        return
    names = (replicated_io.ROOT_VARIABLE, replicated_io.ENDPOINT_VARIABLE)
    before = {name: os.environ.get(name) for name in names}
    os.environ[replicated_io.ROOT_VARIABLE] = data_dir
    os.environ[replicated_io.ENDPOINT_VARIABLE] = commit_endpoint
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class _ResyncOnRestart(RestartCounts):
    """A leader's restart counts, which also tell its coordinator before a process that
    writes the data directory starts again within one leadership (``Resync``): the one
    it replaces may have ended with writes it never committed, which the followers
    lack. (A leadership's first start of each needs none: a new leadership's log is a
    new one, which syncs every follower whole.)"""

    def __init__(self, node: Node) -> None:
        super().__init__()
        self._node = node
        self._started_in_leadership: set[str] = set()

    def new_leadership(self) -> None:
        self._started_in_leadership = set()

    def starting(self, name: str) -> None:
        super().starting(name)
        node = self._node
        if name == COORDINATOR_NAME or not (node._data_running or node._data_starting):
            return
        if name not in self._started_in_leadership:
            self._started_in_leadership.add(name)
            return
        coordinator = node._actor_node.whereis(COORDINATOR_NAME)
        if coordinator is None:
            return
        try:
            coordinator.ask(Resync(), timeout=STATS_TIMEOUT_S * 15)
        except ActorError as exc:  # it restarts: its followers are synced whole anyway
            log.warning("node %s: its coordinator did not take a resync: %s", node.name, exc)


def amqp_reached_at(address: tuple[str, int], peer: str) -> str | None:
    """Where the nodes of a cluster reach a node's AMQP port bound at ``address``: its
    host, or for a wildcard bind the host the node's peers reach it at (``peer``); None
    for a port on loopback when the peers are not (no other machine reaches it)."""
    host, port = address
    peer_host = peer.removeprefix("tcp://").rpartition(":")[0].strip("[]")
    if host in ("", "0.0.0.0", "::"):
        host = peer_host
    host = host.strip("[]")
    if is_loopback(host) and not is_loopback(peer_host):
        return None
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

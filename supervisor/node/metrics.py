"""A running node's figures, gathered when asked, and how they read: Prometheus families
(RabbitMQ's names with ``warren_`` for ``rabbitmq_``, and Warren's own) and JSON documents.

``NodeFigures.snapshot()`` gathers one ``Snapshot``. Each actor the tree runs gives its
runtime counters, its own figures by its kind (its answer to ``QueueStats`` for a queue
or a stream, ``StoreStats``, ``ListenerStats``) and, for a snapshot ``per_object``, its
process's CPU time and RSS, read by the process itself, in one of two ways:
- read, without a word to the actor, from the figures it published
  (``warren.actors.figures``): an actor asked once keeps its answer in a small shared
  file and marks it stale before it handles anything, so what is read is its answer
  now. Most actors of a large node are idle, and a scrape costs each a few microseconds
  of the node's time and nothing of its own;
- asked, when they are not there to read (never asked yet, handled something since,
  its loop silent for ``LIVE_S`` past its stamp, an actor that opts out as the listener
  does, or, for a snapshot ``per_object``, an answer published without the process's
  usage):
  one request, all sent at once (``ActorRef.figures_async``, on its control channel, so
  a busy actor answers between two passes rather than after its backlog), all answered
  within one budget (``SCRAPE_BUDGET_S``). Answering also publishes, so the next scrape
  reads what it asked for this time unless the actor changed meanwhile.
An actor that neither could be read nor answered within the budget has no series in
that snapshot at all: a slow, stopped or dead actor costs a scrape at most the budget,
and never fails it. The node's own figures (alarms, memory and disk readings, the
start's duration, its control-socket counters) need no actor and are always there.
``NodeFigures.tree()`` is the supervision tree as its supervisors see it (every child's
state and restarts), which needs no actor either.

Counters are the node's. ``CounterLedger`` keeps, per actor incarnation, the last value of
each counter it read, and adds only increases to the node's totals and to the actor's
own: an actor restarted (after a SIGKILL or any crash) counts from 0 again under a new
incarnation, so its first reading adds in whole, while what the old incarnation counted
after its last reading is lost, never counted twice. No node counter goes backwards, so
Prometheus's ``rate()`` stays true across restarts; a deleted queue's counts stay in the
node's totals. Restarts are the node's too, counted by the supervisors as they start an
actor again (``warren.supervisor.supervisor.RestartCounts``), not sampled: a queue that
crash-loops between two scrapes and gives up shows every restart, and keeps its count,
and its state (``warren_queue_state``, crashed) is a series of its own while its
process is gone. Both are the node's, so an actor that does not answer keeps them.
Gauges are reported as read. A published
answer already booked (the same incarnation and sequence number) is not booked again.

Protocol: every request goes to the incarnation the tree names now (a pinned ref), and a
published answer is read only when its file names that incarnation and pid, so an answer
is never booked under another incarnation's readings. One thread (``warren-metrics``)
reads every file and sends every request and reads every answer: its mappings (one per
actor incarnation) and its channels (a DEALER per actor's control endpoint) are made
once and serve every later snapshot, and snapshots asked for at the same time are
gathered one after the other. What a scrape costs grows with the actors that changed
since the last one (a round trip each, on both sides), and only a little with the rest.

Races: a request unanswered when the budget ran out stays outstanding. The next snapshot
drops its answer if it has come and asks again; if it still has not, that snapshot sends
the actor nothing and counts it unanswered at once. A stopped actor so holds one request,
not one per scrape, and delays one scrape, not every one. An actor stopped or killed
while idle is read as it last published until the tree no longer runs it or its loop
has been silent for ``LIVE_S`` (two and a half seconds) past its last stamp (an idle
loop, asleep, stamps when it will turn by: five seconds ahead at most), then asked as
above. The
readings of a queue deleted meanwhile are forgotten only once the tree no longer runs its
process, so the next reading of an incarnation still alive is never taken for its first.
The files of actors the tree no longer runs are unmapped at the end of each snapshot.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import logging
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psutil
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from warren.actors import ActorError, ActorRef, AskTimeout, Future
from warren.actors.figures import SlotReader
from warren.queues.amqp.server import AmqpStats
from warren.queues.broker.listener import ListenerStats
from warren.queues.broker.wal_actor import WalStats
from warren.queues.protocol import QueueStats
from warren.store.latency import LATENCY_BUCKETS_S
from warren.store.protocol import StoreStats

from ..cluster.coordinator import CoordinatorStats
from ..supervisor import RestartCounts
from ..version import __version__
from .series import (
    ACTOR_COUNTERS,
    ACTOR_MEMORY,
    ACTOR_RESTARTS,
    ACTORS_RUNNING,
    ALARMS,
    AMQP_COUNTERS,
    AMQP_GAUGES,
    CLUSTER_COUNTERS,
    CLUSTER_GAUGES,
    CONSUMERS,
    CPU_SECONDS,
    DEAD_LETTER_REASONS,
    DEAD_LETTERED,
    FOLLOWER_GAUGES,
    GLOBAL_COUNTERS,
    IDENTITY,
    LISTENER_COUNTERS,
    LISTENER_GAUGES,
    NODE_COUNTERS,
    QUEUE_COUNTERS,
    QUEUE_GAUGES,
    QUEUE_STATE,
    QUEUE_STATES,
    QUEUES_DECLARED,
    QUORUM_GAUGES,
    RESOURCE_GAUGES,
    START_SECONDS,
    STORE_COUNTERS,
    STORE_GAUGES,
    STORE_HISTOGRAMS,
    STREAM_CONSUMER_GAUGES,
    STREAM_CONSUMER_OFFSETS,
    STREAM_COUNTERS,
    STREAM_GAUGES,
    STREAM_OFFSETS,
    STREAM_STATE,
    UNANSWERED,
    VARIABLE_QUEUE_FAMILY,
    VARIABLE_QUEUE_HELP,
    VARIABLE_QUEUE_STATES,
    WAL_COUNTERS,
    WAL_GAUGES,
    Figure,
    dead_lettered,
)

if TYPE_CHECKING:
    from .node import Node

log = logging.getLogger("warren.node")

SCRAPE_BUDGET_S = 0.5  # what one snapshot waits for the actors' answers, all of them
SNAPSHOT_TIMEOUT_S = 5.0  # what a scrape waits for its snapshot, queued ones before it too


class CounterLedger:
    """The node's counters, from readings of actors' counters that restart from 0 with
    every incarnation; see the module docstring."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = {}  # counter -> the node's total
        self.by_owner: dict[str, dict[str, float]] = {}  # actor -> counter -> its total
        self._last: dict[str, tuple[int, dict[str, float]]] = {}  # actor -> readings

    def read(self, owner: str, incarnation: int, readings: Iterable[tuple[str, float]]) -> None:
        """Book one incarnation's counters: only what grew since its last reading adds."""
        seen, last = self._last.get(owner, (incarnation, {}))
        if seen != incarnation:
            last = {}
        own = self.by_owner.setdefault(owner, {})
        for counter, value in readings:
            increase = value - last.get(counter, 0)
            if increase > 0:
                last[counter] = value
                self.totals[counter] = self.totals.get(counter, 0) + increase
                own[counter] = own.get(counter, 0) + increase
            else:
                own.setdefault(counter, 0)
        self._last[owner] = (incarnation, last)

    def forget(self, owner: str) -> None:
        """Drop an actor that is gone for good; its counts stay in the totals."""
        self._last.pop(owner, None)
        self.by_owner.pop(owner, None)

    def owners(self) -> list[str]:
        return list(self.by_owner)


@dataclass
class ActorFigures:
    """One actor that answered: its process, its runtime counters, the figures of its kind
    (a queue's, a stream's, a store's, the listener's, the AMQP port's; empty for others)
    and its
    node-owned counts."""

    name: str
    pid: int
    incarnation: int
    restarts: int
    own: dict[str, Any]
    rss_bytes: int | None
    counters: dict[str, float]


@dataclass
class Snapshot:
    """Everything one scrape reports, gathered at once."""

    node: str
    state: str
    data_dir: str
    start_seconds: float | None
    started_at: float  # epoch seconds
    http_endpoint: str | None
    listen_endpoint: str | None
    alarms: list[str]
    readings: dict[str, int]
    node_counters: dict[str, int]
    declared_queues: list[str]
    queue_types: dict[str, str]  # declared queue -> "classic" or "stream"
    queue_states: dict[str, str]
    running: int
    unanswered: list[str]
    restarts: int
    # actor -> its restarts: every actor the tree runs, and every crashed queue's
    actor_restarts: dict[str, int]
    totals: dict[str, float]
    actors: dict[str, ActorFigures] = dataclasses.field(default_factory=dict)
    queues: dict[str, ActorFigures] = dataclasses.field(default_factory=dict)
    streams: dict[str, ActorFigures] = dataclasses.field(default_factory=dict)
    stores: dict[str, ActorFigures] = dataclasses.field(default_factory=dict)
    listener: ActorFigures | None = None
    amqp: ActorFigures | None = None  # the AMQP port
    wal: ActorFigures | None = None  # quorum queues' write-ahead log
    cluster: ActorFigures | None = None  # the coordinator, in a cluster


QUESTIONS = {
    "queue": QueueStats(),
    "stream": QueueStats(),
    "store": StoreStats(),
    "listener": ListenerStats(),
    "amqp": AmqpStats(),
    "wal": WalStats(),
    "coordinator": CoordinatorStats(),
}


@dataclass
class _Asked:
    ref: ActorRef
    figures: Future | None  # None: not asked (published, or its last request unanswered)
    kind: str  # "queue", "stream", "store", "listener", "amqp", "wal", "coordinator" or "actor"
    published: tuple[int, list[Any]] | None = None  # (seq, answer) read from its file


@dataclass
class _Answer:
    runtime: dict[str, Any]  # the actor's runtime counters
    own: dict[str, Any]  # its kind's figures; {} for an actor of no kind
    usage: dict[str, Any]  # its process's cpu_seconds and rss_bytes; {} node-wide


class NodeFigures:
    """Gathers ``Snapshot``s of one node, on a thread of its own; see the module
    docstring. ``queue_prefix``, ``stream_prefix``, ``stores``, ``listener`` and ``amqp``
    say which actors are what."""

    def __init__(
        self,
        node: Node,
        *,
        queue_prefix: str,
        stream_prefix: str,
        stores: Iterable[str],
        listener: str,
        amqp: str,
        wal: str,
        coordinator: str,
        budget_s: float = SCRAPE_BUDGET_S,
    ) -> None:
        self._node = node
        self._queue_prefix = queue_prefix
        self._stream_prefix = stream_prefix
        self._stores = frozenset(stores)
        self._listener = listener
        self._amqp = amqp
        self._wal = wal
        self._coordinator = coordinator
        self.budget_s = budget_s
        self._ledger = CounterLedger()
        self._outstanding: dict[str, tuple[int, Future]] = {}  # address -> unanswered
        self._slots = SlotReader()  # the actors' published figures
        self._booked: dict[str, tuple[int, int]] = {}  # address -> (incarnation, seq) booked
        self._asked: dict[str, int] = {}  # address -> the incarnation asked once at least
        self._worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="warren-metrics")

    def snapshot(self, *, per_object: bool, timeout: float = SNAPSHOT_TIMEOUT_S) -> Snapshot:
        """Gather a snapshot on the metrics thread, with each actor's process figures when
        ``per_object``; TimeoutError if it took longer than ``timeout``."""
        return self._worker.submit(self._gather, per_object).result(timeout)

    def tree(self, *, timeout: float = SNAPSHOT_TIMEOUT_S) -> dict[str, Any]:
        """The node and its supervision tree (``Supervisor.status``: each supervisor and
        worker with its state and restarts; ``tree`` None while the node starts), read
        on the metrics thread; TimeoutError if it took longer than ``timeout``."""
        return self._worker.submit(self._tree).result(timeout)

    def exchanges_and_bindings(self) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
        """The node's exchanges and bindings (``Node.exchanges_and_bindings``), read at
        once: no actor is asked."""
        return self._node.exchanges_and_bindings()

    def _tree(self) -> dict[str, Any]:
        node = self._node
        root = node.root
        return {
            "node": node.name,
            "state": node.state,
            "tree": root.status() if root is not None else None,
        }

    def close(self) -> None:
        self._worker.shutdown(wait=True, cancel_futures=True)
        self._slots.close()

    # ------------------------------------------------------------------ gathering

    def _kind(self, name: str) -> str:
        if name.startswith(self._queue_prefix):
            return "queue"
        if name.startswith(self._stream_prefix):
            return "stream"
        if name in self._stores:
            return "store"
        if name == self._amqp:
            return "amqp"
        if name == self._wal:
            return "wal"
        if name == self._coordinator:
            return "coordinator"
        return "listener" if name == self._listener else "actor"

    def _gather(self, per_object: bool) -> Snapshot:
        node = self._node
        root = node.root
        refs = root.actor_refs() if root is not None else []
        now = time.monotonic()
        deadline = now + self.budget_s
        asked = [self._read_or_ask(ref, per_object, now) for ref in refs]
        counts = root.restart_counts if root is not None else RestartCounts()
        queue_types = node.queue_types()
        declared = sorted(queue_types)
        queue_states = self._queue_states(declared, {ref.name for ref in refs})
        crashed = [
            (self._stream_prefix if queue_types[name] == "stream" else self._queue_prefix) + name
            for name, state in queue_states.items()
            if state == "crashed"
        ]
        snapshot = Snapshot(
            node=node.name,
            state=node.state,
            data_dir=node.data_dir,
            start_seconds=node.start_duration_s,
            started_at=node.started_at,
            http_endpoint=node.http_endpoint,
            listen_endpoint=node.listen_endpoint,
            alarms=sorted(node.alarms.active),
            readings=dict(node.alarms.readings),
            node_counters=dict(node.counters),
            declared_queues=declared,
            queue_types=queue_types,
            queue_states=queue_states,
            running=len(refs),
            unanswered=[],
            restarts=counts.total(),
            actor_restarts={name: counts.of(name) for name in [ref.name for ref in refs] + crashed},
            totals={},
        )
        for request in asked:
            answer = self._answer(request, deadline)
            ref = request.ref
            if answer is None:
                snapshot.unanswered.append(ref.name)
                continue
            if request.published is None:
                self._book(ref, request.kind, answer)
            elif self._booked.get(ref.address) != (ref.incarnation, request.published[0]):
                # booked once: read again unchanged, it would add nothing
                self._book(ref, request.kind, answer)
                self._booked[ref.address] = (ref.incarnation, request.published[0])
            rss_bytes = answer.usage.get("rss_bytes")
            figures = ActorFigures(
                name=ref.name,
                pid=ref.pid,
                incarnation=ref.incarnation,
                restarts=snapshot.actor_restarts[ref.name],
                own=answer.own,
                rss_bytes=rss_bytes if isinstance(rss_bytes, int) else None,
                counters=dict(self._ledger.by_owner.get(ref.name, {})),
            )
            snapshot.actors[ref.name] = figures
            if request.kind == "queue":
                snapshot.queues[ref.name.removeprefix(self._queue_prefix)] = figures
            elif request.kind == "stream":
                snapshot.streams[ref.name.removeprefix(self._stream_prefix)] = figures
            elif request.kind == "store":
                snapshot.stores[ref.name] = figures
            elif request.kind == "listener":
                snapshot.listener = figures
            elif request.kind == "amqp":
                snapshot.amqp = figures
            elif request.kind == "wal":
                snapshot.wal = figures
            elif request.kind == "coordinator":
                snapshot.cluster = figures
        self._forget_gone(declared, refs)
        snapshot.totals = dict(self._ledger.totals)
        return snapshot

    def _read_or_ask(self, ref: ActorRef, per_object: bool, now: float) -> _Asked:
        """The actor's published figures when they are its figures now (see the module
        docstring), else its request."""
        if self._asked.get(ref.address) != ref.incarnation:
            return self._ask(ref, per_object)  # it publishes once asked: nothing to read yet
        published = self._slots.read(ref.control, ref.pid, ref.incarnation, now)
        if published is None or (per_object and not isinstance(published[1][2], dict)):
            return self._ask(ref, per_object)  # a node-wide answer has no process usage
        held = self._outstanding.pop(ref.address, None)
        if held is not None and held[0] == ref.incarnation:
            try:
                held[1].get(0)  # a late answer is dropped
            except AskTimeout:
                self._outstanding[ref.address] = held  # drained when it comes
            except Exception:
                pass
        return _Asked(ref, None, self._kind(ref.name), published)

    def _ask(self, ref: ActorRef, per_object: bool) -> _Asked:
        """Send the actor its one request, unless the one sent before to this incarnation
        is still unanswered (then none: see Races), or its mailbox is full or it is known
        dead."""
        pinned = ref.pin()
        kind = self._kind(ref.name)
        held = self._outstanding.pop(ref.address, None)
        if held is not None and held[0] == ref.incarnation:
            try:
                held[1].get(0)
            except AskTimeout:
                self._outstanding[ref.address] = held
                return _Asked(pinned, None, kind)
            except Exception:  # whatever it answered late is dropped: asked again below
                pass
        try:
            future = pinned.figures_async(QUESTIONS.get(kind), process=per_object, timeout=0)
        except ActorError:
            future = None
        else:
            self._asked[ref.address] = ref.incarnation
        return _Asked(pinned, future, kind)

    def _answer(self, request: _Asked, deadline: float) -> _Answer | None:
        """The actor's figures, or None unless they all came before the deadline."""
        ref = request.ref
        if request.published is not None:
            answer: Any = request.published[1]
        elif request.figures is None:
            return None
        else:
            try:
                answer = request.figures.get(max(0.0, deadline - time.monotonic()))
            except AskTimeout:
                self._outstanding[ref.address] = (ref.incarnation, request.figures)
                return None
            except Exception as exc:  # an actor going away, or an answer of another shape
                log.debug("metrics: %s answered %s: %s", ref.name, type(exc).__name__, exc)
                return None
        if not isinstance(answer, list) or len(answer) != 3:
            return None
        runtime, own, usage = answer
        if request.kind == "actor":
            own = {}
        if not isinstance(runtime, dict) or not isinstance(own, dict):
            return None  # no figures of its kind: a deleted queue's refusal
        return _Answer(runtime, own, usage if isinstance(usage, dict) else {})

    def _book(self, ref: ActorRef, kind: str, answer: _Answer) -> None:
        own = answer.own
        readings = list(_values(ACTOR_COUNTERS, answer.runtime))
        readings += _values((CPU_SECONDS,), answer.usage)
        own_counters = {
            "queue": QUEUE_COUNTERS,
            "stream": STREAM_COUNTERS,
            "store": STORE_COUNTERS,
            "listener": LISTENER_COUNTERS,
            "amqp": AMQP_COUNTERS,
            "wal": WAL_COUNTERS,
            "coordinator": CLUSTER_COUNTERS,
        }.get(kind, ())
        readings += _values(own_counters, own)
        if kind == "store":
            readings += _histogram_values(STORE_HISTOGRAMS, own)
        if kind == "queue":
            readings += [
                (dead_lettered(reason), value)
                for reason in DEAD_LETTER_REASONS
                if isinstance(value := own.get(f"{DEAD_LETTERED.key}_{reason}"), int)
            ]
        self._ledger.read(ref.name, ref.incarnation, readings)

    def _queue_states(self, declared: list[str], running: set[str]) -> dict[str, str]:
        """Every declared queue's state (``Node.queue_state``), asked of the node only for
        the few whose process is not running now."""
        states = {}
        for name in declared:
            if {self._queue_prefix + name, self._stream_prefix + name} & running:
                states[name] = "running"
            elif self._node.root is None:
                states[name] = "starting"
            else:
                try:
                    states[name] = self._node.queue_state(name)
                except (KeyError, ValueError):  # queue_sup itself is being started again
                    states[name] = "restarting"
        return states

    def _forget_gone(self, declared: list[str], refs: list[ActorRef]) -> None:
        """Forget the readings of queues deleted and no longer run (see Races), and the
        outstanding requests of incarnations no longer run."""
        prefixes = (self._queue_prefix, self._stream_prefix)
        kept = {prefix + name for name in declared for prefix in prefixes}
        kept |= {ref.name for ref in refs}
        for owner in self._ledger.owners():
            if owner.startswith(prefixes) and owner not in kept:
                self._ledger.forget(owner)
        running = {ref.address: ref.incarnation for ref in refs}
        for address, (incarnation, _) in list(self._outstanding.items()):
            if running.get(address) != incarnation:
                del self._outstanding[address]
        for address, (incarnation, _) in list(self._booked.items()):
            if running.get(address) != incarnation:
                del self._booked[address]
        for address, incarnation in list(self._asked.items()):
            if running.get(address) != incarnation:
                del self._asked[address]
        self._slots.keep({ref.control for ref in refs})


def _values(figures: Iterable[Figure], answer: dict[str, Any]) -> Iterator[tuple[str, float]]:
    for figure in figures:
        value = answer.get(figure.key)
        if isinstance(value, (int, float)):
            yield figure.name, value * figure.scale if figure.scale != 1.0 else value


def _histogram_values(
    figures: Iterable[Figure], answer: dict[str, Any]
) -> Iterator[tuple[str, float]]:
    """A histogram reading's figures as counters, each bucket's under its bound: they
    only grow within an incarnation, so the ledger keeps them as it keeps counters."""
    for figure in figures:
        reading = answer.get(figure.key)
        if not isinstance(reading, dict):
            continue
        counts = reading.get("counts")
        if not isinstance(counts, list) or len(counts) != len(LATENCY_BUCKETS_S):
            continue  # not a reading of these buckets: no series rather than wrong ones
        for bound, count in zip(LATENCY_BUCKETS_S, counts, strict=True):
            yield _bucket(figure, bound), count
        yield figure.name + "_count", reading["count"]
        yield figure.name + "_sum", reading["sum"]


def _bucket(figure: Figure, bound: float) -> str:
    """The ledger's name of one bucket of a histogram."""
    return f"{figure.name}_bucket le={bound}"


# ---------------------------------------------------------------------- Prometheus


class WarrenCollector(Collector):
    """The node's one Prometheus collector: node-wide series, with per-queue, per-store
    and per-actor labels when ``per_object``. Each ``collect`` gathers a snapshot."""

    def __init__(self, figures: NodeFigures, *, per_object: bool) -> None:
        self.figures = figures
        self.per_object = per_object

    def collect(self) -> Iterator[Metric]:
        snapshot = self.figures.snapshot(per_object=self.per_object)
        return iter(prometheus_families(snapshot, per_object=self.per_object))

    def describe(self) -> list[Metric]:
        return []  # the series change with the node: nothing to check at registration


def prometheus_families(snapshot: Snapshot, *, per_object: bool) -> list[Metric]:
    """The snapshot as Prometheus metric families, those with no sample left out.
    Node-wide, a queue or stream family is one sample, the sum over those that answered
    (a counter: the node's total), and a stream's offsets are left out; per object, one
    sample per queue, per stream, and per named consumer of a stream."""
    families = [
        _gauge(IDENTITY, ["warren_node"], [((snapshot.node,), 1)]),
        *_node_families(snapshot),
        *_queue_families(snapshot, per_object),
        *_stream_families(snapshot, per_object),
        *_store_families(snapshot),
        *_actor_families(snapshot, per_object),
    ]
    for port, gauges, counters in (
        (snapshot.listener, LISTENER_GAUGES, LISTENER_COUNTERS),
        (snapshot.amqp, AMQP_GAUGES, AMQP_COUNTERS),
        (snapshot.wal, WAL_GAUGES, WAL_COUNTERS),
        (snapshot.cluster, CLUSTER_GAUGES, CLUSTER_COUNTERS),
    ):
        if port is not None:
            families += [_gauge(f, [], [((), port.own.get(f.key))]) for f in gauges]
            families += [_counter(f, [], [((), port.counters.get(f.name))]) for f in counters]
    if snapshot.cluster is not None:
        followers = (snapshot.cluster.own.get("replication") or {}).get("followers", {})
        families += [
            _gauge(f, ["follower"], [((name,), row[f.key]) for name, row in followers.items()])
            for f in FOLLOWER_GAUGES
        ]
    return [family for family in families if family.samples]


Samples = Iterable[tuple[tuple[str, ...], Any]]  # (label values, value); None values skipped


def _gauge(figure: Figure, labels: list[str], samples: Samples) -> Metric:
    family = GaugeMetricFamily(figure.name, figure.help, labels=labels)
    for label_values, value in samples:
        if isinstance(value, (int, float)):
            family.add_metric(list(label_values), float(value) * figure.scale)
    return family


def _counter(figure: Figure, labels: list[str], samples: Samples) -> Metric:
    family = CounterMetricFamily(figure.name, figure.help, labels=labels)
    for label_values, value in samples:
        if isinstance(value, (int, float)):
            family.add_metric(list(label_values), float(value))
    return family


def _histogram(figure: Figure, labels: list[str], owners: list[tuple[str, dict]]) -> Metric:
    """One sample set per owner (label value, its ledger counts) that has the figure."""
    family = HistogramMetricFamily(figure.name, figure.help, labels=labels)
    for name, counts in owners:
        if figure.name + "_count" not in counts:
            continue
        buckets = [
            (floatToGoString(bound), counts.get(_bucket(figure, bound), 0))
            for bound in LATENCY_BUCKETS_S
        ]
        buckets.append(("+Inf", counts[figure.name + "_count"]))
        family.add_metric([name], buckets, counts.get(figure.name + "_sum", 0))
    return family


def _gauges(
    figures: Iterable[Figure], owners: list[tuple[str, ActorFigures]], label: str, per_object: bool
) -> list[Metric]:
    """Each figure's gauge: a sample per owner labelled ``label``, or one, their sum."""
    families = []
    for figure in figures:
        if per_object:
            samples = [((name,), owner.own.get(figure.key)) for name, owner in owners]
            families.append(_gauge(figure, [label], samples))
        else:
            total = sum(owner.own.get(figure.key, 0) for _, owner in owners)
            families.append(_gauge(figure, [], [((), total)]))
    return families


def _counters(
    figures: Iterable[Figure],
    owners: list[tuple[str, ActorFigures]],
    label: str,
    per_object: bool,
    totals: dict[str, float],
) -> list[Metric]:
    """Each figure's counter: a sample per owner labelled ``label``, or one, the node's
    total (which keeps what deleted owners counted)."""
    families = []
    for figure in figures:
        if per_object:
            samples = [((name,), owner.counters.get(figure.name)) for name, owner in owners]
            families.append(_counter(figure, [label], samples))
        else:
            families.append(_counter(figure, [], [((), totals.get(figure.name, 0))]))
    return families


def _node_families(snapshot: Snapshot) -> list[Metric]:
    queues = snapshot.queues.values()
    families = [_gauge(f, [], [((), int(f.key in snapshot.alarms))]) for f in ALARMS]
    families += [_gauge(f, [], [((), snapshot.readings.get(f.key))]) for f in RESOURCE_GAUGES]
    families += [
        _gauge(QUEUES_DECLARED, [], [((), len(snapshot.declared_queues))]),
        _gauge(CONSUMERS, [], [((), sum(q.own.get(CONSUMERS.key, 0) for q in queues))]),
        _gauge(START_SECONDS, [], [((), snapshot.start_seconds)]),
        _gauge(UNANSWERED, [], [((), len(snapshot.unanswered))]),
    ]
    families += [_counter(f, [], [((), snapshot.node_counters.get(f.key))]) for f in NODE_COUNTERS]
    families += [
        _counter(Figure(name, "", text), [], [((), _summed(snapshot, parts))])
        for name, parts, text in GLOBAL_COUNTERS
    ]
    return families


def _summed(snapshot: Snapshot, counters: Iterable[str]) -> float:
    return sum(snapshot.totals.get(counter, 0) for counter in counters)


def _state_family(snapshot: Snapshot, per_object: bool, kind: str) -> Metric:
    """The state of every declared queue of ``kind`` (``queue``: classic, or ``stream``),
    the node's word (no answer needed): per object 1 for its state and 0 for the others,
    node-wide how many are in each."""
    figure = STREAM_STATE if kind == "stream" else QUEUE_STATE
    states = {
        name: state
        for name, state in snapshot.queue_states.items()
        if (snapshot.queue_types.get(name) == "stream") == (kind == "stream")
    }
    if per_object:
        samples = [
            ((name, state), int(states[name] == state))
            for name in sorted(states)
            for state in QUEUE_STATES
        ]
        return _gauge(figure, [kind, "state"], samples)
    counts = collections.Counter(states.values())
    return _gauge(figure, ["state"], [((state,), counts[state]) for state in QUEUE_STATES])


def _queue_families(snapshot: Snapshot, per_object: bool) -> list[Metric]:
    queues = sorted(snapshot.queues.items())
    labels = ["queue"] if per_object else []
    families = _gauges(QUEUE_GAUGES, queues, "queue", per_object)
    samples: list[tuple[tuple[str, ...], Any]]
    states = Figure(VARIABLE_QUEUE_FAMILY, "", VARIABLE_QUEUE_HELP)
    if per_object:
        samples = [
            ((name, state), q.own.get(state))
            for name, q in queues
            for state in VARIABLE_QUEUE_STATES
        ]
    else:
        samples = [
            ((state,), sum(q.own.get(state, 0) for _, q in queues))
            for state in VARIABLE_QUEUE_STATES
        ]
    families.append(_gauge(states, [*labels, "state"], samples))
    families.append(_state_family(snapshot, per_object, "queue"))
    if per_object:  # an index or a latency summed over queues means nothing
        quorum = [(name, q) for name, q in queues if q.own.get("type") == "quorum"]
        families += _gauges(QUORUM_GAUGES, quorum, "queue", per_object)
    families += _counters(QUEUE_COUNTERS, queues, "queue", per_object, snapshot.totals)
    if per_object:
        samples = [
            ((name, reason), q.counters.get(dead_lettered(reason)))
            for name, q in queues
            for reason in DEAD_LETTER_REASONS
        ]
    else:
        samples = [
            ((reason,), snapshot.totals.get(dead_lettered(reason), 0))
            for reason in DEAD_LETTER_REASONS
        ]
    families.append(_counter(DEAD_LETTERED, [*labels, "reason"], samples))
    return families


def _stream_families(snapshot: Snapshot, per_object: bool) -> list[Metric]:
    streams = sorted(snapshot.streams.items())
    families = _gauges(STREAM_GAUGES, streams, "stream", per_object)
    families.append(_state_family(snapshot, per_object, "stream"))
    if per_object:
        families += _gauges(STREAM_OFFSETS, streams, "stream", per_object)
        consumers = [
            ((name, consumer), figures)
            for name, stream in streams
            for consumer, figures in stream.own.get(STREAM_CONSUMER_OFFSETS, {}).items()
        ]
        families += [
            _gauge(f, ["stream", "consumer"], [(labels, c.get(f.key)) for labels, c in consumers])
            for f in STREAM_CONSUMER_GAUGES
        ]
    families += _counters(STREAM_COUNTERS, streams, "stream", per_object, snapshot.totals)
    return families


def _store_families(snapshot: Snapshot) -> list[Metric]:
    stores = sorted(snapshot.stores.items())
    families: list[Metric] = [
        _gauge(f, ["store"], [((name,), s.own.get(f.key)) for name, s in stores])
        for f in STORE_GAUGES
    ]
    families += [
        _counter(f, ["store"], [((name,), s.counters.get(f.name)) for name, s in stores])
        for f in STORE_COUNTERS
    ]
    families += [
        _histogram(f, ["store"], [(name, s.counters) for name, s in stores])
        for f in STORE_HISTOGRAMS
    ]
    return families


def _actor_families(snapshot: Snapshot, per_object: bool) -> list[Metric]:
    families = [_gauge(ACTORS_RUNNING, [], [((), snapshot.running)])]
    if not per_object:
        families.append(_counter(ACTOR_RESTARTS, [], [((), snapshot.restarts)]))
        families += [
            _counter(f, [], [((), snapshot.totals.get(f.name, 0))]) for f in ACTOR_COUNTERS
        ]
        return families
    actors = sorted(snapshot.actors.items())
    labels = ["actor"]
    restarts = sorted(snapshot.actor_restarts.items())
    families.append(_counter(ACTOR_RESTARTS, labels, [((n,), count) for n, count in restarts]))
    families += [
        _counter(f, labels, [((name,), a.counters.get(f.name)) for name, a in actors])
        for f in (*ACTOR_COUNTERS, CPU_SECONDS)
    ]
    families.append(_gauge(ACTOR_MEMORY, labels, [((n,), a.rss_bytes) for n, a in actors]))
    return families


# ---------------------------------------------------------------------- JSON


def _short(figure: Figure, prefix: str, counter: bool = False) -> str:
    """A figure's key in the JSON documents: its series name without the family's prefix."""
    return figure.name.removeprefix(prefix) + ("_total" if counter else "")


def cluster_document(snapshot: Snapshot) -> dict[str, Any]:
    """``/api/cluster``: the node's view of its cluster (``CoordinatorStats``), or
    ``{"cluster": None}`` for a node outside a cluster or while its coordinator does not
    answer."""
    return dict(snapshot.cluster.own) if snapshot.cluster else {"cluster": None}


def overview_document(snapshot: Snapshot) -> dict[str, Any]:
    """``/api/overview``: the node, its version and uptime, its alarms and readings, queue
    totals (``queues`` counts the streams too, ``streams`` those alone), the node's
    counters, the stores, the remote clients' tcp connections (None without a listener)
    and the AMQP clients' (None without an AMQP port), and the node's view of its cluster
    (``CoordinatorStats``; None outside a cluster)."""
    queues = snapshot.queues.values()
    listener = snapshot.listener
    return {
        "node": snapshot.node,
        "version": __version__,
        "started_at": snapshot.started_at,
        "uptime_seconds": max(0.0, time.time() - snapshot.started_at),
        "state": snapshot.state,
        "data_dir": snapshot.data_dir,
        "http_endpoint": snapshot.http_endpoint,
        "listen_endpoint": snapshot.listen_endpoint,
        "start_seconds": snapshot.start_seconds,
        "alarms": snapshot.alarms,
        "readings": snapshot.readings,
        "queues": len(snapshot.declared_queues),
        "streams": sum(kind == "stream" for kind in snapshot.queue_types.values()),
        "consumers": sum(q.own.get(CONSUMERS.key, 0) for q in queues),
        **{
            _short(f, "warren_queue_"): sum(q.own.get(f.key, 0) for q in queues)
            for f in QUEUE_GAUGES
            if f.key != CONSUMERS.key
        },
        "counters": {
            **{
                name.removeprefix("warren_") + "_total": _summed(snapshot, parts)
                for name, parts, _ in GLOBAL_COUNTERS
            },
            **{
                _short(f, "warren_", True): snapshot.node_counters.get(f.key) for f in NODE_COUNTERS
            },
            "actor_restarts_total": snapshot.restarts,
        },
        "stores": {name: _store_document(store) for name, store in sorted(snapshot.stores.items())},
        "actors_running": snapshot.running,
        "actors_unanswered": sorted(snapshot.unanswered),
        "tcp_connections": listener.own.get("connections") if listener else None,
        "amqp_connections": snapshot.amqp.own.get("connections") if snapshot.amqp else None,
        "cluster": snapshot.cluster.own if snapshot.cluster else None,
    }


def _store_document(store: ActorFigures) -> dict[str, Any]:
    document: dict[str, Any] = {
        _short(f, "warren_msg_store_"): _scaled(store.own.get(f.key), f) for f in STORE_GAUGES
    }
    document.update(
        {_short(f, "warren_msg_store_", True): store.counters.get(f.name) for f in STORE_COUNTERS}
    )
    return document


def _scaled(value: Any, figure: Figure) -> Any:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (int, float)) and figure.scale != 1.0:
        return value * figure.scale
    return value


def queues_document(snapshot: Snapshot) -> list[dict[str, Any]]:
    """``/api/queues``: every declared queue and stream, its type (``classic`` or
    ``stream``), its state and, when it answered, its figures (None for one that did
    not): a classic queue's or a stream's, by its type."""
    documents = []
    for name in snapshot.declared_queues:
        kind = snapshot.queue_types.get(name, "classic")
        answered = (snapshot.streams if kind == "stream" else snapshot.queues).get(name)
        document: dict[str, Any] = {
            "name": name,
            "type": kind,
            "state": snapshot.queue_states.get(name, "crashed"),
            "answered": answered is not None,
        }
        if kind == "stream":
            document.update(_stream_document(answered))
        else:
            document.update(_queue_document(answered))
        documents.append(document)
    return documents


def _queue_document(queue: ActorFigures | None) -> dict[str, Any]:
    """A classic queue's gauges, its messages by variable-queue state, its counters (its
    dead letters by reason)."""
    document: dict[str, Any] = {}
    for figure in QUEUE_GAUGES:
        document[_short(figure, "warren_queue_")] = queue.own.get(figure.key) if queue else None
    for state in VARIABLE_QUEUE_STATES:
        document[state] = queue.own.get(state) if queue else None
    document["consumer_details"] = queue.own.get("consumer_details") if queue else None
    for figure in QUEUE_COUNTERS:
        document[_short(figure, "warren_queue_", True)] = (
            queue.counters.get(figure.name) if queue else None
        )
    document[_short(DEAD_LETTERED, "warren_queue_", True)] = (
        {reason: queue.counters.get(dead_lettered(reason)) for reason in DEAD_LETTER_REASONS}
        if queue
        else None
    )
    return document


def _stream_document(stream: ActorFigures | None) -> dict[str, Any]:
    """A stream's gauges and offsets, each named consumer's offset and lag, the super
    stream it is a partition of and its consumer groups, its counters."""
    document: dict[str, Any] = {
        _short(figure, "warren_stream_"): stream.own.get(figure.key) if stream else None
        for figure in (*STREAM_GAUGES, *STREAM_OFFSETS)
    }
    document[STREAM_CONSUMER_OFFSETS] = (
        {
            consumer: {f.key: figures.get(f.key) for f in STREAM_CONSUMER_GAUGES}
            for consumer, figures in stream.own.get(STREAM_CONSUMER_OFFSETS, {}).items()
        }
        if stream
        else None
    )
    for key in ("super_stream", "partition", "consumer_groups"):  # a super stream's part
        document[key] = stream.own.get(key) if stream else None
    for figure in STREAM_COUNTERS:
        document[_short(figure, "warren_stream_", True)] = (
            stream.counters.get(figure.name) if stream else None
        )
    return document


def actors_document(snapshot: Snapshot) -> list[dict[str, Any]]:
    """``/api/actors``: every actor that answered, with its process and its counters."""
    return [
        {
            "name": name,
            "pid": actor.pid,
            "incarnation": actor.incarnation,
            "restarts": actor.restarts,
            "rss_bytes": actor.rss_bytes,
            "cpu_seconds_total": actor.counters.get(CPU_SECONDS.name),
            **{
                _short(f, "warren_actor_", True): actor.counters.get(f.name) for f in ACTOR_COUNTERS
            },
        }
        for name, actor in sorted(snapshot.actors.items())
    ]


def connections_document(snapshot: Snapshot) -> list[dict[str, Any]]:
    """``/api/connections``: each client connection that consumes from a queue or holds
    its deliveries, as the queues that answered say (``consumer_details``): its process
    (the listener's for a remote client: ``transport`` "tcp"; the AMQP port's for an AMQP
    client: "amqp") and, per queue, its
    consumers, prefetch and unacked deliveries. A connection that only publishes is not
    here: its publishes go straight to the queues, which keep no note of it."""
    transports = {
        port.pid: transport
        for port, transport in ((snapshot.listener, "tcp"), (snapshot.amqp, "amqp"))
        if port is not None
    }
    connections: dict[str, dict[str, Any]] = {}
    for name, queue in sorted(snapshot.queues.items()):
        for detail in queue.own.get("consumer_details") or ():
            connection = connections.setdefault(
                detail["connection"],
                {
                    "connection": detail["connection"],
                    "pid": detail["pid"],
                    "transport": transports.get(detail["pid"], "local"),
                    "process": _process_name(detail["pid"]),
                    "consumers": 0,
                    "unacked": 0,
                    "queues": [],
                },
            )
            connection["consumers"] += detail["consumers"]
            connection["unacked"] += detail["unacked"]
            connection["queues"].append(
                {
                    "queue": name,
                    **{k: detail[k] for k in ("consumers", "prefetch_count", "unacked")},
                }
            )
    return list(connections.values())


def _process_name(pid: int | None) -> str | None:
    try:
        return psutil.Process(pid).name() if pid is not None else None
    except psutil.Error:
        return None

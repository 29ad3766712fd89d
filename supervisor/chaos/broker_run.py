"""Warren's own crash-recovery run (``warren chaos``): producers and consumers over tcp across
a default, a lazy, a fanout-bound pair and a quorum queue and a stream while faults land,
then the invariants.

The node listens on a loopback port the run picks; its queues are ``chaos.default``,
``chaos.lazy`` (lazy mode) and ``chaos.fanout.1`` / ``chaos.fanout.2``, both bound to the
fanout exchange ``chaos.fanout``, the quorum queue ``chaos.quorum``, and the stream
``chaos.stream``, whose segments are small (``STREAM_SEGMENT_BYTES``) and whose retention by
size (``STREAM_RETENTION_BYTES``) keeps a few of them, so that retention deletes segments
all run long and races its reader. Producer ``i`` (a process of
``warren.supervisor.chaos.workload``, ``pI``) publishes to the default queue, the lazy
queue, the fanout exchange and the quorum queue in turn (by ``i``), one persistent message
at a time with confirms, under ``producer_id=pI`` and ``sequence=n``, so a publish re-sent
after a fault is a repeat the queue drops. (``pI`` is prefixed by the run's own id, so a
node's data directory can take run after run; body sizes are drawn from the seed, so a run
repeated with its seed publishes the same bytes.) Consumers share the queues among
themselves (every queue has one) and check each body against its id. A stream producer and a
stream reader (``warren.supervisor.chaos.stream_workload``) publish to the stream with
confirms and deduplication, and read it by offset as a named consumer.

After the faults, producers stop, consumers drain the queues until they are empty, and
``warren.supervisor.chaos.workload.audit`` says what was ``lost``, ``unflagged`` (consumed
again without the redelivered flag), ``misrouted``, wrong, or delivered by the quorum queue
with a lower delivery count than before (``backwards``). The stream's reader reads on until
it has been idle ``STREAM_DRAIN_IDLE_S``; then, the node stopped, what the stream holds is
read from its files, and ``warren.supervisor.chaos.stream_workload.audit_stream`` says what
of the stream was lost, and what retention deleted before the reader got there
(``trimmed``). Confirmed messages that a torn or flipped file destroyed are counted apart
(``destroyed``): a store with one copy cannot give those back. Before it damages a file the
harness tells ``note_damage`` where, and the damage excuses only what it can reach: a cut,
the record it lands in and every one after it; a flipped bit, the record it lands in (one of
two neighbours, where the bit falls between two bodies); a file's damaged header, the whole
file. A queue's own files excuse that queue's messages; the shared store's, every queue's; a
stream's segment or index, the messages of the chunks the damage lands in (a cut: and every
chunk after it) and those chunks' offsets (``StreamDamage``); a quorum queue's WAL file
(every quorum queue's) or log segment (its queue's), the record the damage lands in and
every one after it in the file, and with them the delivery counts those records raised; its
snapshot, nothing (the snapshot before it, or the log kept since, holds the same). A
workload process that dies during the run is a problem of the run.
"""

from __future__ import annotations

import bisect
import fnmatch
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from warren.actors import ActorError
from warren.queues.broker.dedup import message_ids
from warren.queues.broker.definitions import queue_directory
from warren.queues.broker.listener import with_free_port
from warren.queues.broker.wal_actor import WAL_NAME
from warren.queues.engine.queue_index import HEADER_BYTES, SLOT_BYTES, records_at
from warren.queues.engine.ra_log import (
    LOG_DIRECTORY,
    QUORUM_DIRECTORY,
    SNAPSHOT_FILE,
    WAL_DIRECTORY,
    record_start,
)
from warren.queues.engine.ref_counts import QUEUES_DIR
from warren.queues.engine.segments import header_fields
from warren.queues.engine.stream_log import INDEX_SUFFIX, SEGMENT_SUFFIX
from warren.queues.errors import QueueError
from warren.queues.protocol import STREAM_ACTOR_PREFIX
from warren.store.store_actor import GC_NAME

from ..node.node import LISTENER_NAME, QUEUE_PREFIX, STORES
from . import faults as chaos
from .report import format_report, report_document, write_report
from .run import (
    RUN_DIR,
    NodeUnderTest,
    check_data_dir,
    harness_signals,
    run_faults,
    spawn_with_parent,
)
from .stream_workload import (
    PAUSE_S,
    StreamAudit,
    StreamDamage,
    audit_stream,
    stream_contents,
    with_stream,
)
from .workload import Audit, Producer, audit, connect_node

if TYPE_CHECKING:
    from warren.queues.client import Connection

__all__ = [
    "QUEUES",
    "RUN_DIR",
    "STREAM",
    "TARGETS",
    "ChaosWorkload",
    "actor_names",
    "pattern_limits",
    "run_chaos",
]

DEFAULT_QUEUE, LAZY_QUEUE, EXCHANGE = "chaos.default", "chaos.lazy", "chaos.fanout"
FANOUT_QUEUES = ("chaos.fanout.1", "chaos.fanout.2")
QUORUM_QUEUE = "chaos.quorum"
QUEUES = (DEFAULT_QUEUE, LAZY_QUEUE, *FANOUT_QUEUES, QUORUM_QUEUE)
# What producer i publishes to, by i modulo 4: (exchange, routing key, the queues it reaches)
TARGETS = (
    ("", DEFAULT_QUEUE, (DEFAULT_QUEUE,)),
    ("", LAZY_QUEUE, (LAZY_QUEUE,)),
    (EXCHANGE, "", FANOUT_QUEUES),
    ("", QUORUM_QUEUE, (QUORUM_QUEUE,)),
)
# Queues whose delivery counts survive every restart: one must never go backwards.
COUNTED_QUEUES = (QUORUM_QUEUE,)
STREAM = "chaos.stream"
STREAM_SEGMENT_BYTES = 256 * 1024  # a segment file, at most (but for its first chunk)
STREAM_RETENTION_BYTES = 4 * STREAM_SEGMENT_BYTES  # the stream's max_length_bytes
DRAIN_IDLE_S = 20.0  # draining ends when the queues stay as they are this long
# ... and the stream's reader has read nothing for this long (longer than it pauses)
STREAM_DRAIN_IDLE_S = PAUSE_S[1] + 2.0
DRAIN_POLL_S = 0.5
STOP_WAIT_S = 30.0  # a workload process told to stop, before it is killed
STORE_GC_BY_SEED = ("compact", "combine")  # an even seed compacts, an odd one combines
# Store files of 1 MiB (16 by default): a run of a minute rolls over dozens, so the GC
# compacts or combines them while the faults land.
CHAOS_STORE_FILE_BYTES = "1MiB"
_ORDER = re.compile(rb'\{"order": "([0-9a-f]+p\d+-\d+)"')
_MSG_ID_AT = 16  # where a queue index slot keeps the message id (16 bytes)
# Process faults a pattern may take in a period: under the restart intensity of the node's
# supervisors (3 in 60 s for the root and for each queue's), so a supervisor giving up is
# the run's finding. A pattern naming queues only may take 3; the others (the root's
# children: the stores, the WAL) share 2, leaving the root a restart for the rest.
QUEUE_PATTERN_LIMIT, OTHER_PATTERNS_LIMIT = (3, 60.0), (2, 60.0)


def actor_names() -> list[str]:
    """The actor names of a node running this workload: the ones it must end with."""
    return [
        GC_NAME,
        *STORES,
        WAL_NAME,
        LISTENER_NAME,
        *(QUEUE_PREFIX + q for q in QUEUES),
        STREAM_ACTOR_PREFIX + STREAM,
    ]


def pattern_limits(patterns: tuple[str, ...]) -> dict[str, tuple[int, float]]:
    """Each pattern's limit; ValueError for a pattern that names none of the actors."""
    names = actor_names()
    queues_only = {}
    for pattern in patterns:
        matched = [n for n in names if fnmatch.fnmatchcase(n, pattern)]
        if not matched:
            raise ValueError(
                f"the pattern {pattern!r} matches no process of the node; its "
                f"processes are {', '.join(names)}"
            )
        queues_only[pattern] = all(
            n.startswith((QUEUE_PREFIX, STREAM_ACTOR_PREFIX)) for n in matched
        )
    others = sum(1 for only in queues_only.values() if not only)
    count, period_s = OTHER_PATTERNS_LIMIT
    other = (max(1, count // max(1, others)), period_s)
    return {p: QUEUE_PATTERN_LIMIT if only else other for p, only in queues_only.items()}


class ChaosWorkload:
    """The workload's processes and ledgers in ``directory``, against the node listening
    on ``endpoint`` (or the cluster whose nodes' addresses it lists, separated by commas:
    ``warren.supervisor.chaos.cluster_run``)."""

    def __init__(
        self,
        directory: str,
        endpoint: str,
        *,
        producers: int,
        consumers: int,
        sizes: tuple[int, int],
        seed: int = 0,
    ) -> None:
        self.directory, self.endpoint = directory, endpoint
        self.producers, self.consumers, self.sizes, self.seed = producers, consumers, sizes, seed
        # Producer ids of this run only: a node's queues remember earlier runs' producers
        # (deduplication) and may still hold their messages.
        self.run_id = os.urandom(3).hex()
        self._producers: list[subprocess.Popen] = []
        self._consumers: list[subprocess.Popen] = []
        self._stream_producers: list[subprocess.Popen] = []
        self._stream_readers: list[subprocess.Popen] = []
        self.problems: list[str] = []
        self._counted: dict[str, tuple[int, int]] = {}  # ledger -> (offset, lines)
        # Bodies in a damaged file, by queue (None: the shared store, every queue's).
        self._destroyed_ids: dict[str | None, set[str]] = {}
        self._destroyed_slots: dict[str, set[bytes]] = {}  # queue -> index entries
        # Queues whose log a damaged file cut: their delivery counts may go back.
        self._counts_damaged: set[str] = set()
        self.stream_damage = StreamDamage()
        self._stream_read_changed = (0, time.monotonic())  # reader lines, and since when
        os.makedirs(directory, exist_ok=True)

    def ledger(self, role: str, index: int) -> str:
        return os.path.join(self.directory, f"{role}{index}.ledger")

    def producer(self, index: int) -> Producer:
        return Producer(
            f"{self.run_id}p{index}",
            self.ledger("producer", index),
            TARGETS[index % len(TARGETS)][2],
        )

    def stream_producer(self) -> Producer:
        return Producer(f"{self.run_id}s0", self.ledger("streamproducer", 0), (STREAM,))

    @property
    def stream_reader_ledger(self) -> str:
        return self.ledger("streamreader", 0)

    def connect(self) -> Connection:
        # a node a fault has just restarted may still be starting: waited for as well
        return connect_node(self.endpoint, wait=60)

    def declare(self) -> None:
        connection = self.connect()
        try:
            connection.declare_queue(DEFAULT_QUEUE)
            connection.declare_queue(LAZY_QUEUE, lazy=True)
            connection.declare_queue(QUORUM_QUEUE, type="quorum")
            connection.declare_exchange(EXCHANGE, kind="fanout")
            for queue in FANOUT_QUEUES:
                connection.declare_queue(queue)
                connection.bind_queue(queue, EXCHANGE)
            connection.declare_queue(
                STREAM,
                type="stream",
                max_segment_size_bytes=STREAM_SEGMENT_BYTES,
                max_length_bytes=STREAM_RETENTION_BYTES,
            )
        finally:
            connection.close()

    def start(self) -> None:
        """Start the consumers and the stream's reader, then the producers; each says
        ``ready`` once connected."""
        for j in range(self.consumers):
            mine = [q for k, q in enumerate(QUEUES) if k % self.consumers == j] or [
                QUEUES[j % len(QUEUES)]
            ]
            self._consumers.append(
                self._spawn("consume", self.endpoint, self.ledger("consumer", j), *mine)
            )
        self._stream_readers.append(
            self._spawn(
                "read-stream",
                self.endpoint,
                STREAM,
                f"{self.run_id}r0",
                self.stream_reader_ledger,
                "--pause-key",
                f"{self.seed}r0",
            )
        )
        for i in range(self.producers):
            exchange, routing_key, _ = TARGETS[i % len(TARGETS)]
            producer = self.producer(i)
            self._producers.append(
                self._spawn(
                    "produce",
                    self.endpoint,
                    routing_key,
                    producer.name,
                    producer.ledger,
                    "--exchange",
                    exchange,
                    "--sizes",
                    *map(str, self.sizes),
                    "--size-key",
                    f"{self.seed}p{i}",
                    "--deduplicate",
                )
            )
        producer = self.stream_producer()
        self._stream_producers.append(
            self._spawn(
                "produce-stream",
                self.endpoint,
                STREAM,
                producer.name,
                producer.ledger,
                "--sizes",
                *map(str, self.sizes),
                "--size-key",
                f"{self.seed}s0",
            )
        )

    def _spawn(self, *argv: str) -> subprocess.Popen:
        with open(os.path.join(self.directory, "workload.log"), "ab") as log:
            process = spawn_with_parent(
                [sys.executable, "-m", "warren.supervisor.chaos.roles", *argv],
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
            )
        assert process.stdout is not None  # stdout=PIPE above
        if process.stdout.readline().strip() != "ready":
            process.kill()
            process.wait()
            raise RuntimeError(
                f"a workload process did not start: {' '.join(argv)} (see "
                f"{os.path.join(self.directory, 'workload.log')})"
            )
        return process

    def sample(self) -> dict[str, int]:
        """Lines in the producers' and the consumers' ledgers so far, the stream's
        included (cheap: new bytes)."""
        producers = [self.ledger("producer", i) for i in range(self.producers)]
        consumers = [self.ledger("consumer", j) for j in range(self.consumers)]
        return {
            "confirmed": sum(map(self._count, [*producers, self.stream_producer().ledger])),
            "consumed": sum(map(self._count, [*consumers, self.stream_reader_ledger])),
        }

    def _count(self, path: str) -> int:
        offset, lines = self._counted.get(path, (0, 0))
        try:
            with open(path, "rb") as file:
                file.seek(offset)
                data = file.read()
        except FileNotFoundError:
            return lines
        done = data.rfind(b"\n") + 1
        self._counted[path] = (offset + done, lines + data.count(b"\n", 0, done))
        return self._counted[path][1]

    def note_damage(self, path: str, kind: str, offset: int) -> None:
        """Before a torn or flipped fault: what it may destroy (see the module docstring)."""
        if self._note_quorum_damage(path, offset):
            return
        if path.endswith((SEGMENT_SUFFIX, INDEX_SUFFIX)):
            self.stream_damage.note(path, kind, offset)
            return
        with open(path, "rb") as file:
            data = file.read()
        parent = os.path.dirname(path)
        queue = (
            os.path.basename(parent)
            if os.path.basename(os.path.dirname(parent)) == "queues"
            else None
        )
        header = 0 if path.endswith(".rdq") else HEADER_BYTES  # the shared store's: none
        whole = offset < header
        if path.endswith(".qi"):  # a queue's segment: its slots, then its own records
            fields = header_fields(data)
            slots_end = min(len(data), records_at(fields[2]) if fields else len(data))
            if offset < slots_end:
                hit = HEADER_BYTES + (offset - HEADER_BYTES) // SLOT_BYTES * SLOT_BYTES
                first, last = (
                    (HEADER_BYTES, slots_end)
                    if whole
                    else (hit, slots_end if kind == "torn" else hit + SLOT_BYTES)
                )
                assert queue is not None  # a segment file lies in its queue's directory
                slots = self._destroyed_slots.setdefault(queue, set())
                for at in range(first, min(last, slots_end - SLOT_BYTES + 1), SLOT_BYTES):
                    slots.add(data[at + _MSG_ID_AT : at + _MSG_ID_AT + 16])
                if not (whole or kind == "torn"):
                    return
                whole = True  # the records after the slots are gone or unreadable too
            data, offset = data[slots_end:], offset - slots_end
        # Bodies start with their event: the last one starting at or before the damage is
        # the record it lands in, unless it lands in the next record's framing.
        events = [(m.start(), m.group(1).decode()) for m in _ORDER.finditer(data)]
        starts = [at for at, _ in events]
        hit = max(0, bisect.bisect_right(starts, offset) - 1)
        reached = events if whole else events[hit:] if kind == "torn" else events[hit : hit + 2]
        self._destroyed_ids.setdefault(queue, set()).update(m for _, m in reached)

    def _note_quorum_damage(self, path: str, offset: int) -> bool:
        """A quorum queue's log file (a WAL file, a segment, a snapshot): reading one stops
        at its first bad record, so a cut or a flipped bit takes the record it lands in and
        every one after it in that file, and with them the delivery counts they raised
        (a WAL file's: any quorum queue's). A snapshot takes nothing (its fallback, or the
        log it kept, holds it all). False for any other file."""
        *_, grandparent, parent, name = path.split(os.sep)
        *_, queues, queue_dir, _ = os.path.dirname(path).split(os.sep)
        if (grandparent, parent) == (QUORUM_DIRECTORY, WAL_DIRECTORY):
            queue = None
        elif (queues, parent) == (QUEUES_DIR, LOG_DIRECTORY):
            queue = queue_dir
        elif grandparent == QUEUES_DIR and name.startswith(SNAPSHOT_FILE):
            return True
        else:
            return False
        with open(path, "rb") as file:
            data = file.read()
        cut = data[record_start(data, offset) :]
        self._destroyed_ids.setdefault(queue, set()).update(
            m.group(1).decode() for m in _ORDER.finditer(cut)
        )
        self._counts_damaged.update(COUNTED_QUEUES if queue is None else (queue,))
        return True

    def destroyed(self, queue: str, message_id: str) -> bool:
        """Whether a damaged file held ``message_id``'s body or ``queue``'s entry of it."""
        if any(message_id in self._destroyed_ids.get(key, ()) for key in (queue, None)):
            return True
        slots = self._destroyed_slots.get(queue)
        if not slots:
            return False
        producer, sequence = message_id.rsplit("-", 1)
        return message_ids(producer.encode(), int(sequence), 1)[0] in slots

    def stop_producers(self) -> None:
        self._stop(self._producers, "producer")
        self._stop(self._stream_producers, "stream producer")

    def drain(self) -> None:
        """Let the consumers empty every queue (ready and unacked) and the stream's
        reader read to its end (idle for ``STREAM_DRAIN_IDLE_S``); give up when the queues
        and the ledgers stay as they are for ``DRAIN_IDLE_S``."""
        try:
            connection = self.connect()
        except OSError:
            return  # no node to drain: the verdict and its health say so
        try:
            last, since = None, time.monotonic()
            while time.monotonic() - since < DRAIN_IDLE_S:
                depths = []
                for queue in QUEUES:
                    try:
                        depths.append(connection.queue_stats(queue)["depth"])
                    except (QueueError, ActorError, TimeoutError):
                        depths.append(None)  # restarting, or down
                if all(depth == 0 for depth in depths) and self._stream_read_idle():
                    return
                now = (tuple(depths), self.sample()["consumed"])
                if now != last:
                    last, since = now, time.monotonic()
                time.sleep(DRAIN_POLL_S)
            self._stalled(dict(zip(QUEUES, last[0] if last else (), strict=False)))
        finally:
            connection.close()

    def _stalled(self, depths: dict[str, int | None]) -> None:
        """The drain gave up with messages left: a problem of the run, named with the
        queues' depths, and every consumer's stacks written to ``workload.log`` (SIGUSR1)
        to show where it stands."""
        left = {queue: depth for queue, depth in depths.items() if depth}
        if not left:
            return
        for process in self._consumers:
            if process.poll() is None:
                process.send_signal(signal.SIGUSR1)
        self.problems.append(
            f"the consumers took nothing for {DRAIN_IDLE_S:g} s while queues held messages "
            f"({', '.join(f'{q} {d}' for q, d in sorted(left.items()))}): a consumer stuck "
            f"(its stacks are in workload.log), or a queue that does not deliver"
        )

    def _stream_read_idle(self) -> bool:
        lines = self._count(self.stream_reader_ledger)
        if lines != self._stream_read_changed[0]:
            self._stream_read_changed = (lines, time.monotonic())
        return time.monotonic() - self._stream_read_changed[1] >= STREAM_DRAIN_IDLE_S

    def close(self) -> None:
        """Stop every workload process (SIGTERM, then SIGKILL)."""
        self.stop_producers()
        self._stop(self._consumers, "consumer")
        self._stop(self._stream_readers, "stream reader")

    def _stop(self, processes: list[subprocess.Popen], role: str) -> None:
        for index, process in enumerate(processes):
            if process.poll() is not None:
                self.problems.append(
                    f"{role} {index} exited with {process.returncode} "
                    f"during the run (see workload.log)"
                )
            else:
                process.terminate()
        for process in processes:
            try:
                process.wait(STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            if process.stdout is not None:
                process.stdout.close()
        processes.clear()

    def audit(self) -> Audit:
        return audit(
            [self.producer(i) for i in range(self.producers)],
            [self.ledger("consumer", j) for j in range(self.consumers)],
            self.destroyed,
            counted=tuple(q for q in COUNTED_QUEUES if q not in self._counts_damaged),
        )

    def audit_stream(self, data_dir: str) -> StreamAudit:
        """The stream's ledgers against what its files on the stopped node hold."""
        return audit_stream(
            STREAM,
            [self.stream_producer()],
            [self.stream_reader_ledger],
            self.stream_damage,
            stream_contents(queue_directory(data_dir, STREAM)),
        )


def run_chaos(
    data_dir: str,
    *,
    duration_s: float,
    kinds: list[str],
    producers: int,
    consumers: int,
    sizes: tuple[int, int],
    seed: int,
    patterns: tuple[str, ...] = ("queue *", "stream *", "msg_store_*", "wal"),
    every_s: tuple[float, float] = (1.0, 3.0),
    files: tuple[str, ...] = chaos.DAMAGEABLE,
    report_dir: str | None = None,
    store_gc: str | None = None,
    say: Callable[[str], None] = print,
) -> dict:
    """The whole run; its report document (``ok`` says whether every invariant held).
    ``patterns`` name the actors kill and stop aim at, ``files`` the files torn and flip
    pick from (patterns under the data directory). ``store_gc`` is the stores' GC
    ("compact" or "combine"); None lets the seed choose, so that random seeds run both.
    ValueError, before anything starts, for a bad fault kind, pattern or duration, or a
    data directory that is not a node's."""
    faults = chaos.schedule(
        seed, duration_s, kinds, patterns=patterns, every_s=every_s, limits=pattern_limits(patterns)
    )
    data_dir = check_data_dir(data_dir)
    run_dir = os.path.join(data_dir, RUN_DIR)
    if os.path.isdir(run_dir):
        for name in os.listdir(run_dir):
            os.unlink(os.path.join(run_dir, name))
    os.makedirs(run_dir, exist_ok=True)
    endpoint = with_free_port("tcp://127.0.0.1:*")
    if store_gc is None:
        store_gc = STORE_GC_BY_SEED[seed % len(STORE_GC_BY_SEED)]
    say(
        f"chaos: seed {seed}, {len(faults)} faults over {duration_s:g} s "
        f"({', '.join(sorted(set(kinds)))}), {producers} producers, {consumers} consumers, "
        f"bodies of {sizes[0]:,} to {sizes[1]:,} bytes, store GC {store_gc}; "
        f"node on {data_dir} at {endpoint}"
    )
    node = NodeUnderTest(
        data_dir,
        options=(
            "--listen",
            endpoint,
            "--store-gc",
            store_gc,
            "--file-size-limit",
            CHAOS_STORE_FILE_BYTES,
        ),
        log_path=os.path.join(run_dir, "node.log"),
    )
    workload = ChaosWorkload(
        run_dir, endpoint, producers=producers, consumers=consumers, sizes=sizes, seed=seed
    )
    with harness_signals():
        try:
            node.start()
            workload.declare()
            node.expect(actor_names())
            workload.start()
            result = run_faults(
                node,
                faults,
                duration_s,
                seed=seed,
                sample=workload.sample,
                before_damage=workload.note_damage,
                files=files,
            )
            say("chaos: faults done; producers stop, consumers drain")
            workload.stop_producers()
            workload.drain()
            result.healthy_at_end = node.healthy()
            result.restarts, result.node_starts = node.restarts(), node.starts
        finally:
            workload.close()
            node.close()
    result.problems += workload.problems
    verdict, stream_verdict = workload.audit(), workload.audit_stream(data_dir)
    document = report_document(
        result, with_stream(verdict.counts(), stream_verdict), verdict.ok and stream_verdict.ok
    )
    document["store_gc"] = store_gc
    if report_dir is not None:
        document = write_report(report_dir, document)
    say(format_report(document))
    return document

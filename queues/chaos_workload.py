"""Warren's own crash-recovery run (``warren chaos``): producers and consumers over tcp
across a default, a lazy and a fanout-bound pair of queues while faults land, then the
invariants.

The node listens on a loopback port the run picks; its queues are ``chaos.default``,
``chaos.lazy`` (lazy mode) and ``chaos.fanout.1`` / ``chaos.fanout.2``, both bound to
the fanout exchange ``chaos.fanout``. Producer ``i`` (a process, ``pI``) publishes to the
default queue, the lazy queue and the fanout exchange in turn (by ``i``), one persistent
message at a time with confirms, under ``producer_id=pI`` and ``sequence=n``, so a
publish re-sent after a fault is a repeat the queue drops; every confirmed id goes to its
ledger, every re-sent one to ``.resent``. (``pI`` is prefixed by the run's own id, so a
node's data directory can take run after run.) The body of ``pI-n`` is an order event padded
by its digest to a size drawn, from its id, in the ``--size`` range: a consumer checks
each body against its id and writes ``queue id redelivered`` (or ``queue ? wrong``).
Consumers share the queues among themselves (every queue has one) and ack each message
after writing its line, so a consumer killed in between sees it again, redelivered.

After the faults, producers stop, consumers drain what is left, and ``Verdict`` says:

- ``lost``: confirmed messages no consumer got from a queue they went to, other than
  those a torn or flipped file destroyed (``destroyed``: a damaged file held their body
  or their index entry; a store with one copy cannot give those back, and the run counts
  them apart);
- ``duplicates`` / ``unflagged``: a message consumed again from a queue must carry the
  redelivered flag, unless its producer re-sent it (at-least-once);
- ``wrong_bodies``: a delivered body unlike the one published: never allowed;
- the node ends healthy (every actor running).

Races: a fault between a publish and its confirm leaves the message in doubt: it is not in
the ledger (so it cannot be lost), and its re-send is deduplicated. A consumer's line is
written before its ack, so a message can be consumed twice but never acked unrecorded.
"""

from __future__ import annotations

import fnmatch
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from warren.actors._forkserver import die_with_parent
from warren.supervisor import chaos
from warren.supervisor.chaos_report import (format_report, report_document,
                                            write_report)
from warren.supervisor.chaos_run import NodeUnderTest, harness_signals, run_faults

from .dedup import message_ids
from .queue_index import HEADER_BYTES, SLOT_BYTES
from .workload import consume, ledger_lines, produce

__all__ = ["QUEUES", "TARGETS", "ChaosWorkload", "Verdict", "actor_names", "pattern_limits",
           "run_chaos"]

DEFAULT_QUEUE, LAZY_QUEUE, EXCHANGE = "chaos.default", "chaos.lazy", "chaos.fanout"
FANOUT_QUEUES = ("chaos.fanout.1", "chaos.fanout.2")
QUEUES = (DEFAULT_QUEUE, LAZY_QUEUE, *FANOUT_QUEUES)
# What producer i publishes to, by i modulo 3: (exchange, routing key, the queues it reaches)
TARGETS = (("", DEFAULT_QUEUE, (DEFAULT_QUEUE,)), ("", LAZY_QUEUE, (LAZY_QUEUE,)),
           (EXCHANGE, "", FANOUT_QUEUES))
DRAIN_IDLE_S = 20.0        # consumers drain until nothing new arrives this long
_ORDER = re.compile(rb'\{"order": "([0-9a-f]+p\d+-\d+)"')
_MSG_ID_AT = 16            # where a queue index slot keeps the message id (16 bytes)
# Process faults a pattern may take in a period: under the restart intensity of the node's
# supervisors (3 in 60 s for the root and for each queue's), so a supervisor giving up is
# the run's finding. A pattern naming queues only may take 3; any other 2, leaving the
# root a restart for the rest.
QUEUE_PATTERN_LIMIT, OTHER_PATTERN_LIMIT = (3, 60.0), (2, 60.0)
RUN_DIR = "chaos-run"      # in the data directory: the ledgers and the node's log


def actor_names() -> list[str]:
    """The actor names of a node running this workload (for checking fault patterns)."""
    return ["msg_store_gc", "msg_store_persistent", "msg_store_transient", "listener",
            *(f"queue {q}" for q in QUEUES)]


def pattern_limits(patterns: tuple[str, ...]) -> dict[str, tuple[int, float]]:
    """Each pattern's limit; ValueError for a pattern that names none of the actors."""
    names = actor_names()
    limits = {}
    for pattern in patterns:
        matched = [n for n in names if fnmatch.fnmatchcase(n, pattern)]
        if not matched:
            raise ValueError(f"the pattern {pattern!r} matches no process of the node; its "
                             f"processes are {', '.join(names)}")
        limits[pattern] = (QUEUE_PATTERN_LIMIT if all(n.startswith("queue ") for n in matched)
                           else OTHER_PATTERN_LIMIT)
    return limits


@dataclass
class Verdict:
    confirmed: int = 0               # (queue, message) pairs confirmed
    consumed: int = 0                # deliveries recorded
    lost: list[str] = field(default_factory=list)
    destroyed: list[str] = field(default_factory=list)
    duplicates: int = 0
    unflagged: list[str] = field(default_factory=list)
    wrong_bodies: int = 0

    @property
    def ok(self) -> bool:
        return not self.lost and not self.unflagged and not self.wrong_bodies

    def invariants(self) -> dict:
        """The report's counts (and the ids behind the failing ones)."""
        figures = asdict(self)
        return {"confirmed": self.confirmed, "consumed": self.consumed,
                "lost": len(self.lost), "duplicates": self.duplicates,
                "unflagged_duplicates": len(self.unflagged),
                "wrong_bodies": self.wrong_bodies, "destroyed": len(self.destroyed),
                "lost_ids": figures["lost"], "unflagged_ids": figures["unflagged"],
                "destroyed_ids": figures["destroyed"]}


class ChaosWorkload:
    """The workload's processes and ledgers in ``directory``, against the node listening
    on ``endpoint``."""

    def __init__(self, directory: str, endpoint: str, *,
                 producers: int, consumers: int, sizes: tuple[int, int]) -> None:
        self.directory, self.endpoint = directory, endpoint
        self.producers, self.consumers, self.sizes = producers, consumers, sizes
        # Producer ids of this run only: a node's queues remember earlier runs' producers
        # (deduplication) and may still hold their messages.
        self.run_id = os.urandom(3).hex()
        self._processes: list[subprocess.Popen] = []
        self._counted: dict[str, tuple[int, int]] = {}     # ledger -> (offset, lines)
        # Bodies in a damaged file, by queue (None: the shared store, every queue's).
        self._destroyed_ids: dict[str | None, set[str]] = {}
        self._destroyed_slots: dict[str, set[bytes]] = {}  # queue -> index entries
        os.makedirs(directory, exist_ok=True)

    def ledger(self, role: str, index: int) -> str:
        return os.path.join(self.directory, f"{role}{index}.ledger")

    def declare(self) -> None:
        from warren import connect

        connection = connect(self.endpoint)
        try:
            connection.declare_queue(DEFAULT_QUEUE)
            connection.declare_queue(LAZY_QUEUE, lazy=True)
            connection.declare_exchange(EXCHANGE, kind="fanout")
            for queue in FANOUT_QUEUES:
                connection.declare_queue(queue)
                connection.bind_queue(queue, EXCHANGE)
        finally:
            connection.close()

    def start(self) -> None:
        """Start the consumers, then the producers; each says ``ready`` once connected."""
        for j in range(self.consumers):
            mine = [q for k, q in enumerate(QUEUES) if k % self.consumers == j] or [
                QUEUES[j % len(QUEUES)]]
            self._spawn("consume", self.endpoint, self.ledger("consumer", j), *mine)
        for i in range(self.producers):
            self._spawn("produce", self.endpoint, f"{self.run_id}p{i}", str(i % len(TARGETS)),
                        str(self.sizes[0]), str(self.sizes[1]), self.ledger("producer", i))

    def _spawn(self, *argv: str) -> None:
        parent = os.getpid()
        process = subprocess.Popen(
            [sys.executable, "-m", "warren.queues.chaos_workload", *argv],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True,
            preexec_fn=lambda: die_with_parent(parent))
        self._processes.append(process)
        if process.stdout.readline().strip() != "ready":
            raise RuntimeError(f"a workload process did not start: {' '.join(argv)}")

    def sample(self) -> dict[str, int]:
        """Lines in the producers' and the consumers' ledgers so far (cheap: new bytes)."""
        return {"confirmed": sum(self._count(self.ledger("producer", i))
                                 for i in range(self.producers)),
                "consumed": sum(self._count(self.ledger("consumer", j))
                                for j in range(self.consumers))}

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
        """Before a torn or flipped fault: what it may destroy. A cut destroys the record
        it lands in and every one after it (the whole file if it cuts the header); a flipped
        bit may cost the whole file (a flipped length loses the records after it)."""
        with open(path, "rb") as file:
            data = file.read()
        whole = kind != "torn" or offset < HEADER_BYTES
        parent = os.path.dirname(path)
        queue = (os.path.basename(parent)
                 if os.path.basename(os.path.dirname(parent)) == "queues" else None)
        if path.endswith(".qi"):
            slots = self._destroyed_slots.setdefault(queue, set())
            first = HEADER_BYTES if whole else (
                HEADER_BYTES + (offset - HEADER_BYTES) // SLOT_BYTES * SLOT_BYTES)
            for at in range(first, len(data) - SLOT_BYTES + 1, SLOT_BYTES):
                slots.add(data[at + _MSG_ID_AT:at + _MSG_ID_AT + 16])
            return
        # A body starts with its event: the last one starting before the cut is the one
        # the cut lands in (or the one before it, when the cut is in a record's header).
        start = 0 if whole else max(0, data.rfind(b'{"order": ', 0, offset + 1))
        self._destroyed_ids.setdefault(queue, set()).update(
            m.decode() for m in _ORDER.findall(data, start))

    def stop_producers(self) -> None:
        for process in self._processes:
            if process.args[3] == "produce":
                process.send_signal(signal.SIGTERM)
        for process in self._processes:
            if process.args[3] == "produce":
                process.wait(30)

    def drain(self) -> None:
        """Wait until the consumers got every confirmed message (but those a damaged file
        destroyed), or nothing new for ``DRAIN_IDLE_S``."""
        last, since = -1, time.monotonic()
        while time.monotonic() - since < DRAIN_IDLE_S:
            consumed = self.sample()["consumed"]
            if consumed != last:
                last, since = consumed, time.monotonic()
                if not self.verdict().lost:
                    return
            time.sleep(0.5)

    def close(self) -> None:
        """Stop every workload process (SIGTERM, then SIGKILL)."""
        for process in self._processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self._processes:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            process.stdout.close()
        self._processes.clear()

    def _expected(self) -> set[tuple[str, str]]:
        pairs = set()
        for i in range(self.producers):
            queues = TARGETS[i % len(TARGETS)][2]
            for message_id in ledger_lines(self.ledger("producer", i)):
                pairs.update((queue, message_id) for queue in queues)
        return pairs

    def verdict(self) -> Verdict:
        expected = self._expected()
        resent = {m for i in range(self.producers)
                  for m in ledger_lines(self.ledger("producer", i) + ".resent")}
        result = Verdict(confirmed=len(expected))
        seen: set[tuple[str, str]] = set()
        for j in range(self.consumers):
            for line in ledger_lines(self.ledger("consumer", j)):
                queue, message_id, redelivered = line.split()
                result.consumed += 1
                if message_id == "?":
                    result.wrong_bodies += 1
                    continue
                pair = (queue, message_id)
                if pair in seen:
                    result.duplicates += 1
                    if redelivered != "1" and message_id not in resent:
                        result.unflagged.append(f"{queue} {message_id}")
                seen.add(pair)
        for queue, message_id in sorted(expected - seen):
            name = f"{queue} {message_id}"
            (result.destroyed if self._destroyed(queue, message_id)
             else result.lost).append(name)
        return result

    def _destroyed(self, queue: str, message_id: str) -> bool:
        if any(message_id in self._destroyed_ids.get(key, ()) for key in (queue, None)):
            return True
        slots = self._destroyed_slots.get(queue)
        if not slots:
            return False
        producer, sequence = message_id.rsplit("-", 1)
        return message_ids(producer.encode(), int(sequence), 1)[0] in slots


def run_chaos(data_dir: str, *, duration_s: float, kinds: list[str], producers: int,
              consumers: int, sizes: tuple[int, int], seed: int,
              patterns: tuple[str, ...] = ("queue *", "msg_store_*"),
              every_s: tuple[float, float] = (1.0, 3.0), report_dir: str | None = None,
              say: Callable[[str], None] = print) -> dict:
    """The whole run; its report document (``ok`` says whether every invariant held).
    ValueError, before anything starts, for a bad fault kind, pattern or duration."""
    faults = chaos.schedule(seed, duration_s, kinds, patterns=patterns, every_s=every_s,
                            limits=pattern_limits(patterns))
    run_dir = os.path.join(data_dir, RUN_DIR)
    if os.path.isdir(run_dir):
        for name in os.listdir(run_dir):
            os.unlink(os.path.join(run_dir, name))
    os.makedirs(run_dir, exist_ok=True)
    endpoint = f"tcp://127.0.0.1:{free_loopback_port()}"
    say(f"chaos: seed {seed}, {len(faults)} faults over {duration_s:g} s "
        f"({', '.join(sorted(set(kinds)))}), {producers} producers, {consumers} consumers, "
        f"bodies of {sizes[0]:,} to {sizes[1]:,} bytes; node on {data_dir} at {endpoint}")
    node = NodeUnderTest(data_dir, options=("--listen", endpoint),
                         log_path=os.path.join(run_dir, "node.log"))
    workload = ChaosWorkload(run_dir, endpoint, producers=producers,
                             consumers=consumers, sizes=sizes)
    with harness_signals():
        try:
            node.start()
            workload.declare()
            workload.start()
            result = run_faults(node, faults, duration_s, seed=seed, sample=workload.sample,
                                before_damage=workload.note_damage)
            say("chaos: faults done; producers stop, consumers drain")
            workload.stop_producers()
            workload.drain()
            result.healthy_at_end = node.healthy()
            result.restarts, result.node_starts = node.restarts(), node.starts
        finally:
            workload.close()
            node.close()
    verdict = workload.verdict()
    document = report_document(result, verdict.invariants(), verdict.ok)
    if report_dir is not None:
        document = write_report(report_dir, document)
    say(format_report(document))
    return document


def free_loopback_port() -> int:
    """A tcp port free on 127.0.0.1 now (the node binds it for the whole run)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# ------------------------------------------------------------------ the processes

class _Stop(Exception):
    pass


def _stop_on_sigterm() -> None:
    def stop(_signum: int, _frame: object) -> None:
        raise _Stop

    signal.signal(signal.SIGTERM, stop)


def _produce(endpoint: str, name: str, target: int, sizes: tuple[int, int],
             ledger: str) -> None:
    from warren import connect

    exchange, routing_key, _ = TARGETS[target]
    connection = connect(endpoint, connect_timeout_s=60)
    print("ready", flush=True)
    produce(connection, routing_key, name, None, ledger, exchange, sizes=sizes,
            deduplicate=True)


def _consume(endpoint: str, ledger: str, queues: list[str]) -> None:
    from warren import connect

    connection = connect(endpoint, connect_timeout_s=60)
    print("ready", flush=True)
    consume(connection, queues, ledger)


def main(argv: list[str]) -> None:
    _stop_on_sigterm()
    try:
        if argv[0] == "produce":
            _produce(argv[1], argv[2], int(argv[3]), (int(argv[4]), int(argv[5])), argv[6])
        elif argv[0] == "consume":
            _consume(argv[1], argv[2], argv[3:])
        else:
            raise SystemExit(f"unknown role {argv[0]!r}: produce or consume")
    except (_Stop, KeyboardInterrupt):
        # Every ledger line is written whole (line buffering); leave without waiting for
        # the connection's sockets, which a node that is away would hold up.
        os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])

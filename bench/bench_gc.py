"""The store's two garbage collections, compaction in place and the combine of neighbouring
files, on the same workloads in one run: how fast each reclaims disk, the disk it takes
meanwhile, what it costs a writer, and the confirm latency while it works.

    python -m bench gc [--quick]

Every workload runs in a fresh node (``Node(store_gc=...)``) whose persistent store actor
and GC process do the work, as users run them; the bench reaches the store through
``StoreClient``s and asks it for ``StoreStats`` every 10 ms (every 100 ms while a writer
runs). The reclaim workloads run ``ROUNDS`` times and the writer workload ``WRITER_ROUNDS``
times, each setting in turn, and report their sums.

Reclaiming: the store is filled with 1 KiB messages (48 files of 4 MiB), then a random
50 %, 75 % or 90 % of them are acked (garbage spread over every file), or 90 % of those in
the oldest third of the files (garbage concentrated in old files). Reclaimed is the fall
of the store's ``bytes_on_disk`` until the GC is done: no job in flight, and either nothing
due (for the combine: garbage at or below ``GARBAGE_FRACTION`` of the store) or, for
compaction (a file is only taken once it saw no remove for ``COMPACT_QUIET_S``),
``SETTLE_S`` since the last ack and a GC check since the last job. The rate counts from the
first job seen to the last fall; the time from the first ack, which includes compaction's
quiet wait, is in the note. Peak disk is the store directory's allocated size
(``st_blocks``: data files, removal logs, journals, the lock table), sampled every 5 ms
from the first ack on, against its size before it: a combine writes the new file before
it deletes the pair.

Writers: one client publishes 1 KiB messages as fast as its credit allows and acks each
one ``ACK_LAG`` messages later; its confirmed writes a second while the GC works on a
backlog (75 % of 48 files acked at once: from the first poll that sees a job to the last)
against the same writer for ``IDLE_S`` before the backlog is acked and ``IDLE_S`` once the
GC is done (nothing due either time: a drift of the machine's speed over the run counts
on both sides). While the writer writes, the store makes its GC yield (``GC_LOOP_SHARE``
of its loop, ``GC_BUSY_SHARE`` of the time), so the GC works longer than without it: its
busy time, the waits between its jobs included, is in the note.

Confirm latency: four files of 100-byte messages, two in three then removed; a probe
client writes one message every 5 ms and waits for its confirm, first with nothing else
happening (the baseline), then while the GC works (the writes made while a job is in
flight: the probe is a writer, so the GC waits between jobs, and those waits do not
count); each latency counts from when the write was due. Small messages are the GC's worst case: its
work grows with the number of records.
"""

from __future__ import annotations

import os
import random
import shutil
import threading
import time
from collections import deque
from dataclasses import dataclass

from warren.store.client import StoreClient
from warren.store.engine.gc import MIN_FILES_FOR_GC
from warren.store.engine.message_store import GARBAGE_FRACTION
from warren.store.protocol import Settled, StoreStats
from warren.store.store_actor import COMPACT_QUIET_S, GC_CHECK_INTERVAL_S
from warren.supervisor import Node

from .table import Row, median, percentile, render, scratch_directory

SETTINGS = ("compact", "combine")  # the figure, the baseline
STORE = "msg_store_persistent"
MIB = 2**20
MB = 1e6
BODY_BYTES = 1024
RECORD_BYTES = BODY_BYTES + 25
FILE_BYTES = 4 * MIB
FILES = 48  # per reclaim workload
STEADY_FILES = 48  # the writers' workload: the backlog the GC works on
STEADY_ACKED = 0.75
IDLE_S = 5.0  # the writer with the GC idle: before the backlog is acked, and once it is done
ROUNDS = 2  # of every reclaim workload, each setting in turn
# Of the writer workload, each setting in turn: a writer alone moves by 10-20 % from one
# five seconds to the next here, so two rounds' ratio swung by as much as the target.
WRITER_ROUNDS = 4
ACK_LAG = 8000  # the writer acks each message this many messages after it
ACK_GROUP = 100  # messages written, then acked, at a time
ACK_CHUNK = 800  # acks per batch when a workload acks its garbage
POLL_S = 0.01  # StoreStats while a GC works
WRITER_POLL_S = 0.1  # the writer's StoreStats
DISK_POLL_S = 0.005
# The GC is done once no job is in flight, nothing is due, or: SETTLE_S have passed since
# the last ack (every file acked is quiet by then: compaction waits COMPACT_QUIET_S from
# the first GC check that saw its last remove) and a GC check more passed since the last
# job (a job that ends chooses the next file at once).
NEXT_CHECK_S = 1.5 * GC_CHECK_INTERVAL_S
SETTLE_S = COMPACT_QUIET_S + NEXT_CHECK_S
GC_TIMEOUT_S = 120.0
TARGET_RECLAIM_RATIO = 1.0  # compaction's rate of the combine's, where garbage is spread
TARGET_WRITER_RATIO = 0.9  # writers' throughput while the GC works, of idle

PROBE_BODY_BYTES = 100
PROBE_FILE_BYTES = 16 * MIB
TARGET_P99_MS = 50.0
PROBE_INTERVAL_S = 0.005

WORKLOADS = (  # (name, acked fraction, of the oldest third only)
    ("50 % acked at random", 0.50, False),
    ("75 % acked at random", 0.75, False),
    ("90 % acked at random", 0.90, False),
    ("90 % of the oldest third acked", 0.90, True),
)


# ---------------------------------------------------------------------- watching


def allocated(directory: str) -> int:
    """The bytes the files of ``directory`` take on disk (st_blocks)."""
    total = 0
    with os.scandir(directory) as entries:
        for entry in entries:
            try:
                total += entry.stat(follow_symlinks=False).st_blocks * 512
            except FileNotFoundError:
                continue  # deleted since the listing
    return total


class DiskSampler:
    """``with DiskSampler(directory) as disk:`` samples its allocated size in a thread
    every ``DISK_POLL_S``; ``disk.before``, ``disk.peak``, ``disk.last``."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.before = self.peak = self.last = allocated(directory)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="disk-sampler", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(DISK_POLL_S):
            self.last = allocated(self.directory)
            self.peak = max(self.peak, self.last)

    def __enter__(self) -> DiskSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.last = allocated(self.directory)
        self.peak = max(self.peak, self.last)


class GCWatch:
    """The store's GC as its ``StoreStats`` show it, one ask per ``poll()``: when a job
    was first and last seen, when ``bytes_on_disk`` last fell, and whether it is done."""

    def __init__(self, store, setting: str) -> None:
        self.store = store
        self.setting = setting
        self.figures = self.before = store.ask(StoreStats())
        self.acked_at = self.started = time.monotonic()
        self.first_job: float | None = None
        self.last_job: float | None = None
        self.last_fall: float | None = None
        self.working = False  # a job was in flight, or started, at the last poll
        self.busy = False  # ... or the GC was waiting to start the next (yielding)

    def poll(self) -> bool:
        """Ask the store; True once the GC is done."""
        previous, figures = self.figures, self.store.ask(StoreStats())
        now = time.monotonic()
        self.figures = figures
        # between two jobs while the store makes its GC yield to writers: busy too
        paused = figures["gc_paused_s"] > 0
        self.working = figures["gc_job_in_flight"] or figures["gc_jobs"] != previous["gc_jobs"]
        self.busy = self.working or paused
        if self.busy:
            self.first_job = self.first_job or now
            self.last_job = now
        if figures["bytes_on_disk"] < previous["bytes_on_disk"]:
            self.last_fall = now
        if figures["gc_job_in_flight"] or paused:
            return False
        if self.setting == "combine" and (
            figures["garbage_fraction"] <= GARBAGE_FRACTION
            or figures["file_count"] < MIN_FILES_FOR_GC
        ):
            return True  # its trigger no longer holds: nothing is due
        return now - self.acked_at >= SETTLE_S and (
            self.last_job is None or now - self.last_job >= NEXT_CHECK_S
        )

    def wait(self) -> None:
        while not self.poll():
            if time.monotonic() - self.started > GC_TIMEOUT_S:
                raise TimeoutError(
                    f"the {self.setting} GC was not done within {GC_TIMEOUT_S:g} s: {self.figures}"
                )
            time.sleep(POLL_S)

    @property
    def jobs(self) -> int:
        return self.figures["gc_jobs"] - self.before["gc_jobs"]

    @property
    def reclaimed(self) -> int:
        return self.before["bytes_on_disk"] - self.figures["bytes_on_disk"]

    @property
    def working_s(self) -> float | None:
        """From the first job seen to the last fall of ``bytes_on_disk``."""
        if self.first_job is None or self.last_fall is None:
            return None
        return max(self.last_fall - self.first_job, POLL_S)


def fill(client: StoreClient, count: int, body_bytes: int) -> list[bytes]:
    ids = [os.urandom(16) for _ in range(count)]
    body = os.urandom(body_bytes)
    for msg_id in ids:
        client.write(msg_id, body)
    client.settle()
    return ids


def ack(client: StoreClient, ids: list[bytes], watch: GCWatch) -> None:
    """Remove ``ids`` a batch at a time, asking the store's figures now and then (a
    combine may start before the last ack), until all are applied."""
    watch.started = time.monotonic()
    for n, start in enumerate(range(0, len(ids), ACK_CHUNK)):
        client.remove(ids[start : start + ACK_CHUNK])
        if n % 5 == 4:
            watch.poll()
    client.settle()
    watch.acked_at = time.monotonic()


# ---------------------------------------------------------------------- reclaiming


@dataclass(frozen=True)
class Reclaim:
    after_bytes: int
    valid_bytes: int
    reclaimed: int
    working_s: float | None
    from_acks_s: float | None  # from the first ack to the last fall
    disk_before: int  # the directory's allocated bytes
    disk_peak: int
    data_file_bytes: int  # the .rdq files' sizes at the end
    log_bytes: int  # the removal logs' (.removed) at the end


def reclaim(
    root: str, setting: str, files: int, file_bytes: int, acked: float, oldest_third: bool
) -> Reclaim:
    directory = os.path.join(root, f"reclaim-{setting}")
    with Node(directory, file_size_limit=file_bytes, store_gc=setting) as node:
        store = node.store()
        client = StoreClient(store)
        ids = fill(client, files * file_bytes // RECORD_BYTES, BODY_BYTES)
        candidates = ids[: len(ids) // 3] if oldest_third else ids
        chosen = random.Random(len(candidates)).sample(candidates, round(acked * len(candidates)))
        store_directory = os.path.join(node.data_dir, STORE)
        with DiskSampler(store_directory) as disk:
            watch = GCWatch(store, setting)
            ack(client, chosen, watch)
            watch.wait()
        client.terminate()
        sizes = {entry.name: entry.stat().st_size for entry in os.scandir(store_directory)}
    shutil.rmtree(directory, ignore_errors=True)
    figures = watch.figures
    return Reclaim(
        after_bytes=figures["bytes_on_disk"],
        valid_bytes=figures["valid_bytes"],
        reclaimed=watch.reclaimed,
        working_s=watch.working_s,
        from_acks_s=None if watch.last_fall is None else watch.last_fall - watch.started,
        disk_before=disk.before,
        disk_peak=disk.peak,
        data_file_bytes=sum(n for name, n in sizes.items() if name.endswith(".rdq")),
        log_bytes=sum(n for name, n in sizes.items() if name.endswith(".removed")),
    )


def _took(results: list[Reclaim]) -> str:
    """What one setting did, averaged over the rounds."""
    reclaimed = sum(r.reclaimed for r in results) / len(results)
    if not reclaimed:
        return "none"
    timed = [r for r in results if r.working_s is not None and r.from_acks_s is not None]
    if not timed:
        return f"{reclaimed / MB:.0f} MB, no GC job"
    working_s = sum(r.working_s for r in timed) / len(timed)
    from_acks_s = sum(r.from_acks_s for r in timed) / len(timed)
    return f"{reclaimed / MB:.0f} MB in {working_s:.2f} s, {from_acks_s:.1f} s after the first ack"


def _rate(results: list[Reclaim]) -> float:
    """MB reclaimed a second while the GC works, over every round; 0 if none reclaimed."""
    working_s = sum(r.working_s or 0.0 for r in results)
    return sum(r.reclaimed for r in results) / working_s / MB if working_s else 0.0


def reclaim_rows(name: str, spread: bool, results: dict[str, list[Reclaim]]) -> list[Row]:
    compact, combine = results["compact"], results["combine"]
    note = f"compaction {_took(compact)}; combine {_took(combine)}"
    if not any(r.reclaimed for r in combine):
        note += f" (not due: garbage not over {GARBAGE_FRACTION:.0%} of the store)"
    elif len(compact) > 1:
        note += "; ratio by round " + ", ".join(
            f"{_rate([c]) / _rate([b]):.2f}" if _rate([b]) else "-"
            for c, b in zip(compact, combine, strict=True)
        )
    rows = [
        Row(
            f"{name}: MB reclaimed a second, compaction",
            _rate(compact),
            "MB/s",
            _rate(combine),
            TARGET_RECLAIM_RATIO if spread else None,
            note,
        )
    ]
    for setting, rounds in results.items():
        peak = max(rounds, key=lambda r: r.disk_peak / r.disk_before)
        last = rounds[-1]
        left = (
            f"left {last.after_bytes / MB:.0f} MB ({last.valid_bytes / MB:.0f} valid) and "
            f"{last.log_bytes / MB:.1f} MB of removal logs"
        )
        if last.data_file_bytes != last.after_bytes:
            left += f"; the data files hold {last.data_file_bytes / MB:.1f} MB"
        rows.append(
            Row(
                f"{name}: peak disk, {'compaction' if setting == 'compact' else 'combine'}",
                peak.disk_peak / MB,
                "MB",
                peak.disk_before / MB,
                note=left,
            )
        )
    return rows


# ---------------------------------------------------------------------- writers


class Writer:
    """Publishes ``BODY_BYTES`` messages as fast as the client's credit allows and acks
    each ``ACK_LAG`` messages later; counts its confirmed writes."""

    def __init__(self, store) -> None:
        self.confirmed = 0
        self.client = StoreClient(store, on_settled=self._settled)
        self.body = os.urandom(BODY_BYTES)
        self.unacked: deque[list[bytes]] = deque()

    def _settled(self, settled: Settled) -> None:
        self.confirmed = settled.up_to_seq + 1

    def run(self, until) -> list[tuple[float, int, bool]]:
        """Write until ``until()`` (asked every ``WRITER_POLL_S``) says stop; the samples
        (time, confirmed writes, whether the GC was busy at that poll)."""
        client, body, unacked = self.client, self.body, self.unacked
        samples = [(time.monotonic(), self.confirmed, False)]
        next_poll = time.monotonic() + WRITER_POLL_S
        while True:
            group = [os.urandom(16) for _ in range(ACK_GROUP)]
            for msg_id in group:
                client.write(msg_id, body)
            unacked.append(group)
            if len(unacked) * ACK_GROUP > ACK_LAG:
                client.remove(unacked.popleft())
            now = time.monotonic()
            if now >= next_poll:
                stop, busy = until()
                samples.append((time.monotonic(), self.confirmed, busy))
                if stop:
                    return samples
                next_poll = now + WRITER_POLL_S


@dataclass(frozen=True)
class WritersUnderGC:
    idle_writes: int
    idle_s: float
    idle_jobs: int  # polls that saw the GC busy while it should have been idle
    busy_writes: int
    busy_s: float
    reclaimed: int
    jobs: int

    @property
    def ratio(self) -> float:
        if not self.busy_s:
            return float("nan")
        return (self.busy_writes / self.busy_s) / (self.idle_writes / self.idle_s)


def writers(root: str, setting: str, files: int, file_bytes: int, idle_s: float) -> WritersUnderGC:
    directory = os.path.join(root, f"writers-{setting}")
    with Node(directory, file_size_limit=file_bytes, store_gc=setting) as node:
        store = node.store()
        loader = StoreClient(store)
        ids = fill(loader, files * file_bytes // RECORD_BYTES, BODY_BYTES)
        backlog = random.Random(len(ids)).sample(ids, round(STEADY_ACKED * len(ids)))
        writer = Writer(store)
        watch = GCWatch(store, setting)

        started = time.monotonic()

        def for_idle_s() -> tuple[bool, bool]:
            watch.poll()
            return time.monotonic() - started >= idle_s, watch.busy

        idle = writer.run(for_idle_s)
        watch = GCWatch(store, setting)
        loader.remove(backlog)
        loader.flush()
        acked = [False]

        def until_done() -> tuple[bool, bool]:
            loader.settled(wait=False)  # takes the acks' answers as they come
            if not acked[0] and not loader.unsettled:
                watch.acked_at, acked[0] = time.monotonic(), True
            done = watch.poll() and acked[0]
            if time.monotonic() - watch.started > GC_TIMEOUT_S:
                raise TimeoutError(f"the {setting} GC was not done: {watch.figures}")
            return done, watch.busy

        during = writer.run(until_done)
        gc_watch, watch, started = watch, GCWatch(store, setting), time.monotonic()
        idle_after = writer.run(for_idle_s)
        loader.terminate()
        writer.client.terminate()
    shutil.rmtree(directory, ignore_errors=True)
    # The GC's busy time: from the first poll that saw a job to the last one.
    busy = [n for n, sample in enumerate(during) if sample[2]]
    first, last = (during[busy[0]], during[busy[-1]]) if busy else (during[0], during[0])
    return WritersUnderGC(
        idle_writes=sum(run[-1][1] - run[0][1] for run in (idle, idle_after)),
        idle_s=sum(run[-1][0] - run[0][0] for run in (idle, idle_after)),
        idle_jobs=sum(sample[2] for sample in idle + idle_after),
        busy_writes=last[1] - first[1],
        busy_s=last[0] - first[0],
        reclaimed=gc_watch.reclaimed,
        jobs=gc_watch.jobs,
    )


def writer_rows(results: dict[str, list[WritersUnderGC]]) -> list[Row]:
    rows = []
    for setting, rounds in results.items():
        work = "compaction" if setting == "compact" else "combine"
        busy_s = sum(r.busy_s for r in rounds)
        idle_s = sum(r.idle_s for r in rounds)
        note = (
            f"baseline: GC idle; GC busy {busy_s:.1f} s, {sum(r.jobs for r in rounds)} jobs, "
            f"{sum(r.reclaimed for r in rounds) / MB:.0f} MB reclaimed"
        )
        if len(rounds) > 1:
            note += "; rounds " + ", ".join(f"{r.ratio:.2f}" for r in rounds)
        idle_jobs = sum(r.idle_jobs for r in rounds)
        if idle_jobs:
            note += f"; GC seen busy at {idle_jobs} polls of the baseline"
        rows.append(
            Row(
                f"1 KiB publish+ack while {work} works",
                sum(r.busy_writes for r in rounds) / busy_s if busy_s else 0.0,
                "msgs/s",
                sum(r.idle_writes for r in rounds) / idle_s,
                TARGET_WRITER_RATIO,
                note,
            )
        )
    return rows


# ---------------------------------------------------------------------- confirm latency


def probe(client: StoreClient, until, counting=lambda: True) -> list[float]:
    """Confirm latencies (ms) of one write every ``PROBE_INTERVAL_S``, until ``until()``
    says stop, of the writes made while ``counting()``. Each is measured from when it
    was due, not from when it went out: a write held up behind a stalled store counts
    the stall, as a steady producer would see it (without this, one stall would cost
    only the one write waiting through it)."""
    latencies = []
    body = os.urandom(PROBE_BODY_BYTES)
    due = time.perf_counter()
    while not until():
        wait_s = due - time.perf_counter()
        if wait_s > 0:
            time.sleep(wait_s)
        counted = counting()
        msg_id = os.urandom(16)
        client.write(msg_id, body)
        client.settle()
        if counted:
            latencies.append((time.perf_counter() - due) * 1000)
        client.remove([msg_id])
        due += PROBE_INTERVAL_S
    return latencies


@dataclass(frozen=True)
class Latency:
    quiet: list[float]
    during: list[float]
    jobs: int
    longest_slice_ms: float


def latency(root: str, setting: str, file_bytes: int) -> Latency:
    directory = os.path.join(root, f"latency-{setting}")
    with Node(directory, file_size_limit=file_bytes, store_gc=setting) as node:
        store = node.store()
        loader = StoreClient(store)
        ids = fill(loader, 4 * file_bytes // (PROBE_BODY_BYTES + 25), PROBE_BODY_BYTES)
        prober = StoreClient(store)
        quiet_until = time.monotonic() + 3
        quiet = probe(prober, lambda: time.monotonic() > quiet_until)
        watch = GCWatch(store, setting)
        loader.remove([m for n, m in enumerate(ids) if n % 3])
        loader.settle()
        watch.acked_at = time.monotonic()

        def until() -> bool:
            if time.monotonic() - watch.started > GC_TIMEOUT_S:
                raise TimeoutError(f"the {setting} GC was not done: {watch.figures}")
            return watch.poll()

        during = probe(prober, until, lambda: watch.working)
        loader.terminate()
        prober.terminate()
    shutil.rmtree(directory, ignore_errors=True)
    return Latency(quiet, during, watch.jobs, watch.figures["longest_gc_slice_ms"])


def latency_rows(results: dict[str, Latency], file_bytes: int) -> list[Row]:
    rows = []
    for setting, result in results.items():
        work = "compacts" if setting == "compact" else "combines"
        quiet, during = result.quiet, result.during or [float("nan")]
        p99 = percentile(during, 99)
        met = "met" if p99 <= TARGET_P99_MS else "MISSED"
        rows += [
            Row(
                f"confirm p50 while the GC {work}",
                median(during),
                "ms",
                median(quiet),
                note="baseline: the same probe, no GC running",
            ),
            Row(
                f"confirm p99 while the GC {work}",
                p99,
                "ms",
                percentile(quiet, 99),
                note=f"target <= {TARGET_P99_MS:g} ms: {met}",
            ),
            Row(
                f"confirm max while the GC {work}",
                max(during),
                "ms",
                max(quiet),
                note=f"{result.jobs} jobs on {file_bytes // MIB} MiB files of "
                f"{PROBE_BODY_BYTES} B messages; {len(result.during)} confirms during them",
            ),
            Row(
                f"longest hold of the store's loop by one GC step ({setting})",
                result.longest_slice_ms,
                "ms",
                note="a staging slice, a journal, the switch or the cut; target about 20 ms",
            ),
        ]
    return rows


# ---------------------------------------------------------------------- main


def _rounds(rounds: int) -> str:
    return "1 round" if rounds == 1 else f"{rounds} rounds"


def main(argv: list[str]) -> str:
    quick = "--quick" in argv
    scale = 4 if quick else 1
    file_bytes = FILE_BYTES // scale
    files = FILES // 4 if quick else FILES
    steady_files = STEADY_FILES // 2 if quick else STEADY_FILES
    idle_s = IDLE_S / 2 if quick else IDLE_S
    rounds = 1 if quick else ROUNDS
    writer_rounds = 1 if quick else WRITER_ROUNDS
    probe_file_bytes = PROBE_FILE_BYTES // scale
    volumes = "quick" if quick else "full"
    root = scratch_directory("warren-bench-gc-")
    took = [time.monotonic()]
    try:
        reclaimed: dict[str, dict[str, list[Reclaim]]] = {
            name: {setting: [] for setting in SETTINGS} for name, _, _ in WORKLOADS
        }
        for _ in range(rounds):
            for name, acked, oldest_third in WORKLOADS:
                for setting in SETTINGS:
                    reclaimed[name][setting].append(
                        reclaim(root, setting, files, file_bytes, acked, oldest_third)
                    )
        took.append(time.monotonic())
        under_load: dict[str, list[WritersUnderGC]] = {setting: [] for setting in SETTINGS}
        for _ in range(writer_rounds):
            for setting in SETTINGS:
                under_load[setting].append(writers(root, setting, steady_files, file_bytes, idle_s))
        took.append(time.monotonic())
        latencies = {setting: latency(root, setting, probe_file_bytes) for setting in SETTINGS}
        took.append(time.monotonic())
    finally:
        shutil.rmtree(root, ignore_errors=True)
    seconds = [f"{b - a:.0f} s" for a, b in zip(took, took[1:], strict=False)]
    reclaim_table = [
        row
        for name, _, oldest_third in WORKLOADS
        for row in reclaim_rows(name, not oldest_third, reclaimed[name])
    ]
    return "\n\n".join(
        [
            render(
                f"GC reclaiming: compaction (figure) against combine (baseline), store "
                f"actor, {files} files of {file_bytes // MIB} MiB of 1 KiB messages, "
                f"{_rounds(rounds)} ({seconds[0]}, {volumes} volumes)",
                reclaim_table,
            ),
            render(
                f"a writer while the GC works ({steady_files} files of "
                f"{file_bytes // MIB} MiB, {STEADY_ACKED:.0%} acked at once; "
                f"{_rounds(writer_rounds)}, {seconds[1]})",
                writer_rows(under_load),
            ),
            render(
                f"confirm latency during GC (store actor, {PROBE_BODY_BYTES} B messages, "
                f"{seconds[2]})",
                latency_rows(latencies, probe_file_bytes),
            ),
        ]
    )

"""``MessageStoreActor``: msg_store_persistent and msg_store_transient as actor processes.

Each wraps one ``MessageStore`` engine (with the shared lock table, so clients read files
directly) in its own OS process, started by the node's tree
(``warren.supervisor.node.node``). The transient store deletes its files at every start
(only its own: a file another program put in its directory stays, and is logged).
Supervised by the node's root (rest_for_one): a store crash restarts everything after it.

Messages accepted (``warren.store.protocol``), and what each gets back:

    Register(client_ref)            → StoreInfo(this incarnation's pinned ref, directory,
                                      transient, recovered_clean)
    WriteBatch(client_ref, first_seq, records, removes)
                                    → Settled, once every write of the batch is on disk,
                                      ignored, or failed because the disk is full; the
                                      removes (one reference less each, unknown ids
                                      counted) applied in their place among the writes;
                                      a malformed batch → an error, nothing of it
                                      applied
    Read(msg_id) / ReadMany(ids)    → Found(body, file, offset, total_size) | None each
                                      (file -1: not yet flushed, do not cache the place)
    Contains(ids)                   → list[bool]
    Claim(client_ref, predecessors, ids)
                                    → list[bool]: whether the client now holds a
                                      reference to each id (``MessageStore.claim``)
    ReadsReport(client, direct, fallback)   (tell) a client's read counters
    Terminate(client_ref)           → None, after everything that client sent before it
    ClientDying(client_ref)         (tell) forget the client; its writes of ids the store
                                      does not hold are ignored from now on
    StoreStats()                    → the engine's stats plus this actor's counters
    Scanned / Rewritten / RewriteFailed
                                    (from the GC actor) stage, finish or abandon a combine
    Down (of the GC actor)          abandon the combine it was doing

A message whose fields are not what ``warren.store.protocol`` declares is refused by the
codec before this actor sees it (``malformed``, answered ``UnhandledMessage``). Anything
else, a batch that is not whole records or whose removes are out of place, or a request
that needs an answer sent by tell (a WriteBatch) raises ``UnhandledMessage`` before
anything of it is applied: an ask gets it as its error, a tell is logged and
counted by the actor loop. A stray or mistaken message never restarts a store (which, as
rest_for_one, would restart the transient store with it).

Sent unprompted: ``ScanJob`` and ``RewriteJob`` to the GC actor (``msg_store_gc``).

Full disk: the node's disk alarm (``on_alarm("disk", ...)``, raised below its free-space
limit) makes the store ask its clients, through the lock table, to hold their writes
until it clears; writes that still find the disk full fail alone (``Settled.failed``)
and the store stays up, serving reads and removes.

Group commit: writes of every batch in the mailbox are applied as they are drained; when
the mailbox is empty (``on_idle``), or at the latest ``sync_interval_ms`` after the first
unsettled write when it never empties, one ``sync()`` (one fdatasync) settles all of them
and every waiting batch gets its ``Settled``, cumulative for its client up to the batch's
last sequence number, with each durable write's location. The longest wait from a batch's
arrival to its answer is kept in ``longest_confirm_wait_ms``; every batch's wait, and the
time each sync took, are counted into histograms (``warren.store.latency``), answered in
``StoreStats`` as ``confirm_wait_seconds`` and ``sync_duration_seconds``.

GC: after a sync, after each finished combine, and every ``gc_check_interval_s``, the
store chooses a pair (from its file summary alone) and asks the GC actor to scan both
files (``ScanJob``); it stages the ``Scanned`` records against its index
``GC_SLICE_RECORDS`` at a time, serving its mailbox between slices, then asks the GC to
copy what it kept (``RewriteJob``). ``Rewritten`` is applied in one step (the staged
index values, the rename, the delete: ``warren.store.engine.gc``); if readers hold either
file past the deadline, the job is given up and the next pair no reader holds is chosen
(a reader stopped while holding a file delays only that file). No step holds the
store's loop for long: the longest is kept in ``longest_gc_slice_ms``. While clients
write, the GC yields to them: after a job during which messages were written, the next
waits until the job's steps took at most ``GC_LOOP_SHARE`` of the loop and the job at
most ``GC_BUSY_SHARE`` of the time (counted in ``gc_yields`` and ``gc_yield_seconds``;
``gc_paused_s`` in the stats is the wait left); without writers it goes at full speed.
A GC that dies or fails mid-job: the store abandons the job (flags cleared, ``.rdt``
deleted) and plans again after ``gc_retry_s``.

Races: a client's removes travel inside its write batches, in their place among the
writes, so a remove is never applied before a write sent ahead of it, and a write and its
remove in one batch never reach the disk. The GC answers to this incarnation's pinned ref,
so the answer to a job of a store that has since restarted is dropped, and an answer is
applied only to the job it names (id, Dst, Src); a ``Down`` abandons the job only if it is
the GC incarnation the job went to. Ordering is per client socket, so ``Terminate`` is
answered after all the client sent before it. Unlike RabbitMQ, a ``ClientDying`` does not
overtake the client's earlier messages; it stops later ones. A request stamped with an
older incarnation of this actor is dropped and counted by the runtime before it reaches
this code.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import os
import struct
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from warren.actors import ActorError, ActorRef, Down, ProcessActor, UnhandledMessage

from .engine.compaction import CompactionPlan
from .engine.index import PENDING_FILE
from .engine.message_store import (
    DEFAULT_GC,
    FILE_SIZE_LIMIT_BYTES,
    MessageStore,
    remove_store_files,
)
from .engine.records import HEADER_BYTES, MSG_ID_BYTES, OK_MARKER
from .engine.rewrite import CombinePlan, RewriteResult
from .errors import StoreError
from .latency import LatencyHistogram
from .protocol import (
    Claim,
    ClientDying,
    Compacted,
    CompactJob,
    CompactScan,
    Contains,
    FileScanned,
    Found,
    Read,
    ReadMany,
    ReadsReport,
    Register,
    RewriteFailed,
    RewriteJob,
    Rewritten,
    ScanJob,
    Scanned,
    Settled,
    StoreInfo,
    StoreStats,
    Terminate,
    WriteBatch,
)

if TYPE_CHECKING:
    from warren.actors import DeferredReply

log = logging.getLogger("warren.store")

SYNC_INTERVAL_MS = 25  # longest a pending confirm waits for its fsync
# Records of a GC scan staged against the index per loop pass: a few milliseconds of the
# store's thread each, so confirms and reads go on between slices of a combine.
GC_SLICE_RECORDS = 4096
GC_CHECK_INTERVAL_S = 1.0  # how often an idle store looks for garbage to combine
GC_RETRY_S = 5.0  # after a failed or abandoned combine
# A file that saw removes within this long is not compacted yet: a file being drained is
# left to empty and be deleted, not copied first (RabbitMQ waits 15 s).
COMPACT_QUIET_S = 2.0
# While clients write, the GC yields to them: its steps on the store's loop take at most
# GC_LOOP_SHARE of the loop, and its jobs (the GC process's scans, copies and syncs
# included) run at most GC_BUSY_SHARE of the time. After a job during which messages
# were written, the next one waits long enough for both. Without writers the GC goes at
# full speed.
GC_LOOP_SHARE = 0.05
GC_BUSY_SHARE = 0.5
GC_MAX_PAUSE_S = 5.0  # a job stretched by a stall (a slow disk, a stopped GC) waits no more
GC_NAME = "msg_store_gc"
_SIZE = struct.Struct(">Q")
# The ticket of each write this actor makes: (client_ref, seq, msg_id).
_Ticket = tuple[bytes, int, bytes]


class MessageStoreActor(ProcessActor):
    """One store process; see the module docstring."""

    store: MessageStore  # the engine, opened by on_start before any message is handled

    def __init__(
        self,
        directory: str,
        *,
        transient: bool = False,
        file_size_limit: int = FILE_SIZE_LIMIT_BYTES,
        sync_policy: str = "fsync",
        sync_interval_ms: float = SYNC_INTERVAL_MS,
        ref_counts: Callable[[], Iterable[tuple[bytes, int]]] | None = None,
        clean_clients: Callable[[], Iterable[bytes] | None] | None = None,
        gc_name: str = GC_NAME,
        gc_check_interval_s: float = GC_CHECK_INTERVAL_S,
        gc_retry_s: float = GC_RETRY_S,
        gc: str = DEFAULT_GC,
        compact_quiet_s: float = COMPACT_QUIET_S,
    ) -> None:
        self.directory = os.path.abspath(directory)
        self.transient = transient
        self.file_size_limit = file_size_limit
        self.sync_policy = sync_policy
        self.sync_interval_s = sync_interval_ms / 1000
        self.ref_counts = ref_counts
        self.clean_clients = clean_clients
        self.gc_name = gc_name
        self.gc_check_interval_s = gc_check_interval_s
        self.gc_retry_s = gc_retry_s
        self.gc = gc
        self.compact_quiet_s = compact_quiet_s
        # (reply, client_ref, first_seq, last_seq, arrived) of each unanswered WriteBatch
        self._waiting: list[tuple[DeferredReply, bytes, int, int, float]] = []
        self._sync_armed = False
        self._dying: set[bytes] = set()
        self._ignored_unwritten: list[tuple[bytes, int, bytes]] = []  # dying clients' writes
        self._gc_watched: tuple[str, int] | None = None  # (address, incarnation)
        self._gc_ref: ActorRef | None = None  # whereis(gc_name), cached
        self._job: _Job | _CompactionJob | None = None
        self._job_ids = itertools.count(1)
        self._gc_not_before = 0.0
        self.counters = {
            "batches": 0,
            "malformed_batches": 0,
            "fallback_reads": 0,
            "direct_reads_reported": 0,
            "fallback_reads_reported": 0,
            "gc_jobs": 0,
            "gc_jobs_abandoned": 0,
            "gc_yields": 0,  # jobs after which the GC waited for the writers
            "gc_yield_seconds": 0.0,  # the waits
            "longest_gc_slice_ms": 0.0,
            "longest_confirm_wait_ms": 0.0,
        }
        self._confirm_waits = LatencyHistogram()  # each batch: arrival to its Settled
        self._sync_durations = LatencyHistogram()  # each group commit's sync()

    # ------------------------------------------------------------------ lifecycle

    def on_start(self) -> None:
        if self.transient:
            left = remove_store_files(self.directory)
            if left:
                log.warning(
                    "%s: left %d files that are not the store's in %s: %s",
                    self.ref.name,
                    len(left),
                    self.directory,
                    ", ".join(left[:5]),
                )
        self.store = MessageStore(
            self.directory,
            file_size_limit=self.file_size_limit,
            sync_policy=self.sync_policy,
            gc=self.gc,
            auto_gc=False,
            shared_readers=True,
            ref_counts=None if self.transient or self.ref_counts is None else self.ref_counts(),
            clean_clients=None if self.clean_clients is None else self.clean_clients(),
        )
        self.call_later(self.gc_check_interval_s, self._gc_tick)

    def on_stop(self) -> None:
        # Nothing here may wait on the node: on_stop also runs when the node has died and
        # its forkserver asks every actor to stop (a GC job is not started now).
        try:
            self._settle()
            if self._job is not None:
                self.store.abandon_combine()
                # The GC may still be moving: the next start rolls the journal back.
                self.store.abandon_compaction(roll_back=False)
        finally:
            self.store.close()

    # ------------------------------------------------------------------ messages

    def on_receive(self, message: Any) -> Any:
        handler = self._handlers.get(type(message))
        if handler is None:
            raise UnhandledMessage(
                f"{type(self).__name__} does not handle {type(message).__name__}"
            )
        return handler(self, message)

    def on_alarm(self, resource: str, raised: bool) -> None:
        if resource == "disk":
            log.warning(
                "%s: disk alarm %s; client writes %s",
                self.directory,
                "raised" if raised else "cleared",
                "held" if raised else "resume",
            )
            self.store.block_writes(raised)

    def on_idle(self) -> None:
        if self._waiting:
            self._settle()
            self._collect_garbage()

    def _register(self, message: Register) -> StoreInfo:
        self.store.register_client(message.client_ref)
        self._dying.discard(message.client_ref)
        return StoreInfo(
            self.ref.pin(),
            self.directory,
            self.transient,
            self.store.recovered_clean,
            self.store.start_token,
        )

    def _write_batch(self, message: WriteBatch) -> None:
        records = message.records
        parsed = _split_records(records)
        if parsed is None or not _valid_removes(message.removes, len(parsed)):
            self.counters["malformed_batches"] += 1
            raise UnhandledMessage(
                f"malformed WriteBatch from {message.client_ref.hex()} at "
                f"seq {message.first_seq}: not whole records in .rdq "
                f"layout, or removes out of place; nothing of it applied"
            )
        reply = self.defer_reply()  # before any write: a batch sent by tell is refused
        client, seq, write = message.client_ref, message.first_seq, self.store.write_record
        dying = client in self._dying
        removes = list(reversed(message.removes))  # pop() takes them in order
        for position in range(len(parsed) + 1):
            while removes and removes[-1][0] == position:
                for removed in removes.pop()[1]:
                    self.store.remove(removed, client)
            if position == len(parsed):
                break
            start, end = parsed[position]
            msg_id = records[start + 8 : start + HEADER_BYTES]
            if dying and not self.store.contains(msg_id):
                self._ignored_unwritten.append((client, seq, msg_id))
            else:
                write(msg_id, records[start:end], (client, seq, msg_id), client)
            seq += 1
        self.counters["batches"] += 1
        self._waiting.append((reply, client, message.first_seq, seq - 1, time.monotonic()))
        if not self._sync_armed:
            self._sync_armed = True
            self.call_later(self.sync_interval_s, self._sync_timer)

    def _read(self, message: Read) -> Found | None:
        self.counters["fallback_reads"] += 1
        return self._found(message.msg_id)

    def _read_many(self, message: ReadMany) -> list[Found | None]:
        self.counters["fallback_reads"] += len(message.msg_ids)
        return [self._found(msg_id) for msg_id in message.msg_ids]

    def _found(self, msg_id: bytes) -> Found | None:
        body = self.store.read(msg_id)
        if body is None:
            return None
        place = self.store.location(msg_id)
        assert place is not None  # read() just found it, and nothing ran since
        if place.file == PENDING_FILE:
            return Found(body, -1, 0, 0)
        return Found(body, place.file, place.offset, place.total_size)

    def _contains(self, message: Contains) -> list[bool]:
        return [self.store.contains(msg_id) for msg_id in message.msg_ids]

    def _claim(self, message: Claim) -> list[bool]:
        return self.store.claim(
            message.msg_ids, message.client_ref, message.predecessors, message.written_since
        )

    def _reads_report(self, message: ReadsReport) -> None:
        self.counters["direct_reads_reported"] += message.direct
        self.counters["fallback_reads_reported"] += message.fallback

    def _terminate(self, message: Terminate) -> None:
        self.store.unregister_client(message.client_ref)

    def _client_dying(self, message: ClientDying) -> None:
        self.store.unregister_client(message.client_ref)
        self._dying.add(message.client_ref)

    def _stats(self, message: StoreStats) -> dict[str, Any]:
        stats = self.store.stats()
        stats.pop("files")
        return {
            **stats,
            **self.counters,
            "transient": self.transient,
            "gc_job_in_flight": self._job is not None,
            # the wait before the GC may start its next job (yielding, or after a failure)
            "gc_paused_s": max(0.0, self._gc_not_before - time.monotonic()),
            "clients": len(self.store.clients),
            "confirm_wait_seconds": self._confirm_waits.reading(),
            "sync_duration_seconds": self._sync_durations.reading(),
        }

    def _scanned(self, message: Scanned) -> None:
        job = self._job
        if (
            not isinstance(job, _Job)
            or job.job_id != message.job_id
            or job.scan is not None
            or (message.dst, message.src) != (job.dst, job.src)
        ):
            return  # a job abandoned since
        views = []
        for ids, offsets, sizes in (
            (message.dst_ids, message.dst_offsets, message.dst_sizes),
            (message.src_ids, message.src_offsets, message.src_sizes),
        ):
            if len(offsets) % 8 or len(ids) != 2 * len(offsets) or len(sizes) != len(offsets):
                log.error("%s: the GC's scan is malformed; abandoning the job", self.directory)
                self._abandon_job()
                return
            views.append((ids, memoryview(offsets).cast("Q"), memoryview(sizes).cast("Q")))
        job.scan = views
        self.call_later(0, lambda: self._stage_slice(job))

    def _stage_slice(self, job: _Job) -> None:
        """Stage one slice of the scan against the index; then yield the loop."""
        if self._job is not job:
            return  # abandoned meanwhile
        started = time.perf_counter()
        part, at = job.cursor
        assert job.scan is not None  # _scanned set it before staging began
        ids, offsets, sizes = job.scan[part]
        stop = min(len(offsets), at + GC_SLICE_RECORDS)
        msg_ids = [ids[i * 16 : i * 16 + 16] for i in range(at, stop)]
        job.keep[part] += self.store.stage_combine(
            (job.dst, job.src)[part], msg_ids, offsets[at:stop], sizes[at:stop]
        )
        job.cursor = (part + 1, 0) if stop == len(offsets) else (part, stop)
        if job.cursor[0] < 2:
            self.call_later(0, lambda: self._stage_slice(job))
        else:
            job.plan = self.store.finish_staging()
            if job.plan is None:
                self._job = None
                self.counters["gc_jobs_abandoned"] += 1
            else:
                job.gc.tell(
                    RewriteJob(
                        job.job_id,
                        job.dst,
                        job.src,
                        bytes(job.keep[0]),
                        bytes(job.keep[1]),
                        self.ref.pin(),
                    )
                )
        self._note_gc_slice(job, started)
        if job.plan is None:  # the staging's turns on the loop were spent all the same
            self._yield_to_writers(job)

    def _rewritten(self, message: Rewritten) -> None:
        job = self._job
        if (
            not isinstance(job, _Job)
            or job.job_id != message.job_id
            or job.plan is None
            or (message.dst, message.src) != (job.dst, job.src)
        ):
            return  # a job abandoned since
        self._job = None
        started = time.perf_counter()
        result = RewriteResult((), (), message.file_size)
        try:
            applied = self.store.apply_combine(job.plan, result)
        except StoreError as exc:
            log.error("%s: the GC's copy does not match the plan: %s", self.directory, exc)
            self._job = job
            self._abandon_job()
            return
        self._note_gc_slice(job, started)
        if not applied:
            # Readers hold Dst or Src: give this pair up (the copy is cheap to redo) so
            # that pairs no reader holds go ahead; this one is chosen again once free.
            self._job = job
            self._abandon_job(retry_s=0.0)
        self._yield_to_writers(job)
        self._collect_garbage()  # while garbage is over the fraction, keep going

    def _file_scanned(self, message: FileScanned) -> None:
        job = self._job
        if (
            not isinstance(job, _CompactionJob)
            or job.job_id != message.job_id
            or job.scan is not None
            or message.file != job.file
        ):
            return  # a job abandoned since
        ids, offsets, sizes = message.ids, message.offsets, message.sizes
        removed_ids, removed_offsets = message.removed_ids, message.removed_offsets
        if (
            len(offsets) % 8
            or len(ids) != 2 * len(offsets)
            or len(sizes) != len(offsets)
            or len(removed_offsets) % 8
            or len(removed_ids) != 2 * len(removed_offsets)
        ):
            log.error("%s: the GC's scan is malformed; abandoning the job", self.directory)
            self._abandon_job()
            return
        job.scan = (ids, memoryview(offsets).cast("Q"), memoryview(sizes).cast("Q"))
        job.removed = [
            (offset, removed_ids[i * 16 : i * 16 + 16])
            for i, offset in enumerate(memoryview(removed_offsets).cast("Q"))
        ]
        self.call_later(0, lambda: self._stage_compaction_slice(job))

    def _stage_compaction_slice(self, job: _CompactionJob) -> None:
        """Stage one slice of the file's scan against the index; then yield the loop.
        The last one writes the plan's journal and hands the moves to the GC."""
        if self._job is not job:
            return  # abandoned meanwhile
        started = time.perf_counter()
        assert job.scan is not None  # _file_scanned set it before staging began
        ids, offsets, sizes = job.scan
        at, stop = job.cursor, min(len(offsets), job.cursor + GC_SLICE_RECORDS)
        msg_ids = [ids[i * 16 : i * 16 + 16] for i in range(at, stop)]
        self.store.stage_compaction(job.file, msg_ids, offsets[at:stop], sizes[at:stop])
        job.cursor = stop
        if stop < len(offsets):
            self.call_later(0, lambda: self._stage_compaction_slice(job))
        else:
            try:
                job.plan = self.store.finish_compaction_staging(job.removed)
            except OSError as exc:
                log.error("%s: the compaction journal was not written: %s", self.directory, exc)
                self._job = None
                self._abandoned()
                return
            if job.plan is None:
                self._job = None
                self.counters["gc_jobs_abandoned"] += 1
            else:
                job.gc.tell(
                    CompactJob(job.job_id, self.directory, job.file, job.plan.token, self.ref.pin())
                )
        self._note_gc_slice(job, started)
        if job.plan is None:  # the staging's turns on the loop were spent all the same
            self._yield_to_writers(job)

    def _compacted(self, message: Compacted) -> None:
        job = self._job
        if (
            not isinstance(job, _CompactionJob)
            or job.job_id != message.job_id
            or job.plan is None
            or message.file != job.file
        ):
            return  # a job abandoned since
        self._job = None
        started = time.perf_counter()
        if message.truncate_at != job.plan.truncate_at:
            log.error("%s: the GC's compaction does not match the plan", self.directory)
            self._job = job
            self._abandon_job()
            return
        applied = self.store.apply_compaction(job.plan)
        self._note_gc_slice(job, started)
        if not applied:
            # Readers hold the file: give it up (rolled back) so that files no reader
            # holds go ahead; this one is chosen again once free.
            self._job = job
            self._abandon_job(retry_s=0.0)
        self._yield_to_writers(job)
        self._collect_garbage()

    def _note_gc_slice(self, job: _Job | _CompactionJob, started: float) -> None:
        held_s = time.perf_counter() - started
        job.held_s += held_s
        self.counters["longest_gc_slice_ms"] = max(
            self.counters["longest_gc_slice_ms"], held_s * 1000
        )

    def _yield_to_writers(self, job: _Job | _CompactionJob) -> None:
        """After a finished job: if clients wrote while it ran, the next job waits long
        enough that the job's steps took at most ``GC_LOOP_SHARE`` of the store's loop,
        and the job itself at most ``GC_BUSY_SHARE`` of the time (``GC_MAX_PAUSE_S`` at
        most)."""
        if self.store.writes > job.written_before:
            pause_s = min(
                GC_MAX_PAUSE_S,
                max(
                    job.held_s * (1 / GC_LOOP_SHARE - 1),
                    (time.monotonic() - job.began) * (1 / GC_BUSY_SHARE - 1),
                ),
            )
            self._gc_not_before = max(self._gc_not_before, time.monotonic() + pause_s)
            self.counters["gc_yields"] += 1
            self.counters["gc_yield_seconds"] += pause_s

    def _rewrite_failed(self, message: RewriteFailed) -> None:
        if self._job is not None and self._job.job_id == message.job_id:
            log.error("%s: the GC could not rewrite: %s", self.directory, message.reason)
            self._abandon_job()

    def _down(self, message: Down) -> None:
        if (message.ref.address, message.ref.incarnation) == self._gc_watched:
            self._gc_ref = None  # its restart is found at the next combine
        if (
            self._job is not None
            and (message.ref.address, message.ref.incarnation) == self._gc_watched
        ):
            log.warning(
                "%s: the GC died mid-job (%s); abandoning the job",
                self.directory,
                message.reason,
            )
            self._abandon_job()

    _handlers: dict[type, Callable[[MessageStoreActor, Any], Any]] = {
        Register: _register,
        WriteBatch: _write_batch,
        Read: _read,
        ReadMany: _read_many,
        Contains: _contains,
        Claim: _claim,
        ReadsReport: _reads_report,
        Terminate: _terminate,
        ClientDying: _client_dying,
        StoreStats: _stats,
        Scanned: _scanned,
        Rewritten: _rewritten,
        FileScanned: _file_scanned,
        Compacted: _compacted,
        RewriteFailed: _rewrite_failed,
        Down: _down,
    }

    # ------------------------------------------------------------------ group commit

    def _sync_timer(self) -> None:
        self._sync_armed = False
        if self._waiting:
            self._settle()
            self._collect_garbage()

    def _settle(self) -> None:
        """One sync for everything written; answer every waiting batch."""
        syncing_at = time.monotonic()
        result = self.store.sync()
        self._sync_durations.observe(time.monotonic() - syncing_at)
        # Every ticket the store reports is one this actor's writes gave it.
        durable_tickets = cast("list[_Ticket]", result.durable)
        # Each client's durable writes, in seq order, with where each record lies.
        durable: dict[bytes, list[tuple[int, int, int, int]]] = {}
        for (client, seq, _), place in zip(
            durable_tickets,
            self.store.places([msg_id for _, _, msg_id in durable_tickets]),
            strict=True,
        ):
            if place is not None:
                durable.setdefault(client, []).append((seq, *place))
        seqs: dict[bytes, list[int]] = {}
        for client, entries in durable.items():
            entries.sort()
            seqs[client] = [entry[0] for entry in entries]
        ignored = {(client, seq) for client, seq, _ in cast("list[_Ticket]", result.ignored)}
        ignored.update((client, seq) for client, seq, _ in self._ignored_unwritten)
        self._ignored_unwritten = []
        failed = {(client, seq) for client, seq, _ in cast("list[_Ticket]", result.failed)}
        now = time.monotonic()
        longest = self.counters["longest_confirm_wait_ms"]
        for reply, client, first, last, arrived in self._waiting:
            batch = range(first, last + 1)
            client_seqs = seqs.get(client, ())
            locations = durable.get(client, [])[
                bisect.bisect_left(client_seqs, first) : bisect.bisect_right(client_seqs, last)
            ]
            reply.send(
                Settled(
                    client,
                    last,
                    [s for s in batch if (client, s) in ignored] if ignored else [],
                    locations,
                    [s for s in batch if (client, s) in failed] if failed else [],
                )
            )
            waited_s = now - arrived
            self._confirm_waits.observe(waited_s)
            longest = max(longest, waited_s * 1000)
        self.counters["longest_confirm_wait_ms"] = longest
        self._waiting = []

    # ------------------------------------------------------------------ GC

    def _gc_tick(self) -> None:
        self._collect_garbage()
        self.call_later(self.gc_check_interval_s, self._gc_tick)

    def _collect_garbage(self) -> None:
        if self._job is not None or time.monotonic() < self._gc_not_before:
            return
        if self.gc == "compact":
            file = self.store.choose_compaction(quiet_s=self.compact_quiet_s)
            if file is None:
                return
            gc = self._watched_gc()
            if gc is None:
                self.store.abandon_compaction()
                return
            self._job = _CompactionJob(next(self._job_ids), file, gc, self.store.writes)
            gc.tell(CompactScan(self._job.job_id, self.directory, file, self.ref.pin()))
            return
        pair = self.store.choose_combine()
        if pair is None:
            return
        gc = self._watched_gc()
        if gc is None:
            self.store.abandon_combine()
            return
        self._job = _Job(next(self._job_ids), *pair, gc, self.store.writes)
        gc.tell(ScanJob(self._job.job_id, self.directory, *pair, self.ref.pin()))

    def _watched_gc(self) -> ActorRef | None:
        """The GC's ref, monitored, for a job about to start (counted); None when the
        node does not answer."""
        gc = self._gc()
        if gc is None:
            return None
        self.counters["gc_jobs"] += 1
        if self._gc_watched != (gc.address, gc.incarnation):
            self._gc_watched = (gc.address, gc.incarnation)
            self.monitor(gc)
        return gc

    def _gc(self) -> ActorRef | None:
        """The GC actor's ref, asked of the node only when a combine is due and the last
        one known has died (a dead node's service must not be waited on every tick)."""
        if self._gc_ref is None:
            try:
                self._gc_ref = self.whereis(self.gc_name)
            except ActorError as exc:  # the node is busy or going: try at the next tick
                log.info("%s: no GC this time: %s", self.directory, exc)
        return self._gc_ref

    def _abandon_job(self, retry_s: float | None = None) -> None:
        self.store.abandon_combine()
        self.store.abandon_compaction()
        self._job = None
        self._abandoned(retry_s)

    def _abandoned(self, retry_s: float | None = None) -> None:
        self.counters["gc_jobs_abandoned"] += 1
        wait_s = self.gc_retry_s if retry_s is None else retry_s
        self._gc_not_before = max(self._gc_not_before, time.monotonic() + wait_s)


@dataclass
class _Job:
    """A combine this store runs with the GC: scanned, staged in slices, copied, applied."""

    job_id: int
    dst: int
    src: int
    gc: ActorRef
    written_before: int  # the store's count of writes when the job began
    held_s: float = 0.0  # the store's loop time its steps took
    began: float = field(default_factory=time.monotonic)
    # per file: (ids, offsets, sizes) from the GC
    scan: list[tuple[bytes, memoryview, memoryview]] | None = None
    cursor: tuple[int, int] = (0, 0)  # (0 = Dst / 1 = Src, next record) to stage
    keep: list[bytearray] = field(default_factory=lambda: [bytearray(), bytearray()])
    plan: CombinePlan | None = None  # once staged: what the GC copies


@dataclass
class _CompactionJob:
    """A compaction this store runs with the GC: scanned, staged in slices, journal
    written, moved by the GC, applied."""

    job_id: int
    file: int
    gc: ActorRef
    written_before: int  # the store's count of writes when the job began
    held_s: float = 0.0  # the store's loop time its steps took
    began: float = field(default_factory=time.monotonic)
    scan: tuple[bytes, memoryview, memoryview] | None = None  # (ids, offsets, sizes)
    removed: list[tuple[int, bytes]] = field(default_factory=list)  # the log's, for the plan
    cursor: int = 0  # the next record to stage
    plan: CompactionPlan | None = None  # once staged: the journal the GC carries out


def _valid_removes(removes: Any, records: int) -> bool:
    """Whether ``removes`` is a list of [after, msg_ids] with ``after`` in 0..records, never
    decreasing, and each msg_id 16 bytes."""
    previous = 0
    for entry in removes if isinstance(removes, list) else [None]:
        if not (
            isinstance(entry, list)
            and len(entry) == 2
            and type(entry[0]) is int
            and previous <= entry[0] <= records
            and isinstance(entry[1], list)
            and all(type(m) is bytes and len(m) == MSG_ID_BYTES for m in entry[1])
        ):
            return False
        previous = entry[0]
    return True


def _split_records(records: bytes) -> list[tuple[int, int]] | None:
    """(start, end) of each record in a batch; None unless it is whole records only."""
    places = []
    pos, length, unpack = 0, len(records), _SIZE.unpack_from
    while pos < length:
        if pos + HEADER_BYTES + 1 > length:
            return None
        (size,) = unpack(records, pos)
        end = pos + size + 9
        if size < MSG_ID_BYTES or end > length or records[end - 1] != OK_MARKER:
            return None
        places.append((pos, end))
        pos = end
    return places

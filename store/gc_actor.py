"""``GCActor`` (``msg_store_gc``): the scanning and copying of both stores' combines and
compactions, in its own process, so neither runs on a store's thread.

Accepts (tells, from a store actor; ``warren.store.protocol``):

    ScanJob(job_id, directory, dst, src, reply_to)
        scans both files and tells ``reply_to`` ``Scanned`` with every record found; the
        scan is kept for the job.
    RewriteJob(job_id, dst, src, dst_keep, src_keep, reply_to)
        copies the records the keep flags select, Dst's first, into ``Dst.rdt`` and
        fdatasyncs it (``warren.store.engine.rewrite``); tells ``Rewritten(job_id, dst, src,
        file_size)``, or ``RewriteFailed(job_id, reason)`` when a record does not
        validate, the disk fails, or the job's scan is unknown (this GC restarted since).
    CompactScan(job_id, directory, file, reply_to)
        scans the file and its removal log and tells ``reply_to`` ``FileScanned`` with
        every record found and the log's entries naming one of their ids.
    CompactJob(job_id, directory, file, token, reply_to)
        carries out the file's compaction journal bearing ``token``, which the store wrote
        (``warren.store.engine.compaction.compact_in_place``); tells ``Compacted(job_id,
        file, truncate_at)``, or ``RewriteFailed`` when a record to move does not
        validate, the journal is missing or damaged, or the disk fails.

It touches no byte the store's index can point at (a combine reads files that no longer
change and writes only the ``.rdt``; a compaction writes only into a file's holes, below
bytes that stay where they are until the store cuts the file), so it holds no lock and
needs none. Jobs run one at a
time, in mailbox order, for either store; one kept scan per store directory (a new
ScanJob for a directory replaces its old scan). Anything else, or a job whose fields are
malformed, raises ``UnhandledMessage``: logged and counted, never a crash.

It runs at a lower CPU priority (``GC_NICENESS``) than the stores: on a machine of two
cores, a combine's scan and copy would otherwise take the CPU from the store's group
commits and its clients. Supervised by ``gc_sup`` (one_for_one) under the node's root,
first in the tree: a GC crash restarts the GC alone, and the store whose job it was
abandons that job when its monitor reports the GC's death.
"""

from __future__ import annotations

import array
import logging
import os
from typing import Any

from warren.actors import ActorRef, ProcessActor, UnhandledMessage

from .engine.compaction import compact_in_place
from .engine.records import data_file_name
from .engine.removal_log import named_among
from .engine.rewrite import CombinePlan, Record, rewrite_combine
from .engine.scanner import ScanResult, scan_file
from .protocol import (
    Compacted,
    CompactJob,
    CompactScan,
    FileScanned,
    RewriteFailed,
    RewriteJob,
    Rewritten,
    ScanJob,
    Scanned,
)

log = logging.getLogger("warren.store")


# The GC's scans and copies are background work: on a small machine the store's loop and
# its clients, not the GC, should get the CPU when they want it (niceness, 0..19).
GC_NICENESS = 10


class GCActor(ProcessActor):
    def __init__(self) -> None:
        # directory -> (job_id, dst, src, dst's scan, src's scan)
        self._scans: dict[str, tuple[int, int, int, ScanResult, ScanResult]] = {}

    def on_start(self) -> None:
        os.nice(GC_NICENESS)

    def on_receive(self, message: Any) -> None:
        if isinstance(message, ScanJob):
            return self._scan(message)
        if isinstance(message, RewriteJob):
            return self._rewrite(message)
        if isinstance(message, CompactScan):
            return self._scan_one(message)
        if isinstance(message, CompactJob):
            return self._compact(message)
        raise UnhandledMessage(f"GCActor does not handle {type(message).__name__}")

    def _scan(self, job: ScanJob) -> None:
        if not (
            type(job.job_id) is int
            and type(job.directory) is str
            and os.path.isabs(job.directory)
            and _is_file_number(job.dst)
            and _is_file_number(job.src)
            and isinstance(job.reply_to, ActorRef)
        ):
            raise UnhandledMessage(
                "malformed ScanJob: job_id, dst and src must be ints and directory an absolute path"
            )
        try:
            dst, src = (
                scan_file(os.path.join(job.directory, data_file_name(f)))
                for f in (job.dst, job.src)
            )
        except OSError as exc:
            log.error("GC scan %d of %s failed: %s", job.job_id, job.directory, exc)
            job.reply_to.tell(RewriteFailed(job.job_id, f"{type(exc).__name__}: {exc}"))
            return
        self._scans[job.directory] = (job.job_id, job.dst, job.src, dst, src)
        job.reply_to.tell(Scanned(job.job_id, job.dst, job.src, *_packed(dst), *_packed(src)))

    def _rewrite(self, job: RewriteJob) -> None:
        if not (
            type(job.job_id) is int
            and type(job.dst_keep) is bytes
            and type(job.src_keep) is bytes
            and isinstance(job.reply_to, ActorRef)
        ):
            raise UnhandledMessage(
                "malformed RewriteJob: job_id must be an int, the keep "
                "flags bytes and reply_to a ref"
            )
        kept = next(
            (
                (d, scans)
                for d, scans in self._scans.items()
                if scans[:3] == (job.job_id, job.dst, job.src)
            ),
            None,
        )
        if kept is None:
            job.reply_to.tell(
                RewriteFailed(
                    job.job_id, "no scan kept for this job (the GC restarted since it scanned)"
                )
            )
            return
        directory, (_, dst, src, dst_scan, src_scan) = kept
        del self._scans[directory]
        if (len(job.dst_keep), len(job.src_keep)) != (len(dst_scan.offsets), len(src_scan.offsets)):
            job.reply_to.tell(RewriteFailed(job.job_id, "keep flags do not match the scan"))
            return
        plan = CombinePlan(
            dst, src, _selected(dst_scan, job.dst_keep), _selected(src_scan, job.src_keep)
        )
        try:
            result = rewrite_combine(directory, plan)
        except Exception as exc:  # reported to the store, which abandons the job
            log.error("GC job %d on %s failed: %s", job.job_id, directory, exc)
            job.reply_to.tell(RewriteFailed(job.job_id, f"{type(exc).__name__}: {exc}"))
            return
        job.reply_to.tell(Rewritten(job.job_id, dst, src, result.file_size))

    def _scan_one(self, job: CompactScan) -> None:
        _check_compaction_job(job)
        try:
            found = scan_file(os.path.join(job.directory, data_file_name(job.file)))
        except OSError as exc:
            log.error("GC scan %d of %s failed: %s", job.job_id, job.directory, exc)
            job.reply_to.tell(RewriteFailed(job.job_id, f"{type(exc).__name__}: {exc}"))
            return
        try:
            named = named_among(job.directory, job.file, set(found.msg_ids))
        except OSError as exc:
            log.error("GC scan %d of %s failed: %s", job.job_id, job.directory, exc)
            job.reply_to.tell(RewriteFailed(job.job_id, f"{type(exc).__name__}: {exc}"))
            return
        job.reply_to.tell(
            FileScanned(
                job.job_id,
                job.file,
                *_packed(found),
                b"".join(msg_id for _, msg_id in named),
                array.array("Q", [offset for offset, _ in named]).tobytes(),
            )
        )

    def _compact(self, job: CompactJob) -> None:
        _check_compaction_job(job)
        try:
            plan = compact_in_place(job.directory, job.file, job.token)
        except Exception as exc:  # reported to the store, which abandons the job
            log.error("GC compaction %d on %s failed: %s", job.job_id, job.directory, exc)
            job.reply_to.tell(RewriteFailed(job.job_id, f"{type(exc).__name__}: {exc}"))
            return
        job.reply_to.tell(Compacted(job.job_id, job.file, plan.truncate_at))


def _check_compaction_job(job: CompactScan | CompactJob) -> None:
    if not (
        type(job.job_id) is int
        and type(job.directory) is str
        and os.path.isabs(job.directory)
        and _is_file_number(job.file)
        and isinstance(job.reply_to, ActorRef)
        and (isinstance(job, CompactScan) or type(job.token) is bytes)
    ):
        raise UnhandledMessage(
            f"malformed {type(job).__name__}: job_id and file must be ints "
            "and directory an absolute path"
        )


def _is_file_number(value: object) -> bool:
    return type(value) is int and value >= 0


def _packed(found: ScanResult) -> tuple[bytes, bytes, bytes]:
    return (
        b"".join(found.msg_ids),
        array.array("Q", found.offsets).tobytes(),
        array.array("Q", found.total_sizes).tobytes(),
    )


def _selected(found: ScanResult, keep: bytes) -> tuple[Record, ...]:
    # _rewrite checked that ``keep`` has one flag per record of the scan.
    return tuple(
        (msg_id, offset, size)
        for msg_id, offset, size, flag in zip(
            found.msg_ids, found.offsets, found.total_sizes, keep, strict=True
        )
        if flag
    )

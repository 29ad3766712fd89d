"""``GCActor`` (``msg_store_gc``): the copy step of both stores' combines, in its own process.

Accepts ``RewriteJob(job_id, directory, dst, src, dst_records, src_records, reply_to)``
(tell) from a store actor, writes and fdatasyncs ``Dst.rdt`` (``warren.store.combine``), and
tells ``reply_to`` ``Rewritten(job_id, dst, src, dst_offsets, src_offsets, file_size)``, or
``RewriteFailed(job_id, reason)`` when a record does not validate or the disk fails. It
touches no byte the store's index can point at, so it holds no lock and needs none; one
job at a time, in mailbox order, for either store. Anything else, or a job whose fields
are malformed, raises ``UnhandledMessage``: logged and counted, never a crash.

Supervised by ``gc_sup`` (one_for_one) under the node's root, first in the tree: a GC
crash restarts the GC alone, and the store whose job it was abandons that job when its
monitor reports the GC's death.
"""

from __future__ import annotations

import logging
import os

from warren.actors import ActorRef, ProcessActor, UnhandledMessage

from .combine import CombinePlan, rewrite_combine
from .messages import Rewritten, RewriteFailed, RewriteJob

log = logging.getLogger("warren.store")


def _malformed_job(job: RewriteJob) -> str | None:
    """What is wrong with a job's fields, or None."""
    if not (type(job.job_id) is int and type(job.directory) is str and os.path.isabs(job.directory)
            and type(job.dst) is int and type(job.src) is int and job.dst >= 0 and job.src >= 0
            and isinstance(job.reply_to, ActorRef)):
        return "job_id, dst and src must be ints, directory an absolute path, reply_to a ref"
    for records in (job.dst_records, job.src_records):
        if type(records) is not list or not all(
                type(r) is list and len(r) == 3 and type(r[0]) is bytes and len(r[0]) == 16
                and type(r[1]) is int and type(r[2]) is int and r[1] >= 0 and r[2] > 0
                for r in records):
            return "dst_records and src_records must be lists of [msg_id, offset, size]"
    return None


class GCActor(ProcessActor):
    def on_receive(self, message):
        if not isinstance(message, RewriteJob):
            raise UnhandledMessage(f"GCActor does not handle {type(message).__name__}")
        problem = _malformed_job(message)
        if problem is not None:
            raise UnhandledMessage(f"malformed RewriteJob: {problem}")
        plan = CombinePlan(message.dst, message.src,
                           tuple(tuple(r) for r in message.dst_records),
                           tuple(tuple(r) for r in message.src_records))
        try:
            result = rewrite_combine(message.directory, plan)
        except Exception as exc:   # reported to the store, which abandons the job
            log.error("GC job %d on %s failed: %s", message.job_id, message.directory, exc)
            message.reply_to.tell(RewriteFailed(message.job_id, f"{type(exc).__name__}: {exc}"))
            return
        message.reply_to.tell(Rewritten(message.job_id, message.dst, message.src,
                                        list(result.dst_offsets), list(result.src_offsets),
                                        result.file_size))

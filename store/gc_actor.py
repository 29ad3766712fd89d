"""``GCActor`` (``msg_store_gc``): the copy step of both stores' combines, in its own process.

Accepts ``RewriteJob(job_id, directory, dst, src, dst_records, src_records, reply_to)``
(tell) from a store actor, writes and fdatasyncs ``Dst.rdt`` (``warren.store.combine``), and
tells ``reply_to`` ``Rewritten(job_id, dst, src, dst_offsets, src_offsets, file_size)``, or
``RewriteFailed(job_id, reason)`` when a record does not validate or the disk fails. It
touches no byte the store's index can point at, so it holds no lock and needs none; one
job at a time, in mailbox order, for either store.

Supervised by ``gc_sup`` (one_for_one) under the node's root, first in the tree: a GC
crash restarts the GC alone, and the store whose job it was abandons that job when its
monitor reports the GC's death.
"""

from __future__ import annotations

import logging

from warren.actors import ProcessActor

from .combine import CombinePlan, rewrite_combine
from .messages import Rewritten, RewriteFailed, RewriteJob

log = logging.getLogger("warren.store")


class GCActor(ProcessActor):
    def on_receive(self, message):
        if not isinstance(message, RewriteJob):
            raise TypeError(f"GCActor does not handle {type(message).__name__}")
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

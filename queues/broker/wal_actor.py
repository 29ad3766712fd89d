"""``WalActor``: the node's write-ahead log for every quorum queue, as an OS process
(``warren: wal``), the only writer of the WAL files and of the queues' segment files
(``warren.queues.engine.ra_log``).

Supervised by the node's root after the stores and before ``queue_sup``: the root is
rest_for_one, so a crash of the WAL restarts every queue after it, and each quorum queue
recovers from its snapshot and log (what it handed the WAL and was not yet answered was
never confirmed).

Messages accepted, and what each gets back:

    WalAppend(owner, records)   → None, once the records are fdatasync'd: ``records`` are
                                  whole log records (``ra_log.pack_entry``) of the queue
                                  whose directory, relative to the node's data directory,
                                  is ``owner``. Appends that wait together share one
                                  write and one fdatasync (a group commit, when the
                                  mailbox is empty, or after ``max_pass_s`` of a pass)
    WalWrite(owner, records)    (tell) the same, unanswered: written with the next
                                  commit, and fdatasync'd with the next that an append
                                  waits on, or ``UNWAITED_SYNC_S`` after it at the latest
                                  (what no one waits on: deliveries, settles; a process
                                  killed loses none of it, a machine lost some)
    WalEntries(owner)           → (term, records): the term the queue's new entries
                                  carry (the cluster's epoch its node leads at, 1 on a
                                  lone node), and the queue's entries held in the WAL
                                  file being written, not yet in its segments (a queue
                                  that restarts alone reads its log from its segments,
                                  then these)
    WalForget(owner)            → None: the queue is being deleted: its entries are
                                  dropped, and a tombstone fdatasync'd first, so that a
                                  queue declared again under its name never reads them
    WalStats()                  → {"syncs", "bytes_written", "appends", "records_per_sync",
                                  "files", "segment_writes", "unsynced" (batches written
                                  since the last fdatasync)}

A record batch that is not whole, correct records, or an owner that is not a queue's
directory, raises ``UnhandledMessage`` before anything is written: one bad sender never
corrupts the log every quorum queue shares.

Rollover. Past ``WAL_MAX_BYTES`` the file is closed, every queue's entries in it go to
that queue's segments (fdatasync'd), and only then is the file deleted. At its start the
process does the same with every WAL file left, before it answers anything: a queue that
starts after it finds its whole log in its segments.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from warren.actors import DeferredReply, ProcessActor, UnhandledMessage, message

from ..engine import ra_log

WAL_NAME = "wal"
# the longest records no one waits on stay written but not fdatasync'd (RabbitMQ's
# msg_store_sync_interval is 200 ms too)
UNWAITED_SYNC_S = 0.2


@message
@dataclass(frozen=True)
class WalAppend:
    owner: str
    records: bytes


@message
@dataclass(frozen=True)
class WalWrite:
    owner: str
    records: bytes


@message
@dataclass(frozen=True)
class WalEntries:
    owner: str


@message
@dataclass(frozen=True)
class WalForget:
    owner: str


@message
@dataclass(frozen=True)
class WalStats:
    pass


class WalActor(ProcessActor):
    """The node's WAL (the module docstring); its files are ``ra_log.Wal``'s."""

    # a pass under a stream of unanswered writes still ends in a group commit this soon
    max_pass_s = 0.005

    def __init__(self, data_dir: str, max_bytes: int = ra_log.WAL_MAX_BYTES, term: int = 1) -> None:
        if not isinstance(term, int) or term < 1:
            raise ValueError(f"a term is a whole number from 1, not {term!r}")
        self.data_dir = data_dir
        self.max_bytes = max_bytes
        self.term = term
        self._wal: ra_log.Wal | None = None
        self._waiting: list[DeferredReply] = []  # the appends the next commit answers
        self._sync_armed = False
        self.counters = {"appends": 0, "writes": 0}

    def on_start(self) -> None:
        self._wal = ra_log.Wal(self.data_dir, self.max_bytes)

    def on_stop(self) -> None:
        if self._wal is not None:
            self._commit()
            self._wal.close()

    def on_receive(self, message: Any) -> Any:
        wal = self._wal
        if wal is None:
            raise RuntimeError("the WAL failed a commit and is stopping")
        try:
            if isinstance(message, WalAppend):
                wal.add(message.owner, message.records)
                self._waiting.append(self.defer_reply())
                self.counters["appends"] += 1
                return None
            if isinstance(message, WalWrite):
                wal.add(message.owner, message.records)
                self.counters["writes"] += 1
                return None
            if isinstance(message, WalEntries):
                self._commit()  # what it asks for is durable before it is read back
                return self.term, wal.entries(message.owner)
            if isinstance(message, WalForget):
                wal.forget(message.owner)
                self._commit()  # the tombstone durable before the queue's files go
                return None
        except ValueError as exc:
            raise UnhandledMessage(f"{type(message).__name__}: {exc}") from None
        if isinstance(message, WalStats):
            files = wal.files
            return {
                "syncs": files.syncs,
                "bytes_written": files.bytes_written,
                "files": len(files.files()),
                "records_per_sync": wal.records_synced / max(1, files.syncs),
                "unsynced": wal.unsynced,
                "segment_writes": wal.segment_writes,
                **self.counters,
            }
        raise UnhandledMessage(f"the WAL does not handle {type(message).__name__}")

    def on_idle(self) -> None:
        self._commit(sync=bool(self._waiting))

    def _sync_unwaited(self) -> None:
        self._sync_armed = False
        self._commit()

    def _commit(self, sync: bool = True) -> None:
        """One write for everything taken and, when an append waits (or ``sync``), one
        fdatasync, then the answers. A commit that fails (a full disk, a failed
        fdatasync) ends the process at once: the file may end in a torn record that would
        hide every later one, and the records it took may not be on disk; the queues,
        restarted after it, recover from theirs."""
        if self._wal is None:
            return
        waiting, self._waiting = self._waiting, []
        try:
            self._wal.commit(sync=sync or bool(waiting))
        except BaseException as exc:
            for reply in waiting:
                reply.fail(exc)
            self._wal = None
            self.stop(abnormal=True)
            raise
        for reply in waiting:
            reply.send(None)
        if self._wal.unsynced and not self._sync_armed:
            self._sync_armed = True
            self.call_later(UNWAITED_SYNC_S, self._sync_unwaited)

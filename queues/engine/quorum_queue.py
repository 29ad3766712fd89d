"""``QuorumQueue``: a quorum queue's state machine (rabbit_fifo's semantics) over its
Raft-shaped log (``warren.queues.engine.ra_log``): the engine a quorum queue's process
wraps, with the calls a classic queue's engine (``VariableQueue``) answers, so that the
queue process's consumers, long polls, TTL, max-length and dead-lettering serve both.

Commands. Each change is an entry of the log, under the next index, applied to the
state as it is made and replayed the same way at a start:

    E expiry_ms u64 | id length u16 | msg_id | payload     enqueue (its index is its tag)
    D index...                                              delivered (checked out)
    R delivered u8 | index...                               returned to the queue
    S index...                                              settled (acked, or dropped)
    P                                                       purge: every waiting message

A message's ``delivery_count`` counts its deliveries that ended without an ack: a return
that was delivered (``requeue``), and a consumer gone, which includes the queue process
itself ending with the message out (a start returns every message it finds out, one
more each, and logs that it did). Past ``delivery_limit`` a returned message is not
queued again: it stays out, in ``over_limit``, for the queue process to dead-letter or
drop (settling it then). The waiting messages are served in index order, so a returned
one goes before newer ones.

Confirms. The entries made since the last ``sync`` go to the node's WAL in one call
(``append``): when they hold an enqueue, or a snapshot is due, to be made durable, and
once the WAL answers that they are fdatasync'd (with every other quorum queue's that
came meanwhile) a ``sync`` returns the enqueues among them: the queue takes more
commands while the WAL syncs, as a classic queue goes on while its store does.
Deliveries and settles alone are handed over without a wait (nothing waits on them:
lost in a crash, a message is delivered again), and the next durable hand-over covers
them too. ``last_written`` is the last index known durable.

Bodies. A message published since the queue started keeps its body in RAM until it is
settled, or until the queue holds more than ``ram_body_bytes`` of bodies: then those
its segment files hold already are dropped from RAM (``page_out``, which the queue's
process calls while ``over_ram_limit``), the newest first
and down to half the limit, stopping at the first one dropped before (the oldest, which
a consumer takes next, stay); a body only the WAL holds stays until the WAL's rollover
has written it to a segment. One a start took from its snapshot has its body in the log
too. A body in the log is read when it is first needed (a delivery, a dead letter) with
every other body its segment holds (``_body``), as RabbitMQ 3.10's quorum queues read
theirs from the log: a start does not read the bodies below its snapshot, so a deep
queue starts in the time its snapshot takes to read, and a deep queue holds its
messages' places, not their bodies. A body the log lost (a damaged segment) is found
missing then: the message is settled, counted in ``log_entries_lost`` and logged
(``lose_body``). Invariant: a message's body is dropped from RAM only once a segment
file holds its record (which the queue saw there), so ``_body`` always finds it.

Snapshots. After a sync, once enough entries were applied since the last snapshot, the
state is written (``ra_log.write_snapshot``): the index it covers, and each live
message's index, delivery count, whether it is out and whether it may have been
delivered, its expiry, body size and message id, as packed columns (``_pack_live``). Enough
is ``snapshot_interval`` (Ra's ``raft_log_snapshot_interval``, 4096) or, as rabbit_fifo
scales its release cursor, as many as the queue held at the last snapshot, never more
than ``max_entries`` (``raft_log_max_entries``, 32768): a deep queue's snapshot costs a
pass over every message, so it is taken less often as the queue grows.

Messages' bodies stay in the log, so a snapshot releases the segments below the oldest
live message (``needs_from``); the one before is kept as a fallback (a snapshot that
fails its check is passed over), so the segments deleted are those below what both
need.

Recovery (the constructor): the snapshot (or the one before it) gives the live messages,
their bodies left in the log; the entries above its index are applied from the segments
and then from what the WAL's process holds for the queue that is not in segments yet
(``wal_entries``; bodies of live messages it holds below the index are taken from
there). Damage (a segment whose reading stops at a record that fails its check, a gap
in the indexes) loses only what it covers (below the snapshot: only bodies, found
missing when read): the queue starts with the rest, counts the entries
lost (``log_entries_lost``) and logs each; the indexes go on above the highest read, so
none is used twice (the WAL's process begins a new segment past a gap). An entry whose
check holds but that does not decode is no damage but a log this version cannot read:
``CorruptLog``, the queue does not start and its files stay as they are.

Term. Every entry carries the term it was made in: the cluster's epoch where the node is
in a cluster (the leadership its data part started under), 1 on a lone node. A start
never goes below the highest term its snapshot and log hold (a node that led at epoch 7
and starts again alone writes on at 7), so the terms along a log never go down, as
Raft's do.

Redelivered. A delivery is handed to the WAL without a wait, so a crash may lose its
record: a start that finds no ``CLEAN_MARKER`` (written by a clean stop, removed by the
next start before it serves) or that met damage marks every message it recovered as
maybe delivered, and such a message's next delivery says so (a delivery count of at least
1; the delivery limit counts only the deliveries logged), as a classic queue's dirty
recovery does. The mark is kept in snapshots.

Races this module guards against (one thread of control; a queue process owns it):
- a crash between a command and its sync: the command was never confirmed; a settle
  lost that way delivers the message again (at least once), never loses it;
- a tag settled or returned twice, or never delivered: ``UnknownDeliveryTag`` before
  anything changes.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import logging
import math
import os
import struct
import sys
import time
from array import array
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from warren.store import replicated_io

from ..durable_files import fsync_directory
from ..errors import CorruptLog, QueueClosed, UnknownDeliveryTag
from ..message import MAX_MESSAGE_BYTES
from . import ra_log
from .msg_status import Fetched, MessageInfo, checked_batch

log = logging.getLogger(__name__)

SNAPSHOT_INTERVAL = 4096  # Ra's raft_log_snapshot_interval
MAX_ENTRIES = 32768  # Ra's raft_log_max_entries
PREVIOUS_SNAPSHOT = ra_log.SNAPSHOT_FILE + ".previous"
CLEAN_MARKER = "clean"  # a queue stopped cleanly: every delivery it made is in its log
ENQUEUE = struct.Struct(">QH")  # after the kind byte: expiry_ms, msg_id length
INDEXES = "Q"
OUT, MAYBE_DELIVERED = 1, 2  # a live message's flags in a snapshot
BODY_BATCH = 256  # the most bodies one read from the log takes
RAM_BODY_BYTES = 32 * 2**20  # past this many bytes of bodies in RAM, those in segments go


class Written(Protocol):
    """Records handed to the WAL to be made durable: ``arrived`` says whether ``get``
    would return at once; ``get`` returns once they (and every record handed before) are
    fdatasync'd, or raises what the WAL failed with."""

    def arrived(self) -> bool: ...

    def get(self) -> object: ...


# hands records to the WAL: with True to be made durable (what it returns says when), with
# False without a wait (covered by a later durable hand-over)
Append = Callable[[list[bytes], bool], Written | None]


@dataclass(slots=True)
class _Message:
    payload: bytes | None  # None: in the log, read when it is needed (``_body``)
    expiry_ms: int
    msg_id: bytes
    size: int
    delivery_count: int = 0
    out: bool = False
    # a crash (or damage) may have lost the record of a delivery: its next one says
    # "redelivered" (a delivery count of at least 1) whatever the count
    maybe_delivered: bool = False


# a snapshot as a start reads it: its header, and its live messages (``_unpack_live``)
_Snapshot = tuple[dict[str, Any], dict[int, _Message]]


def _decode_enqueue(command: bytes) -> tuple[int, bytes, bytes]:
    """An enqueue's expiry, message id and body."""
    expiry_ms, id_length = ENQUEUE.unpack_from(command, 1)
    body_at = 1 + ENQUEUE.size + id_length
    return expiry_ms, command[1 + ENQUEUE.size : body_at], command[body_at:]


def _indexes(data: bytes) -> list[int]:
    return list(struct.unpack(f">{len(data) // 8}{INDEXES}", data))


def _pack_indexes(indexes: list[int]) -> bytes:
    return struct.pack(f">{len(indexes)}{INDEXES}", *indexes)


def _little_endian(column: array) -> bytes:
    if sys.byteorder != "little":
        column.byteswap()
    return column.tobytes()


def _pack_live(messages: dict[int, _Message]) -> bytes:
    """A snapshot's columns: every live message's index, delivery count, flags, expiry,
    body size and message id (the ids' lengths, then the ids): what a start needs of it
    without reading its body from the log."""
    held = messages.values()
    ids = [m.msg_id for m in held]
    return b"".join(
        (
            _little_endian(array("Q", messages)),
            _little_endian(array("I", [m.delivery_count for m in held])),
            bytes([m.out | m.maybe_delivered << 1 for m in held]),
            _little_endian(array("Q", [m.expiry_ms for m in held])),
            _little_endian(array("I", [m.size for m in held])),
            _little_endian(array("H", [len(i) for i in ids])),
            *ids,
        )
    )


def _column(columns: memoryview, code: str, at: int, count: int) -> tuple[array, int]:
    column = array(code)
    end = at + count * column.itemsize
    column.frombytes(columns[at:end])
    if sys.byteorder != "little":
        column.byteswap()
    return column, end


LEGACY_MESSAGES = "messages"  # an earlier version's snapshot: its messages in its header


def _live_of(header: dict[str, Any], columns: memoryview) -> dict[int, _Message]:
    """A snapshot's live messages: from its columns, or from an earlier version's header
    (index, delivery count, out and maybe delivered of each; the rest is read with the
    body)."""
    if LEGACY_MESSAGES in header:
        return {
            index: _Message(None, 0, b"", 0, count, bool(out), bool(maybe and maybe[0]))
            for index, count, out, *maybe in header[LEGACY_MESSAGES]
        }
    return _unpack_live(columns, header["live"])


def _unpack_live(columns: memoryview, count: int) -> dict[int, _Message]:
    """``_pack_live``'s columns of ``count`` messages, as messages whose bodies are in
    the log; ``ValueError`` for columns that do not hold them."""
    indexes, at = _column(columns, "Q", 0, count)
    counts, at = _column(columns, "I", at, count)
    flags = bytes(columns[at : at + count])
    expiries, at = _column(columns, "Q", at + count, count)
    sizes, at = _column(columns, "I", at, count)
    lengths, at = _column(columns, "H", at, count)
    ids = bytes(columns[at:])  # sliced from bytes: each id one copy (a start's hot loop)
    if len(ids) != sum(lengths):
        raise ValueError(f"snapshot columns of {len(columns)} bytes for {count} messages")
    ends = list(itertools.accumulate(lengths))
    return {
        index: _Message(
            None,
            expiry,
            ids[end - length : end],
            size,
            delivered,
            bool(flag & OUT),
            bool(flag & MAYBE_DELIVERED),
        )
        for index, delivered, flag, expiry, size, length, end in zip(
            indexes, counts, flags, expiries, sizes, lengths, ends, strict=True
        )
    }


class QuorumQueue:
    """One quorum queue's state and log (the module docstring)."""

    def __init__(
        self,
        directory: str,
        append: Append,
        *,
        owner: bytes = b"",
        term: int = 1,
        wal_entries: Iterable[ra_log.Entry] = (),
        delivery_limit: int | None = None,
        snapshot_interval: int = SNAPSHOT_INTERVAL,
        max_entries: int = MAX_ENTRIES,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        ram_body_bytes: int = RAM_BODY_BYTES,
    ) -> None:
        self.directory = directory
        self.ram_body_bytes = ram_body_bytes
        self._append = append
        self.term = term  # raised at recovery to the highest the log holds
        self.delivery_limit = delivery_limit
        self.snapshot_interval = snapshot_interval
        self.max_entries = max_entries
        self.max_message_bytes = max_message_bytes
        self._owner = owner or directory.encode()  # how the WAL's records name the queue
        self._messages: dict[int, _Message] = {}
        # a heap of the waiting messages' indexes, and some that are not any more (out,
        # or gone): those are passed over when met at the top (``_head``)
        self._ready: list[int] = []
        self._out_count = 0
        self._ram_bytes = 0  # the bodies held in RAM (not those left in the log)
        # the segment bodies are being read from (``_read_bodies``), kept while a
        # consumer reads on through it
        self._segment: ra_log.SegmentRecords | None = None
        self._paged_at: tuple[str, int] | None = None  # the newest segment page_out saw
        self._unsent: list[bytes] = []  # the records (in parts) not handed to the WAL
        # deliveries and settles made since the last entry: logged as one D entry and one
        # S entry before the next other entry or sync (a message delivered and settled in
        # between is delivered before it is settled, as in the order they were made)
        self._delivered: list[int] = []
        self._settled: list[int] = []
        self._unsent_enqueues: list[int] = []
        # handed to the WAL, not yet durable: what says when, the enqueues it confirms,
        # the last index it holds, when it was handed over
        self._in_flight: collections.deque[tuple[Written, list[int], int, float]] = (
            collections.deque()
        )
        self.over_limit: list[int] = []
        self.counters: dict[str, int] = {
            "log_entries_replayed": 0,
            "log_entries_lost": 0,
            "snapshots_written": 0,
            "segments_deleted": 0,
            "wal_appends": 0,
            "bodies_paged_out": 0,
        }
        self._commit_latency_s = 0.0
        self._closed = False
        os.makedirs(directory, exist_ok=True)
        self.next_seq_id = 1
        self.snapshot_index = 0
        self._snapshot_needs_from = 1  # what the snapshot on disk needs of the log
        self._snapshot_damaged = False  # the newest failed its check (its fallback used)
        self._previous_needs_from = 1  # and the one before it
        self._damaged = False  # the start met a damaged file: something was lost
        # messages flagged maybe delivered at the start, in no snapshot yet: a clean stop
        # writes one even with no entry past the last (the flags are in no entry)
        self._flags_unsaved = False
        self._recover(list(wal_entries))
        self.last_written = self.next_seq_id - 1
        self._applied_at_snapshot = self.snapshot_index
        self._next_snapshot_after = self._scaled_interval()
        if self._unsent:  # the start's returns, durable before anything else
            records, self._unsent = self._unsent, []
            self._hand_over(records, True, [])
            self._settle(wait=True)

    # ------------------------------------------------------------------ recovery

    def _recover(self, wal_entries: list[ra_log.Entry]) -> None:
        snapshot, previous = self._snapshots()
        start = 1
        if snapshot is not None:
            header, live = snapshot
            self.term = max(self.term, header["term"])
            self.snapshot_index = header["index"]
            self._snapshot_needs_from = header["needs_from"]
            self._previous_needs_from = (
                previous["needs_from"] if previous else self._snapshot_needs_from
            )
            self._messages = live  # their bodies stay in the log until needed
            self._out_count = sum(m.out for m in live.values())
            self._ready = sorted(i for i, m in live.items() if not m.out)  # a heap already
            # an earlier version's snapshot holds no message's expiry, size or id: those
            # are read with the bodies, from the oldest message it needs on
            start = header["needs_from"] if LEGACY_MESSAGES in header else self.snapshot_index + 1
        self.next_seq_id = self.snapshot_index + 1
        expected = start
        replayed = 0
        damaged_files: list[str] = []
        entries = itertools.chain(
            ra_log.read_segments(self.directory, start, damaged_files), wal_entries
        )
        for entry in entries:
            if entry.index < expected:
                if entry.index <= self.snapshot_index:  # the WAL holds it: its body is here
                    self._take_body(entry)
                continue  # the WAL's copy of what a segment holds already
            if entry.index != expected:
                self._lost(expected, entry.index - 1)
            expected = entry.index + 1
            self.term = max(self.term, entry.term)
            if entry.index <= self.snapshot_index:
                self._take_body(entry)
                continue
            try:
                self._apply(entry.index, entry.command)
            except (ValueError, struct.error, IndexError) as exc:
                # the record's CRC holds: not damage, a log this version cannot read
                raise CorruptLog(f"{self.directory}: entry {entry.index}: {exc}") from None
            self.next_seq_id = entry.index + 1
            replayed += 1
        self.counters["log_entries_replayed"] = replayed
        for path in damaged_files:
            self._damaged = True
            log.error("%s: damaged; what follows its last whole record is lost", path)
        clean = self._was_stopped_cleanly()
        if self._damaged or not clean:
            # a delivery handed out without a wait may be lost with the crash (or the
            # damage): each message here may have been delivered, so it says so
            for message in self._messages.values():
                message.maybe_delivered = True
            self._flags_unsaved = bool(self._messages)
        over = set(self.over_limit)
        gone = sorted(i for i, m in self._messages.items() if m.out and i not in over)
        if gone:  # their consumers went with the process that delivered them: logged, so
            # that a purge or a snapshot after this start finds them where they are
            self._log(b"R" + bytes([1]) + _pack_indexes(gone))
            self._return(gone, delivered=True)

    def _lost(self, first: int, last: int) -> None:
        """Entries ``first`` to ``last`` are not in the log (a damaged file)."""
        self._damaged = True
        self.counters["log_entries_lost"] += last - first + 1
        log.error("%s: log entries %d to %d are lost (a damaged file)", self.directory, first, last)

    def _was_stopped_cleanly(self) -> bool:
        """Whether the last run stopped cleanly (its marker, removed here for good: from
        now on a crash may lose a delivery handed out without a wait)."""
        marker = os.path.join(self.directory, CLEAN_MARKER)
        if not os.path.exists(marker):
            return False
        replicated_io.unlink(marker)
        fsync_directory(self.directory)
        return True

    def _snapshots(self) -> tuple[_Snapshot | None, dict[str, Any] | None]:
        """The snapshot to start from (its header and live messages), and the header of
        the one before it (either may be None)."""
        chosen: _Snapshot | None = None
        previous: dict[str, Any] | None = None
        for name in (ra_log.SNAPSHOT_FILE, PREVIOUS_SNAPSHOT):
            path = os.path.join(self.directory, name)
            try:
                read = ra_log.read_snapshot(path)
                if read is None:
                    continue
                header, columns = read
                if chosen is None:
                    chosen = (header, _live_of(header, columns))
                else:
                    previous = header
            except (ValueError, KeyError, TypeError) as exc:
                self.counters["snapshots_refused"] = self.counters.get("snapshots_refused", 0) + 1
                self._snapshot_damaged |= name == ra_log.SNAPSHOT_FILE
                log.error("%s: %s; the snapshot before it is used", path, exc)
        return chosen, previous

    def _apply(self, index: int, command: bytes) -> None:
        kind, rest = command[:1], command[1:]
        if kind == b"E":
            self._enqueued(index, command)
        elif kind == b"D":
            for tag in _indexes(rest):
                message = self._messages.get(tag)
                if message is None:
                    continue
                if message.out:  # delivered again after a restart returned it
                    message.delivery_count += 1
                else:
                    self._mark_out(tag, True)
        elif kind == b"R":
            tags = [t for t in dict.fromkeys(_indexes(rest[1:])) if t in self._messages]
            self._return(tags, delivered=bool(rest[0]))
        elif kind == b"S":
            self._forget([t for t in dict.fromkeys(_indexes(rest)) if t in self._messages])
        elif kind == b"P":
            self._forget(self._waiting())
        else:
            raise ValueError(f"{self.directory}: entry {index} holds an unknown command {kind!r}")

    def _enqueued(self, index: int, command: bytes) -> _Message:
        expiry_ms, msg_id, payload = _decode_enqueue(command)
        message = _Message(payload, expiry_ms, msg_id, len(payload))
        self._messages[index] = message
        self._ram_bytes += message.size
        heapq.heappush(self._ready, index)
        return message

    def _take_body(self, entry: ra_log.Entry) -> None:
        """Give a live message whose body is in the log the body ``entry`` holds."""
        message = self._messages.get(entry.index)
        if message is not None and message.payload is None and entry.command[:1] == b"E":
            self._give_body(message, entry.command)

    def _give_body(self, message: _Message, command: bytes) -> None:
        """``message`` as its enqueue ``command`` says (its body, and the rest an earlier
        version's snapshot did not hold)."""
        message.expiry_ms, message.msg_id, message.payload = _decode_enqueue(command)
        message.size = len(message.payload)
        self._ram_bytes += message.size

    def _body(self, index: int) -> bytes | None:
        """A live message's body: read from the segment that holds it when it is not in
        RAM (``_read_bodies``); None when damage lost it (``lose_body``)."""
        message = self._messages[index]
        if message.payload is None:
            self._read_bodies(index)
        return message.payload

    def _read_bodies(self, index: int) -> None:
        """Take from the log the body of ``index`` and of the next messages after it in
        its segment whose bodies are there, ``BODY_BATCH`` at most. The segment is read
        once and kept while its bodies are taken in order (a consumer reads on from
        where it was); each record taken is checked (a cut or flipped one is not taken:
        the caller finds the body missing). The WAL's process may be appending to the
        newest segment: a record cut short at its end is that, not damage; a segment
        that does not hold ``index`` yet is read again once it has grown."""
        records = self._segment
        if records is None or records.span(index) is None:
            path = ra_log.segment_holding(self.directory, index)
            if path is None:
                return
            if records is None or (path, os.path.getsize(path)) != records.key:
                records = self._segment = ra_log.SegmentRecords(path)
        taken = 0
        at = index
        while taken < BODY_BATCH and records.span(at) is not None:
            message = self._messages.get(at)
            if message is not None and message.payload is None:
                taken += 1
                command = records.command(at)
                if command is not None and command[:1] == b"E":
                    self._give_body(message, command)
            at += 1
        if records.span(at) is None:
            self._segment = None  # read to its end: the next body is in another file

    def lose_body(self, index: int) -> None:
        """A message whose body the log no longer holds (a damaged segment): settled."""
        self.counters["log_entries_lost"] += 1
        log.error("%s: the body of message %d is lost (a damaged file)", self.directory, index)
        self._settled.append(index)
        self._forget([index])

    def _mark_out(self, index: int, out: bool) -> None:
        message = self._messages[index]
        if out and not message.out:
            self._out_count += 1
        elif not out and message.out:
            self._out_count -= 1
        message.out = out

    def _return(self, tags: list[int], delivered: bool) -> None:
        for tag in tags:
            message = self._messages[tag]
            message.delivery_count += delivered
            if self.delivery_limit is not None and message.delivery_count > self.delivery_limit:
                self._mark_out(tag, True)  # the queue process dead-letters or drops it
                if tag not in self.over_limit:
                    self.over_limit.append(tag)
                continue
            if message.out:
                self._mark_out(tag, False)
                heapq.heappush(self._ready, tag)

    def _forget(self, tags: list[int]) -> None:
        """Drop the messages (their entries in the heap are passed over when met)."""
        for tag in tags:
            message = self._messages.pop(tag)
            if message.payload is not None:
                self._ram_bytes -= message.size
            if message.out:
                self._out_count -= 1
        if self.over_limit:
            gone = set(tags)
            self.over_limit = [tag for tag in self.over_limit if tag not in gone]

    def _waiting(self) -> list[int]:
        return sorted(index for index, m in self._messages.items() if not m.out)

    def _head(self) -> int | None:
        """The oldest waiting message's index, the heap's stale top entries dropped."""
        ready, messages = self._ready, self._messages
        while ready:
            message = messages.get(ready[0])
            if message is not None and not message.out:
                return ready[0]
            heapq.heappop(ready)
        return None

    # ------------------------------------------------------------------ commands

    def _log(self, *command: bytes) -> int:
        """Log the command whose parts are ``command`` (after the deliveries and settles
        made before it); its index."""
        self._log_pending()
        return self._append_entry(command)

    def _append_entry(self, command: tuple[bytes, ...]) -> int:
        index = self.next_seq_id
        self.next_seq_id += 1
        self._unsent += ra_log.entry_parts(index, self.term, self._owner, command)
        return index

    def _log_pending(self) -> None:
        if self._delivered:
            delivered, self._delivered = self._delivered, []
            self._append_entry((b"D", _pack_indexes(delivered)))
        if self._settled:
            settled, self._settled = self._settled, []
            self._append_entry((b"S", _pack_indexes(settled)))

    def publish_many(
        self,
        payloads: list[bytes],
        *,
        persistent: bool = True,
        expiry_ms: int | None = None,
        msg_ids: list[bytes] | None = None,
        sync_follows: bool = False,
    ) -> range:
        """Enqueue a batch (every message of a quorum queue is persistent); their indexes.
        A message over the maximum size refuses the whole batch before anything changes."""
        self._check_open()
        checked_batch(payloads, msg_ids, self.max_message_bytes)
        self._log_pending()
        first = self.next_seq_id
        expiry = expiry_ms or 0
        for number, payload in enumerate(payloads):
            msg_id = msg_ids[number] if msg_ids is not None else b""
            index = self._append_entry((b"E", ENQUEUE.pack(expiry, len(msg_id)), msg_id, payload))
            self._messages[index] = _Message(payload, expiry, msg_id, len(payload))
            self._ram_bytes += len(payload)
            heapq.heappush(self._ready, index)
            self._unsent_enqueues.append(index)
        return range(first, self.next_seq_id)

    def sync(self, wait: bool = True) -> list[int]:
        """Hand what was logged since the last call to the WAL; the enqueues that became
        confirmed (fdatasync'd), each once: with ``wait`` every one handed over, without
        it those the WAL has answered (a later call takes the rest). A snapshot follows
        when one is due: then this call waits for everything it handed over, as a
        snapshot is of a state whose every entry is durable (under a steady load
        something is always out, and the snapshot would never come)."""
        self._check_open()
        self._log_pending()
        due = self._snapshot_due(self.next_seq_id - 1)
        if self._unsent:
            records, self._unsent = self._unsent, []
            enqueues, self._unsent_enqueues = self._unsent_enqueues, []
            self._hand_over(records, bool(enqueues) or due, enqueues)
        confirmed = self._settle(wait or due)
        if (
            not self._in_flight
            and self.last_written == self.next_seq_id - 1
            and self._snapshot_due(self.last_written)
        ):
            self.snapshot()
        return confirmed

    def over_ram_limit(self) -> bool:
        """Whether the bodies in RAM are past ``ram_body_bytes`` (``page_out`` is due)."""
        return self._ram_bytes > self.ram_body_bytes

    def page_out(self) -> None:
        """Drop from RAM the bodies the segments hold, the newest first, until half of
        ``ram_body_bytes`` is left or a body dropped before is met (module docstring).
        The queue's process calls it on a timer (a look lists the log's directory: at
        every sync that cost a deep queue's process an eighth of its time), and the
        newest segment is walked only when it has changed since the last look: until
        the WAL writes more to the segments, nothing more can go."""
        files = ra_log.segment_files(self.directory)
        if not files:
            return
        first, path = files[-1]
        try:
            seen = (path, os.path.getsize(path))
            if seen == self._paged_at:
                return
            last = ra_log.last_whole_index(path)
        except FileNotFoundError:
            return  # deleted since the listing: the next look finds the files as they are
        self._paged_at = seen
        in_segments = first - 1 if last is None else last  # the highest index they hold
        keep = self.ram_body_bytes // 2
        dropped = 0
        for index in reversed(self._messages):
            if self._ram_bytes <= keep:
                break
            if index > in_segments:
                continue  # only in the WAL yet
            message = self._messages[index]
            if message.payload is None:
                break  # the bodies dropped before begin here: the oldest stay
            message.payload = None
            self._ram_bytes -= message.size
            dropped += 1
        self.counters["bodies_paged_out"] += dropped

    def _hand_over(self, records: list[bytes], durable: bool, enqueues: list[int]) -> None:
        began = time.monotonic()
        try:
            written = self._append(records, durable)
        except BaseException:
            self._closed = True  # a log must not go on past entries it may have lost
            raise
        self.counters["wal_appends"] += 1
        if written is not None:
            self._in_flight.append((written, enqueues, self.next_seq_id - 1, began))

    def _settle(self, wait: bool) -> list[int]:
        """The enqueues of the hand-overs the WAL made durable (all of them, waiting, with
        ``wait``), oldest first."""
        confirmed: list[int] = []
        in_flight = self._in_flight
        while in_flight and (wait or in_flight[0][0].arrived()):
            written, enqueues, last, began = in_flight.popleft()
            try:
                written.get()
            except BaseException:
                self._closed = True
                raise
            self.last_written = last
            self._commit_latency_s = time.monotonic() - began
            confirmed += enqueues
        return confirmed

    def needs_sync(self) -> bool:
        """Whether commands wait to be handed to the WAL (what it has not answered yet is
        ``awaiting_wal``: its answer, not a timer, is the time to look again)."""
        return bool(self._unsent or self._delivered or self._settled)

    @property
    def awaiting_wal(self) -> bool:
        return bool(self._in_flight)

    def waited_for_wal_s(self) -> float | None:
        """How long the oldest append the WAL has not answered has been out (None: none)."""
        if not self._in_flight:
            return None
        return time.monotonic() - self._in_flight[0][3]

    def _snapshot_due(self, index: int) -> bool:
        return index - self._applied_at_snapshot >= self._next_snapshot_after

    def _scaled_interval(self) -> int:
        return min(max(self.snapshot_interval, len(self._messages)), self.max_entries)

    def snapshot(self) -> None:
        """Write the state at the last index, and delete the segments neither this snapshot
        nor the one before needs (call once every entry is durable: the state is the
        state at that index, or a replay would apply some twice)."""
        index = self.last_written
        assert not self.needs_sync() and not self._in_flight, "every entry durable"
        assert index == self.next_seq_id - 1, "every entry durable"
        needs_from = min(self._messages, default=index + 1)
        header = {
            "index": index,
            "term": self.term,
            "needs_from": needs_from,
            "live": len(self._messages),
        }
        current = os.path.join(self.directory, ra_log.SNAPSHOT_FILE)
        if self._snapshot_damaged:  # never over the good fallback
            replicated_io.unlink(current)
            self._snapshot_damaged = False
        elif os.path.exists(current):  # the fallback, should the new one be damaged
            replicated_io.rename(current, os.path.join(self.directory, PREVIOUS_SNAPSHOT))
            self._previous_needs_from = self._snapshot_needs_from
        ra_log.write_snapshot(current, header, _pack_live(self._messages))
        self.counters["snapshots_written"] += 1
        self._flags_unsaved = False
        self.snapshot_index = index
        self._applied_at_snapshot = index
        self._next_snapshot_after = self._scaled_interval()
        self._snapshot_needs_from = needs_from
        deleted = ra_log.delete_segments_below(
            self.directory, min(self._previous_needs_from, needs_from)
        )
        if deleted:
            self._segment = None  # it may have been one of them
        self.counters["segments_deleted"] += deleted

    # ------------------------------------------------------------------ fetching

    def fetch_encoded(self, ack_required: bool = True, below: float = math.inf) -> Fetched | None:
        """The oldest waiting message, still encoded; None when none waits below
        ``below``. With ``ack_required`` it is out until ``ack`` or ``requeue``."""
        self._check_open()
        while True:
            index = self._head()
            if index is None or index >= below:
                return None
            heapq.heappop(self._ready)
            payload = self._body(index)
            if payload is not None:
                break
            self.lose_body(index)
        message = self._messages[index]
        if ack_required:
            self._mark_out(index, True)
            self._delivered.append(index)
        else:
            self._settled.append(index)
            self._forget([index])
        count = max(message.delivery_count, int(message.maybe_delivered))
        return Fetched(index, payload, count, message.msg_id)

    def peek(self) -> MessageInfo | None:
        self._check_open()
        index = self._head()
        if index is None:
            return None
        message = self._messages[index]
        return MessageInfo(index, message.expiry_ms, message.size, True)

    def _take_out(self, seq_ids: Iterable[int]) -> list[int]:
        self._check_open()
        tags = list(seq_ids)
        if len(set(tags)) != len(tags):
            raise UnknownDeliveryTag(f"seq ids repeated in one call: {tags}")
        for tag in tags:
            message = self._messages.get(tag)
            if message is None or not message.out:
                raise UnknownDeliveryTag(
                    f"seq id {tag!r} awaits no ack: never fetched, or already acked or requeued"
                )
        return tags

    def ack(self, seq_ids: Iterable[int]) -> None:
        """Settle delivered messages for good."""
        tags = self._take_out(seq_ids)
        if not tags:
            return
        self._settled += tags
        self._forget(tags)

    def requeue(self, seq_ids: Iterable[int], *, delivered: bool = True) -> None:
        """Return delivered messages, in index order before newer ones; with ``delivered``
        their delivery counts go up by one, and those past the delivery limit go to
        ``over_limit`` instead."""
        tags = sorted(self._take_out(seq_ids))
        if not tags:
            return
        self._log(b"R" + bytes([delivered]) + _pack_indexes(tags))
        self._return(tags, delivered)

    def take_over_limit(self) -> list[int]:
        """The messages past the delivery limit, out until settled (the caller's to
        dead-letter or ack)."""
        taken, self.over_limit = self.over_limit, []
        return taken

    def pending_payload(self, seq_id: int) -> bytes | None:
        message = self._messages.get(seq_id)
        if message is None or not message.out:
            raise UnknownDeliveryTag(f"seq id {seq_id!r} awaits no ack")
        return self._body(seq_id)

    def delivery_count(self, seq_id: int) -> int:
        return self._messages[seq_id].delivery_count

    def drop_while(self, predicate: Callable[[MessageInfo], bool]) -> MessageInfo | None:
        """Drop waiting messages from the head while ``predicate`` holds; the first it
        refused, or None when none waits."""
        dropped: list[int] = []
        while (info := self.peek()) is not None and predicate(info):
            heapq.heappop(self._ready)
            self._forget([info.seq_id])  # now: a second heap entry of it is then stale
            dropped.append(info.seq_id)
        self._settled += dropped
        return self.peek()

    def purge(self) -> int:
        self._check_open()
        waiting = self._waiting()
        if waiting:
            self._log(b"P")
            self._forget(waiting)
            self._segment = None  # none of its bodies is wanted now
        return len(waiting)

    def msg_ids_from(self, seq_id: int) -> set[bytes]:
        return {m.msg_id for i, m in self._messages.items() if i >= seq_id and m.msg_id}

    # ------------------------------------------------------------------ figures

    def __len__(self) -> int:
        return len(self._messages) - self._out_count

    @property
    def depth(self) -> int:
        return len(self._messages)

    def stats(self) -> dict[str, Any]:
        return {
            "len": len(self),
            "depth": len(self._messages),
            "ram_bytes": self._ram_bytes,
            "disk_bytes": sum(
                os.path.getsize(path) for _, path in ra_log.segment_files(self.directory)
            ),
            "unconfirmed": len(self._unsent_enqueues)
            + sum(len(enqueues) for _, enqueues, _, _ in self._in_flight),
            "persistent": len(self._messages),
            "type": "quorum",
            "mode": "quorum",
            "rates": {},
            "last_index": self.next_seq_id - 1,
            "last_written_index": self.last_written,
            "last_applied_index": self.next_seq_id - 1,
            "snapshot_index": self.snapshot_index,
            "term": self.term,
            "commit_latency_s": self._commit_latency_s,
            "delivery_limit": self.delivery_limit,
        }

    def set_ram_duration_target(self, seconds: float) -> None:
        """Kept for the queue process's alarm handling: a quorum queue's bodies leave
        RAM by ``ram_body_bytes`` alone, whatever the target (docs/quorum-queues.md)."""

    def update_rates(self) -> None:
        """A quorum queue keeps no ingress or egress rates."""

    def resume_rates(self) -> None:
        """A quorum queue keeps no ingress or egress rates."""

    def rates_at_rest(self) -> bool:
        return True

    # ------------------------------------------------------------------ ending

    def terminate(self) -> None:
        """Clean stop (after a sync): a snapshot, so the next start replays little."""
        if self._closed:
            return
        if not self.needs_sync() and not self._in_flight:
            if self.last_written < self.next_seq_id - 1:  # settles handed over unwaited
                self._hand_over([], True, [])
                self._settle(wait=True)
            if self.last_written > self.snapshot_index or self._flags_unsaved:
                self.snapshot()
            marker = os.path.join(self.directory, CLEAN_MARKER)
            os.close(replicated_io.open(marker, os.O_WRONLY | os.O_CREAT, 0o644))
            fsync_directory(self.directory)
        self._closed = True

    def delete(self) -> None:
        """Delete the queue: its log, its snapshots, its directory."""
        self._check_open()
        self._closed = True
        replicated_io.remove_tree(self.directory, ignore_errors=True)

    def abandon(self) -> None:
        self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise QueueClosed(f"queue {self.directory!r} is closed")

    def __repr__(self) -> str:
        return f"QuorumQueue({self.directory!r}, len={len(self)}, depth={self.depth})"

"""``StreamActor``: one stream as an OS process (``warren: stream <name>``), the only writer
of its log (``warren.queues.engine.stream_log``).

Supervised by the node's ``queue_sup`` as a queue is: a stream that crashes is restarted
alone and recovers its log from disk (a torn chunk at the tail is cut, CRCs are checked).
It uses neither message store: a stream's bodies live in its own segment files.

Messages accepted (``warren.queues.protocol``), and what each gets back:

    Publish(payloads, ...)          → how many were taken, once they are committed: the
                                      payloads become one chunk (more when a Publish holds
                                      over 65,535), appended at once; chunks are made
                                      durable by a group commit (below), then
                                      confirmed. ``persistent``, ``msg_ids`` and
                                      ``expiration_ms`` are a queue's and mean nothing here
                                      (a stream keeps everything until retention). With a
                                      producer, sequences at or below the last one the
                                      stream took from it are confirmed and dropped; that
                                      last sequence goes in the chunk's trailer, so it is
                                      durable with the records it covers
    StreamAttach(start, value)      → where a reader starting there begins, and the
                                      stream's directory, committed offset, identity, and
                                      the offset after its last committed record
    StreamPlan(start, end, bytes)   → the committed offsets [start, end) cut on chunk
                                      boundaries (from the index files only)
    StreamChunks(offset, end, max_bytes)
                                    → committed user chunks as the files hold them, for
                                      a reader that checks their CRCs itself (Spark's)
    StreamRead(offset, max_records, wait_ms)
                                    → committed records from ``offset``, whole chunks; at
                                      once when ``offset`` is committed, else when it is or
                                      after ``wait_ms`` (a long poll)
    StoreOffset(name, offset)       (tell, or ask) a tracking delta chunk, committed with
                                      the next group commit; an offset past the committed
                                      one is refused (``OffsetOutOfRange`` to an ask; a
                                      tell is dropped and logged)
    GroupBeat(group, member, ...)   → the member's turn in its consumer group: "active",
                                      "standby" or "step-down" (single active consumer,
                                      ``warren.queues.broker.single_active``)
    QueryOffset(name), LastSequence(producer)
                                    → the stored offset, the producer's last sequence
    QueueStats()                    → offsets, segments, bytes, the user records held
                                      (``messages_ready``: tracking chunks take offsets
                                      but are no records) and each named consumer's lag
                                      (the user records committed after its offset)
    DeleteQueue()                   → records deleted; the files are removed and every later
                                      request is refused
    Purge(), Fetch(...), Settle(...) ... raise ``UnsupportedOperation``: a stream is read by
                                      offset, never consumed away

Group commit: the fdatasync runs on a thread of this process (``StreamLog.begin_sync``
then ``PendingSync.run`` there), one at a time, so the process goes on taking and
appending Publishes while the disk flushes. A sync starts after a Publish is appended or
when the mailbox runs dry, unless one is running; when that one ends with more appended
meanwhile, the next starts at once. Each covers everything appended before it began;
when it ends, back on the actor's thread, the committed offset moves and the Publishes
it covers are confirmed. Under ``sync_policy="flush"`` nothing blocks and
the commit is made at once.

Readers: a reader on this machine opens the segment files itself
(``warren.queues.client.stream``) and asks this process only for the committed offset
(``StreamRead`` of 0 records, a long poll); a reader behind the tcp listener has its
records read here. Either way no offset above the committed one is ever read: the
committed offset moves only after the sync that made the chunk durable (or, under
``sync_policy="flush"``, after the chunk is written whole).

Retention (``max_length_bytes``, ``max_age``) deletes whole segments, oldest first,
never the newest; it runs after a rollover and on a timer (a tenth of ``max_age``, at most
a minute), so an idle stream is trimmed too. A reader in a deleted segment keeps its open
file; one that needs a deleted segment moves on to the new first chunk.

Races: a publisher is confirmed only after the sync that covers its chunk, so a stream
killed with confirms pending leaves its publishers an ActorDeadError (the batch is in
doubt: re-send it, with a producer id to drop what did land), never a false confirm. The
sync thread flushes duplicates of the descriptors, so a rollover closing the segment
under it changes nothing; a stop waits for it, then confirms what it covered; a delete
fails the confirms it would have given; a flush that fails crashes the process (its
publishers get an error, and nothing after it is confirmed: after a failed fdatasync the
page cache no longer says what is on disk), and the restart recovers from what the files
show, which after such a failure may include pages the disk never took: a failed flush
is a disk fault no program that trusts fdatasync can undo. A write that fails (a full
disk) stops the process without a sync: the restart cuts the torn tail, and the
publishers of unconfirmed chunks get an error.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, ClassVar, NamedTuple

from warren.actors import ProcessActor, UnhandledMessage
from warren.store import replicated_io

from ..engine.stream_log import (
    MAX_TRACKING_ID_BYTES,
    PendingSync,
    Start,
    StreamError,
    StreamLog,
    StreamReader,
    Timestamp,
    chunk_ranges,
)
from ..errors import (
    Nacked,
    OffsetOutOfRange,
    OutOfSequence,
    QueueClosed,
    UnsupportedOperation,
)
from ..protocol import (
    MAX_ENTRIES_PER_CHUNK,
    MAX_SEQUENCE,
    DeleteQueue,
    Fetch,
    GroupBeat,
    LastSequence,
    Publish,
    Purge,
    QueryOffset,
    QueueDefinition,
    QueueStats,
    Release,
    Settle,
    StoreOffset,
    StreamAttach,
    StreamChunks,
    StreamPlan,
    StreamRead,
    Subscribe,
)
from .single_active import ActiveConsumers

__all__ = ["StreamActor", "tracking_id"]

log = logging.getLogger("warren.queues")

RETENTION_CHECK_S = 60.0  # how often retention looks at an idle stream, at the most
RETENTION_AGE_FRACTION = 0.1  # and at the least, as a share of its max_age
MIN_RETENTION_CHECK_S = 0.1
READERS_KEPT = 16  # readers serving StreamRead kept open, by the offset each reads next
# A stored offset of None is kept as this value (Osiris's tracking values are u64).
FORGOTTEN_OFFSET = 2**64 - 1
MAX_READ_BYTES = 8 * 2**20  # past this, a StreamRead answers with the chunks it has
QUEUE_ONLY = (Fetch, Settle, Subscribe, Release, Purge)  # a classic queue's, refused


def tracking_id(producer: bytes) -> str:
    """The tracking id a producer's sequences are kept under: its id when that is UTF-8 of
    at most 255 bytes (Osiris's limit), else a digest of it."""
    if len(producer) <= MAX_TRACKING_ID_BYTES:
        try:
            return producer.decode()
        except UnicodeDecodeError:
            pass
    return "sha256:" + hashlib.sha256(producer).hexdigest()


class _Waiting:
    """A StreamRead whose offset is not committed yet."""

    __slots__ = ("request", "reply", "answered")

    def __init__(self, request: StreamRead, reply: Any) -> None:
        self.request, self.reply, self.answered = request, reply, False


class _Sync(NamedTuple):
    """A group commit running on the sync thread, and what it will confirm."""

    pending: PendingSync
    confirms: list[tuple[Any, int]]
    last_record: int  # the offset of the last record it covers
    flushed: Future[PendingSync]


class StreamActor(ProcessActor):
    """One stream's process; see the module docstring."""

    def __init__(
        self,
        definition: QueueDefinition,
        directory: str,
        *,
        data_dir: str | None = None,
        max_segment_chunks: int = 256_000,
        retention_check_s: float | None = None,
        epoch: int = 0,
    ) -> None:
        """``retention_check_s``: how often retention looks at the stream (by default a
        tenth of ``max_age``, at least 0.1 s and at most ``RETENTION_CHECK_S``);
        ``epoch``: the cluster's epoch this node leads in (0 outside a cluster), written
        into every chunk's header."""
        if not definition.is_stream:
            raise ValueError(f"queue {definition.name} is not a stream")
        self.definition = definition
        self.stream_name = definition.name
        self.directory = directory
        self.max_segment_chunks = max_segment_chunks
        self.epoch = epoch
        if retention_check_s is None:
            retention_check_s = RETENTION_CHECK_S
            if definition.max_age is not None:
                retention_check_s = min(
                    retention_check_s,
                    max(MIN_RETENTION_CHECK_S, definition.max_age * RETENTION_AGE_FRACTION),
                )
        self.retention_check_s = retention_check_s
        self._log: StreamLog | None = None
        self._pending: list[tuple[Any, int]] = []  # confirms awaiting the next sync
        self._syncer: ThreadPoolExecutor | None = None  # the sync thread (fsync policy)
        self._sync: _Sync | None = None  # the group commit running there
        self._waiting: list[_Waiting] = []
        self._readers: dict[int, StreamReader] = {}  # next offset -> an open reader
        self._deleted = False
        self._last_record = -1  # the offset of the last record appended (not tracking)
        self._last_committed_record = -1
        self._groups = ActiveConsumers(definition.partition)
        self.counters = {
            "published": 0,
            "confirmed": 0,
            "repeats_dropped": 0,
            "records_read": 0,
            "chunks_read": 0,
            "offsets_stored": 0,
            "segments_deleted": 0,
            "syncs": 0,
        }

    # ------------------------------------------------------------------ lifecycle

    def on_start(self) -> None:
        definition = self.definition
        assert definition.max_segment_size_bytes is not None  # a stream definition sets it
        started = time.monotonic()
        self._log = StreamLog(
            self.directory,
            max_segment_size_bytes=definition.max_segment_size_bytes,
            max_segment_chunks=self.max_segment_chunks,
            sync=definition.sync_policy == "fsync",
            epoch=self.epoch,
        )
        log.info(
            "stream %s: recovered offsets %d..%d in %.3f s",
            self.stream_name,
            self._log.first_offset,
            self._log.last_offset,
            time.monotonic() - started,
        )
        try:
            with StreamReader(self.directory, "last", self._committed) as reader:
                last_chunk = reader.read_chunk()
        except StreamError as error:  # damage in the middle: readers meet it, not the start
            log.error("stream %s: its last chunk cannot be read: %s", self.stream_name, error)
            last_chunk = None
        if last_chunk:
            self._last_record = self._last_committed_record = last_chunk[-1][0]
        self._apply_retention()
        self.call_later(self.retention_check_s, self._retention_tick)
        if self._log.sync_policy:
            self._syncer = ThreadPoolExecutor(1, thread_name_prefix=f"sync {self.stream_name}")

    def on_stop(self) -> None:
        self._close_readers()
        if self._syncer is not None:
            self._syncer.shutdown()  # waits for a sync in flight
        if self._log is not None and not self._deleted:
            if self._sync is not None:
                self._commit(self._sync)
            self._log.close()
            self._committed_through(self._last_record, self._take_pending())

    def on_idle(self) -> None:
        self._start_sync()

    @property
    def _stream(self) -> StreamLog:
        assert self._log is not None, "on_start opens the log"
        return self._log

    @property
    def _committed(self) -> int:
        return self._stream.committed_offset

    # ------------------------------------------------------------------ messages

    def on_receive(self, message: Any) -> Any:
        handler = self._handlers.get(type(message))
        if isinstance(message, QUEUE_ONLY):
            raise UnsupportedOperation(
                f"{self.stream_name!r} is a stream: it takes no {type(message).__name__}; "
                f"read it with consume(name, offset=...) (its messages stay until retention)"
            )
        if handler is None:
            raise UnhandledMessage(
                f"stream {self.stream_name} does not handle {type(message).__name__}"
            )
        if self._deleted:
            raise QueueClosed(f"stream {self.stream_name} was deleted")
        if self._log is None:  # a write failed: stopping, to restart from disk
            raise Nacked(f"stream {self.stream_name} is restarting; try again in a moment")
        try:
            return handler(self, message)
        except OSError as error:
            # A write failed half way (a full disk): stop without syncing; the restart
            # cuts the torn tail and the unconfirmed publishers get an error.
            log.error("stream %s: a write failed (%s); restarting", self.stream_name, error)
            self._stream.abandon()
            self._log = None
            self.stop()
            raise Nacked(
                f"stream {self.stream_name}: a write failed ({error.strerror or error}); "
                f"nothing of this request was taken, and the stream restarts from what is "
                f"on disk: publish it again"
            ) from None

    def _publish(self, message: Publish) -> None:
        payloads = message.payloads
        producers: dict[str, int] = {}
        taken = len(payloads)
        if message.producer is not None:
            payloads, producers = self._without_repeats(message)
        reply = self.defer_reply()
        segments = self._stream.segment_count
        for start in range(0, len(payloads), MAX_ENTRIES_PER_CHUNK):
            last = start + MAX_ENTRIES_PER_CHUNK >= len(payloads)
            _first, self._last_record = self._stream.append(
                payloads[start : start + MAX_ENTRIES_PER_CHUNK],
                producer_sequences=producers if last else None,
            )
        self.counters["published"] += len(payloads)
        self.counters["repeats_dropped"] += taken - len(payloads)
        self._pending.append((reply, taken))
        if self._sync is None and self._syncer is not None:
            self._start_sync()  # early, so that the flush overlaps what comes next
        if self._stream.segment_count != segments:
            self._apply_retention()

    def _without_repeats(self, message: Publish) -> tuple[list[bytes], dict[str, int]]:
        """The payloads whose sequences are above the producer's last, and the trailer
        that records the new last; OutOfSequence for a gap."""
        producer, first = message.producer, message.sequence
        if producer is None or first is None or first > MAX_SEQUENCE - len(message.payloads):
            raise UnhandledMessage(
                "malformed Publish: producer and sequence go together, and the sequences "
                f"must stay within 0..{MAX_SEQUENCE}"
            )
        name = tracking_id(producer)
        last = self._stream.tracking().producers.get(name, -1)
        if first > last + 1:
            raise OutOfSequence(
                f"stream {self.stream_name}: producer {producer!r} sent sequence {first} "
                f"after {last}, the last this stream took from it; nothing was taken: send "
                f"again from {last + 1}"
            )
        fresh = message.payloads[last + 1 - first :]
        if not fresh:
            return [], {}
        return fresh, {name: first + len(message.payloads) - 1}

    def _attach(self, message: StreamAttach) -> dict[str, Any]:
        start: Start
        if message.start == "offset":
            start = message.value
        elif message.start == "timestamp":
            start = Timestamp(message.value)
        else:
            start = message.start  # type: ignore[assignment]  # checked on decode
        try:
            with StreamReader(self.directory, start, self._committed) as reader:
                offset = reader.next_offset
        except OffsetOutOfRange:
            raise OffsetOutOfRange(
                f"offset {message.value} is not in stream {self.stream_name!r}: it holds "
                f"offsets {self._stream.first_offset} to {self._committed} (and "
                f"{self._committed + 1} next)"
            ) from None
        return {
            "offset": offset,
            "first": self._stream.first_offset,
            "committed": self._committed,
            "directory": self.directory,
            "identity": self._stream.identity,
            "records_end": self._last_committed_record + 1,
        }

    def _plan(self, message: StreamPlan) -> dict[str, Any]:
        first, committed = self._stream.first_offset, self._committed
        self._check_range(message.start, message.end)
        return {
            "ranges": chunk_ranges(
                self.directory, message.start, message.end, message.target_bytes
            ),
            "first": first,
            "committed": committed,
            "identity": self._stream.identity,
        }

    def _chunks(self, message: StreamChunks) -> dict[str, Any]:
        self._check_range(message.offset, message.end)
        chunks: list[bytes] = []
        next_offset, size = message.offset, 0
        if message.offset < message.end:
            reader = self._reader_at(message.offset)
            try:
                while reader.next_offset < message.end and size < message.max_bytes:
                    raw = reader.read_raw_chunk()
                    if raw is None:
                        break
                    chunks.append(raw)
                    size += len(raw)
            except StreamError:
                reader.close()  # a chunk header is missing: the error goes to the asker
                raise
            next_offset = reader.next_offset
            self._keep_reader(reader)
            self.counters["chunks_read"] += len(chunks)
        return {
            "chunks": chunks,
            "next": next_offset,
            "first": self._stream.first_offset,
            "committed": self._committed,
            "identity": self._stream.identity,
        }

    def _check_range(self, start: int, end: int) -> None:
        first, committed = self._stream.first_offset, self._committed
        if not first <= start <= end <= committed + 1:
            raise OffsetOutOfRange(
                f"offsets {start} to {end - 1} are not in stream {self.stream_name!r}: it "
                f"holds offsets {first} to {committed}"
            )

    def _read(self, message: StreamRead) -> Any:
        if message.offset <= self._committed or message.wait_ms == 0:
            return self._records(message)
        waiting = _Waiting(message, self.defer_reply())
        self._waiting.append(waiting)
        self.call_later(message.wait_ms / 1000, lambda: self._answer_waiting(waiting))
        return None

    def _records(self, message: StreamRead) -> dict[str, Any]:
        records: list[list[Any]] = []
        next_offset = message.offset
        if message.max_records and message.offset <= self._committed:
            # retention may have deleted the offset since: read on from the new first, as a
            # reader of the files does (one kept open here does so too)
            reader = self._reader_at(max(message.offset, self._stream.first_offset))
            size = 0
            try:
                while len(records) < message.max_records and size < MAX_READ_BYTES:
                    chunk = reader.read_chunk()
                    if chunk is None:
                        break
                    records.extend([offset, ts, body] for offset, ts, body in chunk)
                    size += sum(len(body) for _, _, body in chunk)
            except StreamError:
                reader.close()  # it stays before the bad chunk: the error goes to the asker
                raise
            next_offset = reader.next_offset
            self._keep_reader(reader)
            self.counters["records_read"] += len(records)
        return {
            "records": records,
            "next": next_offset,
            "committed": self._committed,
            "first": self._stream.first_offset,
        }

    def _reader_at(self, offset: int) -> StreamReader:
        """A reader whose next offset is ``offset``: one an earlier read left there, or a
        new one."""
        reader = self._readers.pop(offset, None)
        if reader is None:
            reader = StreamReader(self.directory, offset, lambda: self._stream.committed_offset)
        return reader

    def _keep_reader(self, reader: StreamReader) -> None:
        """Keep ``reader`` for the read at its next offset: in place of one kept there
        (closed, as another reader left it at the same offset) or of the oldest."""
        replaced = self._readers.pop(reader.next_offset, None)
        if replaced is not None:
            replaced.close()
        elif len(self._readers) >= READERS_KEPT:
            oldest = next(iter(self._readers))
            self._readers.pop(oldest).close()
        self._readers[reader.next_offset] = reader

    def _store_offset(self, message: StoreOffset) -> None:
        if message.offset is not None and message.offset > self._committed:
            refusal = (
                f"offset {message.offset} is past the end of stream {self.stream_name!r} "
                f"(its last offset is {self._committed}): store the offset of a record "
                f"consumer {message.name!r} processed"
            )
            try:
                reply = self.defer_reply()
            except UnhandledMessage:  # a tell: dropped and logged, never stored
                raise UnhandledMessage(refusal) from None
            reply.fail(OffsetOutOfRange(refusal))
            return
        offset = FORGOTTEN_OFFSET if message.offset is None else message.offset
        self._stream.append_tracking(consumers={message.name: offset})
        self.counters["offsets_stored"] += 1

    def _query_offset(self, message: QueryOffset) -> int | None:
        offset = self._stream.tracking().consumers.get(message.name)
        return None if offset == FORGOTTEN_OFFSET else offset

    def _group_beat(self, message: GroupBeat) -> str:
        return self._groups.beat(message.group, message.member, message.release, message.leave)

    def _last_sequence(self, message: LastSequence) -> int | None:
        return self._stream.tracking().producers.get(tracking_id(message.producer))

    def _stats(self, message: QueueStats) -> dict[str, Any]:
        stream = self._stream
        segments = stream.segments()
        committed = self._committed
        offsets = {
            name: offset
            for name, offset in stream.tracking().consumers.items()
            if offset != FORGOTTEN_OFFSET
        }
        first = stream.first_offset
        records_end = self._last_committed_record + 1
        return {
            "name": self.stream_name,
            "type": "stream",
            "durable": True,
            "sync_policy": self.definition.sync_policy,
            "identity": stream.identity,
            "first_offset": stream.first_offset,
            "last_offset": stream.last_offset,
            "committed_offset": committed,
            "offsets": max(0, committed + 1 - first),  # tracking chunks' included
            "messages_ready": stream.user_records(first, committed + 1),
            "messages_unacked": 0,
            "consumers": len(offsets),
            "consumer_offsets": {
                name: {"offset": offset, "lag": stream.user_records(offset + 1, records_end)}
                for name, offset in sorted(offsets.items())
            },
            "producers": len(stream.tracking().producers),
            "consumer_groups": self._groups.groups(),
            "super_stream": self.definition.super_stream,
            "partition": self.definition.partition,
            "segments": len(segments),
            "bytes": sum(info.size_bytes for info in segments),
            **self.counters,
        }

    def _delete(self, message: DeleteQueue) -> int:
        count = self._stream.user_records(self._stream.first_offset, self._stream.last_offset + 1)
        for reply, _taken in self._take_pending():
            reply.fail(
                QueueClosed(f"stream {self.stream_name} was deleted before confirming this publish")
            )
        self._close_readers()
        self._stream.abandon()
        replicated_io.remove_tree(self.directory, ignore_errors=True)
        self._deleted = True
        return count

    _handlers: ClassVar[dict[type, Callable[[StreamActor, Any], Any]]] = {
        Publish: _publish,
        StreamAttach: _attach,
        StreamRead: _read,
        StreamPlan: _plan,
        StreamChunks: _chunks,
        StoreOffset: _store_offset,
        QueryOffset: _query_offset,
        LastSequence: _last_sequence,
        GroupBeat: _group_beat,
        QueueStats: _stats,
        DeleteQueue: _delete,
    }

    # ------------------------------------------------------------------ commits

    def _start_sync(self) -> None:
        """Begin a group commit of everything appended, unless one is running (the next
        starts when it ends) or nothing waits for one."""
        log = self._log
        if self._sync is not None or log is None or self._deleted:
            return
        if not self._pending and log.last_offset <= log.committed_offset:
            return
        pending, confirms = log.begin_sync(), self._pending
        self._pending = []
        if self._syncer is None:
            log.commit(pending.run())
            self._committed_through(self._last_record, confirms)
            return
        flushed = self._syncer.submit(pending.run)
        self._sync = _Sync(pending, confirms, self._last_record, flushed)
        flushed.add_done_callback(lambda _: self.call_soon_threadsafe(self._sync_ended))

    def _sync_ended(self) -> None:
        """Back on the actor's thread: commit what the sync covered (or crash with its
        error), then begin the next."""
        if self._sync is None or self._deleted or self._log is None:
            return
        self._commit(self._sync)
        self._start_sync()

    def _commit(self, sync: _Sync) -> None:
        self._sync = None
        self._stream.commit(sync.flushed.result())  # a failed flush raises here
        self._committed_through(sync.last_record, sync.confirms)

    def _take_pending(self) -> list[tuple[Any, int]]:
        """Every confirm not given yet, the running sync's included."""
        pending, self._pending = self._pending, []
        if self._sync is not None:
            pending[:0] = self._sync.confirms
            self._sync = None
        return pending

    def _committed_through(self, last_record: int, confirms: list[tuple[Any, int]]) -> None:
        self._last_committed_record = last_record
        self.counters["syncs"] += 1
        for reply, taken in confirms:
            reply.send(taken)
            self.counters["confirmed"] += taken
        if self._waiting:
            waiting, self._waiting = self._waiting, []
            for entry in waiting:
                if entry.request.offset <= self._committed:
                    self._answer_waiting(entry)
                elif not entry.answered:
                    self._waiting.append(entry)

    def _answer_waiting(self, waiting: _Waiting) -> None:
        if waiting.answered or self._log is None:
            return
        waiting.answered = True
        try:
            waiting.reply.send(self._records(waiting.request))
        except StreamError as error:
            waiting.reply.fail(error)

    # ------------------------------------------------------------------ retention

    def _apply_retention(self) -> None:
        definition = self.definition
        if definition.max_length_bytes is None and definition.max_age is None:
            return
        deleted = self._stream.apply_retention(definition.max_length_bytes, definition.max_age)
        self.counters["segments_deleted"] += len(deleted)

    def _retention_tick(self) -> None:
        if self._log is not None and not self._deleted:
            self._apply_retention()
        self.call_later(self.retention_check_s, self._retention_tick)

    def _close_readers(self) -> None:
        for reader in self._readers.values():
            reader.close()
        self._readers.clear()

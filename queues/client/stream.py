"""Reading a stream: ``StreamConsumer`` iterates over a stream's records from an offset,
without taking them away; ``StreamDelivery`` is one record.

Where a consumer starts (``Connection.consume(stream, offset=...)``): "first", "last"
(the last chunk), "next" (what is published from now on), an offset (exact; one the
stream no longer or not yet holds raises ``OffsetOutOfRange`` naming its range), a
``datetime`` or a ``Timestamp(epoch ms)`` (the first chunk written at or after it), or an
interval string like "1h" (that long ago). The stream's process resolves it
(``StreamAttach``).

How it reads (protocol in ``warren.queues.protocol``): a consumer on the node's machine
opens the stream's segment files itself (``StreamReader``) and asks the stream's process
only for the committed offset, with a long poll (``StreamRead`` of 0 records, answered
once something past what it read is committed); behind a tcp listener it asks the process
for whole chunks instead, up to ``prefetch`` records at a time (the credit: it holds no
more than that unread). Either way it never reads past the committed offset, so it never
sees an offset that was not confirmed.

A named consumer (``name="billing"``) stores the offset it has processed on the node:
every ``store_every`` records and every ``store_interval_s`` seconds (a record counts as
processed once the iteration asked for the next one), and when it is cancelled. It
resumes after that offset; ``offset`` applies only while none is stored
(``Connection.reset_offset`` forgets it). What it stores is at-least-once: a consumer
killed between two stores reads again what it processed after the last one.

A single active consumer (``single_active=True``, with a ``name``: its group) reads only
while the stream's process says it is its group's active member
(``warren.queues.broker.single_active``): it beats every ``MEMBER_BEAT_S``, from the call
that asks for the next record; made active, it starts after the group's stored offset
(``offset`` while none is); told to step down, it stores the offset of the last record
it handed out, drops what it read ahead, and releases its turn. A consumer over a super
stream shares one member id among its partitions (``warren.queues.client.super_stream``).

Races: the stream's process restarting while a consumer waits (its long poll dies with
it: asked again of the next incarnation; the files stay, so a local reader goes on where
it was); retention deleting the segment a reader is in (it keeps its open file) or the
one it needs next (it moves on to the new first chunk); retention deleting the stored
offset's segment before a named consumer resumes (it starts at the first offset).
"""

from __future__ import annotations

import collections
import datetime
import os
import secrets
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

from warren.actors import ActorError, ActorRef

from ..errors import InvalidArgument, Nacked, NotFound, OffsetOutOfRange, QueueRestarting
from ..message import Message, decode
from ..protocol import (
    MAX_WAIT_MS,
    MEMBER_BEAT_S,
    GroupBeat,
    StoreOffset,
    StreamAttach,
    StreamRead,
    Timestamp,
    parse_interval,
)

if TYPE_CHECKING:
    from ..engine.stream_log import StreamReader
    from .connection_consuming import ConsumingCalls

__all__ = ["StreamConsumer", "StreamDelivery", "Timestamp", "stream_start"]

STORE_EVERY = 1000  # records between a named consumer's stored offsets
STORE_INTERVAL_S = 5.0  # and seconds
COMMIT_POLL_MS = 200  # a long poll's wait: how long the connection is held by one ask
RESTART_WAIT_S = 60.0  # how long a reader waits for a restarting stream's successor
RESTART_POLL_S = 0.05


def stream_start(offset: object) -> tuple[str, int]:
    """A consumer's ``offset`` argument as ``StreamAttach(start, value)``; InvalidArgument for
    one that is none of the documented kinds."""
    if offset in ("first", "last", "next"):
        return str(offset), 0
    if isinstance(offset, Timestamp):
        return "timestamp", max(0, int(offset.ms))
    if isinstance(offset, datetime.datetime):
        return "timestamp", max(0, int(offset.timestamp() * 1000))
    if type(offset) is int:
        if offset < 0:
            raise InvalidArgument(f"a stream offset is an int >= 0, got {offset}")
        return "offset", offset
    if isinstance(offset, str):
        try:
            seconds = parse_interval(offset, "offset")
        except ValueError:
            pass
        else:
            return "timestamp", max(0, int((time.time() - seconds) * 1000))
    raise InvalidArgument(
        "offset is 'first', 'last', 'next', an offset (int >= 0), a datetime, a "
        f"Timestamp(epoch ms) or an interval like '1h' (that long ago); got {offset!r}"
    )


class Reading(Protocol):
    """A consumer of stream records that ``next_or_stop`` iterates over."""

    inactivity_timeout: float | None
    _closed: bool

    def _next_within(self, deadline: float | None) -> StreamDelivery | None: ...
    def cancel(self, processed_last: bool = True) -> None: ...


def next_or_stop(consumer: Reading) -> StreamDelivery:
    """A consumer's next record for its iteration, waiting at most its
    ``inactivity_timeout``; once that passed with none, it is cancelled and the
    iteration stops (``StopIteration``)."""
    deadline = None
    if consumer.inactivity_timeout is not None:
        deadline = time.monotonic() + consumer.inactivity_timeout
    delivery = consumer._next_within(deadline)
    if delivery is None:
        if not consumer._closed and consumer.inactivity_timeout is not None:
            consumer.cancel()
        raise StopIteration
    return delivery


class StreamDelivery:
    """One record of a stream: its ``offset``, ``timestamp_ms`` (when the stream wrote its
    chunk) and the message. Nothing to ack: reading takes nothing away."""

    __slots__ = ("stream", "offset", "timestamp_ms", "message", "body", "headers", "message_id")

    def __init__(self, stream: str, offset: int, timestamp_ms: int, message: Message) -> None:
        self.stream = stream
        self.offset = offset
        self.timestamp_ms = timestamp_ms
        self.message = message
        self.body = message.body
        self.headers = message.headers or {}
        self.message_id = message.message_id

    def __repr__(self) -> str:
        size = len(self.body)
        return f"StreamDelivery(stream={self.stream!r}, offset={self.offset}, {size} bytes)"


class StreamConsumer:
    """An iterator over a stream's records from a start; a context manager whose exit
    stores a named consumer's offset and closes its files. See the module docstring."""

    def __init__(
        self,
        connection: ConsumingCalls,
        stream: str,
        ref: Any,
        offset: object,
        *,
        name: str | None,
        prefetch: int,
        inactivity_timeout: float | None,
        store_every: int = STORE_EVERY,
        store_interval_s: float = STORE_INTERVAL_S,
        single_active: bool = False,
        member: str | None = None,
    ) -> None:
        if type(store_every) is not int or store_every < 1:
            raise InvalidArgument(f"store_every must be an int >= 1, got {store_every!r}")
        if single_active and name is None:
            raise InvalidArgument(
                "a single active consumer needs a name: the group whose members take turns"
            )
        self.connection = connection
        self.stream = stream
        self.name = name
        self.prefetch = prefetch
        self.inactivity_timeout = inactivity_timeout
        self.store_every = store_every
        self.store_interval_s = store_interval_s
        self._ready: collections.deque[tuple[int, int, bytes]] = collections.deque()
        self._handed = -1  # the offset of the last record handed to the application
        self._stored = -1  # the offset last stored for ``name``
        self._stored_at = time.monotonic()
        self._closed = False
        self._start = stream_start(offset)
        self._reader: StreamReader | None = None
        self._broken: OffsetOutOfRange | None = None  # why it cannot go on after a recovery
        self.single_active = bool(single_active)
        self.member = member or secrets.token_hex(8)  # its id in group ``name``
        self._active = not self.single_active  # reads now
        self._beat_due = 0.0
        self._next = self._committed = 0
        self._local = False
        if not self.single_active:
            self._open_after_stored(ref)
        self._first = self._next  # where it started: where it starts again, read nothing

    def _open_after_stored(self, ref: Any) -> None:
        """Open the reader after the offset stored for its name, else at its start."""
        start = self._start
        if self.name is not None:
            stored = self.connection.query_offset(self.stream, self.name)
            if stored is not None:
                self._stored = stored
                start = ("offset", stored + 1)
        self._open(ref, start, resuming=self.name is not None and self._stored >= 0)

    def _open(self, ref: Any, start: tuple[str, int], resuming: bool) -> None:
        attached = self._attach(start, resuming)
        self._next = attached["offset"]
        self._committed = attached["committed"]
        directory = attached["directory"]
        # On the node's machine: read the files; behind a listener: ask for the records.
        self._local = isinstance(ref, ActorRef) and os.path.isdir(directory)
        if self._local:
            # the engine's reader, loaded only by a process that reads a stream's files
            from ..engine.stream_log import StreamReader

            self._reader = StreamReader(directory, self._next, lambda: self._committed)

    def _recovered(self) -> None:
        """The connection recovered on a new node: attach there again, after the last
        record handed out (where it started, if none was), so that its offsets keep
        increasing; records read ahead and not handed out are read again. A named
        consumer stores its offset again at its next record: the node may have lost
        the last one it stored with the node's kill."""
        if self._closed:
            return
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        self._ready.clear()
        if self.single_active:  # the new node's stream knows no member: take turns anew
            self._active, self._beat_due = False, 0.0
            return
        try:
            self._attach_again()
        except NotFound as exc:
            if isinstance(exc, QueueRestarting):
                raise  # the node is still starting it: the recovery tries again
            # gone from the restarted node: the next read raises NotFound

    def _attach_again(self) -> None:
        if self.name is not None:
            stored = self.connection.query_offset(self.stream, self.name)
            self._stored = -1 if stored is None else stored
            self._stored_at = float("-inf")
        start = self._handed + 1 if self._handed >= 0 else self._first
        ref = self.connection._ref(self.stream)
        try:
            self._open(ref, ("offset", start), resuming=False)
        except OffsetOutOfRange as exc:
            self._open(ref, ("first", 0), resuming=False)
            if self._next < start:
                # Not retention (which moves it forwards): the restarted stream lost
                # its tail, which it may write again at these offsets; going back would
                # break its order. The next read says so; consume again to go on.
                self._broken = exc

    def _attach(self, start: tuple[str, int], resuming: bool) -> dict[str, Any]:
        try:
            return self.connection._request(self.stream, StreamAttach(*start))
        except OffsetOutOfRange:
            if not resuming:
                raise
            # retention removed what follows the stored offset: go on from the first
            return self.connection._request(self.stream, StreamAttach("first"))

    @property
    def next_offset(self) -> int:
        """The offset the next record read will have at the least."""
        return self._reader.next_offset if self._reader is not None else self._next

    def __iter__(self) -> Iterator[StreamDelivery]:
        return self

    def __next__(self) -> StreamDelivery:
        return next_or_stop(self)

    def get(self, timeout: float) -> StreamDelivery | None:
        """The next record, waiting up to ``timeout`` seconds (0: look once); None when
        none came or the consumer is cancelled."""
        return self._next_within(time.monotonic() + timeout)

    def _next_within(self, deadline: float | None) -> StreamDelivery | None:
        if self._broken is not None:
            raise self._broken
        if self._closed:
            return None
        stored = False  # the last record handed out counted as processed (stored if due)
        while not self._closed:
            # A single active consumer beats while it waits for records too: a member
            # silent for its lease would be replaced while it still reads.
            if self.single_active and not self._my_turn():
                wait = MEMBER_BEAT_S if deadline is None else deadline - time.monotonic()
                if wait <= 0:
                    return None
                time.sleep(min(wait, max(0.0, self._beat_due - time.monotonic())))
                continue
            if not stored:  # only once its turn is known: a member replaced stores nothing
                stored = True
                if self.name is not None and self._handed > self._stored:
                    self._maybe_store(self._handed)
            if self._ready:
                break
            left = None if deadline is None else deadline - time.monotonic()
            self._fill(left)
            if self._ready:
                break
            if deadline is not None and time.monotonic() >= deadline:
                return None
        if not self._ready or self._closed:
            return None
        offset, timestamp_ms, payload = self._ready.popleft()
        self._handed = offset
        return StreamDelivery(self.stream, offset, timestamp_ms, decode(payload))

    def _fill(self, left: float | None) -> None:
        """Read what is committed; when nothing is, wait (a long poll of at most ``left``
        seconds) for the next commit. An answer that comes after the connection
        recovered (the poll was asked again of the new node) is dropped: the consumer
        attached again meanwhile, from where it is now."""
        reader = self._reader
        session = self.connection.session
        if reader is not None:
            chunk = reader.read_chunk()
            if chunk is not None:
                self._ready.extend(chunk)
                return
            answer = self._poll(reader.next_offset, 0, left)
            if self.connection.session == session:
                self._committed = answer["committed"]
            return
        answer = self._poll(self._next, self.prefetch, left)
        if self.connection.session != session:
            return
        self._ready.extend((offset, ts, body) for offset, ts, body in answer["records"])
        self._committed, self._next = answer["committed"], answer["next"]

    def _poll(self, offset: int, records: int, left: float | None) -> dict[str, Any]:
        """Ask for what is committed from ``offset``; a stream between two incarnations
        (the old one dead, its successor not yet serving) is asked again until it
        answers, within ``left`` seconds (nothing new when they pass) or, waiting
        without a limit, ``RESTART_WAIT_S``."""
        wait_ms = COMMIT_POLL_MS if left is None else max(0, min(COMMIT_POLL_MS, int(left * 1000)))
        request = StreamRead(offset, records, min(wait_ms, MAX_WAIT_MS))
        give_up = time.monotonic() + (RESTART_WAIT_S if left is None else left)
        while True:
            try:
                return self.connection._request(self.stream, request)
            except (Nacked, QueueRestarting, ActorError):  # a poll changes nothing: ask again
                if time.monotonic() >= give_up:
                    if left is None:
                        raise
                    return {"records": [], "committed": self._committed, "next": offset}
                time.sleep(RESTART_POLL_S)

    @property
    def buffered(self) -> int:
        """Records read and not handed out yet (the next ``get`` takes one at once)."""
        return len(self._ready)

    def beat_if_due(self) -> None:
        """Keep a single active consumer's turn while records of other partitions are
        handed out (``warren.queues.client.super_stream``)."""
        if self.single_active and not self._closed:
            self._my_turn()

    def _my_turn(self) -> bool:
        """Whether this single active consumer reads now: its group's turn, asked every
        ``MEMBER_BEAT_S`` (see the module docstring)."""
        now = time.monotonic()
        if now < self._beat_due:
            return self._active
        self._beat_due = now + MEMBER_BEAT_S
        turn = self._beat()
        if turn == "active" and not self._active:
            self._stored = -1
            self._open_after_stored(self.connection._ref(self.stream))
            self._handed, self._stored_at = -1, time.monotonic()
            self._active = True
        elif turn == "step-down":  # still its turn: hand it on with the offset
            if self._active:
                self._stop_reading()
                self._store_now()
            self._beat(release=True)  # even if it stopped already (a recovery, a failure)
        elif turn != "active" and self._active:
            self._stop_reading()
        return self._active

    def _beat(self, release: bool = False, leave: bool = False) -> str:
        assert self.name is not None
        try:
            return str(
                self.connection._request(
                    self.stream, GroupBeat(self.name, self.member, release, leave)
                )
            )
        except (Nacked, QueueRestarting, ActorError):
            return "standby"  # the stream is restarting: it knows no member yet

    def _stop_reading(self) -> None:
        self._active = False
        self._ready.clear()
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def _store_now(self) -> None:
        """Store the offset of the last record handed out, answered (it is the group's
        before the turn passes)."""
        if self.name is not None and self._handed > self._stored:
            self.connection._request(self.stream, StoreOffset(self.name, self._handed))
            self._stored, self._stored_at = self._handed, time.monotonic()

    def _maybe_store(self, processed: int) -> None:
        due = processed - self._stored >= self.store_every or (
            time.monotonic() - self._stored_at >= self.store_interval_s
        )
        if due:
            self._store(processed)

    def _store(self, processed: int) -> None:
        assert self.name is not None
        self.connection._tell(self.stream, StoreOffset(self.name, processed))
        self._stored, self._stored_at = processed, time.monotonic()

    def cancel(self, processed_last: bool = True) -> None:
        """Stop reading; a named consumer stores the offset of the last record handed out
        (the one before it with ``processed_last=False``: the application failed on it)."""
        if self._closed:
            return
        self._closed = True
        self.connection._consumer_done(self)
        if self._reader is not None:
            self._reader.close()
        processed = self._handed if processed_last else self._handed - 1
        if self.single_active:
            # its turn asked first: a member replaced meanwhile stores nothing
            if self._active and self._beat() != "standby":
                self._handed = processed
                self._store_now()
            self._beat(leave=True)  # the next member takes over at once
        elif self.name is not None and processed > self._stored:
            self._store(processed)

    def __enter__(self) -> StreamConsumer:
        return self

    def __exit__(self, exc_type: object, *exc_info: object) -> None:
        self.cancel(processed_last=exc_type is None)

"""Publishing: what a ``Connection`` sends to queues and how it learns of confirms.

An ``OutgoingPublish`` is one ``Publish`` frame of encoded messages, to one or more
queues; ``publish_async`` fills one (its messages linger up to ``linger_s`` for more to
share the frame) and ``publish_many`` cuts batches into them (``read_ahead_chunks``,
``byte_batches``). Once sent, it waits in the connection's window of unconfirmed
publishes until each of its queues answered how many of its messages it took.
``Confirm`` and ``BatchConfirm`` are what a caller holds to wait for that. The flusher
thread (one per process) sends a lingering frame once it is ``linger_s`` old, for a
producer that stopped calling; at exit it sends what every connection still keeps.

A publish that was sent to a node that went away can be sent again whole
(``OutgoingPublish.resend``): it keeps its payloads, its producer and its sequence, so a
queue that took it before drops the repeat (``warren.queues.broker.dedup``).
"""

from __future__ import annotations

import atexit
import itertools
import logging
import os
import threading
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from warren.actors import ActorDeadError, ActorError, NotDelivered, RemoteError

from ..errors import InvalidArgument, Nacked, QueueError, local_error
from ..message import Message
from ..protocol import (
    MAX_PRODUCER_BYTES,
    MAX_SEQUENCE,
    REPLICATION_ALARM,
    Publish,
    QueueRef,
    QueueStats,
)
from .queue_refs import RESTART_CHECK_S, await_answer, sender
from .recovery import NodeLost

if TYPE_CHECKING:
    from .connection_core import ConnectionCore
    from .connection_publishing import PublishingCalls

__all__ = [
    "ASYNC_BATCH",
    "ASYNC_BATCH_BYTES",
    "BUSY_DOUBLINGS",
    "BUSY_RECHECK_S",
    "LINGER_S",
    "PUBLISH_BATCH",
    "PUBLISH_BATCH_BYTES",
    "STREAM_WINDOW_SHARE",
    "BatchConfirm",
    "Confirm",
    "OutgoingPublish",
    "byte_batches",
    "flusher",
    "new_message",
    "producer_bytes",
    "publish_stamp",
    "read_ahead_chunks",
]

log = logging.getLogger("warren.queues")

PUBLISH_BATCH = 500  # messages per Publish from publish_many, to a queue
# How many times a publish goes again to a queue's newer incarnation that never had it
NOT_DELIVERED_RESENDS = 3
# and to streams only: a Publish is one chunk of the stream, so a batch is kept whole up
# to a quarter of the connection's window (four share it) and a chunk's limit
STREAM_WINDOW_SHARE = 4
PUBLISH_BATCH_BYTES = 4 * 2**20
READ_AHEAD = 4096  # messages publish_many takes from its iterable at a time, at most
READ_AHEAD_STEP = 64  # and in steps of this many, stopping at PUBLISH_BATCH_BYTES
LINGER_S = 0.002  # how long publish_async's messages wait for more to share their frame
ASYNC_BATCH = 64  # publish_async's messages per frame, at most
ASYNC_BATCH_BYTES = 256 * 2**10
BUSY_RECHECK_S = 0.05  # the longest the flusher waits to look again at a busy connection
BUSY_DOUBLINGS = 8  # how many times that wait doubles from linger_s (reaching the above)
EXIT_FLUSH_WAIT_S = 1.0  # how long an exiting process waits for a busy connection to flush


class Confirm:
    """The confirm of one ``publish_async``: ``result(timeout)`` returns once every queue
    the message was routed to confirmed it, or raises ``Nacked``."""

    __slots__ = ("_connection", "_index", "_publish")

    def __init__(self, connection: PublishingCalls, publish: OutgoingPublish, index: int) -> None:
        self._connection = connection
        self._publish = publish
        self._index = index  # the message's place in its Publish

    def result(self, timeout: float | None = None) -> None:
        self._connection._await_publish(self._publish, self._index, timeout)

    def done(self) -> bool:
        try:
            self.result(timeout=0)
        except TimeoutError:
            return False
        except Nacked:
            pass
        return True


class BatchConfirm:
    """The confirm of one ``publish_many_async``: ``result(timeout)`` returns how many
    messages the batch held once every queue confirmed every one of them, or raises
    ``Nacked`` (the connection's ``call_timeout_s`` when no timeout is given)."""

    __slots__ = ("_connection", "_publishes", "count")

    def __init__(
        self, connection: PublishingCalls, publishes: list[OutgoingPublish], count: int
    ) -> None:
        self._connection = connection
        self._publishes = publishes
        self.count = count

    def result(self, timeout: float | None = None) -> int:
        wait = timeout if timeout is not None else self._connection.call_timeout_s
        deadline = time.monotonic() + wait
        for publish in self._publishes:
            self._connection._await_publish(publish, None, max(0.0, deadline - time.monotonic()))
        return self.count


class OutgoingPublish:
    """One ``Publish`` of a connection. ``publish_async`` fills it: its messages wait in
    the connection, at most ``linger_s``, for more to share their frame. It is then sent
    to each of its queues, on the channels of the thread that filled it (so that the
    flusher thread sending it keeps that thread's order), and awaited: each queue answers
    how many of its messages it took."""

    __slots__ = (
        "_answers",
        "_failed",
        "_message",
        "_sent",
        "awaited",
        "bytes",
        "channels",
        "expiration_ms",
        "lost",
        "payloads",
        "persistent",
        "producer",
        "queues",
        "sequence",
        "started",
    )

    def __init__(
        self,
        queues: list[str],
        refs: list[QueueRef],
        persistent: bool,
        expiration_ms: int | None,
        producer: bytes | None,
        sequence: int | None,
        awaited: bool = False,
    ) -> None:
        self.queues = queues
        self.awaited = awaited  # its caller waits for its confirm before sending more
        self.channels = [sender(ref) for ref in refs]
        self.persistent = persistent
        self.expiration_ms = expiration_ms
        self.producer = producer
        self.sequence = sequence  # the first message's, with a producer
        self.payloads: list[bytes] = []
        self.bytes = 0
        self.started = time.monotonic()
        self._sent: list[tuple[str, QueueRef, Any]] = []  # (queue, ref, future) per queue
        self._message: Publish | None = None  # the frame sent, for a queue that must have it again
        self._failed: list[tuple[str, int | Nacked]] = []  # the queues it could not reach
        self._answers: list[tuple[str, int | Nacked]] | None = None  # per queue, once known
        self.lost: NodeLost | None = None  # the node went away while it was being sent

    def takes(
        self,
        queues: list[str],
        persistent: bool,
        expiration_ms: int | None,
        producer: bytes | None,
        sequence: int | None,
    ) -> bool:
        """Whether a message so published can join this Publish's frame."""
        return (
            queues == self.queues
            and persistent == self.persistent
            and expiration_ms == self.expiration_ms
            and producer == self.producer
            and (self.sequence is None or sequence == self.sequence + len(self.payloads))
        )

    def send(self, connection: ConnectionCore) -> None:
        """Ask each queue; a queue it cannot reach gets its answer now, a ``Nacked``."""
        # One id per message for all its queues: the shared store keeps one copy of a
        # large message, with a reference per queue (a producer's messages have ids the
        # queues derive from their sequences).
        msg_ids = (
            [os.urandom(16) for _ in self.payloads]
            if len(self.queues) > 1 and self.producer is None
            else None
        )
        publish = Publish(
            self.payloads,
            self.persistent,
            msg_ids,
            self.expiration_ms,
            self.producer,
            self.sequence,
            self.awaited,
        )
        self._message = publish
        timeout = connection.call_timeout_s
        failed: list[tuple[str, int | Nacked]] = []
        for queue, channel in zip(self.queues, self.channels, strict=True):
            try:
                # the connection's ref now: after a recovery, the new node's queue
                ref = connection._ref(queue)
                try:
                    future = ref.ask_async(publish, timeout, _same_mailbox(ref, channel))
                except ActorDeadError:  # known dead already: ask the node again
                    connection._forget(queue)
                    ref = connection._ref(queue)
                    future = ref.ask_async(publish, timeout, _same_mailbox(ref, channel))
                self._sent.append((queue, ref, future))
            except (ActorError, QueueError, OSError) as exc:
                if connection._node_gone(exc):
                    self.lost = NodeLost(f"the node went away while publishing to {queue!r}")
                    return  # every queue is asked again once the connection recovered
                if isinstance(exc, ActorDeadError):
                    failed.append((queue, Nacked(f"queue {queue!r} is restarting; publish again")))
                else:
                    failed.append(
                        (queue, Nacked(f"the publish could not be sent to queue {queue!r}: {exc}"))
                    )
        self._failed = failed

    def fail(self, why: Nacked) -> None:
        """Answer it ``why`` at every queue, unsent (its node went away with it in doubt)."""
        self._sent, self._failed, self.lost = [], [], None
        self._answers = [(queue, why) for queue in self.queues]

    def resend(self, connection: ConnectionCore) -> None:
        """Send it again whole, to the queues of a connection that recovered: a queue
        that took it before confirms the repeat of its producer's sequences."""
        self._sent, self._failed, self._answers, self.lost = [], [], None, None
        self.send(connection)

    def answers(
        self, timeout: float | None, connection: PublishingCalls
    ) -> list[tuple[str, int | Nacked]]:
        """Per queue, how many of the messages it took, or why it took none. A queue
        whose process went away before it answered is in doubt (a ``Nacked``); one whose
        newer incarnation (a restart, or a queue declared again under the name) got the
        publish and took nothing of it (``NotDelivered``) has it sent there again. When
        the whole node went away, ``NodeLost`` (the publish is in doubt at every queue, to
        be sent again, not answered)."""
        if self._answers is not None:
            return self._answers
        if self.lost is not None:
            raise self.lost
        deadline = None if timeout is None else time.monotonic() + timeout
        answers: list[tuple[str, int | Nacked]] = []
        for index, (queue, _, _) in enumerate(self._sent):
            left = _left(deadline)
            try:
                answers.append((queue, self._answer_of(connection, index, left)))
            except TimeoutError:
                raise TimeoutError(
                    f"no confirm from queue {queue!r} within {timeout} s; it may still come"
                ) from None
            except ActorDeadError:
                lost = connection._queue_died(queue)
                if lost is not None:
                    raise lost from None
                answers.append(
                    (
                        queue,
                        Nacked(
                            f"queue {queue!r} restarted before confirming; the message is in "
                            f"doubt: publish it again"
                        ),
                    )
                )
            except RemoteError as exc:
                refused = local_error(exc.type_name, exc.message)  # OutOfSequence as itself
                if not isinstance(refused, Nacked):
                    refused = Nacked(f"queue {queue!r} refused the publish: {exc.message}")
                answers.append((queue, refused))
        self._answers = answers = answers + self._failed
        return answers

    def _answer_of(self, connection: PublishingCalls, index: int, timeout: float | None) -> Any:
        """The answer of the queue it was sent to ``index``-th; sent again, at most
        ``NOT_DELIVERED_RESENDS`` times a call, to the incarnation that answered
        ``NotDelivered`` (it never had it: no duplicate), and kept as sent there (a
        later call, after this one timed out, waits for that answer).
        A ``Nacked`` when the queue cannot be sent it again (deleted since, say), and
        when the node's ``REPLICATION_ALARM`` is raised while the answer is awaited (a
        cluster's leader short of in-sync copies: the commit waits until one catches
        up, the publish is in doubt until then)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        queue, ref, future = self._sent[index]
        channel = self.channels[self.queues.index(queue)]

        def unreplicated() -> None:
            if connection._short_of_copies():
                raise _Unreplicated

        resends = 0
        while True:
            try:
                try:
                    return await_answer(ref, future, _left(deadline), unreplicated)
                except NotDelivered:
                    raise
                except ActorDeadError:
                    return _answered_before_a_probe(connection, ref, future, channel)
                except TimeoutError:
                    unreplicated()  # a look that did not wait (a poll) looks here
                    raise
            except NotDelivered:
                lost = connection._queue_died(queue)  # the ref to the gone one forgotten
                if lost is not None:
                    raise lost from None
                resends += 1
                if resends > NOT_DELIVERED_RESENDS:
                    raise
            except _Unreplicated:
                return Nacked(
                    f"queue {queue!r}: the cluster's leader holds fewer in-sync copies "
                    f"than min_insync, so this publish is not confirmed (it may be kept "
                    f"once a follower catches up); publish it again once the node's "
                    f"{REPLICATION_ALARM} alarm clears (a producer id drops the repeat)"
                )
            assert self._message is not None, "sent before answered"
            try:
                ref = connection._ref(queue)
                future = ref.ask_async(
                    self._message, connection.call_timeout_s, _same_mailbox(ref, channel)
                )
                self._sent[index] = (queue, ref, future)
            except (ActorError, QueueError, OSError) as exc:
                if connection._node_gone(exc):
                    raise NodeLost(f"the node went away while publishing to {queue!r}") from None
                return Nacked(f"queue {queue!r} could not be sent the publish again: {exc}")

    @property
    def answered(self) -> bool:
        return self._answers is not None

    def refusal(self, index: int | None) -> Nacked | None:
        """Why message ``index`` (None: any of them) was not confirmed, once answered."""
        assert self._answers is not None, "answers() first"
        size = len(self.payloads)
        for queue, answer in self._answers:
            if isinstance(answer, Nacked):
                return answer
            if answer < size and (index is None or index >= answer):
                what = (
                    f"{size - answer} of {size} messages refused, the last ones"
                    if index is None
                    else "the message was refused"
                )
                return Nacked(
                    f"queue {queue!r} is full (max_length, overflow reject-publish): {what}; "
                    f"publish again later"
                )
        return None


def _answered_before_a_probe(
    connection: PublishingCalls, ref: QueueRef, future: Any, channel: Any
) -> Any:
    """The answer to a publish (``future``, sent on ``channel``) to an incarnation found
    gone: a probe sent on the same channel reaches what the publish reached, or the one
    after it at that address, and is answered after it. Once the probe is answered, the
    publish was too if anything took it up: the gone one's stop (``NotDelivered``), or
    the one there now (``NotDelivered``: it drops what was meant for its predecessor).
    ``ActorDeadError`` when it was not (the gone one took it: in doubt) or the probe
    finds no one within ``RESTART_CHECK_S``."""
    try:
        probe = ref.ask_async(QueueStats(), connection.call_timeout_s, _same_mailbox(ref, channel))
        probe.get(timeout=RESTART_CHECK_S)
    except NotDelivered:
        pass  # the one there now answered the probe, and before it the publish, if it came
    except (ActorError, TimeoutError):
        raise ActorDeadError(f"{ref.name} incarnation {ref.incarnation} is gone") from None
    try:
        return future.get(timeout=0)
    except TimeoutError:
        raise ActorDeadError(f"{ref.name} incarnation {ref.incarnation} is gone") from None


class _Unreplicated(Exception):
    """A wait for a confirm given up: the node's replication alarm is raised."""


def _left(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def new_message(
    body: bytes,
    message_id: str | None,
    headers: dict[str, Any] | None,
    expiration_ms: int | None,
    producer_id: str | bytes | None,
    persistent: bool,
) -> Message:
    """What ``publish`` and ``publish_async`` send: stamped now unless deduplicated."""
    return Message(
        body, message_id, headers, expiration_ms, publish_stamp(producer_id), None, bool(persistent)
    )


def publish_stamp(producer_id: str | bytes | None) -> int | None:
    """The publish timestamp a message gets: now, but none for a deduplicated one. Its
    shared-store id is derived from (producer, sequence), the same for every attempt, and
    the store keeps one copy per id: an attempt stamped a moment later would be other
    bytes under that id, and a queue taking the second attempt (a fanout whose first
    attempt reached only some queues) would read the first's bytes and find them failing
    its CRC."""
    return None if producer_id is not None else int(time.time() * 1000)


def producer_bytes(producer_id: str | bytes | None, sequence: int | None) -> bytes | None:
    """A producer id as the queues take it; ``InvalidArgument`` for a half-given or bad
    pair."""
    if producer_id is None and sequence is None:
        return None
    producer = producer_id.encode() if isinstance(producer_id, str) else producer_id
    if type(producer) is not bytes or not 0 < len(producer) <= MAX_PRODUCER_BYTES:
        raise InvalidArgument(
            f"producer_id must be a str or bytes of 1 to {MAX_PRODUCER_BYTES} "
            f"bytes, with a sequence; got {producer_id!r}"
        )
    if type(sequence) is not int or not 0 <= sequence <= MAX_SEQUENCE:
        raise InvalidArgument(
            f"sequence must be an int in 0..{MAX_SEQUENCE} with a producer_id "
            f"(the message's place in what that producer sends); got {sequence!r}"
        )
    return producer


def _same_mailbox(ref: QueueRef, channel: Any) -> Any:
    """``channel`` for the incarnation ``ref`` names, if it lives at the same address."""
    return (
        channel
        if channel is not None and channel.endpoint == getattr(ref, "address", None)
        else None
    )


class _Flusher:
    """The thread that sends a connection's lingering Publish once it is ``linger_s`` old,
    for a producer that stopped publishing without waiting for its confirms: one per
    process, started with the first Publish that lingers (and anew in a forked child)."""

    def __init__(self) -> None:
        self._pid = os.getpid()
        self._due: dict[ConnectionCore, float] = {}  # connection -> when to look at it
        self._changed = threading.Condition()
        threading.Thread(target=self._run, name="warren-flusher", daemon=True).start()
        atexit.register(self._flush_all)

    def _flush_all(self) -> None:
        """At exit: send what every connection still keeps, as a message handed to
        ZeroMQ goes out at exit (within the sockets' linger), so that a process that
        publishes and exits loses nothing it published. Not in a forked child, which
        inherits the registration but not the parent's connections."""
        if os.getpid() != self._pid:
            return
        with self._changed:
            connections = list(self._due)
            self._due.clear()
        for connection in connections:
            if connection._lock.acquire(timeout=EXIT_FLUSH_WAIT_S):
                try:
                    connection._flush()
                except Exception:
                    log.exception("sending a lingering publish at exit failed")
                finally:
                    connection._lock.release()

    def watch(self, connection: ConnectionCore, at: float) -> None:
        with self._changed:
            known = self._due.get(connection)
            if known is None or at < known:
                self._due[connection] = at
                self._changed.notify()

    def _run(self) -> None:
        while True:
            with self._changed:
                while True:
                    now = time.monotonic()
                    due = [c for c, at in self._due.items() if at <= now]
                    if due:
                        break
                    self._changed.wait(min(self._due.values()) - now if self._due else None)
                for connection in due:
                    del self._due[connection]
            for connection in due:
                try:
                    connection._flush_lingering()
                except Exception:  # a connection's failure is its Confirms'; never the thread's
                    log.exception("sending a lingering publish failed")


_the_flusher: tuple[int, _Flusher] | None = None
_flusher_lock = threading.Lock()


def flusher() -> _Flusher:
    global _the_flusher
    with _flusher_lock:
        if _the_flusher is None or _the_flusher[0] != os.getpid():
            _the_flusher = (os.getpid(), _Flusher())
        return _the_flusher[1]


def read_ahead_chunks(items: Iterable[Any]) -> Iterator[list[Any]]:
    """``items`` in lists of at most ``READ_AHEAD`` and about ``PUBLISH_BATCH_BYTES``
    (``READ_AHEAD_STEP`` at a time), taken as they are needed: a producer's generator is
    never read far ahead, in messages or in bytes."""
    items = iter(items)
    while True:
        chunk: list[Any] = []
        size = 0
        while len(chunk) < READ_AHEAD and size < PUBLISH_BATCH_BYTES:
            step = list(itertools.islice(items, READ_AHEAD_STEP))
            if not step:
                break
            chunk += step
            size += _size(step)
        if not chunk:
            return
        yield chunk


def _size(items: list[Any]) -> int:
    """The bytes of ``items``, bodies or ``Message``s (anything else counts nothing here:
    encoding it raises the error that names it)."""
    try:
        return sum(map(len, items))
    except TypeError:
        return sum(
            len(item.body) if isinstance(item, Message) else len(item)
            for item in items
            if isinstance(item, (bytes, bytearray, memoryview, Message))
        )


def byte_batches(sizes: list[int], most: int) -> Iterator[tuple[int, int]]:
    """(start, stop) of consecutive messages of ``sizes`` that share a Publish of at most
    ``most`` messages and ``PUBLISH_BATCH_BYTES`` (a larger message goes alone)."""
    if len(sizes) <= most and sum(sizes) <= PUBLISH_BATCH_BYTES:
        yield 0, len(sizes)
        return
    start, total = 0, 0
    for at, size in enumerate(sizes):
        if at > start and (total + size > PUBLISH_BATCH_BYTES or at - start == most):
            yield start, at
            start, total = at, 0
        total += size
    yield start, len(sizes)

"""The messages between a queue's clients (``warren.queues.client.connection``) and its process
(``warren.queues.broker.queue_actor``).

Every message is a frozen dataclass registered with the actor runtime's codec; a list of
encoded messages travels as one msgpack frame (bodies of 64 KiB or more as frames of
their own). ``consumer`` names a connection: the deliveries a connection holds unacked are
its own, and go back to the queue when it closes or its process dies.

    Publish(payloads, persistent, msg_ids, expiration_ms, producer, sequence, awaited)
                                       ask → the number taken, answered once every one
                                       of them is confirmed (fdatasync'd); fewer than sent
                                       when the queue is full (overflow reject-publish:
                                       the last ones are refused); ``expiration_ms`` is the
                                       messages' TTL;
                                       ``msg_ids`` (16 bytes each, or None) name the messages
                                       in the shared store: one id for a message routed to
                                       several queues, written there once;
                                       ``producer`` and ``sequence`` (the first message's;
                                       the others follow one by one) deduplicate: a repeat
                                       is confirmed, counted as taken, and not enqueued
                                       (``warren.queues.broker.dedup``); ``awaited``: the
                                       producer waits for this confirm before it sends
                                       more (``publish_many``), so the queue may write the
                                       batch ahead of its commit
    Fetch(consumer, pid, count, ack_required, wait_ms)
                                       ask → list[Delivered] (up to ``count``); an empty
                                       queue answers [] at once, or with ``wait_ms`` (a
                                       long poll) when messages come, within ``wait_ms``
                                       ([] then), or when the consumer stops (``Subscribe``
                                       inactive, ``Release``: [] too); it fails when the
                                       queue stops (``ActorDeadError``) or is deleted
                                       (``QueueClosed``)
    Settle(consumer, tags, action)     tell (or ask → the tags ignored); action "ack",
                                       "requeue" or "reject" (reject: drop); a tag the
                                       consumer does not hold is ignored and counted
    Subscribe(consumer, pid, active, prefetch)
                                       tell: a consumer of the connection starts (active)
                                       or stops; an auto-delete queue goes when its last
                                       one stops; ``prefetch``, the most deliveries it
                                       holds unacked (0: not said), is only shown
                                       (``QueueStats``'s ``consumer_details``)
    Release(consumer)                  tell: requeue what the consumer holds and end its
                                       subscriptions (it closed)
    Purge()                            ask → the number of messages purged
    QueueStats()                       ask → dict
    DeleteQueue()                      ask → the number of messages deleted; the queue then
                                       refuses everything until its process is stopped

A stream's process (``warren.queues.broker.stream_actor``) takes ``Publish``, ``QueueStats``
and ``DeleteQueue`` as a queue does (a Publish is one chunk of its log), and these, which
a queue refuses:

    StreamAttach(start, value)         ask → {"offset", "first", "committed", "directory",
                                       "identity", "records_end"}:
                                       where a reader starting at ``start`` ("first",
                                       "last", "next", "offset" with ``value``, or
                                       "timestamp" with ``value`` in epoch ms) begins;
                                       ``records_end`` is the offset after the last
                                       committed record (tracking chunks may follow it)
    StreamRead(offset, max_records, wait_ms)
                                       ask → {"records": [[offset, timestamp_ms, payload]],
                                       "next", "committed", "first"}: whole committed
                                       chunks from ``offset`` (at least one, up to
                                       ``max_records`` records when more chunks fit; 0
                                       asks for none) and the offset to ask for next,
                                       answered once ``offset`` is committed or after
                                       ``wait_ms``; from the first offset when retention
                                       deleted ``offset``; a reader that opens the files itself
                                       asks it with 0 records to learn the committed offset
    StoreOffset(name, offset)          tell (or ask → None): consumer ``name`` has
                                       processed up to ``offset`` (None: forget it)
    QueryOffset(name)                  ask → the offset stored for ``name``, or None
    LastSequence(producer)             ask → the last sequence taken from ``producer``,
                                       or None
    StreamPlan(start, end, target_bytes)
                                       ask → {"ranges": [[from, to]], "first",
                                       "committed", "identity"}: the committed offsets
                                       ``[start, end)`` cut on chunk boundaries into ranges
                                       of about ``target_bytes`` each (a Spark job's
                                       partitions); ``identity`` is the stream's random id
                                       (``StreamAttach`` answers it too), which changes when
                                       a stream is deleted and declared again
    StreamChunks(offset, end, max_bytes)
                                       ask → {"chunks": [bytes], "next", "first",
                                       "committed", "identity"}: committed user chunks as
                                       the segment holds them, from the one holding
                                       ``offset`` up to the one holding ``end - 1``, about
                                       ``max_bytes`` (at least one chunk); the reader checks
                                       their CRCs itself (``stream_log.check_chunk``);
                                       ``offset`` below the first raises ``OffsetOutOfRange``

The node's own calls (declarations, where a queue lives, the alarms) are declared once, in
``NodeHandle``: the ``Node`` in its own process implements them, its control socket and the
tcp listener accept exactly ``NODE_CALLS``, and both client transports (``ipc_node``,
``tcp_node``) inherit ``NodeCalls``, which carries each call of ``NodeHandle`` as one
``_call(op, **named arguments)``. A call added to ``NodeHandle`` is therefore a call of
every transport at once. An error raised by the node comes back through
``warren.queues.errors.local_error``, so a client sees the same class over ipc and tcp.
"""

from __future__ import annotations

import inspect
import math
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, NamedTuple, Protocol

from warren.actors import message
from warren.actors.codec import Check

from .errors import InvalidArgument
from .routing import SUPER_STREAM

SETTLE_ACTIONS = ("ack", "requeue", "reject")
MAX_PRODUCER_BYTES = 1024  # a deduplicating producer's id
MAX_SEQUENCE = 2**63 - 1  # a producer's sequence numbers: a signed 64-bit int
MAX_FETCH = 10_000  # messages one Fetch may take
# The alarm a cluster's leader raises while its ISR holds fewer nodes than min_insync:
# its commits wait, so a client nacks what it has in flight and holds new publishes.
REPLICATION_ALARM = "replication"

# Field types with the checks a queue applies on decode (warren.actors.codec); what one
# field cannot say alone (one msg_id per payload, a producer with its sequence) the queue
# process checks itself.
NonNegative = Annotated[int, Check(lambda v: v >= 0, "an int >= 0")]
# A message's expiry is the time it arrived plus its TTL, in an index slot's unsigned 64
# bits: a TTL below 2**63 ms (290 million years) always fits.
MAX_TTL_MS = 2**63 - 1
Ttl = Annotated[int, Check(lambda v: 0 <= v <= MAX_TTL_MS, f"an int in 0..{MAX_TTL_MS}")]
MsgIds = Annotated[list[bytes], Check(lambda v: all(len(m) == 16 for m in v), "16-byte ids")]
Producer = Annotated[
    bytes, Check(lambda v: 0 < len(v) <= MAX_PRODUCER_BYTES, f"1 to {MAX_PRODUCER_BYTES} bytes")
]
FetchCount = Annotated[int, Check(lambda v: 0 < v <= MAX_FETCH, f"an int in 1..{MAX_FETCH}")]
SettleAction = Annotated[str, Check(lambda v: v in SETTLE_ACTIONS, f"one of {SETTLE_ACTIONS}")]
STREAM_STARTS = ("first", "last", "next", "offset", "timestamp")
StreamStart = Annotated[str, Check(lambda v: v in STREAM_STARTS, f"one of {STREAM_STARTS}")]
MAX_READ_RECORDS = 100_000  # records one StreamRead may ask for
ReadCount = Annotated[
    int, Check(lambda v: 0 <= v <= MAX_READ_RECORDS, f"an int in 0..{MAX_READ_RECORDS}")
]
MAX_WAIT_MS = 60_000  # the longest a long poll (StreamRead, Fetch with wait_ms) is held
WaitMs = Annotated[int, Check(lambda v: 0 <= v <= MAX_WAIT_MS, f"an int in 0..{MAX_WAIT_MS}")]
MAX_TRACKING_NAME_BYTES = 255  # a stream's tracking ids (Osiris: a u8 length)


def _is_tracking_name(name: object) -> bool:
    if not isinstance(name, str):
        return False
    try:
        return 0 < len(name.encode()) <= MAX_TRACKING_NAME_BYTES
    except UnicodeEncodeError:  # a lone surrogate
        return False


def check_tracking_name(name: object) -> str:
    """A stream consumer's name: 1 to 255 bytes of UTF-8 (Osiris's tracking ids)."""
    if not _is_tracking_name(name):
        raise InvalidArgument(
            f"a stream consumer's name is 1 to {MAX_TRACKING_NAME_BYTES} bytes of UTF-8 "
            f"text; got {name!r}"
        )
    return name  # type: ignore[return-value]  # checked above


TrackingName = Annotated[
    str, Check(_is_tracking_name, f"1 to {MAX_TRACKING_NAME_BYTES} bytes of UTF-8")
]


@message
@dataclass(frozen=True)
class Publish:
    payloads: list[bytes]
    persistent: bool
    msg_ids: MsgIds | None = None
    expiration_ms: Ttl | None = None
    producer: Producer | None = None
    sequence: NonNegative | None = None
    awaited: bool = False


@message
@dataclass(frozen=True)
class Fetch:
    consumer: bytes
    pid: int
    count: FetchCount
    ack_required: bool
    wait_ms: WaitMs = 0


@message
@dataclass(frozen=True)
class Delivered:
    seq_id: int
    payload: bytes
    delivery_count: int
    served_ns: int = 0  # when the queue handed it out (CLOCK_MONOTONIC: the machine's)


@message
@dataclass(frozen=True)
class Settle:
    consumer: bytes
    tags: list[int]
    action: SettleAction


@message
@dataclass(frozen=True)
class Subscribe:
    """A consumer of connection ``consumer`` starts (``active``, asked: the answer is
    True when the queue has a single active consumer, whose turns go by ``serial``, the
    number the connection gave that consumer) or stops (told)."""

    consumer: bytes
    pid: int
    active: bool
    prefetch: NonNegative = 0
    serial: NonNegative = 0


@message
@dataclass(frozen=True)
class Release:
    consumer: bytes


@message
@dataclass(frozen=True)
class Purge:
    pass


@message
@dataclass(frozen=True)
class QueueStats:
    """``declare``: asked for a declare of the queue, which counts as a use of it (an
    ``expires_ms`` queue's clock starts again), as a look at its figures does not."""

    declare: bool = False


@message
@dataclass(frozen=True)
class DeleteQueue:
    pass


@message
@dataclass(frozen=True)
class StreamAttach:
    start: StreamStart
    value: NonNegative = 0


@message
@dataclass(frozen=True)
class StreamRead:
    offset: NonNegative
    max_records: ReadCount
    wait_ms: WaitMs = 0


@message
@dataclass(frozen=True)
class StoreOffset:
    name: TrackingName
    offset: NonNegative | None


@message
@dataclass(frozen=True)
class QueryOffset:
    name: TrackingName


@message
@dataclass(frozen=True)
class LastSequence:
    producer: Producer


MemberId = Annotated[str, Check(lambda v: 0 < len(v) <= 64, "1 to 64 characters")]
MEMBER_BEAT_S = 1.0  # how often a member of a consumer group beats (GroupBeat)
MEMBER_LEASE_S = 5.0  # how long its stream keeps a member unheard of


@message
@dataclass(frozen=True)
class GroupBeat:
    """A member of consumer group ``group`` on a stream is still there; ``release``: it
    stepped down (its offset is stored); ``leave``: it goes. Answered with its turn:
    ``warren.queues.broker.single_active``."""

    group: TrackingName
    member: MemberId
    release: bool = False
    leave: bool = False


MAX_PLAN_BYTES = 2**31  # the largest range a StreamPlan or StreamChunks may ask for
PlanBytes = Annotated[
    int, Check(lambda v: 0 < v <= MAX_PLAN_BYTES, f"an int in 1..{MAX_PLAN_BYTES}")
]


@message
@dataclass(frozen=True)
class StreamPlan:
    start: NonNegative
    end: NonNegative
    target_bytes: PlanBytes


@message
@dataclass(frozen=True)
class StreamChunks:
    offset: NonNegative
    end: NonNegative
    max_bytes: PlanBytes


STREAM_MESSAGES = (
    GroupBeat,
    StreamAttach,
    StreamRead,
    StoreOffset,
    QueryOffset,
    LastSequence,
    StreamPlan,
    StreamChunks,
)


class Timestamp(NamedTuple):
    """A stream reader's start: the first chunk whose timestamp is at or after ``ms``
    (milliseconds since the epoch)."""

    ms: int


OVERFLOWS = ("drop-head", "reject-publish")
QUEUE_TYPES = ("classic", "stream", "quorum")
DEAD_LETTER_STRATEGIES = ("at-most-once", "at-least-once")
SYNC_POLICIES = ("fsync", "flush")
STREAM_SEGMENT_BYTES = 500_000_000  # Osiris's default max_segment_size_bytes
MAX_STREAM_SEGMENT_BYTES = 2**32 - 1  # an index record holds a chunk's position in 32 bits
# A classic queue's arguments, with their defaults: a stream takes none of them.
CLASSIC_ARGUMENTS = {
    "lazy": False,
    "message_ttl_ms": None,
    "max_length": None,
    "overflow": "drop-head",
    "dead_letter_exchange": None,
    "dead_letter_routing_key": None,
    "auto_delete": False,
    "expires_ms": None,
    "consumer_timeout_ms": None,
}
STREAM_ARGUMENTS = ("max_length_bytes", "max_age", "max_segment_size_bytes", "sync_policy")
QUORUM_ARGUMENTS = ("delivery_limit", "dead_letter_strategy", "single_active_consumer")
_INTERVAL = re.compile(r"(\d+(?:\.\d+)?)(Y|M|D|h|m|s)")
_INTERVAL_SECONDS = {"Y": 365 * 86400, "M": 30 * 86400, "D": 86400, "h": 3600, "m": 60, "s": 1}


def parse_interval(value: object, what: str) -> float:
    """Seconds, from a positive number of seconds or a string like RabbitMQ's
    ``x-max-age``: a number and one unit of Y, M (30 days), D, h, m or s ("7D", "12h",
    "1.5h")."""
    if type(value) in (int, float) and 0 < value < math.inf:  # type: ignore[operator]
        return float(value)  # type: ignore[arg-type]
    if isinstance(value, str) and (found := _INTERVAL.fullmatch(value)) is not None:
        seconds = float(found[1]) * _INTERVAL_SECONDS[found[2]]
        if seconds > 0:
            return seconds
    raise InvalidArgument(
        f"{what} is a positive number of seconds or a string like '7D', '12h', '30m' "
        f"(units Y, M, D, h, m, s); got {value!r}"
    )


def interval_text(value: str) -> float | str:
    """An interval given as text (a command-line flag, a Spark option) as
    ``parse_interval`` takes it: a number of seconds where it is one ("30"), else the
    text as it is ("30s", "7D")."""
    try:
        return float(value)
    except ValueError:
        return value


MAX_NAME_BYTES = 255  # RabbitMQ's: a queue or exchange name is a shortstr
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def check_name(name: object, what: str = "queue") -> str:
    """A queue or exchange name: any UTF-8 text of 1 to 255 bytes, as RabbitMQ takes it,
    without control characters (a name is printed in tables, logs and process titles)."""
    if isinstance(name, str) and not _CONTROL.search(name):
        try:
            if 1 <= len(name.encode()) <= MAX_NAME_BYTES:
                return name
        except UnicodeEncodeError:
            pass  # a lone surrogate: not text that UTF-8 can hold
    raise InvalidArgument(
        f"a {what} name is 1 to {MAX_NAME_BYTES} bytes of UTF-8 text without control "
        f"characters; got {name!r}"
    )


def server_named_queue() -> str:
    """A new queue name for a declare of ``""``: ``amq.gen-`` and 128 random bits, as
    RabbitMQ names one (no two declares meet)."""
    return f"amq.gen-{secrets.token_urlsafe(16)}"


def check_routing_key(key: object, what: str = "routing key") -> str:
    """A routing key: UTF-8 text of at most 255 bytes (an AMQP short string; empty is
    one)."""
    if isinstance(key, str):
        try:
            if len(key.encode()) <= MAX_NAME_BYTES:
                return key
        except UnicodeEncodeError:
            pass  # a lone surrogate: not text that UTF-8 can hold
    raise InvalidArgument(f"a {what} is UTF-8 text of at most {MAX_NAME_BYTES} bytes; got {key!r}")


@dataclass(frozen=True)
class QueueDefinition:
    """A queue's arguments. ``message_ttl_ms``: how long a message may wait (None: for
    ever); ``max_length``: how many messages may wait, the oldest dropped beyond it
    (``overflow="drop-head"``) or new ones refused (``"reject-publish"``);
    ``dead_letter_exchange``: where expired, rejected and dropped messages go (``""``: the
    default exchange, to the queue their key names), routed with
    ``dead_letter_routing_key`` (None: each with its own routing key, RabbitMQ's
    ``x-dead-letter-routing-key``);
    ``auto_delete``: the queue deletes itself when its last consumer stops;
    ``expires_ms``: it deletes itself once unused that long (no consumer, no get, no
    declare: RabbitMQ's ``x-expires``); ``consumer_timeout_ms``: how long an AMQP client
    may hold one of its deliveries unacked before the port closes that channel (406, as
    RabbitMQ's ``x-consumer-timeout``; None, the default: no limit).

    ``type="stream"`` makes an append-only log instead (``warren.queues.engine.stream_log``),
    always durable, which takes none of the arguments above but these:
    ``max_length_bytes`` and ``max_age`` (seconds, or a string like "7D", "12h"; kept as
    seconds) for retention, ``max_segment_size_bytes`` (500 MB) for rollover, and
    ``sync_policy``: "fsync" (a chunk is fdatasync'd before its confirm) or "flush" (the
    page cache, RabbitMQ's own stream policy: confirmed messages survive the process's
    death, not the machine's).

    ``type="quorum"`` makes a quorum queue (``warren.queues.engine.quorum_queue``): always
    durable, never lazy nor auto-delete (RabbitMQ refuses both), taking a classic queue's
    other arguments and its own: ``delivery_limit`` (a message returned more often than
    this is dead-lettered, or dropped without a dead-letter exchange; None: no limit),
    ``dead_letter_strategy`` ("at-most-once", the default, or "at-least-once") and
    ``single_active_consumer`` (one consumer at a time gets deliveries; the next in
    line when it goes).

    The one statement of what a queue takes: ``Connection.declare_queue`` checks its
    arguments against it before sending, ``Node.declare_queue`` builds it, the definitions
    file stores it, and the queue's process is started with it whole."""

    name: str
    durable: bool = True
    lazy: bool = False
    message_ttl_ms: int | None = None
    max_length: int | None = None
    overflow: str = "drop-head"
    dead_letter_exchange: str | None = None
    dead_letter_routing_key: str | None = None
    auto_delete: bool = False
    expires_ms: int | None = None
    consumer_timeout_ms: int | None = None
    type: str = "classic"
    max_length_bytes: int | None = None
    max_age: float | None = None
    max_segment_size_bytes: int | None = None
    sync_policy: str | None = None
    # a partition of a super stream: its name and index (set by the node's declare of the
    # super stream, ``super_stream_partitions``; never an application's to give)
    super_stream: str | None = None
    partition: int | None = None
    delivery_limit: int | None = None
    dead_letter_strategy: str | None = None
    single_active_consumer: bool = False

    def __post_init__(self) -> None:
        check_name(self.name)
        for flag in ("durable", "lazy", "auto_delete"):  # as a JSON peer may send them
            object.__setattr__(self, flag, bool(getattr(self, flag)))
        for field in ("message_ttl_ms", "max_length"):
            value = getattr(self, field)
            if value is not None and (type(value) is not int or value < 0):
                raise InvalidArgument(f"{field} must be None or an int >= 0, got {value!r}")
        for field in ("expires_ms", "consumer_timeout_ms"):
            value = getattr(self, field)
            if value is not None and (type(value) is not int or not 0 < value <= MAX_TTL_MS):
                raise InvalidArgument(
                    f"{field} must be None or an int in 1..{MAX_TTL_MS}, got {value!r}"
                )
        if self.message_ttl_ms is not None and self.message_ttl_ms > MAX_TTL_MS:
            raise InvalidArgument(
                f"message_ttl_ms must be at most {MAX_TTL_MS}, got {self.message_ttl_ms}"
            )
        if self.overflow not in OVERFLOWS:
            raise InvalidArgument(f"overflow must be one of {OVERFLOWS}, got {self.overflow!r}")
        if self.dead_letter_exchange:  # "": the default exchange, to the key's queue
            check_name(self.dead_letter_exchange, "dead-letter exchange")
        if self.dead_letter_routing_key is not None:
            check_routing_key(self.dead_letter_routing_key, "dead-letter routing key")
            if self.dead_letter_exchange is None:
                raise InvalidArgument(
                    "a dead-letter routing key needs a dead-letter exchange too, as RabbitMQ's "
                    "x-dead-letter-routing-key needs x-dead-letter-exchange"
                )
        if self.type not in QUEUE_TYPES:
            raise InvalidArgument(f"type must be one of {QUEUE_TYPES}, got {self.type!r}")
        if (self.super_stream is None) != (self.partition is None) or (
            self.partition is not None
            and (self.type != "stream" or type(self.partition) is not int or self.partition < 0)
        ):
            raise InvalidArgument(
                f"queue {self.name!r}: a partition of a super stream is a stream with a "
                f"super_stream name and a partition index >= 0, made by declaring the "
                f"super stream (type='super-stream')"
            )
        if self.type == "stream":
            self._check_stream()
            return
        if self.type == "quorum":
            self._check_quorum()
        elif (
            self.delivery_limit is not None
            or self.dead_letter_strategy is not None
            or (self.single_active_consumer)
        ):
            raise InvalidArgument(
                f"{', '.join(QUORUM_ARGUMENTS)}: quorum queue arguments; declare the queue "
                f"with type='quorum' to use them"
            )
        given = [field for field in STREAM_ARGUMENTS if getattr(self, field) is not None]
        if given:
            raise InvalidArgument(
                f"{', '.join(given)}: stream arguments; declare the queue with type='stream' "
                f"to use them"
            )

    @property
    def is_stream(self) -> bool:
        return self.type == "stream"

    def _check_quorum(self) -> None:
        refused = [
            f"{flag}={getattr(self, flag)!r}"
            for flag, refused in (("durable", False), ("lazy", True), ("auto_delete", True))
            if getattr(self, flag) == refused
        ]
        if refused:
            raise InvalidArgument(
                f"a quorum queue takes no {', '.join(refused)}: it is always durable, keeps "
                f"its log on disk and its bodies in RAM, and is never auto-delete (RabbitMQ "
                f"refuses the same)"
            )
        limit = self.delivery_limit
        if limit is not None and (type(limit) is not int or limit < 0):
            raise InvalidArgument(f"delivery_limit must be None or an int >= 0, got {limit!r}")
        if self.dead_letter_strategy is None:
            object.__setattr__(self, "dead_letter_strategy", "at-most-once")
        elif self.dead_letter_strategy not in DEAD_LETTER_STRATEGIES:
            raise InvalidArgument(
                f"dead_letter_strategy must be one of {DEAD_LETTER_STRATEGIES}, got "
                f"{self.dead_letter_strategy!r}"
            )
        object.__setattr__(self, "single_active_consumer", bool(self.single_active_consumer))

    @property
    def deletes_itself(self) -> bool:
        """Whether the queue may delete itself (``auto_delete``, ``expires_ms``): its
        process then ends for good, and its tombstone means a decided delete."""
        return self.auto_delete or self.expires_ms is not None

    def _check_stream(self) -> None:
        given = [
            f"{k}={getattr(self, k)!r}"
            for k, v in CLASSIC_ARGUMENTS.items()
            if getattr(self, k) != v
        ]
        if self.delivery_limit is not None or self.dead_letter_strategy is not None:
            given.append("delivery_limit/dead_letter_strategy")
        if self.single_active_consumer:
            given.append("single_active_consumer=True")
        if given:
            raise InvalidArgument(
                f"a stream takes no {', '.join(given)}: those are other queues' arguments "
                f"(a stream keeps its messages by max_length_bytes and max_age; its single "
                f"active consumer is the consumer's, StreamConsumer(single_active=True))"
            )
        if not self.durable:
            raise InvalidArgument("a stream is always durable; declare it without durable=False")
        if self.max_length_bytes is not None and (
            type(self.max_length_bytes) is not int or self.max_length_bytes < 1
        ):
            raise InvalidArgument(
                f"max_length_bytes must be None or an int >= 1, got {self.max_length_bytes!r}"
            )
        if self.max_age is not None:
            object.__setattr__(self, "max_age", parse_interval(self.max_age, "max_age"))
        segment = self.max_segment_size_bytes
        if segment is None:
            object.__setattr__(self, "max_segment_size_bytes", STREAM_SEGMENT_BYTES)
        elif type(segment) is not int or not 0 < segment <= MAX_STREAM_SEGMENT_BYTES:
            raise InvalidArgument(
                f"max_segment_size_bytes must be an int in 1..{MAX_STREAM_SEGMENT_BYTES}, "
                f"got {segment!r}"
            )
        if self.sync_policy is None:
            object.__setattr__(self, "sync_policy", "fsync")
        elif self.sync_policy not in SYNC_POLICIES:
            raise InvalidArgument(
                f"sync_policy must be one of {SYNC_POLICIES}, got {self.sync_policy!r}"
            )


SUPER_STREAM_TYPE = SUPER_STREAM  # declare_queue(name, type=...): partitioned streams
MAX_PARTITIONS = 256  # partitions a super stream may have


def declared_queue(name: str, arguments: dict[str, Any]) -> QueueDefinition:
    """The queue an application's ``declare_queue(name, **arguments)`` makes; the arguments
    only a super stream's declare takes or makes are ``InvalidArgument``, not a queue's."""
    if "partitions" in arguments:
        raise InvalidArgument("partitions is a super stream's: declare it with type='super-stream'")
    if "super_stream" in arguments or "partition" in arguments:
        raise InvalidArgument(
            "super_stream and partition are a super stream's partitions' own: declare "
            "the super stream (type='super-stream', partitions=N) and it makes them"
        )
    return QueueDefinition(name, **arguments)


def super_stream_partitions(name: str, arguments: dict[str, Any]) -> list[QueueDefinition]:
    """The partition streams ``name-0`` .. ``name-(N-1)`` of super stream ``name``
    declared with ``arguments``: ``partitions=N`` and a stream's arguments, which every
    partition takes (retention, segment size and sync policy are each partition's own).
    ``InvalidArgument`` for a bad count or argument, before anything is made."""
    arguments = dict(arguments)
    arguments.pop("type", None)
    partitions = arguments.pop("partitions", None)
    if type(partitions) is not int or not 1 <= partitions <= MAX_PARTITIONS:
        raise InvalidArgument(
            f"a super stream takes partitions=N, an int in 1..{MAX_PARTITIONS}; got {partitions!r}"
        )
    if "super_stream" in arguments or "partition" in arguments:
        raise InvalidArgument("a super stream names and numbers its partitions itself")
    check_name(name, "super stream")
    return [
        QueueDefinition(
            check_name(f"{name}-{index}", "super stream's partition"),
            type="stream",
            super_stream=name,
            partition=index,
            **arguments,
        )
        for index in range(partitions)
    ]


STREAM_ACTOR_PREFIX = "stream "  # a stream's actor name, and title: "warren: stream events"
MAX_ENTRIES_PER_CHUNK = 0xFFFF  # records in one stream chunk (its header's u16 entry count)


class QueueRef(Protocol):
    """What a client holds for one incarnation of a queue's process: an ``ActorRef`` on
    this machine, a ``RemoteQueue`` through a tcp listener."""

    @property
    def name(self) -> str: ...
    @property
    def incarnation(self) -> int: ...
    def pin(self) -> QueueRef: ...
    def ask_async(self, message: Any, timeout: float | None = None, channel: Any = None) -> Any: ...
    def tell(self, message: Any, timeout: float | None = None, channel: Any = None) -> None: ...


class NodeHandle(Protocol):
    """The node's calls, as every client makes them: the one declaration of what a node
    answers besides the queues' own messages."""

    def declare_queue(
        self, name: str, *, passive: bool = False, **arguments: Any
    ) -> dict[str, Any]: ...
    def delete_queue(self, name: str) -> int: ...
    def declare_exchange(
        self,
        name: str,
        *,
        kind: str = "direct",
        durable: bool = True,
        auto_delete: bool = False,
        internal: bool = False,
        alternate_exchange: str = "",
    ) -> None: ...
    def bind_queue(self, queue: str, exchange: str, routing_key: str = "") -> None: ...
    def unbind_queue(self, queue: str, exchange: str, routing_key: str = "") -> None: ...
    def delete_exchange(self, name: str) -> None: ...
    def list_exchanges(self) -> list[dict[str, Any]]: ...
    def list_bindings(self) -> list[dict[str, str]]: ...
    def exchange(self, name: str) -> dict[str, Any]: ...
    def queue(self, name: str) -> QueueRef: ...
    def queue_state(self, name: str) -> str: ...
    def list_queues(self) -> list[str]: ...
    def active_alarms(self) -> list[str]: ...


_SIGNATURES = {
    name: inspect.signature(member)
    for name, member in vars(NodeHandle).items()
    if not name.startswith("_") and callable(member)
}
NODE_CALLS = frozenset(_SIGNATURES)


class NodeCalls:
    """``NodeHandle`` for a node in another process: each call is bound to its declared
    signature (a wrong argument raises TypeError here, before anything is sent) and
    carried as ``_call(op, **named arguments)``, which a transport defines. A transport
    may answer a call itself by defining the method (``queue`` returns its own kind of
    ref; ``active_alarms`` over ipc reads the alarms file)."""

    def _call(self, op: str, **args: Any) -> Any:
        raise NotImplementedError

    def __getattr__(self, op: str) -> Callable[..., Any]:
        signature = _SIGNATURES.get(op)
        if signature is None:
            raise AttributeError(f"{type(self).__name__!r} has no attribute {op!r}")

        def call(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(self, *args, **kwargs)
            bound.apply_defaults()
            named = {k: v for k, v in bound.arguments.items() if k != "self"}
            named.update(named.pop("arguments", {}))
            return self._call(op, **named)

        call.__name__ = op
        return call

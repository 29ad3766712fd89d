"""Spark reading Warren streams: the reading half of the ``warren`` data source
(``warren.queues.client.spark`` registers both halves under one name; the options
both share are ``spark_options``'s).

    spark.read.format("warren").option("endpoint", "tcp://broker:5673")
        .option("stream", "events").option("startingOffsets", "first").load()
    spark.readStream.format("warren").option("endpoint", ...).option("stream", "events")
        .option("maxRecordsPerTrigger", 100000).load()

Columns (``SCHEMA``): ``offset`` (long), ``timestamp`` (when the stream wrote the record's
chunk), ``body`` (binary), ``routing_key`` (the ``x-routing-key`` header, RabbitMQ's name
for it in a stream: a stream keeps messages, not the key they were routed by),
``headers`` (map of string to string: other values as text), ``message_id``, and
``properties``, a struct of what the publisher set (null when it set none): its
``message_id``, ``correlation_id``, ``content_type``, ``content_encoding``,
``reply_to``, ``expiration`` (milliseconds, as text), ``timestamp``, ``priority``,
``type``, ``app_id`` and ``user_id``. A message published over AMQP (the node's AMQP
port) has them from its AMQP properties, its AMQP headers in ``headers`` and, without
an ``x-routing-key`` header, the key it was published with in ``routing_key``; one of
Warren's client, its message id and expiration (the client's own clock stamp is not a
property its publisher set: the ``timestamp`` column is when the stream wrote it).

Options: ``endpoint`` and ``stream`` (required), ``key_file`` or ``key`` (CURVE: see
``spark_options``), ``timeout_s`` (120: how long a node that is down is retried before
the read fails, naming the offsets it was reading), ``startingOffsets`` ("first", "last":
the last chunk, "latest": what is published from now on, an offset, or
``timestamp:<epoch ms>``; "first" for a batch read, "latest" for a streaming one; or,
as Kafka's, ``startingOffsetsByTimestamp`` with its strategy: ``_starting_by_timestamp``),
``endingOffsets`` (batch only: "latest", the default, is everything committed when the
read is planned; an offset, excluded; or ``timestamp:<ms>``), ``failOnDataLoss`` (true:
offsets retention deleted before they were read fail the query naming them; false: they
are skipped with a warning), ``partitionBytes`` (32 MiB: the size of one task's offset
range; each task costs Spark tens of milliseconds of its own, so fewer, larger ranges
read faster) with ``minPartitions`` (a hint: smaller ranges until there are that many),
and, streaming, ``maxRecordsPerTrigger``, ``maxBytesPerTrigger``,
``minOffsetsPerTrigger`` with ``maxTriggerDelay`` (``WarrenStreamReader._shaped``) and
``consumerName`` (the name the query's progress is stored under on the node, so
``warren streams`` shows its lag: "spark" unless given). Any other option is refused,
case aside (``spark_options.check_known``). A ``startingOffsets`` below the first offset
is data loss (``failOnDataLoss``); one past the stream's end is refused either way, never
read from the first.

Progress. Spark commits a micro-batch to the source (``commit``) only when it plans the
next one, so a query's last micro-batch would never be stored; but it asks for the next
(``latestOffset(start, ...)``) once the last one is done, and ends a
``trigger(availableNow=True)`` query only after that ask. The reader stores ``start``
there, so a query that read everything shows lag 0; a micro-batch that failed is never
stored (Spark asks for no next one). Spark does not stop the reader when a query ends
(its process is ended), so nothing can be left to a ``stop``.

How it reads. The driver resolves the offsets with the stream's process (``StreamAttach``)
and has it cut ``[start, end)`` into ranges on chunk boundaries (``StreamPlan``, from the
index files: no record is read to plan). Each task connects from its executor and asks
for its range's chunks as the segment files hold them (``StreamChunks``), checks each
chunk's CRC and framing itself (``stream_log.check_chunk``, then the entries: bytes
damaged anywhere between the disk and the task fail the task), and yields one Arrow batch
per answer. A chunk whose records are all messages without properties (what Spark's
writer and ``publish_many`` store) is never split into Python objects: numpy finds each
body's place in the chunk's bytes, exactly (``_plain_spans``), and Arrow copies the bodies
out in one call; any other chunk is decoded record by record (``decode``).

Offsets a streaming query keeps in its checkpoint are ``{"stream", "identity",
"offset"}``: the next offset to read, and the stream's random identity, which changes when
a stream is deleted and declared again under the same name (the query then fails rather
than read another stream's offsets as its own). Exactly once: a micro-batch is a fixed
offset range, read again whole if it is replayed, so with a sink that drops repeats
(Warren's, with its producer ids) each record is counted once.

PySpark 4.0 to 4.3: ``latestOffset(start, limit)`` takes the read limit Spark passes from
4.2 on (``maxRecordsPerTrigger`` is ``getDefaultReadLimit``); 4.0 and 4.1 call it with no
argument, and then every trigger reads all that is committed. ``SupportsTriggerAvailableNow``
(4.2+) pins the end at what is committed when the query starts, read in batches that keep
to the limit.

Races: retention deleting a range between the plan and the task (the task sees
``OffsetOutOfRange`` and fails or skips, as ``failOnDataLoss`` says); the node or the
stream restarting under a task (the same request is asked again, from a new connection,
until ``timeout_s`` passes without progress); a stream deleted and declared again while a
query runs (identity compared on every plan and every answer).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition

from ..engine.stream_log import SIMPLE_ENTRY_HEADER_BYTES
from ..errors import (
    InvalidArgument,
    NotFound,
    OffsetOutOfRange,
    QueueRestarting,
    WarrenReadError,
)
from ..message import Message, decode, encode
from ..protocol import (
    MAX_PLAN_BYTES,
    StreamAttach,
    StreamChunks,
    StreamPlan,
    interval_text,
    parse_interval,
)
from .spark_options import RETRY_PAUSE_S, Target, node_connection, retryable

try:
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )
except ImportError:  # PySpark 4.0 and 4.1: no read limits; every trigger reads all

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        """Stands in for the mixin PySpark 4.2 added."""

    ReadLimit = ReadAllAvailable = ReadMaxRows = None  # type: ignore[assignment, misc]
try:  # PySpark 4.3: a default limit that tells a "read everything" trigger from ours
    from pyspark.sql.streaming.datasource import ReadMaxBytes, ReadMinRows
except ImportError:
    ReadMaxBytes = ReadMinRows = None  # type: ignore[assignment, misc]

if TYPE_CHECKING:
    import pyarrow

    from .connection import Connection

__all__ = ["SCHEMA", "Source", "WarrenBatchReader", "WarrenStreamReader"]

log = logging.getLogger("warren.spark")

# The properties struct's fields: a publisher's AMQP properties, by their AMQP names
PROPERTY_FIELDS = (
    ("message_id", "string"),
    ("correlation_id", "string"),
    ("content_type", "string"),
    ("content_encoding", "string"),
    ("reply_to", "string"),
    ("expiration", "string"),
    ("timestamp", "timestamp"),
    ("priority", "int"),
    ("type", "string"),
    ("app_id", "string"),
    ("user_id", "string"),
)
SCHEMA = (
    "offset long, timestamp timestamp, body binary, routing_key string, "
    "headers map<string,string>, message_id string, properties struct<"
    + ", ".join(f"{name}: {kind}" for name, kind in PROPERTY_FIELDS)
    + ">"
)
ROUTING_KEY_HEADER = "x-routing-key"
DEFAULT_PARTITION_BYTES = 32 * 2**20
ANSWER_BYTES = 2 * 2**20  # chunks one StreamChunks answer carries: one Arrow batch
DEFAULT_CONSUMER_NAME = "spark"
# Streaming: the most a micro-batch waits for minOffsetsPerTrigger once some data is there
# (Kafka's source: 15 minutes), and the options that shape micro-batches beside
# maxRecordsPerTrigger.
DEFAULT_MAX_TRIGGER_DELAY_S = 15 * 60.0
TRIGGER_OPTIONS = ("maxBytesPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay")
T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Source:
    """A read's options, checked on the driver (picklable: it travels to the executors)."""

    endpoint: str
    stream: str
    key_file: str | None
    key: str | None = dataclasses.field(repr=False)  # a client's secret
    timeout_s: float
    starting: tuple[str, int]  # a StreamAttach (start, value)
    ending: tuple[str, int] | None  # None: what is committed at planning
    fail_on_data_loss: bool
    partition_bytes: int
    max_records_per_trigger: int | None
    consumer_name: str
    max_bytes_per_trigger: int | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_s: float = DEFAULT_MAX_TRIGGER_DELAY_S
    # startingOffsetsByTimestampStrategy: "error" or "latest" where a start was given by
    # startingOffsetsByTimestamp, None otherwise
    timestamp_strategy: str | None = None
    min_partitions: int | None = None  # a hint over partition_bytes (Kafka's minPartitions)

    @classmethod
    def from_options(cls, options: Any, streaming: bool) -> Source:
        target = Target.from_options(dict(options), reading=True)
        assert target.stream is not None, "a read names its stream"
        starting = _offset_option(
            options.get("startingOffsets", "latest" if streaming else "first"),
            "startingOffsets",
            ("first", "last", "latest"),
        )
        by_timestamp, strategy = _starting_by_timestamp(options, target.stream)
        if by_timestamp is not None:
            starting = ("timestamp", by_timestamp)
        ending = None
        if "endingOffsets" in options:
            if streaming:
                raise WarrenReadError("endingOffsets is for a batch read (spark.read) only")
            ending = _offset_option(options["endingOffsets"], "endingOffsets", ("latest",))
            if ending[0] == "next":
                ending = None
        flag = options.get("failOnDataLoss", "true").lower()
        if flag not in ("true", "false"):
            raise WarrenReadError(f"option failOnDataLoss is true or false, not {flag!r}")
        partition_bytes = _positive_int(  # a task's range is one plan request's at most
            options.get("partitionBytes", DEFAULT_PARTITION_BYTES), "partitionBytes", MAX_PLAN_BYTES
        )
        max_records = options.get("maxRecordsPerTrigger")
        for name in ("maxRecordsPerTrigger", *TRIGGER_OPTIONS):
            if options.get(name) is not None and not streaming:
                raise WarrenReadError(f"{name} is for a streaming read only")
        max_bytes, min_offsets, delay = (options.get(name) for name in TRIGGER_OPTIONS)
        if delay is not None and min_offsets is None:
            raise WarrenReadError(
                "maxTriggerDelay is how long a micro-batch waits for minOffsetsPerTrigger; "
                "give minOffsetsPerTrigger too"
            )
        try:
            delay_s = (
                DEFAULT_MAX_TRIGGER_DELAY_S
                if delay is None
                else parse_interval(interval_text(delay), "option maxTriggerDelay")
            )
        except InvalidArgument as exc:
            raise WarrenReadError(str(exc)) from None
        return cls(
            target.endpoint,
            target.stream,
            target.key_file,
            target.key,
            target.timeout_s,
            starting,
            ending,
            flag == "true",
            partition_bytes,
            None if max_records is None else _positive_int(max_records, "maxRecordsPerTrigger"),
            options.get("consumerName", DEFAULT_CONSUMER_NAME),
            None
            if max_bytes is None
            else _positive_int(max_bytes, "maxBytesPerTrigger", MAX_PLAN_BYTES),
            None if min_offsets is None else _positive_int(min_offsets, "minOffsetsPerTrigger"),
            delay_s,
            strategy,
            None
            if options.get("minPartitions") is None
            else _positive_int(options["minPartitions"], "minPartitions"),
        )


def _offset_option(value: object, name: str, words: Sequence[str]) -> tuple[str, int]:
    text = str(value).strip()
    if text in words:
        return {"latest": ("next", 0)}.get(text, (text, 0))
    if text.isdigit():
        return "offset", int(text)
    if text.startswith("timestamp:") and text[len("timestamp:") :].isdigit():
        return "timestamp", int(text[len("timestamp:") :])
    raise WarrenReadError(
        f"option {name} is {', '.join(repr(w) for w in words)}, an offset (an int >= 0) "
        f"or 'timestamp:<epoch ms>'; got {text!r}"
    )


def _starting_by_timestamp(options: Any, stream: str) -> tuple[int | None, str | None]:
    """Option startingOffsetsByTimestamp, Kafka's JSON (``{"events": 1700000000000}``, or
    ``{"events": {"0": ...}}``: a stream is one partition), as epoch ms, and its strategy
    (startingOffsetsByTimestampStrategy, "error" unless given); (None, None) without it."""
    text = options.get("startingOffsetsByTimestamp")
    strategy = options.get("startingOffsetsByTimestampStrategy")
    if text is None:
        if strategy is not None:
            raise WarrenReadError(
                "startingOffsetsByTimestampStrategy is for startingOffsetsByTimestamp; "
                "give that too"
            )
        return None, None
    if options.get("startingOffsets") is not None:
        raise WarrenReadError(
            "give startingOffsets or startingOffsetsByTimestamp, not both: they say where "
            "the read starts"
        )
    strategy = str(strategy or "error").lower()
    if strategy not in ("error", "latest"):
        raise WarrenReadError(
            f"option startingOffsetsByTimestampStrategy is error or latest, not {strategy!r}"
        )
    shape = (
        f'option startingOffsetsByTimestamp is JSON naming the stream read: {{"{stream}": '
        f"<epoch ms>}}"
    )
    try:
        given = json.loads(text)
    except ValueError:
        raise WarrenReadError(f"{shape}; got {text!r}") from None
    if not isinstance(given, dict) or set(given) != {stream}:
        raise WarrenReadError(f"{shape}; got {text!r}")
    value = given[stream]
    if isinstance(value, dict) and set(value) == {"0"}:  # Kafka's by partition: one here
        value = value["0"]
    if type(value) is not int or value < 0:
        raise WarrenReadError(f"{shape}; got {text!r}")
    return value, strategy


def _started(source: Source, begun: dict[str, Any], where: str) -> dict[str, Any]:
    """``begun``, where a read starts, unless startingOffsetsByTimestamp found no record
    at or after its timestamp and its strategy is "error" ("latest": the end)."""
    if source.timestamp_strategy == "error" and begun["offset"] >= begun["records_end"]:
        raise WarrenReadError(
            f"{where}: stream {source.stream!r} has no record at or after timestamp "
            f"{source.starting[1]} (startingOffsetsByTimestamp); set "
            f"startingOffsetsByTimestampStrategy=latest to start at its end instead"
        )
    return begun


def _positive_int(value: object, name: str, at_most: int | None = None) -> int:
    try:
        number = int(str(value))
    except ValueError:
        number = 0
    if number < 1 or (at_most is not None and number > at_most):
        bounds = ">= 1" if at_most is None else f"in 1..{at_most}"
        raise WarrenReadError(f"option {name} is an int {bounds}, not {value!r}")
    return number


class OffsetRange(InputPartition):
    """One task's offsets, ``[start, end)``, of the stream whose identity is given."""

    def __init__(self, start: int, end: int, identity: str) -> None:
        super().__init__((start, end))
        self.start, self.end, self.identity = start, end, identity


class NodeSession:
    """A connection to the node that asks again, from a new connection, what failed
    because the node or the stream was away, until ``timeout_s`` passes without an
    answer; the driver's and each task's own (never shared between processes)."""

    def __init__(self, source: Source) -> None:
        self.source = source
        self._connection: Connection | None = None

    def ask(self, request: Any, where: str) -> Any:
        return self.call(lambda connection: connection._request(self.source.stream, request), where)

    def call(self, action: Callable[[Connection], T], where: str) -> T:
        deadline = time.monotonic() + self.source.timeout_s
        pause = RETRY_PAUSE_S[0]
        while True:
            try:
                if self._connection is None:
                    self._connection = node_connection(
                        self.source.endpoint,
                        self.source.key_file,
                        self.source.key,
                        WarrenReadError,
                    )
                return action(self._connection)
            except Exception as exc:
                if isinstance(exc, NotFound) and not isinstance(exc, QueueRestarting):
                    raise WarrenReadError(
                        f"stream {self.source.stream!r} is not declared on {self.source.endpoint}"
                    ) from None
                if not retryable(exc) or time.monotonic() + pause > deadline:
                    raise
                log.warning("%s: %s; asking again in %.1f s", where, exc, pause)
                self.close()
                time.sleep(pause)
                pause = min(pause * 2, RETRY_PAUSE_S[1])

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None


def _attach(session: NodeSession, start: tuple[str, int], where: str) -> dict[str, Any]:
    source = session.source

    def attach(connection: Connection) -> dict[str, Any]:
        if not connection.is_stream(source.stream):
            raise WarrenReadError(
                f"{source.stream!r} is a classic queue, not a stream: Spark reads streams "
                f"(declare one with type='stream'); a queue's messages are consumed, not read"
            )
        return connection._request(source.stream, StreamAttach(*start))

    try:
        return session.call(attach, where)
    except OffsetOutOfRange as error:
        if start[0] != "offset":
            raise WarrenReadError(f"{where}: {error}") from None
        first = session.ask(StreamAttach("first"), where)
        if start[1] > first["committed"] + 1:  # not data loss: refused whatever the flag
            raise WarrenReadError(
                f"{where}: offset {start[1]} is past the end of stream {source.stream!r} (it "
                f"holds offsets {first['first']} to {first['committed']}): start at 'latest' "
                f"to read what is published from now on"
            ) from None
        if source.fail_on_data_loss:
            raise WarrenReadError(f"{where}: {error}") from None
        log.warning("%s: %s; starting at the first offset (failOnDataLoss=false)", where, error)
        return first


def _plan(
    session: NodeSession, start: int, end: int, identity: str, where: str
) -> list[OffsetRange]:
    """``[start, end)`` as tasks; offsets retention deleted fail the read or are skipped."""
    source = session.source
    if start >= end:
        return []
    try:
        answer = session.ask(StreamPlan(start, end, source.partition_bytes), where)
    except OffsetOutOfRange as error:
        first = session.ask(StreamAttach("first"), where)
        if start >= first["offset"]:  # past the stream's end (recovery cut it), not retention
            raise WarrenReadError(f"{where}: {error}") from None
        lost_to = min(first["offset"], end)
        _data_lost(source, start, lost_to, f"{where}: {error}")
        if lost_to >= end:
            return []
        answer = session.ask(StreamPlan(lost_to, end, source.partition_bytes), where)
    _check_identity(source, identity, answer["identity"], where)
    ranges = answer["ranges"]
    target = source.partition_bytes
    # minPartitions: smaller ranges until there are enough (a hint, as Kafka's: chunks are
    # not cut, so a few large ones may leave fewer)
    while source.min_partitions is not None and len(ranges) < source.min_partitions:
        if target <= 1:  # a range a chunk already
            break
        target //= 2  # at most some 30 asks, each a read of the index files alone
        try:
            ranges = session.ask(StreamPlan(ranges[0][0], end, target), where)["ranges"]
        except OffsetOutOfRange:  # retention moved meanwhile: the ranges found stand
            break
    return [OffsetRange(low, high, identity) for low, high in ranges]


def _data_lost(source: Source, start: int, end: int, why: str) -> None:
    message = (
        f"offsets {start} to {end - 1} of stream {source.stream!r} were deleted by "
        f"retention before they were read ({why})"
    )
    if source.fail_on_data_loss:
        raise WarrenReadError(f"{message}; set failOnDataLoss=false to skip them")
    log.warning("%s; skipped (failOnDataLoss=false)", message)


def _check_identity(source: Source, expected: str, found: str, where: str) -> None:
    if expected != found:
        raise WarrenReadError(
            f"{where}: stream {source.stream!r} is not the one these offsets are of (it was "
            f"deleted and declared again: identity {found}, the offsets' {expected}); start "
            f"the query again with a new checkpoint"
        )


def read_range(source: Source, partition: OffsetRange) -> Iterator[pyarrow.RecordBatch]:
    """A task: the records of ``partition``'s offsets as Arrow batches, every chunk's CRC
    checked here."""
    where = f"stream {source.stream!r}, offsets {partition.start} to {partition.end - 1}"
    session = NodeSession(source)
    offset = partition.start
    try:
        while offset < partition.end:
            try:
                answer = session.ask(
                    StreamChunks(offset, partition.end, ANSWER_BYTES), f"reading {where}"
                )
            except OffsetOutOfRange as error:
                first = session.ask(StreamAttach("first"), where)["offset"]
                _data_lost(source, offset, min(first, partition.end), str(error))
                offset = first
                continue
            except Exception as exc:
                raise WarrenReadError(
                    f"{where}: offsets from {offset} were not read: {type(exc).__name__}: {exc}"
                ) from None
            _check_identity(source, partition.identity, answer["identity"], where)
            if not answer["chunks"]:
                raise WarrenReadError(
                    f"{where}: the stream answered no chunk at offset {offset} (committed: "
                    f"{answer['committed']})"
                )
            batch = record_batch(answer["chunks"], offset, partition.end, where)
            if batch.num_rows:
                yield batch
            offset = answer["next"]
    finally:
        session.close()


def record_batch(chunks: Sequence[bytes], start: int, end: int, where: str) -> pyarrow.RecordBatch:
    """The records of ``chunks`` (whole chunks as they travelled, each checked here: its
    CRC, then its framing) whose offsets are in ``[start, end)``. A chunk whose records
    are all messages without properties has its bodies found by numpy and gathered by
    Arrow straight from its bytes (``_plain_spans``); any other is decoded record by
    record."""
    import numpy as np
    import pyarrow as pa

    from ..engine.stream_log import check_chunk, entry_bodies  # the format; no file opened

    offsets: list[Any] = []  # numpy arrays, one a chunk
    stamps: list[Any] = []
    bodies: list[Any] = []  # Arrow arrays, one a chunk
    properties: list[tuple[int, list | None]] = []  # (rows, [_Described] or None)
    for raw in chunks:
        header = check_chunk(raw, where)
        first = header.chunk_id
        low, high = max(0, start - first), min(header.record_count, end - first)
        spans = _plain_spans(raw, header)
        payloads = None
        if spans is None:  # its framing is checked, read or not
            data = raw[header.data_position : header.data_position + header.data_bytes]
            payloads = entry_bodies(header, data, f"{where} (chunk {first})")
        if low >= high:
            continue
        offsets.append(np.arange(first + low, first + high, dtype=np.int64))
        stamps.append(np.full(high - low, header.timestamp_ms * 1000, dtype=np.int64))
        if payloads is None:
            assert spans is not None
            bodies.append(_gather(raw, spans[0][low:high], spans[1][low:high]))
            properties.append((high - low, None))
        else:
            chunk_bodies, chunk_properties = _decoded(payloads[low:high])
            bodies.append(pa.array(chunk_bodies, pa.binary()))
            properties.append((high - low, chunk_properties))
    rows = sum(count for count, _ in properties)
    columns = [
        pa.array(np.concatenate(offsets) if offsets else [], pa.int64()),
        pa.array(np.concatenate(stamps) if stamps else [], pa.int64()).cast(
            pa.timestamp("us", tz="UTC")
        ),
        pa.concat_arrays([body.cast(pa.binary()) for body in bodies])
        if bodies
        else pa.array([], pa.binary()),
    ]
    types = [pa.string(), pa.map_(pa.string(), pa.string()), pa.string(), _properties_type()]
    if all(found is None for _, found in properties):
        columns += [pa.nulls(rows, kind) for kind in types]
    else:
        nothing = (None, None, None, None)
        listed = [
            values
            for count, found in properties
            for values in (found if found is not None else [nothing] * count)
        ]
        columns += [
            pa.array([values[i] for values in listed], kind) for i, kind in enumerate(types)
        ]
    return pa.RecordBatch.from_arrays(
        columns,
        names=["offset", "timestamp", "body", "routing_key", "headers", "message_id", "properties"],
    )


def _properties_type() -> Any:
    import pyarrow as pa

    kinds = {"string": pa.string(), "int": pa.int32(), "timestamp": pa.timestamp("us", tz="UTC")}
    return pa.struct([(name, kinds[kind]) for name, kind in PROPERTY_FIELDS])


# A record's routing key, headers (name, value as text), message id and properties
_Described = tuple[str | None, list[tuple[str, str | None]] | None, str | None, dict | None]


def _decoded(payloads: list[bytes]) -> tuple[list[bytes], list[_Described]]:
    """Each record's body and what describes it (``_Described``), record by record."""
    bodies: list[bytes] = []
    described: list[_Described] = []
    for payload in payloads:
        body = _plain_body(payload)
        if body is not None:
            bodies.append(body)
            described.append((None, None, None, None))
            continue
        message = decode(payload)
        bodies.append(message.body)
        headers = dict(message.headers or {})
        key: object = headers.get(ROUTING_KEY_HEADER)
        properties: dict[str, Any] = {
            "message_id": message.message_id,
            "content_type": message.content_type,
            "expiration": None if message.expiration_ms is None else str(message.expiration_ms),
        }
        if message.amqp is not None:
            published = _amqp_published(message.amqp)
            if published is not None:
                amqp_key, amqp_properties, amqp_headers = published
                key = amqp_key if key is None else key
                properties.update(amqp_properties)
                headers.update(amqp_headers)
        described.append(
            (
                None if key is None else _text(key),
                [(name, _text(value)) for name, value in headers.items()] if headers else None,
                properties["message_id"],
                properties if any(v is not None for v in properties.values()) else None,
            )
        )
    return bodies, described


def _amqp_published(amqp: bytes) -> tuple[str, dict[str, Any], dict[str, Any]] | None:
    """The routing key, properties (``PROPERTY_FIELDS``'s, those set) and headers of a
    message published over AMQP; None when its kept publish does not read."""
    from ..amqp.frames import AmqpError, read_properties  # pamqp, only where needed
    from ..amqp_envelope import split

    parts = split(amqp)
    if parts is None:
        return None
    _, routing_key, properties = parts
    names = tuple(name for name, _ in PROPERTY_FIELDS) + ("headers",)
    try:
        found = read_properties(properties, names)
    except AmqpError:
        return None
    headers = found.pop("headers") or {}
    return (
        routing_key[1:].decode("utf-8", "backslashreplace"),
        {name: value for name, value in found.items() if value is not None},
        headers,
    )


def _plain_spans(raw: bytes, header: Any) -> tuple[Any, Any] | None:
    """Where each record's body starts and ends in ``raw`` (numpy arrays), when every
    record of the chunk is one simple entry holding a message without properties (what
    Spark's writer and ``publish_many`` send); None otherwise, and the chunk is decoded
    record by record.

    Exact, not a guess: the candidates are the bytes where a message without properties
    starts (``_PLAIN_START``, then nil, nil, nil, a nil or uint64 timestamp, nil and a
    bool); they are kept only when they chain as the framing does (the first entry at the
    data's start, each entry ending where the next candidate's entry begins, the last at
    the data's end, as many as the header's records), which only the real entries do,
    and when each body's msgpack bin header gives the size its entry leaves for it. A
    body that happens to hold such bytes breaks the chain, and the chunk is decoded."""
    import numpy as np

    count = header.record_count
    if count == 0 or header.entry_count != count:  # sub-batches: decoded
        return None
    size = header.data_bytes
    data = np.frombuffer(raw, np.uint8, size, header.data_position)
    starts = np.flatnonzero(data == _PLAIN_START >> 32)
    if len(starts) < count:
        return None
    # the data and zeros after it, seen as the big-endian u64 (and u32) at every byte: a
    # read near the end sees zeros, which fail the checks below
    padded = np.zeros(size + 32, np.uint8)
    padded[:size] = data
    words = np.ndarray((size + 25,), ">u8", padded, 0, (1,))
    quads = np.ndarray((size + 29,), ">u4", padded, 0, (1,))
    starts = starts[starts >= SIMPLE_ENTRY_HEADER_BYTES]
    first = words[starts]
    kept = first >> 24 == _PLAIN_START
    starts, first = starts[kept], first[kept]
    if len(starts) != count:
        return None
    stamped = (first >> 16 & 0xFF == _UINT64) & (first >> 8 & 0x80 == 0)  # below 2**63
    if stamped.any():
        stamped &= words[starts + 8] & 0xFFFF | 1 == _NIL << 8 | _TRUE
    if not (stamped | (first & 0xFFFFFF | 1 == _NIL << 16 | _NIL << 8 | _TRUE)).all():
        return None
    ends = starts + quads[starts - SIMPLE_ENTRY_HEADER_BYTES].astype(np.int64)
    if (
        starts[0] != SIMPLE_ENTRY_HEADER_BYTES
        or ends[-1] != size
        or not np.array_equal(ends[:-1], starts[1:] - SIMPLE_ENTRY_HEADER_BYTES)
    ):
        return None
    markers = starts + np.where(stamped, 16, 8)  # the body's bin header
    head = words[markers]
    kind = head >> 56
    if (kind == 0xC4).all():  # bin 8, every one: the common case
        sizes = (head >> 48 & 0xFF).astype(np.int64)
        bodies = markers + 2
    else:
        width = np.where(kind == 0xC4, 1, np.where(kind == 0xC5, 2, np.where(kind == 0xC6, 4, 0)))
        if not width.all():
            return None
        bits = (8 * width).astype(np.uint64)
        sizes = (head >> (np.uint64(56) - bits) & (np.uint64(1) << bits) - np.uint64(1)).astype(
            np.int64
        )
        bodies = markers + 1 + width
    if not np.array_equal(bodies + sizes, ends):
        return None
    return bodies + header.data_position, ends + header.data_position


def _gather(raw: bytes, starts: Any, ends: Any) -> pyarrow.Array:
    """The bytes ``raw[starts[i]:ends[i]]`` of each i as one binary array: ``raw`` seen
    as the array (gap, body, gap, body, ...) whose odd values Arrow copies out."""
    import numpy as np
    import pyarrow as pa

    count = len(starts)
    large = len(raw) >= 2**31
    index = np.int64 if large else np.int32
    bounds = np.zeros(2 * count + 1, index)
    bounds[1::2] = starts
    bounds[2::2] = ends
    both = pa.Array.from_buffers(
        pa.large_binary() if large else pa.binary(),
        2 * count,
        [None, pa.py_buffer(bounds), pa.py_buffer(raw)],
    )
    return both.take(pa.array(np.arange(1, 2 * count, 2, dtype=index)))


# A message with a body and no property (what Spark's writer sends, persistent or not)
# encodes as one of these 8 bytes, then msgpack's bin 8, 16 or 32 header and the body.
_PLAIN_PREFIXES = frozenset(encode(Message(b"", persistent=p))[:8] for p in (True, False))
_BIN_HEADER_BYTES = {0xC4: 2, 0xC5: 3, 0xC6: 5}
# msgpack: an array of 8, the format version 1, then nil (message id), nil (headers),
# nil (expiration): how a message without properties starts, stamped or not (5 bytes)
_PLAIN_START = int.from_bytes(encode(Message(b"", timestamp_ms=0))[:5])
_NIL, _TRUE, _UINT64 = 0xC0, 0xC3, 0xCF


def _plain_body(payload: bytes) -> bytes | None:
    """The body of a message with no property, read without unpacking it (a third of
    ``decode``'s cost); None for any other message, or one whose length is wrong (which
    ``decode`` then refuses)."""
    if payload[:8] not in _PLAIN_PREFIXES or len(payload) < 10:
        return None
    header = _BIN_HEADER_BYTES.get(payload[8])
    if header is None or int.from_bytes(payload[9 : 8 + header]) != len(payload) - 8 - header:
        return None
    return payload[8 + header :]


def _text(value: object) -> str | None:
    """A header value as the map<string,string> column holds it."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    if isinstance(value, (bool, int, float)):
        return json.dumps(value)
    return json.dumps(value, default=_json_default)


def _json_default(value: object) -> str:
    """What a header value JSON has no type for becomes in its text: bytes decoded, an
    AMQP table's decimal or timestamp as Python writes it."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    return str(value)


class WarrenBatchReader(DataSourceReader):
    """``spark.read.format("warren")``: plans on the driver, reads on the executors."""

    def __init__(self, source: Source) -> None:
        self.source = source

    def partitions(self) -> Sequence[InputPartition]:
        source = self.source
        where = f"planning a read of stream {source.stream!r}"
        session = NodeSession(source)
        try:
            begun = _started(source, _attach(session, source.starting, where), where)
            identity, end = begun["identity"], begun["records_end"]
            if source.ending is not None:
                if source.ending[0] == "offset" and source.ending[1] > begun["committed"] + 1:
                    raise WarrenReadError(
                        f"{where}: endingOffsets {source.ending[1]} is past the stream's "
                        f"end (it holds offsets {begun['first']} to {begun['committed']})"
                    )
                end = _attach(session, source.ending, where)["offset"]
            # Spark reads a batch with no partition as one partition of its own making:
            # an empty range stands for "nothing to read" instead
            empty = [OffsetRange(begun["offset"], begun["offset"], identity)]
            return _plan(session, begun["offset"], end, identity, where) or empty
        finally:
            session.close()

    def read(self, partition: InputPartition) -> Iterator[pyarrow.RecordBatch]:
        assert isinstance(partition, OffsetRange)
        return read_range(self.source, partition)


class WarrenStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("warren")``; see the module docstring."""

    def __init__(self, source: Source) -> None:
        self.source = source
        self._session = NodeSession(source)
        self._available_now_end: int | None = None
        self._identity: str | None = None
        self._stored = 0  # the end whose offset before it is stored under consumerName
        # when a micro-batch was last let through (Kafka's source: never, at a start, so
        # the first is not held back by minOffsetsPerTrigger)
        self._last_batch_at = -math.inf

    def _offset(self, offset: int) -> dict[str, Any]:
        assert self._identity is not None
        return {"stream": self.source.stream, "identity": self._identity, "offset": offset}

    def _latest(self) -> int:
        answer = _attach(self._session, ("next", 0), f"reading stream {self.source.stream!r}")
        if self._identity is None:
            self._identity = answer["identity"]
        else:
            _check_identity(self.source, self._identity, answer["identity"], "the query")
        return int(answer["records_end"])

    def initialOffset(self) -> dict[str, Any]:
        where = f"starting a query on stream {self.source.stream!r}"
        begun = _started(self.source, _attach(self._session, self.source.starting, where), where)
        self._identity = begun["identity"]
        return self._offset(begun["offset"])

    def latestOffset(
        self, start: dict[str, Any] | None = None, limit: ReadLimit | None = None
    ) -> dict[str, Any]:
        if start is not None:
            self._take_identity(start)
        end = self._latest()
        if start is not None and self._stored < start["offset"] <= end:
            # Spark asks for the next micro-batch once the last one is done: stored now,
            # as the query may stop before it plans another (and commits this one)
            self._store(int(start["offset"]))
        if self._available_now_end is not None:
            end = min(end, self._available_now_end)
        if start is not None:
            end = max(self._shaped(int(start["offset"]), end, limit), start["offset"])
        return self._offset(end)

    def _shaped(self, start: int, end: int, limit: ReadLimit | None) -> int:
        """The end of the micro-batch from ``start`` with ``[start, end)`` available, as
        maxRecordsPerTrigger, maxBytesPerTrigger (a soft maximum, as Delta's: the first
        chunk boundary at or past it) and minOffsetsPerTrigger with maxTriggerDelay shape
        it (``start``: none)."""
        source = self.source
        if limit is None or (
            isinstance(limit, ReadAllAvailable)
            and not isinstance(self.getDefaultReadLimit(), ReadAllAvailable)
        ):
            return end  # PySpark 4.0/4.1, or a trigger that reads everything (once)
        if source.min_offsets_per_trigger is not None and self._available_now_end is None:
            # as Kafka's: what is available against the minimum, before any maximum;
            # availableNow reads what there is, now
            if end - start < source.min_offsets_per_trigger and (
                time.monotonic() - self._last_batch_at < source.max_trigger_delay_s
            ):
                return start
            self._last_batch_at = time.monotonic()
        if source.max_records_per_trigger is not None:
            end = min(end, start + source.max_records_per_trigger)
        if source.max_bytes_per_trigger is not None and end > start:
            end = self._bytes_end(start, end, source.max_bytes_per_trigger)
        return end

    def _bytes_end(self, start: int, end: int, max_bytes: int) -> int:
        """The end of the first range from ``start`` as the stream cuts ``[start, end)``
        on chunk boundaries into ranges of about ``max_bytes`` (each ends at the first
        boundary at or past it)."""
        where = f"planning a micro-batch of stream {self.source.stream!r}"
        try:
            answer = self._session.ask(StreamPlan(start, end, max_bytes), where)
        except OffsetOutOfRange:
            # Retention took the start (the micro-batch's plan fails the query or skips
            # them, as failOnDataLoss says): the bound counts from what the stream kept.
            first = int(self._session.ask(StreamAttach("first"), where)["offset"])
            if first >= end:
                return end
            try:
                answer = self._session.ask(StreamPlan(first, end, max_bytes), where)
            except OffsetOutOfRange:  # retention runs on: a micro-batch of one offset
                return min(end, first + 1)
        ranges = answer["ranges"]
        return int(ranges[0][1]) if ranges else end

    def getDefaultReadLimit(self) -> ReadLimit:
        """The options' limit, so that Spark hands back ``ReadAllAvailable`` only when a
        trigger asks for everything (``once``); ``_shaped`` applies every option."""
        source = self.source
        if source.min_offsets_per_trigger is not None and ReadMinRows is not None:
            return ReadMinRows(source.min_offsets_per_trigger)
        if source.max_bytes_per_trigger is not None and ReadMaxBytes is not None:
            return ReadMaxBytes(source.max_bytes_per_trigger)
        if source.max_records_per_trigger is not None:
            return ReadMaxRows(source.max_records_per_trigger)
        return ReadAllAvailable()

    def reportLatestOffset(self) -> dict[str, Any]:
        return self._offset(self._latest())

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now_end = self._latest()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        identity = self._take_identity(start)
        self._take_identity(end)
        where = f"micro-batch of stream {self.source.stream!r}"
        return _plan(self._session, start["offset"], end["offset"], identity, where)

    def read(self, partition: InputPartition) -> Iterator[pyarrow.RecordBatch]:
        assert isinstance(partition, OffsetRange)
        return read_range(self.source, partition)

    def commit(self, end: dict[str, Any]) -> None:
        """The query processed every offset before ``end``: stored on the node under
        ``consumerName``, where its lag shows (unless ``latestOffset`` stored it)."""
        if end["offset"] > self._stored:
            self._store(int(end["offset"]))

    def _store(self, end: int) -> None:
        if end > 0:
            self._session.call(
                lambda connection: connection.store_offset(
                    self.source.stream, self.source.consumer_name, end - 1
                ),
                f"storing the offset of stream {self.source.stream!r}",
            )
        self._stored = end

    def stop(self) -> None:
        self._session.close()

    def _take_identity(self, offset: dict[str, Any]) -> str:
        """The identity a checkpointed offset carries, checked against the stream's."""
        if not isinstance(offset, dict) or offset.get("stream") != self.source.stream:
            raise WarrenReadError(
                f"the checkpoint's offset {offset!r} is not one of stream "
                f"{self.source.stream!r}: a query's checkpoint belongs to the stream it read"
            )
        if self._identity is None:
            self._latest()
        assert self._identity is not None
        _check_identity(self.source, offset["identity"], self._identity, "the checkpoint")
        return str(offset["identity"])

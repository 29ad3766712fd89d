"""Spark reading Warren streams: the reading half of the ``warren`` data source
(``warren.queues.client.spark`` registers both halves under one name; the options
both share are ``spark_options``'s; the columns and how chunks become them,
``spark_records``'s).

    spark.read.format("warren").option("endpoint", "tcp://broker:5673")
        .option("stream", "events").option("startingOffsets", "first").load()
    spark.readStream.format("warren").option("endpoint", ...)
        .option("streamPattern", "events-.*").option("maxRecordsPerTrigger", 100000).load()

Options: ``endpoint`` and either ``stream`` (one stream, or several separated by commas)
or ``streamPattern`` (a regular expression a stream's whole name matches, as Kafka's
``subscribePattern``: a streaming query picks up streams declared after it started and
reads them from their first offset); ``key_file`` or ``key`` (CURVE: see
``spark_options``), ``timeout_s`` (120: how long a node that is down is retried before
the read fails, naming the offsets it was reading), ``startingOffsets`` ("first", "last":
the last chunk, "latest": what is published from now on, an offset (of one stream), or
``timestamp:<epoch ms>``; "first" for a batch read, "latest" for a streaming one; or
Kafka's JSON, a start for each stream named, ``{"events": 42, "audit": -2}``, -2 the first
offset and -1 the latest; or ``startingOffsetsByTimestamp`` with its strategy:
``_starting_by_timestamp``), ``endingOffsets`` (batch only: "latest", the default, is
everything committed when the read is planned; an offset, excluded; ``timestamp:<ms>``;
or the same JSON, -1 the latest), ``failOnDataLoss`` (true: offsets retention deleted
before they were read, or a stream a pattern matched deleted, fail the query naming them;
false: they are skipped with a warning), ``partitionBytes`` (32 MiB: the size of one
task's offset range; each task costs Spark tens of milliseconds of its own, so fewer,
larger ranges read faster) with ``minPartitions`` (a hint: smaller ranges until there
are that many, in each stream), ``includeHeaders`` (``spark_records``), and, streaming,
``maxRecordsPerTrigger``, ``maxBytesPerTrigger``, ``minOffsetsPerTrigger`` with
``maxTriggerDelay`` (``WarrenStreamReader._shaped``: over all the streams read, shared
between them as each has records waiting, as Kafka's) and ``consumerName`` (the name the
query's progress is stored under in each stream, so ``warren streams`` shows its lag:
"spark" unless given). Any other option is refused, case aside
(``spark_options.check_known``). A ``startingOffsets`` below the first offset is data
loss (``failOnDataLoss``); one past the stream's end is refused either way, never read
from the first.

Progress. Spark commits a micro-batch to the source (``commit``) only when it plans the
next one, so a query's last micro-batch would never be stored; but it asks for the next
(``latestOffset(start, ...)``) once the last one is done, and ends a
``trigger(availableNow=True)`` query only after that ask. The reader stores ``start``
there, so a query that read everything shows lag 0; a micro-batch that failed is never
stored (Spark asks for no next one). Spark does not stop the reader when a query ends
(its process is ended), so nothing can be left to a ``stop``.

How it reads. The driver resolves the offsets with each stream's process
(``StreamAttach``) and has it cut ``[start, end)`` into ranges on chunk boundaries
(``StreamPlan``, from the index files: no record is read to plan): each task reads one
range of one stream, so a query of several streams reads them side by side. Each task
connects from its executor and asks for its range's chunks as the segment files hold
them (``StreamChunks``), and turns each answer into one Arrow batch
(``spark_records.record_batch``, which checks every chunk).

Offsets a streaming query keeps in its checkpoint are, for each stream, the next offset
to read and the stream's random identity, which changes when a stream is deleted and
declared again under the same name (the query then fails rather than read another
stream's offsets as its own): ``{"stream", "identity", "offset"}`` for a query of one
stream named, ``{"streams": {name: {"identity", "offset"}}}`` for any other. Exactly
once: a micro-batch is a fixed offset range of each stream, read again whole if it is
replayed, so with a sink that drops repeats (Warren's, with its producer ids) each record
is counted once.

PySpark 4.0 to 4.3: ``latestOffset(start, limit)`` takes the read limit Spark passes from
4.2 on (``maxRecordsPerTrigger`` is ``getDefaultReadLimit``); 4.0 and 4.1 call it with no
argument, and then every trigger reads all that is committed. ``SupportsTriggerAvailableNow``
(4.2+) pins the end at what is committed when the query starts, read in batches that keep
to the limit (a stream a pattern matches only later is left to the next query).

Races: retention deleting a range between the plan and the task (the task sees
``OffsetOutOfRange`` and fails or skips, as ``failOnDataLoss`` says); the node or the
stream restarting under a task (the same request is asked again, from a new connection,
until ``timeout_s`` passes without progress); a stream deleted and declared again while a
query runs (identity compared on every plan and every answer); a stream a pattern
matched deleted between the listing and the ask (``StreamGone``: as deleted after).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition

from ..errors import (
    InvalidArgument,
    NotFound,
    OffsetOutOfRange,
    QueueDown,
    QueueRestarting,
    StreamGone,
    WarrenReadError,
)
from ..protocol import (
    MAX_PLAN_BYTES,
    StreamAttach,
    StreamChunks,
    StreamPlan,
    interval_text,
    parse_interval,
)
from .spark_options import RETRY_PAUSE_S, Target, node_connection, retryable
from .spark_records import record_batch, schema

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

__all__ = ["Source", "WarrenBatchReader", "WarrenStreamReader", "read_schema"]

log = logging.getLogger("warren.spark")

DEFAULT_PARTITION_BYTES = 32 * 2**20
ANSWER_BYTES = 2 * 2**20  # chunks one StreamChunks answer carries: one Arrow batch
DEFAULT_CONSUMER_NAME = "spark"
# Streaming: the most a micro-batch waits for minOffsetsPerTrigger once some data is there
# (Kafka's source: 15 minutes), and the options that shape micro-batches beside
# maxRecordsPerTrigger.
DEFAULT_MAX_TRIGGER_DELAY_S = 15 * 60.0
TRIGGER_OPTIONS = ("maxBytesPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay")
# Kafka's JSON offsets: these two stand for the first offset and for the latest
KAFKA_EARLIEST, KAFKA_LATEST = -2, -1
T = TypeVar("T")
Start = tuple[str, int]  # a StreamAttach's (start, value)


def read_schema(options: Mapping[str, str]) -> str:
    """The columns a read with ``options`` gives (``includeHeaders`` decides a type)."""
    return schema(_flag(options, "includeHeaders", "false"))


def _flag(options: Mapping[str, str], name: str, default: str) -> bool:
    flag = str(options.get(name, default)).lower()
    if flag not in ("true", "false"):
        raise WarrenReadError(f"option {name} is true or false, not {flag!r}")
    return flag == "true"


@dataclasses.dataclass(frozen=True)
class Source:
    """A read's options, checked on the driver (picklable: it travels to the executors)."""

    endpoint: str
    streams: tuple[str, ...]  # option stream's names; none with a pattern
    key_file: str | None
    key: str | None = dataclasses.field(repr=False)  # a client's secret
    timeout_s: float
    starting: Start  # where each stream starts, unless named in starts_by_stream
    ending: Start | None  # None: what is committed at planning
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
    pattern: str | None = None  # option streamPattern (or superStream's partitions')
    include_headers: bool = False
    # Kafka's JSON: a start (or an end) for each stream it names
    starts_by_stream: Mapping[str, Start] = dataclasses.field(default_factory=dict)
    ends_by_stream: Mapping[str, Start] = dataclasses.field(default_factory=dict)
    super_stream: str | None = None  # option superStream: its partitions are read

    @classmethod
    def from_options(cls, options: Any, streaming: bool) -> Source:
        target = Target.from_options(dict(options), reading=True)
        pattern = options.get("streamPattern") or None
        if target.super_stream is not None:  # its partitions, as a pattern names them
            pattern = re.escape(target.super_stream) + "-[0-9]+"
        streams = _named_streams(target.stream)
        if pattern is not None:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise WarrenReadError(
                    f"option streamPattern is a regular expression, not {pattern!r} ({exc})"
                ) from None
        several = pattern is not None or len(streams) > 1
        starting, starts_by_stream = _offsets_option(
            options.get("startingOffsets", "latest" if streaming else "first"),
            "startingOffsets",
            ("first", "last", "latest"),
            several,
            ("next", 0) if streaming else ("first", 0),
        )
        _check_named(starts_by_stream, streams, pattern, "startingOffsets")
        by_timestamp, strategy = _starting_by_timestamp(options)
        if by_timestamp is not None:
            _check_named(by_timestamp, streams, pattern, "startingOffsetsByTimestamp")
            starts_by_stream = {name: ("timestamp", ms) for name, ms in by_timestamp.items()}
        ending: Start | None = None
        ends_by_stream: dict[str, Start] = {}
        if "endingOffsets" in options:
            if streaming:
                raise WarrenReadError("endingOffsets is for a batch read (spark.read) only")
            ending, ends_by_stream = _offsets_option(
                options["endingOffsets"], "endingOffsets", ("latest",), several, ("next", 0)
            )
            if ending[0] == "next":
                ending = None
            _check_named(ends_by_stream, streams, pattern, "endingOffsets")
        if "endingOffsetsByTimestamp" in options:
            if streaming or "endingOffsets" in options:
                raise WarrenReadError(
                    "endingOffsetsByTimestamp is for a batch read (spark.read), in place of "
                    "endingOffsets: each says where the read ends"
                )
            shape = (
                'option endingOffsetsByTimestamp is JSON naming each stream: {"<stream>": '
                "<epoch ms>}"
            )
            by_time = _json_by_stream(options["endingOffsetsByTimestamp"], shape, 0)
            _check_named(by_time, streams, pattern, "endingOffsetsByTimestamp")
            ends_by_stream = {name: ("timestamp", ms) for name, ms in by_time.items()}
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
            streams,
            target.key_file,
            target.key,
            target.timeout_s,
            starting,
            ending,
            _flag(options, "failOnDataLoss", "true"),
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
            pattern,
            _flag(options, "includeHeaders", "false"),
            starts_by_stream,
            ends_by_stream,
            target.super_stream,
        )

    @property
    def one_stream(self) -> bool:
        """One stream named: its checkpoint offsets keep their first shape."""
        return self.pattern is None and len(self.streams) == 1

    def described(self) -> str:
        if self.super_stream is not None:
            return f"super stream {self.super_stream!r}"
        if self.pattern is not None:
            return f"the streams matching {self.pattern!r}"
        if self.one_stream:
            return f"stream {self.streams[0]!r}"
        return "streams " + ", ".join(repr(name) for name in self.streams)

    def start_of(self, stream: str) -> Start:
        """Where the read of ``stream`` starts (a stream a pattern matched only after a
        streaming query started: at its first offset, ``WarrenStreamReader``)."""
        return self.starts_by_stream.get(stream, self.starting)

    def end_of(self, stream: str) -> Start | None:
        return self.ends_by_stream.get(stream, self.ending)

    def matches(self, stream: str) -> bool:
        return self.pattern is not None and re.fullmatch(self.pattern, stream) is not None


def _named_streams(option: str | None) -> tuple[str, ...]:
    """Option stream's names: one, or several separated by commas."""
    if option is None:
        return ()
    names = tuple(name.strip() for name in option.split(","))
    if not all(names) or len(set(names)) != len(names):
        raise WarrenReadError(
            f"option stream is a stream's name, or several separated by commas, each once; "
            f"got {option!r}"
        )
    return names


def _check_named(
    given: Mapping[str, Any], streams: Sequence[str], pattern: str | None, option: str
) -> None:
    """The streams an option's JSON names are streams the read reads."""
    for name in given:
        if name not in streams and (pattern is None or re.fullmatch(pattern, name) is None):
            read = f"matching {pattern!r}" if pattern is not None else ", ".join(streams)
            raise WarrenReadError(
                f"option {option} names stream {name!r}, which this read does not read "
                f"(it reads {read})"
            )


def _offsets_option(
    value: object, name: str, words: Sequence[str], several: bool, default: Start
) -> tuple[Start, dict[str, Start]]:
    """Option startingOffsets or endingOffsets: a start for every stream (``default``
    for those Kafka's JSON does not name), and those the JSON gives stream by stream
    (-2 the first offset, -1 the latest)."""
    text = str(value).strip()
    if text.startswith("{"):
        return default, _offsets_json(text, name)
    if text in words:
        return {"latest": ("next", 0)}.get(text, (text, 0)), {}
    if text.isdigit():
        if several:
            raise WarrenReadError(
                f"option {name} {text} is an offset of one stream, and this read reads "
                f'several: give each its own as JSON, {{"<stream>": {text}, ...}}'
            )
        return ("offset", int(text)), {}
    if text.startswith("timestamp:") and text[len("timestamp:") :].isdigit():
        return ("timestamp", int(text[len("timestamp:") :])), {}
    raise WarrenReadError(
        f"option {name} is {', '.join(repr(w) for w in words)}, an offset (an int >= 0), "
        f"'timestamp:<epoch ms>' or JSON naming each stream; got {text!r}"
    )


def _offsets_json(text: str, name: str) -> dict[str, Start]:
    shape = (
        f'option {name} as JSON gives each stream its offset: {{"<stream>": <offset>}} '
        f"({KAFKA_EARLIEST}: the first, {KAFKA_LATEST}: the latest)"
    )
    lowest = KAFKA_LATEST if name == "endingOffsets" else KAFKA_EARLIEST
    words = {KAFKA_EARLIEST: ("first", 0), KAFKA_LATEST: ("next", 0)}
    return {
        stream: words.get(value, ("offset", value))
        for stream, value in _json_by_stream(text, shape, lowest).items()
    }


def _json_by_stream(text: str, shape: str, lowest: int) -> dict[str, int]:
    """Kafka's JSON of a value by stream (``{"events": 12}`` or by partition,
    ``{"events": {"0": 12}}``), each an int >= ``lowest``; else ``shape`` says how."""
    try:
        given = json.loads(text)
    except ValueError:
        raise WarrenReadError(f"{shape}; got {text!r}") from None
    if not isinstance(given, dict) or not given:
        raise WarrenReadError(f"{shape}; got {text!r}")
    values = {}
    for stream, found in given.items():
        value = _one_partition(found)
        if not isinstance(value, int) or isinstance(value, bool) or value < lowest:
            raise WarrenReadError(f"{shape}; got {text!r}")
        values[stream] = value
    return values


def _one_partition(value: object) -> object:
    """Kafka's value by partition, ``{"0": value}``: a stream is one partition."""
    if isinstance(value, dict) and set(value) == {"0"}:
        return value["0"]
    return value


def _starting_by_timestamp(options: Any) -> tuple[dict[str, int] | None, str | None]:
    """Option startingOffsetsByTimestamp, Kafka's JSON (``{"events": 1700000000000}``, or
    ``{"events": {"0": ...}}``: a stream is one partition), as epoch ms by stream, and its
    strategy (startingOffsetsByTimestampStrategy, "error" unless given); (None, None)
    without it. A stream it does not name starts where startingOffsets' default says."""
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
    shape = 'option startingOffsetsByTimestamp is JSON naming each stream: {"<stream>": <epoch ms>}'
    return _json_by_stream(text, shape, 0), strategy


def _started(source: Source, stream: str, begun: dict[str, Any], where: str) -> dict[str, Any]:
    """``begun``, where the read of ``stream`` starts, unless startingOffsetsByTimestamp
    found no record at or after its timestamp and its strategy is "error" ("latest": the
    end)."""
    start = source.start_of(stream)
    if (
        source.timestamp_strategy == "error"
        and start[0] == "timestamp"
        and begun["offset"] >= begun["records_end"]
    ):
        raise WarrenReadError(
            f"{where}: stream {stream!r} has no record at or after timestamp "
            f"{start[1]} (startingOffsetsByTimestamp); set "
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
    """One task's offsets, ``[start, end)``, of the stream named whose identity is given."""

    def __init__(self, stream: str, start: int, end: int, identity: str) -> None:
        super().__init__((stream, start, end))
        self.stream, self.start, self.end, self.identity = stream, start, end, identity


class NodeSession:
    """A connection to the node that asks again, from a new connection, what failed
    because the node or the stream was away, until ``timeout_s`` passes without an
    answer; the driver's and each task's own (never shared between processes)."""

    def __init__(self, source: Source) -> None:
        self.source = source
        self._connection: Connection | None = None

    def ask(self, stream: str, request: Any, where: str) -> Any:
        return self.call(lambda connection: connection._request(stream, request), where, stream)

    def call(self, action: Callable[[Connection], T], where: str, stream: str = "") -> T:
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
                    raise StreamGone(
                        f"stream {stream!r} is not declared on {self.source.endpoint}"
                    ) from None
                if not retryable(exc) or time.monotonic() + pause > deadline:
                    raise
                log.warning("%s: %s; asking again in %.1f s", where, exc, pause)
                self.close()
                time.sleep(pause)
                pause = min(pause * 2, RETRY_PAUSE_S[1])

    def streams(self, where: str) -> list[str]:
        """The streams the read reads now: those named, or those its pattern matches."""
        source = self.source
        if source.pattern is None:
            return list(source.streams)
        super_stream = source.super_stream
        if super_stream is not None:  # its partitions, fixed when it was declared
            return self.call(lambda c: c.partitions(super_stream), where, super_stream)

        def matching(connection: Connection) -> list[str]:
            found = []
            for name in connection.list_queues():
                if not source.matches(name):
                    continue
                try:
                    if connection.is_stream(name):
                        found.append(name)
                except QueueRestarting:
                    raise  # coming back: asked again (not left out, as lost)
                except NotFound:  # deleted since the listing
                    continue
                except QueueDown:
                    raise WarrenReadError(
                        f"queue {name!r}, which streamPattern {source.pattern!r} matches, is "
                        f"down (it kept crashing): restart it, or narrow the pattern"
                    ) from None
            return sorted(found)

        return self.call(matching, where)

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None


def _attach(session: NodeSession, stream: str, start: Start, where: str) -> dict[str, Any]:
    source = session.source

    def attach(connection: Connection) -> dict[str, Any]:
        if not connection.is_stream(stream):
            raise WarrenReadError(
                f"{stream!r} is a classic queue, not a stream: Spark reads streams "
                f"(declare one with type='stream'); a queue's messages are consumed, not read"
            )
        return connection._request(stream, StreamAttach(*start))

    try:
        return session.call(attach, where, stream)
    except OffsetOutOfRange as error:
        if start[0] != "offset":
            raise WarrenReadError(f"{where}: {error}") from None
        first = session.ask(stream, StreamAttach("first"), where)
        if start[1] > first["committed"] + 1:  # not data loss: refused whatever the flag
            raise WarrenReadError(
                f"{where}: offset {start[1]} is past the end of stream {stream!r} (it "
                f"holds offsets {first['first']} to {first['committed']}): start at 'latest' "
                f"to read what is published from now on"
            ) from None
        if source.fail_on_data_loss:
            raise WarrenReadError(f"{where}: {error}") from None
        log.warning("%s: %s; starting at the first offset (failOnDataLoss=false)", where, error)
        return first


def _plan(
    session: NodeSession, stream: str, start: int, end: int, identity: str, where: str
) -> list[OffsetRange]:
    """``[start, end)`` of ``stream`` as tasks; offsets retention deleted fail the read or
    are skipped."""
    source = session.source
    if start >= end:
        return []
    try:
        answer = session.ask(stream, StreamPlan(start, end, source.partition_bytes), where)
    except OffsetOutOfRange as error:
        first = session.ask(stream, StreamAttach("first"), where)
        if start >= first["offset"]:  # past the stream's end (recovery cut it), not retention
            raise WarrenReadError(f"{where}: {error}") from None
        lost_to = min(first["offset"], end)
        _data_lost(source, stream, start, lost_to, f"{where}: {error}")
        if lost_to >= end:
            return []
        answer = session.ask(stream, StreamPlan(lost_to, end, source.partition_bytes), where)
    _check_identity(stream, identity, answer["identity"], where)
    ranges = answer["ranges"]
    target = source.partition_bytes
    # minPartitions: smaller ranges until there are enough (a hint, as Kafka's: chunks are
    # not cut, so a few large ones may leave fewer)
    while source.min_partitions is not None and len(ranges) < source.min_partitions:
        if target <= 1:  # a range a chunk already
            break
        target //= 2  # at most some 30 asks, each a read of the index files alone
        try:
            ranges = session.ask(stream, StreamPlan(ranges[0][0], end, target), where)["ranges"]
        except OffsetOutOfRange:  # retention moved meanwhile: the ranges found stand
            break
    return [OffsetRange(stream, low, high, identity) for low, high in ranges]


def _data_lost(source: Source, stream: str, start: int, end: int, why: str) -> None:
    message = (
        f"offsets {start} to {end - 1} of stream {stream!r} were deleted by "
        f"retention before they were read ({why})"
    )
    if source.fail_on_data_loss:
        raise WarrenReadError(f"{message}; set failOnDataLoss=false to skip them")
    log.warning("%s; skipped (failOnDataLoss=false)", message)


def _check_identity(stream: str, expected: str, found: str, where: str) -> None:
    if expected != found:
        raise WarrenReadError(
            f"{where}: stream {stream!r} is not the one these offsets are of (it was "
            f"deleted and declared again: identity {found}, the offsets' {expected}); start "
            f"the query again with a new checkpoint"
        )


def read_range(source: Source, partition: OffsetRange) -> Iterator[pyarrow.RecordBatch]:
    """A task: the records of ``partition``'s offsets as Arrow batches, every chunk's CRC
    checked (``record_batch``)."""
    stream = partition.stream
    where = f"stream {stream!r}, offsets {partition.start} to {partition.end - 1}"
    session = NodeSession(source)
    offset = partition.start
    try:
        while offset < partition.end:
            try:
                answer = session.ask(
                    stream, StreamChunks(offset, partition.end, ANSWER_BYTES), f"reading {where}"
                )
            except OffsetOutOfRange as error:
                first = session.ask(stream, StreamAttach("first"), where)["offset"]
                _data_lost(source, stream, offset, min(first, partition.end), str(error))
                offset = first
                continue
            except StreamGone:
                if source.pattern is None or source.fail_on_data_loss:
                    raise WarrenReadError(
                        f"{where}: stream {stream!r} was deleted before offsets from {offset} "
                        f"were read"
                    ) from None
                log.warning("%s: the stream was deleted; skipped (failOnDataLoss=false)", where)
                return
            except Exception as exc:
                raise WarrenReadError(
                    f"{where}: offsets from {offset} were not read: {type(exc).__name__}: {exc}"
                ) from None
            _check_identity(stream, partition.identity, answer["identity"], where)
            if not answer["chunks"]:
                raise WarrenReadError(
                    f"{where}: the stream answered no chunk at offset {offset} (committed: "
                    f"{answer['committed']})"
                )
            batch = record_batch(
                answer["chunks"], offset, partition.end, where, stream, source.include_headers
            )
            if batch.num_rows:
                yield batch
            offset = answer["next"]
    finally:
        session.close()


class WarrenBatchReader(DataSourceReader):
    """``spark.read.format("warren")``: plans on the driver, reads on the executors."""

    def __init__(self, source: Source) -> None:
        self.source = source

    def partitions(self) -> Sequence[InputPartition]:
        source = self.source
        where = f"planning a read of {source.described()}"
        session = NodeSession(source)
        try:
            ranges: list[OffsetRange] = []
            for stream in session.streams(where):
                try:
                    ranges += self._stream_ranges(session, stream, where)
                except StreamGone:
                    if source.pattern is None:
                        raise
                    log.info("%s: stream %r was deleted since the listing", where, stream)
            # Spark reads a batch with no partition as one partition of its own making:
            # an empty range stands for "nothing to read" instead
            return ranges or [OffsetRange("", 0, 0, "")]
        finally:
            session.close()

    def _stream_ranges(self, session: NodeSession, stream: str, where: str) -> list[OffsetRange]:
        source = self.source
        begun = _started(
            source, stream, _attach(session, stream, source.start_of(stream), where), where
        )
        identity, end = begun["identity"], begun["records_end"]
        ending = source.end_of(stream)
        if ending is not None and ending[0] != "next":
            if ending[0] == "offset" and ending[1] > begun["committed"] + 1:
                raise WarrenReadError(
                    f"{where}: endingOffsets {ending[1]} is past the end of stream {stream!r} "
                    f"(it holds offsets {begun['first']} to {begun['committed']})"
                )
            end = _attach(session, stream, ending, where)["offset"]
        return _plan(session, stream, begun["offset"], end, identity, where)

    def read(self, partition: InputPartition) -> Iterator[pyarrow.RecordBatch]:
        assert isinstance(partition, OffsetRange)
        return read_range(self.source, partition)


class WarrenStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("warren")``; see the module docstring."""

    def __init__(self, source: Source) -> None:
        self.source = source
        self._session = NodeSession(source)
        self._available_now_end: dict[str, int] | None = None
        self._identities: dict[str, str] = {}  # each stream read: the identity it had
        self._lost: set[str] = set()  # streams a pattern matched that were deleted
        self._stored: dict[str, int] = {}  # each stream: the end stored under consumerName
        # when a micro-batch was last let through (Kafka's source: never, at a start, so
        # the first is not held back by minOffsetsPerTrigger)
        self._last_batch_at = -math.inf

    def _offset(self, offsets: Mapping[str, int]) -> dict[str, Any]:
        """Each stream's next offset as the checkpoint keeps it (the module docstring)."""
        if self.source.one_stream:
            (stream,) = self.source.streams
            return {
                "stream": stream,
                "identity": self._identities[stream],
                "offset": offsets[stream],
            }
        return {
            "streams": {
                stream: {"identity": self._identities[stream], "offset": offset}
                for stream, offset in sorted(offsets.items())
            }
        }

    def _offsets(self, offset: Any) -> dict[str, int]:
        """A checkpointed offset as each stream's next offset, its identities checked
        against the streams' (a stream a pattern matched that was deleted is left out,
        or fails the query: ``failOnDataLoss``)."""
        source = self.source
        given: Any = None
        if isinstance(offset, dict) and "streams" in offset:
            given = offset["streams"]
        elif isinstance(offset, dict) and "stream" in offset:
            given = {offset["stream"]: offset}
        if (
            not isinstance(given, dict)
            or not all(
                isinstance(each, dict) and {"identity", "offset"} <= set(each)
                for each in given.values()
            )
            or (source.pattern is None and set(given) != set(source.streams))
            or not all(source.pattern is None or source.matches(name) for name in given)
        ):
            raise WarrenReadError(
                f"the checkpoint's offset {offset!r} is not one of {source.described()}: a "
                f"query's checkpoint belongs to the streams it read"
            )
        offsets = {}
        for stream, each in given.items():
            if stream not in self._identities:
                self._latest()
            if stream not in self._identities:
                self._stream_lost(stream)
                continue
            _check_identity(stream, each["identity"], self._identities[stream], "the checkpoint")
            offsets[stream] = int(each["offset"])
        return offsets

    def _latest(self) -> dict[str, int]:
        """Each stream's end (the offset after its last committed record), the streams a
        pattern matches listed again."""
        where = f"reading {self.source.described()}"
        ends = {}
        for stream in self._session.streams(where):
            try:
                answer = _attach(self._session, stream, ("next", 0), where)
            except StreamGone:
                if self.source.pattern is None:
                    raise
                continue  # deleted since the listing
            known = self._identities.setdefault(stream, answer["identity"])
            _check_identity(stream, known, answer["identity"], "the query")
            ends[stream] = int(answer["records_end"])
        for stream in [name for name in self._identities if name not in ends]:
            self._stream_lost(stream)
        return ends

    def _stream_lost(self, stream: str) -> None:
        """A stream a pattern matched was deleted: data loss (``failOnDataLoss``)."""
        message = f"stream {stream!r}, which this query read, was deleted"
        if self.source.fail_on_data_loss:
            raise WarrenReadError(f"{message}; set failOnDataLoss=false to go on without it")
        if stream not in self._lost:
            log.warning("%s; the query goes on without it (failOnDataLoss=false)", message)
        self._lost.add(stream)
        self._identities.pop(stream, None)

    def _first(self, stream: str) -> int:
        """The first offset ``stream`` holds."""
        where = f"finding the first offset of stream {stream!r}"
        return int(self._session.ask(stream, StreamAttach("first"), where)["offset"])

    def initialOffset(self) -> dict[str, Any]:
        source = self.source
        where = f"starting a query on {source.described()}"
        offsets = {}
        for stream in self._session.streams(where):
            try:
                begun = _attach(self._session, stream, source.start_of(stream), where)
            except StreamGone:
                if source.pattern is None:
                    raise
                continue  # deleted since the listing
            _started(source, stream, begun, where)
            self._identities[stream] = begun["identity"]
            offsets[stream] = int(begun["offset"])
        return self._offset(offsets)

    def latestOffset(
        self, start: dict[str, Any] | None = None, limit: ReadLimit | None = None
    ) -> dict[str, Any]:
        starts = None if start is None else self._offsets(start)
        ends = self._latest()
        for stream, offset in (starts or {}).items():
            if self._stored.get(stream, 0) < offset <= ends.get(stream, -1):
                # Spark asks for the next micro-batch once the last one is done: stored
                # now, as the query may stop before it plans another (and commits this one)
                self._store(stream, offset)
        if self._available_now_end is not None:
            # what was committed when the query started (a stream matched since: left
            # to the next query, one in the checkpoint since: where it was)
            pinned, kept = self._available_now_end, {}
            for stream, end in ends.items():
                if stream in pinned:
                    kept[stream] = min(end, pinned[stream])
                elif starts is not None and stream in starts:
                    kept[stream] = starts[stream]
            ends = kept
        if starts is not None:
            froms = {}
            for stream in list(ends):
                if stream in starts:
                    froms[stream] = starts[stream]
                    continue
                # matched since the last micro-batch: this one ends it at its first
                # offset, so the checkpoint holds where its read starts
                try:
                    froms[stream] = ends[stream] = self._first(stream)
                except StreamGone:
                    self._stream_lost(stream)
                    del ends[stream]
            shaped = self._shaped(froms, ends, limit)
            ends = {stream: max(shaped[stream], froms[stream]) for stream in ends}
        return self._offset(ends)

    def _shaped(
        self, starts: Mapping[str, int], ends: Mapping[str, int], limit: ReadLimit | None
    ) -> dict[str, int]:
        """Each stream's end of the micro-batch from ``starts`` with ``[start, end)`` of
        each available, as maxRecordsPerTrigger, maxBytesPerTrigger (a soft maximum, as
        Delta's: the first chunk boundary at or past it) and minOffsetsPerTrigger with
        maxTriggerDelay shape it: over all the streams, the maxima shared between them as
        each has records waiting (Kafka's)."""
        source = self.source
        shaped = dict(ends)
        if limit is None or (
            isinstance(limit, ReadAllAvailable)
            and not isinstance(self.getDefaultReadLimit(), ReadAllAvailable)
        ):
            return shaped  # PySpark 4.0/4.1, or a trigger that reads everything (once)
        waiting = {stream: max(0, end - starts[stream]) for stream, end in ends.items()}
        if source.min_offsets_per_trigger is not None and self._available_now_end is None:
            # as Kafka's: what is available against the minimum, before any maximum;
            # availableNow reads what there is, now
            if sum(waiting.values()) < source.min_offsets_per_trigger and (
                time.monotonic() - self._last_batch_at < source.max_trigger_delay_s
            ):
                return {stream: starts[stream] for stream in ends}
            self._last_batch_at = time.monotonic()
        if source.max_records_per_trigger is not None:
            shares = _shared(waiting, source.max_records_per_trigger)
            shaped = {stream: starts[stream] + shares[stream] for stream in ends}
            waiting = shares
        if source.max_bytes_per_trigger is not None:
            total = sum(waiting.values())
            for stream, count in waiting.items():
                if count:  # its part of the budget, as of the records: a chunk at least
                    budget = max(1, source.max_bytes_per_trigger * count // total)
                    shaped[stream] = self._bytes_end(stream, starts[stream], shaped[stream], budget)
        return shaped

    def _bytes_end(self, stream: str, start: int, end: int, max_bytes: int) -> int:
        """The end of the first range from ``start`` as ``stream`` cuts ``[start, end)``
        on chunk boundaries into ranges of about ``max_bytes`` (each ends at the first
        boundary at or past it)."""
        where = f"planning a micro-batch of stream {stream!r}"
        try:
            answer = self._session.ask(stream, StreamPlan(start, end, max_bytes), where)
        except OffsetOutOfRange:
            # Retention took the start (the micro-batch's plan fails the query or skips
            # them, as failOnDataLoss says): the bound counts from what the stream kept.
            first = self._first(stream)
            if first >= end:
                return end
            try:
                answer = self._session.ask(stream, StreamPlan(first, end, max_bytes), where)
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
        starts, ends = self._offsets(start), self._offsets(end)
        where = f"micro-batch of {self.source.described()}"
        ranges: list[InputPartition] = []
        for stream, stop in ends.items():
            try:
                # a stream absent from the start: matched since (PySpark 4.0 and 4.1 pass
                # latestOffset no start, and its first micro-batch reads it from its first)
                begin = starts[stream] if stream in starts else min(stop, self._first(stream))
                ranges += _plan(self._session, stream, begin, stop, self._identities[stream], where)
            except StreamGone:
                if self.source.pattern is None:
                    raise
                self._stream_lost(stream)
        return ranges

    def read(self, partition: InputPartition) -> Iterator[pyarrow.RecordBatch]:
        assert isinstance(partition, OffsetRange)
        return read_range(self.source, partition)

    def commit(self, end: dict[str, Any]) -> None:
        """The query processed every offset before ``end``: stored on the node under
        ``consumerName`` in each stream, where its lag shows (unless ``latestOffset``
        stored it)."""
        for stream, offset in self._offsets(end).items():
            if offset > self._stored.get(stream, 0):
                self._store(stream, offset)

    def _store(self, stream: str, end: int) -> None:
        if end > 0:
            try:
                self._session.call(
                    lambda connection: connection.store_offset(
                        stream, self.source.consumer_name, end - 1
                    ),
                    f"storing the offset of stream {stream!r}",
                    stream,
                )
            except StreamGone:
                if self.source.pattern is None:
                    raise
                return  # a stream a pattern matched deleted: the next plan says so
        self._stored[stream] = end

    def stop(self) -> None:
        self._session.close()


def _shared(waiting: Mapping[str, int], most: int) -> dict[str, int]:
    """``most`` records shared between streams as each has records ``waiting`` (Kafka's
    maxOffsetsPerTrigger): all of each when they fit; else each its part, rounded down,
    the rest one each to those rounding lost most from, and one at least to each."""
    total = sum(waiting.values())
    if total <= most:
        return dict(waiting)
    shares = {stream: most * count // total for stream, count in waiting.items()}
    rest = most - sum(shares.values())
    for stream in sorted(waiting, key=lambda name: (-(most * waiting[name] % total), name))[:rest]:
        shares[stream] += 1
    # as Kafka's: a stream with records waiting is never starved (the sum may pass
    # ``most`` by the few streams so raised)
    return {stream: max(share, min(waiting[stream], 1)) for stream, share in shares.items()}

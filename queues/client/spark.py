"""Spark and Warren: a PySpark (4.x) data source named ``warren``. Executors write into
queues and streams (this module) and read streams back (``warren.queues.client.spark_read``).

    from warren.queues.client.spark import register
    register(spark)
    (df.write.format("warren").mode("append")
       .option("endpoint", "tcp://broker:5673").option("queue", "orders").save())

Needs ``pip install warren-mq[spark]`` (pyspark and pyarrow) on the driver and the
executors, and a node listening there (``warren node --listen ...``).

Columns: ``body`` (binary or string, never null) and, optionally, ``routing_key``
(string; with an exchange, each row's own), ``headers`` (a map of string to string,
binary, number or boolean), ``message_id`` (string), and ``queue`` or ``stream``
(string: each row's destination, as Kafka's topic column, where no option names one;
an option overrides it). Any other column is refused before anything is sent (select
the columns first), or left out with option ``ignoreUnknownColumns``. Options:
``endpoint`` (required), ``queue``, ``stream`` or ``exchange`` (at most one, and one
unless a column names each row's; a stream takes each Arrow batch as one chunk),
``routing_key`` (for an exchange, rows without their own), ``key_file`` (a CURVE key
from ``warren keys``: a path on every executor, or a file shipped with ``addFile``) or
``key`` (its content, base64), ``persistent`` (true), ``mandatory`` (true: a row the
exchange routes to no queue fails the job; false: it is dropped), ``producer`` (a name
for the job: see below), ``timeout_s`` (120: how long a task retries a node that is
down before it fails the job), ``max_in_flight`` (4: the chunks a task sends before the
first one's confirm, so that it encodes the next while the node writes and syncs; 1
waits for each).

Exactly once, per row. Each task is a producer, ``<job>/<partition>``, and a row's
sequence is its index in the partition (rows that name their own destinations: each
destination a producer of the task's, counting the rows sent to it: ``_send_runs``), so
a retried task, a speculative copy, or a micro-batch replayed after a failure re-sends
the same rows under the same sequences and the queues drop the repeats
(``warren.queues.broker.dedup``). ``<job>`` is a random id made when
the write is planned, unless the ``producer`` option names the job: give one to make a
re-run of a failed job (not only its retried tasks) add no duplicates. This relies on
Spark's own contract for retried tasks: a partition yields the same rows in the same
order every time (a source that does not, such as an unordered shuffle of a
non-deterministic input, must be sorted within partitions or checkpointed first).

Encoding. A batch write's task gets Arrow batches. One whose only values are its bodies
(every other column null throughout; a routing_key counts only for an exchange, a
destination column only where no option overrides it) is
encoded whole from its buffers (``encode_bodies``: one prefix shared by every message,
the bodies' msgpack headers built by numpy, Arrow joining each to its body), so the only
Python object made per row is the message's bytes; any other batch, and a streaming
write's rows, are encoded row by row (``Message``, ``encode``). The bytes are the same
either way. Into a queue they go in Publishes of ``PUBLISH_BATCH``; into a stream an
Arrow batch goes as one Publish, so one chunk (as several when it is over the
connection's bytes per Publish).

A task returns only once every row it sent is confirmed (fsynced by every queue it went
to). A node down or restarting is retried, with the same sequences, for ``timeout_s``;
then the task fails with the node's last error. A confirm that fails has every chunk
not yet confirmed sent again (those after it too): the queues drop what had landed. The
driver's commit logs the totals (``warren.spark`` logger, and stderr); an abort logs
what the finished tasks published.

Streaming: ``df.writeStream.format("warren")`` writes each micro-batch the same way, the
producer being ``<query>/<batch>/<partition>``.

Spark 3 (no Python data sources): ``df.foreachPartition(partition_publisher(endpoint,
queue="orders", producer="daily-orders"))`` does the same per partition.

Settings measured here for a local session kept on loopback and quiet: ``PYSPARK_PYTHON``
naming the venv's python, ``SPARK_LOCAL_IP=127.0.0.1``, ``spark.driver.host`` and
``spark.driver.bindAddress`` 127.0.0.1, ``spark.ui.enabled`` false (``local_session``).
Sockets are created inside the task, never on the driver, and linger at most 1 s, so a
failed task does not hang.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import logging
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, TypeAlias

from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import BinaryType, MapType, StringType, StructType

from ..errors import WarrenWriteError
from .spark_options import (
    DEFAULT_TIMEOUT_S,
    DESTINATION_COLUMNS,
    RETRY_PAUSE_S,
    Target,
    node_connection,
    retryable,
)
from .spark_partitions import key_partitions, row_partition

if TYPE_CHECKING:
    import pyarrow
    from pyspark import TaskContext
    from pyspark.sql import SparkSession

    from ..message import Message
    from .connection import Connection

__all__ = ["WarrenDataSource", "local_session", "partition_publisher", "register"]

log = logging.getLogger("warren.spark")

COLUMNS = {
    "body": (BinaryType, StringType),
    "routing_key": (StringType,),
    "headers": (MapType,),
    "message_id": (StringType,),
    "queue": (StringType,),  # each row's destination, unless an option names one
    "stream": (StringType,),
}
BATCH_ROWS = 5000  # rows published (and confirmed) per chunk
STREAM_BATCH_ROWS = 65_535  # into a stream, an Arrow batch as one chunk: at most this many
# into a super stream, batches are joined until each partition's share is about this many
# rows (Spark's own Arrow batch): a chunk per partition as large as a stream's chunk
PARTITION_CHUNK_ROWS = 10_000
REDACTED_OPTIONS = "(?i)url|^key$"  # Spark's own (url), and a client's inline secret key
Columns: TypeAlias = "dict[str, list] | pyarrow.RecordBatch"  # a chunk's rows, by column


def check_schema(
    schema: StructType, ignore_unknown: bool = False, overridden: Iterable[str] = ()
) -> list[str]:
    """The columns a write publishes, in order; ``WarrenWriteError`` for any other, unless
    ``ignore_unknown`` (option ignoreUnknownColumns): then they are left out. The
    ``overridden`` ones (destination columns where an option names the destination) are
    left out whatever they hold."""
    names = []
    for field in schema.fields:
        if field.name in overridden:
            continue
        allowed = COLUMNS.get(field.name)
        if allowed is None and ignore_unknown:
            continue
        if allowed is None:
            raise WarrenWriteError(
                f"column {field.name!r} is not one Warren publishes; select body (binary or "
                f"string) and any of routing_key, headers, message_id, queue or stream first, "
                f"or set option ignoreUnknownColumns"
            )
        if not isinstance(field.dataType, allowed):
            raise WarrenWriteError(
                f"column {field.name!r} is {field.dataType.simpleString()}; "
                f"it must be {' or '.join(a.typeName() for a in allowed)}"
            )
        names.append(field.name)
    if "body" not in names:
        raise WarrenWriteError(
            "the DataFrame has no body column (binary or string): the message bodies"
        )
    return names


@dataclasses.dataclass
class PartitionWritten(WriterCommitMessage):
    """What one task published: its partition, attempt and rows (all confirmed)."""

    partition: int
    attempt: int
    rows: int
    retries: int


def publish_columns(
    target: Target, producer: str, chunks: Iterable[Columns], where: str
) -> tuple[int, int]:
    """Publish the rows of ``chunks`` (Arrow batches, or column name -> values, at most
    ``BATCH_ROWS`` rows each, ``STREAM_BATCH_ROWS`` into a stream) as producer
    ``producer``, at most ``target.max_in_flight`` chunks sent ahead of the oldest one's
    confirm; when a confirm fails, every chunk not confirmed is sent again, under the
    same sequences (the node drops what had landed), until ``target.timeout_s`` has
    passed without a chunk confirmed. (rows, retries)."""
    connection: Connection | None = None
    in_flight: collections.deque[_Chunk] = collections.deque()
    # through an exchange: each set of queues a run goes to, and the next sequence its
    # producer gives, after the chunks sent so far (see _send_runs)
    routed: dict[tuple[str, ...], int] = {}
    chunks = iter(chunks)
    sequence = confirmed = retries = 0
    deadline: float | None = None  # set once chunks wait to be sent (their upstream's
    pause = RETRY_PAUSE_S[0]  # time, a sort within partitions say, is not the node's)
    try:
        while True:
            while len(in_flight) < target.max_in_flight:
                columns = next(chunks, None)
                if columns is None:
                    break
                runs = _encoded_runs(columns, target, where, sequence)
                count = sum(len(payloads) for _, payloads in runs)
                in_flight.append(_Chunk(sequence, count, runs))
                sequence += count
            if not in_flight:
                return confirmed, retries
            if deadline is None:
                deadline = time.monotonic() + target.timeout_s
            oldest = in_flight[0]
            try:
                if connection is None:
                    connection = node_connection(
                        target.endpoint, target.key_file, target.key, WarrenWriteError
                    )
                for chunk in in_flight:
                    if chunk.confirms is None:
                        if chunk.routed_before is None:
                            chunk.routed_before = dict(routed)
                        else:  # sent again after a failure: from where it began
                            routed = dict(chunk.routed_before)
                        chunk.confirms = _send_runs(connection, target, chunk, producer, routed)
                for confirm in oldest.confirms or ():
                    confirm.result()
            except Exception as exc:
                if not retryable(exc) or time.monotonic() + pause > deadline:
                    last = in_flight[-1]
                    raise WarrenWriteError(
                        f"{where}: rows {oldest.sequence}..{last.sequence + last.count - 1} "
                        f"were not confirmed: {type(exc).__name__}: {exc} (after {retries} "
                        f"retries; the {oldest.sequence} rows before them are confirmed)"
                    ) from None
                retries += 1
                log.warning(
                    "%s: %s; publishing rows %d.. again in %.1f s",
                    where,
                    exc,
                    oldest.sequence,
                    pause,
                )
                if connection is not None:
                    connection.close()
                    connection = None
                for chunk in in_flight:
                    chunk.confirms = None
                time.sleep(pause)
                pause = min(pause * 2, RETRY_PAUSE_S[1])
                continue
            in_flight.popleft()
            confirmed += oldest.count
            deadline = None
            pause = RETRY_PAUSE_S[0]
    finally:
        if connection is not None:
            connection.close()


@dataclasses.dataclass
class _Chunk:
    """A chunk's rows as encoded runs, from ``sequence``; ``confirms`` once sent."""

    sequence: int
    count: int
    runs: list[tuple[str, list[bytes]]]
    confirms: list[Any] | None = None
    routed_before: dict[tuple[str, ...], int] | None = None  # exchange: sequences before it


def _send_runs(
    connection: Connection,
    target: Target,
    chunk: _Chunk,
    producer: str,
    routed: dict[tuple[str, ...], int],
) -> list[Any]:
    """Each run of the chunk's encoded messages (one routing key) sent, in order; their
    confirms. The connection cuts a run into Publishes: of ``PUBLISH_BATCH`` messages
    into a queue, into a stream one Publish (one chunk) while it keeps under the bytes
    one Publish holds.

    Into a queue or a stream a row's sequence is its index in the partition. Through an
    exchange each queue sees only the rows routed to it, and a queue refuses a gap in a
    producer's sequences: so each set of queues a run is routed to has a producer of its
    own (the task's name and the set's digest) whose sequences count the rows sent to
    that set (``routed``, advanced here), as a recovering connection's own producers do.
    A retried task routes its rows the same way, while the bindings stay as they were.
    Rows naming their own queue or stream (``Target.destination_column``) are routed so
    too, each destination a set of one (a stream column's names checked to be streams,
    each once)."""
    confirms = []
    sequence = chunk.sequence
    for key, payloads in chunk.runs:
        if not payloads:
            continue
        exchange = target.exchange or ""
        run_producer, run_sequence = producer, sequence
        queues: tuple[str, ...] = ()
        if exchange:
            with connection._lock:
                queues = tuple(sorted(connection._route(exchange, key, target.mandatory)))
        elif target.destination_column is not None or target.partitions:  # a row's own
            if target.destination_column == "stream" and (key,) not in routed:
                _check_stream(connection, key, target.endpoint)
            queues = (key,)
        if queues:
            digest = hashlib.blake2b("\0".join(queues).encode(), digest_size=8).hexdigest()
            run_producer, run_sequence = f"{producer}@{digest}", routed.get(queues, 0)
            routed[queues] = run_sequence + len(payloads)
        confirms.append(
            connection._send_runs(
                key,
                [(target.persistent, None, payloads)],
                exchange,
                target.mandatory,
                run_producer,
                run_sequence,
                awaited=True,
            )
        )
        sequence += len(payloads)
    return confirms


def _encoded_runs(
    columns: Columns, target: Target, where: str, first: int
) -> list[tuple[str, list[bytes]]]:
    """A chunk's rows as runs of (routing key, encoded messages), in row order (rows
    naming their own destination: one run a destination, each its rows in their order);
    ``WarrenWriteError`` names the first row that cannot be published. An Arrow batch
    whose only values are its bodies (every other column null, but a destination column)
    is encoded whole, its messages sharing one prefix (``encode_bodies``); any other
    chunk row by row."""
    from ..message import encode

    if target.ignore_unknown_columns:
        columns = _known_columns(columns)
    destination = target.destination_column
    if not isinstance(columns, dict):
        names = columns.schema.names
        # a queue's or a stream's messages take its name as their key, whatever the row's;
        # a destination column is the runs' keys, or overridden by an option
        ignored = ["body"] if target.exchange is not None else ["body", "routing_key"]
        ignored += DESTINATION_COLUMNS
        if all(
            columns.column(i).null_count == columns.num_rows
            for i, name in enumerate(names)
            if name not in ignored
        ):
            body = columns.column(names.index("body"))
            if body.null_count:
                index = body.is_null().to_pylist().index(True)
                raise WarrenWriteError(
                    f"{where}, row {first + index}: body is null; every row needs a binary "
                    f"or string body"
                )
            if target.partitions:
                return _runs_by_partition(columns, body, target, where, first)
            if destination is None:
                return [(_default_key(target), encode_bodies(body, target.persistent))]
            destinations = columns.column(names.index(destination))
            return _runs_by_destination(destinations, body, target, where, first)
        columns = {name: columns.column(i).to_pylist() for i, name in enumerate(names)}
    runs: list[tuple[str, list[bytes]]] = []
    grouped: dict[str, list[bytes]] = {}
    for key, message in _messages(columns, target, where, first):
        if destination is not None or target.partitions:
            grouped.setdefault(key, []).append(encode(message))
            continue
        if not runs or runs[-1][0] != key:
            runs.append((key, []))
        runs[-1][1].append(encode(message))
    return list(grouped.items()) if destination is not None or target.partitions else runs


def _runs_by_partition(
    columns: pyarrow.RecordBatch, bodies: pyarrow.Array, target: Target, where: str, first: int
) -> list[tuple[str, list[bytes]]]:
    """Bodies without properties grouped by the super stream partition each row's
    routing key hashes to (``warren.queues.client.spark_partitions``): each row's
    partition is its destination."""
    import numpy as np
    import pyarrow as pa

    names = columns.schema.names
    keyless = target.keyless_partition
    if "routing_key" in names:
        keys = columns.column(names.index("routing_key"))
        rows = key_partitions(keys, len(target.partitions), keyless)
    else:
        rows = np.full(len(bodies), keyless, dtype=np.int64)
    destinations = pa.array(target.partitions).take(pa.array(rows))
    return _runs_by_destination(destinations, bodies, target, where, first)


def _runs_by_destination(
    destinations: pyarrow.Array, bodies: pyarrow.Array, target: Target, where: str, first: int
) -> list[tuple[str, list[bytes]]]:
    """Bodies without properties grouped by the destination each row names, in the
    order the destinations first appear, each group encoded whole (``encode_bodies``)."""
    import pyarrow.compute as pc

    missing = pc.or_kleene(pc.is_null(destinations), pc.equal(destinations, ""))
    if pc.any(missing).as_py():
        index = missing.to_pylist().index(True)
        raise _no_destination(target, where, first + index, destinations[index].as_py())
    return [
        (name, encode_bodies(bodies.filter(pc.equal(destinations, name)), target.persistent))
        for name in pc.unique(destinations).to_pylist()
    ]


def _no_destination(target: Target, where: str, row: int, value: str | None) -> WarrenWriteError:
    column = target.destination_column
    return WarrenWriteError(
        f"{where}, row {row}: {column} is {'empty' if value == '' else 'null'}; every row "
        f"names its {column} (or give option {column})"
    )


def _known_columns(columns: Columns) -> Columns:
    """``columns`` without those Warren does not publish (option ignoreUnknownColumns)."""
    if isinstance(columns, dict):
        return {name: values for name, values in columns.items() if name in COLUMNS}
    return columns.select([name for name in columns.schema.names if name in COLUMNS])


def encode_bodies(bodies: pyarrow.Array, persistent: bool) -> list[bytes]:
    """The encoding (``warren.queues.message.encode``, byte for byte) of a message
    without properties for each of ``bodies`` (binary or string, no null), built by
    Arrow and numpy from the column's buffers: one prefix shared by every message
    (``body_prefix``), each body's msgpack bin header, and its bytes; the only Python
    object made per row is the encoded message itself."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from ..message import Message, body_prefix

    count = len(bodies)
    if count == 0:
        return []
    bodies = bodies.cast(pa.large_binary())  # a string's UTF-8 bytes, as they are
    offsets = np.frombuffer(bodies.buffers()[1], np.int64, count + 1, bodies.offset * 8)
    sizes = np.diff(offsets)
    prefix = np.frombuffer(body_prefix(Message(b"", persistent=persistent)), np.uint8)
    # msgpack's bin 8, 16 or 32: a marker byte, then the size in 1, 2 or 4 bytes
    widths = np.where(sizes < 0x100, 1, np.where(sizes < 0x10000, 2, 4))
    head_sizes = len(prefix) + 1 + widths
    head_offsets = np.zeros(count + 1, np.int64)
    np.cumsum(head_sizes, out=head_offsets[1:])
    heads: Any  # the headers' bytes, one after the other
    if widths.min() == widths.max():  # the common case: one shape of header for all
        width = int(widths[0])
        heads = np.empty((count, len(prefix) + 1 + width), np.uint8)
        heads[:, : len(prefix)] = prefix
        heads[:, len(prefix)] = _BIN_MARKERS[width]
        for byte in range(width):
            heads[:, len(prefix) + 1 + byte] = sizes >> (8 * (width - 1 - byte)) & 0xFF
    else:
        heads = np.empty(int(head_offsets[-1]), np.uint8)
        starts = head_offsets[:-1]
        for shift, value in enumerate(prefix):
            heads[starts + shift] = value
        for width, marker in _BIN_MARKERS.items():
            rows = widths == width
            if not rows.any():
                continue
            markers = starts[rows] + len(prefix)
            heads[markers] = marker
            for byte in range(width):
                heads[markers + 1 + byte] = sizes[rows] >> (8 * (width - 1 - byte)) & 0xFF
    head_array = pa.Array.from_buffers(
        pa.large_binary(),
        count,
        [None, pa.py_buffer(head_offsets), pa.py_buffer(heads)],
    )
    nothing = pa.scalar(b"", pa.large_binary())
    encoded: list[bytes] = pc.binary_join_element_wise(head_array, bodies, nothing).to_pylist()
    return encoded


_BIN_MARKERS = {1: 0xC4, 2: 0xC5, 4: 0xC6}  # msgpack's bin 8, 16 and 32, by size bytes


def _default_key(target: Target) -> str:
    if target.exchange is None:
        return target.queue or ""  # none: each row names its own (destination_column)
    return target.routing_key


def _messages(
    columns: dict[str, list], target: Target, where: str, first: int
) -> list[tuple[str, Message]]:
    """(routing key, Message) for each row of a chunk; ``WarrenWriteError`` names the
    first row that cannot be published."""
    from ..message import Message

    bodies = columns["body"]
    count = len(bodies)
    nothing = [None] * count
    keys = columns.get("routing_key", nothing)
    headers = columns.get("headers", nothing)
    ids = columns.get("message_id", nothing)
    persistent = target.persistent
    default_key = _default_key(target)
    destinations = columns.get(target.destination_column or "", nothing)
    out = []
    for index, body in enumerate(bodies):
        if type(body) is not bytes:
            if isinstance(body, str):
                body = body.encode()
            elif isinstance(body, (bytearray, memoryview)):
                body = bytes(body)
            else:
                raise WarrenWriteError(
                    f"{where}, row {first + index}: body is "
                    f"{'null' if body is None else type(body).__name__}; every row needs a "
                    f"binary or string body"
                )
        row_headers = headers[index]
        if isinstance(row_headers, list):  # Arrow gives a map as (key, value) pairs
            row_headers = dict(row_headers)
        key = (keys[index] or default_key) if target.exchange is not None else default_key
        if target.partitions:
            partitions = target.partitions
            key = partitions[row_partition(keys[index], len(partitions), target.keyless_partition)]
        elif target.destination_column is not None:
            key = destinations[index]
            if not key:
                raise _no_destination(target, where, first + index, key)
        # No timestamp: a retried task must publish the same bytes (see
        # ``warren.queues.client.publishing.publish_stamp``).
        out.append(
            (key, Message(body, ids[index], row_headers or None, None, None, None, persistent))
        )
    return out


def _chunk_rows(target: Target) -> int:
    """Rows a chunk holds: into streams an Arrow batch, a stream's chunk; else BATCH_ROWS."""
    if target.stream or target.partitions or target.destination_column == "stream":
        return STREAM_BATCH_ROWS
    return BATCH_ROWS


def _arrow_chunks(batches: Iterator[Any], rows: int) -> Iterator[pyarrow.RecordBatch]:
    for batch in batches:
        for start in range(0, batch.num_rows, rows):
            yield batch.slice(start, rows)


def _joined(batches: Iterator[Any], rows: int) -> Iterator[pyarrow.RecordBatch]:
    """Consecutive Arrow batches joined into batches of at least ``rows`` (the last may
    be short), the same way whenever a task is run again."""
    import pyarrow as pa

    pending: list[Any] = []
    count = 0
    for batch in batches:
        pending.append(batch)
        count += batch.num_rows
        if count >= rows:
            yield pending[0] if len(pending) == 1 else pa.concat_batches(pending)
            pending, count = [], 0
    if pending:
        yield pending[0] if len(pending) == 1 else pa.concat_batches(pending)


def _row_chunks(rows: Iterable[Any]) -> Iterator[dict[str, list]]:
    columns: dict[str, list] = {}
    count = 0
    for row in rows:
        for name, value in row.asDict().items():
            columns.setdefault(name, []).append(value)
        count += 1
        if count == BATCH_ROWS:
            yield columns
            columns, count = {}, 0
    if count:
        yield columns


def _task_context() -> TaskContext:
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        raise WarrenWriteError("a Warren write publishes from inside a Spark task only")
    return context


def _task() -> tuple[int, int]:
    context = _task_context()
    return context.partitionId(), context.attemptNumber()


def _for_task(target: Target, partition: int) -> Target:
    """The target as Spark partition ``partition``'s task writes it: into a super
    stream, its rows without a routing key go to partition ``partition`` mod N."""
    if not target.partitions:
        return target
    return dataclasses.replace(target, keyless_partition=partition % len(target.partitions))


class WarrenWriter(DataSourceArrowWriter):
    """A batch write: runs ``write`` on the executors, ``commit``/``abort`` on the driver."""

    def __init__(self, target: Target, job: str) -> None:
        self.target, self.job = target, job

    def write(self, iterator: Iterator[Any]) -> PartitionWritten:
        partition, attempt = _task()
        target = _for_task(self.target, partition)
        chunks = _arrow_chunks(iterator, _chunk_rows(target))
        if target.partitions:  # at most a few stream chunks held at once
            rows = min(PARTITION_CHUNK_ROWS * len(target.partitions), 4 * STREAM_BATCH_ROWS)
            chunks = _joined(chunks, rows)
        rows, retries = publish_columns(
            target, f"{self.job}/{partition}", chunks, f"partition {partition} (attempt {attempt})"
        )
        return PartitionWritten(partition, attempt, rows, retries)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        _report("published", self.job, self.target, messages)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        _report("FAILED; the finished tasks published", self.job, self.target, messages)


class WarrenStreamWriter(DataSourceStreamWriter):
    """A streaming write: each micro-batch as a batch write whose producers name it."""

    def __init__(self, target: Target, job: str) -> None:
        self.target, self.job = target, job

    def write(self, iterator: Iterator[Any]) -> PartitionWritten:
        context = _task_context()
        batch = context.getLocalProperty("streaming.sql.batchId") or "0"
        query = context.getLocalProperty("sql.streaming.queryId") or self.job
        partition, attempt = context.partitionId(), context.attemptNumber()
        rows, retries = publish_columns(
            _for_task(self.target, partition),
            f"{query}/{batch}/{partition}",
            _row_chunks(iterator),
            f"micro-batch {batch}, partition {partition} (attempt {attempt})",
        )
        return PartitionWritten(partition, attempt, rows, retries)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _report(f"micro-batch {batchId} published", self.job, self.target, messages)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _report(
            f"micro-batch {batchId} FAILED; the finished tasks published",
            self.job,
            self.target,
            messages,
        )


def _report(
    what: str, job: str, target: Target, messages: list[WriterCommitMessage | None]
) -> None:
    done = [m for m in messages if isinstance(m, PartitionWritten)]
    retried = sorted(m.partition for m in done if m.attempt > 0)
    if target.super_stream:
        where = f"super stream {target.super_stream!r}"
    elif target.stream:
        where = f"stream {target.stream!r}"
    elif target.queue:
        where = f"queue {target.queue!r}"
    elif target.exchange is not None:
        where = f"exchange {target.exchange!r}"
    else:
        where = f"the {target.destination_column} each row names"
    line = (
        f"warren: write {job} {what} {sum(m.rows for m in done):,} rows from "
        f"{len(done)} of {len(messages)} partitions into {where} (tasks run again: "
        f"{', '.join(map(str, retried)) or 'none'}; chunks re-sent to a node that was "
        f"away: {sum(m.retries for m in done)})"
    )
    log.info("%s", line)
    print(line, file=sys.stderr, flush=True)


class WarrenDataSource(DataSource):
    """``format("warren")``: writes (see the module docstring) and reads of streams
    (``warren.queues.client.spark_read``)."""

    @classmethod
    def name(cls) -> str:
        return "warren"

    def schema(self) -> str:
        from .spark_read import read_schema

        return read_schema(self.options)

    def reader(self, schema: StructType) -> DataSourceReader:
        from .spark_read import Source, WarrenBatchReader

        return WarrenBatchReader(Source.from_options(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from .spark_read import Source, WarrenStreamReader

        return WarrenStreamReader(Source.from_options(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> WarrenWriter:
        return WarrenWriter(*self._plan(schema, overwrite))

    def streamWriter(self, schema: StructType, overwrite: bool) -> WarrenStreamWriter:
        return WarrenStreamWriter(*self._plan(schema, overwrite))

    def _plan(self, schema: StructType, overwrite: bool) -> tuple[Target, str]:
        if overwrite:
            raise WarrenWriteError('a queue cannot be overwritten: use mode("append")')
        target = Target.from_options(dict(self.options), columns=schema.names)
        overridden = DESTINATION_COLUMNS if target.destination_column is None else ()
        check_schema(schema, target.ignore_unknown_columns, overridden)
        if target.stream is not None:
            _check_stream_option(target)
        if target.super_stream is not None:
            target = dataclasses.replace(target, partitions=_super_stream_partitions(target))
        job = self.options.get("producer") or uuid.uuid4().hex
        return target, job


def _check_stream_option(target: Target) -> None:
    """On the driver, before any task: the stream option names a stream."""
    from ..errors import QueueRestarting

    connection = node_connection(target.endpoint, target.key_file, target.key, WarrenWriteError)
    try:
        _check_stream(connection, target.stream or "", target.endpoint)
    except QueueRestarting:
        pass  # declared, and coming back: the tasks retry it as they retry a node away
    finally:
        connection.close()


def _super_stream_partitions(target: Target) -> tuple[str, ...]:
    """On the driver: the partitions of the super stream option superStream names (the
    tasks route to them; a super stream's partitions never change)."""
    from ..errors import NotFound

    name = target.super_stream or ""
    connection = node_connection(target.endpoint, target.key_file, target.key, WarrenWriteError)
    try:
        return tuple(connection.partitions(name))
    except NotFound:
        raise WarrenWriteError(
            f"super stream {name!r} is not declared on {target.endpoint}: declare it first "
            f"(warren declare queue {name} --type super-stream --partitions N)"
        ) from None
    finally:
        connection.close()


def _check_stream(connection: Connection, name: str, endpoint: str) -> None:
    """``name`` is a stream's (an option's, or a row's stream column), or
    ``WarrenWriteError`` says what it is; ``QueueRestarting`` when it is coming back."""
    from ..errors import NotFound, QueueRestarting

    try:
        if not connection.is_stream(name):
            raise WarrenWriteError(
                f"{name!r} is a classic queue, not a stream: write into it with option queue "
                f"(or a queue column), or declare a stream (type='stream')"
            )
    except QueueRestarting:
        raise
    except NotFound:
        raise WarrenWriteError(
            f"stream {name!r} is not declared on {endpoint}: declare it first "
            f"(warren declare queue {name} --type stream)"
        ) from None


def register(spark: SparkSession) -> None:
    """Make ``format("warren")`` known to this session."""
    spark.dataSource.register(WarrenDataSource)


def partition_publisher(
    endpoint: str,
    *,
    producer: str,
    queue: str | None = None,
    exchange: str | None = None,
    routing_key: str | None = None,
    key_file: str | None = None,
    key: str | None = None,
    persistent: bool = True,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> Callable[[Iterable], None]:
    """For Spark 3: a function for ``df.foreachPartition`` that publishes each partition
    as producer ``<producer>/<partition>`` (give the job a stable name)."""
    options = {
        "endpoint": endpoint,
        "persistent": str(persistent).lower(),
        "timeout_s": str(timeout_s),
    }
    for name, value in (
        ("queue", queue),
        ("exchange", exchange),
        ("routing_key", routing_key),
        ("key_file", key_file),
        ("key", key),
    ):
        if value is not None:
            options[name] = value
    target = Target.from_options(options)
    if not producer:
        raise WarrenWriteError("partition_publisher needs a producer name for the job")

    def publish_partition(rows: Iterable) -> None:
        partition, attempt = _task()
        publish_columns(
            target,
            f"{producer}/{partition}",
            _row_chunks(rows),
            f"partition {partition} (attempt {attempt})",
        )

    return publish_partition


def local_session(app_name: str = "warren", cores: int = 2, max_failures: int = 2) -> SparkSession:
    """A local SparkSession kept on loopback and quiet, its workers on this python;
    ``local[cores, max_failures]`` retries a failed task ``max_failures - 1`` times.
    Option ``key`` (a client's secret key) is redacted where Spark shows options, beside
    Spark's own ``url``."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spark = (
        SparkSession.builder.master(f"local[{cores},{max_failures}]")
        .appName(app_name)
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.redaction.options.regex", REDACTED_OPTIONS)
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark

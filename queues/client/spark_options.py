"""What both directions of the ``warren`` Spark data source share: the options that name a
node and a queue or stream (``Target``), and how a task or the driver tells a failure
worth retrying (the node or a queue was away) from a mistake (``retryable``).

``Target`` is checked on the driver, where a wrong option fails the job before any task
runs, and is picklable: it travels to the executors. An option the source does not take
is refused there too, compared without case as Spark compares options (it passes them
in lower case): a misspelt option would otherwise leave its default in force unseen.
A CURVE key reaches the executors as option ``key`` (a key file's content in base64,
in the options themselves) or as option ``key_file``: a path on each machine that runs
a task, or the name of a file shipped with ``SparkContext.addFile`` (found through
``SparkFiles.get`` where the path is not there): ``node_connection``. Retrying is the
caller's loop (``spark.publish_columns`` for writes, ``spark_read.NodeSession`` for
reads): attempts ``RETRY_PAUSE_S`` apart, doubling, until ``timeout_s`` passes without
progress.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import difflib
import math
import os
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from ..errors import KeyFileError, WarrenReadError, WarrenWriteError
from .keys import ClientKey, load_client_key, parse_client_key

if TYPE_CHECKING:
    from .connection import Connection

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "READ_OPTIONS",
    "RETRY_PAUSE_S",
    "WRITE_OPTIONS",
    "DESTINATION_COLUMNS",
    "Target",
    "check_known",
    "client_key",
    "node_connection",
    "retryable",
]

DEFAULT_TIMEOUT_S = 120.0
# A task's chunks sent ahead of the first one's confirm (option max_in_flight): the next
# is encoded and sent while the node writes and syncs the one before; each holds its rows
# until confirmed (BATCH_ROWS into a queue, an Arrow batch into a stream).
DEFAULT_CHUNKS_IN_FLIGHT = 4
MAX_CHUNKS_IN_FLIGHT = 64
RETRY_PAUSE_S = (0.2, 5.0)  # between attempts: from, to
# A write's columns that name each row's destination when no option names one (Kafka's
# sink: its topic column); an option overrides them
DESTINATION_COLUMNS = ("queue", "stream")
WRITE_OPTIONS = (
    "endpoint",
    "queue",
    "stream",
    "superStream",
    "exchange",
    "routing_key",
    "key_file",
    "key",
    "persistent",
    "mandatory",
    "producer",
    "timeout_s",
    "ignoreUnknownColumns",
    "max_in_flight",
    "checkpointLocation",  # Spark's own, which it passes to a streaming write
    "queryName",
)
READ_OPTIONS = (
    "endpoint",
    "stream",
    "streamPattern",
    "superStream",
    "key_file",
    "key",
    "timeout_s",
    "startingOffsets",
    "startingOffsetsByTimestamp",
    "startingOffsetsByTimestampStrategy",
    "endingOffsets",
    "endingOffsetsByTimestamp",
    "failOnDataLoss",
    "partitionBytes",
    "minPartitions",
    "maxRecordsPerTrigger",
    "maxBytesPerTrigger",
    "minOffsetsPerTrigger",
    "maxTriggerDelay",
    "consumerName",
    "includeHeaders",
)


def check_known(
    given: Iterable[str], known: Sequence[str], error: type[Exception], what: str
) -> None:
    """Refuse the options in ``given`` that are not in ``known``, case aside, naming the
    option each is closest to."""
    names = {name.lower(): name for name in known}
    for option in sorted(given):
        if option.lower() not in names:
            close = difflib.get_close_matches(option.lower(), names, n=1)
            hint = f"did you mean {names[close[0]]!r}? " if close else ""
            raise error(
                f"option {option!r} is not one {what} takes ({hint}it takes {', '.join(known)})"
            )


@dataclasses.dataclass(frozen=True)
class Target:
    """Where and how a task publishes (picklable: it travels to the executors)."""

    endpoint: str
    queue: str | None
    exchange: str | None
    routing_key: str
    key_file: str | None
    persistent: bool
    timeout_s: float
    mandatory: bool = True

    stream: str | None = None  # the queue named is a stream, checked when planned
    key: str | None = dataclasses.field(default=None, repr=False)  # a key file's, base64
    ignore_unknown_columns: bool = False  # columns Warren does not publish are dropped
    max_in_flight: int = DEFAULT_CHUNKS_IN_FLIGHT  # chunks a task has sent unconfirmed
    # "queue" or "stream": each row names its own, in that column (no option names one)
    destination_column: str | None = None
    super_stream: str | None = None  # option superStream: rows go to its partitions
    partitions: tuple[str, ...] = ()  # its partition streams, looked up on the driver
    keyless_partition: int = 0  # where a task sends its rows without a routing_key

    @classmethod
    def from_options(
        cls, options: dict[str, str], reading: bool = False, columns: Sequence[str] = ()
    ) -> Target:
        """The options' target (a write's ``columns`` may name each row's:
        ``DESTINATION_COLUMNS``); ``WarrenReadError`` (reading) or ``WarrenWriteError``
        naming the option that is wrong."""
        error = WarrenReadError if reading else WarrenWriteError
        if reading:
            check_known(options, READ_OPTIONS, error, "a read of a stream")
        else:
            check_known(options, WRITE_OPTIONS, error, "a write")
        endpoint = options.get("endpoint")
        if not endpoint or not all(
            part.strip().startswith("tcp://") for part in endpoint.split(",")
        ):
            raise error(
                "option endpoint is required: the node's listener, "
                "tcp://host:port (warren node --listen ...), or a cluster's nodes, "
                "tcp://host:port,tcp://host:port,..."
            )
        queue, stream, exchange = (
            options.get("queue"),
            options.get("stream"),
            options.get("exchange"),
        )
        given = {name.lower(): value for name, value in options.items()}
        super_stream = given.get("superstream")
        if reading and (
            [bool(stream), bool(given.get("streampattern")), bool(super_stream)].count(True) != 1
            or queue is not None
            or exchange is not None
        ):
            raise error(
                "a read names option stream (a stream's name, or several separated by "
                "commas), option streamPattern (a regular expression) or option superStream "
                "(a super stream's name), one of the three, and no queue or exchange: a "
                "queue's messages are consumed, not read"
            )
        destination_column = None
        if not reading and [queue, stream, exchange, super_stream].count(None) == 4:
            named = [name for name in DESTINATION_COLUMNS if name in columns]
            if len(named) > 1:
                raise error(
                    "the rows have a queue and a stream column: keep the one naming each "
                    "row's destination, or give option queue, stream or exchange"
                )
            destination_column = named[0] if named else None
        destinations = [queue, stream, exchange, super_stream]
        if not reading and destinations.count(None) != 3 and not destination_column:
            raise error(
                "give exactly one of the options queue, stream, superStream and exchange, or "
                "a queue or stream column naming each row's"
            )
        if stream is not None:
            queue = stream
        flags = {}
        for flag, default in (
            ("persistent", "true"),
            ("mandatory", "true"),
            ("ignoreUnknownColumns", "false"),
        ):
            flags[flag] = str(given.get(flag.lower(), default)).lower()
            if flags[flag] not in ("true", "false"):
                raise error(f"option {flag} is true or false, not {flags[flag]!r}")
        try:
            timeout_s = float(options.get("timeout_s", DEFAULT_TIMEOUT_S))
        except ValueError:
            raise error(
                f"option timeout_s is a number of seconds, not {options['timeout_s']!r}"
            ) from None
        if not 0 < timeout_s < math.inf:
            raise error("option timeout_s must be a positive number of seconds")
        in_flight = given.get("max_in_flight", str(DEFAULT_CHUNKS_IN_FLIGHT))
        if not (in_flight.isdigit() and 1 <= int(in_flight) <= MAX_CHUNKS_IN_FLIGHT):
            raise error(
                f"option max_in_flight is the chunks a task sends before the first is "
                f"confirmed, 1..{MAX_CHUNKS_IN_FLIGHT}; not {in_flight!r}"
            )
        key = options.get("key")
        if key is not None:
            if options.get("key_file") is not None:
                raise error("give option key or option key_file, not both: they name one key")
            client_key(None, key, error)  # on the driver: a bad key fails the job at once
        return cls(
            endpoint,
            queue,
            exchange,
            options.get("routing_key", queue or ""),
            options.get("key_file"),
            flags["persistent"] == "true",
            timeout_s,
            flags["mandatory"] == "true",
            stream,
            key,
            flags["ignoreUnknownColumns"] == "true",
            int(in_flight),
            destination_column,
            super_stream,
        )


def client_key(key_file: str | None, key: str | None, error: type[Exception]) -> ClientKey | None:
    """The CURVE key of options ``key_file`` and ``key`` (None: none given), on the
    driver or on an executor; ``error`` says what is wrong with it. ``key`` is a key
    file's content in base64 (``base64 -w0 NAME.key``); ``key_file`` a path on the
    machine that runs the task, or else the name of a file shipped to every executor with
    ``SparkContext.addFile``."""
    if key is not None:
        try:
            text = base64.b64decode(key, validate=True)
        except (binascii.Error, ValueError):
            raise error(
                "option key is a client key file's content in base64 (base64 -w0 NAME.key); "
                "what it holds is not base64"
            ) from None
        try:
            return parse_client_key(text, "option key")
        except KeyFileError as exc:
            raise error(str(exc)) from None
    if key_file is None:
        return None
    path = key_file if os.path.exists(key_file) else _shipped(key_file)
    try:
        return load_client_key(path or key_file)
    except KeyFileError as exc:
        hint = (
            ""
            if path
            else "; on other machines, ship it with spark.sparkContext.addFile(path) or "
            "give its content as option key"
        )
        raise error(f"option key_file: {exc}{hint}") from None


def _shipped(key_file: str) -> str | None:
    """Where ``SparkContext.addFile`` put a file of ``key_file``'s name on this machine,
    if it did."""
    try:
        from pyspark import SparkFiles

        shipped = SparkFiles.get(os.path.basename(key_file))
    except Exception:  # no Spark here, or no file shipped
        return None
    return shipped if os.path.exists(shipped) else None


def node_connection(
    endpoint: str, key_file: str | None, key: str | None, error: type[Exception]
) -> Connection:
    """A connection to the node at ``endpoint`` (or, named by several addresses
    separated by commas, to whichever node of that cluster leads) with the key of the
    options."""
    from . import connect

    nodes = [part.strip() for part in endpoint.split(",")]
    return connect(nodes if len(nodes) > 1 else endpoint, key=client_key(key_file, key, error))


def retryable(exc: Exception) -> bool:
    """Whether a failed request (a chunk published, a range read) may succeed if sent
    again: the node, a queue or a stream was away, or restarted with it in doubt; not a
    mistake in the request itself."""
    from warren.actors import ActorError

    from ..errors import Blocked, ConnectionClosed, Nacked, NodeNotRunning, QueueRestarting

    return isinstance(
        exc,
        (
            Nacked,
            NodeNotRunning,
            QueueRestarting,
            ConnectionClosed,
            Blocked,
            TimeoutError,
            ActorError,
            OSError,
        ),
    )

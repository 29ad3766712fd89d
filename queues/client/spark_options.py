"""What both directions of the ``warren`` Spark data source share: the options that name a
node and a queue or stream (``Target``), and how a task or the driver tells a failure
worth retrying (the node or a queue was away) from a mistake (``retryable``).

``Target`` is checked on the driver, where a wrong option fails the job before any task
runs, and is picklable: it travels to the executors. An option the source does not take
is refused there too, compared without case as Spark compares options (it passes them
in lower case): a misspelt option would otherwise leave its default in force unseen.
Retrying is the caller's loop (``spark.publish_columns`` for writes,
``spark_read.NodeSession`` for reads): attempts ``RETRY_PAUSE_S`` apart, doubling, until
``timeout_s`` passes without progress.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Iterable, Sequence

from ..errors import WarrenReadError, WarrenWriteError

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "READ_OPTIONS",
    "RETRY_PAUSE_S",
    "WRITE_OPTIONS",
    "Target",
    "check_known",
    "retryable",
]

DEFAULT_TIMEOUT_S = 120.0
RETRY_PAUSE_S = (0.2, 5.0)  # between attempts: from, to
WRITE_OPTIONS = (
    "endpoint",
    "queue",
    "stream",
    "exchange",
    "routing_key",
    "key_file",
    "persistent",
    "mandatory",
    "producer",
    "timeout_s",
    "checkpointLocation",  # Spark's own, which it passes to a streaming write
    "queryName",
)
READ_OPTIONS = (
    "endpoint",
    "stream",
    "key_file",
    "timeout_s",
    "startingOffsets",
    "endingOffsets",
    "failOnDataLoss",
    "partitionBytes",
    "maxRecordsPerTrigger",
    "consumerName",
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

    @classmethod
    def from_options(cls, options: dict[str, str], reading: bool = False) -> Target:
        """The options' target; ``WarrenReadError`` (reading) or ``WarrenWriteError``
        naming the option that is wrong."""
        error = WarrenReadError if reading else WarrenWriteError
        if reading:
            check_known(options, READ_OPTIONS, error, "a read of a stream")
        else:
            check_known(options, WRITE_OPTIONS, error, "a write")
        endpoint = options.get("endpoint")
        if not endpoint or not endpoint.startswith("tcp://"):
            raise error(
                "option endpoint is required: the node's listener, "
                "tcp://host:port (warren node --listen ...)"
            )
        queue, stream, exchange = (
            options.get("queue"),
            options.get("stream"),
            options.get("exchange"),
        )
        if reading and (not stream or queue is not None or exchange is not None):
            raise error(
                "a read names option stream (the stream's name), and no queue or exchange: "
                "a queue's messages are consumed, not read"
            )
        if not reading and [queue, stream, exchange].count(None) != 2:
            raise error("give exactly one of the options queue, stream and exchange")
        if stream is not None:
            queue = stream
        flags = {}
        for flag in ("persistent", "mandatory"):
            flags[flag] = options.get(flag, "true").lower()
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
        )


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

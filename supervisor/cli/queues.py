"""The ``warren`` commands that work on a running node's queues, through ``warren.connect``.
Each names its node with ``--data-dir D`` (on this machine) or ``--url tcp://HOST:PORT``
(its listener; ``--key-file K`` for a node that wants CURVE); written here as ``NODE``:

    warren queues NODE [--json]                  every queue: state, messages, states, bytes
    warren exchanges NODE [--json]               the declared exchanges
    warren bindings NODE [--json]                exchange, queue and routing key of each
    warren declare queue NAME NODE [--transient --lazy --message-ttl-ms N --max-length N
                   --overflow drop-head|reject-publish --dead-letter-exchange E
                   --dead-letter-routing-key K --auto-delete --expires-ms N]
    warren declare queue NAME NODE --type stream [--max-length-bytes SIZE --max-age 7D
                   --max-segment-size SIZE --sync-policy fsync|flush]
    warren declare queue NAME NODE --type quorum [a classic queue's options but --transient,
                   --lazy, --auto-delete; --delivery-limit N --dead-letter-strategy
                   at-most-once|at-least-once --single-active-consumer]
    warren declare queue NAME NODE --type super-stream --partitions N [a stream's options]
                                                 streams NAME-0 .. NAME-(N-1) and exchange
                                                 NAME, which routes by the key's hash
    warren streams NODE [--json]                 every stream: offsets, segments, bytes, and
                                                 each named consumer's offset and lag (and
                                                 consumer group); each super stream's partitions
    warren declare exchange NAME NODE [--kind direct|fanout|topic --transient
                                     --alternate-exchange NAME]
    warren bind QUEUE EXCHANGE NODE [--routing-key K]
    warren unbind QUEUE EXCHANGE NODE [--routing-key K]
    warren publish QUEUE NODE [--exchange E] [--count N --size BYTES]
                                                 lines of stdin as messages, or N generated
    warren consume QUEUE NODE [--count N]        print and ack messages (all that are ready)
    warren consume STREAM NODE [--offset first|last|next|N|1h] [--name C] [--count N]
                                                 print a stream's records (all committed)
    warren purge QUEUE NODE                      drop the ready messages
    warren delete QUEUE NODE                     delete the queue
    warren delete-exchange EXCHANGE NODE         delete the exchange and its bindings

A node that is not running exits 1; an unknown queue, or any other refusal, is one line on
stderr and exit 2. Runs longer than a second report their progress on stderr.
"""

from __future__ import annotations

import argparse
import base64
import collections
import json
import math
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from warren.actors.errors import ActorDeadError
from warren.queues.client import connect
from warren.queues.client.connection import Connection, Consumer, Delivery
from warren.queues.client.greeting import nothing_listens
from warren.queues.client.stream import StreamConsumer, StreamDelivery
from warren.queues.errors import ConnectionClosed, MessageTooLarge, NodeNotRunning, QueueError
from warren.queues.message import MAX_MESSAGE_BYTES
from warren.queues.protocol import (
    DEAD_LETTER_STRATEGIES,
    OVERFLOWS,
    QUEUE_TYPES,
    SUPER_STREAM_TYPE,
    SYNC_POLICIES,
    interval_text,
)
from warren.queues.routing import EXCHANGE_KINDS

from ..errors import UsageError
from ..tables import Column, abbreviated, counted, format_table, strict_json
from .access import refuse_unreachable_node
from .output import Output, Stopped, StopSignals
from .sizes import parse_size

__all__ = ["add_queue_commands", "format_queues", "format_streams"]

EXIT_OK, EXIT_NO_NODE, EXIT_REFUSED, EXIT_INTERRUPTED = 0, 1, 2, 130
PROGRESS_EVERY_S = 1.0
POLL_S = 0.2  # a consumer's wait for the next message between looks at the signals
IDLE_END_S = 5.0  # without --count or --timeout: an empty queue this long ends the run
CONSUME_PREFETCH = 100  # deliveries a consume holds ahead of what it wrote out
# Messages a consume into a pipe writes one at a time, each taken before the next goes:
# a reader that stops within them (`| head -3`) has exactly what it used acked. After
# them a pipe's worth goes ahead of the reader, and a reader that exits holding lines it
# read but did not use (head reads a block) has those acked too: `--count N` takes N.
ONE_AT_A_TIME = 100
PUBLISH_BATCH = 1000  # messages a publish sends at once
CONFIRM_LOOK_S = 1.0  # a publish awaiting its confirm looks at the stop signals this often
NODE_LOOK_S = 3.0  # and, once it waited this long, whether its node is still there
NODE_CONNECT_S = 10.0  # how long that look gives a node that takes connections to answer
READ_BYTES = 1 << 16  # what one read of stdin takes, at most

_QUEUE_COLUMNS = (
    Column("queue", cut=True, min_width=10),
    Column("state"),
    Column("ready", ">"),
    Column("unacked", ">"),
    Column("α/β/γ/δ", ">"),
    Column("RAM", ">"),
    Column("disk", ">"),
    Column("in/out/s", ">"),
)
_EXCHANGE_COLUMNS = (
    Column("exchange", cut=True, min_width=10),
    Column("kind"),
    Column("durable"),
    Column("alternate", cut=True, min_width=9),
)
_BINDING_COLUMNS = (
    Column("exchange", cut=True, min_width=10),
    Column("queue", cut=True, min_width=10),
    Column("routing key", cut=True, min_width=10),
)


def format_queues(rows: list[dict]) -> str:
    """The queues as a table for a person at an 80-column terminal."""
    cells = []
    for row in rows:
        stats = row.get("stats")
        if stats is None:
            cells.append([row["name"], row["state"], "-", "-", "-", "-", "-", "-"])
            continue
        if row.get("type") == "stream":  # its own figures: `warren streams`
            records = abbreviated(stats["messages_ready"])  # user records, not tracking
            disk = abbreviated(stats["bytes"], "B")
            cells.append([row["name"], row["state"], records, "-", "stream", "-", disk, "-"])
            continue
        if row.get("type") == "quorum":  # no variable-queue states, no rates
            cells.append(
                [
                    row["name"],
                    row["state"],
                    abbreviated(stats["messages_ready"]),
                    abbreviated(stats["messages_unacked"]),
                    "quorum",
                    abbreviated(stats["ram_bytes"], "B"),
                    abbreviated(stats["disk_bytes"], "B"),
                    "-",
                ]
            )
            continue
        rates = stats["rates"]
        cells.append(
            [
                row["name"],
                row["state"],
                abbreviated(stats["messages_ready"]),
                abbreviated(stats["messages_unacked"]),
                "/".join(abbreviated(stats[part]) for part in ("alpha", "beta", "gamma", "delta")),
                abbreviated(stats["ram_bytes"], "B"),
                abbreviated(stats["disk_bytes"], "B"),
                f"{abbreviated(round(rates['ingress']))}/{abbreviated(round(rates['egress']))}",
            ]
        )
    return format_table(_QUEUE_COLUMNS, cells) if cells else "no queues"


def add_queue_commands(commands: argparse._SubParsersAction) -> None:
    streams = _command(commands, "streams", "list the streams, their offsets and consumers")
    streams.add_argument("--json", action="store_true", help="print every figure as JSON")
    streams.set_defaults(handler=_with_connection(_streams))
    queues = _command(commands, "queues", "the queues of the node, with their figures")
    queues.add_argument("--json", action="store_true", help="print every figure as JSON")
    queues.set_defaults(handler=_with_connection(_queues))
    exchanges = _command(commands, "exchanges", "the exchanges declared on the node")
    exchanges.add_argument("--json", action="store_true", help="print them as JSON")
    exchanges.set_defaults(handler=_with_connection(_exchanges))
    bindings = _command(commands, "bindings", "which exchange routes what to which queue")
    bindings.add_argument("--json", action="store_true", help="print them as JSON")
    bindings.set_defaults(handler=_with_connection(_bindings))

    declare = commands.add_parser("declare", help="declare a queue or an exchange")
    kinds = declare.add_subparsers(dest="declare_kind", metavar="KIND")
    queue = _command(kinds, "queue", "declare a queue (nothing happens if it exists alike)")
    queue.add_argument("name")
    queue.add_argument(
        "--passive",
        action="store_true",
        help="create nothing: say whether it exists, and its counts",
    )
    queue.add_argument("--transient", action="store_true", help="not kept across restarts")
    queue.add_argument("--lazy", action="store_true", help="every message straight to disk")
    queue.add_argument("--message-ttl-ms", type=int, help="how long a message may wait")
    queue.add_argument("--max-length", type=int, help="how many messages may wait")
    queue.add_argument(
        "--overflow",
        choices=OVERFLOWS,
        default=OVERFLOWS[0],
        help="beyond --max-length: drop the oldest (default) or refuse new ones",
    )
    queue.add_argument("--dead-letter-exchange", help="where expired and dropped ones go")
    queue.add_argument(
        "--dead-letter-routing-key",
        help="the routing key they go there with (default: each message's own)",
    )
    queue.add_argument("--auto-delete", action="store_true", help="go with the last consumer")
    queue.add_argument(
        "--expires-ms", type=int, help="go once unused this long (no consumer, get, declare)"
    )
    queue.add_argument(
        "--type",
        choices=(*QUEUE_TYPES, SUPER_STREAM_TYPE),
        default="classic",
        help="a classic queue, a quorum queue, a stream, or a super stream of --partitions streams",
    )
    queue.add_argument("--delivery-limit", type=int, help="a quorum queue's: returns before DLX")
    queue.add_argument(
        "--dead-letter-strategy",
        choices=DEAD_LETTER_STRATEGIES,
        help="a quorum queue's (at-most-once)",
    )
    queue.add_argument(
        "--single-active-consumer", action="store_true", help="a quorum queue's: one at a time"
    )
    queue.add_argument("--partitions", type=int, help="a super stream's partition streams")
    queue.add_argument("--max-length-bytes", help="a stream's retention by size: 10GB, 500MiB")
    queue.add_argument("--max-age", help="a stream's retention by age: 7D, 12h, 30m, 3600")
    queue.add_argument("--max-segment-size", help="a stream's segment files' size (500MB)")
    queue.add_argument("--sync-policy", choices=SYNC_POLICIES, help="a stream's (fsync)")
    queue.set_defaults(handler=_with_connection(_declare_queue))
    exchange = _command(kinds, "exchange", "declare an exchange")
    exchange.add_argument("name")
    exchange.add_argument("--kind", choices=EXCHANGE_KINDS, default="direct")
    exchange.add_argument("--transient", action="store_true", help="not kept across restarts")
    exchange.add_argument(
        "--alternate-exchange",
        default="",
        metavar="NAME",
        help="where what it routes to no queue goes instead",
    )
    exchange.set_defaults(handler=_with_connection(_declare_exchange))
    for name, action, text in (
        ("bind", _bind, "route an exchange's messages with a routing key to a queue"),
        ("unbind", _unbind, "undo a bind"),
    ):
        command = _command(commands, name, text)
        command.add_argument("queue")
        command.add_argument("exchange")
        command.add_argument("--routing-key", default="", help="(default: the empty key)")
        command.set_defaults(handler=_with_connection(action))

    publish = _command(commands, "publish", "publish lines of stdin, or --count generated ones")
    publish.add_argument("queue", help="the queue, or the routing key with --exchange")
    publish.add_argument("--exchange", default="", help="publish through this exchange")
    publish.add_argument("--count", type=int, help="publish this many generated messages")
    publish.add_argument(
        "--size", default="1KiB", help="size of each generated message: 100, 4KiB ... (1KiB)"
    )
    publish.add_argument("--transient", action="store_true", help="publish non-persistent messages")
    publish.set_defaults(handler=_with_connection(_publish))
    consume = _command(commands, "consume", "print and ack a queue's messages")
    consume.add_argument("queue")
    consume.add_argument(
        "--count", type=int, help="stop after this many (default: all that are ready)"
    )
    consume.add_argument(
        "--timeout", type=float, help="go on until none came for this many seconds"
    )
    consume.add_argument(
        "--requeue", action="store_true", help="put each back after printing it (a peek)"
    )
    consume.add_argument(
        "--json",
        action="store_true",
        help="one JSON object a line: body, headers, message_id, redelivered, delivery_count "
        "(a stream's: offset and timestamp_ms)",
    )
    consume.add_argument(
        "--offset", help="a stream's start: first, last, next, an offset, or 1h (that long ago)"
    )
    consume.add_argument("--name", help="a stream's named consumer: resume, store the offset")
    consume.set_defaults(handler=_with_connection(_consume))
    for name, action, text, what in (
        ("purge", _purge, "drop a queue's ready messages", "queue"),
        ("delete", _delete, "delete a queue and its messages", "queue"),
        ("delete-exchange", _delete_exchange, "delete an exchange and its bindings", "exchange"),
    ):
        command = _command(commands, name, text)
        command.add_argument(what)
        command.set_defaults(handler=_with_connection(action))


def _command(commands: argparse._SubParsersAction, name: str, text: str) -> argparse.ArgumentParser:
    """A subcommand that talks to a node: on this machine by its data directory, or over
    tcp by its listener's address (with a key file where the node wants CURVE)."""
    command = commands.add_parser(name, help=text, description=text)
    where = command.add_mutually_exclusive_group(required=True)
    where.add_argument("--data-dir", help="the node running on this data directory")
    where.add_argument("--url", help="a node's listener, tcp://HOST:PORT")
    command.add_argument("--key-file", help="with --url: a key from `warren keys`")
    return command


def _connect(args: argparse.Namespace, **options: Any) -> Connection:
    """A connection to the node the command names (``--url`` or ``--data-dir``). A command
    fails fast when its node goes away, saying so, rather than recover behind the user's
    back: ``recover=False``, so that the loss is ``ConnectionClosed``."""
    options.setdefault("recover", False)
    if args.url is not None:
        return connect(args.url, key_file=args.key_file, **options)
    if args.key_file is not None:
        raise UsageError("--key-file goes with --url: a node on this machine needs none")
    refuse_unreachable_node(args.data_dir)
    return connect(args.data_dir, **options)


def _with_connection(
    action: Callable[[Connection, argparse.Namespace], int],
) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        try:
            with _connect(args) as connection:
                return action(connection, args)
        except NodeNotRunning as exc:
            print(f"warren: {exc}", file=sys.stderr)
            return EXIT_NO_NODE
        except (ActorDeadError, TimeoutError, ConnectionClosed) as exc:  # the node went away
            print(f"warren: the node stopped answering ({exc})", file=sys.stderr)
            return EXIT_NO_NODE
        except (QueueError, ValueError, TypeError) as exc:
            print(f"warren: {exc}", file=sys.stderr)
            return EXIT_REFUSED

    return run


def _declare_queue(connection: Connection, args: argparse.Namespace) -> int:
    if args.passive:
        declared = connection.declare_queue(args.name, passive=True)
    else:
        stream_arguments = {
            "max_length_bytes": _size_or_none(args.max_length_bytes, "--max-length-bytes"),
            "max_age": _interval_or_none(args.max_age),
            "max_segment_size_bytes": _size_or_none(args.max_segment_size, "--max-segment-size"),
            "sync_policy": args.sync_policy,
        }
        arguments: dict[str, Any] = {
            "durable": not args.transient,
            "lazy": args.lazy,
            "message_ttl_ms": args.message_ttl_ms,
            "max_length": args.max_length,
            "overflow": args.overflow,
            "dead_letter_exchange": args.dead_letter_exchange,
            "dead_letter_routing_key": args.dead_letter_routing_key,
            "auto_delete": args.auto_delete,
            "expires_ms": args.expires_ms,
        }
        quorum_arguments = {
            "delivery_limit": args.delivery_limit,
            "dead_letter_strategy": args.dead_letter_strategy,
            "single_active_consumer": args.single_active_consumer or None,
        }
        # passed on only when given, to be refused by name by the other types
        arguments.update({k: v for k, v in quorum_arguments.items() if v is not None})
        if args.type == "quorum":
            arguments["type"] = "quorum"
        if args.type in ("stream", SUPER_STREAM_TYPE):
            arguments.update(type=args.type, **stream_arguments)
        else:  # passed on only when given, to be refused by name
            arguments.update({k: v for k, v in stream_arguments.items() if v is not None})
        if args.type == SUPER_STREAM_TYPE or args.partitions is not None:
            arguments["partitions"] = args.partitions  # refused by the queue types but one
        declared = connection.declare_queue(args.name, **arguments)
    if args.type == SUPER_STREAM_TYPE:
        partitions = connection.partitions(args.name)
        print(
            f"declared super stream {args.name}: {counted(len(partitions), 'partition')} "
            f"({partitions[0]} .. {partitions[-1]}), "
            f"{counted(declared.message_count or 0, 'record')}"
        )
        return EXIT_OK
    done = "queue" if args.passive else "declared queue"
    if declared.message_count is None or declared.consumer_count is None:
        print(f"{done} {args.name}: {connection.queue_state(args.name)}, no counts")
    else:
        print(
            f"{done} {args.name}: {counted(declared.message_count, 'message')} ready, "
            f"{counted(declared.consumer_count, 'consumer')}"
        )
    return EXIT_OK


def _size_or_none(value: str | None, what: str) -> int | None:
    return None if value is None else parse_size(value, what)


def _interval_or_none(value: str | None) -> float | str | None:
    """--max-age as seconds when it is a plain number, else as the unit string it is."""
    return None if value is None else interval_text(value)


def _declare_exchange(connection: Connection, args: argparse.Namespace) -> int:
    connection.declare_exchange(
        args.name,
        kind=args.kind,
        durable=not args.transient,
        alternate_exchange=args.alternate_exchange,
    )
    print(f"declared {args.kind} exchange {args.name}")
    return EXIT_OK


def _bind(connection: Connection, args: argparse.Namespace) -> int:
    connection.bind_queue(args.queue, args.exchange, args.routing_key)
    print(f"bound {args.queue} to {args.exchange} with {args.routing_key!r}")
    return EXIT_OK


def _unbind(connection: Connection, args: argparse.Namespace) -> int:
    connection.unbind_queue(args.queue, args.exchange, args.routing_key)
    print(f"unbound {args.queue} from {args.exchange} with {args.routing_key!r}")
    return EXIT_OK


def _exchanges(connection: Connection, args: argparse.Namespace) -> int:
    rows = connection.list_exchanges()
    if args.json:
        print(strict_json(rows))
    else:
        table = [
            [r["name"], r["kind"], "yes" if r["durable"] else "no", r["alternate_exchange"]]
            for r in rows
        ]
        print(format_table(_EXCHANGE_COLUMNS, table))
    return EXIT_OK


def _bindings(connection: Connection, args: argparse.Namespace) -> int:
    rows = connection.list_bindings()
    if args.json:
        print(strict_json(rows))
    else:
        table = [[r["exchange"], r["queue"], r["routing_key"]] for r in rows]
        print(format_table(_BINDING_COLUMNS, table))
    return EXIT_OK


def _delete_exchange(connection: Connection, args: argparse.Namespace) -> int:
    connection.delete_exchange(args.exchange)
    print(f"deleted exchange {args.exchange} and its bindings")
    return EXIT_OK


def _queue_rows(connection: Connection) -> list[dict]:
    rows = []
    for name in connection.list_queues():
        state = connection.queue_state(name)
        stats = connection.queue_stats(name) if state == "running" else None
        # a queue that is not running has no ref to tell its type by: None
        kind = None if stats is None else stats.get("type", "classic")
        rows.append({"name": name, "type": kind, "state": state, "stats": stats})
    return rows


def _queues(connection: Connection, args: argparse.Namespace) -> int:
    rows = _queue_rows(connection)
    print(strict_json(rows) if args.json else format_queues(rows))
    return EXIT_OK


_STREAM_COLUMNS = (
    Column("stream", cut=True, min_width=10),
    Column("state"),
    Column("first", ">"),
    Column("committed", ">"),
    Column("segments", ">"),
    Column("disk", ">"),
    Column("consumers (lag)", cut=True, min_width=15),
)


def format_streams(rows: list[dict]) -> str:
    """The streams as a table for a person at an 80-column terminal."""
    cells = []
    for row in rows:
        stats = row.get("stats")
        if stats is None:
            cells.append([row["name"], row["state"], "-", "-", "-", "-", "-"])
            continue
        consumers = stats["consumer_offsets"]
        cells.append(
            [
                row["name"],
                row["state"],
                str(stats["first_offset"]),
                str(stats["committed_offset"]),
                str(stats["segments"]),
                abbreviated(stats["bytes"], "B"),
                " ".join(
                    [f"{n}({abbreviated(c['lag'])})" for n, c in consumers.items()]
                    + [f"{n}[{g['members']}]" for n, g in stats.get("consumer_groups", {}).items()]
                )
                or "-",
            ]
        )
    if not cells:
        return "no streams"
    supers: dict[str, list[str]] = {}
    for row in rows:
        owner = (row.get("stats") or {}).get("super_stream")
        if owner is not None:
            supers.setdefault(owner, []).append(row["name"])
    lines = [
        f"super stream {name}: {counted(len(parts), 'partition')} ({', '.join(parts)})"
        for name, parts in sorted(supers.items())
    ]
    return "\n".join([format_table(_STREAM_COLUMNS, cells), *lines])


def _streams(connection: Connection, args: argparse.Namespace) -> int:
    rows = [row for row in _queue_rows(connection) if row["type"] == "stream"]
    print(strict_json(rows) if args.json else format_streams(rows))
    return EXIT_OK


def _publish(connection: Connection, args: argparse.Namespace) -> int:
    """Generated messages in batches of ``PUBLISH_BATCH``; or stdin's lines as they arrive,
    each read's whole lines as one batch, confirmed before the next read (so ``tail -f``
    is never held back, and a file goes in large batches). A stop signal ends it where it
    stands (exit 130), and a node that went away under it ends it too (exit 1): either
    way one line says how many were confirmed and where to resume."""
    progress = _Progress("published")
    in_doubt = 0
    total = args.count

    def where_it_stands() -> str:
        """What was confirmed, what is in doubt and where to resume, in one phrase."""
        done = progress.count
        if total is not None:
            doubt = f", {counted(in_doubt, 'message')} in doubt" if in_doubt else ""
            return f"{done:,} of {counted(total, 'message')} confirmed{doubt}"
        doubt = f"; lines {done + 1:,}-{done + in_doubt:,} may be in the queue already"
        return (
            f"{counted(done, 'line')} of the input confirmed; publish again from line "
            f"{done + 1:,} (tail -n +{done + 1}){doubt if in_doubt else ''}"
        )

    def send(batch: list[bytes]) -> None:
        """Publish ``batch`` and wait for its confirm; a stop signal or a node that went
        away ends the wait with the batch in doubt."""
        nonlocal in_doubt
        in_doubt = len(batch)
        confirm = connection.publish_many_async(
            args.queue, batch, exchange=args.exchange, persistent=not args.transient, awaited=True
        )
        look_at_node = time.monotonic() + NODE_LOOK_S
        while True:
            try:
                progress.add(confirm.result(timeout=CONFIRM_LOOK_S))
                break
            except TimeoutError:
                stop.stop_if_received()
                if time.monotonic() >= look_at_node:
                    if not _node_reachable(args):
                        raise _NodeWentAway() from None
                    look_at_node = time.monotonic() + NODE_LOOK_S
        in_doubt = 0

    with StopSignals() as stop:
        try:
            if args.count is not None:
                batches = _generated(args.count, parse_size(args.size, "--size"))
            else:
                batches = _line_batches(sys.stdin.buffer.fileno(), stop)
            for batch in batches:
                send(batch)
                stop.stop_if_received()
        except Stopped as stopped:
            progress.done()
            print(f"warren: stopped by {stopped}: {where_it_stands()}", file=sys.stderr)
            return EXIT_INTERRUPTED
        except MessageTooLarge as exc:
            raise MessageTooLarge(
                f"{exc} ({counted(progress.count, 'message')} published before it)"
            ) from None
        except (QueueError, ActorDeadError, TimeoutError, _NodeWentAway) as exc:
            if not isinstance(exc, _NodeWentAway) and _node_reachable(args):
                raise  # a refusal by a node that is still there: said as it is
            progress.done()
            print(f"warren: the node went away: {where_it_stands()}", file=sys.stderr)
            return EXIT_NO_NODE
    progress.done()
    return EXIT_OK


class _NodeWentAway(Exception):
    """A publish's node no longer takes connections while its confirm is awaited."""


def _node_reachable(args: argparse.Namespace) -> bool:
    """Whether the node still takes a new connection within ``NODE_CONNECT_S`` (after a
    publish failed or waited long: a node that went away, or a queue that refused). Over
    tcp a port that refuses connections says it at once: its listener is gone."""
    if args.url is not None and nothing_listens(args.url, NODE_CONNECT_S):
        return False
    over_tcp = {"connect_timeout_s": NODE_CONNECT_S} if args.url is not None else {}
    try:
        with _connect(args, **over_tcp):
            return True
    except (QueueError, ActorDeadError, TimeoutError):
        return False


def _generated(count: int, size: int) -> Iterator[list[bytes]]:
    if count < 0:
        raise UsageError(f"--count must be >= 0, got {count}")
    for start in range(0, count, PUBLISH_BATCH):
        yield [
            b"%d:" % n + b"x" * max(0, size - len(b"%d:" % n))
            for n in range(start, min(count, start + PUBLISH_BATCH))
        ]


def _line_batches(fd: int, stop: StopSignals) -> Iterator[list[bytes]]:
    """The lines read from ``fd``, a batch per read (what had arrived), at most
    ``PUBLISH_BATCH`` each; a last line without its newline too. A stop signal ends a
    read that waits for the next line. A line longer than the largest message raises
    ``MessageTooLarge`` as soon as it is that long, without reading the rest of it."""
    pending: list[bytes] = []  # the start of a line whose newline has not come yet
    pending_bytes = 0
    lines_read = 0
    while True:
        with stop.interrupting():
            chunk = os.read(fd, READ_BYTES)
        if not chunk:
            break
        if b"\n" not in chunk:
            pending.append(chunk)
            pending_bytes += len(chunk)
            if pending_bytes > MAX_MESSAGE_BYTES:
                raise MessageTooLarge(
                    f"line {lines_read + 1} of the input is over {MAX_MESSAGE_BYTES:,} bytes, "
                    f"the largest message; it was not sent"
                )
            continue
        *lines, rest = b"".join([*pending, chunk]).split(b"\n")
        pending, pending_bytes = [rest], len(rest)
        lines_read += len(lines)
        for start in range(0, len(lines), PUBLISH_BATCH):
            yield lines[start : start + PUBLISH_BATCH]
    if pending_bytes:
        yield [b"".join(pending)]


def _consume(connection: Connection, args: argparse.Namespace) -> int:
    """Write each message out and flush it, and ack it only once its reader took it (see
    ``output``): the messages written are acked in batches as the reader takes them, and
    the loop waits for the reader only when it holds ``CONSUME_PREFETCH`` unacked or has
    nothing new to write. A signal ends the loop where it stands; what was not acked goes
    back to the queue when the connection closes."""
    if args.count is not None and args.count < 0:
        raise UsageError(f"--count must be >= 0, got {args.count}")
    if args.timeout is not None and not 0 < args.timeout < math.inf:
        raise UsageError(f"--timeout must be a number of seconds > 0, got {args.timeout}")
    if connection.is_stream(args.queue):
        return _consume_stream(connection, args)
    if args.offset is not None or args.name is not None:
        raise UsageError("--offset and --name are for streams")
    wanted = args.count
    if wanted is None and args.timeout is None:
        wanted = connection.queue_stats(args.queue)["messages_ready"]
    idle_limit = args.timeout if args.timeout is not None else IDLE_END_S
    progress = _Progress("consumed")
    prefetch = min(max(wanted or 1, 1), CONSUME_PREFETCH)
    consumer = connection.consume(args.queue, prefetch=prefetch)
    assert isinstance(consumer, Consumer)  # not a stream
    written: collections.deque[tuple[int, Delivery]] = collections.deque()  # (end, delivery)

    def settle_taken() -> None:
        """Ack (or, peeking, requeue) every message written that the reader took."""
        taken, settled = out.taken, 0
        while written and written[0][0] <= taken:
            last = written.popleft()[1]
            settled += 1
        if settled:
            if args.requeue:
                last.nack(requeue=True, multiple=True)
            else:
                last.ack(multiple=True)
            progress.add(settled)

    with StopSignals() as stop, consumer:
        out = Output(sys.stdout.buffer, stop)
        idle_since = time.monotonic()
        got = 0
        while stop.received is None and (wanted is None or got < wanted):
            settle_taken()
            if len(written) >= prefetch:  # no more will come before some are acked
                if not out.wait_taken(written[0][0]):
                    break
                continue
            delivery = consumer.get(timeout=0 if written else POLL_S)
            if delivery is None:
                if written:  # nothing new: wait for the reader to take what it has
                    if not out.wait_taken(written[-1][0]):
                        break
                    continue
                if time.monotonic() - idle_since >= idle_limit:
                    break
                continue
            idle_since = time.monotonic()
            if got < ONE_AT_A_TIME and not out.wait_taken(out.written):
                break  # the reader stopped: this one and the untaken go back to the queue
            if not out.write(_render(delivery, args.json)):
                break  # not written: it goes back to the queue
            written.append((out.written, delivery))
            got += 1
        if written and stop.received is None:
            out.wait_taken(written[-1][0])
        settle_taken()
    progress.done()
    return _stopped(stop)


def _stopped(stop: StopSignals) -> int:
    """Exit 130 with a line saying so when a stop signal ended the run, else 0."""
    if stop.received is None:
        return EXIT_OK
    print(f"warren: stopped by {signal.Signals(stop.received).name}", file=sys.stderr)
    return EXIT_INTERRUPTED


def _consume_stream(connection: Connection, args: argparse.Namespace) -> int:
    """Write a stream's records out from ``--offset``: without --count or --timeout, up to
    the offset committed when it started. A named consumer stores the offset of the last
    record its reader took (each record waits for the one before it to be taken, so a
    stored offset never passes what was read); without a name nothing is stored or
    acked, and a pipe is written as fast as its reader reads."""
    committed = connection.queue_stats(args.queue)["committed_offset"]
    offset: object = args.offset
    if isinstance(offset, str) and offset.isdigit():
        offset = int(offset)
    idle_limit = args.timeout if args.timeout is not None else IDLE_END_S
    progress = _Progress("read")
    consumer = connection.consume(
        args.queue, prefetch=CONSUME_PREFETCH, offset=offset, name=args.name
    )
    assert isinstance(consumer, StreamConsumer)
    drain = args.count is None and args.timeout is None
    with StopSignals() as stop, consumer:
        out = Output(sys.stdout.buffer, stop, checked=args.name is not None)
        idle_since = time.monotonic()
        while stop.received is None and (args.count is None or progress.count < args.count):
            delivery = consumer.get(timeout=POLL_S)
            if delivery is None:
                if drain and consumer.next_offset > committed:
                    break  # read up to where it started
                if time.monotonic() - idle_since >= idle_limit:
                    break
                continue
            idle_since = time.monotonic()
            if not out.write(_render(delivery, args.json)) or not out.wait_taken(out.written):
                consumer.cancel(processed_last=False)
                break
            progress.add(1)
            if drain and delivery.offset >= committed:
                break
    progress.done()
    return _stopped(stop)


def _render(delivery: Delivery | StreamDelivery, as_json: bool) -> bytes:
    if not as_json:
        return delivery.body + b"\n"
    fields: dict[str, object]
    if isinstance(delivery, StreamDelivery):
        fields = {
            "stream": delivery.stream,
            "offset": delivery.offset,
            "timestamp_ms": delivery.timestamp_ms,
            "message_id": delivery.message_id,
            "headers": delivery.headers,
        }
    else:
        fields = {
            "queue": delivery.queue,
            "message_id": delivery.message_id,
            "redelivered": delivery.redelivered,
            "delivery_count": delivery.delivery_count,
            "headers": delivery.headers,
        }
    try:
        fields["body"] = delivery.body.decode()
    except UnicodeDecodeError:
        fields["body_base64"] = base64.b64encode(delivery.body).decode()
    return json.dumps(fields, allow_nan=False, default=str).encode() + b"\n"


def _purge(connection: Connection, args: argparse.Namespace) -> int:
    print(f"purged {counted(connection.purge_queue(args.queue), 'message')} from {args.queue}")
    return EXIT_OK


def _delete(connection: Connection, args: argparse.Namespace) -> int:
    held = connection.delete_queue(args.queue)
    print(f"deleted {args.queue} and its {counted(held, 'message')}")
    return EXIT_OK


class _Progress:
    """A count reported on stderr every second of a long run, and at its end."""

    def __init__(self, verb: str) -> None:
        self.verb = verb
        self.count = 0
        self.started = self._reported = time.monotonic()

    def add(self, count: int) -> None:
        self.count += count
        now = time.monotonic()
        if now - self._reported >= PROGRESS_EVERY_S:
            self._reported = now
            print(
                f"{self.verb} {self.count:,} ({self.count / (now - self.started):,.0f}/s)",
                file=sys.stderr,
                flush=True,
            )

    def done(self) -> None:
        elapsed = time.monotonic() - self.started
        rate = f", {self.count / elapsed:,.0f}/s" if elapsed >= PROGRESS_EVERY_S else ""
        print(f"{self.verb} {counted(self.count, 'message')}{rate}", file=sys.stderr, flush=True)

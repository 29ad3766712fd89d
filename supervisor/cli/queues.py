"""The ``warren`` commands that work on a running node's queues, through ``warren.connect``:

    warren queues --data-dir D [--json]          every queue: state, messages, states, bytes
    warren publish QUEUE --data-dir D [--exchange E] [--count N --size BYTES]
                                                 lines of stdin as messages, or N generated
    warren consume QUEUE --data-dir D [--count N]
                                                 print and ack messages (all that are ready)
    warren purge QUEUE --data-dir D              drop the ready messages
    warren delete QUEUE --data-dir D             delete the queue

A node that is not running exits 1; an unknown queue, or any other refusal, is one line on
stderr and exit 2. Runs longer than a second report their progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterator

from warren.queues.client.connection import Connection
from warren.queues.client.ipc_node import RemoteNode
from warren.queues.errors import NodeNotRunning, QueueError

from ..tables import Column, format_table

__all__ = ["add_queue_commands", "format_queues"]

EXIT_OK, EXIT_NO_NODE, EXIT_REFUSED = 0, 1, 2
PROGRESS_EVERY_S = 1.0

_QUEUE_COLUMNS = (
    Column("queue", wrap=True, min_width=10),
    Column("state"),
    Column("mode"),
    Column("ready", ">"),
    Column("unacked", ">"),
    Column("α/β/γ/δ", ">"),
    Column("RAM MiB", ">"),
    Column("disk MiB", ">"),
    Column("in/out/s", ">"),
)


def format_queues(rows: list[dict]) -> str:
    """The queues as a table for a person at an 80-column terminal."""
    cells = []
    for row in rows:
        stats = row.get("stats")
        if stats is None:
            cells.append([row["name"], row["state"], "-", "-", "-", "-", "-", "-", "-"])
            continue
        rates = stats["rates"]
        cells.append(
            [
                row["name"],
                row["state"],
                stats["mode"],
                f"{stats['messages_ready']:,}",
                f"{stats['messages_unacked']:,}",
                f"{stats['alpha']}/{stats['beta']}/{stats['gamma']}/{stats['delta']}",
                f"{stats['ram_bytes'] / 2**20:.1f}",
                f"{stats['disk_bytes'] / 2**20:.1f}",
                f"{rates['ingress']:.0f}/{rates['egress']:.0f}",
            ]
        )
    return format_table(_QUEUE_COLUMNS, cells) if cells else "no queues"


def add_queue_commands(commands: argparse._SubParsersAction) -> None:
    queues = commands.add_parser("queues", help="the queues of the node on a data dir")
    queues.add_argument("--data-dir", required=True)
    queues.add_argument("--json", action="store_true", help="print every figure as JSON")
    queues.set_defaults(handler=_with_connection(_queues))
    publish = commands.add_parser(
        "publish", help="publish lines of stdin, or --count generated messages"
    )
    publish.add_argument("queue", help="the queue, or the routing key with --exchange")
    publish.add_argument("--data-dir", required=True)
    publish.add_argument("--exchange", default="", help="publish through this exchange")
    publish.add_argument("--count", type=int, help="publish this many generated messages")
    publish.add_argument(
        "--size", type=int, default=1024, help="bytes of each generated message (default 1024)"
    )
    publish.add_argument("--transient", action="store_true", help="publish non-persistent messages")
    publish.set_defaults(handler=_with_connection(_publish))
    consume = commands.add_parser("consume", help="print and ack a queue's messages")
    consume.add_argument("queue")
    consume.add_argument("--data-dir", required=True)
    consume.add_argument(
        "--count", type=int, help="stop after this many (default: all that are ready)"
    )
    consume.set_defaults(handler=_with_connection(_consume))
    for name, action, text in (
        ("purge", _purge, "drop a queue's ready messages"),
        ("delete", _delete, "delete a queue and its messages"),
    ):
        command = commands.add_parser(name, help=text)
        command.add_argument("queue")
        command.add_argument("--data-dir", required=True)
        command.set_defaults(handler=_with_connection(action))


def _with_connection(
    action: Callable[[Connection, argparse.Namespace], int],
) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        try:
            with Connection(RemoteNode(args.data_dir)) as connection:
                return action(connection, args)
        except NodeNotRunning as exc:
            print(f"warren: {exc}", file=sys.stderr)
            return EXIT_NO_NODE
        except QueueError as exc:
            print(f"warren: {exc}", file=sys.stderr)
            return EXIT_REFUSED

    return run


def _queues(connection: Connection, args: argparse.Namespace) -> int:
    rows = []
    for name in connection.list_queues():
        state = connection.queue_state(name)
        stats = connection.queue_stats(name) if state == "running" else None
        rows.append({"name": name, "state": state, "stats": stats})
    print(json.dumps(rows, indent=2, default=str) if args.json else format_queues(rows))
    return EXIT_OK


def _publish(connection: Connection, args: argparse.Namespace) -> int:
    if args.count is not None:
        if args.count < 0 or args.size < 0:
            raise QueueError("--count and --size must be >= 0")
        bodies: Iterator[bytes] = (
            b"%d:" % n + b"x" * max(0, args.size - len(b"%d:" % n)) for n in range(args.count)
        )
    else:
        bodies = (line.rstrip(b"\n") for line in sys.stdin.buffer)
    progress = _Progress("published")
    batch: list[bytes] = []
    for body in bodies:
        batch.append(body)
        if len(batch) == 1000:
            progress.add(
                connection.publish_many(
                    args.queue, batch, exchange=args.exchange, persistent=not args.transient
                )
            )
            batch = []
    if batch:
        progress.add(
            connection.publish_many(
                args.queue, batch, exchange=args.exchange, persistent=not args.transient
            )
        )
    progress.done()
    return EXIT_OK


def _consume(connection: Connection, args: argparse.Namespace) -> int:
    wanted = args.count
    if wanted is None:
        wanted = connection.queue_stats(args.queue)["messages_ready"]
    progress = _Progress("consumed")
    out = sys.stdout.buffer
    with connection.consume(args.queue, prefetch=min(max(wanted, 1), 1000)) as consumer:
        while progress.count < wanted:
            delivery = consumer.get(timeout=5.0)
            if delivery is None:
                break
            out.write(delivery.body + b"\n")
            delivery.ack()
            progress.add(1)
    out.flush()
    progress.done()
    return EXIT_OK


def _purge(connection: Connection, args: argparse.Namespace) -> int:
    print(f"purged {connection.purge_queue(args.queue):,} messages from {args.queue}")
    return EXIT_OK


def _delete(connection: Connection, args: argparse.Namespace) -> int:
    print(f"deleted {args.queue} and its {connection.delete_queue(args.queue):,} messages")
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
        print(f"{self.verb} {self.count:,} messages{rate}", file=sys.stderr, flush=True)

"""The workload's roles, each as a process of its own: the queue producer and consumer of
``warren.supervisor.chaos.workload`` and the stream producer and reader of
``warren.supervisor.chaos.stream_workload``. It prints ``ready`` once connected, and stops
on SIGTERM with every ledger line it wrote whole::

    python -m warren.supervisor.chaos.roles produce NODE ROUTING_KEY NAME LEDGER [--count N]
        [--exchange E] [--sizes FROM TO] [--size-key KEY] [--deduplicate]
    python -m warren.supervisor.chaos.roles consume NODE LEDGER QUEUE [QUEUE ...]
    python -m warren.supervisor.chaos.roles produce-stream NODE STREAM NAME LEDGER
        [--count N] [--sizes FROM TO] [--size-key KEY]
    python -m warren.supervisor.chaos.roles read-stream NODE STREAM NAME LEDGER
        [--pause-key KEY]

``NODE`` is a node's data directory, a listener's ``tcp://`` address, or a cluster's
``tcp://`` addresses separated by commas. The stream's
roles and their audit are ``warren.supervisor.chaos.stream_workload``'s.

What a role logs (its connection going away and recovering) goes to stderr, each line
with its time, role, ledger and pid, since every role shares the run's ``workload.log``;
SIGUSR1 writes every thread's stack there (``faulthandler``), which the run asks for
when a role stops making progress.

This module only dispatches: it stands above both workload modules, so neither imports
the other.
"""

from __future__ import annotations

import argparse
import faulthandler
import logging
import os
import signal
import sys

from .stream_workload import produce_stream, read_stream
from .workload import connect_node, consume, produce


class _Stop(Exception):
    pass


def _stop(_signum: int, _frame: object) -> None:
    raise _Stop


NODE_HELP = "a node's data directory or tcp:// address, or a cluster's, comma-separated"


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m warren.supervisor.chaos.roles")
    roles = parser.add_subparsers(dest="role", required=True)
    producer = roles.add_parser("produce")
    producer.add_argument(
        "node",
        help=NODE_HELP,
    )
    producer.add_argument("routing_key")
    producer.add_argument("name")
    producer.add_argument("ledger")
    producer.add_argument("--count", type=int, help="default: until stopped")
    producer.add_argument("--exchange", default="")
    producer.add_argument("--sizes", type=int, nargs=2, metavar=("FROM", "TO"))
    producer.add_argument("--size-key")
    producer.add_argument("--deduplicate", action="store_true")
    consumer = roles.add_parser("consume")
    consumer.add_argument("node")
    consumer.add_argument("ledger")
    consumer.add_argument("queues", nargs="+")
    stream_producer = roles.add_parser("produce-stream")
    stream_reader = roles.add_parser("read-stream")
    for role in (stream_producer, stream_reader):
        role.add_argument(
            "node",
            help=NODE_HELP,
        )
        role.add_argument("stream")
        role.add_argument("name", help="the producer id, or the consumer name")
        role.add_argument("ledger")
    stream_producer.add_argument("--count", type=int, help="default: until stopped")
    stream_producer.add_argument("--sizes", type=int, nargs=2, metavar=("FROM", "TO"))
    stream_producer.add_argument("--size-key")
    stream_reader.add_argument("--pause-key", help="pause now and then, drawn from KEY")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _stop)
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    logging.basicConfig(
        format=f"%(asctime)s {args.role} {os.path.basename(args.ledger)}[%(process)d] "
        f"%(levelname)s %(message)s"
    )
    try:
        connection = connect_node(args.node)
        print("ready", flush=True)
        if args.role == "produce":
            produce(
                connection,
                args.routing_key,
                args.name,
                args.count,
                args.ledger,
                args.exchange,
                sizes=None if args.sizes is None else tuple(args.sizes),
                size_key=args.size_key,
                deduplicate=args.deduplicate,
            )
        elif args.role == "consume":
            consume(connection, args.queues, args.ledger)
        elif args.role == "produce-stream":
            produce_stream(
                connection,
                args.stream,
                args.name,
                args.ledger,
                count=args.count,
                sizes=None if args.sizes is None else tuple(args.sizes),
                size_key=args.size_key,
            )
        else:
            read_stream(connection, args.stream, args.name, args.ledger, pause_key=args.pause_key)
    except (_Stop, KeyboardInterrupt):
        # Every ledger line is written whole (line buffering); leave without waiting for
        # the connection's sockets, which a node that is away would hold up.
        os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])

"""The ``warren`` command line.

    warren node --data-dir DIR [--name NAME]   run a node in the foreground; Ctrl-C or
                                                SIGTERM stops it cleanly (exit 0)
    warren status --data-dir DIR [--json]      the tree of the node running on DIR
    warren store inspect DIR                   what a store directory holds; changes nothing

Exit codes: 0 success; 1 no node answers on DIR; 2 bad usage, a path that is not a store
directory, or a data directory another node holds; 3 the node's root supervisor gave up;
4 the node did not start.
"""

from __future__ import annotations

import argparse
import logging
import sys

EXIT_OK = 0
EXIT_NO_NODE = 1
EXIT_USAGE = 2
EXIT_NODE_FAILED = 3
EXIT_START_FAILED = 4


def _store_inspect(args: argparse.Namespace) -> int:
    from warren.store.inspect import format_report, inspect_store

    try:
        report = inspect_store(args.directory)
    except (NotADirectoryError, PermissionError) as exc:
        print(f"warren: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(format_report(report))
    return EXIT_OK


def _node(args: argparse.Namespace) -> int:
    import signal
    import threading

    from warren.supervisor.errors import NodeLocked
    from warren.supervisor.node import Node

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    try:
        node = Node(args.data_dir, name=args.name)
    except NodeLocked as exc:
        print(f"warren: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as exc:   # reported as a line a person reads, with its own exit code
        print(f"warren: the node did not start: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_START_FAILED
    with node:
        print(format_status(node.status()), flush=True)
        while not stop.wait(0.2):
            if node.failed.is_set():
                return EXIT_NODE_FAILED
    return EXIT_OK


def _status(args: argparse.Namespace) -> int:
    import json

    from warren.supervisor.node import query_status

    try:
        status = query_status(args.data_dir)
    except OSError as exc:
        print(f"warren: {exc}", file=sys.stderr)
        return EXIT_NO_NODE
    print(json.dumps(status, indent=2) if args.json else format_status(status))
    return EXIT_OK


def format_status(status: dict) -> str:
    """The node's tree as a table a person reads."""
    alarms = ", ".join(status["alarms"]) or "none"
    lines = [f"node {status['node']} (pid {status['pid']}) on {status['data_dir']}: "
             f"{status['state']}; alarms: {alarms}",
             f"{'ACTOR':<40} {'PID':>7} {'STATE':<9} {'RESTARTS':>8} {'RSS MiB':>8} {'CPU%':>6}"]

    def walk(entry: dict, prefix: str, last: bool, top: bool) -> None:
        branch = "" if top else ("└─ " if last else "├─ ")
        label = f"{prefix}{branch}{entry['id']}"
        if entry["kind"] == "supervisor":
            label += f" ({entry['strategy']})"
            lines.append(f"{label:<40} {'':>7} {entry['state']:<9} "
                         f"{entry.get('restarts', 0):>8}")
        else:
            rss = f"{entry['rss_bytes'] / 2**20:.1f}" if entry["rss_bytes"] else "-"
            cpu = f"{entry['cpu_percent']:.1f}" if entry["cpu_percent"] is not None else "-"
            lines.append(f"{label:<40} {entry['pid'] or '-':>7} {entry['state']:<9} "
                         f"{entry['restarts']:>8} {rss:>8} {cpu:>6}")
        children = entry.get("children", [])
        inner = prefix if top else prefix + ("   " if last else "│  ")
        for i, child in enumerate(children):
            walk(child, inner, i == len(children) - 1, False)

    if status.get("tree"):
        walk(status["tree"], "", True, True)
    for name, figures in status.get("stores", {}).items():
        if figures is None:
            lines.append(f"{name}: not answering")
            continue
        lines.append(
            f"{name}: {figures['message_count']:,} messages, {figures['file_count']} files, "
            f"{figures['bytes_on_disk']:,} bytes ({figures['garbage_fraction']:.0%} garbage), "
            f"{figures['gc_runs']} GC runs, reads {figures['direct_reads_reported']:,} direct / "
            f"{figures['fallback_reads']:,} through the store, {figures['locked_files']} locked "
            f"files, longest confirm wait {figures['longest_confirm_wait_ms']:.1f} ms")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="warren", description="Warren: RabbitMQ's "
                                     "message persistence layer as Python actors")
    commands = parser.add_subparsers(dest="command", required=True)
    node = commands.add_parser("node", help="run a node in the foreground")
    node.add_argument("--data-dir", required=True)
    node.add_argument("--name", default="warren")
    node.set_defaults(handler=_node)
    status = commands.add_parser("status", help="the tree of the node running on a data dir")
    status.add_argument("--data-dir", required=True)
    status.add_argument("--json", action="store_true", help="print the status as JSON")
    status.set_defaults(handler=_status)
    store = commands.add_parser("store", help="message store tools")
    store_commands = store.add_subparsers(dest="store_command", required=True)
    inspect = store_commands.add_parser("inspect", help="report files, records, valid and "
                                        "garbage bytes, damaged regions; changes nothing")
    inspect.add_argument("directory")
    inspect.set_defaults(handler=_store_inspect)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())

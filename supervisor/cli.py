"""The ``warren`` command line.

    warren store inspect DIR     what a store directory holds; changes nothing

Exit codes: 0 success, 2 bad usage or a path that is not a store directory.
"""

from __future__ import annotations

import argparse
import sys

EXIT_OK = 0
EXIT_USAGE = 2


def _store_inspect(args: argparse.Namespace) -> int:
    from store.inspect import format_report, inspect_store

    try:
        report = inspect_store(args.directory)
    except (NotADirectoryError, PermissionError) as exc:
        print(f"warren: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(format_report(report))
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="warren", description="Warren: RabbitMQ's "
                                     "message persistence layer as Python actors")
    commands = parser.add_subparsers(dest="command", required=True)
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

"""The ``warren users`` commands: the AMQP port's users, in the node's data directory
(``warren.queues.amqp.users`` has the file and its hashing).

    warren users add NAME --data-dir DIR        a new user; its password from the terminal
                                                (asked twice), or a line of stdin
    warren users password NAME --data-dir DIR   a new password for a user
    warren users delete NAME --data-dir DIR     the user may log in no more
    warren users list --data-dir DIR            the users, one a line

The node need not run, nor have run: a directory made here is a node's to be. A running
node's AMQP port reads the file again at the next login. A mistake (a name taken or
unknown, an empty password, two that differ) is one line and exit 2; nothing changes.
"""

from __future__ import annotations

import argparse
import getpass
import sys

from warren.queues.amqp.users import (
    UsersFileError,
    add_user,
    delete_user,
    list_users,
    set_password,
)

from ..errors import UsageError
from .access import permission_denied, refuse_another_owner, usable_data_directory

__all__ = ["add_user_commands"]

EXIT_OK, EXIT_INTERRUPTED = 0, 130


def add_user_commands(commands: argparse._SubParsersAction) -> None:
    users = commands.add_parser(
        "users",
        help="the AMQP port's users (names and hashed passwords)",
        description="The users the AMQP port lets in, kept in the data directory with "
        "their passwords hashed (scrypt). Without any, the one user is guest/guest, from "
        "loopback only, as RabbitMQ's. A running node reads them again at the next login.",
    )
    actions = users.add_subparsers(dest="users_command", metavar="ACTION")
    for action, about in (
        ("add", "add a user; its password from the terminal (twice) or a line of stdin"),
        ("password", "give a user a new password (from the terminal or stdin)"),
        ("delete", "remove a user (guest too)"),
    ):
        parser = actions.add_parser(action, help=about, description=about)
        parser.add_argument("name")
        parser.add_argument("--data-dir", required=True, help="the node's data directory")
        parser.set_defaults(handler=_change)
    listing = actions.add_parser("list", help="the users, one a line")
    listing.add_argument("--data-dir", required=True, help="the node's data directory")
    listing.set_defaults(handler=_list)


def _change(args: argparse.Namespace) -> int:
    data_dir = usable_data_directory(args.data_dir)
    refuse_another_owner(data_dir, "a users file of another owner keeps its node's port from it")
    try:
        if args.users_command == "delete":
            delete_user(data_dir, args.name)
            done = f"deleted user {args.name}"
        elif args.users_command == "add":
            add_user(data_dir, args.name, _password(args.name))
            done = f"added user {args.name}"
        else:
            set_password(data_dir, args.name, _password(args.name))
            done = f"changed the password of {args.name}"
    except UsersFileError as exc:
        raise UsageError(str(exc)) from None
    except PermissionError as exc:
        raise UsageError(permission_denied(str(exc.filename), "")) from None
    except OSError as exc:  # a full disk, an I/O error: the file is as it was
        raise UsageError(f"cannot write the users file: {exc.strerror}; nothing changed") from None
    except KeyboardInterrupt:  # at the password's prompt
        print("\nwarren: interrupted; nothing changed", file=sys.stderr)
        return EXIT_INTERRUPTED
    print(f"{done}; the AMQP port on {data_dir} goes by it from the next login")
    return EXIT_OK


def _list(args: argparse.Namespace) -> int:
    data_dir = usable_data_directory(args.data_dir)
    try:
        names = list_users(data_dir)
    except UsersFileError as exc:
        raise UsageError(str(exc)) from None
    except PermissionError as exc:
        raise UsageError(permission_denied(str(exc.filename), "")) from None
    for name in names:
        print(name)
    return EXIT_OK


def _password(name: str) -> str:
    """The password typed twice at the terminal, or the first line of stdin."""
    if sys.stdin is None:
        raise UsageError("no password: stdin is closed; nothing changed")
    try:
        if sys.stdin.isatty():
            first = getpass.getpass(f"password for {name}: ")
            if getpass.getpass("the same again: ") != first:
                raise UsageError("the two passwords differ; nothing changed")
            return first
        line = sys.stdin.readline()
    except EOFError:
        raise UsageError("no password given (end of input); nothing changed") from None
    return line[:-1] if line.endswith("\n") else line

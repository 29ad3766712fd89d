"""What the ``warren`` command says when the user may not open what it needs: a data
directory, the node file in it, or the node's socket.

Before a command talks to a node on this machine it reads ``<data_dir>/node.json`` and
connects to the ipc socket named there (in the node's private runtime directory, mode
0700). A user other than the node's meets a permission error on either: the file's is
raised at once, but ZeroMQ connects to an ipc path in the background and retries, so a
socket the user may not open would only show as a node that "does not answer" after the
call's timeout. ``refuse_unreachable_node`` looks first, with the same permission checks
the kernel makes (a directory to search, a socket to write), and raises ``UsageError``
naming the path and its owner: one line, exit 2. ``permission_denied`` is that line, for
any other path the command may not open (a data directory a node is started on), and
``usable_data_directory`` refuses, in one line too, a data directory a node could not use.
Anything else (no node file, a node that is not running) is left to the connection,
which says it in its own words.
"""

from __future__ import annotations

import json
import os
import pwd
import sys

from warren.queues.client.ipc_node import NODE_FILE

from ..errors import UsageError

__all__ = [
    "permission_denied",
    "refuse_another_owner",
    "refuse_unreachable_node",
    "usable_data_directory",
]


def usable_data_directory(data_dir: str) -> str:
    """``data_dir`` made absolute, if it is a node's or may become one (missing, empty):
    else ``UsageError`` saying why (not a directory, no parent, another program's files,
    not this user's to open)."""
    from ..errors import NotANodeDirectory
    from ..node.node import check_node_directory

    data_dir = os.path.abspath(data_dir)
    if os.path.exists(data_dir) and not os.path.isdir(data_dir):
        raise UsageError(f"the data directory {data_dir} exists and is not a directory")
    parent = os.path.dirname(data_dir)
    if not os.path.isdir(parent):
        raise UsageError(
            f"the parent of the data directory, {parent}, does not exist; "
            f"create it first (a mistyped path would otherwise start a new "
            f"empty node)"
        )
    try:
        check_node_directory(data_dir)
    except NotANodeDirectory as exc:
        raise UsageError(str(exc)) from None
    except PermissionError:
        raise UsageError(permission_denied(data_dir, "the data directory")) from None
    return data_dir


def refuse_unreachable_node(data_dir: str) -> None:
    """``UsageError`` when this user may not read the node file of ``data_dir`` or open
    the node's socket it names."""
    try:
        with open(os.path.join(data_dir, NODE_FILE)) as file:
            found = json.load(file)
    except PermissionError:
        raise UsageError(permission_denied(data_dir, "the data directory")) from None
    except (OSError, ValueError):
        return  # no node file, or a torn one: the connection says so
    endpoint = found.get("status_endpoint") if isinstance(found, dict) else None
    if not isinstance(endpoint, str) or not endpoint.startswith("ipc://"):
        return
    socket_path = endpoint.removeprefix("ipc://")
    try:
        os.stat(socket_path)
    except PermissionError:
        raise UsageError(permission_denied(socket_path, "the node's socket")) from None
    except OSError:
        return  # gone: the node is not running, which the connection says
    if not os.access(socket_path, os.W_OK):
        raise UsageError(permission_denied(socket_path, "the node's socket"))


def node_status(data_dir: str) -> dict | None:
    """The status of the node running on ``data_dir``, or None once the reason none
    answers is printed (a path the user may not use is a ``UsageError``)."""
    from ..node.node import query_status

    refuse_unreachable_node(data_dir)
    try:
        return query_status(data_dir)
    except OSError as exc:
        print(f"warren: {exc}", file=sys.stderr)
        return None


def permission_denied(path: str, what: str = "") -> str:
    """One line: permission denied on ``path`` (``what`` it is), and whom to run as."""
    named = f"{what} {path}" if what else path
    return f"permission denied on {named}: run warren as its owner, {_owner(path)}"


def refuse_another_owner(path: str, why: str) -> None:
    """``UsageError`` unless this process runs as the owner of ``path`` (when it exists):
    a file it would write there would be another user's, which the node may not read
    (``why`` says what would follow)."""
    try:
        uid = os.stat(path).st_uid
    except OSError:
        return
    if uid != os.geteuid():
        owner = _name(uid)
        raise UsageError(f"{path} belongs to {owner}: run warren as {owner} ({why})")


def _owner(path: str) -> str:
    """The name of the user owning ``path`` or the nearest directory above it that this
    user may look at."""
    while True:
        try:
            uid = os.stat(path).st_uid
            break
        except OSError:
            parent = os.path.dirname(path)
            if parent == path:
                return "the node's user"
            path = parent
    return _name(uid)


def _name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"

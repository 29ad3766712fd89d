"""The private runtime directory where ipc mailboxes live, and how endpoints are named.

(docs/architecture.md, "Design notes") ipc sockets live in a short private directory
(mode 0700, so other users can neither connect nor squat a path), named by a hash of the
actor's name so that any name is safe and short, and every path is checked against the
kernel's limit for a unix socket path (108 bytes including the terminating NUL; we allow
at most 107).

Where: under ``$XDG_RUNTIME_DIR`` when it is set (and short), else under ``$TMPDIR`` when
that is set, else under ``/dev/shm`` when that is a directory this user may write (a memory
filesystem on Linux), else under the temporary directory. Not the temporary directory
first: on a disk filesystem every actor's
start (its two socket binds, its figures file) creates files there, and each creation
waits for the filesystem's journal while the disk is busy with fsyncs (the node's own:
its stores' and its queues'). Measured on a loaded 2-core machine, a queue's first bind
took 3.4 ms under ``/tmp`` (ext4) and 0.13 ms under ``/dev/shm``, its figures file 1.9 ms
and 0.55 ms: a declare of a queue went from 30 to 14 ms at the median.

Leftovers: a node killed with SIGKILL cannot remove its directory. Each directory holds
an ``owner`` file (the creating process's pid, start time and pid namespace); the next
node to create one in the same place removes every ``warren-*`` directory of this user
whose owner is gone. A directory without an owner file (one being created right now) is
left alone, and so is one whose owner lives in another pid namespace: containers of one
pod share ``/dev/shm`` (and may share a temporary directory) but not their pids, so a
live node's pid there means nothing here, and its directory is not ours to judge. An
owner file of an older version holds the pid and start time only: its pid is judged as
if it were in ours.

Races: a second bind on an ipc path silently steals it from the first binder. Only the
owner of the directory binds in it: a ``Node`` creates its own directory (or is handed
one created under its data-dir lock) and gives each actor incarnation the endpoints of
its name; a restarted incarnation rebinds the same paths on purpose, after the previous
one has exited.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import tempfile

import psutil

from .errors import InvalidSpec

# Longest usable unix socket path, bytes (sun_path is 108 bytes with its NUL).
MAX_IPC_PATH_BYTES = 107
# The memory filesystem a runtime directory goes to when neither $XDG_RUNTIME_DIR nor
# $TMPDIR is set.
MEMORY_FS = "/dev/shm"
# Hex digits of the name hash in a socket file name.
_HASH_HEX_DIGITS = 16
_PREFIX = "warren-"
OWNER_FILE = "owner"


def create_runtime_dir(parent: str | None = None) -> str:
    """Create a fresh private (0700) directory for ipc sockets and return its path.

    ``parent`` defaults to ``default_parent()``.
    """
    if parent is None:
        parent = default_parent()
    sweep_stale_runtime_dirs(parent)
    path = tempfile.mkdtemp(prefix=_PREFIX, dir=parent)
    check_private(path)
    me = psutil.Process()
    with open(os.path.join(path, OWNER_FILE), "w") as owner:
        owner.write(f"{me.pid} {me.create_time()!r} {_pid_namespace()}\n")
    return path


def _pid_namespace() -> str:
    """This process's pid namespace (``pid:[inode]``), or ``-`` where the kernel does not
    say."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return "-"


def default_parent() -> str:
    """Where runtime directories go: ``$XDG_RUNTIME_DIR`` when it is set and short, else
    the temporary directory when ``$TMPDIR`` names it, else ``MEMORY_FS`` when this user
    may make a directory there, else the temporary directory (see the module docstring)."""
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and len(xdg) < 40 and os.path.isdir(xdg):
        return xdg
    writable = os.path.isdir(MEMORY_FS) and os.access(MEMORY_FS, os.W_OK | os.X_OK)
    if writable and not os.environ.get("TMPDIR"):
        return MEMORY_FS
    return tempfile.gettempdir()


def sweep_stale_runtime_dirs(parent: str) -> list[str]:
    """Remove this user's runtime directories under ``parent`` whose owner has exited;
    the paths removed."""
    removed = []
    for name in os.listdir(parent):
        path = os.path.join(parent, name)
        if not name.startswith(_PREFIX) or not _owner_gone(path):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def _owner_gone(path: str) -> bool:
    try:
        info = os.lstat(path)
        if (
            not stat.S_ISDIR(info.st_mode)
            or info.st_uid != os.getuid()
            or stat.S_IMODE(info.st_mode) != 0o700
        ):
            return False
        with open(os.path.join(path, OWNER_FILE)) as owner:
            # an older version wrote the first two only: its namespace is unknown
            pid_text, started_text, *namespace = owner.read().split()
        pid, started = int(pid_text), float(started_text)
    except (OSError, ValueError):
        return False  # not ours, or being created: leave it alone
    if namespace and namespace != [_pid_namespace()]:
        return False  # its pid names no process of ours (see Leftovers)
    try:
        return psutil.Process(pid).create_time() != started  # a reused pid
    except psutil.NoSuchProcess:
        return True


def check_private(path: str) -> None:
    """Refuse a directory that other users could write to or list."""
    mode = os.stat(path).st_mode
    if not stat.S_ISDIR(mode):
        raise InvalidSpec("runtime_dir", path, "is not a directory")
    if stat.S_IMODE(mode) & 0o077:
        raise InvalidSpec("runtime_dir", path, f"mode {stat.S_IMODE(mode):o} is not private (0700)")


def ipc_endpoint(runtime_dir: str, name: str, suffix: str) -> str:
    """``ipc://<dir>/<hash of name>.<suffix>``, checked against the path limit."""
    digest = hashlib.blake2b(name.encode("utf-8"), digest_size=_HASH_HEX_DIGITS // 2)
    path = os.path.join(runtime_dir, f"{digest.hexdigest()}.{suffix}")
    if len(os.fsencode(path)) > MAX_IPC_PATH_BYTES:
        raise InvalidSpec(
            "runtime_dir",
            runtime_dir,
            f"socket path {path!r} is longer than {MAX_IPC_PATH_BYTES} bytes",
        )
    return "ipc://" + path

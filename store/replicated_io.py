"""The writes a node makes to its data directory, kept for its cluster's followers.

Every writer whose files crash recovery reads (the stores and the GC, the queue
indexes, the streams, the definitions, the producers' dedup state) changes them through
these functions rather than ``os``'s: ``write``, ``writev``, ``pwrite``, ``pwritev``, ``ftruncate``,
``truncate``, ``open`` (a create, a truncate to 0), ``rename``, ``unlink``,
``remove_tree``; and syncs them through ``fdatasync``/``fsync``. Outside a cluster
(every process whose environment lacks ``ROOT_VARIABLE``) each is the ``os`` call and
one look at a module global.

In a cluster's leader, each change to a file under the data directory (``ROOT_VARIABLE``)
is recorded, in the order this process made it, with the bytes it wrote (a copy: the
caller may reuse its buffer). Each sync is then a **commit**: once the file's own sync
returned, the actions recorded so far go to the node's coordinator (``warren.supervisor.
cluster``), which numbers them, ships them to the followers and answers when every
in-sync replica has them on its disk; only then does the sync return. A writer gives its
confirms after its sync, so a confirm means what the cluster promises. A refusal (the
node does not lead any more, or its coordinator does not answer within
``COMMIT_TIMEOUT_S``) raises ``ReplicationRefused`` (an ``OSError``, as a failed
fdatasync): the writer's sync fails, and so does what it was about to confirm.

The transport is ``warren.store.replication_link``'s, which enables this module at its
import when the environment names a data directory (``ROOT_VARIABLE``) and the
coordinator's socket (``ENDPOINT_VARIABLE``): a node in a cluster sets both for its
forkserver, which imports it before it forks any actor (the engines that call this
module import no ZeroMQ).

Races it guards against:
- Two threads of one process committing (a stream syncs on a thread of its own): one
  commit at a time, so the coordinator gets each process's actions in the order made.
- A buffer reused after its write: the bytes are copied when the write is recorded.
- A file renamed or deleted before its bytes would be read: they never are read back;
  the actions carry them.
- A process forked with actions pending (the forkserver never records any: its
  children start with an empty journal, ``os.register_at_fork``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "COMMIT_TIMEOUT_S",
    "ENDPOINT_VARIABLE",
    "NODE_OWN_FILES",
    "ROOT_VARIABLE",
    "RecordedAction",
    "UNREPLICATED_DIRECTORIES",
    "commit",
    "disable",
    "enable",
    "fdatasync",
    "fsync",
    "ftruncate",
    "node_own",
    "one_commit",
    "open",
    "pwrite",
    "pwritev",
    "remove_tree",
    "rename",
    "truncate",
    "unlink",
    "write",
    "writev",
]

ROOT_VARIABLE = "WARREN_REPLICATED_DIR"  # the data directory whose writes are replicated
ENDPOINT_VARIABLE = "WARREN_REPLICATION_ENDPOINT"  # the coordinator's socket for commits
COMMIT_TIMEOUT_S = 120.0  # how long a sync waits for the cluster before it fails
# Each node's own files, never replicated: its lock and address, its cluster id, its
# position as a replica, the alarms it raised, the disk space it keeps in reserve.
NODE_OWN_FILES = frozenset(
    {"node.lock", "node.json", "cluster.json", "replica.json", "alarms.json", "node.reserve"}
)
# Directories whose files no start reads back: the transient store is emptied at each.
UNREPLICATED_DIRECTORIES = ("msg_store_transient",)


def node_own(path: str) -> bool:
    """Whether ``path`` (relative to the data directory) is one of the node's own files,
    or a temporary file one is made in."""
    return any(path == own or path.startswith(own + ".") for own in NODE_OWN_FILES)


@dataclass(frozen=True)
class RecordedAction:
    """One change to a file: ``kind`` is ``write``, ``create``, ``truncate`` (to
    ``offset``), ``rename`` (to ``target``) or ``delete``; ``path`` is relative to the
    data directory."""

    kind: str
    path: str
    offset: int = 0
    data: bytes = b""
    target: str = ""


Committer = Callable[[Sequence[RecordedAction]], None]


class _Journal:
    def __init__(self, root: str, committer: Committer) -> None:
        self.root = os.path.realpath(root)
        self.prefix = self.root + os.sep
        self.committer = committer
        self.pending: list[RecordedAction] = []
        self.lock = threading.Lock()  # the pending list
        self.committing = threading.Lock()  # one commit at a time, in order

    def relative(self, path: str) -> str | None:
        """``path`` relative to the data directory, when its writes are replicated."""
        if not path.startswith(self.prefix):
            return None
        relative = path[len(self.prefix) :]
        if relative.split(os.sep, 1)[0] in UNREPLICATED_DIRECTORIES or node_own(relative):
            return None
        return relative

    def record(self, kind: str, path: str | None, **fields: Any) -> None:
        if path is not None:
            with self.lock:
                self.pending.append(RecordedAction(kind, path, **fields))

    def commit(self) -> None:
        with self.committing:
            with self.lock:
                actions, self.pending = self.pending, []
            if actions:
                self.committer(actions)


_journal: _Journal | None = None


def enable(root: str, committer: Committer) -> None:
    """Record the writes under ``root`` in this process; ``committer`` takes each
    commit's actions and returns once the cluster holds them (``warren.store.
    replication_link``'s, or a test's)."""
    global _journal
    _journal = _Journal(root, committer)


def disable() -> None:
    """Record nothing more (what is pending is dropped)."""
    global _journal
    _journal = None


def _forgotten_in_child() -> None:
    """A forked child starts with nothing pending (its committer makes a socket of its
    own: ``replication_link``'s never uses its parent's)."""
    if _journal is not None:
        _journal.pending = []
        _journal.lock = threading.Lock()
        _journal.committing = threading.Lock()


os.register_at_fork(after_in_child=_forgotten_in_child)


def _fd_path(journal: _Journal, fd: int) -> str | None:
    try:
        path = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None
    if path.endswith(" (deleted)"):  # written after its unlink: its delete is recorded
        return None
    return journal.relative(path)


def _named(journal: _Journal, path: str | os.PathLike, dir_fd: int | None) -> str | None:
    path = os.fspath(path)
    if not os.path.isabs(path):
        base = os.readlink(f"/proc/self/fd/{dir_fd}") if dir_fd is not None else os.getcwd()
        path = os.path.join(base, path)
    directory, name = os.path.split(os.path.normpath(path))
    return journal.relative(os.path.join(os.path.realpath(directory), name))


def _kept(data: Any, count: int) -> bytes:
    """The first ``count`` bytes of ``data``, as bytes no caller can change: a whole
    ``bytes`` object as it is, anything else (a reused buffer, a view) copied."""
    if type(data) is bytes and len(data) == count:
        return data
    return bytes(memoryview(data).cast("B")[:count])


def write(fd: int, data: Any) -> int:
    """``os.write``, recorded at the offset it wrote at."""
    count = os.write(fd, data)
    journal = _journal
    if journal is not None and count:
        end = os.lseek(fd, 0, os.SEEK_CUR)
        chunk = _kept(data, count)
        journal.record("write", _fd_path(journal, fd), offset=end - count, data=chunk)
    return count


def writev(fd: int, buffers: Sequence[Any]) -> int:
    """``os.writev``, recorded at the offset it wrote at."""
    count = os.writev(fd, buffers)
    journal = _journal
    if journal is not None and count:
        end = os.lseek(fd, 0, os.SEEK_CUR)
        chunk = _joined(buffers)[:count]
        journal.record("write", _fd_path(journal, fd), offset=end - count, data=chunk)
    return count


def _joined(buffers: Sequence[Any]) -> bytes:
    return b"".join(buffers)  # a copy of each, whatever bytes-like object it is


def pwrite(fd: int, data: Any, offset: int) -> int:
    count = os.pwrite(fd, data, offset)
    journal = _journal
    if journal is not None and count:
        chunk = _kept(data, count)
        journal.record("write", _fd_path(journal, fd), offset=offset, data=chunk)
    return count


def pwritev(fd: int, buffers: Sequence[Any], offset: int) -> int:
    count = os.pwritev(fd, buffers, offset)
    journal = _journal
    if journal is not None and count:
        chunk = _joined(buffers)[:count]
        journal.record("write", _fd_path(journal, fd), offset=offset, data=chunk)
    return count


def ftruncate(fd: int, size: int) -> None:
    os.ftruncate(fd, size)
    journal = _journal
    if journal is not None:
        journal.record("truncate", _fd_path(journal, fd), offset=size)


def truncate(path: str | os.PathLike, size: int) -> None:
    os.truncate(path, size)
    journal = _journal
    if journal is not None:
        journal.record("truncate", _named(journal, path, None), offset=size)


def open(  # noqa: A001 - os.open's stand-in, named as it is
    path: str | os.PathLike, flags: int, mode: int = 0o777, *, dir_fd: int | None = None
) -> int:
    """``os.open``; a create (``O_CREAT``) and a truncate (``O_TRUNC``) are recorded."""
    fd = os.open(path, flags, mode, dir_fd=dir_fd)
    journal = _journal
    if journal is not None and flags & (os.O_CREAT | os.O_TRUNC):
        named = _fd_path(journal, fd)
        if flags & os.O_CREAT:
            journal.record("create", named)
        if flags & os.O_TRUNC:
            journal.record("truncate", named, offset=0)
    return fd


def rename(
    source: str | os.PathLike,
    target: str | os.PathLike,
    *,
    src_dir_fd: int | None = None,
    dst_dir_fd: int | None = None,
) -> None:
    """``os.rename`` (``os.replace``: the same call on Linux), recorded."""
    journal = _journal
    if journal is None:
        os.rename(source, target, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)
        return
    old = _named(journal, source, src_dir_fd)
    new = _named(journal, target, dst_dir_fd)
    os.rename(source, target, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)
    if old is not None and new is not None:
        journal.record("rename", old, target=new)
    elif new is not None:  # moved in from elsewhere: its bytes were never recorded
        fd = os.open(target, os.O_RDONLY, dir_fd=dst_dir_fd)
        try:
            whole = b"".join(iter(lambda: os.read(fd, 1 << 20), b""))
        finally:
            os.close(fd)
        journal.record("create", new)
        journal.record("truncate", new, offset=0)
        journal.record("write", new, data=whole)
    else:  # moved out, or never followed
        journal.record("delete", old)


def unlink(path: str | os.PathLike, *, dir_fd: int | None = None) -> None:
    journal = _journal
    named = None if journal is None else _named(journal, path, dir_fd)
    os.unlink(path, dir_fd=dir_fd)
    if journal is not None:
        journal.record("delete", named)


def remove_tree(path: str | os.PathLike, *, ignore_errors: bool = False) -> None:
    """``shutil.rmtree``, recorded as one delete of the directory and committed at once
    (a queue's process that removes its own directory ends without a sync after it)."""
    journal = _journal
    named = None if journal is None else _named(journal, path, None)
    shutil.rmtree(path, ignore_errors=ignore_errors)
    if journal is not None:
        journal.record("delete", named)
        journal.commit()


def fdatasync(fd: int) -> None:
    """``os.fdatasync``, then a commit (see the module docstring), unless inside
    ``one_commit``."""
    os.fdatasync(fd)
    if not getattr(_deferring, "depth", 0):
        commit()


def fsync(fd: int) -> None:
    """``os.fsync`` (a file's, a directory's), then a commit, unless inside
    ``one_commit``."""
    os.fsync(fd)
    if not getattr(_deferring, "depth", 0):
        commit()


_deferring = threading.local()


@contextlib.contextmanager
def one_commit() -> Iterator[None]:
    """The syncs of a group commit (a file's, then its directory's, then another
    file's) made one commit, at the end: one round trip to the followers, not one a
    sync. Nothing is confirmed before it returns, so nothing is lost by the wait; an
    exception inside sends nothing (what was recorded goes with the next commit)."""
    _deferring.depth = getattr(_deferring, "depth", 0) + 1
    try:
        yield
    finally:
        _deferring.depth -= 1
    if not _deferring.depth:
        commit()


def commit() -> None:
    """Send what this process recorded to the cluster, and wait until it is on every
    in-sync replica (``ReplicationRefused`` otherwise); nothing outside a cluster."""
    journal = _journal
    if journal is not None:
        journal.commit()

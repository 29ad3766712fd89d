"""Replication's engine: the leader's writes to its data directory as one ordered
sequence of file actions, and a follower's copy of that directory kept by applying them.
Plain objects (no sockets, no threads): the coordinator carries the batches between
nodes, and tests drive both ends directly.

Actions (``FileAction``), each with a sequence number the leader gives in order:
``append``/``write`` (bytes at an offset), ``create``, ``truncate`` (to a size),
``rename`` and ``delete``. Every one is **idempotent** (a write names its offset, a
create of an existing file, a delete of a missing one, a rename whose source is gone and
whose target is there: each is done already), so a follower killed between applying a
batch and recording it applies the batch again and ends where the leader is.

Paths are relative to the data directory; ``check_path`` refuses absolute ones, ``..``,
and the node's own files (``NODE_OWN_FILES``: its lock, its address, its cluster id,
which belong to each node, not to the cluster's data).

The follower (``Replica``):
- refuses a batch of an older epoch than the newest it has seen (``StaleEpoch``): a
  deposed leader, paused past its lease, cannot write into a follower that has heard
  from its successor;
- takes a batch only at ``applied + 1`` (a gap or a repeat is refused with the position
  it needs, ``OutOfOrder``: the leader resends from there);
- applies a batch, fdatasyncs every file it touched and the directories whose entries
  changed (group commit: one sync per file per batch), then records ``(epoch, applied)``
  durably in ``REPLICA_FILE``; only then is the batch acknowledged.

The leader (``ActionLog``) keeps every action no ISR member has acknowledged yet, the
position each follower acknowledged, and ``committed(isr)``: the highest action every
member of the ISR has, below which a confirm may be given (the leader's own fdatasync is
its writer's, before the action is recorded).

A follower that joins, or fell further behind than the log keeps, is brought level by a
**full sync**: ``manifest`` lists each file's size and the CRC-32 of each ``BLOCK_BYTES``
block; ``sync_actions`` turns the leader's manifest and the follower's into the actions
that make the follower's files the leader's (only the blocks that differ are written,
files the leader lacks are deleted, longer ones cut).
"""

from __future__ import annotations

import json
import os
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from warren.queues.durable_files import fsync_directory, write_atomically

from ..errors import ClusterError

__all__ = [
    "ActionLog",
    "BLOCK_BYTES",
    "FileAction",
    "NODE_OWN_FILES",
    "OutOfOrder",
    "REPLICA_FILE",
    "Replica",
    "StaleEpoch",
    "check_path",
    "manifest",
    "sync_actions",
]

REPLICA_FILE = "replica.json"  # a follower's position: {"epoch", "applied"}
# Each node's own files, never replicated: its lock and address, its cluster id, its
# position as a replica, the alarms it raised, the disk space it keeps in reserve.
NODE_OWN_FILES = frozenset(
    {"node.lock", "node.json", "cluster.json", REPLICA_FILE, "alarms.json", "node.reserve"}
)
BLOCK_BYTES = 1 << 20  # a full sync compares files block by block, this size
KINDS = ("append", "write", "create", "truncate", "rename", "delete")


class StaleEpoch(ClusterError):
    """A batch of an older epoch than one the replica has already taken."""


class OutOfOrder(ClusterError):
    """A batch that does not start right after the replica's last action; ``needed`` is
    the sequence number it takes next."""

    def __init__(self, message: str, needed: int) -> None:
        super().__init__(message)
        self.needed = needed


def check_path(path: str) -> str:
    """``path`` if it names a file of the data directory a replica may hold; ValueError."""
    parts = path.split("/")
    if (
        not path
        or path.startswith("/")
        or any(part in ("", ".", "..") for part in parts)
        or "\0" in path
    ):
        raise ValueError(f"{path!r} is not a path inside a data directory")
    if path in NODE_OWN_FILES:
        raise ValueError(f"{path!r} is the node's own file, never replicated")
    return path


@dataclass(frozen=True)
class FileAction:
    """One change to one file of the data directory; see the module docstring."""

    seq: int
    kind: str
    path: str
    offset: int = 0  # append, write: where the data goes; truncate: the size
    data: bytes = b""
    target: str = ""  # rename: the new path

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown file action {self.kind!r}")
        check_path(self.path)
        if self.kind == "rename":
            check_path(self.target)
        if self.offset < 0 or self.seq < 1:
            raise ValueError(f"{self.kind} of {self.path!r}: seq and offset are positive")


class Replica:
    """A follower's copy of the leader's data directory; see the module docstring."""

    def __init__(self, data_dir: str) -> None:
        self.data_dir = data_dir
        self.epoch, self.applied = _read_position(data_dir)

    def apply(self, epoch: int, actions: Sequence[FileAction]) -> int:
        """Apply one batch of the leader of ``epoch``; the position now durable (what the
        follower acknowledges)."""
        if epoch < self.epoch:
            raise StaleEpoch(
                f"a batch of epoch {epoch} came after epoch {self.epoch}: its leader was "
                "deposed; nothing applied"
            )
        if actions and actions[0].seq != self.applied + 1:
            raise OutOfOrder(
                f"a batch from action {actions[0].seq}, where the replica has "
                f"{self.applied}: nothing applied",
                self.applied + 1,
            )
        for previous, action in zip(actions, actions[1:], strict=False):
            if action.seq != previous.seq + 1:
                raise OutOfOrder(
                    f"a batch with a gap after action {previous.seq}: nothing applied",
                    self.applied + 1,
                )
        touched: set[str] = set()
        directories: set[str] = set()
        for action in actions:
            _apply(self.data_dir, action, touched, directories)
        for path in sorted(touched):
            _fdatasync(os.path.join(self.data_dir, path))
        for directory in sorted(directories):
            fsync_directory(directory)
        if actions or epoch != self.epoch:
            self.epoch = epoch
            self.applied = actions[-1].seq if actions else self.applied
            _write_position(self.data_dir, self.epoch, self.applied)
        return self.applied


def _apply(data_dir: str, action: FileAction, touched: set[str], directories: set[str]) -> None:
    path = os.path.join(data_dir, action.path)
    parent = os.path.dirname(path)
    if action.kind in ("append", "write", "create", "truncate"):
        _make_directories(parent, directories)
        if not os.path.exists(path):
            directories.add(parent)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            if action.kind in ("append", "write"):
                os.pwrite(fd, action.data, action.offset)
            elif action.kind == "truncate":
                os.ftruncate(fd, action.offset)
        finally:
            os.close(fd)
        touched.add(action.path)
    elif action.kind == "delete":
        try:
            os.unlink(path)
        except FileNotFoundError:
            return  # deleted already
        touched.discard(action.path)
        directories.add(parent)
    else:  # rename
        target = os.path.join(data_dir, action.target)
        if not os.path.exists(path) and os.path.exists(target):
            return  # renamed already
        _make_directories(os.path.dirname(target), directories)
        os.replace(path, target)
        if action.path in touched:
            touched.discard(action.path)
            touched.add(action.target)
        directories.update({parent, os.path.dirname(target)})


def _make_directories(directory: str, directories: set[str]) -> None:
    """Create ``directory`` and its missing parents, noting each parent whose entries
    changed (synced with the batch)."""
    if os.path.isdir(directory):
        return
    _make_directories(os.path.dirname(directory), directories)
    os.mkdir(directory)
    directories.add(os.path.dirname(directory))


def _fdatasync(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return  # renamed or deleted later in the batch: its new name was synced
    try:
        os.fdatasync(fd)
    finally:
        os.close(fd)


def _read_position(data_dir: str) -> tuple[int, int]:
    try:
        with open(os.path.join(data_dir, REPLICA_FILE), encoding="utf-8") as file:
            kept = json.load(file)
        return int(kept["epoch"]), int(kept["applied"])
    except FileNotFoundError:
        return 0, 0


def _write_position(data_dir: str, epoch: int, applied: int) -> None:
    position = json.dumps({"epoch": epoch, "applied": applied}).encode()
    write_atomically(os.path.join(data_dir, REPLICA_FILE), position)


@dataclass
class ActionLog:
    """The leader's side; see the module docstring."""

    next_seq: int = 1
    kept: list[FileAction] = field(default_factory=list)  # from the lowest ISR ack on
    acked: dict[str, int] = field(default_factory=dict)  # follower -> its durable position

    def record(self, kind: str, path: str, **fields: object) -> FileAction:
        """The next action, kept until every ISR member has it."""
        action = FileAction(self.next_seq, kind, path, **fields)  # type: ignore[arg-type]
        self.kept.append(action)
        self.next_seq += 1
        return action

    def batch_for(self, follower: str, limit: int = 1000) -> list[FileAction] | None:
        """The actions ``follower`` lacks, at most ``limit``; None when the log no longer
        keeps the first of them (the follower needs a full sync)."""
        after = self.acked.get(follower, 0)
        if after + 1 >= self.next_seq:
            return []
        if not self.kept or self.kept[0].seq > after + 1:
            return None
        start = after + 1 - self.kept[0].seq
        return self.kept[start : start + limit]

    def acknowledge(self, follower: str, position: int) -> None:
        self.acked[follower] = max(self.acked.get(follower, 0), position)

    def committed(self, isr: Iterable[str]) -> int:
        """The highest action every ISR member but the leader has (the leader has all)."""
        followers = list(isr)
        if not followers:
            return self.next_seq - 1
        return min(self.acked.get(follower, 0) for follower in followers)

    def release(self, isr: Iterable[str]) -> None:
        """Drop what every ISR member has: a follower outside the ISR that needs it later
        is brought level by a full sync."""
        done = self.committed(isr)
        while self.kept and self.kept[0].seq <= done:
            self.kept.pop(0)


def manifest(data_dir: str) -> dict[str, tuple[int, tuple[int, ...]]]:
    """Each replicated file's size and its blocks' CRC-32s, by path."""
    files: dict[str, tuple[int, tuple[int, ...]]] = {}
    for path in _replicated_files(data_dir):
        with open(os.path.join(data_dir, path), "rb") as file:
            crcs = []
            size = 0
            while block := file.read(BLOCK_BYTES):
                crcs.append(zlib.crc32(block))
                size += len(block)
        files[path] = (size, tuple(crcs))
    return files


def _replicated_files(data_dir: str) -> Iterator[str]:
    for root, _, names in os.walk(data_dir):
        for name in sorted(names):
            path = os.path.relpath(os.path.join(root, name), data_dir)
            if path not in NODE_OWN_FILES:
                yield path


def sync_actions(
    data_dir: str,
    leader: dict[str, tuple[int, tuple[int, ...]]],
    follower: dict[str, tuple[int, tuple[int, ...]]],
    first_seq: int,
) -> list[FileAction]:
    """The actions (numbered from ``first_seq``) that make the follower's files those of
    the leader's ``data_dir``, whose manifest is ``leader``."""
    actions: list[FileAction] = []

    def add(kind: str, path: str, **fields: object) -> None:
        actions.append(FileAction(first_seq + len(actions), kind, path, **fields))  # type: ignore[arg-type]

    for path in sorted(set(follower) - set(leader)):
        add("delete", path)
    for path, (size, crcs) in sorted(leader.items()):
        theirs_size, theirs = follower.get(path, (-1, ()))
        if theirs_size < 0:
            add("create", path)
        with open(os.path.join(data_dir, path), "rb") as file:
            for index, crc in enumerate(crcs):
                if index < len(theirs) and theirs[index] == crc:
                    continue
                file.seek(index * BLOCK_BYTES)
                add("write", path, offset=index * BLOCK_BYTES, data=file.read(BLOCK_BYTES))
        if theirs_size != size:
            add("truncate", path, offset=size)
    return actions

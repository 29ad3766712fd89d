"""Replication's engine: the leader's writes to its data directory as one ordered
sequence of file actions, and a follower's copy of that directory kept by applying them.
Plain objects (no sockets, no threads): the coordinator carries the batches between
nodes, and tests drive both ends directly.

Actions (``FileAction``), each with a sequence number the leader gives in order:
``append``/``write`` (bytes at an offset), ``create``, ``truncate`` (to a size),
``rename`` and ``delete``. Writes, creates and truncates are **idempotent** (a write
names its offset), so a follower killed mid-batch applies them again and ends where the
leader is. Renames and deletes are not (a rename then a write of the old name, applied
twice, would write into the renamed file): the follower records its position durably
right before and right after each one, so that a batch taken up again after a kill
never repeats an action that came before a rename or delete already done, and finds the
rename or delete itself done (its source gone, its target there; the file gone).

Paths are relative to the data directory; ``check_path`` refuses absolute ones, ``..``,
and the node's own files (``NODE_OWN_FILES``: its lock, its address, its cluster id,
which belong to each node, not to the cluster's data); a follower never follows a
symbolic link (``O_NOFOLLOW``, and none among a path's directories), and a file or
directory that stands where the leader has the other kind is removed first.

The follower (``Replica``):
- refuses a batch of an older epoch than the newest it has seen (``StaleEpoch``): a
  deposed leader, paused past its lease, cannot write into a follower that has heard
  from its successor;
- takes a batch only at ``applied + 1`` (a gap or a repeat is refused with the position
  it needs, ``OutOfOrder``: the leader resends from there);
- applies a batch, fdatasyncs every file it touched and every directory from the data
  directory down to each path it named (whether or not this run changed the entry: a
  run killed after the change left it unsynced), one sync each per batch (group
  commit), then records ``(epoch, applied)`` durably in ``REPLICA_FILE``; only then is
  the batch acknowledged.

The leader (``ActionLog``) keeps the actions its followers have not acknowledged yet (at
most ``KEPT_ACTIONS``: one further behind needs a full sync), the position each follower
acknowledged, and ``committed(isr)``: the highest action every other member of the ISR
has, below which a confirm may be given (the leader's own fdatasync is its writer's,
before the action is recorded).

A follower that joins, or fell further behind than the log keeps, is brought level by a
**full sync**: the leader notes its position S, then ``manifest`` lists each file's size
and a 128-bit BLAKE2 digest of each ``BLOCK_BYTES`` block; ``sync_actions`` turns the
leader's manifest and the follower's into the actions that make the follower's files
the leader's (only the blocks that differ are written, files the leader lacks are
deleted, longer ones cut), read one block at a time as they are sent. The follower
applies them with ``resync_to=S``: its position becomes S, and the leader's log goes on
from S + 1. Files the leader changes during the sync are read as they are then: the
actions after S, applied next, write the same bytes or later ones (a file deleted
meanwhile is skipped: its delete follows).
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import shutil
import stat
import threading
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from warren.queues.durable_files import fsync_directory
from warren.store.engine.lock_table import RESERVE_FILE, TABLE_FILE
from warren.store.replicated_io import NODE_OWN_FILES, UNREPLICATED_DIRECTORIES, node_own

from ..errors import OutOfOrder, StaleEpoch

__all__ = [
    "ActionLog",
    "BLOCK_BYTES",
    "FileAction",
    "KEPT_ACTIONS",
    "KEPT_BYTES",
    "NODE_OWN_FILES",
    "REPLICA_FILE",
    "Replica",
    "check_path",
    "manifest",
    "sync_actions",
]

REPLICA_FILE = "replica.json"  # a follower's position: {"epoch", "applied", "level", "log"}
assert REPLICA_FILE in NODE_OWN_FILES
POSITION_BYTES = 256  # REPLICA_FILE's size: the position, padded with spaces
BLOCK_BYTES = 1 << 20  # a full sync compares files block by block, this size
KEPT_ACTIONS = 100_000  # the most actions the leader keeps for followers behind
KEPT_BYTES = 256 * 2**20  # and the most bytes they carry
_LOCK_TABLE_FILES = frozenset({TABLE_FILE, RESERVE_FILE})
KINDS = ("append", "write", "create", "truncate", "rename", "delete")


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
        # level: a full sync ended here, so its files are a leader's as of ``applied``
        # (a sync cut short, or none yet, leaves it false: the leader syncs it whole)
        self.epoch, self.applied, self.level, self.log = _read_position(data_dir)
        # Entries an earlier run (or a batch that failed) may have made and not synced:
        # until a batch has been applied whole, every directory a batch names is synced,
        # changed now or not; from then on, only those whose entries it changes.
        self.entries_unsure = True

    def apply(
        self,
        epoch: int,
        actions: Sequence[FileAction],
        *,
        log: str = "",
        resync_to: int | None = None,
        partial: bool = False,
    ) -> int:
        """Apply one batch of the leader of ``epoch``, from its action log ``log`` (each
        leadership numbers its actions anew: a position counts only in the log it was
        reached in); the position now durable (what the follower acknowledges). A full
        sync's batches give ``resync_to``, the leader's position they bring the follower
        to, and all but the last are ``partial``: the replica is not level until the last
        one is applied."""
        if epoch < self.epoch:
            raise StaleEpoch(
                f"a batch of epoch {epoch} came after epoch {self.epoch}: its leader was "
                "deposed; nothing applied"
            )
        if resync_to is None and log != self.log:
            raise ValueError(
                f"a batch of action log {log!r}, where the replica follows {self.log!r}: "
                "nothing applied (a full sync brings it into that log)"
            )
        pending = _Syncs(self.data_dir, every_directory=self.entries_unsure)
        self.entries_unsure = True
        if resync_to is None:
            _check_order(actions, self.applied)
        else:  # not level from its first write on, whenever it is cut short
            self._checkpoint(self.epoch, self.applied, pending, level=False)
            self.log = log
        for action in actions:
            if action.kind in ("rename", "delete") and resync_to is None:
                self._checkpoint(epoch, action.seq - 1, pending, self.level)
                _apply(self.data_dir, action, pending)
                self._checkpoint(epoch, action.seq, pending, self.level)
            else:
                _apply(self.data_dir, action, pending)
        if resync_to is not None:
            self._checkpoint(epoch, resync_to, pending, level=not partial)
        elif actions or epoch != self.epoch:
            last = actions[-1].seq if actions else self.applied
            self._checkpoint(epoch, last, pending, self.level)
        self.entries_unsure = False
        return self.applied

    def _checkpoint(self, epoch: int, applied: int, pending: _Syncs, level: bool) -> None:
        """Sync what the batch changed so far, then record the position."""
        pending.flush()
        if (epoch, applied, level) != (self.epoch, self.applied, self.level):
            _write_position(self.data_dir, epoch, applied, level, self.log)
            self.epoch, self.applied, self.level = epoch, applied, level


def _check_order(actions: Sequence[FileAction], applied: int) -> None:
    if actions and actions[0].seq != applied + 1:
        raise OutOfOrder(
            f"a batch from action {actions[0].seq}, where the replica has {applied}: "
            "nothing applied",
            applied + 1,
        )
    for previous, action in zip(actions, actions[1:], strict=False):
        if action.seq != previous.seq + 1:
            raise OutOfOrder(
                f"a batch with a gap after action {previous.seq}: nothing applied", applied + 1
            )


class _Syncs:
    """The files and directories a batch touched, synced together at a checkpoint."""

    def __init__(self, data_dir: str, every_directory: bool) -> None:
        self.data_dir = data_dir
        self.every_directory = every_directory  # see Replica.entries_unsure
        self.files: set[str] = set()
        self.directories: set[str] = set()

    def named(self, path: str) -> None:
        """Every directory from the data directory down to ``path``'s."""
        directory = self.data_dir
        self.directories.add(directory)
        for part in path.split("/")[:-1]:
            directory = os.path.join(directory, part)
            self.directories.add(directory)

    def flush(self) -> None:
        for path in sorted(self.files):
            _fdatasync(os.path.join(self.data_dir, path))
        for directory in sorted(self.directories, key=len, reverse=True):
            if os.path.isdir(directory):
                fsync_directory(directory)
        self.files.clear()
        self.directories.clear()


def _apply(data_dir: str, action: FileAction, syncs: _Syncs) -> None:
    path = os.path.join(data_dir, action.path)
    if action.kind in ("append", "write", "create", "truncate"):
        _make_directories(data_dir, os.path.dirname(action.path))
        _clear_the_way(path, keep=stat.S_ISREG)
        if syncs.every_directory or action.kind == "create" or not os.path.lexists(path):
            syncs.named(action.path)  # a new entry (a write to an existing file adds none)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        try:
            if action.kind in ("append", "write"):
                os.pwrite(fd, action.data, action.offset)
            elif action.kind == "truncate":
                os.ftruncate(fd, action.offset)
        finally:
            os.close(fd)
        syncs.files.add(action.path)
    elif action.kind == "delete":
        syncs.named(action.path)
        _clear_the_way(path, keep=None)
        syncs.files.discard(action.path)
    else:  # rename
        target = os.path.join(data_dir, action.target)
        syncs.named(action.path)
        syncs.named(action.target)
        if not os.path.lexists(path) and os.path.lexists(target):
            return  # renamed already (the position before it was recorded first)
        _make_directories(data_dir, os.path.dirname(action.target))
        _clear_the_way(target, keep=stat.S_ISREG)
        os.replace(path, target)
        if action.path in syncs.files:
            syncs.files.discard(action.path)
        syncs.files.add(action.target)


def _make_directories(data_dir: str, relative: str) -> None:
    """Create the directories of ``relative`` under ``data_dir``, replacing a file or a
    link that stands where one belongs."""
    directory = data_dir
    for part in relative.split("/") if relative else ():
        directory = os.path.join(directory, part)
        _clear_the_way(directory, keep=stat.S_ISDIR)
        if not os.path.lexists(directory):
            os.mkdir(directory)


def _clear_the_way(path: str, keep: object) -> None:
    """Remove what is at ``path`` unless it is of the kind ``keep`` tests for (a
    symbolic link never is; ``keep=None``: remove whatever is there)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if callable(keep) and keep(mode):
        return
    if stat.S_ISDIR(mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def _opened(path: str) -> int | None:
    """A descriptor of the file at ``path`` for reading, never through a link; None when
    it is gone (renamed or deleted since it was named: what did that is an action too)."""
    try:
        return os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None


def _fdatasync(path: str) -> None:
    fd = _opened(path)
    if fd is None:
        return  # renamed or deleted later in the batch: its new name was synced
    try:
        os.fdatasync(fd)
    finally:
        os.close(fd)


def _read_position(data_dir: str) -> tuple[int, int, bool, str]:
    """The position ``_write_position`` left; a file torn by a crash mid-write (it does
    not parse) reads as no position at all, so the leader syncs the replica whole."""
    try:
        with open(os.path.join(data_dir, REPLICA_FILE), encoding="utf-8") as file:
            kept = json.loads(file.read())
        return (
            int(kept["epoch"]),
            int(kept["applied"]),
            bool(kept.get("level", False)),
            str(kept.get("log", "")),
        )
    except FileNotFoundError:
        return 0, 0, False, ""
    except (ValueError, KeyError, TypeError):
        return 0, 0, False, ""


def _write_position(data_dir: str, epoch: int, applied: int, level: bool, log: str) -> None:
    """Overwrite the position in place, padded to ``POSITION_BYTES``, and fdatasync:
    one sync a batch (a replace would cost three)."""
    position = json.dumps({"epoch": epoch, "applied": applied, "level": level, "log": log}).encode()
    path = os.path.join(data_dir, REPLICA_FILE)
    created = not os.path.exists(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.pwrite(fd, position.ljust(POSITION_BYTES), 0)
        os.fdatasync(fd)
    finally:
        os.close(fd)
    if created:
        fsync_directory(data_dir)


@dataclass
class ActionLog:
    """The leader's side; see the module docstring. ``leader``: its own name, which the
    ISR holds too and which has every action. Safe to share between threads (the
    coordinator records, each follower's link reads and acknowledges)."""

    leader: str
    # each leadership's log is another: a follower's position counts only in its own
    identity: str = field(default_factory=lambda: uuid.uuid4().hex)
    next_seq: int = 1
    kept: collections.deque[FileAction] = field(default_factory=collections.deque)
    acked: dict[str, int] = field(default_factory=dict)  # follower -> its durable position
    kept_bytes: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def position(self) -> int:
        """The last action recorded."""
        return self.next_seq - 1

    def record(self, kind: str, path: str, **fields: object) -> FileAction:
        """The next action, kept until every follower has it (or is too far behind:
        more than ``KEPT_ACTIONS`` or ``KEPT_BYTES`` after it)."""
        with self.lock:
            action = FileAction(self.next_seq, kind, path, **fields)  # type: ignore[arg-type]
            self.kept.append(action)
            self.kept_bytes += len(action.data)
            self.next_seq += 1
            while len(self.kept) > KEPT_ACTIONS or self.kept_bytes > KEPT_BYTES:
                self.kept_bytes -= len(self.kept.popleft().data)
            return action

    def batch_for(self, follower: str, limit: int = 1000) -> list[FileAction] | None:
        """The actions ``follower`` lacks, at most ``limit``; None when the log no longer
        keeps the first of them (the follower needs a full sync)."""
        with self.lock:
            after = self.acked.get(follower, 0)
            if after >= self.position:
                return []
            if not self.kept or self.kept[0].seq > after + 1:
                return None
            start = after + 1 - self.kept[0].seq
            stop = min(start + limit, len(self.kept))
            return [self.kept[index] for index in range(start, stop)]

    def acknowledge(self, follower: str, position: int, identity: str) -> None:
        """``follower`` has every action up to ``position`` of the log ``identity`` on
        its disk (nothing, when that log was renewed since)."""
        with self.lock:
            if identity != self.identity:
                return
            if not 0 <= position <= self.position:
                raise ValueError(
                    f"{follower} acknowledged action {position}; the log is at {self.position}"
                )
            self.acked[follower] = max(self.acked.get(follower, 0), position)

    def resynced(self, follower: str, position: int, identity: str) -> None:
        """``follower`` was brought level with the log ``identity`` at ``position`` (by
        a full sync, or found there: lower, too, for a follower whose disk was replaced);
        nothing when that log was renewed since."""
        with self.lock:
            if identity != self.identity:
                return
            if not 0 <= position <= self.position:
                raise ValueError(f"a full sync to {position}; the log is at {self.position}")
            self.acked[follower] = position

    def renew(self) -> None:
        """A new identity, and no follower's position known any more: each is synced
        whole before it counts again (a writer of the leader ended with writes it never
        committed, which no follower has)."""
        with self.lock:
            self.identity = uuid.uuid4().hex
            self.acked = dict.fromkeys(self.acked, 0)

    def lag(self, follower: str) -> tuple[int, int]:
        """How many actions, and bytes of data, ``follower`` lacks (the bytes counted
        over the actions the log still keeps)."""
        with self.lock:
            after = self.acked.get(follower, 0)
            missing = sum(len(a.data) for a in self.kept if a.seq > after)
            return self.position - after, missing

    def committed(self, isr: Iterable[str]) -> int:
        """The highest action every ISR member has (the leader has all of them)."""
        followers = [member for member in isr if member != self.leader]
        with self.lock:
            return min((self.acked.get(f, 0) for f in followers), default=self.position)

    def release(self) -> None:
        """Drop what every follower has."""
        with self.lock:
            done = min(self.acked.values(), default=self.position)
            while self.kept and self.kept[0].seq <= done:
                self.kept_bytes -= len(self.kept.popleft().data)


Manifest = dict[str, tuple[int, tuple[bytes, ...]]]  # path -> (size, its blocks' digests)


def manifest(data_dir: str) -> Manifest:
    """Each replicated file's size and its blocks' digests, by path."""
    files: Manifest = {}
    for path in _replicated_files(data_dir):
        fd = _opened(os.path.join(data_dir, path))
        if fd is None:
            continue  # deleted since the listing
        with os.fdopen(fd, "rb") as file:
            digests = []
            size = 0
            while block := file.read(BLOCK_BYTES):
                digests.append(hashlib.blake2b(block, digest_size=16).digest())
                size += len(block)
        files[path] = (size, tuple(digests))
    return files


def _replicated_files(data_dir: str) -> Iterator[str]:
    """The regular files under ``data_dir`` (no link followed), but each node's own
    (temporary files too: a replace's source renamed after the sync began must be
    there for its rename to bring it), the stores' lock tables
    (their readers' live state, made anew at each start), and none of the directories no
    start reads back (the transient store's)."""
    for root, directories, names in os.walk(data_dir):
        if root == data_dir:
            directories[:] = [d for d in directories if d not in UNREPLICATED_DIRECTORIES]
        for name in sorted(names):
            full = os.path.join(root, name)
            path = os.path.relpath(full, data_dir)
            if node_own(path) or name in _LOCK_TABLE_FILES or not _regular(full):
                continue
            yield path


def _regular(path: str) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


def sync_actions(data_dir: str, leader: Manifest, follower: Manifest) -> Iterator[FileAction]:
    """The actions that make the follower's files those of the leader's ``data_dir``
    (whose manifest is ``leader``), numbered from 1 within the sync, each block read as
    it is taken."""
    numbers = iter(range(1, 1 << 62))
    for path in sorted(set(follower) - set(leader)):
        yield FileAction(next(numbers), "delete", path)
    for path, (size, digests) in sorted(leader.items()):
        theirs_size, theirs = follower.get(path, (-1, ()))
        if theirs_size < 0:
            yield FileAction(next(numbers), "create", path)
        fd = _opened(os.path.join(data_dir, path))
        if fd is None:
            continue  # deleted since the manifest: its delete action follows the sync
        with os.fdopen(fd, "rb") as file:
            for index, digest in enumerate(digests):
                if index < len(theirs) and theirs[index] == digest:
                    continue
                offset = index * BLOCK_BYTES
                data = os.pread(file.fileno(), BLOCK_BYTES, offset)
                yield FileAction(next(numbers), "write", path, offset=offset, data=data)
        if theirs_size != size:
            yield FileAction(next(numbers), "truncate", path, offset=size)

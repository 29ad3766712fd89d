"""The shared file-lock table: how readers in other processes read store files safely.

Readers in other processes (queues, consumers) read records straight from the ``.rdq``
files instead of asking the store actor. They must never read a file while the store
switches it (the GC's rename of ``Dst.rdt`` over ``Dst.rdq``) or deletes it, must never
block behind the GC, and a reader that dies must never leave a file locked. Kernel locks
give all three: the kernel drops a dead process's locks.

The table is one file, ``lock.table``, in the store directory, memory-mapped by the store
(which writes it) and by every reader (which only reads it)::

    header, 64 bytes: magic "WRNLOCKS" · version u32 · slot count u32 · sequence u64 ·
                      current file u64 · flushed offset u64 · writes blocked u32 ·
                      zero padding
    slot i, 16 bytes at 64 + 16·i: locked u32 · unused u32 · generation u64

File N uses slot ``N mod slot count`` (65,536 slots: files sharing a slot only share its
flag and generation, which costs them fallbacks, never wrong bytes). The byte range of a
slot is also what is locked: readers take an open-file-description read lock on it
(``F_OFD_SETLK``: not ``lockf``/``F_SETLK``, whose locks vanish when any fd of the file
closes, and which are per process rather than per description), the store a write lock.
The header's current file and flushed offset sit behind a sequence counter (odd while the
store updates them) so a reader never combines two halves of different updates.

Reader protocol (``LockTableReader.read``), per record:

1. slot flag set → fall back (ask the store actor);
2. take the read lock without blocking; the store holds the write lock → fall back;
3. re-check the flag: set after step 1 (the store is waiting for readers to leave) →
   release and fall back, so the store gets its lock soon;
4. the file is the current file and the record ends past the flushed offset → fall back;
5. the slot's generation differs from the one the cached fd was opened under → reopen;
6. pread and validate the record (length, size field, msg_id, 0xFF trailer); any
   failure → fall back. Correctness rests on this check: a lock bug costs fallbacks,
   never wrong bytes;
7. release the lock.

Writes blocked: while the node's disk alarm is raised, the store sets the header's
"writes blocked" word and its clients hold their write batches (removes, reads and
contains still go): RabbitMQ's blocking of publishers, as client credit.

The table's blocks are allocated (``posix_fallocate``) before anyone maps it: a mapping
of a file whose blocks the disk cannot provide raises SIGBUS when touched, which is how a
store restarted on a full disk used to die. So that a store can restart even on a full
disk, each start also sets aside ``lock.reserve``, a file the size of the table that no
one maps: the next start deletes it first, and the room it frees holds the new table. A
start that still finds no room fails with a clear error, never a SIGBUS.

Store protocol (``LockTableOwner.exclusive``), around each rename or delete: set the flags
of the slots, poll for their write locks without blocking until a deadline, do the
operation, bump the generations, unlock, clear the flags. Past the deadline (a reader
SIGSTOPped holding its lock) it gives up, clears the flags and the caller retries later:
a stopped reader delays GC, never stalls the store.

Races and their answers:

- reader checks the flag, store sets it and takes the write lock before the reader's lock
  attempt: the reader's lock fails (step 2) → fallback;
- store sets the flag while a reader holds its lock: the store cannot lock until the
  reader releases; new readers see the flag → fallback; the reader finishes on the old,
  intact file;
- reader opened the file before a switch and reads it after: its fd still names the old
  inode, whose records are intact; the generation bump makes it reopen next time (step 5);
- threads of one process share one lock fd, so they share its lock: a per-slot count
  under a mutex makes the first reader lock and the last one unlock;
- ``fork()``: the child inherits the lock fd, and with it the parent's locks, which would
  outlive the parent; ``os.register_at_fork`` closes every reader's lock fd and cached
  file fds in the child, which opens its own on first use;
- a reader killed holding its lock: the kernel releases it with the process's last fd of
  that description;
- the store restarts: it renames a fresh table into place, so flags and locks of the old
  one no longer count; a reader compares the inode of the table it maps with the one under
  the name at its next fallback (and every ``REFRESH_EVERY_READS`` reads) and starts over
  on the new one. The first read after a restart may therefore fall back once;
- the store dies in the middle of updating the header (sequence left odd): the reader
  gives up after ``SEQUENCE_RETRIES`` tries and falls back; the next store's new table
  ends it;
- a file combined away or deleted is never read again, so its cached fd would pin its
  disk space: whenever a reader sees a generation move (or falls back, or every
  ``REFRESH_EVERY_READS`` reads) it closes the fds whose generation is no longer current;
- local filesystems only: OFD locks over NFS are not reliable.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import struct
import threading
import time
import weakref
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from ..errors import StoreDirectoryError
from .records import HEADER, HEADER_BYTES, OK_MARKER, data_file_name

TABLE_FILE = "lock.table"
RESERVE_FILE = "lock.reserve"
SLOT_COUNT = 65536
SWITCH_DEADLINE_SECONDS = 0.1  # how long the store polls for readers to leave
SWITCH_POLL_SECONDS = 0.001
REFRESH_EVERY_READS = 256  # a reader looks for a new table and stale fds this often
SEQUENCE_RETRIES = 1000  # a header update never ends (its store died): fall back

_MAGIC = b"WRNLOCKS"
_VERSION = 1
_HEADER = struct.Struct("<8sIIQQQ")  # magic, version, slots, sequence, current, flushed
_HEADER_BYTES = 64
_SLOT = struct.Struct("<IIQ")  # locked, unused, generation
_SLOT_BYTES = 16
_SEQUENCE_AT = 16
_CURRENT_AT = 24
_BLOCKED_AT = 40
_WORD = struct.Struct("<Q")
_FLOCK = struct.Struct("hhqqi4x")  # struct flock: type, whence, start, len, pid


def _slot_offset(slot: int) -> int:
    return _HEADER_BYTES + slot * _SLOT_BYTES


def _ofd_lock(fd: int, kind: int, slot: int) -> bool:
    """Set or clear an OFD lock on one slot without blocking; False if another holds it."""
    request = _FLOCK.pack(kind, os.SEEK_SET, _slot_offset(slot), _SLOT_BYTES, 0)
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, request)
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


def _set_aside(dir_fd: int, size: int) -> None:
    """Allocate the room the next start's table will need; nothing when the disk has no
    room now."""
    fd = os.open(RESERVE_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644, dir_fd=dir_fd)
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError:
        os.close(fd)
        os.unlink(RESERVE_FILE, dir_fd=dir_fd)
        return
    os.close(fd)


class LockTableOwner:
    """The store's side: creates the table, publishes the current file and flushed
    offset, and takes slots exclusively around renames and deletes."""

    def __init__(self, dir_fd: int, slot_count: int = SLOT_COUNT) -> None:
        self.slot_count = slot_count
        size = _HEADER_BYTES + slot_count * _SLOT_BYTES
        # A fresh table (a new inode, renamed into place) every start: a reader of the
        # previous incarnation keeps its mapping of the old one, which stays valid (never
        # truncate a file someone may have mapped: touching it would raise SIGBUS).
        temp = TABLE_FILE + ".new"
        try:
            os.unlink(RESERVE_FILE, dir_fd=dir_fd)
        except FileNotFoundError:
            pass
        fd = os.open(temp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644, dir_fd=dir_fd)
        try:
            try:
                os.posix_fallocate(fd, 0, size)
            except OSError as exc:
                raise StoreDirectoryError(
                    f"no room to create {TABLE_FILE} ({size} bytes) in the store directory: "
                    f"{exc.strerror}; free disk space"
                ) from exc
            self._map = mmap.mmap(fd, size)
            self._map[: _HEADER.size] = _HEADER.pack(_MAGIC, _VERSION, slot_count, 0, 0, 0)
            os.rename(temp, TABLE_FILE, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        _set_aside(dir_fd, size)

    def publish(self, current_file: int, flushed_offset: int) -> None:
        """Tell readers which file is current and how much of it is written."""
        table = self._map
        (sequence,) = _WORD.unpack_from(table, _SEQUENCE_AT)
        _WORD.pack_into(table, _SEQUENCE_AT, sequence + 1)
        struct.pack_into("<QQ", table, _CURRENT_AT, current_file, flushed_offset)
        _WORD.pack_into(table, _SEQUENCE_AT, sequence + 2)

    def block_writes(self, blocked: bool) -> None:
        """Tell clients to hold their write batches (True) or to send them again."""
        struct.pack_into("<I", self._map, _BLOCKED_AT, int(blocked))

    @contextmanager
    def exclusive(
        self, files: Iterable[int], deadline_seconds: float = SWITCH_DEADLINE_SECONDS
    ) -> Iterator[bool]:
        """Hold the slots of ``files`` exclusively; yields True, or False past the deadline
        (then the caller must not touch the files, and retries later)."""
        slots = sorted({file % self.slot_count for file in files})
        for slot in slots:
            self._set_flag(slot, 1)
        locked: list[int] = []
        try:
            deadline = time.monotonic() + deadline_seconds
            for slot in slots:
                while not _ofd_lock(self._fd, fcntl.F_WRLCK, slot):
                    if time.monotonic() >= deadline:
                        break
                    time.sleep(SWITCH_POLL_SECONDS)
                else:
                    locked.append(slot)
                    continue
                break
            acquired = len(locked) == len(slots)
            yield acquired
            if acquired:
                for slot in slots:
                    self._bump_generation(slot)
        finally:
            # The store may have stopped inside the block (a failed rename breaks it and
            # closes the table): its lock and flags went with the file; nothing to undo.
            if not self._map.closed:
                for slot in locked:
                    _ofd_lock(self._fd, fcntl.F_UNLCK, slot)
                for slot in slots:
                    self._set_flag(slot, 0)

    def held_by_readers(self, file: int) -> bool:
        """Whether some reader holds ``file``'s slot right now (the kernel says; nothing
        counts readers, so this is a yes or no)."""
        request = _FLOCK.pack(
            fcntl.F_WRLCK, os.SEEK_SET, _slot_offset(file % self.slot_count), _SLOT_BYTES, 0
        )
        answer = fcntl.fcntl(self._fd, fcntl.F_OFD_GETLK, request)
        return _FLOCK.unpack(answer)[0] != fcntl.F_UNLCK

    def _set_flag(self, slot: int, value: int) -> None:
        struct.pack_into("<I", self._map, _slot_offset(slot), value)

    def _bump_generation(self, slot: int) -> None:
        at = _slot_offset(slot) + 8
        (generation,) = _WORD.unpack_from(self._map, at)
        _WORD.pack_into(self._map, at, generation + 1)

    def close(self) -> None:
        self._map.close()
        os.close(self._fd)


class LockTableReader:
    """A reader process's side: reads records directly, or says to fall back.

    ``read(file, offset, total_size, msg_id)`` returns the body, or None when the caller
    must ask the store actor instead (see the protocol in the module docstring). Thread-
    safe; one per store directory per process is enough.
    """

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = os.fspath(directory)
        self._mutex = threading.Lock()
        self._lock_fd = -1
        self._map: mmap.mmap | None = None
        self._slot_count = 0
        self._holders: dict[int, int] = {}  # slot -> threads holding its lock
        self._files: dict[int, tuple[int, int]] = {}  # file -> (generation, fd)
        self.direct_reads = 0
        self.fallbacks = 0
        self._reads_since_refresh = 0
        self._switch_seen = False  # a generation moved: sweep after this read
        _readers.add(self)

    def writes_blocked(self) -> bool:
        """Whether the store asks its clients to hold their writes (a disk alarm)."""
        return bool(struct.unpack_from("<I", self._table(), _BLOCKED_AT)[0])

    def read(self, file: int, offset: int, total_size: int, msg_id: bytes) -> bytes | None:
        self._reads_since_refresh += 1
        if self._reads_since_refresh >= REFRESH_EVERY_READS:
            self._refresh()
        try:
            body = self._read(file, offset, total_size, msg_id)
        except OSError:
            body = None  # a missing or replaced file: the store knows
        if body is None:
            self.fallbacks += 1
            self._refresh()
        else:
            self.direct_reads += 1
            if self._switch_seen:
                self._refresh()
        return body

    def _read(self, file: int, offset: int, total_size: int, msg_id: bytes) -> bytes | None:
        table = self._table()
        slot = file % self._slot_count
        slot_at = _slot_offset(slot)
        if table[slot_at] or not self._acquire(slot):
            return None
        try:
            locked, _, generation = _SLOT.unpack_from(table, slot_at)
            if locked:
                return None
            position = self._current_and_flushed(table)
            if (
                position is None
                or file > position[0]
                or (file == position[0] and offset + total_size > position[1])
            ):
                return None
            fd = self._fd_for(file, generation)
            record = os.pread(fd, total_size, offset)
        finally:
            self._release(slot)
        if (
            len(record) != total_size
            or total_size < HEADER_BYTES + 1
            or record[-1] != OK_MARKER
            or HEADER.unpack_from(record) != (total_size - 9, msg_id)
        ):
            return None
        return record[HEADER_BYTES:-1]

    def _table(self) -> mmap.mmap:
        if self._map is None:
            with self._mutex:
                if self._map is None:
                    fd = os.open(os.path.join(self.directory, TABLE_FILE), os.O_RDONLY)
                    table = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
                    magic, version, slots, *_ = _HEADER.unpack_from(table)
                    if magic != _MAGIC or version != _VERSION:
                        table.close()
                        os.close(fd)
                        raise OSError(errno.EINVAL, f"{TABLE_FILE} is not a lock table")
                    self._lock_fd, self._slot_count, self._map = fd, slots, table
        return self._map

    @staticmethod
    def _current_and_flushed(table: mmap.mmap) -> tuple[int, int] | None:
        """The current file and its flushed offset, or None if the header stays mid-update
        (the store died while writing it; a new store brings a new table)."""
        for _ in range(SEQUENCE_RETRIES):
            (before,) = _WORD.unpack_from(table, _SEQUENCE_AT)
            current, flushed = struct.unpack_from("<QQ", table, _CURRENT_AT)
            (after,) = _WORD.unpack_from(table, _SEQUENCE_AT)
            if before == after and not before & 1:
                return current, flushed
        return None

    def _refresh(self) -> None:
        """Let go of what a restarted store or a finished switch made stale: the whole
        table when a new store renamed a new one into place (its locks and flags are the
        ones that count now), else the fds of files whose generation moved on (a file
        combined away or deleted is never read again, and its fd would pin its disk
        space)."""
        self._reads_since_refresh = 0
        with self._mutex:
            self._switch_seen = False
            if self._map is None or self._holders:
                return  # another thread is mid-read: next time
            try:
                replaced = (
                    os.stat(os.path.join(self.directory, TABLE_FILE)).st_ino
                    != os.fstat(self._lock_fd).st_ino
                )
            except FileNotFoundError:
                replaced = True
            if replaced:
                self._drop_everything()
                return
            for file, (generation, fd) in list(self._files.items()):
                slot_at = _slot_offset(file % self._slot_count)
                if _SLOT.unpack_from(self._map, slot_at)[2] != generation:
                    del self._files[file]
                    os.close(fd)

    def _acquire(self, slot: int) -> bool:
        with self._mutex:
            holders = self._holders.get(slot, 0)
            if holders == 0 and not _ofd_lock(self._lock_fd, fcntl.F_RDLCK, slot):
                return False
            self._holders[slot] = holders + 1
            return True

    def _release(self, slot: int) -> None:
        with self._mutex:
            holders = self._holders[slot] - 1
            if holders:
                self._holders[slot] = holders
            else:
                del self._holders[slot]
                _ofd_lock(self._lock_fd, fcntl.F_UNLCK, slot)

    def _fd_for(self, file: int, generation: int) -> int:
        with self._mutex:
            cached = self._files.get(file)
            if cached is not None and cached[0] == generation:
                return cached[1]
            fd = os.open(os.path.join(self.directory, data_file_name(file)), os.O_RDONLY)
            if cached is not None:
                os.close(cached[1])
                self._switch_seen = True
            self._files[file] = (generation, fd)
            return fd

    def forget(self, file: int) -> None:
        """Close the cached fd of a file the caller learned is gone."""
        with self._mutex:
            cached = self._files.pop(file, None)
        if cached is not None:
            os.close(cached[1])

    def close(self) -> None:
        with self._mutex:
            self._drop_everything()

    def _drop_everything(self) -> None:
        for _, fd in self._files.values():
            os.close(fd)
        self._files.clear()
        if self._map is not None:
            self._map.close()
            os.close(self._lock_fd)
            self._map, self._lock_fd = None, -1
        self._holders.clear()

    def _after_fork_in_child(self) -> None:
        """Drop everything inherited: the parent's locks must not live on in the child."""
        self._mutex = threading.Lock()
        self._drop_everything()


_readers: weakref.WeakSet[LockTableReader] = weakref.WeakSet()


def _close_inherited_readers() -> None:
    for reader in list(_readers):
        reader._after_fork_in_child()


os.register_at_fork(after_in_child=_close_inherited_readers)

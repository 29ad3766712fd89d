"""The multi-step changes of a store's files, each run as a whole or breaking the store.

``MessageStore`` takes these from ``FileChanges``: handing pending records to write(2)
(``_flush``), rolling over to a new file, syncing (data, then the directory when a file
was created, renamed or deleted), deleting an empty file (waiting for readers through
the lock table), and the guard every one of them runs under (``_guarded``): an exception
escaping from the middle of one (an OS error, a KeyboardInterrupt, a bug) marks the store
broken, so it refuses every later call and writes no clean snapshot; the next start is
dirty. A failed fsync is never retried.

A full disk is the one error that does not break the store: the space of the current
file is reserved ahead (``reserve``: fallocate, keeping the size), so only writes find
it, never an fdatasync; records that landed whole stay, the rest of the append is cut
off and its writes fail (``SyncResult.failed``), a new file that cannot be created or
reserved fails the records that needed it, and writing resumes by itself when space
returns.

Races (all within the store's one thread): a record is placed (its offset put in the
index) only in the pass that writes it, so a remove before that pass cancels it without
I/O; a partly written append is truncated back before anything else is written, so the
file always ends with whole records where the index expects the next one.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import mmap
import os
from collections.abc import Callable, Iterable
from typing import TypeVar, TypeVarTuple

from .. import replicated_io
from ..disk_faults import slow_sync
from ..errors import StoreError
from . import compaction
from . import index as idx
from .lock_table import SWITCH_DEADLINE_SECONDS
from .records import data_file_name
from .state import _StoreState
from .summary import FileSummary

log = logging.getLogger("warren.store")

# Hot-path copies of the index layout (module globals are one lookup, attributes two).
_FILE_SHIFT = idx.FILE_SHIFT
_OFFSET_SHIFT = idx.OFFSET_SHIFT
_LOCATION_CLEAR = idx.LOCATION_CLEAR
DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_FALLOC_FL_KEEP_SIZE = 1
_libc = ctypes.CDLL(None, use_errno=True)
_T = TypeVar("_T")
_Ts = TypeVarTuple("_Ts")


def reserve(fd: int, length: int) -> None:
    """Allocate the blocks of the first ``length`` bytes of ``fd`` without changing its
    size (fallocate's KEEP_SIZE), so writes below ``length`` cannot find the disk full and
    an fdatasync cannot fail for want of space. OSError(ENOSPC) when the disk lacks the
    room; nothing on a filesystem that cannot reserve."""
    if _libc.fallocate(fd, _FALLOC_FL_KEEP_SIZE, ctypes.c_long(0), ctypes.c_long(length)):
        code = ctypes.get_errno()
        if code not in (errno.EOPNOTSUPP, errno.ENOSYS):
            raise OSError(code, os.strerror(code))


class _NoSpace(Exception):
    """Internal: a write(2) or a new file found the disk full. ``landed`` records of the
    append (in order) are in the file; the effects of the rest are undone and they are
    still pending."""

    def __init__(self, landed: int = 0) -> None:
        super().__init__(landed)
        self.landed = landed


class FileChanges(_StoreState):
    """The multi-step file changes of ``MessageStore`` (see the module docstring)."""

    def _flush(self) -> None:
        """Hand every pending record to write(2), rolling over as files fill up. On a full
        disk the records not written fail (``SyncResult.failed``); the store goes on."""
        if not self._pending:
            return
        index, pending = self._index, self._pending
        offset = start = self._write_offset
        file_bits = self._current_file << _FILE_SHIFT
        try:
            if offset + self._pending_bytes < self.file_size_limit:
                # No rollover (the common case): one pass places the records; records and
                # tickets then go out whole, in arrival order, as the dicts keep it.
                for key, record in pending.items():
                    index[key] = (
                        (index[key] & _LOCATION_CLEAR) | (offset << _OFFSET_SHIFT) | file_bits
                    )
                    offset += len(record)
                keys: dict[int, bytes] | list[int] = pending
                self._append(pending.values(), offset - start)
                self._pending_written(pending)
                return
            keys = []
            for key, record in list(pending.items()):
                index[key] = (index[key] & _LOCATION_CLEAR) | (offset << _OFFSET_SHIFT) | file_bits
                keys.append(key)
                offset += len(record)
                if offset >= self.file_size_limit:
                    self._append([pending[k] for k in keys], offset - start)
                    self._pending_written(keys)
                    keys, offset, start = [], 0, 0
                    self._roll_over()
                    file_bits = self._current_file << _FILE_SHIFT
            if keys:
                self._append([pending[k] for k in keys], offset - start)
                self._pending_written(keys)
        except _NoSpace as full:
            self._pending_written(list(keys)[: full.landed])
            self._pending_failed()

    def _pending_written(self, keys: Iterable[int]) -> None:
        """The records of ``keys`` are in the kernel: their tickets await the fsync."""
        pending, tickets, fan_outs = self._pending, self._pending_tickets, self._pending_fan_out
        unsynced = self._unsynced_tickets
        if keys is pending:  # all of them, the common case: whole dicts
            unsynced += tickets.values()
            for fan_out in fan_outs.values():
                unsynced += fan_out
            pending.clear()
            tickets.clear()
            fan_outs.clear()
            self._pending_bytes = 0
            return
        for key in keys:
            self._pending_bytes -= len(pending.pop(key))
            unsynced.append(tickets.pop(key))
            unsynced += fan_outs.pop(key, ())

    def _pending_failed(self) -> None:
        """The disk is full: every record still pending fails, its references dropped as
        if never written."""
        failed = self._failed_tickets
        before = len(failed)
        for key in self._pending:
            del self._index[key]
            self._holders.table.pop(key, None)
            failed.append(self._pending_tickets[key])
            failed += self._pending_fan_out.get(key, ())
        self._pending.clear()
        self._pending_tickets.clear()
        self._pending_fan_out.clear()
        self._pending_bytes = 0
        self.counters["writes_failed_disk_full"] += len(failed) - before
        if not self.disk_full:
            log.error(
                "%s: the disk is full; writes fail until space is freed (reads and removes go on)",
                self.directory,
            )
        self.disk_full = True

    def _append(self, records: Iterable[bytes], length: int) -> None:
        """Write ``records`` (``length`` bytes) at the end of the current file. On a full
        disk the records that landed whole stay, the rest is cut off, and ``_NoSpace``
        says how many landed."""
        view = memoryview(b"".join(records))
        written = 0
        try:
            while view:
                count = replicated_io.write(self._current_fd, view)
                written += count
                view = view[count:]
        except OSError as exc:
            if exc.errno not in DISK_FULL_ERRNOS:
                raise
            landed = whole = 0
            for record in records:
                if whole + len(record) > written:
                    break
                whole += len(record)
                landed += 1
            # The file must end with whole records, where the index expects the next one.
            end = self._write_offset + whole
            replicated_io.ftruncate(self._current_fd, end)
            os.lseek(self._current_fd, end, os.SEEK_SET)
            try:
                reserve(self._current_fd, self.file_size_limit)  # truncating dropped it
            except OSError:
                pass  # no room now; the writes that need it fail until there is
            if whole:
                self._appended(whole)
            raise _NoSpace(landed) from exc
        self._appended(length)

    def _appended(self, length: int) -> None:
        if self.disk_full:
            log.info("%s: space is back; writes are stored again", self.directory)
            self.disk_full = False
        self._write_offset += length
        summary = self._summary[self._current_file]
        summary.file_size += length
        summary.valid_total_size += length
        self._data_unsynced = True
        if self._lock_table is not None:
            self._lock_table.publish(self._current_file, self._write_offset)

    def _roll_over(self) -> None:
        old = self._current_file
        new = old + 1
        if new > idx.MAX_FILE:
            raise StoreError(f"file numbers exhausted at {new}")
        new_fd = self._open_data_file(new)
        if self._data_unsynced:
            if self._fsync:
                replicated_io.fdatasync(self._current_fd)
                self.counters["syncs"] += 1
            else:
                self._unsynced_files.add(old)
            self._data_unsynced = False
        os.close(self._current_fd)
        self._current_fd = new_fd
        self._summary[new] = FileSummary(left=old)
        self._summary[old].right = new
        self._current_file = new
        self._write_offset = 0
        self._directory_unsynced = True
        if self._lock_table is not None:
            self._lock_table.publish(new, 0)
        old_summary = self._summary[old]
        if old_summary.valid_total_size == 0 and not old_summary.locked:
            self._delete_empty_file(old)

    def _open_data_file(self, file: int) -> int:
        """Create data file ``file`` with its space reserved; _NoSpace (and no file left
        behind) when the disk cannot hold it."""
        try:
            fd = replicated_io.open(
                data_file_name(file),
                os.O_RDWR | os.O_CREAT | os.O_TRUNC,
                0o644,
                dir_fd=self._dir_fd,
            )
        except OSError as exc:
            if exc.errno in DISK_FULL_ERRNOS:
                raise _NoSpace from exc
            raise
        try:
            reserve(fd, self.file_size_limit)
        except OSError as exc:
            os.close(fd)
            replicated_io.unlink(data_file_name(file), dir_fd=self._dir_fd)
            if exc.errno in DISK_FULL_ERRNOS:
                raise _NoSpace from exc
            raise
        self._directory_unsynced = True
        return fd

    def _sync_to_disk(self) -> None:
        self._flush()
        self._removals.write()
        with replicated_io.one_commit():  # the writes, even where no fsync covers them
            if self._fsync:
                slow_sync()
                if self._data_unsynced:
                    replicated_io.fdatasync(self._current_fd)
                    self.counters["syncs"] += 1
                if self._directory_unsynced:
                    replicated_io.fsync(self._dir_fd)
                    self.counters["syncs"] += 1
                    self._directory_unsynced = False
        self._data_unsynced = False

    def _delete_empty_file(self, file: int, wait_s: float = SWITCH_DEADLINE_SECONDS) -> None:
        """Delete a non-current file with no valid data, once no reader holds it; while
        one does (for ``wait_s``), keep it locked and retry at the next sync."""
        if self._lock_table is None:
            self._unlink_file(file)
            return
        with self._lock_table.exclusive([file], wait_s) as acquired:
            if acquired:
                self._unlink_file(file)
                return
        self._summary[file].locked = True
        self._deferred_deletes.add(file)

    def _unlink_file(self, file: int) -> None:
        self._unsynced_files.discard(file)
        self._uncombinable.discard(file)
        summary = self._summary.pop(file)
        if summary.left is not None:
            self._summary[summary.left].right = summary.right
        if summary.right is not None:
            self._summary[summary.right].left = summary.left
        self._unmap(file)
        replicated_io.unlink(data_file_name(file), dir_fd=self._dir_fd)
        self._removals.forget(file)
        compaction.forget(self._dir_fd, file)
        self._not_worth_compacting.pop(file, None)
        self._removes_seen.pop(file, None)
        self._directory_unsynced = True
        self.counters["files_deleted"] += 1

    def _map_file(self, file: int) -> mmap.mmap:
        """Map a non-current file for reading. It no longer changes: the GC replaces it by
        rename and deletes it by unlink, and a mapping outlives both (it holds the inode)."""
        fd = os.open(data_file_name(file), os.O_RDONLY, dir_fd=self._dir_fd)
        try:
            mapped = self._maps[file] = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)
        return mapped

    def _unmap(self, file: int) -> None:
        mapped = self._maps.pop(file, None)
        if mapped is not None:
            mapped.close()

    def _guarded(self, operation: Callable[[*_Ts], _T], *args: *_Ts) -> _T:
        """Run one multi-step change of the files or the index as a whole: any exception
        escaping it (an OS error, a KeyboardInterrupt, a bug) breaks the store."""
        try:
            return operation(*args)
        except BaseException as exc:
            self._break(operation.__name__, exc)
            raise

    def _break(self, where: str, exc: BaseException) -> None:
        """Stop the store after ``where`` was interrupted by ``exc``: the index and files
        may disagree now, so no clean snapshot may ever describe them. Every later call
        raises StoreClosed, ``close()`` writes nothing, and the next open recovers dirty.
        A failed fsync is never retried: the kernel may have dropped the pages it could
        not write."""
        if self._broken is not None or self._closed:
            return
        self._broken = exc
        log.error(
            "%s: %s was interrupted (%s: %s); the store stops and recovers dirty on next open",
            self.directory,
            where,
            type(exc).__name__,
            exc,
        )
        self._release()

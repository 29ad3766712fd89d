"""The removal log: which records in the data files were removed, so that a dirty recovery
with no reference counts to go by does not bring acknowledged messages back.

Why. A remove only changes the index in memory; the record stays in its file until the
file is deleted or combined. A dirty recovery that is given no reference counts (a store
used directly, with no queue index to walk) counts every record it finds once, so every
removed record whose file still existed came back: 1,500 live and 1,500 removed messages
became 3,000 after a crash.

Format. ``removals.log`` in the store directory, a sequence of 32-byte entries::

    file:u32 BE | offset:u64 BE | msg_id:16 | crc32 of the 28 bytes before:u32 BE

naming the record (file, offset, id) that a remove took to zero references. A torn last
entry (a crash mid-append) or a damaged one fails its length or CRC and is ignored.

Protocol with the store (``warren.store.message_store``):
- ``note`` buffers an entry when a remove drops a record in a file (not a pending one,
  which never reaches the disk) to zero references: no I/O on the remove itself;
- ``write`` appends the buffer with the group commit's flush, and ``sync`` fdatasyncs it
  when that commit fdatasyncs the data (policy "fsync"), so a remove answered to a client
  is on disk like the writes answered with it;
- a dirty recovery without reference counts drops every record whose place and id an
  entry names (``entries``);
- ``compact`` rewrites the log with only the entries a predicate keeps (temp file, fsync,
  rename, directory fsync): at a clean close and when the log has doubled, the entries of
  deleted files go; before a combine switches Dst and Src, their entries go too.

Races and their answers:
- A combine moves live records into Dst at new offsets: a live record could land exactly
  where a removed record of the same id (a reused id) used to be, and an old entry would
  then drop it. Entries of Dst and Src are therefore removed *before* the rename: a crash
  between the two can only bring a removed record back (at-least-once), never lose a live
  one.
- A file is deleted: its entries name records that no longer exist and match nothing;
  file numbers only grow, so they never name a record of a later file.
- The disk is full: entries stay buffered and are written at a later sync; a compaction
  that finds no room leaves the log as it was (a combine then waits: it may not switch
  files before its entries are gone).
- A crash before ``write``: the remove was not answered yet (removes are answered with
  the sync that writes them), so bringing the record back breaks no promise.
"""

from __future__ import annotations

import errno
import os
import struct
import zlib
from collections.abc import Callable, Iterator

LOG_FILE = "removals.log"
_TEMP = LOG_FILE + ".tmp"
_HEAD = struct.Struct(">IQ16s")
_CRC = struct.Struct(">I")
ENTRY_BYTES = _HEAD.size + _CRC.size
# Compact when the log has grown past both this and twice its size after the last
# compaction (bytes).
COMPACT_AFTER_BYTES = 4 * 2**20


class RemovalLog:
    """The removal log of one store directory; owned by the store's one thread."""

    def __init__(self, dir_fd: int, *, fsync: bool) -> None:
        self._dir_fd = dir_fd
        self._fsync = fsync
        self._fd = os.open(LOG_FILE, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644,
                           dir_fd=dir_fd)
        self._buffer = bytearray()
        self._unsynced = False
        self.size = os.fstat(self._fd).st_size
        self._compacted_size = self.size

    def note(self, file: int, offset: int, msg_id: bytes) -> None:
        head = _HEAD.pack(file, offset, msg_id)
        self._buffer += head
        self._buffer += _CRC.pack(zlib.crc32(head))

    def write(self) -> None:
        """Hand the buffered entries to write(2); on a full disk keep them buffered for the
        next try (a partly written entry is cut off first)."""
        if not self._buffer:
            return
        view = memoryview(self._buffer)
        try:
            while view:
                view = view[os.write(self._fd, view):]
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            os.ftruncate(self._fd, self.size)
            return
        self.size += len(self._buffer)
        self._buffer = bytearray()
        self._unsynced = True

    def sync(self) -> None:
        """fdatasync what ``write`` appended (policy "fsync" only)."""
        if self._unsynced and self._fsync:
            os.fdatasync(self._fd)
        self._unsynced = False

    def due_for_compaction(self) -> bool:
        return self.size > max(COMPACT_AFTER_BYTES, 2 * self._compacted_size)

    def entries(self) -> Iterator[tuple[int, int, bytes]]:
        """Every intact entry on disk, in the order written: (file, offset, msg_id)."""
        return parse_entries(os.pread(self._fd, self.size, 0))

    def compact(self, keep: Callable[[int], bool]) -> bool:
        """Rewrite the log with the entries whose file ``keep`` accepts; False, and the log
        as it was, when the disk has no room for the new one."""
        self.write()
        if self._buffer:
            return False
        kept = bytearray()
        for file, offset, msg_id in self.entries():
            if keep(file):
                head = _HEAD.pack(file, offset, msg_id)
                kept += head
                kept += _CRC.pack(zlib.crc32(head))
        try:
            fd = os.open(_TEMP, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644,
                         dir_fd=self._dir_fd)
            try:
                view = memoryview(kept)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            os.unlink(_TEMP, dir_fd=self._dir_fd)
            return False
        os.rename(_TEMP, LOG_FILE, src_dir_fd=self._dir_fd, dst_dir_fd=self._dir_fd)
        os.fsync(self._dir_fd)
        os.close(self._fd)
        self._fd = os.open(LOG_FILE, os.O_RDWR | os.O_APPEND, dir_fd=self._dir_fd)
        self.size = self._compacted_size = len(kept)
        self._unsynced = False
        return True

    def close(self) -> None:
        os.close(self._fd)


def parse_entries(data: bytes) -> Iterator[tuple[int, int, bytes]]:
    """The intact entries in a removal log's bytes; a torn or damaged one is skipped."""
    for start in range(0, len(data) - ENTRY_BYTES + 1, ENTRY_BYTES):
        head = data[start:start + _HEAD.size]
        (crc,) = _CRC.unpack_from(data, start + _HEAD.size)
        if zlib.crc32(head) == crc:
            yield _HEAD.unpack(head)


def read_entries(directory: str) -> list[tuple[int, int, bytes]]:
    """The intact entries of ``directory``'s removal log, read without opening a store
    (for ``warren store inspect``); none when there is no log."""
    try:
        with open(os.path.join(directory, LOG_FILE), "rb") as log:
            return list(parse_entries(log.read()))
    except FileNotFoundError:
        return []

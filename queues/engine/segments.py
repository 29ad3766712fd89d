"""``SegmentFiles``: the numbered segment files of one queue directory (``<seg>.qi``), each
holding the index slots and the per-queue store records of ``segment_entry_count`` seq
ids (``queue_index`` describes the layout).

A file is created whole up to its record area on its first write (its header, then its
slots written as zeros: an index segment's fixed size, as RabbitMQ preallocates its
own); the files written since the last ``sync`` are fdatasync'd together (and the
directory, when files came or went), and a sync with nothing written costs nothing; all
but the newest are closed then, so a queue holds a handful of descriptors however long it
is. One file per segment is what makes a group commit one fdatasync per segment written,
the slots and the records of a batch together. ``start_writeback`` sets the device to
work on what was written without waiting for the writes (``sync_file_range``, Linux; it
may wait for room in the device's queue): a caller that still has computing to do before
its sync makes the sync wait only for the rest. Measured here, 100 KiB appended then
fdatasync'd 150 µs of computing later: 475 µs a sync p50, 355 µs with the writeback
started right after the write. It promises nothing: only ``sync`` makes anything durable,
and reports what failed (a writeback's error reaches the fdatasync of the same file).

Races it guards against: a crash right after a file was created or deleted. The directory
is fsynced at the next sync, before anything written there is confirmed. A crash in the
middle of creating a file leaves it short: its missing slots read as absent. A failed
fdatasync: Linux may drop the pages it could not write, or mark them clean, so a second
fdatasync of the file can succeed with the data lost. Every later ``sync`` raises
instead; what was written is known again only by reopening the queue, which recovers
from what is on disk (a queue process crashes on the first failure and does just that).
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
import sys
from collections.abc import Callable

from isal.isal_zlib import crc32

from warren.store import replicated_io

__all__ = ["SegmentFiles", "segment_numbers", "write_vectors"]


# Every segment file opens with a 64-byte header (format 1's store files had one of the
# same shape too): magic, format version, entries per segment and the segment's first
# sequence id, zero-padded, with a CRC-32 of the first 60 bytes in the last 4.
HEADER_BYTES = 64
_HEADER = struct.Struct(">4sBIQ")
_HEADER_CRC_AT = 60
_CRC = struct.Struct(">I")


_SYNC_FILE_RANGE_WRITE = 2  # start writing the dirty pages back; wait for none of them
_MAX_VECTORS = 1024  # IOV_MAX on Linux: buffers per pwritev


def _writeback_starter() -> Callable[[int], object] | None:
    """A call starting the writeback of a whole file, given its fd; None where the kernel
    has no ``sync_file_range``."""
    if not sys.platform.startswith("linux"):
        return None
    call = getattr(ctypes.CDLL(None, use_errno=True), "sync_file_range", None)
    if call is None:
        return None
    call.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    return lambda fd: call(fd, 0, 0, _SYNC_FILE_RANGE_WRITE)  # 0 bytes: to the end


_start_file_writeback = _writeback_starter()


def segment_header(magic: bytes, version: int, segment: int, entry_count: int) -> bytes:
    """The header of segment ``segment`` of a file kind (``magic``, ``version``)."""
    head = _HEADER.pack(magic, version, entry_count, segment * entry_count)
    head = head.ljust(_HEADER_CRC_AT, b"\0")
    return head + _CRC.pack(crc32(head))


def header_fields(header: bytes) -> tuple[bytes, int, int, int] | None:
    """(magic, version, entry count, first sequence id) of a header, or None when it is
    too short to hold them."""
    if len(header) < _HEADER.size:
        return None
    magic, version, entry_count, first = _HEADER.unpack_from(header)
    return magic, version, entry_count, first


def segment_numbers(dir_fd: int, suffix: str) -> list[int]:
    """The segment numbers of the files named ``<n><suffix>``, sorted."""
    found = []
    for name in os.listdir(dir_fd):
        stem = name[: -len(suffix)]
        if name.endswith(suffix) and stem.isdigit() and stem == str(int(stem)):
            found.append(int(stem))
    return sorted(found)


class SegmentFiles:
    def __init__(
        self, dir_fd: int, suffix: str, header: Callable[[int], bytes], initial_bytes: int = 0
    ) -> None:
        """``header(segment)`` makes a new file's header; the file is written as zeros
        after it up to ``initial_bytes``."""
        self.dir_fd = dir_fd
        self.suffix = suffix
        self._header = header
        self._initial_bytes = initial_bytes
        self.on_disk: set[int] = set(segment_numbers(dir_fd, suffix))
        self.written: dict[int, int] = {}  # segment -> fd, open for writing
        self._read_fd: tuple[int, int] | None = None  # (segment, fd) of the last read
        self._unsynced: set[int] = set()  # segments written since the last sync
        self._sync_failed: OSError | None = None  # an fdatasync's error: none succeeds after
        self._directory_unsynced = False
        self._users: list[Callable[[int], bool]] = []  # what still needs which segment

    def name(self, segment: int) -> str:
        return f"{segment}{self.suffix}"

    def read_all(self, segment: int, limit: int = -1) -> bytes:
        """The file's bytes (up to ``limit``); b"" when it does not exist."""
        try:
            fd = os.open(self.name(segment), os.O_RDONLY, dir_fd=self.dir_fd)
        except FileNotFoundError:
            return b""
        with open(fd, "rb") as file:
            return file.read(limit)

    def open_for_reading(self, segment: int) -> int | None:
        try:
            return os.open(self.name(segment), os.O_RDONLY, dir_fd=self.dir_fd)
        except FileNotFoundError:
            return None

    def reader(self, segment: int) -> int | None:
        """An fd to read the segment with (its writer's, or one kept open for the next
        read of it, closed when another segment is read or this one deleted); None when
        the file does not exist."""
        fd = self.written.get(segment)
        if fd is not None:
            return fd
        if self._read_fd is not None:
            if self._read_fd[0] == segment:
                return self._read_fd[1]
            self._close_reader()
        fd = self.open_for_reading(segment)
        if fd is not None:
            self._read_fd = (segment, fd)
        return fd

    def _close_reader(self) -> None:
        if self._read_fd is not None:
            os.close(self._read_fd[1])
            self._read_fd = None

    def for_writing(self, segment: int) -> int:
        """The segment's fd for writing; the file is created whole (header and zeros) if
        new. The caller writes to it: the next ``sync`` fdatasyncs it."""
        fd = self.written.get(segment)
        if fd is None:
            fd = self._open_for_writing(segment)
            self.written[segment] = fd
        self._unsynced.add(segment)
        return fd

    def _open_for_writing(self, segment: int) -> int:
        fd = replicated_io.open(
            self.name(segment), os.O_RDWR | os.O_CREAT, 0o644, dir_fd=self.dir_fd
        )
        if segment in self.on_disk:
            return fd
        self._directory_unsynced = True  # the next sync makes the new entry durable
        start = self._header(segment).ljust(self._initial_bytes, b"\0")
        try:
            if replicated_io.pwrite(fd, start, 0) != len(start):
                raise OSError(errno.ENOSPC, f"{self.name(segment)}: short write creating it")
        except BaseException:
            # A file without its whole start is never used: a full disk fails this write,
            # and the next one creates the file again.
            os.close(fd)
            replicated_io.unlink(self.name(segment), dir_fd=self.dir_fd)
            raise
        self.on_disk.add(segment)
        return fd

    def delete(self, segment: int) -> None:
        if self._read_fd is not None and self._read_fd[0] == segment:
            self._close_reader()
        fd = self.written.pop(segment, None)
        self._unsynced.discard(segment)
        if fd is not None:
            os.close(fd)
        try:
            replicated_io.unlink(self.name(segment), dir_fd=self.dir_fd)
        except FileNotFoundError:
            pass  # never written, or deleted by an earlier start
        self.on_disk.discard(segment)
        self._directory_unsynced = True

    def add_user(self, needs: Callable[[int], bool]) -> None:
        """Let ``needs(segment)`` keep a segment's file (the index for its entries, the
        queue's own store for its records): see ``delete_unused``."""
        self._users.append(needs)

    def delete_unused(self, segment: int) -> None:
        """Delete the segment's file unless one of its users still needs it."""
        if segment in self.on_disk and not any(needs(segment) for needs in self._users):
            self.delete(segment)

    def delete_all(self) -> None:
        """Delete every file, and make that durable: nothing written is left to sync, so
        this holds after a failed fdatasync too."""
        for segment in sorted(self.on_disk):
            self.delete(segment)
        replicated_io.fsync(self.dir_fd)
        self._directory_unsynced = False

    def start_writeback(self) -> None:
        """Have the device start on every file written since the last sync, without
        waiting for the writes; what fails is left for ``sync`` to raise."""
        if _start_file_writeback is not None:
            for segment in self._unsynced:
                _start_file_writeback(self.written[segment])

    def sync(self) -> None:
        """fdatasync every file written since the last sync, and the directory if needed;
        after a failed one, raise every time (the module docstring)."""
        if self._sync_failed is not None:
            raise OSError(
                self._sync_failed.errno,
                f"an earlier fdatasync of these segment files failed ({self._sync_failed}); "
                f"reopen the queue to recover from what is on disk",
            )
        try:
            for segment in self._unsynced:
                replicated_io.fdatasync(self.written[segment])
            self._unsynced.clear()
            newest = max(self.written, default=None)
            for segment in [s for s in self.written if s != newest]:
                os.close(self.written.pop(segment))
            if self._directory_unsynced:
                replicated_io.fsync(self.dir_fd)
                self._directory_unsynced = False
        except OSError as exc:
            self._sync_failed = exc
            raise

    def close(self) -> None:
        """Close every descriptor without syncing (the caller synced, or is crashing)."""
        for fd in self.written.values():
            os.close(fd)
        self.written.clear()
        self._unsynced.clear()
        self._close_reader()


def write_vectors(fd: int, vectors: list[bytes], offset: int) -> None:
    """pwritev all of ``vectors`` at ``offset``, IOV_MAX buffers at a time; a short write
    (which a regular file gives only when something is wrong) raises."""
    for at in range(0, len(vectors), _MAX_VECTORS):
        chunk = vectors[at : at + _MAX_VECTORS]
        expected = sum(map(len, chunk))
        written = replicated_io.pwritev(fd, chunk, offset)
        if written != expected:
            raise OSError(f"short write: {written} of {expected} bytes at offset {offset}")
        offset += written

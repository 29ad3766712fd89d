"""``SegmentFiles``: the numbered files of one kind in a queue directory (``<seg>.qi`` of
the index, ``<seg>.qs`` of the per-queue store), shared by both.

A file is created with its header on its first write; the files written since the last
``sync`` are fdatasync'd together (and the directory, when files came or went), and a
sync with nothing written costs nothing; all but the newest are closed then, so a queue
holds a handful of descriptors however long it is.

``sync_together`` syncs two sets of files at once (a queue's index and its store): the
first's fdatasyncs on a helper thread while the caller makes the second's, so a group
commit waits for the slower flush, not for the sum of both.

Races it guards against: a crash right after a file was created or deleted. The directory
is fsynced at the next sync, before anything written there is confirmed. A crash during
a ``sync_together`` may leave either set durable without the other; nothing either holds
is confirmed before both are, and recovery drops an index entry whose record did not
land (it fails its size or CRC check).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from isal.isal_zlib import crc32

__all__ = ["SegmentFiles", "segment_numbers", "sync_together"]

_sync_helper: tuple[int, ThreadPoolExecutor] | None = None  # (pid, its one thread)


# Every segment file, of the index (.qi) and of the queue's store (.qs), opens with the
# same 64-byte header: magic, format version, entries per segment and the segment's first
# sequence id, zero-padded, with a CRC-32 of the first 60 bytes in the last 4.
HEADER_BYTES = 64
_HEADER = struct.Struct(">4sBIQ")
_HEADER_CRC_AT = 60
_CRC = struct.Struct(">I")


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
    def __init__(self, dir_fd: int, suffix: str, header: Callable[[int], bytes]) -> None:
        self.dir_fd = dir_fd
        self.suffix = suffix
        self._header = header
        self.on_disk: set[int] = set(segment_numbers(dir_fd, suffix))
        self.written: dict[int, int] = {}  # segment -> fd, open for writing
        self._unsynced: set[int] = set()  # segments written since the last sync
        self._directory_unsynced = False

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

    def for_writing(self, segment: int) -> int:
        """The segment's fd for writing; the file is created with its header if new.
        The caller writes to it: the next ``sync`` fdatasyncs it."""
        self._unsynced.add(segment)
        fd = self.written.get(segment)
        if fd is None:
            fd = os.open(self.name(segment), os.O_RDWR | os.O_CREAT, 0o644, dir_fd=self.dir_fd)
            self.written[segment] = fd
            if segment not in self.on_disk:
                os.pwrite(fd, self._header(segment), 0)
                self.on_disk.add(segment)
                self._directory_unsynced = True
        return fd

    def delete(self, segment: int) -> None:
        fd = self.written.pop(segment, None)
        self._unsynced.discard(segment)
        if fd is not None:
            os.close(fd)
        try:
            os.unlink(self.name(segment), dir_fd=self.dir_fd)
        except FileNotFoundError:
            pass  # never written, or deleted by an earlier start
        self.on_disk.discard(segment)
        self._directory_unsynced = True

    def delete_all(self) -> None:
        for segment in sorted(self.on_disk):
            self.delete(segment)
        self.sync()

    @property
    def unsynced(self) -> bool:
        """Whether ``sync`` has anything to flush."""
        return bool(self._unsynced) or self._directory_unsynced

    def sync(self) -> None:
        """fdatasync every file written since the last sync, and the directory if needed."""
        for segment in self._unsynced:
            os.fdatasync(self.written[segment])
        self._unsynced.clear()
        newest = max(self.written, default=None)
        for segment in [s for s in self.written if s != newest]:
            os.close(self.written.pop(segment))
        if self._directory_unsynced:
            os.fsync(self.dir_fd)
            self._directory_unsynced = False

    def close(self) -> None:
        """Close every descriptor without syncing (the caller synced, or is crashing)."""
        for fd in self.written.values():
            os.close(fd)
        self.written.clear()
        self._unsynced.clear()


def sync_together(first: SegmentFiles, second: SegmentFiles) -> None:
    """``first.sync()`` and ``second.sync()``, overlapped when both have something to
    flush: the first on this process's sync thread, the second here."""
    if not (first.unsynced and second.unsynced):
        first.sync()
        second.sync()
        return
    flushed = _sync_thread().submit(first.sync)
    try:
        second.sync()
    finally:
        flushed.result()


def _sync_thread() -> ThreadPoolExecutor:
    """The process's sync thread, made on first use (and again in a forked child, which
    has none of its parent's threads)."""
    global _sync_helper
    if _sync_helper is None or _sync_helper[0] != os.getpid():
        _sync_helper = (os.getpid(), ThreadPoolExecutor(1, thread_name_prefix="segment sync"))
    return _sync_helper[1]

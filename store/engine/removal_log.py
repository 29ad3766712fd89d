"""The removal logs: which records in the data files were removed, so that a dirty recovery
with no reference counts to go by does not bring acknowledged messages back.

Why. A remove only changes the index in memory; the record stays in its file until the
file is deleted or combined. A dirty recovery that is given no reference counts (a store
used directly, with no queue index to walk) counts every record it finds once, so every
removed record whose file still existed came back: 1,500 live and 1,500 removed messages
became 3,000 after a crash.

Format. One log beside each data file that has removed records, ``N.removed`` for
``N.rdq``: a sequence of 28-byte entries::

    offset:u64 BE | msg_id:16 | crc32 of the 24 bytes before:u32 BE

naming a record of ``N.rdq`` that a remove took to zero references. A torn last entry (a
crash mid-append) or a damaged one fails its length or CRC and is ignored.

Protocol with the store (``warren.store.engine.message_store``):
- ``note`` buffers an entry when a remove drops a record in a file (not a pending one,
  which never reaches the disk) to zero references: no I/O on the remove itself;
- ``write`` appends the buffered entries with the group commit, one write(2) per file
  touched, before the removes are answered: a remove answered to a client survives the
  store process's crash. The logs are not fdatasync'd: after an OS crash a removed
  message may come back (at-least-once), never a live one lost;
- a dirty recovery without reference counts drops every record an entry names
  (``entries``);
- a data file deleted, or combined away, takes its log with it (``forget``), and a data
  file compacted has its log written anew with only the entries that still name a
  record in it (``replace``: the compaction zeroed or cut off the others).

Races and their answers:
- A combine moves live records into Dst at new offsets: a live record could land exactly
  where a removed record of the same id (a reused id) used to be, and an old entry would
  then drop it. The logs of Dst and Src are therefore deleted, and the directory fsynced,
  *before* the rename: a crash between the two can only bring a removed record back.
- File numbers only grow, so a log never outlives its file into a later one of the same
  number.
- The disk is full: entries stay buffered (a partly written one is cut off) and are
  written at a later sync.
- A crash before ``write``: the remove was not answered yet (removes are answered with
  the sync that writes them), so bringing the record back breaks no promise.
"""

from __future__ import annotations

import errno
import os
import re
import struct
from collections.abc import Container, Iterable, Iterator, Sequence

from isal.isal_zlib import crc32

from .. import replicated_io

SUFFIX = ".removed"
REPLACING_SUFFIX = ".new"  # a log being written anew, renamed over the log when whole
_NAME = re.compile(r"^(0|[1-9][0-9]*)\.removed$")
_HEAD = struct.Struct(">Q16s")
_CRC = struct.Struct(">I")
ENTRY_BYTES = _HEAD.size + _CRC.size
_ENTRY = struct.Struct(">Q16sI")


def is_log_name(name: str) -> bool:
    return _NAME.match(name) is not None


def log_name(file: int) -> str:
    return f"{file}{SUFFIX}"


class RemovalLog:
    """The removal logs of one store directory; owned by the store's one thread."""

    def __init__(self, dir_fd: int) -> None:
        self._dir_fd = dir_fd
        self._buffers: dict[int, bytearray] = {}
        self._watched: dict[int, list[tuple[int, bytes]]] = {}  # file -> entries noted

    def note(self, file: int, offset: int, msg_id: bytes) -> None:
        head = _HEAD.pack(offset, msg_id)
        if file in self._watched:
            self._watched[file].append((offset, msg_id))
        buffer = self._buffers.get(file)
        if buffer is None:
            buffer = self._buffers[file] = bytearray()
        buffer += head
        buffer += _CRC.pack(crc32(head))

    def write(self) -> bool:
        """Append every buffered entry to its file's log; on a full disk keep them
        buffered for the next try. Whether every one was written."""
        for file in list(self._buffers):
            if self._append(file, self._buffers[file]):
                del self._buffers[file]
        return not self._buffers

    def _append(self, file: int, entries: bytearray) -> bool:
        fd = replicated_io.open(
            log_name(file), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644, dir_fd=self._dir_fd
        )
        try:
            size = os.fstat(fd).st_size
            view = memoryview(entries)
            try:
                while view:
                    view = view[replicated_io.write(fd, view) :]
            except OSError as exc:
                if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                replicated_io.ftruncate(fd, size)
                return False
            return True
        finally:
            os.close(fd)

    def replace(self, file: int, entries: Sequence[tuple[int, bytes]]) -> None:
        """Write ``file``'s log anew with ``entries`` (offset, msg_id) alone (written out,
        nothing buffered left): a compaction zeroed or cut off what the others named.
        By rename, so a crash leaves the old log or the new one, each of them right; the
        entries still buffered are dropped only once the new log is in place (an error
        leaves them for the next ``write``)."""
        if not entries:
            try:
                replicated_io.unlink(log_name(file), dir_fd=self._dir_fd)
            except FileNotFoundError:
                pass
            self._buffers.pop(file, None)
            return
        data = bytearray()
        for offset, msg_id in entries:
            head = _HEAD.pack(offset, msg_id)
            data += head + _CRC.pack(crc32(head))
        temporary = log_name(file) + REPLACING_SUFFIX
        fd = replicated_io.open(
            temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644, dir_fd=self._dir_fd
        )
        try:
            view = memoryview(data)
            while view:
                view = view[replicated_io.write(fd, view) :]
        finally:
            os.close(fd)
        replicated_io.rename(
            temporary, log_name(file), src_dir_fd=self._dir_fd, dst_dir_fd=self._dir_fd
        )
        self._buffers.pop(file, None)

    def watch(self, file: int) -> None:
        """Keep, from now on, the entries noted for ``file`` (with those still buffered),
        for ``watched``: a compaction planned from a scan's reading of the log also
        needs the entries noted after that reading."""
        buffered = self._buffers.get(file, b"")
        self._watched[file] = list(parse_entries(bytes(buffered)))

    def watched(self, file: int) -> list[tuple[int, bytes]]:
        return list(self._watched.get(file, ()))

    def unwatch(self, file: int) -> None:
        self._watched.pop(file, None)

    def forget(self, file: int) -> bool:
        """Delete ``file``'s log and drop its buffered entries (the file is going, or its
        records are moving); True if a log was deleted (the directory needs an fsync)."""
        self._buffers.pop(file, None)
        try:
            replicated_io.unlink(log_name(file), dir_fd=self._dir_fd)
        except FileNotFoundError:
            return False
        return True

    def entries(self, files: Iterable[int]) -> Iterator[tuple[int, int, bytes]]:
        """Every intact entry on disk of the logs of ``files``: (file, offset, msg_id)."""
        for file in files:
            try:
                fd = os.open(log_name(file), os.O_RDONLY, dir_fd=self._dir_fd)
            except FileNotFoundError:
                continue
            with os.fdopen(fd, "rb") as log:
                data = log.read()
            for offset, msg_id in parse_entries(data):
                yield file, offset, msg_id

    def trim_torn_tails(self, files: Iterable[int]) -> None:
        """Cut each log of ``files`` to whole entries: an append cut short by a kill
        would put every later entry off the grid, where each fails its CRC."""
        for file in files:
            try:
                fd = os.open(log_name(file), os.O_WRONLY, dir_fd=self._dir_fd)
            except FileNotFoundError:
                continue
            try:
                size = os.fstat(fd).st_size
                if size % ENTRY_BYTES:
                    replicated_io.ftruncate(fd, size - size % ENTRY_BYTES)
            finally:
                os.close(fd)

    def stray_logs(self, files: Container[int]) -> list[str]:
        """Logs whose data file is gone (a crash between the two unlinks), and logs a
        crash left half replaced."""
        return [
            name
            for name in os.listdir(self._dir_fd)
            if name.endswith(REPLACING_SUFFIX)
            or ((match := _NAME.match(name)) and int(match.group(1)) not in files)
        ]


def parse_entries(data: bytes) -> Iterator[tuple[int, bytes]]:
    """The intact entries in a removal log's bytes; a torn or damaged one is skipped."""
    for start in range(0, len(data) - ENTRY_BYTES + 1, ENTRY_BYTES):
        head = data[start : start + _HEAD.size]
        (crc,) = _CRC.unpack_from(data, start + _HEAD.size)
        if crc32(head) == crc:
            yield _HEAD.unpack(head)


def named_among(directory: str, file: int, msg_ids: Container[bytes]) -> list[tuple[int, bytes]]:
    """The intact entries (offset, msg_id) of ``file``'s log on disk whose id is among
    ``msg_ids``: what a compaction must not move a record of that id onto. Cheap per
    entry (the CRC is checked only on a match), as a log may name a file's every record."""
    try:
        with open(os.path.join(directory, log_name(file)), "rb") as log:
            data = log.read()
    except FileNotFoundError:
        return []
    named = []
    whole = len(data) - len(data) % ENTRY_BYTES
    for at, (offset, msg_id, crc) in enumerate(_ENTRY.iter_unpack(memoryview(data)[:whole])):
        if (
            msg_id in msg_ids
            and crc32(data[at * ENTRY_BYTES : at * ENTRY_BYTES + _HEAD.size]) == crc
        ):
            named.append((offset, msg_id))
    return named


def read_entries(directory: str, files: Iterable[int]) -> list[tuple[int, int, bytes]]:
    """The intact entries of the logs of ``files`` in ``directory``, read without opening
    a store (for ``warren store inspect``)."""
    entries: list[tuple[int, int, bytes]] = []
    for file in files:
        try:
            with open(os.path.join(directory, log_name(file)), "rb") as log:
                entries += [(file, offset, msg_id) for offset, msg_id in parse_entries(log.read())]
        except FileNotFoundError:
            continue
    return entries

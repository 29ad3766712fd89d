"""Opening a store directory and recovering it: clean from its snapshot, or dirty from
its data files. ``MessageStore`` takes these steps from ``Recovery``; the design (what a
clean start trusts, what a dirty one keeps) is in ``warren.store.engine.message_store``.

Opening takes an exclusive ``flock`` on ``.lock`` (the kernel drops it when the process
dies), deletes stray ``.rdt`` files of an unfinished combine and removal logs whose data
file is gone, rolls back every compaction a crash left unapplied (its journal present:
``warren.store.engine.compaction``), ignores anything named like a data file that is not
a regular file, then loads the snapshot if it is intact, names the same clients and
agrees with the files on disk, or else rebuilds: every file scanned, the last copy of
each id kept, a torn tail cut off, reference counts from the caller's source, or one per
record less the removed ones.
The snapshot files are deleted (and the directory fsynced) before anything is served, so
a crash after a clean start is a dirty start next time. The current file's space is
reserved; a full disk then only fails the writes that do not fit.

Races: a second store on the same directory, in this or another process, is refused with
StoreLocked before anything is read; a crash at any point of a recovery changes nothing
that the next recovery relies on (it only deletes files no recovery reads, and zeroes
only bytes no index points at: a rolled-back compaction's copies).
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterable

from .. import replicated_io
from ..errors import StoreDirectoryError, StoreError, StoreLocked
from ..locks import lock_exclusive
from . import compaction, snapshot
from . import index as idx
from .file_changes import DISK_FULL_ERRNOS, reserve
from .records import TEMP_SUFFIX, check_msg_id, data_file_name, data_file_number
from .removal_log import RemovalLog
from .scanner import scan_file
from .state import _StoreState
from .summary import FileSummary

log = logging.getLogger("warren.store")

LOCK_FILE = ".lock"
_key = int.from_bytes


class Recovery(_StoreState):
    """Opening and recovery steps of ``MessageStore`` (see the module docstring)."""

    def _open_directory(self) -> tuple[int, int]:
        path = self.directory
        if os.path.exists(path) and not os.path.isdir(path):
            raise StoreDirectoryError(f"store directory {path!r} is not a directory")
        try:
            os.makedirs(path, exist_ok=True)
            dir_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        except OSError as exc:
            raise StoreDirectoryError(f"cannot open store directory {path!r}: {exc}") from exc
        try:
            lock_fd = replicated_io.open(LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644, dir_fd=dir_fd)
        except OSError as exc:
            os.close(dir_fd)
            raise StoreDirectoryError(f"store directory {path!r} is not writable: {exc}") from exc
        if not lock_exclusive(lock_fd):
            os.close(lock_fd)
            os.close(dir_fd)
            raise StoreLocked(f"store directory {path!r} is open in another MessageStore") from None
        return dir_fd, lock_fd

    def _recover(
        self,
        ref_counts: Iterable[tuple[bytes, int]] | None,
        clean_clients: Iterable[bytes] | None,
    ) -> bool:
        """Load the clean-shutdown files or rebuild from the data files; True if clean."""
        names = os.listdir(self._dir_fd)
        for name in names:
            if name.endswith(TEMP_SUFFIX):
                log.info("%s: deleting %s left by an unfinished combine", self.directory, name)
                replicated_io.unlink(name, dir_fd=self._dir_fd)
        files: list[int] = []
        for name in names:
            number = data_file_number(name)
            if number is None:
                continue
            if stat.S_ISREG(os.stat(name, dir_fd=self._dir_fd).st_mode):
                files.append(number)
            else:
                log.warning("%s: %s is not a regular file; ignored", self.directory, name)
        files.sort()
        self._removals = RemovalLog(self._dir_fd)
        for stray in self._removals.stray_logs(set(files)):
            replicated_io.unlink(stray, dir_fd=self._dir_fd)
        self._removals.trim_torn_tails(files)
        self._roll_back_compactions(names, set(files))
        clean = self._load_snapshot(files, clean_clients)
        if snapshot.delete(self._dir_fd):
            replicated_io.fsync(self._dir_fd)
        if not clean:
            self._rebuild(files, ref_counts)
        if not self._summary:
            self._summary[0] = FileSummary()
        self._current_file = max(self._summary)
        self._current_fd = replicated_io.open(
            data_file_name(self._current_file), os.O_RDWR | os.O_CREAT, 0o644, dir_fd=self._dir_fd
        )
        self._write_offset = self._summary[self._current_file].file_size
        replicated_io.ftruncate(self._current_fd, self._write_offset)
        try:
            reserve(self._current_fd, self.file_size_limit)
        except OSError as exc:
            if exc.errno not in DISK_FULL_ERRNOS:
                raise
            log.warning("%s: no space to reserve the current file; writes may fail", self.directory)
        os.lseek(self._current_fd, self._write_offset, os.SEEK_SET)
        replicated_io.fsync(self._dir_fd)
        return clean

    def _roll_back_compactions(self, names: list[str], files: set[int]) -> None:
        """Undo every compaction a crash left unapplied (its journal present), before
        anything reads the files; drop journals and markers whose data file is gone."""
        for name in names:
            number = compaction.file_of(name)
            if number is None:
                continue
            if number not in files:
                replicated_io.unlink(name, dir_fd=self._dir_fd)
                continue
            if not name.endswith(compaction.JOURNAL_SUFFIX):
                continue
            undone = compaction.roll_back(self._dir_fd, number)
            if undone.journal_invalid:
                log.warning(
                    "%s: deleted the torn compaction journal of %s (no record had moved)",
                    self.directory,
                    data_file_name(number),
                )
            else:
                log.warning(
                    "%s: rolled back the unfinished compaction of %s: %d copies complete, "
                    "%d torn (found by their CRC against the source), all zeroed; "
                    "every record is at its old place",
                    self.directory,
                    data_file_name(number),
                    undone.complete,
                    undone.torn,
                )

    def _load_snapshot(self, files: list[int], clean_clients: Iterable[bytes] | None) -> bool:
        try:
            saved = snapshot.read(self._dir_fd)
        except snapshot.SnapshotInvalid as exc:
            if snapshot.present(self._dir_fd):
                log.warning(
                    "%s: clean-shutdown files unusable (%s); recovering dirty", self.directory, exc
                )
            return False
        if clean_clients is not None and frozenset(clean_clients) != saved.clients:
            log.info("%s: clients differ from the clean shutdown; recovering dirty", self.directory)
            return False
        problem = snapshot.mismatch(saved, self._dir_fd, files)
        if problem is not None:
            log.warning("%s: %s; recovering dirty", self.directory, problem)
            return False
        self._index = saved.index
        self._clients = set(saved.clients)
        self._link_summary((file, valid, size) for file, valid, size in saved.summary)
        return True

    def _rebuild(self, files: list[int], ref_counts: Iterable[tuple[bytes, int]] | None) -> None:
        """Dirty recovery: scan every file; keep the last copy of each id."""
        index: dict[int, int] = {}
        sizes: dict[int, int] = {}
        found_bytes = dict.fromkeys(files, 0)  # valid bytes, if every id is found once
        records = 0
        for file in files:
            path = os.path.join(self.directory, data_file_name(file))
            found = scan_file(path)
            sizes[file] = found.size
            for offset, length in found.damaged:
                self._damaged.append({"file": file, "offset": offset, "length": length})
                log.warning("%s: %d damaged bytes at offset %d skipped", path, length, offset)
            if file == files[-1] and found.end_of_records < found.size:
                log.warning(
                    "%s: truncating a torn tail of %d bytes",
                    path,
                    found.size - found.end_of_records,
                )
                sizes[file] = found.end_of_records
            # Without a source of counts each record counts once, and is adoptable: see
            # "Recovery" in warren.store.engine.message_store.
            base = 1 | (file << idx.FILE_SHIFT) | (idx.ADOPTABLE if ref_counts is None else 0)
            index.update(
                zip(
                    map(_key, found.msg_ids),
                    [
                        base | (offset << idx.OFFSET_SHIFT) | (size << idx.SIZE_SHIFT)
                        for offset, size in zip(found.offsets, found.total_sizes, strict=True)
                    ],
                    strict=True,
                )
            )
            found_bytes[file] = sum(found.total_sizes)
            records += len(found.msg_ids)
        if ref_counts is not None:
            index = self._apply_ref_counts(index, ref_counts)
        else:
            removed = self._drop_removed(index, found_bytes)
            if removed:
                records -= removed
        if ref_counts is None and len(index) == records:
            valid = found_bytes  # no id twice: every record found is live
        else:
            valid = dict.fromkeys(files, 0)
            for value in index.values():
                valid[value >> idx.FILE_SHIFT] += (value >> idx.SIZE_SHIFT) & idx.SIZE_MASK
        self._index = index
        self._link_summary((file, valid[file], sizes[file]) for file in files)
        for file in files[:-1]:
            if valid[file] == 0:
                self._unlink_file(file)
        log.info(
            "%s: dirty recovery found %d messages in %d files",
            self.directory,
            len(index),
            len(files),
        )

    def _drop_removed(self, index: dict[int, int], found_bytes: dict[int, int]) -> int:
        """Drop from a dirty recovery's ``index`` the records the removal log names (their
        bytes off ``found_bytes``); how many were dropped."""
        dropped = 0
        for file, offset, msg_id in self._removals.entries(list(found_bytes)):
            key = _key(msg_id)
            value = index.get(key)
            if idx.is_at(value, file, offset):
                del index[key]
                found_bytes[file] -= (value >> idx.SIZE_SHIFT) & idx.SIZE_MASK
                dropped += 1
        self.counters["recovery_removed"] = dropped
        return dropped

    def _apply_ref_counts(
        self, found: dict[int, int], ref_counts: Iterable[tuple[bytes, int]]
    ) -> dict[int, int]:
        counts: dict[int, int] = {}
        for msg_id, count in ref_counts:
            key = _key(check_msg_id(msg_id))
            if count > 0:
                counts[key] = counts.get(key, 0) + count
        index: dict[int, int] = {}
        missing = 0
        for key, count in counts.items():
            value = found.get(key)
            if value is None:
                missing += 1
                continue
            if count > idx.MAX_REF_COUNT:
                raise StoreError(
                    f"reference count {count} of {key:032x} exceeds {idx.MAX_REF_COUNT}"
                )
            index[key] = value - 1 + count
        if missing and self._damaged:
            log.warning(
                "%s: %d referenced messages have no data on disk (the damaged bytes above "
                "held some of them); dropped",
                self.directory,
                missing,
            )
        elif missing:
            # The expected cost of a crash: a queue indexed a message whose write the
            # store had not made yet. A confirm waits for the store's fdatasync, so none
            # of these was confirmed, and their publishers send them again.
            log.info(
                "%s: %d referenced messages were not yet written when the store stopped "
                "(never confirmed); dropped",
                self.directory,
                missing,
            )
        self.counters["recovery_missing"] = missing
        return index

    def _link_summary(self, entries: Iterable[tuple[int, int, int]]) -> None:
        self._summary = {}
        previous: int | None = None
        for file, valid, size in entries:
            self._summary[file] = FileSummary(valid, size, left=previous)
            if previous is not None:
                self._summary[previous].right = file
            previous = file

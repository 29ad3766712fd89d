"""The store's side of compaction: choosing a file, staging its live records, writing the
journal, pointing the index at the moved records, cutting the file.

``MessageStore`` takes these steps from ``Compacting`` when its ``gc`` is ``"compact"``;
``warren.store.engine.compaction`` holds the plan, the journal and the moves
(``compact_in_place``, run wherever the caller likes: the GC process in a node). For one
file N:

1. ``choose_compaction``: the oldest non-current file whose garbage is over
   ``garbage_fraction`` of its size (RabbitMQ: valid × 2 < size), with live data, not
   locked, not known damaged, not held by a reader right now, and that saw no remove for
   ``quiet_s`` (a file being drained is left to empty, and is then deleted without a
   copy: RabbitMQ waits 15 s); it is locked.
2. ``stage_compaction``, once per slice of the file's records as a scan found them, in
   offset order: keep those the index points at. Cheap, and bounded per call.
3. ``finish_compaction_staging``: the records still live now (one removed meanwhile is
   dropped) must add up to the file's valid bytes (else the file is damaged: never
   compacted); the plan (``plan_compaction``) is written as the journal, durable, and
   returned. It never moves a record onto a place the removal log names for the same id
   (an id written twice into one file): the entries a scan read from the log
   (``removal_log.named_among``, in the GC process for a node), with those noted since
   the file was chosen (``RemovalLog.watch``). A file whose plan would reclaim nothing is
   not chosen again until its valid bytes change.
4. ``compact_in_place`` (elsewhere): zero the holes, copy the moves, fdatasync.
5. ``apply_compaction``, in one step once no reader in another process is inside the
   file (its lock-table slot, as a combine's switch): write the removal log's entries
   for the copies of records removed meanwhile (their new places hold a dead copy),
   delete the journal, point every index entry still at a copied place at its new one,
   cut the file (neither synced: see ``compaction``'s crash safety). Readers holding the
   slot past the deadline make
   it return False with nothing changed: the caller gives the job up
   (``abandon_compaction``) and the file is chosen again once they are gone.

Abandoning a job whose journal was written rolls it back at once (every copy zeroed, the
journal deleted): no copy ever outlives the journal that describes it, so a later job's
holes, or a later crash's scan, never meet one. A store that stops while its GC may still
move leaves the journal to the next start instead, which waits for the GC's lock on it.

Races and their answers (the store is single-threaded; "meanwhile" is between slices, or
while the GC moves):

- a remove of a staged record meanwhile: at 3 it is not live and is not planned; after 3
  it is moved as planned (a dead copy), and 5 leaves its entry alone and logs the copy;
- a new reference to a staged record: the index entry keeps its place, so 5 relocates it
  with its count (``index.relocate`` keeps the count and the adoptable flag);
- a record removed and written again: the new one is pending or in the current file,
  never in N, so 5 leaves it alone;
- a reader in another process with a cached place: the old places stay intact until 5,
  which waits for readers to leave N's slot and bumps its generation; a read of a place
  that no longer holds the record fails its check and falls back to the store. No index
  entry ever points at a new place while the old one is still in the file, so a remove
  always logs the copy a dirty start would keep;
- the file empties meanwhile: 5 (or the abandon) deletes it instead;
- an exception in 5 breaks the store (``_guarded``): no clean snapshot describes a half
  applied compaction.
"""

from __future__ import annotations

import bisect
import logging
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from .. import replicated_io
from ..errors import CorruptRecord, StoreError
from . import compaction, removal_log
from . import index as idx
from .compaction import CompactionPlan, compact_in_place, plan_compaction
from .lock_table import SWITCH_DEADLINE_SECONDS
from .records import data_file_name
from .rewrite import Record
from .scanner import scan_file
from .state import _StoreState

log = logging.getLogger("warren.store")

_key = int.from_bytes


@dataclass
class CompactionStaging:
    """A compaction being staged or carried out: its file, its live records, its plan."""

    file: int
    live: list[Record] = field(default_factory=list)
    plan: CompactionPlan | None = None


class Compacting(_StoreState):
    """Compaction steps of ``MessageStore`` (see the module docstring); uses its state."""

    def choose_compaction(self, quiet_s: float = 0.0) -> int | None:
        """Step 1: pick and lock a file; None when none is due (or a job runs)."""
        self._check_usable()
        if self._compaction is not None:
            return None
        fraction = self.garbage_fraction
        now = time.monotonic()
        for file, summary in sorted(self._summary.items()):
            valid = summary.valid_total_size
            if (
                summary.right is None
                or summary.locked
                or valid == 0
                or summary.file_size - valid <= fraction * summary.file_size
                or file in self._uncombinable
                or not self._quiet(file, summary.removes, now, quiet_s)
                or self._not_worth_compacting.get(file) == valid
                or self._held_by_readers(file)
            ):
                continue
            summary.locked = True
            self._compaction = CompactionStaging(file)
            self._removals.watch(file)
            return file
        return None

    def _quiet(self, file: int, removes: int, now: float, quiet_s: float) -> bool:
        """Whether ``file`` saw no remove for ``quiet_s``, by its count of removes as
        this method saw it before."""
        seen = self._removes_seen.get(file)
        if seen is None or seen[0] != removes:
            self._removes_seen[file] = (removes, now)
            return quiet_s <= 0
        return now - seen[1] >= quiet_s

    def stage_compaction(
        self, file: int, msg_ids: Sequence[bytes], offsets: Sequence[int], sizes: Sequence[int]
    ) -> None:
        """Step 2, one slice of ``file``'s records in offset order: keep those the index
        points at."""
        staging = self._compaction
        if staging is None or staging.file != file or staging.plan is not None:
            raise StoreError(f"stage_compaction of file {file}: not the file being staged")
        index, live = self._index, staging.live
        is_at = idx.is_at
        for msg_id, offset, size in zip(msg_ids, offsets, sizes, strict=True):
            if is_at(index.get(_key(msg_id)), file, offset):
                live.append((bytes(msg_id), offset, size))

    def finish_compaction_staging(
        self, named: Iterable[tuple[int, bytes]] = ()
    ) -> CompactionPlan | None:
        """Step 3: the plan, its journal durable; None (the file unlocked) when the file
        is damaged or a compaction would reclaim nothing. ``named`` are the removal
        log's entries (offset, msg_id) for the file's ids as the scan read them
        (``removal_log.named_among``); the store adds those noted since it chose the
        file."""
        staging = self._compaction
        assert staging is not None, "finish_compaction_staging without a compaction staged"
        file = staging.file
        summary = self._summary[file]
        # A staged record leaves its place only by a remove to no reference, which the
        # removal log noted (watched since the file was chosen): no index lookups here.
        removed = {offset for offset, _ in self._removals.watched(file)}
        live = [record for record in staging.live if record[1] not in removed]
        if sum(size for _, _, size in live) != summary.valid_total_size:
            log.error(
                "%s: %s holds %d valid bytes by the index but the scan finds %d; "
                "the file is damaged and will not be compacted",
                self.directory,
                data_file_name(file),
                summary.valid_total_size,
                sum(size for _, _, size in live),
            )
            self._uncombinable.add(file)
            self._guarded(self._abandon_compaction)
            return None
        avoid = {*named, *self._removals.watched(file)}
        plan = plan_compaction(file, summary.file_size, live, avoid)
        if plan is None:
            self._not_worth_compacting[file] = summary.valid_total_size
            self._guarded(self._abandon_compaction)
            return None
        try:
            compaction.write_journal(self._dir_fd, plan)
        except OSError:
            self._guarded(self._abandon_compaction)
            raise
        staging.plan = plan
        staging.live = []
        return plan

    def apply_compaction(
        self, plan: CompactionPlan, *, wait_s: float = SWITCH_DEADLINE_SECONDS
    ) -> bool:
        """Step 5, in one step once no reader is inside the file: the journal deleted,
        the index pointed at the moves, the file cut. False (nothing changed) when
        readers held the file for ``wait_s``: give the job up (``abandon_compaction``)
        and compact the file again once they are gone."""
        staging = self._compaction
        if staging is None or staging.plan is not plan:
            raise StoreError("apply_compaction of a plan this store is not running")
        self._check_usable()
        if self._lock_table is None:
            applied, still_named = self._guarded(self._apply_compaction_now, plan)
        else:
            applied, still_named = False, None
            with self._lock_table.exclusive([plan.file], wait_s) as acquired:
                if acquired:
                    applied, still_named = self._guarded(self._apply_compaction_now, plan)
        if not applied or still_named is None:  # not done, or the file emptied and went
            return applied
        # Best effort, after the switch: the log as it was, with the dead copies' entries
        # appended, is right too, only longer; a full disk keeps it.
        try:
            self._removals.replace(plan.file, still_named)
            compaction.note_compacted(self._dir_fd, plan.file, plan.reclaimed)
        except OSError as exc:
            log.warning(
                "%s: after compacting %s: %s", self.directory, data_file_name(plan.file), exc
            )
        return True

    def _apply_compaction_now(
        self, plan: CompactionPlan
    ) -> tuple[bool, list[tuple[int, bytes]] | None]:
        """The switch (the caller holds the file's slot): from the journal's deletion on,
        the compaction is never rolled back, and the old places are gone with the cut
        before anything else can look up an index entry. Whether it was done (not when
        the log entries of its dead copies find no room: they must be written before
        the cut takes their old places), and the removal log's entries that still name
        a removed record in the file (a dead copy, or a staying record removed since the
        file was chosen); None when the file emptied and is gone."""
        file = plan.file
        summary = self._summary[file]
        index, relocate = self._index, idx.relocate
        is_at = idx.is_at
        staying_moves, dead_copies = [], []
        for msg_id, source, to, _size in plan.moves:
            key = _key(msg_id)
            if is_at(index.get(key), file, source):
                staying_moves.append((key, to))
            else:  # removed meanwhile: its new place holds a dead copy
                dead_copies.append((to, msg_id))
        if summary.valid_total_size and dead_copies:
            for to, msg_id in dead_copies:
                self._removals.note(file, to, msg_id)
            if not self._removals.write():
                return False, None  # given up and rolled back: the copies zeroed
        compaction.forget_journal(self._dir_fd, file, sync=False)
        self._directory_unsynced = True
        self._compaction = None
        watched = self._removals.watched(file)
        self._removals.unwatch(file)
        summary.locked = False
        if summary.valid_total_size == 0:  # emptied meanwhile
            self._unlink_file(file)
            return True, None
        for key, to in staying_moves:
            index[key] = relocate(index[key], file, to)
        # Those noted since the file was chosen (the dead copies' among them) that name
        # neither a zeroed hole nor a place past the cut.
        hole_starts = [start for start, _ in plan.holes]
        still_named = [
            (offset, msg_id)
            for offset, msg_id in watched
            if offset < plan.truncate_at and not _in_holes(plan.holes, hole_starts, offset)
        ]
        self._unmap(file)
        # Not fdatasync'd: until the new size is on disk, an OS crash finds the old
        # copies past the cut, intact, as the last copy of each id; a process crash
        # finds the file cut (the page cache).
        fd = os.open(data_file_name(file), os.O_WRONLY, dir_fd=self._dir_fd)
        try:
            replicated_io.ftruncate(fd, plan.truncate_at)
        finally:
            os.close(fd)
        summary.file_size = plan.truncate_at
        self.counters["gc_compactions"] += 1
        self.counters["gc_bytes_moved"] += plan.moved_bytes
        self.counters["gc_bytes_reclaimed"] += plan.reclaimed
        return True, still_named

    def abandon_compaction(
        self, plan: CompactionPlan | None = None, *, roll_back: bool = True
    ) -> None:
        """Give the compaction in progress up (``plan``: only if it is that one). A
        journal already written is rolled back now (every copy zeroed, the journal
        deleted), so that no copy outlives the plan that describes it, unless
        ``roll_back`` is False (the store is stopping while a GC may still move: the
        next start rolls it back once that GC lets go of it)."""
        staging = self._compaction
        if staging is None or (plan is not None and staging.plan is not plan):
            return
        self._guarded(self._abandon_compaction, roll_back)

    def _abandon_compaction(self, roll_back: bool = True) -> None:
        staging = self._compaction
        assert staging is not None  # its callers run it only while one is staged
        self._compaction = None
        self._removals.unwatch(staging.file)
        if staging.plan is not None and roll_back:
            compaction.roll_back(self._dir_fd, staging.file, compare=False)
        summary = self._summary[staging.file]
        summary.locked = False
        if summary.valid_total_size == 0:
            self._delete_empty_file(staging.file)

    def compact_garbage(self) -> int:
        """Compact files in-process until none qualifies, or until readers hold a file
        being applied (tried again at the next call); the number compacted."""
        done = 0
        while (file := self.choose_compaction()) is not None:
            try:
                found = scan_file(os.path.join(self.directory, data_file_name(file)))
                self.stage_compaction(file, found.msg_ids, found.offsets, found.total_sizes)
                plan = self.finish_compaction_staging(
                    removal_log.named_among(self.directory, file, set(found.msg_ids))
                )
                if plan is None:
                    continue
                compact_in_place(self.directory, file, plan.token)
            except CorruptRecord:
                self._uncombinable.add(file)
                self.abandon_compaction()
                raise
            except BaseException:
                self.abandon_compaction()
                raise
            if not self.apply_compaction(plan):
                self.abandon_compaction(plan)
                break
            done += 1
        return done


def _in_holes(holes: Sequence[tuple[int, int]], starts: list[int], offset: int) -> bool:
    """Whether ``offset`` lies in one of ``holes`` (sorted, apart; ``starts`` theirs)."""
    at = bisect.bisect_right(starts, offset) - 1
    return at >= 0 and offset < holes[at][1]

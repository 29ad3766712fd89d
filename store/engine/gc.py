"""The store's side of GC: choosing a pair, staging its moves in slices, switching files.

``MessageStore`` takes these steps from ``Combining``; ``warren.store.engine.rewrite`` holds the
copy step (``rewrite_combine``), which runs wherever the caller likes (the GC process in
a node). The steps, for a pair Dst (older) and Src (its right neighbour):

1. ``choose_combine``: the trigger (garbage over ``garbage_fraction`` of the bytes on
   disk, at least 3 files) and a pair whose valid data fits one file, both non-current,
   unlocked, not known damaged and not held by a reader right now (a reader stopped while
   holding a file delays that file's combines, not every other); both are locked. Cheap:
   the file summary, and the lock table's word on each candidate.
2. ``stage_combine``, once per slice of each file's records as a scan found them (Dst's
   first, then Src's), in offset order: keep those the index points at, and stage the
   index value each will have in the new Dst, whose layout is fixed already (Dst's kept
   records, then Src's, back to back). A slice is bounded, so a caller serving other
   requests between slices (the store actor) never holds its loop for long. The caller's
   scan may run in another process: staging checks every record against the index.
3. ``finish_staging``: the staged bytes of each file must add up to its valid bytes (a
   record the scan could not find would otherwise be left pointing into a file about to
   go: the pair is then never combined); the plan names the records to copy.
4. ``rewrite_combine`` (elsewhere) writes and fdatasyncs ``Dst.rdt``.
5. ``apply_combine``: holding both files' lock-table slots, one step switches everything:
   the pair's removal logs are deleted (and the directory fsynced), the staged values go
   into the index at once (a C-level dict update), ``Dst.rdt`` is renamed over
   ``Dst.rdq``, the directory fsynced, Src deleted. Nothing is moved record by record on the store's
   thread.

``plan_combine`` runs 1–3 at once (with its own scan), for in-process use and tests.

Races and their answers (the store is single-threaded; "meanwhile" is between slices, or
while the GC copies):

- a remove or a second reference of a staged record meanwhile: the write and remove paths
  adjust the staged value too (``_moves``), or unstage it when its count reaches 0, and
  the staged bytes of its file; a removed record is still copied, as garbage;
- a record removed before its slice is staged is simply not found in the index;
- a record removed and written again meanwhile: the new record is pending or in the
  current file, never in Dst or Src, and was unstaged by the remove;
- the staged values are applied only together with the rename, so a reader or a crash
  before it sees the old, intact files and the old index;
- an exception anywhere in the switch breaks the store (``_guarded``), so no clean
  snapshot can describe a half-switched pair;
- readers holding either slot past the deadline: ``apply_combine`` returns False and
  changes nothing; the caller retries later.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .. import replicated_io
from ..errors import CorruptRecord, StoreError
from . import index as idx
from .lock_table import SWITCH_DEADLINE_SECONDS
from .records import data_file_name, temp_file_name
from .rewrite import CombinePlan, Record, RewriteResult, rewrite_combine
from .scanner import scan_file
from .state import _StoreState

if TYPE_CHECKING:
    from collections.abc import Sequence

log = logging.getLogger("warren.store")

MIN_FILES_FOR_GC = 3
_key = int.from_bytes


@dataclass
class Staging:
    """A combine being staged or copied: its pair, and what the switch will do."""

    dst: int
    src: int
    moves: dict[int, int] = field(default_factory=dict)  # key -> value after the switch
    records: dict[int, list[Record]] = field(default_factory=dict)  # file -> to copy
    valid_bytes: dict[int, int] = field(default_factory=dict)  # file -> staged, still live
    next_offset: int = 0  # where the next one lands
    src_started: bool = False


class Combining(_StoreState):
    """GC steps of ``MessageStore`` (see the module docstring); uses its state."""

    def choose_combine(self) -> tuple[int, int] | None:
        """Step 1: pick and lock a pair; None when no combine is due (or one runs)."""
        self._check_usable()
        if self._staging is not None or len(self._summary) < MIN_FILES_FOR_GC:
            return None
        bytes_on_disk = sum(s.file_size for s in self._summary.values())
        valid_bytes = sum(s.valid_total_size for s in self._summary.values())
        if self._garbage_fraction(bytes_on_disk, valid_bytes) <= self.garbage_fraction:
            return None
        pair = self._choose_pair()
        if pair is None:
            return None
        dst, src = pair
        self._staging = Staging(dst, src, records={dst: [], src: []}, valid_bytes={dst: 0, src: 0})
        self._moves = self._staging.moves
        self._summary[dst].locked = self._summary[src].locked = True
        return pair

    def stage_combine(
        self, file: int, msg_ids: Sequence[bytes], offsets: Sequence[int], sizes: Sequence[int]
    ) -> bytearray:
        """Step 2, one slice: stage the records of ``file`` (Dst's slices before Src's,
        each in offset order) that the index points at; one flag per record, 1 = copy."""
        staging = self._staging
        if (
            staging is None
            or file not in (staging.dst, staging.src)
            or (file == staging.dst and staging.src_started)
        ):
            raise StoreError(
                f"stage_combine of file {file}: not the next file of the combine in progress"
            )
        staging.src_started = file == staging.src
        index, moves, records = self._index, staging.moves, staging.records[file]
        is_at, relocate, dst = idx.is_at, idx.relocate, staging.dst
        keep = bytearray(len(msg_ids))
        new_offset = staging.next_offset
        staged_bytes = 0
        for i, (msg_id, offset, size) in enumerate(zip(msg_ids, offsets, sizes, strict=True)):
            key = _key(msg_id)
            value = index.get(key)
            if is_at(value, file, offset):
                moves[key] = relocate(value, dst, new_offset)
                records.append((msg_id, offset, size))
                new_offset += size
                staged_bytes += size
                keep[i] = 1
        staging.next_offset = new_offset
        staging.valid_bytes[file] += staged_bytes
        return keep

    def finish_staging(self) -> CombinePlan | None:
        """Step 3: the plan to copy, or None (the combine abandoned, the pair never tried
        again) when a file's staged bytes do not add up to its valid bytes."""
        staging = self._staging
        assert staging is not None, "finish_staging without a combine in progress"
        for file in (staging.dst, staging.src):
            expected = self._summary[file].valid_total_size
            if staging.valid_bytes[file] != expected:
                log.error(
                    "%s: %s holds %d valid bytes by the index but the scan finds %d; "
                    "the file is damaged and will not be combined",
                    self.directory,
                    data_file_name(file),
                    expected,
                    staging.valid_bytes[file],
                )
                self._uncombinable.add(file)
                self._guarded(self._abandon_combine)
                return None
        self._combine = CombinePlan(
            staging.dst,
            staging.src,
            tuple(staging.records[staging.dst]),
            tuple(staging.records[staging.src]),
        )
        return self._combine

    def plan_combine(self) -> CombinePlan | None:
        """Steps 1–3 at once, scanning both files here; None if no combine is due."""
        while (pair := self.choose_combine()) is not None:
            for file in pair:
                found = scan_file(os.path.join(self.directory, data_file_name(file)))
                self.stage_combine(file, found.msg_ids, found.offsets, found.total_sizes)
            plan = self.finish_staging()
            if plan is not None:
                return plan
        return None

    def apply_combine(
        self, plan: CombinePlan, result: RewriteResult, *, wait_s: float = SWITCH_DEADLINE_SECONDS
    ) -> bool:
        """Step 5: switch the index, the files and the summary in one step.

        False when readers in other processes held the files for ``wait_s`` (with
        ``shared_readers``): nothing changed, call again later.
        """
        if plan is not self._combine:
            raise StoreError("apply_combine of a plan this store is not running")
        staging = self._staging
        assert staging is not None  # set together with the plan
        if result.file_size != staging.next_offset:
            raise StoreError(
                f"apply_combine of a rewrite of {result.file_size} bytes; the "
                f"plan's records hold {staging.next_offset}"
            )
        self._check_usable()
        if self._lock_table is None:
            self._guarded(self._switch_files, plan, result.file_size)
            return True
        with self._lock_table.exclusive([plan.dst, plan.src], wait_s) as acquired:
            if acquired:
                self._guarded(self._switch_files, plan, result.file_size)
        return acquired

    def _switch_files(self, plan: CombinePlan, file_size: int) -> None:
        staging = self._staging
        assert staging is not None  # apply_combine runs this only for the staged plan
        dst, src = self._summary[plan.dst], self._summary[plan.src]
        # Before the rename: a live record moved into Dst could land where an entry of
        # the old Dst's removal log names a removed record of the same id.
        forgotten = [self._removals.forget(file) for file in (plan.dst, plan.src)]
        if any(forgotten):
            replicated_io.fsync(self._dir_fd)
        self._index.update(staging.moves)
        self._unmap(plan.dst)
        replicated_io.rename(
            temp_file_name(plan.dst),
            data_file_name(plan.dst),
            src_dir_fd=self._dir_fd,
            dst_dir_fd=self._dir_fd,
        )
        replicated_io.fsync(self._dir_fd)
        dst.valid_total_size = sum(staging.valid_bytes.values())
        dst.file_size = file_size
        src.valid_total_size = 0
        self._combine = self._staging = self._moves = None
        dst.locked = src.locked = False
        self._unlink_file(plan.src)  # the caller holds both files' slots
        if dst.valid_total_size == 0:
            self._unlink_file(plan.dst)
        replicated_io.fsync(self._dir_fd)
        self._directory_unsynced = False
        self.counters["gc_runs"] += 1
        self.counters["gc_bytes_moved"] += file_size

    def abandon_combine(self, plan: CombinePlan | None = None) -> None:
        """Give the combine in progress up (``plan``: only if it is that one): unlock both
        files, delete the ``.rdt``, forget the staging; planned again later."""
        if self._staging is None or (plan is not None and plan is not self._combine):
            return
        self._guarded(self._abandon_combine)

    def _abandon_combine(self) -> None:
        staging = self._staging
        assert staging is not None  # its callers run it only while a combine is staged
        self._combine = self._staging = self._moves = None
        try:
            replicated_io.unlink(temp_file_name(staging.dst), dir_fd=self._dir_fd)
            self._directory_unsynced = True
        except FileNotFoundError:
            pass
        for file in (staging.dst, staging.src):
            summary = self._summary[file]
            summary.locked = False
            if summary.valid_total_size == 0:
                self._delete_empty_file(file)

    def combine_garbage(self) -> int:
        """Combine pairs in-process until the trigger no longer holds, or until readers
        hold a switch past its deadline (retried at the next call); the number done."""
        done = 0
        if self._deferred_apply is not None:
            held_plan, held_result = self._deferred_apply
            if held_plan is self._combine:
                # A retry takes the locks only if they are free now: a reader stopped
                # while holding one must not cost every sync a full deadline.
                if not self.apply_combine(held_plan, held_result, wait_s=0.0):
                    return done
                done += 1
            self._deferred_apply = None
        while (plan := self.plan_combine()) is not None:
            try:
                result = rewrite_combine(self.directory, plan)
            except CorruptRecord:
                self._uncombinable.update((plan.dst, plan.src))
                self.abandon_combine(plan)
                raise
            except BaseException:
                self.abandon_combine(plan)
                raise
            if not self.apply_combine(plan, result):
                self._deferred_apply = (plan, result)
                break
            done += 1
        return done

    def _choose_pair(self) -> tuple[int, int] | None:
        limit = self.file_size_limit
        for dst, summary in sorted(self._summary.items()):
            src = summary.right
            if src is None or self._summary[src].right is None:
                return None
            neighbour = self._summary[src]
            if (
                not summary.locked
                and not neighbour.locked
                and not {dst, src} & self._uncombinable
                and summary.valid_total_size + neighbour.valid_total_size <= limit
                and not self._held_by_readers(dst)
                and not self._held_by_readers(src)
            ):
                return dst, src
        return None

    def _held_by_readers(self, file: int) -> bool:
        return self._lock_table is not None and self._lock_table.held_by_readers(file)

    @staticmethod
    def _garbage_fraction(bytes_on_disk: int, valid_bytes: int) -> float:
        return (bytes_on_disk - valid_bytes) / bytes_on_disk if bytes_on_disk else 0.0

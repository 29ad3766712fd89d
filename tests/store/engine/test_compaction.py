"""Compaction of one file in place (``gc="compact"``): what it moves, what it cuts, and
what a remove, a new reference, a reader or a crash meanwhile leaves behind."""

import contextlib
import errno
import fcntl
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from warren.store import MessageStore
from warren.store.engine import compacting, compaction
from warren.store.engine.compaction import (
    JournalInvalid,
    compact_in_place,
    journal_name,
    read_marker,
)
from warren.store.engine.removal_log import RemovalLog
from warren.store.engine.scanner import scan_file

from ...waiting import wait_for
from ..helpers import body, fill, msg_id

ROOT = Path(__file__).resolve().parents[3]
RECORD = 125  # a 100-byte body on disk: 8 to a file of 1,000 bytes


def compacting_store(open_store, **options):
    return open_store(file_size_limit=1000, auto_gc=False, gc="compact", **options)


def remove_all_but(store, numbers, keep):
    for n in numbers:
        if n not in keep:
            store.remove(msg_id(n))
    store.sync()


def crash_copy(store_dir, tmp_path) -> Path:
    """The directory as a crash would leave it (no clean-shutdown files, no lock held)."""
    copy = tmp_path / "after-crash"
    shutil.copytree(store_dir, copy, ignore=shutil.ignore_patterns(".lock"))
    return copy


@contextlib.contextmanager
def a_reader_inside(store_dir, file: int):
    """A reader process holding ``file``'s lock-table slot, killed at the end."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.store.reader_child",
            "hold",
            str(store_dir),
            str(file),
            "wait",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        yield
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        holder.stdout.close()


def test_rabbitmqs_worked_example_moves_the_last_records_into_the_first_hole_and_cuts(
    open_store, store_dir
):
    store = compacting_store(open_store)
    fill(store, range(16))  # files 0 and 1 full, 2 current
    # File 0: A@0 kept, a hole of two records, B@375 and C@500 kept, the rest removed.
    remove_all_but(store, range(8), keep={0, 3, 4})
    assert (store_dir / "0.removed").exists()
    assert store.collect_garbage() == 1
    assert store.location(msg_id(0)).offset == 0
    assert store.location(msg_id(4)).offset == RECORD  # the last one went first
    assert store.location(msg_id(3)).offset == 2 * RECORD
    assert os.path.getsize(store_dir / "0.rdq") == 3 * RECORD
    stats = store.stats()
    assert stats["files"][0]["file_size"] == stats["files"][0]["valid_total_size"] == 375
    assert stats["gc_compactions"] == 1 and stats["gc_bytes_reclaimed"] == 1000 - 375
    assert all(store.read(msg_id(n)) == body(n) for n in (0, 3, 4, *range(8, 16)))
    assert read_marker(os.open(store_dir, os.O_RDONLY), 0) == (1, 625)
    # The removed records it named are zeroed or cut off: the log goes with them.
    assert not (store_dir / "0.removed").exists()


def test_a_compacted_store_recovers_clean_and_dirty_with_every_body(
    open_store, store_dir, tmp_path
):
    store = compacting_store(open_store)
    fill(store, range(64))
    live = {n for n in range(56) if n % 3 == 0} | set(range(56, 64))
    remove_all_but(store, range(56), keep=live)
    assert store.collect_garbage() > 0
    crashed = crash_copy(store_dir, tmp_path)
    store.close()
    with MessageStore(store_dir, file_size_limit=1000, gc="compact") as clean:
        assert clean.recovered_clean
        assert all(clean.read(msg_id(n)) == body(n) for n in live)
    with MessageStore(crashed, file_size_limit=1000, gc="compact") as dirty:
        assert not dirty.recovered_clean
        assert {n for n in range(64) if dirty.contains(msg_id(n))} == live
        assert all(dirty.read(msg_id(n)) == body(n) for n in live)


def test_the_current_file_and_a_file_still_being_drained_are_not_compacted(open_store):
    store = compacting_store(open_store)
    fill(store, range(12))  # file 0 full, file 1 current with 4 records
    remove_all_but(store, range(12), keep={0, 8})
    assert store.choose_compaction(quiet_s=60) is None  # file 0 just saw removes
    assert store.choose_compaction(quiet_s=60) is None  # and none since, but not for 60 s
    assert store.choose_compaction() == 0  # never the current file 1
    store.abandon_compaction()
    assert store.stats()["locked_files"] == 0


def test_a_record_removed_while_it_moves_does_not_come_back_after_a_crash(
    open_store, store_dir, tmp_path
):
    store = compacting_store(open_store)
    fill(store, range(16))
    remove_all_but(store, range(8), keep={0, 6, 7})
    assert store.choose_compaction() == 0
    found = scan_file(store_dir / "0.rdq")
    store.stage_compaction(0, found.msg_ids, found.offsets, found.total_sizes)
    plan = store.finish_compaction_staging()
    assert {move[0] for move in plan.moves} == {msg_id(6), msg_id(7)}
    store.remove(msg_id(7))  # acknowledged while the GC copies it
    store.write(msg_id(6), body(6))  # a second reference, while it moves
    store.sync()
    compact_in_place(store_dir, 0)
    store.apply_compaction(plan)
    store.sync()
    assert store.read(msg_id(7)) is None and store.read(msg_id(6)) == body(6)
    store.remove(msg_id(6))
    assert store.read(msg_id(6)) == body(6)  # its second reference holds it
    crashed = crash_copy(store_dir, tmp_path)
    with MessageStore(crashed, file_size_limit=1000, gc="compact") as recovered:
        assert not recovered.contains(msg_id(7))  # its moved copy is in the removal log
        assert recovered.read(msg_id(0)) == body(0)
    assert len((store_dir / "0.removed").read_bytes()) == 28  # that entry alone


def test_a_record_is_never_moved_onto_a_removed_copy_of_its_own_id(open_store, store_dir, tmp_path):
    # X written at 125, removed (the removal log names 125, X), written again at 250 in
    # the same file: moving it back to 125 would have a crash drop it as removed.
    store = compacting_store(open_store)
    x = msg_id(1)
    store.write(msg_id(0), body(0))
    store.write(x, body(1))
    store.sync()
    store.remove(x)
    store.sync()
    store.write(x, body(1, generation=1))
    fill(store, range(3, 12))
    remove_all_but(store, range(3, 8), keep=set())
    assert store.location(x).file == 0 and store.location(x).offset == 2 * RECORD
    store.collect_garbage()
    assert store.location(x).offset != RECORD
    crashed = crash_copy(store_dir, tmp_path)
    with MessageStore(crashed, file_size_limit=1000, gc="compact") as recovered:
        assert recovered.read(x) == body(1, generation=1)
        assert recovered.read(msg_id(0)) == body(0)


def test_a_file_emptied_during_its_compaction_is_deleted_and_its_journal_with_it(
    open_store, store_dir
):
    store = compacting_store(open_store)
    fill(store, range(16))
    remove_all_but(store, range(8), keep={0, 7})
    assert store.choose_compaction() == 0
    found = scan_file(store_dir / "0.rdq")
    store.stage_compaction(0, found.msg_ids, found.offsets, found.total_sizes)
    plan = store.finish_compaction_staging()
    assert (store_dir / journal_name(0)).exists()
    store.remove(msg_id(0))
    store.remove(msg_id(7))
    assert (store_dir / "0.rdq").exists()  # locked by the job: not deleted under it
    store.abandon_compaction(plan)
    assert not (store_dir / "0.rdq").exists() and not (store_dir / journal_name(0)).exists()
    assert store.stats()["locked_files"] == 0


def test_a_file_a_reader_holds_is_left_until_the_reader_goes(open_store, store_dir):
    store = compacting_store(open_store, shared_readers=True)
    fill(store, range(16))
    remove_all_but(store, range(8), keep={0, 7})
    with a_reader_inside(store_dir, 0):  # not chosen at all
        assert store.collect_garbage() == 0
    assert store.collect_garbage() == 1
    assert os.path.getsize(store_dir / "0.rdq") == 2 * RECORD
    assert store.read(msg_id(7)) == body(7)


def test_a_torn_journal_is_deleted_at_the_start_and_nothing_moves(open_store, store_dir, caplog):
    store = compacting_store(open_store)
    fill(store, range(16))
    remove_all_but(store, range(8), keep={0, 7})
    store.close()
    (store_dir / journal_name(0)).write_bytes(b"WRNCMPCT" + b"\x01" * 30)  # torn
    with caplog.at_level(logging.WARNING, logger="warren.store"):
        reopened = compacting_store(open_store)
    assert "torn compaction journal of 0.rdq" in caplog.text
    assert not (store_dir / journal_name(0)).exists()
    assert reopened.read(msg_id(7)) == body(7) and reopened.recovered_clean


def file_0_planned(open_store, store_dir, keep, **options):
    """Files 0 and 1 full, 0 keeping ``keep`` of its eight; its compaction planned (the
    journal written): the store and the plan."""
    store = compacting_store(open_store, **options)
    fill(store, range(16))
    remove_all_but(store, range(8), keep=keep)
    return store, staged(store, store_dir)


def staged(store, store_dir, file=0):
    """Choose ``file`` and stage it from a scan; the plan (its journal written)."""
    assert store.choose_compaction() == file
    found = scan_file(store_dir / f"{file}.rdq")
    store.stage_compaction(file, found.msg_ids, found.offsets, found.total_sizes)
    return store.finish_compaction_staging()


def test_readers_inside_the_file_at_the_switch_leave_everything_as_it_was(
    open_store, store_dir, tmp_path
):
    store, plan = file_0_planned(open_store, store_dir, keep={0, 6, 7}, shared_readers=True)
    compact_in_place(store_dir, 0, plan.token)
    with a_reader_inside(store_dir, 0):
        assert store.apply_compaction(plan, wait_s=0.05) is False
    store.abandon_compaction(plan)  # rolled back: the copies zeroed, the journal gone
    assert not (store_dir / journal_name(0)).exists()
    assert store.location(msg_id(7)).offset == 7 * RECORD  # never moved in the index
    assert os.path.getsize(store_dir / "0.rdq") == 1000
    store.remove(msg_id(7))
    store.sync()
    crashed = crash_copy(store_dir, tmp_path)
    with MessageStore(crashed, file_size_limit=1000, gc="compact") as recovered:
        assert not recovered.contains(msg_id(7))  # acknowledged: it stays gone
        assert recovered.read(msg_id(6)) == body(6)
    assert store.collect_garbage() == 1  # no reader now: done
    assert store.read(msg_id(6)) == body(6) and store.read(msg_id(0)) == body(0)


def test_a_gc_job_of_another_plan_finds_the_journal_is_not_its_own(open_store, store_dir):
    store, plan = file_0_planned(open_store, store_dir, keep={0, 7})
    before = (store_dir / "0.rdq").read_bytes()
    with pytest.raises(JournalInvalid, match="another job's"):
        compact_in_place(store_dir, 0, b"stalejob")
    assert (store_dir / "0.rdq").read_bytes() == before
    compact_in_place(store_dir, 0, plan.token)
    assert store.apply_compaction(plan)
    assert store.read(msg_id(7)) == body(7)


def test_a_full_disk_for_the_compacted_marker_costs_only_the_figure(
    open_store, store_dir, monkeypatch
):
    store = compacting_store(open_store)
    fill(store, range(16))
    remove_all_but(store, range(8), keep={0, 7})

    def disk_full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(compaction, "note_compacted", disk_full)
    assert store.collect_garbage() == 1
    assert store.read(msg_id(7)) == body(7)
    store.write(msg_id(99), body(99))
    assert store.sync().durable  # the store was not broken


def test_a_scan_that_fails_in_process_leaves_the_file_unlocked(open_store, monkeypatch):
    store = compacting_store(open_store)
    fill(store, range(16))
    remove_all_but(store, range(8), keep={0, 7})

    def unreadable(path, **options):
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(compacting, "scan_file", unreadable)
    with pytest.raises(PermissionError):
        store.collect_garbage()
    assert store.stats()["locked_files"] == 0
    monkeypatch.undo()
    assert store.collect_garbage() == 1


def test_no_room_for_a_dead_copys_log_entry_gives_the_compaction_up(
    open_store, store_dir, tmp_path, monkeypatch
):
    store, plan = file_0_planned(open_store, store_dir, keep={0, 6, 7})
    compact_in_place(store_dir, 0, plan.token)
    store.remove(msg_id(7))  # acknowledged while it moved: its copy at 125 is dead
    store.sync()
    monkeypatch.setattr(RemovalLog, "_append", lambda self, file, entries: False)  # no room
    assert store.apply_compaction(plan) is False
    store.abandon_compaction(plan)  # rolled back: the dead copy is zeroed
    monkeypatch.undo()
    crashed = crash_copy(store_dir, tmp_path)
    with MessageStore(crashed, file_size_limit=1000, gc="compact") as recovered:
        assert not recovered.contains(msg_id(7))
        assert recovered.read(msg_id(6)) == body(6)


def opened(path) -> int:
    """How many of this process's fds name ``path``."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}") == str(path)
        except OSError:  # closed meanwhile
            pass
    return count


def test_a_gc_that_gets_the_journal_after_its_roll_back_writes_nothing(open_store, store_dir):
    store, plan = file_0_planned(open_store, store_dir, keep={0, 7})
    before = (store_dir / "0.rdq").read_bytes()
    outcome = []
    holder = os.open(store_dir / journal_name(0), os.O_RDONLY)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)  # a start's roll-back holds it

        def gc():
            try:
                compact_in_place(store_dir, 0, plan.token)
            except JournalInvalid as exc:
                outcome.append(exc)

        waiting = threading.Thread(target=gc)
        waiting.start()
        wait_for(lambda: opened(store_dir / journal_name(0)) == 2)  # the GC waits on it
        os.unlink(store_dir / journal_name(0))  # the roll-back deletes it, then lets go
    finally:
        os.close(holder)
    waiting.join(timeout=30)
    assert outcome and "rolled back" in str(outcome[0])
    assert (store_dir / "0.rdq").read_bytes() == before


def test_a_removal_log_cut_mid_entry_keeps_the_entries_after_it_readable(
    open_store, store_dir, tmp_path
):
    store = compacting_store(open_store)
    fill(store, range(16))
    remove_all_but(store, range(8), keep=set(range(1, 8)))  # 0 removed: one entry
    store.close()
    with open(store_dir / "0.removed", "ab") as log:
        log.write(b"\x00" * 10)  # an append a kill cut short
    store = compacting_store(open_store)
    store.remove(msg_id(5))
    store.sync()
    crashed = crash_copy(store_dir, tmp_path)
    with MessageStore(crashed, file_size_limit=1000, gc="compact") as recovered:
        assert not recovered.contains(msg_id(0)) and not recovered.contains(msg_id(5))
        assert recovered.read(msg_id(4)) == body(4)


def test_a_journal_found_beside_a_file_already_cut_is_only_dropped(
    open_store, store_dir, tmp_path, caplog
):
    # An OS crash may keep the cut and lose the journal's unsynced deletion.
    store, plan = file_0_planned(open_store, store_dir, keep={0, 6, 7})
    journal = (store_dir / journal_name(0)).read_bytes()
    compact_in_place(store_dir, 0, plan.token)
    assert store.apply_compaction(plan)
    crashed = crash_copy(store_dir, tmp_path)
    (crashed / journal_name(0)).write_bytes(journal)
    with (
        caplog.at_level(logging.INFO, logger="warren.store"),
        MessageStore(crashed, file_size_limit=1000, gc="compact") as recovered,
    ):
        assert "0.rdq was compacted; its journal is dropped" in caplog.text
        assert not (crashed / journal_name(0)).exists()
        assert all(recovered.read(msg_id(n)) == body(n) for n in (0, 6, 7, *range(8, 16)))


def test_a_store_stopped_while_its_gc_moves_rolls_the_job_back_at_its_next_start(
    open_store, store_dir, caplog
):
    # What the store actor does on SIGTERM with a job out: give it up without rolling it
    # back (its GC may still be moving), stop cleanly; the next start rolls it back.
    store, plan = file_0_planned(open_store, store_dir, keep={0, 6, 7})
    compact_in_place(store_dir, 0, plan.token)
    store.abandon_compaction(plan, roll_back=False)
    store.close()
    assert (store_dir / journal_name(0)).exists()
    with caplog.at_level(logging.WARNING, logger="warren.store"):
        reopened = compacting_store(open_store)
    assert "2 copies complete, 0 torn" in caplog.text
    assert reopened.recovered_clean and not (store_dir / journal_name(0)).exists()
    assert all(reopened.read(msg_id(n)) == body(n) for n in (0, 6, 7, *range(8, 16)))
    assert reopened.collect_garbage() == 1
    assert all(reopened.read(msg_id(n)) == body(n) for n in (0, 6, 7))

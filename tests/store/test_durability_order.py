"""What reaches the disk, in which order, before a write is reported durable; and what
the store does when the disk or the GC fails. Each test records the real system calls."""

import errno
import logging
import os
import stat

import pytest

from warren.store import MessageStore, rewrite_combine
from warren.store.engine import compacting as compacting_module
from warren.store.engine import gc as gc_module

from .helpers import body, fill, msg_id


@pytest.fixture
def disk_calls(monkeypatch):
    """Record fdatasync/fsync/pwrite/ftruncate (naming the file or "dir"), rename and
    unlink, in order."""
    calls = []

    def target(fd):
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            return "dir"
        return os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))

    on_fd = ("fdatasync", "fsync", "pwrite", "ftruncate")
    real = {name: getattr(os, name) for name in (*on_fd, "rename", "unlink")}

    def recorder(name):
        def call(first, *args, **kwargs):
            calls.append(
                (
                    name,
                    target(first) if name in on_fd else os.path.basename(str(first)),
                )
            )
            return real[name](first, *args, **kwargs)

        return call

    for name in real:
        monkeypatch.setattr(os, name, recorder(name))
    return calls


def test_a_sync_that_created_a_file_fsyncs_every_file_written_and_then_the_directory(
    open_store, disk_calls
):
    store = open_store(file_size_limit=1000)
    disk_calls.clear()
    for n in range(12):  # 8 records fill 0.rdq, 1.rdq is new
        store.write(msg_id(n), body(n))
    store.sync()
    syncs = [c for c in disk_calls if c[0] in ("fdatasync", "fsync")]
    assert syncs == [("fdatasync", "0.rdq"), ("fdatasync", "1.rdq"), ("fsync", "dir")]
    disk_calls.clear()
    store.write(msg_id(99), body(99))
    store.sync()
    assert disk_calls == [("fdatasync", "1.rdq")]  # no file created: no directory sync


def test_a_combine_syncs_its_copy_renames_it_syncs_the_directory_then_deletes_src(
    open_store, store_dir, disk_calls
):
    store = open_store(file_size_limit=1000, auto_gc=False, gc="combine")
    fill(store, range(40))
    for n in range(36):
        if n % 8:
            store.remove(msg_id(n))
    store.sync()  # the removal logs are written
    disk_calls.clear()
    assert store.collect_garbage() >= 1
    assert disk_calls[0] == ("fdatasync", "0.rdt")
    switch = disk_calls.index(("rename", "0.rdt"))
    assert disk_calls[switch : switch + 3] == [
        ("rename", "0.rdt"),
        ("fsync", "dir"),
        ("unlink", "1.rdq"),
    ]
    # The removal logs of Dst and Src go, durably, before the switch.
    assert disk_calls[1:switch] == [
        ("unlink", "0.removed"),
        ("unlink", "1.removed"),
        ("fsync", "dir"),
    ]


def test_the_flush_policy_never_fsyncs_on_sync_but_a_clean_stop_syncs_every_file(
    store_dir, disk_calls
):
    store = MessageStore(store_dir, file_size_limit=1000, sync_policy="flush")
    fill(store, range(20))
    assert not [c for c in disk_calls if c[0] == "fdatasync" and c[1].endswith(".rdq")]
    store.close()
    synced = {c[1] for c in disk_calls if c[0] in ("fdatasync", "fsync")}
    assert {"0.rdq", "1.rdq", "2.rdq"} <= synced


def test_a_fan_out_write_cancelled_by_both_removes_reports_both_tickets_ignored(open_store):
    store = open_store()
    store.write(msg_id(1), body(1), ticket="queue-a")
    store.write(msg_id(1), body(1), ticket="queue-b")
    store.remove(msg_id(1))
    store.remove(msg_id(1))
    settled = store.sync()
    assert settled.ignored == ["queue-a", "queue-b"] and settled.durable == []


def test_close_reports_the_writes_no_sync_reported(store_dir):
    store = MessageStore(store_dir)
    store.write(msg_id(1), body(1), ticket="late")
    settled = store.close()
    assert settled.durable == ["late"]
    with MessageStore(store_dir) as again:
        assert again.read(msg_id(1)) == body(1)


def test_a_compaction_makes_its_journal_durable_first_and_cuts_the_file_after_deleting_it(
    open_store, disk_calls
):
    store = open_store(file_size_limit=1000, auto_gc=False, gc="compact")
    fill(store, range(40))
    for n in range(8):  # file 0 keeps 3 and 7 of its eight
        if n not in (3, 7):
            store.remove(msg_id(n))
    store.sync()
    disk_calls.clear()
    assert store.collect_garbage() == 1
    journal_durable = disk_calls.index(("fdatasync", "0.compact"))
    first_data_write = disk_calls.index(("pwrite", "0.rdq"))
    assert disk_calls[journal_durable + 1] == ("fsync", "dir")
    assert journal_durable < first_data_write
    moves_durable = disk_calls.index(("fdatasync", "0.rdq"))
    journal_gone = disk_calls.index(("unlink", "0.compact"))
    cut = disk_calls.index(("ftruncate", "0.rdq"))
    assert first_data_write < moves_durable < journal_gone < cut
    # Neither synced by the store: a start that finds the journal beside the cut file
    # knows the compaction was applied.
    assert disk_calls[journal_gone + 1] == ("ftruncate", "0.rdq")
    # The last live record moves first, into the first hole (RabbitMQ's order).
    assert store.location(msg_id(7)).offset == 0 and store.location(msg_id(3)).offset == 125
    assert store.stats()["files"][0]["file_size"] == 250
    assert store.read(msg_id(7)) == body(7)


@pytest.mark.parametrize("gc", ["compact", "combine"])
def test_a_gc_that_fails_inside_sync_loses_no_ticket_and_the_store_carries_on(
    open_store, monkeypatch, caplog, gc
):
    store = open_store(file_size_limit=1000, gc=gc)
    fill(store, range(40))

    def disk_full(*job):
        raise OSError(errno.ENOSPC, "No space left on device")

    if gc == "combine":
        monkeypatch.setattr(gc_module, "rewrite_combine", disk_full)
    else:
        monkeypatch.setattr(compacting_module, "compact_in_place", disk_full)
    store.write(msg_id(99), body(99), ticket="T99")
    for n in range(36):
        if n % 8:
            store.remove(msg_id(n))
    with caplog.at_level(logging.ERROR, logger="warren.store"):
        settled = store.sync()
    assert settled.durable == ["T99"]
    assert "garbage collection failed" in caplog.text
    assert store.read(msg_id(99)) == body(99)
    assert store.stats()["locked_files"] == 0


@pytest.mark.parametrize("gc", ["compact", "combine"])
def test_a_damaged_record_keeps_its_file_out_of_gc_and_loses_no_other_message(
    open_store, store_dir, caplog, gc
):
    store = open_store(file_size_limit=1000, auto_gc=False, gc=gc)
    fill(store, range(40))
    place = store.location(msg_id(3))
    with open(store_dir / f"{place.file}.rdq", "r+b") as f:
        f.seek(place.offset + place.total_size - 1)
        f.write(b"\x00")  # its 0xFF trailer is gone
    live = {2, 3, 4, 16, 17, 18} | set(range(36, 40))
    for n in range(36):
        if n not in live:
            store.remove(msg_id(n))
    with caplog.at_level(logging.ERROR, logger="warren.store"):
        store.collect_garbage()
    assert f"will not be {'compacted' if gc == 'compact' else 'combined'}" in caplog.text
    assert place.file in store.stats()["uncombinable_files"]
    for n in live - {3}:
        assert store.read(msg_id(n)) == body(n)
    for n in (2, 4, 16, 17):
        store.remove(msg_id(n))
    assert all(store.read(msg_id(n)) == body(n) for n in (18, 36, 37, 38, 39))


def test_a_failed_rename_during_a_combine_surfaces_as_the_disk_error(
    open_store, store_dir, monkeypatch
):
    store = open_store(file_size_limit=1000, auto_gc=False, shared_readers=True)
    fill(store, range(40))
    for n in range(36):
        if n % 8:
            store.remove(msg_id(n))
    plan = store.plan_combine()
    result = rewrite_combine(store_dir, plan)
    real_rename = os.rename

    def failing_rename(src, dst, **kwargs):
        if str(src).endswith(".rdt"):
            raise OSError(errno.EIO, "Input/output error")
        return real_rename(src, dst, **kwargs)

    monkeypatch.setattr(os, "rename", failing_rename)
    with pytest.raises(OSError) as caught:
        store.apply_combine(plan, result)
    assert caught.value.errno == errno.EIO

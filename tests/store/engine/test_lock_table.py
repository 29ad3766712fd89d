"""Readers in other processes read store files directly through the shared lock table,
and neither they nor the store ever get wrong bytes or stall, whatever a reader does."""

import contextlib
import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from warren.store import MessageStore, rewrite_combine
from warren.store.engine.lock_table import SWITCH_DEADLINE_SECONDS, LockTableReader

from ..helpers import body, fill, msg_id

ROOT = Path(__file__).resolve().parents[3]


class Reader:
    """A reader_child process, always killed (and continued first if stopped)."""

    def __init__(self, *args: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.store.reader_child", *args],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )

    def line(self) -> str:
        return self.process.stdout.readline().strip()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.send_signal(signal.SIGCONT)
        self.process.wait(timeout=30)
        self.process.stdout.close()

    def __enter__(self) -> "Reader":
        return self

    def __exit__(self, *exc) -> None:
        self.kill()


@pytest.fixture
def one_message(store_dir):
    """A store with shared readers holding message 1, its place, and a reader."""
    with MessageStore(store_dir, shared_readers=True) as store:
        store.write(msg_id(1), body(1))
        store.sync()
        reader = LockTableReader(store_dir)
        try:
            yield store, store.location(msg_id(1)), reader
        finally:
            reader.close()


def fragmented_store(directory, count=400):
    store = MessageStore(directory, file_size_limit=8 * 1024, auto_gc=False, shared_readers=True)
    for n in range(count):
        store.write(msg_id(n), body(n, 300))
    store.sync()
    for n in range(count):
        if n % 4:
            store.remove(msg_id(n))
    return store


def test_a_reader_reads_a_flushed_record_directly(one_message):
    store, place, reader = one_message
    assert reader.read(place.file, place.offset, place.total_size, msg_id(1)) == body(1)
    assert reader.read(place.file, place.offset, place.total_size, msg_id(2)) is None
    assert reader.read(place.file, place.offset + 1000, place.total_size, msg_id(1)) is None
    assert (reader.direct_reads, reader.fallbacks) == (1, 2)


def test_a_reader_falls_back_while_the_store_holds_the_file(one_message):
    store, place, reader = one_message
    with store._lock_table.exclusive([place.file]) as acquired:
        assert acquired
        assert reader.read(place.file, place.offset, place.total_size, msg_id(1)) is None
    assert reader.read(place.file, place.offset, place.total_size, msg_id(1)) == body(1)


def test_several_readers_racing_the_gc_never_read_a_wrong_body(store_dir, tmp_path):
    store = fragmented_store(store_dir)
    try:
        live = [n for n in range(400) if n % 4 == 0]
        locations = tmp_path / "locations"
        with open(locations, "w") as f:
            for n in live:
                p = store.location(msg_id(n))
                f.write(
                    f"{msg_id(n).hex()} {p.file} {p.offset} {p.total_size} "
                    f"{hashlib.sha256(body(n, 300)).hexdigest()}\n"
                )
        readers = [Reader("read", str(store_dir), str(locations), "3") for _ in range(3)]
        try:
            assert [r.line() for r in readers] == ["reading"] * 3  # each has read every record
            combines = 0
            while (plan := store.plan_combine()) is not None:
                result = rewrite_combine(store_dir, plan)
                while not store.apply_combine(plan, result):
                    pass
                combines += 1
            assert combines > 0
            assert all(store.read(msg_id(n)) == body(n, 300) for n in live)
            outcomes = [tuple(map(int, r.line().split())) for r in readers]
        finally:
            for r in readers:
                r.kill()
        assert all(wrong == 0 for _direct, _fallback, wrong in outcomes)
        assert all(direct > 0 for direct, _fallback, _wrong in outcomes)
        assert any(fallback > 0 for _direct, fallback, _wrong in outcomes)
    finally:
        store.close()


@pytest.mark.parametrize("how", ["stop", "wait"])
def test_a_reader_holding_its_lock_delays_the_switch_but_never_stalls_the_store(store_dir, how):
    store = fragmented_store(store_dir)
    try:
        plan = store.plan_combine()
        result = rewrite_combine(store_dir, plan)
        with Reader("hold", str(store_dir), str(plan.src), how) as reader:
            assert reader.line() == "held"
            started = time.monotonic()
            assert store.apply_combine(plan, result) is False
            assert time.monotonic() - started < 20  # gave up, not waiting for the reader
            store.write(msg_id(1000), body(1000))  # the store keeps serving
            store.sync()
            assert store.read(msg_id(0)) == body(0, 300)
            reader.kill()  # the kernel drops its lock
        assert store.apply_combine(plan, result) is True
        assert all(store.read(msg_id(n)) == body(n, 300) for n in range(0, 400, 4))
    finally:
        store.close()


@contextlib.contextmanager
def file_zero_emptied_under_a_reader(store_dir, how: str):
    """A store whose 0.rdq a reader process holds (then "wait"s or "stop"s) while all its
    messages are removed; yields (store, reader). Both are stopped at the end."""
    store = MessageStore(store_dir, file_size_limit=1000, shared_readers=True, auto_gc=False)
    try:
        fill(store, range(20))
        with Reader("hold", str(store_dir), "0", how) as reader:
            assert reader.line() == "held"
            for n in range(8):
                store.remove(msg_id(n))  # 0.rdq empties: deleting it waits
            yield store, reader
    finally:
        store.close()


def test_an_empty_file_a_reader_holds_is_deleted_at_the_next_sync_after_it_lets_go(store_dir):
    with file_zero_emptied_under_a_reader(store_dir, "wait") as (store, reader):
        assert "0.rdq" in os.listdir(store_dir)
        assert store.stats()["deferred_deletes"] == 1
        reader.kill()
        store.sync()
        assert "0.rdq" not in os.listdir(store_dir)
        assert store.stats()["deferred_deletes"] == 0


def test_a_reader_that_forks_does_not_keep_its_locks_alive_in_the_child(store_dir):
    store = fragmented_store(store_dir)
    grandchild = None
    try:
        plan = store.plan_combine()
        result = rewrite_combine(store_dir, plan)
        with Reader("hold", str(store_dir), str(plan.src), "fork") as reader:
            _held, pid = reader.line().split()
            grandchild = psutil.Process(int(pid))
            reader.kill()
        assert grandchild.is_running()  # alive, and it inherited the lock fd at fork
        assert store.apply_combine(plan, result) is True
    finally:
        if grandchild is not None and grandchild.is_running():
            grandchild.kill()
            grandchild.wait(10)
        store.close()


def open_fds_of_deleted_files(store_dir) -> list[str]:
    """The deleted store files of ``store_dir`` this process still holds open (only its
    own: a worker that ran other tests before may hold theirs)."""
    links = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            links.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            continue
    return [
        link
        for link in links
        if link.startswith(f"{store_dir}/") and link.endswith(".rdq (deleted)")
    ]


def combine_everything(store, directory):
    while (plan := store.plan_combine()) is not None:
        assert store.apply_combine(plan, rewrite_combine(directory, plan))


def test_a_reader_lets_go_of_files_the_gc_deleted(store_dir):
    store = fragmented_store(store_dir)
    reader = LockTableReader(store_dir)
    try:
        for n in range(0, 400, 4):
            p = store.location(msg_id(n))
            assert reader.read(p.file, p.offset, p.total_size, msg_id(n)) == body(n, 300)
        combine_everything(store, store_dir)
        for n in range(0, 400, 4):  # stale places: fall back, and refresh
            p = store.location(msg_id(n))
            reader.read(p.file, p.offset, p.total_size, msg_id(n))
        assert open_fds_of_deleted_files(store_dir) == []
    finally:
        reader.close()
        store.close()


def test_a_reader_moved_by_a_combine_reads_the_new_place_directly(store_dir):
    store = fragmented_store(store_dir)
    reader = LockTableReader(store_dir)
    try:
        plan = store.plan_combine()
        moved = plan.src_records[0][0]
        dst_id, dst_offset, dst_size = plan.dst_records[-1]
        assert reader.read(plan.dst, dst_offset, dst_size, dst_id) is not None  # fd cached
        assert store.apply_combine(plan, rewrite_combine(store_dir, plan))
        p = store.location(moved)
        assert p.file == plan.dst
        assert reader.read(p.file, p.offset, p.total_size, moved) is not None
    finally:
        reader.close()
        store.close()


def test_a_reader_falls_back_when_the_store_flags_the_file_between_its_check_and_its_lock(
    one_message, monkeypatch
):
    store, p, reader = one_message
    real_acquire = reader._acquire

    def acquire_then_store_flags(slot):
        got = real_acquire(slot)
        store._lock_table._set_flag(slot, 1)
        return got

    monkeypatch.setattr(reader, "_acquire", acquire_then_store_flags)
    assert reader.read(p.file, p.offset, p.total_size, msg_id(1)) is None


def test_a_reader_never_reads_past_the_published_flushed_offset(one_message):
    store, p, reader = one_message
    store._lock_table.publish(p.file, p.offset + p.total_size - 1)
    assert reader.read(p.file, p.offset, p.total_size, msg_id(1)) is None
    store._lock_table.publish(p.file, p.offset + p.total_size)
    assert reader.read(p.file, p.offset, p.total_size, msg_id(1)) == body(1)


def test_a_reader_follows_the_store_across_a_restart_even_one_that_died_mid_update(store_dir):
    store = MessageStore(store_dir, shared_readers=True)
    store.write(msg_id(1), body(1))
    store.sync()
    reader = LockTableReader(store_dir)
    try:
        p = store.location(msg_id(1))
        assert reader.read(p.file, p.offset, p.total_size, msg_id(1)) == body(1)
        table = store._lock_table._map
        table[16:24] = (7).to_bytes(8, "little")  # a header update never finished
        store._release()  # ... because the store died
        started = time.monotonic()
        assert reader.read(p.file, p.offset, p.total_size, msg_id(1)) is None
        assert time.monotonic() - started < 20  # gave up, not waiting for the dead store
        with MessageStore(store_dir, shared_readers=True) as restarted:
            restarted.write(msg_id(2), body(2))
            restarted.sync()
            q = restarted.location(msg_id(2))
            reader.read(q.file, q.offset, q.total_size, msg_id(2))  # may fall back once
            assert reader.read(q.file, q.offset, q.total_size, msg_id(2)) == body(2)
            assert reader.direct_reads >= 2
    finally:
        reader.close()


def test_a_stopped_reader_costs_later_syncs_no_wait(store_dir):
    with file_zero_emptied_under_a_reader(store_dir, "stop") as (store, _reader):
        durations = []
        for n in range(10):
            store.write(msg_id(100 + n), body(n))
            started = time.monotonic()
            store.sync()
            durations.append(time.monotonic() - started)
        # Waiting out the switch deadline would make every sync at least that long; on a
        # loaded machine any fdatasync may be slow, but not every one of ten.
        assert min(durations) < SWITCH_DEADLINE_SECONDS, durations
        assert store.stats()["deferred_deletes"] == 1
        assert store.stats()["files"][0]["readers"] == 1

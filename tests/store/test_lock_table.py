"""Readers in other processes read store files directly through the shared lock table,
and neither they nor the store ever get wrong bytes or stall, whatever a reader does."""

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from store import MessageStore, rewrite_combine
from store.lock_table import LockTableReader

from .helpers import body, msg_id

ROOT = Path(__file__).resolve().parents[2]


class Reader:
    """A reader_child process, always killed (and continued first if stopped)."""

    def __init__(self, *args: str) -> None:
        self.process = subprocess.Popen([sys.executable, "-m", "tests.store.reader_child", *args],
                                        cwd=ROOT, stdout=subprocess.PIPE, text=True)

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


def fragmented_store(directory, count=400):
    store = MessageStore(directory, file_size_limit=8 * 1024, auto_gc=False,
                         shared_readers=True)
    for n in range(count):
        store.write(msg_id(n), body(n, 300))
    store.sync()
    for n in range(count):
        if n % 4:
            store.remove(msg_id(n))
    return store


def test_a_reader_reads_a_flushed_record_directly(store_dir):
    with MessageStore(store_dir, shared_readers=True) as store:
        store.write(msg_id(1), body(1))
        store.sync()
        place = store.location(msg_id(1))
        reader = LockTableReader(store_dir)
        try:
            assert reader.read(place.file, place.offset, place.total_size, msg_id(1)) == body(1)
            assert reader.read(place.file, place.offset, place.total_size, msg_id(2)) is None
            assert reader.read(place.file, place.offset + 1000, place.total_size, msg_id(1)) is None
            assert (reader.direct_reads, reader.fallbacks) == (1, 2)
        finally:
            reader.close()


def test_a_reader_falls_back_while_the_store_holds_the_file(store_dir):
    with MessageStore(store_dir, shared_readers=True) as store:
        store.write(msg_id(1), body(1))
        store.sync()
        place = store.location(msg_id(1))
        reader = LockTableReader(store_dir)
        try:
            with store._lock_table.exclusive([place.file]) as acquired:
                assert acquired
                assert reader.read(place.file, place.offset, place.total_size, msg_id(1)) is None
            assert reader.read(place.file, place.offset, place.total_size, msg_id(1)) == body(1)
        finally:
            reader.close()


def test_several_readers_racing_the_gc_never_read_a_wrong_body(store_dir, tmp_path):
    store = fragmented_store(store_dir)
    try:
        live = [n for n in range(400) if n % 4 == 0]
        locations = tmp_path / "locations"
        with open(locations, "w") as f:
            for n in live:
                p = store.location(msg_id(n))
                f.write(f"{msg_id(n).hex()} {p.file} {p.offset} {p.total_size} "
                        f"{hashlib.sha256(body(n, 300)).hexdigest()}\n")
        readers = [Reader("read", str(store_dir), str(locations), "3") for _ in range(3)]
        try:
            time.sleep(0.5)
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
            assert time.monotonic() - started < 2
            store.write(msg_id(1000), body(1000))              # the store keeps serving
            store.sync()
            assert store.read(msg_id(0)) == body(0, 300)
            reader.kill()                                      # the kernel drops its lock
        assert store.apply_combine(plan, result) is True
        assert all(store.read(msg_id(n)) == body(n, 300) for n in range(0, 400, 4))
    finally:
        store.close()


def test_an_empty_file_a_reader_holds_is_deleted_at_the_next_sync_after_it_lets_go(store_dir):
    store = MessageStore(store_dir, file_size_limit=1000, shared_readers=True, auto_gc=False)
    try:
        for n in range(20):
            store.write(msg_id(n), body(n))
        store.sync()
        with Reader("hold", str(store_dir), "0", "wait") as reader:
            assert reader.line() == "held"
            for n in range(8):
                store.remove(msg_id(n))
            assert "0.rdq" in os.listdir(store_dir)
            assert store.stats()["deferred_deletes"] == 1
            reader.kill()
        store.sync()
        assert "0.rdq" not in os.listdir(store_dir)
        assert store.stats()["deferred_deletes"] == 0
    finally:
        store.close()


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
        assert grandchild.is_running()           # alive, and it inherited the lock fd at fork
        assert store.apply_combine(plan, result) is True
    finally:
        if grandchild is not None and grandchild.is_running():
            grandchild.kill()
            grandchild.wait(10)
        store.close()

"""``warren store inspect`` reports what a directory holds and changes nothing."""

import hashlib
import os
import subprocess
import sys

from warren.store import MessageStore
from warren.store.engine.inspect import inspect_store

from ..helpers import fill, msg_id, record


def fingerprint(directory) -> dict[str, str]:
    return {
        name: hashlib.md5((directory / name).read_bytes()).hexdigest()
        for name in sorted(os.listdir(directory))
    }


def test_inspect_reports_files_records_valid_and_garbage_bytes_and_damage(store_dir):
    with MessageStore(store_dir, file_size_limit=1000, auto_gc=False) as store:
        fill(store, range(20))
        for n in range(8, 12):
            store.remove(msg_id(n))
    with open(store_dir / "2.rdq", "ab") as f:
        f.write(b"\xee" * 10 + record(99)[:40])
    before = fingerprint(store_dir)

    report = inspect_store(store_dir)
    assert report.validity_source == "last copy of each id, less the removal log"
    assert report.snapshot_problem == "2.rdq changed size since the clean shutdown"
    assert fingerprint(store_dir) == before
    files = {f.file: f for f in report.files}
    assert files[1].records == 8
    assert files[2].damaged == [(500, 50)]

    cli = subprocess.run(
        [sys.executable, "-m", "warren.supervisor.cli", "store", "inspect", str(store_dir)],
        capture_output=True,
        text=True,
    )
    assert cli.returncode == 0
    assert "1.rdq" in cli.stdout and "50 B at 500" in cli.stdout
    assert fingerprint(store_dir) == before


def test_inspect_of_a_cleanly_stopped_store_counts_valid_bytes_from_its_index(store_dir):
    with MessageStore(store_dir, file_size_limit=1000, auto_gc=False) as store:
        fill(store, range(20))
        for n in range(8, 12):
            store.remove(msg_id(n))
    report = inspect_store(store_dir)
    assert report.validity_source == "clean-shutdown index"
    assert report.message_count == 16
    assert {f.file: f.garbage_bytes for f in report.files} == {0: 0, 1: 500, 2: 0}


def test_inspect_of_something_that_is_not_a_store_exits_with_a_usage_error(tmp_path):
    cli = subprocess.run(
        [
            sys.executable,
            "-m",
            "warren.supervisor.cli",
            "store",
            "inspect",
            str(tmp_path / "missing"),
        ],
        capture_output=True,
        text=True,
    )
    assert cli.returncode == 2
    assert "is not a store directory" in cli.stderr


def test_inspect_shows_which_files_were_compacted_and_an_unfinished_compaction(store_dir):
    with MessageStore(store_dir, file_size_limit=1000, auto_gc=False, gc="compact") as store:
        fill(store, range(24))
        for n in range(8):
            if n not in (0, 7):
                store.remove(msg_id(n))
        store.sync()
        assert store.collect_garbage() == 1
    (store_dir / "1.compact").write_bytes(b"left by a crash")
    report = inspect_store(store_dir)
    files = {f.file: f for f in report.files}
    assert (files[0].compactions, files[0].compacted_bytes) == (1, 750)
    assert files[0].size == files[0].valid_bytes == 250
    assert files[1].compactions == 0
    assert report.unfinished_compactions == ["1.compact"]
    cli = subprocess.run(
        [sys.executable, "-m", "warren.supervisor.cli", "store", "inspect", str(store_dir)],
        capture_output=True,
        text=True,
    )
    assert cli.returncode == 0
    assert "1x, 750 B cut" in cli.stdout
    assert "unfinished compaction (rolled back at next open): 1.compact" in cli.stdout

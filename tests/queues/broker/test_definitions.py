"""A node's durable definitions on disk: what a declare writes (the same whatever the
number of definitions), what a load makes of a log a crash cut short, and what reaches
the disk, in which order, as a delete's tombstone is removed."""

import errno
import json
import logging
import os
import stat
import zlib
from dataclasses import asdict

import pytest

from warren.queues.broker.definitions import (
    DEFINITIONS_FILE,
    Definitions,
    ExchangeDefinition,
    mark_deleted,
    queue_directory,
)
from warren.queues.protocol import QueueDefinition

from ..helpers import fail_the_next_fdatasync


def bytes_written_by_this_process() -> int:
    with open("/proc/self/io") as io:
        return next(int(line.split()[1]) for line in io if line.startswith("wchar:"))


def test_the_bytes_a_declare_writes_do_not_grow_with_the_definitions(tmp_path):
    """Rewriting every definition at each declare made the last hundred of a thousand
    declares four times as slow as the first: n declares must write O(n) bytes."""
    definitions = Definitions(str(tmp_path))
    count = 1000
    started = bytes_written_by_this_process()
    for n in range(count):
        definitions.add_queue(QueueDefinition(f"queue {n:05d}", max_length=n + 1))
        definitions.save()
    written = bytes_written_by_this_process() - started
    definitions.close()
    on_disk = sum(entry.stat().st_size for entry in os.scandir(tmp_path))
    assert written < 10 * on_disk, (written, on_disk)
    assert set(Definitions(str(tmp_path)).queues) == {f"queue {n:05d}" for n in range(count)}


def test_every_change_comes_back_across_compactions_in_the_order_it_was_made(tmp_path):
    definitions = Definitions(str(tmp_path))
    definitions.add_exchange(ExchangeDefinition("orders", "topic"))
    for n in range(600):  # past a compaction or two
        definitions.add_queue(QueueDefinition(f"q{n}"))
        definitions.bind(f"q{n}", "orders", f"key.{n}")
        definitions.save()
    for n in range(0, 600, 2):
        definitions.remove_queue(f"q{n}")
    definitions.unbind("q1", "orders", "key.1")
    definitions.add_queue(QueueDefinition("q0", lazy=True))
    definitions.add_queue(QueueDefinition("not kept", durable=False))
    definitions.save()
    definitions.close()
    loaded = Definitions(str(tmp_path))
    assert loaded.generation > 0
    assert loaded.queues == {n: d for n, d in definitions.queues.items() if d.durable}
    assert loaded.exchanges == definitions.exchanges
    assert loaded.bindings == definitions.bindings
    assert ("orders", "q1", "key.1") not in loaded.bindings


def test_a_log_a_crash_cut_short_loads_up_to_its_last_whole_change_and_is_cut_back(
    tmp_path, caplog
):
    definitions = Definitions(str(tmp_path))
    for name in ("a", "b", "c"):
        definitions.add_queue(QueueDefinition(name))
        definitions.save()
    definitions.close()
    log_path = tmp_path / f"definitions-{definitions.generation}.log"
    whole = log_path.read_bytes()
    for torn in (whole[:-7], whole + b"3fa9", whole + bytes(100)):  # cut, half-written, zeros
        log_path.write_bytes(torn)
        with caplog.at_level(logging.WARNING, logger="warren.queues"):
            loaded = Definitions(str(tmp_path))
        expected = {"a", "b"} if torn == whole[:-7] else {"a", "b", "c"}
        assert set(loaded.queues) == expected
        assert log_path.read_bytes() == whole[: len(log_path.read_bytes())]
        assert "cut back" in caplog.text
        loaded.add_queue(QueueDefinition("c"))  # the declare the crash left unanswered
        loaded.save()
        loaded.close()
        assert log_path.read_bytes().startswith(whole[: -len(whole.splitlines()[-1]) - 1])
        assert set(Definitions(str(tmp_path)).queues) == {"a", "b", "c"}
        log_path.write_bytes(whole)
        caplog.clear()


def test_a_save_whose_fdatasync_failed_leaves_no_line_behind_and_undoes_its_changes(
    tmp_path, monkeypatch
):
    """What a failed save held is neither on disk nor in memory: made again, it is new
    again, and saved (a second declare of a queue must not find it and save nothing)."""
    definitions = Definitions(str(tmp_path))
    definitions.add_queue(QueueDefinition("a"))
    definitions.add_queue(QueueDefinition("gone"))
    definitions.add_exchange(ExchangeDefinition("orders", "topic"))
    definitions.bind("a", "orders", "a.#")
    definitions.bind("gone", "orders", "gone.#")
    definitions.save()
    before = (dict(definitions.queues), dict(definitions.exchanges), set(definitions.bindings))

    def changes():
        assert definitions.add_queue(QueueDefinition("b"))
        assert definitions.add_exchange(ExchangeDefinition("audit", "fanout"))
        assert definitions.bind("b", "audit", "")
        assert definitions.unbind("a", "orders", "a.#")
        definitions.remove_queue("gone")
        definitions.remove_exchange("orders")

    changes()
    fail_the_next_fdatasync(monkeypatch)
    with pytest.raises(OSError):
        definitions.save()
    assert (definitions.queues, definitions.exchanges, definitions.bindings) == before
    log_path = tmp_path / f"definitions-{definitions.generation}.log"
    assert len(log_path.read_bytes().splitlines()) == 5
    loaded = Definitions(str(tmp_path))
    assert (loaded.queues, loaded.exchanges, loaded.bindings) == before
    changes()
    definitions.save()
    definitions.close()
    loaded = Definitions(str(tmp_path))
    assert set(loaded.queues) == {"a", "b"} and set(loaded.exchanges) == {"audit"}
    assert loaded.bindings == {("audit", "b", "")}


def test_a_stale_log_of_the_generation_before_a_compaction_is_ignored(tmp_path):
    """A crash after the new snapshot's rename but before the old log's unlink."""
    definitions = Definitions(str(tmp_path))
    for n in range(400):
        definitions.add_queue(QueueDefinition(f"q{n}"))
        definitions.save()
    assert definitions.generation >= 1
    definitions.remove_queue("q0")
    definitions.save()
    definitions.close()
    stale = tmp_path / f"definitions-{definitions.generation - 1}.log"
    change = json.dumps({"add_queue": asdict(QueueDefinition("q0"))}).encode()
    stale.write_bytes(b"%08x %s\n" % (zlib.crc32(change), change))  # what it logged
    assert (tmp_path / DEFINITIONS_FILE).exists()
    loaded = Definitions(str(tmp_path))
    assert "q0" not in loaded.queues and len(loaded.queues) == 399
    assert not stale.exists()


@pytest.fixture
def unlinks_and_directory_syncs(monkeypatch):
    """Record, in order, each unlink (the file's name) and each fsync of a directory
    (the directory's name), as the calls are really made."""
    calls = []
    unlink, fsync = os.unlink, os.fsync

    def recorded_unlink(path, *args, **kwargs):
        calls.append(("unlink", os.path.basename(path)))
        return unlink(path, *args, **kwargs)

    def recorded_fsync(fd):
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            calls.append(("fsync", os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))))
        return fsync(fd)

    monkeypatch.setattr(os, "unlink", recorded_unlink)
    monkeypatch.setattr(os, "fsync", recorded_fsync)
    return calls


def test_a_finished_delete_syncs_the_removal_of_its_tombstone(
    tmp_path, unlinks_and_directory_syncs
):
    """A power cut must not bring the tombstone back: over an ``auto_delete`` queue of
    the same name declared again, it would make that queue delete itself, confirmed
    messages and all, as it starts."""
    definitions = Definitions(str(tmp_path))
    definitions.add_queue(QueueDefinition("replies", auto_delete=True))
    definitions.save()
    directory = queue_directory(str(tmp_path), "replies")
    os.makedirs(directory)
    mark_deleted(directory, "replies")
    definitions.remove_queue("replies")
    definitions.save()
    unlinks_and_directory_syncs.clear()
    definitions.finish_delete("replies")
    definitions.close()
    assert os.listdir(tmp_path / "queues") == []
    assert unlinks_and_directory_syncs == [
        ("fsync", "queues"),  # the queue's directory gone before its tombstone
        ("unlink", "replies~deleted"),
        ("fsync", "queues"),
    ]


def test_a_tombstone_whose_write_failed_is_removed_and_the_removal_synced(
    tmp_path, monkeypatch, unlinks_and_directory_syncs
):
    """The queue stays: a tombstone a power cut brought back would delete it at boot."""
    directory = queue_directory(str(tmp_path), "replies")
    recorded_fsync = os.fsync

    def refused_once(fd):  # the tombstone's own fsync
        monkeypatch.setattr(os, "fsync", recorded_fsync)
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "fsync", refused_once)
    with pytest.raises(OSError, match="Input/output error"):
        mark_deleted(directory, "replies")
    assert os.listdir(tmp_path / "queues") == []
    assert unlinks_and_directory_syncs == [("unlink", "replies~deleted"), ("fsync", "queues")]

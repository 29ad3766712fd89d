"""The engine's everyday behaviour: references, reads, confirms, cancellation, rollover,
deletion and GC (RabbitMQ's msg_store suite, ported)."""

import os

import pytest

from ..helpers import body, fill, msg_id


def rdq_files(directory) -> list[int]:
    return sorted(int(name[:-4]) for name in os.listdir(directory) if name.endswith(".rdq"))


def test_a_fresh_store_contains_none_of_a_hundred_ids(open_store):
    store = open_store()
    assert not any(store.contains(msg_id(n)) for n in range(100))
    assert store.read(msg_id(0)) is None


def test_references_are_counted_across_two_writers(open_store):
    store = open_store()
    for n in range(1, 101):
        store.write(msg_id(n), body(n), ticket=("A", n))
    for n in range(51, 101):
        store.write(msg_id(n), body(n), ticket=("B", n))
    settled = store.sync()
    assert len(settled.durable) == 150 and settled.ignored == []
    assert all(store.read(msg_id(n)) == body(n) for n in range(1, 101))
    for n in range(1, 101):
        store.remove(msg_id(n))
    store.sync()
    assert not any(store.contains(msg_id(n)) for n in range(1, 51))
    assert all(store.read(msg_id(n)) == body(n) for n in range(51, 101))


def test_a_second_write_of_a_live_id_writes_nothing(open_store, store_dir):
    store = open_store()
    store.write(msg_id(1), body(1))
    store.sync()
    size = os.path.getsize(store_dir / "0.rdq")
    store.write(msg_id(1), b"another body is not stored")
    store.sync()
    assert os.path.getsize(store_dir / "0.rdq") == size
    assert store.read(msg_id(1)) == body(1)


def test_a_writer_reads_its_own_writes_before_any_sync(open_store, store_dir):
    store = open_store()
    for n in range(50):
        store.write(msg_id(n), body(n))
    assert os.path.getsize(store_dir / "0.rdq") == 0
    assert all(store.read(msg_id(n)) == body(n) for n in range(50))


def test_contains_is_false_after_the_last_reference_is_removed(open_store):
    store = open_store()
    store.write(msg_id(1), body(1))
    store.sync()
    assert store.contains(msg_id(1))
    assert store.remove(msg_id(1)) is True
    assert not store.contains(msg_id(1))
    assert store.read(msg_id(1)) is None


def test_removing_an_unknown_id_changes_nothing_and_says_so(open_store):
    store = open_store()
    store.write(msg_id(1), body(1))
    assert store.remove(msg_id(2)) is False
    assert store.contains(msg_id(1))
    assert store.stats()["removes_unknown"] == 1


def test_a_write_removed_before_it_reaches_the_disk_is_ignored_and_never_written(
    open_store, store_dir
):
    store = open_store()
    store.write(msg_id(1), body(1), ticket="kept")
    store.write(msg_id(2), body(2), ticket="cancelled")
    store.remove(msg_id(2))
    settled = store.sync()
    assert settled.durable == ["kept"]
    assert settled.ignored == ["cancelled"]
    assert os.path.getsize(store_dir / "0.rdq") == 125


def test_every_write_is_settled_exactly_once_whatever_the_interleaving(open_store):
    store = open_store()
    # write, remove, write: the first is ignored, the second durable, the message present.
    store.write(msg_id(1), body(1), ticket="w1")
    store.remove(msg_id(1))
    store.write(msg_id(1), body(1), ticket="w2")
    # remove of nothing, then write: durable and present.
    store.remove(msg_id(2))
    store.write(msg_id(2), body(2), ticket="w3")
    # write, remove, then a fan-out write after sync: each settled once.
    store.write(msg_id(3), body(3), ticket="w4")
    store.remove(msg_id(3))
    settled = store.sync()
    store.write(msg_id(2), body(2), ticket="w5")
    settled_later = store.sync()
    assert sorted(settled.durable) == ["w2", "w3"]
    assert settled.ignored == ["w1", "w4"]
    assert settled_later.durable == ["w5"] and settled_later.ignored == []
    assert store.contains(msg_id(1)) and store.contains(msg_id(2))
    assert not store.contains(msg_id(3))


def test_n_back_to_back_write_remove_pairs_write_no_record(open_store, store_dir):
    store = open_store()
    for n in range(1000):
        store.write(msg_id(n), body(n))
        store.remove(msg_id(n))
    settled = store.sync()
    assert len(settled.ignored) == 1000 and settled.durable == []
    assert os.path.getsize(store_dir / "0.rdq") == 0


def test_an_id_reused_after_its_count_reached_zero_gets_a_fresh_record(open_store):
    store = open_store()
    store.write(msg_id(1), b"first body")
    store.sync()
    first = store.location(msg_id(1))
    store.remove(msg_id(1))
    store.write(msg_id(1), b"second body")
    store.sync()
    assert store.read(msg_id(1)) == b"second body"
    assert store.location(msg_id(1)).offset > first.offset


def test_files_roll_over_at_the_size_limit(open_store, store_dir):
    store = open_store(file_size_limit=1000)
    for n in range(20):  # 125 bytes a record: 8 per file
        store.write(msg_id(n), body(n))
    store.sync()
    assert rdq_files(store_dir) == [0, 1, 2]
    assert os.path.getsize(store_dir / "0.rdq") == 1000
    assert store.location(msg_id(8)).file == 1 and store.location(msg_id(8)).offset == 0
    assert all(store.read(msg_id(n)) == body(n) for n in range(20))
    stats = store.stats()
    assert stats["files"][0]["right"] == 1 and stats["files"][1]["left"] == 0
    assert stats["files"][2]["right"] is None


def test_a_non_current_file_is_deleted_once_its_last_message_is_removed(open_store, store_dir):
    store = open_store(file_size_limit=1000, auto_gc=False)
    fill(store, range(20))
    for n in range(8):
        store.remove(msg_id(n))
    assert rdq_files(store_dir) == [1, 2]
    assert store.stats()["files"][1]["left"] is None


def test_the_current_file_is_kept_when_emptied(open_store, store_dir):
    store = open_store(file_size_limit=1000)
    store.write(msg_id(1), body(1))
    store.sync()
    store.remove(msg_id(1))
    store.sync()
    assert rdq_files(store_dir) == [0]


def test_stats_report_sizes_counts_and_counters(open_store):
    store = open_store(file_size_limit=1000, auto_gc=False)
    fill(store, range(20))
    store.remove(msg_id(9))
    store.read(msg_id(10))
    stats = store.stats()
    assert stats["message_count"] == 19
    assert stats["file_count"] == 3
    assert stats["bytes_on_disk"] == 2500
    assert stats["valid_bytes"] == 2375
    assert stats["garbage_fraction"] == 125 / 2500
    assert stats["files"][1] == {
        "valid_total_size": 875,
        "file_size": 1000,
        "left": 0,
        "right": 2,
        "locked": False,
        "removes": 1,
        "readers": 0,
    }
    assert (stats["writes"], stats["reads"], stats["removes"], stats["gc_runs"]) == (20, 1, 1, 0)


@pytest.mark.parametrize("gc", ["compact", "combine"])
def test_a_hundred_files_emptied_in_thirds_with_gc_running_leave_only_the_current_file(
    open_store, store_dir, gc
):
    store = open_store(file_size_limit=8 * 1024, gc=gc)
    count = 100 * 8  # 1 KiB bodies: 7-8 per file, ~110 files
    ids = [msg_id(n) for n in range(count)]
    for n, mid in enumerate(ids):
        store.write(mid, body(n, 1000))
    store.sync()
    assert len(rdq_files(store_dir)) >= 100
    assert all(store.read(mid) == body(n, 1000) for n, mid in enumerate(ids))
    youngest_first = list(reversed(range(count)))
    thirds = [youngest_first[0::3], youngest_first[1::3], youngest_first[2::3]]
    for phase, third in enumerate(thirds):
        for n in third:
            store.remove(ids[n])
        store.sync()
        survivors = set(range(count)) - {n for t in thirds[: phase + 1] for n in t}
        assert all(store.read(ids[n]) == body(n, 1000) for n in survivors)
        if phase == 1:
            assert store.stats()["gc_runs" if gc == "combine" else "gc_compactions"] > 0
            assert store.stats()["garbage_fraction"] <= 0.5
    assert not any(store.contains(mid) for mid in ids)
    assert rdq_files(store_dir) == [store.stats()["current_file"]]


def test_gc_combines_two_adjacent_files_into_the_older_one(open_store, store_dir):
    store = open_store(file_size_limit=1000, auto_gc=False, gc="combine")
    for n in range(40):  # files 0..4 hold 8 records each; 5 is current
        store.write(msg_id(n), body(n))
    store.sync()
    kept = {3, 16}  # one survivor in file 0, one in file 2
    for n in list(range(24)) + list(range(24, 28)):
        if n not in kept:
            store.remove(msg_id(n))
    assert rdq_files(store_dir) == [0, 2, 3, 4, 5]  # file 1 emptied and deleted
    assert store.stats()["garbage_fraction"] > 0.5
    assert store.collect_garbage() == 1
    assert rdq_files(store_dir) == [0, 3, 4, 5]
    assert store.location(msg_id(3)) == (1, 0, 0, 125)
    assert store.location(msg_id(16)) == (1, 0, 125, 125)
    assert all(store.read(msg_id(n)) == body(n) for n in sorted(kept) + list(range(28, 40)))
    stats = store.stats()
    assert stats["files"][0] == {
        "valid_total_size": 250,
        "file_size": 250,
        "left": None,
        "right": 3,
        "locked": False,
        "removes": 7,
        "readers": 0,
    }
    assert stats["gc_runs"] == 1 and stats["garbage_fraction"] <= 0.5


def test_flush_policy_confirms_without_fsync_and_keeps_data_readable(open_store):
    store = open_store(sync_policy="flush")
    store.write(msg_id(1), body(1), ticket=1)
    assert store.sync().durable == [1]
    assert store.read(msg_id(1)) == body(1)

"""The GC's copy-then-switch combine with the store changing underneath: the steps run
separately, as they do when the GC is another process."""

import os

import pytest

from warren.store import MessageStore, rewrite_combine
from warren.store.engine.records import RECORD_OVERHEAD
from warren.store.errors import CorruptRecord

from ..helpers import body, fill, msg_id


@pytest.fixture
def fragmented(open_store):
    """Files 0, 2 and 4 left (8 records of 125 bytes each when written), 5 current, and a
    combine due on files 0 and 2."""
    store = open_store(file_size_limit=1000, auto_gc=False)
    fill(store, range(40))
    for n in range(36):
        if n not in (2, 3, 4, 16, 17, 18):
            store.remove(msg_id(n))
    return store


def expected_valid_bytes(store, numbers) -> dict[int, int]:
    valid: dict[int, int] = {}
    for n in numbers:
        location = store.location(msg_id(n))
        if location is not None:
            valid[location.file] = valid.get(location.file, 0) + location.total_size
    return valid


def test_apply_moves_only_the_entries_that_stayed_in_place_during_the_copy(fragmented, store_dir):
    store = fragmented
    plan = store.plan_combine()
    assert (plan.dst, plan.src) == (0, 2)
    assert [r[0] for r in plan.dst_records] == [msg_id(n) for n in (2, 3, 4)]
    assert [r[0] for r in plan.src_records] == [msg_id(n) for n in (16, 17, 18)]
    assert store.stats()["files"][0]["locked"] and store.stats()["files"][2]["locked"]

    # While the GC copies: a removal, a removal and rewrite with a new body, an extra
    # reference, and new messages.
    store.remove(msg_id(3))
    store.remove(msg_id(17))
    store.write(msg_id(17), b"written again while the GC copied")
    store.write(msg_id(18), body(18))
    store.write(msg_id(100), body(100))
    store.sync()

    result = rewrite_combine(store_dir, plan)
    assert result.file_size == 6 * (100 + RECORD_OVERHEAD)
    store.apply_combine(plan, result)

    assert "2.rdq" not in os.listdir(store_dir)
    assert not store.contains(msg_id(3))
    assert store.read(msg_id(17)) == b"written again while the GC copied"
    assert store.location(msg_id(17)).file == 5
    assert [store.read(msg_id(n)) for n in (2, 4, 16, 18, 100)] == [
        body(n) for n in (2, 4, 16, 18, 100)
    ]
    assert store.location(msg_id(16)).file == 0
    store.remove(msg_id(18))
    assert store.read(msg_id(18)) == body(18)

    live = [2, 4, 16, 17, 18, 100] + list(range(36, 40))
    files = store.stats()["files"]
    expected = expected_valid_bytes(store, live)
    assert {f: s["valid_total_size"] for f, s in files.items() if s["valid_total_size"]} == expected
    assert files[0]["file_size"] == os.path.getsize(store_dir / "0.rdq") == 750
    assert not files[0]["locked"] and files[0]["right"] == 4
    store.close()

    with MessageStore(store_dir, file_size_limit=1000) as clean:
        assert clean.stats()["files"][0]["valid_total_size"] == expected[0]
        assert [clean.read(msg_id(n)) for n in (2, 4, 16)] == [body(n) for n in (2, 4, 16)]
    refs = [(msg_id(n), 1) for n in live]
    dirty = MessageStore(
        store_dir, file_size_limit=1000, clean_clients=[b"someone"], ref_counts=refs
    )
    try:
        assert not dirty.recovered_clean
        assert dirty.read(msg_id(17)) == b"written again while the GC copied"
        assert {
            f: s["valid_total_size"]
            for f, s in dirty.stats()["files"].items()
            if s["valid_total_size"]
        } == expected_valid_bytes(dirty, live)
    finally:
        dirty.close()


def test_a_file_emptied_during_the_copy_is_deleted_when_the_combine_applies(fragmented, store_dir):
    store = fragmented
    plan = store.plan_combine()
    for n in (16, 17, 18):
        store.remove(msg_id(n))
    assert "2.rdq" in os.listdir(store_dir)  # locked: not deleted while copied
    store.apply_combine(plan, rewrite_combine(store_dir, plan))
    assert "2.rdq" not in os.listdir(store_dir)
    assert store.stats()["files"][0]["valid_total_size"] == 375


def test_an_abandoned_combine_unlocks_its_files_and_leaves_no_temporary_file(fragmented, store_dir):
    store = fragmented
    plan = store.plan_combine()
    rewrite_combine(store_dir, plan)
    store.abandon_combine(plan)
    assert "0.rdt" not in os.listdir(store_dir)
    assert not store.stats()["files"][0]["locked"]
    assert all(store.read(msg_id(n)) == body(n) for n in (2, 3, 4, 16, 17, 18))
    assert store.plan_combine() is not None  # planned again later


def test_a_copy_that_finds_a_damaged_record_fails_and_the_store_carries_on(fragmented, store_dir):
    store = fragmented
    plan = store.plan_combine()
    with open(store_dir / "2.rdq", "r+b") as f:
        f.seek(plan.src_records[0][1] + 30)
        f.write(b"\x00" * 8)
        f.seek(plan.src_records[0][1] + plan.src_records[0][2] - 1)
        f.write(b"\x00")
    with pytest.raises(CorruptRecord):
        rewrite_combine(store_dir, plan)
    store.abandon_combine(plan)
    assert store.read(msg_id(2)) == body(2)


def test_only_one_combine_runs_at_a_time(fragmented):
    store = fragmented
    assert store.plan_combine() is not None
    assert store.plan_combine() is None


def test_no_combine_is_planned_below_the_garbage_fraction_or_with_fewer_than_three_files(
    open_store,
):
    store = open_store(file_size_limit=1000, auto_gc=False)
    fill(store, range(10))
    store.remove(msg_id(0))
    assert store.plan_combine() is None  # two files
    fill(store, range(10, 24))
    assert store.plan_combine() is None  # little garbage

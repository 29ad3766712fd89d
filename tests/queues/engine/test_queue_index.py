"""The queue index on its own: bounds, reads, acks, segment deletion and the write
buffer, with 16-entry segments so that every case crosses segment boundaries (RabbitMQ's
queue-index cases of backing_queue_SUITE)."""

import os

import pytest

from warren.queues import Entry, QueueIndex, QueueLocked, UnknownDeliveryTag
from warren.queues.engine.queue_index import HEADER_BYTES, SLOT_BYTES

N = 16


def entry(seq_id, persistent=True, shared=False, size=10, expiry_ms=0):
    return Entry(
        seq_id,
        bytes([seq_id % 256]) * 16,
        shared,
        0 if shared else 64 + seq_id,
        size,
        persistent,
        expiry_ms,
    )


@pytest.fixture
def index_dir(tmp_path):
    return tmp_path / "q"


@pytest.fixture
def open_index(index_dir):
    opened = []

    def _open():
        index = QueueIndex(index_dir, segment_entry_count=N)
        opened.append(index)
        return index

    yield _open
    for index in opened:
        index.abandon()


def segment_files(directory):
    return sorted(name for name in os.listdir(directory) if name.endswith(".qi"))


def reopen_dirty(index, open_index, keep=lambda entries: [True] * len(entries)):
    index.close()
    fresh = open_index()
    return fresh, fresh.recover_dirty(keep)


def test_an_empty_index_has_no_bounds_and_publishes_read_back_in_order(open_index):
    index = open_index()
    assert index.bounds() == (0, 0)
    published = [entry(s, persistent=False) for s in range(N * 3 // 4)]
    for e in published:
        index.publish(e)
    assert index.bounds() == (0, N)
    assert index.read(0, N) == published
    index.sync()
    assert index.read(0, N) == published


def test_transient_entries_are_gone_after_a_dirty_restart(open_index):
    index = open_index()
    for s in range(N * 3 // 4):
        index.publish(entry(s, persistent=False))
    index, found = reopen_dirty(index, open_index, lambda es: [e.persistent for e in es])
    assert found.entries == 0 and index.bounds() == (0, 0) and len(index) == 0


def test_persistent_entries_across_two_segments_survive_a_restart(open_index):
    index = open_index()
    published = [entry(s) for s in range(N * 3 // 4, N * 3 // 2)]
    for e in published:
        index.publish(e)
    assert index.bounds() == (0, 2 * N)
    assert index.read(0, N) == [e for e in published if e.seq_id < N]
    index, found = reopen_dirty(index, open_index)
    assert found.entries == len(published)
    assert sum(e.size for e in index.read(0, 2 * N)) == 10 * len(published)


def test_acking_everything_deletes_every_segment_file(open_index, index_dir):
    index = open_index()
    for s in range(N * 3 // 4, N * 3 // 2):
        index.publish(entry(s))
    index.sync()
    assert segment_files(index_dir) == ["0.qi", "1.qi"]
    index.ack(range(N * 3 // 4, N * 3 // 2))
    index.sync()
    assert segment_files(index_dir) == [] and index.bounds() == (0, 0)
    index, found = reopen_dirty(index, open_index)
    assert found.entries == 0 and index.bounds() == (0, 0)


@pytest.mark.parametrize(
    "steps",
    [
        [("pub", range(0, 5)), ("ack", range(0, 5)), ("pub", range(N, N + 3))],
        [("pub", range(0, 5)), ("pub", range(N, N + 3)), ("ack", range(0, 5))],
        [("pub", range(0, 4 * N + 1)), ("ack", range(0, 4 * N + 1))],
    ],
)
def test_segments_empty_and_refill_in_any_order_without_error(open_index, steps):
    index = open_index()
    live = set()
    for op, seqs in steps:
        for s in seqs:
            if op == "pub":
                index.publish(entry(s))
                live.add(s)
        if op == "ack":
            index.ack(seqs)
            live -= set(seqs)
        index.sync()
    assert [e.seq_id for e in index.read(0, 5 * N)] == sorted(live)


def test_mixed_publishes_and_acks_read_back_only_the_unacked(open_index):
    index = open_index()
    for s in (0, 1, 2, 4, 5, 7):
        index.publish(entry(s))
    index.ack([0])
    index.sync()
    for s in (3, 6, 8):
        index.publish(entry(s))
    index.ack([1, 2, 3])

    def seqs(a, b):
        return [e.seq_id for e in index.read(a, b)]

    assert (seqs(0, 4), seqs(4, 7), seqs(7, 9)) == ([], [4, 5, 6], [7, 8])


def test_mixed_persistent_entries_survive_restarts_after_each_phase(open_index):
    index = open_index()
    for s in (0, 1, 2, 4, 5, 7):
        index.publish(entry(s))
    index.ack([0])
    index, first = reopen_dirty(index, open_index)
    for s in (3, 6, 8):
        index.publish(entry(s))
    index.ack([1, 2, 3])
    index, second = reopen_dirty(index, open_index)
    assert first.entries == second.entries == 5
    assert sum(e.size for e in index.read(0, N)) == 50


def test_every_property_of_an_entry_reads_back_unchanged(open_index):
    index = open_index()
    shared = Entry(3, b"\x07" * 16, True, 0, 123456, True, 12345)
    in_store = Entry(4, b"\x08" * 16, False, 9876, 10, False, 0)
    index.publish(shared)
    index.publish(in_store)
    assert index.read(0, N) == [shared, in_store]
    index.sync()
    index, _ = reopen_dirty(index, open_index)
    assert index.read(0, N) == [shared, in_store]


def test_a_segment_file_goes_exactly_when_its_last_entry_is_acked(open_index, index_dir):
    index = open_index()
    for s in range(N):
        index.publish(entry(s))
    index.sync()
    assert index.ack(range(N)) == [0] and "0.qi" not in segment_files(index_dir)
    for s in range(N // 2 + 1):
        index.publish(entry(s + N))
    assert index.ack(range(N, N + N // 2 + 1)) == [1]
    holes = list(range(2 * N, 2 * N + N // 2 + 1)) + list(range(2 * N + N // 2 + 3, 3 * N))
    for s in holes:
        index.publish(entry(s))
    index.sync()
    assert index.ack(holes[: N // 2 + 1]) == [] and "2.qi" in segment_files(index_dir)
    assert index.ack(holes[N // 2 + 1 :]) == [2] and "2.qi" not in segment_files(index_dir)


def test_an_entry_published_and_acked_before_a_flush_is_never_written(
    open_index, index_dir, monkeypatch
):
    index = open_index()
    index.publish(entry(0))
    index.publish(entry(1))
    index.sync()
    written: list[tuple[int, int]] = []  # (offset, length) of each write after
    pwrite, pwritev = os.pwrite, os.pwritev

    def noting_pwrite(fd: int, data: bytes, offset: int) -> int:
        written.append((offset, len(data)))
        return pwrite(fd, data, offset)

    def noting_pwritev(fd: int, buffers: list[bytes], offset: int) -> int:
        written.append((offset, sum(map(len, buffers))))
        return pwritev(fd, buffers, offset)

    monkeypatch.setattr(os, "pwrite", noting_pwrite)
    monkeypatch.setattr(os, "pwritev", noting_pwritev)
    index.publish(entry(2))
    index.ack([2])
    index.sync()
    slot_2 = HEADER_BYTES + 2 * SLOT_BYTES
    assert not [w for w in written if w[0] < slot_2 + SLOT_BYTES and w[0] + w[1] > slot_2]
    assert index.read(0, N) == [entry(0), entry(1)]
    assert index.ack([0, 1]) == [0] and segment_files(index_dir) == []


def test_a_short_write_of_slots_raises_and_the_next_sync_writes_them(open_index, monkeypatch):
    index = open_index()
    for seq_id in range(3):
        index.publish(entry(seq_id))
    pwritev = os.pwritev

    def short_once(fd: int, buffers: list[bytes], offset: int) -> int:
        monkeypatch.setattr(os, "pwritev", pwritev)
        return pwritev(fd, buffers[:1], offset)  # the disk filled after the first slot

    monkeypatch.setattr(os, "pwritev", short_once)
    with pytest.raises(OSError, match="short write"):
        index.sync()  # before any fdatasync: nothing of it is durable yet
    index.sync()
    index, _ = reopen_dirty(index, open_index)  # what is on disk
    assert index.read(0, N) == [entry(0), entry(1), entry(2)]


def test_a_second_index_on_the_same_directory_is_refused(open_index, held_lock_refused_at_once):
    open_index()
    with pytest.raises(QueueLocked):
        open_index()


def test_acking_a_seq_id_the_index_does_not_hold_is_refused(open_index):
    index = open_index()
    index.publish(entry(0))
    with pytest.raises(UnknownDeliveryTag, match="seq id 40"):
        index.ack([40])


def test_reopening_with_another_segment_size_is_refused_and_deletes_nothing(index_dir):
    index = QueueIndex(index_dir, segment_entry_count=N)
    index.publish(entry(0))
    index.close()
    with pytest.raises(ValueError, match="segment_entry_count=16"):
        QueueIndex(index_dir, segment_entry_count=32)
    assert segment_files(index_dir) == ["0.qi"]


def test_another_segment_size_is_refused_even_when_the_first_segments_header_is_damaged(
    index_dir,
):
    index = QueueIndex(index_dir, segment_entry_count=N)
    for seq_id in range(2 * N):
        index.publish(entry(seq_id))
    index.close()
    first = index_dir / "0.qi"
    first.write_bytes(b"JUNK" + first.read_bytes()[4:])
    with pytest.raises(ValueError, match="segment_entry_count=16"):
        QueueIndex(index_dir, segment_entry_count=32)
    assert segment_files(index_dir) == ["0.qi", "1.qi"], "nothing was deleted"


def test_reopening_the_same_directory_many_times_keeps_its_path(index_dir):
    for _ in range(100):
        index = QueueIndex(index_dir, segment_entry_count=N)
        assert index.directory == str(index_dir)
        index.close()


def test_the_default_segment_holds_2048_entries(tmp_path):
    index = QueueIndex(tmp_path / "q")
    index.publish(entry(2047))
    index.publish(entry(2048))
    assert index.bounds() == (0, 4096)
    index.close()


@pytest.mark.parametrize("damage", ["truncated", "zero_filled", "corrupt_header", "torn_slot"])
def test_a_damaged_segment_is_dropped_or_repaired_and_recovery_finishes(
    open_index, index_dir, damage
):
    index = open_index()
    for s in range(2 * N):
        index.publish(entry(s))
    index.close()
    path = index_dir / "0.qi"
    data = bytearray(path.read_bytes())
    if damage == "truncated":
        data = data[: HEADER_BYTES + 5 * SLOT_BYTES + 7]
    elif damage == "zero_filled":
        data[HEADER_BYTES:] = bytes(len(data) - HEADER_BYTES)
    elif damage == "corrupt_header":
        data[0:4] = b"JUNK"
    else:
        data[HEADER_BYTES + 3 * SLOT_BYTES + 10] ^= 0xFF
    path.write_bytes(bytes(data))
    index = open_index()
    found = index.recover_dirty(lambda es: [True] * len(es))
    survivors = [e.seq_id for e in index.read(0, 2 * N)]
    expected_first = {
        "truncated": list(range(5)),
        "zero_filled": [],
        "corrupt_header": [],
        "torn_slot": [s for s in range(N) if s != 3],
    }
    assert survivors == expected_first[damage] + list(range(N, 2 * N))
    assert found.entries == len(survivors)
    assert (found.torn, found.bad_segments) == {
        "torn_slot": (1, 0),
        "corrupt_header": (0, 1),
        "truncated": (1, 0),
    }.get(damage, (0, 0))  # the slot cut short is counted

"""The variable queue: confirms, fetch and ack, requeue order, TTL, purge, paging between
RAM and disk, lazy mode, and restarts (RabbitMQ's variable-queue cases of
backing_queue_SUITE, with 16-entry segments)."""

import collections
import errno
import gc
import json
import math
import os
import time
import tracemalloc

import pytest

from warren.queues import (
    CorruptMessage,
    InvalidMessage,
    Message,
    MessageTooLarge,
    UnknownDeliveryTag,
    decode,
    encode,
)
from warren.queues.engine import segments
from warren.queues.engine.queue_index import QueueIndex, records_at
from warren.queues.engine.variable_queue import (
    WRITE_AT_ONCE_BYTES,
    WRITE_BATCH,
    collect_only_the_young_automatically,
    collector_is_generational,
)

from ..helpers import (
    N,
    assert_counts_add_up,
    drain,
    fail_the_next_fdatasync,
    message,
    number,
)

SIZES = [10, 5000]  # below and above embed_msgs_below (4096)


def test_a_persistent_message_is_confirmed_once_by_the_sync_that_makes_it_durable(open_queue):
    queue = open_queue()
    seqs = [queue.publish(message(n, size=SIZES[n % 2])) for n in range(3 * N)]
    assert queue.needs_sync()
    assert queue.sync() == seqs
    assert queue.sync() == [] and not queue.needs_sync()


def test_confirms_come_from_the_store_actor_as_from_the_engine(open_queue, stores):
    queue = open_queue()
    seqs = [queue.publish(message(n, size=SIZES[n % 2])) for n in range(200)]
    confirmed = queue.sync(wait=False)
    confirmed += queue.sync(wait=True)
    assert sorted(confirmed) == seqs and len(set(confirmed)) == len(seqs)
    assert [number(d) for d in drain(queue)] == list(range(200))


def test_transient_messages_are_confirmed_at_the_first_sync(open_queue):
    queue = open_queue()
    seqs = [queue.publish(message(n, persistent=False)) for n in range(5)]
    assert queue.sync() == seqs


def test_a_message_fetched_without_ack_is_gone_and_with_ack_awaits_it(open_queue):
    queue = open_queue()
    for n in range(3):
        queue.publish(message(n))
    gone = queue.fetch(ack_required=False)
    kept = queue.fetch(ack_required=True)
    assert (len(queue), queue.depth) == (1, 2)
    queue.ack([kept.seq_id])
    assert (number(gone), number(kept), len(queue), queue.depth) == (0, 1, 1, 1)


@pytest.mark.parametrize("lazy", [False, True])
def test_a_fetch_below_a_seq_id_leaves_the_head_from_there_in_place(open_queue, lazy):
    """What a queue process asks while a deduplicated message waits for its producer
    record: the messages before it, and none from it on, in RAM or paged out alike."""
    queue = open_queue(lazy=lazy)
    seqs = [queue.publish(message(n)) for n in range(3 * N)]
    held = seqs[N + 1]
    before = [queue.fetch_encoded(True, held) for _ in range(N + 1)]
    assert [f.seq_id for f in before] == seqs[: N + 1]
    assert queue.fetch_encoded(True, held) is None
    assert queue.fetch_encoded(False, held) is None
    assert (len(queue), queue.peek().seq_id) == (2 * N - 1, held)
    assert [number(d) for d in drain(queue)] == list(range(N + 1, 3 * N))


def test_acks_and_requeues_of_tags_not_awaiting_one_are_refused_and_change_nothing(open_queue):
    queue = open_queue()
    for n in range(3):
        queue.publish(message(n))
    first = queue.fetch()
    with pytest.raises(UnknownDeliveryTag, match="never fetched"):
        queue.requeue([2])
    with pytest.raises(UnknownDeliveryTag):
        queue.ack([first.seq_id, 99])
    queue.ack([first.seq_id])
    with pytest.raises(UnknownDeliveryTag, match="already acked"):
        queue.ack([first.seq_id])
    assert (len(queue), queue.depth) == (2, 2)


def test_requeued_messages_come_back_first_in_seq_order_flagged_with_their_count(open_queue):
    queue = open_queue()
    for n in range(5 * N):
        queue.publish(message(n, size=SIZES[n % 2]))
    fetched = [queue.fetch() for _ in range(3 * N)]
    queue.requeue([d.seq_id for d in fetched[N : 2 * N][::-1]])  # a subset, backwards
    for d in fetched[2 * N : 3 * N]:
        queue.requeue([d.seq_id])  # one by one
    queue.requeue([d.seq_id for d in fetched[: N // 2]])  # in halves
    queue.requeue([d.seq_id for d in fetched[N // 2 : N]])
    for n in range(5 * N, 5 * N + 5):
        queue.publish(message(n))
    again = drain(queue)
    assert [number(d) for d in again] == list(range(5 * N + 5))
    assert [d.redelivered for d in again] == [True] * 3 * N + [False] * (2 * N + 5)
    assert all(d.delivery_count == 1 for d in again[: 3 * N])
    assert len(queue) == queue.depth == 0


def test_a_message_requeued_twice_counts_two_deliveries(open_queue):
    queue = open_queue()
    queue.publish(message(0))
    for _ in range(2):
        queue.requeue([queue.fetch().seq_id])
    assert queue.fetch().delivery_count == 2


def test_a_message_put_back_undelivered_is_not_flagged_redelivered(open_queue):
    # a dead letter the exchange could not take now: the queue took it out itself, and
    # its consumer, when it gets it, gets it as never delivered
    queue = open_queue()
    queue.publish(message(0))
    queue.requeue([queue.fetch().seq_id], delivered=False)
    assert queue.fetch().delivery_count == 0


def test_drop_and_fetch_while_a_predicate_holds_stop_at_the_first_it_refuses(open_queue):
    queue = open_queue()
    for n in range(1, 11):
        queue.publish(message(n), expiry_ms=n)
    first = [queue.fetch() for _ in range(5)]
    queue.requeue([d.seq_id for d in first])
    refused = queue.drop_while(lambda info: info.expiry_ms <= 5)
    assert refused.expiry_ms == 6 and len(queue) == 5
    expired = queue.fetch_while(lambda info: info.expiry_ms <= 7)
    assert [number(d) for d in expired] == [6, 7]
    assert [number(d) for d in drain(queue)] == [8, 9, 10]
    assert queue.drop_while(lambda info: True) is None


def test_drop_while_then_a_clean_restart_keeps_the_rest(open_queue):
    queue = open_queue()
    for n in range(2000):
        queue.publish(message(n), expiry_ms=n)
    queue.drop_while(lambda info: info.expiry_ms < 5)
    queue.terminate()
    queue = open_queue()
    assert queue.recovered_clean and len(queue) == 1995
    assert [number(d) for d in drain(queue)] == list(range(5, 2000))


def test_a_restart_with_a_huge_next_seq_id_and_no_data_is_fast_and_empty(open_queue, tmp_path):
    open_queue().terminate()
    terms_path = tmp_path / "queues" / "q" / "recovery.json"
    terms = json.loads(terms_path.read_text())
    terms["next_seq_id"] = 10**11
    terms_path.write_text(json.dumps(terms))
    started = time.monotonic()
    queue = open_queue()
    assert time.monotonic() - started < 10  # no walk of the 10**11 sequence ids: hours
    assert len(queue) == 0 and queue.fetch() is None
    assert queue.publish(message(0)) == 10**11


def test_purge_drops_the_waiting_messages_and_leaves_those_awaiting_acks(open_queue):
    queue = open_queue()
    for n in range(10):
        queue.publish(message(n))
    fetched = [queue.fetch() for _ in range(6)]
    assert queue.purge() == 4
    assert (len(queue), queue.depth) == (0, 6)
    queue.requeue([d.seq_id for d in fetched[:2]])
    assert (len(queue), queue.depth) == (2, 6)
    queue.ack([d.seq_id for d in fetched[2:]])
    assert (len(queue), queue.depth) == (2, 2)


def test_a_purge_reaches_messages_paged_out_to_delta(open_queue, engine_stores):
    queue = open_queue(io_batch_size=1)
    for n in range(5 * N):
        queue.publish(message(n, size=SIZES[n % 2]))
    queue.set_ram_duration_target(0)
    while queue.reduce_memory_use():
        pass
    assert queue.stats()["delta"] > 0
    assert queue.purge() == 5 * N and len(queue) == 0
    queue.sync()
    assert engine_stores.persistent.stats()["message_count"] == 0
    assert not [f for f in os.listdir(queue.directory) if f.endswith((".qi", ".qs"))]


def test_deleting_a_queue_of_large_messages_frees_them_in_the_shared_store(
    open_queue, engine_stores
):
    queue = open_queue()
    for n in range(30):
        queue.publish(message(n, size=2**20))
    queue.sync()
    queue.fetch()
    directory = queue.directory
    queue.delete()
    assert not os.path.exists(directory)
    assert engine_stores.persistent.stats()["message_count"] == 0


def test_small_messages_stay_in_the_queues_files_and_large_ones_go_to_the_shared_store(
    open_queue, engine_stores
):
    queue = open_queue(embed_msgs_below=100)
    queue.publish(message(0, size=50))
    queue.sync()
    assert engine_stores.persistent.stats()["message_count"] == 0
    # its record follows the segment's slots in the queue's own file
    assert os.path.getsize(os.path.join(queue.directory, "0.qi")) > records_at(N)
    queue.publish(message(1, size=150))
    queue.sync()
    assert engine_stores.persistent.stats()["message_count"] == 1


def test_a_message_over_the_maximum_size_is_refused_and_nothing_is_stored(open_queue):
    queue = open_queue(max_message_bytes=1000)
    with pytest.raises(MessageTooLarge, match="above this queue's maximum of 1000"):
        queue.publish(message(0, size=2000))
    with pytest.raises(InvalidMessage, match="headers"):
        queue.publish(Message(b"x", headers={"k": object()}))
    assert len(queue) == 0 and queue.sync() == [] and queue.next_seq_id == 0


def test_a_record_failing_its_crc_is_never_delivered_and_the_queue_goes_on(open_queue):
    queue = open_queue()
    for n in range(3):
        queue.publish(message(n, size=100))
    queue.set_ram_duration_target(0)  # bodies only on disk now
    queue.sync()
    path = os.path.join(queue.directory, "0.qi")
    with open(path, "r+b") as file:
        file.seek(records_at(N) + 8 + 20)
        byte = file.read(1)
        file.seek(records_at(N) + 8 + 20)
        file.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(CorruptMessage, match="seq id 0"):
        queue.fetch()
    assert [number(d) for d in drain(queue)] == [1, 2]
    assert queue.counters["corrupt_on_read"] == 1


def test_at_a_ram_target_of_zero_one_segment_stays_in_q3_and_the_rest_in_delta(open_queue):
    queue = open_queue(io_batch_size=4)
    for n in range(N * 3 // 2):
        queue.publish(message(n, persistent=n % 2 == 0))
    queue.set_ram_duration_target(0)
    while queue.reduce_memory_use():
        pass
    stats = assert_counts_add_up(queue)
    assert (stats["q3"], stats["alpha"], stats["ram_bytes"]) == (N, 0, 0)
    assert (queue.delta.start, queue.delta.count, queue.delta.end) == (N, N // 2, N * 3 // 2)
    assert [number(d) for d in drain(queue)] == list(range(N * 3 // 2))


def test_a_queue_churning_under_changing_ram_targets_drains_completely(open_queue):
    clock = [0.0]
    queue = open_queue(io_batch_size=4, page_batch=50, clock=lambda: clock[0])
    published = consumed = 0
    for target in (0.25, 0, 0.25, math.inf, 0, math.inf):
        for _ in range(3):
            for _ in range(40):
                queue.publish(
                    message(published, size=SIZES[published % 2], persistent=published % 3 != 0)
                )
                published += 1
            for _ in range(25):
                delivery = queue.fetch()
                if delivery is not None:
                    assert number(delivery) == consumed
                    consumed += 1
                    queue.ack([delivery.seq_id])
            clock[0] += 1.0
            queue.update_rates()
            queue.set_ram_duration_target(target)
            assert_counts_add_up(queue)
    assert [number(d) for d in drain(queue)] == list(range(consumed, published))
    assert len(queue) == queue.depth == 0


def test_a_lazy_queue_keeps_nothing_in_ram_and_switches_modes_while_in_use(open_queue):
    queue = open_queue(lazy=True)
    for n in range(2 * N):
        queue.publish(message(n, size=SIZES[n % 2], persistent=n % 3 != 0))
    stats = assert_counts_add_up(queue)
    assert (stats["delta"], stats["ram_bytes"], stats["mode"]) == (2 * N, 0, "lazy")
    first = [queue.fetch() for _ in range(3)]
    queue.set_lazy(False)
    for n in range(2 * N, 3 * N):
        queue.publish(message(n))
    queue.requeue([d.seq_id for d in first])
    queue.set_lazy(True)
    assert assert_counts_add_up(queue)["alpha"] == 0
    queue.set_lazy(False)
    assert [number(d) for d in drain(queue)] == list(range(3 * N))


def test_a_lazy_queue_requeues_without_reading_bodies_back_into_ram(open_queue):
    """RabbitMQ's requeue/2 for lazy queues: a requeued message goes back to q3 or delta,
    its body left on disk; the order and the redelivered flags are those of any queue."""
    queue = open_queue(lazy=True)
    for n in range(200):
        queue.publish(message(n, size=2000))
    fetched = [queue.fetch() for _ in range(200)]
    queue.requeue([d.seq_id for d in fetched])
    stats = assert_counts_add_up(queue)
    assert (stats["q4"], stats["alpha"], stats["ram_bytes"]) == (0, 0, 0)
    again = drain(queue)
    assert [number(d) for d in again] == list(range(200))
    assert all(d.redelivered and d.delivery_count == 1 for d in again)


def test_counts_of_every_state_add_up_to_the_length_while_paging(open_queue):
    queue = open_queue(io_batch_size=2, page_batch=7)
    for n in range(4 * N):
        queue.publish(message(n, size=SIZES[n % 2], persistent=n % 2 == 0))
    queue.set_ram_duration_target(0)
    seen = set()
    while True:
        stats = assert_counts_add_up(queue)
        seen |= {state for state in ("alpha", "beta", "gamma", "delta") if stats[state]}
        if not queue.reduce_memory_use():
            break
    assert seen == {"alpha", "beta", "gamma", "delta"}


def test_stats_of_a_deep_queue_cost_no_more_memory_than_of_a_shallow_one(open_queue):
    """Each scrape of a busy queue asks for its stats: they must not walk its statuses (a
    walk of a million cost the queue most of its publish rate). What a call allocates
    says whether it walks, where its time would depend on the machine."""
    queue = open_queue(page_batch=5000)

    def stats_allocate() -> int:
        tracemalloc.start()
        try:
            queue.stats()
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    queue.publish(message(0))
    shallow = stats_allocate()
    queue.publish_many([encode(message(n, size=100)) for n in range(1, 30_000)])
    fetched = [queue.fetch() for _ in range(2000)]
    queue.update_rates()
    queue.set_ram_duration_target(0)  # a first batch of pending acks and alphas paged
    stats = queue.stats()
    assert stats["beta"] + stats["gamma"] > 0 and stats["pending_acks_disk"] == len(fetched)
    assert stats_allocate() < shallow + 4096


def test_a_clean_restart_reads_no_index_and_brings_unacked_messages_back_redelivered(
    open_queue, stores
):
    queue = open_queue()
    for n in range(3 * N):
        queue.publish(message(n, size=SIZES[n % 2], persistent=n % 4 != 0))
    queue.sync()
    fetched = [queue.fetch() for _ in range(5)]
    queue.ack([fetched[0].seq_id])
    queue.terminate()
    queue = open_queue()
    assert queue.recovered_clean and queue.stats()["delta"] == len(queue)
    again = drain(queue)
    survivors = [n for n in range(1, 3 * N) if n % 4 != 0]
    assert [number(d) for d in again] == survivors
    assert [d.delivery_count for d in again[:3]] == [1, 1, 1]  # 1, 2, 3 were fetched
    assert not any(d.redelivered for d in again[3:])


def test_a_dirty_restart_drops_transients_and_flags_every_survivor_redelivered(open_queue):
    queue = open_queue()
    for n in range(2 * N):
        queue.publish(message(n))
        queue.publish(message(2 * N + n, persistent=False))
    queue.sync()
    drain(queue, ack=False)
    queue.abandon()
    queue = open_queue()
    assert not queue.recovered_clean and len(queue) == 2 * N
    again = drain(queue)
    assert [number(d) for d in again] == list(range(2 * N))
    assert all(d.redelivered for d in again)


def test_an_index_entry_whose_record_never_reached_the_store_is_dropped_at_restart(open_queue):
    # A segment's slots and records are flushed by one fdatasync: a power cut before it
    # ends may leave the page of an entry on disk and not its record's. That message was
    # never confirmed; it must not come back.
    queue = open_queue()
    for n in range(3):
        queue.publish(message(n, size=100))
    assert len(queue.sync()) == 3
    store = os.path.join(queue.directory, "0.qi")
    landed = os.path.getsize(store)
    queue.publish(message(3, size=100))
    queue.sync()
    queue.abandon()
    os.truncate(store, landed + 30)  # the fourth record only began to land
    queue = open_queue()
    assert not queue.recovered_clean and len(queue) == 3
    assert queue.counters["dropped_corrupt"] == 1
    assert [number(d) for d in drain(queue)] == [0, 1, 2]


def test_requeued_transients_are_gone_after_a_dirty_restart(open_queue):
    queue = open_queue()
    for n in range(4):
        queue.publish(message(n, persistent=False))
    queue.requeue([queue.fetch().seq_id, queue.fetch().seq_id])
    queue.sync()
    queue.abandon()
    assert len(open_queue()) == 0


def test_a_non_durable_queue_keeps_nothing_across_a_restart(open_queue):
    queue = open_queue(durable=False)
    for n in range(N):
        queue.publish(message(n, size=SIZES[n % 2]))
    assert queue.sync() == list(range(N))
    queue.terminate()
    assert len(open_queue(durable=False)) == 0


def test_paged_transient_messages_go_to_the_transient_store_and_leave_it_when_acked(
    open_queue, engine_stores
):
    queue = open_queue(io_batch_size=1)
    for n in range(2 * N):
        queue.publish(message(n, size=5000, persistent=False))
    queue.set_ram_duration_target(0)
    while queue.reduce_memory_use():
        pass
    assert engine_stores.transient.stats()["message_count"] == 2 * N
    assert engine_stores.persistent.stats()["message_count"] == 0
    drain(queue)
    assert engine_stores.transient.stats()["message_count"] == 0


def _a_batch_written_at_once() -> list[bytes]:
    """40 messages of 1,000 bytes: a producer's frame, more than ``WRITE_AT_ONCE_BYTES``,
    over three of the tests' 16-entry segments."""
    batch = [encode(message(n, size=1000)) for n in range(40)]
    assert sum(map(len, batch)) >= WRITE_AT_ONCE_BYTES
    return batch


def _files_hold(directory, body: bytes) -> bool:
    return any(body in path.read_bytes() for path in directory.glob("*.qi"))


@pytest.mark.parametrize("lazy", [False, True], ids=["default", "lazy"])
def test_a_large_batch_is_written_and_on_its_way_to_the_disk_before_its_sync(
    open_queue, tmp_path, monkeypatch, lazy
):
    started_on: list[int] = []
    start = segments._start_file_writeback
    if start is None:
        pytest.skip("this kernel has no sync_file_range: nothing is started before a sync")

    def noting(fd: int) -> object:
        started_on.append(fd)
        return start(fd)

    monkeypatch.setattr(segments, "_start_file_writeback", noting)
    queue = open_queue(lazy=lazy)
    small = encode(message(100, size=1000))
    batch = _a_batch_written_at_once()
    queue.publish_many([small], sync_follows=True)  # below the threshold
    queue.publish_many(batch)  # no sync next: the batch waits for it as the small one does
    assert not started_on
    assert not any(_files_hold(tmp_path / "queues" / "q", body) for body in [small, *batch])
    queue.sync()
    queue.publish_many([small], sync_follows=True)
    assert list(queue.publish_many(batch, sync_follows=True)) == list(range(42, 82))
    assert len(set(started_on)) == len(started_on) == 4  # seq ids 41 to 81: segments 2 to 5
    assert all(_files_hold(tmp_path / "queues" / "q", body) for body in [small, *batch])
    assert queue.needs_sync()  # nothing confirmed before the fdatasync
    assert queue.sync() == list(range(41, 82))
    numbers = [100, *range(40)] * 2
    queue.set_ram_duration_target(0)  # read back from where their statuses say they are
    assert [number(d) for d in drain(queue, ack=False)] == numbers
    queue.abandon()  # a crash after the confirm: unacked, they come back
    assert [number(d) for d in drain(open_queue())] == numbers


@pytest.mark.parametrize("lazy", [False, True], ids=["default", "lazy"])
@pytest.mark.parametrize("failure", ["records: no space", "records: short write", "entries"])
def test_a_full_disk_under_a_batch_written_at_once_loses_nothing(
    open_queue, monkeypatch, failure, lazy
):
    queue = open_queue(lazy=lazy)
    earlier = [encode(message(n, size=1000)) for n in range(100, 105)]
    queue.publish_many(earlier)  # waits for the sync, unwritten
    pwritev, publish_slots = os.pwritev, QueueIndex.publish_slots

    def records_once(fd: int, buffers: list[bytes], offset: int) -> int:
        monkeypatch.setattr(os, "pwritev", pwritev)
        if failure == "records: no space":
            raise OSError(errno.ENOSPC, "No space left on device")
        return pwritev(fd, buffers[: len(buffers) // 2], offset)  # the rest did not fit

    def entries_once(index: QueueIndex, first: int, slots: list[bytes]) -> None:
        monkeypatch.setattr(QueueIndex, "publish_slots", publish_slots)
        raise OSError(errno.ENOSPC, "No space left on device")  # its buffer's flush

    if failure == "entries":  # the store and the index do not take the batch
        monkeypatch.setattr(QueueIndex, "publish_slots", entries_once)
    else:  # they take it, and the write of the records fails
        monkeypatch.setattr(os, "pwritev", records_once)
    batch = _a_batch_written_at_once()
    assert list(queue.publish_many(batch, sync_follows=True)) == list(range(5, 45))
    assert len(queue) == 45
    assert queue.sync() == list(range(45))  # room again: written whole, then confirmed
    bodies = [decode(payload).body for payload in earlier + batch]
    queue.set_ram_duration_target(0)  # read back from where their statuses say they are
    assert [d.message.body for d in drain(queue, ack=False)] == bodies
    queue.abandon()  # a crash: unacked, they come back
    assert [d.message.body for d in drain(open_queue())] == bodies


@pytest.mark.parametrize("lazy", [False, True], ids=["default", "lazy"])
@pytest.mark.parametrize("path", ["written at once", "a full batch"])
def test_a_disk_that_stays_full_fails_every_sync_and_a_publish_none(
    open_queue, monkeypatch, lazy, path
):
    queue = open_queue(lazy=lazy)
    if path == "written at once":
        earlier, batch = [], _a_batch_written_at_once()
    else:  # the second batch's hand-over writes out the first's slots
        earlier = [encode(message(n, size=10)) for n in range(WRITE_BATCH)]
        batch = [encode(message(n, size=10)) for n in range(WRITE_BATCH, 2 * WRITE_BATCH)]
    queue.publish_many(earlier)
    pwritev = os.pwritev

    def no_space(fd: int, buffers: list[bytes], offset: int) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwritev", no_space)
    published = queue.publish_many(batch, sync_follows=path == "written at once")
    assert list(published) == list(range(len(earlier), len(earlier) + len(batch)))
    for _ in range(2):
        with pytest.raises(OSError, match="No space"):
            queue.sync()
        assert queue.needs_sync()  # nothing confirmed
    monkeypatch.setattr(os, "pwritev", pwritev)
    assert queue.sync() == list(range(len(earlier) + len(batch)))
    bodies = [decode(payload).body for payload in earlier + batch]
    queue.set_ram_duration_target(0)  # read back from where their statuses say they are
    assert [d.message.body for d in drain(queue, ack=False)] == bodies
    queue.abandon()  # a crash: unacked, they come back
    assert [d.message.body for d in drain(open_queue())] == bodies


def _a_queue_whose_fdatasync_failed(open_queue, monkeypatch):
    """A queue holding messages 0 to 2, whose sync of them failed at its fdatasync."""
    queue = open_queue()
    queue.publish_many([encode(message(n)) for n in range(3)])
    fail_the_next_fdatasync(monkeypatch)
    with pytest.raises(OSError, match="Input/output error"):
        queue.sync()
    return queue


def test_after_a_failed_fdatasync_no_sync_succeeds_until_the_queue_is_reopened(
    open_queue, monkeypatch
):
    queue = _a_queue_whose_fdatasync_failed(open_queue, monkeypatch)
    # The kernel may have dropped the pages it could not write: a second fdatasync
    # succeeding would prove nothing.
    with pytest.raises(OSError, match="earlier fdatasync"):
        queue.sync()
    assert queue.needs_sync()
    with pytest.raises(OSError, match="earlier fdatasync"):
        queue.terminate()  # no clean stop: released as a crash would, no recovery terms
    reopened = open_queue()  # recovers from what is on disk (here: all of it)
    assert [number(d) for d in drain(reopened)] == [0, 1, 2]
    assert reopened.sync() == []


def test_a_queue_whose_fdatasync_failed_can_still_be_deleted(open_queue, tmp_path, monkeypatch):
    _a_queue_whose_fdatasync_failed(open_queue, monkeypatch).delete()
    assert not (tmp_path / "queues" / "q").exists()


def test_a_batch_with_a_message_over_the_maximum_publishes_nothing(open_queue):
    queue = open_queue(max_message_bytes=1000)
    small = encode(message(0))
    with pytest.raises(MessageTooLarge, match="nothing was published"):
        queue.publish_many([small, encode(message(1, size=2000))])
    assert len(queue) == 0 and queue.next_seq_id == 0
    assert list(queue.publish_many([small] * 3)) == [0, 1, 2]
    assert queue.sync() == [0, 1, 2]


def test_a_lazy_queue_delivers_a_large_message_its_store_client_has_not_sent_yet(
    open_queue, stores
):
    queue = open_queue(lazy=True)
    queue.publish(message(0, size=6000))  # batched in the client, not sent
    delivery = queue.fetch()
    assert number(delivery) == 0 and len(delivery.message.body) == 6000
    queue.ack([delivery.seq_id])
    assert queue.counters["missing_on_read"] == 0


def test_a_body_flipped_in_the_shared_store_is_never_delivered_and_the_queue_goes_on(
    open_queue, stores
):
    queue = open_queue()
    for n in range(3):
        queue.publish(message(n, size=6000))  # above 4 KiB: in the shared store
    queue.set_ram_duration_target(0)  # bodies only on disk now
    queue.sync()
    store = os.path.join(
        stores.root if stores.kind == "engine" else os.path.join(stores.node.data_dir),
        "msg_store_persistent",
    )
    path = os.path.join(store, "0.rdq")
    with open(path, "r+b") as file:
        data = file.read()
        at = data.index(b"1:xxxx") + 3000  # the middle of message 1's body
        file.seek(at)
        file.write(bytes([data[at] ^ 0x01]))
    assert number(queue.fetch()) == 0
    with pytest.raises(CorruptMessage, match="seq id 1 in the shared store"):
        queue.fetch()
    assert [number(d) for d in drain(queue)] == [2]
    assert queue.counters["corrupt_on_read"] == 1


def _collections_while_growing(open_queue) -> collections.Counter[int]:
    """How many collections of each generation the collector ran on its own while a queue
    grew to 200,000 messages in RAM."""
    started: collections.Counter[int] = collections.Counter()

    def note(phase: str, info: dict) -> None:
        if phase == "start":
            started[info["generation"]] += 1

    gc.collect()  # every object older than the queue is in the oldest generation now
    gc.callbacks.append(note)
    try:
        queue = open_queue(segment_entry_count=4096)
        body = encode(Message(b"x" * 20))
        for _ in range(200):
            queue.publish_many([body] * 1000)
        queue.sync()
        assert queue.stats()["q4"] + queue.stats()["q1"] == 200_000  # all alphas, in RAM
        queue.delete()
    finally:
        gc.callbacks.remove(note)
    return started


def test_a_process_holding_a_long_queue_can_leave_automatic_collections_to_the_young(
    open_queue,
):
    if not collector_is_generational():
        pytest.skip("this Python collects its old generation incrementally: left as it is")
    by_default = _collections_while_growing(open_queue)
    # Python's own setting walks the statuses in collections of the older generations
    # (both with 3.11's thresholds, the middle one with 3.13's larger young threshold)
    assert by_default[1] + by_default[2] > 0
    before = collect_only_the_young_automatically()
    try:
        assert gc.get_threshold()[0] == before[0]  # the youngest generation runs as before
        leaving_the_old = _collections_while_growing(open_queue)
        assert leaving_the_old[0] > 0
        assert leaving_the_old[1] == leaving_the_old[2] == 0
    finally:
        gc.set_threshold(*before)


def test_an_incremental_collector_is_left_as_it_is(monkeypatch):
    # CPython 3.14.0 to 3.14.4: a young threshold, the old generation's scan rate, and 0
    set_to: list[tuple[int, ...]] = []
    monkeypatch.setattr(gc, "get_threshold", lambda: (2000, 10, 0))
    monkeypatch.setattr(gc, "set_threshold", lambda *thresholds: set_to.append(thresholds))
    assert not collector_is_generational()
    assert collect_only_the_young_automatically() == (2000, 10, 0)
    assert set_to == []


def test_a_paged_out_transient_message_outlives_the_acks_of_its_segments_entries(open_queue):
    # Paged out, a transient message's body goes to the queue's own records without an
    # index entry: the segment file must stay while that record is live, whatever
    # happens to the segment's entries.
    queue = open_queue(io_batch_size=10 * N)  # betas stay betas: no index entry for them
    queue.publish(message(0))  # persistent: an index entry
    queue.publish(message(1, persistent=False))
    queue.sync()
    queue.set_ram_duration_target(0)
    while queue.reduce_memory_use():
        pass
    queue.sync()  # its record on disk
    first = queue.fetch()
    queue.ack([first.seq_id])  # the segment's last index entry
    queue.sync()
    assert number(first) == 0 and [number(d) for d in drain(queue)] == [1]
    assert queue.counters["corrupt_on_read"] == 0


def test_acked_entries_of_a_segment_kept_for_a_paged_out_record_never_come_back(open_queue):
    # The segment's entries are all acked while a paged-out transient message's record
    # keeps its file: the acked slots must read absent, not present, when the segment is
    # read again (here after a clean restart, as delta).
    queue = open_queue(io_batch_size=10 * N)
    queue.publish(message(0))
    queue.publish(message(1, persistent=False))
    queue.sync()
    queue.set_ram_duration_target(0)
    while queue.reduce_memory_use():
        pass
    queue.sync()
    first = queue.fetch()
    queue.ack([first.seq_id])  # the file stays for message 1's record
    queue.publish(message(2))  # a new entry in the same segment
    queue.sync()
    queue.terminate()
    queue = open_queue()
    assert queue.recovered_clean
    assert [number(d) for d in drain(queue)] == [2]


def test_a_full_disk_when_a_segment_file_is_created_loses_nothing(open_queue, monkeypatch):
    queue = open_queue()
    queue.publish(message(0, size=100))
    pwrite = os.pwrite

    def full_disk_once(fd: int, data: bytes, offset: int) -> int:
        monkeypatch.setattr(os, "pwrite", pwrite)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", full_disk_once)  # the new file's header and slots
    with pytest.raises(OSError, match="No space"):
        queue.sync()
    assert queue.sync() == [0]  # room again: written, with its file whole
    queue.abandon()
    queue = open_queue()
    assert [number(d) for d in drain(queue)] == [0]


def test_rates_come_to_rest_once_decayed_and_move_again_from_the_next_operation(open_queue):
    clock = [0.0]
    queue = open_queue(clock=lambda: clock[0])
    queue.publish_many([encode(message(n)) for n in range(50)])
    clock[0] += 5.0
    queue.update_rates()
    assert queue.stats()["rates"]["ingress"] == 5.0  # half of the 10 a second, smoothed
    assert not queue.rates_at_rest()
    folds = 0
    while not queue.rates_at_rest():  # what the queue's rate timer does every 5 s
        clock[0] += 5.0
        queue.update_rates()
        folds += 1
    assert folds <= 10  # halved at each fold, nothing after 0.01 a second
    assert queue.stats()["rates"] == {"ingress": 0.0, "egress": 0.0, "ack": 0.0}
    assert queue.ram_duration() == math.inf
    clock[0] += 600.0  # ten minutes at rest: the timer stopped, nothing folded
    queue.publish_many([encode(message(n)) for n in range(50, 60)])
    assert not queue.rates_at_rest()  # the operation that starts the timer again
    queue.resume_rates()
    clock[0] += 5.0
    queue.update_rates()
    # ten in the five seconds since the rest ended, not in the ten minutes of rest
    assert queue.stats()["rates"]["ingress"] == 1.0

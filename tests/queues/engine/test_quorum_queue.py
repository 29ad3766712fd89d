"""A quorum queue's engine over the node's WAL, in one process: what a crash at any point
leaves, delivery counts through returns and restarts, the delivery limit, snapshots that
release the log, damaged files (a torn WAL tail, a flipped snapshot), and a WAL file
shipped to a follower without its queue's directory."""

import json
import os
import shutil
import struct
import zlib

import pytest

from warren.queues.engine import ra_log
from warren.queues.engine.quorum_queue import QuorumQueue
from warren.queues.errors import CorruptLog, QueueClosed, UnknownDeliveryTag


class Node:
    """A data directory with its WAL, as the WAL's process runs it, and the quorum queues
    opened on it; ``crash`` drops every object as a kill -9 would leave the files."""

    def __init__(self, data_dir, **wal_options):
        self.data_dir = str(data_dir)
        self.wal_options = wal_options
        self.wal = ra_log.Wal(self.data_dir, **wal_options)

    def open(self, name, **options):
        owner = f"queues/{name}"
        directory = os.path.join(self.data_dir, owner)

        def append(records, durable):
            self.wal.add(owner, b"".join(records))
            if not durable:
                return None
            self.wal.commit()  # as the WAL's process answers: once it is durable
            return Committed()

        held = [entry for _, entry in ra_log.unpack_records(self.wal.entries(owner))]
        return QuorumQueue(directory, append, owner=owner.encode(), wal_entries=held, **options)

    def crash(self):
        """The node's processes killed: the WAL's next start moves its files to segments."""
        self.wal.close()
        self.wal = ra_log.Wal(self.data_dir, **self.wal_options)


class Committed:
    """The WAL's answer, come."""

    def arrived(self):
        return True

    def get(self):
        return None


def bodies(queue, ack=True):
    out = []
    while (fetched := queue.fetch_encoded(ack_required=ack)) is not None:
        out.append(fetched.payload)
    return out


def test_a_sync_confirms_the_enqueues_and_a_crash_after_it_loses_none(tmp_path):
    node = Node(tmp_path)
    queue = node.open("orders")
    tags = queue.publish_many([b"a", b"b", b"c"])
    assert queue.sync() == list(tags)
    queue.publish_many([b"never synced"])
    queue.abandon()
    node.crash()
    again = node.open("orders")
    assert bodies(again, ack=False) == [b"a", b"b", b"c"]


class HeldCommit:
    """A WAL's answer that has not come: ``answer`` brings it (or its failure)."""

    def __init__(self, wal):
        self.wal = wal
        self.error = None
        self.done = False

    def answer(self, error=None):
        if error is None:
            self.wal.commit()
        self.error, self.done = error, True

    def arrived(self):
        return self.done

    def get(self):
        assert self.done, "a waited sync would block here"
        if self.error is not None:
            raise self.error


class WaitedCommit(HeldCommit):
    """A WAL's answer that a waited sync waits for (and gets)."""

    def get(self):
        if not self.done:
            self.answer()
        return super().get()


def answered_later(node, answer_type, **options):
    """Queue ``orders`` on ``node``'s WAL, whose durable appends get answers of
    ``answer_type`` the test gives; the queue, and the list they are kept in."""
    answers = []
    owner = "queues/orders"

    def append(records, durable):
        node.wal.add(owner, b"".join(records))
        if not durable:
            return None
        answers.append(answer_type(node.wal))
        return answers[-1]

    directory = os.path.join(node.data_dir, owner)
    return QuorumQueue(directory, append, owner=owner.encode(), **options), answers


def test_a_sync_without_a_wait_confirms_what_the_wal_answered_and_takes_more_meanwhile(tmp_path):
    node = Node(tmp_path)
    queue, held = answered_later(node, HeldCommit)
    first = queue.publish_many([b"a", b"b"])
    assert queue.sync(wait=False) == []  # handed over; the WAL has not answered
    second = queue.publish_many([b"c"])
    assert queue.sync(wait=False) == []
    assert queue.awaiting_wal and queue.stats()["unconfirmed"] == 3
    assert queue.waited_for_wal_s() >= 0  # what the queue process's watchdog reads
    held[1].answer()  # answers come in order: the second does not confirm alone
    assert queue.sync(wait=False) == []
    held[0].answer()
    assert queue.sync(wait=False) == list(first) + list(second)
    assert not queue.awaiting_wal and queue.last_written == second[-1]
    assert queue.waited_for_wal_s() is None
    queue.publish_many([b"lost with the WAL"])
    queue.sync(wait=False)
    held[2].answer(OSError(28, "No space left on device"))
    with pytest.raises(OSError):
        queue.sync(wait=False)
    with pytest.raises(QueueClosed):  # nothing goes on past a write it may have lost
        queue.publish_many([b"after"])
    node.crash()
    assert bodies(node.open("orders"), ack=False) == [b"a", b"b", b"c"]


def test_a_snapshot_comes_under_a_steady_load_that_always_has_an_append_out(tmp_path):
    node = Node(tmp_path)
    queue, out = answered_later(node, WaitedCommit, snapshot_interval=16)
    for n in range(10):
        queue.publish_many([b"%d" % n] * 5)
        queue.sync(wait=False)
        if len(out) > 1:
            out[-2].answer()  # the WAL answers one append late: one is always out
    assert queue.counters["snapshots_written"] >= 2
    assert all(commit.done for commit in out[:-1])


def test_a_queue_restarted_alone_reads_what_only_the_wal_holds(tmp_path):
    node = Node(tmp_path)
    queue = node.open("orders")
    queue.publish_many([b"%d" % n for n in range(10)])
    queue.sync()
    queue.abandon()  # the WAL's process lives on: nothing is in a segment yet
    assert ra_log.segment_files(os.path.join(node.data_dir, "queues/orders")) == []
    assert bodies(node.open("orders"), ack=False) == [b"%d" % n for n in range(10)]


def test_delivery_counts_rise_with_returns_and_with_a_crash_that_left_them_out(tmp_path):
    node = Node(tmp_path)
    queue = node.open("orders")
    queue.publish_many([b"poison", b"fine"])
    first = queue.fetch_encoded()
    queue.requeue([first.seq_id])
    second = queue.fetch_encoded()
    assert (second.seq_id, second.delivery_count) == (first.seq_id, 1)
    queue.sync()
    queue.abandon()
    node.crash()
    recovered = node.open("orders")
    again = recovered.fetch_encoded()  # it was out when the queue died: one more
    assert (again.payload, again.delivery_count) == (b"poison", 2)
    recovered.sync()  # a delivery alone: handed over unwaited
    node.wal.commit()  # what the WAL's process does once its mailbox is empty
    recovered.abandon()
    node.crash()
    counts = {f.payload: f.delivery_count for f in iter(node.open("orders").fetch_encoded, None)}
    # never backwards across restarts; "fine" was never delivered, but a crash may lose a
    # delivery's record, so after one every message comes back flagged as delivered
    assert counts == {b"poison": 3, b"fine": 1}


def test_a_delivery_a_crash_lost_comes_back_flagged_and_a_clean_stop_flags_none(tmp_path):
    node = Node(tmp_path)
    queue = node.open("orders")
    queue.publish_many([b"delivered", b"waiting"])
    queue.sync()
    queue.terminate()
    node.crash()
    clean = node.open("orders")
    first = clean.fetch_encoded()
    assert (first.payload, first.delivery_count) == (b"delivered", 0)
    clean.sync()  # the delivery handed over unwaited: the crash below loses it
    clean.abandon()
    node.crash()
    again = node.open("orders")
    assert [(f.payload, f.delivery_count) for f in iter(again.fetch_encoded, None)] == [
        (b"delivered", 1),  # the consumer may have had it: said so
        (b"waiting", 1),
    ]
    again.requeue([tag for tag in range(1, 3)], delivered=False)
    again.sync()
    again.terminate()  # the flag survives a clean stop: the consumer may still have it
    node.crash()
    assert [f.delivery_count for f in iter(node.open("orders").fetch_encoded, None)] == [1, 1]


def test_the_crash_flag_survives_a_clean_stop_that_had_nothing_new_to_log(tmp_path):
    """A start after a crash flags every message as maybe delivered; a clean stop right
    after it, with its log no further than its last snapshot, must keep the flags too."""
    node = Node(tmp_path)
    queue = node.open("orders")
    queue.publish_many([b"a", b"b"])
    queue.sync()
    queue.snapshot()  # the snapshot covers the last entry
    queue.abandon()
    node.crash()
    node.open("orders").terminate()  # flagged at its start, nothing new logged since
    node.crash()
    assert [f.delivery_count for f in iter(node.open("orders").fetch_encoded, None)] == [1, 1]


def test_a_message_returned_past_its_delivery_limit_is_held_out_for_dead_lettering(tmp_path):
    queue = Node(tmp_path).open("orders", delivery_limit=1)
    (tag,) = queue.publish_many([b"poison"])
    queue.publish_many([b"next"])
    queue.requeue([queue.fetch_encoded().seq_id])
    assert queue.take_over_limit() == []
    queue.requeue([queue.fetch_encoded().seq_id])
    assert queue.take_over_limit() == [tag]
    assert queue.fetch_encoded().payload == b"next"  # the poison is not served again
    assert queue.pending_payload(tag) == b"poison"
    queue.ack([tag])  # what the queue process does once it is dead-lettered
    assert queue.depth == 1


def test_settling_a_tag_twice_or_one_never_delivered_changes_nothing(tmp_path):
    queue = Node(tmp_path).open("orders")
    queue.publish_many([b"a", b"b"])
    fetched = queue.fetch_encoded()
    queue.ack([fetched.seq_id])
    for bad in ([fetched.seq_id], [2], [99]):
        with pytest.raises(UnknownDeliveryTag):
            queue.ack(bad)
    assert len(queue) == 1


def test_snapshots_release_the_log_below_the_oldest_live_message(tmp_path):
    node = Node(tmp_path, max_bytes=4096, segment_entries=16)
    queue = node.open("orders", snapshot_interval=64)
    kept = queue.publish_many([b"kept"])
    queue.sync()
    for _ in range(20):
        queue.publish_many([b"%d" % n for n in range(20)])
        out = [fetched.seq_id for fetched in iter(queue.fetch_encoded, None)]
        queue.ack([tag for tag in out if tag not in kept])
        queue.requeue(kept, delivered=False)
        queue.sync()
    directory = os.path.join(node.data_dir, "queues/orders")
    assert queue.counters["snapshots_written"] >= 5
    segments = ra_log.segment_files(directory)
    assert segments[0][0] <= kept[0]  # the live message pins its segment
    queue.ack([queue.fetch_encoded().seq_id])
    queue.publish_many([b"x"] * 100)
    queue.sync()
    queue.publish_many([b"y"] * 100)
    queue.sync()
    assert ra_log.segment_files(directory)[0][0] > kept[0]  # released once it went
    queue.abandon()
    node.crash()
    assert bodies(node.open("orders"), ack=False) == [b"x"] * 100 + [b"y"] * 100


def test_a_growing_queue_is_snapshotted_less_often_and_starts_from_one_as_it_was(tmp_path):
    node = Node(tmp_path, segment_entries=64)
    queue = node.open("orders", snapshot_interval=16, max_entries=256)
    for n in range(100):
        queue.publish_many([b"%d-%d" % (n, i) for i in range(10)])
        queue.sync()
    # at 16, then at as many as the queue held (32, 64, 128), then every 256 entries
    assert queue.counters["snapshots_written"] == 7
    first, second, held = (queue.fetch_encoded().seq_id for _ in range(3))
    queue.requeue([first, second])  # counted: 1 each
    queue.sync()
    queue.terminate()  # a snapshot with ``held`` out: back, counted, at the start
    node.crash()
    again = node.open("orders")
    assert again.counters["log_entries_replayed"] == 0  # all from the snapshot
    assert [again.delivery_count(tag) for tag in (first, second, held)] == [1, 1, 1]
    assert again.delivery_count(held + 1) == 0
    assert len(bodies(again, ack=False)) == 1000


def test_a_start_from_a_snapshot_reads_each_body_from_the_log_only_when_it_is_needed(tmp_path):
    node = Node(tmp_path, max_bytes=4096, segment_entries=64)
    queue = node.open("orders", snapshot_interval=16)
    sent = [b"%04d" % n + b"." * 96 for n in range(300)]
    for at in range(0, 300, 10):
        queue.publish_many(sent[at : at + 10], msg_ids=[b"id-%d" % (at + i) for i in range(10)])
        queue.sync()
    queue.terminate()
    node.crash()
    again = node.open("orders")
    assert again.stats()["ram_bytes"] == 0 and len(again) == 300  # all in the log
    assert again.msg_ids_from(1) == {b"id-%d" % n for n in range(300)}
    first = again.fetch_encoded()
    assert first.payload == sent[0] and first.msg_id == b"id-0"
    assert again.stats()["ram_bytes"] == 64 * 100  # the first segment's bodies, all 64
    assert again.peek().size == 100
    assert [first.payload] + bodies(again, ack=False) == sent


def sync_and_page_out(queue):
    """A sync, then a page-out if one is due, as the queue's process does (on a timer)."""
    queue.sync()
    if queue.over_ram_limit():
        queue.page_out()


def publish_deep(tmp_path, count):
    """A queue allowed 5,000 B of bodies in RAM, on WAL files of 8 KiB and segments of
    64 entries, given ``count`` bodies of 100 B in batches of 20: the node, the queue,
    the bodies, and the most RAM its bodies took after a batch."""
    node = Node(tmp_path, max_bytes=8192, segment_entries=64)
    queue = node.open("orders", ram_body_bytes=5_000)
    sent = [b"%04d" % n + b"." * 96 for n in range(count)]
    most = 0
    for at in range(0, count, 20):
        queue.publish_many(sent[at : at + 20])
        sync_and_page_out(queue)
        most = max(most, queue.stats()["ram_bytes"])
    return node, queue, sent, most


def test_a_deep_queue_keeps_its_bodies_in_the_log_not_in_ram_and_serves_each_once(tmp_path):
    """Past ``ram_body_bytes`` of bodies, those the segments hold leave RAM, the newest
    first: the oldest, which a consumer takes next, stay; a body only the WAL holds
    stays until the WAL's rollover wrote it to a segment. Each is read back when it is
    needed, once, in order, and a requeued one too."""
    node, queue, sent, most = publish_deep(tmp_path, 1_000)
    # never above the limit by more than what the WAL alone holds (8 KiB a file)
    assert most <= 5_000 + 8192 + 20 * 100
    assert queue.counters["bodies_paged_out"] > 900
    assert queue.stats()["ram_bytes"] < 20 * 1_000
    head = [queue.fetch_encoded() for _ in range(3)]
    assert [f.payload for f in head] == sent[:3]
    queue.requeue([head[1].seq_id])
    queue.ack([head[0].seq_id, head[2].seq_id])
    assert bodies(queue, ack=False) == [sent[1], *sent[3:]]
    queue.sync()
    queue.terminate()
    node.crash()
    assert bodies(node.open("orders"), ack=False) == []  # each served once, and settled


def test_a_body_only_the_wal_holds_stays_in_ram_until_a_segment_has_it(tmp_path):
    node = Node(tmp_path, max_bytes=8192, segment_entries=1000)
    queue = node.open("orders", ram_body_bytes=10_000)
    sent = [b"%04d" % n + b"." * 96 for n in range(150)]
    for at in range(0, 150, 10):  # the WAL rolls over once: the oldest go to a segment
        queue.publish_many(sent[at : at + 10])
        sync_and_page_out(queue)
        if queue.counters["bodies_paged_out"]:
            sent = sent[: at + 10]  # read at once, before a rollover writes the rest
            break
    paged = queue.counters["bodies_paged_out"]
    assert 0 < paged < len(sent) and queue.stats()["ram_bytes"] == (len(sent) - paged) * 100
    assert bodies(queue, ack=False) == sent  # those left in RAM, and those in the segment
    assert queue.counters["log_entries_lost"] == 0


def test_bodies_left_in_the_log_survive_a_crash_and_are_all_served(tmp_path):
    node, queue, sent, _ = publish_deep(tmp_path, 600)
    assert queue.counters["bodies_paged_out"] > 0
    queue.abandon()
    node.crash()
    assert bodies(node.open("orders"), ack=False) == sent


@pytest.mark.parametrize("first_read", [None, 1000])
def test_a_flipped_byte_in_a_body_below_the_snapshot_loses_that_message_alone(
    tmp_path, monkeypatch, first_read
):
    """Bodies are read back from the segment's start as far as needed (with
    ``first_read``: from a small first piece, records cut at its end read again whole)."""
    if first_read is not None:
        monkeypatch.setattr(ra_log.SegmentRecords, "FIRST_READ_BYTES", first_read)
    node = Node(tmp_path, max_bytes=4096, segment_entries=1000)
    queue = node.open("orders", snapshot_interval=16)
    sent = [b"%04d" % n + b"." * 60 for n in range(600)]
    for at in range(0, 600, 50):
        queue.publish_many(sent[at : at + 50])
        queue.sync()
    queue.terminate()
    node.crash()
    ((_, segment),) = ra_log.segment_files(os.path.join(node.data_dir, "queues/orders"))
    with open(segment, "rb") as file:
        records = list(ra_log.split_records(file.read()))
    (_, _, hit) = next(r for r in records if r[1] == 300)
    at = sum(len(r[2]) for r in records if r[1] < 300)
    flip(segment, at + len(hit) - 1)  # the last byte of message 300's body
    again = node.open("orders")
    got = bodies(again)  # read from the log in batches, past the damaged record
    assert got == sent[:299] + sent[300:]
    assert again.counters["log_entries_lost"] == 1


def test_a_snapshot_an_earlier_version_wrote_is_read_with_its_bodies_from_the_log(tmp_path):
    node = Node(tmp_path, segment_entries=16)
    queue = node.open("orders", snapshot_interval=8)
    queue.publish_many([b"gone"] + [b"kept %d" % n for n in range(20)], msg_ids=[b"a"] * 21)
    queue.sync()
    queue.ack([queue.fetch_encoded().seq_id])
    returned = queue.fetch_encoded().seq_id
    queue.requeue([returned])
    queue.terminate()
    node.crash()
    directory = os.path.join(node.data_dir, "queues/orders")
    live = [[i, int(i == returned), 0, 0] for i in range(2, 22)]
    state = {"index": queue.snapshot_index, "term": 1, "needs_from": 2, "messages": live}
    body = json.dumps(state).encode()  # as the version before columns wrote it
    with open(os.path.join(directory, ra_log.SNAPSHOT_FILE), "wb") as file:
        file.write(struct.pack(">I", zlib.crc32(body)) + body)
    again = node.open("orders")
    assert again.counters.get("snapshots_refused", 0) == 0
    first = again.fetch_encoded()
    assert (first.payload, first.delivery_count, first.msg_id) == (b"kept 0", 1, b"a")
    assert bodies(again) == [b"kept %d" % n for n in range(1, 20)]


def test_a_torn_wal_tail_loses_only_what_was_never_confirmed(tmp_path):
    node = Node(tmp_path)
    queue = node.open("orders")
    queue.publish_many([b"confirmed %d" % n for n in range(5)])
    queue.sync()
    queue.abandon()
    node.wal.close()
    (path,) = node.wal.files.files()
    with open(path, "ab") as wal:  # half a record, as a crash in the middle of a write
        wal.write(ra_log.pack_entry(99, 1, b"Etorn", b"queues/orders")[:17])
    node.wal = ra_log.Wal(node.data_dir)
    assert bodies(node.open("orders"), ack=False) == [b"confirmed %d" % n for n in range(5)]


def test_a_damaged_snapshot_is_passed_over_for_the_one_before(tmp_path):
    node = Node(tmp_path, max_bytes=1024, segment_entries=8)
    queue = node.open("orders", snapshot_interval=16)
    for n in range(6):
        queue.publish_many([b"%d-%d" % (n, i) for i in range(10)])
        queue.sync()
    assert queue.counters["snapshots_written"] >= 2
    queue.abandon()
    node.crash()
    snapshot = os.path.join(node.data_dir, "queues/orders", ra_log.SNAPSHOT_FILE)
    with open(snapshot, "r+b") as file:
        file.seek(10)
        byte = file.read(1)
        file.seek(10)
        file.write(bytes([byte[0] ^ 0x40]))
    recovered = node.open("orders")
    assert recovered.counters["snapshots_refused"] == 1
    assert bodies(recovered, ack=False) == [b"%d-%d" % (n, i) for n in range(6) for i in range(10)]


def test_purges_no_ack_fetches_and_expiries_replay_as_they_happened(tmp_path):
    node = Node(tmp_path)
    queue = node.open("orders")
    queue.publish_many([b"purged 1", b"purged 2"])
    queue.purge()
    queue.publish_many([b"taken"])
    assert queue.fetch_encoded(ack_required=False).payload == b"taken"
    queue.publish_many([b"expired"], expiry_ms=1)
    queue.publish_many([b"left"])
    queue.drop_while(lambda info: 0 < info.expiry_ms)
    queue.sync()
    queue.abandon()
    node.crash()
    assert bodies(node.open("orders"), ack=False) == [b"left"]


def test_the_wal_refuses_records_that_are_not_whole_or_not_a_queues(tmp_path):
    wal = ra_log.Wal(str(tmp_path))
    record = ra_log.pack_entry(1, 1, b"Ex", b"queues/orders")
    for owner in ("queues/..", "../etc", "queues/a/b", "quorum/wal"):
        with pytest.raises(ValueError, match="not a queue's directory"):
            wal.add(owner, record)
    for records in (record[:-1], record + b"\x00", record[:4] + b"\xff" + record[5:]):
        with pytest.raises(ValueError, match="not whole"):
            wal.add("queues/orders", records)
    assert wal.commit() == 0


def test_a_clean_stop_after_unwaited_settles_snapshots_each_of_them_once(tmp_path):
    node = Node(tmp_path)
    queue = node.open("orders")
    queue.publish_many([b"acked", b"returned", b"kept"])
    queue.sync()
    queue.ack([queue.fetch_encoded().seq_id])
    queue.requeue([queue.fetch_encoded().seq_id])
    queue.sync()  # settles alone: handed over without a wait
    queue.terminate()  # waits for them, then snapshots
    node.crash()
    again = node.open("orders")
    assert [(f.payload, f.delivery_count) for f in iter(again.fetch_encoded, None)] == [
        (b"returned", 1),
        (b"kept", 0),
    ]


def restarted(node, queue, **options):
    """``queue`` ended as by kill -9 with the WAL's process alive, then opened again."""
    queue.sync()
    node.wal.commit()  # the WAL's group commit, as its process makes once idle
    queue.abandon()
    return node.open("orders", **options)


def test_expiring_a_message_returned_before_a_restart_drops_it_once(tmp_path):
    node = Node(tmp_path)
    queue = node.open("orders")
    queue.publish_many([b"expires"], expiry_ms=1)
    queue.publish_many([b"stays"])
    queue.requeue([queue.fetch_encoded().seq_id])  # its index twice in the heap, after
    queue = restarted(node, queue)
    queue.drop_while(lambda info: 0 < info.expiry_ms)
    queue = restarted(node, queue)
    assert bodies(queue, ack=False) == [b"stays"]


def test_a_message_dropped_past_its_limit_is_not_asked_for_again_after_a_restart(tmp_path):
    node = Node(tmp_path)
    queue = node.open("orders", delivery_limit=0)
    queue.publish_many([b"poison", b"fine"])
    queue.requeue([queue.fetch_encoded().seq_id])
    queue.ack(queue.take_over_limit())  # dropped: no dead-letter exchange
    queue = restarted(node, queue, delivery_limit=0)
    assert queue.take_over_limit() == []
    assert bodies(queue, ack=False) == [b"fine"]


def test_a_purge_after_a_restart_takes_what_that_restart_returned(tmp_path):
    node = Node(tmp_path)
    queue = node.open("orders")
    queue.publish_many([b"was out", b"waiting"])
    queue.fetch_encoded()
    queue = restarted(node, queue)  # returns "was out"
    assert queue.purge() == 2
    queue = restarted(node, queue)
    assert queue.depth == 0


def test_a_queue_declared_again_under_a_deleted_ones_name_reads_only_its_own_log(tmp_path):
    node = Node(tmp_path)
    queue = node.open("orders")
    queue.publish_many([b"old %d" % n for n in range(5)])
    queue.sync()
    node.wal.forget("queues/orders")
    node.wal.commit()
    queue.delete()
    again = node.open("orders")
    again.publish_many([b"new"])
    again.sync()
    again.abandon()
    node.crash()  # the WAL file holds both queues' entries, under one name
    assert bodies(node.open("orders"), ack=False) == [b"new"]


def test_entries_carry_the_term_they_were_made_in_and_a_start_never_lowers_it(tmp_path):
    node = Node(tmp_path)
    queue = node.open("orders", term=7)  # a node leading at epoch 7
    queue.publish_many([b"a", b"b"])
    queue.sync()
    queue.abandon()
    node.crash()
    alone = node.open("orders")  # the same files on a lone node: term 1 asked
    assert alone.stats()["term"] == 7
    alone.publish_many([b"c"])
    alone.sync()
    alone.abandon()
    node.crash()
    directory = os.path.join(node.data_dir, "queues/orders")
    terms = [entry.term for entry in ra_log.read_segments(directory)]
    assert terms == [7, 7, 7]
    assert node.open("orders", term=9).stats()["term"] == 9  # a later leadership


def shipped_wal(node, to):
    """A node on a copy of ``node``'s WAL files alone, as a cluster's follower holds
    them: no file of a queue that had none yet, so no directory of it either."""
    wal_directory = os.path.join(node.data_dir, ra_log.QUORUM_DIRECTORY, ra_log.WAL_DIRECTORY)
    copy = os.path.join(to, ra_log.QUORUM_DIRECTORY, ra_log.WAL_DIRECTORY)
    shutil.copytree(wal_directory, copy)
    return Node(to)


def test_a_wal_file_without_its_queues_directory_gives_the_queue_its_whole_log(tmp_path):
    leader = Node(tmp_path / "leader")
    orders, gone = leader.open("orders"), leader.open("gone")
    orders.publish_many([b"%d" % n for n in range(20)])
    gone.publish_many([b"deleted with its queue"])
    orders.requeue([orders.fetch_encoded().seq_id])
    orders.sync()
    gone.sync()
    leader.wal.forget("queues/gone")
    leader.wal.commit()
    gone.delete()
    orders.abandon()
    follower = shipped_wal(leader, tmp_path / "follower")  # its WAL's start: segments
    queues = tmp_path / "follower" / "queues"
    assert sorted(os.listdir(queues)) == ["orders"]  # a deleted queue's stays gone
    taken = follower.open("orders")
    first = taken.fetch_encoded()
    assert (first.payload, first.delivery_count) == (b"0", 1)
    assert bodies(taken, ack=False) == [b"%d" % n for n in range(1, 20)]


def test_the_wal_refuses_records_that_name_another_queue(tmp_path):
    wal = ra_log.Wal(str(tmp_path))
    theirs = ra_log.pack_entry(1, 1, b"E" + b"\x00" * 10 + b"evil", b"queues/victim")
    with pytest.raises(ValueError, match="of that queue"):
        wal.add("queues/attacker", theirs)


def flip(path, offset):
    with open(path, "r+b") as file:
        file.seek(offset)
        byte = file.read(1)
        file.seek(offset)
        file.write(bytes([byte[0] ^ 1]))


def test_a_damaged_segment_in_the_middle_of_the_log_loses_its_stretch_and_nothing_else(
    tmp_path,
):
    node = Node(tmp_path, max_bytes=1024, segment_entries=8)
    queue = node.open("orders")
    for n in range(6):
        queue.publish_many([b"%d-%d" % (n, i) for i in range(8)])
        queue.sync()
    queue.terminate()
    node.crash()
    directory = os.path.join(node.data_dir, "queues/orders")
    segments = ra_log.segment_files(directory)
    flip(segments[1][1], 12)  # the second segment's first record: all of that file is lost
    recovered = node.open("orders")  # from its snapshot: the bodies are read when needed
    fetched = list(iter(recovered.fetch_encoded, None))
    assert [f.payload for f in fetched] == [
        b"%d-%d" % (n, i) for n in range(6) if n != 1 for i in range(8)
    ]
    assert recovered.counters["log_entries_lost"] == 8
    # below the snapshot the damage took bodies, never the record of a delivery
    assert {f.delivery_count for f in fetched} == {0}
    recovered.requeue([f.seq_id for f in fetched], delivered=False)
    recovered.publish_many([b"after"])
    recovered.sync()
    recovered.abandon()
    node.crash()  # the WAL's entries go to segments past the gap
    again = node.open("orders")
    assert [f.payload for f in iter(again.fetch_encoded, None)][-1:] == [b"after"]


def test_entries_past_a_damaged_segment_tail_are_kept_in_a_segment_of_their_own(tmp_path):
    node = Node(tmp_path, max_bytes=512, segment_entries=64)
    queue = node.open("orders")
    for n in range(4):
        queue.publish_many([b"early %d " % n + b"." * 200])
        queue.sync()
    node.wal.files.max_bytes = 10**6  # what comes now stays in the WAL file being written
    queue.publish_many([b"in the wal"])
    queue.sync()
    queue.abandon()
    node.wal.close()
    directory = os.path.join(node.data_dir, "queues/orders")
    (_, path), *_ = ra_log.segment_files(directory)
    with open(path, "r+b") as segment:  # the segment's last record cut
        segment.truncate(os.path.getsize(path) - 3)
    node.wal = ra_log.Wal(node.data_dir, max_bytes=512, segment_entries=64)
    recovered = node.open("orders")
    assert [f.payload for f in iter(recovered.fetch_encoded, None)][-1:] == [b"in the wal"]
    assert len(ra_log.segment_files(directory)) == 2  # after the gap, a segment of its own
    recovered.abandon()
    node.crash()
    assert bodies(node.open("orders"), ack=False)[-1:] == [b"in the wal"]


def test_an_entry_that_holds_its_check_but_not_a_known_command_stops_the_start(tmp_path):
    node = Node(tmp_path)
    queue = node.open("orders")
    queue.publish_many([b"a"])
    queue.sync()
    node.wal.add("queues/orders", ra_log.pack_entry(2, 1, b"Znew kind", b"queues/orders"))
    node.wal.commit()
    queue.abandon()
    node.crash()
    with pytest.raises(CorruptLog, match="unknown command"):
        node.open("orders")


def test_records_no_one_waits_on_are_written_at_once_and_synced_with_the_next_commit(tmp_path):
    wal = ra_log.Wal(str(tmp_path))
    owner = "queues/orders"
    wal.add(owner, ra_log.pack_entry(1, 1, b"S" + bytes(8), owner.encode()))
    wal.commit(sync=False)
    assert (wal.files.syncs, wal.unsynced) == (0, 1)
    assert [i for i, _ in ra_log.read_wal(wal.files.path)[owner]] == [1]  # in the file
    wal.add(owner, ra_log.pack_entry(2, 1, b"S" + bytes(8), owner.encode()))
    wal.commit()
    assert (wal.files.syncs, wal.unsynced, wal.records_synced) == (1, 0, 2)
    wal.close()

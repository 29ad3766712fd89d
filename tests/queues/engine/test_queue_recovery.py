"""What a queue brings back after a clean stop, a dropped object and a SIGKILLed process,
with damaged files; and the reference counts the shared store takes from the queues."""

import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from warren.queues import VariableQueue, walk_ref_counts
from warren.queues.broker.definitions import queue_directory
from warren.queues.engine import queue_recovery
from warren.queues.engine.queue_index import (
    HEADER_BYTES,
    SLOT_BYTES,
    pack_slot,
    records_at,
    unpack_slot,
)
from warren.queues.engine.queue_index import segment_header as index_segment_header
from warren.queues.engine.recovery_terms import name_store_clients
from warren.queues.engine.segments import segment_header
from warren.queues.message import encode
from warren.store import LocalStoreClient, MessageStore
from warren.store.client import StoreClient
from warren.store.protocol import StoreStats
from warren.supervisor import Node

from ...waiting import wait_for
from ..helpers import N, drain, drained, message, number

ROOT = Path(__file__).resolve().parents[3]
SIZE_LARGE = 5000  # above embed_msgs_below: in the shared store


def synced_queue(open_queue, count: int):
    """A queue holding messages 0..count-1 of 100 bytes (its own records), synced."""
    queue = open_queue()
    for n in range(count):
        queue.publish(message(n, size=100))
    queue.sync()
    return queue


def test_dirty_recovery_drops_entries_whose_shared_message_is_missing(
    open_queue, engine_stores, caplog
):
    queue = open_queue()
    msg_ids = [os.urandom(16) for _ in range(6)]
    for n, msg_id in enumerate(msg_ids):
        queue.publish(message(n, size=5000), msg_id=msg_id)
    queue.sync()
    queue.abandon()
    engine_stores.persistent.remove(msg_ids[2])
    engine_stores.persistent.remove(msg_ids[4])
    with caplog.at_level(logging.INFO, logger="warren.queues"):
        queue = open_queue()
    assert queue.counters["dropped_missing"] == 2
    assert [number(d) for d in drain(queue)] == [0, 1, 3, 5]
    assert "2 missing from the shared store" in caplog.text and "dirty" in caplog.text
    # the expected cost of a crash (never confirmed), not a warning to a newcomer: data the
    # store lost is the store's own warning
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert "2 messages had no reference of this queue in the shared store" in caplog.text


def test_a_crash_after_acks_whose_removes_reached_the_store_brings_none_of_them_back(
    open_queue, caplog
):
    # The in-process store client applies a remove at once, as a store actor does once
    # the client's batch fills: before the queue's next sync writes its index.
    queue = open_queue()
    for n in range(6):
        queue.publish(message(n, size=SIZE_LARGE))
    queue.sync()
    fetched = [queue.fetch() for _ in range(6)]
    queue.ack(d.seq_id for d in fetched[:3])
    queue.abandon()  # killed before its sync: only what it wrote is on file
    with caplog.at_level(logging.INFO, logger="warren.queues"):
        queue = open_queue()
    assert queue.counters["dropped_missing"] == 0
    assert [number(d) for d in drain(queue)] == [3, 4, 5]
    assert "not in the shared store" not in caplog.text


class Recording:
    """A store factory that keeps the persistent clients it made, oldest first."""

    def __init__(self, make):
        self.make = make
        self.clients = []

    def __call__(self, ref):
        self.clients.append(self.make(ref))
        return self.clients[-1]


def fanout_queue(tmp_path, stores, persistent):
    return VariableQueue(
        tmp_path / "queues" / "q",
        segment_entry_count=N,
        persistent_store=persistent,
        transient_store=stores.transient_client,
    )


def a_fanout(tmp_path, stores, *more):
    """A queue and another store client (the other queue), both holding a reference to
    one large message, the queue's first; the queue also holds ``more``. (the other
    client, the message's id, the message, the queue's store clients, the queue)"""
    other = stores.persistent_client(os.urandom(16))
    msg_id, body = os.urandom(16), message(0, size=SIZE_LARGE)
    persistent = Recording(stores.persistent_client)
    queue = fanout_queue(tmp_path, stores, persistent)
    for published, published_id in ((body, msg_id), *((m, None) for m in more)):
        queue.publish(published, msg_id=published_id)
    queue.sync()
    other.write(msg_id, encode(body))
    other.settled(True)
    return other, msg_id, body, persistent, queue


def test_a_queue_killed_before_its_fanout_write_reached_the_store_leaves_the_other_copy_alone(
    tmp_path, stores, caplog
):
    """A fanout: another queue holds a reference to the same body. This queue's own write
    died with it (its index named the message, its store client never sent the write), so
    only the other queue's reference keeps the body. Its recovery drops the entry (never
    confirmed) rather than take that reference as its own: acking it would have removed
    the other queue's confirmed copy."""
    other, msg_id, body, persistent, queue = a_fanout(tmp_path, stores, message(1, SIZE_LARGE))
    persistent.clients[0].remove([msg_id])  # as if this queue's write had never arrived
    persistent.clients[0].settled(True)
    queue.abandon()
    with caplog.at_level(logging.INFO, logger="warren.queues"):
        queue = fanout_queue(tmp_path, stores, persistent)
        assert queue.counters["dropped_missing"] == 1
        assert [number(d) for d in drain(queue)] == [1]
        queue.sync()
    assert other.read_many([msg_id]) == [encode(body)]
    assert "1 messages had no reference of this queue in the shared store" in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    queue.terminate()
    other.terminate()


def test_a_queue_killed_after_its_write_of_a_fanout_body_reached_the_store_keeps_it(
    tmp_path, stores
):
    """The same fanout, with this queue's write in the store: its recovery keeps the
    message, and the other queue's ack leaves this queue's copy readable."""
    other, msg_id, body, persistent, queue = a_fanout(tmp_path, stores)
    queue.abandon()
    queue = fanout_queue(tmp_path, stores, persistent)
    other.remove([msg_id])
    other.settled(True)
    assert [d.message.body for d in drain(queue)] == [body.body]
    queue.terminate()
    other.terminate()


@pytest.mark.parametrize("when", ["before its claim", "after its claim"])
def test_a_queue_killed_again_during_its_recovery_keeps_what_its_first_life_held(
    tmp_path, stores, monkeypatch, when
):
    """Killed once, then again while its next open recovered: before it claimed its
    predecessor's references, or after (they are its new client's then) but before it
    named that client alone. The opens after that still claim them, and keep every
    message."""
    persistent = Recording(stores.persistent_client)
    queue = fanout_queue(tmp_path, stores, persistent)
    for n in range(4):
        queue.publish(message(n, size=SIZE_LARGE))
    queue.sync()
    queue.abandon()
    named = []

    def recovery_killed(*scan):
        raise KeyboardInterrupt

    def killed_naming_it_alone(directory, clients):
        named.append(clients)
        if len(named) == 2:
            assert len(clients.refs) == 1
            raise KeyboardInterrupt
        name_store_clients(directory, clients)

    with monkeypatch.context() as patched:
        if when == "before its claim":
            patched.setattr(queue_recovery, "_recover_dirty", recovery_killed)
        else:
            patched.setattr(queue_recovery, "name_store_clients", killed_naming_it_alone)
        with pytest.raises(KeyboardInterrupt):
            fanout_queue(tmp_path, stores, persistent)
    queue = fanout_queue(tmp_path, stores, persistent)
    assert queue.counters["dropped_missing"] == 0 and len(queue) == 4
    queue.abandon()
    queue = fanout_queue(tmp_path, stores, persistent)  # killed once more: its refs moved on
    assert queue.counters["dropped_missing"] == 0
    assert [number(d) for d in drain(queue)] == [0, 1, 2, 3]
    queue.terminate()


def test_a_fanout_entry_newer_than_the_stores_start_does_not_take_a_reference_recovered_then(
    tmp_path, engine_stores
):
    """The other queue's copy predates the store's start, so the store knows no holder of
    its reference. This queue took the same message (a producer's re-send: the same id)
    after the start, and was killed before its write reached the store: its recovery
    drops it, and the other queue's copy stays."""
    msg_id = os.urandom(16)
    body = message(0, size=SIZE_LARGE)
    other = engine_stores.persistent_client(os.urandom(16))
    other.write(msg_id, encode(body))
    other.settled(True)
    engine_stores.close()
    engine_stores.open()  # the node restarted: one reference of no known holder
    persistent = Recording(engine_stores.persistent_client)
    queue = fanout_queue(tmp_path, engine_stores, persistent)
    queue.publish(body, msg_id=msg_id)
    queue.sync()
    persistent.clients[0].remove([msg_id])  # as if this queue's write had never arrived
    persistent.clients[0].settled(True)
    queue.abandon()
    queue = fanout_queue(tmp_path, engine_stores, persistent)
    assert queue.counters["dropped_missing"] == 1
    assert drain(queue) == []
    queue.sync()
    assert engine_stores.persistent.read(msg_id) == encode(body)
    queue.terminate()


def test_dirty_recovery_drops_records_failing_their_crc_and_keeps_the_rest(open_queue, caplog):
    queue = synced_queue(open_queue, 3 * N)
    queue.abandon()
    path = os.path.join(queue.directory, "1.qi")
    with open(path, "r+b") as file:  # the first record of segment 1: message N
        file.seek(records_at(N) + 8 + 30)
        file.write(b"\xff\xfe")
    with caplog.at_level(logging.WARNING, logger="warren.queues"):
        queue = open_queue()
    assert queue.counters["dropped_corrupt"] == 1
    assert [number(d) for d in drain(queue)] == [n for n in range(3 * N) if n != N]
    assert "failed their size or CRC check" in caplog.text


@pytest.mark.parametrize(
    "flushed_by", ["an ack of a shared-store message", "half a segment of acks"]
)
def test_a_kill_after_the_index_wrote_its_slots_leaves_no_entry_pointing_at_an_unwritten_record(
    open_queue, caplog, flushed_by
):
    """The index writes its buffer before its sync when the queue acks a message of the
    shared store (before the store may drop the body) or when acks fill half a segment.
    Small messages published since the last sync then have their slots on file; killed
    before the sync, the queue must not come back with entries whose records it never
    wrote (once reported as a corrupt message at the restart after a demo's kill)."""
    queue = open_queue()
    queue.publish(message(0, size=SIZE_LARGE))
    for n in range(1, N):
        queue.publish(message(n, size=100))
    queue.sync()
    for n in range(N, N + 5):  # never synced: the queue store holds their records
        queue.publish(message(n, size=100))
    if flushed_by == "an ack of a shared-store message":
        queue.ack([queue.fetch().seq_id])
    else:
        queue.ack([queue.fetch().seq_id for _ in range(N // 2)])
    queue.abandon()
    with caplog.at_level(logging.WARNING, logger="warren.queues"):
        queue = open_queue()
    assert queue.counters["dropped_corrupt"] == 0 and not caplog.records
    kept = [number(d) for d in drain(queue)]
    assert kept[-5:] == list(range(N, N + 5))  # the slots on file found their records


def test_a_body_file_cut_mid_record_loses_only_the_records_it_cut(open_queue):
    queue = synced_queue(open_queue, N)
    queue.abandon()
    path = os.path.join(queue.directory, "0.qi")  # its records come after its slots
    os.truncate(path, os.path.getsize(path) - 50)
    queue = open_queue()
    assert [number(d) for d in drain(queue)] == list(range(N - 1))


def test_a_segment_cut_after_a_clean_stop_is_recovered_by_a_scan_that_says_so(open_queue, caplog):
    queue = synced_queue(open_queue, N)
    queue.terminate()  # clean: the terms count N messages
    path = os.path.join(queue.directory, "0.qi")
    os.truncate(path, os.path.getsize(path) - 50)  # into the last record
    with caplog.at_level(logging.WARNING, logger="warren.queues"):
        queue = open_queue()
    assert not queue.recovered_clean and queue.counters["dropped_corrupt"] == 1
    assert [number(d) for d in drain(queue)] == list(range(N - 1))
    assert "changed size since the clean stop" in caplog.text


def test_a_segment_cut_inside_its_slots_keeps_the_slots_before_the_cut(open_queue):
    queue = open_queue()
    for n in range(N):  # shared-store messages: their slots are all they have here
        queue.publish(message(n, size=SIZE_LARGE))
    queue.sync()
    queue.abandon()
    path = os.path.join(queue.directory, "0.qi")
    os.truncate(path, 64 + 48 * (N - 4) + 20)  # the last four slots, one of them torn
    queue = open_queue()
    assert queue.counters["torn_slots"] == 1
    assert [number(d) for d in drain(queue)] == list(range(N - 4))


def test_a_segment_cut_after_a_clean_stop_leaves_no_message_behind_in_the_shared_store(tmp_path):
    """A torn copy or a restored backup: the index file cut inside its last slot after a
    clean node stop. The queue recovers dirty without that message; the shared store must
    not keep the reference its own clean stop saved for it, or the message stays there for
    good, held by no queue."""
    data = tmp_path / "data"
    bodies = [b"%d:" % n + b"x" * 6000 for n in range(8)]  # each in the shared store
    with Node(data) as node:
        node.declare_queue("orders")
        with node.connect() as conn:
            conn.publish_many("orders", bodies)
    index_file = Path(queue_directory(str(data), "orders")) / "0.qi"
    os.truncate(index_file, HEADER_BYTES + 7 * SLOT_BYTES + SLOT_BYTES // 2)  # mid-slot 7
    with Node(data) as node, node.connect() as conn:
        assert drained(conn, "orders") == bodies[:7]
    with Node(data) as node:
        assert node.store().ask(StoreStats())["message_count"] == 0
        with node.connect() as conn:
            assert conn.get("orders") is None


def test_a_segment_with_a_corrupt_header_is_dropped_and_the_others_recover(open_queue):
    queue = open_queue()
    for n in range(3 * N):
        queue.publish(message(n, size=SIZE_LARGE if n % 2 else 10))
    queue.sync()
    queue.abandon()
    with open(os.path.join(queue.directory, "1.qi"), "r+b") as file:
        file.write(b"GARBAGE!")
    queue = open_queue()
    assert queue.counters["bad_segments"] == 1
    assert [number(d) for d in drain(queue)] == list(range(N)) + list(range(2 * N, 3 * N))


def test_a_queue_process_killed_while_publishing_keeps_every_confirmed_message(tmp_path):
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.queues.queue_child", str(tmp_path)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "ready"
        confirmed_file = tmp_path / "confirmed"
        wait_for(
            lambda: confirmed_file.exists() and confirmed_file.read_text().count("\n") >= 400,
            timeout=60,
        )
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
    confirmed = {int(line) for line in confirmed_file.read_text().split()}
    persistent = MessageStore(tmp_path / "msg_store_persistent")
    transient = MessageStore(tmp_path / "msg_store_transient")
    queue = VariableQueue(
        tmp_path / "queues" / "q",
        segment_entry_count=16,
        persistent_store=lambda ref: LocalStoreClient(persistent, ref),
        transient_store=lambda ref: LocalStoreClient(transient, ref),
        shared_store_clean=persistent.recovered_clean,
    )
    try:
        back = drain(queue)
        numbers = [number(d) for d in back]
        assert confirmed <= set(numbers)
        assert numbers == sorted(numbers) and all(n % 5 != 0 for n in numbers)
        assert all(d.redelivered for d in back)
    finally:
        queue.terminate()
        persistent.close()
        transient.close()


def test_the_walker_counts_each_queue_holding_a_shared_message(tmp_path):
    store = MessageStore(tmp_path / "msg_store_persistent")
    transient = MessageStore(tmp_path / "msg_store_transient")
    queues = [
        VariableQueue(
            tmp_path / "queues" / name,
            segment_entry_count=N,
            persistent_store=lambda ref: LocalStoreClient(store, ref),
            transient_store=lambda ref: LocalStoreClient(transient, ref),
        )
        for name in ("a", "b")
    ]
    shared_id, only_a, small = os.urandom(16), os.urandom(16), os.urandom(16)
    for queue in queues:
        queue.publish(message(0, size=5000), msg_id=shared_id)
    queues[0].publish(message(1, size=5000), msg_id=only_a)
    queues[0].publish(message(2, size=10), msg_id=small)  # in a's own store
    queues[0].publish(message(3, size=5000, persistent=False))  # transient
    acked = queues[1].fetch()
    queues[1].ack([acked.seq_id])
    queues[0].terminate()
    queues[1].abandon()
    store.close()
    walk = walk_ref_counts([tmp_path / "queues" / "a", tmp_path / "queues" / "b"])
    counted = {}
    for msg_id, count in walk:
        counted[msg_id] = counted.get(msg_id, 0) + count
    assert counted == {shared_id: 1, only_a: 1}
    assert len(walk.client_refs) == 1
    transient.close()


def test_the_walker_skips_a_segment_the_queues_own_recovery_deletes(tmp_path):
    """A header with one bit flipped outside its magic: the queue's dirty recovery deletes
    the segment, so the walker must not count its entries either (a reference no queue
    holds would keep the message in the store for good)."""
    store = MessageStore(tmp_path / "msg_store_persistent")
    transient = MessageStore(tmp_path / "msg_store_transient")

    def open_queue():
        return VariableQueue(
            tmp_path / "queues" / "a",
            segment_entry_count=N,
            persistent_store=lambda ref: LocalStoreClient(store, ref),
            transient_store=lambda ref: LocalStoreClient(transient, ref),
        )

    queue = open_queue()
    ids = [os.urandom(16) for _ in range(N + 2)]  # the first segment full, two in the next
    for n, msg_id in enumerate(ids):
        queue.publish(message(n, size=SIZE_LARGE), msg_id=msg_id)
    queue.sync()
    queue.abandon()
    index_file = tmp_path / "queues" / "a" / "0.qi"
    damaged = bytearray(index_file.read_bytes())
    damaged[20] ^= 0x01  # padding inside the 64-byte header, past the magic
    index_file.write_bytes(bytes(damaged))

    walk = walk_ref_counts([tmp_path / "queues" / "a"])
    counted = {msg_id for msg_id, _ in walk}
    assert counted == set(ids[N:]) and walk.skipped == 1
    queue = open_queue()
    assert [number(d) for d in drain(queue)] == [N, N + 1]
    queue.terminate()
    store.close()
    transient.close()


def test_a_killed_store_of_a_node_with_queues_takes_its_counts_from_their_indexes(tmp_path):
    with Node(tmp_path / "data") as node:
        queue = VariableQueue(
            tmp_path / "data" / "queues" / "orders",
            segment_entry_count=N,
            persistent_store=lambda ref: StoreClient(node.store("msg_store_persistent"), ref),
            transient_store=lambda ref: StoreClient(node.store("msg_store_transient"), ref),
        )
        for n in range(20):
            queue.publish(message(n, size=5000))
        queue.sync()
        queue.ack([queue.fetch().seq_id for _ in range(5)])
        queue.sync()
        stray = StoreClient(node.store())
        for _ in range(30):
            stray.write(os.urandom(16), b"no queue holds this")
        stray.settle()
        queue.abandon()
        old = node.store().pid
        os.kill(old, signal.SIGKILL)
        wait_for(lambda: getattr(node.actors.whereis("msg_store_persistent"), "pid", old) != old)
        figures = node.store("msg_store_persistent").ask(StoreStats())
        assert not figures["recovered_clean"] and figures["message_count"] == 15


def as_format_1(directory: str, entry_count: int) -> None:
    """Rewrite a queue directory's segment files as Warren's format version 1 laid them
    out: each ``<seg>.qi`` its header and slots (up to its last written slot), the
    records in ``<seg>.qs`` after a header of their own; the recovery terms, if any,
    name the new sizes, as that version's clean stop wrote them."""
    shift = records_at(entry_count) - HEADER_BYTES
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".qi"):
            continue
        segment = int(name[: -len(".qi")])
        with open(os.path.join(directory, name), "rb") as file:
            data = file.read()
        slots = bytearray(data[: records_at(entry_count)])
        slots[:HEADER_BYTES] = index_segment_header(segment, entry_count, 1)
        for at in range(HEADER_BYTES, len(slots), SLOT_BYTES):
            if slots[at]:
                entry = unpack_slot(
                    segment * entry_count + (at - HEADER_BYTES) // SLOT_BYTES,
                    bytes(slots[at : at + SLOT_BYTES]),
                )
                if not entry.shared:
                    slots[at : at + SLOT_BYTES] = pack_slot(
                        entry.msg_id,
                        False,
                        entry.store_offset - shift,
                        entry.size,
                        entry.persistent,
                        entry.expiry_ms,
                    )
        end = len(slots)
        while end > HEADER_BYTES and not any(slots[end - SLOT_BYTES : end]):
            end -= SLOT_BYTES
        with open(os.path.join(directory, name), "wb") as file:
            file.write(slots[:end])
        records = data[records_at(entry_count) :]
        if records:
            with open(os.path.join(directory, f"{segment}.qs"), "wb") as file:
                file.write(segment_header(b"WQST", 1, segment, entry_count) + records)
    terms_path = os.path.join(directory, "recovery.json")
    if os.path.exists(terms_path):
        with open(terms_path) as file:
            terms = json.load(file)
        terms["file_sizes"] = {
            name: os.path.getsize(os.path.join(directory, name))
            for name in os.listdir(directory)
            if name.endswith((".qi", ".qs"))
        }
        with open(terms_path, "w") as file:
            json.dump(terms, file)


def _format_versions(directory: str) -> set[int]:
    versions = set()
    for name in os.listdir(directory):
        if name.endswith(".qi"):
            with open(os.path.join(directory, name), "rb") as file:
                versions.add(file.read(5)[4])
    return versions


@pytest.mark.parametrize("stop", ["clean", "dirty"])
def test_a_queue_left_in_the_previous_file_format_opens_with_every_message(open_queue, stop):
    queue = open_queue()
    for n in range(3 * N):  # small ones in the queue's own records, large ones shared
        queue.publish(message(n, size=SIZE_LARGE if n % 3 == 0 else 100))
    queue.sync()
    acked = [queue.fetch(), queue.fetch()]  # two slots acked: zeros in the old index
    queue.ack([d.seq_id for d in acked])
    queue.sync()
    queue.terminate() if stop == "clean" else queue.abandon()
    as_format_1(queue.directory, N)
    assert any(name.endswith(".qs") for name in os.listdir(queue.directory))
    queue = open_queue()
    assert queue.recovered_clean == (stop == "clean")
    assert not [name for name in os.listdir(queue.directory) if name.endswith(".qs")]
    assert _format_versions(queue.directory) == {2}
    assert [number(d) for d in drain(queue)] == list(range(2, 3 * N))


def test_an_upgrade_a_crash_cut_short_is_finished_at_the_next_open(open_queue):
    queue = synced_queue(open_queue, 3 * N)
    queue.abandon()
    directory = queue.directory
    with open(os.path.join(directory, "1.qi"), "rb") as file:
        upgraded = file.read()  # segment 1 as the upgrade writes it
    as_format_1(directory, N)
    # The crash: segment 1 renamed into place but its old records not deleted yet, and
    # segment 2 half written aside.
    with open(os.path.join(directory, "1.qi"), "wb") as file:
        file.write(upgraded)
    with open(os.path.join(directory, "2.qi.upgrade"), "wb") as file:
        file.write(b"half a segment")
    queue = open_queue()
    assert sorted(os.listdir(directory)) == [".lock", "0.qi", "1.qi", "2.qi", "store_clients"]
    assert _format_versions(directory) == {2}
    assert [number(d) for d in drain(queue)] == list(range(3 * N))


def test_an_upgrade_that_finds_the_disk_full_leaves_the_segment_as_it_was(open_queue, monkeypatch):
    queue = synced_queue(open_queue, N)
    queue.abandon()
    as_format_1(queue.directory, N)
    pwritev = os.pwritev
    monkeypatch.setattr(os, "pwritev", lambda fd, buffers, offset: pwritev(fd, buffers[:1], offset))
    with pytest.raises(OSError, match="short write"):
        open_queue()
    assert _format_versions(queue.directory) == {1}
    monkeypatch.setattr(os, "pwritev", pwritev)
    queue = open_queue()
    assert [number(d) for d in drain(queue)] == list(range(N))


def test_a_damaged_segment_header_makes_the_start_after_a_clean_stop_dirty(open_queue, caplog):
    queue = synced_queue(open_queue, 3 * N)
    queue.terminate()
    with open(os.path.join(queue.directory, "1.qi"), "r+b") as file:
        file.seek(20)
        file.write(b"\xff")  # its size unchanged: the clean stop's size check passes
    with caplog.at_level(logging.WARNING, logger="warren.queues"):
        queue = open_queue()
    assert not queue.recovered_clean and queue.counters["bad_segments"] == 1
    assert [number(d) for d in drain(queue)] == list(range(N)) + list(range(2 * N, 3 * N))
    assert "damaged header" in caplog.text

"""Super streams (RabbitMQ's partitioned streams): declared whole with their partitions,
routed by the hash RabbitMQ's stream clients use, read over every partition or one, kept
whole across a restart, deleted whole; and single active consumers in a named group,
which share the partitions and take over from a member that goes."""

import subprocess
import sys
import threading
from collections import Counter

import pytest

from warren import connect
from warren.queues.broker.single_active import (
    ELECTION_DELAY_S,
    MEMBER_LEASE_S,
    ActiveConsumers,
)
from warren.queues.errors import InvalidArgument, NotFound, PreconditionFailed
from warren.queues.routing import murmur3_32, partition_of
from warren.supervisor import Node

from ...waiting import wait_for


def test_murmur3_gives_the_reference_hashes():
    # MurmurHash3 x86_32's published test vectors
    assert murmur3_32(b"", 0) == 0
    assert murmur3_32(b"", 1) == 0x514E28B7
    assert murmur3_32(b"hello", 0) == 0x248BFA47
    assert murmur3_32(b"The quick brown fox jumps over the lazy dog", 0) == 0x2E4FF723
    assert murmur3_32(b"test", 0x9747B28C) == 0x704B81DC
    # every tail length, with RabbitMQ's stream clients' seed
    assert [partition_of(key, 3) for key in ("a", "ab", "abc", "abcd", "abcde")] == [
        murmur3_32(key.encode()) % 3 for key in ("a", "ab", "abc", "abcd", "abcde")
    ]


def test_a_super_stream_routes_each_key_to_one_partition_in_order(node):
    connection = connect(node.data_dir)
    declared = connection.declare_queue("invoices", type="super-stream", partitions=3)
    assert declared.queue == "invoices" and declared.message_count == 0
    assert connection.partitions("invoices") == ["invoices-0", "invoices-1", "invoices-2"]
    assert {"invoices-0", "invoices-1", "invoices-2"} <= set(connection.list_queues())
    keys = [f"customer-{n}" for n in range(30)]
    for round_ in range(3):
        for key in keys:
            connection.publish(key, f"{key} #{round_}".encode(), exchange="invoices")
    for index in range(3):
        reader = connection.consume(f"invoices-{index}", offset="first")
        got = [reader.get(timeout=10) for _ in range(3 * keys_in(keys, index))]
        assert [d.offset for d in got] == list(range(len(got)))
        assert reader.get(timeout=0) is None
        bodies = [d.body.decode() for d in got]
        for key in keys:
            mine = [body for body in bodies if body.startswith(f"{key} ")]
            expected = [f"{key} #{r}" for r in range(3)] if partition_of(key, 3) == index else []
            assert mine == expected  # each key whole in its partition, in publish order
        reader.cancel()
    connection.close()


def keys_in(keys: list[str], index: int) -> int:
    return sum(partition_of(key, 3) == index for key in keys)


def test_a_consumer_over_the_super_stream_reads_every_partition(node):
    connection = connect(node.data_dir)
    connection.declare_queue("events", type="super-stream", partitions=4, max_age="1D")
    bodies = [b"event %d" % n for n in range(400)]
    for body in bodies:
        connection.publish(body.decode(), body, exchange="events")
    got = []
    with connection.consume("events", offset="first") as reader:
        while len(got) < len(bodies) and (delivery := reader.get(timeout=60)) is not None:
            got.append(delivery)
    assert sorted(d.body for d in got) == sorted(bodies)
    by_partition: dict[str, list[int]] = {}
    for delivery in got:
        by_partition.setdefault(delivery.stream, []).append(delivery.offset)
    assert set(by_partition) == {"events-0", "events-1", "events-2", "events-3"}
    assert all(offsets == sorted(offsets) for offsets in by_partition.values())
    connection.close()


def test_a_super_stream_keeps_its_shape_and_refuses_to_change_it_piece_by_piece(node):
    connection = connect(node.data_dir)
    connection.declare_queue("orders", type="super-stream", partitions=2)
    connection.declare_queue("orders", type="super-stream", partitions=2)  # alike: fine
    with pytest.raises(PreconditionFailed, match="has 2 partitions, not 3"):
        connection.declare_queue("orders", type="super-stream", partitions=3)
    with pytest.raises(PreconditionFailed, match="max_age"):
        connection.declare_queue("orders", type="super-stream", partitions=2, max_age="1h")
    with pytest.raises(PreconditionFailed, match="super stream 'orders'"):
        connection.delete_queue("orders-1")
    with pytest.raises(PreconditionFailed, match="super stream 'orders'"):
        connection.unbind_queue("orders-1", "orders", "1")
    connection.declare_queue("audit", type="stream")
    with pytest.raises(PreconditionFailed, match="super stream 'orders'"):
        connection.bind_queue("audit", "orders", "2")
    with pytest.raises(PreconditionFailed, match="super stream 'orders'"):
        connection.delete_exchange("orders")
    with pytest.raises(PreconditionFailed, match="a super stream's name"):
        connection.declare_queue("orders")  # a consume or a delete of it means the whole
    connection.declare_queue("orders-1", type="stream")  # a partition, as the stream it is
    connection.declare_queue("taken-1")
    with pytest.raises(PreconditionFailed, match="'taken-1' exists"):
        connection.declare_queue("taken", type="super-stream", partitions=2)
    assert "taken" not in {e["name"] for e in connection.list_exchanges()}
    for bad in (0, 257, "3", None):
        with pytest.raises(InvalidArgument, match="partitions=N"):
            connection.declare_queue("bad", type="super-stream", partitions=bad)
    with pytest.raises(InvalidArgument, match="durable"):
        connection.declare_queue("bad", type="super-stream", partitions=2, durable=False)
    with pytest.raises(InvalidArgument, match="super stream"):
        connection.declare_queue("fake-0", type="stream", super_stream="fake", partition=0)
    with pytest.raises(InvalidArgument, match="exchange kind"):
        connection.declare_exchange("hashing", "super-stream")
    connection.close()


def test_a_super_stream_survives_a_restart_and_is_deleted_whole(tmp_path):
    data = tmp_path / "data"
    with Node(data) as node:
        connection = connect(node.data_dir)
        connection.declare_queue("metrics", type="super-stream", partitions=3)
        for n in range(30):
            connection.publish(f"host-{n}", b"%d" % n, exchange="metrics")
        connection.close()
    with Node(data) as node:
        connection = connect(node.data_dir)
        assert connection.declare_queue("metrics", passive=True).message_count == 30
        assert connection.partitions("metrics") == ["metrics-0", "metrics-1", "metrics-2"]
        connection.publish("host-1", b"after", exchange="metrics")
        assert connection.delete_queue("metrics") == 31
        assert not any(q.startswith("metrics") for q in connection.list_queues())
        with pytest.raises(NotFound):
            connection.partitions("metrics")
        connection.declare_queue("metrics", type="super-stream", partitions=5)  # anew
        assert len(connection.partitions("metrics")) == 5
        connection.close()


def test_the_active_member_is_spread_by_partition_and_handed_on_only_when_released():
    now = [0.0]
    partitions = [ActiveConsumers(index, clock=lambda: now[0]) for index in range(4)]
    assert partitions[0].beat("billing", "b", False, False) == "standby"  # just started
    now[0] = ELECTION_DELAY_S  # every member that was there has beaten since

    def turns(member: str, **flags: bool) -> list[str]:
        return [p.beat("billing", member, flags.get("release", False), False) for p in partitions]

    assert turns("b") == ["active"] * 4  # alone: every partition
    assert turns("a") == ["standby"] * 4  # "a" sorts first: wanted at partitions 0, 2
    assert turns("b") == ["step-down", "active", "step-down", "active"]
    assert turns("a") == ["standby"] * 4  # not before "b" released
    assert turns("b", release=True) == ["standby", "active", "standby", "active"]
    assert turns("a") == ["active", "standby", "active", "standby"]
    now[0] += MEMBER_LEASE_S / 2
    turns("a")
    now[0] += MEMBER_LEASE_S / 2 + 0.1  # "b" unheard of for longer than its lease
    assert turns("a") == ["active"] * 4
    assert turns("b") == ["standby"] * 4  # came back late: its turn passed, no step-down
    assert partitions[1].groups() == {"billing": {"members": 2, "active": "a"}}


CONSUMER = """
import sys
from warren import connect
connection = connect(sys.argv[1])
reader = connection.consume("jobs", offset="first", name="workers", single_active=True)
print("ready", flush=True)
while True:
    delivery = reader.get(timeout=1)
    if delivery is not None:
        print(delivery.stream, delivery.body.decode(), flush=True)
"""


def test_members_of_a_group_share_the_partitions_and_take_over_from_one_killed(node):
    connection = connect(node.data_dir)
    connection.declare_queue("jobs", type="super-stream", partitions=4)
    partitions = connection.partitions("jobs")
    member = connection.consume("jobs", offset="first", name="workers", single_active=True)
    here: list[str] = []  # the bodies read by this member
    there: list[str] = []  # the lines the other member printed
    other = subprocess.Popen(
        [sys.executable, "-c", CONSUMER, str(node.data_dir)], stdout=subprocess.PIPE, text=True
    )
    reading = threading.Thread(target=lambda: there.extend(iter(other.stdout.readline, "")))

    def read_here() -> list[str]:
        """What this member read so far (its reads, and so its beats, kept up)."""
        while (delivery := member.get(timeout=0.1)) is not None:
            here.append(delivery.body.decode())
        return here

    def active_members(members: int = 2) -> dict[str, str]:
        """Each partition's active member where the group has ``members``, this member's
        reads (and so its beats) kept up meanwhile."""
        read_here()
        groups = [connection.queue_stats(p)["consumer_groups"].get("workers") for p in partitions]
        return {
            p: g["active"]
            for p, g in zip(partitions, groups, strict=True)
            if g and g["members"] == members
        }

    def publish(jobs: range) -> dict[str, str]:
        for n in jobs:
            connection.publish(f"job-{n}", b"job %d" % n, exchange="jobs")
        return {f"job {n}": partitions[partition_of(f"job-{n}", 4)] for n in jobs}

    try:
        reading.start()
        wait_for(lambda: "ready\n" in there, timeout=60)
        # Both members beat; the partitions split two and two between them.
        wait_for(lambda: sorted(Counter(active_members().values()).values()) == [2, 2], timeout=60)
        actives = active_members()
        mine = {p for p, m in actives.items() if m == member.member}
        routed = publish(range(40))
        expected_here = {job for job, p in routed.items() if p in mine}
        wait_for(lambda: set(read_here()) >= expected_here, timeout=60)
        assert set(here) == expected_here  # nothing of the other member's partitions
        wait_for(
            lambda: (
                {line.split(" ", 1)[1].strip() for line in there[1:]} >= set(routed) - expected_here
            ),
            timeout=60,
        )
        other.kill()  # without leaving: its lease runs out, its partitions pass here
        other.wait()
        wait_for(
            lambda: list(active_members(members=1).values()) == [member.member] * 4,
            timeout=60,
        )
        here.clear()
        routed = publish(range(40, 80))
        wait_for(lambda: set(read_here()) >= set(routed), timeout=60)
    finally:
        other.kill()
        other.wait()
        if reading.is_alive():
            reading.join(timeout=60)
        member.cancel()
        connection.close()


def test_a_spark_write_hashes_a_column_of_keys_as_the_client_hashes_each():
    pyarrow = pytest.importorskip("pyarrow", reason="the spark extra (pyarrow) hashes columns")
    from warren.queues.client.spark_partitions import SLICE_ROWS, key_partitions, row_partition

    keys = [None, "", "a", "ab", "abc", "abcd", "abcde", "h\u00e9llo w\u00f6rld", "x" * 300]
    keys += [f"customer-{n}" for n in range(SLICE_ROWS + 100)]  # more than one slice
    column = pyarrow.array(keys)
    for sliced in (column, column.slice(3, SLICE_ROWS)):
        expected = [row_partition(key, 7, keyless=5) for key in sliced.to_pylist()]
        assert key_partitions(sliced, 7, keyless=5).tolist() == expected
    binary = pyarrow.array([key.encode() if key is not None else None for key in keys])
    assert key_partitions(binary, 3, 0).tolist() == [row_partition(k, 3, 0) for k in keys]
    for nothing in ([None, None], ["", ""], []):  # no key bytes at all
        assert key_partitions(pyarrow.array(nothing, pyarrow.string()), 3, 2).tolist() == [
            row_partition(k, 3, 2) for k in nothing
        ]
    long_ones = ["k" * 100_000, None, "short", "\u00e9" * 5_000]  # hashed alone, not padded
    assert key_partitions(pyarrow.array(long_ones), 5, 1).tolist() == [
        row_partition(k, 5, 1) for k in long_ones
    ]


def test_an_active_member_waiting_for_records_keeps_its_turn_past_the_lease(node):
    connection, other = connect(node.data_dir), connect(node.data_dir)
    try:
        connection.declare_queue("tasks", type="stream")
        first = connection.consume("tasks", offset="first", name="g", single_active=True)

        def active() -> str | None:
            group = connection.queue_stats("tasks")["consumer_groups"].get("g")
            return group and group["active"]

        read_again = []  # what a member read that it should not have

        def reads_nothing_until(member, consumer) -> bool:
            """``consumer`` read nothing (its reads beat) until ``member`` is active."""
            if (delivery := consumer.get(timeout=0.2)) is not None:
                read_again.append(delivery.body)
            return active() == member.member

        wait_for(lambda: reads_nothing_until(first, first), timeout=60)  # made active
        second = other.consume("tasks", offset="first", name="g", single_active=True)
        second.get(timeout=0.1)
        assert active() == first.member
        waiting = threading.Thread(target=first.get, args=(MEMBER_LEASE_S + 2,))
        waiting.start()  # one wait longer than the lease, nothing published
        while waiting.is_alive():
            assert second.get(timeout=0.2) is None
        assert active() == first.member  # it beat while it waited
        connection.publish("tasks", b"one")
        assert first.get(timeout=10).body == b"one"
        assert second.get(timeout=1) is None
        first.cancel()  # leaves: the other takes over after the stored offset
        wait_for(lambda: reads_nothing_until(second, second), timeout=60)
        assert read_again == [] and active() == second.member
        connection.publish("tasks", b"two")
        assert second.get(timeout=10).body == b"two"
        second.cancel()
    finally:
        connection.close()
        other.close()

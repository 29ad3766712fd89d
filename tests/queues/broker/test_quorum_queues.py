"""Quorum queues on a node: what a publisher was confirmed survives kill -9 of the queue's
process, of the WAL's and of the whole node, and a stop by signal; delivery counts, the
delivery limit with and without a dead-letter exchange, a single active consumer, the
arguments refused, the same queue declared over AMQP and from the command line, and a
stray message to the WAL that changes nothing."""

import os
import signal
import struct
import subprocess

import pika
import psutil
import pytest

from warren import connect
from warren.actors import RemoteError
from warren.queues.broker.wal_actor import WAL_NAME, WalAppend, WalStats
from warren.queues.engine import ra_log
from warren.queues.errors import InvalidArgument
from warren.queues.protocol import Fetch, Release, Subscribe
from warren.supervisor import Node

from ...supervisor.node.test_metrics import scrape
from ...waiting import wait_for
from ..client.node_process import WARREN, NodeProcess
from .test_broker import restarted


def drain(connection, queue):
    """Every message of ``queue``, taken (no acks)."""
    out = []
    while (delivery := connection.get(queue, ack=False)) is not None:
        out.append(delivery)
    return out


def test_confirmed_messages_survive_kill_9_of_the_queue_the_wal_and_the_whole_node(tmp_path):
    node = NodeProcess(tmp_path / "data")
    try:
        with connect(node.target("ipc")) as connection:
            connection.declare_queue("orders", type="quorum")
            connection.publish_many("orders", [b"a%d" % n for n in range(300)])
            held = connection.get("orders")  # out when everything dies below
            assert held.body == b"a0" and held.delivery_count == 0
        old = node.queue_pid("orders")
        os.kill(old, signal.SIGKILL)
        wait_for(lambda: _pid_or_none(node, "orders") not in (None, old), timeout=60)
        with connect(node.target("ipc")) as connection:
            wait_for(lambda: connection.queue_state("orders") == "running", timeout=60)
            connection.publish_many("orders", [b"b%d" % n for n in range(300)])
        wal = _titled(node, f"warren: {WAL_NAME}")
        os.kill(wal, signal.SIGKILL)  # the root restarts every queue after it
        wait_for(lambda: _titled(node, f"warren: {WAL_NAME}") not in (None, wal), timeout=60)
        with connect(node.target("ipc"), wait=60) as connection:
            wait_for(lambda: connection.queue_state("orders") == "running", timeout=60)
            connection.publish_many("orders", [b"c%d" % n for n in range(300)])
        node.kill()
        node.start()
        with connect(node.target("ipc")) as connection:
            got = drain(connection, "orders")
        expected = [b"%s%d" % (p, n) for p in (b"a", b"b", b"c") for n in range(300)]
        assert [d.body for d in got] == expected
        assert got[0].redelivered and got[0].delivery_count >= 1  # its consumer went
        # a kill -9 may lose a delivery's record (handed over without a wait): every
        # message recovered says it may have been delivered, as a classic queue's does
        assert all(d.redelivered for d in got[1:])
    finally:
        node.stop()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_to_the_whole_group_keeps_the_queue_and_its_counts(tmp_path, signum):
    node = NodeProcess(tmp_path / "data")
    try:
        with connect(node.target("ipc")) as connection:
            connection.declare_queue("orders", type="quorum", delivery_limit=5)
            connection.publish_many("orders", [b"%d" % n for n in range(100)])
            connection.get("orders").nack(requeue=True)
        node.stop_by(signum, to="group")
        node.start()
        with connect(node.target("ipc")) as connection:
            got = drain(connection, "orders")
            stats = connection.queue_stats("orders")
        assert [d.body for d in got] == [b"%d" % n for n in range(100)]
        assert got[0].delivery_count == 1
        assert stats["type"] == "quorum" and stats["snapshot_index"] > 0  # a clean stop's
    finally:
        node.stop()


def _titled(node, title):
    for child in psutil.Process(node.process.pid).children(recursive=True):
        try:
            if child.cmdline()[:1] == [title]:
                return child.pid
        except psutil.Error:
            continue
    return None


def _pid_or_none(node, queue):
    return _titled(node, f"warren: queue {queue}")


@pytest.fixture
def node(tmp_path):
    with Node(tmp_path / "data") as running:
        yield running


def test_a_message_returned_past_its_delivery_limit_is_dead_lettered(node):
    node.declare_queue("poison", type="classic")
    node.declare_queue(
        "work",
        type="quorum",
        delivery_limit=1,
        dead_letter_exchange="",
        dead_letter_routing_key="poison",
    )
    connection = node.connect()
    connection.publish("work", b"bad")
    connection.publish("work", b"good")
    for count in (0, 1):
        delivery = connection.get("work")
        assert (delivery.body, delivery.delivery_count) == (b"bad", count)
        delivery.nack(requeue=True)
    wait_for(lambda: connection.queue_stats("poison")["messages_ready"] == 1)
    dead = connection.get("poison")
    assert dead.body == b"bad"
    assert dead.headers["x-death"][0]["reason"] == "delivery_limit"
    assert dead.headers["x-death"][0]["queue"] == "work"
    assert [d.body for d in drain(connection, "work")] == [b"good"]
    wait_for(lambda: connection.queue_stats("work")["depth"] == 0)  # settled once confirmed


def test_without_a_dead_letter_exchange_a_message_past_its_limit_is_dropped(node):
    node.declare_queue("work", type="quorum", delivery_limit=0)
    connection = node.connect()
    connection.publish("work", b"bad")
    connection.get("work").reject(requeue=True)
    assert connection.get("work") is None
    stats = connection.queue_stats("work")
    assert stats["depth"] == 0 and stats["delivery_limit_reached"] == 1


def test_with_a_single_active_consumer_the_next_takes_over_when_the_first_goes(node):
    node.declare_queue("jobs", type="quorum", single_active_consumer=True)
    first, second = node.connect(), node.connect()
    active = first.consume("jobs", prefetch=10)
    waiting = second.consume("jobs", prefetch=10)
    wait_for(lambda: first.queue_stats("jobs")["consumers"] == 2)
    first.publish_many("jobs", [b"%d" % n for n in range(5)])
    got = [active.get(timeout=30) for _ in range(5)]
    assert [d.body for d in got] == [b"%d" % n for n in range(5)]
    assert waiting.get(timeout=0.5) is None  # not its turn
    got[0].ack()
    first.close()  # the four it held go back, to the next in line
    taken = [waiting.get(timeout=30) for _ in range(4)]
    assert [d.body for d in taken] == [b"%d" % n for n in range(1, 5)]
    assert all(d.redelivered for d in taken)
    second.close()


def test_a_single_active_consumers_turns_go_by_consumer_not_by_connection(node):
    """RabbitMQ's order: two consumers of one connection are two places in line, and
    another connection's consumer that came between them takes over before the second."""
    node.declare_queue("jobs", type="quorum", single_active_consumer=True)
    one, other = node.connect(), node.connect()
    first = one.consume("jobs", prefetch=10)
    second = other.consume("jobs", prefetch=10)
    third = one.consume("jobs", prefetch=10)
    one.publish("jobs", b"1")
    assert third.get(timeout=0.5) is None  # its connection's turn, but not its own
    taken = first.get(timeout=30)
    assert taken.body == b"1"
    taken.ack()
    first.cancel()
    one.publish("jobs", b"2")
    taken = second.get(timeout=30)
    assert taken.body == b"2"
    taken.ack()
    second.cancel()
    one.publish("jobs", b"3")
    taken = third.get(timeout=30)
    assert taken.body == b"3" and not taken.redelivered
    taken.ack()
    one.close()
    other.close()


def test_pika_consumers_of_one_connection_take_turns_with_another_connections(tmp_path):
    with Node(tmp_path / "data", amqp="127.0.0.1:0") as node:
        host, port = node.amqp_endpoint.rsplit(":", 1)
        parameters = pika.ConnectionParameters(host, int(port))
        clients = [pika.BlockingConnection(parameters) for _ in range(2)]
        got: dict[str, list[bytes]] = {"first": [], "second": [], "third": []}

        def consumer(client, tag):
            channel = client.channel()

            def take(ch, method, properties, body):
                got[tag].append(body)
                ch.basic_ack(method.delivery_tag)

            channel.basic_consume("jobs", take, consumer_tag=tag)
            return channel

        def pump_until(condition):
            def pumped():
                for client in clients:
                    if client.is_open:
                        client.process_data_events(time_limit=0.05)
                return condition()

            wait_for(pumped, timeout=30)

        publisher = clients[0].channel()
        publisher.confirm_delivery()
        arguments = {"x-queue-type": "quorum", "x-single-active-consumer": True}
        publisher.queue_declare("jobs", durable=True, arguments=arguments)
        first = consumer(clients[0], "first")
        consumer(clients[1], "second")
        consumer(clients[0], "third")
        for n in (1, 2):
            publisher.basic_publish("", "jobs", b"%d" % n, pika.BasicProperties(delivery_mode=2))
        pump_until(lambda: sum(map(len, got.values())) == 2)
        assert got == {"first": [b"1", b"2"], "second": [], "third": []}
        first.basic_cancel("first")
        publisher.basic_publish("", "jobs", b"3", pika.BasicProperties(delivery_mode=2))
        pump_until(lambda: sum(map(len, got.values())) == 3)
        assert got["second"] == [b"3"]  # the next consumer, on the other connection
        clients[1].close()
        publisher.basic_publish("", "jobs", b"4", pika.BasicProperties(delivery_mode=2))
        pump_until(lambda: sum(map(len, got.values())) == 4)
        assert got["third"] == [b"4"]
        clients[0].close()


@pytest.mark.parametrize(
    "arguments",
    [
        {"type": "quorum", "durable": False},
        {"type": "quorum", "auto_delete": True},
        {"type": "quorum", "lazy": True},
        {"type": "quorum", "delivery_limit": -1},
        {"type": "quorum", "dead_letter_strategy": "exactly-once"},
        {"delivery_limit": 3},
        {"type": "stream", "single_active_consumer": True},
    ],
)
def test_arguments_a_quorum_queue_does_not_take_are_refused_before_anything_is_made(
    node, arguments
):
    with pytest.raises(InvalidArgument):
        node.connect().declare_queue("q", **arguments)
    assert node.list_queues() == []


def test_a_stray_or_malformed_message_to_the_wal_changes_nothing(node):
    node.declare_queue("orders", type="quorum")
    connection = node.connect()
    connection.publish_many("orders", [b"before"] * 10)
    wal = node.actors.whereis(WAL_NAME)
    for bad in (
        WalAppend("queues/orders", b"\x00" * 40),
        WalAppend("../../etc", b""),
        WalAppend("queues/..", b""),
        "hello",
    ):
        with pytest.raises(RemoteError):
            wal.ask(bad, timeout=30)
    connection.publish_many("orders", [b"after"] * 10)
    assert wal.ask(WalStats(), timeout=30)["syncs"] >= 2
    assert [d.body for d in drain(connection, "orders")] == [b"before"] * 10 + [b"after"] * 10


def test_pika_declares_a_quorum_queue_with_a_delivery_limit_and_sees_delivery_counts(tmp_path):
    with Node(tmp_path / "data", amqp="127.0.0.1:0") as node:
        host, port = node.amqp_endpoint.rsplit(":", 1)
        client = pika.BlockingConnection(pika.ConnectionParameters(host, int(port)))
        channel = client.channel()
        channel.confirm_delivery()
        channel.queue_declare(
            "tasks",
            durable=True,
            arguments={"x-queue-type": "quorum", "x-delivery-limit": 2},
        )
        publisher_headers = pika.BasicProperties(delivery_mode=2, headers={"kept": "yes"})
        channel.basic_publish("", "tasks", b"task", publisher_headers)
        method, properties, body = channel.basic_get("tasks")
        assert "x-delivery-count" not in (properties.headers or {})  # the first delivery
        channel.basic_nack(method.delivery_tag, requeue=True)
        method, properties, body = channel.basic_get("tasks")
        assert body == b"task" and method.redelivered
        assert properties.headers == {"kept": "yes", "x-delivery-count": 1}
        channel.basic_nack(method.delivery_tag, requeue=True)
        method, properties, _ = next(channel.consume("tasks", inactivity_timeout=30))
        assert properties.headers["x-delivery-count"] == 2  # a consumer's delivery too
        channel.basic_ack(method.delivery_tag)
        channel.cancel()
        channel.queue_declare("plain", durable=True)  # a classic queue adds no count
        channel.basic_publish("", "plain", b"x", pika.BasicProperties(delivery_mode=2))
        method, _, _ = channel.basic_get("plain")
        channel.basic_nack(method.delivery_tag, requeue=True)
        method, properties, _ = channel.basic_get("plain")
        assert method.redelivered and properties.headers is None
        channel.basic_ack(method.delivery_tag)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            client.channel().queue_declare(
                "transient", durable=False, arguments={"x-queue-type": "quorum"}
            )
        assert refused.value.reply_code == 406
        client.close()
        stats = node.connect().queue_stats("tasks")
        assert stats["type"] == "quorum" and stats["delivery_limit"] == 2


def test_the_command_line_declares_and_lists_a_quorum_queue(node):
    declared = subprocess.run(
        [
            *WARREN,
            "declare",
            "queue",
            "jobs",
            "--data-dir",
            node.data_dir,
            "--type",
            "quorum",
            "--delivery-limit",
            "3",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert declared.returncode == 0, declared.stderr
    listed = subprocess.run(
        [*WARREN, "queues", "--data-dir", node.data_dir],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert listed.returncode == 0, listed.stderr
    (row,) = [line for line in listed.stdout.splitlines() if line.startswith("jobs")]
    assert "quorum" in row
    assert node.connect().queue_stats("jobs")["delivery_limit"] == 3


def test_a_queue_restarted_alone_keeps_what_only_the_wal_held(node):
    node.declare_queue("orders", type="quorum")
    connection = node.connect()
    connection.publish_many("orders", [b"%d" % n for n in range(50)])
    old = node.queue("orders").pid
    os.kill(old, signal.SIGKILL)
    wait_for(lambda: restarted(node, "orders", old), timeout=60)
    assert [d.body for d in drain(node.connect(), "orders")] == [b"%d" % n for n in range(50)]


def test_a_deep_queue_holds_its_bodies_in_its_log_not_in_ram_and_serves_them_in_order(node):
    """100 MiB published: once the WAL's rollover (at 64 MiB) has written them to the
    queue's segments, their bodies leave the queue's RAM; all are served, in order."""
    node.declare_queue("deep", type="quorum")
    connection = node.connect()
    body = b"." * 1020
    for batch in range(100):
        connection.publish_many("deep", [b"%04d" % batch + body] * 1_000)
    assert connection.queue_stats("deep")["depth"] == 100_000
    # 100 MiB were published: the queue's timer sheds what the segments hold, with or
    # without more publishes
    wait_for(lambda: connection.queue_stats("deep")["ram_bytes"] < 64 * 2**20, timeout=60)
    consumer = connection.consume("deep", prefetch=1_000)
    for batch in range(100):
        got = [consumer.get(timeout=60) for _ in range(1_000)]
        assert {d.body for d in got} == {b"%04d" % batch + body}
        got[-1].ack(multiple=True)
    consumer.cancel()
    assert connection.queue_stats("deep")["depth"] == 0


def test_acks_no_one_waits_on_are_synced_soon_and_a_killed_wal_loses_none(node):
    node.declare_queue("orders", type="quorum")
    connection = node.connect()
    connection.publish_many("orders", [b"%d" % n for n in range(20)])
    wal = node.actors.whereis(WAL_NAME)
    acked = [connection.get("orders") for _ in range(10)]
    for delivery in acked:
        delivery.ack()
    # the settles reach the WAL's file at once, and are fdatasync'd without a publish
    wal_dir = os.path.join(node.data_dir, ra_log.QUORUM_DIRECTORY, ra_log.WAL_DIRECTORY)
    wait_for(lambda: len(settled_in(wal_dir, "queues/orders")) == 10, timeout=30)
    wait_for(lambda: wal.ask(WalStats(), timeout=30)["unsynced"] == 0, timeout=30)
    queue_pid = node.queue("orders").pid
    os.kill(wal.pid, signal.SIGKILL)  # the queue restarts after it, from the log
    wait_for(lambda: restarted(node, "orders", queue_pid), timeout=60)
    remaining = [d.body for d in drain(node.connect(), "orders")]
    assert remaining == [b"%d" % n for n in range(10, 20)]


def settled_in(wal_dir, owner):
    """The indexes the WAL's files hold settles of, for the queue ``owner``."""
    settled = set()
    for name in sorted(os.listdir(wal_dir)):
        with open(os.path.join(wal_dir, name), "rb") as file:
            records = ra_log.unpack_records(file.read())
            for record_owner, entry in records:
                if record_owner == owner.encode() and entry.command[:1] == b"S":
                    body = entry.command[1:]
                    settled.update(struct.unpack(f">{len(body) // 8}Q", body))
    return settled


def test_a_scrape_shows_each_quorum_queues_log_and_the_wals_syncs(tmp_path):
    with Node(tmp_path / "data", http="127.0.0.1:0") as node:
        node.declare_queue("orders", type="quorum")
        node.declare_queue("plain")
        connection = node.connect()
        connection.publish_many("orders", [b"x"] * 10)
        connection.get("orders", ack=False)
        samples = scrape(node, "/metrics/per-object")
        assert samples[("warren_quorum_queue_last_written_index", (("queue", "orders"),))] >= 10
        assert ("warren_quorum_queue_snapshot_index", (("queue", "orders"),)) in samples
        assert ("warren_quorum_queue_snapshot_index", (("queue", "plain"),)) not in samples
        assert scrape(node)[("warren_wal_syncs_total", ())] >= 1


def test_a_waiting_consumers_parked_fetch_does_not_hold_back_the_active_ones(node):
    node.declare_queue("jobs", type="quorum", single_active_consumer=True)
    queue = node.queue("jobs")
    active, waiting = b"active-consumer!", b"waiting-consumer"
    for consumer in (active, waiting):
        queue.ask(Subscribe(consumer, os.getpid(), True, 10), timeout=30)
    waiting_fetch = queue.ask_async(Fetch(waiting, os.getpid(), 10, True, 60_000))
    active_fetch = queue.ask_async(Fetch(active, os.getpid(), 10, True, 60_000))
    node.connect().publish("jobs", b"job")
    (delivered,) = active_fetch.get(timeout=30)  # not after the waiting one's minute
    assert b"job" in delivered.payload
    queue.tell(Release(waiting))
    assert waiting_fetch.get(timeout=30) == []
    queue.tell(Release(active))

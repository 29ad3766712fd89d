"""Queues as processes in a node, through the client API: publish with confirms, get and
consume with acks, durable declarations, and what survives when a queue, a consumer or
the persistent store is killed."""

import contextlib
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from warren import AlarmLimits, connect
from warren.actors import ActorDeadError, AskTimeout, RemoteError, SpawnError
from warren.queues import (
    Blocked,
    Message,
    Nacked,
    NotFound,
    PreconditionFailed,
    UnknownDeliveryTag,
    Unroutable,
    encode,
)
from warren.queues.broker.definitions import LOG_PREFIX as DEFINITIONS_LOG_PREFIX
from warren.queues.broker.definitions import Definitions, queue_directory
from warren.queues.broker.queue_actor import QueueActor
from warren.queues.errors import ConnectionClosed, InvalidArgument, NodeNotRunning, QueueRestarting
from warren.queues.message import MAX_MESSAGE_BYTES
from warren.queues.protocol import Fetch, Publish, QueueDefinition, QueueStats, Release, Subscribe
from warren.store.client import StoreClient
from warren.store.disk_faults import ENVIRONMENT_VARIABLE, write_faults
from warren.supervisor import Node
from warren.supervisor.node.node import QUEUE_FLAGS

from ...supervisor.sample_actors import gated_worker
from ...waiting import wait_for
from ..helpers import drained, fail_the_next_fdatasync, store_messages

ROOT = Path(__file__).resolve().parents[3]


def restarted(node, name, old_pid):
    """True once queue ``name`` runs in a process other than ``old_pid``."""
    try:
        return node.queue(name).pid != old_pid
    except NotFound:
        return False  # between its death and its restart


@pytest.fixture
def data_dir(tmp_path):
    return tmp_path / "data"


def forget_the_definition(data_dir, name: str) -> None:
    """Remove queue ``name``'s definition from the stopped node on ``data_dir``, its files
    left: what a lost or restored definitions file leaves."""
    lost = Definitions(str(data_dir))
    lost.remove_queue(name)
    lost.save()
    lost.close()


@pytest.fixture
def node(data_dir):
    with Node(data_dir) as running:
        yield running


def test_a_published_message_is_confirmed_fetched_and_acked(node):
    node.declare_queue("orders")
    connection = node.connect()
    connection.publish("orders", b"order 1", headers={"region": "eu"}, message_id="o-1")
    delivery = connection.get("orders")
    assert (delivery.body, delivery.headers, delivery.message_id) == (
        b"order 1",
        {"region": "eu"},
        "o-1",
    )
    assert not delivery.redelivered
    delivery.ack()
    assert connection.get("orders") is None
    stats = connection.queue_stats("orders")
    assert (stats["messages_ready"], stats["messages_unacked"]) == (0, 0)


def test_a_queue_is_a_process_of_its_own_titled_by_its_name(node):
    node.declare_queue("orders")
    process = psutil.Process(node.queue("orders").pid)
    assert process.cmdline()[0] == "warren: queue orders"
    assert process.pid != os.getpid()


def test_declaring_again_is_harmless_and_with_other_arguments_refused(node):
    node.declare_queue("orders")
    node.declare_queue("orders")
    with pytest.raises(PreconditionFailed, match="exists with lazy=False"):
        node.declare_queue("orders", lazy=True)
    with pytest.raises(ValueError, match="queue name"):
        node.declare_queue("line\nbreak")
    assert node.list_queues() == ["orders"]


def test_a_declare_counts_the_messages_a_directory_left_without_its_definition_holds(
    data_dir,
):
    with Node(data_dir) as node:
        assert node.declare_queue("orders") == {
            "queue": "orders",
            "message_count": 0,
            "consumer_count": 0,
        }
        node.connect().publish_many("orders", [b"a", b"b", b"c"])
    forget_the_definition(data_dir, "orders")
    with Node(data_dir) as node:
        assert node.list_queues() == []
        assert node.declare_queue("orders") == {
            "queue": "orders",
            "message_count": 3,
            "consumer_count": 0,
        }
        assert node.connect().get("orders").body == b"a"


def test_an_unknown_queue_is_a_clear_error(node):
    connection = node.connect()
    with pytest.raises(NotFound, match="declare it first"):
        connection.publish("nowhere", b"x")


def test_publish_many_and_consume_with_prefetch_see_every_message_in_order(node):
    node.declare_queue("orders")
    connection = node.connect()
    assert connection.publish_many("orders", (b"%d" % n for n in range(3000))) == 3000
    seen = []
    with connection.consume("orders", prefetch=50) as consumer:
        for delivery in consumer:
            assert connection.held("orders") <= 50
            seen.append(int(delivery.body))
            delivery.ack()
            if len(seen) == 3000:
                break
    assert seen == list(range(3000))


def test_publish_async_confirms_arrive_and_wait_for_confirms_waits_for_all(node):
    node.declare_queue("orders")
    connection = node.connect()
    confirms = [connection.publish_async("orders", b"x" * 5000) for _ in range(100)]
    confirms += [connection.publish_async("orders", b"small") for _ in range(5000)]
    connection.wait_for_confirms(timeout=30)
    assert all(confirm.done() for confirm in confirms)
    assert connection.queue_stats("orders")["messages_ready"] == 5100


def test_nack_requeues_reject_drops_and_multiple_settles_the_earlier_ones(node):
    node.declare_queue("orders")
    connection = node.connect()
    connection.publish_many("orders", [b"0", b"1", b"2", b"3"])
    first, second, third, fourth = (connection.get("orders") for _ in range(4))
    first.nack(requeue=True)
    second.reject(requeue=False)
    fourth.ack(multiple=True)  # third and fourth
    again = connection.get("orders")
    assert (again.body, again.redelivered, again.delivery_count) == (b"0", True, 1)
    again.ack()
    assert connection.get("orders") is None
    with pytest.raises(UnknownDeliveryTag, match="not awaiting an ack"):
        third.ack()


def test_closing_a_connection_hands_its_unacked_deliveries_back(node):
    node.declare_queue("orders")
    connection = node.connect()
    connection.publish_many("orders", [b"a", b"b"])
    assert connection.get("orders").body == b"a"
    connection.close()
    with pytest.raises(ConnectionClosed):
        connection.get("orders")
    other = node.connect()
    wait_for(lambda: other.queue_stats("orders")["messages_ready"] == 2)
    assert [other.get("orders", ack=False).body for _ in range(2)] == [b"a", b"b"]


def test_a_durable_queue_and_its_messages_survive_a_restart_and_a_transient_one_does_not(data_dir):
    with Node(data_dir) as node:
        node.declare_queue("orders")
        node.declare_queue("scratch", durable=False)
        connection = node.connect()
        connection.publish_many("orders", [b"kept %d" % n for n in range(10)])
        connection.publish("scratch", b"gone")
        assert connection.get("orders").body == b"kept 0"  # unacked at the stop
    with Node(data_dir) as node:
        assert node.list_queues() == ["orders"]
        assert not (data_dir / "queues" / "scratch").exists()
        connection = node.connect()
        first = connection.get("orders")
        assert (first.body, first.redelivered) == (b"kept 0", True)
        rest = [connection.get("orders").body for _ in range(9)]
        assert rest == [b"kept %d" % n for n in range(1, 10)]


def test_a_killed_queue_restarts_with_every_confirmed_message_the_unacked_redelivered(node):
    node.declare_queue("orders")
    connection = node.connect()
    connection.publish_many("orders", [b"%d" % n for n in range(2 * 2048)])
    held = connection.get("orders")
    old = node.queue("orders").pid
    os.kill(old, signal.SIGKILL)
    wait_for(lambda: restarted(node, "orders", old))
    fresh = node.connect()
    first = fresh.get("orders")
    assert (first.body, first.redelivered) == (held.body, True)
    assert fresh.queue_stats("orders")["messages_ready"] == 2 * 2048 - 1


def test_a_killed_persistent_store_restarts_the_queues_and_loses_nothing_confirmed(node):
    node.declare_queue("orders")
    connection = node.connect()
    bodies = [b"%d" % n + b"x" * 5000 for n in range(200)]  # in the shared store
    connection.publish_many("orders", bodies)
    old_queue = node.queue("orders").pid
    os.kill(node.store().pid, signal.SIGKILL)
    wait_for(lambda: restarted(node, "orders", old_queue))
    fresh = node.connect()
    wait_for(lambda: fresh.queue_stats("orders")["messages_ready"] == 200)
    assert [fresh.get("orders", ack=False).body for _ in range(200)] == bodies


def test_a_queue_registers_with_its_stores_while_the_node_monitors_them_and_checks_they_match(
    node, data_dir
):
    # Given a queue declared on a running node (its process is handed the stores: it
    # registers with them while the node answers its monitor of both)
    node.declare_queue("found-ahead")
    # When a queue is started handed stores that are not the node's (the right addresses
    # the wrong way round: each registration reaches the other store)
    persistent, transient = node.store("msg_store_persistent"), node.store("msg_store_transient")
    definition = QueueDefinition("handed-wrong")
    with pytest.raises(SpawnError, match="the stores it was given .* are not the node's"):
        node.actors.spawn(
            QueueActor,
            definition,
            queue_directory(str(data_dir), definition.name),
            name="queue handed-wrong",
            data_dir=str(data_dir),
            stores=(transient.unpin(), persistent.unpin()),
        )
    # Then it does not start, while the declared queue serves (a store's kill restarts it:
    # test_a_killed_persistent_store_restarts_the_queues_and_loses_nothing_confirmed)
    connection = node.connect()
    connection.publish("found-ahead", b"served")
    assert connection.get("found-ahead").body == b"served"


def test_a_consumer_process_killed_holding_deliveries_has_them_redelivered(node, data_dir):
    node.declare_queue("orders")
    connection = node.connect()
    connection.publish_many("orders", [b"%d" % n for n in range(10)])
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.queues.consumer_child", str(data_dir), "orders", "4"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        taken = child.stdout.readline().split()
        assert taken == ["0", "1", "2", "3"]
        assert connection.queue_stats("orders")["messages_unacked"] == 4
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
    wait_for(lambda: connection.queue_stats("orders")["messages_ready"] == 10)
    again = connection.get("orders")
    assert (again.body, again.redelivered) == (b"0", True)


def test_another_process_connects_by_data_directory(node, data_dir):
    node.declare_queue("orders")
    code = (
        "import sys; from warren import connect; c = connect(sys.argv[1]); "
        "c.declare_queue('replies'); c.publish('orders', b'from afar'); "
        "print(c.list_queues())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(data_dir)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['orders', 'replies']"
    assert node.connect().get("orders").body == b"from afar"


def test_connecting_where_no_node_runs_says_so(tmp_path):
    with pytest.raises(ConnectionError, match="no node is running"):
        connect(tmp_path)


def test_a_malformed_request_is_refused_and_the_queue_keeps_serving(node):
    node.declare_queue("orders")
    ref = node.queue("orders")
    with pytest.raises(RemoteError, match="count must be"):
        ref.ask(Fetch(b"c", os.getpid(), -5, True))
    with pytest.raises(RemoteError, match="does not handle"):
        ref.ask("hello")
    with pytest.raises(RemoteError, match="expiration_ms"):  # an expiry past 64 bits
        ref.ask(Publish([encode(Message(b"too late"))], True, expiration_ms=2**64 - 1))
    connection = node.connect()
    connection.publish("orders", b"still here")
    assert connection.get("orders").body == b"still here"
    assert ref.pid == node.queue("orders").pid


def test_deleting_a_queue_removes_its_process_and_files_and_later_publishes_fail(node, data_dir):
    node.declare_queue("orders")
    connection = node.connect()
    connection.publish_many("orders", [b"x" * 5000] * 20)
    pid = node.queue("orders").pid
    assert connection.delete_queue("orders") == 20
    assert not (data_dir / "queues" / "orders").exists()
    wait_for(lambda: not psutil.pid_exists(pid))
    with pytest.raises((NotFound, ActorDeadError)):
        connection.publish("orders", b"late")
    assert node.list_queues() == []


def test_a_large_message_fanned_out_to_two_queues_is_stored_once_until_both_ack(node):
    for name in ("billing", "shipping"):
        node.declare_queue(name)
        node.declare_exchange("orders", kind="fanout")
        node.bind_queue(name, "orders")
    connection = node.connect()
    body = b"o" * 10_000
    connection.publish("any key", body, exchange="orders")
    assert store_messages(node) == 1
    billing = connection.get("billing")
    shipping = connection.get("shipping")
    assert billing.body == shipping.body == body
    billing.ack()
    wait_for(lambda: connection.queue_stats("billing")["depth"] == 0)
    assert store_messages(node) == 1  # shipping still holds it
    shipping.ack()
    wait_for(lambda: store_messages(node) == 0)


def test_direct_and_topic_exchanges_route_by_key_and_unroutable_is_refused(node):
    for name in ("eu", "us", "audit"):
        node.declare_queue(name)
    node.declare_exchange("by_region", kind="direct")
    node.bind_queue("eu", "by_region", "eu")
    node.bind_queue("us", "by_region", "us")
    node.declare_exchange("events", kind="topic")
    node.bind_queue("audit", "events", "order.#")
    node.bind_queue("eu", "events", "*.eu")
    connection = node.connect()
    connection.publish("eu", b"to eu", exchange="by_region")
    connection.publish("order.created.us", b"audited", exchange="events")
    connection.publish("refund.eu", b"eu refund", exchange="events")
    with pytest.raises(Unroutable, match="routes 'asia' to no queue"):
        connection.publish("asia", b"lost", exchange="by_region")
    connection.publish("asia", b"dropped", exchange="by_region", mandatory=False)
    bodies = {name: [] for name in ("eu", "us", "audit")}
    for name in bodies:
        while (delivery := connection.get(name, ack=False)) is not None:
            bodies[name].append(delivery.body)
    assert bodies == {"eu": [b"to eu", b"eu refund"], "us": [], "audit": [b"audited"]}


def test_a_queue_with_a_utf8_name_keeps_its_messages_across_a_restart(data_dir):
    names = ["заказы/../escape", "..", "orders"]
    with Node(data_dir) as node:
        for name in names:
            node.declare_queue(name)
            node.connect().publish(name, name.encode())
    kept = sorted(os.listdir(data_dir / "queues"))
    assert "orders" in kept and all(k == "orders" or k.startswith("~") for k in kept)
    with Node(data_dir) as node:
        assert sorted(node.list_queues()) == sorted(names)
        assert [node.connect().get(name).body for name in names] == [n.encode() for n in names]


def test_durable_exchanges_and_bindings_survive_a_restart(data_dir):
    with Node(data_dir) as node:
        node.declare_queue("billing")
        node.declare_exchange("orders", kind="fanout")
        node.bind_queue("billing", "orders")
        with pytest.raises(PreconditionFailed, match="kind='fanout'"):
            node.declare_exchange("orders", kind="topic")
    with Node(data_dir) as node:
        connection = node.connect()
        connection.publish("", b"after restart", exchange="orders")
        assert connection.get("billing").body == b"after restart"


def refuse_the_next_definitions_write(monkeypatch, error=errno.ENOSPC):
    """The node's next write of its definitions fails (a full disk by default)."""
    fail_the_next_fdatasync(monkeypatch, of=DEFINITIONS_LOG_PREFIX, error=error)


def test_a_declare_the_disk_refused_is_an_error_and_declared_again_is_kept(data_dir, monkeypatch):
    """The first declare's definition could not be written: the second must write it,
    not find it in memory and answer ok with nothing on disk."""
    with Node(data_dir) as node:
        refuse_the_next_definitions_write(monkeypatch)
        with pytest.raises(OSError, match="queue 'orders' was not declared.*No space left"):
            node.declare_queue("orders")
        assert node.declare_queue("orders") == {
            "queue": "orders",
            "message_count": 0,
            "consumer_count": 0,
        }
        node.connect().publish("orders", b"kept")
    with Node(data_dir) as node:
        assert node.list_queues() == ["orders"]
        assert node.connect().get("orders").body == b"kept"


def test_a_declare_the_disk_refused_left_no_queue_behind_nor_after_a_restart(data_dir, monkeypatch):
    with Node(data_dir) as node:
        refuse_the_next_definitions_write(monkeypatch)
        with pytest.raises(OSError, match="queue 'orders' was not declared"):
            node.declare_queue("orders")
        assert node.list_queues() == []
        with pytest.raises(NotFound, match="declare it first"):
            node.connect().publish("orders", b"lost")
    with Node(data_dir) as node:
        assert node.list_queues() == []
        assert not os.path.exists(queue_directory(str(data_dir), "orders"))
        node.declare_queue("orders")
        connection = node.connect()
        connection.publish("orders", b"declared at last")
        assert connection.get("orders").body == b"declared at last"


def test_exchanges_bindings_and_deletes_the_disk_refused_did_not_happen(data_dir, monkeypatch):
    """Each change whose write failed is undone whole (a queue whose delete failed keeps
    its messages) and made again as new, so that after a restart every change answered
    ok is there."""
    with Node(data_dir) as node:
        for name in ("billing", "audit", "old"):
            node.declare_queue(name)
        node.declare_exchange("legacy", kind="fanout")
        node.bind_queue("audit", "legacy")
        connection = node.connect()
        connection.publish("old", b"still here")
        changes = [
            (lambda: node.declare_exchange("orders", kind="fanout"), "exchange 'orders'"),
            (lambda: node.bind_queue("billing", "orders"), "queue 'billing' was not bound"),
            (lambda: node.unbind_queue("audit", "legacy"), "queue 'audit' was not unbound"),
            (lambda: node.delete_exchange("legacy"), "exchange 'legacy' was not deleted"),
            (lambda: node.delete_queue("old"), "queue 'old' was not deleted"),
        ]
        for change, refused in changes:
            before = (node.list_queues(), node.list_exchanges(), node.list_bindings())
            refuse_the_next_definitions_write(monkeypatch, errno.EIO)
            with pytest.raises(OSError, match=f"{refused}.*Input/output error"):
                change()
            assert (node.list_queues(), node.list_exchanges(), node.list_bindings()) == before
            if refused == "queue 'old' was not deleted":
                assert connection.get("old").body == b"still here"
            change()
    with Node(data_dir) as node:
        assert node.list_queues() == ["audit", "billing"]
        assert [e["name"] for e in node.list_exchanges()] == ["orders"]
        assert node.list_bindings() == [
            {"exchange": "orders", "queue": "billing", "routing_key": ""}
        ]


def refuse_the_next_write_in_the_queues_directory(monkeypatch) -> None:
    """The next fsync of a file the node writes in ``<data_dir>/queues`` fails (EIO)."""
    fsync = os.fsync

    def io_error_once(fd: int) -> None:
        if os.path.basename(os.path.dirname(os.readlink(f"/proc/self/fd/{fd}"))) != "queues":
            return fsync(fd)
        monkeypatch.setattr(os, "fsync", fsync)
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "fsync", io_error_once)


@pytest.mark.parametrize(
    "refuse, refused",
    [
        (refuse_the_next_definitions_write, "could not write its definitions"),
        (refuse_the_next_write_in_the_queues_directory, "could not write the queue's tombstone"),
    ],
    ids=["definitions", "tombstone"],
)
def test_a_delete_the_disk_refused_leaves_the_queue_whole_and_nothing_behind(
    data_dir, monkeypatch, refuse, refused
):
    with Node(data_dir) as node:
        node.declare_queue("orders")
        node.connect().publish("orders", b"still here" + b"x" * 6000)
        refuse(monkeypatch)
        with pytest.raises(OSError, match=f"queue 'orders' was not deleted: .*{refused}"):
            node.delete_queue("orders")
    with Node(data_dir) as node:  # a tombstone a refused save left: the queue stays
        assert os.listdir(data_dir / "queues") == ["orders"]
        assert node.list_queues() == ["orders"]
        assert node.connect().get("orders").body == b"still here" + b"x" * 6000


def test_a_refused_save_of_an_auto_delete_queues_delete_says_it_completes_at_its_next_start(
    data_dir, monkeypatch
):
    """Its tombstone stays (the save may have reached the disk), and for an
    ``auto_delete`` queue a tombstone is a decided delete: the error must not say that
    nothing changed. The queue runs on until its next start, which deletes it."""
    with Node(data_dir) as node:
        node.declare_queue("replies", auto_delete=True)
        connection = node.connect()
        connection.publish("replies", b"goes at the next start")
        refuse_the_next_definitions_write(monkeypatch, errno.EIO)
        with pytest.raises(OSError) as refused:
            node.delete_queue("replies")
        message = refused.value.strerror
        assert message.startswith("queue 'replies' was not deleted yet: the node could not")
        assert "its delete completes at the queue's next start" in message
        assert "nothing changed" not in message
        assert connection.queue_stats("replies")["messages_ready"] == 1  # runs on
    with Node(data_dir) as node:  # as the error said
        wait_for(lambda: node.list_queues() == [] and os.listdir(data_dir / "queues") == [], 60)


def test_a_queue_that_keeps_crashing_stays_down_alone_and_publishes_to_it_are_nacked(node):
    node.declare_queue("fragile")
    node.declare_queue("steady")
    connection = node.connect()
    for _ in range(3):  # as many crashes as its supervisor allows
        pid = node.queue("fragile").pid
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda pid=pid: restarted(node, "fragile", pid))
    os.kill(node.queue("fragile").pid, signal.SIGKILL)  # and one more
    wait_for(lambda: node.queue_state("fragile") == "crashed")
    assert connection.declare_queue("fragile") == ("fragile", None, None)  # it exists
    with pytest.raises(Nacked, match="stays down"):
        connection.publish("fragile", b"x")
    assert node.status()["queues"] == {"fragile": "crashed", "steady": "running"}
    connection.publish("steady", b"fine")
    assert connection.get("steady").body == b"fine"
    assert node.delete_queue("fragile") == 0
    assert node.list_queues() == ["steady"]


def test_files_a_delete_could_not_remove_are_removed_before_the_name_is_declared_again(
    data_dir, monkeypatch
):
    """A queue that kept crashing stays down, so the node removes its files itself; the
    disk refuses that once: the delete is done all the same (its definition is gone), and
    the next declare of the name removes what was left before it starts the queue, whose
    old messages never come back, nor stay in the shared store."""
    with Node(data_dir) as node:
        node.declare_queue("orders")
        connection = node.connect()
        connection.publish_many("orders", [b"%d" % n + b"x" * 6000 for n in range(20)])
        for _ in range(QUEUE_FLAGS.intensity):  # as many crashes as its supervisor allows
            pid = node.queue("orders").pid
            os.kill(pid, signal.SIGKILL)
            wait_for(lambda pid=pid: restarted(node, "orders", pid))
        os.kill(node.queue("orders").pid, signal.SIGKILL)  # and one more
        wait_for(lambda: node.queue_state("orders") == "crashed")
        directory = queue_directory(str(data_dir), "orders")
        rmtree = shutil.rmtree

        def refused_once(path, ignore_errors=False, **options):  # as rmtree fails
            monkeypatch.setattr(shutil, "rmtree", rmtree)
            if not ignore_errors:
                raise OSError(errno.EIO, os.strerror(errno.EIO), path)

        monkeypatch.setattr(shutil, "rmtree", refused_once)
        assert node.delete_queue("orders") == 0
        assert node.list_queues() == []
        assert os.path.isdir(directory)  # left behind
        assert node.declare_queue("orders") == {
            "queue": "orders",
            "message_count": 0,
            "consumer_count": 0,
        }
        assert connection.get("orders") is None
    with Node(data_dir) as node:
        assert node.connect().get("orders") is None
        assert store_messages(node) == 0


def test_messages_expire_by_queue_ttl_or_their_own_whichever_is_shorter(node):
    node.declare_queue("short", message_ttl_ms=3000)  # room for a loaded machine's get
    connection = node.connect()
    connection.publish("short", b"own ttl", expiration_ms=50)
    connection.publish("short", b"queue ttl")
    wait_for(lambda: connection.queue_stats("short")["expired"] == 1)
    assert connection.get("short", ack=False).body == b"queue ttl"
    connection.publish("short", b"too late")
    wait_for(lambda: connection.queue_stats("short")["messages_ready"] == 0)
    assert connection.get("short") is None


def test_max_length_drops_the_oldest_or_refuses_the_newest(node):
    node.declare_queue("latest", max_length=3)
    node.declare_queue("bounded", max_length=2, overflow="reject-publish")
    connection = node.connect()
    connection.publish_many("latest", [b"1", b"2", b"3", b"4", b"5"])
    assert [connection.get("latest", ack=False).body for _ in range(3)] == [b"3", b"4", b"5"]
    connection.publish("bounded", b"a")
    with pytest.raises(Nacked, match="1 of 2 messages refused"):
        connection.publish_many("bounded", [b"b", b"c"])
    with pytest.raises(Nacked, match="is full"):
        connection.publish("bounded", b"d")
    assert [connection.get("bounded", ack=False).body for _ in range(2)] == [b"a", b"b"]


def test_expired_rejected_and_dropped_messages_are_dead_lettered_with_their_reason(node):
    node.declare_exchange("dlx", kind="fanout")
    node.declare_queue("dead")
    node.bind_queue("dead", "dlx")
    # the queue's TTL bounds the batch's below: three seconds for its get and reject,
    # which a loaded machine can take more than a tenth of
    node.declare_queue("work", message_ttl_ms=3000, max_length=5, dead_letter_exchange="dlx")
    connection = node.connect()
    connection.publish("work", b"expires", headers={"order": 1}, expiration_ms=100)
    wait_for(lambda: connection.queue_stats("dead")["messages_ready"] == 1)
    connection.publish_many("work", [b"%d" % n for n in range(6)], expiration_ms=60_000)
    connection.get("work").reject(requeue=False)
    wait_for(lambda: connection.queue_stats("dead")["messages_ready"] == 3)
    dead = [connection.get("dead", ack=False) for _ in range(3)]
    assert [(d.body, d.headers["x-death"][0]["reason"]) for d in dead] == [
        (b"expires", "expired"),
        (b"0", "maxlen"),
        (b"1", "rejected"),
    ]
    assert dead[0].headers["order"] == 1 and dead[0].headers["x-death"][0]["queue"] == "work"
    # the four left expire by the queue's TTL, not their own minute
    wait_for(lambda: connection.queue_stats("dead")["messages_ready"] == 4)
    wait_for(lambda: connection.queue_stats("work")["depth"] == 0)  # once dead-lettered
    later = [connection.get("dead", ack=False) for _ in range(4)]
    assert [(d.body, d.headers["x-death"][0]["reason"]) for d in later] == [
        (b"%d" % n, "expired") for n in range(2, 6)
    ]


@contextlib.contextmanager
def restarted_without_the_body(data_dir, msg_id: bytes) -> Iterator[Node]:
    """The node on ``data_dir`` started again (its queues read their bodies from the
    store), once the body of ``msg_id`` lost its one reference there to another client,
    which removes its store file (each body fills one at this file size)."""
    with Node(data_dir, file_size_limit=4096) as node:
        stray = StoreClient(node.store("msg_store_persistent"))
        stray.remove([msg_id])
        stray.settle()
        stray.close()
        yield node


def test_an_expired_head_whose_body_is_missing_dead_letters_no_message_behind_it(data_dir):
    """The head expired, and its body is gone from the shared store (its one reference
    dropped by another client: a store that lost it): the head is dropped, and the message behind
    it, with a minute of its TTL left, stays (the dead-lettering of the expired head
    went on to it, and dead-lettered it as expired)."""
    lost = os.urandom(16)
    with Node(data_dir, file_size_limit=4096) as node:  # a body fills a store file
        node.declare_exchange("dlx", kind="fanout")
        node.declare_queue("dead")
        node.bind_queue("dead", "dlx")
        node.declare_queue("work", dead_letter_exchange="dlx")
        connection = node.connect()
        connection.publish("work", b"first")  # no expiry: none behind it expires yet
        body = encode(Message(b"lost " + b"x" * 6000))  # kept in the shared store
        assert node.queue("work").ask(Publish([body], True, [lost], 1)) == 1
        connection.publish("work", b"a minute to live", expiration_ms=60_000)
    with restarted_without_the_body(data_dir, lost) as node:
        connection = node.connect()
        connection.get("work").ack()
        assert connection.get("work", ack=False).body == b"a minute to live"
        assert connection.queue_stats("work")["missing_on_read"] == 1
        assert connection.queue_stats("dead")["messages_ready"] == 0


def test_a_head_dropped_over_max_length_whose_body_is_missing_takes_no_message_behind_it(
    data_dir,
):
    """A queue at its max-length whose head's body is gone from the shared store (as in
    the test above) gets one message more: only that head goes, and no message behind it
    is dead-lettered with it."""
    lost = os.urandom(16)
    with Node(data_dir, file_size_limit=4096) as node:  # a body fills a store file
        node.declare_exchange("dlx", kind="fanout")
        node.declare_queue("dead")
        node.bind_queue("dead", "dlx")
        node.declare_queue("work", max_length=3, dead_letter_exchange="dlx")
        body = encode(Message(b"lost " + b"x" * 6000))  # kept in the shared store
        assert node.queue("work").ask(Publish([body], True, [lost])) == 1
        connection = node.connect()
        connection.publish("work", b"second")
        connection.publish("work", b"third")
    with restarted_without_the_body(data_dir, lost) as node:
        connection = node.connect()
        connection.publish("work", b"fourth")
        bodies = [connection.get("work", ack=False).body for _ in range(3)]
        assert bodies == [b"second", b"third", b"fourth"]
        assert connection.queue_stats("work")["missing_on_read"] == 1
        assert connection.queue_stats("dead")["messages_ready"] == 0


def test_a_dead_letter_exchange_that_does_not_exist_drops_what_max_length_pushes_out(node):
    # RabbitMQ drops a dead letter whose exchange is missing: the publish that pushed it
    # out is confirmed, and the queue carries on at its length.
    node.declare_queue("work", max_length=1, dead_letter_exchange="nowhere")
    queue = node.queue("work")
    connection = node.connect()
    connection.publish_many("work", [b"first", b"second"])
    wait_for(lambda: connection.queue_stats("work")["depth"] == 1)  # the drop settled
    stats = connection.queue_stats("work")
    assert (stats["dropped_over_max_length"], stats["dead_letters_nacked"]) == (1, 1)
    assert node.queue("work").pid == queue.pid  # not restarted
    assert drained(connection, "work") == [b"second"]


def test_a_message_whose_own_x_death_header_is_not_a_list_is_dead_lettered_with_a_list(node):
    # x-death is the dead-letter path's own header, but a publisher may set anything
    # under that name: the dead letter gets a list all the same, and the queue goes on.
    node.declare_exchange("dlx", kind="fanout")
    node.declare_queue("dead")
    node.bind_queue("dead", "dlx")
    node.declare_queue("work", max_length=1, dead_letter_exchange="dlx")
    queue = node.queue("work")
    connection = node.connect()
    connection.publish("work", b"first", headers={"x-death": 5})
    connection.publish("work", b"second")
    wait_for(lambda: connection.queue_stats("work")["depth"] == 1)  # the drop settled
    dead = connection.get("dead")
    assert (dead.body, [d["reason"] for d in dead.headers["x-death"]]) == (b"first", ["maxlen"])
    assert node.queue("work").pid == queue.pid  # not restarted


def test_a_queue_that_starts_over_its_max_length_dead_letters_the_excess(data_dir):
    # What a directory left without its definition holds (see the declare test above),
    # declared again with a max-length: the oldest go to the dead-letter exchange at
    # once, not at the next publish (which may never come).
    with Node(data_dir) as node:
        node.declare_queue("orders")
        node.connect().publish_many("orders", [b"a", b"b", b"c"])
    forget_the_definition(data_dir, "orders")
    with Node(data_dir) as node:
        node.declare_exchange("dlx", kind="fanout")
        node.declare_queue("dead")
        node.bind_queue("dead", "dlx")
        node.declare_queue("orders", max_length=1, dead_letter_exchange="dlx")
        connection = node.connect()
        wait_for(lambda: connection.queue_stats("orders")["depth"] == 1)
        assert drained(connection, "dead") == [b"a", b"b"]
        assert drained(connection, "orders") == [b"c"]


def test_messages_that_expired_while_the_node_was_down_are_dead_lettered_once_it_has_started(
    data_dir, monkeypatch
):
    with Node(data_dir) as first:
        first.declare_exchange("dlx", kind="fanout")
        first.declare_queue("dead")
        first.bind_queue("dead", "dlx")
        first.declare_queue("work", dead_letter_exchange="dlx")
        first.connect().publish_many("work", [b"a", b"b"], expiration_ms=1_000)
    time.sleep(1.0)  # they expire while no node runs (a wall clock must pass their TTL)
    gate = f"{data_dir}.gate"
    started: list = []
    # each expiry round of "work" asks the node for a connection to dead-letter through,
    # and is told that the node is starting
    told_starting: list[bytes] = []
    answer_call = Node._control_call

    def counted_call(node: Node, body: bytes) -> bytes:
        answer = answer_call(node, body)
        if b'"NodeStarting"' in answer:
            told_starting.append(body)
        return answer

    monkeypatch.setattr(Node, "_control_call", counted_call)
    # the application's worker holds the start open until the gate file exists, while
    # the queues, which start before it, already look for expired messages
    starting = threading.Thread(
        target=lambda: started.append(Node(data_dir, children=gated_worker(str(data_dir))))
    )
    starting.start()
    try:
        # several expiry rounds of the queue, with the node not serving
        wait_for(lambda: len(told_starting) >= 3, timeout=120)
        open(gate, "w").close()
        starting.join(timeout=120)
        node = started[0]
        connection = node.connect()
        wait_for(lambda: connection.queue_stats("dead")["messages_ready"] == 2)
        (queue_sup,) = [c for c in node.status()["tree"]["children"] if c["id"] == "queue_sup"]
        (work_sup,) = [c for c in queue_sup["children"] if c["id"] == "queue_sup work"]
        assert work_sup["children"][0]["restarts"] == 0
    finally:
        starting.join(timeout=120)
        for running in started:
            running.close()


def test_a_batch_its_producer_waits_for_is_written_ahead_of_the_commit_and_no_other(node):
    node.declare_queue("orders")
    connection = node.connect()
    connection.publish_many("orders", [b"x" * 1024] * 100)  # waits: its frame goes ahead
    assert connection.queue_stats("orders")["written_ahead"] == 1
    # a pipelined producer's frames wait for the commit's one write, as before
    confirms = [connection.publish_async("orders", b"y" * 1024) for _ in range(2000)]
    for confirm in confirms:
        confirm.result(30)
    connection.publish_many_async("orders", [b"z" * 1024] * 100).result(30)
    stats = connection.queue_stats("orders")
    assert stats["written_ahead"] == 1 and stats["messages_ready"] == 2200


def test_queue_arguments_are_checked_when_declared(node):
    with pytest.raises(ValueError, match="overflow must be one of"):
        node.declare_queue("q", overflow="drop-tail")
    with pytest.raises(ValueError, match="max_length must be None or an int >= 0"):
        node.declare_queue("q", max_length=-1)
    with pytest.raises(ValueError, match="message_ttl_ms must be at most"):
        node.declare_queue("q", message_ttl_ms=2**63)  # its expiries would overflow
    assert node.list_queues() == []


def test_under_a_memory_alarm_publishers_are_held_and_queues_page_out(tmp_path):
    tight = AlarmLimits(memory_limit_bytes=1, check_interval_s=0.1)
    with Node(tmp_path / "data", alarm_limits=tight) as node:
        node.declare_queue("orders")
        connection = node.connect(call_timeout_s=0.5)
        wait_for(lambda: connection.blocked)
        with pytest.raises(Blocked, match="memory alarm has held this publish"):
            connection.publish("orders", b"held")
        queue = node.queue("orders")  # a producer that ignores the alarm
        wait_for(lambda: queue.ask(QueueStats())["target_ram_count"] == 0)
        queue.ask(Publish([encode(Message(b"x" * 100))] * 50, True))
        stats = queue.ask(QueueStats())
        assert stats["alpha"] == 0 and stats["messages_ready"] == 50


def test_a_publish_held_by_an_alarm_ends_when_another_thread_interrupts_its_connection(tmp_path):
    """A server stopping the thread that publishes (the AMQP port's worker) must not wait
    out the alarm: the held publish ends with Blocked and sends nothing."""
    tight = AlarmLimits(memory_limit_bytes=1, check_interval_s=0.1)
    with Node(tmp_path / "data", alarm_limits=tight) as node:
        node.declare_queue("orders")
        connection = node.connect(call_timeout_s=180)  # far beyond the wait below
        wait_for(lambda: connection.blocked)
        outcome: list[BaseException] = []

        def publish() -> None:
            try:
                connection.publish("orders", b"held")
            except BaseException as exc:
                outcome.append(exc)

        publisher = threading.Thread(target=publish, daemon=True)
        publisher.start()
        try:
            publisher.join(0.5)  # it waits out the alarm: nothing ends it but the interrupt
            assert publisher.is_alive() and not outcome
        finally:
            connection.interrupt()
            publisher.join(60)
        assert not publisher.is_alive()
        assert isinstance(outcome[0], Blocked)
        assert "interrupted while the node's memory alarm held this publish" in str(outcome[0])
        assert node.connect().queue_stats("orders")["published"] == 0


def persistent_store_figures(node):
    return node.store_stats()["msg_store_persistent"]


def test_a_clean_stop_of_a_node_with_queues_restarts_its_store_clean(data_dir):
    with Node(data_dir) as node:
        node.declare_queue("orders")
        node.connect().publish_many("orders", [b"x" * 6000] * 10)
    with Node(data_dir) as node:
        figures = persistent_store_figures(node)
        assert figures["recovered_clean"] and figures["message_count"] == 10
        assert node.connect().queue_stats("orders")["messages_ready"] == 10


def test_after_a_queue_crash_the_next_start_rebuilds_the_store_counts_from_the_queues(data_dir):
    with Node(data_dir) as node:
        node.declare_queue("orders")
        connection = node.connect()
        connection.publish_many("orders", [b"x" * 6000] * 10)
        old = node.queue("orders").pid
        os.kill(old, signal.SIGKILL)
        wait_for(lambda: restarted(node, "orders", old))
    with Node(data_dir) as node:
        figures = persistent_store_figures(node)
        assert not figures["recovered_clean"] and figures["message_count"] == 10
        connection = node.connect()
        while (delivery := connection.get("orders")) is not None:
            delivery.ack()
        wait_for(lambda: persistent_store_figures(node)["message_count"] == 0)


def test_an_auto_delete_queue_goes_when_its_last_consumer_stops(node, data_dir):
    node.declare_queue("replies", auto_delete=True, durable=False)
    connection = node.connect()
    connection.publish("replies", b"one")
    first = connection.consume("replies", prefetch=10)
    second = connection.consume("replies", prefetch=10)
    assert next(first).body == b"one"
    assert connection.queue_stats("replies")["consumers"] == 2
    first.cancel()
    assert node.list_queues() == ["replies"]  # one consumer is left
    second.cancel()
    wait_for(lambda: node.list_queues() == [], timeout=10)
    assert not (data_dir / "queues" / "replies").exists()
    node.declare_queue("replies", auto_delete=True, durable=False)  # declared anew
    assert connection.queue_stats("replies")["messages_ready"] == 0


def test_an_auto_delete_queue_whose_tombstone_the_disk_refuses_stays_whole(node, data_dir):
    """Its tombstone cannot be written (a directory is in its place): the queue does not
    delete itself, messages and all, until its last consumer stops again."""
    node.declare_queue("replies", auto_delete=True, durable=False)
    connection = node.connect()
    connection.publish("replies", b"kept")
    in_the_way = data_dir / "queues" / "replies~deleted"
    in_the_way.mkdir()
    consumer = connection.consume("replies")
    consumer.cancel()
    assert connection.queue_stats("replies")["messages_ready"] == 1  # after the cancel
    assert node.list_queues() == ["replies"]
    in_the_way.rmdir()
    consumer = connection.consume("replies")
    assert next(consumer).body == b"kept"
    consumer.cancel()
    wait_for(lambda: node.list_queues() == [] and os.listdir(data_dir / "queues") == [], 60)


def test_closing_the_connection_of_an_auto_delete_queues_consumer_deletes_the_queue(node):
    node.declare_queue("replies", auto_delete=True, durable=False)
    connection = node.connect()
    connection.consume("replies")
    connection.close()
    wait_for(lambda: node.list_queues() == [], timeout=10)


def test_a_byte_flipped_in_a_stopped_nodes_store_is_never_delivered(data_dir):
    bodies = [b"%d:" % n + b"x" * 6000 for n in range(3)]  # in the shared store
    with Node(data_dir) as node:
        node.declare_queue("orders")
        node.connect().publish_many("orders", bodies)
    path = data_dir / "msg_store_persistent" / "0.rdq"
    data = path.read_bytes()
    at = data.index(b"1:xxxx") + 3000
    with open(path, "r+b") as file:
        file.seek(at)
        file.write(bytes([data[at] ^ 0x01]))
    with Node(data_dir) as node:
        connection = node.connect()
        with connection.consume("orders", prefetch=3) as consumer:
            got = [consumer.get(timeout=10) for _ in range(2)]
            assert consumer.get(timeout=0.5) is None
        assert sorted(d.body for d in got) == [bodies[0], bodies[2]]
        assert connection.queue_stats("orders")["corrupt_on_read"] == 1


def test_a_resent_fanout_message_the_first_attempt_left_in_one_queue_reaches_both(data_dir):
    # The first attempt reached "orders" alone (as when "audit" restarted meanwhile); the
    # second, through the fanout, is a repeat for "orders" and new for "audit". Both must
    # deliver the one body the shared store keeps under the message's derived id, read
    # back from the store after a restart.
    body = b"order 7 " + b"x" * 6000  # in the shared store
    with Node(data_dir) as node:
        node.declare_exchange("events", kind="fanout")
        for queue in ("orders", "audit"):
            node.declare_queue(queue)
            node.bind_queue(queue, "events")
        connection = node.connect()
        connection.publish("orders", body, producer_id="p", sequence=0)
        time.sleep(0.01)  # another millisecond on the clock
        connection.publish("", body, exchange="events", producer_id="p", sequence=0)
    with Node(data_dir) as node:
        connection = node.connect()
        for queue in ("orders", "audit"):
            assert connection.get(queue).body == body
            assert connection.get(queue) is None
            assert connection.queue_stats(queue)["corrupt_on_read"] == 0


def test_repeats_found_among_recovered_messages_count_as_taken(data_dir):
    """A queue killed after its messages were durable but before its producer log named
    them: the ids recovered from the index tell the repeats, and the producer goes on."""
    with Node(data_dir) as node:
        node.declare_queue("orders")
        node.connect().publish_many(
            "orders", [b"%d" % n for n in range(1000)], producer_id="p", sequence=0
        )
    (data_dir / "queues" / "orders" / "producers.log").write_bytes(b"")
    with Node(data_dir) as node:
        connection = node.connect()
        connection.publish_many(
            "orders", [b"%d" % n for n in range(1500)], producer_id="p", sequence=0
        )
        stats = connection.queue_stats("orders")
        assert (stats["len"], stats["repeats_dropped"]) == (1500, 1000)


def test_a_disk_error_under_a_deduplicated_batch_loses_none_of_it_on_the_retry(
    data_dir, tmp_path, monkeypatch
):
    """The disk refuses the queue's writes (a file-size limit on its process: a short
    write, as a full disk gives) in the middle of a frame that goes message by message
    (one of its messages is for the shared store), then has room again before the queue's
    next sync (a slow one: three seconds). The producer is told, and its retry of the same
    sequences leaves every message in the queue exactly once."""
    faults = tmp_path / "disk-faults"
    write_faults(faults)
    monkeypatch.setenv(ENVIRONMENT_VARIABLE, str(faults))
    # One frame, as a raw client may send (publish_many's hold 500): its small messages
    # are handed to the disk 1,024 at a time, and the second hand-over fails.
    bodies = [b"big" * 2000] + [b"%04d" % n * 256 for n in range(2100)]
    batch = Publish([encode(Message(body)) for body in bodies], True, None, None, b"p", 0)
    with Node(data_dir) as node:
        node.declare_queue("orders")
        connection = node.connect()
        connection.publish("orders", b"first")  # the segment file exists
        queue = psutil.Process(node.queue("orders").pid)
        files = (data_dir / "queues" / "orders").glob("*.qi")
        limit = max(path.stat().st_size for path in files) + 100_000  # less than the batch
        queue.rlimit(psutil.RLIMIT_FSIZE, (limit, psutil.RLIM_INFINITY))
        write_faults(faults, sync_delay_s=3.0)
        with pytest.raises(RemoteError, match="short write"):
            node.queue("orders").ask(batch, timeout=30)
        with contextlib.suppress(psutil.NoSuchProcess):  # it may have stopped already
            queue.rlimit(psutil.RLIMIT_FSIZE, (psutil.RLIM_INFINITY, psutil.RLIM_INFINITY))
        write_faults(faults)  # room again, before the sync under way writes anything

        def retried() -> bool:  # refused, or unanswered (in doubt), while the queue restarts
            try:
                assert node.queue("orders").ask(batch, timeout=5) == len(bodies)
            except (RemoteError, ActorDeadError, AskTimeout, NotFound):
                time.sleep(0.5)  # pacing: each try sends the whole 2 MB frame again
                return False
            return True

        wait_for(retried, timeout=120)
        taken = drained(connection, "orders")
        assert taken.count(b"first") == 1
        assert sorted(b for b in taken if b != b"first") == sorted(bodies)


def test_a_deduplicated_batch_refused_whole_leaves_the_producer_where_it_was(node):
    """A frame holding a message over the maximum size is refused whole: the producer's
    sequences in it were not taken, and its next batch from the same sequence is."""
    node.declare_queue("orders")
    queue = node.queue("orders")
    small = encode(Message(b"small"))
    too_large = b"x" * (MAX_MESSAGE_BYTES + 1)  # a raw frame: a Connection checks first
    with pytest.raises(RemoteError, match="above this queue's maximum"):
        queue.ask(Publish([small, too_large], True, None, None, b"p", 0), timeout=60)
    del too_large
    assert queue.ask(Publish([small, small], True, None, None, b"p", 0), timeout=30) == 2
    assert queue.ask(QueueStats())["len"] == 2


def test_a_node_file_left_by_a_killed_node_is_not_running_at_once(tmp_path):
    """A node killed with SIGKILL leaves its node file naming a dead pid: a client learns
    NodeNotRunning within a second, not after the call's 60 s timeout."""
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (data_dir / "node.json").write_text(
        json.dumps({"pid": dead.pid, "status_endpoint": f"ipc://{tmp_path}/gone"})
    )
    started = time.monotonic()
    with pytest.raises(NodeNotRunning, match=f"its pid {dead.pid} is gone"):
        connect(data_dir)
    assert time.monotonic() - started < 20  # the call's timeout is 60 s


def test_a_client_waiting_for_a_node_is_served_as_soon_as_it_starts(tmp_path):
    data_dir = tmp_path / "data"
    refused = threading.Event()
    started = threading.Event()
    nodes = []

    def start_later():
        if refused.wait(timeout=60):
            nodes.append(Node(data_dir))
            started.set()

    starter = threading.Thread(target=start_later)
    starter.start()
    try:
        with pytest.raises(NodeNotRunning):
            connect(data_dir)  # not yet, and no wait: at once
        refused.set()
        with connect(data_dir, wait=60) as connection:
            # served by the node started after the refusal: it serves before its
            # constructor has returned, so that return is waited for, not assumed
            assert started.wait(timeout=60)
            connection.declare_queue("orders")
            assert connection.list_queues() == ["orders"]
    finally:
        starter.join()
        for node in nodes:
            node.close()


def test_dead_letters_go_with_the_queues_dead_letter_routing_key_when_it_has_one(node):
    node.declare_exchange("dlx", kind="direct")
    node.declare_queue("retry")
    node.bind_queue("retry", "dlx", "again")
    node.declare_queue("work", dead_letter_exchange="dlx", dead_letter_routing_key="again")
    node.declare_queue("parked")
    # the default exchange as dead-letter exchange: to the queue the key names
    node.declare_queue("loop", dead_letter_exchange="", dead_letter_routing_key="parked")
    connection = node.connect()
    connection.publish("work", b"failed")
    connection.get("work").reject(requeue=False)
    connection.publish("loop", b"looped")
    connection.get("loop").reject(requeue=False)
    wait_for(lambda: connection.queue_stats("retry")["messages_ready"] == 1)
    wait_for(lambda: connection.queue_stats("parked")["messages_ready"] == 1)
    assert connection.get("retry").headers["x-death"][0]["queue"] == "work"
    assert connection.get("parked").body == b"looped"
    with pytest.raises(InvalidArgument, match="needs a dead-letter exchange too"):
        node.declare_queue("lonely", dead_letter_routing_key="again")
    with pytest.raises(InvalidArgument, match="at most 255 bytes"):
        node.declare_queue("long", dead_letter_exchange="dlx", dead_letter_routing_key="k" * 256)


def test_a_queue_with_expires_lives_while_consumed_and_goes_once_unused_that_long(node, data_dir):
    """RabbitMQ's x-expires: a consumer keeps the queue, however long; once the last
    one stops, the queue deletes itself after the period, messages and files, durable
    or not, and a node restarted in the middle finishes the delete."""
    node.declare_queue("session", expires_ms=500)
    connection = node.connect()
    connection.publish("session", b"left behind")
    consumer = connection.consume("session", prefetch=1)
    assert next(consumer).body == b"left behind"
    started = time.monotonic()
    while time.monotonic() - started < 2.0:  # four periods pass with a consumer
        time.sleep(0.1)  # paces the look: the outcome waits for no clock
        assert node.list_queues() == ["session"]
    consumer.cancel()
    wait_for(lambda: node.list_queues() == [], timeout=30)
    assert not (data_dir / "queues" / "session").exists()
    with pytest.raises(InvalidArgument, match="expires_ms must be None or an int in 1"):
        node.declare_queue("never", expires_ms=0)
    with pytest.raises(InvalidArgument, match="expires_ms"):
        node.declare_queue("log", type="stream", expires_ms=1000)


def test_an_unused_queue_with_expires_is_deleted_after_a_restart_too(data_dir):
    """A queue never used expires from its start, also when that start is a boot."""
    with Node(data_dir) as node:
        node.declare_queue("forgotten", expires_ms=60_000)
        node.connect().publish("forgotten", b"nobody reads this")
    with Node(data_dir) as node:
        with pytest.raises(PreconditionFailed):  # kept with its expiry
            node.declare_queue("forgotten")
        node.delete_queue("forgotten")
        node.declare_queue("forgotten", expires_ms=300)
    with Node(data_dir) as node:  # its tombstone goes last, after its definition
        wait_for(lambda: node.list_queues() == [] and os.listdir(data_dir / "queues") == [], 30)


def test_tells_that_come_after_an_auto_delete_queue_went_are_dropped_not_a_crash(node):
    """A consumer's stop deletes the queue; what its connection told it next (a release,
    in the same mailbox read) has nothing left to apply to. The queue's process ends for
    good, never restarted as crashed (clients would hear "restarting" meanwhile)."""
    node.declare_queue("jobs", auto_delete=True, durable=False)
    queue = node.queue("jobs")
    consumer = os.urandom(16)
    queue.tell(Subscribe(consumer, os.getpid(), True, 10))
    queue.ask(QueueStats())  # the subscription is in
    node.connect().publish_many("jobs", [b"x" * 1000] * 2000)  # keeps it busy a moment
    for message in (Subscribe(consumer, os.getpid(), False), Release(consumer)):
        queue.tell(message)  # read in one pass, most likely: the delete, then the release
    wait_for(lambda: node.list_queues() == [], timeout=30)
    assert node.root.restart_counts.of("queue jobs") == 0


def test_a_queue_that_deleted_itself_is_gone_at_once_and_its_name_declared_anew(data_dir):
    """Between its self-delete and the node dropping its definition (at its next look,
    here a minute away), the queue is not "restarting": it is gone, and a declare of its
    name makes a new queue."""
    with Node(data_dir, alarm_limits=AlarmLimits(check_interval_s=60)) as node:
        node.declare_queue("replies", auto_delete=True, durable=False)
        connection = node.connect()
        connection.consume("replies").cancel()
        wait_for(lambda: not (data_dir / "queues" / "replies").exists())
        wait_for(lambda: node.queue_state("replies") != "running")
        with pytest.raises(NotFound) as gone:
            node.queue("replies")
        assert not isinstance(gone.value, QueueRestarting)
        node.declare_queue("replies", auto_delete=True, durable=False)
        connection.publish("replies", b"to the new one")
        assert connection.get("replies").body == b"to the new one"


def test_a_publish_to_a_queue_declared_anew_or_restarted_since_reaches_the_one_there_now(
    node, data_dir
):
    """A connection's ref to a queue names its incarnation; the one there now answers a
    publish meant for an earlier one that it took nothing of it, and the connection
    sends it there: confirmed once, as RabbitMQ routes by the name at each publish (an
    aio-pika client's robust reconnect declares its auto-delete queue anew). The
    publisher is a process of its own, which hears of neither change."""
    node.declare_queue("replies")
    code = (
        "import sys; from warren import connect; c = connect(sys.argv[1]); "
        "[c.publish('replies', line.strip().encode()) or print('confirmed', flush=True) "
        "for line in sys.stdin]"
    )
    publisher = subprocess.Popen(
        [sys.executable, "-c", code, str(data_dir)],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:

        def publish(body: str) -> None:
            assert publisher.stdin is not None and publisher.stdout is not None
            publisher.stdin.write(body + "\n")
            publisher.stdin.flush()
            assert publisher.stdout.readline() == "confirmed\n"

        publish("to the first")
        other = node.connect()
        other.delete_queue("replies")
        other.declare_queue("replies")
        publish("to the second")
        old_pid = node.queue("replies").pid
        os.kill(old_pid, signal.SIGKILL)
        wait_for(lambda: restarted(node, "replies", old_pid), timeout=60)
        publish("to its restart")
        assert drained(other, "replies") == [b"to the second", b"to its restart"]
    finally:
        publisher.kill()
        publisher.communicate(timeout=60)

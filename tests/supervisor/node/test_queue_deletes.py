"""A queue's delete interrupted where it is committed but not yet done: the node killed
(SIGKILL) the moment the definitions without the queue are saved, before its messages
and files are removed. Deleted stays deleted: the next boot lists no such queue and
leaves none of its files, a later declare of the name finds it empty, and the shared
store drops the bodies only the deleted queue held. Killed the moment before that save,
the delete did not happen. An ``auto_delete`` queue deleting itself (its last consumer
gone) is killed in the middle of its delete: it neither comes back with its messages
when its supervisor restarts it, nor at the node's next boot. (A delete whose files or
save the disk refused: ``tests/queues/broker/test_broker.py``.)"""

import os
import signal
from pathlib import Path

import psutil
import pytest

from warren.actors.process import process_exists
from warren.queues.broker.definitions import is_marked_deleted, queue_directory
from warren.supervisor import Node

from ...queues.helpers import drained, store_messages
from ...waiting import all_threads_asleep, wait_for

BODY_BYTES = 6000  # a body this large is kept in the shared store, not in the queue's files
EMPTY = {"message_count": 0, "consumer_count": 0}


def bodies(label: str, count: int) -> list[bytes]:
    return [b"%s %d " % (label.encode(), n) + b"x" * BODY_BYTES for n in range(count)]


def killed_while_deleting(node_process, data: str, name: str, *when: str) -> None:
    """Start the node on ``data`` in a process of its own, delete ``name`` there, and see
    the process killed the moment the delete is saved (``--before-the-save``: the moment
    before), and its actors gone after it."""
    process, pids = node_process(data, "--delete-and-die", name, *when)
    assert process.wait(timeout=120) == -signal.SIGKILL, process.stderr_path.read_text()
    wait_for(lambda: not any(map(process_exists, pids[1:])), timeout=60)


@pytest.mark.parametrize("beside_another", [False, True], ids=["its-only-queue", "beside-another"])
def test_a_queue_whose_delete_a_kill_interrupted_stays_deleted_and_its_bodies_go(
    node_process, tmp_path, beside_another
):
    data = str(tmp_path / "data")
    kept = bodies("kept", 5) if beside_another else []
    with Node(data) as node, node.connect() as connection:
        node.declare_queue("orders")
        connection.publish_many("orders", bodies("order", 20))
        if beside_another:
            node.declare_queue("kept")
            connection.publish_many("kept", kept)
    killed_while_deleting(node_process, data, "orders")
    directory = queue_directory(data, "orders")
    assert os.path.isdir(directory)  # killed before its files went
    survivors = ["kept"] if beside_another else []
    with Node(data) as node:
        assert node.list_queues() == survivors
        assert not os.path.exists(directory)
        assert sorted(os.listdir(os.path.dirname(directory))) == survivors
        wait_for(lambda: store_messages(node) == len(kept))
        assert node.declare_queue("orders") == {"queue": "orders", **EMPTY}
        with node.connect() as connection:
            assert connection.get("orders") is None
            if beside_another:
                assert drained(connection, "kept") == kept
    with Node(data) as node, node.connect() as connection:
        assert connection.get("orders") is None
        assert store_messages(node) == 0


def test_a_stream_whose_delete_a_kill_interrupted_stays_deleted(node_process, tmp_path):
    data = str(tmp_path / "data")
    with Node(data) as node, node.connect() as connection:
        connection.declare_queue("events", type="stream")
        connection.publish_many("events", [b"event %d" % n for n in range(10)])
    killed_while_deleting(node_process, data, "events")
    directory = queue_directory(data, "events")
    assert os.path.isdir(directory)
    with Node(data) as node:
        assert node.list_queues() == []
        assert not os.path.exists(directory)
        assert node.declare_queue("events", type="stream") == {"queue": "events", **EMPTY}
        with node.connect() as connection:
            connection.publish("events", b"after the delete")
            with connection.consume("events", offset="first") as consumer:
                first = consumer.get(timeout=60)
            assert (first.offset, first.body) == (0, b"after the delete")


def test_a_queue_whose_delete_a_kill_cut_before_its_save_stays_whole(node_process, tmp_path):
    """The client had no answer: the delete did not happen, and nothing of it is left."""
    data = str(tmp_path / "data")
    orders = bodies("order", 20)
    with Node(data) as node, node.connect() as connection:
        node.declare_queue("orders")
        connection.publish_many("orders", orders)
    killed_while_deleting(node_process, data, "orders", "--before-the-save")
    directory = queue_directory(data, "orders")
    with Node(data) as node, node.connect() as connection:
        assert node.list_queues() == ["orders"]
        assert os.listdir(os.path.dirname(directory)) == ["orders"]
        assert drained(connection, "orders") == orders
        assert node.delete_queue("orders") == 0
        assert node.list_queues() == []
    with Node(data) as node:
        assert node.list_queues() == []
        assert store_messages(node) == 0


def test_an_auto_delete_queue_killed_deleting_itself_stays_deleted_and_its_bodies_go(tmp_path):
    """The persistent store is stopped (SIGSTOP) so that the queue's delete of itself
    waits for it, its tombstone written; the queue is killed there, then the store
    resumed: the queue, restarted by its supervisor, finishes the delete. (Killed after
    its index forgot messages and before their removes left its process, a queue leaves
    their bodies in the store until its next dirty start, as any ack so cut does: the
    kill waits until the queue is blocked on the store.)"""
    data = str(tmp_path / "data")
    directory = queue_directory(data, "replies")
    with Node(data) as node, node.connect() as connection:
        node.declare_queue("replies", auto_delete=True)  # durable: defined at every boot
        connection.publish_many("replies", bodies("reply", 20))
        consumer = connection.consume("replies")  # nothing fetched: no store read pending
        queue_pid = node.queue("replies").pid
        store = psutil.Process(node.store("msg_store_persistent").pid)
        store.suspend()
        try:
            consumer.cancel()  # the last consumer: the queue deletes itself
            wait_for(lambda: is_marked_deleted(directory), timeout=60)
            # blocked on the store: its removes sent (the kill does not lose them)
            wait_for(lambda: all_threads_asleep(queue_pid), timeout=60)
            os.kill(queue_pid, signal.SIGKILL)
            wait_for(lambda: not process_exists(queue_pid), timeout=60)
        finally:
            store.resume()
        wait_for(lambda: node.list_queues() == [] and not is_marked_deleted(directory), 60)
        assert not os.path.lexists(directory)
        wait_for(lambda: store_messages(node) == 0, timeout=60)
        assert node.declare_queue("replies", auto_delete=True) == {"queue": "replies", **EMPTY}
        assert connection.get("replies") is None
    with Node(data) as node, node.connect() as connection:
        assert node.list_queues() == ["replies"]  # the one declared anew, empty
        assert connection.get("replies") is None
        assert store_messages(node) == 0


def test_an_auto_delete_queue_whose_node_was_killed_as_it_deleted_itself_stays_deleted(
    node_process, tmp_path
):
    """The node, its store and the queue killed while the queue, deleting itself, waited
    for the store: the queue's files whole, its definition saved, its tombstone beside
    them. The next boot does not bring it back: the queue finishes its delete as it
    starts, and the store drops its bodies, not those of another queue."""
    data = str(tmp_path / "data")
    directory = queue_directory(data, "replies")
    kept = bodies("kept", 5)
    with Node(data) as node, node.connect() as connection:
        node.declare_queue("kept")
        connection.publish_many("kept", kept)
    process, pids = node_process(data, "--auto-delete-and-die", "replies")
    assert process.wait(timeout=120) == -signal.SIGKILL, process.stderr_path.read_text()
    wait_for(lambda: not any(map(process_exists, pids[1:])), timeout=60)
    assert is_marked_deleted(directory) and os.path.isdir(directory)
    with Node(data) as node, node.connect() as connection:
        wait_for(lambda: node.list_queues() == ["kept"] and not is_marked_deleted(directory), 60)
        assert not os.path.lexists(directory)
        wait_for(lambda: store_messages(node) == len(kept), timeout=60)
        assert drained(connection, "kept") == kept
    with Node(data) as node:
        assert node.list_queues() == ["kept"]
        assert store_messages(node) == 0


def tombstone_lines(caplog, tombstone: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if tombstone in r.getMessage()]


BAD_TOMBSTONES = {
    "empty": ("orders~deleted", b""),
    "truncated": ("orders~deleted", b"ord"),
    "garbage": ("orders~deleted", b"\xff\x00\x17 not a name"),
    "a directory": ("orders~deleted", None),
    "of no name": ("~deleted", b"orders"),
    "of the queues directory": (".~deleted", b"orders"),
    "of the data directory": ("..~deleted", b"orders"),
    "of no queue directory": ("notes~deleted", b"notes"),
    "of a file": ("notes.txt~deleted", b"notes.txt"),
}


@pytest.mark.parametrize("name,content", BAD_TOMBSTONES.values(), ids=BAD_TOMBSTONES.keys())
def test_a_damaged_or_stray_tombstone_costs_no_confirmed_message(tmp_path, caplog, name, content):
    data = tmp_path / "data"
    orders = bodies("order", 10)
    with Node(data) as node, node.connect() as connection:
        node.declare_queue("orders")
        connection.publish_many("orders", orders)
    queues = os.path.dirname(queue_directory(str(data), "orders"))
    (Path(queues) / "notes.txt").write_text("the operator's")
    tombstone = os.path.join(queues, name)
    if content is None:
        os.mkdir(tombstone)
    else:
        Path(tombstone).write_bytes(content)
    with caplog.at_level("INFO", logger="warren.queues"), Node(data) as node:
        assert node.list_queues() == ["orders"]
        with node.connect() as connection:
            assert drained(connection, "orders") == orders
    assert len(tombstone_lines(caplog, tombstone)) == 1, caplog.text
    assert (Path(queues) / "notes.txt").read_text() == "the operator's"

"""A fetch that waits in an empty queue (a long poll): answered when a message comes,
when its consumer stops, when its wait ends, when the queue stops or is deleted; a
consumer built on it hears of a publish without asking again and again, and loses
nothing when it is cancelled or its queue is killed while it waits."""

import contextlib
import itertools
import os
import signal
import threading
import types

import pytest

from warren.actors import AskTimeout, RemoteError
from warren.queues.client import consuming
from warren.queues.client.consuming import LONG_POLL_MS
from warren.queues.errors import QueueRestarting
from warren.queues.protocol import Fetch, Release, Subscribe
from warren.supervisor import Node

from ...waiting import wait_for
from .test_broker import restarted

CONSUMER = b"long-poller"


@pytest.fixture
def node(tmp_path):
    with Node(tmp_path / "data") as running:
        running.declare_queue("orders")
        yield running


@contextlib.contextmanager
def consumer_waiting(node, timeout=60):
    """A consumer of "orders" waiting in another thread for its next delivery, subscribed
    when the block runs; yields the list the delivery (or None) lands in."""
    got = []
    consumer = node.connect().consume("orders", prefetch=10)
    waiter = threading.Thread(target=lambda: got.append(consumer.get(timeout=timeout)))
    waiter.start()
    try:
        wait_for(lambda: node.connect().queue_stats("orders")["consumers"] == 1)
        yield got
    finally:
        waiter.join(timeout=timeout + 30)


def parked_fetch(node, wait_ms=60_000):
    """A fetch of up to ten messages that waits ``wait_ms`` in the empty queue, seen
    parked (not answered within a look)."""
    answer = node.queue("orders").ask_async(Fetch(CONSUMER, os.getpid(), 10, True, wait_ms))
    with pytest.raises(AskTimeout):
        answer.get(timeout=0.3)
    return answer


def test_a_waiting_fetch_is_answered_with_the_message_published_after_it(node):
    answer = parked_fetch(node)
    node.connect().publish("orders", b"order 1")
    (delivered,) = answer.get(timeout=30)
    assert b"order 1" in delivered.payload
    stats = node.connect().queue_stats("orders")
    assert (stats["messages_ready"], stats["messages_unacked"]) == (0, 1)


def test_waiting_fetches_are_served_oldest_first(node):
    first, second = parked_fetch(node), parked_fetch(node)
    node.connect().publish("orders", b"order 1")
    assert len(first.get(timeout=30)) == 1
    with pytest.raises(AskTimeout):
        second.get(timeout=0.3)
    node.connect().publish("orders", b"order 2")
    assert len(second.get(timeout=30)) == 1


@pytest.mark.parametrize(
    "stop", [Subscribe(CONSUMER, os.getpid(), False), Release(CONSUMER)], ids=["cancel", "release"]
)
def test_a_waiting_fetch_is_answered_with_nothing_when_its_consumer_stops(node, stop):
    ref = node.queue("orders")
    ref.tell(Subscribe(CONSUMER, os.getpid(), True, 10))
    answer = parked_fetch(node)
    other = ref.ask_async(Fetch(b"someone else", os.getpid(), 10, True, 60_000))
    ref.tell(stop)
    assert answer.get(timeout=30) == []
    node.connect().publish("orders", b"order 1")
    assert len(other.get(timeout=30)) == 1  # another consumer's waits on


def test_a_waiting_fetch_is_answered_with_nothing_when_its_wait_ends(node):
    answer = node.queue("orders").ask_async(Fetch(CONSUMER, os.getpid(), 10, True, 200))
    assert answer.get(timeout=30) == []
    node.connect().publish("orders", b"order 1")
    assert node.connect().queue_stats("orders")["messages_ready"] == 1


def test_a_waiting_fetch_fails_when_its_queue_is_deleted(node):
    answer = parked_fetch(node)
    node.delete_queue("orders")
    with pytest.raises(RemoteError, match="QueueClosed|was deleted"):
        answer.get(timeout=30)


def test_a_wait_longer_than_a_minute_is_refused(node):
    with pytest.raises(RemoteError, match="wait_ms"):
        node.queue("orders").ask(Fetch(CONSUMER, os.getpid(), 10, True, 60_001))


def test_an_idle_consumer_asks_its_queue_once_per_long_poll_not_again_and_again(node):
    ref = node.queue("orders")
    received_before = ref.stats()["received"]
    consumer = node.connect().consume("orders", prefetch=10)
    assert consumer.get(timeout=3 * LONG_POLL_MS / 1000) is None
    # three long polls' time: a subscribe, a fetch each poll, the cancel's
    consumer.cancel()
    assert ref.stats()["received"] - received_before <= 6


def test_a_consumer_waiting_in_another_thread_gets_a_message_published_meanwhile(node):
    with consumer_waiting(node) as got:
        node.connect().publish("orders", b"order 1")
    assert got[0].body == b"order 1"


def test_a_consumer_cancelled_with_a_poll_out_gives_back_what_the_poll_brought(node, monkeypatch):
    monkeypatch.setattr(consuming, "LONG_POLL_MS", 60_000)
    connection = node.connect()
    consumer = connection.consume("orders", prefetch=10)
    assert consumer.take() is None  # its fetch waits on in the queue
    node.connect().publish_many("orders", [b"order 1", b"order 2"])
    wait_for(lambda: node.connect().queue_stats("orders")["messages_unacked"] == 2)
    consumer.cancel()
    stats = node.connect().queue_stats("orders")
    assert (stats["messages_ready"], stats["messages_unacked"], stats["consumers"]) == (2, 0, 0)
    bodies = [connection.get("orders").body for _ in range(2)]
    assert bodies == [b"order 1", b"order 2"]


def test_a_consumer_cancelled_with_a_poll_out_does_not_wait_for_the_poll(node, monkeypatch):
    monkeypatch.setattr(consuming, "LONG_POLL_MS", 60_000)
    consumer = node.connect().consume("orders", prefetch=10)
    taken = []

    def take_then_cancel() -> None:  # one thread: what it sends reaches the queue in order
        taken.append(consumer.take())  # its fetch waits in the queue
        consumer.cancel()

    cancelling = threading.Thread(target=take_then_cancel)
    cancelling.start()
    try:
        wait_for(lambda: not cancelling.is_alive(), timeout=30)  # the poll: 60 s
    finally:
        cancelling.join()
    assert taken == [None]
    assert node.connect().queue_stats("orders")["consumers"] == 0


def test_a_consumer_waiting_on_a_queue_killed_meanwhile_gets_what_comes_after_its_restart(node):
    with consumer_waiting(node, timeout=90) as got:
        killed = node.queue("orders").pid
        os.kill(killed, signal.SIGKILL)
        wait_for(lambda: restarted(node, "orders", killed), timeout=60)
        node.connect().publish("orders", b"after the restart")
    assert got[0].body == b"after the restart"


def test_a_consumer_waiting_sends_what_its_connection_kept_first(node, monkeypatch):
    """The request-reply pattern on one connection: a publish kept to share a frame
    (``publish_async``) leaves before the consumer waits out its poll for the reply."""
    monkeypatch.setattr(consuming, "LONG_POLL_MS", 60_000)
    connection = node.connect(linger_s=1)
    replies = connection.consume("orders", prefetch=10)
    assert replies.take() is None  # its poll waits in the queue
    connection.publish_async("orders", b"request")
    delivery = replies.get(timeout=30)
    assert delivery is not None and delivery.body == b"request"


def test_a_consumer_waiting_on_a_queue_stopped_meanwhile_asks_its_next_incarnation(
    node, monkeypatch
):
    monkeypatch.setattr(consuming, "LONG_POLL_MS", 60_000)
    with consumer_waiting(node, timeout=45) as got:
        stopped = node.queue("orders")
        stopped.stop()  # a clean stop: the supervisor starts the queue again
        wait_for(lambda: restarted(node, "orders", stopped.pid), timeout=60)
        node.connect().publish("orders", b"after the restart")
    assert got[0] is not None and got[0].body == b"after the restart"


class RestartingQueue:
    """A connection whose queue is between two incarnations for its first two fetches
    (what a loaded machine shows a consumer whose queue restarts), then has a message."""

    def __init__(self):
        self.restarting = 2
        self.delivery = types.SimpleNamespace(delivery_tag=1, body=b"after the restart")
        self._consumer_serials = itertools.count(1)

    def held(self, queue):
        return 0

    def _has_turn(self, consumer):
        return True

    def _fetch_async(self, queue, room, poll_ms):
        if self.restarting:
            self.restarting -= 1
            raise QueueRestarting(f"queue {queue!r} is restarting; try again in a moment")
        return ("the new incarnation", "its answer")

    def _answered(self, ahead, look):
        return True

    def _fetched(self, queue, asked):
        return [self.delivery]


def test_a_consumer_whose_queue_is_restarting_waits_for_it_within_its_timeout():
    connection = RestartingQueue()
    consumer = consuming.Consumer(connection, "orders", prefetch=10)
    assert consumer.take() is None  # a look finds nothing yet, and raises nothing
    assert consumer.get(timeout=30) is connection.delivery
    assert connection.restarting == 0


def test_deliveries_of_waiting_consumers_say_when_their_queues_took_them(node, monkeypatch):
    """What two queues took in turn, each waited for by a consumer, is stamped in that
    order (the machine's monotonic clock): a consumer of both can hand it on so."""
    monkeypatch.setattr(consuming, "LONG_POLL_MS", 60_000)
    node.declare_queue("control")
    connection = node.connect()
    tasks, control = connection.consume("orders"), connection.consume("control")
    assert tasks.take() is None and control.take() is None  # both wait in their queues
    publisher = node.connect()
    publisher.publish("control", b"revoke")
    publisher.publish("orders", b"task")
    got = {}

    def both() -> bool:
        for consumer in (tasks, control):
            if consumer.queue not in got and (delivery := consumer.take()) is not None:
                got[consumer.queue] = delivery
        return len(got) == 2

    wait_for(both)
    assert 0 < got["control"].served_ns < got["orders"].served_ns

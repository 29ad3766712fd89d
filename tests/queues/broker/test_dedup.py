"""Publisher deduplication against a queue killed between a confirm's group commit and its
producer record: a producer that re-sends what it was never told of gets it confirmed,
and no consumer gets it twice."""

import os
import signal

from warren.actors.process import process_exists
from warren.queues import Message, encode
from warren.queues.protocol import Fetch, Publish, QueueStats, Settle
from warren.supervisor import Node

from ...waiting import wait_for
from ..helpers import drained
from .test_broker import restarted

CONSUMER = b"consumer-1"


def fetch_and_ack(queue):
    """What one fetch of up to 10 delivers, each acked at once."""
    delivered = queue.ask(Fetch(CONSUMER, os.getpid(), 10, True), timeout=30)
    if delivered:
        queue.ask(Settle(CONSUMER, [d.seq_id for d in delivered], "ack"), timeout=30)
    return delivered


def test_a_message_acked_before_its_producer_record_is_not_delivered_again_when_resent(node):
    """The persistent store is stopped, so a message for it waits for its confirm (and
    its producer record) as long as the test wants: the window between a publish and
    its record, held open. A consumer asks for it meanwhile and acks what it gets; the
    queue is killed, the producer (never confirmed) sends it again under the same
    sequence: it is confirmed, and the consumer gets it once in all."""
    node.declare_queue("orders")
    body = b"order 7 " + b"x" * 6000  # in the shared store: its confirm waits for it
    publish = Publish([encode(Message(body))], True, None, None, b"p", 0)
    queue = node.queue("orders")
    store = node.store().pid
    os.kill(store, signal.SIGSTOP)
    try:
        queue.ask_async(publish, timeout=60)  # never answered: the queue dies first
        taken = [d.payload for d in fetch_and_ack(queue)]
        assert queue.ask(QueueStats(), timeout=30)["depth"] == (0 if taken else 1)
        os.kill(queue.pid, signal.SIGKILL)
        wait_for(lambda: not process_exists(queue.pid))
    finally:
        os.kill(store, signal.SIGCONT)
    wait_for(lambda: restarted(node, "orders", queue.pid), timeout=60)
    queue = node.queue("orders")
    assert queue.ask(publish, timeout=60) == 1
    while delivered := fetch_and_ack(queue):
        taken += [d.payload for d in delivered]
    assert [encode(Message(body))] == taken


def test_a_resend_after_two_restarts_is_a_repeat_though_the_first_had_it_consumed(tmp_path):
    """A queue stopped after its second batch was durable but before that batch's record
    (the log cut back to the first batch's), then started: a consumer takes everything
    and another producer's record moves the low water past the batch. Started again, the
    queue still knows the batch when its producer, never told, sends it at last."""
    data_dir = tmp_path / "data"
    log = data_dir / "queues" / "orders" / "producers.log"
    first = [b"first %d" % n for n in range(500)]
    second = [b"second %d" % n for n in range(500)]
    with Node(data_dir) as node:
        node.declare_queue("orders")
        connection = node.connect()
        connection.publish_many("orders", first, producer_id="p", sequence=0)
        logged = log.read_bytes()
        connection.publish_many("orders", second, producer_id="p", sequence=500)
    log.write_bytes(logged)
    with Node(data_dir) as node:
        connection = node.connect()
        assert drained(connection, "orders") == first + second
        connection.publish("orders", b"other", producer_id="q", sequence=0)
    with Node(data_dir) as node:
        connection = node.connect()
        connection.publish_many("orders", second, producer_id="p", sequence=500)
        stats = connection.queue_stats("orders")
        assert (stats["len"], stats["repeats_dropped"]) == (1, 500)
        assert connection.get("orders").body == b"other"


def test_messages_a_held_batch_pushes_over_max_length_are_dead_lettered_once_though_resent(
    node,
):
    """A deduplicated batch of three over a queue's max-length of one, its producer
    record held back (the persistent store stopped): the two it pushes out of the queue
    go to the dead-letter exchange only once the record names them. The queue is killed
    in that window and the producer, never confirmed, sends the batch again: each message
    pushed out reaches the dead-letter queue once in all."""
    node.declare_exchange("dlx", kind="fanout")
    node.declare_queue("dead")
    node.bind_queue("dead", "dlx")
    node.declare_queue("orders", max_length=1, dead_letter_exchange="dlx")
    bodies = [b"order %d " % n + b"x" * 6000 for n in range(3)]  # in the shared store
    publish = Publish([encode(Message(body)) for body in bodies], True, None, None, b"p", 0)
    queue = node.queue("orders")
    store = node.store().pid
    os.kill(store, signal.SIGSTOP)
    try:
        queue.ask_async(publish, timeout=60)  # never answered: the queue dies first
        assert queue.ask(QueueStats(), timeout=30)["messages_ready"] >= 1  # taken, held
        os.kill(queue.pid, signal.SIGKILL)
        wait_for(lambda: not process_exists(queue.pid))
    finally:
        os.kill(store, signal.SIGCONT)
    wait_for(lambda: restarted(node, "orders", queue.pid), timeout=60)
    assert node.queue("orders").ask(publish, timeout=60) == 3
    connection = node.connect()
    # the dead letters confirmed, and acked in the queue: the one left is all it holds
    wait_for(lambda: connection.queue_stats("orders")["depth"] == 1, timeout=60)
    assert sorted(drained(connection, "dead")) == bodies[:2]
    assert drained(connection, "orders") == bodies[2:]

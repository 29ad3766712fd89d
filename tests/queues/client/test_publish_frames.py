"""publish_async's shared frames: consecutive messages travel in one Publish, and a user
sees each message as if it went alone. What a producer hands over reaches the queue
while it sleeps and when it exits at once; each message gets its own confirm or nack;
the connection's other calls keep their place among its publishes; a deduplicating
producer's sequences stay exact across frames."""

import subprocess
import sys
import textwrap
import threading

import pytest

from warren import connect
from warren.queues import Nacked
from warren.supervisor import Node

from ...waiting import wait_for

LOOPBACK_ANY_PORT = "tcp://127.0.0.1:*"

PRODUCER = textwrap.dedent(
    """
    import sys, time
    from warren import connect
    target, queue, count, then = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    connection = connect(target)
    for n in range(count):
        connection.publish_async(queue, str(n).encode())
    print("published", flush=True)
    if then == "sleep":
        time.sleep(3600)
    """
)


@pytest.fixture
def node(tmp_path):
    with Node(tmp_path / "data", listen=LOOPBACK_ANY_PORT) as running:
        yield running


def target_of(node, transport):
    return {"ipc": node.data_dir, "tcp": node.listen_endpoint}[transport]


def ready(connection, queue):
    return connection.queue_stats(queue)["messages_ready"]


def run_producer(node, transport, count, then):
    return subprocess.Popen(
        [
            sys.executable,
            "-c",
            PRODUCER,
            str(target_of(node, transport)),
            "orders",
            str(count),
            then,
        ],
        stdout=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_what_a_producer_handed_over_reaches_the_queue_while_it_sleeps(node, transport):
    """Three publish_async calls, then the producer sleeps without waiting for a confirm
    or calling anything: the messages lingering for company still go, in order."""
    node.declare_queue("orders")
    producer = run_producer(node, transport, 3, "sleep")
    try:
        assert producer.stdout.readline().strip() == "published"
        with node.connect() as observer:
            wait_for(lambda: ready(observer, "orders") == 3, timeout=5)
            assert [observer.get("orders").body for _ in range(3)] == [b"0", b"1", b"2"]
    finally:
        producer.kill()
        producer.wait()
        producer.stdout.close()


@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_a_producer_exiting_right_after_publish_async_loses_nothing_it_published(node, transport):
    node.declare_queue("orders")
    producer = run_producer(node, transport, 100, "exit")
    try:
        assert producer.stdout.readline().strip() == "published"
        assert producer.wait(timeout=30) == 0
    finally:
        producer.kill()
        producer.wait()
        producer.stdout.close()
    with node.connect() as observer:
        wait_for(lambda: ready(observer, "orders") == 100, timeout=5)
        assert [observer.get("orders").body for _ in range(100)] == [
            str(n).encode() for n in range(100)
        ]


def test_a_full_queue_refuses_only_the_messages_past_its_limit_in_a_shared_frame(node):
    node.declare_queue("bounded", max_length=3, overflow="reject-publish")
    connection = node.connect()
    confirms = [connection.publish_async("bounded", bytes([n])) for n in range(5)]
    for confirm in confirms[:3]:
        confirm.result(timeout=10)
    for confirm in confirms[3:]:
        with pytest.raises(Nacked, match="the message was refused"):
            confirm.result(timeout=10)
        assert confirm.done()
    with pytest.raises(Nacked, match="is full"):
        connection.wait_for_confirms(timeout=10)
    assert [connection.get("bounded", ack=False).body for _ in range(3)] == [b"\0", b"\1", b"\2"]


@pytest.mark.parametrize("transport", ["in-process", "ipc", "tcp"])
def test_calls_between_publishes_see_every_message_published_before_them(node, transport):
    """No call overtakes a publish made before it: a purge takes what was published just
    before it, a get sees it, a stats call counts it, a declare of another queue does not
    hold it back."""
    node.declare_queue("orders")
    target = None if transport == "in-process" else target_of(node, transport)
    with node.connect() if target is None else connect(target) as connection:
        connection.publish_async("orders", b"a")
        connection.publish_async("orders", b"b")
        assert connection.purge_queue("orders") == 2
        connection.publish_async("orders", b"c")
        assert connection.queue_stats("orders")["messages_ready"] == 1
        connection.publish_async("orders", b"d")
        connection.declare_queue("other")
        connection.publish_async("other", b"e")
        delivery = connection.get("orders")
        assert delivery.body == b"c"
        delivery.ack()
        assert connection.get("orders").body == b"d"
        assert connection.get("other").body == b"e"


def test_a_deduplicating_producer_keeps_exact_sequences_across_frames(node):
    """Sequences 0..99 span two frames; a resend of 50..149 adds only 100..149; a gap in
    the sequences goes in a frame of its own, refused alone."""
    node.declare_queue("orders")
    connection = node.connect()
    for n in range(100):
        connection.publish_async("orders", b"%d" % n, producer_id="p", sequence=n)
    connection.wait_for_confirms(timeout=30)
    resent = [
        connection.publish_async("orders", b"%d" % n, producer_id="p", sequence=n)
        for n in range(50, 150)
    ]
    gap = connection.publish_async("orders", b"1000", producer_id="p", sequence=1000)
    for confirm in resent:
        confirm.result(timeout=30)
    with pytest.raises(Nacked, match="send again from 150"):
        gap.result(timeout=30)
    bodies = [connection.get("orders", ack=False).body for _ in range(150)]
    assert bodies == [b"%d" % n for n in range(150)]
    assert connection.get("orders") is None


def test_a_linger_that_is_not_a_small_number_of_seconds_is_refused(node):
    for bad in (-1, 2, float("nan"), "0.1", True):
        with pytest.raises(ValueError, match="linger_s"):
            node.connect(linger_s=bad)


def test_a_connection_busy_for_a_long_wait_still_sends_what_is_published_after_it(node):
    """The flusher looks again, ever less often, at a connection whose user holds it (a
    long wait for a confirm); however many times it finds it busy, it keeps looking, and
    what the user publishes after the wait still goes without another call."""
    node.declare_queue("orders")
    connection = node.connect()
    held, release = threading.Event(), threading.Event()

    def wait_for_a_confirm():  # what such a wait holds, for as long as it lasts
        with connection._lock:
            held.set()
            release.wait(30)

    waiter = threading.Thread(target=wait_for_a_confirm)
    waiter.start()
    try:
        held.wait(10)
        for _ in range(5000):
            connection._flush_lingering()
    finally:
        release.set()
        waiter.join()
    connection.publish_async("orders", b"after the wait")
    with node.connect() as observer:
        wait_for(lambda: ready(observer, "orders") == 1, timeout=5)

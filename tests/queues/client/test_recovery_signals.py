"""A recovering client through every ordinary way its node stops: SIGTERM or SIGHUP to the
node's process alone or to its whole process group (each an orderly stop), the node then
started again on the same data directory; a node stopped for good; a full disk; a restart
while a call is in flight. The node runs as ``warren node`` in a session of its own
(``NodeProcess``, shared with the kill tests)."""

import os
import signal
import sys
import threading
import time

import pytest

from warren import connect
from warren.queues.client.recovery import NODE_SILENCE_S
from warren.queues.errors import Blocked, ConnectionClosed, NodeNotRunning

from ...store.helpers import fill_disk
from ...waiting import wait_for
from .node_process import TRANSPORTS, NodeProcess, Traffic

STOPS = {
    "SIGTERM to the node": (signal.SIGTERM, "node"),
    "SIGHUP to the node": (signal.SIGHUP, "node"),
    "SIGTERM to its group": (signal.SIGTERM, "group"),
    "SIGHUP to its group": (signal.SIGHUP, "group"),
    "SIGTERM to every process": (signal.SIGTERM, "every process"),
}


@pytest.mark.parametrize("stop", STOPS)
def test_producers_and_consumers_go_through_a_node_stopped_by_a_signal_and_started_again(
    node, stop
):
    signum, to = STOPS[stop]
    traffic: list[Traffic] = []
    try:
        for transport in TRANSPORTS:
            traffic.append(Traffic(node.target(transport), queue=f"orders-{transport}"))
        for each in traffic:
            each.progressed()
        node.stop_by(signum, to)
        node.start()
        for each in traffic:
            each.progressed()
        again = [each.finish() for each in traffic]
    finally:
        for each in traffic:
            each.stop()
    for each in traffic:
        assert each.recoveries["producer"] == 1 and each.recoveries["consumer"] == 1, (
            each.queue,
            each.recoveries,
        )
    print([(len(t.confirmed), len(t.consumed), a) for t, a in zip(traffic, again, strict=True)])


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_node_stopped_for_good_ends_a_recovering_connection_in_connection_closed(node, transport):
    """docs/broker.md: the loss is noticed at once over ipc, over tcp by the port that
    refuses connections once the listener is gone (not by 15 s of silence);
    ``on_disconnect`` runs then, and the connection tries to connect again for at most
    ``recovery_timeout_s`` before it closes with ``ConnectionClosed``."""
    lost: list[tuple[float, Exception]] = []
    recovered: list[object] = []
    connection = connect(
        node.target(transport),
        recovery_timeout_s=2,
        on_disconnect=lambda error: lost.append((time.monotonic(), error)),
        on_recovery=recovered.append,
    )
    connection.declare_queue("orders")
    consumer = connection.consume("orders")
    connection.publish("orders", b"before")
    node.stop_by(signal.SIGTERM, "node")
    stopped = time.monotonic()
    with pytest.raises(ConnectionClosed, match="did not come back within 2 s"):
        connection.publish("orders", b"into the void")
    gave_up = time.monotonic()
    assert len(lost) == 1 and not recovered and connection.recoveries == 0
    noticed, error = lost[0]
    assert isinstance(error, ConnectionClosed | NodeNotRunning), error
    # An attempt to connect again waits no longer than the recovery has left (the tcp
    # connect's own 10 s used to run past it); slack for a loaded machine.
    assert gave_up - noticed < 2 + 5, gave_up - noticed
    # over tcp, found by the refused port: sooner than the silence would tell
    assert noticed - stopped < (10 if transport == "ipc" else NODE_SILENCE_S)
    with pytest.raises(ConnectionClosed, match="closed"):
        consumer.get(timeout=1)
    with pytest.raises(ConnectionClosed, match="closed"):
        connection.declare_queue("orders")
    connection.close()
    print(f"noticed after {noticed - stopped:.1f} s, gave up {gave_up - noticed:.1f} s later")


@pytest.fixture
def node_on_a_small_disk(small_disk):
    """A node on a real 8 MiB filesystem (its stores' lock tables take 4 MiB of it),
    whose disk alarm goes off below 1.5 MiB free."""
    running = NodeProcess(
        small_disk / "data",
        options=(
            "--file-size-limit",
            "256KiB",
            "--disk-free-limit",
            "1536KiB",
            "--check-interval-s",
            "0.1",
        ),
    )
    try:
        yield running
    finally:
        running.stop()


def waiting_in(thread: threading.Thread, function: str) -> bool:
    """Whether ``thread`` is inside a call of ``function`` now: its call is in flight."""
    frame = sys._current_frames().get(thread.ident or 0)
    while frame is not None:
        if frame.f_code.co_name == function:
            return True
        frame = frame.f_back
    return False


def answering_nothing(node: NodeProcess, call: str) -> int:
    """Stop (SIGSTOP) the process that answers ``call``: the node's own for a declare,
    the queue's for the others; its pid."""
    pid = node.process.pid if call == "a declare" else node.queue_pid("orders")
    os.kill(pid, signal.SIGSTOP)
    return pid


CALLS_IN_FLIGHT = {  # the call, and the function it waits in once sent
    "a declare": (lambda connection: connection.declare_queue("more"), "_call"),
    "a confirm": (
        lambda connection: connection.publish("orders", b"late", producer_id="p", sequence=0),
        "await_answer",
    ),
    "queue_stats": (lambda connection: connection.queue_stats("orders"), "await_answer"),
}


@pytest.mark.parametrize("call", CALLS_IN_FLIGHT)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_call_in_flight_when_the_node_stops_completes_on_the_node_started_again(
    node, transport, call
):
    """The process answering the call is stopped (SIGSTOP) so that the call is surely
    in flight when the node is stopped by SIGTERM; the call goes on once the connection
    recovered on the node started again, within its documented bounds (a loss over tcp
    is found after 15 s of silence at the most, then the call is made again)."""
    connection = connect(node.target(transport))
    connection.declare_queue("orders")
    make, waits_in = CALLS_IN_FLIGHT[call]
    outcome: list[object] = []

    def in_flight() -> None:
        try:
            outcome.append(make(connection))
        except Exception as exc:
            outcome.append(exc)

    stopped = answering_nothing(node, call)
    caller = threading.Thread(target=in_flight)
    caller.start()
    try:
        wait_for(lambda: waiting_in(caller, waits_in) or not caller.is_alive())
        assert caller.is_alive(), outcome  # nothing answers it yet
        if stopped == node.process.pid:
            node.process.send_signal(signal.SIGTERM)  # pending while the node is stopped
            node.stop_by(signal.SIGCONT, "node")  # which lets it run, and stop in order
        else:
            node.stop_by(signal.SIGTERM, "node")
        node.start()
        wait_for(lambda: not caller.is_alive(), timeout=NODE_SILENCE_S + 60)
    finally:
        caller.join(timeout=300)
    (result,) = outcome
    assert not isinstance(result, Exception), repr(result)
    # A declare may have been answered by the stopping node (durably: it is there
    # after the restart); the connection then recovers at its next call.
    assert "more" in connection.list_queues() or call != "a declare"
    assert connection.recoveries == 1
    if call == "a confirm":
        assert [connection.get("orders").body, connection.get("orders")] == [b"late", None]
    connection.close()


def test_a_node_restarted_on_a_disk_full_to_the_last_byte_serves_and_producers_go_on(
    node_on_a_small_disk, small_disk
):
    node = node_on_a_small_disk
    producers = {t: connect(node.target(t), idempotent=True, call_timeout_s=2) for t in TRANSPORTS}
    before = [b"before %d" % n for n in range(500)]
    for transport, producer in producers.items():
        producer.declare_queue(f"orders-{transport}")
        producer.publish_many(f"orders-{transport}", before)
    filler = fill_disk(small_disk)  # to the last byte, faster than the alarm's check
    try:
        node.stop_by(signal.SIGTERM, "node")
        node.start()  # serves, on both transports: it did not start ("No space left")
        for transport, producer in producers.items():  # recovers, and finds all it had
            assert producer.queue_stats(f"orders-{transport}")["depth"] == len(before)
            wait_for(lambda producer=producer: producer.blocked)  # the new node's alarm
            with pytest.raises(Blocked, match="disk alarm has held this publish"):
                producer.publish(f"orders-{transport}", b"held")  # for call_timeout_s
    finally:
        os.unlink(filler)
    after = [b"after %d" % n for n in range(100)]
    for transport, producer in producers.items():
        wait_for(lambda producer=producer: not producer.blocked)  # the alarm cleared
        producer.publish_many(f"orders-{transport}", after)
        got = []
        while (delivery := producer.get(f"orders-{transport}")) is not None:
            got.append(delivery.body)
            delivery.ack()
        assert got == before + after
        assert producer.recoveries == 1
        producer.close()

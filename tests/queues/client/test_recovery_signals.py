"""A recovering client through every ordinary way its node stops: SIGTERM or SIGHUP to the
node's process alone or to its whole process group (each an orderly stop), the node then
started again on the same data directory; a node stopped for good; a full disk; a restart
while a call is in flight. The node runs as ``warren node`` in a session of its own
(``NodeProcess``, shared with the kill tests)."""

import signal
import time

import pytest

from warren import connect
from warren.queues.client.recovery import NODE_SILENCE_S
from warren.queues.errors import ConnectionClosed, NodeNotRunning

from .test_recovery import TRANSPORTS, NodeProcess, Traffic

STOPS = {
    "SIGTERM to the node": (signal.SIGTERM, "node"),
    "SIGHUP to the node": (signal.SIGHUP, "node"),
    "SIGTERM to its group": (signal.SIGTERM, "group"),
    "SIGHUP to its group": (signal.SIGHUP, "group"),
    "SIGTERM to every process": (signal.SIGTERM, "every process"),
}


@pytest.fixture
def node(tmp_path):
    running = NodeProcess(tmp_path / "data")
    try:
        yield running
    finally:
        running.stop()


@pytest.mark.parametrize("stop", STOPS)
def test_producers_and_consumers_go_through_a_node_stopped_by_a_signal_and_started_again(
    node, stop
):
    signum, to = STOPS[stop]
    traffic = [Traffic(node.target(t), queue=f"orders-{t}") for t in TRANSPORTS]
    try:
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
    """docs/broker.md: the loss is noticed at once over ipc, after 15 s of silence over
    tcp; ``on_disconnect`` runs then, and the connection tries to connect again for at
    most ``recovery_timeout_s`` before it closes with ``ConnectionClosed``."""
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
    assert noticed - stopped < (0 if transport == "ipc" else NODE_SILENCE_S) + 10
    with pytest.raises(ConnectionClosed, match="closed"):
        consumer.get(timeout=1)
    with pytest.raises(ConnectionClosed, match="closed"):
        connection.declare_queue("orders")
    connection.close()
    print(f"noticed after {noticed - stopped:.1f} s, gave up {gave_up - noticed:.1f} s later")

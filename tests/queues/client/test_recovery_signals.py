"""A recovering client through every ordinary way its node stops: SIGTERM or SIGHUP to the
node's process alone or to its whole process group (each an orderly stop), the node then
started again on the same data directory; a node stopped for good; a full disk; a restart
while a call is in flight. The node runs as ``warren node`` in a session of its own
(``NodeProcess``, shared with the kill tests)."""

import signal

import pytest

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

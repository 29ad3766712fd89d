"""Every ordinary way of stopping a node is an orderly stop: SIGTERM, SIGINT or SIGHUP to
its process group (a terminal, ``timeout``, ``kill -- -PGID``) or SIGTERM to every one of
its processes at once (systemd's control-group stop) reaches a program that runs the node
with ``Node.run_until_signalled``, as ``warren node`` does. It exits 0, leaves no process
behind, and its persistent store starts clean next time with every message it had
confirmed. A signal to one actor stops that actor in order, and its supervisor restarts
it. SIGINT (Ctrl-C) is the node's alone: sent to one of its other processes (the
forkserver, its spare child, a queue, a store) it is ignored, and the node loses nothing
and serves on."""

import contextlib
import os
import signal
import time
from pathlib import Path

import psutil
import pytest

from warren.actors.process import process_exists
from warren.store import MessageStore
from warren.supervisor import Node

from ...waiting import the_spare, wait_for
from ..node_child import message_body, message_id

MESSAGES = 500


def assert_stopped_cleanly(process, family: list[int], data: Path) -> None:
    assert process.wait(timeout=120) == 0, process.stderr_path.read_text()
    wait_for(lambda: not any(map(process_exists, family)))
    with MessageStore(data / "msg_store_persistent") as reopened:
        assert reopened.recovered_clean
        assert all(reopened.read(message_id(i)) == message_body(i) for i in range(MESSAGES))
    with MessageStore(data / "msg_store_transient") as reopened:
        assert reopened.recovered_clean


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_to_the_nodes_process_group_stops_it_in_order(node_process, tmp_path, signum):
    process, family = node_process(
        str(tmp_path / "data"), "--messages", str(MESSAGES), "--until-signalled"
    )
    assert len(family) == 8  # node, forkserver, GC, two stores, the WAL, two workers
    os.killpg(process.pid, signum)
    assert_stopped_cleanly(process, family, tmp_path / "data")
    assert process.stdout.read().strip() == signal.Signals(signum).name


def test_sigterm_to_every_process_of_the_node_at_once_stops_it_in_order(node_process, tmp_path):
    process, family = node_process(
        str(tmp_path / "data"), "--messages", str(MESSAGES), "--until-signalled"
    )
    for pid in family:  # as systemd does: one that ended since it was listed is passed over
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    assert_stopped_cleanly(process, family, tmp_path / "data")


def test_an_embedding_program_killed_by_a_signal_leaves_its_stores_clean(node_process, tmp_path):
    process, family = node_process(str(tmp_path / "data"), "--messages", str(MESSAGES))
    process.send_signal(signal.SIGTERM)  # the default action: the program just dies
    assert process.wait(timeout=30) == -signal.SIGTERM
    wait_for(lambda: not any(map(process_exists, family)))
    with MessageStore(tmp_path / "data" / "msg_store_persistent") as reopened:
        assert reopened.recovered_clean
        assert all(reopened.read(message_id(i)) == message_body(i) for i in range(MESSAGES))


def current_incarnation(node: Node, name: str) -> int | None:
    try:
        return node.store(name).incarnation
    except KeyError:
        return None  # between two incarnations


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_to_one_store_stops_it_in_order_and_it_is_restarted_clean(tmp_path, signum):
    with Node(tmp_path / "data") as node:
        first = node.store()
        os.kill(first.pid, signum)
        wait_for(
            lambda: (current_incarnation(node, "msg_store_persistent") or 0) > first.incarnation
        )
        stats = node.store_stats()["msg_store_persistent"]
        assert stats["recovered_clean"]
        store_row = node.status()["tree"]["children"][1]
        assert (store_row["id"], store_row["restarts"]) == ("msg_store_persistent", 1)


def signal_taken(pid: int, signum: int) -> bool:
    """Whether process ``pid`` has taken ``signum`` (acted on it or ignored it: it is
    pending no more), or is gone."""
    bit = 1 << (signum - 1)
    try:
        with open(f"/proc/{pid}/status") as status:
            lines = dict(line.split(":", 1) for line in status)
    except FileNotFoundError:
        return True
    return not any(int(lines[mask], 16) & bit for mask in ("SigPnd", "ShdPnd"))


def sigint_target(node: Node, target: str) -> int:
    if target == "forkserver":
        return node.actors.forkserver_pid
    if target == "spare":
        return the_spare(node.actors.forkserver_pid).pid
    if target == "queue":
        return node.queue("orders").pid
    return node.store(target).pid


@pytest.mark.parametrize(
    "target", ["forkserver", "spare", "queue", "msg_store_persistent", "msg_store_transient"]
)
def test_sigint_to_one_process_of_the_node_is_ignored_and_loses_nothing(tmp_path, target):
    orders = [b"order %d" % n for n in range(50)]
    with Node(tmp_path / "data") as node, node.connect() as connection:
        node.declare_queue("orders")
        assert connection.publish_many("orders", orders[:25]) == 25
        connection.publish_many("orders", orders[25:], persistent=False)
        pid = sigint_target(node, target)
        os.kill(pid, signal.SIGINT)
        wait_for(lambda: signal_taken(pid, signal.SIGINT))
        assert process_exists(pid)  # ignored: the same process serves on
        node.declare_queue("invoices")  # a spawn: through the spare, if it was the target
        if target == "spare":
            assert node.queue("invoices").pid == pid
        connection.publish_many("invoices", [b"invoice"])
        got = []
        while (delivery := connection.get("orders")) is not None:
            got.append(delivery.body)
            delivery.ack()
        assert got == orders
        assert connection.get("invoices").body == b"invoice"
        assert process_exists(pid)
        assert all(child["restarts"] == 0 for child in node.status()["tree"]["children"])


def test_a_node_stopped_whole_past_its_heartbeat_timeout_resumes_with_every_actor(tmp_path):
    # SIGSTOP to every process of the node (a suspended machine, a paused container, a
    # cluster's paused leader), then SIGCONT: its supervisors were held as long as their
    # children, and killed every one of them for the silence they had not been there to
    # hear.
    from warren import connect

    from ...queues.client.node_process import NodeProcess

    node = NodeProcess(tmp_path / "data", ("--heartbeat-timeout-s", "2"))
    try:
        with connect(node.endpoint) as connection:
            connection.declare_queue("orders")
            connection.publish("orders", b"before the pause")
        family = [p.pid for p in psutil.Process(node.process.pid).children(recursive=True)]
        os.killpg(node.process.pid, signal.SIGSTOP)
        time.sleep(5)  # the pause itself: more than twice the heartbeat timeout
        os.killpg(node.process.pid, signal.SIGCONT)
        with connect(node.endpoint, wait=30) as connection:
            connection.publish("orders", b"after it")
            assert [connection.get("orders", ack=False).body for _ in range(2)] == [
                b"before the pause",
                b"after it",
            ]
        # no process was killed for the pause (a restart replaces one)
        assert [pid for pid in family if not process_exists(pid)] == []
    finally:
        node.stop()

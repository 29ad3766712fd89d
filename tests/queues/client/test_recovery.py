"""A client through kills of its whole node: a node runs as `warren node` in a process
group of its own, is SIGKILLed whole and started again on the same data directory and
port; connections recover by themselves (or, told not to, end in ConnectionClosed)."""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from warren import connect
from warren.queues.errors import ConnectionClosed, Nacked

from ...waiting import group_alive, wait_for

ROOT = Path(__file__).resolve().parents[3]
WARREN = [sys.executable, "-m", "warren.supervisor.cli"]
TRANSPORTS = ["ipc", "tcp"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class NodeProcess:
    """``warren node`` on one data directory and one tcp port (and ``options``), killed
    whole or stopped by a signal, and started again there."""

    def __init__(self, data_dir: Path, options: tuple[str, ...] = ()) -> None:
        self.data_dir = data_dir
        self.options = options
        self.endpoint = f"tcp://127.0.0.1:{free_port()}"
        self.process: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                *WARREN,
                "node",
                "--data-dir",
                str(self.data_dir),
                "--listen",
                self.endpoint,
                *self.options,
            ],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            for transport in TRANSPORTS:  # it serves, on both
                connect(self.target(transport), wait=60, recover=False).close()
        except BaseException:
            self.stop()  # it does not serve: no test will stop it
            raise

    def kill(self) -> None:
        """SIGKILL every process of the node at once, and reap its main process."""
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        wait_for(lambda: not group_alive(self.process.pid), timeout=30)

    def restart(self) -> None:
        self.kill()
        self.start()

    def stop_by(self, signum: int, to: str) -> None:
        """Send ``signum`` to the node's process (``to="node"``), to its process group
        (``"group"``: a terminal, ``kill -- -PGID``) or to every process of the node at
        once (``"every process"``: systemd's control-group stop), and wait until it
        stopped: cleanly, exit 0."""
        assert self.process is not None
        if to == "group":
            os.killpg(self.process.pid, signum)
        elif to == "every process":
            family = psutil.Process(self.process.pid).children(recursive=True)
            self.process.send_signal(signum)
            for process in family:
                with contextlib.suppress(psutil.Error):
                    process.send_signal(signum)
        else:
            assert to == "node", to
            self.process.send_signal(signum)
        assert self.process.wait(timeout=300) == 0
        wait_for(lambda: not group_alive(self.process.pid), timeout=30)

    def queue_pid(self, queue: str) -> int:
        """The pid of the process titled ``warren: queue QUEUE``."""
        assert self.process is not None
        for child in psutil.Process(self.process.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if child.cmdline()[:1] == [f"warren: queue {queue}"]:
                    return child.pid
        raise AssertionError(f"no process for queue {queue}")

    def target(self, transport: str) -> str:
        return str(self.data_dir) if transport == "ipc" else self.endpoint

    def stop(self) -> None:
        """Stop the node's whole process group (SIGTERM, then SIGKILL), and close the pipes
        a test gave its process."""
        if self.process is None:
            return
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        wait_for(lambda: not group_alive(self.process.pid), timeout=30)
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):  # a write its reader never took
                    pipe.close()


class Traffic:
    """A producer (``publish_many`` batches, each confirmed) and a consumer (acks each
    delivery) of queue ``queue``, each on a recovering connection of its own and a thread
    of its own, until ``finish``; then every confirmed message must have been consumed,
    none twice but flagged redelivered."""

    BATCH = 100

    def __init__(self, target: str, queue: str = "orders") -> None:
        self.target, self.queue = target, queue
        setup = connect(target, recover=False)
        setup.declare_queue(queue)
        setup.close()
        self.confirmed: list[bytes] = []
        self.consumed: list[tuple[bytes, bool]] = []
        self.failures: list[str] = []
        self.recoveries = {"producer": 0, "consumer": 0}
        self._produced_all = threading.Event()
        self._threads = [
            threading.Thread(target=self._produce, name=f"producer of {queue}"),
            threading.Thread(target=self._consume, name=f"consumer of {queue}"),
        ]
        for thread in self._threads:
            thread.start()

    def _recovered(self, who: str) -> None:
        self.recoveries[who] += 1

    def _produce(self) -> None:
        try:
            with connect(
                self.target, idempotent=True, on_recovery=lambda _: self._recovered("producer")
            ) as producer:
                start = 0
                while not self._produced_all.is_set():
                    bodies = [
                        b"%s %d" % (self.queue.encode(), n)
                        for n in range(start, start + self.BATCH)
                    ]
                    producer.publish_many(self.queue, bodies)
                    self.confirmed.extend(bodies)
                    start += self.BATCH
        except BaseException:
            self.failures.append(traceback.format_exc())

    def _consume(self) -> None:
        try:
            with connect(
                self.target, on_recovery=lambda _: self._recovered("consumer")
            ) as consumer:
                deliveries = consumer.consume(self.queue, prefetch=50)
                bodies: set[bytes] = set()
                while not (
                    self._produced_all.is_set()
                    and len(bodies) >= len(self.confirmed)
                    and bodies.issuperset(self.confirmed)
                ):
                    delivery = deliveries.get(timeout=1)
                    if delivery is not None:
                        self.consumed.append((delivery.body, delivery.redelivered))
                        bodies.add(delivery.body)
                        delivery.ack()
        except BaseException:
            self.failures.append(traceback.format_exc())

    def confirmed_past(self, mark: int) -> Callable[[], object]:
        """A condition: ``mark`` messages confirmed, or a thread failed."""
        return lambda: len(self.confirmed) >= mark or self.failures

    def progressed(self, messages: int = 500, timeout: float = 120) -> None:
        """Wait until ``messages`` more are confirmed (or a thread failed)."""
        wait_for(self.confirmed_past(len(self.confirmed) + messages), timeout=timeout)

    def finish(self) -> int:
        """Stop producing, let the consumer take the rest, and check what it got; how
        many came twice (flagged)."""
        self._produced_all.set()
        for thread in self._threads:
            thread.join(timeout=300)
        assert not self.failures, self.failures[0]
        assert not any(thread.is_alive() for thread in self._threads)
        assert {body for body, _ in self.consumed} == set(self.confirmed)
        seen: set[bytes] = set()
        for body, redelivered in self.consumed:
            assert body not in seen or redelivered, f"{body!r} delivered twice, not flagged"
            seen.add(body)
        return len(self.consumed) - len(seen)

    def stop(self) -> None:
        """End the threads however the test went (after ``finish``, nothing to do)."""
        self._produced_all.set()
        for thread in self._threads:
            thread.join(timeout=300)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_producers_and_consumers_go_through_three_node_kills_and_lose_nothing_confirmed(
    node, transport
):
    traffic = Traffic(node.target(transport))
    try:
        for _ in range(3):  # each kill once the producer went on after the last
            traffic.progressed()
            node.restart()
        traffic.progressed()
        again = traffic.finish()
    finally:
        traffic.stop()
    # Each kill waited for the producer's progress, so it recovered from each; the
    # consumer may have been recovering still when the next kill came, and recovered
    # from both at once.
    recoveries = traffic.recoveries
    assert recoveries["producer"] == 3 and 1 <= recoveries["consumer"] <= 3, recoveries
    print(f"{len(traffic.confirmed)} confirmed, {len(traffic.consumed)} consumed, {again} again")


CALLS_AFTER_THE_KILL = {
    "publish": lambda connection, _: connection.publish("orders", b"after"),
    "a confirm": lambda connection, _: connection.publish_async("orders", b"after").result(),
    "a consumer": lambda _, consumer: consumer.get(timeout=60),
    "a declare": lambda connection, _: connection.declare_queue("more"),
}


@pytest.mark.parametrize("call", CALLS_AFTER_THE_KILL)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_without_recovery_a_node_kill_ends_every_call_in_connection_closed(node, transport, call):
    connection = connect(node.target(transport), recover=False)
    connection.declare_queue("orders")
    consumer = connection.consume("orders")
    lost: list[Exception] = []
    connection.on_disconnect = lost.append
    node.restart()
    with pytest.raises(ConnectionClosed, match="the node went away") as raised:
        CALLS_AFTER_THE_KILL[call](connection, consumer)
    assert type(raised.value) is ConnectionClosed
    assert len(lost) == 1
    with pytest.raises(ConnectionClosed, match="closed"):
        connection.get("orders")
    connection.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_recovery_gives_up_after_its_timeout_with_connection_closed(node, transport):
    connection = connect(node.target(transport), recovery_timeout_s=2)
    connection.declare_queue("orders")
    node.kill()
    with pytest.raises(ConnectionClosed, match="did not come back within 2 s"):
        connection.publish("orders", b"into the void")
    connection.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_publish_in_doubt_is_sent_again_with_a_producer_id_and_nacked_without(node, transport):
    connection = connect(node.target(transport))
    connection.declare_queue("orders")
    os.kill(node.queue_pid("orders"), signal.SIGSTOP)  # it confirms nothing from now on
    plain = connection.publish_async("orders", b"plain")
    deduplicated = connection.publish_async("orders", b"dedup", producer_id="p", sequence=0)
    connection.flush()
    node.restart()
    with pytest.raises(Nacked, match="in doubt: publish it again"):
        plain.result(timeout=60)
    deduplicated.result(timeout=60)
    assert connection.recoveries == 1
    assert connection.get("orders", ack=False).body == b"dedup"  # the stopped queue
    assert connection.get("orders") is None  # never took the plain one
    connection.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_after_a_node_kill_what_the_connection_declared_is_declared_again(node, transport):
    connection = connect(node.target(transport))
    connection.declare_exchange("events", kind="fanout", durable=False)
    connection.declare_queue("audit", durable=False)
    connection.declare_queue("gone", durable=False)
    connection.bind_queue("audit", "events")
    connection.delete_queue("gone")
    recovered = threading.Event()
    connection.on_recovery = lambda _: recovered.set()
    node.restart()
    connection.publish("", b"after the restart", exchange="events")
    assert recovered.is_set()
    assert connection.get("audit").body == b"after the restart"
    assert "gone" not in connection.list_queues()
    assert {"exchange": "events", "queue": "audit", "routing_key": ""} in (
        connection.list_bindings()
    )
    connection.close()


def connected_to_a_stream(node, transport, records):
    """A connection to the node, which declared stream "events" with ``records`` records
    e0, e1 ... at offsets 0, 1 ..."""
    connection = connect(node.target(transport))
    connection.declare_queue("events", type="stream")
    connection.publish_many("events", [b"e%d" % n for n in range(records)])
    return connection


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_stream_consumer_resumes_after_the_last_record_it_handed_out(node, transport):
    connection = connected_to_a_stream(node, transport, records=10)
    reader = connection.consume("events", offset="first")
    got = [reader.get(timeout=30) for _ in range(4)]
    assert [d.offset for d in got] == [0, 1, 2, 3]
    node.restart()
    # sent before the connection noticed the node went away, so in doubt: a producer
    # id makes the connection send it again itself
    connection.publish_many(
        "events", [b"e%d" % n for n in range(10, 15)], producer_id="late", sequence=0
    )
    rest = []
    while (delivery := reader.get(timeout=10)) is not None:
        rest.append(delivery.offset)
        if delivery.offset == 14:
            break
    assert rest == list(range(4, 15))
    assert connection.recoveries == 1
    reader.cancel()
    connection.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_named_stream_consumer_goes_on_and_stores_its_offset_again_on_the_new_node(
    node, transport
):
    connection = connected_to_a_stream(node, transport, records=6)
    reader = connection.consume(
        "events", offset="first", name="billing", store_every=10**6, store_interval_s=3600
    )
    for _ in range(3):
        reader.get(timeout=30)
    connection.store_offset("events", "billing", 2)  # durable at the next commit
    connection.publish("events", b"e6")  # ... which this publish's confirm is
    handed = [reader.get(timeout=30) for _ in range(3)]  # e3..e5, not stored
    node.restart()
    after = reader.get(timeout=30)
    assert after is not None and after.body == b"e6"  # on from where it was
    assert connection.recoveries == 1
    assert reader.get(timeout=0.5) is None  # and it stored what it handed out
    assert connection.query_offset("events", "billing") == after.offset > handed[-1].offset
    reader.cancel()
    connection.close()


def test_a_queue_consumer_holding_deliveries_gets_them_again_flagged_and_old_acks_do_nothing(
    node,
):
    connection = connect(node.target("tcp"))
    connection.declare_queue("orders")
    connection.publish_many("orders", [b"a", b"b", b"c"])
    consumer = connection.consume("orders", prefetch=10)
    held = consumer.get(timeout=30)
    assert held is not None and (held.body, held.redelivered) == (b"a", False)
    disconnected: list[Exception] = []
    connection.on_disconnect = disconnected.append
    node.restart()
    # What it had fetched before the kill may still be handed out, before the
    # connection asks the node for more and finds it gone: those come again too.
    after = []
    while (delivery := consumer.get(timeout=5)) is not None:
        after.append((delivery.body, delivery.redelivered, delivery.session))
        delivery.ack()
    held.ack()  # of the old session: the node has it back; nothing happens
    assert connection.session == 1
    assert {body for body, _, session in after if session == 1} == {b"a", b"b", b"c"}
    assert [flag for body, flag, session in after if session == 1 and body == b"a"] == [True]
    wait_for(lambda: connection.queue_stats("orders")["depth"] == 0)
    assert len(disconnected) == 1 and connection.recoveries == 1
    consumer.cancel()
    connection.close()

"""A client through kills of its whole node: a node runs as `warren node` in a process
group of its own, is SIGKILLed whole and started again on the same data directory and
port; connections recover by themselves (or, told not to, end in ConnectionClosed)."""

import os
import signal
import threading

import pytest

from warren import connect
from warren.queues.errors import ConnectionClosed, Nacked

from ...waiting import wait_for
from .node_process import TRANSPORTS, Traffic


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

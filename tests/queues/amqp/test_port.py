"""The AMQP port of a real node, used by pika as an application on RabbitMQ would.

Each test starts a node with ``amqp="127.0.0.1:0"`` and talks to it with pika's
``BlockingConnection``: what a publisher sent comes back to a consumer byte for byte, a
queue's messages survive a client that vanishes and a port that is killed, and errors
come back with the codes RabbitMQ uses."""

from __future__ import annotations

import datetime
import decimal
import os
import signal
import socket
import subprocess
import sys
import time

import pamqp.commands as commands
import pika
import pika.exceptions
import psutil
import pytest

from warren.queues.amqp import frames
from warren.supervisor import AlarmLimits, Node

from ...waiting import descendant_titled, wait_for


@pytest.fixture
def node(tmp_path):
    with Node(tmp_path / "data", amqp="127.0.0.1:0") as running:
        yield running


def _connect(node: Node, **options: object) -> pika.BlockingConnection:
    assert node.amqp_endpoint is not None
    host, port = node.amqp_endpoint.rsplit(":", 1)
    return pika.BlockingConnection(pika.ConnectionParameters(host, int(port), **options))


CELERY_LIKE = pika.BasicProperties(
    content_type="application/json",
    content_encoding="utf-8",
    headers={"task": "add", "retries": 0, "eta": None, "price": decimal.Decimal("1.25")},
    delivery_mode=2,
    priority=0,
    correlation_id="c0ffee",
    reply_to="replies",
    message_id="m-1",
    timestamp=1_700_000_000,
    type="task",
    app_id="tests",
)


def test_a_message_comes_back_as_its_publisher_sent_it(node):
    connection = _connect(node)
    channel = connection.channel()
    channel.queue_declare("jobs", durable=True)
    channel.confirm_delivery()
    channel.basic_publish("", "jobs", b'{"x": 1}', CELERY_LIKE, mandatory=True)
    method, properties, body = channel.basic_get("jobs", auto_ack=True)
    assert body == b'{"x": 1}'
    assert (method.exchange, method.routing_key, method.redelivered) == ("", "jobs", False)
    assert method.message_count == 0
    for name in ("content_type", "content_encoding", "headers", "delivery_mode", "priority"):
        assert getattr(properties, name) == getattr(CELERY_LIKE, name), name
    for name in ("correlation_id", "reply_to", "message_id", "timestamp", "type", "app_id"):
        assert getattr(properties, name) == getattr(CELERY_LIKE, name), name
    assert channel.basic_get("jobs") == (None, None, None)
    connection.close()


def test_a_confirmed_persistent_message_outlives_the_node(tmp_path):
    with Node(tmp_path / "data", amqp="127.0.0.1:0") as node:
        connection = _connect(node)
        channel = connection.channel()
        channel.queue_declare("kept", durable=True)
        channel.confirm_delivery()
        for n in range(50):
            channel.basic_publish("", "kept", b"%d" % n, pika.BasicProperties(delivery_mode=2))
        connection.close()
    with Node(tmp_path / "data", amqp="127.0.0.1:0") as node:
        connection = _connect(node)
        channel = connection.channel()
        assert channel.queue_declare("kept", passive=True).method.message_count == 50
        bodies = [channel.basic_get("kept", auto_ack=True)[2] for _ in range(50)]
        assert bodies == [b"%d" % n for n in range(50)]
        connection.close()


def test_a_consumer_holds_at_most_its_prefetch_and_a_nack_redelivers(node):
    connection, channel = _queue_with(node, "work", 20)
    channel.basic_qos(prefetch_count=5)
    held = _consumed(channel, "work", 5, ack=False)
    assert [body for _, body in held] == [b"%d" % n for n in range(5)]  # no ack yet
    with node.connect() as warren:  # five held, and nothing more taken for them
        stats = warren.queue_stats("work")
    assert (stats["messages_unacked"], stats["messages_ready"]) == (5, 15)
    channel.basic_ack(held[2][0].delivery_tag, multiple=True)  # the first three
    channel.basic_nack(held[3][0].delivery_tag, requeue=True)
    channel.basic_ack(held[4][0].delivery_tag)
    taken = [(body, method.redelivered) for method, body in _consumed(channel, "work", 16)]
    channel.cancel()
    assert sorted(body for body, _ in taken) == sorted([b"3"] + [b"%d" % n for n in range(5, 20)])
    assert dict(taken)[b"3"] is True and dict(taken)[b"19"] is False
    connection.close()


def _consumed(channel, queue: str, count: int, ack: bool = True) -> list:
    """(method, body) of the first ``count`` deliveries to a consumer of ``queue``; each
    acked as it comes with ``ack``. Fails when none comes for 30 s."""
    got = []
    for method, _, body in channel.consume(queue, inactivity_timeout=30):
        assert method is not None, f"{len(got)} of {count} deliveries came"
        got.append((method, body))
        if ack:
            channel.basic_ack(method.delivery_tag)
        if len(got) == count:
            return got
    raise AssertionError("the consumer ended")


def _queue_with(node, queue: str, count: int) -> tuple[pika.BlockingConnection, object]:
    """A connection and channel, and ``queue`` declared with ``count`` messages, "0"..."""
    connection = _connect(node)
    channel = connection.channel()
    channel.queue_declare(queue)
    channel.confirm_delivery()
    for n in range(count):
        channel.basic_publish("", queue, b"%d" % n)
    return connection, channel


def test_what_a_vanished_client_held_is_back_at_once_flagged_redelivered(node):
    holder, channel = _queue_with(node, "orders", 3)
    got = [channel.basic_get("orders")[2] for _ in range(3)]
    assert got == [b"0", b"1", b"2"]
    # the client's socket goes without a close (a process killed, a cable pulled)
    holder._impl._transport._sock.shutdown(2)
    other = _connect(node)
    again = other.channel()
    seen = []

    def back() -> bool:
        method, _, body = again.basic_get("orders", auto_ack=True)
        if method is not None:
            seen.append((body, method.redelivered))
        return len(seen) == 3

    wait_for(back)
    assert seen == [(b"0", True), (b"1", True), (b"2", True)]
    other.close()


def test_exchanges_route_and_an_unroutable_mandatory_publish_is_returned(node):
    connection = _connect(node)
    channel = connection.channel()
    channel.exchange_declare("events", "topic", durable=True)
    channel.queue_declare("eu")
    channel.queue_bind("eu", "events", "eu.*")
    channel.confirm_delivery()
    channel.basic_publish("events", "eu.new", b"routed", mandatory=True)
    with pytest.raises(pika.exceptions.UnroutableError):
        channel.basic_publish("events", "us.new", b"nowhere", mandatory=True)
    channel.basic_publish("events", "us.new", b"dropped")  # not mandatory: confirmed
    method, _, body = channel.basic_get("eu", auto_ack=True)
    assert (body, method.exchange, method.routing_key) == (b"routed", "events", "eu.new")
    assert channel.basic_get("eu") == (None, None, None)
    connection.close()


def test_a_binding_one_client_made_routes_another_clients_next_publish(node):
    binder, publisher = _connect(node), _connect(node)
    binding = binder.channel()
    binding.exchange_declare("fan", "fanout")
    binding.queue_declare("first")
    binding.queue_bind("first", "fan")
    publishing = publisher.channel()
    publishing.confirm_delivery()
    publishing.basic_publish("fan", "", b"one")  # its connection now knows the bindings
    binding.queue_declare("second")
    binding.queue_bind("second", "fan")
    publishing.basic_publish("fan", "", b"two")  # at once: no second to wait
    assert binding.basic_get("second", auto_ack=True)[2] == b"two"
    assert [binding.basic_get("first", auto_ack=True)[2] for _ in range(2)] == [b"one", b"two"]
    binder.close()
    publisher.close()


def test_a_warren_client_and_an_amqp_client_read_each_others_messages(node):
    warren = node.connect()
    warren.declare_queue("mixed")
    warren.publish("mixed", b"from warren", headers={"k": "v"}, message_id="w-1")
    connection = _connect(node)
    channel = connection.channel()
    method, properties, body = channel.basic_get("mixed", auto_ack=True)
    assert body == b"from warren" and method.routing_key == "mixed"
    assert properties.headers == {"k": "v"} and properties.message_id == "w-1"
    assert properties.delivery_mode == 2
    channel.confirm_delivery()  # so that the publish is in the queue before the get
    channel.basic_publish("", "mixed", b"from amqp", pika.BasicProperties(delivery_mode=1))
    delivery = warren.get("mixed")
    assert delivery is not None and delivery.body == b"from amqp"
    assert delivery.message.persistent is False
    delivery.ack()
    connection.close()
    warren.close()


@pytest.mark.parametrize(
    ("call", "code"),
    [
        pytest.param(lambda c: c.queue_declare("absent", passive=True), 404, id="passive absent"),
        pytest.param(lambda c: c.exchange_declare("absent", passive=True), 404, id="no exchange"),
        pytest.param(lambda c: c.queue_declare("amq.mine"), 403, id="reserved name"),
        pytest.param(lambda c: c.queue_bind("q", ""), 403, id="bind to default"),
        pytest.param(
            lambda c: c.queue_declare("q", arguments={"x-no-such-argument": 1}), 406, id="argument"
        ),
        pytest.param(lambda c: c.basic_ack(99), 406, id="unknown tag"),
        pytest.param(lambda c: c.exchange_declare("", passive=True), 403, id="default exchange"),
        pytest.param(lambda c: c.exchange_declare("e", "ZZwwInvalid"), 406, id="unknown type"),
        pytest.param(
            lambda c: c.exchange_declare("in", internal=True) and c.basic_publish("in", "", b""),
            403,
            id="publish to internal",
        ),
        pytest.param(
            lambda c: (
                c.exchange_declare("used")
                and c.queue_bind("q", "used")
                and c.exchange_delete("used", if_unused=True)
            ),
            406,
            id="delete used exchange",
        ),
        pytest.param(
            lambda c: c.basic_publish("", "q", b"", pika.BasicProperties(expiration="soon")),
            406,
            id="bad expiration",
        ),
    ],
)
def test_a_channel_error_closes_the_channel_with_rabbitmqs_code(node, call, code):
    connection = _connect(node)
    channel = connection.channel()
    channel.queue_declare("q")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        call(channel)
        channel.basic_get("q")  # a publish or ack is not answered: this makes it show
    assert closed.value.reply_code == code
    channel = connection.channel()  # the connection goes on
    assert channel.queue_declare("q", passive=True).method.queue == "q"
    connection.close()


def test_an_auto_delete_exchange_goes_with_its_last_binding_and_deletes_are_idempotent(node):
    """RabbitMQ's rules: an auto-delete exchange is deleted when its last queue is unbound
    or deleted (not before it had one); deleting what is not there is a delete-ok."""
    connection = _connect(node)
    channel = connection.channel()
    channel.exchange_declare("events", "fanout", auto_delete=True)
    channel.exchange_declare("events", "fanout", passive=True)  # never bound: it stays
    for name in ("a", "b"):
        channel.queue_declare(name)
        channel.queue_bind(name, "events")
    channel.queue_unbind("a", "events")
    channel.exchange_declare("events", "fanout", passive=True)  # b is still bound
    channel.queue_delete("b")
    assert "events" not in {e["name"] for e in node.list_exchanges()}
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        channel.exchange_declare("events", "fanout", auto_delete=False)
        channel.exchange_declare("events", "fanout", auto_delete=True)  # not equivalent
    assert refused.value.reply_code == 406
    channel = connection.channel()
    assert channel.queue_delete("never-there").method.message_count == 0
    channel.exchange_delete("never-there")
    channel.queue_unbind("never-there", "amq.direct", "key")  # nothing to undo: unbind-ok
    connection.update_secret("guest", "token refreshed")
    channel.queue_declare("a", passive=True)  # the connection goes on
    connection.close()


def test_dead_letters_reach_an_internal_exchange_no_client_may_publish_to(node):
    connection = _connect(node)
    channel = connection.channel()
    channel.exchange_declare("dlx", "fanout", internal=True)
    channel.queue_declare("dead")
    channel.queue_bind("dead", "dlx")
    channel.queue_declare("work", arguments={"x-dead-letter-exchange": "dlx"})
    channel.basic_publish("", "work", b"doomed")
    method, _, _ = channel.basic_get("work")
    channel.basic_reject(method.delivery_tag, requeue=False)
    wait_for(lambda: channel.basic_get("dead", auto_ack=True)[2] == b"doomed")
    connection.close()


def test_what_warren_does_not_serve_yet_closes_the_connection_with_540(node):
    connection = _connect(node)
    channel = connection.channel()
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        channel.exchange_declare("h", "headers")
    assert closed.value.reply_code == frames.NOT_IMPLEMENTED
    connection = _connect(node)
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        connection.channel().exchange_bind("amq.direct", "amq.fanout")
    assert closed.value.reply_code == frames.NOT_IMPLEMENTED
    connection = _connect(node)
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        connection.channel().queue_declare("urgent", arguments={"x-max-priority": 10})
    assert closed.value.reply_code == frames.NOT_IMPLEMENTED
    assert "urgent" not in node.list_queues()


def test_what_an_exchange_routes_nowhere_goes_to_its_alternate_exchange(node):
    connection = _connect(node)
    channel = connection.channel()
    channel.exchange_declare("unrouted", "fanout")
    channel.queue_declare("caught")
    channel.queue_bind("caught", "unrouted")
    channel.exchange_declare("second", "direct", arguments={"alternate-exchange": "unrouted"})
    channel.exchange_declare("orders", "direct", arguments={"alternate-exchange": "second"})
    channel.queue_declare("paid")
    channel.queue_bind("paid", "orders", "paid")
    channel.confirm_delivery()  # a mandatory publish routed nowhere raises UnroutableError
    channel.basic_publish("orders", "paid", b"routed", mandatory=True)
    channel.basic_publish("orders", "refund", b"through two", mandatory=True)
    assert channel.basic_get("paid", auto_ack=True)[2] == b"routed"
    assert channel.basic_get("caught", auto_ack=True)[2] == b"through two"
    assert channel.basic_get("paid")[0] is None
    # an alternate exchange that routes nothing (or does not exist): a mandatory
    # publish comes back, as on RabbitMQ; loops of alternates end
    channel.queue_unbind("caught", "unrouted")
    channel.exchange_declare("loop-a", "direct", arguments={"alternate-exchange": "loop-b"})
    channel.exchange_declare("loop-b", "direct", arguments={"alternate-exchange": "loop-a"})
    channel.exchange_declare("dangling", "direct", arguments={"alternate-exchange": "nowhere"})
    for exchange in ("orders", "loop-a", "dangling"):
        with pytest.raises(pika.exceptions.UnroutableError):
            channel.basic_publish(exchange, "refund", exchange.encode(), mandatory=True)
    # redeclared with another alternate, or with one that is no string: 406
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        connection.channel().exchange_declare("orders", "direct")
    assert closed.value.reply_code == frames.PRECONDITION_FAILED
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        connection.channel().exchange_declare("bad", arguments={"alternate-exchange": 7})
    assert closed.value.reply_code == frames.PRECONDITION_FAILED
    connection.close()


def test_an_alternate_exchange_outlives_a_restart_and_serves_warren_clients_too(tmp_path):
    with Node(tmp_path / "data") as node:
        node.declare_exchange("spill", kind="fanout")
        node.declare_queue("spilled")
        node.bind_queue("spilled", "spill")
        node.declare_exchange("main", alternate_exchange="spill")
    with Node(tmp_path / "data") as node, node.connect() as warren:
        warren.publish("nothing-bound", b"spilt", exchange="main", mandatory=True)
        assert warren.get("spilled", ack=False).body == b"spilt"
        assert {"name": "main", "alternate_exchange": "spill"}.items() <= next(
            e for e in warren.list_exchanges() if e["name"] == "main"
        ).items()


def _stream_offsets(channel, stream: str, count: int, **arguments: object) -> list:
    """The ``(offset, body)`` of ``count`` deliveries of a consumer of ``stream`` from the
    ``x-stream-offset`` argument given (each acked), then cancelled."""
    channel.basic_qos(prefetch_count=10)
    got = []
    for method, properties, body in channel.consume(
        stream, arguments=arguments or None, inactivity_timeout=30
    ):
        assert method is not None, f"only {len(got)} of {count} records came"
        got.append((properties.headers["x-stream-offset"], body))
        channel.basic_ack(method.delivery_tag)
        if len(got) == count:
            break
    channel.cancel()
    return got


def test_a_stream_is_read_over_amqp_from_the_offset_a_consumer_asks_for(node):
    connection = _connect(node)
    channel = connection.channel()
    channel.queue_declare("ledger", durable=True, arguments={"x-queue-type": "stream"})
    channel.confirm_delivery()
    before = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=5)
    for n in range(5):
        headers = {"n": n} if n % 2 else None  # with headers of its own, and without
        channel.basic_publish("", "ledger", b"r%d" % n, pika.BasicProperties(headers=headers))
    everything = [(n, b"r%d" % n) for n in range(5)]
    assert _stream_offsets(channel, "ledger", 5, **{"x-stream-offset": "first"}) == everything
    assert _stream_offsets(channel, "ledger", 2, **{"x-stream-offset": 3}) == everything[3:]
    assert _stream_offsets(channel, "ledger", 5, **{"x-stream-offset": before}) == everything
    assert _stream_offsets(channel, "ledger", 5, **{"x-stream-offset": "1h"}) == everything
    # reading took nothing away; a publisher's own headers are kept beside the offset
    method, properties, body = next(
        channel.consume("ledger", arguments={"x-stream-offset": 1}, inactivity_timeout=30)
    )
    assert properties.headers == {"n": 1, "x-stream-offset": 1} and body == b"r1"
    channel.cancel()
    assert channel.queue_declare("ledger", passive=True).method.message_count >= 5
    connection.close()


def test_a_stream_consumer_is_sent_no_more_than_its_prefetch_until_it_acks(node):
    connection = _connect(node)
    channel = connection.channel()
    channel.queue_declare("ticks", durable=True, arguments={"x-queue-type": "stream"})
    channel.confirm_delivery()
    for n in range(20):
        channel.basic_publish("", "ticks", b"%d" % n)
    channel.basic_qos(prefetch_count=3)
    held = []
    channel.basic_consume(
        "ticks",
        lambda ch, method, props, body: held.append(method.delivery_tag),
        arguments={"x-stream-offset": "first"},
    )
    wait_for(lambda: connection.process_data_events(time_limit=0.1) or len(held) >= 3)
    connection.process_data_events(time_limit=0.5)
    assert len(held) == 3  # its prefetch, and no more while none is acked
    channel.basic_ack(held[-1], multiple=True)
    wait_for(lambda: connection.process_data_events(time_limit=0.1) or len(held) >= 6)
    connection.process_data_events(time_limit=0.5)
    assert len(held) == 6
    connection.close()


def test_what_a_stream_does_not_take_over_amqp_is_refused_as_rabbitmq_refuses_it(node):
    connection = _connect(node)
    channel = connection.channel()
    channel.queue_declare("events", durable=True, arguments={"x-queue-type": "stream"})
    refusals = (
        (lambda ch: ch.basic_consume("events", print), frames.PRECONDITION_FAILED),  # no qos
        (lambda ch: ch.basic_qos(prefetch_count=5) or ch.basic_consume(
            "events", print, auto_ack=True), frames.PRECONDITION_FAILED),
        (lambda ch: ch.basic_qos(prefetch_count=5) or ch.basic_consume(
            "events", print, arguments={"x-stream-offset": True}), frames.PRECONDITION_FAILED),
        (lambda ch: ch.queue_declare(
            "gone", exclusive=True, arguments={"x-queue-type": "stream"}),
            frames.PRECONDITION_FAILED),
        (lambda ch: ch.queue_declare(
            "brief", durable=False, arguments={"x-queue-type": "stream"}),
            frames.PRECONDITION_FAILED),
    )  # fmt: skip
    for refuse, code in refusals:
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
            refuse(connection.channel())
        assert closed.value.reply_code == code, closed.value.reply_text
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        connection.channel().basic_get("events")
    assert closed.value.reply_code == frames.NOT_IMPLEMENTED
    assert "gone" not in node.list_queues() and "brief" not in node.list_queues()


def test_a_new_prefetch_applies_to_the_channels_live_consumers_too(node):
    connection = _connect(node)
    channel = connection.channel()
    channel.queue_declare("work")
    channel.queue_declare("events", durable=True, arguments={"x-queue-type": "stream"})
    channel.confirm_delivery()
    for n in range(20):
        channel.basic_publish("", "work", b"%d" % n)
        channel.basic_publish("", "events", b"%d" % n)
    held: dict[str, list[int]] = {"work": [], "events": []}
    channel.basic_qos(prefetch_count=2)
    for queue in held:
        channel.basic_consume(
            queue,
            lambda ch, method, props, body, queue=queue: held[queue].append(method.delivery_tag),
            arguments={"x-stream-offset": "first"} if queue == "events" else None,
        )

    def settled_at(count: int) -> bool:
        connection.process_data_events(time_limit=0.1)
        return all(len(tags) >= count for tags in held.values())

    wait_for(lambda: settled_at(2))
    connection.process_data_events(time_limit=0.5)
    assert [len(tags) for tags in held.values()] == [2, 2]
    # Celery raises its prefetch this way (for ETA tasks): RabbitMQ applies it only to
    # consumers started after it; Warren to these as well
    channel.basic_qos(prefetch_count=5)
    wait_for(lambda: settled_at(5))
    connection.process_data_events(time_limit=0.5)
    assert [len(tags) for tags in held.values()] == [5, 5]
    connection.close()


def test_a_lowered_prefetch_holds_a_live_consumer_whose_fetch_waits_in_its_queue(node):
    """Celery lowers its prefetch again once its ETA tasks ran: the fetch the consumer
    had waiting in the empty queue asked for the old prefetch's room, and what it brings
    beyond the new one goes back."""
    connection = _connect(node)
    channel = connection.channel()
    channel.queue_declare("work")
    held: list[int] = []
    channel.basic_qos(prefetch_count=10)
    channel.basic_consume("work", lambda ch, method, props, body: held.append(method.delivery_tag))
    connection.process_data_events(time_limit=0.3)  # its fetch waits in the empty queue
    channel.basic_qos(prefetch_count=1)
    with node.connect() as warren:
        warren.publish_many("work", [b"%d" % n for n in range(5)])  # taken at once

        def one_held_and_the_rest_ready() -> bool:
            connection.process_data_events(time_limit=0.05)
            stats = warren.queue_stats("work")
            return len(held) == 1 and stats["messages_ready"] == 4

        wait_for(one_held_and_the_rest_ready)
        connection.process_data_events(time_limit=0.5)
        assert len(held) == 1 and warren.queue_stats("work")["messages_unacked"] == 1
    connection.close()


def test_a_delivery_held_past_its_queues_consumer_timeout_closes_its_channel(node):
    connection = _connect(node)
    channel = connection.channel()
    channel.queue_declare("slow", arguments={"x-consumer-timeout": 1000})
    channel.queue_declare("patient")  # no timeout: RabbitMQ's 30 minutes are not Warren's
    channel.confirm_delivery()
    for queue in ("slow", "patient"):
        channel.basic_publish("", queue, b"held")
    keeper = connection.channel()
    method, _, _ = keeper.basic_get("patient")
    channel.basic_qos(prefetch_count=1)
    delivered = []
    channel.basic_consume("slow", lambda ch, m, p, b: delivered.append(m.redelivered))
    connection.call_later(30, channel.stop_consuming)  # a bound: it closes long before
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        channel.start_consuming()
    assert closed.value.reply_code == frames.PRECONDITION_FAILED
    assert "delivery acknowledgement on channel" in closed.value.reply_text
    assert "1000 ms" in closed.value.reply_text and delivered == [False]
    # its delivery is back in the queue; the channel that held one of a queue without a
    # timeout is still open, and acks it
    again = connection.channel().basic_get("slow", auto_ack=True)
    assert again[2] == b"held" and again[0].redelivered
    keeper.basic_ack(method.delivery_tag)
    assert keeper.is_open
    connection.close()


def test_an_exclusive_queue_is_gone_when_its_connections_close_is_answered(node):
    other = _connect(node)  # open already: its declare follows the close at once
    for n in range(10):  # py-amqp's tests declare one exclusive queue, one after another
        connection = _connect(node)
        channel = connection.channel()
        channel.queue_declare("mine", exclusive=True)
        channel.basic_publish("", "mine", b"kept until the close")
        if n % 2:
            connection.close()  # returns with the server's CloseOk
        else:  # or closed by the server for an error: gone before the client hears of it
            with pytest.raises(pika.exceptions.ConnectionClosedByBroker):
                channel.exchange_declare("h", "headers")  # 540: not served
        taken = other.channel()
        taken.queue_declare("mine", exclusive=True)  # no 405: the queue is gone
        taken.queue_delete("mine")  # for the next round's first connection
    other.close()
    assert "mine" not in node.list_queues()


def test_a_consumer_timeout_that_is_no_positive_number_of_ms_is_refused(node):
    connection = _connect(node)
    for bad in ("abc", 0, -5):
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
            connection.channel().queue_declare("q", arguments={"x-consumer-timeout": bad})
        assert closed.value.reply_code == frames.PRECONDITION_FAILED
    assert "q" not in node.list_queues()
    connection.close()


def test_a_transaction_publishes_and_acks_at_its_commit_and_a_rollback_drops_them(node):
    connection = _connect(node)
    watcher = connection.channel()
    watcher.queue_declare("ledger", durable=True)
    for n in range(2):
        watcher.basic_publish("", "ledger", b"old %d" % n)
    channel = connection.channel()
    channel.tx_select()
    method, _, body = channel.basic_get("ledger")
    channel.basic_ack(method.delivery_tag)
    channel.basic_publish("", "ledger", b"new", pika.BasicProperties(delivery_mode=2))
    assert watcher.queue_declare("ledger", passive=True).method.message_count == 1
    channel.tx_rollback()  # neither the ack nor the publish happened
    assert watcher.queue_declare("ledger", passive=True).method.message_count == 1
    channel.basic_ack(method.delivery_tag)  # the same delivery, acked for good this time
    channel.basic_publish("", "ledger", b"new", pika.BasicProperties(delivery_mode=2))
    channel.tx_commit()
    assert [watcher.basic_get("ledger", auto_ack=True)[2] for _ in range(2)] == [b"old 1", b"new"]
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        channel.confirm_delivery()
    assert refused.value.reply_code == 406
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        connection.channel().tx_commit()
    assert refused.value.reply_code == 406
    connection.close()


def test_a_server_named_queue_gets_a_name_of_amq_gen(node):
    connection = _connect(node)
    channel = connection.channel()
    name = channel.queue_declare("", durable=False, auto_delete=True).method.queue
    assert name.startswith("amq.gen-")
    channel.basic_publish("", name, b"to myself")
    assert channel.basic_get(name, auto_ack=True)[2] == b"to myself"
    connection.close()


def test_an_exclusive_queue_is_its_connections_alone_and_goes_with_it(node):
    owner, other = _connect(node), _connect(node)
    mine = owner.channel()
    name = mine.queue_declare("", exclusive=True).method.queue
    mine.basic_publish("", name, b"reply")
    for attempt in (
        lambda c: c.queue_declare(name, passive=True),
        lambda c: c.basic_get(name),
        lambda c: c.queue_purge(name),
        lambda c: c.queue_declare(name, exclusive=True),
    ):
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
            attempt(other.channel())
        assert closed.value.reply_code == frames.RESOURCE_LOCKED
    other.channel().basic_publish("", name, b"anyone may publish to it")
    assert mine.basic_get(name, auto_ack=True)[2] == b"reply"
    owner.close()

    def gone() -> bool:  # locked (405) until its deletion is over, then not found
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
            other.channel().queue_declare(name, passive=True)
        return closed.value.reply_code == frames.NOT_FOUND

    wait_for(gone)
    assert name not in node.list_queues()
    other.close()


def test_the_exclusive_queues_of_a_killed_port_are_deleted_when_it_comes_back(node):
    connection = _connect(node)
    name = connection.channel().queue_declare("", exclusive=True).method.queue
    assert name in node.list_queues()
    port_pid = _port_pid()
    os.kill(port_pid, signal.SIGKILL)
    wait_for(lambda: name not in node.list_queues())
    assert _port_pid() != port_pid


def _port_pid() -> int:
    """The pid of the node's AMQP port (one killed and not reaped yet is skipped)."""
    port = descendant_titled("warren: amqp")
    if port is None:
        raise LookupError("the node runs no AMQP port")
    return port.pid


def test_a_killed_port_comes_back_on_its_port_and_the_messages_are_there(node):
    connection = _connect(node)
    channel = connection.channel()
    channel.queue_declare("safe")
    channel.confirm_delivery()
    channel.basic_publish("", "safe", b"confirmed", pika.BasicProperties(delivery_mode=2))
    os.kill(_port_pid(), signal.SIGKILL)
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        channel.basic_publish("", "safe", b"after")
        connection.process_data_events(time_limit=5)
        channel.basic_publish("", "safe", b"after")

    def connected() -> pika.BlockingConnection | None:
        try:
            return _connect(node)
        except pika.exceptions.AMQPConnectionError:
            return None

    wait_for(connected)
    again = _connect(node)
    assert again.channel().basic_get("safe", auto_ack=True)[2] == b"confirmed"
    again.close()


@pytest.fixture
def alarmed_node(tmp_path):
    """A node with an AMQP port whose memory alarm is raised (a 1-byte limit)."""
    tight = AlarmLimits(memory_limit_bytes=1, check_interval_s=0.1)
    with Node(tmp_path / "data", amqp="127.0.0.1:0", alarm_limits=tight) as running:
        wait_for(lambda: running.status()["alarms"] == ["memory"])
        yield running


def test_a_client_hears_when_the_node_blocks_publishers_and_when_it_lets_them_go(
    alarmed_node,
):
    node = alarmed_node
    heard: list[str] = []
    connection = _connect(node)
    connection.add_on_connection_blocked_callback(
        lambda _, frame: heard.append(f"blocked: {frame.method.reason}")
    )
    connection.add_on_connection_unblocked_callback(lambda _, __: heard.append("unblocked"))

    def heard_of(count: int) -> bool:
        connection.process_data_events(time_limit=0.05)
        return len(heard) >= count

    channel = connection.channel()
    channel.queue_declare("held")
    assert not heard_of(1)  # a connection that does not publish is not blocked
    channel.basic_publish("", "held", b"sent while blocked")
    wait_for(lambda: heard_of(1))
    node.alarms.limits = AlarmLimits(memory_limit_bytes=2**62, check_interval_s=0.1)
    wait_for(lambda: heard_of(2))
    assert heard == ["blocked: low on memory", "unblocked"]
    wait_for(lambda: channel.basic_get("held", auto_ack=True)[2] == b"sent while blocked")
    connection.close()


def test_a_client_whose_publishes_wait_is_not_read_without_bound(alarmed_node):
    """Under the alarm its worker waits on the node; the port stops reading the client's
    socket once a few MiB wait, so the client's sends block instead of the port's memory
    growing with everything it sends."""
    host, port = alarmed_node.amqp_endpoint.rsplit(":", 1)
    alarmed_node.declare_queue("held")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        _open_raw(sock)
        body = b"x" * 2**20
        publish = frames.method_frame(1, commands.Basic.Publish(routing_key="held"))
        message = publish + b"".join(frames.content_frames(1, b"\x00\x00", body, 131072))
        sock.settimeout(5)
        sent = 0
        with pytest.raises(TimeoutError):
            while sent < 256 * 2**20:
                sock.sendall(message)
                sent += len(message)
        assert sent < 64 * 2**20
    assert psutil.Process(_port_pid()).memory_info().rss < 256 * 2**20


def _open_raw(sock: socket.socket, heartbeat_s: int = 0) -> None:
    """The handshake (with heartbeats every ``heartbeat_s``) and channel 1 opened, by
    hand."""
    sock.sendall(frames.PROTOCOL_HEADER)
    _expect(sock, commands.Connection.Start)
    sock.sendall(
        frames.method_frame(
            0,
            commands.Connection.StartOk(
                client_properties={}, mechanism="PLAIN", response="\x00guest\x00guest"
            ),
        )
    )
    _expect(sock, commands.Connection.Tune)
    sock.sendall(frames.method_frame(0, commands.Connection.TuneOk(2047, 131072, heartbeat_s)))
    sock.sendall(frames.method_frame(0, commands.Connection.Open()))
    _expect(sock, commands.Connection.OpenOk)
    sock.sendall(frames.method_frame(1, commands.Channel.Open()))
    _expect(sock, commands.Channel.OpenOk)


def _expect(sock: socket.socket, kind: type) -> None:
    assert isinstance(_next_method(sock), kind)


# ----------------------------------------------------------------------------- hostile
# clients and failures: each of these took the port down, hung a client or lost a
# message before it was guarded against


def _still_serves(node) -> None:
    """A new client connects and declares: the port lives."""
    bystander = _connect(node)
    assert bystander.channel().queue_declare("bystander").method.queue == "bystander"
    bystander.close()


def test_replies_longer_than_a_short_string_are_cut_not_fatal(node):
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        _connect(node, credentials=pika.PlainCredentials("u" * 200, "wrong"))
    connection = _connect(node)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        connection.channel().exchange_declare("€" * 85, passive=True)
    assert closed.value.reply_code == frames.NOT_FOUND
    connection.close()
    _still_serves(node)


def test_a_table_nested_thousands_deep_before_login_closes_that_client_alone(node):
    host, port = node.amqp_endpoint.rsplit(":", 1)
    nested = b"\x00\x00\x00\x00"
    for _ in range(600):  # inside the 4 KiB a frame may have before tuning
        entry = b"\x01kF" + nested
        nested = len(entry).to_bytes(4, "big") + entry
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(frames.PROTOCOL_HEADER)
        _expect(sock, commands.Connection.Start)
        payload = b"\x00\x0a\x00\x0b" + nested + b"\x05PLAIN\x00\x00\x00\x00\x05en_US"
        sock.sendall(_frame(payload))
        assert _closed_by_server(sock)
    _still_serves(node)


def _frame(payload: bytes) -> bytes:
    return b"\x01\x00\x00" + len(payload).to_bytes(4, "big") + payload + b"\xce"


def _closed_by_server(sock: socket.socket) -> bool:
    sock.settimeout(10)
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        pass
    return True


def test_a_publish_to_a_restarting_queue_is_nacked_never_acked_and_lost(node):
    connection = _connect(node)
    channel = connection.channel()
    channel.queue_declare("restarting", durable=True)
    channel.confirm_delivery()
    acked = []
    killed = 0
    for n in range(3000):
        if n in (800, 1600):
            queue = descendant_titled("warren: queue restarting")
            assert queue is not None
            queue.kill()
            killed += 1
        try:
            channel.basic_publish(
                "", "restarting", b"%d" % n, pika.BasicProperties(delivery_mode=2)
            )
        except pika.exceptions.NackError:
            continue
        acked.append(b"%d" % n)
    assert killed == 2
    held = []
    while True:
        method, _, body = channel.basic_get("restarting", auto_ack=True)
        if method is None:
            break
        held.append(body)
    assert not set(acked) - set(held)  # every acked message is in the queue
    connection.close()


def test_an_expiration_of_digits_that_are_not_ascii_is_a_channel_error(node):
    connection = _connect(node)
    channel = connection.channel()
    channel.queue_declare("q")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        channel.basic_publish("", "q", b"", pika.BasicProperties(expiration="²"))
        channel.basic_get("q")
    assert closed.value.reply_code == frames.PRECONDITION_FAILED
    assert connection.channel().queue_declare("q", passive=True).method.queue == "q"
    connection.close()


def test_a_consumer_whose_queue_is_deleted_is_cancelled_by_the_server(node):
    connection, other = _connect(node), _connect(node)
    channel = connection.channel()
    channel.queue_declare("doomed")
    cancelled = []
    channel.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    tag = channel.basic_consume("doomed", lambda *_: None)
    other.channel().queue_delete("doomed")

    def heard() -> bool:
        connection.process_data_events(time_limit=0.05)
        return bool(cancelled)

    wait_for(heard)
    assert cancelled == [tag]
    assert channel.queue_declare("again").method.queue == "again"  # the channel lives
    connection.close()
    other.close()


def test_a_warren_message_amqp_cannot_carry_whole_is_delivered_without_what_does_not_fit(
    node,
):
    with node.connect() as warren:
        warren.declare_queue("odd")
        warren.publish("odd", b"long id", message_id="m" * 300)
        warren.publish("odd", b"huge header", headers={"n": 2**64 - 1})
    connection = _connect(node)
    channel = connection.channel()
    first = channel.basic_get("odd", auto_ack=True)
    second = channel.basic_get("odd", auto_ack=True)
    assert (first[2], second[2]) == (b"long id", b"huge header")
    assert first[1].message_id is None and first[1].delivery_mode == 2
    connection.close()


def test_a_body_larger_than_a_message_may_be_is_refused_at_its_header(node):
    host, port = node.amqp_endpoint.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        _open_raw(sock)
        sock.sendall(frames.method_frame(1, commands.Basic.Publish(routing_key="q")))
        header = (60).to_bytes(2, "big") + b"\x00\x00" + (2**40).to_bytes(8, "big") + b"\x00\x00"
        sock.sendall(b"\x02\x00\x01" + len(header).to_bytes(4, "big") + header + b"\xce")
        close = _next_method(sock)
        assert isinstance(close, commands.Channel.Close), close.reply_text
        assert close.reply_code == frames.PRECONDITION_FAILED


def test_publishes_after_a_channel_error_are_dropped_until_the_client_hears_of_it(node):
    connection = _connect(node)
    channel = connection.channel()
    channel.queue_declare("after-error")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker):
        channel.basic_publish("no-such-exchange", "k", b"fails")
        for n in range(3):  # sent before the close reaches the client
            channel.basic_publish("", "after-error", b"%d" % n)
        channel.basic_get("after-error")
    assert connection.channel().queue_declare("after-error", passive=True).method.message_count == 0
    connection.close()


def test_flow_off_is_refused_as_rabbitmq_refuses_it(node):
    connection = _connect(node)
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        connection.channel().flow(False)
    assert closed.value.reply_code == frames.NOT_IMPLEMENTED


def test_sockets_that_never_log_in_cost_the_port_no_thread(node):
    host, port = node.amqp_endpoint.rsplit(":", 1)
    threads = psutil.Process(_port_pid()).num_threads()
    port_actor = node.actors.whereis("amqp")
    silent = [socket.create_connection((host, int(port)), timeout=10) for _ in range(30)]
    try:
        wait_for(lambda: port_actor.ask(_amqp_stats())["connections"] == 30)
        assert psutil.Process(_port_pid()).num_threads() <= threads + 1
        _still_serves(node)
    finally:
        for sock in silent:
            sock.close()


def test_a_consumer_without_acks_that_does_not_read_leaves_its_queue_mostly_full(node):
    with node.connect() as warren:
        warren.declare_queue("big")
        warren.publish_many("big", [b"x" * 65536] * 400)
    host, port = node.amqp_endpoint.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        _open_raw(sock)
        sock.sendall(frames.method_frame(1, commands.Basic.Consume(queue="big", no_ack=True)))
        port_actor = node.actors.whereis("amqp")  # it reads nothing more: the port stops
        with node.connect() as warren:
            # stopped: 4 MiB wait for the client, and the consumer holds at most its 100
            # ahead (what its last fetch brought is not taken while the client reads nothing)
            wait_for(lambda: port_actor.ask(_amqp_stats())["output_waiting_bytes"] >= 3 * 2**20)
            stats = warren.queue_stats("big")
            waiting = port_actor.ask(_amqp_stats())["output_waiting_bytes"]
        assert stats["messages_ready"] >= 150 and stats["messages_unacked"] <= 100, stats
        assert waiting < 6 * 2**20, waiting


def test_a_stopping_node_tells_its_amqp_clients_and_stops_cleanly(tmp_path, capfd):
    with Node(tmp_path / "data", amqp="127.0.0.1:0") as node:
        connection = _connect(node)
        channel = connection.channel()
        channel.queue_declare("q")
        channel.basic_consume("q", lambda *_: None)
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        connection.process_data_events(time_limit=5)
        connection.channel()
    assert closed.value.reply_code == frames.CONNECTION_FORCED
    assert "Socket operation on non-socket" not in capfd.readouterr().err


def _next_method(sock: socket.socket):
    buffer = bytearray()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        buffer += sock.recv(65536)
        read, _ = frames.split_frames(buffer, 1 << 20)
        if read:
            return frames.decode_method(read[0])
    raise AssertionError("no method within 10 s")


def _published(node: Node) -> int:
    stats = node.amqp_stats()
    assert stats is not None, "the node has an AMQP port"
    return stats["messages_published"]


def test_a_pipelining_publisher_hears_of_every_publish_when_its_queue_is_killed(node):
    """20,000 confirm-mode publishes sent without waiting, the queue killed among them:
    each is acked or nacked soon after, none left waiting on the killed incarnation (they
    had been found dead one look, a second, each). Those the killed one never took reach
    the one started after it (it answers that it never had them, and the port sends them
    there): every ack is kept, and nothing twice."""
    connection = _connect(node)
    connection.channel().queue_declare("rq", durable=True)
    connection.close()
    host, port = node.amqp_endpoint.rsplit(":", 1)
    publishes = 20_000
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        _open_raw(sock)
        sock.sendall(frames.method_frame(1, commands.Confirm.Select()))
        _expect(sock, commands.Confirm.SelectOk)
        one = frames.method_frame(1, commands.Basic.Publish(routing_key="rq")) + b"".join(
            frames.content_frames(1, b"\x10\x00\x02", b"x" * 100, 131072)
        )
        queue = descendant_titled("warren: queue rq")
        assert queue is not None
        queue.suspend()  # it confirms none of the first half: all in flight at the kill
        sock.sendall(one * (publishes // 2))
        wait_for(lambda: _published(node) > 0)  # the port handed some to the queue
        queue.kill()
        sock.sendall(one * (publishes // 2))
        settled: dict[int, bool] = {}
        buffer = bytearray()
        deadline = time.monotonic() + 60
        while len(settled) < publishes and time.monotonic() < deadline:
            buffer += sock.recv(1 << 20)
            read, used = frames.split_frames(buffer, 1 << 20)
            del buffer[:used]
            for frame in read:
                ids = frames.method_id(frame.payload)
                if ids in (frames.ACK, frames.NACK):
                    tag, multiple, _ = frames.decode_settle(frame.payload)
                    first = min((t for t in range(1, tag + 1) if t not in settled), default=tag)
                    for settled_tag in range(first if multiple else tag, tag + 1):
                        settled.setdefault(settled_tag, ids == frames.ACK)
        assert len(settled) == publishes, f"{len(settled)} of {publishes} confirmed in 60 s"
    kept = node.connect().queue_stats("rq")["len"]
    assert sum(settled.values()) <= kept <= publishes


def test_an_exclusive_declare_does_not_take_over_a_queue_that_exists(node):
    first, second = _connect(node), _connect(node)
    first.channel().queue_declare("shared")
    publisher = first.channel()
    publisher.confirm_delivery()  # in the queue before it is counted below
    publisher.basic_publish("", "shared", b"kept")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        second.channel().queue_declare("shared", exclusive=True)
    assert closed.value.reply_code == frames.RESOURCE_LOCKED
    second.close()
    assert first.channel().queue_declare("shared", passive=True).method.message_count == 1
    first.close()


def test_bodies_begun_on_many_channels_are_bounded_together(node):
    host, port = node.amqp_endpoint.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        _open_raw(sock)
        for channel in range(2, 4):
            sock.sendall(frames.method_frame(channel, commands.Channel.Open()))
            _expect(sock, commands.Channel.OpenOk)
        header = (60).to_bytes(2, "big") + b"\x00\x00" + (100 * 2**20).to_bytes(8, "big")
        for channel in range(1, 4):
            sock.sendall(frames.method_frame(channel, commands.Basic.Publish(routing_key="q")))
            sock.sendall(
                bytes([2, 0, channel])
                + len(header + b"\x00\x00").to_bytes(4, "big")
                + header
                + b"\x00\x00\xce"
            )
        piece = b"x" * 131_000
        body = b"".join(
            bytes([3, 0, channel]) + len(piece).to_bytes(4, "big") + piece + b"\xce"
            for channel in range(1, 4)
        )
        for _ in range(400):  # 150 MiB across the three, read and dropped once refused
            sock.sendall(body)
        close = _next_method(sock)
        assert isinstance(close, commands.Connection.Close)
        assert close.reply_code == frames.RESOURCE_ERROR
        assert psutil.Process(_port_pid()).memory_info().rss < 512 * 2**20
    _still_serves(node)


def test_a_client_held_back_by_an_alarm_is_not_dropped_for_its_unread_heartbeats(
    alarmed_node,
):
    host, port = alarmed_node.amqp_endpoint.rsplit(":", 1)
    alarmed_node.declare_queue("held")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        _open_raw(sock, heartbeat_s=1)
        publish = frames.method_frame(1, commands.Basic.Publish(routing_key="held")) + b"".join(
            frames.content_frames(1, b"\x00\x00", b"x" * 2**20, 131072)
        )
        sock.settimeout(3)
        with pytest.raises(TimeoutError):
            while True:
                sock.sendall(publish)  # until the port stops reading it
        time.sleep(4)  # two heartbeat intervals and more, with nothing read from it
        stats = alarmed_node.actors.whereis("amqp").ask(_amqp_stats())
        assert stats["connections"] == 1 and stats["connections_closed"] == 0


def _amqp_stats():
    from warren.queues.amqp.server import AmqpStats

    return AmqpStats()


def test_a_get_without_ack_is_settled_only_once_sent(node):
    connection = _connect(node)
    channel = connection.channel()
    channel.queue_declare("once")
    channel.confirm_delivery()
    for n in range(20):
        channel.basic_publish("", "once", b"%d" % n)
    got = [channel.basic_get("once", auto_ack=True)[2] for _ in range(20)]
    channel.basic_recover(requeue=True)  # nothing of a get without ack comes back
    assert got == [b"%d" % n for n in range(20)]
    assert channel.queue_declare("once", passive=True).method.message_count == 0
    connection.close()


def test_the_exchanges_every_amqp_broker_has_are_there_and_route(node):
    connection = _connect(node)
    channel = connection.channel()
    for name in ("amq.direct", "amq.fanout", "amq.topic"):
        channel.exchange_declare(name, passive=True)
    channel.queue_declare("through-amq-direct")
    channel.queue_bind("through-amq-direct", "amq.direct", "key")
    channel.confirm_delivery()
    channel.basic_publish("amq.direct", "key", b"routed", mandatory=True)
    assert channel.basic_get("through-amq-direct", auto_ack=True)[2] == b"routed"
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        channel.exchange_delete("amq.topic")
    assert closed.value.reply_code == frames.ACCESS_REFUSED
    connection.close()


def test_a_node_starts_its_port_with_exclusive_queues_left_from_before(tmp_path):
    """The port prepares (the standard exchanges, the exclusive queues a crash left) once
    the node serves: started with the node's tree, it asked a node still starting and
    crashed until the root supervisor gave up."""
    data = tmp_path / "data"
    with Node(data):
        pass  # a node's directory, for the file a crash left to be in
    (data / "amqp").mkdir()
    (data / "amqp" / "exclusive.json").write_text('["amq.gen-left-by-a-crash"]')
    with Node(data, amqp="127.0.0.1:0") as node:
        _still_serves(node)
        wait_for(lambda: (data / "amqp" / "exclusive.json").read_text() == "[]")
        assert node.status()["tree"]["children"][-1]["restarts"] == 0


def test_a_queue_declared_with_x_expires_goes_once_unused(node):
    connection = _connect(node)
    channel = connection.channel()
    channel.queue_declare("celery@host.pidbox", arguments={"x-expires": 300})
    channel.basic_publish("", "celery@host.pidbox", b"ping")
    # a declare, passive too, is a use that starts its time again, as on RabbitMQ
    wait_for(lambda: node.list_queues() == [], timeout=30)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as gone:
        channel.queue_declare("celery@host.pidbox", passive=True)
    assert gone.value.reply_code == 404
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        connection.channel().queue_declare("bad", arguments={"x-expires": 0})
    assert refused.value.reply_code == 406
    connection.close()


def test_an_exclusive_consumer_holds_its_queue_alone_until_it_is_cancelled(node):
    first, second = _connect(node), _connect(node)
    holder = first.channel()
    holder.queue_declare("sole")
    tag = holder.basic_consume("sole", lambda *delivery: None, exclusive=True)
    for exclusive in (False, True):
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            second.channel().basic_consume("sole", lambda *delivery: None, exclusive=exclusive)
        assert refused.value.reply_code == 403
    holder.basic_cancel(tag)
    other = second.channel()
    other.basic_consume("sole", lambda *delivery: None)  # free again
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        holder.basic_consume("sole", lambda *delivery: None, exclusive=True)  # has a consumer
    assert refused.value.reply_code == 403
    first.close()
    second.close()


def test_a_declare_of_ones_own_exclusive_queue_as_not_exclusive_is_resource_locked(node):
    connection = _connect(node)
    connection.channel().queue_declare("mine", exclusive=True)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as locked:
        connection.channel().queue_declare("mine")
    assert locked.value.reply_code == 405
    assert connection.channel().queue_declare("mine", exclusive=True).method.queue == "mine"
    connection.close()


def test_a_queue_named_empty_is_the_channels_last_declared_one(node):
    connection = _connect(node)
    channel = connection.channel()
    name = channel.queue_declare("", exclusive=True).method.queue
    channel.basic_publish("", name, b"first")
    channel.basic_publish("", name, b"second")
    assert channel.basic_get("", auto_ack=True)[2] == b"first"
    assert channel.queue_purge("").method.message_count == 1
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        connection.channel().basic_get("")  # a channel that declared none
    assert refused.value.reply_code == 404
    connection.close()


def test_a_commit_whose_publish_a_queue_refused_is_not_answered_commit_ok(node):
    connection = _connect(node)
    channel = connection.channel()
    args = {"x-max-length": 1, "x-overflow": "reject-publish"}
    channel.queue_declare("full", durable=True, arguments=args)
    channel.basic_publish("", "full", b"fills it")
    channel.tx_select()
    channel.basic_publish("", "full", b"refused", pika.BasicProperties(delivery_mode=2))
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        channel.tx_commit()
    assert refused.value.reply_code == 406 and "were not taken" in refused.value.reply_text
    connection.close()


def test_deliveries_of_two_queues_reach_a_client_in_the_order_the_queues_took_them(node):
    """Celery's revoke before its task: a broadcast published, confirmed, then a task to
    another queue, both consumed on one connection (the task's channel first). Each
    consumer's fetch waits in its queue, so the broadcast leaves as soon as its queue took
    it, not with the task at the port's next look at its consumers. Read off the socket:
    a client library may dispatch what one read brought channel by channel."""
    with node.connect() as warren:
        warren.declare_queue("tasks")
        warren.declare_queue("control")
    host, port = node.amqp_endpoint.rsplit(":", 1)
    publisher = _connect(node)
    sending = publisher.channel()
    sending.confirm_delivery()
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        _open_raw(sock)
        sock.sendall(frames.method_frame(2, commands.Channel.Open()))
        reader = _FrameReader(sock)
        assert isinstance(reader.method(), commands.Channel.OpenOk)
        for number, queue in ((1, "tasks"), (2, "control")):
            consume = commands.Basic.Consume(queue=queue, consumer_tag=queue, no_ack=True)
            sock.sendall(frames.method_frame(number, consume))
            assert isinstance(reader.method(), commands.Basic.ConsumeOk)
        for round_ in range(20):
            time.sleep(0.06)  # the consumers idle, as a worker between tasks
            sending.basic_publish("", "control", b"revoke %d" % round_)
            sending.basic_publish("", "tasks", b"task %d" % round_)
        delivered = [reader.method().consumer_tag for _ in range(40)]
    publisher.close()
    assert delivered == ["control", "tasks"] * 20


class _FrameReader:
    """The methods a raw socket receives, in order (content frames skipped)."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._buffer = bytearray()
        self._frames: list[frames.Frame] = []

    def method(self):
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            while self._frames:
                frame = self._frames.pop(0)
                if frame.kind == frames.FRAME_METHOD:
                    return frames.decode_method(frame)
            self._buffer += self._sock.recv(65536)
            read, taken = frames.split_frames(self._buffer, 1 << 20)
            del self._buffer[:taken]
            self._frames += read
        raise AssertionError("no method within 30 s")


CONSUMER = """
import sys, pika
host, port = sys.argv[1].rsplit(":", 1)
channel = pika.BlockingConnection(pika.ConnectionParameters(host, int(port))).channel()
channel.queue_declare("replies", auto_delete=True)
channel.basic_consume("replies", lambda ch, m, p, b: print(b.decode(), flush=True), True)
print("consuming", flush=True)
channel.start_consuming()
"""


def test_a_publisher_reaches_an_auto_delete_queue_declared_anew_after_its_consumer_died(node):
    """An aio-pika robust client's pattern: its consumer's process dies (kill -9), the
    auto-delete queue goes with it, the restarted client declares it anew; another
    connection that published to the old queue goes on publishing by its name, and every
    publish is confirmed and delivered once, as RabbitMQ routes by the name each time."""
    assert node.amqp_endpoint is not None
    publisher = _connect(node).channel()
    publisher.confirm_delivery()

    def consumer() -> subprocess.Popen:
        process = subprocess.Popen(
            [sys.executable, "-c", CONSUMER, node.amqp_endpoint], stdout=subprocess.PIPE, text=True
        )
        assert process.stdout is not None and process.stdout.readline() == "consuming\n"
        return process

    first = consumer()
    try:
        publisher.basic_publish("", "replies", b"to the first")
        assert first.stdout is not None and first.stdout.readline() == "to the first\n"
    finally:
        first.kill()
        first.communicate(timeout=60)
    wait_for(lambda: "replies" not in node.list_queues(), timeout=60)
    second = consumer()
    try:
        for n in range(3):
            publisher.basic_publish("", "replies", b"to the second %d" % n)  # each confirmed
        assert second.stdout is not None
        assert [second.stdout.readline() for _ in range(3)] == [
            f"to the second {n}\n" for n in range(3)
        ]
    finally:
        second.kill()
        second.communicate(timeout=60)

"""Dead letters as pika sees them, as RabbitMQ hands them out: routed with the message's
own routing key or the queue's ``x-dead-letter-routing-key``, delivered from the
dead-letter exchange, with RabbitMQ's ``x-death`` and ``x-first-death-*`` headers and
without the expiration that killed them (Celery's retries and delayed tasks read them)."""

from __future__ import annotations

import datetime

import pika
import pytest

from warren.supervisor import Node

from ...waiting import wait_for


@pytest.fixture
def channel(tmp_path):
    with Node(tmp_path / "data", amqp="127.0.0.1:0") as node:
        assert node.amqp_endpoint is not None
        host, port = node.amqp_endpoint.rsplit(":", 1)
        connection = pika.BlockingConnection(pika.ConnectionParameters(host, int(port)))
        yield connection.channel()
        connection.close()


def _one(channel, queue: str, *, auto_ack: bool = True):
    """The next message of ``queue``, once one is there."""
    got: list = []

    def arrived() -> bool:
        method, properties, body = channel.basic_get(queue, auto_ack=auto_ack)
        if method is not None:
            got.append((method, properties, body))
        return bool(got)

    wait_for(arrived)
    return got[0]


def test_a_rejected_message_goes_with_its_own_routing_key_and_says_how_it_died(channel):
    channel.exchange_declare("tasks", "topic", durable=True)
    channel.exchange_declare("dlx", "direct", durable=True)
    channel.queue_declare("work", durable=True, arguments={"x-dead-letter-exchange": "dlx"})
    channel.queue_bind("work", "tasks", "task.#")
    channel.queue_declare("failed", durable=True)
    channel.queue_bind("failed", "dlx", "task.resize")
    sent = pika.BasicProperties(headers={"attempt": 3}, expiration="60000", delivery_mode=2)
    channel.basic_publish("tasks", "task.resize", b"resize 42", sent)
    method, _, _ = _one(channel, "work", auto_ack=False)
    channel.basic_reject(method.delivery_tag, requeue=False)
    method, properties, body = _one(channel, "failed")
    assert body == b"resize 42"
    assert (method.exchange, method.routing_key) == ("dlx", "task.resize")
    assert properties.expiration is None and properties.delivery_mode == 2
    headers = properties.headers
    assert headers["attempt"] == 3
    (death,) = headers["x-death"]
    assert {k: death[k] for k in ("count", "reason", "queue", "exchange", "routing-keys")} == {
        "count": 1,
        "reason": "rejected",
        "queue": "work",
        "exchange": "tasks",
        "routing-keys": ["task.resize"],
    }
    assert death["original-expiration"] == "60000"
    assert isinstance(death["time"], datetime.datetime)
    assert (
        headers["x-first-death-queue"],
        headers["x-first-death-reason"],
        headers["x-first-death-exchange"],
    ) == ("work", "rejected", "tasks")


def test_an_expired_message_goes_with_the_queues_dead_letter_routing_key(channel):
    """Celery's countdown on RabbitMQ: a queue without consumers whose messages expire
    into the exchange and key of the queue that runs them."""
    channel.queue_declare("run", durable=True)
    channel.queue_declare(
        "wait-1s",
        durable=True,
        arguments={
            "x-message-ttl": 100,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": "run",
        },
    )
    channel.basic_publish("", "wait-1s", b"later", pika.BasicProperties(delivery_mode=2))
    method, properties, body = _one(channel, "run")
    assert (body, method.exchange, method.routing_key) == (b"later", "", "run")
    assert properties.headers["x-death"][0]["reason"] == "expired"
    assert properties.headers["x-death"][0]["routing-keys"] == ["wait-1s"]


def test_a_message_dead_lettered_twice_by_the_same_queue_is_counted_not_listed_twice(channel):
    channel.queue_declare(
        "again",
        durable=True,
        arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "again"},
    )
    channel.basic_publish("", "again", b"boomerang")
    for _ in range(2):
        method, _, _ = _one(channel, "again", auto_ack=False)
        channel.basic_reject(method.delivery_tag, requeue=False)
    _, properties, _ = _one(channel, "again")
    (death,) = properties.headers["x-death"]
    assert (death["count"], death["reason"], death["queue"]) == (2, "rejected", "again")

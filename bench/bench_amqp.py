"""Warren's AMQP port against RabbitMQ, with the same client in the same run.

    python -m bench amqp [--quick] [--messages=N]

Each broker runs as its own process tree on 127.0.0.1:5672, one after the other: a
``warren node --amqp`` on a fresh data directory, then a private RabbitMQ node (the one
``make compat`` starts, where ``rabbitmq-server`` is installed; without it, Warren's
figures alone, said in the table's title). The same two workloads run on each:

- publish: pika's asynchronous connection, one ``basic_publish`` per message with
  publisher confirms, at most 1,000 unconfirmed (WINDOW), 1 KiB bodies, persistent, into
  a durable queue. A confirm means the message is on disk on both brokers (Warren
  fdatasyncs before it confirms, RabbitMQ's durable queues likewise);
- consume: pika's blocking connection, ``basic.qos`` prefetch 100, one ``basic_ack`` per
  message, until the queue the publish filled is drained.

Rates are messages a second over the whole workload. The CPU figure is the broker's
processes' user and system time over the workload, per message: every process of its
session (Warren's node, forkserver, stores, queue and AMQP port; RabbitMQ's beam), read
before and after, so that the client's own CPU (in this process) is not counted. The
same workloads with aio-pika (asyncio) are reported too where it is installed (the
compat suites' virtualenv has it; ``pip install aio-pika`` for this one). Targets
(issue's): Warren at least 2x RabbitMQ's rate for publish and for consume, and at most
half its CPU per message.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pika
import psutil

from .bench_metrics import option
from .compat import HOST, PORT, BrokerError, RabbitMQNode, WarrenNode, session_members
from .table import Row, render, scratch_directory

MESSAGES = 50_000
WINDOW = 1000
PREFETCH = 100
BODY = b"x" * 1024
QUEUE = "bench-amqp"
RATE_TARGET = 2.0
CPU_TARGET = 0.5


class BrokerCpu:
    """The user and system seconds of a broker's processes (its session) over a block."""

    def __init__(self, leader: int) -> None:
        self._leader = leader
        self._before: dict[int, float] = {}
        self.seconds = 0.0

    def _now(self) -> dict[int, float]:
        seconds = {}
        for process in session_members(self._leader):
            with contextlib.suppress(psutil.Error):
                seconds[process.pid] = sum(process.cpu_times()[:2])
        return seconds

    def __enter__(self) -> BrokerCpu:
        self._before = self._now()
        return self

    def __exit__(self, *_: object) -> None:
        after = self._now()
        self.seconds = sum(now - self._before.get(pid, 0.0) for pid, now in after.items())


def _parameters() -> pika.ConnectionParameters:
    return pika.ConnectionParameters(HOST, PORT, heartbeat=0)


def pika_publish(count: int) -> float:
    """Seconds to publish ``count`` messages with confirms, WINDOW in flight (pika's
    SelectConnection: publishing goes on as confirms come back)."""
    unconfirmed: set[int] = set()
    state = {"sent": 0, "lowest": 1, "nacked": 0, "started": 0.0, "ended": 0.0}

    def publish_more(channel) -> None:
        properties = pika.BasicProperties(delivery_mode=2)
        while state["sent"] < count and len(unconfirmed) < WINDOW:
            state["sent"] += 1
            unconfirmed.add(state["sent"])
            channel.basic_publish("", QUEUE, BODY, properties)

    def on_confirm(frame, channel) -> None:
        method = frame.method
        if isinstance(method, pika.spec.Basic.Nack):
            state["nacked"] += 1
        if method.multiple:
            for tag in range(state["lowest"], method.delivery_tag + 1):
                unconfirmed.discard(tag)
            state["lowest"] = method.delivery_tag + 1
        else:
            unconfirmed.discard(method.delivery_tag)
        if state["sent"] == count and not unconfirmed:
            state["ended"] = time.perf_counter()
            channel.connection.close()
        else:
            publish_more(channel)

    def on_declared(_frame, channel) -> None:
        state["started"] = time.perf_counter()
        publish_more(channel)

    def on_channel(channel) -> None:
        channel.confirm_delivery(lambda frame: on_confirm(frame, channel))
        channel.queue_declare(QUEUE, durable=True, callback=lambda f: on_declared(f, channel))

    connection = pika.SelectConnection(
        _parameters(), on_open_callback=lambda c: c.channel(on_open_callback=on_channel)
    )
    connection.ioloop.call_later(600, connection.ioloop.stop)  # a broker gone silent
    connection.add_on_close_callback(lambda *_: connection.ioloop.stop())
    connection.ioloop.start()
    if not state["ended"] or state["nacked"]:
        raise BrokerError(f"publish ended early: {len(unconfirmed)} unconfirmed, {state}")
    return state["ended"] - state["started"]


def pika_consume(count: int) -> float:
    """Seconds to consume ``count`` messages, prefetch PREFETCH, one ack each."""
    connection = pika.BlockingConnection(_parameters())
    channel = connection.channel()
    channel.basic_qos(prefetch_count=PREFETCH)
    got = 0

    def on_message(channel, method, _properties, _body) -> None:
        nonlocal got
        channel.basic_ack(method.delivery_tag)
        got += 1
        if got == count:
            channel.stop_consuming()

    started = time.perf_counter()
    channel.basic_consume(QUEUE, on_message)
    channel.start_consuming()
    seconds = time.perf_counter() - started
    connection.close()
    return seconds


async def _aio_pika_publish(count: int) -> float:
    import aio_pika

    connection = await aio_pika.connect(f"amqp://guest:guest@{HOST}:{PORT}/")
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        await channel.declare_queue(QUEUE, durable=True)
        window = asyncio.Semaphore(WINDOW)
        message = aio_pika.Message(BODY, delivery_mode=aio_pika.DeliveryMode.PERSISTENT)

        async def one() -> None:
            try:
                await channel.default_exchange.publish(message, QUEUE)
            finally:
                window.release()

        started = time.perf_counter()
        tasks = []
        for _ in range(count):
            await window.acquire()
            tasks.append(asyncio.ensure_future(one()))
        await asyncio.gather(*tasks)
        return time.perf_counter() - started


async def _aio_pika_consume(count: int) -> float:
    import aio_pika

    connection = await aio_pika.connect(f"amqp://guest:guest@{HOST}:{PORT}/")
    async with connection:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=PREFETCH)
        queue = await channel.declare_queue(QUEUE, durable=True)
        got = 0
        started = time.perf_counter()
        async with queue.iterator() as messages:
            async for message in messages:
                await message.ack()
                got += 1
                if got == count:
                    break
        return time.perf_counter() - started


def aio_pika_publish(count: int) -> float:
    return asyncio.run(_aio_pika_publish(count))


def aio_pika_consume(count: int) -> float:
    return asyncio.run(_aio_pika_consume(count))


def aio_pika_installed() -> bool:
    try:
        import aio_pika  # noqa: F401
    except ImportError:
        return False
    return True


Workload = Callable[[int], float]
Figures = dict[str, tuple[float, float]]  # workload -> (msgs/s, broker CPU µs a message)


def measure(broker, count: int, workloads: dict[str, Workload]) -> Figures:
    """Start ``broker``, run each workload on it, stop it; each one's rate and CPU."""
    figures: Figures = {}
    broker.start()
    try:
        assert broker.process is not None
        for name, workload in workloads.items():
            with BrokerCpu(broker.process.pid) as cpu:
                seconds = workload(count)
            figures[name] = (count / seconds, cpu.seconds / count * 1e6)
    finally:
        broker.stop()
    return figures


def rows(warren: Figures, rabbitmq: Figures | None) -> list[Row]:
    found = []
    for name, (rate, cpu) in warren.items():
        theirs = rabbitmq.get(name) if rabbitmq else None
        rate_note = cpu_note = "no RabbitMQ to compare"
        if theirs:
            rate_note = "baseline: RabbitMQ; " + ("met" if rate >= RATE_TARGET * theirs[0] else "")
            share = cpu / theirs[1]
            cpu_note = f"baseline: RabbitMQ's beam; target <= {CPU_TARGET}: " + (
                "met" if share <= CPU_TARGET else "MISSED"
            )
        found.append(
            Row(
                f"{name}: Warren msgs/s",
                rate,
                "msgs/s",
                theirs[0] if theirs else None,
                RATE_TARGET if theirs else None,
                rate_note.removesuffix("; "),
            )
        )
        found.append(
            Row(
                f"{name}: Warren's CPU per message",
                cpu,
                "µs",
                theirs[1] if theirs else None,
                None,
                cpu_note,
            )
        )
    return found


def main(argv: list[str]) -> str:
    count = int(option(argv, "messages") or (MESSAGES // 8 if "--quick" in argv else MESSAGES))
    workloads: dict[str, Workload] = {
        "pika publish+confirm, window 1,000": pika_publish,
        "pika consume+ack, prefetch 100": pika_consume,
    }
    if aio_pika_installed():
        workloads["aio-pika publish+confirm, window 1,000"] = aio_pika_publish
        workloads["aio-pika consume+ack, prefetch 100"] = aio_pika_consume
    root = Path(scratch_directory("warren-bench-amqp-"))
    try:
        results = {}
        brokers = [("warren", WarrenNode)]
        if RabbitMQNode.server() is not None:
            brokers.append(("rabbitmq", RabbitMQNode))
        for name, broker_class in brokers:
            scratch = root / name
            scratch.mkdir()
            results[name] = measure(broker_class(scratch, root / f"{name}.log"), count, workloads)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    against = (
        "RabbitMQ 3.x from Debian in the same run"
        if "rabbitmq" in results
        else "no rabbitmq-server installed here: Warren alone"
    )
    title = f"AMQP 0-9-1, {count:,} messages of 1 KiB, persistent, durable queue ({against})"
    if not aio_pika_installed():
        title += "; aio-pika not installed: its rows left out"
    return render(title, rows(results["warren"], results.get("rabbitmq")))

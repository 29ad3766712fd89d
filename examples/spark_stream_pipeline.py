"""Spark → Warren → Spark, exactly once, through a driver killed mid-query.

    .venv/bin/python examples/spark_stream_pipeline.py [--events 1000000]
        [--per-trigger 100000] [--kill-after 3]

A node listens on loopback. A driver process of its own first runs a batch Spark job that
writes ``--events`` order events into the stream ``orders``
(``write.format("warren").option("stream", ...)``: each Arrow batch one chunk, each task a
deduplicating producer), then, in the same Spark session, a streaming query that reads
the stream (``readStream.format("warren")``, ``maxRecordsPerTrigger``),
counts the events of each customer and minute in every micro-batch, and writes those
counts into the durable queue ``customer-minutes`` through the same data source (its
producer ``order-minutes/<batch>``, so a micro-batch run again adds nothing twice). The
first attempt of one reading task fails; Spark runs it again. Once ``--kill-after``
micro-batches are committed, the driver's whole process group (the Python driver, its
JVM, its workers) is SIGKILLed, and the driver is started again from its checkpoint; it
re-runs the micro-batch that was in flight and goes on to the end.

At the end the counts are drained from the queue and checked against what was written:
events counted (must be every one, once), duplicate counts (0), wrong counts (0). The
script exits non-zero when any is off.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pyspark.sql import SparkSession  # noqa: E402

from warren.queues.client.spark import local_session  # noqa: E402  (the path above only makes examples.* importable, for a node's forkserver; warren comes from the install)
from warren.supervisor import Node  # noqa: E402

STREAM, RESULTS, PRODUCER = "orders", "customer-minutes", "order-minutes"
CUSTOMERS = 100
EVENTS_PER_MINUTE = 5000
FAILING_BATCH = 1  # the micro-batch whose first reading task fails once
SHUFFLE_PARTITIONS = 4  # fixed: a re-run micro-batch must cut its result the same way


def customer_of(order_id: int) -> str:
    return f"C{order_id * 7919 % CUSTOMERS:03d}"


def minute_of(order_id: int) -> int:
    return order_id // EVENTS_PER_MINUTE


def write_events(spark: SparkSession, endpoint: str, events: int) -> None:
    """The batch job: ``events`` order events into the stream."""
    frame = spark.range(events, numPartitions=4).selectExpr(
        f"to_json(named_struct('order_id', id, 'customer', concat('C', "
        f"lpad(cast(id * 7919 % {CUSTOMERS} as string), 3, '0')), 'minute', "
        f"cast(floor(id / {EVENTS_PER_MINUTE}) as int), 'amount', "
        f"round(5 + (id * 2654435761 % 100000) / 200.0, 2))) as body"
    )
    started = time.monotonic()
    (
        frame.write.format("warren")
        .mode("append")
        .option("endpoint", endpoint)
        .option("stream", STREAM)
        .option("producer", "orders-load")
        .save()
    )
    print(
        f"wrote {events:,} events into stream {STREAM!r} in {time.monotonic() - started:.1f} s",
        flush=True,
    )


def fail_one_first_attempt(batch_id: int):
    """``mapInArrow``: passes the micro-batch's records through; in micro-batch
    ``FAILING_BATCH`` the first attempt of the first task fails after its first batch."""

    def pass_through(batches):
        from pyspark import TaskContext

        context = TaskContext.get()
        doomed = (
            batch_id == FAILING_BATCH
            and context.partitionId() == 0
            and context.attemptNumber() == 0
        )
        for index, batch in enumerate(batches):
            if doomed and index == 1:
                raise RuntimeError("the first attempt of this task fails, on purpose")
            yield batch

    return pass_through


def run_driver(endpoint: str, checkpoint: str, per_trigger: int, load: int) -> None:
    """The load of ``load`` events (none: the driver started again), then the streaming
    query, in this process, until the stream's end (availableNow)."""
    spark = local_session("warren-stream-query", cores=2, max_failures=2)
    if load:
        write_events(spark, endpoint, load)
    spark.conf.set("spark.sql.shuffle.partitions", SHUFFLE_PARTITIONS)
    spark.conf.set("spark.sql.adaptive.coalescePartitions.enabled", "false")
    spark.sparkContext.setLogLevel("FATAL")  # the failing attempt is on purpose

    def count_batch(frame, batch_id: int) -> None:
        frame = frame.mapInArrow(fail_one_first_attempt(batch_id), frame.schema)
        counts = (
            frame.selectExpr(
                "get_json_object(cast(body as string), '$.customer') as customer",
                "cast(get_json_object(cast(body as string), '$.minute') as int) as minute",
            )
            .groupBy("customer", "minute")
            .count()
            .sortWithinPartitions("customer", "minute")  # the same rows in the same order
            .selectExpr(
                f"to_json(named_struct('batch', {batch_id}, 'customer', customer, "
                f"'minute', minute, 'events', count)) as body"
            )
        )
        (
            counts.write.format("warren")
            .mode("append")
            .option("endpoint", endpoint)
            .option("queue", RESULTS)
            .option("producer", f"{PRODUCER}/{batch_id}")
            .save()
        )

    query = (
        spark.readStream.format("warren")
        .option("endpoint", endpoint)
        .option("stream", STREAM)
        .option("startingOffsets", "first")
        .option("maxRecordsPerTrigger", per_trigger)
        .option("consumerName", PRODUCER)
        .load()
        .writeStream.foreachBatch(count_batch)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    spark.stop()


def start_driver(
    endpoint: str, checkpoint: str, per_trigger: int, load: int = 0
) -> subprocess.Popen:
    """The driver as a process group of its own, so one signal stops all of it."""
    return subprocess.Popen(
        [sys.executable, __file__, "--driver", endpoint, checkpoint, str(per_trigger), str(load)],
        start_new_session=True,
    )


def committed_batches(checkpoint: str) -> int:
    commits = Path(checkpoint) / "commits"
    return sum(1 for p in commits.iterdir() if p.name.isdigit()) if commits.is_dir() else 0


def drain(node: Node) -> tuple[Counter, int, int]:
    """Per (customer, minute): events counted; the duplicate and malformed results."""
    counted: Counter = Counter()
    seen: set[tuple[int, str, int]] = set()
    duplicates = malformed = 0
    connection = node.connect()
    while (delivery := connection.get(RESULTS)) is not None:
        try:
            result = json.loads(delivery.body)
            key = (result["batch"], result["customer"], result["minute"])
            events = int(result["events"])
        except (ValueError, KeyError, TypeError):
            malformed += 1
        else:
            if key in seen:
                duplicates += 1
            else:
                seen.add(key)
                counted[key[1:]] += events
        delivery.ack()
    return counted, duplicates, malformed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--per-trigger", type=int, default=100_000)
    parser.add_argument("--kill-after", type=int, default=3, help="committed micro-batches")
    args = parser.parse_args()
    if args.events < 1 or args.per_trigger < 1 or args.kill_after < 1:
        parser.error("--events, --per-trigger and --kill-after must be >= 1")
    if args.kill_after >= -(-args.events // args.per_trigger):
        parser.error("--kill-after must leave micro-batches to run after the kill")
    work = tempfile.mkdtemp(prefix="warren-stream-pipeline-")
    checkpoint = os.path.join(work, "checkpoint")
    with Node(os.path.join(work, "data"), listen="tcp://127.0.0.1:*") as node:
        endpoint = node.listen_endpoint
        node.declare_queue(STREAM, type="stream")
        node.declare_queue(RESULTS)
        print(f"node on {work}, listening on {endpoint}", flush=True)
        started = time.monotonic()
        driver = start_driver(endpoint, checkpoint, args.per_trigger, load=args.events)
        try:
            while committed_batches(checkpoint) < args.kill_after and driver.poll() is None:
                time.sleep(0.05)
            if driver.poll() is not None:
                raise SystemExit(f"the driver ended (exit {driver.returncode}) before the kill")
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
            killed_at = committed_batches(checkpoint)
            print(f"SIGKILLed the driver's process group after {killed_at} micro-batches")
            driver = start_driver(endpoint, checkpoint, args.per_trigger)
            if driver.wait() != 0:
                raise SystemExit(f"the restarted driver failed (exit {driver.returncode})")
        finally:
            if driver.poll() is None:
                os.killpg(driver.pid, signal.SIGKILL)
                driver.wait()
        query_s = time.monotonic() - started
        batches = committed_batches(checkpoint)

        counted, duplicates, malformed = drain(node)
        expected = Counter((customer_of(order), minute_of(order)) for order in range(args.events))
        wrong = sum(1 for key in expected.keys() | counted.keys() if counted[key] != expected[key])
        total = sum(counted.values())
        lag = node.connect().queue_stats(STREAM)["consumer_offsets"].get(PRODUCER)
        print(
            f"\nthe load and the streaming query: {batches} micro-batches of at most "
            f"{args.per_trigger:,} events in {query_s:.1f} s, across the kill and the "
            f"restart; the first attempt "
            f"of one task of micro-batch {FAILING_BATCH} failed and was run again"
        )
        print(f"{'events written':<28} {args.events:>10,}")
        print(f"{'events counted':<28} {total:>10,}")
        print(f"{'customer-minute counts':<28} {len(counted):>10,}")
        print(f"{'duplicate result messages':<28} {duplicates:>10}")
        print(f"{'wrong or malformed counts':<28} {wrong + malformed:>10}")
        print(f"stored progress of the query on the node: {lag}")
        if total != args.events or duplicates or wrong or malformed:
            raise SystemExit("an event was lost or counted twice: this must not happen")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--driver"]:
        run_driver(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    else:
        main()

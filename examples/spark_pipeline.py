"""Spark executors publishing a dataset into Warren, exactly once, while consumers drain it.

    .venv/bin/python examples/spark_pipeline.py [--rows 1000000] [--partitions 8]

A node listens on loopback (``listen="tcp://127.0.0.1:*"``). A local Spark session
(``local[2,2]``: a failed task is tried once more) generates order events (order id,
customer, amount, currency, timestamp) as JSON bodies and writes them with
``format("warren")`` through a fanout exchange into two queues, ``billing`` and a lazy
``analytics``. The first attempt of one task fails halfway through its partition, after
publishing part of it; Spark runs the task again and it re-sends the partition from its
first row, which the queues recognise as repeats (each task is a producer, each row's
sequence its index in the partition). Meanwhile a consumer thread per queue takes and
acks every message. At the end: rows published, consumed per queue, duplicates (0) and
lost (0), and the rates.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from warren.queues.client.spark import local_session  # noqa: E402  (the path above only makes examples.* importable, for a node's forkserver; warren comes from the install)
from warren.supervisor import Node  # noqa: E402

QUEUES = ("billing", "analytics")
FAILING_PARTITION = 1


class Tally:
    """What one queue's consumer saw: each order id once, twice, or never."""

    def __init__(self, rows: int) -> None:
        self.seen = bytearray(rows)
        self.consumed = self.duplicates = self.wrong = 0
        self.last_at = time.monotonic()

    def count(self, body: bytes) -> None:
        order = json.loads(body)
        order_id = order["order_id"]
        if not 0 <= order_id < len(self.seen) or not order["customer"].startswith("C"):
            self.wrong += 1
            return
        if self.seen[order_id]:
            self.duplicates += 1
        self.seen[order_id] = 1
        self.consumed += 1
        self.last_at = time.monotonic()

    @property
    def lost(self) -> int:
        return len(self.seen) - sum(self.seen)


def consume(node: Node, queue: str, tally: Tally, done: threading.Event) -> None:
    """Take and ack every message, until the job is done and the queue is empty."""
    with node.connect() as connection, connection.consume(queue, prefetch=1000) as consumer:
        while True:
            delivery = consumer.get(timeout=0.5)
            if delivery is not None:
                tally.count(delivery.body)
                delivery.ack()
            elif done.is_set() and connection.queue_stats(queue)["depth"] == 0:
                return


def fail_the_first_attempt_halfway(batches):
    """Passes Arrow batches through; the first attempt of one partition fails after
    half of its batches (``mapInArrow``: no per-row Python work)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    doomed = context.partitionId() == FAILING_PARTITION and context.attemptNumber() == 0
    for index, batch in enumerate(batches):
        if doomed and index == 2:
            raise RuntimeError("the first attempt of this task fails halfway, on purpose")
        yield batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=8)
    args = parser.parse_args()
    if args.rows < 1 or args.partitions < 2:
        parser.error("--rows must be >= 1 and --partitions >= 2")
    data_dir = tempfile.mkdtemp(prefix="warren-spark-")
    with Node(data_dir, listen="tcp://127.0.0.1:*") as node:
        node.declare_exchange("orders", kind="fanout")
        for queue in QUEUES:
            node.declare_queue(queue, lazy=queue == "analytics")
            node.bind_queue(queue, "orders")
        print(f"node on {data_dir}, listening on {node.listen_endpoint}", flush=True)
        spark = local_session("warren-spark-pipeline", cores=2, max_failures=2)
        # Four Arrow batches a partition: the failing attempt fails after two of them.
        spark.conf.set(
            "spark.sql.execution.arrow.maxRecordsPerBatch",
            max(100, args.rows // args.partitions // 4),
        )
        spark.sparkContext.setLogLevel("FATAL")  # the failing attempt is on purpose
        events = spark.range(args.rows, numPartitions=args.partitions).selectExpr(
            "id as order_id",
            "concat('C', lpad(cast(id * 7919 % 50000 as string), 5, '0')) as customer",
            "round(5 + (id * 2654435761 % 100000) / 200.0, 2) as amount",
            "element_at(array('EUR', 'USD', 'GBP'), cast(id % 3 as int) + 1) as currency",
            "timestamp_millis(1767225600000 + id * 37) as placed_at",
        )
        bodies = events.selectExpr("to_json(struct(*)) as body")
        bodies = bodies.mapInArrow(fail_the_first_attempt_halfway, bodies.schema)
        tallies = {queue: Tally(args.rows) for queue in QUEUES}
        done = threading.Event()
        consumers = [
            threading.Thread(target=consume, args=(node, q, tallies[q], done)) for q in QUEUES
        ]
        for thread in consumers:
            thread.start()
        started = time.monotonic()
        try:
            (
                bodies.write.format("warren")
                .mode("append")
                .option("endpoint", node.listen_endpoint)
                .option("exchange", "orders")
                .option("producer", "orders-2026-01-01")
                .save()
            )
            published_in = time.monotonic() - started
        finally:
            done.set()
            for thread in consumers:
                thread.join()
            spark.stop()
        drained_in = max(t.last_at for t in tallies.values()) - started
        print(
            f"\npublished {args.rows:,} rows into {len(QUEUES)} queues in "
            f"{published_in:.1f} s: {args.rows / published_in:,.0f} rows/s "
            f"({len(QUEUES) * args.rows / published_in:,.0f} messages/s); the first "
            f"attempt of partition {FAILING_PARTITION} failed halfway and was run again"
        )
        print(f"{'queue':<10} {'consumed':>10} {'duplicates':>10} {'lost':>6} {'wrong':>6}")
        for queue, tally in tallies.items():
            print(
                f"{queue:<10} {tally.consumed:>10,} {tally.duplicates:>10} {tally.lost:>6} "
                f"{tally.wrong:>6}"
            )
        print(f"every message consumed and acked {drained_in:.1f} s after the job started")
        if any(t.duplicates or t.lost or t.wrong for t in tallies.values()):
            raise SystemExit("duplicates, losses or wrong bodies: this must not happen")


if __name__ == "__main__":
    main()

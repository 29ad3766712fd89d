"""Warren end to end: a broker on an embedded node, with crashes in the middle.

    make run            (or: .venv/bin/python examples/demo.py)

A node boots its supervision tree, each actor its own OS process: the GC, the persistent
and transient message stores, and one process per queue. Orders are published through a
fanout exchange into two queues, ``billing`` and a lazy ``shipping``, by two producer
processes, while a consumer process drains each queue. Midway the demo SIGKILLs the
billing queue's process, then the persistent store: the supervisors restart them, they
recover from disk, producers re-send what was in doubt, consumers get the unacked
messages again flagged redelivered. At the end the ledgers of producers and consumers are
compared: confirmed, consumed, redelivered, lost (0). Then the workload the README's
performance figures measure runs on the same node (one producer, ``publish_async`` with
1,000 unconfirmed in flight, then one consumer acking each), and the node's status.

What the node logs (WARNING and above, to stderr) during the crashes is the kills seen
from inside: a queue stopping because its store died, requests that were in flight.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.bench_broker import publish_and_consume  # noqa: E402
from warren.supervisor import Node  # noqa: E402
from warren.supervisor.chaos.workload import Producer, audit  # noqa: E402
from warren.supervisor.cli.main import format_status  # noqa: E402
from warren.supervisor.cli.queues import format_queues  # noqa: E402  (the path above only makes examples.* importable, for a node's forkserver; warren comes from the install)

ORDERS_PER_PRODUCER = 2500
HEADLINE_COUNT = 20_000  # 1 KiB messages of the README's publish+confirm workload
QUEUES = ("billing", "shipping")
FILE_SIZE_LIMIT = 1024 * 1024  # small store files, so rollover and GC show up


def step(title: str) -> None:
    print(f"\n== {title}", flush=True)


def wait_until(condition, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit("the demo waited too long; something is wrong")
        time.sleep(0.05)


def lines(path: str) -> int:
    try:
        with open(path) as file:
            return file.read().count("\n")
    except FileNotFoundError:
        return 0


def start(*arguments: object) -> subprocess.Popen:
    """A producer or consumer of the chaos workload (``warren.supervisor.chaos.roles``) in
    a process of its own."""
    process = subprocess.Popen(
        [sys.executable, "-m", "warren.supervisor.chaos.roles", *map(str, arguments)],
        stdout=subprocess.PIPE,
        text=True,
    )
    process.stdout.readline()  # "ready"
    return process


def kill(node: Node, actor: str) -> None:
    old = node.actors.whereis(actor).pid
    os.kill(old, signal.SIGKILL)
    wait_until(lambda: getattr(node.actors.whereis(actor), "pid", old) != old)
    print(
        f"   SIGKILL {actor} (pid {old}): restarted as pid "
        f"{node.actors.whereis(actor).pid}, recovered from disk"
    )


def queue_rows(node: Node) -> list[dict]:
    connection = node.connect()
    try:
        return [
            {"name": q, "state": node.queue_state(q), "stats": connection.queue_stats(q)}
            for q in QUEUES
        ]
    finally:
        connection.close()


def tour(node: Node, work: str) -> None:
    step("1. The node's processes")
    for row in node.status()["tree"]["children"]:
        pids = (
            [c["pid"] for c in row.get("children", [])]
            if row["kind"] == "supervisor"
            else [row["pid"]]
        )
        print(f"   {row['id']:<22} {row['kind']:<10} pids {pids}")

    step("2. A fanout exchange 'orders' into two queues, one of them lazy")
    node.declare_exchange("orders", kind="fanout")
    node.declare_queue("billing")
    node.declare_queue("shipping", lazy=True)
    for queue in QUEUES:
        node.bind_queue(queue, "orders")
    print(
        "   queue processes: "
        + ", ".join(f"warren: queue {q} (pid {node.queue(q).pid})" for q in QUEUES)
    )

    step(
        f"3. Two producer processes publish {2 * ORDERS_PER_PRODUCER:,} orders; "
        f"a consumer process drains each queue"
    )
    producers = [os.path.join(work, f"producer-{i}") for i in range(2)]
    consumers = {q: os.path.join(work, f"consumer-{q}") for q in QUEUES}
    processes = []
    try:
        processes += [
            start(
                "produce",
                node.data_dir,
                "",
                f"p{i}",
                ledger,
                "--count",
                ORDERS_PER_PRODUCER,
                "--exchange",
                "orders",
            )
            for i, ledger in enumerate(producers)
        ]
        processes += [start("consume", node.data_dir, consumers[q], q) for q in QUEUES]
        started = time.monotonic()
        confirmed = lambda: sum(lines(p) for p in producers)  # noqa: E731
        wait_until(lambda: confirmed() >= 1500)
        print(f"   {confirmed():,} orders confirmed so far")
        print("   " + format_queues(queue_rows(node)).replace("\n", "\n   "))

        step("4. Crashes in the middle of the flow")
        print(
            "   (the node's processes log what each kill interrupts, as WARNING lines: a\n"
            "   queue stopping to restart after its store, requests in flight; nothing\n"
            "   confirmed is lost)"
        )
        kill(node, "queue billing")
        wait_until(lambda: confirmed() >= 3000)
        kill(node, "msg_store_persistent")
        print("   (rest_for_one: the transient store and every queue restarted after it)")

        step("5. The producers finish; the consumers drain both queues")
        for producer in processes[:2]:
            producer.wait(timeout=300)
        elapsed = time.monotonic() - started
        wait_until(lambda: all(r["stats"]["depth"] == 0 for r in queue_rows(node)))
        print(
            f"   {confirmed():,} orders confirmed in {elapsed:.1f} s "
            f"({confirmed() / elapsed:,.0f}/s: each order published alone and waited for,\n"
            f"   to both queues, and written to its producer's ledger, through two crashes;\n"
            f"   a check of what survives, not a throughput figure: step 7 measures that)"
        )
    finally:
        for process in processes:
            process.kill()
            process.wait()
            process.stdout.close()

    step("6. The ledgers")
    lost = 0
    for queue in QUEUES:
        result = audit(
            [Producer(f"p{i}", ledger, (queue,)) for i, ledger in enumerate(producers)],
            [consumers[queue]],
        )
        lost += (
            len(result.lost) + len(result.unflagged) + len(result.misrouted) + result.wrong_bodies
        )
        print(
            f"   {queue:<9} confirmed {result.confirmed:,}, consumed {result.consumed:,}, "
            f"redelivered {result.redelivered:,}, duplicates {result.duplicates:,}, "
            f"lost {len(result.lost)}"
        )
    if lost:
        raise SystemExit(
            f"{lost} confirmed orders were lost, came back unflagged, went "
            f"astray or came back damaged"
        )

    step(f"7. The README's workload: {HEADLINE_COUNT:,} messages of 1 KiB into one queue")
    node.declare_queue("throughput")
    publish, consume = publish_and_consume(node, "throughput", b"x" * 1024, HEADLINE_COUNT)
    print(
        f"   publish+confirm, publish_async each, 1,000 in flight: {publish:,.0f} msgs/s\n"
        f"   consume+ack, prefetch 100, one ack each:            {consume:,.0f} msgs/s\n"
        f"   (README.md's figures are this workload on a machine at rest; `make bench\n"
        f"   BENCH=broker` runs it at full size)"
    )

    step("8. The node's status")
    print("   " + format_status(node.status()).replace("\n", "\n   "))


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="warren-demo-") as work:
        data_dir = os.path.join(work, "data")
        print(f"Warren: a node on {data_dir}")
        with Node(data_dir, file_size_limit=FILE_SIZE_LIMIT) as node:
            tour(node, work)
        print(
            "\nThe node stopped cleanly: every process of the tree has exited, and no "
            "confirmed order was lost."
        )


if __name__ == "__main__":
    main()

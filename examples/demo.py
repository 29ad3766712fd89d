"""Warren end to end, on an embedded node in a temporary directory.

    make run            (or: .venv/bin/python examples/demo.py)

A node boots its supervision tree — the GC, the persistent and transient message stores,
each its own OS process. A client writes messages to the persistent store (batched, one
fsync per group, every write confirmed), reads them back straight from the files, acks
most of them, and the GC process compacts the files. Then the store process is killed
with SIGKILL in the middle of a stream of writes: the supervisor restarts it, it recovers
from disk, the client learns which writes were in doubt, and every confirmed message reads
back intact. Each step prints what happened; the node's status table ends the tour.
"""

from __future__ import annotations

import hashlib
import os
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from warren.store.client import StoreClient, StoreRestarted  # noqa: E402  (source checkout)
from warren.store.messages import StoreStats  # noqa: E402
from warren.supervisor import Node  # noqa: E402
from warren.supervisor.cli import format_status  # noqa: E402

FILE_SIZE_LIMIT = 256 * 1024      # small files, so rollover and GC show up quickly


def msg_id(n: int) -> bytes:
    return hashlib.md5(f"order {n}".encode()).digest()


def body(n: int) -> bytes:
    return f"order #{n}: ".encode() + bytes([n % 251]) * (4000 + n % 3000)


def step(title: str) -> None:
    print(f"\n== {title}", flush=True)


def wait_until(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit("the demo waited too long; something is wrong")
        time.sleep(0.05)


def tour(node: Node) -> None:
    figures = lambda: node.store().ask(StoreStats())  # noqa: E731

    step("1. The node's processes")
    for row in node.status()["tree"]["children"]:
        pids = [c["pid"] for c in row.get("children", [])] if row["kind"] == "supervisor" \
            else [row["pid"]]
        print(f"   {row['id']:<22} {row['kind']:<10} pids {pids}")

    step("2. A client writes 5,000 messages of 4-7 KiB; each is confirmed once on disk")
    confirmed = []
    client = StoreClient(node.store(), on_settled=lambda s: confirmed.append(s))
    started = time.perf_counter()
    for n in range(5000):
        client.write(msg_id(n), body(n))
    client.settle()
    elapsed = time.perf_counter() - started
    durable = sum(len(s.locations) for s in confirmed)
    print(f"   {durable} writes confirmed in {len(confirmed)} group commits, "
          f"{5000 / elapsed:,.0f} msgs/s; the store has {figures()['file_count']} files")

    step("3. Reading them back, straight from the files (no round trip to the store)")
    assert all(client.read(msg_id(n)) == body(n) for n in range(5000))
    print(f"   5000 bodies intact: {client.direct_reads} read directly, "
          f"{client.fallback_reads} through the store")

    step("4. Consumers ack 80% of them; the GC process combines the files")
    before = figures()
    client.remove([msg_id(n) for n in range(5000) if n % 5])
    client.settle()
    wait_until(lambda: figures()["gc_runs"] > 0 and figures()["garbage_fraction"] <= 0.5)
    after = figures()
    print(f"   {before['file_count']} files → {after['file_count']}; garbage "
          f"{after['garbage_fraction']:.0%}; {after['gc_runs']} combines by msg_store_gc")
    assert all(client.read(msg_id(n)) == body(n) for n in range(0, 5000, 5))
    print("   every remaining message still reads back intact")

    step("5. The store process is killed with SIGKILL in the middle of a stream of writes")
    store_pid = node.store().pid
    settled_ids: list[bytes] = []
    streaming = StoreClient(node.store(), on_settled=lambda s: settled_ids.extend(
        msg_id(10_000 + seq) for seq, *_ in s.locations))
    in_doubt: list[bytes] = []
    try:
        for n in range(10_000, 200_000):
            streaming.write(msg_id(n), body(n))
            if n == 40_000:
                os.kill(store_pid, signal.SIGKILL)
        streaming.settle()
    except StoreRestarted as restarted:
        in_doubt = restarted.in_doubt
    print(f"   {len(settled_ids)} writes had been confirmed; {len(in_doubt)} were in flight "
          f"and are reported in doubt (send them again)")
    print(f"   the supervisor restarted the store: pid {store_pid} → {node.store().pid}, "
          f"recovered from disk")

    step("6. After the restart")
    fresh = StoreClient(node.store())
    bodies = {msg_id(n): body(n) for n in range(10_000, 200_000)}
    intact = sum(fresh.read(m) == bodies[m] for m in settled_ids)
    old = sum(fresh.read(msg_id(n)) == body(n) for n in range(0, 5000, 5))
    print(f"   {intact} of {len(settled_ids)} confirmed writes read back, and all {old} "
          f"messages from before")
    recovered = fresh.store.ask(StoreStats())["message_count"]
    print(f"   the store holds {recovered} messages: those, plus {recovered - intact - old} "
          f"in-doubt writes that had reached the disk before the kill")
    assert intact == len(settled_ids) and old == 1000
    for client_ in (fresh, streaming, client):
        client_.terminate()

    step("7. The node's status (a store crash restarts everything after it: rest_for_one)")
    print("   " + format_status(node.status()).replace("\n", "\n   "))


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="warren-demo-") as data_dir:
        print(f"Warren: a node on {data_dir}")
        with Node(data_dir, file_size_limit=FILE_SIZE_LIMIT) as node:
            tour(node)
        print("\nThe node stopped cleanly: every process of the tree has exited, and nothing "
              "confirmed was lost.")


if __name__ == "__main__":
    main()

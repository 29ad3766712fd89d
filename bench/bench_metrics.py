"""What a node's metrics cost: the scrape itself with many queues, and what a scrape every
second takes from publish+confirm, both in the same run.

    python -m bench metrics [--quick] [--queues=N]

- scrape time: a node started with ``http="127.0.0.1:0"`` and N queues (1,000 unless
  ``--queues`` says otherwise), each holding one message; ``/metrics`` and
  ``/metrics/per-object`` fetched 20 times each over loopback (after two unmeasured
  fetches), median and slowest. Target: <= 200 ms with 1,000 queues (``--queues=N``
  measures another count, without the target).
- publish+confirm under scrapes: bench_broker's publisher workload (one ``publish_async``
  per message, a window of 1,000 unconfirmed, 1 KiB, one producer into one durable
  queue, the connection in the node's process), on a node of its own, alternately
  without and with a scraper process fetching ``/metrics/per-object`` every second (as
  Prometheus would), three times each, the fastest of each kept (``best_of_alternating``);
  the queue is purged, untimed, after every run. The baseline is the run without scrapes.
  Target: the slowdown <= 5 %, so the ratio >= 0.95.

``--quick`` shrinks the queues to 100 and the publishes by 4x.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

from warren.supervisor import Node

from .table import Row, best_of_alternating, median, render

QUEUES = 1000
SCRAPES = 20
SCRAPE_TARGET_MS = 200.0
PUBLISHES = 100_000
WINDOW = 1000  # unconfirmed messages the producer keeps in flight
BODY = b"x" * 1024
SLOWDOWN_RATIO_TARGET = 0.95
PAGES = ("/metrics", "/metrics/per-object")

SCRAPER = """
import sys, threading, time, urllib.request
url = sys.argv[1]
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
print("ready", flush=True)
next_at = time.monotonic()
while not stop.is_set():
    urllib.request.urlopen(url, timeout=10).read()
    next_at += 1.0
    stop.wait(max(0.0, next_at - time.monotonic()))
"""


def scrape_times(node: Node, path: str) -> list[float]:
    """Seconds per fetch of ``path``, ``SCRAPES`` of them after two unmeasured."""
    url = node.http_endpoint + path
    times = []
    for n in range(SCRAPES + 2):
        started = time.perf_counter()
        urllib.request.urlopen(url, timeout=30).read()
        if n >= 2:
            times.append(time.perf_counter() - started)
    return times


def node_with_queues(data_dir: str, queues: int) -> tuple[dict[str, list[float]], float]:
    """Fetch times per page of a node holding ``queues`` queues of one message each, and
    the seconds their declarations took."""
    with Node(data_dir, http="127.0.0.1:0") as node:
        started = time.perf_counter()
        with node.connect() as connection:
            for n in range(queues):
                node.declare_queue(f"q{n:04d}")
                connection.publish(f"q{n:04d}", BODY)
        declared = time.perf_counter() - started
        return {page: scrape_times(node, page) for page in PAGES}, declared


def publish_rate_runs(data_dir: str, count: int) -> tuple[float, float]:
    """The fastest publish+confirm run without and with a scrape every second, in
    messages per second."""
    with Node(data_dir, http="127.0.0.1:0") as node:
        node.declare_queue("load")
        connection = node.connect(max_in_flight=WINDOW)

        def publish() -> float:
            started = time.perf_counter()
            for _ in range(count):
                connection.publish_async("load", BODY)
            connection.wait_for_confirms(timeout=300)
            elapsed = time.perf_counter() - started
            connection.purge_queue("load")
            return elapsed

        def publish_while_scraped() -> float:
            scraper = subprocess.Popen(
                [sys.executable, "-c", SCRAPER, node.http_endpoint + "/metrics/per-object"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            try:
                scraper.stdout.readline()
                return publish()
            finally:
                scraper.stdin.close()
                scraper.wait(timeout=30)
                scraper.stdout.close()

        try:
            plain, scraped = best_of_alternating(publish, publish_while_scraped)
        finally:
            connection.close()
    return count / plain, count / scraped


def met(figure: float, target: float) -> str:
    return f"target <= {target:,g}: {'met' if figure <= target else 'MISSED'}"


def main(argv: list[str]) -> str:
    quick = "--quick" in argv
    queues = 100 if quick else QUEUES
    for option in argv:
        if option.startswith("--queues="):
            queues = int(option.removeprefix("--queues="))
    count = PUBLISHES // (4 if quick else 1)
    root = tempfile.mkdtemp(prefix="warren-bench-metrics-")
    try:
        times, declared = node_with_queues(os.path.join(root, "queues"), queues)
        plain, scraped = publish_rate_runs(os.path.join(root, "load"), count)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    ms = 1000
    rows = []
    for page in PAGES:
        typical = median(times[page]) * ms
        rows.append(
            Row(
                f"GET {page}, {queues:,} queues (median)",
                typical,
                "ms",
                note=met(typical, SCRAPE_TARGET_MS) if queues >= QUEUES else "",
            )
        )
        rows.append(Row(f"GET {page}, {queues:,} queues (slowest)", max(times[page]) * ms, "ms"))
    rows.append(
        Row(
            f"publish+confirm 1 KiB, window {WINDOW:,}, a scrape every second",
            scraped,
            "msgs/s",
            plain,
            SLOWDOWN_RATIO_TARGET,
            "baseline: the same without scrapes",
        )
    )
    return render(
        f"node metrics: scrapes and their cost ({queues:,} queues declared in "
        f"{declared:.0f} s; {count:,} publishes a run)",
        rows,
    )

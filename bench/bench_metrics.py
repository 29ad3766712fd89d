"""What a node's metrics cost: the scrape itself with many queues, the node's idle CPU
with them, and what a scrape every second takes from publish+confirm, all in the same run.

    python -m bench metrics [--quick] [--queues=N[,N...]]

- scrape time: a node started with ``http="127.0.0.1:0"`` and N queues (1,000 unless
  ``--queues`` says otherwise; ``--queues=200,1000`` measures each count on a node of its
  own), each holding one message; ``/metrics`` and ``/metrics/per-object`` fetched 20
  times each over loopback (after two unmeasured fetches), median and slowest. Target:
  ``/metrics`` in <= 200 ms with 1,000 queues (other counts are measured without it).
  The queues are idle, so these scrapes read the figures each queue published; the
  node's first ``/metrics`` (the first unmeasured fetch) asks every actor, as a scrape
  does when every queue has changed since the last one: it is shown on a row of its own
  (one fetch, so a rough figure).
- idle: the CPU the node's own process, and all its processes together (the forkserver
  and every actor), took over ``IDLE_S`` with nothing to do, as a share of one core.
  Before it, the node has stood ``SETTLE_S`` after the declares, so that the memory
  alarm has read every process once.
- file descriptors: what the node's process holds after the scrapes (a thousand queues
  need thousands: each actor's control channel, for the heartbeats and the scrapes, is a
  ZeroMQ socket and a connection). The run raises its soft limit to the hard one
  (``ulimit -Hn``); under a soft limit of 1,024, a node of 1,000 queues runs out.
- publish+confirm under scrapes: bench_broker's publisher workload (one ``publish_async``
  per message, a window of 1,000 unconfirmed, 1 KiB, one producer into one durable
  queue, the connection in the node's process), on a node of its own, alternately
  without and with a scraper process fetching ``/metrics/per-object`` every second (as
  Prometheus would), five times each, the fastest of each kept (``best_of_alternating``);
  the queue is purged, untimed, after every run. The baseline is the run without scrapes.
  Target: the slowdown <= 5 %, so the ratio >= 0.95.
- publish+confirm into a deep queue under scrapes: the same workload with 100-byte
  bodies into a queue holding ``DEEP_DEPTH`` messages (1,000,000; 100,000 with
  ``--quick``; ``--depth=N`` to choose), alternately without and with a scraper fetching
  ``/metrics`` 16 times a second, the messages of each run left in the queue. The queue
  is busy, so every scrape asks it for its stats, which once walked every message in
  RAM (26 ms at 100,000). Target: the slowdown <= 10 %, so the ratio >= 0.90.

``--quick`` shrinks the queues to 100, the publishes by 4x and the deep queue to
100,000. ``--only=scrape,load,deep`` runs only the parts named (the many-queue node, the
publishes under a scrape a second, the deep queue).
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import psutil

from warren.supervisor import Node

from .table import Row, best_of_alternating, median, render, scratch_directory

QUEUES = 1000
IDLE_S = 10.0  # how long the idle node's CPU is measured (seconds)
SETTLE_S = 5.0  # how long the node stands after its declares before that (seconds)
SCRAPES = 20
SCRAPE_TARGET_MS = 200.0
PUBLISHES = 100_000
WINDOW = 1000  # unconfirmed messages the producer keeps in flight
BODY = b"x" * 1024
SLOWDOWN_RATIO_TARGET = 0.95
SLOWDOWN_RUNS = 5  # each side: runs of under a second, so one disturbed run weighs less
PAGES = ("/metrics", "/metrics/per-object")
DEEP_DEPTH = 1_000_000  # messages in the deep queue before its timed runs
DEEP_BODY = b"x" * 100
DEEP_PUBLISHES = 200_000  # per timed run
DEEP_SCRAPES_PER_S = 16
DEEP_RATIO_TARGET = 0.90
PREFILL_BATCH = 1000  # messages per publish_many of the deep queue's filling
PARTS = ("scrape", "load", "deep")

SCRAPER = """
import sys, threading, time, urllib.request
url, interval = sys.argv[1], float(sys.argv[2])
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
print("ready", flush=True)
next_at = time.monotonic()
while not stop.is_set():
    urllib.request.urlopen(url, timeout=10).read()
    next_at += interval
    stop.wait(max(0.0, next_at - time.monotonic()))
"""


def scrape_times(node: Node, path: str) -> list[float]:
    """Seconds per fetch of ``path``: the first unmeasured one, then ``SCRAPES`` after
    a second unmeasured."""
    url = node.http_endpoint + path
    times = []
    for n in range(SCRAPES + 2):
        started = time.perf_counter()
        urllib.request.urlopen(url, timeout=30).read()
        if n != 1:
            times.append(time.perf_counter() - started)
    return times


@dataclass
class QueuesRun:
    """What one node of many queues measured."""

    queues: int
    declare_s: float
    idle_node: float  # CPU seconds per second: the node's process
    idle_all: float  # the same, all the node's processes
    times: dict[str, list[float]]  # page -> seconds per fetch
    first: float  # seconds of the node's first /metrics: every actor asked
    descriptors: int  # open by the node's process after the scrapes


def cpu_seconds(processes: list[psutil.Process]) -> float:
    """User and system CPU seconds of the processes, those gone since counting none."""
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def node_with_queues(data_dir: str, queues: int) -> QueuesRun:
    """Declare ``queues`` queues of one message each on a node, then measure it idle and
    under scrapes."""
    with Node(data_dir, http="127.0.0.1:0") as node:
        started = time.perf_counter()
        with node.connect() as connection:
            for n in range(queues):
                node.declare_queue(f"q{n:04d}")
                connection.publish(f"q{n:04d}", BODY)
        declare_s = time.perf_counter() - started
        time.sleep(SETTLE_S)
        me = psutil.Process()
        processes = [me, *me.children(recursive=True)]
        before_node, before_all = cpu_seconds([me]), cpu_seconds(processes)
        time.sleep(IDLE_S)
        idle_node = (cpu_seconds([me]) - before_node) / IDLE_S
        idle_all = (cpu_seconds(processes) - before_all) / IDLE_S
        times = {page: scrape_times(node, page) for page in PAGES}
        first = times["/metrics"].pop(0)
        for page in PAGES[1:]:
            times[page].pop(0)
        return QueuesRun(
            queues,
            declare_s,
            idle_node,
            idle_all,
            times,
            first,
            len(os.listdir("/proc/self/fd")),
        )


def raise_open_files_limit() -> str:
    """Raise this process's soft limit of open files to its hard limit; the limit now."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return "unlimited" if hard == resource.RLIM_INFINITY else f"{hard:,}"


@contextmanager
def scraping(url: str, per_second: float) -> Iterator[None]:
    """A scraper process fetching ``url`` ``per_second`` times a second meanwhile."""
    scraper = subprocess.Popen(
        [sys.executable, "-c", SCRAPER, url, str(1 / per_second)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        scraper.stdout.readline()
        yield
    finally:
        scraper.stdin.close()
        scraper.wait(timeout=30)
        scraper.stdout.close()


def publish_rates(
    node: Node, queue: str, body: bytes, count: int, page: str, per_second: float, purge: bool
) -> tuple[float, float]:
    """The fastest run of ``count`` publish+confirms into ``queue`` without and with
    ``page`` scraped ``per_second`` times a second, in messages per second; the queue
    purged, untimed, after each run when ``purge``."""
    connection = node.connect(max_in_flight=WINDOW)

    def publish() -> float:
        started = time.perf_counter()
        for _ in range(count):
            connection.publish_async(queue, body)
        connection.wait_for_confirms(timeout=300)
        elapsed = time.perf_counter() - started
        if purge:
            connection.purge_queue(queue)
        return elapsed

    def publish_while_scraped() -> float:
        with scraping(node.http_endpoint + page, per_second):
            return publish()

    try:
        plain, scraped = best_of_alternating(publish, publish_while_scraped, runs=SLOWDOWN_RUNS)
    finally:
        connection.close()
    return count / plain, count / scraped


def publish_rate_runs(data_dir: str, count: int) -> tuple[float, float]:
    """The fastest publish+confirm run without and with a scrape every second, in
    messages per second."""
    with Node(data_dir, http="127.0.0.1:0") as node:
        node.declare_queue("load")
        return publish_rates(node, "load", BODY, count, "/metrics/per-object", 1.0, purge=True)


def deep_queue_runs(data_dir: str, depth: int, count: int) -> tuple[float, float, float]:
    """The fastest publish+confirm run into a queue of ``depth`` messages without and with
    ``DEEP_SCRAPES_PER_S`` scrapes a second, in messages per second; and the seconds its
    filling took."""
    with Node(data_dir, http="127.0.0.1:0") as node:
        node.declare_queue("deep")
        started = time.perf_counter()
        with node.connect(max_in_flight=WINDOW) as connection:
            batch = [DEEP_BODY] * PREFILL_BATCH
            for _ in range(depth // PREFILL_BATCH):
                connection.publish_many_async("deep", batch)
            connection.wait_for_confirms(timeout=1800)
        filled_s = time.perf_counter() - started
        plain, scraped = publish_rates(
            node, "deep", DEEP_BODY, count, "/metrics", DEEP_SCRAPES_PER_S, purge=False
        )
    return plain, scraped, filled_s


def met(figure: float, target: float) -> str:
    return f"target <= {target:,g}: {'met' if figure <= target else 'MISSED'}"


def queue_counts(argv: list[str]) -> list[int]:
    """The queue counts to measure: ``--queues=N[,N...]``, else 1,000 (100 with --quick)."""
    counts = [100 if "--quick" in argv else QUEUES]
    for option in argv:
        if option.startswith("--queues="):
            counts = [int(count) for count in option.removeprefix("--queues=").split(",")]
    return counts


def option(argv: list[str], name: str) -> str | None:
    """The value of ``--name=value`` on the command line, the last one given."""
    values = [a.removeprefix(f"--{name}=") for a in argv if a.startswith(f"--{name}=")]
    return values[-1] if values else None


def main(argv: list[str]) -> str:
    quick = "--quick" in argv
    count = PUBLISHES // (4 if quick else 1)
    depth = int(option(argv, "depth") or DEEP_DEPTH // (10 if quick else 1))
    parts = (option(argv, "only") or ",".join(PARTS)).split(",")
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        raise SystemExit(f"bench metrics: --only names {unknown}; the parts are {list(PARTS)}")
    open_files = raise_open_files_limit()
    root = scratch_directory("warren-bench-metrics-")
    runs, load, deep = [], None, None
    try:
        if "scrape" in parts:
            runs = [
                node_with_queues(os.path.join(root, f"queues-{queues}"), queues)
                for queues in queue_counts(argv)
            ]
        if "load" in parts:
            load = publish_rate_runs(os.path.join(root, "load"), count)
        if "deep" in parts:
            deep = deep_queue_runs(os.path.join(root, "deep"), depth, DEEP_PUBLISHES)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    ms = 1000
    rows = []
    for run in runs:
        queues = f"{run.queues:,} queues"
        for page in PAGES:
            typical = median(run.times[page]) * ms
            rows.append(
                Row(
                    f"GET {page}, {queues} (median)",
                    typical,
                    "ms",
                    note=(
                        met(typical, SCRAPE_TARGET_MS)
                        if run.queues == QUEUES and page == "/metrics"
                        else ""
                    ),
                )
            )
            rows.append(Row(f"GET {page}, {queues} (slowest)", max(run.times[page]) * ms, "ms"))
            if page == "/metrics":
                rows.append(
                    Row(
                        f"GET {page}, {queues}, first (every actor asked)",
                        run.first * ms,
                        "ms",
                    )
                )
        rows.append(Row(f"idle CPU, {queues}: the node's process", run.idle_node * 100, "% core"))
        rows.append(
            Row(
                f"idle CPU, {queues}: all its processes",
                run.idle_all * 100,
                "% core",
                note=f"declared in {run.declare_s:.0f} s",
            )
        )
        rows.append(
            Row(
                f"file descriptors of the node's process, {queues}",
                run.descriptors,
                "fds",
                note=f"limit {open_files}",
            )
        )
    if load is not None:
        plain, scraped = load
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
    if deep is not None:
        plain, scraped, filled_s = deep
        rows.append(
            Row(
                f"publish+confirm 100 B into a queue of {depth:,}, no scrapes",
                plain,
                "msgs/s",
                note=f"filled in {filled_s:.0f} s",
            )
        )
        rows.append(
            Row(
                f"publish+confirm 100 B into a queue of {depth:,}, "
                f"{DEEP_SCRAPES_PER_S} scrapes a second",
                scraped,
                "msgs/s",
                plain,
                DEEP_RATIO_TARGET,
                "baseline: the row above",
            )
        )
    per_run = f" ({count:,} publishes a run)" if load is not None else ""
    return render(f"node metrics: scrapes and their cost{per_run}", rows)

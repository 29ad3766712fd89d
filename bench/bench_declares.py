"""What declaring many queues costs: each declare on a node as the node's queue count
grows, and the definitions' writing alone up to ten thousand.

    python -m bench declares [--quick] [--queues=N] [--definitions=N]

- node: ``Node.declare_queue`` of N durable queues (1,000 unless ``--queues`` says
  otherwise; 200 with ``--quick``) on a fresh node, one after another, each answered once
  its queue process runs and its definition is on disk (fdatasync'd). The median declare
  of the first hundred is the baseline, and the last hundred's ratio to it says whether a
  declare costs more on a node holding more queues (it did: the last hundred of a
  thousand took four times the first, every definition written again at each declare);
  medians, as a loaded machine's pauses land on a few declares. Target: the thousand in
  <= 10 s.
- definitions: the same changes to ``Definitions`` alone (add, then save: a line appended
  and fdatasync'd, a compaction now and then), for M queues (10,000 unless
  ``--definitions`` says otherwise; 2,000 with ``--quick``): a node of ten thousand queues
  needs more memory than a test machine has (an idle queue process is 6.7 MiB PSS), and
  its processes cost the same per queue whatever their number. The first thousand is the
  baseline of the last thousand. Target: linear, the ratio <= 1.5.
"""

from __future__ import annotations

import os
import shutil
import time

from warren.queues.broker.definitions import Definitions
from warren.queues.protocol import QueueDefinition
from warren.supervisor import Node

from .bench_metrics import option
from .table import Row, median, render, scratch_directory

QUEUES = 1000
DEFINITIONS = 10_000
NODE_TARGET_S = 10.0
LINEAR_RATIO_TARGET = 1.5


def node_declares(data_dir: str, count: int) -> list[float]:
    """Seconds of each declare of ``count`` queues on a fresh node."""
    times = []
    with Node(data_dir) as node:
        for n in range(count):
            started = time.perf_counter()
            node.declare_queue(f"queue-{n:05d}")
            times.append(time.perf_counter() - started)
    return times


def definition_saves(directory: str, count: int) -> tuple[list[float], int]:
    """Seconds of each add-and-save of ``count`` queue definitions, and the bytes on disk
    after them."""
    os.makedirs(directory)
    definitions = Definitions(directory)
    times = []
    for n in range(count):
        started = time.perf_counter()
        definitions.add_queue(QueueDefinition(f"queue-{n:05d}"))
        definitions.save()
        times.append(time.perf_counter() - started)
    definitions.close()
    return times, sum(entry.stat().st_size for entry in os.scandir(directory))


def main(argv: list[str]) -> str:
    quick = "--quick" in argv
    queues = int(option(argv, "queues") or (200 if quick else QUEUES))
    count = int(option(argv, "definitions") or (2000 if quick else DEFINITIONS))
    root = scratch_directory("warren-bench-declares-")
    try:
        declares = node_declares(os.path.join(root, "node"), queues)
        saves, on_disk = definition_saves(os.path.join(root, "definitions"), count)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    hundred, thousand = min(100, queues), min(1000, count)
    total = sum(declares)
    growth = sum(saves[-thousand:]) / sum(saves[:thousand])
    ms = 1000
    rows = [
        Row(f"declare, node: the first {hundred} (median)", median(declares[:hundred]) * ms, "ms"),
        Row(
            f"declare, node: the last {hundred} of {queues:,} (median)",
            median(declares[-hundred:]) * ms,
            "ms",
            median(declares[:hundred]) * ms,
            note="baseline: the first ones",
        ),
        Row(
            f"declare, node: all {queues:,}",
            total,
            "s",
            note=(
                f"target <= {NODE_TARGET_S:g} s: {'met' if total <= NODE_TARGET_S else 'MISSED'}"
                if queues == QUEUES
                else ""
            ),
        ),
        Row(f"definitions saved: the first {thousand:,}", sum(saves[:thousand]), "s"),
        Row(
            f"definitions saved: the last {thousand:,} of {count:,}",
            sum(saves[-thousand:]),
            "s",
            sum(saves[:thousand]),
            note=(
                f"target ratio <= {LINEAR_RATIO_TARGET:g}: "
                f"{'met' if growth <= LINEAR_RATIO_TARGET else 'MISSED'}; "
                f"{on_disk / 2**20:.1f} MiB on disk at the end"
            ),
        ),
    ]
    return render(f"declaring queues ({queues:,} on a node, {count:,} definitions)", rows)

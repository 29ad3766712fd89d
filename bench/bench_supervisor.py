"""Restart latency: from SIGKILL of a supervised actor to its next incarnation ready.

    python -m bench supervisor [--quick]

The baseline, measured in the same run, is a plain spawn of the same actor to ready:
a restart cannot beat it, and the difference is what noticing the death and deciding
the restart cost.
"""

from __future__ import annotations

import os
import signal
import time

from warren.actors import Node as ActorNode
from warren.actors import ProcessActor
from warren.supervisor import ChildSpec, Supervisor, SupervisorFlags, SupervisorSpec

from .table import Row, median, percentile, render


class Idle(ProcessActor):
    pass


def main(argv: list[str]) -> str:
    rounds = 20 if "--quick" in argv else 100
    with ActorNode("bench-supervisor", preload=("bench.bench_supervisor",)) as node:
        spawns = []
        for n in range(rounds):
            started = time.perf_counter()
            ref = node.spawn(Idle, name=f"idle-{n}")
            spawns.append(time.perf_counter() - started)
            node.stop(ref)
        spec = SupervisorSpec(
            "bench",
            SupervisorFlags("one_for_one", intensity=rounds + 1, period_s=3600),
            children=(ChildSpec("victim", Idle),),
        )
        restarts = []
        with Supervisor(node, spec) as supervisor:
            for _ in range(rounds):
                before = supervisor.which_children()[0]["pid"]
                started = time.perf_counter()
                os.kill(before, signal.SIGKILL)
                while True:
                    row = supervisor.which_children()[0]
                    if row["pid"] != before and row["state"] == "running":
                        break
                    time.sleep(0.0002)
                restarts.append(time.perf_counter() - started)
    ms = 1000
    rows = [
        Row(
            "restart, SIGKILL to ready (median)",
            median(restarts) * ms,
            "ms",
            median(spawns) * ms,
            note="baseline: spawn to ready, median",
        ),
        Row(
            "restart, SIGKILL to ready (p99)",
            percentile(restarts, 99) * ms,
            "ms",
            percentile(spawns, 99) * ms,
            note="baseline: spawn to ready, p99",
        ),
    ]
    return render(f"supervisor restart latency ({rounds} rounds)", rows)

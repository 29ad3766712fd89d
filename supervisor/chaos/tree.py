"""``run_tree``: an application's own supervision tree on a node under a seeded schedule of
faults, then the application's check on the stopped node's files, and the report.

This is the library face of the chaos harness for applications built on Warren (the
``warren_chaos`` pytest fixture calls it); ``warren chaos`` runs Warren's own workload
instead (``broker_run``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable

from . import faults as chaos
from .report import report_document, write_report
from .run import NODE_LOG, NodeUnderTest, check_data_dir, harness_signals, run_faults

__all__ = ["run_tree"]


def run_tree(
    data_dir: str | os.PathLike,
    children: str,
    *,
    kinds: tuple[str, ...] | list[str],
    duration_s: float,
    seed: int,
    patterns: tuple[str, ...],
    check: Callable[[str], list[str] | None],
    every_s: tuple[float, float] = (1.0, 3.0),
    limits: dict[str, tuple[int, float]] | None = None,
    sample: Callable[[str], dict[str, int]] | None = None,
    node_options: tuple[str, ...] = (),
    report_dir: str | os.PathLike | None = None,
    expect: Iterable[str] | None = None,
) -> dict:
    """An application's tree (``children``: ``"module:function"``, the function taking
    the data directory and returning its ChildSpecs and SupervisorSpecs) on a node under
    a seeded schedule, then ``check(data_dir)`` on the stopped node's files: the problems
    it finds (a list of lines, or an AssertionError's message). The report document
    (``warren.supervisor.chaos.report``): ``ok`` only when the check found nothing, every
    fault's recovery ended and the node was healthy at the end, with every actor named
    in ``expect`` (by default, every one it started with). ValueError, before anything
    starts, for a bad kind, duration or interval or a data directory that is not a node's
    (``check_data_dir``), and, before the first fault, for a pattern that matches none of
    the node's processes."""
    faults = chaos.schedule(
        seed,
        duration_s,
        kinds,
        patterns=patterns,
        every_s=every_s,
        limits=limits or {p: (2, 60.0) for p in patterns},
    )
    data_dir = check_data_dir(data_dir)
    node = NodeUnderTest(
        data_dir,
        options=("--children", children, *node_options),
        log_path=os.path.join(data_dir, NODE_LOG),
    )
    with harness_signals():
        try:
            node.start()
            node.expect(node.actor_pids() if expect is None else expect)
            processes = node.processes()
            for pattern in patterns:
                if not chaos.matching(processes, pattern):
                    names = sorted(chaos.actor_name(p) for p in chaos.matching(processes, "*"))
                    raise ValueError(
                        f"the pattern {pattern!r} matches no process of the "
                        f"node; its processes are {', '.join(names)}"
                    )
            result = run_faults(
                node,
                faults,
                duration_s,
                seed=seed,
                sample=None if sample is None else lambda: sample(data_dir),
            )
            result.healthy_at_end = node.healthy()
            result.restarts, result.node_starts = node.restarts(), node.starts
        finally:
            node.close()
    try:
        found = list(check(data_dir) or ())
    except AssertionError as exc:
        found = [str(exc) or "the check failed"]
    document = report_document(result, {"invariant_failures": found}, not found)
    if report_dir is not None:
        document = write_report(report_dir, document)
    return document

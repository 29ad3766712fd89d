"""The report of a crash-recovery run: a table for a person, JSON for CI, a plot.

``report_document(result, invariants, ok)`` joins what the harness saw (its faults,
restarts, recovery times, samples: ``ChaosResult``) with what the workload's or the
user's check found (``invariants``: counts such as ``confirmed``, ``consumed``, ``lost``,
``duplicates``, ``wrong_bodies``, and lists of the ids behind them). The document's top
level always has ``faults`` (how many landed), ``faults_by_kind``, ``restarts``,
``recovery_p50_s``, ``recovery_max_s``, ``healthy``, ``ok``, ``seed`` and the events, so a
CI step reads one file whatever the workload.

``format_report`` prints it in 80 columns, ending in the verdict: ``PASSED``, or
``FAILED`` and each promise broken, in words, with how often (``broken_promises``); the
ids and the evidence behind each are listed above it. ``write_report(directory, ...)``
writes ``report.json``, ``report.txt`` and ``throughput.png`` (confirmed and consumed
messages a second over the run, each fault a labelled vertical line), the plot only when
matplotlib is installed (``pip install 'warren-mq[plot]'``); without it the report says
so.
"""

from __future__ import annotations

import json
import os
import statistics
from typing import Any

from ..tables import Column, format_table
from .result import SAMPLE_EVERY_S, ChaosResult

__all__ = ["format_report", "report_document", "write_report"]

LISTED_IDS = 20  # ids of lost or unflagged messages shown on the terminal
PLOT_WINDOWS = 200  # a run's plot shows rates over this many windows at most
LABELLED_FAULTS = 30  # more faults than this are told apart by colour alone
# What each failing figure says was broken, for the verdict's line: the promise, in words.
BROKEN_PROMISES = {
    "lost": "{n} confirmed messages lost (a confirmed message is consumed from every queue "
    "it was routed to, or read from the stream)",
    "unflagged_duplicates": "{n} messages delivered twice without the redelivered flag",
    "misrouted": "{n} messages consumed from a queue they were not routed to",
    "counts_backwards": "{n} messages of a quorum queue delivered again with a lower "
    "delivery count than before",
    "wrong_bodies": "{n} bodies read with bytes their message never had",
    "offset_conflicts": "{n} stream offsets read with two different messages",
    "out_of_order": "{n} stream offsets read out of order within one attach",
    "stream_duplicates": "{n} stream messages held at two offsets though deduplicated",
    "unexplained_corrupt": "{n} stream chunks refused as damaged where no damage landed",
    "deposed_confirms": "{n} times a deposed leader committed after a newer one led "
    "(the epoch fence failed)",
    "leaders_outside_isr": "{n} times a node led while out of the ISR",
    "replica_mismatches": "{n} differences between the in-sync copies of the stream",
    "invariant_failures": "the application's check failed ({n} findings, above)",
    "problems": "{n} problems of the run (each named above: a victim not replaced, a "
    "node that exited or stayed down, a disk alarm that never went off)",
}
FAULT_COLOURS = {
    "kill": "red",
    "stop": "orange",
    "node": "black",
    "torn": "purple",
    "flip": "magenta",
    "full": "teal",
    "slow": "olive",
}


def report_document(result: ChaosResult, invariants: dict[str, Any], ok: bool) -> dict:
    recoveries = result.recovery_times()
    return {
        "ok": ok and result.healthy_at_end and not result.problems,
        "seed": result.seed,
        "duration_s": result.duration_s,
        "faults": sum(result.faults_by_kind().values()),
        "faults_by_kind": result.faults_by_kind(),
        "faults_missed": sum(1 for e in result.events if not e.landed),
        **invariants,
        "restarts": result.restarts,
        "node_starts": result.node_starts,
        "recovery_p50_s": round(statistics.median(recoveries), 3) if recoveries else None,
        "recovery_max_s": max(recoveries) if recoveries else None,
        "healthy": result.healthy_at_end,
        "problems": result.problems,
        "events": result.as_dict()["events"],
        "samples": result.as_dict()["samples"],
    }


def _figure(value: Any) -> str:
    if isinstance(value, list):
        return f"{len(value):,}"
    if isinstance(value, float):
        return f"{value:.2f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return "-" if value is None else str(value)


def format_report(document: dict) -> str:
    """The run in a table of faults and a table of outcomes, then the verdict."""
    events = [
        [
            f"{e['at_s']:.2f}",
            e["kind"],
            e["target"],
            "yes" if e["landed"] else "no",
            "-" if e["recovery_s"] is None else f"{e['recovery_s']:.2f}",
            e["detail"],
        ]
        for e in document["events"]
    ]
    lines = [
        format_table(
            (
                Column("at s", ">"),
                Column("fault"),
                Column("target", wrap=True, min_width=14),
                Column("landed"),
                Column("recovery s", ">"),
                Column("detail", wrap=True),
            ),
            events,
        )
        if events
        else "no fault landed"
    ]
    by_kind = ", ".join(f"{k} {n}" for k, n in sorted(document["faults_by_kind"].items()))
    rows = [
        [
            "faults",
            f"{document['faults']} ({by_kind or 'none'}), {document['faults_missed']} missed",
        ],
        [
            "restarts",
            f"{document['restarts']} by supervisors, {document['node_starts']} node starts",
        ],
        [
            "recovery p50 / max",
            f"{_figure(document['recovery_p50_s'])} s / {_figure(document['recovery_max_s'])} s",
        ],
    ]
    skip = {
        "ok",
        "seed",
        "duration_s",
        "faults",
        "faults_by_kind",
        "faults_missed",
        "restarts",
        "node_starts",
        "recovery_p50_s",
        "recovery_max_s",
        "healthy",
        "problems",
        "events",
        "samples",
        "plot",
    }
    rows += [
        [key.replace("_", " "), _figure(value)]
        for key, value in document.items()
        if key not in skip and not key.endswith("_ids")
    ]
    rows.append(["node healthy at the end", "yes" if document["healthy"] else "NO"])
    lines += ["", format_table((Column("outcome"), Column("", wrap=True)), rows)]
    # A list (of ids, of failures) is counted in the table and its first items follow it.
    for key, value in document.items():
        if key not in skip and isinstance(value, list) and value:
            shown = ", ".join(value[:LISTED_IDS])
            more = f" and {len(value) - LISTED_IDS} more" if len(value) > LISTED_IDS else ""
            lines.append(f"{key.replace('_', ' ')}: {shown}{more}")
    lines += [f"problem: {p}" for p in document["problems"]]
    if "plot" in document:
        lines.append(f"plot: {document['plot']}")
    verdict = f"seed {document['seed']}, {document['duration_s']:g} s"
    if document["ok"]:
        lines.append(f"PASSED: {verdict}")
    else:
        lines.append(f"FAILED: {verdict}: {'; '.join(broken_promises(document))}")
    return "\n".join(lines)


def broken_promises(document: dict) -> list[str]:
    """What a failed run's document says was broken, each with how often (the ids and
    the evidence are listed above the verdict)."""
    broken = []
    for key, promise in BROKEN_PROMISES.items():
        value = document.get(key)
        count = len(value) if isinstance(value, list) else value
        if count:
            broken.append(promise.format(n=count))
    if not document["healthy"]:
        broken.append("the node was not healthy at the end (an actor not running, or missing)")
    return broken or ["an invariant failed (above)"]


def write_report(directory: str | os.PathLike, document: dict) -> dict:
    """report.json, report.txt and throughput.png in ``directory``; the document, with
    where the plot went (or why there is none) under ``plot``."""
    directory = os.fspath(directory)
    os.makedirs(directory, exist_ok=True)
    document = {**document, "plot": _plot(document, os.path.join(directory, "throughput.png"))}
    with open(os.path.join(directory, "report.json"), "w", encoding="utf-8") as file:
        json.dump(document, file, indent=2)
    with open(os.path.join(directory, "report.txt"), "w", encoding="utf-8") as file:
        file.write(format_report(document) + "\n")
    return document


def _plot(document: dict, path: str) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as pyplot
    except ImportError:
        return "none: matplotlib is not installed (pip install 'warren-mq[plot]')"
    samples = document["samples"]
    figure, axes = pyplot.subplots(figsize=(11, 4.5), dpi=100)
    # Rates over windows of a 200th of the run (at least a sample's interval): a long
    # run's line stays readable.
    window = max(document["duration_s"] / PLOT_WINDOWS, SAMPLE_EVERY_S)
    for series, colour in (("confirmed", "tab:blue"), ("consumed", "tab:green")):
        points = [(t, counts[series]) for t, counts in samples if series in counts]
        kept = points[:1]
        for point in points[1:]:
            if point[0] - kept[-1][0] >= window:
                kept.append(point)
        rates = [
            (t1, (n1 - n0) / (t1 - t0))
            for (t0, n0), (t1, n1) in zip(kept, kept[1:], strict=False)
            if t1 > t0
        ]
        if rates:
            axes.plot(*zip(*rates, strict=True), label=f"{series} / s", color=colour, linewidth=1.2)
    landed = [e for e in document["events"] if e["landed"]]
    for event in landed:
        colour = FAULT_COLOURS.get(event["kind"], "black")
        axes.axvline(event["at_s"], color=colour, linestyle="--", linewidth=0.8)
        if len(landed) <= LABELLED_FAULTS:
            axes.text(
                event["at_s"],
                0.98,
                f" {event['kind']}",
                rotation=90,
                va="top",
                fontsize=7,
                color=colour,
                transform=axes.get_xaxis_transform(),
            )
    for kind in sorted({e["kind"] for e in landed}):  # a legend entry per fault kind
        axes.plot(
            [],
            [],
            color=FAULT_COLOURS.get(kind, "black"),
            linestyle="--",
            linewidth=0.8,
            label=kind,
        )
    axes.set_xlabel("seconds from the start")
    if any(str(line.get_label()).endswith(" / s") for line in axes.get_lines()):
        axes.set_ylabel("messages per second")
    else:
        axes.set_ylabel("(no throughput sampled)")
        axes.set_yticks([])
    axes.set_title(
        f"{'passed' if document['ok'] else 'FAILED'}: seed {document['seed']}, "
        f"{document['faults']} faults, {document['restarts']} restarts"
    )
    axes.set_xlim(0, max(document["duration_s"], samples[-1][0] if samples else 0))
    axes.set_ylim(bottom=0)
    if axes.get_legend_handles_labels()[0]:
        axes.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    figure.savefig(path, bbox_inches="tight")
    pyplot.close(figure)
    return path

"""The table every benchmark prints: figures and their ratio to a baseline, in the same
format as the ``warren`` command's tables (``warren.supervisor.tables``).

A benchmark measures a baseline (raw file appends, raw pyzmq ...) in the same run as the
thing under test and reports ``Row``s; ratios compare figures taken minutes apart on the
same machine, never across runs (this machine's absolute figures vary several-fold).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from dataclasses import dataclass

from warren.supervisor.tables import Column, format_table

QUICK_SCALE = 8  # how many times smaller --quick makes the volumes


def scale_of(argv: list[str]) -> tuple[int, str]:
    """How much to divide the volumes by, and the word the title says it with."""
    return (QUICK_SCALE, "quick") if "--quick" in argv else (1, "full")


def scratch_directory(prefix: str = "warren-bench-") -> str:
    """A new directory for a benchmark's files, under ``$WARREN_BENCH_DIR`` when it is
    set (another disk, or room the default temp directory lacks); the caller removes it."""
    return tempfile.mkdtemp(prefix=prefix, dir=os.environ.get("WARREN_BENCH_DIR"))


@dataclass(frozen=True)
class Row:
    """One line of a benchmark table."""

    name: str
    figure: float
    unit: str
    baseline: float | None = None
    target: float | None = None
    note: str = ""

    @property
    def ratio(self) -> float | None:
        if not self.baseline:
            return None
        return self.figure / self.baseline


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


COLUMNS = (
    Column("what", wrap=True, min_width=20),
    Column("figure", ">"),
    Column("baseline", ">"),
    Column("ratio", ">"),
    Column("target", ">"),
    Column("note", wrap=True, min_width=16),
)


def render(title: str, rows: list[Row]) -> str:
    """Return the table as aligned text that fits 80 columns, under its title."""
    cells = [
        [
            r.name,
            f"{_fmt(r.figure)} {r.unit}",
            _fmt(r.baseline),
            _fmt(r.ratio),
            "" if r.target is None else f">= {r.target}",
            (
                "MISSED "
                if r.target is not None and r.ratio is not None and r.ratio < r.target
                else ""
            )
            + r.note,
        ]
        for r in rows
    ]
    return f"{title}\n\n{format_table(COLUMNS, cells)}"


def best_of_alternating(baseline, subject, runs: int = 3) -> tuple[float, float]:
    """Run two timed functions (each returns seconds) alternately ``runs`` times and keep
    each one's fastest run: on a shared machine the fastest run is the least disturbed."""
    baseline_times, subject_times = [], []
    for _ in range(runs):
        baseline_times.append(baseline())
        subject_times.append(subject())
    return min(baseline_times), min(subject_times)


def percentile(samples: list[float], pct: float) -> float:
    ordered = sorted(samples)
    if not ordered:
        return float("nan")
    k = min(len(ordered) - 1, max(0, round(pct / 100 * (len(ordered) - 1))))
    return ordered[k]


def median(samples: list[float]) -> float:
    return statistics.median(samples) if samples else float("nan")


class Stopwatch:
    """``with Stopwatch() as sw: ...`` then ``sw.seconds``."""

    def __enter__(self) -> Stopwatch:
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = time.perf_counter() - self._start

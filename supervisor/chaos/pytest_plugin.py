"""The ``warren_chaos`` pytest fixture: an application's supervision tree on a node under
a seeded fault schedule, then the application's own invariant check.

Installing Warren registers this plugin with pytest (the ``pytest11`` entry point), so a
test needs no import to use the fixture::

    def test_the_ledger_never_loses_a_deposit(warren_chaos):
        report = warren_chaos.run("myapp.tree:children", check=myapp.check,
                                  kinds=("kill", "stop", "node"),
                                  patterns=("ledger", "teller"), duration_s=10, seed=7)
        assert report["ok"], warren_chaos.text(report)

``run`` takes what ``warren.supervisor.chaos.tree.run_tree`` takes, with the data
directory in the test's ``tmp_path`` and the report (``report.json``, ``report.txt``,
``throughput.png``) beside it; ``--warren-chaos-seed N`` on pytest's command line
replaces every run's seed, to repeat a failed run fault for fault. The node and every
process it started are stopped when ``run`` returns, fails or is interrupted; the
fixture's teardown checks that none is left.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from .faults import is_alive, kill_processes
from .report import format_report
from .tree import run_tree

SEED_OPTION = "--warren-chaos-seed"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("warren").addoption(
        SEED_OPTION,
        type=int,
        default=None,
        metavar="N",
        help="the seed of every warren_chaos run (repeat a failed one)",
    )


class ChaosFixture:
    """What ``warren_chaos`` gives a test."""

    def __init__(self, directory: str, seed: int | None) -> None:
        self.directory = directory
        self.forced_seed = seed
        self.runs = 0

    def run(
        self,
        children: str,
        *,
        check: Callable[[str], list[str] | None],
        kinds: tuple[str, ...] | list[str] = ("kill", "node"),
        patterns: tuple[str, ...] = ("*",),
        duration_s: float = 10.0,
        seed: int = 0,
        **options: Any,
    ) -> dict:
        """Run ``children`` under faults and ``check`` it; the report document."""
        self.runs += 1
        run_dir = os.path.join(self.directory, f"chaos-{self.runs}")
        os.makedirs(run_dir, exist_ok=True)
        return run_tree(
            os.path.join(run_dir, "data"),
            children,
            check=check,
            kinds=kinds,
            patterns=patterns,
            duration_s=duration_s,
            seed=seed if self.forced_seed is None else self.forced_seed,
            report_dir=os.path.join(run_dir, "report"),
            **options,
        )

    @staticmethod
    def text(report: dict) -> str:
        """The report as the terminal shows it (for an assertion's message)."""
        return format_report(report)


@pytest.fixture
def warren_chaos(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ChaosFixture]:
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    yield ChaosFixture(str(tmp_path), request.config.getoption(SEED_OPTION))
    left = [
        p for p in psutil.Process().children(recursive=True) if p.pid not in before and is_alive(p)
    ]
    if left:
        kill_processes(left)
        pytest.fail(f"processes of a chaos run outlived it: {[p.pid for p in left]}")

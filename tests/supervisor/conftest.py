"""Fixtures for the supervision tests: an actor node per test, and node processes, each
stopped at the end even when the test fails."""

import contextlib
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from warren.actors import Node

PRELOAD = ("tests.supervisor.sample_actors",)
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def actor_node() -> Iterator[Node]:
    with Node("supervision-test", preload=PRELOAD) as node:
        yield node


NodeProcess = tuple[subprocess.Popen, list[int]]


@pytest.fixture
def node_process(tmp_path: Path) -> Iterator[Callable[..., NodeProcess]]:
    """Start ``tests.supervisor.node_child`` (its arguments given) in a session of its
    own; get the process and the pids of every process of its node, the node's first.
    What is left of them at the end of the test is killed; the program's stderr is in
    ``process.stderr_path``."""
    started: list[tuple[subprocess.Popen, list[psutil.Process]]] = []

    def start(*arguments: str) -> NodeProcess:
        stderr_path = tmp_path / f"node_child-{len(started)}.stderr"
        with open(stderr_path, "w") as stderr:
            process = subprocess.Popen(
                [sys.executable, "-m", "tests.supervisor.node_child", *arguments],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                start_new_session=True,
            )
        process.stderr_path = stderr_path
        family: list[psutil.Process] = []
        started.append((process, family))
        line = process.stdout.readline()
        assert line, f"the node did not start: {stderr_path.read_text()}"
        pids = [int(pid) for pid in line.split()]
        for pid in pids:
            with contextlib.suppress(psutil.NoSuchProcess):  # ended already: nothing to stop
                family.append(psutil.Process(pid))
        return process, pids

    yield start
    for process, family in started:
        for member in family:
            try:
                member.send_signal(signal.SIGKILL)  # psutil refuses a recycled pid
            except psutil.NoSuchProcess:
                pass
        process.wait()
        process.stdout.close()

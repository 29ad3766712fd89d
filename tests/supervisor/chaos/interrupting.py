"""A ``warren chaos`` run interrupted by a signal, as a terminal's Ctrl-C, systemd's stop
or a closed terminal does it: the run must end with exit 130 and leave none of the
processes it started behind."""

import os
import subprocess
import sys
from pathlib import Path

import psutil

from warren.supervisor.chaos.faults import is_alive, kill_processes, node_processes

from ...waiting import wait_for

ROOT = Path(__file__).resolve().parents[3]
WARREN = [sys.executable, "-m", "warren.supervisor.cli"]


def interrupt_run(
    options: list[str],
    signum: int,
    *,
    to_group: bool,
    running_at_least: int,
    start_timeout_s: float = 60,
    stop_timeout_s: float = 90,
) -> None:
    """Start ``warren chaos`` with ``options``; once at least ``running_at_least`` of its
    processes run, send it ``signum`` (to its whole process group with ``to_group``);
    assert it says it was interrupted, exits 130 and leaves no process behind."""
    harness = subprocess.Popen(
        [*WARREN, "chaos", *options],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    family: list[psutil.Process] = []
    try:
        wait_for(
            lambda: len(node_processes(harness.pid)) >= running_at_least,
            timeout=start_timeout_s,
        )
        family = node_processes(harness.pid)
        if to_group:
            os.killpg(harness.pid, signum)
        else:
            harness.send_signal(signum)
        out, err = harness.communicate(timeout=stop_timeout_s)
        assert harness.returncode == 130, out[-2000:] + err[-2000:]
        assert "interrupted" in err
        wait_for(lambda: not [p for p in family if is_alive(p)], timeout=30)
    finally:
        if harness.poll() is None:
            harness.kill()
            harness.communicate()
        kill_processes([p for p in family if is_alive(p)])

"""Timing producer processes that start together: each prints a line once it is ready,
waits for a line on stdin, does its work, and prints ``done``."""

from __future__ import annotations

import subprocess
import time


def time_together(processes: list[subprocess.Popen]) -> float:
    """Seconds from telling every ready process to go until the last one is done."""
    for process in processes:
        process.stdout.readline()
    started = time.perf_counter()
    for process in processes:
        process.stdin.write("go\n")
        process.stdin.flush()
    for process in processes:
        if process.stdout.readline().strip() != "done":
            raise RuntimeError("a producer process failed (its stderr says why)")
    return time.perf_counter() - started

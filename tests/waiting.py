"""Waiting for an outcome in another process, with a generous deadline."""

import os
import time
from collections.abc import Callable


def wait_for(condition: Callable[[], object], timeout: float = 20.0) -> None:
    """Wait until ``condition()`` is true, or fail the test."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{condition} did not become true within {timeout} s")
        time.sleep(0.01)


def all_threads_asleep(pid: int) -> bool:
    """Whether every thread of process ``pid`` sleeps (interruptibly: waiting on a socket,
    a lock or a timer): none runs, waits to run or waits on the disk, so whatever it
    sent before it blocked has left it (a ZeroMQ I/O thread that still has a message
    to pass on to the kernel is not asleep)."""
    states = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/stat") as stat:
                states.append(stat.read().rsplit(")", 1)[1].split()[0])
        except FileNotFoundError:  # a thread that just ended
            continue
    return all(state == "S" for state in states)


def group_alive(group: int) -> bool:
    """Whether process group ``group`` still has a process (a zombie counts)."""
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True

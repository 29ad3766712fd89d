"""Waiting for an outcome in another process, with a generous deadline, and telling
where such a process stands (its threads asleep, its group alive, a forkserver's spare
child ready)."""

import contextlib
import os
import time
from collections.abc import Callable

import psutil

from warren.actors.process import SPARE_TITLE, group_alive  # noqa: F401 (the tests import it from here)


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


def descendant_titled(title: str) -> psutil.Process | None:
    """This process's descendant whose title is ``title``, if one lives (a zombie left by
    an earlier test, or a process gone as they are listed, reads no title: skipped)."""
    for process in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if process.cmdline()[:1] == [title]:
                return process
    return None


def spare_children(forkserver_pid: int) -> list[psutil.Process]:
    """The children of forkserver ``forkserver_pid`` that wait for an order, forked ahead
    of the next spawn (a child that exits, or becomes an actor, as they are listed is not
    one)."""
    spares = []
    for child in psutil.Process(forkserver_pid).children():
        with contextlib.suppress(psutil.Error):
            if child.cmdline()[:1] == [SPARE_TITLE]:
                spares.append(child)
    return spares


def the_spare(forkserver_pid: int) -> psutil.Process:
    """The one spare child of forkserver ``forkserver_pid``, once it is there alone."""
    found: list[psutil.Process] = []

    def one_spare() -> bool:
        found[:] = spare_children(forkserver_pid)
        return len(found) == 1

    wait_for(one_spare)
    return found[0]

"""Small process-level helpers that the runtime and the parts above it share.

``die_with_parent`` ties a forked process's life to its parent's (Linux's
``PR_SET_PDEATHSIG``): the forkserver's children and the chaos harness's watchdog use it so
that a SIGKILLed parent never leaves an orphan running. The race it guards against is the
parent dying between the fork and the ``prctl`` call; the returned flag tells the caller to
exit at once in that case.

``process_exists`` says whether a pid names a running process: a process that ended but
is not reaped yet (a zombie) does not run, and another user's process does.

``SPARE_TITLE`` is the process title of the forkserver's spare child, forked ahead of the
next spawn and no actor until its order comes: what lists a node's actors by their titles
(the chaos harness) passes over it.

``LIBC`` is the C library's handle, made once at import: the forkserver imports this module
before it forks, so no actor pays for a ``dlopen`` of its own (a tenth of a millisecond
and some forty pages copied on write, in every spare child, at each spawn).

``drain_wake_pipe`` empties the self-pipe a thread writes to when it queues work for a loop
that polls sockets (an actor's loop, the listener's gateway): the bytes carry no meaning, only
"look at the queue", so they are read and dropped until the pipe is empty.
"""

import ctypes
import os
import signal
import sys

__all__ = [
    "LIBC",
    "SPARE_TITLE",
    "die_with_parent",
    "drain_wake_pipe",
    "group_alive",
    "process_exists",
]

SPARE_TITLE = "warren: spare"  # a spare child's title until its order makes it an actor

_PR_SET_PDEATHSIG = 1  # prctl option: the signal a process receives when its parent exits

LIBC = ctypes.CDLL(None, use_errno=True)


def die_with_parent(expected_parent: int) -> bool:
    """Ask for SIGKILL when the parent exits; False if it is already gone."""
    if sys.platform.startswith("linux"):
        LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    return os.getppid() == expected_parent


def drain_wake_pipe(fd: int) -> None:
    """Empty a non-blocking wake-up pipe: it only says "look at the queue"."""
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass  # drained


def group_alive(group: int) -> bool:
    """Whether process group ``group`` still has a process (a zombie counts)."""
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


def process_exists(pid: int) -> bool:
    """Whether process ``pid`` runs; a zombie does not (see the module docstring)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat_file:
            stat = stat_file.read()
    except FileNotFoundError:
        return not os.path.isdir("/proc/self") and _signalable(pid)
    except OSError:
        return _signalable(pid)
    # "pid (command) state ...": the command may hold spaces and parentheses
    return stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3] != b"Z"


def _signalable(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

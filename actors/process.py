"""Small process-level helpers that the runtime and the parts above it share.

``die_with_parent`` ties a forked process's life to its parent's (Linux's
``PR_SET_PDEATHSIG``): the forkserver's children and the chaos harness's watchdog use it so
that a SIGKILLed parent never leaves an orphan running. The race it guards against is the
parent dying between the fork and the ``prctl`` call; the returned flag tells the caller to
exit at once in that case.

``drain_wake_pipe`` empties the self-pipe a thread writes to when it queues work for a loop
that polls sockets (an actor's loop, the listener's gateway): the bytes carry no meaning, only
"look at the queue", so they are read and dropped until the pipe is empty.
"""

import ctypes
import os
import signal
import sys

__all__ = ["die_with_parent", "drain_wake_pipe"]

_PR_SET_PDEATHSIG = 1  # prctl option: the signal a process receives when its parent exits


def die_with_parent(expected_parent: int) -> bool:
    """Ask for SIGKILL when the parent exits; False if it is already gone."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    return os.getppid() == expected_parent


def drain_wake_pipe(fd: int) -> None:
    """Empty a non-blocking wake-up pipe: it only says "look at the queue"."""
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass  # drained

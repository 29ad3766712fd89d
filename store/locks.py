"""The exclusive lock of a directory that one process at a time may write: a store's, a
queue's, a stream's (``flock`` on its lock file, held for as long as that process has the
directory open, and let go by the kernel however the process ends).

The race it guards against: a holder may be the dying incarnation of the same actor. When
a whole node is SIGKILLed, its actors die of ``PR_SET_PDEATHSIG`` a moment after the
node's own processes, so a node started again at once (a supervisor, systemd's restart, a
test) can find a lock still held for some milliseconds. ``lock_exclusive`` therefore
retries a held lock for ``LOCK_HOLDER_EXIT_S`` before the caller says that the directory is
open elsewhere: a live holder never lets go, and is then refused as before.
"""

import fcntl
import time

__all__ = ["LOCK_HOLDER_EXIT_S", "lock_exclusive"]

LOCK_HOLDER_EXIT_S = 5.0
_LOCK_RETRY_S = 0.02


def lock_exclusive(fd: int, wait_s: float | None = None) -> bool:
    """Take an exclusive ``flock`` on ``fd``; False if another open file description held
    it all of ``wait_s`` (``LOCK_HOLDER_EXIT_S`` by default)."""
    deadline = time.monotonic() + (LOCK_HOLDER_EXIT_S if wait_s is None else wait_s)
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(_LOCK_RETRY_S)

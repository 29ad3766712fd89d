"""Suite-wide guards: every test stops every process it starts.

The check runs after each test: any descendant of the test process that appeared during
the test and is still alive a few seconds later fails the test, and is killed so that one
leak does not cascade into the tests after it. The test process is made a child
subreaper, so a process orphaned by a killed parent (a forkserver whose node died, say)
is re-parented to it instead of to init, and stays in view of the check.
"""

import ctypes
import time

import psutil
import pytest

GRACE_SECONDS = 5.0
PR_SET_CHILD_SUBREAPER = 36


def pytest_configure(config) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


def _children() -> dict[int, psutil.Process]:
    return {p.pid: p for p in psutil.Process().children(recursive=True)}


@pytest.fixture(autouse=True)
def no_process_survives_the_test():
    before = set(_children())
    yield
    deadline = time.monotonic() + GRACE_SECONDS
    survivors = []
    while time.monotonic() < deadline:
        survivors = [p for pid, p in _children().items()
                     if pid not in before and p.is_running()
                     and p.status() != psutil.STATUS_ZOMBIE]
        if not survivors:
            return
        time.sleep(0.05)
    described = [f"{p.pid} {' '.join(p.cmdline())[:80]}" for p in survivors]
    for p in survivors:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(survivors, timeout=GRACE_SECONDS)
    pytest.fail(f"processes outlived the test: {described}")

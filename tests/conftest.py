"""Suite-wide guards: every test stops every process it starts.

The check runs after each test: any child of the test process that appeared during the
test and is still alive a few seconds later fails the test, and is killed so that one
leak does not cascade into the tests after it.
"""

import time

import psutil
import pytest

GRACE_SECONDS = 5.0


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

"""Suite-wide guards: every test stops every process it starts.

The check runs after each test: any descendant of the test process that appeared during
the test, and any Warren process (titled ``warren: ...``) that appeared during it even if
orphaned since (a forkserver whose node was killed is re-parented away from us), still
alive a few seconds later fails the test, and is killed so that one leak does not
cascade into the tests after it.
"""

import time

import psutil
import pytest

GRACE_SECONDS = 5.0


def _watched() -> dict[int, psutil.Process]:
    found = {p.pid: p for p in psutil.Process().children(recursive=True)}
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"] or []
        if cmdline and cmdline[0].startswith("warren: "):
            found.setdefault(process.pid, process)
    return found


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture(autouse=True)
def no_process_survives_the_test():
    before = set(_watched())
    yield
    deadline = time.monotonic() + GRACE_SECONDS
    survivors = []
    while time.monotonic() < deadline:
        survivors = [p for pid, p in _watched().items() if pid not in before and _alive(p)]
        if not survivors:
            return
        time.sleep(0.05)
    described = []
    for p in survivors:
        try:
            described.append(f"{p.pid} {' '.join(p.cmdline())[:80]}")
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(survivors, timeout=GRACE_SECONDS)
    pytest.fail(f"processes outlived the test: {described}")

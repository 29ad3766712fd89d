"""Suite-wide guards: every test stops every process it starts.

The check runs after each test: any descendant of the test process that appeared during
the test (but not one a process already running before it started: a module fixture's
Spark JVM forks its Python workers as it needs them, and the fixture stops them all), and
any Warren process (titled ``warren: ...``) of this test run that appeared during it even
if orphaned since (a forkserver whose node was killed is re-parented away from us), still
alive a few seconds later fails the test, and is killed so that one leak does not cascade
into the tests after it. "Of this test run": its environment carries this run's
``RUN_MARKER`` (every process the suite starts inherits it), so the Warren
processes of other programs and other test runs on the machine are never judged or killed.
"""

import os
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import psutil
import pytest

GRACE_SECONDS = 5.0
RUN_MARKER = "WARREN_TEST_RUN"
os.environ[RUN_MARKER] = uuid.uuid4().hex


def _ours(process: psutil.Process) -> bool:
    try:
        return process.environ().get(RUN_MARKER) == os.environ[RUN_MARKER]
    except psutil.Error:
        return False  # gone, or not ours to read


def _watched() -> dict[int, psutil.Process]:
    found = {p.pid: p for p in psutil.Process().children(recursive=True)}
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"] or []
        if (
            cmdline
            and cmdline[0].startswith("warren: ")
            and process.pid not in found
            and _ours(process)
        ):
            found[process.pid] = process
    return found


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _started_by_a_fixture(process: psutil.Process, before: set[int]) -> bool:
    """Whether ``process`` descends from a process that was running before the test (not
    this one): a longer-lived fixture's (a Spark JVM's Python workers), which stops it."""
    try:
        ancestors = process.parents()
    except psutil.Error:
        return False
    me = os.getpid()
    return any(a.pid in before and a.pid != me for a in ancestors)


@pytest.fixture(autouse=True)
def no_process_survives_the_test():
    before = set(_watched())
    yield
    deadline = time.monotonic() + GRACE_SECONDS
    survivors = []
    while time.monotonic() < deadline:
        survivors = [
            p
            for pid, p in _watched().items()
            if pid not in before and _alive(p) and not _started_by_a_fixture(p, before)
        ]
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


@pytest.fixture
def short_tmp_path():
    """A temporary directory with a short path, for tests whose nodes make their unix
    sockets under it (a socket path is limited to 107 bytes, and ``tmp_path`` under a
    parallel run's worker directory can come near that); removed at the end."""
    path = tempfile.mkdtemp(prefix="wt-")
    try:
        yield Path(path)
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def small_disk(tmp_path):
    """A real 8 MiB filesystem (tmpfs) to fill up; unmounted at the end."""
    mount_point = tmp_path / "small-disk"
    mount_point.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        if subprocess.run(["umount", str(mount_point)], capture_output=True).returncode:
            subprocess.run(["umount", "-l", str(mount_point)], capture_output=True)

"""Suite-wide guards: every test stops every process it starts.

The check runs after each test: any descendant of the test process that appeared during
the test (but not one a process already running before it started: a module fixture's
Spark JVM forks its Python workers as it needs them, and the fixture stops them all), and
any Warren process (titled ``warren: ...``) of this test run that appeared during it even
if orphaned since (an actor whose forkserver died is re-parented away from us), still
alive a few seconds later fails the test, and is killed so that one leak does not cascade
into the tests after it. "Of this test run": the suite points ``XDG_RUNTIME_DIR`` at a
directory of its own (``RUN_DIR``, one per pytest process), so every node it starts, here
or in a child that inherits the environment, makes its ipc runtime directory there; a
Warren process with a socket under it is this run's, wherever it was re-parented to. The
Warren processes of other programs and other test runs on the machine (other workers of
a parallel run included) are never judged or killed. (A process's environment cannot tell:
a titled process's ``/proc/<pid>/environ`` holds its title now.)
"""

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from warren.supervisor import Node

pytest_plugins = ["pytester"]

GRACE_SECONDS = 5.0
# Short: a node takes XDG_RUNTIME_DIR for its runtime directory only under 40 characters.
RUN_DIR = tempfile.mkdtemp(prefix="wr-")
os.environ["XDG_RUNTIME_DIR"] = RUN_DIR
# Every JVM the tests start (Spark sessions, the Spark Connect server, the examples'
# drivers) lives seconds to minutes, and most of its CPU went to compiling hot code it
# never ran long enough to repay: the C1 compiler alone and the serial collector cut an
# example's CPU from 121 s to 85 s here. Tests only: Warren's bench and users' sessions
# keep the JVM's defaults.
os.environ.setdefault("JAVA_TOOL_OPTIONS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")


def _ours(process: psutil.Process) -> bool:
    """Whether a Warren process is this run's: a socket of it is under ``RUN_DIR``."""
    try:
        sockets = process.net_connections(kind="unix")
    except psutil.Error:
        return False  # gone, or not ours to read
    return any(socket.laddr.startswith(RUN_DIR + os.sep) for socket in sockets)


# The modules that take longest (measured with --durations=0 on a 2-core machine, longest
# first). `make test` gives each worker whole modules, the next one in collection order
# whenever it is free: these go first, so that no long module starts when the other
# worker is nearly done, and the two end together.
LONGEST_FIRST = (
    "tests/supervisor/chaos/test_harness.py",
    "tests/queues/client/test_spark_streams.py",
    "tests/queues/client/test_spark.py",
    # a cluster of three under faults: after the first three, which load both cores
    "tests/supervisor/chaos/test_cluster_chaos.py",
    "tests/supervisor/cli/test_queue_commands.py",
    "tests/supervisor/chaos/test_streams.py",
    "tests/queues/amqp/test_port.py",
    "tests/store/test_store_actors.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        module = item.nodeid.partition("::")[0]
        return LONGEST_FIRST.index(module) if module in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: every module keeps its own order


def pytest_sessionfinish(session: pytest.Session) -> None:
    shutil.rmtree(RUN_DIR, ignore_errors=True)  # and what SIGKILLed nodes left there


def _warren_processes() -> dict[int, psutil.Process]:
    """Every process titled ``warren: ...`` on the machine, this run's or not."""
    return {
        process.pid: process
        for process in psutil.process_iter(["cmdline"])
        if (process.info["cmdline"] or [""])[0].startswith("warren: ")
    }


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


def _survivors(before: set[int]) -> list[psutil.Process]:
    """The live processes not in ``before`` that the test had to stop: its descendants
    (but a fixture's), and this run's Warren processes wherever they were re-parented."""
    descendants = {p.pid: p for p in psutil.Process().children(recursive=True)}
    new = [
        p
        for pid, p in descendants.items()
        if pid not in before and not _started_by_a_fixture(p, before)
    ]
    new += [
        p
        for pid, p in _warren_processes().items()
        if pid not in before and pid not in descendants and _ours(p)
    ]
    return [p for p in new if _alive(p)]


@pytest.fixture(autouse=True)
def no_process_survives_the_test():
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    before |= set(_warren_processes())
    yield
    deadline = time.monotonic() + GRACE_SECONDS
    survivors = []
    while time.monotonic() < deadline:
        survivors = _survivors(before)
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
def node(tmp_path):
    """A node (``warren.supervisor.Node``) on the data directory ``tmp_path / "data"``,
    closed at the end. A directory or module whose tests need a node of another kind
    defines its own ``node``."""
    with Node(tmp_path / "data") as running:
        yield running


@pytest.fixture
def held_lock_refused_at_once(monkeypatch):
    """A directory lock held by another open file is refused after a tenth of a second,
    not after the seconds a dying holder is given (``warren.store.locks``): for tests
    whose holder is alive in the test's own process, and never lets go."""
    monkeypatch.setattr("warren.store.locks.LOCK_HOLDER_EXIT_S", 0.1)


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

"""The client tests' shared fixtures: a ``warren node`` process of its own for a recovery
test (``node``; a module with a node of another kind defines its own), and the Spark
session, one for the whole run, stopped with every process it began."""

import psutil
import pytest

from .node_process import NodeProcess


@pytest.fixture
def node(tmp_path):
    """A ``warren node`` of its own on a data directory under ``tmp_path``, stopped (its
    whole process group) when the test ends, whatever it did to it."""
    running = NodeProcess(tmp_path / "data")
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="session")
def spark():
    """One local session for the run; at its end, the JVM and every Python worker it
    started are stopped (a session's stop leaves the JVM to the Python process's exit)."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    from warren.queues.client.spark import local_session

    session = local_session("warren-tests", cores=2, max_failures=2)
    try:
        yield session
    finally:
        session.stop()
        started = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
        for process in started:
            try:
                process.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(started, timeout=30)

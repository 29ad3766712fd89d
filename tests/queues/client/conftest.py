"""The client tests' Spark session: one for the whole run, stopped with every process it began."""

import psutil
import pytest


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

"""Waiting for an outcome in another process, with a generous deadline."""

import os
import time
from collections.abc import Callable


def wait_for(condition: Callable[[], object], timeout: float = 20.0) -> None:
    """Wait until ``condition()`` is true, or fail the test."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{condition} did not become true within {timeout} s")
        time.sleep(0.01)


def group_alive(group: int) -> bool:
    """Whether process group ``group`` still has a process (a zombie counts)."""
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True

"""Preloaded into a test's forkserver: a spare's warm-up (its connection to the node) waits
until the file named by ``GATE_VARIABLE`` exists, then fails as one out of descriptors
would. The test can so hand the spare its order before the warm-up fails. Actors (titled
otherwise once their order is read) connect as usual."""

from __future__ import annotations

import errno
import os
import time

import setproctitle

from warren.actors import _forkserver
from warren.actors._runtime import Channel, Runtime

GATE_VARIABLE = "WARREN_TEST_WARM_UP_GATE"
_connect = Runtime.channel


def _channel_failing_in_a_spare(self: Runtime, endpoint: str) -> Channel:
    if setproctitle.getproctitle() != _forkserver.SPARE_TITLE:
        return _connect(self, endpoint)
    gate = os.environ[GATE_VARIABLE]
    while not os.path.exists(gate):  # a spare has nothing else to do; the test opens it
        time.sleep(0.01)
    raise OSError(errno.EMFILE, "Too many open files (a test's failing warm-up)")


Runtime.channel = _channel_failing_in_a_spare  # type: ignore[method-assign]

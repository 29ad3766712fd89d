"""``make run`` as a newcomer meets it: ``examples/demo.py`` runs to its end, every line
the node logs at WARNING or above is one the demo has said to expect (a kill seen from
inside), and every rate it prints says which workload it measures."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow

# What the demo's two kills make the node log, as its step 4 says: a queue stopping to
# restart after its store, and the requests that were in its mailbox.
EXPECTED_WARNINGS = (
    re.compile(r"queue \w+: msg_store_persistent went down \(killed by SIGKILL\); stopping"),
    re.compile(r"queue \w+: \d+ messages were still queued at stop"),
)


@pytest.mark.timeout(600)
def test_the_demo_runs_and_says_what_its_warnings_and_rates_mean():
    ran = subprocess.run(
        [sys.executable, "examples/demo.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    logged = [line for line in ran.stderr.splitlines() if re.search(r" (WARNING|ERROR) ", line)]
    unexplained = [line for line in logged if not any(p.search(line) for p in EXPECTED_WARNINGS)]
    assert not unexplained, unexplained
    assert "lost 0" in ran.stdout and "Traceback" not in ran.stderr
    rates = [line for line in ran.stdout.splitlines() if re.search(r"[\d,]+(/s| msgs/s)", line)]
    assert len(rates) == 3, rates  # the crash run's, then the README workload's two
    assert "not a throughput figure" in ran.stdout
    assert "publish+confirm, publish_async each, 1,000 in flight" in rates[1]
    assert "consume+ack, prefetch 100, one ack each" in rates[2]

"""``format("warren")`` under Spark Connect (``pyspark.sql.connect``): the data source
registered through a Connect client is shipped to the server, which runs its writes and
reads in its own Python workers. The job runs in a process of its own
(``spark_connect_job.py``), as one process holds one SparkContext."""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

if shutil.which("java") is None:
    pytest.skip(
        "Spark needs Java (a JRE 17 or newer on PATH); none is installed here",
        allow_module_level=True,
    )

from warren.supervisor import Node

from ...waiting import wait_for

JOB = Path(__file__).with_name("spark_connect_job.py")


def in_group(group: int) -> list[psutil.Process]:
    """The live processes of process group ``group``."""
    found = []
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            if os.getpgid(process.pid) == group and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
    return found


pytestmark = pytest.mark.timeout(600)


def test_a_connect_client_writes_into_a_stream_and_reads_it_back(tmp_path):
    with Node(tmp_path / "data", listen="tcp://127.0.0.1:*") as node:
        node.declare_queue("events", type="stream")
        job = subprocess.Popen(
            [sys.executable, str(JOB), node.listen_endpoint, "events", "1000"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # its JVM and Python workers share its process group
        )
        try:
            out, err = job.communicate(timeout=480)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(job.pid, signal.SIGKILL)
            job.wait()
            wait_for(lambda: not in_group(job.pid), timeout=60)
        assert job.returncode == 0, err[-3000:]
        result = json.loads(out.strip().splitlines()[-1])
        assert result["client"] == "pyspark.sql.connect.session"
        # every row once, at offsets 0..999: the two tasks' writes land in either order
        assert [offset for offset, _ in result["rows"]] == list(range(1000))
        assert sorted(int(body) for _, body in result["rows"]) == list(range(1000))

"""The suite's process guard (``tests/conftest.py``), run on a test of its own making:
a test that leaves a process behind fails, and the process is killed."""

import os
import signal
from pathlib import Path

import psutil
import pytest

from .waiting import wait_for

# A child that makes itself a Warren actor of the inner run (its title, a socket in the
# run's runtime directory) and whose parent exits at once: an orphan, re-parented away
# from the test process, as an actor is whose forkserver dies without taking it along.
ORPHAN_TEST = """
import os, socket, tempfile, time
import setproctitle

def test_leaves_an_orphan():
    pid_file = {pid_file!r}
    if os.fork() == 0:  # the parent, gone at once
        if os.fork() == 0:  # the orphan
            setproctitle.setproctitle("warren: stray actor")
            mailbox = tempfile.mkdtemp(prefix="warren-", dir=os.environ["XDG_RUNTIME_DIR"])
            listening = socket.socket(socket.AF_UNIX)
            listening.bind(os.path.join(mailbox, "stray.data"))
            listening.listen()
            with open(pid_file + ".part", "w") as out:
                out.write(str(os.getpid()))
            os.replace(pid_file + ".part", pid_file)
            time.sleep(120)
            os._exit(0)
        os._exit(0)
    os.wait()
    while not os.path.exists(pid_file):
        time.sleep(0.01)
"""


def test_a_test_leaving_an_orphaned_warren_process_fails_and_the_process_is_killed(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    pid_file = tmp_path / "orphan.pid"
    pytester.makeconftest((Path(__file__).parent / "conftest.py").read_text())
    pytester.makepyfile(ORPHAN_TEST.format(pid_file=str(pid_file)))
    orphan = None
    try:
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
        orphan = int(pid_file.read_text())
        result.assert_outcomes(passed=1, errors=1)
        result.stdout.fnmatch_lines(["*processes outlived the test*warren: stray actor*"])
        wait_for(lambda: not psutil.pid_exists(orphan), timeout=5)
    finally:
        if orphan is not None and psutil.pid_exists(orphan):
            os.kill(orphan, signal.SIGKILL)  # the guard under test failed to

"""examples/celery_app.py run as its users run it: ``warren node --amqp`` as a process, a
``celery worker`` process, and the tasks sent from here; the node is killed with SIGKILL,
or stopped with SIGTERM (either to every process of its session at once, as systemd
does), in the middle of the work and started again on the same data directory and port.

What must hold, as Celery promises with late acknowledgements: every task sent before the
kill completes with the right result, the worker and the sender recovering by
themselves; a task runs more than once only where the node delivered it again, flagged
redelivered (it was running, or held for its countdown, when the node died)."""

from __future__ import annotations

import collections
import contextlib
import importlib.util
import os
import signal
import socket
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psutil
import pytest

from ...waiting import wait_for

pytest.importorskip("celery", reason="the Celery example needs the test extra's celery")

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "celery_app.py"
WARREN = [sys.executable, "-m", "warren.supervisor.cli"]
TASKS = 60


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0) as sock:
            sock.sendall(b"AMQP\x00\x00\x09\x01")
            return sock.recv(1) == b"\x01"  # connection.start, a method frame
    except OSError:
        return False


def _start(argv: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    with open(log, "ab") as out:  # the child keeps its own descriptor
        return subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def _session(leader: int) -> list[psutil.Process]:
    """The live processes of the session ``leader`` started: the node's forkserver and
    its actors have a process group of their own, in the node's session."""
    members = []
    for process in psutil.process_iter():
        try:
            if os.getsid(process.pid) == leader and process.status() != psutil.STATUS_ZOMBIE:
                members.append(process)
        except (OSError, psutil.Error):
            continue
    return members


def _kill_session(leader: subprocess.Popen, signum: int) -> None:
    """``signum`` to every process of the session at once (as systemd's stop of a
    service's cgroup), and wait until none is left."""
    for process in _session(leader.pid):
        with contextlib.suppress(psutil.Error):
            process.send_signal(signum)
    with contextlib.suppress(subprocess.TimeoutExpired):
        leader.wait(timeout=60)
    wait_for(lambda: not _session(leader.pid), timeout=60)


def _stop(leader: subprocess.Popen) -> None:
    """Stop a started program as a service manager would: SIGTERM to the leader, then
    SIGKILL to whatever of its session is left."""
    if leader.poll() is None:
        leader.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            leader.wait(timeout=60)
    _kill_session(leader, signal.SIGKILL)


@pytest.fixture
def example(tmp_path, monkeypatch):
    """The example module loaded here with its settings pointing into ``tmp_path``."""
    port = _free_port()
    settings = {
        "WARREN_AMQP_URL": f"amqp://guest:guest@127.0.0.1:{port}//",
        "CELERY_RESULTS": str(tmp_path / "results.sqlite"),
        "CELERY_LEDGER": str(tmp_path / "ledger.txt"),
    }
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    spec = importlib.util.spec_from_file_location("celery_app_under_test", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module, port, dict(os.environ)
    module.app.close()


def _runs(ledger: Path) -> dict[str, list[str]]:
    runs: dict[str, list[str]] = collections.defaultdict(list)
    if ledger.exists():
        for line in ledger.read_text().splitlines():
            task_id, how = line.split()
            runs[task_id].append(how)
    return runs


# each case loads the example anew (its settings are read at import): its tasks' names
# are then registered a second time in this process, on purpose
@pytest.mark.filterwarnings("ignore::celery.exceptions.DuplicateTaskNameWarning")
@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM], ids=["kill-9", "stop"])
def test_a_celery_app_completes_every_task_through_a_kill_9_or_a_stop_of_the_node(
    tmp_path, example, signum
):
    celery_app, port, env = example
    ledger = Path(env["CELERY_LEDGER"])
    node_argv = [*WARREN, "node", "--data-dir", str(tmp_path / "data")]
    node_argv += ["--amqp", f"127.0.0.1:{port}"]
    node = _start(node_argv, tmp_path / "node.log", env)
    worker = None
    try:
        wait_for(lambda: _answers(port), timeout=60)
        worker = _start(
            [sys.executable, "-m", "celery", "--app", "examples.celery_app", "worker",
             "--loglevel", "INFO", "--concurrency", "2", "--without-mingle", "--without-gossip"],
            tmp_path / "worker.log", env,
        )  # fmt: skip
        add = celery_app.add
        sums = [add.apply_async((n, n), {"pause_s": 0.1}) for n in range(TASKS)]
        later = add.apply_async((20, 22), countdown=3)
        at = add.apply_async((1, 1), eta=datetime.now(UTC) + timedelta(seconds=4))
        retried = celery_app.flaky.delay(2)
        summed = celery_app.chord(add.s(n, 1) for n in range(10))(celery_app.total.s())
        # Sent with confirms: all of it is on the node's disk. Kill it mid-work.
        wait_for(lambda: len(_runs(ledger)) >= 10, timeout=120)
        _kill_session(node, signum)  # SIGTERM to all at once: systemd's stop
        done_at_kill = len(_runs(ledger))
        assert done_at_kill < TASKS, "the work was over before the kill: nothing was tested"
        node = _start(node_argv, tmp_path / "node.log", env)
        wait_for(lambda: _answers(port), timeout=60)

        assert [r.get(timeout=180) for r in sums] == [n + n for n in range(TASKS)]
        assert (later.get(timeout=180), at.get(timeout=180)) == (42, 2)
        assert retried.get(timeout=180) == 3  # two failures, each retried after 1 s
        assert summed.get(timeout=180) == sum(n + 1 for n in range(10))
    finally:
        if worker is not None:
            _stop(worker)
        _stop(node)
    runs = _runs(ledger)
    ours = [r.id for r in (*sums, later, at)] + [summed.id]
    for task_id in ours:
        assert runs[task_id], f"task {task_id} never ran"
        assert runs[task_id].count("first") <= 1, runs[task_id]  # the others: redelivered
    # A retry is a new message of the same task id: three runs, more only where one was
    # delivered again.
    tries = runs[retried.id]
    assert len(tries) >= 3 and tries.count("first") <= 3, tries

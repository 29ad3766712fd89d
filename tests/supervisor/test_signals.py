"""Every ordinary way of stopping a node is an orderly stop: SIGTERM, SIGINT or SIGHUP to
its process group (a terminal, ``timeout``, ``kill -- -PGID``) or SIGTERM to every one of
its processes at once (systemd's control-group stop). The node exits 0, leaves no
process behind, and its stores start clean next time."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from warren.store import MessageStore

from ..waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
WARREN = [sys.executable, "-m", "warren.supervisor.cli"]


def start_node(data: Path) -> tuple[subprocess.Popen, list[int]]:
    node = subprocess.Popen([*WARREN, "node", "--data-dir", str(data)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    assert node.stdout.readline().startswith("node warren")
    family = [node.pid] + [p.pid for p in psutil.Process(node.pid).children(recursive=True)]
    assert len(family) == 5              # node, forkserver, GC, two stores
    return node, family


def gone(pids: list[int]) -> bool:
    def alive(pid):
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False
    return not any(alive(pid) for pid in pids)


def stop_and_check(node: subprocess.Popen, family: list[int], data: Path) -> None:
    try:
        assert node.wait(timeout=60) == 0, node.stderr.read()
        wait_for(lambda: gone(family))
    finally:
        for pid in family:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        node.wait()
        node.stdout.close()
        node.stderr.close()
    for store in ("msg_store_persistent", "msg_store_transient"):
        with MessageStore(data / store) as reopened:
            assert reopened.recovered_clean, store


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_to_the_nodes_process_group_stops_it_in_order(tmp_path, signum):
    node, family = start_node(tmp_path / "data")
    os.killpg(node.pid, signum)
    stop_and_check(node, family, tmp_path / "data")


def test_sigterm_to_every_process_of_the_node_at_once_stops_it_in_order(tmp_path):
    node, family = start_node(tmp_path / "data")
    for pid in family:
        os.kill(pid, signal.SIGTERM)
    stop_and_check(node, family, tmp_path / "data")


def test_an_embedding_program_killed_by_a_signal_leaves_its_stores_clean(tmp_path):
    program = subprocess.Popen([sys.executable, "-m", "tests.supervisor.node_child",
                                str(tmp_path / "data")], cwd=ROOT, stdout=subprocess.PIPE,
                               text=True, start_new_session=True)
    descendants = [int(pid) for pid in program.stdout.readline().split()]
    try:
        program.send_signal(signal.SIGTERM)   # the default action: the program just dies
        program.wait(timeout=30)
        wait_for(lambda: gone(descendants))
    finally:
        for pid in descendants:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if program.poll() is None:
            program.kill()
            program.wait()
        program.stdout.close()
    with MessageStore(tmp_path / "data" / "msg_store_persistent") as reopened:
        assert reopened.recovered_clean

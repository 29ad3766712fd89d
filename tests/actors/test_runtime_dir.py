"""The private runtime directory and the names of ipc endpoints."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from warren.actors import InvalidSpec, Node
from warren.actors.runtime_dir import (
    MAX_IPC_PATH_BYTES,
    MEMORY_FS,
    OWNER_FILE,
    create_runtime_dir,
    default_parent,
    ipc_endpoint,
)

ROOT = Path(__file__).resolve().parents[2]


def test_the_runtime_directory_is_private(tmp_path: Path) -> None:
    path = create_runtime_dir(str(tmp_path))
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o700


def test_endpoints_are_short_hashes_of_any_name(tmp_path: Path) -> None:
    endpoint = ipc_endpoint(str(tmp_path), "queue: orders/ü " * 20, "data")
    name = os.path.basename(endpoint)
    assert len(name) == len("0123456789abcdef.data")
    assert ipc_endpoint(str(tmp_path), "a", "data") != ipc_endpoint(str(tmp_path), "b", "data")


def test_a_socket_path_over_the_kernel_limit_is_refused_with_its_path(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * (MAX_IPC_PATH_BYTES - len(str(tmp_path))))
    with pytest.raises(InvalidSpec, match="longer than 107 bytes"):
        ipc_endpoint(str(deep), "actor", "data")


def test_a_node_refuses_a_runtime_directory_others_can_enter(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    with pytest.raises(InvalidSpec, match="not private"):
        Node("shared", runtime_dir=str(shared))


def test_a_node_sweeps_the_runtime_directories_of_nodes_that_died(tmp_path: Path) -> None:
    script = tmp_path / "doomed.py"
    script.write_text(
        textwrap.dedent(f"""
        import os, signal
        from warren.actors.runtime_dir import create_runtime_dir
        print(create_runtime_dir({str(tmp_path)!r}), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    )
    doomed = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
    left_behind = doomed.stdout.strip()
    assert os.path.isdir(left_behind)
    not_ours = tmp_path / "warren-not-a-runtime-dir"
    not_ours.mkdir(mode=0o700)
    alive = create_runtime_dir(str(tmp_path))
    assert not os.path.exists(left_behind)
    assert not_ours.is_dir()  # no owner file: not ours to judge
    assert os.path.isdir(alive)
    create_runtime_dir(str(tmp_path))
    assert os.path.isdir(alive)  # its owner (this process) lives


def test_runtime_directories_whose_owner_file_has_no_pid_namespace_are_judged_by_pid(
    tmp_path: Path,
) -> None:
    """An owner file written before the pid namespace was recorded holds the pid and the
    start time only: its directory is swept once that process is gone, and kept while
    it lives."""

    def old_runtime_dir(name: str, process: psutil.Process) -> Path:
        path = tmp_path / f"warren-{name}"
        path.mkdir(mode=0o700)
        (path / OWNER_FILE).write_text(f"{process.pid} {process.create_time()!r}\n")
        return path

    child = subprocess.Popen([sys.executable, "-c", "input()"], stdin=subprocess.PIPE)
    try:
        gone = old_runtime_dir("gone", psutil.Process(child.pid))
    finally:
        child.communicate(b"\n", timeout=60)
    alive = old_runtime_dir("alive", psutil.Process())
    create_runtime_dir(str(tmp_path))
    assert not gone.exists()
    assert alive.is_dir()


def test_the_runtime_directory_of_a_live_node_in_another_pid_namespace_is_left_alone(
    tmp_path: Path,
) -> None:
    """Containers of one pod share /dev/shm but not their pids: a node there, alive, wrote
    a pid that names another process here (or none); its directory must not be swept."""
    if subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True
    ).returncode:
        pytest.skip("this machine does not let the tests make a pid namespace (unshare)")
    program = (
        "import sys\n"
        "from warren.actors.runtime_dir import create_runtime_dir\n"
        f"print(create_runtime_dir({str(tmp_path)!r}), flush=True)\n"
        "sys.stdin.read()\n"
    )
    other = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", program],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its group: unshare and the node's process in the namespace
    )
    try:
        theirs = other.stdout.readline().strip()
        assert os.path.isdir(theirs)
        create_runtime_dir(str(tmp_path))
        assert os.path.isdir(theirs)
    finally:
        other.stdin.close()  # its end of input: it exits
        try:
            other.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(other.pid, signal.SIGKILL)
            other.wait()
        finally:
            other.stdout.close()


NODE_PROGRAM = textwrap.dedent("""
    import os, signal, sys
    from warren.actors import Node
    from tests.actors.sample_actors import Recorder

    if __name__ == "__main__":
        node = Node(sys.argv[1])
        node.spawn(Recorder, name="bystander")
        print(node.runtime_dir, flush=True)
        if sys.argv[1] == "doomed":
            os.kill(os.getpid(), signal.SIGKILL)
        node.close()
""")


def test_the_next_node_removes_the_runtime_directory_of_a_sigkilled_node(
    short_tmp_path: Path,
) -> None:
    script = short_tmp_path / "node_program.py"
    script.write_text(NODE_PROGRAM)
    runs = short_tmp_path / "runs"  # the temporary directory both nodes use
    runs.mkdir()
    env = {**os.environ, "TMPDIR": str(runs), "PYTHONPATH": str(ROOT)}
    env.pop("XDG_RUNTIME_DIR", None)

    def run(name: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, str(script), name],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    doomed = run("doomed")
    assert doomed.returncode == -signal.SIGKILL, doomed.stderr
    left_behind = doomed.stdout.strip()
    assert os.path.dirname(left_behind) == str(runs) and os.path.isdir(left_behind)
    following = run("following")
    assert following.returncode == 0, following.stderr
    assert not os.path.exists(left_behind)
    assert not os.path.exists(following.stdout.strip())  # closed cleanly, removed


def test_without_xdg_runtime_dir_a_node_keeps_its_sockets_in_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under the temporary directory, on a disk, every actor's start waited for the
    filesystem's journal whenever the disk was busy. This test binds its node's ipc
    sockets in ``MEMORY_FS`` itself, outside any temporary directory of the test: that is
    the behaviour under test. Whatever runtime directory this process made there is
    removed at the end, even when the test fails."""
    if not os.access(MEMORY_FS, os.W_OK | os.X_OK):
        pytest.skip(f"{MEMORY_FS} is not writable here")
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.delenv("TMPDIR", raising=False)
    before = set(os.listdir(MEMORY_FS))
    try:
        with Node("in-memory") as node:
            assert os.path.dirname(node.runtime_dir) == MEMORY_FS
            assert node.endpoint.startswith(f"ipc://{node.runtime_dir}/")
        assert not os.path.exists(node.runtime_dir)
    finally:
        for name in set(os.listdir(MEMORY_FS)) - before:
            if made_by_this_process(os.path.join(MEMORY_FS, name)):
                shutil.rmtree(os.path.join(MEMORY_FS, name), ignore_errors=True)


def made_by_this_process(path: str) -> bool:
    """Whether ``path`` is a runtime directory this process created (its owner file names
    this process): not one of another program's, which may share ``MEMORY_FS``."""
    try:
        with open(os.path.join(path, OWNER_FILE)) as owner:
            return owner.read().split()[:1] == [str(os.getpid())]
    except OSError:
        return False


def test_xdg_runtime_dir_comes_first(short_tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(short_tmp_path))
    assert default_parent() == str(short_tmp_path)

"""The README's quickstart works as written. Its fenced ``sh`` and ``python`` blocks under
"## Quickstart" are run as a newcomer runs them, in a fresh directory (the README names
the data directory ``./warren-data``, relative to where the commands run): the
``warren node`` line in the background, every other shell line in turn, then the Python
block. What they print must be what the README shows. Then the node is stopped, started
again (the queue is still there, and the "Streams" block runs against it), stopped, and
the "A node inside your program" block runs a node of its own on the same directory.

The node's ipc sockets go to a private temporary directory of this test (``TMPDIR``), it
listens on no tcp port, and every node is stopped in a ``finally``: SIGTERM first (a clean
stop, exit 0), SIGKILL only if it hangs."""

import importlib.metadata
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BIN = Path(sys.executable).parent  # the venv's bin: `warren` and `python`, as after install
STOP_TIMEOUT_S = 60

pytestmark = pytest.mark.slow


def section(heading: str) -> str:
    """The README's text under ``heading`` (a whole heading line), up to the next heading."""
    text = README.read_text()
    start = text.index(f"\n{heading}\n") + len(heading) + 2
    following = re.search(r"^#{1,6} ", text[start:], re.MULTILINE)
    return text[start : start + following.start()] if following else text[start:]


def blocks(text: str, language: str) -> list[str]:
    """The fenced blocks of ``language`` in ``text``, in order."""
    return re.findall(rf"^```{language}\n(.*?)^```$", text, re.MULTILINE | re.DOTALL)


def commands(block: str) -> list[str]:
    return [line for line in block.splitlines() if line.strip() and not line.startswith("#")]


@pytest.fixture
def shell_env():
    """The environment a newcomer's terminal has after installing Warren, with ipc sockets
    in a private directory of this test."""
    assert (BIN / "warren").exists() and (BIN / "python").exists(), f"no warren in {BIN}"
    runtime = tempfile.mkdtemp(prefix="readme-")  # short: unix socket paths are limited
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}", TMPDIR=runtime)
    env.pop("XDG_RUNTIME_DIR", None)
    env.pop("PYTHONPATH", None)
    try:
        yield env
    finally:
        shutil.rmtree(runtime, ignore_errors=True)


def sh(line: str, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    done = subprocess.run(
        ["bash", "-o", "pipefail", "-c", line],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, f"{line}\n{done.stdout}\n{done.stderr}"
    return done


def start_node(line: str, cwd: Path, env: dict) -> subprocess.Popen:
    node = subprocess.Popen(
        ["bash", "-c", f"exec {line}"],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    first = node.stdout.readline()  # the node prints its tree once it runs
    assert first.startswith("node warren"), first + node.stderr.read()
    node.first_line = first.rstrip("\n")  # type: ignore[attr-defined]
    return node


def stop_node(node: subprocess.Popen) -> int:
    """SIGTERM, as Ctrl-C in its terminal would; SIGKILL only if it does not stop."""
    try:
        if node.poll() is None:
            node.send_signal(signal.SIGTERM)
            try:
                return node.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                node.kill()
                node.wait()
                raise
        return node.returncode
    finally:
        node.stdout.close()
        node.stderr.close()


def queue_row(listing: str, queue: str) -> list[str]:
    row = next(line for line in listing.splitlines() if line.split()[:1] == [queue])
    return row.split()


def run_block(heading: str, directory: Path, env: dict[str, str]) -> str:
    """Run the one python block under ``heading`` as a script in ``directory``; what it
    printed (the test fails if it fails)."""
    (block,) = blocks(section(heading), "python")
    (directory / "block.py").write_text(block)
    ran = subprocess.run(
        [sys.executable, "block.py"],
        cwd=directory,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr
    return ran.stdout


def test_the_quickstart_runs_as_written(tmp_path, shell_env):
    quickstart = section("## Quickstart")
    node_block, client_block = blocks(quickstart, "sh")
    shown = blocks(quickstart, "text")[1].splitlines()  # what the client lines print
    (python_block,) = blocks(quickstart, "python")
    (node_line,) = commands(node_block)
    assert node_line.startswith("warren node --data-dir ./warren-data")

    node = start_node(node_line, tmp_path, shell_env)
    try:
        node_shown = blocks(quickstart, "text")[0].splitlines()  # what the node prints
        assert node_shown[-1] == "..."
        node_printed = [node.first_line]
        while not node_printed[-1].startswith("actor "):
            line = node.stdout.readline().rstrip("\n")
            if line.startswith("  "):  # a long line wrapped at 80 columns
                node_printed[-1] += " " + line.strip()
            else:
                node_printed.append(line)
        for got, expected in zip(node_printed, node_shown[:-1], strict=True):
            expected = expected.replace("/home/you/warren-data", str(tmp_path / "warren-data"))
            expected = re.sub(r"\(pid \d+\)", f"(pid {node.pid})", expected)
            if expected.startswith("actor "):  # its columns are as wide as the pids
                assert got.split() == expected.split()
            else:
                assert got == expected
        printed = []
        for line in commands(client_block):
            done = sh(line, tmp_path, shell_env)
            printed += (done.stdout + done.stderr).splitlines()
        assert len(printed) == len(shown), printed
        for got, expected in zip(printed, shown, strict=True):
            if expected.startswith("orders "):  # the rates column moves with time
                assert got.split()[:6] == expected.split()[:6]
            else:
                assert got == expected

        (tmp_path / "quickstart.py").write_text(python_block)
        ran = subprocess.run(
            [sys.executable, "quickstart.py"],
            cwd=tmp_path,
            env=shell_env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert ran.returncode == 0, ran.stderr
        assert ran.stdout == "order 3\norder 4\norder 5\n"
        listing = sh("warren queues --data-dir ./warren-data", tmp_path, shell_env).stdout
        assert queue_row(listing, "orders")[:4] == ["orders", "running", "0", "0"]
    finally:
        assert stop_node(node) == 0

    node = start_node(node_line, tmp_path, shell_env)  # "start it again"
    try:
        listing = sh("warren queues --data-dir ./warren-data", tmp_path, shell_env).stdout
        assert queue_row(listing, "orders")[:3] == ["orders", "running", "0"]
        assert run_block("### Streams", tmp_path, shell_env) == (
            "0 b'clicked'\n1 b'bought'\nbilling read [0, 1]\n"
        )
        listing = sh("warren streams --data-dir ./warren-data", tmp_path, shell_env).stdout
        row = listing.splitlines()[2].split()
        assert row[:3] == ["events", "running", "0"] and row[-1] == "billing(0)"
        # A second run: the named consumer resumes after what the first one read.
        again = run_block("### Streams", tmp_path, shell_env).splitlines()
        assert again[-1] == f"billing read {[int(line.split()[0]) for line in again[2:4]]}"
    finally:
        assert stop_node(node) == 0

    assert run_block("### A node inside your program", tmp_path, shell_env) == "order 6 False\n"


def test_the_first_install_lines_install_from_the_clone():
    """Each ``pip install`` line of "## Install" names what a clone holds: its own
    directory (a setup.py whose distribution is warren-mq) and extras it declares. Warren
    is not on PyPI: a line naming the distribution alone installs nothing."""
    lines = commands(blocks(section("## Install"), "sh")[0])
    assert lines and all(line.startswith("pip install ") for line in lines)
    declared = set(importlib.metadata.metadata("warren-mq").get_all("Provides-Extra") or [])
    for line in lines:
        (requirement,) = shlex.split(line.split("#")[0])[2:]
        where, _, extras = requirement.partition("[")
        assert (ROOT / where / "setup.py").is_file(), f"{line}: not a directory of the clone"
        assert set(filter(None, extras.rstrip("]").split(","))) <= declared, line
    name = subprocess.run(
        [sys.executable, "setup.py", "--name"], cwd=ROOT, capture_output=True, text=True
    )
    assert name.stdout.splitlines()[-1] == "warren-mq", name.stderr


def test_the_version_is_one_figure_for_the_package_the_command_and_the_distribution():
    import warren

    shown = subprocess.run(
        [str(BIN / "warren"), "--version"], capture_output=True, text=True, timeout=60
    )
    assert shown.stdout == f"warren {warren.__version__}\n"
    assert importlib.metadata.version("warren-mq") == warren.__version__
    assert re.fullmatch(r"\d+\.\d+\.\d+", warren.__version__)


def test_the_readme_opens_with_make_run_and_make_test_and_stays_short():
    first = commands(blocks(README.read_text(), "sh")[0])
    assert [line.split("#")[0].strip() for line in first] == ["make run", "make test"]
    assert len(README.read_text().splitlines()) <= 300


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize(
    "document",
    [
        "README.md",
        "bench/README.md",
        *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")),
    ],
)
def test_every_link_between_the_documents_reaches_a_file_and_heading(document):
    path = ROOT / document
    text = path.read_text()
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # a web address
        file, _, anchor = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        assert linked.exists(), f"{document} links to {target}: no such file"
        if anchor:
            headings = re.findall(r"^#{1,6} (.+)$", linked.read_text(), re.MULTILINE)
            assert anchor in {slug(h) for h in headings}, f"{document}: no heading #{anchor}"

"""Operators see what every actor process logs: on the node's stderr, at the node's
level, each line with its time, level, the actor's name and pid."""

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PROGRAM = textwrap.dedent("""
    import sys
    from warren.actors import Node
    from tests.actors.sample_actors import Recorder

    if __name__ == "__main__":
        with Node("logs", log_level=sys.argv[1]) as node:
            ref = node.spawn(Recorder, name="chatty")
            ref.ask(("log", 20, "an info line from the actor"), timeout=10)
            ref.ask(("log", 40, "an error line from the actor"), timeout=10)
""")


def run(tmp_path: Path, level: str) -> str:
    script = tmp_path / "program.py"
    script.write_text(PROGRAM)
    done = subprocess.run(
        [sys.executable, str(script), level],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr
    return done.stderr


def test_actor_processes_log_at_the_nodes_level_with_time_and_name(tmp_path):
    shown = run(tmp_path, "INFO")
    line = next(line for line in shown.splitlines() if "an info line" in line)
    assert re.match(
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO chatty\[\d+\] sample: "
        r"an info line from the actor$",
        line,
    ), line


def test_below_the_nodes_level_nothing_is_shown(tmp_path):
    shown = run(tmp_path, "WARNING")
    assert "an info line" not in shown
    assert "ERROR chatty[" in shown and "an error line from the actor" in shown


def test_a_level_that_is_not_one_is_refused():
    from warren.actors import InvalidSpec, Node

    with pytest.raises(InvalidSpec, match="log_level"):
        Node("bad-level", log_level="LOUD")

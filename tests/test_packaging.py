"""Warren installs as one top-level package, ``warren``, so it lives beside packages that own
the names of its parts: supervisord's ``supervisor`` above all, which once replaced Warren's
``supervisor`` on install and deleted its files on uninstall. A node installed from the
wheel serves its management page, whose files are package data, not modules."""

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

IMPORT_BOTH = textwrap.dedent("""
    import supervisor.supervisord, warren, warren.supervisor, warren.store, warren.actors
    from warren import Node, StoreClient
    assert supervisor.supervisord.__file__.endswith("supervisor/supervisord.py")
    assert warren.supervisor.Supervisor.__module__ == "warren.supervisor.supervisor"
    print("both import")
""")
START_A_NODE = textwrap.dedent("""
    import sys
    import urllib.request
    from warren import Node, StoreClient
    if __name__ == "__main__":
        with Node(sys.argv[1], http="127.0.0.1:0") as node:
            client = StoreClient(node.store())
            client.write(b"0123456789abcdef", b"from a wheel")
            client.settle()
            assert client.read(b"0123456789abcdef") == b"from a wheel"
            client.terminate()
            for path, shows in (
                ("/", b"page.js"),
                ("/page.js", b"api/${page}"),
                ("/favicon.ico", b"<svg"),
            ):
                with urllib.request.urlopen(node.http_endpoint + path, timeout=10) as page:
                    assert shows in page.read(), path
        print("node ran")
""")


def run(*command, cwd: Path, timeout: float = 300) -> str:
    done = subprocess.run(
        [str(c) for c in command], cwd=cwd, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.mark.slow
def test_the_wheel_installs_beside_supervisord_and_survives_its_uninstall(tmp_path):
    source = tmp_path / "source"  # a copy: building writes build/ and egg-info
    shutil.copytree(
        ROOT,
        source,
        ignore=shutil.ignore_patterns(
            ".git", ".venv", "build", "*.egg-info", "__pycache__", ".pytest_cache"
        ),
    )
    run(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--quiet",
        "--no-deps",
        "--wheel-dir",
        tmp_path / "dist",
        source,
        cwd=tmp_path,
    )
    wheel = next((tmp_path / "dist").glob("warren_mq-*.whl"))
    run(sys.executable, "-m", "venv", tmp_path / "venv", cwd=tmp_path)
    python = tmp_path / "venv" / "bin" / "python"
    run(
        python,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        wheel,
        "supervisor",
        cwd=tmp_path,
    )
    assert "both import" in run(python, "-c", IMPORT_BOTH, cwd=tmp_path)

    run(python, "-m", "pip", "uninstall", "--yes", "--quiet", "supervisor", cwd=tmp_path)
    script = tmp_path / "start_a_node.py"
    script.write_text(START_A_NODE)
    assert "node ran" in run(python, script, tmp_path / "data", cwd=tmp_path)
    assert "exit codes" in run(tmp_path / "venv" / "bin" / "warren", "--help", cwd=tmp_path)

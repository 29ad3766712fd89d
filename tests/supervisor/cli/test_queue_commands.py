"""The ``warren`` commands on a running node's queues: list, publish, consume, purge,
delete; and what they say when there is no node or no such queue."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from warren.supervisor import Node

ROOT = Path(__file__).resolve().parents[3]
WARREN = [sys.executable, "-m", "warren.supervisor.cli"]


def warren(*arguments, stdin=None):
    return subprocess.run(
        [*WARREN, *arguments], cwd=ROOT, input=stdin, capture_output=True, timeout=120
    )


@pytest.fixture
def data_dir(tmp_path):
    return str(tmp_path / "data")


@pytest.fixture
def node(data_dir):
    with Node(data_dir) as running:
        yield running


def test_publish_lines_then_list_consume_purge_and_delete_a_queue(node, data_dir):
    node.declare_queue("orders")
    published = warren("publish", "orders", "--data-dir", data_dir, stdin=b"one\ntwo\nthree\n")
    assert published.returncode == 0, published.stderr
    assert b"published 3 messages" in published.stderr
    listed = warren("queues", "--data-dir", data_dir)
    assert listed.returncode == 0, listed.stderr
    row = next(line for line in listed.stdout.decode().splitlines() if line.startswith("orders"))
    assert row.split()[:4] == ["orders", "running", "default", "3"]
    consumed = warren("consume", "orders", "--data-dir", data_dir, "--count", "2")
    assert consumed.returncode == 0, consumed.stderr
    assert consumed.stdout == b"one\ntwo\n"
    generated = warren(
        "publish", "orders", "--data-dir", data_dir, "--count", "500", "--size", "100"
    )
    assert generated.returncode == 0, generated.stderr
    figures = json.loads(warren("queues", "--data-dir", data_dir, "--json").stdout)
    assert figures[0]["stats"]["messages_ready"] == 501
    purged = warren("purge", "orders", "--data-dir", data_dir)
    assert purged.stdout.decode().strip() == "purged 501 messages from orders"
    deleted = warren("delete", "orders", "--data-dir", data_dir)
    assert deleted.returncode == 0 and node.list_queues() == []


def test_an_unknown_queue_and_a_missing_node_are_one_line_errors(node, data_dir, tmp_path):
    unknown = warren("consume", "nowhere", "--data-dir", data_dir)
    assert unknown.returncode == 2
    assert unknown.stderr.decode().strip() == (
        "warren: no queue 'nowhere' on this node; declare it first"
    )
    absent = warren("queues", "--data-dir", str(tmp_path / "elsewhere"))
    assert absent.returncode == 1
    assert b"no node is running" in absent.stderr and b"Traceback" not in absent.stderr

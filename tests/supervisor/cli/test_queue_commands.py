"""The ``warren`` commands on a running node's queues: list, publish, consume, purge,
delete; and what they say when there is no node or no such queue."""

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from warren import connect
from warren.queues.errors import ConnectionClosed
from warren.queues.message import MAX_MESSAGE_BYTES
from warren.queues.routing import partition_of
from warren.supervisor import Node

from ...waiting import group_alive, wait_for
from .test_cli import printed_to_a_reader_that_left

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
    assert row.split()[:3] == ["orders", "running", "3"]
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


def test_a_shell_user_declares_binds_routes_and_undoes_it_all(node, data_dir):
    def ok(*arguments, stdin=None):
        done = warren(*arguments, "--data-dir", data_dir, stdin=stdin)
        assert done.returncode == 0, done.stderr
        return done.stdout.decode()

    ok("declare", "queue", "audit", "--max-length", "10", "--overflow", "reject-publish")
    ok("declare", "exchange", "events", "--kind", "topic", "--alternate-exchange", "spill")
    assert ok("bind", "audit", "events", "--routing-key", "order.*").startswith("bound audit")
    ok("publish", "order.paid", "--exchange", "events", stdin=b"paid\n")
    assert (
        ok("declare", "queue", "audit", "--passive")
        == "queue audit: 1 message ready, 0 consumers\n"
    )
    missing = warren("declare", "queue", "nowhere", "--passive", "--data-dir", data_dir)
    assert missing.returncode == 2 and b"creates none" in missing.stderr
    assert json.loads(ok("exchanges", "--json")) == [
        {
            "name": "events",
            "kind": "topic",
            "durable": True,
            "auto_delete": False,
            "internal": False,
            "alternate_exchange": "spill",
        }
    ]
    assert json.loads(ok("bindings", "--json")) == [
        {"exchange": "events", "queue": "audit", "routing_key": "order.*"}
    ]
    assert ok("exchanges").splitlines()[2].split() == ["events", "topic", "yes", "spill"]
    ok("unbind", "audit", "events", "--routing-key", "order.*")
    ok("delete-exchange", "events")
    assert json.loads(ok("exchanges", "--json")) == [] == json.loads(ok("bindings", "--json"))
    assert node.list_queues() == ["audit"]
    assert ok("consume", "audit") == "paid\n"
    refused = warren("declare", "queue", "audit", "--data-dir", data_dir)  # other arguments
    assert refused.returncode == 2 and refused.stderr.count(b"\n") == 1
    assert b"exists with max_length=10" in refused.stderr


def test_a_shell_user_declares_a_super_stream_publishes_by_key_and_sees_its_partitions(
    node, data_dir
):
    def run(*arguments, stdin=None):
        return warren(*arguments, "--data-dir", data_dir, stdin=stdin)

    declared = run("declare", "queue", "invoices", "--type", "super-stream", "--partitions", "3")
    assert declared.returncode == 0, declared.stderr
    assert declared.stdout == (
        b"declared super stream invoices: 3 partitions (invoices-0 .. invoices-2), 0 records\n"
    )
    for key in ("customer-1", "customer-2", "customer-1"):
        assert run("publish", key, "--exchange", "invoices", stdin=b"x\n").returncode == 0
    table = run("streams").stdout.decode()
    assert table.splitlines()[-1] == (
        "super stream invoices: 3 partitions (invoices-0, invoices-1, invoices-2)"
    )
    rows = {row["name"]: row["stats"] for row in json.loads(run("streams", "--json").stdout)}
    assert [rows[f"invoices-{n}"]["partition"] for n in range(3)] == [0, 1, 2]
    held = [rows[f"invoices-{n}"]["messages_ready"] for n in range(3)]
    first, second = partition_of("customer-1", 3), partition_of("customer-2", 3)
    assert held[first] == 2 + (first == second) and sum(held) == 3
    again = run("declare", "queue", "invoices", "--type", "super-stream", "--partitions", "4")
    assert again.returncode == 2 and b"has 3 partitions, not 4" in again.stderr
    alone = run("declare", "queue", "solo", "--partitions", "4")
    assert alone.returncode == 2 and b"partitions" in alone.stderr
    assert run("delete", "invoices").returncode == 0
    assert node.list_queues() == []


def test_every_command_reaches_a_node_over_tcp_with_url(tmp_path):
    with Node(tmp_path / "data", listen="tcp://127.0.0.1:*") as node:
        url = node.listen_endpoint
        declared = warren("declare", "queue", "remote", "--url", url)
        assert declared.returncode == 0, declared.stderr
        warren("publish", "remote", "--url", url, stdin=b"over tcp\n")
        consumed = warren("consume", "remote", "--url", url)
        assert consumed.stdout == b"over tcp\n", consumed.stderr
        assert node.list_queues() == ["remote"]


@pytest.mark.parametrize(
    ("arguments", "complaint"),
    [
        (["--url", "tcp://127.0.0.1"], b"tcp://HOST:PORT, with a port in 1..65535"),
        (["--url", "tcp://127.0.0.1:70000"], b"tcp://HOST:PORT, with a port in 1..65535"),
        (["--data-dir", "somewhere", "--key-file", "k.key"], b"--key-file goes with --url"),
    ],
)
def test_a_bad_node_address_is_one_line_and_exit_2(arguments, complaint):
    done = warren("queues", *arguments)
    assert done.returncode == 2
    assert complaint in done.stderr and b"Traceback" not in done.stderr


def strict(text):
    """JSON as a strict parser reads it: Infinity and NaN refused."""

    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_json_output_is_strict_and_counts_speak_in_the_singular_too(node, data_dir):
    node.declare_queue("orders")  # a default queue's RAM target is infinite
    listed = warren("queues", "--data-dir", data_dir, "--json")
    assert strict(listed.stdout)[0]["stats"]["target_ram_count"] is None
    status = warren("status", "--data-dir", data_dir, "--json")
    assert strict(status.stdout)["state"] == "running"
    one = warren("publish", "orders", "--data-dir", data_dir, stdin=b"only\n")
    assert b"published 1 message\n" in one.stderr
    sized = warren("publish", "orders", "--data-dir", data_dir, "--count", "2", "--size", "2KiB")
    assert sized.returncode == 0, sized.stderr
    assert [len(d.body) for d in drain_all(node, "orders")] == [4, 2048, 2048]
    purged = warren("purge", "orders", "--data-dir", data_dir)
    assert purged.stdout.decode().strip() == "purged 0 messages from orders"
    bad = warren("publish", "orders", "--data-dir", data_dir, "--count", "1", "--size", "2XB")
    assert bad.returncode == 2 and b"unknown unit" in bad.stderr


def drain_all(node, queue):
    connection = node.connect()
    deliveries = []
    while (delivery := connection.get(queue)) is not None:
        delivery.ack()
        deliveries.append(delivery)
    return deliveries


def ready(node, queue):
    return node.connect().queue_stats(queue)["messages_ready"]


def ready_once_unsubscribed(node, queue):
    """``messages_ready`` once the queue has let go of every consumer and what they held:
    a consume that ended has sent its cancel, but the queue may take it after another
    connection's question."""
    connection = node.connect()

    def settled():
        stats = connection.queue_stats(queue)
        return stats["consumers"] == 0 and stats["messages_unacked"] == 0

    wait_for(settled, timeout=60)
    return connection.queue_stats(queue)["messages_ready"]


def test_consume_into_head_through_a_shell_pipe_acks_exactly_what_head_read(node, data_dir):
    node.declare_queue("orders")
    node.connect().publish_many("orders", [b"order %d" % n for n in range(50)])
    command = " ".join([*WARREN, "consume", "orders", "--data-dir", data_dir]) + " | head -3"
    shell = subprocess.run(["bash", "-c", command], cwd=ROOT, capture_output=True, timeout=60)
    assert shell.stdout == b"order 0\norder 1\norder 2\n"
    assert b"Traceback" not in shell.stderr
    assert ready_once_unsubscribed(node, "orders") == 47


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_consume_stopped_by_a_signal_acked_exactly_what_its_reader_took(
    node, data_dir, stop_signal
):
    """The reader takes lines slowly; the signal lands mid-stream. What the reader got was
    acked, everything else is back in the queue: nothing lost, nothing acked unread."""
    node.declare_queue("orders")
    node.connect().publish_many("orders", [b"order %d" % n for n in range(300)])
    consumer = subprocess.Popen(
        [*WARREN, "consume", "orders", "--data-dir", data_dir, "--timeout", "30"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        taken = [consumer.stdout.readline() for _ in range(20)]
        consumer.send_signal(stop_signal)
        taken += consumer.stdout.read().splitlines(keepends=True)
        assert consumer.wait(timeout=30) == 130
        said = consumer.stderr.read().decode()
    finally:
        consumer.kill()
        consumer.wait()
        consumer.stdout.close()
        consumer.stderr.close()
    assert taken[:3] == [b"order 0\n", b"order 1\n", b"order 2\n"]
    assert said.splitlines()[-1] == f"warren: stopped by {stop_signal.name}"
    # Each of the first lines goes out once the reader took the one before it; the one
    # written as the signal came may still sit in the pipe when the consume settles: not
    # taken then, so back in the queue (at least once), though this reader reads it after.
    assert ready_once_unsubscribed(node, "orders") in (300 - len(taken), 300 - len(taken) + 1)
    read = [line.rstrip(b"\n") for line in taken]
    drained = drain_all(node, "orders")
    rest = [delivery.body for delivery in drained]
    assert sorted(set(read + rest)) == sorted(b"order %d" % n for n in range(300))
    assert len(read) == len(set(read)) and len(rest) == len(set(rest))
    read_and_requeued = [delivery for delivery in drained if delivery.body in read]
    assert len(read_and_requeued) <= 1
    assert all(delivery.redelivered for delivery in read_and_requeued)


def test_a_consume_whose_node_is_killed_ends_in_seconds_with_one_line(tmp_path):
    data_dir = str(tmp_path / "data")
    consumer = None
    try:
        with node_to_kill(data_dir) as node:
            assert warren("declare", "queue", "orders", "--data-dir", data_dir).returncode == 0
            consumer = subprocess.Popen(
                [*WARREN, "consume", "orders", "--data-dir", data_dir, "--timeout", "60"],
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            with connect(data_dir) as watcher:  # until it consumes the empty queue
                wait_for(lambda: watcher.queue_stats("orders")["consumers"] == 1, timeout=60)
            os.killpg(node.pid, signal.SIGKILL)
            assert consumer.wait(timeout=20) == 1
            complaint = consumer.stderr.read().decode()
            assert complaint.startswith("warren: ") and complaint.count("\n") == 1
    finally:
        if consumer is not None:
            consumer.kill()
            consumer.wait()
            consumer.stderr.close()


@contextlib.contextmanager
def node_to_kill(data_dir, *options):
    """``warren node`` in a process group of its own, served; killed whole at the end."""
    node = subprocess.Popen(
        [*WARREN, "node", "--data-dir", data_dir, *options],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_for_node(data_dir)
        yield node
    finally:
        kill_node(node)


def kill_node(node):
    """SIGKILL the node's process group (``kill -9 -PGID``) and wait until every process
    of the node is gone. Its actors are not in that group: they live in their
    forkserver's, which stops them in order once it sees the node gone (seconds later on
    a loaded machine); until then a queue still confirms what its publishers send it,
    truthfully (it is in the queue after a restart). A node already dead: reaped."""
    if node.poll() is not None:
        return
    groups = set()
    for process in psutil.Process(node.pid).children(recursive=True):
        with contextlib.suppress(ProcessLookupError):
            groups.add(os.getpgid(process.pid))
    with contextlib.suppress(ProcessLookupError):
        os.killpg(node.pid, signal.SIGKILL)
    node.wait()
    wait_for(lambda: not any(map(group_alive, groups)), timeout=90)


def wait_for_node(data_dir):
    deadline = time.monotonic() + 60
    while warren("queues", "--data-dir", data_dir).returncode != 0:
        assert time.monotonic() < deadline, "the node did not start"
        time.sleep(0.2)  # pacing of a poll that the deadline above bounds


def test_consume_json_lines_show_headers_ids_and_the_redelivered_flag(node, data_dir):
    node.declare_queue("orders")
    connection = node.connect()
    connection.publish("orders", b"first", headers={"k": "v"}, message_id="m-1")
    connection.publish("orders", b"\xff binary")
    peeked = warren("consume", "orders", "--data-dir", data_dir, "--count", "1", "--requeue")
    assert peeked.stdout == b"first\n"
    shown = warren("consume", "orders", "--data-dir", data_dir, "--json")
    lines = [json.loads(line) for line in shown.stdout.splitlines()]
    assert lines[0]["body"] == "first" and lines[0]["headers"] == {"k": "v"}
    assert (lines[0]["message_id"], lines[0]["redelivered"]) == ("m-1", True)
    assert lines[1]["body_base64"] == "/yBiaW5hcnk=" and lines[1]["redelivered"] is False


def test_publish_sends_each_line_as_it_arrives_and_says_what_an_interrupt_left(node, data_dir):
    """Like ``tail -f | warren publish``: a line is published while stdin stays open, and
    Ctrl-C then ends it with the count confirmed, no traceback."""
    node.declare_queue("log")
    publisher = subprocess.Popen(
        [*WARREN, "publish", "log", "--data-dir", data_dir],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        for n in range(3):
            publisher.stdin.write(b"line %d\n" % n)
            publisher.stdin.flush()
            deadline = time.monotonic() + 30
            while ready(node, "log") < n + 1:
                assert time.monotonic() < deadline, f"line {n} was held back"
                time.sleep(0.05)  # pacing of a poll that the deadline above bounds
        publisher.send_signal(signal.SIGINT)
        assert publisher.wait(timeout=30) == 130
        said = publisher.stderr.read().decode()
    finally:
        publisher.kill()
        publisher.wait()
        publisher.stdin.close()
        publisher.stderr.close()
    assert "published 3 messages" in said and "stopped by SIGINT" in said
    assert "Traceback" not in said
    assert [d.body for d in drain_all(node, "log")] == [b"line 0", b"line 1", b"line 2"]


def test_a_line_over_the_message_limit_is_refused_at_once_in_one_line(node, data_dir):
    node.declare_queue("orders")
    too_long = b"x" * (MAX_MESSAGE_BYTES + 1)
    refused = warren("publish", "orders", "--data-dir", data_dir, stdin=b"first\n" + too_long)
    assert refused.returncode == 2
    assert refused.stderr.decode().splitlines() == [
        f"warren: line 2 of the input is over {MAX_MESSAGE_BYTES:,} bytes, the largest "
        "message; it was not sent (1 message published before it)"
    ]
    assert node.connect().queue_stats("orders")["messages_ready"] == 1


def test_a_consume_whose_reader_closes_the_pipe_mid_stream_loses_nothing(node, data_dir):
    """The reader takes 100 whole lines and half of the next, then closes its end: those
    100 were acked, every other message is back in the queue (the one cut in half too)."""
    node.declare_queue("orders")
    bodies = [b"order %03d" % n for n in range(300)]  # 10 bytes a line with its newline
    node.connect().publish_many("orders", bodies)
    consumer = subprocess.Popen(
        [*WARREN, "consume", "orders", "--data-dir", data_dir, "--timeout", "30"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        taken = b""
        while len(taken) < 1005:
            chunk = os.read(consumer.stdout.fileno(), 1005 - len(taken))
            assert chunk, consumer.stderr.read()
            taken += chunk
        consumer.stdout.close()  # mid-stream, mid-line
        assert consumer.wait(timeout=60) == 0
        said = consumer.stderr.read().decode()
    finally:
        if consumer.poll() is None:
            consumer.kill()
            consumer.wait()
        consumer.stderr.close()
    assert "Traceback" not in said and said.splitlines()[-1] == "consumed 100 messages"
    assert taken.split(b"\n")[:100] == bodies[:100]
    assert ready(node, "orders") == 200
    assert sorted(d.body for d in drain_all(node, "orders")) == bodies[100:]


def test_names_that_start_with_a_dash_are_given_after_double_dash(node, data_dir):
    declared = warren("declare", "queue", "--", "-audit", "--data-dir", data_dir, "--lazy")
    assert declared.returncode == 0, declared.stderr
    published = warren("publish", "--data-dir", data_dir, "--", "-audit", stdin=b"kept\n")
    assert published.returncode == 0, published.stderr
    assert warren("consume", "--", "-audit", "--data-dir", data_dir).stdout == b"kept\n"
    assert node.list_queues() == ["-audit"]
    as_option = warren("declare", "queue", "-audit", "--data-dir", data_dir)
    assert as_option.returncode == 2
    assert b"a name that starts with '-' goes after '--'" in as_option.stderr


@pytest.mark.parametrize("command", [["status", "--json"], ["queues", "--json"]])
def test_json_into_a_reader_that_left_ends_quietly(node, data_dir, command):
    """``warren status --json | head``: no BrokenPipeError traceback, SIGPIPE's status."""
    node.declare_queue("orders")
    code, said = printed_to_a_reader_that_left(*command, "--data-dir", data_dir)
    assert (code, said) == (141, "")


@pytest.mark.parametrize("over", ["ipc", "tcp"])
def test_a_publish_whose_node_is_killed_says_from_which_line_to_resume(tmp_path, over):
    """Locally the node's pid is seen gone; over tcp the listener stops answering, and a
    new connection is refused within seconds: either way one line, exit 1."""
    data_dir = str(tmp_path / "data")
    publisher = None
    try:
        with node_to_kill(data_dir, "--listen", "tcp://127.0.0.1:*") as node:
            assert warren("declare", "queue", "orders", "--data-dir", data_dir).returncode == 0
            with open(os.path.join(data_dir, "node.json")) as file:
                url = json.load(file)["listen_endpoint"]
            where = ["--data-dir", data_dir] if over == "ipc" else ["--url", url]
            publisher = subprocess.Popen(
                [*WARREN, "publish", "orders", *where],
                cwd=ROOT,
                stdin=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            publisher.stdin.write(b"".join(b"line %d\n" % n for n in range(1, 101)))
            publisher.stdin.flush()
            wait_for(lambda: queue_figure(data_dir, "orders", "confirmed") == 100, timeout=60)
            kill_node(node)  # no process of the node left to confirm the next lines
            publisher.stdin.write(b"line 101\nline 102\n")
            publisher.stdin.close()
            assert publisher.wait(timeout=60) == 1  # the node went away: not bad usage
            said = publisher.stderr.read().decode().splitlines()
    finally:
        if publisher is not None:
            publisher.kill()
            publisher.wait()
            publisher.stderr.close()
    assert said[-1].startswith(
        "warren: the node went away: 100 lines of the input confirmed; publish again from "
        "line 101 (tail -n +101); line"
    ), said


def test_a_confirm_awaited_in_short_waits_says_the_node_went_away_at_the_first(tmp_path):
    """``warren publish`` waits for a confirm a second at a time (to look at its stop
    signals): a wait of that length on a node whose processes are all gone says so,
    rather than time out again and again until the command looks at the node itself."""
    data_dir = str(tmp_path / "data")
    with node_to_kill(data_dir) as node:
        assert warren("declare", "queue", "orders", "--data-dir", data_dir).returncode == 0
        with connect(data_dir, recover=False) as connection:
            connection.publish_many("orders", [b"before"])
            kill_node(node)
            confirm = connection.publish_many_async("orders", [b"after"], awaited=True)
            with pytest.raises(ConnectionClosed, match="the node went away"):
                confirm.result(timeout=1.0)


def queue_figure(data_dir, queue, figure):
    listed = warren("queues", "--data-dir", data_dir, "--json")
    rows = json.loads(listed.stdout) if listed.stdout else []
    return next((row["stats"][figure] for row in rows if row["name"] == queue), None)


def test_ctrl_c_during_a_counted_publish_says_how_many_were_confirmed(node, data_dir):
    node.declare_queue("orders")
    publisher = subprocess.Popen(
        [*WARREN, "publish", "orders", "--data-dir", data_dir, "--count", "10000000"],
        cwd=ROOT,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for(lambda: ready(node, "orders") > 0, timeout=60)
        publisher.send_signal(signal.SIGINT)
        assert publisher.wait(timeout=60) == 130
        said = publisher.stderr.read().decode().splitlines()
    finally:
        publisher.kill()
        publisher.wait()
        publisher.stderr.close()
    last = re.fullmatch(
        r"warren: stopped by SIGINT: ([\d,]+) of 10,000,000 messages confirmed", said[-1]
    )
    assert last, said
    assert int(last.group(1).replace(",", "")) == ready(node, "orders")

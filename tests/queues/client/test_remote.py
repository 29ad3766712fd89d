"""Remote clients over tcp through the node's listener, with and without CURVE keys;
hostile frames; and publisher deduplication across kills of the queue and the listener."""

import math
import os
import re
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import zmq

from warren import AlarmLimits, connect
from warren.actors import wire
from warren.actors.codec import Encoder
from warren.errors import WarrenError
from warren.queues import (
    Blocked,
    MessageTooLarge,
    Nacked,
    NotFound,
    PreconditionFailed,
)
from warren.queues.broker.listener import ListenerStats, with_free_port
from warren.queues.client.keys import AUTHORIZED_FILE, create_client_key
from warren.queues.client.tcp_node import TcpNode
from warren.queues.errors import AccessRefused, KeyFileError, NodeNotRunning
from warren.queues.message import MAX_MESSAGE_BYTES
from warren.queues.protocol import DeleteQueue, Fetch, Publish
from warren.supervisor import Node
from warren.supervisor.errors import InvalidSpec

from ...waiting import wait_for

ROOT = Path(__file__).resolve().parents[3]
WARREN = [sys.executable, "-m", "warren.supervisor.cli"]
LOOPBACK_ANY_PORT = "tcp://127.0.0.1:*"
REFUSAL_BOUND_S = 300  # a handshake refused comes long before: the bound never decides


@pytest.fixture
def data_dir(tmp_path):
    return tmp_path / "data"


@pytest.fixture
def node(data_dir):
    with Node(
        data_dir, listen=LOOPBACK_ANY_PORT, listener_options={"consumer_silence_s": 2.0}
    ) as running:
        yield running


@pytest.fixture
def curve_node(data_dir):
    with Node(data_dir, listen=LOOPBACK_ANY_PORT, curve=True) as running:
        yield running


def listener_stats(node):
    return node.actors.whereis("listener").ask(ListenerStats())


def test_a_connect_whose_first_listener_stops_before_answering_asks_the_next_one(tmp_path):
    # A recovering client connects while the node is killed again: its first request
    # reaches a listener that stops without answering, and the node's next listener
    # must be asked again, not waited on for the whole connect timeout.
    endpoint = with_free_port("tcp://127.0.0.1:*")
    dying = zmq.Context.instance().socket(zmq.ROUTER)
    dying.bind(endpoint)
    connected: list = []
    connecting = threading.Thread(
        target=lambda: connected.append(TcpNode(endpoint, connect_timeout_s=600)), daemon=True
    )
    connecting.start()
    try:
        assert dying.poll(30_000), "the client sent nothing"
        dying.recv_multipart()  # its boot request, never answered
        dying.close(linger=0)
        with Node(tmp_path / "data", listen=endpoint):
            connecting.join(60)
            assert connected, "the client waited on the listener that had stopped"
            assert connected[0].list_queues() == []
    finally:
        for node in connected:
            node.close()


def test_a_remote_client_declares_publishes_consumes_and_acks_like_a_local_one(node):
    with connect(node.listen_endpoint) as remote:
        remote.declare_exchange("events", kind="fanout")
        for queue in ("billing", "shipping"):
            remote.declare_queue(queue)
            remote.bind_queue(queue, "events")
        remote.publish("", b"order 1", exchange="events", headers={"region": "eu"})
        assert remote.publish_many("billing", [b"b%d" % i for i in range(1000)]) == 1000
        assert sorted(remote.list_queues()) == ["billing", "shipping"]
        first = remote.get("shipping")
        assert (first.body, first.headers) == (b"order 1", {"region": "eu"})
        first.ack()
        bodies = []
        with remote.consume("billing", prefetch=50) as consumer:
            for delivery in consumer:
                bodies.append(delivery.body)
                delivery.ack()
                if len(bodies) == 1001:
                    break
        assert bodies == [b"order 1"] + [b"b%d" % i for i in range(1000)]
        assert remote.queue_stats("billing")["depth"] == 0
        with pytest.raises(NotFound):
            remote.publish("nowhere", b"x")
    local = node.connect()
    assert local.get("shipping") is None


def test_a_remote_consumer_killed_holding_deliveries_has_them_redelivered(node):
    node.declare_queue("jobs")
    node.connect().publish_many("jobs", [b"j1", b"j2", b"j3"])
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.queues.consumer_child", node.listen_endpoint, "jobs", "2"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
    )
    try:
        assert child.stdout.readline().split() == [b"j1", b"j2"]
        child.kill()
        child.wait()
        local = node.connect()
        # The listener releases a consumer it has not heard of for consumer_silence_s.
        wait_for(lambda: local.queue_stats("jobs")["messages_ready"] == 3, timeout=30)
        again = [local.get("jobs") for _ in range(3)]
        assert sorted(d.body for d in again) == [b"j1", b"j2", b"j3"]
        assert sorted(d.redelivered for d in again) == [False, True, True]
    finally:
        child.kill()
        child.wait()
        child.stdout.close()


def test_a_client_with_a_key_is_let_in_and_one_without_or_with_an_unknown_key_is_refused(
    curve_node, data_dir, tmp_path
):
    secret = os.path.join(data_dir, "node.key_secret")
    assert stat.S_IMODE(os.stat(secret).st_mode) == 0o600
    key = create_client_key(data_dir, "alice", tmp_path)
    assert stat.S_IMODE(os.stat(key).st_mode) == 0o600
    with connect(curve_node.listen_endpoint, key_file=key) as alice:
        alice.declare_queue("private")
        alice.publish("private", b"secret")
        assert alice.get("private").body == b"secret"
    # Refused at once, however slow the machine: the refusal, not the bound, ends it.
    with pytest.raises(AccessRefused, match="wants a key"):
        connect(curve_node.listen_endpoint, connect_timeout_s=REFUSAL_BOUND_S)
    # A key made for another node: the handshake fails (it names another node's key).
    other = tmp_path / "other"
    other.mkdir()
    stranger = create_client_key(other, "stranger", tmp_path)
    with pytest.raises(NodeNotRunning, match="refuses this key"):
        connect(curve_node.listen_endpoint, key_file=stranger, connect_timeout_s=1.0)
    # Removing alice's line from authorized_keys shuts her out from her next connection
    # on, at once: the node refuses her key, logs it and counts it. The connection she
    # opened before goes on working until it closes (docs/broker.md says so).
    opened_before = connect(curve_node.listen_endpoint, key_file=key)
    path = os.path.join(data_dir, AUTHORIZED_FILE)
    with open(path) as file:
        kept = [line for line in file if not line.rstrip().endswith(" alice")]
    with open(path, "w") as file:
        file.writelines(kept)
    with opened_before:
        with pytest.raises(AccessRefused, match="refuses this key"):
            connect(curve_node.listen_endpoint, key_file=key, connect_timeout_s=REFUSAL_BOUND_S)
        opened_before.declare_queue("after")
        opened_before.publish("after", b"still open")
        assert opened_before.get("after").body == b"still open"
    assert listener_stats(curve_node)["clients_refused"] >= 1


def test_a_key_used_against_a_node_without_curve_is_refused_at_once_in_one_line(
    node, data_dir, tmp_path
):
    key = create_client_key(data_dir, "alice", tmp_path)
    with pytest.raises(AccessRefused, match="does not use keys .* connect without a key file"):
        connect(node.listen_endpoint, key_file=key, connect_timeout_s=REFUSAL_BOUND_S)
    refused = subprocess.run(
        [*WARREN, "queues", "--url", node.listen_endpoint, "--key-file", key],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2
    assert refused.stderr.splitlines() == [
        f"warren: the node at {node.listen_endpoint} does not use keys (it runs without "
        "--curve): connect without a key file"
    ]
    garbage = tmp_path / "garbage.key"
    garbage.write_bytes(bytes(range(128, 256)))
    with pytest.raises(KeyFileError, match="is not a Warren client key file: it is not text"):
        connect(node.listen_endpoint, key_file=garbage)


def test_warren_keys_writes_a_private_key_file_and_refuses_bad_names_and_overwrites(
    data_dir, tmp_path
):
    data_dir.mkdir()
    made = subprocess.run(
        [*WARREN, "keys", "--data-dir", str(data_dir), "spark-executor", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    text = (tmp_path / "spark-executor.key").read_text()
    assert "public-key" in text and "secret-key" in text and "server-key" in text
    assert (data_dir / AUTHORIZED_FILE).read_text().split()[1] == "spark-executor"
    for name in ("../escape", "", "a b"):
        bad = subprocess.run(
            [*WARREN, "keys", "--data-dir", str(data_dir), name, "--out", str(tmp_path)],
            cwd=ROOT,
            capture_output=True,
            timeout=60,
        )
        assert bad.returncode == 2 and b"key name" in bad.stderr, bad.stderr
    again = subprocess.run(
        [*WARREN, "keys", "--data-dir", str(data_dir), "spark-executor", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        timeout=60,
    )
    assert again.returncode == 2 and b"exists" in again.stderr
    (tmp_path / "broken.key").write_text('curve\n    public-key = "short"\n')
    with pytest.raises(KeyFileError, match="not a Warren client key"):
        connect("tcp://127.0.0.1:1", key_file=tmp_path / "broken.key")


def test_a_listener_on_a_non_loopback_address_needs_curve_or_an_explicit_insecure(data_dir):
    with pytest.raises(InvalidSpec, match="not a loopback address"):
        Node(data_dir, listen="tcp://0.0.0.0:5673")
    with pytest.raises(InvalidSpec, match="tcp://host:port"):
        Node(data_dir, listen="ipc:///tmp/x")
    refused = subprocess.run(
        [*WARREN, "node", "--data-dir", str(data_dir), "--listen", "tcp://0.0.0.0:5673"],
        cwd=ROOT,
        capture_output=True,
        timeout=60,
    )
    assert refused.returncode == 2 and b"--insecure" in refused.stderr
    assert not data_dir.exists()  # refused before anything started


def test_hostile_frames_are_answered_or_dropped_and_counted_and_the_listener_serves_on(node):
    node.declare_queue("q")
    pid = node.actors.whereis("listener").pid
    context = zmq.Context()
    raw = context.socket(zmq.DEALER)
    raw.linger = 0
    raw.rcvtimeo = 5000
    raw.connect(node.listen_endpoint)
    encoder = Encoder()
    try:
        raw.send_multipart(encoder.encode(["boot", 1]))
        boot = _answer(raw)[2]
        raw.send(b"\xc1 not msgpack")  # dropped: no id to answer
        raw.send_multipart(encoder.encode({"op": "ask"}))  # not a list: dropped
        raw.send_multipart(encoder.encode(["ask", 7, boot, "q", 1, DeleteQueue()]))
        kind, request_id, (type_name, text, _) = _answer(raw)
        assert (kind, request_id, type_name) == (wire.REPLY_ERROR, 7, "UnhandledMessage")
        raw.send_multipart(encoder.encode(["call", 8, "close", {}]))
        assert _answer(raw)[2][1].startswith("no call 'close'")
        raw.send_multipart(encoder.encode(["call", 9, "declare_queue", {"name": 5}]))
        assert _answer(raw)[0] == wire.REPLY_ERROR
        raw.send_multipart(encoder.encode(["ask", 10, boot, "q", 1, Publish([1, 2], True)]))
        assert "malformed Publish" in _answer(raw)[2][1]
        raw.send_multipart(encoder.encode(["ask", 11, boot, "q", 1, Fetch(b"c", 1, 10**9, True)]))
        assert "count must be" in _answer(raw)[2][1]
        raw.send_multipart(encoder.encode(["ask", 12, boot, ["q"], "one", Publish([], True)]))
        assert _answer(raw)[2][0] == "ValueError"
        # A request meant for an earlier listener (another boot) is refused, not done.
        raw.send_multipart(
            encoder.encode(["ask", 13, b"earlier!", "q", 1, Publish([b"stale"], True)])
        )
        assert _answer(raw)[2][0] == "ListenerRestarted"
        raw.send_multipart([b"x" * (65 * 2**20)])  # over the frame limit
    finally:
        raw.close()
        context.term()
    assert node.actors.whereis("listener").pid == pid
    stats = listener_stats(node)
    assert stats["malformed"] >= 3 and stats["refused"] >= 2 and stats["stale"] == 1
    with connect(node.listen_endpoint) as remote:
        remote.publish("q", b"still served")
        assert remote.get("q").body == b"still served"


def _answer(socket):
    from warren.actors.codec import Decoder

    return Decoder().decode(socket.recv_multipart())


def test_a_producer_resending_after_a_queue_sigkill_adds_no_duplicates(node):
    node.declare_queue("orders")
    remote = connect(node.listen_endpoint)
    total, chunk = 40_000, 500
    kill_at = [5_000, 20_000]
    progress = {"sent": 0}
    stop = threading.Event()
    killed_while_sending: list[bool] = []

    def kill_the_queue_at_each_mark():
        for mark in kill_at:
            while progress["sent"] < mark and not stop.is_set():
                stop.wait(0.001)
            pid = node.queue("orders").pid
            os.kill(pid, signal.SIGKILL)
            killed_while_sending.append(progress["sent"] < total)
            wait_for(
                lambda pid=pid: (
                    node.queue_state("orders") == "running" and node.queue("orders").pid != pid
                )
            )

    killer = threading.Thread(target=kill_the_queue_at_each_mark)
    killer.start()
    attempts = 0
    try:
        while progress["sent"] < total:
            # Each attempt re-sends everything from the start, as a retried task does.
            attempts += 1
            assert attempts < 20
            try:
                for start in range(0, total, chunk):
                    remote.publish_many(
                        "orders",
                        [b"order %d" % i for i in range(start, start + chunk)],
                        producer_id="job-1/partition-0",
                        sequence=start,
                    )
                    progress["sent"] = max(progress["sent"], start + chunk)
            except Exception:
                continue
    finally:
        stop.set()
        killer.join()
    assert killed_while_sending == [True, True]  # both kills landed mid-publish
    remote.close()
    local = node.connect()
    stats = local.queue_stats("orders")
    assert stats["len"] == total
    bodies = []
    while (delivery := local.get("orders", ack=False)) is not None:
        bodies.append(delivery.body)
    assert sorted(bodies) == sorted(b"order %d" % i for i in range(total))


def test_a_listener_killed_mid_publish_restarts_on_its_port_and_the_client_recovers_alone(node):
    node.declare_queue("events")
    remote = connect(node.listen_endpoint, idempotent=True)
    pid = node.actors.whereis("listener").pid
    killed = threading.Event()

    def kill_the_listener():
        os.kill(pid, signal.SIGKILL)
        killed.set()

    threading.Timer(0.2, kill_the_listener).start()
    sent = 0
    while True:
        # A batch answered by the old listener can still be taken after the kill: only
        # one sent after it shows the restarted listener at work. The batches in doubt
        # are sent again by the connection itself, with its own producer id
        # (idempotent), which the queue drops as repeats where it took them.
        sent_after_the_kill = killed.is_set()
        remote.publish_many("events", [b"e%d" % i for i in range(sent, sent + 500)])
        sent += 500
        if sent_after_the_kill and sent >= 10_000:
            break
    assert remote.recoveries == 1
    assert node.actors.whereis("listener").pid != pid
    assert remote.queue_stats("events")["len"] == sent
    remote.close()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_listener_stopped_by_a_signal_comes_back_and_an_idle_client_goes_on(node, signum):
    node.declare_queue("orders")
    remote = connect(node.listen_endpoint)
    remote.publish("orders", b"before")
    pid = node.actors.whereis("listener").pid
    os.kill(pid, signum)
    wait_for(lambda: getattr(node.actors.whereis("listener"), "pid", pid) != pid, timeout=30)
    sent = 0
    for _ in range(5):  # the first may be in doubt: the listener changed
        try:
            remote.publish("orders", b"after", producer_id="idle", sequence=0)
            sent += 1
            break
        except Nacked:
            continue
    assert sent == 1
    assert [remote.get("orders").body for _ in range(2)] == [b"before", b"after"]
    remote.close()


def test_under_a_disk_alarm_a_remote_publisher_is_held_then_told(tmp_path):
    full = AlarmLimits(disk_free_limit_bytes=2**60, check_interval_s=0.1)  # the disk "full"
    with Node(tmp_path / "data", alarm_limits=full, listen=LOOPBACK_ANY_PORT) as node:
        node.declare_queue("orders")
        with connect(node.listen_endpoint, call_timeout_s=0.5) as remote:
            wait_for(lambda: remote.blocked)
            with pytest.raises(Blocked, match="disk alarm has held this publish"):
                remote.publish("orders", b"held")
        assert node.connect().queue_stats("orders")["len"] == 0


@pytest.mark.parametrize("transport", ["in-process", "ipc", "tcp"])
def test_a_node_call_refused_raises_the_same_class_over_every_transport(node, transport):
    """The node's refusals reach a client as the classes a user catches, whichever way the
    call travelled: unknown queue, a re-declare with other arguments, a bad argument."""
    target = {"in-process": None, "ipc": node.data_dir, "tcp": node.listen_endpoint}[transport]
    with node.connect() if target is None else connect(target) as client:
        client.declare_queue("orders", max_length=10)
        with pytest.raises(NotFound):
            client.delete_queue("no such queue")
        with pytest.raises(PreconditionFailed):
            client.declare_queue("orders", max_length=20)
        with pytest.raises(ValueError, match="overflow"):
            client.declare_queue("other", overflow="sideways")
        with pytest.raises(TypeError):
            client.declare_queue("other", colour="blue")
        with pytest.raises(ValueError, match="name"):
            client.declare_exchange("x" * 256)


def test_a_node_call_the_node_answers_slowly_still_succeeds_over_tcp(node, monkeypatch):
    """The listener asks the node on the client's behalf and, while it waits, looks
    whether the node lives; a node that takes longer than one look to answer (a busy
    machine, a large declare) is waited for, not an error."""
    declare = node.declare_queue

    def slow_declare(*args, **kwargs):
        time.sleep(1.0)  # several of the listener's liveness looks
        return declare(*args, **kwargs)

    monkeypatch.setattr(node, "declare_queue", slow_declare)
    with connect(node.listen_endpoint) as remote:
        assert remote.declare_queue("slow") == ("slow", 0, 0)
        assert remote.list_queues() == ["slow"]


@pytest.mark.parametrize("transport", ["in-process", "ipc", "tcp"])
def test_bindings_and_exchanges_are_listed_undone_and_deleted_over_every_transport(node, transport):
    target = {"in-process": None, "ipc": node.data_dir, "tcp": node.listen_endpoint}[transport]
    with node.connect() if target is None else connect(target) as client:
        client.declare_exchange("events", kind="topic")
        client.declare_queue("audit")
        client.bind_queue("audit", "events", "order.*")
        assert client.list_exchanges() == [
            {
                "name": "events",
                "kind": "topic",
                "durable": True,
                "auto_delete": False,
                "internal": False,
                "alternate_exchange": "",
            }
        ]
        assert client.list_bindings() == [
            {"exchange": "events", "queue": "audit", "routing_key": "order.*"}
        ]
        client.publish("order.paid", b"routed", exchange="events")
        client.unbind_queue("audit", "events", "order.*")
        client.unbind_queue("audit", "events", "order.*")  # a second time changes nothing
        assert client.list_bindings() == []
        client.delete_exchange("events")
        assert client.list_exchanges() == []
        with pytest.raises(NotFound):
            client.delete_exchange("events")
        with pytest.raises(NotFound):
            client.publish("order.paid", b"nowhere to go", exchange="events")
        assert client.get("audit").body == b"routed"
        assert client.list_queues() == ["audit"]


@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_the_largest_message_goes_through_and_one_byte_more_is_refused_at_once(node, transport):
    """One limit, MAX_MESSAGE_BYTES encoded, locally and over tcp: a message at the limit
    is confirmed and read back whole; one over it is refused before anything is sent."""
    target = {"ipc": node.data_dir, "tcp": node.listen_endpoint}[transport]
    largest = MAX_MESSAGE_BYTES - 64  # room for its properties, the timestamp among them
    with connect(target) as client:
        client.declare_queue("big")
        client.publish("big", b"x" * (largest))
        with pytest.raises(MessageTooLarge, match=f"above the maximum of {MAX_MESSAGE_BYTES}"):
            client.publish("big", b"x" * MAX_MESSAGE_BYTES)
        assert client.queue_stats("big")["messages_ready"] == 1
        delivery = client.get("big")
        assert len(delivery.body) == largest
        delivery.ack()


UTF8_NAMES = ["заказы", "🚀 launch/queue", ".", "..", "é" * 127 + "x"]  # the last: 255 bytes


@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_queue_names_are_any_utf8_text_as_rabbitmq_allows(node, transport):
    target = {"ipc": node.data_dir, "tcp": node.listen_endpoint}[transport]
    with connect(target) as client:
        client.declare_exchange("événements", kind="fanout")
        for name in UTF8_NAMES:
            client.declare_queue(name)
            client.bind_queue(name, "événements")
        client.publish("", "ünïcode".encode(), exchange="événements")
        assert sorted(client.list_queues()) == sorted(UTF8_NAMES)
        for name in UTF8_NAMES:
            assert client.get(name).body == "ünïcode".encode()
        for bad in ("é" * 128, "tab\there", "nul\x00", "\ud800"):
            with pytest.raises(ValueError, match="UTF-8 text without control characters"):
                client.declare_queue(bad)
        # "" asks for a name, as AMQP's declare does: a new one each time
        named = [client.declare_queue("", durable=False).queue for _ in range(2)]
        assert all(name.startswith("amq.gen-") for name in named) and named[0] != named[1]
        assert set(named) <= set(client.list_queues())
        with pytest.raises(NotFound):
            client.declare_queue("", passive=True)  # no name to look for


@pytest.mark.parametrize("transport", ["in-process", "ipc", "tcp"])
def test_a_passive_declare_counts_and_a_consumer_can_stop_on_an_empty_queue(node, transport):
    target = {"in-process": None, "ipc": node.data_dir, "tcp": node.listen_endpoint}[transport]
    with node.connect() if target is None else connect(target) as client:
        assert client.declare_queue("jobs") == ("jobs", 0, 0)
        with pytest.raises(NotFound, match="creates none"):
            client.declare_queue("nowhere", passive=True)
        assert "nowhere" not in client.list_queues()
        client.publish_many("jobs", [b"a", b"b", b"c"])
        drained = []
        with client.consume("jobs", prefetch=2, inactivity_timeout=3) as consumer:
            declared = client.declare_queue("jobs", passive=True)
            assert (declared.message_count, declared.consumer_count) == (3, 1)
            for delivery in consumer:  # ends three seconds after the queue is empty
                drained.append(delivery.body)
                delivery.ack()
            assert consumer.get(timeout=0) is None
        assert drained == [b"a", b"b", b"c"]
        assert client.declare_queue("jobs", passive=True) == ("jobs", 0, 0)
        for bad in (math.nan, math.inf, -1, "1"):
            with pytest.raises(ValueError, match="inactivity_timeout must be a finite number"):
                client.consume("jobs", inactivity_timeout=bad)


def get_one_within(client, timeout):
    with client.consume("orders") as consumer:
        return consumer.get(timeout)


BAD_CALLS = {  # what a client may pass wrong, and what the error says
    "prefetch": (lambda c: c.consume("orders", prefetch=0), "prefetch must be an int >= 1"),
    "inactivity_timeout": (
        lambda c: c.consume("orders", inactivity_timeout=-1),
        "inactivity_timeout must be a finite number of seconds > 0, got -1",
    ),
    "a consumer's timeout": (
        lambda c: get_one_within(c, math.nan),
        "timeout must be a finite number of seconds >= 0, got nan",
    ),
    "producer_id": (
        lambda c: c.publish("orders", b"x", producer_id="", sequence=0),
        "producer_id must be a str or bytes of 1 to",
    ),
    "sequence": (
        lambda c: c.publish("orders", b"x", producer_id="p", sequence=-1),
        "sequence must be an int in 0..",
    ),
    "exchange kind": (
        lambda c: c.declare_exchange("events", kind="sideways"),
        "exchange kind must be one of",
    ),
    "routing key": (
        lambda c: c.bind_queue("orders", "amq.x", "k" * 256),
        "a routing key is a str of at most 255 characters",
    ),
}
BAD_OPTIONS = {  # what connect (or node.connect) may be passed wrong
    "linger_s": ({"linger_s": 2}, "linger_s must be a number of seconds in 0..1, got 2"),
    "recovery_interval_s": (
        {"recovery_interval_s": 0},
        "recovery_interval_s must be a finite number of seconds > 0, got 0",
    ),
    "call_timeout_s": (
        {"call_timeout_s": -1},
        "call_timeout_s must be a finite number of seconds > 0, got -1",
    ),
    "max_in_flight": ({"max_in_flight": 0}, "max_in_flight must be an int >= 1, got 0"),
    "max_in_flight_bytes": (
        {"max_in_flight_bytes": 1.5},
        "max_in_flight_bytes must be an int >= 1, got 1.5",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_CALLS) + sorted(BAD_OPTIONS))
@pytest.mark.parametrize("transport", ["in-process", "ipc", "tcp"])
def test_every_bad_argument_to_the_client_is_a_warren_error_and_a_value_error(
    node, transport, case
):
    """``except WarrenError`` catches any argument a user got wrong, as ``except
    ValueError`` always did, over every transport, with a message that names it."""
    target = {"in-process": None, "ipc": node.data_dir, "tcp": node.listen_endpoint}[transport]
    node.declare_queue("orders")
    node.declare_exchange("amq.x")
    if case in BAD_OPTIONS:
        options, says = BAD_OPTIONS[case]
        with pytest.raises(WarrenError, match=re.escape(says)) as refused:
            node.connect(**options) if target is None else connect(target, **options)
    else:
        call, says = BAD_CALLS[case]
        with node.connect() if target is None else connect(target) as client:
            with pytest.raises(WarrenError, match=re.escape(says)) as refused:
                call(client)
            client.publish("orders", b"still served")  # the bad call changed nothing
            assert client.get("orders").body == b"still served"
    assert isinstance(refused.value, ValueError)


def test_the_options_only_one_transport_takes_are_checked_as_well(node, tmp_path):
    with pytest.raises(WarrenError, match="key_file is for a tcp:// address") as refused:
        connect(node.data_dir, key_file=tmp_path / "key")
    assert isinstance(refused.value, ValueError)
    with pytest.raises(WarrenError, match="connect_timeout_s must be a finite") as refused:
        connect(node.listen_endpoint, connect_timeout_s=-1)
    assert isinstance(refused.value, ValueError)

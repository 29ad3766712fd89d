"""Nodes of a cluster with clients on the leader: every message (of a classic or a
quorum queue) and stream record the leader confirmed is on the node that takes over when
the leader's machine is lost (every process of it killed at once); the lost node,
started again, is synced whole and rejoins the ISR holding the leader's files; a leader
short of ``min_insync`` copies confirms nothing: its clients' publishes in flight are
nacked and the next ones held back until a follower has caught up."""

import contextlib
import json

import psutil
import pytest
import zmq

from warren import connect
from warren.errors import Nacked
from warren.queues.broker.definitions import queue_directory
from warren.queues.engine.stream_inspect import inspect_stream
from warren.supervisor.cluster.replication import manifest
from warren.supervisor.node.node import query_status

from ...waiting import wait_for
from ..node.test_metrics import fetch
from .test_cluster_nodes import (
    ALL_THREE,
    agreed_leader,
    cluster_node,
    cluster_status,
    lose_machine,
    start_nodes,
)


def titled(node, title: str) -> psutil.Process | None:
    """The process of ``node`` titled ``title``."""
    for child in psutil.Process(node.process.pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if child.cmdline()[:1] == [title]:
                return child
    return None


def same_files(one, other) -> bool:
    """Whether two data directories hold the same replicated files, byte for byte."""
    return manifest(str(one.data_dir)) == manifest(str(other.data_dir))


def test_every_confirmed_message_survives_the_loss_of_the_leaders_machine(etcd, tmp_path):
    nodes = start_nodes(etcd, tmp_path, "survive", ttl_s=5)
    try:
        wait_for(lambda: agreed_leader(nodes), timeout=60)
        leader, epoch = agreed_leader(nodes)
        wait_for(lambda: all(cluster_status(n)["isr"] == ALL_THREE for n in nodes), timeout=60)
        first = nodes[int(leader[-1])]
        orders = [b"order %d" % n for n in range(300)]
        events = [b"event %d" % n for n in range(100)]
        tasks = [b"task %d" % n for n in range(50)]
        with connect(first.endpoint, wait=60, recover=False) as connection:
            connection.declare_queue("orders")
            connection.declare_queue("events", type="stream")
            for order in orders[:50]:  # one commit each
                connection.publish("orders", order)
            connection.publish_many("orders", orders[50:])  # commits of many
            connection.publish_many("events", events[:60], producer_id="feed", sequence=0)
            # A quorum queue's WAL and segments are shipped as the stores' files are; the
            # first task returned twice: its delivery count is in the log too, made durable
            # by the confirmed publish after it.
            connection.declare_queue("tasks", type="quorum")
            connection.publish_many("tasks", tasks[:-1])
            for _ in range(2):
                connection.get("tasks").nack(requeue=True)
            connection.publish("tasks", tasks[-1])
            assert connection.queue_stats("tasks")["term"] == epoch  # the log's term
            # The stream's process killed and started again: what it wrote last may never
            # have been shipped, so the followers are synced whole before the next commit.
            stream = titled(first, "warren: stream events")
            stream.kill()
            wait_for(lambda: (again := titled(first, "warren: stream events")) and again != stream)
            wait_for(lambda: cluster_status(first)["replication"]["counters"]["resyncs"], 60)
            for _ in range(2):  # the first may meet the restart: sent again, never twice
                with contextlib.suppress(Nacked):
                    connection.publish_many("events", events[60:], producer_id="feed", sequence=60)
                    break
        lose_machine(first)
        others = [node for node in nodes if node is not first]
        wait_for(lambda: (agreed := agreed_leader(others)) and agreed[1] > epoch, timeout=60)
        second_leader, second_epoch = agreed_leader(others)
        second = nodes[int(second_leader[-1])]
        with connect(second.endpoint, wait=60, recover=False) as connection:
            got = []
            while (delivery := connection.get("orders")) is not None:
                got.append(delivery.body)
                delivery.ack()
            assert got == orders
            deliveries = []
            while (delivery := connection.get("tasks")) is not None:
                deliveries.append(delivery)
                delivery.ack()
            assert [d.body for d in deliveries] == tasks
            assert deliveries[0].delivery_count >= 2 and deliveries[0].redelivered
            assert connection.queue_stats("tasks")["term"] == second_epoch
            reader = connection.consume("events", offset="first")
            assert [reader.get(timeout=30).body for _ in events] == events
            connection.publish_many(
                "events", [b"led by the second"], producer_id="feed", sequence=100
            )
            assert reader.get(timeout=30).body == b"led by the second"
            reader.cancel()
        # Each chunk's header names the epoch of the leader that wrote it (Osiris's rule):
        # the first leader's chunks, then the second's.
        stream_files = queue_directory(str(second.data_dir), "events")
        epochs = [e for segment in inspect_stream(stream_files) for e in segment.epochs]
        assert [e for i, e in enumerate(epochs) if i == 0 or epochs[i - 1] != e] == [
            epoch,
            second_epoch,
        ]
        # The lost node, back: its files are of an older epoch, so it is synced whole
        # from the new leader, then written into the ISR again.
        first.start()
        wait_for(lambda: cluster_status(second)["isr"] == ALL_THREE, timeout=60)
        assert cluster_status(first)["role"] == "follower"
        wait_for(lambda: same_files(second, first), timeout=60)
    finally:
        for node in nodes:
            node.stop()


def test_a_leader_short_of_min_insync_copies_nacks_blocks_and_serves_again_once_caught_up(
    etcd, tmp_path
):
    first = cluster_node(etcd, tmp_path, "few", 0, ttl_s=5, min_insync=2)
    nodes = [first]
    try:
        wait_for(lambda: cluster_status(first)["role"] == "leader", timeout=60)
        # Its stores' first writes wait for a second copy: it leads, but serves nothing.
        wait_for(lambda: cluster_status(first)["replication"]["waiting_commits"], timeout=60)
        assert cluster_status(first)["isr"] == ["n0"]
        scraped = ("--http", "127.0.0.1:0")
        nodes.append(
            second := cluster_node(etcd, tmp_path, "few", 1, ttl_s=5, min_insync=2, extra=scraped)
        )
        wait_for(lambda: cluster_status(first)["isr"] == ["n0", "n1"], timeout=60)
        # a follower is scraped as any node: it says it follows, and whom
        http = json.loads((second.data_dir / "node.json").read_text())["http_endpoint"]
        status, _, body = fetch(http + "/metrics")
        assert status == 200 and "warren_cluster_leader 0.0" in body.decode()
        assert json.loads(fetch(http + "/api/cluster")[2])["leader"] == "n0"
        with connect(first.endpoint, wait=60, recover=False) as connection:
            connection.declare_queue("orders")
            connection.publish("orders", b"two copies", producer_id="shop", sequence=0)
            # The follower's machine lost: after its deadline the leader writes it out of
            # the ISR, which leaves one copy, below min_insync: the publish in flight is
            # nacked (never confirmed by one copy), and publishers are held back as by a
            # full disk.
            lose_machine(second)
            held = connection.publish_async("orders", b"in doubt", producer_id="shop", sequence=1)
            with pytest.raises(Nacked, match="fewer in-sync copies than min_insync"):
                held.result(timeout=120)
            assert cluster_status(first)["isr"] == ["n0"]
            assert "replication" in query_status(first.data_dir)["alarms"]
            assert connection.blocked
            second.start()  # synced, written back into the ISR: publishers go on
            wait_for(lambda: cluster_status(first)["isr"] == ["n0", "n1"], timeout=60)
            wait_for(lambda: not connection.blocked, timeout=30)
            # sent again as a nacked publish is: kept once, whether the first was or not
            connection.publish("orders", b"in doubt", producer_id="shop", sequence=1)
            connection.publish("orders", b"after", producer_id="shop", sequence=2)
            taken = [connection.get("orders", ack=False) for _ in range(3)]
            assert [d.body for d in taken if d is not None] == [
                b"two copies",
                b"in doubt",
                b"after",
            ]
            assert connection.get("orders") is None
    finally:
        for node in nodes:
            node.stop()


def test_a_client_naming_every_node_follows_a_failover_and_loses_no_confirmed_message(
    etcd, tmp_path
):
    nodes = start_nodes(etcd, tmp_path, "follow", ttl_s=5)
    try:
        wait_for(lambda: agreed_leader(nodes), timeout=60)
        leader, epoch = agreed_leader(nodes)
        wait_for(lambda: all(cluster_status(n)["isr"] == ALL_THREE for n in nodes), timeout=60)
        everyone = [node.endpoint for node in reversed(nodes)]  # the leader anywhere in it
        with connect(everyone, wait=60, recovery_timeout_s=120) as connection:
            connection.declare_queue("orders")
            for sequence in range(200):
                if sequence == 100:  # the leader's machine lost mid-stream
                    lose_machine(nodes[int(leader[-1])])
                body = b"order %d" % sequence
                connection.publish("orders", body, producer_id="shop", sequence=sequence)
            assert connection.recoveries == 1
            got = []
            while (delivery := connection.get("orders")) is not None:
                got.append(delivery.body)
                delivery.ack()
        # every publish above returned confirmed; a re-sent one is dropped by the dedup
        # state the new leader holds (it is replicated too)
        assert got == [b"order %d" % sequence for sequence in range(200)]
        others = [node for node in nodes if node.endpoint != nodes[int(leader[-1])].endpoint]
        assert agreed_leader(others)[1] > epoch
    finally:
        for node in nodes:
            node.stop()


def test_a_leaders_coordinator_killed_under_its_commits_leaves_the_node_up_and_loses_nothing(
    etcd, tmp_path
):
    # The coordinator dies with commits in flight: a commit it took was never answered
    # (its writer, and the node's stop, held two minutes), and the stores' restarts,
    # refused by a coordinator that serves nobody until the node says which of its
    # processes write, made the node's root supervisor give up: the node exited. Now the
    # commit is refused at once, the data part alone gives up, and the node leads on.
    nodes = start_nodes(etcd, tmp_path, "peer", ttl_s=5)
    try:
        wait_for(lambda: agreed_leader(nodes), timeout=60)
        leader, _ = agreed_leader(nodes)
        wait_for(lambda: all(cluster_status(n)["isr"] == ALL_THREE for n in nodes), timeout=60)
        everyone = [node.endpoint for node in nodes]
        killed = nodes[int(leader[-1])]
        with connect(everyone, wait=60, recovery_timeout_s=120) as connection:
            connection.declare_queue("orders")
            for sequence in range(300):
                if sequence in (50, 150):  # twice: the second under a new coordinator
                    coordinator = titled(killed, "warren: coordinator")
                    if coordinator is not None:
                        coordinator.kill()
                body = b"order %d" % sequence
                while True:
                    try:
                        connection.publish("orders", body, producer_id="shop", sequence=sequence)
                        break
                    except Nacked:  # in doubt (its queue restarted): sent again, as apps do
                        continue
            got = []
            while (delivery := connection.get("orders")) is not None:
                got.append(delivery.body)
                delivery.ack()
        # each once: a re-sent one the queue had taken is dropped by its dedup state
        assert got == [b"order %d" % sequence for sequence in range(300)]
        assert all(node.process.poll() is None for node in nodes)  # no node gave up
        wait_for(lambda: all(cluster_status(n)["isr"] == ALL_THREE for n in nodes), timeout=90)
    finally:
        for node in nodes:
            node.stop()


def test_stray_and_malformed_commits_are_refused_and_the_leader_goes_on(etcd, tmp_path):
    (node,) = start_nodes(etcd, tmp_path, "stray", count=1)
    try:
        wait_for(lambda: cluster_status(node)["replication"]["mode"] == "leader", timeout=60)
        status_endpoint = json.loads((node.data_dir / "node.json").read_text())["status_endpoint"]
        commits = status_endpoint.rsplit("/", 1)[0] + "/replication"
        socket = zmq.Context.instance().socket(zmq.DEALER)
        socket.linger = 0
        socket.connect(commits)
        header = {"kind": "commit", "pid": 1}
        position = cluster_status(node)["replication"]["position"]
        strays = [
            [b"not json at all"],
            [json.dumps({**header, "actions": [["write", "a", 0, ""]]}).encode()],  # no data
            [json.dumps({**header, "actions": [["write", "../outside", 0, ""]]}).encode(), b"x"],
            [json.dumps({**header, "actions": [["format", "a", 0, ""]]}).encode(), b"x"],
            [  # a good action before a bad one: the whole commit refused, none shipped
                json.dumps(
                    {**header, "actions": [["write", "a", 0, ""], ["write", "/etc/x", 0, ""]]}
                ).encode(),
                b"x",
                b"y",
            ],
        ]
        try:
            for frames in strays:
                socket.send_multipart(frames)
                assert socket.poll(30_000), frames
                assert "refused" in json.loads(socket.recv()), frames
        finally:
            socket.close()
        assert not (tmp_path / "outside").exists()
        assert cluster_status(node)["replication"]["position"] == position
        with connect(node.endpoint, wait=60, recover=False) as connection:
            connection.declare_queue("orders")
            connection.publish("orders", b"after the strays")
            assert connection.get("orders").body == b"after the strays"
    finally:
        node.stop()

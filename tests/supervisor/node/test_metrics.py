"""A node's HTTP endpoint as an operator meets it: Prometheus scraping its figures (parsed
with prometheus_client's own parser, checked by promtool, and scraped by a real Prometheus
server), a stream's offsets and its consumers' lag, the store's latency histograms, the
JSON API, counters that survive a killed queue without going backwards, a stopped queue
that costs a scrape half a second and nothing more, a stopped node that closes the
connections kept open to it, and every bad address refused in one line. Everything binds
127.0.0.1 with port 0."""

import contextlib
import errno
import http.client
import importlib.metadata
import json
import os
import re
import select
import shutil
import signal
import socket
import struct
import subprocess
import textwrap
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from warren import connect
from warren.actors import InvalidSpec
from warren.actors.figures import SlotReader
from warren.queues.errors import NotFound, QueueDown
from warren.supervisor import ChildSpec, Node
from warren.supervisor.node import series
from warren.supervisor.node.http_endpoint import CLIENT_TIMEOUT_S
from warren.supervisor.node.metrics import SNAPSHOT_TIMEOUT_S
from warren.supervisor.node.node import QUEUE_FLAGS

from ...waiting import wait_for
from ..cli.test_cli import ROOT, WARREN, settings_from, warren
from ..sample_actors import OneAtATime
from .test_node import warren_node

LOOPBACK_ANY_PORT = "127.0.0.1:0"
PLAIN = {"auto_delete": False, "internal": False, "alternate_exchange": ""}  # flags unset
ORDERS = (("queue", "orders"),)
NODE_KEPT = ("warren_queue_state", "warren_actor_restarts_total")  # no answer needed
STUCK_RUNNING = (("queue", "stuck"), ("state", "running"))


def fetch(url: str, method: str = "GET") -> tuple[int, dict, bytes]:
    """The status, headers and body of one request (an error status is an answer too)."""
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


def families(node: Node, path: str = "/metrics") -> list:
    status, headers, body = fetch(node.http_endpoint + path)
    assert status == 200, body
    assert headers["Content-Type"].startswith("text/plain; version=0.0.4")
    return list(text_string_to_metric_families(body.decode()))


def scrape(node: Node, path: str = "/metrics") -> dict[tuple[str, tuple], float]:
    """Every sample of a page: (name, sorted labels) -> value."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in families(node, path)
        for sample in family.samples
    }


def strict_json(body: bytes):
    def refuse(constant: str):
        raise ValueError(f"{constant} is not strict JSON")

    return json.loads(body, parse_constant=refuse)


def restarted(node: Node, queue: str, pid: int) -> bool:
    try:
        return node.queue(queue).pid != pid
    except NotFound:  # between incarnations
        return False


def test_a_scrape_shows_a_queues_ready_and_unacked_counts_and_what_went_through_it(tmp_path):
    with Node(tmp_path / "data", http=LOOPBACK_ANY_PORT) as node:
        node.declare_queue("orders")
        with node.connect() as conn:
            for n in range(5):
                conn.publish("orders", b"order %d" % n)
            conn.get("orders").ack()
            held = conn.get("orders")
            acked = ("warren_global_messages_acknowledged_total", ())
            wait_for(lambda: scrape(node).get(acked) == 1)
            node_wide = scrape(node)
            assert node_wide[("warren_queue_messages_ready", ())] == 3
            assert node_wide[("warren_queue_messages_unacked", ())] == 1
            assert node_wide[("warren_queues", ())] == 1
            assert node_wide[("warren_global_messages_routed_total", ())] == 5
            assert node_wide[("warren_global_messages_received_confirm_total", ())] == 5
            assert node_wide[("warren_global_messages_confirmed_total", ())] == 5
            assert node_wide[("warren_global_messages_delivered_total", ())] == 2
            assert node_wide[("warren_queue_variable_queue_messages", (("state", "alpha"),))] == 3
            assert node_wide[("warren_scrape_actors_unanswered", ())] == 0
            assert not [
                labels for _, labels in node_wide if {"queue", "actor"} & dict(labels).keys()
            ], "/metrics holds node-wide series only"
            per_object = scrape(node, "/metrics/per-object")
            assert per_object[("warren_queue_messages_ready", ORDERS)] == 3
            assert per_object[("warren_queue_messages_unacked", ORDERS)] == 1
            assert per_object[("warren_queue_messages_published_total", ORDERS)] == 5
            assert per_object[("warren_queue_messages_acknowledged_total", ORDERS)] == 1
            queue_actor = (("actor", "queue orders"),)
            assert per_object[("warren_actor_messages_received_total", queue_actor)] > 0
            assert per_object[("warren_actor_resident_memory_bytes", queue_actor)] > 0
            assert per_object[("warren_actor_restarts_total", queue_actor)] == 0
            persistent = (("store", "msg_store_persistent"),)
            assert per_object[("warren_msg_store_files", persistent)] >= 1
            assert ("warren_msg_store_sync_ops_total", persistent) in per_object
            held.ack()
        undocumented = [
            f.name for f in families(node, "/metrics/per-object") if not f.documentation
        ]
        assert undocumented == []


def test_a_streams_offsets_segments_and_named_consumers_lag_are_series_of_their_own(tmp_path):
    events = (("stream", "events"),)
    billing = (("consumer", "billing"), ("stream", "events"))
    with Node(tmp_path / "data", http=LOOPBACK_ANY_PORT) as node:
        node.declare_queue("orders")
        node.declare_queue("events", type="stream")
        with node.connect() as conn:
            conn.publish("orders", b"order")
            conn.publish_many("events", [b"event %d" % n for n in range(10)])
            with conn.consume("events", offset="first", name="billing") as consumer:
                for record in consumer:
                    if record.offset == 3:
                        break  # leaving the block stores offset 3 for billing
        lag = ("warren_stream_consumer_lag", billing)
        wait_for(lambda: scrape(node, "/metrics/per-object").get(lag) == 6)
        per_object = scrape(node, "/metrics/per-object")
        assert per_object[("warren_stream_first_offset", events)] == 0
        # records 0..9, then the tracking entry that stored billing's offset: offset 10
        assert per_object[("warren_stream_committed_offset", events)] == 10
        assert per_object[("warren_stream_last_offset", events)] == 10
        assert per_object[("warren_stream_consumer_offset", billing)] == 3
        assert per_object[("warren_stream_segments", events)] == 1
        assert per_object[("warren_stream_bytes", events)] > 10 * len(b"event 0")
        assert per_object[("warren_stream_consumers", events)] == 1
        assert per_object[("warren_stream_messages_published_total", events)] == 10
        assert per_object[("warren_stream_messages_confirmed_total", events)] == 10
        assert per_object[("warren_stream_offsets_stored_total", events)] == 1
        assert per_object[("warren_actor_restarts_total", (("actor", "stream events"),))] == 0
        assert not [key for key in per_object if dict(key[1]).get("queue") == "events"]
        node_wide = scrape(node)
        assert node_wide[("warren_stream_segments", ())] == 1
        assert node_wide[("warren_stream_messages_published_total", ())] == 10
        assert node_wide[("warren_global_messages_routed_total", ())] == 11
        assert node_wide[("warren_queue_messages_ready", ())] == 1
        assert not [name for name, _ in node_wide if name.endswith("_offset")]
        _, _, body = fetch(node.http_endpoint + "/api/queues")
        stream, queue = strict_json(body)
        assert (stream["name"], stream["type"], queue["name"], queue["type"]) == (
            "events",
            "stream",
            "orders",
            "classic",
        )
        assert stream["consumer_offsets"] == {"billing": {"offset": 3, "lag": 6}}
        assert (stream["first_offset"], stream["committed_offset"]) == (0, 10)
        assert stream["messages_published_total"] == 10 and queue["messages_ready"] == 1
        _, _, body = fetch(node.http_endpoint + "/api/overview")
        assert (strict_json(body)["queues"], strict_json(body)["streams"]) == (2, 1)


def test_the_stores_confirm_waits_and_syncs_are_histograms_whose_buckets_add_up(tmp_path):
    persistent = ("store", "msg_store_persistent")
    with Node(tmp_path / "data", http=LOOPBACK_ANY_PORT) as node:
        node.declare_queue("orders")
        with node.connect() as conn:  # bodies this large go to the shared store
            conn.publish_many("orders", [os.urandom(8192) for _ in range(3)])
        histograms = {
            family.name: family
            for family in families(node, "/metrics/per-object")
            if family.type == "histogram"
        }
    assert set(histograms) == {
        "warren_msg_store_confirm_wait_seconds",
        "warren_msg_store_sync_duration_seconds",
    }
    for name, family in histograms.items():
        mine = [s for s in family.samples if persistent in s.labels.items()]
        buckets = [s.value for s in mine if s.name == name + "_bucket"]
        (count,) = [s.value for s in mine if s.name == name + "_count"]
        (total,) = [s.value for s in mine if s.name == name + "_sum"]
        assert count >= 1 and total > 0, name
        assert buckets == sorted(buckets) and buckets[-1] == count, name


def test_counters_never_go_backwards_when_the_queue_process_is_killed_and_restarted(tmp_path):
    published = ("warren_queue_messages_published_total", ORDERS)
    with Node(tmp_path / "data", http=LOOPBACK_ANY_PORT) as node:
        node.declare_queue("orders")
        with node.connect() as conn:
            conn.publish_many("orders", [b"before"] * 10)
        pages = ("/metrics", "/metrics/per-object")
        before = {page: scrape(node, page) for page in pages}
        assert before["/metrics/per-object"][published] == 10
        pid = node.queue("orders").pid
        os.kill(pid, signal.SIGKILL)
        during = scrape(node, "/metrics")  # the queue may be missing, never counted again
        wait_for(lambda: restarted(node, "orders", pid))
        with node.connect() as conn:
            conn.publish_many("orders", [b"after"] * 7)
        wait_for(lambda: scrape(node, "/metrics/per-object").get(published) == 17)
        after = {page: scrape(node, page) for page in pages}
        for page in pages:
            for key, value in before[page].items():
                if key[0].endswith("_total") and key in after[page]:
                    assert after[page][key] >= value, (page, key)
        for key, value in during.items():
            if key[0].endswith("_total"):
                assert after["/metrics"][key] >= value, key
        node_wide, per_object = after["/metrics"], after["/metrics/per-object"]
        assert node_wide[("warren_queue_messages_published_total", ())] == 17
        assert node_wide[("warren_global_messages_routed_total", ())] == 17
        assert node_wide[("warren_global_messages_confirmed_total", ())] == 17
        assert per_object[published] == 17
        assert per_object[("warren_queue_messages_ready", ORDERS)] == 17
        assert per_object[("warren_queue_messages_recovered_total", ORDERS)] == 10
        assert per_object[("warren_actor_restarts_total", (("actor", "queue orders"),))] == 1
        assert node_wide[("warren_actor_restarts_total", ())] == 1


def kill_queue_process(node: Node, queue: str) -> None:
    """SIGKILL the queue's process once it runs, and wait until it has been replaced or
    its supervisor gave up on it."""
    wait_for(lambda: node.queue_state(queue) == "running")
    pid = node.queue(queue).pid
    os.kill(pid, signal.SIGKILL)

    def replaced_or_given_up() -> bool:
        try:
            return restarted(node, queue, pid)
        except QueueDown:  # its supervisor gave up on it
            return True

    wait_for(replaced_or_given_up)


def test_a_queue_that_crash_loops_between_two_scrapes_counts_every_restart_and_shows_crashed(
    tmp_path,
):
    restarts = ("warren_actor_restarts_total", (("actor", "queue orders"),))
    with Node(tmp_path / "data", http=LOOPBACK_ANY_PORT) as node:
        node.declare_queue("orders")
        node.declare_queue("steady")
        assert scrape(node, "/metrics/per-object")[restarts] == 0
        assert scrape(node)[("warren_actor_restarts_total", ())] == 0
        for _ in range(QUEUE_FLAGS.intensity + 1):  # one crash more than it may restart
            kill_queue_process(node, "orders")
        assert node.queue_state("orders") == "crashed"
        node_wide, per_object = scrape(node), scrape(node, "/metrics/per-object")
        assert node_wide[("warren_actor_restarts_total", ())] == QUEUE_FLAGS.intensity
        assert per_object[restarts] == QUEUE_FLAGS.intensity
        assert per_object[("warren_queue_state", (("queue", "orders"), ("state", "crashed")))] == 1
        assert per_object[("warren_queue_state", (("queue", "orders"), ("state", "running")))] == 0
        assert per_object[("warren_queue_state", (("queue", "steady"), ("state", "running")))] == 1
        assert node_wide[("warren_queue_state", (("state", "crashed"),))] == 1
        assert node_wide[("warren_queue_state", (("state", "running"),))] == 1


def test_dead_letters_are_counted_by_reason_expired_maxlen_and_rejected(tmp_path):
    reasons = ("expired", "maxlen", "rejected")
    with Node(tmp_path / "data", http=LOOPBACK_ANY_PORT) as node:
        # Given a queue whose dead letters go to a queue of their own
        node.declare_exchange("dlx", kind="fanout")
        node.declare_queue("dead")
        node.bind_queue("dead", "dlx")
        node.declare_queue("work", max_length=5, dead_letter_exchange="dlx")
        with node.connect() as conn:
            # When one message expires, one goes over max-length, and one is rejected
            conn.publish("work", b"expires", expiration_ms=100)
            wait_for(lambda: conn.queue_stats("dead")["messages_ready"] == 1)
            conn.publish_many("work", [b"%d" % n for n in range(6)])
            conn.get("work").reject(requeue=False)
            wait_for(lambda: conn.queue_stats("dead")["messages_ready"] == 3)
        # Then each counts once under its reason, per queue and node-wide
        dead_lettered = "warren_queue_messages_dead_lettered_total"
        keys = [(dead_lettered, (("queue", "work"), ("reason", r))) for r in reasons]
        wait_for(lambda: [scrape(node, "/metrics/per-object").get(k) for k in keys] == [1, 1, 1])
        node_wide = scrape(node)
        assert [node_wide[(dead_lettered, (("reason", r),))] for r in reasons] == [1, 1, 1]
        assert node_wide[("warren_global_messages_dead_lettered_confirmed_total", ())] == 3
        queues = {q["name"]: q for q in strict_json(fetch(node.http_endpoint + "/api/queues")[2])}
        assert queues["work"]["messages_dead_lettered_total"] == {
            **dict.fromkeys(reasons, 1),
            "delivery_limit": 0,  # a quorum queue's reason
        }


def test_a_remote_client_shows_in_the_connections_while_it_is_connected(tmp_path):
    names = (
        "warren_connections",
        "warren_connections_opened_total",
        "warren_connections_closed_total",
    )
    with Node(tmp_path / "data", http=LOOPBACK_ANY_PORT, listen="tcp://127.0.0.1:*") as node:

        def connections() -> tuple:
            """Open now, opened, closed."""
            samples = scrape(node)
            return tuple(samples.get((name, ())) for name in names)

        wait_for(lambda: connections() == (0, 0, 0))
        with connect(node.listen_endpoint) as client:
            client.declare_queue("orders")
            wait_for(lambda: connections() == (1, 1, 0))
        wait_for(lambda: connections() == (0, 1, 1))


def test_an_actor_that_falls_behind_its_mailbox_counts_its_backlogged_passes(tmp_path):
    backlogged = ("warren_actor_mailbox_backlogged_passes_total", (("actor", "worker"),))
    with Node(
        tmp_path / "data", http=LOOPBACK_ANY_PORT, children=(ChildSpec("worker", OneAtATime),)
    ) as node:
        assert scrape(node, "/metrics/per-object")[backlogged] == 0
        worker = node.store("worker")
        for _ in range(20):
            worker.tell("nap")
        worker.ask("pid")  # answered after the naps
        assert scrape(node, "/metrics/per-object")[backlogged] > 0
        node_wide = ("warren_actor_mailbox_backlogged_passes_total", ())
        assert scrape(node)[node_wide] > 0


def test_a_stopped_queue_process_delays_a_scrape_half_a_second_and_hides_only_its_series(
    tmp_path,
):
    with Node(tmp_path / "data", http=LOOPBACK_ANY_PORT) as node:
        node.declare_queue("orders")
        node.declare_queue("stuck")
        with node.connect() as conn:
            conn.publish("orders", b"order")
            conn.publish("stuck", b"stuck")
        scrape(node, "/metrics/per-object")  # both answer, and publish their figures
        pid = node.queue("stuck").pid
        os.kill(pid, signal.SIGSTOP)
        try:
            # its published figures stand until its loop is seen not turning (LIVE_S)
            wait_for(lambda: scrape(node)[("warren_scrape_actors_unanswered", ())] == 1)
            for _ in range(3):
                started = time.monotonic()
                samples = scrape(node, "/metrics/per-object")
                # not held up to the snapshot's timeout by the actor that cannot answer
                assert time.monotonic() - started < SNAPSHOT_TIMEOUT_S
                assert samples[("warren_queue_messages_ready", ORDERS)] == 1
                assert samples[("warren_scrape_actors_unanswered", ())] == 1
                stuck = [
                    key
                    for key in samples
                    if (
                        dict(key[1]).get("queue") == "stuck"
                        or dict(key[1]).get("actor") == "queue stuck"
                    )
                    and key[0] not in NODE_KEPT  # the node's, not the actor's answer
                ]
                assert stuck == []
                assert samples[("warren_queue_state", STUCK_RUNNING)] == 1
        finally:
            os.kill(pid, signal.SIGCONT)
        stuck_ready = ("warren_queue_messages_ready", (("queue", "stuck"),))
        wait_for(lambda: scrape(node, "/metrics/per-object").get(stuck_ready) == 1)


def test_an_idle_queues_published_figures_are_its_answer_and_a_change_shows_at_once(tmp_path):
    ready, unacked = (
        ("warren_queue_messages_ready", ORDERS),
        ("warren_queue_messages_unacked", ORDERS),
    )
    with Node(tmp_path / "data", http=LOOPBACK_ANY_PORT) as node:
        node.declare_queue("orders")
        with node.connect() as conn:
            conn.publish_many("orders", [b"order"] * 3)
            asked = scrape(node, "/metrics/per-object")  # nothing published yet: asked
            queue = node.queue("orders")
            reader = SlotReader()
            wait_for(
                lambda: reader.read(queue.control, queue.pid, queue.incarnation, time.monotonic())
            )
            read = scrape(node, "/metrics/per-object")
            reader.close()
            for key, value in asked.items():
                if dict(key[1]).get("queue") == "orders":
                    assert read[key] == value, key
            conn.publish("orders", b"one more")
            assert scrape(node, "/metrics/per-object")[ready] == 4
            held = conn.get("orders")
            assert scrape(node, "/metrics/per-object")[unacked] == 1
            assert scrape(node)[("warren_queue_messages_unacked", ())] == 1
            held.ack()  # a tell: counted once the queue has taken it
            acked = ("warren_global_messages_acknowledged_total", ())
            wait_for(lambda: scrape(node)[acked] == 1)


def test_the_api_answers_strict_json_with_the_same_figures(tmp_path):
    with Node(tmp_path / "data", http=LOOPBACK_ANY_PORT) as node:
        node.declare_queue("orders", max_length=1_000)  # a RAM target of infinity, too
        with node.connect() as conn:
            conn.publish_many("orders", [b"order"] * 3)
        documents = {}
        for page in ("overview", "queues", "actors"):
            status, headers, body = fetch(f"{node.http_endpoint}/api/{page}")
            assert status == 200 and headers["Content-Type"] == "application/json"
            documents[page] = strict_json(body)
        assert documents["overview"]["messages_ready"] == 3
        assert documents["overview"]["counters"]["global_messages_routed_total"] == 3
        (orders,) = documents["queues"]
        assert (orders["name"], orders["state"], orders["messages_ready"]) == (
            "orders",
            "running",
            3,
        )
        assert orders["messages_published_total"] == 3
        names = {actor["name"] for actor in documents["actors"]}
        assert {"queue orders", "msg_store_persistent", "msg_store_gc"} <= names
        assert scrape(node)[("warren_queue_messages_ready", ())] == 3


def api(node: Node, page: str):
    status, headers, body = fetch(f"{node.http_endpoint}/api/{page}")
    assert status == 200 and headers["Content-Type"] == "application/json", body
    return strict_json(body)


def test_the_overview_names_the_version_and_how_long_the_node_has_run(tmp_path):
    before = time.time()
    with Node(tmp_path / "data", http=LOOPBACK_ANY_PORT) as node:
        first = api(node, "overview")
        assert first["version"] == importlib.metadata.version("warren-mq")
        assert before <= first["started_at"] <= time.time()
        assert 0 <= first["uptime_seconds"] <= time.time() - before
        assert first["tcp_connections"] is None  # no listener
        wait_for(lambda: api(node, "overview")["uptime_seconds"] > first["uptime_seconds"])


def test_the_exchanges_and_bindings_are_listed_the_default_exchange_first(tmp_path):
    with Node(tmp_path / "data", http=LOOPBACK_ANY_PORT) as node:
        node.declare_queue("orders")
        node.declare_queue("audit")
        node.declare_exchange("shop", kind="topic")
        node.declare_exchange("logs", kind="fanout", durable=False)
        node.bind_queue("orders", "shop", "order.*")
        node.bind_queue("audit", "shop", "#")
        node.bind_queue("audit", "logs")
        assert api(node, "exchanges") == [
            {"name": "", "kind": "direct", "durable": True, **PLAIN},
            {"name": "logs", "kind": "fanout", "durable": False, **PLAIN},
            {"name": "shop", "kind": "topic", "durable": True, **PLAIN},
        ]
        assert api(node, "bindings") == [
            {"exchange": "logs", "queue": "audit", "routing_key": ""},
            {"exchange": "shop", "queue": "audit", "routing_key": "#"},
            {"exchange": "shop", "queue": "orders", "routing_key": "order.*"},
        ]
        node.delete_exchange("logs")
        assert [b["exchange"] for b in api(node, "bindings")] == ["shop", "shop"]


def test_consumers_show_with_their_prefetch_and_unacked_and_their_connections(tmp_path):
    with Node(tmp_path / "data", http=LOOPBACK_ANY_PORT, listen="tcp://127.0.0.1:*") as node:
        node.declare_queue("orders")
        node.declare_queue("idle")
        with node.connect() as local, connect(node.listen_endpoint) as remote:
            local.publish_many("orders", [b"order"] * 5)
            local_consumer = local.consume("orders", prefetch=3)
            taken = [next(local_consumer) for _ in range(3)]  # unacked: the prefetch is full
            remote_consumer = remote.consume("orders", prefetch=50)
            next(remote_consumer)  # and the two messages left, unacked
            held = remote.get("idle") is None  # a get of an empty queue holds nothing

            def details() -> list:
                (orders,) = [q for q in api(node, "queues") if q["name"] == "orders"]
                return sorted(orders["consumer_details"], key=lambda d: d["prefetch_count"])

            wait_for(lambda: [d["unacked"] for d in details()] == [3, 2])
            mine, theirs = details()
            assert (mine["pid"], mine["consumers"], mine["prefetch_count"]) == (os.getpid(), 1, 3)
            (listener_pid,) = [a["pid"] for a in api(node, "actors") if a["name"] == "listener"]
            assert (theirs["pid"], theirs["consumers"], theirs["prefetch_count"]) == (
                listener_pid,
                1,
                50,
            )
            (idle,) = [q for q in api(node, "queues") if q["name"] == "idle"]
            assert held and idle["consumer_details"] == []

            connections = {c["connection"]: c for c in api(node, "connections")}
            assert set(connections) == {mine["connection"], theirs["connection"]}
            local_row, remote_row = (
                connections[mine["connection"]],
                connections[theirs["connection"]],
            )
            assert (local_row["transport"], local_row["pid"]) == ("local", os.getpid())
            assert (remote_row["transport"], remote_row["pid"]) == ("tcp", listener_pid)
            assert local_row["queues"] == [
                {"queue": "orders", "consumers": 1, "prefetch_count": 3, "unacked": 3}
            ]
            assert (remote_row["consumers"], remote_row["unacked"]) == (1, 2)
            assert api(node, "overview")["tcp_connections"] >= 1

            for delivery in taken:
                delivery.ack()
            local_consumer.cancel()
            wait_for(lambda: [d["unacked"] for d in details()] == [2])
        # Both connections closed: what they held went back, and they are gone
        wait_for(lambda: api(node, "connections") == [])


def test_an_amqp_client_shows_as_a_connection_of_the_amqp_port_and_in_its_figures(tmp_path):
    import pika

    with Node(tmp_path / "data", http=LOOPBACK_ANY_PORT, amqp=LOOPBACK_ANY_PORT) as node:
        assert node.amqp_endpoint is not None
        host, port = node.amqp_endpoint.rsplit(":", 1)
        connection = pika.BlockingConnection(pika.ConnectionParameters(host, int(port)))
        channel = connection.channel()
        channel.queue_declare("tasks")
        channel.basic_publish("", "tasks", b"work")
        channel.basic_qos(prefetch_count=7)
        channel.basic_consume("tasks", lambda *delivery: None)
        (amqp_pid,) = [a["pid"] for a in api(node, "actors") if a["name"] == "amqp"]

        def amqp_rows() -> list:
            connection.process_data_events(time_limit=0)
            return [c for c in api(node, "connections") if c["transport"] == "amqp"]

        wait_for(lambda: [r["unacked"] for r in amqp_rows()] == [1])
        (row,) = amqp_rows()
        assert (row["pid"], row["queues"][0]["queue"], row["queues"][0]["prefetch_count"]) == (
            amqp_pid,
            "tasks",
            7,
        )
        assert api(node, "overview")["amqp_connections"] == 1
        samples = scrape(node)
        assert samples[("warren_amqp_connections", ())] == 1
        assert samples[("warren_amqp_connections_opened_total", ())] >= 1
        connection.close()
        wait_for(lambda: scrape(node)[("warren_amqp_connections_closed_total", ())] >= 1)
        assert api(node, "overview")["amqp_connections"] == 0


def test_unknown_pages_are_404_and_other_methods_405_each_in_one_line(tmp_path):
    with Node(tmp_path / "data", http=LOOPBACK_ANY_PORT) as node:
        status, _, body = fetch(node.http_endpoint + "/nowhere")
        assert status == 404 and body.count(b"\n") == 1 and b"/metrics" in body
        status, headers, body = fetch(node.http_endpoint + "/metrics", method="POST")
        assert status == 405 and body.count(b"\n") == 1 and headers["Allow"] == "GET"
        status, _, _ = fetch(node.http_endpoint + "/metrics?ignored=1")
        assert status == 200


def raw_request(endpoint: str, request: bytes) -> tuple[bytes, dict, bytes]:
    """The status line, headers and body the endpoint answers to ``request``, sent as is
    on a connection of its own."""
    address = urllib.parse.urlsplit(endpoint)
    with socket.create_connection((address.hostname, address.port), timeout=10) as sock:
        sock.sendall(request)
        answer = http.client.HTTPResponse(sock)
        answer.begin()
        return (
            f"{answer.status} {answer.reason}".encode(),
            dict(answer.getheaders()),
            answer.read(),
        )


def test_every_error_page_is_one_line_of_text_and_the_server_header_names_no_python(tmp_path):
    with Node(tmp_path / "data", http=LOOPBACK_ANY_PORT) as node:
        endpoint = node.http_endpoint
        # a method the server has no handler for is refused as any other method but GET
        for method in ("TRACE", "CONNECT", "FROBNICATE"):
            status, headers, body = fetch(endpoint + "/metrics", method=method)
            assert (status, body) == (405, f"{method} /metrics: only GET is served\n".encode())
            assert headers["Allow"] == "GET" and headers["Content-Type"] == "text/plain"
        status, _, body = fetch(endpoint + "/nowhere", method="TRACE")
        assert status == 404 and body.count(b"\n") == 1
        # requests the server cannot read (each no more than its line, which is all it reads
        # before it answers): a bad HTTP version, HTTP/2 spoken to an HTTP/1.1 server, a
        # request line over 64 KiB
        for request, expected in (
            (b"GET / HTTX/1.1\r\n", b"400"),
            (b"GET / HTTP/2.0\r\n", b"505"),
            (b"GET /" + b"x" * (65537 - 5), b"414"),
        ):
            status_line, headers, body = raw_request(endpoint, request)
            assert status_line.startswith(expected), status_line
            assert headers["Content-Type"] == "text/plain", headers
            assert body.count(b"\n") == 1 and b"<" not in body, body
        for method, path in (("GET", "/"), ("GET", "/nowhere"), ("TRACE", "/")):
            _, headers, _ = fetch(endpoint + path, method=method)
            assert "Python" not in headers["Server"] and "BaseHTTP" not in headers["Server"]


def test_a_405_to_a_request_with_a_body_closes_the_connection_rather_than_read_the_body(
    tmp_path,
):
    with Node(tmp_path / "data", http=LOOPBACK_ANY_PORT) as node:
        address = urllib.parse.urlsplit(node.http_endpoint)
        kept = http.client.HTTPConnection(address.hostname, address.port, timeout=10)
        try:
            kept.request("POST", "/metrics", body=b"GET /metrics HTTP/1.1\r\n\r\n")
            answer = kept.getresponse()
            assert answer.status == 405 and answer.getheader("Connection") == "close"
            assert answer.read() == b"POST /metrics: only GET is served\n"
        finally:
            kept.close()


def test_a_burst_of_fifty_connections_is_answered_without_one_waiting_for_a_retransmission(
    tmp_path,
):
    """Two Prometheus servers, Grafana and a few open pages: more connections at once than
    a listening socket's backlog of 5 holds. Each connection's TCP_INFO says whether the
    kernel dropped any of its packets (a SYN or the request: a full accept queue drops
    both), which a client meets as a wait of a second or more."""
    burst = 50
    with Node(tmp_path / "data", http=LOOPBACK_ANY_PORT) as node:
        address = urllib.parse.urlsplit(node.http_endpoint)
        clients = []
        try:
            for _ in range(burst):  # every connect sent before any is accepted
                client = socket.socket()
                clients.append(client)
                client.setblocking(False)
                assert client.connect_ex((address.hostname, address.port)) in (
                    0,
                    errno.EINPROGRESS,
                )
            paths = ("/", "/metrics", "/api/overview", "/page.js", "/api/queues")
            for n, client in enumerate(clients):
                select.select([], [client], [], 30)
                client.setblocking(True)
                client.settimeout(30)
                path = paths[n % len(paths)]
                client.sendall(
                    f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()
                )
            answers = []
            for client in clients:
                answer = http.client.HTTPResponse(client)
                answer.begin()
                answer.read()
                answers.append(answer.status)
            assert answers == [200] * burst
            retransmitted = [
                struct.unpack_from(
                    "I", client.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104), 100
                )[0]
                for client in clients
            ]
            assert retransmitted == [0] * burst
        finally:
            for client in clients:
                client.close()


def test_a_connection_kept_open_is_answered_503_and_closed_once_the_node_stops(tmp_path):
    node = Node(tmp_path / "data", http=LOOPBACK_ANY_PORT)
    address = urllib.parse.urlsplit(node.http_endpoint)
    kept = http.client.HTTPConnection(address.hostname, address.port, timeout=10)
    try:
        kept.request("GET", "/api/overview")
        answer = kept.getresponse()
        assert answer.status == 200 and answer.getheader("Connection") != "close"
        answer.read()
        node.close()
        kept.request("GET", "/api/overview")  # the same connection, the node gone
        answer = kept.getresponse()
        assert answer.status == 503 and answer.read() == b"the node is stopping\n"
        assert answer.getheader("Connection") == "close"
    finally:
        kept.close()
        node.close()


def test_a_client_that_connects_and_says_nothing_holds_up_neither_scrapes_nor_the_stop(tmp_path):
    node = Node(tmp_path / "data", http=LOOPBACK_ANY_PORT)
    address = urllib.parse.urlsplit(node.http_endpoint)
    silent = socket.create_connection((address.hostname, address.port))
    halfway = socket.create_connection((address.hostname, address.port))
    try:
        halfway.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # the request never ends
        started = time.monotonic()
        assert scrape(node)[("warren_queues", ())] == 0
        assert time.monotonic() - started < CLIENT_TIMEOUT_S / 2  # not held up by them
    finally:
        started = time.monotonic()
        node.close()
        stopped_in = time.monotonic() - started
        silent.close()
        halfway.close()
    assert stopped_in < CLIENT_TIMEOUT_S
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((address.hostname, address.port), timeout=5)


def test_warren_node_serves_its_metrics_where_node_json_and_warren_status_say(tmp_path):
    data = str(tmp_path / "data")
    with warren_node(data, "--http", LOOPBACK_ANY_PORT) as process:
        assert process.stdout.readline().startswith("node warren")
        node_file = os.path.join(data, "node.json")
        wait_for(lambda: os.path.exists(node_file))
        with open(node_file) as f:
            endpoint = json.load(f)["http_endpoint"]
        assert endpoint.startswith("http://127.0.0.1:") and not endpoint.endswith(":0")
        shown = subprocess.run(
            [*WARREN, "status", "--data-dir", data],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert f"metrics: {endpoint}/metrics" in shown.stdout, shown.stderr
        status, _, body = fetch(endpoint + "/metrics")
        assert status == 200 and b"warren_queues 0.0" in body
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0


def test_an_http_address_in_the_config_file_and_insecure_for_another_host(tmp_path):
    config = tmp_path / "warren.toml"
    config.write_text('[http]\nlisten = "127.0.0.1:0"\n')
    data = str(tmp_path / "data")
    assert settings_from("--config", str(config), "--data-dir", data)["http"] == "127.0.0.1:0"
    config.write_text('[http]\nlisten = "0.0.0.0:15692"\ninsecure = true\n')
    assert settings_from("--config", str(config), "--data-dir", data)["http"] == "0.0.0.0:15692"
    chosen = settings_from("--data-dir", data, "--http", "192.0.2.1:15692", "--insecure")
    assert chosen["http"] == "192.0.2.1:15692"
    config.write_text("[listener]\ninsecure = false\n[http]\ninsecure = true\n")
    refused = warren("node", "--config", str(config), "--data-dir", data)
    assert refused.returncode == 2 and "give one value" in refused.stderr
    assert refused.stderr.count("\n") == 1


@pytest.mark.parametrize(
    "address, toml, complaint",
    [
        ("0.0.0.0:15692", '"0.0.0.0:15692"', "not a loopback address"),
        ("garbage", '"garbage"', "HOST:PORT"),
        ("127.0.0.1:65536", '"127.0.0.1:65536"', "a port in 0..65535"),
        ("127.0.0.1:http", '"127.0.0.1:http"', "a port in 0..65535"),
        ("http://127.0.0.1:15692", '"http://127.0.0.1:15692"', "HOST:PORT"),
        (15692, "15692", "HOST:PORT"),
    ],
)
def test_a_bad_http_address_is_refused_in_one_line_from_options_toml_and_node(
    tmp_path, address, toml, complaint
):
    data = tmp_path / "data"
    config = tmp_path / "warren.toml"
    config.write_text(f"[http]\nlisten = {toml}\n")
    attempts = [warren("node", "--data-dir", str(data), "--config", str(config))]
    if isinstance(address, str):
        attempts.append(warren("node", "--data-dir", str(data), "--http", address))
    for refused in attempts:
        assert refused.returncode == 2
        assert complaint in refused.stderr and refused.stderr.count("\n") == 1
    with pytest.raises(InvalidSpec, match=complaint):
        Node(data, http=address)
    assert not data.exists()  # refused before anything started


def test_every_series_the_node_exports_is_listed_in_the_metrics_guide():
    guide = (ROOT / "docs" / "metrics.md").read_text()
    listed = re.findall(r"^\| `(warren_\w+)` \| (\w+) \|", guide, re.MULTILINE)
    assert len(listed) == len(set(listed)), "a series is listed twice"
    assert dict(listed) == series.exported()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.skipif(
    shutil.which("promtool") is None,
    reason="promtool is not installed (Debian's prometheus package has it)",
)
def test_promtool_finds_nothing_to_fault_in_either_metrics_page(tmp_path):
    with Node(tmp_path / "data", http=LOOPBACK_ANY_PORT) as node:
        node.declare_queue("orders")
        with node.connect() as conn:
            conn.publish("orders", b"order")
        wait_for(lambda: ("warren_disk_space_available_bytes", ()) in scrape(node))
        for page in ("/metrics", "/metrics/per-object"):
            _, _, body = fetch(node.http_endpoint + page)
            checked = subprocess.run(
                ["promtool", "check", "metrics"], input=body, capture_output=True, timeout=60
            )
            assert checked.returncode == 0, (page, checked.stdout, checked.stderr)


needs_prometheus = pytest.mark.skipif(
    shutil.which("prometheus") is None,
    reason="prometheus is not installed (Debian: apt-get install prometheus)",
)


@contextlib.contextmanager
def prometheus_scraping(node: Node, tmp_path, job: str = "warren"):
    """A Prometheus server scraping ``node``'s per-object page every second as ``job``,
    stopped on the way out; yields ``query(promql)``: the result of an instant query, or
    None while the server is not ready (a query it refuses fails the test)."""
    config = tmp_path / "prometheus.yml"
    config.write_text(
        textwrap.dedent(
            f"""\
            global:
              scrape_interval: 1s
              scrape_timeout: 1s
            scrape_configs:
              - job_name: {job}
                metrics_path: /metrics/per-object
                static_configs:
                  - targets: ["{node.http_endpoint.removeprefix("http://")}"]
            """
        )
    )
    port = free_port()

    def query(promql: str) -> list | None:
        url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        try:
            status, _, body = fetch(url)
        except OSError:  # not listening yet
            return None
        if status == 503:  # listening, not ready yet
            return None
        answer = json.loads(body)
        assert status == 200, (promql, answer)
        return answer["data"]["result"]

    with open(tmp_path / "prometheus.log", "w") as log:
        server = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            yield query
        finally:
            server.terminate()
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


@needs_prometheus
def test_a_prometheus_server_scraping_the_node_answers_a_promql_query_for_the_ready_count(
    tmp_path,
):
    with Node(tmp_path / "data", http=LOOPBACK_ANY_PORT) as node:
        node.declare_queue("orders")
        with node.connect() as conn:
            conn.publish_many("orders", [b"order"] * 3)
        with prometheus_scraping(node, tmp_path) as query:

            def ready_count() -> str | None:
                result = query('warren_queue_messages_ready{queue="orders"}')
                return result[0]["value"][1] if result else None

            wait_for(lambda: ready_count() == "3", timeout=60)


@needs_prometheus
def test_a_prometheus_server_sees_every_restart_of_a_queue_that_crash_loops_and_its_state(
    tmp_path,
):
    with Node(tmp_path / "data", http=LOOPBACK_ANY_PORT) as node:
        node.declare_queue("orders")
        with prometheus_scraping(node, tmp_path) as query:

            def value(promql: str) -> str | None:
                result = query(promql)
                return result[0]["value"][1] if result else None

            wait_for(lambda: value('warren_queue_state{queue="orders",state="running"}') == "1")
            for _ in range(QUEUE_FLAGS.intensity + 1):  # faster than its scrapes, mostly
                kill_queue_process(node, "orders")
            crashed = 'warren_queue_state{queue="orders",state="crashed"}'
            wait_for(lambda: value(crashed) == "1", timeout=60)
            restarts = 'warren_actor_restarts_total{actor="queue orders"}'
            assert value(restarts) == str(QUEUE_FLAGS.intensity)


@pytest.mark.skipif(
    shutil.which("promtool") is None,
    reason="promtool is not installed (Debian's prometheus package has it)",
)
def test_the_example_scrape_config_is_one_prometheus_accepts():
    checked = subprocess.run(
        ["promtool", "check", "config", str(ROOT / "deploy" / "prometheus.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr

"""The Grafana dashboard in deploy/grafana is built on series the node really exports: every
name in its queries is one the node's tables export and docs/metrics.md lists, it shows
what it promises (queues, rates, latencies, the store, streams, memory and disk against
their limits, restarts), and a real Prometheus scraping a node with a queue, a stream
and a named consumer answers every one of its queries with data."""

import json
import re

import pytest

from warren.supervisor import Node
from warren.supervisor.node import series

from ...waiting import wait_for
from ..cli.test_cli import ROOT
from .test_metrics import LOOPBACK_ANY_PORT, needs_prometheus, prometheus_scraping

DASHBOARD = ROOT / "deploy" / "grafana" / "warren-overview.json"
HISTOGRAM_SAMPLES = ("_bucket", "_sum", "_count")
JOB = "warren-per-object"
# What the dashboard's variables stand for in a query: every queue and stream.
VARIABLES = {"$queue": ".*", "$stream": ".*", "$__rate_interval": "5s"}


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def panel_queries(board: dict) -> dict[str, list[str]]:
    """Each panel's PromQL, by title (rows have none)."""
    return {
        panel["title"]: [target["expr"] for target in panel["targets"]]
        for panel in board["panels"]
        if panel["type"] != "row"
    }


def variable_queries(board: dict) -> list[str]:
    return [variable["query"]["query"] for variable in board["templating"]["list"]]


def family_of(sample_name: str) -> str:
    """The family a sample name belongs to: a histogram's samples carry a suffix."""
    for suffix in HISTOGRAM_SAMPLES:
        family = sample_name.removesuffix(suffix)
        if family != sample_name and series.exported().get(family) == "histogram":
            return family
    return sample_name


def names_in(promql: str) -> set[str]:
    return {family_of(name) for name in re.findall(r"\bwarren_\w+", promql)}


def test_every_series_the_dashboard_queries_is_one_the_node_exports_and_documents():
    board = dashboard()
    queries = [q for qs in panel_queries(board).values() for q in qs] + variable_queries(board)
    used = set().union(*(names_in(q) for q in queries))
    exported = series.exported()
    guide = (ROOT / "docs" / "metrics.md").read_text()
    assert sorted(used - set(exported)) == []
    assert [name for name in used if f"| `{name}` |" not in guide] == []
    promised = {
        "warren_queue_messages_ready",
        "warren_queue_messages_unacked",
        "warren_global_messages_routed_total",
        "warren_global_messages_delivered_total",
        "warren_global_messages_acknowledged_total",
        "warren_msg_store_confirm_wait_seconds",
        "warren_msg_store_sync_duration_seconds",
        "warren_msg_store_files",
        "warren_msg_store_bytes",
        "warren_msg_store_garbage_ratio",
        "warren_msg_store_gc_runs_total",
        "warren_actor_restarts_total",
        "warren_process_resident_memory_bytes",
        "warren_resident_memory_limit_bytes",
        "warren_disk_space_available_bytes",
        "warren_disk_space_available_limit_bytes",
        "warren_stream_first_offset",
        "warren_stream_committed_offset",
        "warren_stream_last_offset",
        "warren_stream_consumer_lag",
    }
    assert sorted(promised - used) == []
    for histogram in ("warren_msg_store_confirm_wait_seconds", "warren_msg_store_sync_duration"):
        assert any("histogram_quantile(" in q and histogram in q for q in queries), (
            f"no quantile of {histogram}"
        )


def test_the_dashboard_asks_for_its_datasource_as_exported_dashboards_do():
    board = dashboard()
    (source,) = board["__inputs"]
    assert (source["name"], source["type"], source["pluginId"]) == (
        "DS_PROMETHEUS",
        "datasource",
        "prometheus",
    )
    uses = [panel["datasource"] for panel in board["panels"] if panel["type"] != "row"]
    uses += [t["datasource"] for p in board["panels"] for t in p.get("targets", [])]
    uses += [variable["datasource"] for variable in board["templating"]["list"]]
    assert all(use == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"} for use in uses)
    panels = [panel for panel in board["panels"] if panel["type"] != "row"]
    assert len({panel["id"] for panel in board["panels"]}) == len(board["panels"])
    for panel in panels:  # on Grafana's grid of 24 columns, none overlapping another
        place = panel["gridPos"]
        assert place["x"] + place["w"] <= 24, panel["title"]
    places = {(p["gridPos"]["x"], p["gridPos"]["y"]) for p in panels}
    assert len(places) == len(panels)


@needs_prometheus
def test_a_prometheus_scraping_a_node_answers_every_dashboard_query_with_data(tmp_path):
    board = dashboard()
    with Node(tmp_path / "data", http=LOOPBACK_ANY_PORT) as node:
        node.declare_queue("orders")
        node.declare_queue("events", type="stream")
        with node.connect() as conn:
            conn.publish_many("orders", [bytes(8192)] * 5)  # large: through the store
            conn.get("orders").ack()
            conn.publish_many("events", [b"event"] * 5)
            with conn.consume("events", offset="first", name="billing") as consumer:
                for record in consumer:
                    if record.offset == 2:
                        break
        target = node.http_endpoint.removeprefix("http://")
        filled = {"$job": JOB, "$instance": target, **VARIABLES}

        def fill(promql: str) -> str:
            for variable, value in filled.items():
                promql = promql.replace(variable, value)
            return promql

        with prometheus_scraping(node, tmp_path, job=JOB) as query:

            def panels_without_data() -> list[str]:
                return [
                    title
                    for title, queries in panel_queries(board).items()
                    if not all(query(fill(q)) for q in queries)
                ]

            try:  # rates need two scrapes, and every query a ready server
                wait_for(lambda: not panels_without_data(), timeout=60)
            except AssertionError:
                pytest.fail(f"panels without data: {panels_without_data()}")
            for variable in variable_queries(board):
                selector, label = re.fullmatch(r"label_values\((.+), (\w+)\)", variable).groups()
                found = query(fill(selector))
                assert found and all(label in s["metric"] for s in found), variable

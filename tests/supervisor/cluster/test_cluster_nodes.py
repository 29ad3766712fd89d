"""Three ``warren node --cluster`` processes on one etcd: they agree on one leader and
its epoch, its followers are synced and join the ISR, `warren cluster status` and
`warren status` say so, a killed leader that restarts releases its old lease so that
the cluster elects at once, a killed leader is replaced by a follower of the ISR, a
stopped one gives its lease back, a paused one stops leading and leads again only under
a new epoch, and every bad start is one line with nothing written."""

import contextlib
import json
import os
import re
import signal
import subprocess

import psutil
import pytest

from warren.supervisor.cluster.election import Election
from warren.supervisor.cluster.etcd import Etcd

from ...queues.client.node_process import ROOT, WARREN, NodeProcess, free_port
from ...waiting import descendant_titled, wait_for


def cluster_status(node: NodeProcess) -> dict:
    done = subprocess.run(
        [*WARREN, "cluster", "status", "--data-dir", str(node.data_dir), "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def cluster_node(
    etcd,
    tmp_path,
    cluster: str,
    index: int,
    ttl_s: int = 10,
    min_insync: int = 2,
    extra: tuple[str, ...] = (),
) -> NodeProcess:
    """Node ``n<index>`` of ``cluster`` (``min_insync`` nodes hold each confirmed write;
    ``extra``: more options); its start waits only for its status: a follower serves no
    client."""
    return NodeProcess(
        tmp_path / f"n{index}",
        (
            "--name",
            f"n{index}",
            "--cluster",
            cluster,
            "--etcd",
            ",".join(etcd.endpoints),
            "--peer",
            f"tcp://127.0.0.1:{free_port()}",  # each test its own: tests run side by side
            "--cluster-ttl-s",
            str(ttl_s),
            "--min-insync",
            str(min_insync),
            *extra,
        ),
        serves=False,
    )


def peer(node: NodeProcess) -> str:
    """The address ``node``'s peers reach it at (its ``--peer``)."""
    return node.options[node.options.index("--peer") + 1]


def start_nodes(etcd, tmp_path, cluster: str, count: int = 3, ttl_s: int = 10, min_insync: int = 2):
    """``count`` nodes of ``cluster`` (``cluster_node``'s; ``min_insync`` at most
    ``count``)."""
    nodes = []
    try:
        for i in range(count):
            nodes.append(cluster_node(etcd, tmp_path, cluster, i, ttl_s, min(min_insync, count)))
    except BaseException:
        for node in nodes:
            node.stop()
        raise
    return nodes


def lose_machine(node: NodeProcess) -> None:
    """SIGKILL every process of ``node`` at once, as a machine that dies (a kill of the
    node's process alone lets its forkserver stop the actors, and the coordinator give
    its lease back on the way)."""
    family = psutil.Process(node.process.pid).children(recursive=True)
    for process in family:
        with contextlib.suppress(psutil.Error):
            process.kill()
    node.kill()
    psutil.wait_procs(family, timeout=30)
    assert not [p for p in family if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def agreed_leader(nodes: list[NodeProcess]) -> tuple[str, int] | None:
    """The leader and epoch every node reports, once they agree and one leads."""
    seen = {(s["leader"], s["epoch"]) for s in map(cluster_status, nodes)}
    if len(seen) == 1:
        leader, epoch = seen.pop()
        if leader is not None:
            return leader, epoch
    return None


ALL_THREE = ["n0", "n1", "n2"]


def test_three_nodes_elect_a_leader_whose_followers_catch_up_into_the_isr(etcd, tmp_path):
    # A 60 s lease, and every wait below 30 s: a killed leader's key released only by
    # its lease's expiry would fail the test.
    nodes = start_nodes(etcd, tmp_path, "three", ttl_s=60)
    try:
        wait_for(lambda: agreed_leader(nodes), timeout=30)
        leader, epoch = agreed_leader(nodes)
        # The followers are synced from the leader's directory, then written into the
        # ISR by the leader (a write fenced on its epoch).
        wait_for(lambda: all(cluster_status(n)["isr"] == ALL_THREE for n in nodes), timeout=30)
        statuses = {s["node"]: s for s in map(cluster_status, nodes)}
        assert {name: s["role"] for name, s in statuses.items()} == {
            name: "leader" if name == leader else "follower" for name in statuses
        }
        for status in statuses.values():
            assert status["isr_epoch"] == epoch
            assert status["nodes"] == {f"n{i}": peer(node) for i, node in enumerate(nodes)}
        shipping = statuses[leader]["replication"]
        assert shipping["mode"] == "leader"
        assert set(shipping["followers"]) == set(ALL_THREE) - {leader}
        assert all(statuses[n]["replication"]["mode"] == "replica" for n in shipping["followers"])
        shown = subprocess.run(
            [*WARREN, "cluster", "status", "--data-dir", str(nodes[int(leader[-1])].data_dir)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
        assert "replication: action " in shown and "min in sync 2" in shown
        for follower in shipping["followers"]:
            assert re.search(rf"\n  {follower}: following the log, \d+ actions", shown), shown
        for node in nodes:
            wait_for(lambda node=node: etcd_healthy(node) == 3, timeout=30)
        shown = subprocess.run(
            [*WARREN, "status", "--data-dir", str(nodes[0].data_dir)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
        assert f"cluster three: this node is {statuses['n0']['role']}; leader {leader}" in shown
        # Every process of the leader SIGKILLed, started again: its new lease releases
        # the key its killed run left, so a node of the ISR leads under a new epoch
        # long before the killed run's lease would have expired.
        killed = nodes[int(leader[-1])]
        lose_machine(killed)
        killed.start()
        wait_for(lambda: (agreed := agreed_leader(nodes)) and agreed[1] > epoch, timeout=30)
        leader, epoch = agreed_leader(nodes)
        # A clean stop gives the lease back: another member of the ISR leads at once.
        stopped = nodes[int(leader[-1])]
        stopped.stop_by(signal.SIGTERM, "node")
        others = [node for node in nodes if node is not stopped]
        wait_for(lambda: (agreed := agreed_leader(others)) and agreed[1] > epoch, timeout=30)
        assert agreed_leader(others)[0] != leader
    finally:
        for node in nodes:
            node.stop()


def etcd_healthy(node: NodeProcess) -> int:
    return sum(member["healthy"] for member in cluster_status(node)["etcd"])


def test_when_the_leader_is_killed_an_isr_follower_takes_over_under_a_higher_epoch(etcd, tmp_path):
    nodes = start_nodes(etcd, tmp_path, "failover", ttl_s=5)
    try:
        wait_for(lambda: agreed_leader(nodes), timeout=60)
        leader, epoch = agreed_leader(nodes)
        wait_for(lambda: all(cluster_status(n)["isr"] == ALL_THREE for n in nodes), timeout=60)
        killed = nodes[int(leader[-1])]
        lose_machine(killed)  # no process of it is left to give its lease back
        others = [node for node in nodes if node is not killed]
        wait_for(lambda: (agreed := agreed_leader(others)) and agreed[1] > epoch, timeout=60)
        new_leader, _ = agreed_leader(others)
        assert new_leader != leader
        assert sorted(cluster_status(n)["role"] for n in others) == ["follower", "leader"]
        killed.start()  # back as a follower: the leader key is another's
        wait_for(lambda: cluster_status(killed)["leader"] == new_leader, timeout=60)
        assert cluster_status(killed)["role"] == "follower"
        # synced whole from the new leader (its files are of an older epoch), then back
        wait_for(lambda: cluster_status(killed)["isr"] == ALL_THREE, timeout=60)
    finally:
        for node in nodes:
            node.stop()


def test_a_leader_paused_past_its_lease_stops_leading_and_leads_again_only_under_a_new_epoch(
    etcd, tmp_path
):
    (node,) = start_nodes(etcd, tmp_path, "paused", count=1, ttl_s=5, min_insync=1)
    reader = Election(Etcd(etcd.endpoints), "paused", "reader", "reader", "tcp://127.0.0.1:1")
    try:
        wait_for(lambda: cluster_status(node)["role"] == "leader", timeout=60)
        epoch = cluster_status(node)["epoch"]
        coordinator = descendant_titled("warren: coordinator")
        assert coordinator is not None
        os.kill(coordinator.pid, signal.SIGSTOP)
        try:
            wait_for(lambda: reader.observe().leader is None, timeout=60)  # etcd expired it
        finally:
            os.kill(coordinator.pid, signal.SIGCONT)
        # From the moment it runs again, it never says it leads under the old epoch.
        seen: list[dict] = []

        def leads_anew() -> bool:
            seen.append(status := cluster_status(node))
            return status["role"] == "leader" and status["epoch"] > epoch

        wait_for(leads_anew, timeout=60)
        assert all(s["role"] != "leader" or s["epoch"] > epoch for s in seen), seen
    finally:
        node.stop()
        reader.etcd.close()


def warren_node(tmp_path, *options: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*WARREN, "node", *options],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_start_with_no_etcd_answering_is_one_line_and_writes_nothing(tmp_path):
    data_dir = tmp_path / "node"
    done = warren_node(
        tmp_path,
        "--data-dir",
        str(data_dir),
        "--cluster",
        "c",
        "--etcd",
        "http://127.0.0.1:9",
        "--peer",
        "tcp://127.0.0.1:7001",
    )
    assert done.returncode == 4
    assert done.stderr.strip().splitlines() == [
        "warren: the node did not start: EtcdUnavailable: no etcd member answered "
        "(http://127.0.0.1:9: connection refused)"
    ]
    assert not data_dir.exists()


@pytest.mark.parametrize(
    ("options", "said"),
    [
        (
            ("--etcd", "http://127.0.0.1:2379"),
            "--etcd, --peer, --peer-listen, --cluster-ttl-s and --min-insync go with --cluster",
        ),
        (
            ("--cluster", "c", "--etcd", "http://a:1", "--peer", "tcp://a:1", "--min-insync", "0"),
            "min_insync=0: how many nodes",
        ),
        (("--cluster", "c", "--peer", "tcp://127.0.0.1:1"), "needs etcd"),
        (("--cluster", "c", "--etcd", "http://127.0.0.1:2379"), "needs the address its peers"),
        (("--cluster", "c", "--etcd", "h:1", "--peer", "tcp://a:1"), "is not an etcd endpoint"),
        (("--cluster", "c", "--etcd", "http://a:1", "--peer", "a:1"), "expected tcp://HOST:PORT"),
        (
            ("--cluster", "c", "--etcd", "http://a:1", "--peer", "tcp://a:1", "--peer-listen", "a"),
            "peer_listen='a': expected tcp://HOST:PORT",
        ),
        (("--cluster", "a/b", "--etcd", "http://a:1", "--peer", "tcp://a:1"), "a cluster's name"),
    ],
)
def test_bad_cluster_options_are_one_line_and_exit_2(tmp_path, options, said):
    done = warren_node(tmp_path, "--data-dir", str(tmp_path / "node"), *options)
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and said in done.stderr
    assert not (tmp_path / "node").exists()


def test_another_clusters_data_and_a_name_in_use_are_refused_in_one_line(etcd, tmp_path):
    (first,) = start_nodes(etcd, tmp_path, "owned", count=1)
    try:
        # registered in etcd (its status answers before its coordinator has joined)
        wait_for(lambda: "n0" in cluster_status(first)["nodes"], timeout=60)
        common = ("--etcd", ",".join(etcd.endpoints), "--peer", f"tcp://127.0.0.1:{free_port()}")
        taken = warren_node(
            tmp_path,
            "--data-dir",
            str(tmp_path / "other"),
            "--name",
            "n0",
            "--cluster",
            "owned",
            *common,
        )
        assert taken.returncode == 2
        assert not (tmp_path / "other").exists()  # refused before anything was written
        assert taken.stderr.strip().splitlines() == [
            f"warren: another node named 'n0' is in cluster 'owned' (at {peer(first)}): "
            "give each node of a cluster its own name"
        ]
        first.stop()
        before = sorted(os.listdir(first.data_dir))
        foreign = warren_node(
            tmp_path,
            "--data-dir",
            str(first.data_dir),
            "--name",
            "n0",
            "--cluster",
            "someone-else",
            *common,
        )
        assert foreign.returncode == 2
        assert foreign.stderr.strip().splitlines() == [
            f"warren: {first.data_dir} holds the data of cluster 'owned', not 'someone-else': "
            "a node joins a cluster only with its own data (use another data directory)"
        ]
        assert sorted(os.listdir(first.data_dir)) == before
    finally:
        first.stop()
    assert descendant_titled("warren: coordinator") is None


def test_the_leaders_metrics_and_api_show_its_cluster_and_a_lone_node_shows_none(etcd, tmp_path):
    from warren.supervisor import Node

    from ..node.test_metrics import fetch, scrape

    options = {
        "etcd": etcd.endpoints,
        "peer": f"tcp://127.0.0.1:{free_port()}",
        "http": "127.0.0.1:0",
        "min_insync": 1,
    }
    with Node(tmp_path / "n0", name="n0", cluster="scraped", **options) as node:
        wait_for(lambda: (node.cluster_status() or {}).get("etcd_healthy") == 3, timeout=60)
        wait_for(lambda: node.cluster_status()["role"] == "leader", timeout=60)
        epoch, steps = node.cluster_status()["epoch"], node.cluster_status()["steps"]
        wait_for(lambda: node.cluster_status()["steps"] >= steps + 3, timeout=60)
        samples = scrape(node)  # several steps of a leader later: still one election
        assert samples[("warren_cluster_leader", ())] == 1
        assert samples[("warren_cluster_epoch", ())] == epoch
        assert samples[("warren_cluster_isr_members", ())] == 1
        assert samples[("warren_cluster_nodes_up", ())] == 1
        assert samples[("warren_cluster_etcd_members_healthy", ())] == 3
        assert samples[("warren_cluster_elections_won_total", ())] == 1
        status, _, body = fetch(node.http_endpoint + "/api/cluster")
        document = json.loads(body)
        assert status == 200 and document["leader"] == "n0" and document["epoch"] == epoch
        assert json.loads(fetch(node.http_endpoint + "/api/overview")[2])["cluster"]["role"] == (
            "leader"
        )
    with Node(tmp_path / "lone", http="127.0.0.1:0") as lone:
        assert json.loads(fetch(lone.http_endpoint + "/api/cluster")[2]) == {"cluster": None}
        assert not [name for name, _ in scrape(lone) if name.startswith("warren_cluster_")]
        assert lone.cluster_status() is None


def test_the_management_page_shows_the_cluster_its_role_leader_and_epoch(etcd, tmp_path):
    from warren.supervisor import Node

    from ..node.test_management_page import CHROMIUM, render

    if CHROMIUM is None:
        pytest.skip("chromium is not installed (Debian: apt-get install chromium; .ci/run does)")
    options = {
        "etcd": etcd.endpoints,
        "peer": f"tcp://127.0.0.1:{free_port()}",
        "http": "127.0.0.1:0",
        "min_insync": 1,
    }
    with Node(tmp_path / "n0", name="n0", cluster="paged", **options) as node:
        wait_for(lambda: node.cluster_status()["role"] == "leader", timeout=60)
        epoch = node.cluster_status()["epoch"]
        dom = render(node.http_endpoint + "/", tmp_path, "--dump-dom")
    assert f'<dd data-cluster="paged">paged: leader; leader n0, epoch {epoch}</dd>' in dom


def test_a_crash_elsewhere_in_the_leaders_tree_costs_no_election(etcd, tmp_path):
    from warren.supervisor import Node
    from warren.supervisor.chaos.faults import kill_processes

    options = {"etcd": etcd.endpoints, "peer": f"tcp://127.0.0.1:{free_port()}", "min_insync": 1}
    with Node(
        tmp_path / "n0", name="n0", cluster="steady", listen="tcp://127.0.0.1:*", **options
    ) as node:
        wait_for(lambda: node.cluster_status()["role"] == "leader", timeout=60)
        epoch = node.cluster_status()["epoch"]
        coordinator = node.actors.whereis("coordinator").pid
        for name in ("msg_store_persistent", "listener"):  # the root restarts what follows
            wait_for(lambda name=name: node.actors.whereis(name) is not None, timeout=60)
            pid = node.actors.whereis(name).pid
            assert not kill_processes([psutil.Process(pid)])
            wait_for(lambda name=name, pid=pid: restarted(node, name, pid), timeout=60)
        steps = node.cluster_status()["steps"]
        wait_for(lambda: node.cluster_status()["steps"] >= steps + 3, timeout=60)
        status = node.cluster_status()
        assert (status["role"], status["epoch"], status["elections_won"]) == ("leader", epoch, 1)
        assert node.actors.whereis("coordinator").pid == coordinator


def restarted(node, name: str, pid: int) -> bool:
    """Whether actor ``name`` runs again, in another process than ``pid``."""
    ref = node.actors.whereis(name)
    return ref is not None and ref.pid != pid


def test_cluster_status_of_a_node_outside_a_cluster_is_one_line_and_exit_2(tmp_path):
    from warren.supervisor import Node

    with Node(tmp_path / "lone"):
        done = subprocess.run(
            [*WARREN, "cluster", "status", "--data-dir", str(tmp_path / "lone")],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"warren: the node on {tmp_path / 'lone'} is not in a cluster "
        "(warren node --cluster NAME --etcd URL --peer tcp://HOST:PORT)"
    ]

"""The election against a real etcd (three members): one winner, the epoch as the
leader key's revision, writes fenced on it, only ISR members leading, a node's own
earlier run released, and any member of etcd serving."""

import http.server
import threading

import pytest

from warren.errors import ClusterMismatch, EtcdUnavailable, StaleLeadership
from warren.supervisor.cluster.election import Election
from warren.supervisor.cluster.etcd import Etcd, parse_endpoints

from ...waiting import wait_for


def election(etcd_members, cluster: str, node: str, node_id: str | None = None, ttl_s: int = 10):
    own = Election(
        Etcd(etcd_members.endpoints),
        cluster,
        node,
        node_id or f"id-{node}",
        f"tcp://127.0.0.1:{7000 + int(node[-1])}",
        ttl_s=ttl_s,
    )
    own.join()
    return own


def test_of_two_nodes_campaigning_at_once_exactly_one_leads_under_the_leader_keys_revision(etcd):
    first, second = (election(etcd, "race", f"n{i}") for i in (1, 2))
    won: dict[str, bool] = {}
    threads = [
        threading.Thread(target=lambda e=e: won.__setitem__(e.node, e.campaign()))
        for e in (first, second)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert sorted(won.values()) == [False, True], won
    leader = first if won["n1"] else second
    view = second.observe()
    assert view.leader == leader.node and view.epoch == leader.epoch
    assert view.isr == (leader.node,) and view.isr_epoch == leader.epoch
    assert set(view.nodes) == {"n1", "n2"}
    for own in (first, second):
        own.leave()


def test_a_leader_whose_lease_expired_stops_leading_and_its_isr_write_is_refused(etcd):
    old = election(etcd, "fenced", "n1", ttl_s=2)
    assert old.campaign()
    old.write_isr(("n1", "n2"))
    new = election(etcd, "fenced", "n2")
    # No keepalive: as a leader paused past its lease (SIGSTOP) or cut from etcd.
    wait_for(lambda: new.observe().leader is None, timeout=30)
    assert not old.leading()  # its own clock said so before etcd expired the key
    assert new.campaign() and new.epoch > old.epoch
    with pytest.raises(StaleLeadership, match="its ISR write was refused"):
        old.write_isr(("n1",))
    assert not old.leading()
    view = new.observe()
    assert view.leader == "n2" and view.isr == ("n1", "n2") and view.isr_epoch == new.epoch
    new.leave()


def test_a_node_outside_the_isr_that_wins_the_key_resigns_and_says_why(etcd):
    first = election(etcd, "isr-only", "n1")
    assert first.campaign()
    first.leave()  # the ISR stays: n1 alone
    second = election(etcd, "isr-only", "n2")
    assert not second.campaign()
    assert "is not in the ISR (n1): resigned" in (second.refused or "")
    assert second.observe().leader is None
    second.leave()


def test_a_restarted_leader_releases_the_key_its_killed_run_left_and_leads_at_a_new_epoch(etcd):
    killed = election(etcd, "restart", "n1")
    assert killed.campaign()
    others = election(etcd, "restart", "n2")
    assert others.observe().leader == "n1"
    # Killed: no leave. The same node id comes back with a new lease.
    again = election(etcd, "restart", "n1")
    assert others.observe().leader is None  # not after a TTL: at once
    assert again.campaign() and again.epoch > killed.epoch
    for own in (others, again):
        own.leave()


def test_a_name_another_node_holds_is_refused_and_the_same_node_may_rejoin(etcd):
    first = election(etcd, "names", "n1", node_id="a")
    with pytest.raises(ClusterMismatch, match="another node named 'n1' is in cluster 'names'"):
        election(etcd, "names", "n1", node_id="b")
    assert first.observe().nodes == {"n1": "tcp://127.0.0.1:7001"}
    election(etcd, "names", "n1", node_id="a").leave()
    first.leave()


def test_with_an_etcd_member_killed_the_others_serve_and_its_health_says_so(own_etcd):
    own = election(own_etcd, "member-down", "n1")
    own_etcd.kill(0)  # the member each client asks first
    assert own.keepalive()
    assert own.campaign()
    assert own.observe().leader == "n1"
    health = own.etcd.health()
    assert [member["healthy"] for member in health] == [False, True, True]
    assert health[0]["error"] == "connection refused"
    own.leave()


def test_no_etcd_answering_is_one_error_naming_each_member(tmp_path):
    with pytest.raises(EtcdUnavailable) as raised:
        Etcd(("http://127.0.0.1:9", "http://127.0.0.1:10")).post("maintenance/status", {})
    assert str(raised.value) == (
        "no etcd member answered (http://127.0.0.1:9: connection refused; "
        "http://127.0.0.1:10: connection refused)"
    )


def test_an_endpoint_that_is_not_etcd_is_not_taken_for_an_answer():
    class NotEtcd(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b'{"hello": "world"}')

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), NotEtcd)
    thread = threading.Thread(target=server.serve_forever)
    thread.start()
    try:
        endpoint = f"http://127.0.0.1:{server.server_address[1]}"
        with pytest.raises(EtcdUnavailable, match="not an etcd answer"):
            Etcd((endpoint,)).post("maintenance/status", {})
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "name at least one etcd endpoint"),
        ("127.0.0.1:2379", "is not an etcd endpoint"),
        ("http://127.0.0.1", "is not an etcd endpoint"),
        ("http://127.0.0.1:2379/v3", "has no path"),
        ("http://a:1,http://a:1", "named twice"),
    ],
)
def test_bad_etcd_endpoints_are_refused_with_the_reason(text, reason):
    with pytest.raises(ValueError, match=reason):
        parse_endpoints(text)

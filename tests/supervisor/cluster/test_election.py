"""The election against a real etcd (three members): one winner, the epoch as the
leader key's revision, writes fenced on it, only ISR members leading, a node's own
earlier run released, and any member of etcd serving."""

import contextlib
import http.server
import threading
import time

import pytest

from warren.errors import (
    ClusterError,
    ClusterMismatch,
    EtcdRefused,
    EtcdUnavailable,
    StaleLeadership,
)
from warren.supervisor.cluster.election import Election
from warren.supervisor.cluster.etcd import Etcd, encoded, parse_endpoints

from ...waiting import wait_for


class Clock:
    """A monotonic clock the test moves by hand (etcd's own clock runs as it does)."""

    def __init__(self) -> None:
        self.now = time.monotonic()

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def elections(etcd):
    """``elect(cluster, node, …)``: a joined Election; each one's sessions are closed
    (and its lease revoked) at the end."""
    made: list[Election] = []

    def elect(cluster: str, node: str, node_id: str | None = None, **options) -> Election:
        own = Election(
            Etcd(etcd.endpoints),
            cluster,
            node,
            node_id or f"id-{node}",
            f"tcp://127.0.0.1:{7000 + int(node[-1])}",
            **options,
        )
        made.append(own)
        own.join()
        return own

    yield elect
    for own in made:
        with contextlib.suppress(ClusterError):
            own.leave()
        own.etcd.close()


def test_of_two_nodes_campaigning_at_once_exactly_one_leads_under_the_leader_keys_revision(
    elections,
):
    first, second = (elections("race", f"n{i}") for i in (1, 2))
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


def test_a_leader_stops_on_its_own_clock_before_etcd_expires_it_and_its_isr_write_is_refused(
    elections,
):
    clock = Clock()
    old = elections("fenced", "n1", ttl_s=2, clock=clock)
    assert old.campaign()
    old.write_isr(("n1", "n2"))
    new = elections("fenced", "n2", ttl_s=30)
    # No keepalive: as a leader paused (SIGSTOP) or cut from etcd. Past 80 % of its TTL
    # by its own clock, it leads no more, while etcd still holds its key.
    clock.now += 2 * 0.8
    assert not old.leading() and new.observe().leader == "n1"
    wait_for(lambda: new.observe().leader is None, timeout=30)  # etcd expired the lease
    assert new.campaign() and new.epoch > old.epoch
    with pytest.raises(StaleLeadership, match="its ISR write was refused"):
        old.write_isr(("n1",))
    view = new.observe()
    assert view.leader == "n2" and view.isr == ("n1", "n2") and view.isr_epoch == new.epoch


def test_a_leader_whose_key_vanished_or_whose_win_was_not_heard_follows_what_etcd_holds(
    elections,
):
    leader = elections("lost-answers", "n1")
    assert leader.campaign()
    # The key deleted behind its back (by hand, or a resign whose answer was lost).
    leader._txn([], [{"request_delete_range": {"key": encoded("/warren/lost-answers/leader")}}])
    leader.follow(leader.observe())
    assert not leader.leading()
    # A win whose answer was lost: the key under its lease, the node not knowing it.
    assert leader.campaign()
    epoch, leader.epoch = leader.epoch, None
    view = leader.observe()
    assert leader.holds_key(view) and not leader.leading()
    assert leader.campaign() and leader.epoch == epoch  # taken up, not a new election


def test_a_node_outside_the_isr_that_wins_the_key_resigns_and_says_why(elections):
    first = elections("isr-only", "n1")
    assert first.campaign()
    first.leave()  # the ISR stays: n1 alone
    second = elections("isr-only", "n2")
    assert not second.campaign() and not second.leading()
    assert "is not in the ISR (n1): resigned" in (second.refused or "")
    assert second.observe().leader is None


def test_a_restarted_leader_releases_the_key_its_killed_run_left_and_leads_at_a_new_epoch(
    elections,
):
    killed = elections("restart", "n1", ttl_s=60)
    assert killed.campaign()
    others = elections("restart", "n2")
    assert others.observe().leader == "n1"
    # Killed: no leave. The same node id comes back with a new lease.
    again = elections("restart", "n1")
    assert others.observe().leader is None  # not after the 60 s TTL: at once
    assert again.campaign() and again.epoch > killed.epoch


def test_a_name_another_node_holds_is_refused_and_the_same_node_may_rejoin(elections):
    first = elections("names", "n1", node_id="a")
    with pytest.raises(ClusterMismatch, match="another node named 'n1' is in cluster 'names'"):
        elections("names", "n1", node_id="b")
    assert first.observe().nodes == {"n1": "tcp://127.0.0.1:7001"}  # the refused one's lease went
    again = elections("names", "n1", node_id="a")
    assert again.lease is not None and again.lease != first.lease


def test_a_revoke_of_a_lease_etcd_no_longer_has_counts_as_done_and_other_refusals_are_said(
    elections,
):
    own = elections("refusals", "n1")
    lease = own.lease
    own.leave()
    own.lease = lease
    own.leave()  # its earlier revoke's answer lost: the second finds no lease, and is done
    with pytest.raises(EtcdRefused, match="refused: etcdserver: requested lease not found"):
        own.etcd.post("kv/put", {"key": encoded("k"), "value": encoded("v"), "lease": lease})


def test_with_an_etcd_member_killed_the_others_serve_and_its_health_says_so(own_etcd):
    own = Election(Etcd(own_etcd.endpoints), "member-down", "n1", "id-n1", "tcp://127.0.0.1:7001")
    own.join()
    own_etcd.kill(0)  # the member each client asks first
    # Once the two left have a raft leader between them (if the killed one led, they
    # elect one first: requests time out until then), they serve every request.
    wait_for(lambda: [m["healthy"] for m in own.etcd.health()] == [False, True, True], 60)
    assert own.keepalive()
    assert own.campaign()
    assert own.observe().leader == "n1"
    health = own.etcd.health()
    assert [member["healthy"] for member in health] == [False, True, True]
    assert health[0]["error"] == "connection refused"
    own.leave()
    own.etcd.close()


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

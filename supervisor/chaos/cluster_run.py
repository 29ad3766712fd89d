"""``warren chaos --cluster``: three etcd members and three Warren nodes of one cluster on
this machine, the workload of ``warren.supervisor.chaos.broker_run`` (producers with
producer ids and sequences, consumers acking, a stream producer and reader) through
``connect([...])`` to whichever node leads, and seeded rounds of the faults a cluster
must outlive; then the same audits as one node's run, and the cluster's own checks.

The network is cut with TCP proxies (``warren.supervisor.cluster.tcp_proxy``), which need
no root: each node's peer port is reached through a proxy (the node listens at
``--peer-listen`` and tells the cluster the proxy's address as its ``--peer``), and each
node reaches each etcd member through a proxy of its own. Clients reach the nodes
directly. The faults (``CLUSTER_FAULTS``), each healed before the next, which lands once
the cluster has settled again (every node answers, all agree on the leader and its
epoch, the ISR holds all three, the leader serves) and a seeded pause has passed:

- ``kill-leader``: every process of the leader SIGKILLed mid-publish; the node started
  again a few seconds later (a machine that comes back);
- ``pause-leader``: every process of the leader SIGSTOPped until another node leads
  under a higher epoch (its lease expired), then SIGCONT: it must confirm nothing more,
  and its followers refuse its epoch;
- ``leader-from-followers``: the links to the leader's followers cut for longer than a
  follower's deadline (the ISR shrinks to the leader, below ``min_insync``: publishes
  wait, the replication alarm blocks producers), then healed;
- ``leader-from-etcd``: the leader's links to every etcd member cut until another node
  leads (the old one stops confirming at 80 % of its lease), then healed;
- ``cut-follower``: one follower cut from everything past its lease (it leaves the ISR),
  then healed (it is synced and joins the ISR again);
- ``kill-etcd-leader``: the etcd member that leads etcd's raft SIGKILLed, started again
  a few seconds later;
- ``damaged-tail``: the leader killed, the tail of its stream's newest segment cut or
  overwritten while another node takes over, then started again: it is synced whole
  and never leads while out of the ISR.

Watched all run long (every ``WATCH_S``): no leader deposed by a newer epoch commits
anything more once it is seen deposed (``deposed_confirms``: the epoch fence failed),
and no node leads while its own view of the ISR leaves it out. After the faults,
producers stop, consumers drain the queues and the stream's reader reads to its end,
the workload stops, the followers catch up, and then: the queue and stream audits of
one node's run (every confirmed (producer, sequence) consumed or read, no stream offset
with two bodies, duplicates only where a re-send was in doubt and flagged or dropped),
and the stream's copies compared chunk by chunk (``replica_differences``: a copy
missing or empty where the leader's holds chunks, a chunk two copies hold with two
CRCs, one failing its CRC, or one missing from a copy below the last chunk it holds;
the leader's chunks past a follower's last are a tail not shipped yet). Each fault's
``recovery s`` is the longest time without a confirm from the moment it landed to the
next fault's (the last one's: to the producers' stop): what producers felt; its detail
says when the first confirm not already in flight came.

Nothing is left behind: the nodes, the etcd members, the proxies and the workload are
stopped when the run ends, fails or is interrupted, as in one node's run.

Races: a fault is aimed at the leader as the nodes agree on it just before it lands; a
paused node's status times out, so the watch sees it only after SIGCONT (its view then
may still say it leads under its old epoch, which is not another's); the first confirms
after a fault may be ones in flight when it landed (at most one a producer and a stream
batch), which the "first confirm" leaves out.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from warren.queues.broker.definitions import queue_directory
from warren.queues.engine.stream_inspect import chunk_checksums
from warren.queues.engine.stream_log import (
    FILE_HEADER_BYTES,
    SEGMENT_SUFFIX,
    numbered_files,
    segment_file_name,
)

from ..cluster.local_etcd import LocalEtcd, free_ports
from ..cluster.shipping import FOLLOWER_DEADLINE_S
from ..cluster.tcp_proxy import TcpProxy
from ..node.node import query_status
from .broker_run import STREAM, ChaosWorkload
from .report import format_report, report_document, write_report
from .result import SAMPLE_EVERY_S, ChaosResult, Event
from .run import NodeUnderTest, harness_signals
from .stream_workload import MAX_BATCH, with_stream

__all__ = [
    "CLUSTER_FAULTS",
    "ClusterUnderTest",
    "Leaderships",
    "replica_differences",
    "run_cluster_chaos",
]

log = logging.getLogger("warren.chaos")

CLUSTER = "chaos"
NODES = ("n0", "n1", "n2")
MIN_INSYNC = 2
CLUSTER_FAULTS = (
    "kill-leader",
    "pause-leader",
    "leader-from-followers",
    "leader-from-etcd",
    "cut-follower",
    "kill-etcd-leader",
    "damaged-tail",
)
LEASE_TTL_S = 5  # the nodes' etcd lease: failovers of a few seconds, a run of minutes
SETTLE_TIMEOUT_S = 180.0  # from a fault's healing to the cluster settled again
TAKEOVER_TIMEOUT_S = 90.0  # from a fault to another node leading
CATCH_UP_TIMEOUT_S = 120.0  # the followers level with the leader at the end
RESTART_AFTER_S = (1.0, 4.0)  # a killed node or etcd member, started again after
WATCH_S = 0.5
STATUS_TIMEOUT_MS = 2000
TAIL_DAMAGE_BYTES = 4096  # a damaged tail: at most this much, cut or overwritten
LISTED_DIFFERENCES = 50  # broken promises of one kind listed in the report, at most


class ClusterUnderTest:
    """Etcd's three members, three nodes behind proxies, under ``root``; ``close()``
    stops everything, whatever its state."""

    def __init__(self, root: str, *, ttl_s: int = LEASE_TTL_S) -> None:
        self.root = root
        self.ttl_s = ttl_s
        self.etcd = LocalEtcd(Path(root, "etcd"))
        self.peer_proxies: list[TcpProxy] = []
        self.etcd_proxies: list[list[TcpProxy]] = []
        self.nodes: list[NodeUnderTest] = []
        self.exits: list[str] = []  # nodes that ended on their own (started again)
        try:
            # Every port taken before the next is looked for: etcd's bound (once its
            # members answer), then the proxies', then the nodes' found free.
            self.etcd.wait_healthy()
            self.peer_proxies = [TcpProxy(None, f"{name} peer") for name in NODES]
            self.etcd_proxies = [
                [
                    TcpProxy(("127.0.0.1", port), f"{name} to etcd {member}")
                    for member, port in zip(self.etcd.names, self.etcd.client_ports, strict=True)
                ]
                for name in NODES
            ]
            ports = free_ports(2 * len(NODES))
            peer_ports, listen_ports = ports[: len(NODES)], ports[len(NODES) :]
            for proxy, port in zip(self.peer_proxies, peer_ports, strict=True):
                proxy.upstream = ("127.0.0.1", port)
            self.endpoints = [f"tcp://127.0.0.1:{port}" for port in listen_ports]
            for index, name in enumerate(NODES):
                etcd = ",".join(f"http://{p.address}" for p in self.etcd_proxies[index])
                self.nodes.append(
                    NodeUnderTest(
                        os.path.join(root, name),
                        options=(
                            "--name",
                            name,
                            "--cluster",
                            CLUSTER,
                            "--etcd",
                            etcd,
                            "--peer",
                            f"tcp://{self.peer_proxies[index].address}",
                            "--peer-listen",
                            f"tcp://127.0.0.1:{peer_ports[index]}",
                            "--cluster-ttl-s",
                            str(ttl_s),
                            "--min-insync",
                            str(MIN_INSYNC),
                            "--listen",
                            self.endpoints[index],
                        ),
                        log_path=os.path.join(root, f"{name}.log"),
                    )
                )
        except BaseException:
            self.close()
            raise

    def start(self) -> None:
        for node in self.nodes:
            node.start(wait=False)

    def view(self, index: int) -> dict | None:
        """Node ``index``'s status with its view of the cluster (``cluster``), or None."""
        node = self.nodes[index]
        with contextlib.suppress(OSError, RuntimeError):  # down, or not started
            pid = node.pid
            status = query_status(node.data_dir, timeout_ms=STATUS_TIMEOUT_MS)
            if status.get("pid") == pid and isinstance(status.get("cluster"), dict):
                return status
        return None

    def agreed(self, indexes: list[int]) -> tuple[int, int] | None:
        """The leader (its index) and epoch nodes ``indexes`` all report, once they agree
        and the leader serves."""
        views = [self.view(i) for i in indexes]
        if any(v is None for v in views):
            return None
        seen = {(v["cluster"]["leader"], v["cluster"]["epoch"]) for v in views if v}
        if len(seen) != 1:
            return None
        leader, epoch = seen.pop()
        if leader not in NODES:
            return None
        at = NODES.index(leader)
        own = views[indexes.index(at)] if at in indexes else self.view(at)
        if own is None or own["state"] != "running" or own["cluster"]["role"] != "leader":
            return None
        return at, epoch

    def settled(self) -> tuple[int, int] | None:
        """The leader and epoch, once every node agrees, the ISR holds all three and
        the leader serves."""
        agreed = self.agreed(list(range(len(NODES))))
        if agreed is None:
            return None
        view = self.view(agreed[0])
        if view is None or sorted(view["cluster"].get("isr") or ()) != list(NODES):
            return None
        return agreed

    def wait(self, what: Callable[[], tuple[int, int] | None], timeout_s: float) -> tuple[int, int]:
        deadline = time.monotonic() + timeout_s
        while (found := what()) is None:
            for node in self.nodes:  # a node that ended on its own is started again
                if node.exit_code() is not None:
                    self.exits.append(
                        f"{os.path.basename(node.data_dir)} exited with {node.exit_code()} "
                        f"(its log: {node.data_dir}.log)"
                    )
                    node.start(wait=False)
            if time.monotonic() > deadline:
                raise TimeoutError(f"the cluster did not settle within {timeout_s:.0f} s")
            time.sleep(WATCH_S)
        return found

    def caught_up(self) -> bool:
        """Whether the leader's followers are all level with its log."""
        settled = self.settled()
        view = settled and self.view(settled[0])
        if not view:
            return False
        followers = view["cluster"].get("replication", {}).get("followers", {})
        return len(followers) == len(NODES) - 1 and all(
            f.get("lag_actions") == 0 and not f.get("syncing") for f in followers.values()
        )

    def close(self) -> None:
        for node in self.nodes:
            with contextlib.suppress(Exception):
                node.close()
        for proxy in [*self.peer_proxies, *(p for row in self.etcd_proxies for p in row)]:
            proxy.close()
        self.etcd.stop()


class Leaderships:
    """What the nodes' views said of who leads, seen one after another: a node that went
    on confirming under an epoch after a newer one was seen leading (``deposed_confirms``:
    the fence failed; the commits it answered as held, counted where they stood when it
    was first seen deposed, must not grow from there), and a node leading while its own view of the
    ISR leaves it out (``outside_isr``); each listed at most ``LISTED_DIFFERENCES``
    times."""

    def __init__(self) -> None:
        self.newest = -1  # the newest epoch seen leading
        self.deposed: dict[tuple[str, int], int] = {}  # (node, epoch) -> commits answered
        self.deposed_confirms: list[str] = []
        self.outside_isr: list[str] = []

    def see(self, name: str, view: dict) -> None:
        """Node ``name``'s view of its cluster (its status's ``cluster``)."""
        epoch, isr = view.get("epoch"), view.get("isr") or []
        if view.get("role") == "leader" and isinstance(epoch, int):
            self.newest = max(self.newest, epoch)
            if isr and name not in isr and len(self.outside_isr) < LISTED_DIFFERENCES:
                self.outside_isr.append(f"{name} led under epoch {epoch} outside its ISR {isr}")
        shipping = view.get("replication") or {}
        own = shipping.get("epoch")
        committed = (shipping.get("counters") or {}).get("confirmed")
        if shipping.get("mode") != "leader" or not isinstance(own, int):
            return
        if own >= self.newest or not isinstance(committed, int):
            return  # the newest leadership known, or no count of its commits
        stood = self.deposed.setdefault((name, own), committed)
        if committed > stood and len(self.deposed_confirms) < LISTED_DIFFERENCES:
            self.deposed_confirms.append(
                f"{name} confirmed {committed - stood} commits under epoch {own} "
                f"after epoch {self.newest} led"
            )
            self.deposed[(name, own)] = committed


class _Watch(threading.Thread):
    """Samples the ledgers every ``SAMPLE_EVERY_S`` and the nodes' views every
    ``WATCH_S`` (``leaderships``)."""

    def __init__(self, cluster: ClusterUnderTest, workload: ChaosWorkload, started: float) -> None:
        super().__init__(name="chaos watch", daemon=True)
        self.cluster, self.workload, self.started = cluster, workload, started
        self.samples: list[tuple[float, dict[str, int]]] = []
        self.leaderships = Leaderships()
        self.done = threading.Event()

    def run(self) -> None:
        next_look = 0.0
        while not self.done.wait(SAMPLE_EVERY_S if self.samples else 0):
            now = time.monotonic()
            self.samples.append((round(now - self.started, 3), self.workload.sample()))
            if now >= next_look:
                for index, name in enumerate(NODES):
                    status = self.cluster.view(index)
                    if status is not None:
                        self.leaderships.see(name, status["cluster"])
                next_look = time.monotonic() + WATCH_S


def _damage_tail(data_dir: str, rng: random.Random) -> str:
    """Cut or overwrite the tail of the newest segment of the workload's stream on
    ``data_dir`` (whose node is down); what was done, in words."""
    directory = queue_directory(data_dir, STREAM)
    segments = numbered_files(directory, SEGMENT_SUFFIX) if os.path.isdir(directory) else []
    if not segments:
        return "no stream segment to damage"
    path = os.path.join(directory, segment_file_name(segments[-1]))
    size = os.path.getsize(path)
    if size <= FILE_HEADER_BYTES:
        return f"{os.path.basename(path)} holds no chunk to damage"
    damage = rng.randint(1, min(TAIL_DAMAGE_BYTES, size - FILE_HEADER_BYTES))
    if rng.random() < 0.5:
        os.truncate(path, size - damage)
        return f"{os.path.basename(path)} cut by {damage} bytes"
    with open(path, "r+b") as file:
        file.seek(size - damage)
        file.write(rng.randbytes(damage))
    return f"the last {damage} bytes of {os.path.basename(path)} overwritten"


class _Faults:
    """Lands each fault on the cluster and heals it; each returns what it did, in
    words, or raises TimeoutError when the cluster does not take over in time."""

    def __init__(self, cluster: ClusterUnderTest, rng: random.Random) -> None:
        self.cluster, self.rng = cluster, rng

    def land(self, kind: str, leader: int, epoch: int) -> tuple[str, str]:
        """The fault's target and what was done."""
        handler = getattr(self, "_" + kind.replace("-", "_"))
        return handler(leader, epoch)

    def _others(self, leader: int) -> list[int]:
        return [i for i in range(len(NODES)) if i != leader]

    def _taken_over(self, leader: int, epoch: int) -> tuple[int, int]:
        """Until the other nodes agree on a leader under a higher epoch."""
        others = self._others(leader)
        return self.cluster.wait(
            lambda: (a := self.cluster.agreed(others)) and a[1] > epoch and a or None,
            TAKEOVER_TIMEOUT_S,
        )

    def _kill_leader(self, leader: int, epoch: int) -> tuple[str, str]:
        self.cluster.nodes[leader].kill()
        pause = self.rng.uniform(*RESTART_AFTER_S)
        time.sleep(pause)
        self.cluster.nodes[leader].start(wait=False)
        return NODES[leader], f"SIGKILL, every process; started again after {pause:.1f} s"

    def _pause_leader(self, leader: int, epoch: int) -> tuple[str, str]:
        processes = self.cluster.nodes[leader].processes()
        for process in processes:
            with contextlib.suppress(psutil.Error):
                process.suspend()
        stopped = time.monotonic()
        try:
            new, new_epoch = self._taken_over(leader, epoch)
        finally:
            for process in processes:
                with contextlib.suppress(psutil.Error):
                    process.resume()
        return NODES[leader], (
            f"SIGSTOP, every process, {time.monotonic() - stopped:.1f} s, until "
            f"{NODES[new]} led under epoch {new_epoch}; then SIGCONT"
        )

    def _leader_from_followers(self, leader: int, epoch: int) -> tuple[str, str]:
        proxies = [self.cluster.peer_proxies[i] for i in self._others(leader)]
        hold = self.rng.uniform(FOLLOWER_DEADLINE_S + 2, FOLLOWER_DEADLINE_S + 6)
        for proxy in proxies:
            proxy.cut()
        time.sleep(hold)
        for proxy in proxies:
            proxy.heal()
        return NODES[leader], f"its links to its followers cut {hold:.1f} s (etcd reached)"

    def _leader_from_etcd(self, leader: int, epoch: int) -> tuple[str, str]:
        proxies = self.cluster.etcd_proxies[leader]
        for proxy in proxies:
            proxy.cut()
        cut = time.monotonic()
        try:
            new, new_epoch = self._taken_over(leader, epoch)
        finally:
            for proxy in proxies:
                proxy.heal()
        return NODES[leader], (
            f"its links to etcd cut {time.monotonic() - cut:.1f} s (followers reached), "
            f"until {NODES[new]} led under epoch {new_epoch}"
        )

    def _cut_follower(self, leader: int, epoch: int) -> tuple[str, str]:
        follower = self.rng.choice(self._others(leader))
        proxies = [self.cluster.peer_proxies[follower], *self.cluster.etcd_proxies[follower]]
        hold = self.rng.uniform(self.cluster.ttl_s + 2, self.cluster.ttl_s + 6)
        for proxy in proxies:
            proxy.cut()
        time.sleep(hold)
        for proxy in proxies:
            proxy.heal()
        return NODES[follower], f"cut from the leader and etcd {hold:.1f} s, then healed"

    def _kill_etcd_leader(self, leader: int, epoch: int) -> tuple[str, str]:
        etcd = self.cluster.etcd
        member = etcd.leader_index()
        if member is None:
            raise TimeoutError("no etcd member says which member leads")
        etcd.kill(member)
        pause = self.rng.uniform(*RESTART_AFTER_S)
        time.sleep(pause)
        etcd.restart(member)
        etcd.wait_healthy(TAKEOVER_TIMEOUT_S)
        return f"etcd {etcd.names[member]}", f"SIGKILL; started again after {pause:.1f} s"

    def _damaged_tail(self, leader: int, epoch: int) -> tuple[str, str]:
        node = self.cluster.nodes[leader]
        node.kill()
        new, new_epoch = self._taken_over(leader, epoch)
        done = _damage_tail(node.data_dir, self.rng)
        node.start(wait=False)
        return NODES[leader], f"SIGKILL; {NODES[new]} led (epoch {new_epoch}); {done}"


def _schedule(seed: int, kinds: list[str], rounds: int) -> list[str]:
    """``rounds`` rounds of every kind, each round in an order drawn from ``seed``."""
    rng = random.Random(seed)
    order = []
    for _ in range(rounds):
        round_ = list(kinds)
        rng.shuffle(round_)
        order += round_
    return order


def _quiet_spells(
    samples: list[tuple[float, dict[str, int]]], since: float, until: float, in_flight: int
) -> tuple[float | None, float | None]:
    """The longest time without a new confirm in [since, until], and when the first
    confirm beyond the ``in_flight`` ones that may have been on their way at ``since``
    came (None: none did)."""
    window = [(t, c["confirmed"]) for t, c in samples if since <= t <= until]
    if not window:
        return None, None
    longest, last_change, last_count = 0.0, since, window[0][1]
    base, first = window[0][1], None
    for t, count in window:
        if count != last_count:
            longest = max(longest, t - last_change)
            last_change, last_count = t, count
        if first is None and count > base + in_flight:
            first = t - since
    longest = max(longest, window[-1][0] - last_change)
    return round(longest, 2), None if first is None else round(first, 2)


def run_cluster_chaos(
    root: str,
    *,
    duration_s: float,
    rounds: int | None,
    kinds: list[str],
    producers: int,
    consumers: int,
    sizes: tuple[int, int],
    seed: int,
    every_s: tuple[float, float] = (1.0, 3.0),
    ttl_s: int = LEASE_TTL_S,
    report_dir: str | None = None,
    say: Callable[[str], None] = print,
) -> dict:
    """The whole run on a new cluster under ``root`` (new or empty: the run makes the
    nodes' and etcd's directories there); its report document. Faults land round after
    round until ``duration_s`` has passed or ``rounds`` rounds are done. ValueError,
    before anything starts, for a bad fault kind or a ``root`` that holds files."""
    unknown = [k for k in kinds if k not in CLUSTER_FAULTS]
    if unknown or not kinds:
        raise ValueError(
            f"unknown cluster fault {', '.join(unknown) or '(none named)'}: the kinds are "
            f"{', '.join(CLUSTER_FAULTS)}"
        )
    if rounds is not None and rounds < 1:
        raise ValueError(f"rounds={rounds}: at least 1")
    root = os.path.abspath(root)
    if os.path.exists(root) and (not os.path.isdir(root) or os.listdir(root)):
        raise ValueError(
            f"{root} holds files: a cluster run makes its nodes' and etcd's directories "
            "in a new or empty one"
        )
    if shutil.which("etcd") is None:
        raise ValueError("warren chaos --cluster needs etcd on the PATH (Debian's etcd-server)")
    os.makedirs(root, exist_ok=True)
    plan = _schedule(seed, kinds, rounds if rounds is not None else 1_000)
    rng = random.Random(seed)
    say(
        f"chaos --cluster: seed {seed}, faults {', '.join(kinds)} for {duration_s:g} s"
        f"{f' or {rounds} rounds' if rounds else ''}, {producers} producers, {consumers} "
        f"consumers, bodies of {sizes[0]:,} to {sizes[1]:,} bytes, lease {ttl_s} s; three "
        f"etcd members and nodes n0 n1 n2 under {root}; links cut by TCP proxies"
    )
    result = ChaosResult(seed=seed, duration_s=duration_s)
    workload: ChaosWorkload | None = None
    watch: _Watch | None = None
    replica_mismatches: list[str] = []
    producers_stopped = 0.0
    with harness_signals():
        cluster = ClusterUnderTest(os.path.join(root, "cluster"), ttl_s=ttl_s)
        try:
            cluster.start()
            cluster.wait(cluster.settled, SETTLE_TIMEOUT_S)
            workload = ChaosWorkload(
                os.path.join(root, "run"),
                ",".join(cluster.endpoints),
                producers=producers,
                consumers=consumers,
                sizes=sizes,
                seed=seed,
            )
            workload.declare()
            workload.start()
            started = time.monotonic()
            watch = _Watch(cluster, workload, started)
            watch.start()
            faults = _Faults(cluster, rng)
            for kind in plan:
                if time.monotonic() - started >= duration_s:
                    break
                try:
                    leader, epoch = cluster.wait(cluster.settled, SETTLE_TIMEOUT_S)
                except TimeoutError as exc:
                    result.problems.append(f"before a {kind}: {exc}")
                    break
                time.sleep(rng.uniform(*every_s))
                at_s = round(time.monotonic() - started, 3)
                try:
                    target, detail = faults.land(kind, leader, epoch)
                    landed = True
                except TimeoutError as exc:
                    target, detail, landed = NODES[leader], str(exc), False
                    result.problems.append(f"{kind} at {at_s:.1f} s: {exc}")
                event = Event(at_s, kind, target, landed, detail)
                result.events.append(event)
                log.info("chaos --cluster: %.1f s %s %s: %s", at_s, kind, target, detail)
                say(f"  {at_s:7.1f} s  {kind:<22} {target:<8} {detail}")
                if not landed:
                    break
            result.duration_s = round(time.monotonic() - started, 1)
            say("chaos --cluster: faults done; producers stop, consumers drain")
            try:
                cluster.wait(cluster.settled, SETTLE_TIMEOUT_S)
                result.healthy_at_end = True
            except TimeoutError as exc:
                result.problems.append(f"after the faults: {exc}")
            producers_stopped = round(time.monotonic() - started, 3)
            workload.stop_producers()
            workload.drain()
            watch.done.set()
            watch.join()
            workload.close()
            if result.healthy_at_end:
                replica_mismatches = _compare_replicas(cluster, result)
            result.restarts = sum(node.restarts() for node in cluster.nodes)
            result.node_starts = sum(node.starts for node in cluster.nodes)
        finally:
            leader_dir = cluster.nodes[0].data_dir
            try:
                if watch is not None:
                    watch.done.set()
                if workload is not None:
                    workload.close()
                leader_dir = _leader_dir(cluster)
            finally:
                cluster.close()
    assert workload is not None and watch is not None  # both made, or the run raised
    result.samples = watch.samples
    ends = [e.at_s for e in result.events[1:]] + [producers_stopped]
    for event, until in zip(result.events, ends, strict=True):
        # one publish a producer, and a stream batch, may be in flight as a fault lands
        longest, first = _quiet_spells(
            result.samples, event.at_s, until, in_flight=producers + MAX_BATCH
        )
        event.recovery_s = longest
        event.detail += f"; first confirm after {first} s" if first is not None else ""
    result.problems += workload.problems + [
        f"a node ended on its own {len(cluster.exits)} times: {', '.join(cluster.exits[:5])}"
    ] * bool(cluster.exits)
    verdict, stream_verdict = workload.audit(), workload.audit_stream(leader_dir)
    invariants = {
        **with_stream(verdict.counts(), stream_verdict),
        "network_cut_by": "TCP proxies (no root needed)",
        "deposed_confirms": watch.leaderships.deposed_confirms,
        "leaders_outside_isr": watch.leaderships.outside_isr,
        "replica_mismatches": replica_mismatches,
    }
    ok = (
        verdict.ok
        and stream_verdict.ok
        and not watch.leaderships.deposed_confirms
        and not watch.leaderships.outside_isr
        and not replica_mismatches
    )
    document = report_document(result, invariants, ok)
    if report_dir is not None:
        document = write_report(report_dir, document)
    say(format_report(document))
    return document


def _leader_dir(cluster: ClusterUnderTest) -> str:
    """The data directory of the node that led last (n0's when none is known)."""
    try:
        agreed = cluster.agreed(list(range(len(NODES))))
    except (KeyError, TypeError):  # a status of another shape: none is known
        agreed = None
    return cluster.nodes[agreed[0] if agreed else 0].data_dir


def _compare_replicas(cluster: ClusterUnderTest, result: ChaosResult) -> list[str]:
    """Once the followers have caught up: the stream's chunks on every node compared
    (see the module docstring); the differences, in words."""
    deadline = time.monotonic() + CATCH_UP_TIMEOUT_S
    while not cluster.caught_up():
        if time.monotonic() > deadline:
            result.problems.append(
                f"the followers did not catch up with the leader within {CATCH_UP_TIMEOUT_S:g} s"
            )
            return []
        time.sleep(WATCH_S)
    copies: dict[str, dict[int, int] | None] = {}
    for name, node in zip(NODES, cluster.nodes, strict=True):
        try:
            copies[name] = chunk_checksums(queue_directory(node.data_dir, STREAM))
        except FileNotFoundError:
            copies[name] = None
    return replica_differences(copies)


def replica_differences(copies: dict[str, dict[int, int] | None]) -> list[str]:
    """What differs between copies of one stream (by node: each chunk id's CRC, -1 for
    a chunk failing it, as ``chunk_checksums`` gives; None where the stream's directory
    is missing): a copy missing or empty while another holds chunks, a chunk failing its
    CRC, a chunk two copies hold with different CRCs, and a chunk one copy lacks between
    the first and the last chunk both hold (retention's deletes and a tail not shipped
    yet are not differences); in words, at most ``LISTED_DIFFERENCES``."""
    found = []
    fullest = max(copies, key=lambda name: len(copies[name] or {}))
    for name, held in copies.items():
        if not held and copies[fullest]:
            found.append(
                f"{name} holds {'an empty' if held is not None else 'no'} copy of the "
                f"stream ({fullest} holds {len(copies[fullest] or {})} chunks)"
            )
    present = {name: held for name, held in copies.items() if held}
    for name, chunks in present.items():
        found += [f"{name}: chunk {c} fails its CRC" for c, crc in chunks.items() if crc == -1]
    names = sorted(present)
    for at, a in enumerate(names):
        for b in names[at + 1 :]:
            one, other = present[a], present[b]
            for chunk in sorted(one.keys() & other.keys()):
                if one[chunk] != other[chunk]:
                    found.append(
                        f"chunk {chunk}: CRC {one[chunk]:#x} on {a}, {other[chunk]:#x} on {b}"
                    )
            low, high = max(min(one), min(other)), min(max(one), max(other))
            for chunk in sorted(one.keys() ^ other.keys()):
                if low <= chunk <= high:
                    found.append(
                        f"chunk {chunk} on {a if chunk in one else b}, not on "
                        f"{b if chunk in one else a}"
                    )
    return found[:LISTED_DIFFERENCES]

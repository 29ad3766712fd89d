"""Who leads a Warren cluster, under which epoch, and which nodes are in sync (the ISR),
agreed in etcd. Plain objects over ``Etcd`` (no actors, no threads): the coordinator
process drives an ``Election`` on its loop, and tests drive one directly.

Keys, under ``/warren/<cluster>/``, each value a JSON object:
- ``leader``: ``{"node", "id", "peer", "lease", "amqp"}`` (``amqp``: where its AMQP port
  is reached, None without one), put only by a transaction that finds the
  key absent, bound to the winner's lease: it goes when that lease expires or is revoked.
  Its ``create_revision`` is the **epoch**: it grows with every election, every reader
  sees the same one, and it fences every later write of that leader.
- ``isr``: ``{"epoch", "members"}``, written only by a transaction that compares the
  leader key's ``create_revision`` with the writer's epoch: a deposed leader (paused past
  its lease, cut from etcd) writes nothing and learns it (``StaleLeadership``), whatever it
  believes. The first leader of a cluster with no ISR writes itself alone into it.
- ``nodes/<name>``: ``{"id", "peer"}``, bound to each node's lease: who is up.

Each node's data directory holds a random node id (``CLUSTER_FILE``, with the cluster's
name): it tells a node's own earlier run from another node of the same name.

Rules, with the races they guard against:
- Only an ISR member leads: a node that wins the key while the ISR exists without it
  resigns at once (deletes the key in a transaction on its own epoch) and says why.
- Two nodes campaign at once: the transaction's compare lets exactly one win.
- A leader leads only while it can show its lease is alive: ``leading()`` turns false once
  ``ttl_s`` less ``LEASE_MARGIN`` of it passed since the last keepalive etcd answered was *sent* (so
  before etcd can have expired the lease, a paused or cut-off leader stops on its own), and
  at once when a keepalive says the lease is gone.
- A request that timed out may have been applied: a leader key found under this node's
  own lease (``holds_key``) is taken up by the next campaign at that key's epoch; a
  leadership whose epoch is not the key's any more (deleted, or a resign whose answer
  was lost) ends at the next view (``follow``); the ISR writes are compare-and-set, so a
  retry writes the same thing again; a lease is this node's only once it is registered
  (a failed registration revokes it), and a revoke of a lease etcd no longer has counts
  as done.
- A node restarted (kill -9) while it led leaves its old lease's key for up to a TTL: it
  finds the key naming its own node id under a lease not its own, and revokes that lease
  (no other process can hold that id: a node holds its data directory's lock), so the
  cluster elects at once instead of waiting the old lease out.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import ClusterMismatch, EtcdRefused, StaleLeadership
from .etcd import Etcd, decoded, encoded

__all__ = [
    "CLUSTER_FILE",
    "ClusterView",
    "Election",
    "LEASE_TTL_S",
    "kept_node_id",
    "new_node_id",
]

LEASE_TTL_S = 10  # the node's etcd lease; its keepalive goes every third of it
LEASE_MARGIN = 0.2  # a leader stops this share of its TTL before etcd could expire it
CLUSTER_FILE = "cluster.json"  # in the data directory: {"cluster", "node_id"}


def kept_node_id(data_dir: str, cluster: str) -> str | None:
    """The node id ``data_dir`` keeps for ``cluster``, None before its first join;
    ``ClusterMismatch`` when the directory belongs to another cluster."""
    path = os.path.join(data_dir, CLUSTER_FILE)
    try:
        with open(path, encoding="utf-8") as file:
            kept = json.load(file)
        if not isinstance(kept, dict) or not isinstance(kept.get("node_id"), str):
            raise ValueError("not a cluster file")
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ClusterMismatch(f"{path} cannot be read ({exc}); restore or remove it") from None
    if kept.get("cluster") != cluster:
        raise ClusterMismatch(
            f"{data_dir} holds the data of cluster {kept.get('cluster')!r}, not {cluster!r}: "
            "a node joins a cluster only with its own data (use another data directory)"
        )
    return str(kept["node_id"])


def new_node_id(data_dir: str, cluster: str) -> str:
    """Make and keep (fdatasync'd) the node id of ``data_dir`` in ``cluster``."""
    node_id = secrets.token_hex(8)
    path = os.path.join(data_dir, CLUSTER_FILE)
    temporary = f"{path}.tmp"
    with open(temporary, "w", encoding="utf-8") as file:
        json.dump({"cluster": cluster, "node_id": node_id}, file)
        file.flush()
        os.fdatasync(file.fileno())
    os.replace(temporary, path)
    return node_id


@dataclass(frozen=True)
class ClusterView:
    """What etcd holds for the cluster at one revision."""

    revision: int
    leader: str | None = None
    leader_peer: str | None = None
    leader_amqp: str | None = None  # where the leader's AMQP port is reached, if it has one
    epoch: int | None = None  # the leader key's create_revision
    leader_lease: int | None = None  # the lease the leader key is bound to
    isr: tuple[str, ...] = ()
    isr_epoch: int | None = None  # the epoch of the leader that last wrote the ISR
    nodes: dict[str, str] = field(default_factory=dict)  # name -> peer, lease alive


class Election:
    """One node's part in its cluster's election; see the module docstring."""

    def __init__(
        self,
        etcd: Etcd,
        cluster: str,
        node: str,
        node_id: str,
        peer: str,
        *,
        ttl_s: int = LEASE_TTL_S,
        clock: Callable[[], float] = time.monotonic,
        amqp: str | None = None,
    ) -> None:
        self.etcd = etcd
        self.cluster, self.node, self.node_id, self.peer = cluster, node, node_id, peer
        self.amqp = amqp  # where clients reach this node's AMQP port, host:port
        self.ttl_s = ttl_s
        self._clock = clock
        self.prefix = f"/warren/{cluster}/"
        self.lease: int | None = None
        self.epoch: int | None = None  # set while this node holds the leader key
        self.refused: str | None = None  # why the last won campaign was given up
        self._alive_until = 0.0

    # ------------------------------------------------------------------ keys

    def _key(self, name: str) -> str:
        return self.prefix + name

    def _txn(
        self,
        compare: list[dict[str, Any]],
        success: list[dict[str, Any]],
        failure: list[dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        body = {"compare": compare, "success": success, "failure": failure or []}
        return self.etcd.post("kv/txn", body)

    def _range(self, name: str, *, prefix: bool = False) -> dict[str, Any]:
        request: dict[str, Any] = {"key": encoded(self._key(name))}
        if prefix:
            request["range_end"] = encoded(_prefix_end(self._key(name)))
        return {"request_range": request}

    def _put(self, name: str, value: dict[str, Any], *, lease: int | None) -> dict[str, Any]:
        request: dict[str, Any] = {
            "key": encoded(self._key(name)),
            "value": encoded(json.dumps(value, sort_keys=True)),
        }
        if lease is not None:
            request["lease"] = lease
        return {"request_put": request}

    def _absent(self, name: str) -> dict[str, Any]:
        return {
            "key": encoded(self._key(name)),
            "result": "EQUAL",
            "target": "CREATE",
            "create_revision": 0,
        }

    def _fence(self) -> dict[str, Any]:
        """The compare every write of a leader carries: its leader key, still."""
        return {
            "key": encoded(self._key("leader")),
            "result": "EQUAL",
            "target": "CREATE",
            "create_revision": self.epoch,
        }

    # ------------------------------------------------------------------ lease

    def join(self) -> None:
        """Take a new lease and register this node under it; the lease is this node's
        only once it is registered. ``ClusterMismatch`` when another node (another id)
        has this name; a leader key its own earlier run left is released."""
        sent = self._clock()
        granted = self.etcd.post("lease/grant", {"TTL": self.ttl_s})
        lease = int(granted["ID"])
        try:
            self._register(lease)
        except BaseException:
            self._revoke(lease)
            raise
        self.lease, self.epoch = lease, None
        self._alive_until = sent + int(granted.get("TTL", self.ttl_s)) * (1 - LEASE_MARGIN)

    def _register(self, lease: int) -> None:
        me = {"id": self.node_id, "peer": self.peer}
        answer = self._txn(
            [self._absent(f"nodes/{self.node}")],
            [self._put(f"nodes/{self.node}", me, lease=lease)],
            [self._range(f"nodes/{self.node}"), self._range("leader")],
        )
        if answer.get("succeeded"):
            return
        named, leader = (_first_value(response) for response in answer["responses"][:2])
        if named is not None and named.get("id") != self.node_id:
            raise self._name_taken(named)
        self._txn([], [self._put(f"nodes/{self.node}", me, lease=lease)])
        if leader is not None and leader.get("id") == self.node_id:
            held = leader.get("lease")
            if isinstance(held, int) and held != lease:  # its killed run's: no process has it
                self._revoke(held)

    def _name_taken(self, named: dict[str, Any]) -> ClusterMismatch:
        return ClusterMismatch(
            f"another node named {self.node!r} is in cluster {self.cluster!r} (at "
            f"{named.get('peer')}): give each node of a cluster its own name"
        )

    def _revoke(self, lease: int) -> None:
        """Revoke ``lease``; one etcd no longer has (expired, or revoked by an earlier
        attempt whose answer was lost) is revoked all the same."""
        try:
            self.etcd.post("kv/lease/revoke", {"ID": lease})
        except EtcdRefused as exc:
            if "not found" not in str(exc):
                raise

    def check_name_free(self) -> None:
        """``ClusterMismatch`` when a live node of another id has this node's name (read
        only: ``join`` checks it again when it registers)."""
        answer = self._txn([], [self._range(f"nodes/{self.node}")])
        named = _first_value(answer["responses"][0])
        if named is not None and named.get("id") != self.node_id:
            raise self._name_taken(named)

    def keepalive(self) -> bool:
        """Renew the lease; False (and no lease, no leadership) when etcd says it is gone."""
        if self.lease is None:
            return False
        sent = self._clock()
        answer = self.etcd.post("lease/keepalive", {"ID": self.lease})
        result = answer.get("result")
        ttl = int(result.get("TTL", -1)) if isinstance(result, dict) else -1
        if ttl <= 0:
            self.lease, self.epoch = None, None
            return False
        self._alive_until = sent + ttl * (1 - LEASE_MARGIN)
        return True

    def lease_alive(self) -> bool:
        """Whether the lease is known alive: renewed within its TTL less the margin."""
        return self.lease is not None and self._clock() < self._alive_until

    def leave(self) -> None:
        """Revoke the lease: the node's keys, the leader key too, go at once."""
        lease, self.lease, self.epoch = self.lease, None, None
        if lease is not None:
            self._revoke(lease)

    # ------------------------------------------------------------------ leadership

    def leading(self) -> bool:
        """Whether this node may act as the leader now (see the module docstring)."""
        return self.epoch is not None and self.lease_alive()

    def follow(self, view: ClusterView) -> None:
        """Take what etcd holds as the truth: an epoch that is not this node's leader key
        any more (deleted, expired, or another's) ends this node's leadership."""
        if self.epoch is not None and view.epoch != self.epoch:
            self.epoch = None

    def holds_key(self, view: ClusterView) -> bool:
        """Whether the leader key in ``view`` is under this node's lease: a campaign whose
        answer was lost won it, or a leadership this node dropped still holds it."""
        return self.lease is not None and view.leader_lease == self.lease

    def campaign(self) -> bool:
        """Try to take the leader key (or take up the one this node's lease holds);
        whether this node leads now."""
        if self.lease is None:
            return False
        if self.epoch is not None:
            return self.leading()
        me = {
            "node": self.node,
            "id": self.node_id,
            "peer": self.peer,
            "lease": self.lease,
            "amqp": self.amqp,
        }
        answer = self._txn(
            [self._absent("leader")],
            [self._put("leader", me, lease=self.lease), self._range("isr")],
            [self._range("leader"), self._range("isr")],
        )
        if answer.get("succeeded"):
            epoch = int(answer["header"]["revision"])
        else:
            held = _first_kv(answer["responses"][0])
            if held is None or _value(held).get("lease") != self.lease:
                return False
            epoch = int(held["create_revision"])  # an earlier attempt won: its answer was lost
        isr = _first_value(answer["responses"][1])
        members = tuple(isr["members"]) if isr is not None else (self.node,)
        if self.node not in members:
            self.refused = (
                f"won the election at epoch {epoch} but is not in the ISR "
                f"({', '.join(members)}): resigned"
            )
            self._resign(epoch)
            return False
        self.refused = None
        self.epoch = epoch
        try:
            self.write_isr(members)  # its epoch in the ISR: a leader's first fenced write
        except StaleLeadership:
            return False
        except BaseException:
            self.epoch = None  # taken up again at the next campaign, the key still held
            raise
        return self.leading()

    def write_isr(self, members: tuple[str, ...]) -> None:
        """Write the ISR under this leader's epoch; ``StaleLeadership`` (and no longer
        leading) when the leader key is not this node's any more."""
        if self.epoch is None:
            raise StaleLeadership(f"{self.node} does not lead cluster {self.cluster!r}")
        value = {"epoch": self.epoch, "members": sorted(set(members))}
        answer = self._txn([self._fence()], [self._put("isr", value, lease=None)])
        if not answer.get("succeeded"):
            epoch, self.epoch = self.epoch, None
            raise StaleLeadership(
                f"{self.node} led cluster {self.cluster!r} at epoch {epoch}, which is over: "
                "its ISR write was refused"
            )

    def resign(self) -> None:
        """Give the leader key up (only the one of this node's epoch); this node leads no
        more from the call on, whether or not etcd's answer comes back."""
        epoch, self.epoch = self.epoch, None
        if epoch is not None:
            self._resign(epoch)

    def _resign(self, epoch: int) -> None:
        fence = {**self._fence(), "create_revision": epoch}
        self._txn([fence], [{"request_delete_range": {"key": encoded(self._key("leader"))}}])

    # ------------------------------------------------------------------ reading

    def observe(self) -> ClusterView:
        """The leader, the epoch, the ISR and the live nodes, read at one revision."""
        answer = self._txn(
            [], [self._range("leader"), self._range("isr"), self._range("nodes/", prefix=True)]
        )
        leader_kv = _first_kv(answer["responses"][0])
        leader = _value(leader_kv) if leader_kv is not None else None
        isr = _first_value(answer["responses"][1])
        nodes = {}
        for kv in answer["responses"][2].get("response_range", {}).get("kvs", []):
            name = decoded(kv["key"]).decode()[len(self._key("nodes/")) :]
            nodes[name] = str(_value(kv).get("peer"))
        return ClusterView(
            revision=int(answer["header"]["revision"]),
            leader=leader.get("node") if leader else None,
            leader_peer=leader.get("peer") if leader else None,
            leader_amqp=leader.get("amqp") if leader else None,
            epoch=int(leader_kv["create_revision"]) if leader_kv is not None else None,
            leader_lease=(int(leader_kv.get("lease", 0)) or None) if leader_kv else None,
            isr=tuple(isr["members"]) if isr else (),
            isr_epoch=int(isr["epoch"]) if isr else None,
            nodes=nodes,
        )


def _prefix_end(prefix: str) -> bytes:
    raw = prefix.encode()
    return raw[:-1] + bytes([raw[-1] + 1])


def _first_kv(response: dict[str, Any]) -> dict[str, Any] | None:
    kvs = response.get("response_range", {}).get("kvs", [])
    return kvs[0] if kvs else None


def _value(kv: dict[str, Any]) -> dict[str, Any]:
    value = json.loads(decoded(kv.get("value", "")) or b"{}")
    if not isinstance(value, dict):
        raise ValueError(f"not a Warren cluster value: {value!r}")
    return value


def _first_value(response: dict[str, Any]) -> dict[str, Any] | None:
    kv = _first_kv(response)
    return _value(kv) if kv is not None else None

"""The coordinator: the process of a node in a cluster (``warren: coordinator``) that
keeps the node's etcd lease, campaigns for the leader key and follows who leads.

Its work runs on a thread of its own (a ``GatewayActor``'s), a step every ``STEP_S``:
join (a new lease, the node registered under it) when it has no lease; renew the lease
every third of its TTL; read the cluster's view (leader, epoch, ISR, live nodes); campaign
when no node leads. The actor's own loop answers ``CoordinatorStats`` from what the last
steps saw, so a status never waits on etcd; the members' health is read every
``HEALTH_EVERY_S``.

Roles, as the status says them:
- ``leader``: this node holds the leader key and its lease is known alive;
- ``follower``: another node leads;
- ``candidate``: no node leads, and this one may (it is in the ISR, or there is none yet);
- ``out of the ISR``: no node leads, and this one may not (it lacks data the ISR has):
  it waits for an ISR member to come back, as Kafka without unclean elections does;
- ``cut off``: the lease is not known alive (etcd unreachable, or the lease lost): such a
  node leads nothing, even if it led a moment ago (see ``Election.leading``);
- ``joining``: the coordinator has just started and not yet heard from etcd.

Races it guards against:
- etcd unreachable: every step's error is kept for the status and the step is tried again
  at the next turn; the lease's own deadline, not the error, ends a leadership.
- A stop while a request hangs on a dead member: the thread is told to stop, each request
  is bounded by ``REQUEST_TIMEOUT_S`` a member, and the gateway's join bounds the wait;
  a clean stop revokes the lease at the thread's last step (the leader key goes at once, so
  the cluster elects without waiting out a TTL); a kill leaves it to expire.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from warren.actors import UnhandledMessage, message
from warren.queues.broker.gateway_actor import GatewayActor
from warren.store import replicated_io

from ..errors import ClusterError
from ..specs import ChildSpec
from .election import ClusterView, Election, kept_node_id, new_node_id
from .etcd import HEALTH_TIMEOUT_S, Etcd
from .settings import ClusterSettings
from .shipping import Shipping

__all__ = [
    "COORDINATOR_NAME",
    "CoordinatorActor",
    "CoordinatorStats",
    "FollowData",
    "LeadData",
    "Resync",
    "checked_node_id",
    "coordinator_spec",
]

log = logging.getLogger("warren.cluster")

COORDINATOR_NAME = "coordinator"
STEP_S = 0.5  # how often the thread looks at etcd (a view, and a campaign if no one leads)
HEALTH_EVERY_S = 5.0  # how often each etcd member's health is read for the status


@message
@dataclass(frozen=True)
class CoordinatorStats:
    """ask → the node's view of its cluster: {"cluster", "node", "peer", "role", "epoch",
    "leader", "leader_peer", "leader_amqp", "isr", "isr_epoch", "nodes", "lease_ttl_s", "etcd",
    "last_error", "refused", "elections_won", "revision", "steps"}, and the figures its series
    read: "leading" (0 or 1), "isr_members", "nodes_up", "etcd_healthy"; and
    "replication", its ``Shipping``'s status."""


@message
@dataclass(frozen=True)
class LeadData:
    """ask → ``{"leading": bool, "epoch"}``: the node would start the processes that
    write its data directory. True (and the replica's server closed, the writes shipped
    under that epoch from now on) only when the node leads at that moment."""


@message
@dataclass(frozen=True)
class FollowData:
    """ask → None: with ``serve``, the node's writing processes have stopped and the
    data directory is the replica's again; without, the node is stopping: every commit
    is refused from now on and no replica is served."""

    serve: bool


@message
@dataclass(frozen=True)
class Resync:
    """ask → None: one of the node's writing processes is being started again after it
    ended (a crash): what it wrote last may never have been committed, so every follower
    is synced whole before a later commit is answered."""


def checked_node_id(settings: ClusterSettings, data_dir: str, node: str) -> str | None:
    """The node id ``data_dir`` keeps for the cluster (None before its first join), once
    etcd answers and no live node of the cluster has the name ``node``; reads only, so a
    refusal (``EtcdUnavailable``, ``ClusterMismatch``) leaves nothing written."""
    node_id = kept_node_id(data_dir, settings.cluster)
    etcd = Etcd(settings.endpoints)
    try:
        etcd.post("maintenance/status", {})
        Election(etcd, settings.cluster, node, node_id or "", settings.peer).check_name_free()
    finally:
        etcd.close()
    return node_id


def coordinator_spec(
    settings: ClusterSettings,
    data_dir: str,
    node: str,
    node_id: str | None,
    heartbeats: tuple[float, float],
    commit_endpoint: str,
) -> ChildSpec:
    """The coordinator's child spec for the node ``node`` on ``data_dir``, whose lock the
    caller holds (a first join keeps a new node id there), heartbeated as the node's
    stores are (``heartbeats``: interval and timeout): a coordinator that stopped
    answering is replaced, and the new one takes the node's leadership up again. The
    node's processes commit their writes at ``commit_endpoint``."""
    if node_id is None:
        node_id = new_node_id(data_dir, settings.cluster)
    arguments = (settings.cluster, node, node_id, settings.peer, settings.endpoints)
    interval, timeout = heartbeats
    return ChildSpec(
        COORDINATOR_NAME,
        CoordinatorActor,
        (
            *arguments,
            settings.ttl_s,
            data_dir,
            commit_endpoint,
            settings.min_insync,
            settings.listen_address,
            settings.amqp,
        ),
        heartbeat_interval_s=interval,
        heartbeat_timeout_s=timeout,
    )


def _eligible(view: ClusterView, election: Election) -> bool:
    """Whether the node may campaign: it is in the ISR, or the cluster has none yet."""
    return not view.isr or election.node in view.isr


class CoordinatorActor(GatewayActor):
    """The coordinator's process; see the module docstring."""

    figures_from_loop = False

    def __init__(
        self,
        cluster: str,
        node: str,
        node_id: str,
        peer: str,
        endpoints: tuple[str, ...],
        ttl_s: int,
        data_dir: str,
        commit_endpoint: str,
        min_insync: int,
        peer_listen: str,
        amqp: str | None = None,
    ) -> None:
        self._settings = (cluster, node, node_id, peer, endpoints, ttl_s, amqp)
        self._data = (data_dir, commit_endpoint, min_insync, peer_listen)
        self._coordination: _Coordination | None = None

    def on_start(self) -> None:
        # The replica's own writes (a follower applying its leader's) are not the node's:
        # recorded, they would be committed to this very process.
        replicated_io.disable()
        cluster, node, node_id, peer, endpoints, ttl_s, amqp = self._settings
        election = Election(Etcd(endpoints), cluster, node, node_id, peer, ttl_s=ttl_s, amqp=amqp)
        shipping = Shipping(election, *self._data)
        self._coordination = _Coordination(election, shipping)
        shipping.start()
        self.start_gateway(self._coordination, "warren-coordinator")

    def on_receive(self, message: Any) -> Any:
        coordination = self._coordination
        assert coordination is not None, "on_start sets it"
        if isinstance(message, CoordinatorStats):
            return coordination.status()
        if isinstance(message, LeadData):
            epoch = coordination.election.epoch
            leading = epoch is not None and coordination.shipping.lead(epoch)
            return {"leading": leading, "epoch": epoch}
        if isinstance(message, FollowData):
            coordination.shipping.follow(serve=message.serve)
            return None
        if isinstance(message, Resync):
            coordination.shipping.resync()
            return None
        raise UnhandledMessage(f"the coordinator does not handle {type(message).__name__}")


class _Coordination:
    """The coordinator thread's state. The election is driven by that thread alone; the
    actor's loop reads the last view, the health and the errors under ``_lock``, and asks
    the election whether it leads at the moment it answers (a step stuck on a request
    must not leave a stale "leader" in the status). The health is read by a thread of
    its own, on sessions of its own, so that members that do not answer never delay a
    keepalive."""

    def __init__(self, election: Election, shipping: Shipping) -> None:
        self.election = election
        self.shipping = shipping
        self.stopping = threading.Event()
        self._finished = threading.Event()  # run returned: the sessions may be closed
        self._lock = threading.Lock()
        self._view: ClusterView | None = None
        self._last_error: str | None = None
        self._health: list[dict[str, Any]] = []
        self._health_etcd = Etcd(election.etcd.endpoints)
        self._health_thread = threading.Thread(
            target=self._read_health, name="warren-coordinator-health", daemon=True
        )
        self._renewed_at = 0.0
        self._elections_won = 0
        self._steps = 0  # the steps taken: a status that counts them has seen them end

    def run(self) -> None:
        self._health_thread.start()
        try:
            while not self.stopping.is_set():
                self._step()
                self.stopping.wait(STEP_S)
            try:
                self.election.leave()
            except ClusterError as exc:  # the lease then expires on its own
                log.warning("coordinator: the lease was not revoked at the stop: %s", exc)
        finally:
            self._finished.set()

    def _step(self) -> None:
        election = self.election
        error = None
        view: ClusterView | None
        try:
            if election.lease is None:
                election.join()
                self._renewed_at = time.monotonic()
            elif time.monotonic() - self._renewed_at >= election.ttl_s / 3:
                if election.keepalive():
                    self._renewed_at = time.monotonic()
                else:
                    log.warning("coordinator: the node's etcd lease expired; joining again")
            view = election.observe()
            election.follow(view)
            self.shipping.observed(view)
            wanted = self.shipping.isr_change()
            if wanted is not None and election.leading():
                election.write_isr(wanted)  # fenced: StaleLeadership ends the leadership
                self.shipping.isr_written(wanted)
                log.info("coordinator: the ISR is now %s", ", ".join(wanted))
            vacant = view.leader is None or election.holds_key(view)
            if (
                vacant
                and election.epoch is None
                and election.lease_alive()
                and _eligible(view, election)
            ):
                if election.campaign():
                    self._elections_won += 1
                    log.info(
                        "coordinator: %s leads cluster %s at epoch %s",
                        election.node,
                        election.cluster,
                        election.epoch,
                    )
                    view = election.observe()
                elif election.refused:
                    log.warning("coordinator: %s", election.refused)
        except ClusterError as exc:
            error, view = str(exc), self._view
        except Exception as exc:  # an answer of a shape no etcd gives: kept, tried again
            log.exception("coordinator: a step failed")
            error, view = f"{type(exc).__name__}: {exc}", self._view
        with self._lock:
            self._view, self._last_error = view, error
            self._steps += 1

    def _read_health(self) -> None:
        while not self.stopping.is_set():
            health = self._health_etcd.health()
            with self._lock:
                self._health = health
            self.stopping.wait(HEALTH_EVERY_S)

    def _role(self, view: ClusterView | None) -> str:
        if view is None and self._last_error is None:
            return "joining"  # its first step has not ended yet
        if self.election.leading() and view is not None and view.epoch == self.election.epoch:
            return "leader"  # (until the step that won has read the view, a candidate)
        if not self.election.lease_alive() or view is None:
            return "cut off"
        if view.leader is not None:
            return "follower"
        return "candidate" if _eligible(view, self.election) else "out of the ISR"

    def status(self) -> dict[str, Any]:
        election = self.election
        with self._lock:
            view, health = self._view, list(self._health)
            role = self._role(view)
            return {
                "cluster": election.cluster,
                "node": election.node,
                "peer": election.peer,
                "role": role,
                "epoch": view.epoch if view else None,
                "leader": view.leader if view else None,
                "leader_peer": view.leader_peer if view else None,
                "leader_amqp": view.leader_amqp if view else None,
                "isr": list(view.isr) if view else [],
                "isr_epoch": view.isr_epoch if view else None,
                "nodes": dict(view.nodes) if view else {},
                "revision": view.revision if view else None,
                "lease_ttl_s": election.ttl_s,
                "etcd": [dict(member) for member in health],
                "last_error": self._last_error,
                "refused": election.refused,
                "elections_won": self._elections_won,
                "steps": self._steps,
                "leading": int(role == "leader"),
                "isr_members": len(view.isr) if view else 0,
                "nodes_up": len(view.nodes) if view else 0,
                "etcd_healthy": sum(1 for member in health if member["healthy"]),
                "replication": self.shipping.status(),
            }

    def stop(self) -> None:
        self.stopping.set()

    def close(self) -> None:
        self.shipping.stop()
        if self._finished.is_set():  # else a request still runs: the process exit ends it
            self.election.etcd.close()
        self._health_thread.join(timeout=HEALTH_TIMEOUT_S * len(self._health_etcd.members))
        if not self._health_thread.is_alive():
            self._health_etcd.close()

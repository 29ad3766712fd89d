"""What a node needs to join a cluster (``Node(cluster=, etcd=, peer=)``, ``warren node
--cluster --etcd --peer``, ``[cluster]`` in the config), checked before anything starts
or is written: a bad value is one ``ValueError`` naming it.

``peer`` is the address the other nodes reach this one at, and where it listens for
them unless ``peer_listen`` says otherwise: behind a NAT, a port forward or a proxy the
two differ (the listening address is never told to the cluster)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from .election import LEASE_TTL_S
from .etcd import parse_endpoints

__all__ = ["MIN_INSYNC", "ClusterSettings"]

CLUSTER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
# A lease outlives a keepalive that met a member not answering (REQUEST_TIMEOUT_S) and
# went to the next: renewed every third of it, it must leave room for two such.
SHORTEST_TTL_S = 5
# How many copies (the leader's among them) a commit needs: below it, writes wait.
MIN_INSYNC = 2


@dataclass(frozen=True)
class ClusterSettings:
    cluster: str
    endpoints: tuple[str, ...]
    peer: str
    ttl_s: int = LEASE_TTL_S
    min_insync: int = MIN_INSYNC
    peer_listen: str | None = None  # where the replica server binds: peer when None
    # where clients reach this node's AMQP port (host:port), told to the other nodes while
    # it leads: their AMQP ports forward to it; None without a port (set by the node)
    amqp: str | None = None

    @property
    def listen_address(self) -> str:
        return self.peer_listen or self.peer

    @classmethod
    def checked(
        cls,
        cluster: str,
        etcd: str | Sequence[str] | None,
        peer: str | None,
        ttl_s: int,
        min_insync: int = MIN_INSYNC,
        peer_listen: str | None = None,
    ) -> ClusterSettings:
        if not isinstance(cluster, str) or not CLUSTER_NAME.fullmatch(cluster):
            raise ValueError(
                f"cluster={cluster!r}: a cluster's name is 1-64 letters, digits, '.', '_' "
                "or '-', starting with a letter or digit"
            )
        if etcd is None:
            raise ValueError("a node in a cluster needs etcd: --etcd http://HOST:2379[,…]")
        if not isinstance(etcd, str) and not (
            isinstance(etcd, Sequence) and all(isinstance(url, str) for url in etcd)
        ):
            raise ValueError(f"etcd={etcd!r}: name etcd's members as http://HOST:PORT URLs")
        text = etcd if isinstance(etcd, str) else ",".join(etcd)
        endpoints = parse_endpoints(text)
        if peer is None:
            raise ValueError(
                "a node in a cluster needs the address its peers reach it at: "
                "--peer tcp://HOST:PORT"
            )
        _check_tcp_address("peer", peer)
        if peer_listen is not None:
            _check_tcp_address("peer_listen", peer_listen)
        if isinstance(ttl_s, bool) or not isinstance(ttl_s, int) or ttl_s < SHORTEST_TTL_S:
            raise ValueError(
                f"cluster_ttl_s={ttl_s!r}: a whole number of seconds, at least {SHORTEST_TTL_S}"
            )
        if isinstance(min_insync, bool) or not isinstance(min_insync, int) or min_insync < 1:
            raise ValueError(
                f"min_insync={min_insync!r}: how many nodes (the leader's among them) hold "
                "each confirmed write, at least 1"
            )
        return cls(cluster, endpoints, peer, ttl_s, min_insync, peer_listen)


def _check_tcp_address(name: str, address: object) -> None:
    if not isinstance(address, str):
        raise ValueError(f"{name}={address!r}: expected tcp://HOST:PORT")
    host, _, port = address.removeprefix("tcp://").rpartition(":")
    if not address.startswith("tcp://") or not host or not port.isdigit():
        raise ValueError(f"{name}={address!r}: expected tcp://HOST:PORT")
    if not 0 < int(port) < 65536:
        raise ValueError(f"{name}={address!r}: a port is 1-65535")

"""The supervisor package's errors: what building and running a tree can raise."""

from __future__ import annotations

from warren.actors.errors import InvalidSpec, WarrenError

__all__ = [
    "ClusterError",
    "ClusterMismatch",
    "EtcdRefused",
    "EtcdUnavailable",
    "FaultMissed",
    "InvalidSpec",
    "NodeLocked",
    "OutOfOrder",
    "PeerError",
    "StaleEpoch",
    "StaleLeadership",
    "SupervisorError",
    "UsageError",
]


class SupervisorError(WarrenError):
    """Base of every error the supervisor package raises."""


class NodeLocked(SupervisorError):
    """Another node runs on this data directory."""


class NotANodeDirectory(SupervisorError, ValueError):
    """A data directory that holds files, none of them a node's: a node never writes
    into, or deletes from, a directory that is not its own."""


class UsageError(SupervisorError, ValueError):
    """A command line or config file the ``warren`` command cannot use; the message is the
    one line it prints before exiting with status 2."""


class FaultMissed(SupervisorError, RuntimeError):
    """A chaos fault could not land: its target was gone, or the node never came back."""


class ClusterError(SupervisorError):
    """Base of the errors of a node in a cluster (``warren.supervisor.cluster``)."""


class EtcdUnavailable(ClusterError):
    """No member of the cluster's etcd answered; the message names each one's error."""


class EtcdRefused(ClusterError):
    """etcd answered a request with an error of its own (a lease it no longer has, a
    request it will not serve): the message is etcd's."""


class StaleLeadership(ClusterError):
    """A leader's fenced write found another epoch in etcd: it leads no more, and wrote
    nothing."""


class ClusterMismatch(ClusterError):
    """A node that may not join as it was asked: its data directory belongs to another
    cluster, or another node of the cluster already has its name."""


class PeerError(ClusterError):
    """A peer that is not a follower of this cluster, or that answered nothing readable."""


class StaleEpoch(ClusterError):
    """A replication batch of an older epoch than one the replica has already taken."""


class OutOfOrder(ClusterError):
    """A replication batch that does not start right after the replica's last action;
    ``needed`` is the sequence number it takes next."""

    def __init__(self, message: str, needed: int) -> None:
        super().__init__(message)
        self.needed = needed

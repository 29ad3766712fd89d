"""The command line of a node in a cluster: ``warren node``'s ``--cluster``, ``--etcd``,
``--peer`` and ``--cluster-ttl-s`` (and ``[cluster]`` in the config file), checked into
``Node``'s keyword arguments, and ``warren cluster status``: the node's view of its
cluster (the leader, the epoch, the ISR, the live nodes, the etcd members' health)."""

from __future__ import annotations

import argparse
import sys
import textwrap
from typing import Any

from ..errors import UsageError
from ..tables import strict_json
from .access import node_status

__all__ = ["add_cluster_commands", "add_cluster_options", "cluster_settings", "format_cluster"]

EXIT_OK, EXIT_NO_NODE, EXIT_USAGE = 0, 1, 2


def add_cluster_options(node: argparse.ArgumentParser) -> None:
    node.add_argument(
        "--cluster",
        metavar="NAME",
        help="join the cluster NAME (with --etcd and --peer; docs/cluster.md)",
    )
    node.add_argument(
        "--etcd",
        metavar="URL[,URL…]",
        help="the cluster's etcd members, e.g. http://127.0.0.1:2379",
    )
    node.add_argument(
        "--peer", metavar="tcp://HOST:PORT", help="where the cluster's other nodes reach this one"
    )
    node.add_argument(
        "--peer-listen",
        metavar="tcp://HOST:PORT",
        help="where this node listens for its peers, when not at --peer (behind a NAT, a "
        "port forward or a proxy)",
    )
    node.add_argument(
        "--cluster-ttl-s",
        type=int,
        metavar="SECONDS",
        help="the node's etcd lease: a leader unheard of this long is replaced (default 10)",
    )
    node.add_argument(
        "--min-insync",
        type=int,
        metavar="N",
        help="nodes (the leader's among them) that hold each confirmed write (default 2)",
    )


def cluster_settings(options: dict[str, Any]) -> dict[str, Any]:
    """``Node``'s cluster arguments from the merged options; ``UsageError`` for a bad one."""
    from ..cluster.election import LEASE_TTL_S
    from ..cluster.settings import MIN_INSYNC, ClusterSettings

    given = {
        key: options[key]
        for key in ("cluster", "etcd", "peer", "peer_listen", "cluster_ttl_s", "min_insync")
        if key in options
    }
    if not given:
        return {}
    if "cluster" not in given:
        raise UsageError(
            "--etcd, --peer, --peer-listen, --cluster-ttl-s and --min-insync go with --cluster NAME"
        )
    try:
        checked = ClusterSettings.checked(
            given["cluster"],
            given.get("etcd"),
            given.get("peer"),
            given.get("cluster_ttl_s", LEASE_TTL_S),
            given.get("min_insync", MIN_INSYNC),
            given.get("peer_listen"),
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return {
        "cluster": checked.cluster,
        "etcd": checked.endpoints,
        "peer": checked.peer,
        "cluster_ttl_s": checked.ttl_s,
        "min_insync": checked.min_insync,
        **({"peer_listen": checked.peer_listen} if checked.peer_listen else {}),
    }


def add_cluster_commands(commands: Any) -> None:
    cluster = commands.add_parser(
        "cluster",
        help="a cluster's state, as a node of it sees it",
        description="Commands about the cluster a node belongs to (warren node --cluster).",
    )
    cluster_commands = cluster.add_subparsers(dest="cluster_command", metavar="COMMAND")
    status = cluster_commands.add_parser(
        "status",
        help="the leader, the epoch, the ISR, the nodes and etcd's members",
        description="The cluster as the node on --data-dir sees it: who leads under which "
        "epoch, which nodes are in sync (the ISR), which are up, and each etcd member's "
        "health.",
    )
    status.add_argument("--data-dir", required=True, help="a node's data directory")
    status.add_argument("--json", action="store_true", help="print it as JSON")
    status.set_defaults(handler=_cluster_status)


def _cluster_status(args: argparse.Namespace) -> int:
    status = node_status(args.data_dir)
    if status is None:
        return EXIT_NO_NODE
    cluster = status.get("cluster")
    if cluster is None:
        if status.get("state") == "starting":
            print(f"warren: the node on {args.data_dir} is starting", file=sys.stderr)
        elif status.get("cluster_name"):
            print(
                f"warren: the coordinator of the node on {args.data_dir} (cluster "
                f"{status['cluster_name']}) does not answer now; try again",
                file=sys.stderr,
            )
        else:
            print(
                f"warren: the node on {args.data_dir} is not in a cluster "
                "(warren node --cluster NAME --etcd URL --peer tcp://HOST:PORT)",
                file=sys.stderr,
            )
            return EXIT_USAGE
        return EXIT_NO_NODE
    print(strict_json(cluster) if args.json else format_cluster(cluster))
    return EXIT_OK


def format_cluster(cluster: dict[str, Any]) -> str:
    """The cluster's state, for a person at an 80-column terminal."""
    leader = cluster["leader"] or "none"
    epoch = cluster["epoch"] if cluster["epoch"] is not None else "-"
    lines = [
        f"cluster {cluster['cluster']}: node {cluster['node']} is {cluster['role']}",
        f"leader: {leader}"
        + (f" at {cluster['leader_peer']}" if cluster["leader_peer"] else "")
        + f", epoch {epoch}",
        f"in sync (ISR): {', '.join(cluster['isr']) or 'none yet'}",
        "nodes up: "
        + (
            ", ".join(f"{name} ({peer})" for name, peer in sorted(cluster["nodes"].items()))
            or "none"
        ),
        f"lease: {cluster['lease_ttl_s']} s",
    ]
    shipping = cluster.get("replication") or {}
    if shipping.get("mode") == "leader":
        lines.append(
            f"replication: action {shipping['position']}, committed "
            f"{shipping['committed']}, min in sync {shipping['min_insync']}"
        )
        for name, follower in sorted(shipping["followers"].items()):
            state = "syncing whole" if follower["syncing"] else "following the log"
            lines.append(
                f"  {name}: {state}, {follower['lag_actions']} actions "
                f"({follower['lag_bytes']} bytes) behind"
                + (f"; {follower['error']}" if follower["error"] else "")
            )
    for member in cluster["etcd"]:
        state = "healthy" if member["healthy"] else f"unhealthy: {member['error']}"
        lines.append(f"etcd {member['endpoint']}: {state}")
    if cluster.get("refused"):
        lines.append(f"last election: {cluster['refused']}")
    if cluster.get("last_error"):
        lines.append(f"last error: {cluster['last_error']}")
    wrapped = []
    for line in lines:
        indent = " " * (len(line) - len(line.lstrip()))
        wrapped += textwrap.wrap(
            line.lstrip(),
            80,
            initial_indent=indent,
            subsequent_indent=indent + "  ",
            break_long_words=False,
        )
    return "\n".join(wrapped)

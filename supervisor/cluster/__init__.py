"""A cluster of Warren nodes (docs/cluster.md): etcd holds who leads, under which epoch,
and which nodes are in sync (``election``, over ``etcd``); each node's ``coordinator``
process takes part in it. ``replication`` (file actions, a follower's replica, the
leader's log, full sync) and ``peers`` (their wire between coordinators) are replication's
engine, not yet wired into the coordinator."""

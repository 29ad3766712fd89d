"""A cluster of Warren nodes: etcd holds who leads, under which epoch, and which nodes
are in sync (``election``, over ``etcd``); each node's ``coordinator`` process takes
part in it."""

"""Queues on a real store: the in-process engine (``LocalStoreClient``) for most tests,
and, for the tests taking ``stores``, the store actors of a node too (one suite, both
twins)."""

import os

import pytest

from warren.queues import VariableQueue
from warren.store import LocalStoreClient, MessageStore
from warren.store.client import StoreClient
from warren.supervisor import Node

SEGMENT = 16  # small segments: every test crosses segment boundaries


class EngineStores:
    """msg_store_persistent and msg_store_transient as engines in this process."""

    kind = "engine"

    def __init__(self, root):
        self.root = root
        self.open()

    def open(self):
        self.persistent = MessageStore(os.path.join(self.root, "msg_store_persistent"))
        self.transient = MessageStore(os.path.join(self.root, "msg_store_transient"))

    def persistent_client(self, ref):
        return LocalStoreClient(self.persistent, ref)

    def transient_client(self, ref):
        return LocalStoreClient(self.transient, ref)

    def close(self):
        self.persistent.close()
        self.transient.close()


class ActorStores:
    """The same two stores as actor processes of a node."""

    kind = "actor"

    def __init__(self, root):
        self.node = Node(os.path.join(root, "node"))

    def persistent_client(self, ref):
        return StoreClient(self.node.store("msg_store_persistent"), ref)

    def transient_client(self, ref):
        return StoreClient(self.node.store("msg_store_transient"), ref)

    def close(self):
        self.node.close()


@pytest.fixture
def engine_stores(tmp_path):
    stores = EngineStores(tmp_path / "stores")
    yield stores
    stores.close()


@pytest.fixture(params=["engine", "actor"])
def stores(request, tmp_path):
    stores = (EngineStores if request.param == "engine" else ActorStores)(tmp_path / "stores")
    yield stores
    stores.close()


@pytest.fixture
def open_queue(tmp_path, request):
    """Open queues on the test's queue directory, over ``stores`` when the test uses it,
    else over in-process engines; whatever is still open is dropped at the end."""
    opened = []
    if "stores" in request.fixturenames:
        backing = request.getfixturevalue("stores")
    else:
        backing = request.getfixturevalue("engine_stores")

    def _open(**options):
        options.setdefault("segment_entry_count", SEGMENT)
        queue = VariableQueue(
            tmp_path / "queues" / "q",
            persistent_store=backing.persistent_client,
            transient_store=backing.transient_client,
            **options,
        )
        opened.append(queue)
        return queue

    _open.stores = backing
    yield _open
    for queue in opened:
        queue.abandon()

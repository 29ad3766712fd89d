"""``LocalStoreClient``: a store client for a ``MessageStore`` in this process.

It has the calls of ``warren.store.client.StoreClient`` that a queue uses (``write``,
``remove``, ``read``, ``read_many``, ``contains_many``, ``claim_many``, ``settled``, ``close``,
``terminate``, ``delete_and_terminate``), so the queue engine runs unchanged against the
in-process engine (tests, benchmarks, embedding) or against a store actor.

Several clients may share one store: each write's ticket is ``(client_ref, seq)``, and
``settled()`` syncs the store (group commit) and hands every client the part of the
result that is its own, so one client's sync settles the others' writes too. Not
thread-safe, as the store is not.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Iterable, Mapping

from .engine.message_store import MessageStore, Settlement

__all__ = ["LocalStoreClient"]

# Every live client of each store, so that one client's sync settles them all.
_CLIENTS: weakref.WeakKeyDictionary[
    MessageStore, weakref.WeakValueDictionary[bytes, LocalStoreClient]
] = weakref.WeakKeyDictionary()


class LocalStoreClient:
    def __init__(self, store: MessageStore, client_ref: bytes | None = None) -> None:
        self.store = store
        self.client_ref = client_ref if client_ref is not None else os.urandom(16)
        self._next_seq = 0
        self._settled_up_to = 0
        self._failed: list[int] = []
        self.recovered_clean = store.recovered_clean
        self.store_start = store.start_token
        store.register_client(self.client_ref)
        _CLIENTS.setdefault(store, weakref.WeakValueDictionary())[self.client_ref] = self

    def write(self, msg_id: bytes, body: bytes) -> int:
        """Add one reference to ``msg_id`` (its body stored if it has none); its sequence
        number, settled by a later ``settled()``."""
        seq = self._next_seq
        self.store.write(msg_id, body, (self.client_ref, seq), self.client_ref)
        self._next_seq = seq + 1
        return seq

    def remove(self, msg_ids: Iterable[bytes]) -> None:
        for msg_id in msg_ids:
            self.store.remove(msg_id, self.client_ref)

    def read(self, msg_id: bytes) -> bytes | None:
        return self.store.read(msg_id)

    def read_many(self, msg_ids: list[bytes]) -> list[bytes | None]:
        read = self.store.read
        return [read(m) for m in msg_ids]

    def contains_many(self, msg_ids: list[bytes]) -> list[bool]:
        contains = self.store.contains
        return [contains(m) for m in msg_ids]

    def claim_many(
        self, msg_ids: list[bytes], predecessors: list[bytes], written_since: str | None
    ) -> list[bool]:
        return self.store.claim(msg_ids, self.client_ref, predecessors, written_since)

    def settled(self, wait: bool = True) -> Settlement:
        """Sync the store if any of this client's writes are unsettled (``wait`` changes
        nothing: an in-process sync is synchronous)."""
        if self._settled_up_to < self._next_seq:
            self._sync_store()
        failed, self._failed = self._failed, []
        return Settlement(self._settled_up_to, failed)

    def _sync_store(self) -> None:
        clients: Mapping[bytes, LocalStoreClient] = _CLIENTS.get(self.store, {})
        result = self.store.sync()
        for client in list(clients.values()):
            client._settled_up_to = client._next_seq
        for ticket in result.failed:  # other callers' tickets are theirs to see
            if type(ticket) is tuple:
                owner = clients.get(ticket[0])
                if owner is not None:
                    owner._failed.append(ticket[1])

    def terminate(self) -> None:
        """Settle everything, then unregister, as ``StoreClient.terminate``."""
        self.settled()
        self.store.unregister_client(self.client_ref)

    def close(self) -> None:
        """Settle everything, staying registered (as ``StoreClient.close``)."""
        self.settled()

    def delete_and_terminate(self) -> None:
        self.store.unregister_client(self.client_ref)
        clients = _CLIENTS.get(self.store)
        if clients is not None:
            clients.pop(self.client_ref, None)

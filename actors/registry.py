"""``Registry``: the names of one node's actors, name → ref.

Each ``Node`` owns one registry; there is no process-wide registry, so two nodes in one
process (two tests, two embedded apps) never see each other's names. ``spawn(name=...)``
registers the actor under its name, and the node unregisters it when that incarnation's
process exits, unless a newer incarnation has taken the name meanwhile. Actor processes
reach their node's registry through ``ProcessActor.whereis`` and ``register``.

Races: registration and lookup are atomic under one lock. A name that is looked up may
die the moment after; use a monitor, or an unpinned ref, which also reaches a restarted
incarnation at the same address.
"""

from __future__ import annotations

import threading

from .errors import InvalidSpec
from .ref import ActorRef


class Registry:
    """A thread-safe map of names to refs, private to one node."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._refs: dict[str, ActorRef] = {}

    def register(self, name: str, ref: ActorRef, replace: bool = False) -> None:
        """Bind ``name`` to ``ref``; a name held by another address needs ``replace=True``."""
        with self._lock:
            held = self._refs.get(name)
            if held is not None and held.address != ref.address and not replace:
                raise InvalidSpec("name", name, f"already registered to {held!r}")
            self._refs[name] = ref

    def unregister(self, name: str, ref: ActorRef | None = None) -> bool:
        """Remove ``name``; with ``ref``, only while the name still points at that ref."""
        with self._lock:
            held = self._refs.get(name)
            if held is None or (ref is not None and held != ref):
                return False
            del self._refs[name]
            return True

    def whereis(self, name: str) -> ActorRef | None:
        """The ref registered under ``name``, or ``None``."""
        with self._lock:
            return self._refs.get(name)

    def names(self) -> list[str]:
        """Every registered name, sorted."""
        with self._lock:
            return sorted(self._refs)

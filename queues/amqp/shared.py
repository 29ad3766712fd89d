"""What the AMQP port's connections share: the count of their topology changes, the
exclusive queues each of them owns, and the queues an exclusive consumer holds.

``TopologyChanges``: every binding, unbinding and delete one connection makes is counted;
a connection that sees the count move drops its cached routes before its next publish
through an exchange, so that a binding one client made routes every other client's next
publish, as RabbitMQ's bindings do once answered.

``ExclusiveQueues``: which connection owns each exclusive queue (the others get 405
RESOURCE_LOCKED for it), kept in a file of the port's (``exclusive.json`` in its
directory) so that a port restarted after a crash deletes the queues its dead
connections owned, as RabbitMQ deletes an exclusive queue when its connection goes.

``ExclusiveConsumers``: the queues a consumer of one of the port's connections holds
alone (``basic.consume`` with ``exclusive``): it is refused while the queue has any
consumer, and every other consume of the port's clients is refused while it holds the
queue (403 ACCESS_REFUSED, as RabbitMQ's). A consume of a queue is checked and made under
that queue's own lock, so that an exclusive one and another cannot both get in. Warren's
own clients consume past it: they do not go through the port.

Races: all three are used from every connection's worker thread, under a lock each. The file
is replaced whole (written aside, then renamed) at each change, without an fsync: its
queues are transient, so a node that lost the file in a power cut lost them too. A disk
that refuses the file (full) fails no declare: the file is written again at the next
change.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from typing import Any

log = logging.getLogger("warren.amqp")

EXCLUSIVE_FILE = "exclusive.json"


class TopologyChanges:
    """How many topology changes the port's connections made (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0

    def changed(self) -> None:
        with self._lock:
            self.count += 1


class ExclusiveConsumers:
    """The queues held by an exclusive consumer, and by which (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holders: dict[str, Any] = {}
        self._guards: dict[str, threading.Lock] = {}

    def guard(self, queue: str) -> threading.Lock:
        """The lock a consume of ``queue`` is checked and made under."""
        with self._lock:
            return self._guards.setdefault(queue, threading.Lock())

    def holder(self, queue: str) -> Any:
        """The consumer holding ``queue`` alone, or None."""
        with self._lock:
            return self._holders.get(queue)

    def hold(self, queue: str, consumer: Any) -> None:
        with self._lock:
            self._holders[queue] = consumer

    def release(self, consumer: Any) -> None:
        """``consumer`` ended: the queues it held are free again."""
        with self._lock:
            for queue in [q for q, held in self._holders.items() if held is consumer]:
                del self._holders[queue]


class ExclusiveQueues:
    """The exclusive queues and their owners (see the module docstring)."""

    def __init__(self, directory: str) -> None:
        os.makedirs(directory, exist_ok=True)
        self._path = os.path.join(directory, EXCLUSIVE_FILE)
        self._lock = threading.Lock()
        self._owners: dict[str, Any] = {}

    def left_by_a_crash(self) -> list[str]:
        """The queues owned by connections of an earlier run of the port, to be deleted
        (then ``forget_left``: until then a port that dies again finds them again)."""
        try:
            with open(self._path, encoding="utf-8") as file:
                names = json.load(file)
        except (OSError, ValueError):
            return []  # none, or a file cut short: nothing to go on
        return [name for name in names if isinstance(name, str)] if isinstance(names, list) else []

    def forget_left(self) -> None:
        """The queues ``left_by_a_crash`` named are deleted: the file names this run's."""
        with self._lock:
            self._save()

    def claim(self, name: str, owner: Any) -> bool:
        """Make ``owner`` the queue's; False when another connection owns it."""
        with self._lock:
            held = self._owners.setdefault(name, owner)
            if held is not owner:
                return False
            self._save()
            return True

    def locked_for(self, name: str, connection: Any) -> bool:
        """Whether another connection than ``connection`` owns the queue."""
        with self._lock:
            owner = self._owners.get(name)
        return owner is not None and owner is not connection

    def release(self, name: str) -> None:
        with self._lock:
            if self._owners.pop(name, None) is not None:
                self._save()

    def owned_by(self, owner: Any) -> list[str]:
        with self._lock:
            return [name for name, held in self._owners.items() if held is owner]

    def _save(self) -> None:
        """Write the file; a disk that refuses it (full) is logged, not raised: the
        queues stay their connections' all the same, and only a crash of the port
        before the next write that succeeds would leave them undeleted."""
        aside = self._path + ".tmp"
        try:
            with open(aside, "w", encoding="utf-8") as file:
                json.dump(sorted(self._owners), file)
            os.replace(aside, self._path)
        except OSError as exc:
            log.warning("amqp: could not write %s: %s", self._path, exc)

"""A node's definitions: its queues, exchanges and bindings, the durable ones kept across
restarts in ``<data_dir>/definitions.json``.

The file is replaced whole (temp file, fsync, rename, directory fsync), so a crash leaves
the old definitions or the new ones, never a mix. It holds the durable queues, the
durable exchanges, and the bindings between a durable exchange and a durable queue.

A non-durable queue's directory holds a ``.transient`` marker; a node deletes such
directories at boot, and leaves alone (with a warning) any queue directory it has no
definition of, rather than guess.

Exchanges (``warren.queues.routing``): the default exchange ``""`` routes a message to the
queue its routing key names, and exists always; ``direct``, ``fanout`` and ``topic``
exchanges route by their bindings. Re-declaring a queue or an exchange with other
arguments raises ``PreconditionFailed``; binding to an unknown queue or exchange raises
``NotFound``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
from dataclasses import asdict, dataclass
from typing import Any

from ..durable_files import write_atomically
from ..engine.ref_counts import QUEUES_DIR
from ..errors import NotFound, PreconditionFailed
from ..protocol import QueueDefinition, check_name
from ..routing import EXCHANGE_KINDS

__all__ = [
    "DEFINITIONS_FILE",
    "Definitions",
    "ExchangeDefinition",
    "queue_directory",
]

log = logging.getLogger("warren.queues")

DEFINITIONS_FILE = "definitions.json"
TRANSIENT_MARKER = ".transient"


@dataclass(frozen=True)
class ExchangeDefinition:
    name: str
    kind: str = "direct"
    durable: bool = True


_PLAIN_NAME = re.compile(r"[A-Za-z0-9_.-]{1,200}")


def queue_directory(data_dir: str, name: str) -> str:
    """Where queue ``name`` keeps its files: ``<data_dir>/queues/<name>`` for a name of
    letters, digits, '_', '.' and '-' (every name a node took before names became UTF-8),
    else a digest of the name, which no such name can equal: any name is a safe, short
    file name, and "." or ".." never climbs out."""
    check_name(name)
    if _PLAIN_NAME.fullmatch(name) and name not in (".", ".."):
        return os.path.join(data_dir, QUEUES_DIR, name)
    digest = hashlib.sha256(name.encode()).hexdigest()[:40]
    return os.path.join(data_dir, QUEUES_DIR, f"~{digest}")


class Definitions:
    """The definitions of one node; not thread-safe (the node holds a lock around it)."""

    def __init__(self, data_dir: str) -> None:
        self.data_dir = data_dir
        self.queues: dict[str, QueueDefinition] = {}
        self.exchanges: dict[str, ExchangeDefinition] = {}
        self.bindings: set[tuple[str, str, str]] = set()  # (exchange, queue, key)
        try:
            with open(os.path.join(data_dir, DEFINITIONS_FILE)) as file:
                saved = json.load(file)
        except FileNotFoundError:
            return
        self.queues = {q["name"]: QueueDefinition(**q) for q in saved.get("queues", [])}
        self.exchanges = {e["name"]: ExchangeDefinition(**e) for e in saved.get("exchanges", [])}
        self.bindings = {tuple(b) for b in saved.get("bindings", [])}

    # ------------------------------------------------------------------ changes

    def add_queue(self, definition: QueueDefinition) -> bool:
        """True if the queue is new; PreconditionFailed if it exists otherwise."""
        existing = self.queues.get(definition.name)
        if existing is not None:
            if existing != definition:
                differ = ", ".join(
                    f"{k}={v!r}" for k, v in asdict(existing).items() if getattr(definition, k) != v
                )
                raise PreconditionFailed(
                    f"queue {definition.name!r} exists with {differ}; declare it with those "
                    f"arguments, or delete it first"
                )
            return False
        self.queues[definition.name] = definition
        return True

    def remove_queue(self, name: str) -> QueueDefinition:
        definition = self.queues.pop(name, None)
        if definition is None:
            raise NotFound(f"no queue {name!r} on this node; nothing to delete")
        self.bindings = {b for b in self.bindings if b[1] != name}
        return definition

    def add_exchange(self, definition: ExchangeDefinition) -> bool:
        if definition.kind not in EXCHANGE_KINDS:
            raise ValueError(
                f"exchange kind must be one of {EXCHANGE_KINDS}, got {definition.kind!r}"
            )
        existing = self.exchanges.get(definition.name)
        if existing is not None:
            if existing != definition:
                raise PreconditionFailed(
                    f"exchange {definition.name!r} exists with kind={existing.kind!r}, "
                    f"durable={existing.durable}; declare it with those arguments"
                )
            return False
        self.exchanges[definition.name] = definition
        return True

    def bind(self, queue: str, exchange: str, routing_key: str) -> bool:
        if queue not in self.queues:
            raise NotFound(f"no queue {queue!r} to bind; declare it first")
        if exchange not in self.exchanges:
            raise NotFound(f"no exchange {exchange!r} to bind to; declare it first")
        if not isinstance(routing_key, str) or len(routing_key) > 255:
            raise ValueError(
                f"a routing key is a str of at most 255 characters, got {routing_key!r}"
            )
        binding = (exchange, queue, routing_key)
        if binding in self.bindings:
            return False
        self.bindings.add(binding)
        return True

    def unbind(self, queue: str, exchange: str, routing_key: str) -> bool:
        """True if the binding was there (an unbind of none changes nothing, as in
        RabbitMQ); NotFound for an unknown queue or exchange."""
        if queue not in self.queues:
            raise NotFound(f"no queue {queue!r} on this node")
        if exchange not in self.exchanges:
            raise NotFound(f"no exchange {exchange!r} on this node")
        binding = (exchange, queue, routing_key)
        if binding not in self.bindings:
            return False
        self.bindings.discard(binding)
        return True

    def remove_exchange(self, name: str) -> ExchangeDefinition:
        """Forget an exchange and its bindings (the queues stay)."""
        if name == "":
            raise PreconditionFailed("the default exchange cannot be deleted")
        definition = self.exchanges.pop(name, None)
        if definition is None:
            raise NotFound(f"no exchange {name!r} on this node; nothing to delete")
        self.bindings = {b for b in self.bindings if b[0] != name}
        return definition

    # ------------------------------------------------------------------ reading

    def list_exchanges(self) -> list[dict[str, Any]]:
        """Every declared exchange: name, kind, durable (the default one is implicit)."""
        return [asdict(self.exchanges[n]) for n in sorted(self.exchanges)]

    def list_bindings(self) -> list[dict[str, str]]:
        return [{"exchange": e, "queue": q, "routing_key": k} for e, q, k in sorted(self.bindings)]

    def exchange(self, name: str) -> dict[str, Any]:
        """An exchange's kind and bindings ``[queue, routing_key]``: what a publisher
        routes with."""
        definition = self.exchanges.get(name)
        if definition is None:
            raise NotFound(f"no exchange {name!r} on this node; declare it first")
        return {
            "kind": definition.kind,
            "bindings": sorted([q, k] for e, q, k in self.bindings if e == name),
        }

    def save(self) -> None:
        durable_queues = {n for n, q in self.queues.items() if q.durable}
        durable_exchanges = {n for n, e in self.exchanges.items() if e.durable}
        saved = {
            "queues": [asdict(self.queues[n]) for n in sorted(durable_queues)],
            "exchanges": [asdict(self.exchanges[n]) for n in sorted(durable_exchanges)],
            "bindings": sorted(
                list(b)
                for b in self.bindings
                if b[0] in durable_exchanges and b[1] in durable_queues
            ),
        }
        write_atomically(os.path.join(self.data_dir, DEFINITIONS_FILE), json.dumps(saved).encode())

    # ------------------------------------------------------------------ directories

    def mark_transient(self, name: str) -> None:
        directory = queue_directory(self.data_dir, name)
        os.makedirs(directory, exist_ok=True)
        open(os.path.join(directory, TRANSIENT_MARKER), "w").close()

    def remove_transient_queues(self) -> None:
        """Delete the directories of non-durable queues left by the node's last run."""
        root = os.path.join(self.data_dir, QUEUES_DIR)
        try:
            names = os.listdir(root)
        except FileNotFoundError:
            return
        for name in names:
            directory = os.path.join(root, name)
            if name in self.queues:
                continue
            if os.path.exists(os.path.join(directory, TRANSIENT_MARKER)):
                shutil.rmtree(directory)
            else:
                log.warning("%s has no queue definition; left alone", directory)

"""A node's definitions: its queues, exchanges and bindings, the durable ones kept across
restarts in ``<data_dir>/definitions.json`` and a log of the changes since.

Storage (as RabbitMQ's Mnesia and Khepri keep theirs: a snapshot and an append log): the
snapshot ``definitions.json`` holds the durable queues, the durable exchanges, the
bindings between a durable exchange and a durable queue, and the number of the log that
follows it (``generation``, 0 in a file written before there was a log). ``save()`` makes
the changes since the last one durable: one line each appended to
``definitions-<generation>.log`` (the CRC-32 of its JSON in hex, a space, the JSON), then
one fdatasync, before the node answers the declare. A declare so writes a few hundred
bytes whatever the number of definitions: rewriting every definition at each declare made
the last hundred of a thousand declares take four times as long as the first hundred.
Once the log outgrows the snapshot (and ``COMPACT_AT_BYTES``), the snapshot is written
anew under the next generation (temp file, fsync, rename, directory fsync) and the old
log deleted: the writing stays linear in the changes made.

Races, each with its answer:
- a crash in the middle of an append: the log ends in a line cut short (or, on some file
  systems, in zeros); its CRC fails and loading stops there, and the log is cut back to
  its last whole line. No line after it was answered, as appends are synced in order;
- a crash during a compaction: before the rename the old snapshot and its log are whole;
  after it the new snapshot names the next generation, and a log of another generation
  is stale and deleted at load;
- a failed append (a full disk, a failed fdatasync): the log is cut back to its last
  whole line, every change since the last save is undone in memory, and the save raises:
  the declare (bind, delete) that made them answers an error and did not happen, so the
  definitions in memory never hold a durable change the disk lacks (a second declare of
  the same queue saves it again, rather than find it there and answer ok unsaved);
- a line that reads but does not apply (a binding to a queue gone since): applied as far
  as it goes, without the checks a declare runs (it is history, checked when made).

A non-durable queue's directory holds a ``.transient`` marker; a node deletes such
directories at boot, and leaves alone (with a warning) any queue directory it has no
definition of, rather than guess.

Deletes (RabbitMQ never brings a deleted queue's messages back): the save that drops a
queue's definition is the moment its delete is done, and its files go after it. A crash
between the two left a directory with no definition, whose messages a later declare of
the name recovered, and whose references kept their bodies in the shared store (a dirty
start of the store counts the references of every queue directory). So a delete first
writes a tombstone beside the queue's directory, ``queues/<directory>~deleted`` (the
queue's name in it, for whoever reads the directory; no queue directory is so named: a
plain one has no ``~``, a digest's is ``~`` and 40 hex digits), synced with the
directory, then saves, then removes the directory, synced, and the tombstone last, synced
(a tombstone a power cut brought back would delete an ``auto_delete`` queue declared
again under the name, messages and all, as it starts). What a tombstone means is read
against the definitions:
- a tombstone of a queue still defined (not ``auto_delete``: see Auto-delete below):
  the delete's save never happened (a crash before it, or a refused save): the queue
  stays whole and the tombstone is removed
  (its client got an error, or no answer). A refused save leaves its tombstone: a save
  can reach the disk and still fail (an fsync's EIO), and the definitions read at the
  next boot say which it was;
- a tombstone of a queue not defined: the delete is done, its files are not all gone.
  ``finish_deletes`` at boot (before the shared store starts, so its recount no longer
  sees their references and drops the bodies only they held) and ``finish_delete`` at
  the next declare of the name remove them, the tombstone last: a crash in the middle
  of a removal leaves the tombstone, and the removal is made again.
A tombstone is read for its name alone (what it holds, empty, cut short or garbage, is
for people). One that is no file (a directory), or whose name stripped of its suffix is
no name ``queue_directory`` gives ("~deleted", "..~deleted": the queues' or the node's
own directory), is no queue's: ``finish_deletes`` logs it and leaves it alone, and
removes nothing on its word. Each tombstone found at boot is told in one log line.
A delete whose files the disk refuses to remove at once is still done (answered ok);
its tombstone stays until the next declare of the name, or the next boot, removes them.
Auto-delete (RabbitMQ's auto-delete queue that deleted itself never comes back either):
such a queue deletes itself in its own process when its last consumer stops, and the
node drops its definition only later, once it sees the process ended and the directory
gone. So the queue writes its tombstone (``mark_deleted``, as the node's delete does)
before it deletes anything, and for a queue defined to delete itself (``auto_delete``, or
an ``expires_ms`` that ran out: ``QueueDefinition.deletes_itself``) a tombstone means
the delete is decided, whether the queue or the node wrote it:
- the queue's process, killed in the middle of its delete (between two unlinks, or
  waiting for the store) and restarted by its supervisor, or started at the node's next
  boot (``finish_deletes`` leaves such a tombstone to it), sees the tombstone as it
  starts: it recovers what is left only to delete it (releasing its references in the
  shared store, which drops the bodies only it held) and ends normally, for good;
- the tombstone outlives the files: the node removes it (``finish_delete``) once the
  save that drops the definition is done. A node killed in between finds the tombstone
  at boot, and the queue, started, finishes an empty delete again, rather than coming
  back empty; a queue_sup restarted in between (after a store crash) likewise;
- a delete by the node whose save is refused leaves the tombstone of an auto-delete
  queue still defined: either reading of that save ends in the delete, at the queue's
  next start;
- a tombstone the disk refuses: the queue stays, messages and all, and is deleted when
  its last consumer stops again.
Left open: a shared store that restarts (dirty) after the save and before the queue
released its references recounts them from the directory still there, and keeps those
bodies until its next dirty start. The recount does not skip a tombstoned directory: a
delete whose save is then refused keeps its queue, which needs them.

Exchanges (``warren.queues.routing``): the default exchange ``""`` routes a message to the
queue its routing key names, and exists always; ``direct``, ``fanout`` and ``topic``
exchanges route by their bindings. Re-declaring a queue or an exchange with other
arguments raises ``PreconditionFailed``; binding to an unknown queue or exchange raises
``NotFound``.

Super streams: super stream ``name`` is a durable exchange of kind ``super-stream`` and
its partition streams ``name-0`` .. bound to it with keys "0" .. (``add_super_stream``, all
in one save: a crash leaves the whole or none of it). Its partitions are fixed: a
declare with another count, or other stream arguments, is refused, as are binds,
unbinds and deletes that would change its shape one piece at a time.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from isal.isal_zlib import crc32

from warren.store import replicated_io

from ..durable_files import fsync_directory, write_atomically
from ..engine.ref_counts import QUEUES_DIR
from ..errors import InvalidArgument, NotFound, PreconditionFailed
from ..protocol import QueueDefinition, check_name
from ..routing import EXCHANGE_KINDS, SUPER_STREAM

__all__ = [
    "DEFINITIONS_FILE",
    "Definitions",
    "ExchangeDefinition",
    "is_marked_deleted",
    "mark_deleted",
    "queue_directory",
]

log = logging.getLogger("warren.queues")

DEFINITIONS_FILE = "definitions.json"
LOG_PREFIX, LOG_SUFFIX = "definitions-", ".log"  # definitions-<generation>.log
COMPACT_AT_BYTES = 64 * 2**10  # a log below this size is never compacted
TRANSIENT_MARKER = ".transient"
TOMBSTONE_SUFFIX = "~deleted"  # queues/<directory>~deleted: a delete not finished


@dataclass(frozen=True)
class ExchangeDefinition:
    """An exchange: ``auto_delete`` goes when its last binding does (one that never had
    a binding stays, as RabbitMQ's); ``internal`` takes no publish from an AMQP client
    (it is a dead-letter exchange's, say); ``alternate_exchange`` (RabbitMQ's
    ``alternate-exchange`` argument) takes what this one routes to no queue, ``""`` none."""

    name: str
    kind: str = "direct"
    durable: bool = True
    auto_delete: bool = False
    internal: bool = False
    alternate_exchange: str = ""


_PLAIN_NAME = re.compile(r"[A-Za-z0-9_.-]{1,200}")
_DIGEST_NAME = re.compile(r"~[0-9a-f]{40}")


def _is_plain(name: str) -> bool:
    return bool(_PLAIN_NAME.fullmatch(name)) and name not in (".", "..")


def queue_directory(data_dir: str, name: str) -> str:
    """Where queue ``name`` keeps its files: ``<data_dir>/queues/<name>`` for a name of
    letters, digits, '_', '.' and '-' (every name a node took before names became UTF-8),
    else a digest of the name, which no such name can equal: any name is a safe, short
    file name, and "." or ".." never climbs out."""
    check_name(name)
    if _is_plain(name):
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
        self._unsaved: list[dict[str, Any]] = []  # changes to durable ones since save()
        self._undo: list[Callable[[], object]] = []  # how to take back each change since save()
        self._log_fd: int | None = None  # the log, opened at the first append
        self._log_bytes = 0
        self._snapshot_bytes = 0
        self.generation = 0
        try:
            with open(os.path.join(data_dir, DEFINITIONS_FILE), "rb") as file:
                data = file.read()
        except FileNotFoundError:
            data = None
        if data is not None:
            saved = json.loads(data)
            self._snapshot_bytes = len(data)
            self.generation = saved.get("generation", 0)
            self.queues = {q["name"]: QueueDefinition(**q) for q in saved.get("queues", [])}
            self.exchanges = {
                e["name"]: ExchangeDefinition(**e) for e in saved.get("exchanges", [])
            }
            self.bindings = {tuple(b) for b in saved.get("bindings", [])}
        self._replay_log()

    def _log_path(self, generation: int) -> str:
        return os.path.join(self.data_dir, f"{LOG_PREFIX}{generation}{LOG_SUFFIX}")

    def _replay_log(self) -> None:
        """Apply the log of this generation up to its last whole line (cut there), and
        delete the logs of other generations (see Races)."""
        try:
            names = os.listdir(self.data_dir)
        except FileNotFoundError:
            return
        current = f"{LOG_PREFIX}{self.generation}{LOG_SUFFIX}"
        for name in names:
            if name.startswith(LOG_PREFIX) and name.endswith(LOG_SUFFIX) and name != current:
                replicated_io.unlink(os.path.join(self.data_dir, name))
        path = self._log_path(self.generation)
        try:
            with open(path, "rb") as file:
                data = file.read()
        except FileNotFoundError:
            return
        whole = 0
        for line in data.splitlines(keepends=True):
            change = _parse_line(line)
            if change is None:
                log.warning(
                    "%s: a change cut short at byte %d (a crash while it was written, "
                    "never answered); the log is cut back there",
                    path,
                    whole,
                )
                break
            self._apply(change)
            whole += len(line)
        if whole != len(data):
            replicated_io.truncate(path, whole)
        self._log_bytes = whole

    # ------------------------------------------------------------------ changes

    def add_queue(self, definition: QueueDefinition) -> bool:
        """True if the queue is new; PreconditionFailed if it exists otherwise, or if its
        name is a super stream's (a consume or a delete of the name means the super
        stream)."""
        if self.partitions(definition.name) is not None:
            raise PreconditionFailed(
                f"{definition.name!r} is a super stream's name; a queue cannot take it "
                f"(its partitions are {definition.name}-0 ...)"
            )
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
        self._undo.append(lambda: self.queues.pop(definition.name))
        if definition.durable:
            self._unsaved.append({"add_queue": asdict(definition)})
        return True

    def remove_queue(self, name: str) -> QueueDefinition:
        definition = self.queues.pop(name, None)
        if definition is None:
            raise NotFound(f"no queue {name!r} on this node; nothing to delete")
        self._forget_bindings(lambda binding: binding[1] == name)
        self._undo.append(lambda: self.queues.__setitem__(name, definition))
        if definition.durable:
            self._unsaved.append({"remove_queue": name})
        return definition

    def add_super_stream(self, name: str, partitions: list[QueueDefinition]) -> bool:
        """Add super stream ``name`` with its ``partitions`` (``super_stream_partitions``):
        True if new, False if it exists alike; ``PreconditionFailed`` if it exists with
        another count or other arguments, or a name it needs is taken."""
        existing = self.partitions(name)
        if existing is not None:
            if len(existing) != len(partitions):
                raise PreconditionFailed(
                    f"super stream {name!r} has {len(existing)} partitions, not "
                    f"{len(partitions)}: a super stream's partitions are fixed when it is "
                    f"declared (adding some would move keys to other partitions); declare "
                    f"another super stream, or delete this one first"
                )
            for queue in partitions:
                self.add_queue(queue)  # the same arguments, or PreconditionFailed
            return False
        if name in self.exchanges:
            raise PreconditionFailed(
                f"exchange {name!r} exists and is no super stream; a super stream's name is "
                f"its exchange's: choose another name, or delete the exchange first"
            )
        taken = [queue.name for queue in partitions if queue.name in self.queues]
        if name in self.queues or taken:
            raise PreconditionFailed(
                f"queue {(taken or [name])[0]!r} exists: super stream {name!r} needs the "
                f"names {name!r} and {name}-0 .. {name}-{len(partitions) - 1}"
            )
        self.add_exchange(ExchangeDefinition(name, SUPER_STREAM))
        for queue in partitions:
            self.add_queue(queue)
            self.bind(queue.name, name, str(queue.partition))
        return True

    def partitions(self, name: str) -> list[str] | None:
        """The partition streams of super stream ``name``, in order; None if it is none."""
        exchange = self.exchanges.get(name)
        if exchange is None or exchange.kind != SUPER_STREAM:
            return None
        bound = sorted((int(key), queue) for e, queue, key in self.bindings if e == name)
        return [queue for _, queue in bound]

    def left_partitions(self, name: str) -> list[str]:
        """The partitions a delete of super stream ``name`` cut short left (its exchange
        is gone, they are not), in order."""
        left = [q for q in self.queues.values() if q.super_stream == name]
        return [q.name for q in sorted(left, key=lambda q: q.partition or 0)]

    def refuse_reshaping(self, queue: str | None, exchange: str | None, what: str) -> None:
        """``PreconditionFailed`` when ``what`` (a bind, an unbind, a delete) would change
        a super stream piece by piece: on its exchange or one of its partitions."""
        definition = self.queues.get(queue) if queue is not None else None
        owner = definition.super_stream if definition is not None else None
        if owner is not None and self.partitions(owner) is None:
            owner = None  # left by a delete cut short: a stream of its own now
        if owner is None and exchange is not None and self.partitions(exchange) is not None:
            owner = exchange
        if owner is not None:
            raise PreconditionFailed(
                f"{what} would change super stream {owner!r}, whose partitions are fixed; "
                f"delete_queue({owner!r}) deletes it whole"
            )

    def add_exchange(self, definition: ExchangeDefinition) -> bool:
        if definition.kind not in (*EXCHANGE_KINDS, SUPER_STREAM):
            raise InvalidArgument(
                f"exchange kind must be one of {EXCHANGE_KINDS}, got {definition.kind!r}"
            )
        existing = self.exchanges.get(definition.name)
        if existing is not None:
            if existing != definition:
                raise PreconditionFailed(
                    f"exchange {definition.name!r} exists with kind={existing.kind!r}, "
                    f"durable={existing.durable}, auto_delete={existing.auto_delete}, "
                    f"internal={existing.internal}, alternate_exchange="
                    f"{existing.alternate_exchange!r}; declare it with those arguments"
                )
            return False
        self.exchanges[definition.name] = definition
        self._undo.append(lambda: self.exchanges.pop(definition.name))
        if definition.durable:
            self._unsaved.append({"add_exchange": asdict(definition)})
        return True

    def bind(self, queue: str, exchange: str, routing_key: str) -> bool:
        if queue not in self.queues:
            raise NotFound(f"no queue {queue!r} to bind; declare it first")
        if exchange not in self.exchanges:
            raise NotFound(f"no exchange {exchange!r} to bind to; declare it first")
        if not isinstance(routing_key, str) or len(routing_key) > 255:
            raise InvalidArgument(
                f"a routing key is a str of at most 255 characters, got {routing_key!r}"
            )
        binding = (exchange, queue, routing_key)
        if binding in self.bindings:
            return False
        self.bindings.add(binding)
        self._undo.append(lambda: self.bindings.discard(binding))
        if self._durable(binding):
            self._unsaved.append({"bind": list(binding)})
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
        self._undo.append(lambda: self.bindings.add(binding))
        if self._durable(binding):
            self._unsaved.append({"unbind": list(binding)})
        self._drop_unbound_auto_delete({exchange})
        return True

    def remove_exchange(self, name: str) -> ExchangeDefinition:
        """Forget an exchange and its bindings (the queues stay)."""
        if name == "":
            raise PreconditionFailed("the default exchange cannot be deleted")
        definition = self.exchanges.pop(name, None)
        if definition is None:
            raise NotFound(f"no exchange {name!r} on this node; nothing to delete")
        self._forget_bindings(lambda binding: binding[0] == name)
        self._undo.append(lambda: self.exchanges.__setitem__(name, definition))
        if definition.durable:
            self._unsaved.append({"remove_exchange": name})
        return definition

    def _forget_bindings(self, gone: Callable[[tuple[str, str, str]], bool]) -> None:
        """Drop the bindings ``gone`` picks (those of a queue or an exchange removed), and
        the auto-delete exchanges that leaves without any."""
        forgotten = {binding for binding in self.bindings if gone(binding)}
        self.bindings = self.bindings - forgotten  # a new set: a reader's copy stays whole

        def restore() -> None:
            self.bindings = self.bindings | forgotten

        self._undo.append(restore)
        self._drop_unbound_auto_delete({exchange for exchange, _, _ in forgotten})

    def _drop_unbound_auto_delete(self, unbound_from: set[str]) -> None:
        """Remove the auto-delete exchanges of ``unbound_from`` (each just lost a binding)
        that have none left, as RabbitMQ deletes one when its last binding goes."""
        bound = {exchange for exchange, _, _ in self.bindings}
        for name in sorted(unbound_from - bound):
            definition = self.exchanges.get(name)
            if definition is not None and definition.auto_delete:
                self.remove_exchange(name)

    def _durable(self, binding: tuple[str, str, str]) -> bool:
        """Whether a binding is kept across restarts: both its ends are durable."""
        exchange, queue = self.exchanges.get(binding[0]), self.queues.get(binding[1])
        return bool(exchange and exchange.durable and queue and queue.durable)

    def _apply(self, change: dict[str, Any]) -> None:
        """Replay one logged change (see Races: no checks)."""
        ((kind, value),) = change.items()
        if kind == "add_queue":
            self.queues[value["name"]] = QueueDefinition(**value)
        elif kind == "remove_queue":
            self.queues.pop(value, None)
            self.bindings = {b for b in self.bindings if b[1] != value}
        elif kind == "add_exchange":
            self.exchanges[value["name"]] = ExchangeDefinition(**value)
        elif kind == "remove_exchange":
            self.exchanges.pop(value, None)
            self.bindings = {b for b in self.bindings if b[0] != value}
        elif kind == "bind":
            self.bindings.add(tuple(value))
        elif kind == "unbind":
            self.bindings.discard(tuple(value))
        else:
            raise ValueError(f"{DEFINITIONS_FILE}: a logged change of unknown kind {kind!r}")

    # ------------------------------------------------------------------ reading

    def list_exchanges(self) -> list[dict[str, Any]]:
        """Every declared exchange: name, kind, durable (the default one is implicit)."""
        return [asdict(self.exchanges[n]) for n in sorted(self.exchanges)]

    def list_bindings(self) -> list[dict[str, str]]:
        return [{"exchange": e, "queue": q, "routing_key": k} for e, q, k in sorted(self.bindings)]

    def exchange(self, name: str) -> dict[str, Any]:
        """An exchange's kind, bindings ``[queue, routing_key]`` and alternate exchange:
        what a publisher routes with."""
        definition = self.exchanges.get(name)
        if definition is None:
            raise NotFound(f"no exchange {name!r} on this node; declare it first")
        return {
            "kind": definition.kind,
            "bindings": sorted([q, k] for e, q, k in self.bindings if e == name),
            "alternate_exchange": definition.alternate_exchange,
        }

    def save(self) -> None:
        """Make the changes since the last save durable: appended to the log and synced,
        the log compacted into a new snapshot once it outgrows the last (see Storage).
        On an ``OSError`` every change since the last save is undone first (see Races)."""
        if not self._unsaved:
            self._undo = []
            return
        lines = b"".join(map(_line, self._unsaved))
        try:
            written = self._append(lines)
        except OSError:
            for undo in reversed(self._undo):
                undo()
            self._undo, self._unsaved = [], []
            raise
        self._log_bytes += written
        self._undo, self._unsaved = [], []
        if self._log_bytes > max(COMPACT_AT_BYTES, self._snapshot_bytes):
            try:
                self._compact()
            except OSError as exc:  # the log holds every change: compacting can wait
                log.warning("%s: compacting the definitions failed (%s)", self.data_dir, exc)

    def _append(self, lines: bytes) -> int:
        """Append ``lines`` to the log and sync them; on an error, none of them stays."""
        opened = self._log_fd is None
        if self._log_fd is None:
            path = self._log_path(self.generation)
            self._log_fd = replicated_io.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        fd = self._log_fd
        try:
            if opened:
                fsync_directory(self.data_dir)  # the log itself must survive a crash
            written = replicated_io.write(fd, lines)
            if written != len(lines):
                raise OSError(
                    errno.ENOSPC,
                    f"a short write to the definitions' log ({written} of {len(lines)} bytes)",
                )
            replicated_io.fdatasync(fd)
        except OSError:
            # A full disk, a failed fdatasync: what was written of these lines must not
            # stay in front of the next ones (a load stops at the first bad line), and a
            # failed fdatasync is never retried on the same file description.
            self._log_fd = None
            try:
                replicated_io.ftruncate(fd, self._log_bytes)
            finally:
                os.close(fd)
            raise
        return written

    def _compact(self) -> None:
        """Write the snapshot anew under the next generation, then drop the old log."""
        durable_queues = {n for n, q in self.queues.items() if q.durable}
        durable_exchanges = {n for n, e in self.exchanges.items() if e.durable}
        saved = {
            "generation": self.generation + 1,
            "queues": [asdict(self.queues[n]) for n in sorted(durable_queues)],
            "exchanges": [asdict(self.exchanges[n]) for n in sorted(durable_exchanges)],
            "bindings": sorted(
                list(b)
                for b in self.bindings
                if b[0] in durable_exchanges and b[1] in durable_queues
            ),
        }
        data = json.dumps(saved).encode()
        write_atomically(os.path.join(self.data_dir, DEFINITIONS_FILE), data)
        self.close()
        replicated_io.unlink(self._log_path(self.generation))
        self.generation += 1
        self._log_bytes, self._snapshot_bytes = 0, len(data)

    def close(self) -> None:
        """Release the log (the node's stop); a later save opens it again."""
        if self._log_fd is not None:
            os.close(self._log_fd)
            self._log_fd = None

    # ------------------------------------------------------------------ directories

    def mark_transient(self, name: str) -> None:
        directory = queue_directory(self.data_dir, name)
        os.makedirs(directory, exist_ok=True)
        os.close(
            replicated_io.open(
                os.path.join(directory, TRANSIENT_MARKER), os.O_WRONLY | os.O_CREAT, 0o644
            )
        )

    def remove_transient_queues(self) -> None:
        """Delete the directories of non-durable queues left by the node's last run."""
        root = os.path.join(self.data_dir, QUEUES_DIR)
        try:
            names = os.listdir(root)
        except FileNotFoundError:
            return
        for name in names:
            directory = os.path.join(root, name)
            if name in self.queues or name.endswith(TOMBSTONE_SUFFIX):  # see finish_deletes
                continue
            if os.path.exists(os.path.join(directory, TRANSIENT_MARKER)):
                replicated_io.remove_tree(directory)
            else:
                log.warning("%s has no queue definition; left alone", directory)

    def finish_delete(self, name: str) -> None:
        """Remove what is left of the deleted queue ``name``, if its tombstone says its
        delete was not finished: its directory, then the tombstone (see Deletes). Only
        for a name with no definition; an ``OSError`` if the disk refuses."""
        assert name not in self.queues, "a defined queue's files are its own"
        directory = queue_directory(self.data_dir, name)
        if is_marked_deleted(directory):
            _remove_deleted(directory)

    def finish_deletes(self) -> None:
        """At boot, before the shared store starts: every tombstone's delete finished, or
        taken back where the queue is still defined (see Deletes). A removal the disk
        refuses is logged and left to the next declare of the name, or the next boot."""
        root = os.path.join(self.data_dir, QUEUES_DIR)
        try:
            names = os.listdir(root)
        except FileNotFoundError:
            return
        defined = {
            os.path.basename(queue_directory(self.data_dir, name)): definition
            for name, definition in self.queues.items()
        }
        for name in names:
            if not name.endswith(TOMBSTONE_SUFFIX):
                continue
            tombstone = os.path.join(root, name)
            directory = name.removesuffix(TOMBSTONE_SUFFIX)
            if not _is_queue_directory_name(directory) or not os.path.isfile(tombstone):
                log.warning(
                    "%s: no queue's tombstone (it names no queue directory, or is no "
                    "file); left alone",
                    tombstone,
                )
                continue
            if directory in defined and defined[directory].deletes_itself:
                log.info("%s: the queue finishes its own delete as it starts", tombstone)
                continue
            try:
                if directory in defined:
                    replicated_io.unlink(tombstone)
                    log.warning(
                        "%s: the delete of this queue was never saved; the queue stays",
                        tombstone,
                    )
                else:
                    _remove_deleted(os.path.join(root, directory))
                    log.info("%s: removed the files of a deleted queue", tombstone)
            except OSError as exc:
                log.error("%s: left for the next start (%s)", tombstone, exc)


def _is_queue_directory_name(name: str) -> bool:
    """Whether ``name`` is one ``queue_directory`` gives: a plain name (never "." or
    "..") or a digest's. A tombstone's name stripped of its suffix must be one before
    anything is removed on its word: "~deleted" or "..~deleted" name the queues' or the
    node's own directory."""
    return _is_plain(name) or bool(_DIGEST_NAME.fullmatch(name))


def mark_deleted(directory: str, name: str) -> None:
    """Write the tombstone of queue ``name`` (whose files are in ``directory``), durably,
    before its delete is saved, or before an ``auto_delete`` queue deletes itself (see
    Deletes); an ``OSError`` if the disk refuses it (nothing is changed then)."""
    path = directory + TOMBSTONE_SUFFIX
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = replicated_io.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        try:
            replicated_io.write(fd, name.encode())
            replicated_io.fsync(fd)
        finally:
            os.close(fd)
        fsync_directory(os.path.dirname(path))
    except OSError:
        try:
            replicated_io.unlink(path)
            fsync_directory(os.path.dirname(path))  # brought back, it would delete the queue
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("queue %r stays, but its tombstone could not be removed: %s", name, exc)
        raise


def is_marked_deleted(directory: str) -> bool:
    """Whether the queue whose files are in ``directory`` has a tombstone (see Deletes):
    a file, as ``mark_deleted`` writes (a directory in its place is none)."""
    return os.path.isfile(directory + TOMBSTONE_SUFFIX)


def _remove_deleted(directory: str) -> None:
    """Remove a deleted queue's directory, durably, then its tombstone (see Deletes)."""
    if os.path.lexists(directory):
        replicated_io.remove_tree(directory)
    fsync_directory(os.path.dirname(directory))  # the directory gone before its tombstone
    replicated_io.unlink(directory + TOMBSTONE_SUFFIX)
    fsync_directory(os.path.dirname(directory))  # brought back, it would delete a new queue


def _line(change: dict[str, Any]) -> bytes:
    """One logged change: the CRC-32 of its JSON in hex, a space, the JSON, a newline."""
    data = json.dumps(change, separators=(",", ":")).encode()
    return b"%08x %s\n" % (crc32(data), data)


def _parse_line(line: bytes) -> dict[str, Any] | None:
    """The change a whole line of the log holds; None for a line cut short or damaged."""
    if not line.endswith(b"\n") or len(line) < 11 or line[8:9] != b" ":
        return None
    data = line[9:-1]
    try:
        if int(line[:8], 16) != crc32(data):
            return None
        change = json.loads(data)
    except ValueError:
        return None
    return change if isinstance(change, dict) and len(change) == 1 else None

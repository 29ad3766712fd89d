"""Automatic recovery of a ``Connection`` whose node went away, as RabbitMQ's Java client
and kombu recover theirs: what the connection must remember to rebuild itself on a new
transport, how long it tries, and the error it ends in when it does not.

"The node went away" (``NodeLost``) means the process or listener this connection spoke
to is no longer the one answering: over ipc, the node's process is gone (kill -9, a
crash, a stop), it is stopping (an orderly stop removes the node file before it stops
any queue) or another node runs on the data directory; over tcp, the listener's boot
id changed (the node or its listener restarted), the connection dropped and nothing
listens at the listener's port any more, or the listener answered nothing for
``NODE_SILENCE_S``. A queue restarting inside a living node is not that: it stays a
``Nacked`` or a ``QueueRestarting`` for the one call it hit, as before.

Recovery, in this order (``Connection._recover``), each step on the new transport:

1. connect again, waiting ``recovery_interval_s`` between attempts, doubling up to
   ``MAX_INTERVAL_S``, for at most ``recovery_timeout_s`` in all (an attempt waits for
   the node's first answer no longer than what is left; then the connection closes and
   raises ``ConnectionClosed``). A node back but still starting is not back yet: a
   transport is made only once the node served a call (``RemoteNode`` and ``TcpNode``
   each ask it one, as ``connect(wait=...)`` relies on), so its ``NodeStarting`` fails
   the attempt, and the next one waits its turn;
2. declare again what this connection declared (``Topology``: exchanges, then queues,
   then bindings, each as it was last declared, less what it deleted or unbound);
3. send again every publish whose confirm was in doubt and that has a producer id (the
   application's, or the connection's own: see ``AutoProducers``), oldest first, with
   its sequences, so that a queue that took it before confirms the repeat without
   enqueueing it; one without a producer id is ``Nacked`` instead (sent again, it could
   be taken twice: its publisher decides);
4. subscribe its consumers again under a new consumer id (the node requeued, flagged
   redelivered, what the old one held); a stream consumer attaches again after the
   last record it handed out (a named one then stores its offset again: the kill may
   have lost its last store), so that its offsets keep increasing.

Then ``on_recovery(connection)`` runs. ``on_disconnect(error)`` ran when the loss was
found, before step 1, with or without recovery.

Races it guards against: the node going away again during recovery (every step's error
ends the attempt; the next one starts over from step 1); a node that restarted under a
transport which saw it serve, and answers "starting" (over tcp, a node call carries no
boot, so the new node answers it): that node is another one, ``NodeLost`` (over ipc,
each start has a control socket of its own, which an older transport never reaches); a
call of the application that found the loss while another part of the connection was
recovering (recovery is not re-entered: errors inside it go to its own loop); a publish
sent by the old session and taken by the node just before it died (the producer's
sequence makes the repeat a no-op).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable
from typing import Any

from ..errors import ConnectionClosed, InvalidArgument
from ..protocol import NodeHandle

__all__ = [
    "MAX_INTERVAL_S",
    "NODE_SILENCE_S",
    "RECOVERY_INTERVAL_S",
    "RECOVERY_TIMEOUT_S",
    "AutoProducers",
    "NodeLost",
    "Topology",
    "backoff",
    "check_recovery_options",
    "notify",
]

log = logging.getLogger("warren.queues")

RECOVERY_INTERVAL_S = 0.5  # the first wait between two attempts to connect again
MAX_INTERVAL_S = 5.0  # the waits double up to this (the Java client's fixed interval)
RECOVERY_TIMEOUT_S = 120.0  # how long a connection tries to recover before it closes
NODE_SILENCE_S = 15.0  # a tcp listener that answers nothing this long is taken as gone


class NodeLost(ConnectionClosed):
    """The node (or the tcp listener) this connection spoke to went away. Raised inside
    the client, where the loss is found; a connection that does not recover raises it
    to the application, as the ``ConnectionClosed`` it is."""


def check_recovery_options(interval_s: Any, timeout_s: Any) -> None:
    for value, what in ((interval_s, "recovery_interval_s"), (timeout_s, "recovery_timeout_s")):
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or value <= 0
        ):
            raise InvalidArgument(f"{what} must be a finite number of seconds > 0, got {value!r}")


def backoff(first_s: float) -> Any:
    """The waits between attempts to connect again: ``first_s``, doubling up to
    ``MAX_INTERVAL_S`` (or ``first_s`` if that is longer)."""
    wait = first_s
    while True:
        yield wait
        wait = min(wait * 2, max(MAX_INTERVAL_S, first_s))


def notify(callback: Callable[..., Any] | None, *args: Any) -> None:
    """Run an application's callback; what it raises is logged, never raised into the
    call of the connection that found the loss."""
    if callback is None:
        return
    try:
        callback(*args)
    except Exception:
        log.exception("a connection's recovery callback %r failed", callback)


class Topology:
    """What a connection declared, to declare again on a new node: exchanges, queues and
    bindings, each as last declared, in the order first declared; a delete or unbind
    takes it out (a deleted queue or exchange takes its bindings with it)."""

    def __init__(self) -> None:
        self.exchanges: dict[str, tuple[str, dict[str, Any]]] = {}  # name -> (kind, options)
        self.queues: dict[str, dict[str, Any]] = {}  # name -> declare arguments
        self.bindings: dict[tuple[str, str, str], None] = {}  # (queue, exchange, key)

    def queue_declared(self, name: str, arguments: dict[str, Any]) -> None:
        self.queues[name] = dict(arguments)

    def queue_deleted(self, name: str) -> None:
        self.queues.pop(name, None)
        self.bindings = {b: None for b in self.bindings if b[0] != name}

    def exchange_declared(self, name: str, kind: str, options: dict[str, Any]) -> None:
        self.exchanges[name] = (kind, options)

    def exchange_deleted(self, name: str) -> None:
        self.exchanges.pop(name, None)
        self.bindings = {b: None for b in self.bindings if b[1] != name}

    def bound(self, queue: str, exchange: str, routing_key: str) -> None:
        self.bindings[(queue, exchange, routing_key)] = None

    def unbound(self, queue: str, exchange: str, routing_key: str) -> None:
        self.bindings.pop((queue, exchange, routing_key), None)

    def declare_on(self, node: NodeHandle) -> None:
        """Declare it all on ``node``: what exists already is left as it is (a queue
        declared elsewhere with other arguments since raises ``PreconditionFailed``)."""
        for name, (kind, options) in self.exchanges.items():
            node.declare_exchange(name, kind=kind, **options)
        for name, arguments in self.queues.items():
            node.declare_queue(name, **arguments)
        for queue, exchange, routing_key in self.bindings:
            node.bind_queue(queue, exchange, routing_key)


class AutoProducers:
    """The producer id and next sequence a recovering connection gives the publishes its
    application sent without one, so that one sent again after a node went away is
    dropped as a repeat by a queue that took it (``warren.queues.broker.dedup``).

    One producer per set of queues a publish goes to: a queue must see a producer's
    sequences without gaps, and each publish carries one sequence to all its queues. A
    publish that was not confirmed (a queue refused it, or restarted with it in doubt)
    retires its producer: its sequences may now have a gap at a queue, so the next
    publish to those queues starts a new producer at 0. Not for streams: a stream keeps
    every producer it has seen in its tracking for good, and a connection's producer
    lives only as long as the connection."""

    def __init__(self) -> None:
        self._next: dict[tuple[str, ...], tuple[bytes, int]] = {}  # queues -> (id, sequence)

    def peek(self, queues: list[str]) -> tuple[bytes, int]:
        """The producer and the sequence of the next message published to ``queues``."""
        key = tuple(queues)
        found = self._next.get(key)
        if found is None:
            found = self._next[key] = (b"auto:" + os.urandom(12).hex().encode(), 0)
        return found

    def advance(self, queues: list[str], count: int) -> None:
        """``count`` messages to ``queues`` took their sequences (after ``peek``)."""
        key = tuple(queues)
        producer, sequence = self._next[key]
        self._next[key] = (producer, sequence + count)

    def retire(self, queues: list[str], producer: bytes | None) -> None:
        """A publish of ``producer`` was not confirmed: its queues get a new producer."""
        key = tuple(queues)
        if producer is not None and key in self._next and self._next[key][0] == producer:
            del self._next[key]

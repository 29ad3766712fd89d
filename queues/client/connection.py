"""``Connection``: what a producer or consumer uses to talk to a node's queues.

A publish goes straight from this process to the queue's process (one hop) as one
``Publish`` of encoded messages, and is answered once every message of it is confirmed.
Through an exchange, the message is routed here, from the exchange's bindings (cached
for a second), and sent to each queue it goes to; its confirm comes when every one of
them has confirmed it. A message routed to several queues carries one id to all of them,
so the shared store holds one copy with a reference per queue.
``publish`` waits for that; ``publish_async`` returns a ``Confirm`` at once;
``publish_many`` sends batches and waits for all of them, and marks them so
(``Publish.awaited``): a queue with nothing else to handle writes such a batch before
making its messages' statuses, ahead of its group commit (``docs/queue-engine.md``).

Frames carry many messages, as RabbitMQ's writer batches frames: consecutive
``publish_async`` calls to the same queues with the same properties fill one ``Publish``
(up to ``ASYNC_BATCH`` messages), which is sent when it is full, when anything else is
asked of the connection (a wait for a confirm included), or, for a producer that stopped
calling, by a flusher thread once it is ``linger_s`` (2 ms) old. That thread is the only
one besides the user's: it sends on the user's thread's channel, under the connection's
lock, which every call that uses the transport holds, so what a connection sends keeps
the order of its calls. A publish that sent the frame being filled before adding its
message yields the processor (``sched_yield``) once it has let go of the connection: a
producer calling in a loop keeps its core, and on a machine whose cores are all busy a
thread woken to carry a frame or a confirm (this process's ZeroMQ I/O thread, a queue's,
another client's) otherwise waits for the scheduler's next tick, 4 ms at 250 Hz: measured
under a window-1,000 producer on two cores, another publisher's confirm p99 4.6–6.0 →
3.4–4.3 ms at the same rates. The call costs under a microsecond where nothing else
waits. At most ``max_in_flight`` messages (4000, RabbitMQ's credit) or
``max_in_flight_bytes`` (32 MiB) are unconfirmed per connection, in at most
``MAX_IN_FLIGHT_REQUESTS`` publishes: a publish beyond that waits for the oldest confirms
first. While the node's memory or disk alarm is raised (``blocked``), a publish waits, up
to ``call_timeout_s`` or until another thread calls ``interrupt``, then raises
``Blocked``.

Consumers fetch: ``get`` takes one message; ``consume(queue, prefetch=N)`` iterates,
holding at most N deliveries unacked. Every delivery awaiting an ack is this
connection's; ``Delivery.ack``, ``nack`` and ``reject`` settle it (``multiple=True``
settles every earlier one the connection holds from that queue too). Settles are sent
without waiting (the connection checks its tags itself). A connection that
closes hands its unacked deliveries back to their queues before ``close`` returns; one
whose process ends (killed, or a zombie not reaped yet) has them requeued by the queue as
soon as the kernel closes its sockets, after the acks it sent before it ended.

When the node goes away (killed, restarted, its tcp listener restarted), a connection
made by ``connect`` recovers by itself (``warren.queues.client.recovery``): it connects
again, declares again what it declared, sends again the publishes in doubt and
subscribes its consumers again; each call that found the loss is made again, or goes
on, once it recovered. Without recovery the loss closes the connection:
``ConnectionClosed``, whichever call found it.

The parts: ``warren.queues.client.connection_core`` (the state, the lock, the frames
being filled, recovery), ``warren.queues.client.connection_publishing`` and
``warren.queues.client.connection_consuming`` (the two roles' calls), over
``warren.queues.client.publishing`` (frames, confirms, the flusher),
``warren.queues.client.consuming`` (deliveries, consumers, settles) and
``warren.queues.client.queue_refs`` (asking one queue incarnation); this module puts
them together, with the declarations.

Errors (``warren.queues.errors``): ``NotFound`` for an unknown queue, ``Nacked`` for a
publish the queue did not confirm (it was deleted, or it restarted with the message in
doubt while the node lived: publish it again), ``UnknownDeliveryTag`` for an ack of a
delivery this connection does not hold, ``MessageTooLarge``, ``InvalidMessage``,
``Unroutable``, ``Blocked``, ``ConnectionClosed`` (closed, or its node went away and it
did not recover). A ``Connection`` is used from one thread (but ``interrupt``, for
another); open one per thread or process.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ..protocol import (
    SUPER_STREAM_TYPE,
    Purge,
    QueueStats,
    declared_queue,
    server_named_queue,
    super_stream_partitions,
)
from .connection_consuming import ConsumingCalls
from .connection_core import exclusive
from .connection_publishing import PublishingCalls
from .consuming import Consumer, Delivery
from .publishing import BatchConfirm, Confirm

__all__ = ["BatchConfirm", "Confirm", "Connection", "Consumer", "Delivery", "QueueDeclared"]


class QueueDeclared(NamedTuple):
    """What a declare answers (AMQP's declare-ok): the queue, how many messages are ready
    in it, how many consumers are subscribed; the counts are None while the queue's
    process does not answer (restarting, or down after repeated crashes)."""

    queue: str
    message_count: int | None
    consumer_count: int | None


class Connection(PublishingCalls, ConsumingCalls):
    """A connection to a node: see the module docstring; ``ConnectionCore.__init__`` for its
    options."""

    # ------------------------------------------------------------------ declarations

    @exclusive
    def declare_queue(self, name: str, *, passive: bool = False, **arguments: Any) -> QueueDeclared:
        """Create the queue unless it exists (``PreconditionFailed`` if it exists with
        other arguments). The arguments are ``QueueDefinition``'s: ``durable`` (True),
        ``lazy`` (False), ``message_ttl_ms``, ``max_length``, ``overflow`` ("drop-head"
        or "reject-publish"), ``dead_letter_exchange``, ``dead_letter_routing_key``
        (None: each message's own), ``auto_delete`` (False), ``expires_ms`` (None: the
        queue never expires; else it deletes itself once unused that long); a bad
        one raises here, before anything is sent. ``passive=True`` creates nothing and
        raises ``NotFound`` unless the queue exists. Returns the queue's ``QueueDeclared``
        (its name, ready messages and consumers), as AMQP's declare-ok does. A queue
        declared with the name ``""`` is given one (``amq.gen-...``, as RabbitMQ names
        it): ``QueueDeclared.queue`` says which."""
        self._check_open()
        if name == "" and not passive:
            name = server_named_queue()
        if not passive and arguments.get("type") == SUPER_STREAM_TYPE:
            super_stream_partitions(name, arguments)
        elif not passive:
            declared_queue(name, arguments)
        answer = self._node.declare_queue(name, passive=passive, **arguments)
        if not passive:
            self._topology.queue_declared(name, arguments)
        return QueueDeclared(answer["queue"], answer["message_count"], answer["consumer_count"])

    @exclusive
    def delete_queue(self, name: str) -> int:
        self._check_open()
        self._refs.pop(name, None)
        self._routes.clear()
        self._topology.queue_deleted(name)
        return self._node.delete_queue(name)

    @exclusive
    def declare_exchange(
        self,
        name: str,
        kind: str = "direct",
        durable: bool = True,
        *,
        auto_delete: bool = False,
        internal: bool = False,
        alternate_exchange: str = "",
    ) -> None:
        """``direct``, ``fanout`` or ``topic`` (the default exchange ``""`` always exists);
        ``auto_delete``: it goes with its last binding; ``internal``: AMQP clients may
        not publish to it; ``alternate_exchange``: where a message it routes to no queue
        goes instead (and on, to that one's, while none routes it)."""
        self._check_open()
        options: dict[str, Any] = {
            "durable": durable,
            "auto_delete": auto_delete,
            "internal": internal,
            "alternate_exchange": alternate_exchange,
        }
        self._node.declare_exchange(name, kind=kind, **options)
        self._topology.exchange_declared(name, kind, options)

    @exclusive
    def bind_queue(self, queue: str, exchange: str, routing_key: str = "") -> None:
        self._check_open()
        self._node.bind_queue(queue, exchange, routing_key)
        self._topology.bound(queue, exchange, routing_key)
        self._routes.pop(exchange, None)

    @exclusive
    def unbind_queue(self, queue: str, exchange: str, routing_key: str = "") -> None:
        """Undo ``bind_queue`` (nothing happens for a binding that is not there)."""
        self._check_open()
        self._topology.unbound(queue, exchange, routing_key)
        self._node.unbind_queue(queue, exchange, routing_key)
        self._routes.pop(exchange, None)

    @exclusive
    def delete_exchange(self, name: str) -> None:
        """Delete an exchange and its bindings; the queues it routed to stay."""
        self._check_open()
        self._topology.exchange_deleted(name)
        self._node.delete_exchange(name)
        self._routes.pop(name, None)

    @exclusive
    def forget_routes(self) -> None:
        """Drop the exchanges' bindings this connection routes with (each is kept for
        ``ROUTES_TTL_S``): the next publish through an exchange reads them from the node.
        For a process that hears of another connection's binding (the AMQP port, whose
        clients bind for each other)."""
        self._routes.clear()

    @exclusive
    def list_exchanges(self) -> list[dict[str, Any]]:
        """Every declared exchange as ``{"name", "kind", "durable"}``."""
        self._check_open()
        return self._node.list_exchanges()

    @exclusive
    def list_bindings(self) -> list[dict[str, str]]:
        """Every binding as ``{"exchange", "queue", "routing_key"}``."""
        self._check_open()
        return self._node.list_bindings()

    @exclusive
    def list_queues(self) -> list[str]:
        self._check_open()
        return self._node.list_queues()

    @exclusive
    def queue_state(self, name: str) -> str:
        """``running``, ``restarting`` or ``crashed`` (it kept crashing and stays down)."""
        self._check_open()
        return self._node.queue_state(name)

    @exclusive
    def purge_queue(self, name: str) -> int:
        return self._ask(name, Purge())

    @exclusive
    def queue_stats(self, name: str) -> dict[str, Any]:
        return self._ask(name, QueueStats())

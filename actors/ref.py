"""``ActorRef``: the handle through which anyone, in any process, talks to an actor.

A ref names an actor incarnation: its name, its data address, its control address, its
incarnation number and pid, and the node service that spawned it. Refs are plain values:
they compare by value, travel inside messages (the codec encodes them) and work in
whichever process receives them, because sending only needs the address.

Addressing an incarnation. By default a ref reaches whichever incarnation of the actor
lives at its address: a supervisor that restarts an actor at the same address makes old
refs work again (the DEALERs reconnect by themselves and the new process binds the same
endpoints). ``ref.pin()`` returns a ref that names exactly this incarnation: the actor drops
(and counts) what a pinned ref sends once a newer incarnation has taken the address (an ask
is answered ``NotDelivered``, an ``ActorDeadError`` saying that nothing of it was taken), and
callers that know of the death get ``ActorDeadError`` at once. Store clients use pinned
refs so that no request ever reaches a restarted store that recovered without them.

Ordering: messages from one thread to one actor arrive in the order sent (one DEALER per
thread and address). Messages from different threads or processes interleave.

Pushback: ``tell`` blocks while the target's mailbox is full, up to ``timeout`` seconds,
then raises ``MailboxFull``. ZeroMQ queues messages for an actor that is not (yet or any
more) bound; what is still queued when the sender's process closes its sockets is discarded
after a bounded linger. Use ``ask`` or a monitor when you need to know.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import zmq

from . import wire
from ._runtime import Channel, channel_to, runtime
from .codec import _install_ref_type
from .errors import ActorDeadError

if TYPE_CHECKING:
    from .messages import Down, Pong


@dataclass(frozen=True)
class ActorRef:
    """A value naming one actor (see the module docstring for what "one" means)."""

    name: str
    address: str
    control: str
    incarnation: int
    pid: int
    node: str
    pinned: bool = False

    def pin(self) -> ActorRef:
        """A ref that reaches this incarnation only."""
        return dataclasses.replace(self, pinned=True)

    def unpin(self) -> ActorRef:
        """A ref that reaches whichever incarnation lives at this address."""
        return dataclasses.replace(self, pinned=False)

    def _check_alive(self) -> None:
        if self.pinned and runtime().known_down(self):
            raise ActorDeadError(f"{self.name} incarnation {self.incarnation} is dead")

    @property
    def _stamp(self) -> int:
        return self.incarnation if self.pinned else 0

    def tell(
        self,
        message: Any,
        timeout: float | None = wire.DEFAULT_SEND_TIMEOUT_S,
        channel: Channel | None = None,
    ) -> None:
        """Send ``message`` without waiting for an answer.

        Blocks while the mailbox is full, then raises ``MailboxFull`` after ``timeout``
        seconds (``0``: at once; ``None``: wait as long as it takes). ``channel``: as
        for ``ask_async``.
        """
        if channel is None:
            channel = channel_to(self.address)
        if self.pinned:
            self._check_alive()
            channel.send_message(wire.TELL, self.incarnation, message, timeout)
        else:
            channel.send_message(wire.TELL, 0, message, timeout)

    def tell_many(
        self, messages: Iterable[Any], timeout: float | None = wire.DEFAULT_SEND_TIMEOUT_S
    ) -> None:
        """Send many messages in one frame; the actor receives them in one batch, in order."""
        self._check_alive()
        batch = messages if isinstance(messages, list) else list(messages)
        if not batch:
            return
        channel_to(self.address).send_message(wire.BATCH, self._stamp, batch, timeout)

    def ask(self, message: Any, timeout: float | None = wire.DEFAULT_ASK_TIMEOUT_S) -> Any:
        """Send ``message`` and return the actor's answer.

        Raises the actor's exception (as ``RemoteError``, also a subclass of the built-in
        type for built-in exceptions), ``AskTimeout`` after ``timeout`` seconds (``None``:
        wait forever), or ``ActorDeadError`` once this process knows the actor is dead.
        """
        self._check_alive()
        rt = runtime()
        channel = rt.channel(self.address)
        request_id = next(rt.request_ids)
        return channel.request(
            [wire.ASK, self._stamp, request_id, message], request_id, timeout, self
        )

    def ask_async(
        self,
        message: Any,
        timeout: float | None = wire.DEFAULT_SEND_TIMEOUT_S,
        channel: Channel | None = None,
    ) -> Future:
        """Send ``message`` as an ask and return a ``Future`` of the answer at once.

        ``timeout`` bounds only the wait for room in a full mailbox; the wait for the answer
        is bounded by ``Future.get(timeout)``. ``channel``: send on this one (``channel()``
        of another thread, so that what that thread sends to the actor stays in order)
        rather than on this thread's.
        """
        self._check_alive()
        return self._request_async(self.address, wire.ASK, message, timeout, channel)

    def channel(self) -> Channel:
        """This thread's channel to the actor's mailbox."""
        return runtime().channel(self.address)

    def ping(self, timeout: float | None = 5.0) -> Pong:
        """A heartbeat on the control channel, answered before any queued data message."""
        return self._control(wire.PING, None, timeout)

    def ping_async(self, timeout: float | None = wire.DEFAULT_SEND_TIMEOUT_S) -> Future:
        """A heartbeat whose ``Pong`` arrives in a ``Future``: a watcher can have pings out
        to many actors at once, and a hung one delays nobody else's."""
        return self._request_async(self.control, wire.PING, None, timeout)

    def _request_async(
        self,
        endpoint: str,
        kind: int,
        body: Any,
        timeout: float | None,
        channel: Channel | None = None,
    ) -> Future:
        rt = runtime()
        if channel is None:
            channel = rt.channel(endpoint)
        request_id = next(rt.request_ids)
        channel.send_request(kind, self._stamp, request_id, body, timeout)
        return Future(channel, request_id, self)

    def stats(self, timeout: float | None = 5.0) -> dict[str, int]:
        """The actor's counters: received, dropped_stale, malformed, unroutable ..."""
        return self._control(wire.STATS, None, timeout)

    def stats_async(self, timeout: float | None = wire.DEFAULT_SEND_TIMEOUT_S) -> Future:
        """The actor's counters (``stats``) in a ``Future``: a node's metrics ask every
        actor at once, and a silent one delays nobody else's answer."""
        return self._request_async(self.control, wire.STATS, None, timeout)

    def figures_async(
        self,
        question: Any,
        *,
        process: bool = False,
        timeout: float | None = wire.DEFAULT_SEND_TIMEOUT_S,
    ) -> Future:
        """One control request for what a node's metrics read of an actor: ``[counters,
        answer, usage]``, the counters of ``stats``, the actor's answer to ``question``
        (None without one, or when it raised), and with ``process`` its process's
        ``{"cpu_seconds", "rss_bytes"}`` (else None). The actor answers between two passes,
        ahead of its queued data, so a busy actor's figures come at once. It also keeps
        the answer, and answers the question itself whenever it changes, where the node
        reads it without asking (``warren.actors.figures``)."""
        return self._request_async(self.control, wire.FIGURES, [question, process], timeout)

    def alarm(
        self, resource: str, raised: bool, timeout: float | None = wire.DEFAULT_SEND_TIMEOUT_S
    ) -> None:
        """Tell the actor a resource alarm was raised or cleared (its ``on_alarm`` runs);
        on the control channel, without waiting for an answer."""
        channel = runtime().channel(self.control)
        channel.send([wire.ALARM, self._stamp, 0, [resource, raised]], timeout)

    def request_stop(self, timeout: float | None = 5.0) -> None:
        """Ask the actor to stop after its current batch (no escalation; see ``stop``)."""
        self._control(wire.STOP, None, timeout)

    def _control(self, kind: int, body: Any, timeout: float | None) -> Any:
        rt = runtime()
        channel = rt.channel(self.control)
        request_id = next(rt.request_ids)
        return channel.request([kind, self._stamp, request_id, body], request_id, timeout, self)

    def stop(self, timeout: float = 5.0) -> Down:
        """Stop the actor: a stop request, then SIGTERM after ``timeout``, then SIGKILL.

        Returns the ``Down`` of the incarnation that stopped. Works from any process: the
        actor's node does the escalation.
        """
        from ._node_client import node_for

        return node_for(self.node).stop(self, timeout)

    def __repr__(self) -> str:
        pin = " pinned" if self.pinned else ""
        return f"<ActorRef {self.name} #{self.incarnation} pid {self.pid}{pin} {self.address}>"


class Answer:
    """An answer that comes once: ``get(timeout)`` waits for it (``_wait``), raising
    ``AskTimeout`` while it has not come; once it came, every ``get`` gives it again, its
    value or its error."""

    def __init__(self) -> None:
        self._done = False
        self._value: Any = None
        self._error: BaseException | None = None

    def get(self, timeout: float | None = wire.DEFAULT_ASK_TIMEOUT_S) -> Any:
        if not self._done:
            try:
                self._value = self._wait(timeout)
            except TimeoutError:
                raise
            except Exception as exc:
                self._error = exc
            self._done = True
        if self._error is not None:
            raise self._error
        return self._value

    def _wait(self, timeout: float | None) -> Any:
        raise NotImplementedError


class Future(Answer):
    """The answer to an ``ask_async`` (or to a request to the node: ``target`` None);
    ``get`` may be called from any thread, and raises like ``ActorRef.ask`` does."""

    def __init__(self, channel: Channel, request_id: int, target: ActorRef | None) -> None:
        super().__init__()
        self._channel = channel
        self._request_id = request_id
        self._target = target

    @property
    def socket(self) -> zmq.Socket:
        """The socket the answer comes on (this thread's channel to the actor): for a
        thread that waits on several actors' answers at once, with a ``zmq.Poller``,
        before it ``get``s them."""
        return self._channel.socket

    def arrived(self) -> bool:
        """Whether ``get`` may not have to wait: the answer came, or something waits on
        its socket to be read (a look that costs no exception, for a thread that looks
        at many answers often)."""
        return self._done or self._channel.may_hold(self._request_id)

    def _wait(self, timeout: float | None) -> Any:
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            return self._channel.wait(self._request_id, deadline, self._target)
        except TimeoutError:
            self._channel.expect(self._request_id)  # a later get may still take it
            raise


_install_ref_type(ActorRef, tuple(f.name for f in dataclasses.fields(ActorRef)))

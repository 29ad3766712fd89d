"""``ProcessActor``: the class an application subclasses to define an actor process.

The hooks are pykka's, with the same contracts, and all run on the actor process's main
thread, one at a time:

- ``__init__(*args, **kwargs)`` gets ``spawn``'s extra arguments (they reach the child
  through the forkserver, so they must be picklable; nothing else ever is).
- ``on_start()`` runs after the mailboxes are bound and before ``spawn`` returns; an
  exception here makes ``spawn`` raise ``SpawnError`` with the type name and message.
- ``on_receive(message)`` handles one message; for an ask, its return value is the
  answer, and an exception it raises goes back to the caller while the actor carries on.
- ``on_receive_batch(messages)`` receives, in order, the tells that were queued together
  (everything drained in one pass of the loop between two asks). The default calls
  ``on_receive`` for each; override it to act on a whole batch at once (one disk write,
  one fsync, one hand-off to an in-process pykka actor). ``UnhandledMessage`` raised for
  a tell (a message the actor does not handle) is logged and counted (``unhandled`` in
  ``ref.stats()``); any other exception raised for a tell crashes the actor:
  ``on_failure`` runs and the process exits with ``EXIT_CRASHED``.
- ``on_idle()`` runs whenever the loop has drained its mailbox after delivering messages
  (the moment for a store to flush its group commit), and after a pass that had run
  ``max_pass_s`` when it ended, when the class sets it (a busy mailbox never empties).
- ``on_peer_gone(pid)`` runs when the last connection process ``pid`` held to the data
  mailbox closed, after everything it sent was handled (``warren.actors.peers``: only
  for ``ipc://`` mailboxes, and only for actors that override it). The pid may name a
  process that ended, is a zombie, or is a new process under a reused pid: look before
  acting.
- ``on_alarm(resource, raised)`` runs when the node raises or clears a resource alarm
  (``ActorRef.alarm``, sent on the control channel: a busy actor hears it between batches).
- ``on_stop()`` runs on a requested stop, a SIGTERM or SIGHUP, or a linked actor's death,
  once the handler call in progress has returned (a signal never interrupts the actor's
  code); it is *not* called when the actor stops because of an unhandled exception.
- ``on_failure(exception_type, exception_value, traceback)`` runs when an unhandled
  exception stops the actor, *instead of* ``on_stop``.

Services the loop offers to the actor's code: ``self.ref`` (its own ref), ``defer_reply``
(answer an ask later, from any thread), ``call_later``, ``call_soon_threadsafe`` (run a
callback on the actor's thread, asked from another thread of its process: how a worker
thread hands a result back), ``stop``, ``monitor``/``demonitor``
(a ``Down`` arrives as a message), ``link``, ``whereis``/``register`` (the node's registry),
``peer_connected`` (whether a process still holds a connection to the mailbox).

Class attributes tune the mailbox: ``mailbox_size`` (messages queued per sender before the
sender is pushed back), ``max_batch`` (messages drained per loop pass; control messages
are looked at between passes), ``max_pass_s`` (the longest a pass handles messages),
``max_message_bytes``, ``trap_exits``.
"""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from . import wire
from .errors import ActorError, UnhandledMessage

if TYPE_CHECKING:
    from collections.abc import Callable

    import zmq

    from .ref import ActorRef, Future


class DeferredReply(Protocol):
    """The answer to one ask, to be given later (once), from any thread."""

    def send(self, value: Any) -> None: ...

    def fail(self, exception: BaseException) -> None: ...


class ActorServices(Protocol):
    """What the actor loop provides to the actor (implemented by ``warren.actors._loop``)."""

    def defer_reply(self) -> DeferredReply: ...

    def call_later(self, delay_s: float, callback: Callable[[], None]) -> None: ...

    def call_soon_threadsafe(self, callback: Callable[[], None]) -> None: ...

    def when_readable(self, socket: zmq.Socket, callback: Callable[[], None]) -> None: ...

    def stop(self, abnormal: bool = False) -> None: ...

    def monitor(self, target: ActorRef) -> None: ...

    def demonitor(self, target: ActorRef) -> None: ...

    def link(self, other: ActorRef) -> None: ...

    def whereis(self, name: str) -> ActorRef | None: ...

    def monitor_named(self, names: list[str]) -> list[ActorRef | None]: ...

    def monitor_named_async(self, names: list[str]) -> Future: ...

    def register(self, name: str) -> None: ...

    def unhandled(self, message: Any, error: UnhandledMessage) -> None: ...

    def peer_connected(self, pid: int) -> bool | None: ...

    def mailbox_empty(self) -> bool: ...


class ProcessActor:
    """Subclass this and ``spawn`` it into its own OS process (see the module docstring)."""

    # Messages queued per sender connection before that sender is pushed back.
    mailbox_size: ClassVar[int] = wire.DEFAULT_MAILBOX_SIZE
    # Messages drained from the mailbox in one loop pass (a batch is at most this long).
    max_batch: ClassVar[int] = 1024
    # Longest a loop pass takes messages (seconds; the clock is read before each further
    # one), or None for no bound but the above. A pass that ends past it ends as one that
    # emptied the mailbox does, with ``on_idle``: the most a busy actor's group commit
    # waits for the mailbox to empty.
    max_pass_s: ClassVar[float | None] = None
    # Largest message accepted, all frames together (bytes); larger ones are refused.
    max_message_bytes: ClassVar[int] = wire.MAX_MESSAGE_BYTES
    # When True, a linked actor's abnormal death arrives as an Exit message instead of
    # stopping this actor.
    trap_exits: ClassVar[bool] = False
    # True when the answer to a node's figures question (``on_receive(question)``) changes
    # only while the loop handles something (a message, a timer, a posted call): the loop
    # then keeps its last answer where the node reads it without asking
    # (``warren.actors.figures``). An actor whose figures change on threads of its own
    # sets False, and is asked at every scrape.
    figures_from_loop: ClassVar[bool] = True

    ref: ActorRef
    _services: ActorServices

    def on_start(self) -> None:
        """Called once the mailboxes are bound, before ``spawn`` returns."""

    def on_receive(self, message: Any) -> Any:
        """Handle one message; for an ask, the return value is the answer.

        Raise ``UnhandledMessage`` for a message this actor does not handle (an unknown
        request, fields it cannot use): an ask gets it as its error, a tell is logged and
        counted (``unhandled``), and the actor goes on. The default handles nothing.
        """
        raise UnhandledMessage(f"{type(self).__name__} does not handle a {type(message).__name__}")

    def on_receive_batch(self, messages: list[Any]) -> None:
        """Handle queued tells in order; the default hands each to ``on_receive``, and a
        message it raises ``UnhandledMessage`` for is logged and counted, the rest still
        handled."""
        for message in messages:
            try:
                self.on_receive(message)
            except UnhandledMessage as exc:
                self._require_services().unhandled(message, exc)

    def on_idle(self) -> None:
        """Called after the loop delivered messages and found the mailbox empty, or
        after a pass that had run ``max_pass_s``."""

    def on_peer_gone(self, pid: int) -> None:
        """Process ``pid`` closed its last connection to this actor's mailbox, and all it
        sent has been handled (see the module docstring)."""

    def on_alarm(self, resource: str, raised: bool) -> None:
        """A resource alarm of the node was raised or cleared (``resource`` is "memory" or
        "disk"). Publishers are to be blocked while any alarm is raised."""

    def on_stop(self) -> None:
        """Called on a clean stop (request, SIGTERM or SIGHUP, linked exit), not after a
        crash."""

    def on_failure(
        self,
        exception_type: type[BaseException] | None,
        exception_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """Called instead of ``on_stop`` when an unhandled exception stops the actor."""

    def defer_reply(self) -> DeferredReply:
        """Inside ``on_receive`` for an ask: answer later via the returned handle.

        The return value of ``on_receive`` is then ignored; an exception ``on_receive``
        raises before the handle is used is sent through it. For a message that came as a
        tell it raises ``UnhandledMessage`` (the sender should have asked). The handle's
        ``send``/``fail`` may be called from any thread of this process (an in-process pykka
        actor, say).
        """
        return self._require_services().defer_reply()

    def call_later(self, delay_s: float, callback: Callable[[], None]) -> None:
        """Run ``callback`` on the actor's thread after ``delay_s`` seconds."""
        self._require_services().call_later(delay_s, callback)

    def call_soon_threadsafe(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` on the actor's thread as soon as the loop is free; callable
        from any thread of this process (at once when called on the actor's thread). A
        callback still waiting when the actor stops is not run."""
        self._require_services().call_soon_threadsafe(callback)

    def when_readable(self, socket: zmq.Socket, callback: Callable[[], None]) -> None:
        """Run ``callback`` once on the actor's thread when ``socket`` (one of this
        process's, as ``Future.socket``: the answer to an ``ask_async``) has something to
        read, rather than at a timer's guess; it stops watching the socket then. Another
        call for the same socket replaces the callback."""
        self._require_services().when_readable(socket, callback)

    def stop(self, abnormal: bool = False) -> None:
        """Stop this actor once the current batch is handled (``on_stop`` runs). With
        ``abnormal``, it exits with ``EXIT_STOPPED_ABNORMALLY``: a failure to its
        monitors, links and supervisor, which restarts even a transient child (Erlang's
        stop with a reason other than normal)."""
        self._require_services().stop(abnormal)

    def monitor(self, target: ActorRef) -> None:
        """Receive a ``Down`` message when ``target``'s incarnation exits (at once if dead)."""
        self._require_services().monitor(target)

    def demonitor(self, target: ActorRef) -> None:
        """Stop monitoring ``target``."""
        self._require_services().demonitor(target)

    def link(self, other: ActorRef) -> None:
        """Die with ``other`` (or, with ``trap_exits``, get an ``Exit``), and it with us."""
        self._require_services().link(other)

    def whereis(self, name: str) -> ActorRef | None:
        """Look ``name`` up in the node's registry."""
        return self._require_services().whereis(name)

    def monitor_named(self, names: list[str]) -> list[ActorRef | None]:
        """Look each of ``names`` up and monitor the incarnation found, in one round trip
        to the node (``whereis`` then ``monitor`` of each take two apiece): its ref, or
        None (nothing monitored) where nobody holds the name. Like ``monitor``, a
        ``Down`` comes at once for an incarnation that exited in between."""
        return self._require_services().monitor_named(names)

    def monitor_named_async(self, names: list[str]) -> Future:
        """``monitor_named`` sent now, its answer taken later from the ``Future``'s
        ``get`` (which raises what ``monitor_named`` would): the node answers while the
        actor does other work (a queue opens its files)."""
        return self._require_services().monitor_named_async(names)

    def register(self, name: str) -> None:
        """Register this actor under ``name`` in the node's registry."""
        self._require_services().register(name)

    def peer_connected(self, pid: int) -> bool | None:
        """Whether process ``pid`` holds a connection to this actor's mailbox; None when
        this actor does not watch its peers (it does not override ``on_peer_gone``, or
        its mailbox is not ``ipc://``)."""
        return self._require_services().peer_connected(pid)

    def mailbox_empty(self) -> bool:
        """Whether no data message waits in the mailbox now: inside ``on_receive``, that
        this one ends the loop's pass, so ``on_idle`` comes next (unless one arrives
        meanwhile). A handler preparing work for ``on_idle`` (a group commit) can start
        on it early then, and leave it to wait for the rest of the pass otherwise."""
        return self._require_services().mailbox_empty()

    def _require_services(self) -> ActorServices:
        services = getattr(self, "_services", None)
        if services is None:
            raise ActorError(
                "actor services are available only inside a spawned actor, from on_start on"
            )
        return services

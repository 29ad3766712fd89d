"""The actor runtime: actors in their own OS processes, talking over ZeroMQ.

Define a ``ProcessActor`` subclass, create a ``Node``, ``spawn`` the actor into a process
of its own and talk to it through the ``ActorRef`` you get back::

    from warren.actors import Node, ProcessActor

    class Counter(ProcessActor):
        def __init__(self, start: int) -> None:
            self.total = start

        def on_receive(self, message):
            if message == "get":
                return self.total
            self.total += message

    with Node("demo") as node:
        counter = node.spawn(Counter, 10, name="counter")
        counter.tell(5)
        assert counter.ask("get") == 15

The modules, each with its protocol and races in its docstring: ``actor`` (the class you
subclass), ``ref`` (refs, tell/ask, futures), ``node`` (spawning, stopping, monitors,
links), ``registry``, ``monitor``, ``messages`` (Down, Exit, Pong), ``codec`` (what may
travel), ``figures`` (an actor's published answer to a node's metrics), ``runtime_dir``,
``exitcodes``, ``errors``.
"""

from typing import TYPE_CHECKING

from .lazy import lazy_face

if TYPE_CHECKING:  # what the names are, for type checkers and editors
    from .actor import DeferredReply, ProcessActor
    from .codec import LARGE_BODY_BYTES, message, register_message
    from .errors import (
        ActorDeadError,
        ActorError,
        AskTimeout,
        CodecError,
        FrameTooLarge,
        InvalidSpec,
        MailboxFull,
        NotDelivered,
        RemoteError,
        SpawnError,
        UnhandledMessage,
        WarrenError,
    )
    from .exitcodes import (
        EXIT_CRASHED,
        EXIT_LINKED,
        EXIT_NORMAL,
        EXIT_PARENT_GONE,
        EXIT_START_FAILED,
        EXIT_STOPPED_ABNORMALLY,
        EXIT_TERMINATED,
    )
    from .messages import Down, Exit, Pong
    from .monitor import Monitor
    from .node import Node
    from .ref import ActorRef, Future
    from .registry import Registry


_EXPORTS = {
    "ActorDeadError": ".errors",
    "ActorError": ".errors",
    "ActorRef": ".ref",
    "AskTimeout": ".errors",
    "CodecError": ".errors",
    "DeferredReply": ".actor",
    "Down": ".messages",
    "Exit": ".messages",
    "EXIT_CRASHED": ".exitcodes",
    "EXIT_LINKED": ".exitcodes",
    "EXIT_NORMAL": ".exitcodes",
    "EXIT_PARENT_GONE": ".exitcodes",
    "EXIT_START_FAILED": ".exitcodes",
    "EXIT_STOPPED_ABNORMALLY": ".exitcodes",
    "EXIT_TERMINATED": ".exitcodes",
    "FrameTooLarge": ".errors",
    "Future": ".ref",
    "InvalidSpec": ".errors",
    "LARGE_BODY_BYTES": ".codec",
    "MailboxFull": ".errors",
    "NotDelivered": ".errors",
    "message": ".codec",
    "Monitor": ".monitor",
    "Node": ".node",
    "Pong": ".messages",
    "ProcessActor": ".actor",
    "register_message": ".codec",
    "Registry": ".registry",
    "RemoteError": ".errors",
    "SpawnError": ".errors",
    "UnhandledMessage": ".errors",
    "WarrenError": ".errors",
}
__getattr__, __dir__ = lazy_face(__name__, _EXPORTS)
del lazy_face, TYPE_CHECKING
__all__ = sorted(_EXPORTS)

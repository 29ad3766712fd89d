"""The queues' error hierarchy: everything the queue engine and its clients raise.

Expected outcomes are values, not exceptions: fetching from an empty queue returns
``None``; a record that fails its CRC during recovery is dropped, logged and counted.
"""

from __future__ import annotations

import sys
import types

from warren.actors.errors import WarrenError, remote_error

__all__ = [
    "AccessRefused",
    "AmqpError",
    "Blocked",
    "ConnectionClosed",
    "CorruptLog",
    "CorruptMessage",
    "InvalidArgument",
    "InvalidMessage",
    "KeyFileError",
    "UsersFileError",
    "MessageTooLarge",
    "Nacked",
    "NodeNotRunning",
    "NodeStarting",
    "NotLeader",
    "NotFound",
    "OffsetOutOfRange",
    "OutOfSequence",
    "PreconditionFailed",
    "QueueClosed",
    "QueueDown",
    "QueueError",
    "QueueLocked",
    "QueueRestarting",
    "StreamCorrupt",
    "StreamError",
    "StreamLocked",
    "UnknownDeliveryTag",
    "Unroutable",
    "UnsupportedOperation",
    "StreamGone",
    "WarrenReadError",
    "WarrenWriteError",
    "local_error",
]


class QueueError(WarrenError):
    """Base class of every error the queues raise."""


class AmqpError(QueueError):
    """What makes the AMQP port close a channel or a connection: the reply code and text
    (AMQP's), and the method that caused it (0, 0 when no method did)."""

    def __init__(self, code: int, text: str, class_id: int = 0, method_id: int = 0) -> None:
        super().__init__(f"{code} {text}")
        self.code = code
        self.text = text
        self.class_id = class_id
        self.method_id = method_id


class InvalidArgument(QueueError, ValueError):
    """An argument a queue, a stream or a consumer does not take (a queue's definition, a
    stream offset, a retention age, a consumer's name): the message names it and what it
    takes. Also a ``ValueError``, as a bad argument is in Python."""


class InvalidMessage(QueueError, ValueError):
    """A message whose body or properties cannot be encoded (the error says which field)."""


class MessageTooLarge(QueueError, ValueError):
    """An encoded message (properties plus body) above the queue's ``max_message_bytes``."""


class CorruptMessage(QueueError):
    """A stored message failed its size or CRC check; it is never delivered."""


class CorruptLog(QueueError):
    """A quorum queue's log has a gap or a damaged entry among what it must replay: the
    queue does not start (going on would give new entries indexes the damaged log holds,
    and lose them); its files are left as they are."""


class UnknownDeliveryTag(QueueError, KeyError):
    """An ack or requeue of a seq id that is not awaiting an ack: never fetched, or
    already acked or requeued."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class QueueClosed(QueueError):
    """The queue was terminated, deleted, or broken by an earlier I/O error."""


class QueueLocked(QueueError):
    """Another queue object (in this or another process) has the directory open."""


class NotFound(QueueError, LookupError):
    """No queue of that name is declared on the node: declare it first."""


class QueueRestarting(NotFound):
    """The queue's (or stream's) process is between two incarnations: it stopped and its
    supervisor is starting it again. Ask again in a moment; unlike its base class, it
    does not mean the queue was never declared."""


class PreconditionFailed(QueueError):
    """A queue re-declared with other arguments than it has: declare it as it is, or
    delete it first."""


class Nacked(QueueError):
    """The queue did not confirm a publish (it was deleted, or restarted with the message
    in doubt); the message may or may not be in the queue: publish it again."""


class ConnectionClosed(QueueError):
    """The connection was closed; open a new one."""


class Unroutable(QueueError):
    """A mandatory publish that its exchange routed to no queue: bind a queue, or publish
    with ``mandatory=False`` to drop such messages."""


class QueueDown(Nacked):
    """The queue kept crashing and stays down; nothing published to it is taken. Restart
    the node, or delete the queue and declare it again (the node's log says why)."""


class OutOfSequence(Nacked):
    """A deduplicated publish whose first sequence leaves a gap after the highest the
    queue took from that producer (a batch before it was lost with a restart): nothing of
    it was taken; send again from the sequence the message names."""


class Blocked(QueueError):
    """A publish held past its timeout by a resource alarm of the node (memory or disk):
    free the resource (consume messages, free disk space) and publish again."""


class NodeNotRunning(QueueError, ConnectionError):
    """No node answers on that data directory: start one (``warren node --data-dir D``)."""


class NodeStarting(NodeNotRunning):
    """The node runs but is still starting (recovering its queues) and serves no call yet:
    ``connect(wait=...)`` waits for it, and so does a connection recovering from the
    node's restart, as for a node not back yet."""


class NotLeader(NodeNotRunning):
    """The node is a follower in its cluster: it serves nothing until it leads (the
    message names the leader, when one is known)."""


class AccessRefused(QueueError, ConnectionError):
    """A remote node refused this client's handshake (AMQP's ACCESS_REFUSED): it refuses
    the key, wants one, or uses none; the message says which and what to do."""


class KeyFileError(QueueError, ValueError):
    """A key file or name that cannot be used; the message says why and what to do."""


class UsersFileError(QueueError, ValueError):
    """The AMQP port's users file does not read, or a user's name or password is refused,
    or a user is missing or there already: the message says which."""


class UnsupportedOperation(QueueError):
    """An operation the queue's type does not have (a stream is not purged or fetched
    from; a classic queue is not read by offset)."""


class StreamError(QueueError):
    """Base class of the stream log's errors."""


class StreamCorrupt(StreamError):
    """A chunk failed its CRC or its framing; its bytes are never delivered."""


class OffsetOutOfRange(StreamError, LookupError):
    """A reader asked for an offset the stream does not hold (the error names the range)."""

    def __str__(self) -> str:  # LookupError would quote the message
        return str(self.args[0])


class StreamLocked(StreamError):
    """Another ``StreamLog`` (in this or another process) has the directory open."""


class WarrenWriteError(QueueError, RuntimeError):
    """A Spark write that cannot go on; the message says which row or setting, and why."""


class WarrenReadError(QueueError, RuntimeError):
    """A Spark read of a stream that cannot go on; the message says which offsets or
    setting, and why."""


class StreamGone(WarrenReadError):
    """A stream a Spark read names, or its pattern matched, is not declared (any more)."""


def local_error(type_name: str, message: str, remote_traceback: str = "") -> Exception:
    """An error raised in a node or a queue process, as the client raises it, whichever
    transport carried it (the node's control socket, the tcp listener, an actor's reply):
    a class of this module as itself; anything else as the actor runtime mirrors it
    (``RemoteError``, also a subclass of the built-in or runtime error it names, so
    ``except ValueError`` and ``except ActorError`` work as they do in the node). One
    function, so the class a user catches never depends on the transport."""
    cls = _BY_NAME.get(type_name)
    if cls is not None:
        try:
            return cls(message)
        except TypeError:
            pass  # a class built from more than a message: the mirror says as much
    return remote_error(type_name, message, remote_traceback)


def _warren_errors(module: types.ModuleType) -> dict[str, type[WarrenError]]:
    return {
        name: cls
        for name in module.__all__
        if isinstance(cls := getattr(module, name), type) and issubclass(cls, WarrenError)
    }


_BY_NAME = _warren_errors(sys.modules[__name__])

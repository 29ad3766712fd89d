"""Warren: a durable message broker you can embed, with RabbitMQ's persistence design, built
as Erlang-style actors in separate OS processes.

This is the ``warren`` package itself: the names most programs need, importable from the top
(``from warren import connect``). Nothing heavy is imported until a name is used (PEP 562).
The parts live beneath it, lowest floor first:

- ``warren.actors``: the actor runtime (process actors over ZeroMQ, refs, monitors);
- ``warren.store``: the shared message store, its actors and ``StoreClient``;
- ``warren.queues``: the queue engine, the broker's processes and the client (``connect``);
- ``warren.supervisor``: supervision trees, the broker ``Node``, the CLI, the chaos harness;
- ``warren.errors``: every error, all derived from ``WarrenError``.

The repository keeps one top-level folder per part; ``setup.py`` installs this folder as the
``warren`` package and each part beneath it, so Warren claims one top-level import name only.
"""

from typing import TYPE_CHECKING

from warren.actors.lazy import lazy_face

if TYPE_CHECKING:  # what the names are, for type checkers and editors
    from warren.errors import (
        AccessRefused,
        ActorDeadError,
        ActorError,
        AskTimeout,
        Blocked,
        CodecError,
        ConnectionClosed,
        CorruptMessage,
        CorruptRecord,
        DiskFull,
        FaultMissed,
        FrameTooLarge,
        InvalidBody,
        InvalidMessage,
        InvalidMessageId,
        InvalidSpec,
        KeyFileError,
        MailboxFull,
        MessageTooLarge,
        Nacked,
        NodeLocked,
        NodeNotRunning,
        NotFound,
        OutOfSequence,
        PreconditionFailed,
        QueueClosed,
        QueueDown,
        QueueError,
        QueueLocked,
        RemoteError,
        SpawnError,
        StoreClosed,
        StoreDirectoryError,
        StoreError,
        StoreLocked,
        StoreRestarted,
        StoreTimeout,
        StoreUnavailable,
        SupervisorError,
        UnhandledMessage,
        Unroutable,
        UsageError,
        WarrenError,
        WarrenWriteError,
        WritesBlocked,
    )
    from warren.queues.client import connect
    from warren.queues.client.connection import Connection
    from warren.queues.message import Message
    from warren.store.client import StoreClient
    from warren.supervisor.node.alarms import AlarmLimits
    from warren.supervisor.node.node import Node
    from warren.supervisor.version import __version__


_EXPORTS = {
    "__version__": "warren.supervisor.version",
    "AlarmLimits": "warren.supervisor.node.alarms",
    "Connection": "warren.queues.client.connection",
    "Message": "warren.queues.message",
    "Node": "warren.supervisor.node.node",
    "StoreClient": "warren.store.client",
    "connect": "warren.queues.client",
    "ActorDeadError": "warren.errors",
    "ActorError": "warren.errors",
    "AskTimeout": "warren.errors",
    "Blocked": "warren.errors",
    "CodecError": "warren.errors",
    "ConnectionClosed": "warren.errors",
    "CorruptMessage": "warren.errors",
    "CorruptRecord": "warren.errors",
    "DiskFull": "warren.errors",
    "FaultMissed": "warren.errors",
    "FrameTooLarge": "warren.errors",
    "InvalidBody": "warren.errors",
    "InvalidMessage": "warren.errors",
    "InvalidMessageId": "warren.errors",
    "InvalidSpec": "warren.errors",
    "KeyFileError": "warren.errors",
    "MailboxFull": "warren.errors",
    "MessageTooLarge": "warren.errors",
    "Nacked": "warren.errors",
    "NodeLocked": "warren.errors",
    "AccessRefused": "warren.errors",
    "NodeNotRunning": "warren.errors",
    "NotFound": "warren.errors",
    "OutOfSequence": "warren.errors",
    "PreconditionFailed": "warren.errors",
    "QueueClosed": "warren.errors",
    "QueueDown": "warren.errors",
    "QueueError": "warren.errors",
    "QueueLocked": "warren.errors",
    "RemoteError": "warren.errors",
    "SpawnError": "warren.errors",
    "StoreClosed": "warren.errors",
    "StoreDirectoryError": "warren.errors",
    "StoreError": "warren.errors",
    "StoreLocked": "warren.errors",
    "StoreRestarted": "warren.errors",
    "StoreTimeout": "warren.errors",
    "StoreUnavailable": "warren.errors",
    "SupervisorError": "warren.errors",
    "UnhandledMessage": "warren.errors",
    "Unroutable": "warren.errors",
    "UsageError": "warren.errors",
    "WarrenError": "warren.errors",
    "WarrenWriteError": "warren.errors",
    "WritesBlocked": "warren.errors",
}
__getattr__, __dir__ = lazy_face(__name__, _EXPORTS)
del lazy_face, TYPE_CHECKING
__all__ = sorted(_EXPORTS)

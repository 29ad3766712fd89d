"""Every exception the actor runtime raises to its callers, in one small hierarchy, and
``WarrenError``, the root of every error of every part of Warren.

The actor runtime is the ground floor, so the root lives here: ``warren.store.errors``,
``warren.queues.errors`` and ``warren.supervisor.errors`` derive their own roots from it, and
``warren.errors`` re-exports them all. ``ActorError`` is the runtime's root, so
``except ActorError`` catches anything the runtime itself raises. An exception raised by an
actor's own code while answering an ask comes back as a ``RemoteError``; for the common
built-in exception types and the runtime's own errors the class raised is also a subclass of
that class (``except ValueError`` works on a remote ``ValueError``, ``except ActorDeadError``
on a remote one), and the original type name, message and traceback text are kept on the
exception.
"""

from __future__ import annotations

import builtins


class WarrenError(Exception):
    """Base of every error Warren raises: ``except WarrenError`` catches them all."""


class ActorError(WarrenError):
    """Base of every error raised by the actor runtime."""


class ActorDeadError(ActorError):
    """The target actor is known to have stopped (or stopped before it could answer)."""


class NotDelivered(ActorDeadError):
    """An ask sent through a pinned ref reached a newer incarnation of its actor, which
    took nothing of it: the incarnation it named is gone and never had it, so the same
    request sent again (to the newer one) is applied once."""


class AskTimeout(ActorError, TimeoutError):
    """No reply arrived before the ask's deadline."""


class MailboxFull(ActorError):
    """The target's mailbox stayed full for the whole send timeout: the sender is pushed back."""


class FrameTooLarge(ActorError, ValueError):
    """An actor message is larger than the receiving mailbox accepts (``max_message_bytes``).
    (A queue message over the broker's limit is ``warren.queues.errors.MessageTooLarge``.)"""


class CodecError(ActorError, TypeError):
    """A message cannot be encoded (an unregistered type) or a frame cannot be decoded."""


class InvalidSpec(WarrenError, ValueError):
    """A spec is invalid: an argument of ``spawn`` or ``Node``, a child spec, a supervisor
    flag, an alarm limit or a node setting; the message names the field and the value.
    One class for every part, so one ``except InvalidSpec`` serves them all."""

    def __init__(self, field: str, value: object, reason: str) -> None:
        super().__init__(f"{field}={value!r}: {reason}")
        self.field = field
        self.value = value


class UnhandledMessage(ActorError, TypeError):
    """An actor does not handle this message: an unknown type, fields of the wrong shape,
    or a request sent as a tell that needs an answer. Raised by the actor's own code; the
    loop answers an ask with it and logs and counts a tell (``unhandled``), never crashing
    the actor for what a peer sent."""


class SpawnError(ActorError):
    """The actor process could not be started, or its ``on_start`` raised."""


class RemoteError(ActorError):
    """An exception raised by an actor's code while it handled an ask."""

    def __init__(self, type_name: str, message: str, remote_traceback: str = "") -> None:
        super().__init__(f"{type_name}: {message}")
        self.type_name = type_name
        self.message = message
        self.remote_traceback = remote_traceback


# Exceptions whose remote twin also derives from the local class, so callers keep their
# ordinary ``except`` clauses: common built-ins, and the runtime's own errors (an actor's
# ask to a third actor that timed out, say). Others (user classes) arrive as a plain
# RemoteError: the caller's process may not be able to import them, and a peer must never
# choose what we import.
_MIRRORED_BUILTINS = (
    "ArithmeticError",
    "AssertionError",
    "AttributeError",
    "Exception",
    "IndexError",
    "KeyError",
    "LookupError",
    "NotImplementedError",
    "OverflowError",
    "RuntimeError",
    "TypeError",
    "ValueError",
    "ZeroDivisionError",
)
_MIRRORED_OWN: dict[str, type[ActorError]] = {
    cls.__name__: cls
    for cls in (
        ActorDeadError,
        AskTimeout,
        CodecError,
        MailboxFull,
        FrameTooLarge,
        NotDelivered,
        SpawnError,
        UnhandledMessage,
    )
}
_mirrors: dict[str, type[RemoteError]] = {}


def remote_error(type_name: str, message: str, remote_traceback: str = "") -> RemoteError:
    """Build the exception a caller sees for an exception raised inside an actor."""
    mirror = _mirrors.get(type_name)
    if mirror is None:
        base = _MIRRORED_OWN.get(type_name)
        if base is None and type_name in _MIRRORED_BUILTINS:
            base = getattr(builtins, type_name)
        if base is not None:
            mirror = type(type_name, (RemoteError, base), {"__module__": __name__})
            _mirrors[type_name] = mirror
    return (mirror or RemoteError)(type_name, message, remote_traceback)

"""The messages the runtime itself delivers to actors and callers.

``Down``  — sent to every monitor of an actor incarnation when its process has exited
            (any exit: a stop, a crash, SIGKILL), or at once when the monitored incarnation
            was already dead. An actor that monitors receives it as an ordinary message in
            ``on_receive``; a monitor held by the node's own process resolves with it.
``Exit``  — sent to an actor linked to one that died abnormally. Unless the receiver's
            class sets ``trap_exits = True`` it stops with ``EXIT_LINKED``; if it traps
            exits, the ``Exit`` arrives as an ordinary message instead.
``Pong``  — the answer to a heartbeat on the control channel.

All are frozen dataclasses registered with the codec, so they travel like user messages.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .codec import register_message
from .exitcodes import describe

if TYPE_CHECKING:
    from .ref import ActorRef


@dataclass(frozen=True)
class _Ending:
    """How an actor incarnation's process ended: by exit code or by signal."""

    ref: ActorRef
    exitcode: int | None
    signal: int | None

    @property
    def reason(self) -> str:
        """``"normal"``, ``"crashed (exit 70)"``, ``"killed by SIGKILL"``, ``"no such process"``."""
        return describe(self.exitcode, self.signal)


@dataclass(frozen=True)
class Down(_Ending):
    """An actor incarnation's process has gone."""


@dataclass(frozen=True)
class Exit(_Ending):
    """A linked actor died abnormally (delivered only to actors with ``trap_exits = True``)."""


@dataclass(frozen=True)
class Pong:
    """A heartbeat answer: who answered, and how much it has received so far."""

    incarnation: int
    pid: int
    received: int


register_message(Down, "actors.Down")
register_message(Exit, "actors.Exit")
register_message(Pong, "actors.Pong")

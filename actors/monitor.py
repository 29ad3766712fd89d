"""``Monitor``: one watch on one actor incarnation, held by the node that spawned it.

``Node.monitor(ref)`` returns a ``Monitor``. When the incarnation's process exits — any
exit, SIGKILL included — the node's service thread learns it from the forkserver (which
reaps the child and reports its exit code or signal) and resolves every monitor of that
incarnation with a ``Down``. A monitor of an incarnation that is already dead, or that
this node never knew, resolves at once ("no such process", or the real reason when the
node remembers it).

What resolving does depends on ``notify``: nothing more (``None``; read it with ``wait``),
a callable (called on the node's service thread: keep it short and never block in it —
a supervisor should hand the ``Down`` to its own thread), or an ``ActorRef`` (the ``Down``
is sent on that actor's control channel and arrives in its ``on_receive``). Monitors held
by actor processes (``ProcessActor.monitor``) are of this last kind.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from .messages import Down

if TYPE_CHECKING:
    from .ref import ActorRef

logger = logging.getLogger("warren.actors")

Notify = Callable[[Down], None]


class Monitor:
    """A pending or resolved watch on ``target``; ``wait`` returns its ``Down``."""

    def __init__(
        self, target: ActorRef, notify: Notify | None, watcher: ActorRef | None = None
    ) -> None:
        self.target = target
        # The actor this monitor notifies, when it is held on an actor's behalf.
        self.watcher = watcher
        self._notify = notify
        self._event = threading.Event()
        self._down: Down | None = None
        self.cancelled = False

    @property
    def down(self) -> Down | None:
        """The ``Down`` once the target has exited, else ``None``."""
        return self._down

    def wait(self, timeout: float | None = None) -> Down | None:
        """Block until the target exits (``Down``) or ``timeout`` seconds pass (``None``)."""
        self._event.wait(timeout)
        return self._down

    def cancel(self) -> None:
        """Stop watching: ``notify`` will not be called (``wait`` then only times out)."""
        self.cancelled = True

    def resolve(self, down: Down) -> None:
        """Called once by the node when the target has exited."""
        if self._down is not None:
            return
        self._down = down
        self._event.set()
        if self._notify is not None and not self.cancelled:
            try:
                self._notify(down)
            except Exception:
                logger.exception("a monitor's notify of %s raised", self.target.name)

"""The supervisor package's errors: what building and running a tree can raise."""

from __future__ import annotations

from warren.actors.errors import InvalidSpec, WarrenError

__all__ = ["FaultMissed", "InvalidSpec", "NodeLocked", "SupervisorError", "UsageError"]


class SupervisorError(WarrenError):
    """Base of every error the supervisor package raises."""


class NodeLocked(SupervisorError):
    """Another node runs on this data directory."""


class NotANodeDirectory(SupervisorError, ValueError):
    """A data directory that holds files, none of them a node's: a node never writes
    into, or deletes from, a directory that is not its own."""


class UsageError(SupervisorError, ValueError):
    """A command line or config file the ``warren`` command cannot use; the message is the
    one line it prints before exiting with status 2."""


class FaultMissed(SupervisorError, RuntimeError):
    """A chaos fault could not land: its target was gone, or the node never came back."""

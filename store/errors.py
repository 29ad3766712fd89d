"""The store's error hierarchy: everything the public API raises on bad input or misuse.

Expected outcomes are values, not exceptions: reading an unknown id returns ``None``, a
write that was cancelled before it reached write(2) is reported as ignored by ``sync()``.
"""

from __future__ import annotations

from warren.actors.errors import WarrenError

__all__ = [
    "CorruptRecord",
    "DiskFull",
    "InvalidBody",
    "InvalidMessageId",
    "ReplicationRefused",
    "StoreClosed",
    "StoreDirectoryError",
    "StoreError",
    "StoreLocked",
    "StoreRestarted",
    "StoreTimeout",
    "StoreUnavailable",
    "WritesBlocked",
]


class StoreError(WarrenError):
    """Base class of every error the message store raises."""


class ReplicationRefused(StoreError, OSError):
    """A commit the cluster did not take (``warren.store.replicated_io``): the node
    leads no more, or its coordinator did not answer; what the sync covered is not
    confirmed. An ``OSError`` too: every writer takes it as it takes a failed fdatasync
    (nothing confirmed, the file not trusted)."""


class InvalidMessageId(StoreError, TypeError):
    """A msg_id that is not exactly 16 bytes."""


class InvalidBody(StoreError, TypeError):
    """A message body that is not bytes-like, or is too large to store."""


class StoreDirectoryError(StoreError, OSError):
    """The store directory is a file, cannot be created, or is not writable."""


class StoreLocked(StoreError):
    """Another MessageStore (in this or another process) has the directory open."""


class StoreClosed(StoreError):
    """The store was closed; open a new MessageStore on the directory."""


class StoreTimeout(StoreError, TimeoutError):
    """A store client's call got no answer within its ``call_timeout_s``: the store is
    alive but silent (stopped, or stuck in a long recovery). Nothing was lost; a read or
    contains may simply be asked again."""


class DiskFull(StoreError):
    """Writes that did not fit on a full disk: ``msg_ids`` hold no reference in the store.
    Everything else is unaffected; writing resumes by itself once space is freed, so the
    caller may send these again later."""

    def __init__(self, msg_ids: list[bytes]) -> None:
        super().__init__(
            f"the disk is full: {len(msg_ids)} writes were not stored; free "
            f"disk space (writes resume by themselves) and send them again"
        )
        self.msg_ids = msg_ids


class WritesBlocked(StoreTimeout):
    """The node's disk alarm held this client's writes for longer than its
    ``call_timeout_s``; nothing was sent. Free disk space; the alarm then clears."""


class StoreRestarted(StoreError):
    """The store restarted: ``in_doubt`` writes may not be on disk (send them again), and
    ``removes_in_doubt`` removes may not have been applied."""

    def __init__(self, in_doubt: list[bytes], removes_in_doubt: list[bytes]) -> None:
        super().__init__(
            f"the store restarted; {len(in_doubt)} writes and "
            f"{len(removes_in_doubt)} removes are in doubt"
        )
        self.in_doubt = in_doubt
        self.removes_in_doubt = removes_in_doubt


class StoreUnavailable(StoreRestarted):
    """The store has not answered for ``unavailable_after_s``; the same writes and removes
    are in doubt."""


class CorruptRecord(StoreError):
    """A record the index points at does not validate; the combine must be abandoned."""

"""The store's error hierarchy: everything the public API raises on bad input or misuse.

Expected outcomes are values, not exceptions: reading an unknown id returns ``None``, a
write that was cancelled before it reached write(2) is reported as ignored by ``sync()``.
"""

from __future__ import annotations

__all__ = [
    "InvalidBody",
    "InvalidMessageId",
    "StoreClosed",
    "StoreDirectoryError",
    "StoreError",
    "StoreLocked",
    "StoreTimeout",
]


class StoreError(Exception):
    """Base class of every error the message store raises."""


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

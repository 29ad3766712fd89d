"""The shared message store: ``.rdq`` files, index, file summary, scanner, GC, recovery.

``MessageStore`` is the in-process engine (see ``warren.store.engine.message_store`` for
the design); the store actors of a node wrap it, and ``LocalStoreClient`` gives it the
calls of the actors' ``StoreClient``. ``rewrite_combine`` is the GC's copy step, which runs
in whatever process the caller chooses.
"""

from typing import TYPE_CHECKING

from warren.actors.lazy import lazy_face

if TYPE_CHECKING:  # what the names are, for type checkers and editors
    from .engine.index import Location
    from .engine.message_store import MessageStore, Settlement, SyncResult
    from .engine.rewrite import CombinePlan, RewriteResult, rewrite_combine
    from .engine.scanner import ScanResult, scan_buffer, scan_file
    from .errors import (
        CorruptRecord,
        DiskFull,
        InvalidBody,
        InvalidMessageId,
        StoreClosed,
        StoreDirectoryError,
        StoreError,
        StoreLocked,
        StoreRestarted,
        StoreTimeout,
        StoreUnavailable,
        WritesBlocked,
    )
    from .local_client import LocalStoreClient


_EXPORTS = {
    "CombinePlan": ".engine.rewrite",
    "CorruptRecord": ".errors",
    "DiskFull": ".errors",
    "InvalidBody": ".errors",
    "InvalidMessageId": ".errors",
    "LocalStoreClient": ".local_client",
    "Location": ".engine.index",
    "MessageStore": ".engine.message_store",
    "rewrite_combine": ".engine.rewrite",
    "RewriteResult": ".engine.rewrite",
    "scan_buffer": ".engine.scanner",
    "scan_file": ".engine.scanner",
    "ScanResult": ".engine.scanner",
    "Settlement": ".engine.message_store",
    "StoreClosed": ".errors",
    "StoreDirectoryError": ".errors",
    "StoreError": ".errors",
    "StoreLocked": ".errors",
    "StoreRestarted": ".errors",
    "StoreTimeout": ".errors",
    "StoreUnavailable": ".errors",
    "SyncResult": ".engine.message_store",
    "WritesBlocked": ".errors",
}
__getattr__, __dir__ = lazy_face(__name__, _EXPORTS)
del lazy_face, TYPE_CHECKING
__all__ = sorted(_EXPORTS)

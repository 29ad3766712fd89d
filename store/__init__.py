"""The shared message store: ``.rdq`` files, index, file summary, scanner, GC, recovery.

``MessageStore`` is the in-process engine (see ``warren.store.engine.message_store`` for the design);
the store actors of a node wrap it, and ``LocalStoreClient`` gives it the calls of the
actors' ``StoreClient``. ``rewrite_combine`` is the GC's copy step, which runs
in whatever process the caller chooses.
"""

from .engine.index import Location
from .engine.message_store import MessageStore, Settlement, SyncResult
from .engine.rewrite import CombinePlan, CorruptRecord, RewriteResult, rewrite_combine
from .engine.scanner import ScanResult, scan_buffer, scan_file
from .errors import (
    DiskFull,
    InvalidBody,
    InvalidMessageId,
    StoreClosed,
    StoreDirectoryError,
    StoreError,
    StoreLocked,
    StoreTimeout,
    WritesBlocked,
)
from .local_client import LocalStoreClient

__all__ = [
    "CombinePlan",
    "CorruptRecord",
    "DiskFull",
    "InvalidBody",
    "InvalidMessageId",
    "LocalStoreClient",
    "Location",
    "MessageStore",
    "RewriteResult",
    "ScanResult",
    "Settlement",
    "StoreClosed",
    "StoreDirectoryError",
    "StoreError",
    "StoreLocked",
    "StoreTimeout",
    "SyncResult",
    "WritesBlocked",
    "rewrite_combine",
    "scan_buffer",
    "scan_file",
]

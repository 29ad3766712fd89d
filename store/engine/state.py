"""The state ``MessageStore`` shares with the parts it is built from.

``MessageStore`` (``warren.store.engine.message_store``) is one object spread over
``Recovery``, ``FileChanges``, ``Combining`` and ``Compacting``, each in its own module,
and every part reads and changes the same state: ``MessageStore.__init__`` assigns it (``_removals``
is assigned by recovery, before anything uses it). ``_StoreState``, their common base,
declares that state once, so every part is checked against the same types. It holds
annotations only: it assigns nothing and defines nothing at run time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import mmap
    from collections.abc import Callable, Hashable
    from typing import TypeVar, TypeVarTuple

    from .compacting import CompactionStaging
    from .gc import Staging
    from .holders import Holders
    from .lock_table import LockTableOwner
    from .removal_log import RemovalLog
    from .rewrite import CombinePlan, RewriteResult
    from .summary import FileSummary

    _T = TypeVar("_T")
    _Ts = TypeVarTuple("_Ts")


class _StoreState:
    """What ``MessageStore``, ``Recovery``, ``FileChanges``, ``Combining`` and
    ``Compacting`` share."""

    # Settings, fixed at open.
    directory: str  # the store directory (os.fspath of the argument)
    file_size_limit: int  # a file rolls over once its write offset reaches this
    garbage_fraction: float  # combine when garbage exceeds this share of the bytes on disk
    _fsync: bool  # policy "fsync": fdatasync at sync and rollover, not only hand data over
    counters: dict[str, int]  # event counts reported by stats()

    # The index and the file summary.
    _index: dict[int, int]  # msg_id as int -> packed Location (warren.store.engine.index)
    _summary: dict[int, FileSummary]  # data file number -> its summary
    _clients: set[bytes]  # client refs the next clean marker names
    _holders: Holders  # who holds each reference added since the store started
    _damaged: list[dict[str, int]]  # regions a dirty recovery skipped: file, offset, length

    # Writes not yet handed to write(2), keyed like the index, in arrival order.
    _pending: dict[int, bytes]  # key -> encoded record
    _pending_tickets: dict[int, Hashable]  # key -> ticket of the write that created it
    _pending_fan_out: dict[int, list[Hashable]]  # key -> tickets of later writes while pending
    _pending_bytes: int  # total size of the pending records

    # Tickets settled by the next sync.
    _unsynced_tickets: list[Hashable]  # written or counted, awaiting the fsync
    _failed_tickets: list[Hashable]  # refused by a full disk, their references dropped
    disk_full: bool  # the last write(2) found no space

    # The files.
    _dir_fd: int  # the open store directory
    _current_file: int  # number of the file written to
    _current_fd: int  # its fd (-1 before recovery opens it)
    _write_offset: int  # bytes of the current file handed to the kernel
    _data_unsynced: bool  # the current file has data not yet fdatasync'd
    _directory_unsynced: bool  # a file was created, renamed or deleted since the last fsync
    _unsynced_files: set[int]  # files rolled over and never fdatasync'd (policy "flush")
    _maps: dict[int, mmap.mmap]  # non-current file -> its read-only mapping
    _removals: RemovalLog  # the removal logs beside the data files
    _lock_table: LockTableOwner | None  # the file-lock table for readers (shared_readers)
    _deferred_deletes: set[int]  # empty files a reader held: locked, deleted at a later sync

    # GC (warren.store.engine.gc).
    _combine: CombinePlan | None  # the plan staged and ready to copy
    _staging: Staging | None  # the combine in progress
    _moves: dict[int, int] | None  # its staged index values (_staging.moves), None without one
    _deferred_apply: tuple[CombinePlan, RewriteResult] | None  # a switch readers held off
    _uncombinable: set[int]  # files a GC job found damaged: never combined or compacted again
    gc: str  # "compact" (one file at a time, in place) or "combine" (two neighbours)
    _compaction: CompactionStaging | None  # the compaction in progress
    _not_worth_compacting: dict[int, int]  # file -> its valid bytes when a plan reclaimed nothing
    _removes_seen: dict[int, tuple[int, float]]  # file -> (its removes, since when), for quiet_s

    # Stopping.
    _broken: BaseException | None  # what broke the store, None while it is sound
    _closed: bool  # every fd released; the store serves nothing more

    if TYPE_CHECKING:
        # Steps one part calls that another defines (message_store, file_changes).
        def _check_usable(self) -> None: ...
        def _release(self) -> None: ...
        def _guarded(self, operation: Callable[[*_Ts], _T], *args: *_Ts) -> _T: ...
        def _delete_empty_file(self, file: int, wait_s: float = ...) -> None: ...
        def _unlink_file(self, file: int) -> None: ...
        def _unmap(self, file: int) -> None: ...
        def _held_by_readers(self, file: int) -> bool: ...

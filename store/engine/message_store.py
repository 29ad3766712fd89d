"""The shared message store engine: RabbitMQ's msg_store as a plain in-process object.

Design
======

Components. Messages live in append-only data files ``0.rdq``, ``1.rdq`` ... in the store
directory (lower numbers are older). The *index* maps each msg_id with references to
(ref_count, file, offset, total_size), packed in one int (``warren.store.engine.index``).
The *file summary* holds, per file, its valid bytes, its size, its left and right
neighbours and whether a GC job has it locked (``warren.store.engine.summary``). The
*pending map* holds records not yet handed to write(2), in arrival order. One object owns
all of it and is not thread-safe: the store actor of a node wraps it and is its only
caller.

Record format (``warren.store.engine.records``)::

    size:u64 BE (= 16 + len(body)) | msg_id:16 | body | 0xFF      total = len(body) + 25

Writes and the write buffer. ``write`` of an id without references creates a pending
record; the pending records are handed to write(2) together once they reach the 1 MiB
buffer size, at ``sync()``, and at ``close()``. Offsets are assigned then, so a pending
record whose count returns to 0 before that (a write and a remove that cancel out:
RabbitMQ's "flying" optimisation) is never written at all, and the writes that asked for
it are reported as *ignored*. A write of an id that has references only increments its
count and writes nothing (the body argument is not compared: one id names one body while
its count is above 0). A remove that drops the count to 0 deletes the index entry; the
next write of that id appends a fresh record, possibly with another body. There is no
resurrection of dead records.

Rollover. A file rolls over once its write offset reaches ``file_size_limit``: its data
is fdatasync'd (policy "fsync"), it is closed, and ``N+1.rdq`` becomes current. A file may
exceed the limit by one record. The current file is never deleted or combined.

Confirms and durability. Each write is identified by a *ticket* (the caller's, e.g.
``(client_ref, seq)``, or a counter). ``sync()`` flushes the buffer, fdatasyncs the current
file and, when a file was created, renamed or deleted since the last sync, the directory;
then it returns every ticket that is now on disk and every ticket that was ignored. With
``sync_policy="flush"`` it only hands the data to the kernel (RabbitMQ 3.13+ behaviour).
An fsync or write error breaks the store: it refuses every later call and writes no
clean-shutdown files, so the next open recovers dirty. A failed fsync is never retried
(the kernel may have dropped the dirty pages it could not write).

Deletion and GC. A non-current file whose valid bytes reach 0 is deleted at once. When
garbage exceeds ``garbage_fraction`` of all bytes on disk and there are at least 3 files,
two logically adjacent non-current files whose valid data fits in one file are combined
into the older one, as copy then switch (``warren.store.engine.rewrite``)::

    files:  [ 3: valid 40% ] [ 5: valid 30% ] [ 8: valid 90% ] [ 9: current ]
                  Dst    <--     Src
    after:  [ 3: valid 70% ]                  [ 8: valid 90% ] [ 9: current ]

``plan_combine`` (or, in slices, ``choose_combine``, ``stage_combine``,
``finish_staging``: ``warren.store.engine.gc``) → ``rewrite_combine`` (may run in another
process while this object serves) → ``apply_combine``, a switch of index and files in one
step, or ``abandon_combine`` when the rewrite failed or its process died.
``collect_garbage`` runs the steps in-process until nothing qualifies; with
``auto_gc=True`` (the default) ``sync()`` does so whenever the trigger holds.

Recovery. A clean ``close()`` writes the index, the file summary and a clean marker naming
the registered clients (``warren.store.engine.snapshot``). An open that finds all three
intact, agreeing with the files on disk, and naming the same clients as ``clean_clients``
(when given) loads them; the files are deleted before anything is served, so a crash after
this open is a dirty start next time. Any other start is dirty: every ``.rdq`` file is
scanned (``warren.store.engine.scanner``), the last complete copy of each id (highest
file, then offset) is kept, and the current file is truncated after its last complete
record (a torn tail from the crash). Reference counts come from ``ref_counts``, an
iterable of (msg_id, count) pairs (a node passes a walker over its queue indexes); ids it
names whose data is missing are dropped and counted; records it does not name are garbage.
Without it every message found counts once, except the records the removal log names
(``warren.store.engine.removal_log``): every remove that took a record in a file to zero
references, written with the group commit, so an acknowledged message never comes back.
Without a source, a recovered count of one is a guess the store cannot check, and a client
re-sending the writes it was told are in doubt would add a second reference to a write
that had reached the disk; so after such a start the first write of each recovered id
*adopts* the record (reported durable, no I/O, no extra reference), until a remove or a
clean close. (After a clean stop counts are exact, and what is in doubt was never applied:
a clean stop answers every batch it applied.) Stray ``.rdt`` files left by a combine that
did not finish are deleted at every start; anything named like a data file that is not a
regular file is ignored.

Readers in other processes. With ``shared_readers=True`` the store keeps the shared
file-lock table (``warren.store.engine.lock_table``): it publishes the current file and its flushed
offset after every write(2), and takes a file's slot exclusively around each rename and
delete. Readers holding a slot past a short deadline make the store defer: a combine's
apply returns False (``collect_garbage`` retries it on its next call), an empty file is
kept, locked, and deleted at a later sync. Retries take the slots only if they are free
at that moment, so a stopped reader costs a sync no wait at all.

Interruptions. Every multi-step change of the index and the files (a write, a remove, a
flush and its rollovers, a file deletion, a combine's apply and switch, an abandon) runs
as a whole or breaks the store: an exception escaping from the middle of one (an OS error,
a KeyboardInterrupt in an embedding program, a bug) marks the store broken, so every later
call raises StoreClosed and ``close()`` writes no clean-shutdown files; the next open
recovers dirty from the files, which never lose a synced record. A clean snapshot thus
only ever describes the files as they are.

Modules. This one holds the public API, the state's initial values and closing;
``warren.store.engine.state`` declares the state all the parts share,
``warren.store.engine.recovery`` holds opening and recovery,
``warren.store.engine.file_changes`` the multi-step changes of the files (the write path,
rollover, sync, deletion, and the guard that breaks the store when one is interrupted),
``warren.store.engine.gc`` the store's side of GC, ``warren.store.engine.holders`` which
client holds each reference (``claim``: a client restarted after a crash takes back the
references its predecessor held, and no other client's).

Races this module guards against (within its one thread of control):

- a write and a remove of the same id while the record is pending: the record is dropped
  before write(2) and every ticket that asked for it is reported ignored, exactly once;
- a remove, or a remove and a new write of the same id, while a combine copies its
  record: apply moves an entry only if it still points at the copied place;
- a file that empties while a combine holds it: not deleted then; apply or abandon does;
- a crash at any step of a combine: see ``warren.store.engine.rewrite``; nothing live is lost;
- a second store on the same directory, in this or another process: refused with
  StoreLocked (an exclusive flock on ``.lock``, released by the kernel on death).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import replicated_io
from ..errors import CorruptRecord, StoreClosed, StoreError
from . import index as idx
from . import removal_log, snapshot
from .compacting import Compacting
from .file_changes import DISK_FULL_ERRNOS, FileChanges
from .gc import Combining
from .holders import Holders
from .lock_table import RESERVE_FILE, TABLE_FILE, LockTableOwner
from .records import (
    FILE_SUFFIX,
    HEADER,
    HEADER_BYTES,
    MAX_BODY_BYTES,
    MSG_ID_BYTES,
    OK_MARKER,
    RECORD_OVERHEAD,
    TEMP_SUFFIX,
    check_body,
    check_msg_id,
    data_file_name,
    data_file_number,
)
from .recovery import LOCK_FILE, Recovery
from .summary import FileSummary

log = logging.getLogger("warren.store")

# Hot-path copies of the index layout (module globals are one lookup, attributes two).
_FILE_SHIFT, _PENDING_FILE = idx.FILE_SHIFT, idx.PENDING_FILE
_SIZE_SHIFT, _SIZE_MASK = idx.SIZE_SHIFT, idx.SIZE_MASK
_OFFSET_SHIFT, _OFFSET_MASK = idx.OFFSET_SHIFT, idx.OFFSET_MASK
_LOCATION_CLEAR = idx.LOCATION_CLEAR
_ADOPTABLE = idx.ADOPTABLE
_PENDING_ONE_REF = (idx.PENDING_FILE << idx.FILE_SHIFT) | 1
_pack_header = HEADER.pack
_key = int.from_bytes  # a 16-byte id as an int: 48 bytes of memory, not 64

FILE_SIZE_LIMIT_BYTES = 16 * 2**20  # msg_store_file_size_limit
WRITE_BUFFER_BYTES = 2**20  # the append buffer handed to write(2) at once
GARBAGE_FRACTION = 0.5  # combine when garbage exceeds this share of disk
SYNC_POLICIES = ("fsync", "flush")
GC_MODES = ("compact", "combine")
DEFAULT_GC = "compact"


@dataclass(frozen=True)
class SyncResult:
    """What one ``sync()`` settled: tickets now on disk, tickets never written (removed
    again first), and tickets that failed because the disk is full (their references
    dropped as if never written). Each ticket is reported once, in one list."""

    durable: list[Hashable] = field(default_factory=list)
    ignored: list[Hashable] = field(default_factory=list)
    failed: list[Hashable] = field(default_factory=list)


@dataclass(frozen=True)
class Settlement:
    """What a store client's ``settled()`` reports: every write whose sequence number is
    below ``up_to`` is settled (on disk, or never written because it was removed first),
    except ``failed`` ones (refused by a full disk; they hold no reference). Each failed
    sequence number is reported once."""

    up_to: int
    failed: list[int] = field(default_factory=list)


class MessageStore(Recovery, FileChanges, Combining, Compacting):
    """A message store directory, opened and recovered. See the module docstring.

    ``MessageStore(directory, file_size_limit=16 MiB, sync_policy="fsync", ref_counts=None,
    clean_clients=None, garbage_fraction=0.5, gc="compact", auto_gc=True,
    shared_readers=False, write_buffer_bytes=1 MiB)``; a context manager whose exit is
    ``close()``, a clean stop.
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        file_size_limit: int = FILE_SIZE_LIMIT_BYTES,
        sync_policy: str = "fsync",
        ref_counts: Iterable[tuple[bytes, int]] | None = None,
        clean_clients: Iterable[bytes] | None = None,
        garbage_fraction: float = GARBAGE_FRACTION,
        gc: str = DEFAULT_GC,
        auto_gc: bool = True,
        shared_readers: bool = False,
        write_buffer_bytes: int = WRITE_BUFFER_BYTES,
    ) -> None:
        if sync_policy not in SYNC_POLICIES:
            raise ValueError(f"sync_policy must be one of {SYNC_POLICIES}, got {sync_policy!r}")
        if not isinstance(file_size_limit, int) or not 0 < file_size_limit <= idx.MAX_OFFSET:
            raise ValueError(
                f"file_size_limit must be an int in 1..{idx.MAX_OFFSET}, got {file_size_limit!r}"
            )
        if gc not in GC_MODES:
            raise ValueError(f"gc must be one of {GC_MODES}, got {gc!r}")
        if not 0 < garbage_fraction < 1:
            raise ValueError(f"garbage_fraction must be between 0 and 1, got {garbage_fraction!r}")
        self.directory = os.fspath(directory)
        self.file_size_limit = file_size_limit
        self.sync_policy = sync_policy
        self.garbage_fraction = garbage_fraction
        self.gc = gc
        self.auto_gc = auto_gc
        self._write_buffer_bytes = write_buffer_bytes
        self._fsync = sync_policy == "fsync"

        # The state every part of the store shares is declared in _StoreState (state.py).
        self._index = {}
        self._summary = {}
        self._pending = {}
        self._pending_tickets = {}
        self._pending_fan_out = {}
        self._pending_bytes = 0
        self._unsynced_tickets = []
        self._ignored_tickets: list[Hashable] = []  # removed again before write(2)
        self._failed_tickets = []
        self.disk_full = False
        self.writes_blocked = False  # clients asked to hold their writes
        self._next_ticket = 0
        self._current_file = 0
        self._current_fd = -1
        self._write_offset = 0
        self._data_unsynced = False
        self._directory_unsynced = False
        self._maps = {}
        self._combine = None
        self._staging = None
        self._moves = None
        self._deferred_apply = None
        self._deferred_deletes = set()
        self._uncombinable = set()
        self._compaction = None
        self._not_worth_compacting = {}
        self._removes_seen = {}
        self._unsynced_files = set()
        self._lock_table = None
        self._clients = set()
        self._holders = Holders()
        self.start_token = os.urandom(8).hex()  # tells this start from the next
        self._damaged = []
        self._broken = None
        self._closed = False
        self._reads = 0  # plain ints: the hot paths count
        self._writes = 0
        self.counters = {
            "removes": 0,
            "removes_unknown": 0,
            "removes_not_held": 0,
            "writes_ignored": 0,
            "writes_adopted": 0,
            "gc_runs": 0,
            "gc_compactions": 0,
            "gc_bytes_moved": 0,
            "gc_bytes_reclaimed": 0,
            "files_deleted": 0,
            "recovery_removed": 0,
            "writes_failed_disk_full": 0,
            "syncs": 0,
        }

        self._dir_fd, self._lock_fd = self._open_directory()
        try:
            self.recovered_clean = self._recover(ref_counts, clean_clients)
            if shared_readers:
                self._lock_table = LockTableOwner(self._dir_fd)
                self._lock_table.publish(self._current_file, self._write_offset)
        except BaseException:
            self._release()
            raise

    # ---------------------------------------------------------------- public API

    def write(
        self, msg_id: bytes, body: bytes, ticket: Hashable = None, holder: bytes | None = None
    ) -> Hashable:
        """Add one reference to ``msg_id``, storing ``body`` if the id has none.

        Returns the write's ticket (``ticket``, or a fresh int), which a later ``sync()``
        reports as durable or ignored exactly once. ``holder`` (a client ref) is who holds
        the reference, for ``claim`` (``warren.store.engine.holders``).
        """
        if type(msg_id) is not bytes or len(msg_id) != MSG_ID_BYTES:
            msg_id = check_msg_id(msg_id)
        if type(body) is not bytes or len(body) > MAX_BODY_BYTES:
            body = check_body(body)
        return self._write(msg_id, body, None, ticket, holder)

    def write_record(
        self, msg_id: bytes, record: bytes, ticket: Hashable, holder: bytes | None = None
    ) -> Hashable:
        """``write`` for a caller that holds the record already encoded (``size · msg_id ·
        body · 0xFF``, checked by the caller: the store actor's batches arrive so): no
        re-encoding, one copy less of every body."""
        if len(record) - RECORD_OVERHEAD > MAX_BODY_BYTES:
            check_body(record[HEADER_BYTES:-1])
        return self._write(msg_id, None, record, ticket, holder)

    def _write(
        self,
        msg_id: bytes,
        body: bytes | None,
        record: bytes | None,
        ticket: Hashable,
        holder: bytes | None,
    ) -> Hashable:
        if self._closed:
            self._check_usable()
        if ticket is None:
            ticket = self._next_ticket
            self._next_ticket += 1
        self._writes += 1
        key = _key(msg_id)
        index = self._index
        value = index.get(key)
        if value is not None and value & idx.REF_MASK == idx.MAX_REF_COUNT:
            raise StoreError(f"{msg_id.hex()} already has {idx.MAX_REF_COUNT} references")
        try:
            if value is None:
                # The record's bytes do not depend on where it lands: encode it now, once.
                if record is None:
                    assert body is not None  # write() passes a body, write_record() a record
                    record = _pack_header(len(body) + 16, msg_id) + body + b"\xff"
                size = len(record)
                index[key] = _PENDING_ONE_REF | (size << _SIZE_SHIFT)
                self._pending[key] = record
                self._pending_tickets[key] = ticket
                if holder is not None:
                    self._holders.table[key] = self._holders.number(holder)  # its first
                pending = self._pending_bytes = self._pending_bytes + size
                if pending >= self._write_buffer_bytes:
                    self._flush()
                return ticket
            if value & _ADOPTABLE:  # the re-send of a recovered write
                index[key] = value ^ _ADOPTABLE
                if self._moves is not None and key in self._moves:
                    self._moves[key] ^= _ADOPTABLE
                self.counters["writes_adopted"] += 1
                if holder is not None:
                    holders = self._holders
                    holders.adopted(key, holders.number(holder), value & idx.REF_MASK)
                self._unsynced_tickets.append(ticket)
                return ticket
            index[key] = value + 1
            if holder is not None:
                self._holders.added(key, self._holders.number(holder))
            if self._moves is not None and key in self._moves:
                self._moves[key] += 1  # a combine staged it: keep up
            if value >> _FILE_SHIFT == _PENDING_FILE:
                self._pending_fan_out.setdefault(key, []).append(ticket)
            else:
                self._unsynced_tickets.append(ticket)
            return ticket
        except BaseException as exc:
            self._break("write", exc)
            raise

    def remove(self, msg_id: bytes, holder: bytes | None = None) -> bool:
        """Drop one reference to ``msg_id``: one of ``holder``'s, when it names one, or
        one recovered at the store's start; False (and nothing changes) if it has none,
        or none ``holder`` may take (``warren.store.engine.holders``)."""
        key = _key(check_msg_id(msg_id))
        self._check_usable()
        value = self._index.get(key)
        if value is None:
            self.counters["removes_unknown"] += 1
            return False
        holders = self._holders
        number = None if holder is None else holders.number(holder)
        if not holders.take(key, number, value & idx.REF_MASK):
            self.counters["removes_not_held"] += 1
            return False
        self.counters["removes"] += 1
        try:
            moves = self._moves
            if value & idx.REF_MASK > 1:
                self._index[key] = value - 1
                if moves is not None and key in moves:
                    moves[key] -= 1  # a combine staged it: keep up
                return True
            del self._index[key]
            file = value >> idx.FILE_SHIFT
            total = (value >> idx.SIZE_SHIFT) & idx.SIZE_MASK
            if moves is not None and moves.pop(key, None) is not None:
                staging = self._staging
                assert staging is not None  # _moves is its moves
                staging.valid_bytes[file] -= total
            if file == idx.PENDING_FILE:
                del self._pending[key]
                self._pending_bytes -= total
                tickets = [self._pending_tickets.pop(key), *self._pending_fan_out.pop(key, ())]
                self._ignored_tickets += tickets
                self.counters["writes_ignored"] += len(tickets)
                return True
            self._removals.note(file, (value >> _OFFSET_SHIFT) & _OFFSET_MASK, msg_id)
            summary = self._summary[file]
            summary.valid_total_size -= total
            summary.removes += 1
            if summary.valid_total_size == 0 and file != self._current_file and not summary.locked:
                self._delete_empty_file(file)
            return True
        except BaseException as exc:
            self._break("remove", exc)
            raise

    def read(self, msg_id: bytes) -> bytes | None:
        """The body of ``msg_id``, or None if it has no references. Sees pending writes."""
        if type(msg_id) is not bytes or len(msg_id) != MSG_ID_BYTES:
            msg_id = check_msg_id(msg_id)
        if self._closed:
            self._check_usable()
        key = _key(msg_id)
        value = self._index.get(key)
        if value is None:
            return None
        self._reads += 1
        file = value >> _FILE_SHIFT
        if file == _PENDING_FILE:
            return self._pending[key][HEADER_BYTES:-1]
        total = (value >> _SIZE_SHIFT) & _SIZE_MASK
        offset = (value >> _OFFSET_SHIFT) & _OFFSET_MASK
        mapped = self._maps.get(file)
        if mapped is not None:
            record = mapped[offset : offset + total]
        elif file == self._current_file:
            record = os.pread(self._current_fd, total, offset)
        else:
            record = self._map_file(file)[offset : offset + total]
        # A wrong place or a short read never passes for data: the whole record must be
        # there, end in 0xFF and carry this id (checking the size field too would cost a
        # third of a read, and a record with this id at this offset is this record).
        if len(record) != total or record[-1] != OK_MARKER or record[8:HEADER_BYTES] != msg_id:
            raise CorruptRecord(
                f"{data_file_name(file)} has no valid record of "
                f"{msg_id.hex()} at {idx.unpack(value)}"
            )
        return record[HEADER_BYTES:-1]

    def contains(self, msg_id: bytes) -> bool:
        """True while ``msg_id`` has references."""
        key = _key(check_msg_id(msg_id))
        self._check_usable()
        return key in self._index

    def claim(
        self,
        msg_ids: Iterable[bytes],
        holder: bytes,
        predecessors: Sequence[bytes],
        written_since: str | None = None,
    ) -> list[bool]:
        """For each id, whether ``holder`` now holds a reference to it: one it held, one
        of ``predecessors`` held (now its), or, unless the entries naming these ids were
        written since this store started (``written_since`` is its ``start_token``), one
        the store recovered at its start that no client has claimed
        (``warren.store.engine.holders``). An id named n times wants n references. A
        client restarted after a crash asks it for the entries its index names, before it
        writes or removes anything; asked again, it answers the same."""
        recovered = written_since != self.start_token
        self._check_usable()
        self._guarded(self._flush)  # a pending write that then fails holds nothing
        index, holders = self._index, self._holders
        number = holders.number(holder)
        numbers = [holders.number(p) for p in predecessors]
        answers: list[bool] = []
        claimed: dict[int, int] = {}
        for msg_id in msg_ids:
            key = _key(check_msg_id(msg_id))
            value = index.get(key)
            nth = claimed.get(key, 0) + 1
            held = value is not None and holders.claim(
                key, number, numbers, value & idx.REF_MASK, nth, recovered
            )
            if value is not None and held:
                claimed[key] = nth
                if value & _ADOPTABLE:  # claimed: a later write is a reference more
                    index[key] = value ^ _ADOPTABLE
                    if self._moves is not None and key in self._moves:
                        self._moves[key] ^= _ADOPTABLE
            answers.append(held)
        return answers

    def places(self, msg_ids: Iterable[bytes]) -> list[tuple[int, int, int] | None]:
        """(file, offset, total_size) of each id's record, None for an id without
        references or not yet written: ``location`` for many ids at once, unchecked (the
        store actor's hot path: the ids are those its writes just made durable)."""
        index, pending = self._index, _PENDING_FILE
        places: list[tuple[int, int, int] | None] = []
        for msg_id in msg_ids:
            value = index.get(_key(msg_id))
            if value is None or value >> _FILE_SHIFT == pending:
                places.append(None)
            else:
                places.append(
                    (
                        value >> _FILE_SHIFT,
                        (value >> _OFFSET_SHIFT) & _OFFSET_MASK,
                        (value >> _SIZE_SHIFT) & _SIZE_MASK,
                    )
                )
        return places

    def location(self, msg_id: bytes) -> idx.Location | None:
        """Where ``msg_id``'s record is (``pending`` until flushed), or None."""
        key = _key(check_msg_id(msg_id))
        self._check_usable()
        value = self._index.get(key)
        return None if value is None else idx.unpack(value)

    def sync(self) -> SyncResult:
        """Group commit: flush the buffer, fdatasync, report durable and ignored tickets."""
        self._check_usable()
        self._guarded(self._sync_to_disk)
        result = SyncResult(self._unsynced_tickets, self._ignored_tickets, self._failed_tickets)
        self._unsynced_tickets, self._ignored_tickets, self._failed_tickets = [], [], []
        # What follows must not lose ``result``: those writes are on disk whatever happens.
        try:
            for file in sorted(self._deferred_deletes):
                self._deferred_deletes.discard(file)
                self._summary[file].locked = False
                self._guarded(self._delete_empty_file, file, 0.0)
            if self.auto_gc:
                self.collect_garbage()
        except (OSError, CorruptRecord) as exc:
            log.error("%s: garbage collection failed: %s", self.directory, exc)
        return result

    def collect_garbage(self) -> int:
        """Run the store's GC in-process until nothing qualifies (``compact_garbage`` or
        ``combine_garbage``, as ``gc`` says); the number of files compacted or pairs
        combined."""
        if self.gc == "compact":
            return self.compact_garbage()
        return self.combine_garbage()

    def block_writes(self, blocked: bool) -> None:
        """Ask the clients that read through the lock table (``shared_readers``) to hold
        their writes while ``blocked`` (the node's disk alarm); nothing without it."""
        self.writes_blocked = blocked
        if self._lock_table is not None:
            self._lock_table.block_writes(blocked)

    def register_client(self, client_ref: bytes) -> None:
        """Name a client in the next clean marker (a queue's persistent_ref)."""
        if not isinstance(client_ref, bytes) or not 0 < len(client_ref) < 2**16:
            raise ValueError(f"client_ref must be 1..65535 bytes, got {client_ref!r}")
        self._clients.add(client_ref)

    def unregister_client(self, client_ref: bytes) -> None:
        self._clients.discard(client_ref)

    @property
    def clients(self) -> frozenset[bytes]:
        return frozenset(self._clients)

    @property
    def writes(self) -> int:
        """Writes made since this store opened (``stats()["writes"]``, without the rest)."""
        return self._writes

    def stats(self) -> dict[str, Any]:
        """Counts, sizes, the per-file summary and the counters."""
        bytes_on_disk = sum(s.file_size for s in self._summary.values())
        valid_bytes = sum(s.valid_total_size for s in self._summary.values())
        return {
            "message_count": len(self._index),
            "file_count": len(self._summary),
            "current_file": self._current_file,
            "bytes_on_disk": bytes_on_disk,
            "valid_bytes": valid_bytes,
            "pending_bytes": self._pending_bytes,
            "garbage_fraction": self._garbage_fraction(bytes_on_disk, valid_bytes),
            "files": {file: self._file_stats(file, s) for file, s in sorted(self._summary.items())},
            "damaged": list(self._damaged),
            "locked_files": sum(s.locked for s in self._summary.values()),
            "uncombinable_files": sorted(self._uncombinable),
            "deferred_deletes": len(self._deferred_deletes),
            "gc": self.gc,
            "recovered_clean": self.recovered_clean,
            "disk_full": self.disk_full,
            "writes_blocked": self.writes_blocked,
            "reads": self._reads,
            "writes": self._writes,
            **self.counters,
        }

    def _file_stats(self, file: int, summary: FileSummary) -> dict[str, Any]:
        held = self._lock_table is not None and self._lock_table.held_by_readers(file)
        return {**summary.as_dict(), "readers": int(held)}

    # ---------------------------------------------------------------- closing

    def _check_usable(self) -> None:
        """Raise StoreClosed once the store has stopped (a failure also closes it)."""
        if self._broken is not None:
            raise StoreClosed(f"store {self.directory!r} failed: {self._broken}")
        if self._closed:
            raise StoreClosed(f"store {self.directory!r} is closed")

    def close(self) -> SyncResult | None:
        """Clean stop: flush, fsync, write the clean-shutdown files, release the lock.

        Returns the settlement of the writes no ``sync()`` reported yet (None if the
        store had already stopped).
        """
        if self._closed:
            return None
        if self._broken is not None:
            self._release()
            return None
        if self._staging is not None:
            self._deferred_apply = None
            self.abandon_combine()
        try:
            for file in sorted(self._deferred_deletes):
                # A reader still holds it: its open fd keeps the inode, and any read by
                # path fails and falls back to a store that is gone; nothing is wrong.
                log.info(
                    "%s: deleting %s at close although a reader holds it",
                    self.directory,
                    data_file_name(file),
                )
                self._unlink_file(file)
            self._deferred_deletes.clear()
            self._guarded(self._sync_to_disk)
            replicated_io.fsync(self._current_fd)
            # The marker will vouch for every file's size: with the "flush" policy files
            # were rolled over unsynced, and must be on disk before it is written.
            for file in sorted(self._unsynced_files):
                fd = os.open(data_file_name(file), os.O_RDONLY, dir_fd=self._dir_fd)
                try:
                    replicated_io.fdatasync(fd)
                finally:
                    os.close(fd)
            self._unsynced_files.clear()
            summary = [
                (file, s.valid_total_size, s.file_size) for file, s in sorted(self._summary.items())
            ]
            try:
                snapshot.write(self._dir_fd, self._index, summary, frozenset(self._clients))
            except OSError as exc:
                if exc.errno not in DISK_FULL_ERRNOS:
                    raise
                # The data is all on disk; only the fast start is lost.
                log.warning(
                    "%s: no room for the clean-shutdown files; the next start "
                    "recovers from the data files",
                    self.directory,
                )
                snapshot.delete(self._dir_fd)
            settled = SyncResult(
                self._unsynced_tickets, self._ignored_tickets, self._failed_tickets
            )
            self._unsynced_tickets, self._ignored_tickets, self._failed_tickets = [], [], []
            return settled
        finally:
            self._release()

    def _release(self) -> None:
        """Close every fd without writing anything (the lock goes with its fd)."""
        if self._closed:
            return
        self._closed = True
        for mapped in self._maps.values():
            mapped.close()
        self._maps.clear()
        if self._lock_table is not None:
            self._lock_table.close()
        fds = [self._current_fd, self._lock_fd, self._dir_fd]
        for fd in fds:
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass  # closing is best effort once the store has stopped

    def __enter__(self) -> MessageStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self._index)} messages"
        return f"<MessageStore {self.directory!r} {state}>"


def is_store_file(name: str) -> bool:
    """Whether ``name`` is one a store writes in its directory (data, temporary, removal
    log, lock table, snapshot and lock files)."""
    return (
        name in _STORE_FILE_NAMES
        or data_file_number(name) is not None
        or (
            name.endswith(TEMP_SUFFIX)
            and data_file_number(name.removesuffix(TEMP_SUFFIX) + FILE_SUFFIX) is not None
        )
        or removal_log.is_log_name(name)
        or (name.endswith(".tmp") and name[: -len(".tmp")] in snapshot.FILES)
    )


def remove_store_files(directory: str) -> list[str]:
    """Delete the files a store wrote in ``directory`` (the transient store's start), and
    the directory once nothing else is in it; the names of what was left (another
    program's files are never touched)."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    left = []
    for name in names:
        if is_store_file(name) and not os.path.isdir(os.path.join(directory, name)):
            replicated_io.unlink(os.path.join(directory, name))
        else:
            left.append(name)
    if not left:
        os.rmdir(directory)
    return sorted(left)


_STORE_FILE_NAMES = frozenset(
    {LOCK_FILE, TABLE_FILE, RESERVE_FILE, TABLE_FILE + ".new", *snapshot.FILES}
)


__all__ = [
    "FILE_SIZE_LIMIT_BYTES",
    "GARBAGE_FRACTION",
    "MSG_ID_BYTES",
    "MessageStore",
    "SyncResult",
    "WRITE_BUFFER_BYTES",
    "is_store_file",
    "remove_store_files",
]

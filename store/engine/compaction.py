"""Compaction: one file's live records moved towards its head in place, then the file cut
(RabbitMQ 3.13+'s GC, seed 002 A4.2), beside the combining of neighbours (``rewrite``).

The steps, and who runs them:

1. plan (the store, ``warren.store.engine.compacting``): the file's live records, from a
   scan checked against the index, give the moves (``plan_compaction``): walking holes
   from the head, the *last* live record moves into the hole before the next live one
   when it fits, else that next one stays and the walk goes on past it. A record only
   moves to a lower offset, into bytes no live record occupies, and never overlaps its
   own old place; every old place of a moved record ends up past the cut
   (``truncate_at``). Worked example (RabbitMQ's)::

       [A@0 100][hole 200][B@300 50][C@350 150]  ->  C to 100, B to 250, cut at 300
       [A][C][B]

   The store writes the plan as the file's *journal*, ``N.compact``, with a token naming
   the job, and hands the job (file and token) on.
2. move (``compact_in_place``; the GC process in a node): holding an exclusive flock on
   the journal, and only if it bears the job's token (a job sent by a store process that
   has since restarted finds another job's journal, or none), fdatasync the journal and
   the directory (the store's thread pays for no sync of it), check every record to move
   (size field, id, 0xFF trailer) before writing anything, zero the holes (every byte
   below the cut that neither a staying nor a moved record will hold: no stale bytes of
   removed records are left for a scanner to mistake for a record, RabbitMQ's
   `fcd011f9cf`), copy each record to its new place (consecutive ones in one write),
   fdatasync (also every megabyte, so that the store's group commits never wait behind
   a backlog of dirty pages).
3. apply (the store, ``warren.store.engine.compacting``), in one step once no reader is
   inside the file: delete the journal (unsynced: below), point the index at the
   new places (only entries still at the copied place: a record removed, or removed and
   written again, meanwhile is left alone), cut the file at ``truncate_at`` (no
   fdatasync: until the new size is on disk, the old copies past it are intact).

Crash safety. Until the journal is deleted, the index (in memory, in a clean snapshot, or
rebuilt by a dirty start) points at the old places, which nothing writes to: the moves
only write into holes. The store deletes the journal without an fsync (the next group
commit's makes it durable), so an OS crash may keep the journal beside a file already
cut: a start that finds the file at the plan's cut knows the compaction was applied and
only drops the journal. A start that finds it at the planned size *rolls it back* before
anything scans the file: each destination is compared with its intact source (a move that
did not finish, a torn one, differs from it), and every destination is zeroed, so that
no half-written copy is left for a scan to find; then the journal is deleted. A journal
whose own CRC fails was torn while it was written, before any move began: it is deleted.
After the journal is deleted, the old copies stay intact until the cut and are the last
copy of their id a dirty start keeps; after the cut only the new copies exist, durable
since step 2. No crash makes recovery read a moved record at its old place.

A job the store gives up is rolled back at once by the store; one left by a store that
stopped or crashed is rolled back by the next start, which first waits (as long as
any time it takes) for the flock a GC still moving holds on it; a GC that gets the lock
of a journal already rolled back (unlinked) does nothing. So no copy outlives the journal
that describes it.

``N.compacted`` beside a compacted file counts its compactions and the bytes they
reclaimed, for ``warren store inspect``; it is written without fsync (a figure, not
state) and deleted with the file.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import struct
from collections.abc import Container, Sequence
from dataclasses import dataclass

from isal.isal_zlib import crc32

from .. import replicated_io
from ..errors import CorruptRecord
from ..locks import lock_exclusive
from .records import HEADER, OK_MARKER, data_file_name
from .rewrite import WRITE_CHUNK_BYTES, Record

log = logging.getLogger("warren.store")

JOURNAL_SUFFIX = ".compact"
MARKER_SUFFIX = ".compacted"
_JOURNAL_MAGIC = b"WRNCMPCT"
_JOURNAL_VERSION = 1
# magic, version, token, file, size, cut, moves, holes
_JOURNAL_HEAD = struct.Struct("<8sI8sQQQII")
TOKEN_BYTES = 8
ROLL_BACK_WAIT_S = 30.0  # a start waiting for a GC still carrying out the journal says so
_MOVE = struct.Struct("<16sQQQ")  # msg_id, from, to, total size
_HOLE = struct.Struct("<QQ")  # start, end
_CRC = struct.Struct("<I")
_ZEROS = bytes(WRITE_CHUNK_BYTES)

Move = tuple[bytes, int, int, int]  # (msg_id, from, to, total_size)


class JournalInvalid(CorruptRecord):
    """A compaction journal that is torn, damaged, not a journal, or not the job's."""


@dataclass(frozen=True)
class CompactionPlan:
    """One file's compaction: its size when planned, where it is cut, the records that
    move, and the holes zeroed before they do (all below the cut). ``token`` tells this
    job's journal from any other's: the GC carries out a journal only for the job that
    names it."""

    file: int
    file_size: int
    truncate_at: int
    moves: tuple[Move, ...]
    holes: tuple[tuple[int, int], ...]  # below the cut, held by no record after the moves
    token: bytes = bytes(TOKEN_BYTES)

    @property
    def reclaimed(self) -> int:
        return self.file_size - self.truncate_at

    @property
    def moved_bytes(self) -> int:
        return sum(move[3] for move in self.moves)


def journal_name(file: int) -> str:
    return f"{file}{JOURNAL_SUFFIX}"


def marker_name(file: int) -> str:
    return f"{file}{MARKER_SUFFIX}"


_NAME = re.compile(r"^(0|[1-9][0-9]*)\.(compact|compacted)$")


def file_of(name: str) -> int | None:
    """The N of a journal or marker name (``N.compact``, ``N.compacted``); None else."""
    match = _NAME.match(name)
    return int(match.group(1)) if match else None


def plan_compaction(
    file: int,
    file_size: int,
    live: Sequence[Record],
    avoid: Container[tuple[int, bytes]] = (),
) -> CompactionPlan | None:
    """The plan for ``file`` whose live records (``(msg_id, offset, total_size)``, in
    offset order) are ``live``; None when it would reclaim nothing. ``avoid`` names
    places a record of that id must not move to: where the removal log says a removed
    copy of the same id was (an entry must never name a live record)."""
    moves: list[Move] = []
    staying: list[Record] = []
    front, back = 0, len(live) - 1
    end = 0  # the end of the data kept or moved so far, from the head
    while front <= back:
        msg_id, offset, size = live[front]
        hole = offset - end
        if hole and back > front:
            last_id, last_offset, last_size = live[back]
            if last_size <= hole and (end, last_id) not in avoid:
                moves.append((last_id, last_offset, end, last_size))
                end += last_size
                back -= 1
                continue
        elif hole and size <= hole and (end, msg_id) not in avoid:
            moves.append((msg_id, offset, end, size))  # the last one, into the hole before it
            end += size
            front += 1
            continue
        staying.append(live[front])  # it stays; the hole before it stays a hole
        end = offset + size
        front += 1
    if end >= file_size:
        return None
    # The holes left below the cut: what neither a staying record nor a moved one will
    # hold. A destination needs no zeroing first: a torn copy is zeroed by the roll-back.
    occupied = sorted(
        [(offset, size) for _, offset, size in staying] + [(m[2], m[3]) for m in moves]
    )
    holes = []
    at = 0
    for offset, size in occupied:
        if offset > at:
            holes.append((at, offset))
        at = offset + size
    if at < end:
        holes.append((at, end))
    return CompactionPlan(file, file_size, end, tuple(moves), tuple(holes), os.urandom(TOKEN_BYTES))


def encode_journal(plan: CompactionPlan) -> bytes:
    parts = [
        _JOURNAL_HEAD.pack(
            _JOURNAL_MAGIC,
            _JOURNAL_VERSION,
            plan.token,
            plan.file,
            plan.file_size,
            plan.truncate_at,
            len(plan.moves),
            len(plan.holes),
        )
    ]
    parts += [_MOVE.pack(*move) for move in plan.moves]
    parts += [_HOLE.pack(*hole) for hole in plan.holes]
    body = b"".join(parts)
    return body + _CRC.pack(crc32(body))


def decode_journal(data: bytes) -> CompactionPlan:
    """The plan a journal holds; ``JournalInvalid`` unless it is whole and intact."""
    if len(data) < _JOURNAL_HEAD.size + _CRC.size:
        raise JournalInvalid("the journal is shorter than its header")
    body, (crc,) = data[: -_CRC.size], _CRC.unpack(data[-_CRC.size :])
    if crc32(body) != crc:
        raise JournalInvalid("the journal fails its CRC (torn while it was written)")
    magic, version, token, file, size, cut, moves, holes = _JOURNAL_HEAD.unpack_from(body)
    if magic != _JOURNAL_MAGIC or version != _JOURNAL_VERSION:
        raise JournalInvalid("not a compaction journal of this version")
    if len(body) != _JOURNAL_HEAD.size + moves * _MOVE.size + holes * _HOLE.size:
        raise JournalInvalid("the journal's length does not match its counts")
    at = _JOURNAL_HEAD.size
    move_list = [_MOVE.unpack_from(body, at + i * _MOVE.size) for i in range(moves)]
    at += moves * _MOVE.size
    hole_list = [_HOLE.unpack_from(body, at + i * _HOLE.size) for i in range(holes)]
    return CompactionPlan(file, size, cut, tuple(move_list), tuple(hole_list), token)


def write_journal(dir_fd: int, plan: CompactionPlan) -> None:
    """Write the plan as ``N.compact``; ``compact_in_place`` makes it durable (file and
    directory entry) before any byte of the data file changes, off the store's thread."""
    fd = replicated_io.open(
        journal_name(plan.file), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644, dir_fd=dir_fd
    )
    try:
        _write_all_at(fd, encode_journal(plan), 0)
    finally:
        os.close(fd)


def compact_in_place(
    directory: str | os.PathLike, file: int, token: bytes | None = None
) -> CompactionPlan:
    """Step 2: carry out the journal of ``file`` (see the module docstring), holding an
    exclusive flock on it (a start's roll-back waits for it); the plan. ``CorruptRecord``
    (nothing written) when a record to move is not where the plan says, or the file is
    not the size it was planned at; ``JournalInvalid`` without an intact journal, or one
    of another job than ``token`` names."""
    directory = os.fspath(directory)
    try:
        journal_fd = os.open(os.path.join(directory, journal_name(file)), os.O_RDONLY)
    except FileNotFoundError:
        raise JournalInvalid(f"no compaction journal for {data_file_name(file)}") from None
    try:
        fcntl.flock(journal_fd, fcntl.LOCK_EX)
        if os.fstat(journal_fd).st_nlink == 0:  # rolled back while this GC waited
            raise JournalInvalid(f"the compaction of {data_file_name(file)} was rolled back")
        plan = decode_journal(_read_all(journal_fd))
        if token is not None and plan.token != token:
            raise JournalInvalid(
                f"the compaction journal of {data_file_name(file)} is another job's"
            )
        replicated_io.fdatasync(journal_fd)
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            replicated_io.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        _move(directory, plan)
    finally:
        os.close(journal_fd)  # and its lock
    return plan


def _read_all(fd: int) -> bytes:
    size = os.fstat(fd).st_size
    data = os.pread(fd, size, 0)
    if len(data) != size:
        raise JournalInvalid("the journal changed while it was read")
    return data


def _move(directory: str, plan: CompactionPlan) -> None:
    path = os.path.join(directory, data_file_name(plan.file))
    fd = os.open(path, os.O_RDWR)
    try:
        size = os.fstat(fd).st_size
        if size != plan.file_size:
            raise CorruptRecord(
                f"{path} is {size} bytes; its compaction was planned at {plan.file_size}"
            )
        records = [_checked_record(fd, path, move) for move in plan.moves]
        written = 0
        for start, stop in plan.holes:
            while start < stop:
                chunk = min(stop - start, len(_ZEROS))
                _write_all_at(fd, memoryview(_ZEROS)[:chunk], start)
                start += chunk
                written = _sync_every_chunk(fd, written + chunk)
        # Consecutive destinations (a hole filled record after record) in one write each.
        pending, pending_at = bytearray(), -1
        for (_msg_id, _source, to, _size), record in zip(plan.moves, records, strict=True):
            if pending and to != pending_at + len(pending):
                _write_all_at(fd, pending, pending_at)
                written = _sync_every_chunk(fd, written + len(pending))
                pending = bytearray()
            if not pending:
                pending_at = to
            pending += record
        if pending:
            _write_all_at(fd, pending, pending_at)
        replicated_io.fdatasync(fd)
    finally:
        os.close(fd)


def _checked_record(fd: int, path: str, move: Move) -> bytes:
    msg_id, source, _to, size = move
    record = os.pread(fd, size, source)
    if (
        len(record) != size
        or record[-1] != OK_MARKER
        or HEADER.unpack_from(record) != (size - 9, msg_id)
    ):
        raise CorruptRecord(f"{path} has no valid record of {msg_id.hex()} at offset {source}")
    return record


def _sync_every_chunk(fd: int, written: int) -> int:
    """fdatasync once a megabyte is dirty (see the module docstring); what is dirty now."""
    if written >= WRITE_CHUNK_BYTES:
        replicated_io.fdatasync(fd)
        return 0
    return written


def _write_all_at(fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
    view = memoryview(data)
    while view:
        done = replicated_io.pwrite(fd, view, offset)
        view, offset = view[done:], offset + done


@dataclass(frozen=True)
class RollBack:
    """What a start found of an unfinished compaction of one file."""

    file: int
    complete: int  # moves whose copy matched its source
    torn: int  # moves whose copy did not (cut short, or never begun)
    journal_invalid: bool  # the journal itself was torn: nothing had moved


def roll_back(dir_fd: int, file: int, *, compare: bool = True) -> RollBack:
    """Undo a compaction of ``file`` that was not applied (its journal present at a
    start, or its job given up): once no GC holds the journal (a GC of an earlier store
    process may still be moving: never without its lock, or that GC would write after
    it), zero every destination, fdatasync, delete the journal and fsync the directory.
    ``compare`` checks each copy against its source first, to count the torn ones."""
    try:
        fd = os.open(journal_name(file), os.O_RDONLY, dir_fd=dir_fd)
    except FileNotFoundError:  # nothing was planned on disk, so nothing moved
        return RollBack(file, 0, 0, journal_invalid=False)
    try:
        while not lock_exclusive(fd, ROLL_BACK_WAIT_S):
            log.warning(
                "waiting for the GC to let go of the compaction journal of %s (held %g s "
                "more); the roll-back needs it",
                data_file_name(file),
                ROLL_BACK_WAIT_S,
            )
        try:
            plan = decode_journal(_read_all(fd))
        except JournalInvalid:
            forget_journal(dir_fd, file)
            return RollBack(file, 0, 0, journal_invalid=True)
        return _roll_back(dir_fd, plan, compare)
    finally:
        os.close(fd)


def _roll_back(dir_fd: int, plan: CompactionPlan, compare: bool) -> RollBack:
    file = plan.file
    complete = torn = 0
    try:
        data_fd = os.open(data_file_name(file), os.O_RDWR, dir_fd=dir_fd)
    except FileNotFoundError:
        forget_journal(dir_fd, file)
        return RollBack(file, 0, len(plan.moves), journal_invalid=False)
    try:
        size = os.fstat(data_fd).st_size
        if size == plan.truncate_at:
            # Applied: the store deletes the journal without an fsync of its own, and an
            # OS crash kept the cut but not the deletion. The copies are the messages now.
            log.info("%s was compacted; its journal is dropped", data_file_name(file))
        elif size != plan.file_size:
            # Not the file this journal planned for: its places mean nothing here.
            log.warning(
                "%s is not the size its compaction journal planned for; "
                "the journal is dropped and the file left as it is",
                data_file_name(file),
            )
        else:
            for _msg_id, source, to, size in plan.moves:
                if compare:
                    copy = os.pread(data_fd, size, to)
                    if crc32(copy) == crc32(os.pread(data_fd, size, source)):
                        complete += 1
                    else:
                        torn += 1
                _write_all_at(data_fd, bytes(size), to)
            replicated_io.fdatasync(data_fd)
    finally:
        os.close(data_fd)
    forget_journal(dir_fd, file)
    return RollBack(file, complete, torn, journal_invalid=False)


def forget_journal(dir_fd: int, file: int, *, sync: bool = True) -> None:
    """Delete ``file``'s journal, if any, and (``sync``) fsync the directory. The store's
    switch passes ``sync=False``: a start that finds the journal beside a file already
    cut to the plan's size knows the compaction was applied, and one that finds the file
    uncut rolls it back, the old copies intact."""
    try:
        replicated_io.unlink(journal_name(file), dir_fd=dir_fd)
    except FileNotFoundError:
        return
    if sync:
        replicated_io.fsync(dir_fd)


def note_compacted(dir_fd: int, file: int, reclaimed: int) -> None:
    """Add one compaction and ``reclaimed`` bytes to ``N.compacted`` (no fsync: a figure)."""
    compactions, total = read_marker(dir_fd, file)
    fd = replicated_io.open(
        marker_name(file), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644, dir_fd=dir_fd
    )
    try:
        _write_all_at(fd, f"{compactions + 1} {total + reclaimed}\n".encode(), 0)
    finally:
        os.close(fd)


def read_marker(dir_fd: int, file: int) -> tuple[int, int]:
    """(compactions, bytes reclaimed) of ``file``; (0, 0) without a readable marker."""
    try:
        fd = os.open(marker_name(file), os.O_RDONLY, dir_fd=dir_fd)
    except FileNotFoundError:
        return 0, 0
    with os.fdopen(fd, "rb") as marker:
        fields = marker.read(64).split()
    if len(fields) == 2 and all(field.isdigit() for field in fields):
        return int(fields[0]), int(fields[1])
    return 0, 0


def forget(dir_fd: int, file: int) -> None:
    """Delete the journal and marker of a file that is going (no fsync: the caller's)."""
    for name in (journal_name(file), marker_name(file)):
        try:
            replicated_io.unlink(name, dir_fd=dir_fd)
        except FileNotFoundError:
            pass

"""The messages between store clients, the store actors and the GC actor.

Every message is a frozen dataclass registered with the actor runtime's codec; a
``bytes`` field of 64 KiB or more (a batch of records) travels as its own frame.

Client → store (``msg_store_persistent`` / ``msg_store_transient``):

    Register(client_ref)                  ask → StoreInfo
    WriteBatch(client_ref, first_seq, records, removes)
                                          ask → Settled, answered once every write of the
                                          batch is on disk, ignored, or failed for want
                                          of space (group commit)
    Read(msg_id)                          ask → Found | None
    ReadMany(msg_ids)                     ask → list[Found | None]
    Contains(msg_ids)                     ask → list[bool]
    Claim(client_ref, predecessors, msg_ids, written_since)
                                          ask → list[bool]: whether the client now holds
                                          a reference to each (its own, a predecessor's
                                          taken over, or, unless written since the start
                                          ``written_since`` names, one recovered at the
                                          store's start): a queue's recovery after a crash
    ReadsReport(client_ref, direct, fallback)   tell: the client's read counters
    Terminate(client_ref)                 ask → None, after everything the client sent
    ClientDying(client_ref)               tell: later writes of unknown ids are ignored,
                                          then the client is forgotten
    StoreStats()                          ask → dict

Store → GC (``msg_store_gc``) and back, one combine in two round trips:

    ScanJob(job_id, directory, dst, src, reply_to)                   tell
    Scanned(job_id, dst, src, dst_ids, dst_offsets, dst_sizes,
            src_ids, src_offsets, src_sizes)                         tell
    RewriteJob(job_id, dst, src, dst_keep, src_keep, reply_to)       tell
    Rewritten(job_id, dst, src, file_size)                           tell
    RewriteFailed(job_id, reason)                                    tell

Store → GC and back, one compaction in two round trips:

    CompactScan(job_id, directory, file, reply_to)                   tell
    FileScanned(job_id, file, ids, offsets, sizes,
                removed_ids, removed_offsets)                        tell
    CompactJob(job_id, directory, file, token, reply_to)             tell
    Compacted(job_id, file, truncate_at)                             tell
    RewriteFailed(job_id, reason)                                    tell

A compaction's plan travels in no message: the store writes it as the file's journal
(``warren.store.engine.compaction``) before it sends ``CompactJob``, and the GC carries
out the journal it finds if it bears the job's ``token`` (a job of a store that has since
restarted finds another job's journal, or none, and fails). ``FileScanned`` also carries
the removal log's entries that name an id the scan found (read in the GC, not on the
store's thread): the plan never moves a record onto one.

The GC scans both files and sends every record it finds: ``*_ids`` the 16-byte ids back
to back, ``*_offsets`` and ``*_sizes`` native ``array("Q")`` bytes (both processes run on
one machine). The store stages them against its index a slice at a time and answers with
one keep flag (a byte, 1 = copy) per record found; the GC copies those from the scan it
kept for the job. A GC that restarted in between has no scan and answers RewriteFailed.
``reply_to`` is the store's ref pinned to its incarnation: the answer to a job of a store
that has since restarted is dropped, never applied to the new incarnation's plan.

``records`` of a WriteBatch is the batch in ``.rdq`` layout, exactly the bytes the store
appends (``size · msg_id · body · 0xFF`` per record), sequence numbers ``first_seq``,
``first_seq + 1`` ... in record order. ``removes`` are the client's removes in their
place among those writes: ``[after, msg_ids]`` pairs, ``after`` records of the batch being
applied before ``msg_ids`` lose one reference each, ``after`` never decreasing. A remove
thus always reaches the store with the writes sent before it (a write and its remove in
one batch cost no disk write), and the client's order, id reuse included, is kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from warren.actors import ActorRef, message
from warren.actors.codec import Check

from .engine.records import MSG_ID_BYTES

# The field types the store's messages share, with the checks a receiver applies on
# decode (warren.actors.codec): a message failing one is refused whole, before its
# handler sees any of it.
MsgId = Annotated[bytes, Check(lambda v: len(v) == MSG_ID_BYTES, f"{MSG_ID_BYTES} bytes")]
MsgIds = Annotated[
    list[bytes],
    Check(lambda v: all(len(m) == MSG_ID_BYTES for m in v), f"a list of {MSG_ID_BYTES}-byte ids"),
]
ClientRef = Annotated[bytes, Check(lambda v: 0 < len(v) < 2**16, "1..65535 bytes")]
ClientRefs = Annotated[
    list[bytes], Check(lambda v: all(0 < len(r) < 2**16 for r in v), "a list of client refs")
]
Count = Annotated[int, Check(lambda v: v >= 0, "an int >= 0")]


@message
@dataclass(frozen=True)
class Register:
    client_ref: ClientRef


@message
@dataclass(frozen=True)
class StoreInfo:
    """What a client needs: the store's ref pinned to this incarnation (so a newer one
    never applies its requests), and the directory it reads directly; and whether this
    incarnation recovered from a clean stop (a queue whose store did not recovers dirty
    itself)."""

    ref: ActorRef
    directory: str
    transient: bool
    recovered_clean: bool
    start_token: str  # tells this start of the store from the next (a queue keeps it)


@message
@dataclass(frozen=True)
class WriteBatch:
    client_ref: ClientRef
    first_seq: Count
    records: bytes
    removes: list[tuple[int, list[bytes]]]


@message
@dataclass(frozen=True)
class Settled:
    """Cumulative confirm of one client's writes up to ``up_to_seq``: every seq not in
    ``ignored`` or ``failed`` is on disk, at the place ``locations`` gives (seq, file,
    offset, size); ``failed`` ones did not fit on a full disk and hold no reference."""

    client_ref: bytes
    up_to_seq: int
    ignored: list[int]
    locations: list[tuple[int, int, int, int]]
    failed: list[int]


@message
@dataclass(frozen=True)
class Read:
    msg_id: MsgId


@message
@dataclass(frozen=True)
class ReadMany:
    msg_ids: MsgIds


@message
@dataclass(frozen=True)
class Found:
    """A body and where it lies, so the client can read it directly next time."""

    body: bytes
    file: int
    offset: int
    total_size: int


@message
@dataclass(frozen=True)
class Contains:
    msg_ids: MsgIds


@message
@dataclass(frozen=True)
class Claim:
    client_ref: ClientRef
    predecessors: ClientRefs
    msg_ids: MsgIds
    written_since: str | None  # a store's start token: the entries are newer than it


@message
@dataclass(frozen=True)
class ReadsReport:
    client_ref: ClientRef
    direct: Count
    fallback: Count


@message
@dataclass(frozen=True)
class Terminate:
    client_ref: ClientRef


@message
@dataclass(frozen=True)
class ClientDying:
    client_ref: ClientRef


@message
@dataclass(frozen=True)
class StoreStats:
    pass


@message
@dataclass(frozen=True)
class ScanJob:
    job_id: int
    directory: str
    dst: int
    src: int
    reply_to: ActorRef


@message
@dataclass(frozen=True)
class Scanned:
    job_id: Count
    dst: Count
    src: Count
    dst_ids: bytes
    dst_offsets: bytes
    dst_sizes: bytes
    src_ids: bytes
    src_offsets: bytes
    src_sizes: bytes


@message
@dataclass(frozen=True)
class RewriteJob:
    job_id: int
    dst: int
    src: int
    dst_keep: bytes
    src_keep: bytes
    reply_to: ActorRef


@message
@dataclass(frozen=True)
class Rewritten:
    job_id: Count
    dst: Count
    src: Count
    file_size: Count


@message
@dataclass(frozen=True)
class RewriteFailed:
    job_id: Count
    reason: str


@message
@dataclass(frozen=True)
class CompactScan:
    job_id: int
    directory: str
    file: int
    reply_to: ActorRef


@message
@dataclass(frozen=True)
class FileScanned:
    job_id: Count
    file: Count
    ids: bytes
    offsets: bytes
    sizes: bytes
    removed_ids: bytes  # the removal log's entries naming an id the scan found ...
    removed_offsets: bytes  # ... and their offsets


@message
@dataclass(frozen=True)
class CompactJob:
    job_id: int
    directory: str
    file: int
    token: bytes
    reply_to: ActorRef


@message
@dataclass(frozen=True)
class Compacted:
    job_id: Count
    file: Count
    truncate_at: Count

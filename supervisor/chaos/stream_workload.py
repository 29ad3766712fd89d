"""The workload's stream: a producer and a reader that keep ledgers, what a torn or
flipped stream file reaches, and the audit that says what was lost.

``warren.supervisor.chaos.broker_run`` declares the stream with small segments and a
retention by size, so that retention deletes segments all run long and races the
reader; its process (``warren: stream NAME``) is killed and stopped like a queue's, and
its segment and index files are torn and flipped like the stores' (``faults``).

The producer (``produce_stream``) publishes batches of one to ``MAX_BATCH`` messages
(one chunk each) with the self-checking bodies of ``warren.supervisor.chaos.workload``,
``NAME-n`` ..., under producer id ``NAME`` and sequence ``n``, with confirms; each
confirmed id goes to its ledger, in the order of the confirms. A batch refused before
anything was sent is sent again; one in doubt is sent again (the stream drops what it
already took) and its ids noted in ``.resent``. A stream answering ``OutOfSequence`` no
longer holds the producer's last confirmed batches (its recovery cut a damaged tail
chunk): the producer asks which sequence the stream holds last and publishes again from
the one after, noting those ids in ``.rewound``.

The reader (``read_stream``) is a named consumer reading by offset from the first: after
a fault it attaches again and resumes after the offset it stored, reading again what it
read since (at least once). Given a pause key, it stops now and then for a while
(``PAUSE_EVERY_S``, ``PAUSE_S``), as a slow application does, long enough for retention
to delete segments it has not read yet. A chunk the stream refuses as damaged
(``StreamCorrupt``) it asks for once more, one chunk at a time from a reader the stream
positions afresh by its index (which steps over damage in the framing before the chunk);
refused again, it stores that offset as processed and goes on after it. Its ledger's
lines:

    attach               a consumer attached: offsets increase from here to the next
    OFFSET ID            a record read (ID ``?``: a body unlike any message's)
    gap LAST NEXT FIRST  the record read after offset LAST (-1: none yet) was at NEXT,
                         and the stream's first offset, asked just after, was FIRST (-1:
                         it did not answer): what lay below FIRST, retention deleted;
                         what lay above it was tracking (stored offsets, snapshots)
    corrupt OFFSET       the stream refused, twice, to read on from OFFSET: the chunk
                         there is damaged, or OFFSET is a tracking chunk's and a damaged
                         chunk follows it; the reader went on at OFFSET + 1

The audit (``audit_stream``) reads the ledgers, what the damage reached (``StreamDamage``,
noted before each torn or flipped stream file) and what the stream holds once the node
has stopped (``stream_contents``). A confirmed message that was read is fine. One that
was not, but is held at the end, is ``destroyed`` when a damaged chunk held its offset
(a cut tail's offsets are written again after the recovery, and a reader already past
them never reads what lands there), else ``lost``. One neither read nor held is, in this
order: ``destroyed`` when a damaged chunk held it; ``trimmed`` when between the offsets
of its producer's neighbours (the messages confirmed just before and just after it whose
offsets were seen) lies an offset the reader jumped over because retention had deleted
it; ``destroyed`` when a damaged chunk's offsets lie there; else ``lost``. A message the
stream forgot (rewound) is lost too, unless a damaged chunk held it. Failures besides: a
body read that is no message's (``wrong_bodies``), an offset seen with two different
messages outside the damaged offsets (``offset_conflicts``), offsets not increasing
within an attach (``out_of_order``), a message at two offsets though it was never
rewound (``stream_duplicates``: deduplication failed), and a refusal that no damage
explains (``unexplained_corrupt``: neither a damaged chunk's offset nor one of a run of
refused offsets that ends in one).

Races: a producer's ledger line is written after the confirm and its next batch
published after that, so a message confirmed later has a higher offset (until a damaged
tail is cut: the offsets written again are damaged ones); the first offset is asked just
after the jump, and retention may have moved it since, which excuses only offsets the
reader did jump over (tracking chunks, if retention overtook it meanwhile). It is asked
until the stream answers (``FIRST_OFFSET_WAIT_S``): a jump often follows a node's restart
(the reader attaches again, and its stored offset's segment is gone), and the node may
be away again then; an unknown first offset excuses nothing. Each lost message names
its evidence: the offset that held it unread, or its producer's neighbours seen around
it and the reader's jumps between them, each with the first offset seen then.
"""

from __future__ import annotations

import hashlib
import os
import random
import time
from dataclasses import dataclass, field

from warren.actors import ActorError
from warren.queues.client.connection import Connection
from warren.queues.client.stream import StreamConsumer
from warren.queues.engine.stream_log import (
    FILE_HEADER_BYTES,
    INDEX_RECORD_BYTES,
    INDEX_SUFFIX,
    SEGMENT_SUFFIX,
    ChunkHeader,
    StreamLog,
    decode_entries,
    parse_chunk_header,
)
from warren.queues.errors import (
    CorruptMessage,
    InvalidMessage,
    MessageTooLarge,
    OutOfSequence,
    QueueError,
    StreamCorrupt,
)
from warren.queues.message import decode

from .workload import REFUSED, RETRY_S, Producer, body_of, checked_id, ledger_lines, size_of

__all__ = [
    "MAX_BATCH",
    "StreamAudit",
    "StreamContents",
    "StreamDamage",
    "audit_stream",
    "batch_of",
    "produce_stream",
    "read_stream",
    "stream_contents",
    "with_stream",
]

MAX_BATCH = 4  # messages a stream publish carries at most: one chunk
# A producer waits this long after each confirmed batch (seconds): a stream takes a
# message for a fraction of a queue's work, and a producer publishing flat out would
# crowd the queues' producers off a small machine's disk.
BATCH_PAUSE_S = 0.01
READ_PREFETCH = 100  # records a reader asks for at a time
POLL_S = 0.2  # a reader's wait for the next record before it looks at the clock again
# How long a reader asks for the first offset before giving up: longer than a node's
# restart under a run's faults (a node kill, or a torn file, lands every few seconds, and
# a restart on a loaded machine can take ten), which an unknown first offset would turn
# a retention jump into a loss.
FIRST_OFFSET_WAIT_S = 60.0
PAUSE_EVERY_S = (3.0, 8.0)  # a pausing reader reads this long (from, to seconds) ...
PAUSE_S = (1.0, 3.0)  # ... then stops for this long


def batch_of(key: str) -> int:
    """How many messages the batch starting at ``key`` (``SIZE_KEY-n``) carries."""
    return 1 + hashlib.blake2b(key.encode(), digest_size=2).digest()[0] % MAX_BATCH


def produce_stream(
    connection: Connection,
    stream: str,
    name: str,
    ledger: str,
    *,
    count: int | None = None,
    sizes: tuple[int, int] | None = None,
    size_key: str | None = None,
) -> None:
    """Publish ``count`` messages (None: until stopped) ``NAME-0``, ``NAME-1`` ... to
    ``stream`` in batches, under producer id ``NAME``; see the module docstring. Sizes
    are drawn as ``warren.supervisor.chaos.workload.produce`` draws them."""
    size_key = name if size_key is None else size_key
    with (
        open(ledger, "a", buffering=1) as confirmed,
        open(ledger + ".resent", "a", buffering=1) as resent,
        open(ledger + ".rewound", "a", buffering=1) as rewound,
    ):
        n = 0
        while count is None or n < count:
            size = batch_of(f"{size_key}-{n}")
            batch = range(n, n + (size if count is None else min(size, count - n)))
            ids = [f"{name}-{i}" for i in batch]
            bodies = [
                body_of(m, None if sizes is None else size_of(f"{size_key}-{i}", sizes))
                for i, m in zip(batch, ids, strict=True)
            ]
            try:
                connection.publish_many(stream, bodies, producer_id=name, sequence=n, timeout=30)
            except (InvalidMessage, MessageTooLarge):
                raise  # the workload's own mistake: no retry cures it
            except REFUSED:
                time.sleep(RETRY_S)
                continue
            except OutOfSequence:
                try:
                    last = connection.last_sequence(stream, name)
                except (QueueError, ActorError, TimeoutError):
                    time.sleep(RETRY_S)
                    continue
                held = -1 if last is None else last
                rewound.writelines(f"{name}-{i}\n" for i in range(held + 1, n))
                n = held + 1
                continue
            except (QueueError, ActorError, TimeoutError):
                resent.writelines(m + "\n" for m in ids)
                time.sleep(RETRY_S)
                continue
            confirmed.writelines(m + "\n" for m in ids)
            n += len(ids)
            time.sleep(BATCH_PAUSE_S)


def read_stream(
    connection: Connection,
    stream: str,
    name: str,
    ledger: str,
    stop_after_idle_s: float | None = None,
    pause_key: str | None = None,
) -> None:
    """Read ``stream`` from its first offset as consumer ``name``, until stopped or idle
    for ``stop_after_idle_s``, writing the ledger the module docstring describes; with
    ``pause_key``, pausing now and then (drawn from the key)."""
    pauses = None if pause_key is None else random.Random(pause_key)
    pause_at = float("inf") if pauses is None else time.monotonic() + pauses.uniform(*PAUSE_EVERY_S)
    last = -1  # the highest offset read, over every attach
    refused_at: int | None = None  # an offset whose chunk was refused once
    careful = False  # one chunk a request: a refusal then names the chunk refused
    idle_since = time.monotonic()
    with open(ledger, "a", buffering=1) as out:
        while True:
            try:
                consumer = connection.consume(
                    stream, offset="first", name=name, prefetch=1 if careful else READ_PREFETCH
                )
            except (QueueError, ActorError, TimeoutError):
                time.sleep(RETRY_S)
                continue
            assert isinstance(consumer, StreamConsumer)  # a stream is read by offset
            out.write("attach\n")
            resume_after: int | None = None
            try:
                while True:
                    if stop_after_idle_s is not None and (
                        time.monotonic() - idle_since >= stop_after_idle_s
                    ):
                        return
                    delivery = consumer.get(POLL_S)
                    if delivery is None:
                        continue
                    idle_since = time.monotonic()
                    if delivery.offset > last + 1:
                        first = _first_offset(connection, stream)
                        out.write(f"gap {last} {delivery.offset} {first}\n")
                    try:
                        out.write(f"{delivery.offset} {checked_id(delivery.body)}\n")
                    except AssertionError:
                        out.write(f"{delivery.offset} ?\n")
                    last = max(last, delivery.offset)
                    if pauses is not None and time.monotonic() >= pause_at:
                        time.sleep(pauses.uniform(*PAUSE_S))
                        pause_at = time.monotonic() + pauses.uniform(*PAUSE_EVERY_S)
                        idle_since = time.monotonic()
                    if careful and refused_at is not None and delivery.offset > refused_at:
                        # past the damage: back to whole prefetches
                        careful, refused_at, resume_after = False, None, delivery.offset
                        break
            except StreamCorrupt:
                at = consumer.next_offset
                if refused_at == at:
                    out.write(f"corrupt {at}\n")
                    resume_after, idle_since = at, time.monotonic()
                else:
                    resume_after = at - 1
                refused_at, careful = at, True
            except (QueueError, ActorError, TimeoutError):
                time.sleep(RETRY_S)
            finally:
                try:
                    consumer.cancel()
                except (QueueError, ActorError, TimeoutError):
                    pass  # its offset is not stored: the next attach reads again from the last
            if resume_after is not None:
                _resume_after(connection, stream, name, resume_after)


def _resume_after(connection: Connection, stream: str, name: str, offset: int) -> None:
    """Make consumer ``name`` resume at ``offset + 1`` (a failure leaves it where it
    stored last: it reads again from there, and meets the same chunk again)."""
    try:
        if offset < 0:
            connection.reset_offset(stream, name)
        else:
            connection.store_offset(stream, name, offset)
    except (QueueError, ActorError, TimeoutError):
        time.sleep(RETRY_S)


def _first_offset(connection: Connection, stream: str) -> int:
    deadline = time.monotonic() + FIRST_OFFSET_WAIT_S
    while True:
        try:
            return int(connection.queue_stats(stream)["first_offset"])
        except (QueueError, ActorError, TimeoutError):
            if time.monotonic() > deadline:
                return -1
            time.sleep(RETRY_S)


# ------------------------------------------------------------------ damage and contents


def _message_id(payload: bytes) -> str:
    """The id of the message a record holds, ``?`` when it holds none."""
    try:
        return checked_id(decode(payload).body)
    except (CorruptMessage, AssertionError):
        return "?"


def _chunks(data: bytes) -> list[ChunkHeader]:
    """The whole chunks of a segment file's bytes, from its start to the first that is
    not one (an earlier fault's damage, or a write cut short)."""
    chunks: list[ChunkHeader] = []
    position = FILE_HEADER_BYTES
    while (header := parse_chunk_header(data[position:], position)) is not None:
        if header.end > len(data):
            break
        chunks.append(header)
        position = header.end
    return chunks


def _ids_in(data: bytes, header: ChunkHeader) -> set[str]:
    try:
        payloads = decode_entries(
            data[header.data_position : header.data_position + header.data_bytes]
        )
    except ValueError:
        return set()  # damaged already: a note taken then covers it
    return {_message_id(p) for p in payloads} - {"?"}


@dataclass
class StreamDamage:
    """What torn and flipped stream files reached: the ids of the messages in the chunks
    the damage landed in, and those chunks' offsets, ``[first, end)``."""

    ids: set[str] = field(default_factory=set)
    offsets: list[tuple[int, int]] = field(default_factory=list)

    def note(self, path: str, kind: str, at: int) -> None:
        """Before ``path`` (a segment or its index) is torn or flipped at byte ``at``:
        a cut reaches the chunk it lands in (or whose index record) and every one after;
        a flipped bit, that chunk alone; a damaged file header, the whole segment."""
        segment = (
            path[: -len(INDEX_SUFFIX)] + SEGMENT_SUFFIX if path.endswith(INDEX_SUFFIX) else path
        )
        with open(segment, "rb") as file:
            data = file.read()
        chunks = _chunks(data)
        if path.endswith(INDEX_SUFFIX):
            hit = (at - FILE_HEADER_BYTES) // INDEX_RECORD_BYTES
        else:
            hit = next((k for k, h in enumerate(chunks) if h.position <= at < h.end), len(chunks))
        if at < FILE_HEADER_BYTES:
            reached = chunks
        else:
            reached = chunks[hit:] if kind == "torn" else chunks[hit : hit + 1]
        for header in reached:
            self.ids |= _ids_in(data, header)
            self.offsets.append((header.chunk_id, header.next_offset))

    def reaches(self, low: int, high: int) -> bool:
        """Whether a damaged chunk's offsets lie strictly between ``low`` and ``high``."""
        return any(first < high and end - 1 > low for first, end in self.offsets)

    def covers(self, offset: int) -> bool:
        return any(first <= offset < end for first, end in self.offsets)


@dataclass(frozen=True)
class StreamContents:
    """What a stopped node's stream holds: its first offset, and each record's message id
    (``?`` for a body that is no message's), by offset."""

    first_offset: int
    records: dict[int, str]


def stream_contents(directory: str) -> StreamContents:
    """Read a stream directory whose node is stopped, as a node starting on it would
    (recovering it first), stepping over a chunk that fails its checks as the reader
    does."""
    records: dict[int, str] = {}
    with StreamLog(directory) as log:
        start = log.first_offset
        refused_at: int | None = None
        while True:
            with log.reader(start) as reader:
                try:
                    for offset, _timestamp, payload in reader:
                        records[offset] = _message_id(payload)
                    break
                except StreamCorrupt:
                    at = reader.next_offset
                    start = at + 1 if refused_at == at else at
                    refused_at = at
        return StreamContents(log.first_offset, records)


# ------------------------------------------------------------------ the audit


@dataclass
class StreamAudit:
    """The stream's ledgers compared (see the module docstring)."""

    confirmed: int = 0  # distinct messages confirmed
    read: int = 0  # records read, again after a resume included
    trimmed: int = 0
    retention_jumps: int = 0  # times the reader found its next offsets deleted
    rewound: int = 0
    duplicates: int = 0  # messages read at more than one offset
    wrong_bodies: int = 0
    lost: list[str] = field(default_factory=list)
    destroyed: list[str] = field(default_factory=list)
    offset_conflicts: list[str] = field(default_factory=list)
    out_of_order: list[str] = field(default_factory=list)
    stream_duplicates: list[str] = field(default_factory=list)
    unexplained_corrupt: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (
            self.lost
            or self.wrong_bodies
            or self.offset_conflicts
            or self.out_of_order
            or self.stream_duplicates
            or self.unexplained_corrupt
        )


@dataclass
class _Reading:
    """A reader's ledger, parsed."""

    offsets_of: dict[str, set[int]] = field(default_factory=dict)  # message id -> offsets
    trimmed: list[tuple[int, int]] = field(default_factory=list)  # offsets [from, to)
    jumps: list[tuple[int, int, int]] = field(default_factory=list)  # every gap line
    corrupt: set[int] = field(default_factory=set)
    retention_jumps: int = 0
    out_of_order: list[str] = field(default_factory=list)
    read: int = 0
    wrong: int = 0

    def add(self, path: str) -> None:
        previous = -1  # the offset read last in this attach
        for line in ledger_lines(path):
            kind, *rest = line.split()
            if kind == "attach":
                previous = -1
            elif kind == "gap":
                last, following, first = map(int, rest)
                self.jumps.append((last, following, first))
                if min(following, first) > last + 1:
                    self.trimmed.append((last + 1, min(following, first)))
                    self.retention_jumps += 1
            elif kind == "corrupt":
                self.corrupt.add(int(rest[0]))
            else:
                offset, message_id = int(kind), rest[0]
                self.read += 1
                if offset <= previous:
                    self.out_of_order.append(f"{os.path.basename(path)}: {offset} after {previous}")
                previous = offset
                if message_id == "?":
                    self.wrong += 1
                else:
                    self.offsets_of.setdefault(message_id, set()).add(offset)


def audit_stream(
    stream: str,
    producers: list[Producer],
    reader_ledgers: list[str],
    damage: StreamDamage,
    contents: StreamContents,
) -> StreamAudit:
    """What the stream's ledgers say (see the module docstring)."""
    reading = _Reading()
    for path in reader_ledgers:
        reading.add(path)
    held_at = {m: o for o, m in contents.records.items() if m != "?"}
    seen: dict[str, set[int]] = {m: set(o) for m, o in reading.offsets_of.items()}
    ids_at: dict[int, set[str]] = {}
    for message_id, offset in held_at.items():
        seen.setdefault(message_id, set()).add(offset)
    for message_id, offsets in seen.items():
        for offset in offsets:
            ids_at.setdefault(offset, set()).add(message_id)
    result = StreamAudit(
        read=reading.read, wrong_bodies=reading.wrong, retention_jumps=reading.retention_jumps
    )
    result.out_of_order = reading.out_of_order
    trimmed = sorted(reading.trimmed)
    rewound: set[str] = set()
    for producer in producers:
        order = list(dict.fromkeys(ledger_lines(producer.ledger)))  # by first confirm
        rewound |= set(ledger_lines(producer.ledger + ".rewound"))
        result.confirmed += len(order)
        known = [min(seen[m]) if m in seen else None for m in order]
        for position, message_id in enumerate(order):
            name = f"{stream} {message_id}"
            if message_id in reading.offsets_of:
                continue
            if message_id in held_at:
                # held, and not read: only a reader already past a cut tail's offsets
                # when they were written again may miss it
                if damage.covers(held_at[message_id]):
                    result.destroyed.append(name)
                else:
                    result.lost.append(
                        f"{name} (confirmed; held at offset {held_at[message_id]} at the "
                        f"end, and never read)"
                    )
                continue
            low = next((o for o in reversed(known[:position]) if o is not None), -1)
            high = next((o for o in known[position + 1 :] if o is not None), 2**63)
            if message_id in damage.ids:
                result.destroyed.append(name)
            elif any(start < high and end - 1 > low for start, end in trimmed):
                result.trimmed += 1
            elif damage.reaches(low, high):
                result.destroyed.append(name)
            else:
                result.lost.append(f"{name} ({_why_lost(low, high, reading.jumps)})")
    result.rewound = len(rewound)
    result.lost += [f"{stream} {m} (the stream forgot it)" for m in sorted(rewound - damage.ids)]
    for message_id, offsets in sorted(seen.items()):
        if len(offsets) > 1:
            result.duplicates += 1
            if message_id not in rewound:
                result.stream_duplicates.append(f"{stream} {message_id} at {sorted(offsets)}")
    result.offset_conflicts = [
        f"{stream} {offset}: {' and '.join(sorted(ids))}"
        for offset, ids in sorted(ids_at.items())
        if len(ids) > 1 and not damage.covers(offset)
    ]
    # A refusal names the offset the reader asked from: tracking chunks (one offset each)
    # may lie between it and the damaged chunk, and are refused with it.
    explained: set[int] = set()
    for offset in sorted(reading.corrupt, reverse=True):
        if damage.covers(offset) or offset + 1 in explained:
            explained.add(offset)
    result.unexplained_corrupt = [
        f"{stream} {offset}" for offset in sorted(reading.corrupt - explained)
    ]
    return result


def _why_lost(low: int, high: int, jumps: list[tuple[int, int, int]]) -> str:
    """The evidence against the stream for a confirmed message neither read nor held,
    whose producer's neighbours were seen at offsets ``low`` and ``high``."""
    seen = [str(offset) for offset in (low, high) if 0 <= offset < 2**63]
    around = f"its producer's neighbours at {' and '.join(seen)}" if seen else "no neighbour seen"
    over = [
        f"from {last} to {following} (the stream's first offset then "
        f"{'unknown' if first < 0 else first})"
        for last, following, first in jumps
        if last < high and following > low
    ]
    jumped = (
        "; the reader jumped " + ", ".join(over) + ", which retention does not explain"
        if over
        else "; the reader jumped over no offset there"
    )
    return f"confirmed, never read, not held at the end; {around}{jumped}"


def with_stream(counts: dict, stream: StreamAudit) -> dict:
    """A queue audit's counts (``Audit.counts``) with the stream's added in: confirmed
    messages, reads, losses, damage and wrong bodies count in the totals, the rest
    under names of their own."""
    return {
        **counts,
        "confirmed": counts["confirmed"] + stream.confirmed,
        "consumed": counts["consumed"] + stream.read,
        "lost": counts["lost"] + len(stream.lost),
        "duplicates": counts["duplicates"] + stream.duplicates,
        "wrong_bodies": counts["wrong_bodies"] + stream.wrong_bodies,
        "destroyed": counts["destroyed"] + len(stream.destroyed),
        "trimmed": stream.trimmed,
        "retention_jumps": stream.retention_jumps,
        "stream_confirmed": stream.confirmed,
        "stream_read": stream.read,
        "stream_rewound": stream.rewound,
        "offset_conflicts": stream.offset_conflicts,
        "out_of_order": stream.out_of_order,
        "stream_duplicates": stream.stream_duplicates,
        "unexplained_corrupt": stream.unexplained_corrupt,
        "lost_ids": counts["lost_ids"] + stream.lost,
        "destroyed_ids": counts["destroyed_ids"] + stream.destroyed,
    }

"""Publisher deduplication for one queue: the highest sequence it has accepted from each
producer, kept in ``producers.log`` in the queue's directory.

A publish may name its producer and the sequence of its first message (the others follow
one by one). The queue accepts a message only if its sequence is above the highest it
has accepted from that producer; a repeat is confirmed but not enqueued. What this asks
of a producer, as of Kafka's idempotent producer: its sequences start at 0 and go up by
one, and every attempt sends the same messages under the same sequences, in the same
order, as Spark's retried and speculative tasks do when the sequence is the row's index
in its partition. A publish that would leave a gap (its first sequence above the highest
taken plus one: batches pipelined before it were lost with a restart of the queue) is
refused whole with ``OutOfSequence``, so a gap never turns the lost batches, when they
are sent again, into "repeats". A producer unheard of (new, or forgotten: see below)
must start at 0.

The log. Each record is ``u16 producer length | producer | u64 sequence | u64 low water
| u64 time ms | u32 crc32`` (big-endian; the CRC covers the bytes before it). A record is
appended for each producer whose messages were confirmed, *after* they were confirmed and
before the publisher hears so: a sequence in the log is always durable in the queue.
``low water`` is the queue's lowest unconfirmed seq id when the record was written: every
message below it is confirmed, so its sequence is in the log.

Races it guards against:

- A queue killed after its index made a batch durable but before the batch's record was
  written: the messages come back at recovery, the log does not name them, and the
  producer re-sends them. Every message of a deduplicated publish is stored under an id
  derived from (producer, sequence) (``message_ids``), so the queue collects the ids of
  its entries from the last record's low water on (``tail``) and drops a re-sent message
  whose id is among them. Those of producers the log knows it logs at once
  (``record_recovered``: from each one's highest on, while they run unbroken), so that a
  second start before the re-send, after a record moved the low water past them or a
  consumer acked them, still knows them.
- One id, two byte strings. The shared store keeps one copy per id, and a derived id is
  the same for every attempt and every queue: an attempt that encoded differently (the
  connection stamping each with its own time) was stored under the first attempt's bytes
  for a queue that took only the second (a fanout whose first attempt reached one queue),
  and that queue's CRC refused them: a confirmed message dropped. A deduplicated message
  therefore carries no connection-stamped timestamp, and the producer's promise (the same
  message under the same sequence) covers every property it gives.
- A torn record at the end (a crash mid-append): its CRC fails; it and what follows are
  cut off. Its messages were not confirmed yet, and the tail covers them.
- A message consumed before its record was written, then the queue killed: acked (or
  fetched without an ack) before the index's buffer was written out, its entry never
  reaches the disk (a publish and its ack cancel out there), and an ack written out since
  zeroes its slot; neither the log nor the tail names it, and the producer, never told,
  re-sends it. So the queue process fetches nothing from the lowest seq id of a
  deduplicated message its log does not name yet (``_hold_from``), nor expires anything
  from there, until the log names it: a deduplicated message waits for its confirm and
  its record (one group commit, as its publisher does) before a consumer gets it, and
  what came after it waits behind it, in order. What a consumer took is then named by
  the log, and its re-sent copy is a repeat. A queue without deduplicated messages
  waiting holds nothing back. (What ``max_length`` drops from the head or a purge takes
  before its record is not consumed: re-sent after a kill, it is taken again.)
- Growth: past ``COMPACT_BYTES`` the log is rewritten (temporary file, fsync, rename)
  with one record per producer, leaving out producers unheard of for ``FORGET_AFTER_S``.

Left open: a queue started twice before a producer the log did not know yet re-sends its
first messages, which the first start recovered (its connection still recovering). Their
ids are kept in memory only (the log has no name to match them with); a record written
meanwhile (another producer's) moves the low water past their entries, and an ack zeroes
an entry: the second start does not collect them, and the re-sent messages are taken
again.
"""

from __future__ import annotations

import hashlib
import logging
import os
import struct
import time
from collections.abc import Iterable

from isal.isal_zlib import crc32

from warren.store import replicated_io

from ..durable_files import fsync_directory, write_atomically

__all__ = ["LOG_FILE", "ProducerLog", "message_ids"]

log = logging.getLogger("warren.queues")

LOG_FILE = "producers.log"
COMPACT_BYTES = 4 * 2**20
FORGET_AFTER_S = 7 * 24 * 3600  # Kafka forgets an idle idempotent producer after 7 days
_LENGTH = struct.Struct(">H")
_FIELDS = struct.Struct(">QQQ")
_CRC = struct.Struct(">I")


def message_ids(producer: bytes, first: int, count: int) -> list[bytes]:
    """The shared-store ids of ``count`` deduplicated messages from sequence ``first``: the
    same for every attempt and every queue they are routed to, and as unlikely to collide
    as random ids (a keyed BLAKE2b of producer and sequence; the producer hashed once)."""
    base = hashlib.blake2b(
        _LENGTH.pack(len(producer)) + producer, digest_size=16, person=b"warren-dedup"
    )
    ids = []
    for sequence in range(first, first + count):
        hasher = base.copy()
        hasher.update(sequence.to_bytes(8, "big"))
        ids.append(hasher.digest())
    return ids


def _record(producer: bytes, sequence: int, low_water: int, at_ms: int) -> bytes:
    body = _LENGTH.pack(len(producer)) + producer + _FIELDS.pack(sequence, low_water, at_ms)
    return body + _CRC.pack(crc32(body))


class ProducerLog:
    """The producers' highest durable sequences of one queue (see the module docstring)."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.path = os.path.join(os.fspath(directory), LOG_FILE)
        self.high: dict[bytes, int] = {}  # producer -> highest durable sequence
        self._seen_ms: dict[bytes, int] = {}
        self.low_water = 0  # of the last record
        # The file is made before the first deduplicated publish is taken, so a queue
        # without one has no tail of ids to collect at its start.
        self.existed = os.path.exists(self.path)
        self.torn_bytes = self._load()
        self._fd = -1
        self._size = 0
        if self.existed:
            self._open()

    def _open(self) -> None:
        self._fd = replicated_io.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._size = os.fstat(self._fd).st_size

    def begin(self) -> None:
        """Make the (empty) log, durably, before the queue takes its first deduplicated
        publish: from then on a start collects the recovered ids."""
        if self._fd >= 0:
            return
        self._open()
        fsync_directory(os.path.dirname(self.path))
        self.existed = True

    def _load(self) -> int:
        try:
            with open(self.path, "rb") as file:
                data = file.read()
        except FileNotFoundError:
            return 0
        at = 0
        while at + _LENGTH.size <= len(data):
            (length,) = _LENGTH.unpack_from(data, at)
            end = at + _LENGTH.size + length + _FIELDS.size
            if end + _CRC.size > len(data) or _CRC.unpack_from(data, end)[0] != crc32(data[at:end]):
                break
            producer = bytes(data[at + _LENGTH.size : at + _LENGTH.size + length])
            sequence, self.low_water, at_ms = _FIELDS.unpack_from(data, end - _FIELDS.size)
            self.high[producer] = max(sequence, self.high.get(producer, -1))
            self._seen_ms[producer] = at_ms
            at = end + _CRC.size
        if at < len(data):
            log.warning(
                "%s: cut off %d bytes after the last whole record (a write torn by "
                "a crash; its messages were not confirmed)",
                self.path,
                len(data) - at,
            )
            with open(self.path, "r+b") as file:
                replicated_io.ftruncate(file.fileno(), at)
                replicated_io.fdatasync(file.fileno())
        return len(data) - at

    def record(self, highs: Iterable[tuple[bytes, int]], low_water: int) -> None:
        """Append the new highest sequences (already durable in the queue) and fdatasync,
        before their publishers are told."""
        now_ms = int(time.time() * 1000)
        chunks = []
        for producer, sequence in highs:
            if sequence > self.high.get(producer, -1):
                self.high[producer] = sequence
            self._seen_ms[producer] = now_ms
            chunks.append(_record(producer, self.high[producer], low_water, now_ms))
        if not chunks:
            return
        self.begin()
        data = b"".join(chunks)
        replicated_io.write(self._fd, data)
        replicated_io.fdatasync(self._fd)
        self.low_water = low_water
        self._size += len(data)
        if self._size > COMPACT_BYTES:
            self.compact(low_water)

    def record_recovered(self, recovered: set[bytes]) -> None:
        """Name the sequences of producers the log knows that a start found among the
        ids of its recovered entries (``tail``): from each one's highest on, as long as
        they run unbroken (a hole is a message not durable: its re-send must be taken).
        Durable in the queue, they are logged at once, under the same low water (the
        tail may hold other producers' entries)."""
        highs = []
        for producer, high in self.high.items():
            sequence = high
            while message_ids(producer, sequence + 1, 1)[0] in recovered:
                sequence += 1
            if sequence > high:
                highs.append((producer, sequence))
        self.record(highs, self.low_water)

    def compact(self, low_water: int) -> None:
        """Rewrite the log with one record per producer heard of in ``FORGET_AFTER_S``."""
        now_ms = int(time.time() * 1000)
        keep = {
            p: s
            for p, s in self.high.items()
            if now_ms - self._seen_ms.get(p, now_ms) <= FORGET_AFTER_S * 1000
        }
        data = b"".join(_record(p, s, low_water, self._seen_ms[p]) for p, s in keep.items())
        write_atomically(self.path, data)
        os.close(self._fd)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        self.high = keep
        self._seen_ms = {p: self._seen_ms[p] for p in keep}
        self.low_water = low_water
        self._size = len(data)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

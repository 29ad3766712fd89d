"""``StoreClient``: what a queue (or a test, or an application) uses to talk to a store actor.

One client is one ``client_ref`` registered with one store actor; everything it sends
goes through this process's one socket to that actor, so its writes, removes and
terminate stay in order. Not thread-safe: one owner, as a queue process is.

Writes. ``write(msg_id, body)`` appends the record, in ``.rdq`` layout, to the current
batch and returns its sequence number. A batch goes out as one ``WriteBatch`` (one frame
of records) when it holds ``batch_messages`` records, ``batch_bytes`` bytes, or on
``flush()``. In flight at most ``max_in_flight`` messages and ``max_in_flight_bytes``
bytes (4000 and 32 MiB, RabbitMQ's credit); past them ``flush`` waits for the oldest batch
to be settled, so a client that outruns the store is slowed, never dropped: the credit
comes back one batch (``batch_messages``, 800) at a time.

Confirms. Each batch's answer is a ``Settled``: every write up to its last sequence
number is on disk, except the ignored ones (written and removed again before reaching
the disk: no I/O at all). ``settle()`` sends the current batch and waits for every answer;
``on_settled`` (when given) sees each ``Settled`` as it arrives. Every write is settled
exactly once.

Reads. A settled write's location is cached (memory only). ``read`` reads the record
straight from the file through the shared lock table (``store.lock_table``), and asks the
store when the location is unknown, the file is locked or gone, the data is not yet
flushed, or the record fails validation; the store's answer carries the fresh location.

Incarnations. While it waits for an answer, the client pings the store every
``restart_check_s``; a new incarnation means the store restarted and recovered from
disk, and the batches it had not settled may or may not have been written. The client
drops its cached locations and its in-flight batches, registers again, and raises
``StoreRestarted`` naming those writes as in doubt: send them again.

Races: a remove is sent only after the writes before it (the current batch is flushed
first), so the store always sees them in that order; ``terminate`` is answered after the
store has applied everything this client sent.
"""

from __future__ import annotations

import collections
import os
import struct
from collections.abc import Callable, Iterable

from actors import ActorDeadError, ActorError, ActorRef, AskTimeout

from .errors import StoreError
from .lock_table import LockTableReader
from .messages import (ClientDying, Contains, Found, Read, ReadMany, ReadsReport, Register,
                       Remove, Settled, StoreInfo, Terminate, WriteBatch)
from .records import HEADER, check_body, check_msg_id

MAX_IN_FLIGHT = 4000                  # msg_store_credit_disc_bound: messages ...
MAX_IN_FLIGHT_BYTES = 32 * 2**20      # ... or bytes in flight per client
BATCH_MESSAGES = 800                  # credit is granted back this many at a time
BATCH_BYTES = 4 * 2**20
RESTART_CHECK_S = 1.0
REPORT_READS_EVERY = 1000


class StoreRestarted(StoreError):
    """The store restarted: these writes (msg_id list) may not be on disk; send them again."""

    def __init__(self, in_doubt: list[bytes]) -> None:
        super().__init__(f"the store restarted; {len(in_doubt)} writes are in doubt")
        self.in_doubt = in_doubt


class StoreClient:
    def __init__(self, store: ActorRef, client_ref: bytes | None = None, *,
                 on_settled: Callable[[Settled], None] | None = None,
                 batch_messages: int = BATCH_MESSAGES, batch_bytes: int = BATCH_BYTES,
                 max_in_flight: int = MAX_IN_FLIGHT,
                 max_in_flight_bytes: int = MAX_IN_FLIGHT_BYTES,
                 restart_check_s: float = RESTART_CHECK_S) -> None:
        self.store = store.unpin()
        self.client_ref = client_ref if client_ref is not None else os.urandom(16)
        self.on_settled = on_settled
        self.batch_messages = batch_messages
        self.batch_bytes = batch_bytes
        self.max_in_flight = max_in_flight
        self.max_in_flight_bytes = max_in_flight_bytes
        self.restart_check_s = restart_check_s
        self._next_seq = 0
        self._batch: list[bytes] = []
        self._batch_ids: list[bytes] = []
        self._batch_bytes = 0
        # (future, first_seq, msg_ids, bytes) of each batch sent and not yet settled
        self._in_flight: collections.deque = collections.deque()
        self._in_flight_messages = 0
        self._in_flight_bytes = 0
        self._locations: dict[bytes, tuple[int, int, int]] = {}
        self.direct_reads = 0
        self.fallback_reads = 0
        self._reported = (0, 0)
        self._register()

    def _register(self) -> None:
        info: StoreInfo = self.store.ask(Register(self.client_ref))
        self.incarnation = info.incarnation
        self._reader = LockTableReader(info.directory)

    # ------------------------------------------------------------------ writes

    def write(self, msg_id: bytes, body: bytes) -> int:
        """Queue one write; its sequence number. Sent with the batch, settled later."""
        msg_id = check_msg_id(msg_id)
        body = check_body(body)
        seq = self._next_seq
        self._next_seq += 1
        self._batch.append(HEADER.pack(len(body) + 16, msg_id) + body + b"\xff")
        self._batch_ids.append(msg_id)
        self._batch_bytes += len(body) + 25
        if len(self._batch) >= self.batch_messages or self._batch_bytes >= self.batch_bytes:
            self.flush()
        return seq

    def flush(self) -> None:
        """Send the current batch; wait while more than the credit is in flight."""
        if self._batch:
            records = b"".join(self._batch)
            first = self._next_seq - len(self._batch)
            future = self.store.ask_async(WriteBatch(self.client_ref, first, records))
            self._in_flight.append((future, first, self._batch_ids, len(records)))
            self._in_flight_messages += len(self._batch)
            self._in_flight_bytes += len(records)
            self._batch, self._batch_ids, self._batch_bytes = [], [], 0
        while (self._in_flight_messages > self.max_in_flight
               or self._in_flight_bytes > self.max_in_flight_bytes):
            self._settle_oldest()

    def settle(self) -> None:
        """Send the current batch and wait until every write sent is settled."""
        self.flush()
        while self._in_flight:
            self._settle_oldest()

    @property
    def unsettled(self) -> int:
        """Writes sent or queued and not yet settled."""
        return self._in_flight_messages + len(self._batch)

    @property
    def batched(self) -> int:
        """Writes in the current batch, not yet sent."""
        return len(self._batch)

    def _settle_oldest(self) -> None:
        future, first, msg_ids, size = self._in_flight[0]
        while True:
            try:
                settled: Settled = future.get(timeout=self.restart_check_s)
                break
            except (AskTimeout, ActorDeadError):
                self._check_incarnation()
        self._in_flight.popleft()
        self._in_flight_messages -= len(msg_ids)
        self._in_flight_bytes -= size
        for seq, file, offset, total_size in settled.locations:
            self._locations[msg_ids[seq - first]] = (file, offset, total_size)
        if self.on_settled is not None:
            self.on_settled(settled)

    def _check_incarnation(self) -> None:
        try:
            incarnation = self.store.ping(timeout=self.restart_check_s).incarnation
        except ActorError:
            return                       # busy, or down and restarting: keep waiting
        if incarnation == self.incarnation:
            return
        in_doubt = [msg_id for _, _, ids, _ in self._in_flight for msg_id in ids]
        in_doubt += self._batch_ids
        self._in_flight.clear()
        self._in_flight_messages = self._in_flight_bytes = 0
        self._batch, self._batch_ids, self._batch_bytes = [], [], 0
        self._locations.clear()
        self._reader.close()
        self._register()
        raise StoreRestarted(in_doubt)

    def remove(self, msg_ids: Iterable[bytes]) -> None:
        """Drop one reference to each id (after the writes sent before it)."""
        msg_ids = [check_msg_id(m) for m in msg_ids]
        self.flush()
        for msg_id in msg_ids:
            self._locations.pop(msg_id, None)
        self.store.tell(Remove(self.client_ref, msg_ids))

    # ------------------------------------------------------------------ reads

    def read(self, msg_id: bytes) -> bytes | None:
        """The body of ``msg_id``: straight from the file when possible, else from the store."""
        msg_id = check_msg_id(msg_id)
        place = self._locations.get(msg_id)
        if place is not None:
            body = self._reader.read(place[0], place[1], place[2], msg_id)
            if body is not None:
                self.direct_reads += 1
                self._maybe_report_reads()
                return body
        self.fallback_reads += 1
        self._maybe_report_reads()
        return self._remember(msg_id, self.store.ask(Read(msg_id)))

    def read_many(self, msg_ids: list[bytes]) -> list[bytes | None]:
        """Bodies in the order asked: direct where possible, the rest in one ask."""
        msg_ids = [check_msg_id(m) for m in msg_ids]
        bodies: list[bytes | None] = [None] * len(msg_ids)
        missing = []
        for i, msg_id in enumerate(msg_ids):
            place = self._locations.get(msg_id)
            body = None if place is None else self._reader.read(*place, msg_id)
            if body is None:
                missing.append(i)
            else:
                bodies[i] = body
        self.direct_reads += len(msg_ids) - len(missing)
        if missing:
            self.fallback_reads += len(missing)
            found = self.store.ask(ReadMany([msg_ids[i] for i in missing]))
            for i, answer in zip(missing, found):
                bodies[i] = self._remember(msg_ids[i], answer)
        self._maybe_report_reads()
        return bodies

    def _remember(self, msg_id: bytes, found: Found | None) -> bytes | None:
        if found is None:
            return None
        if found.file >= 0:
            self._locations[msg_id] = (found.file, found.offset, found.total_size)
        return found.body

    def contains(self, msg_id: bytes) -> bool:
        return self.contains_many([msg_id])[0]

    def contains_many(self, msg_ids: list[bytes]) -> list[bool]:
        self.flush()
        return self.store.ask(Contains([check_msg_id(m) for m in msg_ids]))

    def _maybe_report_reads(self) -> None:
        if self.direct_reads + self.fallback_reads - sum(self._reported) >= REPORT_READS_EVERY:
            self._report_reads()

    def _report_reads(self) -> None:
        direct = self.direct_reads - self._reported[0]
        fallback = self.fallback_reads - self._reported[1]
        if direct or fallback:
            self.store.tell(ReadsReport(self.client_ref, direct, fallback))
            self._reported = (self.direct_reads, self.fallback_reads)

    # ------------------------------------------------------------------ ending

    def terminate(self) -> None:
        """Settle everything, then unregister (answered after all this client sent)."""
        self.settle()
        self._report_reads()
        self.store.ask(Terminate(self.client_ref))
        self._reader.close()

    def delete_and_terminate(self) -> None:
        """Go away without waiting: the store ignores this client's later writes of
        messages it does not hold, and forgets it."""
        self.store.tell(ClientDying(self.client_ref))
        self._reader.close()

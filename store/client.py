"""``StoreClient``: what a queue (or a test, or an application) uses to talk to a store actor.

One client is one ``client_ref`` registered with one store actor; everything it sends
goes through this process's one socket to that actor, so its writes, removes and
terminate stay in order. Not thread-safe: one owner, as a queue process is.

Writes. ``write(msg_id, body)`` appends the record, in ``.rdq`` layout, to the current
batch and returns its sequence number; ``remove(msg_ids)`` adds the removes to the batch,
in their place. A batch goes out as one ``WriteBatch`` (one frame
of records) when it holds ``batch_messages`` records, ``batch_bytes`` bytes, or on
``flush()``. In flight at most ``max_in_flight`` messages and ``max_in_flight_bytes``
bytes (4000 and 32 MiB, RabbitMQ's credit), and ``MAX_IN_FLIGHT_REQUESTS``
(``warren.actors.flow``) unanswered requests (tiny batches: a client's socket queues only
so many answers, and the store drops one that finds it full); ``flush`` waits for the
oldest batches to be settled until the next batch fits, so a client that outruns the
store is slowed, never dropped: the credit comes back one batch (``batch_messages``, 800)
at a time.

Confirms. Each batch's answer is a ``Settled``: every write up to its last sequence
number is on disk, except the ignored ones (written and removed again before reaching
the disk: no I/O at all). ``settle()`` sends the current batch and waits for every answer;
``on_settled`` (when given) sees each ``Settled`` as it arrives. Every write is settled
exactly once.

Credit is exact: before a batch is sent, the client waits for the oldest answers until
the batch fits the window, so at no moment are more than ``max_in_flight`` messages,
``max_in_flight_bytes`` bytes or ``MAX_IN_FLIGHT_REQUESTS`` batches unanswered (a single
batch larger than the whole window goes out alone).

Reads. A settled write's location is cached (memory only). ``read`` reads the record
straight from the file through the shared lock table (``warren.store.engine.lock_table``),
and asks the store when the location is unknown, the file is locked or gone, the data is
not yet flushed, or the record fails validation; the store's answer carries the fresh
location.

Registering. A client registers with its store when it is made: one round trip. A process
that needs clients of several stores (a queue starting: the persistent store's and the
transient one's) makes them with ``register_now=False``, which sends the ``Register``
and returns; the answer is taken by ``registered()``, or by the first use that needs it
(``recovered_clean``, a flush or another request). Its clients' registrations so cost one
round trip together, and each one's errors are raised where its answer is taken; a client
whose registration failed is done with, as one whose constructor raised.

Incarnations. Every request goes through the store's ref pinned to the incarnation the
client registered with: a store that restarted (and recovered from disk) drops and counts
what was meant for its predecessor instead of applying it, so nothing is applied twice.
The client learns of a restart before it sends anything (a new store renames a fresh lock
table into place: its inode changes) and while it waits for an answer (it pings the store
every ``restart_check_s``; a new incarnation answers). Then it raises ``StoreRestarted``
naming the writes and removes it had sent or queued without an answer: they may or may not
have been applied; it drops its cached locations, and registers again on next use (a
restart with nothing in doubt raises nothing: the client just registers with the new
store). A store silent for ``unavailable_after_s`` (its supervisor gave up) raises
``StoreUnavailable`` the same way; with ``unavailable_once_dead``, so does a store whose
process is gone, at once (a client that is restarted after its store, as a queue under
the node's rest_for_one root, waits for no successor: its supervisor stops it before the
store is started again). (A monitor would need the client to be an actor;
clients live in any process.)

Full disk. While the node's disk alarm is raised the store asks, through the lock
table, that writes be held: ``flush`` waits before sending a batch that holds writes
(removes alone still go), up to ``call_timeout_s``, then raises ``WritesBlocked``. Writes
that still meet a full disk fail alone: ``Settled.failed`` names them, and ``settle()``
raises ``DiskFull`` with their ids once every answer is in.

Every call ends. A read, contains or terminate whose store restarted while it waited is
asked again of the new incarnation (they change nothing, or nothing twice); one that gets
no answer within ``call_timeout_s`` raises ``StoreTimeout``, and so does registering with
a silent store (a client made, or any call after a restart of its store); writes end in
a settlement, ``StoreRestarted``, ``StoreUnavailable`` or that ``StoreTimeout``.

Races: a remove travels in the batch, in its place among the writes (``WriteBatch``), so
the store applies it after the writes before it and before those after it, a write and
its remove in one batch never reach the disk, and a remove is answered with its batch: a
remove lost with a dying store is reported in doubt, never forgotten. ``terminate`` is
answered after the store has applied everything this client sent.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from warren.actors import ActorDeadError, ActorError, ActorRef, AskTimeout
from warren.actors.flow import MAX_IN_FLIGHT, MAX_IN_FLIGHT_BYTES, CreditWindow
from warren.actors.process import process_exists

from .engine.lock_table import TABLE_FILE, LockTableReader
from .engine.message_store import Settlement
from .engine.records import HEADER, HEADER_BYTES, check_body, check_msg_id
from .errors import (
    DiskFull,
    StoreRestarted,
    StoreTimeout,
    StoreUnavailable,
    WritesBlocked,
)
from .protocol import (
    Claim,
    ClientDying,
    Contains,
    Found,
    Read,
    ReadMany,
    ReadsReport,
    Register,
    Settled,
    StoreInfo,
    Terminate,
    WriteBatch,
)

if TYPE_CHECKING:
    from warren.actors import Future

BATCH_MESSAGES = 800  # credit is granted back this many at a time
# A batch sent: (its answer, first sequence number, write ids, records' bytes, removes).
InFlight = tuple[Any, int, list[bytes], int, list[bytes]]
BATCH_BYTES = 4 * 2**20
RESTART_CHECK_S = 1.0
UNAVAILABLE_AFTER_S = 300.0
CALL_TIMEOUT_S = 60.0  # longest a read, contains or terminate waits
BLOCKED_POLL_S = 0.05  # how often held writes look at the disk alarm
REPORT_READS_EVERY = 1000


class StoreClient:
    def __init__(
        self,
        store: ActorRef,
        client_ref: bytes | None = None,
        *,
        on_settled: Callable[[Settled], None] | None = None,
        batch_messages: int = BATCH_MESSAGES,
        batch_bytes: int = BATCH_BYTES,
        max_in_flight: int = MAX_IN_FLIGHT,
        max_in_flight_bytes: int = MAX_IN_FLIGHT_BYTES,
        restart_check_s: float = RESTART_CHECK_S,
        unavailable_after_s: float = UNAVAILABLE_AFTER_S,
        call_timeout_s: float = CALL_TIMEOUT_S,
        unavailable_once_dead: bool = False,
        register_now: bool = True,
    ) -> None:
        self.store = store.unpin()  # whoever lives at the address: pings
        self.client_ref = client_ref if client_ref is not None else os.urandom(16)
        self.on_settled = on_settled
        self.batch_messages = batch_messages
        self.batch_bytes = batch_bytes
        self.max_in_flight = max_in_flight
        self.max_in_flight_bytes = max_in_flight_bytes
        self.restart_check_s = restart_check_s
        self.unavailable_after_s = unavailable_after_s
        self.call_timeout_s = call_timeout_s
        self.unavailable_once_dead = unavailable_once_dead
        self._next_seq = 0
        self._batch: list[bytes] = []
        self._batch_ids: list[bytes] = []
        self._batch_records: dict[bytes, bytes] = {}  # unsent writes, for reads
        self._batch_bytes = 0
        self._removes: list[tuple[int, list[bytes]]] = []  # in the batch: [after, ids]
        self._removed = 0
        # (future, first_seq, written msg_ids, bytes, removed msg_ids) of each batch sent
        # and not yet answered
        self._in_flight: CreditWindow[InFlight] = CreditWindow(max_in_flight, max_in_flight_bytes)
        self._locations: dict[bytes, tuple[int, int, int]] = {}
        self._failed: list[bytes] = []  # writes the full disk refused
        self._failed_seqs: list[int] = []  # the same, for ``settled``
        self.direct_reads = 0
        self.fallback_reads = 0
        self._reported = (0, 0)
        self._pinned: ActorRef | None = None
        self._recovered_clean = False
        self._store_start = ""
        # The answer to a Register sent and not yet taken (register_now=False).
        self._registering: Future | None = None
        if register_now:
            self._register()
        else:
            self._registering = self.store.ask_async(Register(self.client_ref))

    def registered(self) -> None:
        """Take the answer to the registration sent when this client was made with
        ``register_now=False`` (raising what registering raises); nothing otherwise."""
        if self._registering is not None:
            self._register()

    @property
    def recovered_clean(self) -> bool:
        """Whether the store it registered with recovered from a clean stop."""
        self.registered()
        return self._recovered_clean

    @property
    def store_start(self) -> str:
        """The start token of the store it registered with: another after its restart."""
        self.registered()
        return self._store_start

    def _register(self) -> ActorRef:
        """Register with the store (or take the answer to the registration sent ahead);
        its ref, pinned to the incarnation that answered."""
        registering, self._registering = self._registering, None
        try:
            if registering is not None:
                info: StoreInfo = registering.get(timeout=self.call_timeout_s)
            else:
                info = self.store.ask(Register(self.client_ref), timeout=self.call_timeout_s)
        except AskTimeout:
            raise StoreTimeout(
                f"the store did not register this client within "
                f"{self.call_timeout_s:g} s; it is alive but silent (stopped, "
                f"or recovering); ask again later"
            ) from None
        self._pinned = info.ref
        self.incarnation = info.ref.incarnation
        self._recovered_clean = info.recovered_clean
        self._store_start = info.start_token
        self._reader = LockTableReader(info.directory)
        self._table = os.path.join(info.directory, TABLE_FILE)
        self._table_inode = os.stat(self._table).st_ino
        return info.ref

    def _send(self, send: Callable[[ActorRef], Any]) -> Any:
        """Send through the pinned ref, after making sure the store did not restart; a
        store this process knows is dead means waiting for the next one to answer."""
        if self._pinned is not None and os.stat(self._table).st_ino != self._table_inode:
            self._restarted(StoreRestarted)
        pinned = self._pinned if self._pinned is not None else self._register()
        try:
            return send(pinned)
        except ActorDeadError:
            silent_since = time.monotonic()
            while not self._store_answers():
                if time.monotonic() - silent_since > self.unavailable_after_s:
                    self._restarted(StoreUnavailable)
            return send(self._pinned if self._pinned is not None else self._register())

    # ------------------------------------------------------------------ writes

    def write(self, msg_id: bytes, body: bytes) -> int:
        """Queue one write; its sequence number. Sent with the batch, settled later."""
        msg_id = check_msg_id(msg_id)
        body = check_body(body)
        seq = self._next_seq
        self._next_seq += 1
        record = HEADER.pack(len(body) + 16, msg_id) + body + b"\xff"
        self._batch.append(record)
        self._batch_ids.append(msg_id)
        self._batch_records[msg_id] = record
        self._batch_bytes += len(body) + 25
        if (
            len(self._batch) + self._removed >= self.batch_messages
            or self._batch_bytes >= self.batch_bytes
        ):
            self.flush()
        return seq

    def flush(self) -> None:
        """Send the current batch, once the credit has room for it."""
        self.registered()
        if not (self._batch or self._removes):
            return
        messages = len(self._batch) + self._removed
        if self._batch and self._reader.writes_blocked():
            self._wait_while_blocked()
        while self._in_flight.full_for(messages, self._batch_bytes):
            self._settle_oldest()
        records = b"".join(self._batch)
        first = self._next_seq - len(self._batch)
        request = WriteBatch(self.client_ref, first, records, self._removes)
        future = self._send(lambda store: store.ask_async(request))
        removed = [m for _, ids in self._removes for m in ids]
        self._in_flight.add(
            (future, first, self._batch_ids, len(records), removed), messages, len(records)
        )
        self._batch, self._batch_ids, self._batch_bytes = [], [], 0
        self._batch_records = {}
        self._removes, self._removed = [], 0

    def settle(self) -> None:
        """Send the current batch; wait until every write sent is settled and every remove
        sent is applied. ``DiskFull`` names the writes a full disk refused since the last
        ``settle``."""
        self.flush()
        while self._in_flight:
            self._settle_oldest()
        if self._failed:
            failed, self._failed = self._failed, []
            self._failed_seqs.clear()
            raise DiskFull(failed)

    def settled(self, wait: bool = True) -> Settlement:
        """Send the current batch; take in the answers already here (all of them, waiting,
        when ``wait``); report how far the writes are settled. The queue engine's
        asynchronous confirms: its sync calls this without waiting."""
        self.flush()
        while self._in_flight and (wait or _answered(self._in_flight.oldest()[0])):
            self._settle_oldest()
        up_to = (
            self._in_flight.oldest()[1] if self._in_flight else self._next_seq - len(self._batch)
        )
        failed, self._failed_seqs = self._failed_seqs, []
        self._failed.clear()
        return Settlement(up_to, failed)

    def _wait_while_blocked(self) -> None:
        deadline = time.monotonic() + self.call_timeout_s
        while self._reader.writes_blocked():
            if time.monotonic() >= deadline:
                raise WritesBlocked(
                    f"the node's disk alarm has held this client's writes "
                    f"for {self.call_timeout_s:g} s; free disk space"
                )
            time.sleep(BLOCKED_POLL_S)

    @property
    def unsettled(self) -> int:
        """Writes and removes sent or queued and not yet answered."""
        return self._in_flight.messages + len(self._batch) + self._removed

    @property
    def in_flight(self) -> int:
        """Writes and removes sent and not yet answered (never above ``max_in_flight``,
        but for one batch larger than the whole window)."""
        return self._in_flight.messages

    @property
    def batched(self) -> int:
        """Writes in the current batch, not yet sent."""
        return len(self._batch)

    def _settle_oldest(self) -> None:
        """Wait for the oldest batch's answer (its writes settled, its removes applied)."""
        future, first, msg_ids, _, _ = self._in_flight.oldest()
        silent_since = time.monotonic()
        while True:
            try:
                settled: Settled = future.get(timeout=self.restart_check_s)
                break
            except (AskTimeout, ActorDeadError):
                if self._store_answers():
                    silent_since = time.monotonic()
                elif time.monotonic() - silent_since > self.unavailable_after_s:
                    self._restarted(StoreUnavailable)
        self._in_flight.pop_oldest()
        for seq, file, offset, total_size in settled.locations:
            self._locations[msg_ids[seq - first]] = (file, offset, total_size)
        self._failed += [msg_ids[seq - first] for seq in settled.failed]
        self._failed_seqs += settled.failed
        if self.on_settled is not None and msg_ids:
            self.on_settled(settled)

    def _store_answers(self) -> bool:
        """Ping whoever lives at the store's address: True if our incarnation answers;
        raise StoreRestarted if another one does; False if nobody answers (or, with
        ``unavailable_once_dead``, StoreUnavailable once our incarnation's process is
        gone)."""
        pinned = self._pinned
        if self.unavailable_once_dead and pinned is not None and not process_exists(pinned.pid):
            self._restarted(StoreUnavailable)
        try:
            incarnation = self.store.ping(timeout=self.restart_check_s).incarnation
        except ActorError:
            return False  # busy, or down and restarting
        if incarnation != self.incarnation and self._pinned is not None:
            self._restarted(StoreRestarted)
        return True

    def _restarted(self, error: type[StoreRestarted]) -> None:
        """Give up on everything unanswered and forget the store's state; raise ``error``
        if anything was in doubt (or the store is unavailable), else carry on: the next
        request registers with the new store."""
        writes = [m for _, _, ids, _, _ in self._in_flight for m in ids] + self._batch_ids
        removes = [m for *_, removed in self._in_flight for m in removed]
        removes += [m for _, ids in self._removes for m in ids]
        self._in_flight.clear()
        self._batch, self._batch_ids, self._batch_bytes = [], [], 0
        self._batch_records = {}
        self._removes, self._removed = [], 0
        self._locations.clear()
        self._reader.close()
        self._pinned = None  # registers again on next use
        if writes or removes or error is StoreUnavailable:
            raise error(writes, removes)

    def remove(self, msg_ids: Iterable[bytes]) -> None:
        """Drop one reference to each id, in order after the writes before it (it travels
        in the batch, which ``flush``/``settle`` send)."""
        msg_ids = [check_msg_id(m) for m in msg_ids]
        if not msg_ids:
            return
        for msg_id in msg_ids:
            self._locations.pop(msg_id, None)
            self._batch_records.pop(msg_id, None)
        self._removes.append((len(self._batch), msg_ids))
        self._removed += len(msg_ids)
        if len(self._batch) + self._removed >= self.batch_messages:
            self.flush()

    # ------------------------------------------------------------------ reads

    def read(self, msg_id: bytes) -> bytes | None:
        """The body of ``msg_id``: from this client's unsent batch, straight from the file
        when possible, else from the store."""
        msg_id = check_msg_id(msg_id)
        unsent = self._batch_records.get(msg_id)
        if unsent is not None:
            return unsent[HEADER_BYTES:-1]
        place = self._locations.get(msg_id)
        if place is not None:
            body = self._reader.read(place[0], place[1], place[2], msg_id)
            if body is not None:
                self.direct_reads += 1
                self._maybe_report_reads()
                return body
        self.fallback_reads += 1
        self._maybe_report_reads()
        return self._remember(msg_id, self._ask(Read(msg_id)))

    def read_many(self, msg_ids: list[bytes]) -> list[bytes | None]:
        """Bodies in the order asked: direct where possible, the rest in one ask."""
        msg_ids = [check_msg_id(m) for m in msg_ids]
        bodies: list[bytes | None] = [None] * len(msg_ids)
        missing = []
        for i, msg_id in enumerate(msg_ids):
            unsent = self._batch_records.get(msg_id)
            if unsent is not None:  # written here, not sent yet: the store has none
                bodies[i] = unsent[HEADER_BYTES:-1]
                continue
            place = self._locations.get(msg_id)
            body = None if place is None else self._reader.read(*place, msg_id)
            if body is None:
                missing.append(i)
            else:
                bodies[i] = body
        self.direct_reads += len(msg_ids) - len(missing)
        if missing:
            self.fallback_reads += len(missing)
            found = self._ask(ReadMany([msg_ids[i] for i in missing]))
            for i, answer in zip(missing, found, strict=True):  # one answer per id asked
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
        return self._ask(Contains([check_msg_id(m) for m in msg_ids]))

    def claim_many(
        self, msg_ids: list[bytes], predecessors: list[bytes], written_since: str | None
    ) -> list[bool]:
        """Whether this client now holds a reference to each id: its own, one a
        predecessor (the client of this queue before a crash) held, or, unless the
        entries were written since the start of the store that answers
        (``written_since``, its ``store_start``), one recovered at that start
        (``MessageStore.claim``). Asked again of a store that restarted meanwhile, every
        entry is older than its start."""
        self.flush()
        ids = [check_msg_id(m) for m in msg_ids]
        return self._ask(Claim(self.client_ref, predecessors, ids, written_since))

    def _ask(self, request: Read | ReadMany | Contains | Claim | Terminate) -> Any:
        """Ask our store incarnation; after a restart, ask the new one again (every request
        sent through here changes nothing, or nothing twice: a claim asked again answers
        the same); StoreRestarted if writes or removes were in doubt, StoreTimeout after
        ``call_timeout_s`` without an answer."""
        deadline = time.monotonic() + self.call_timeout_s
        future = self._send(lambda store: store.ask_async(request))
        while True:
            wait_s = min(self.restart_check_s, deadline - time.monotonic())
            try:
                return future.get(timeout=max(0.0, wait_s))
            except (AskTimeout, ActorDeadError):
                self._store_answers()
                if time.monotonic() >= deadline:
                    raise StoreTimeout(
                        f"{type(request).__name__} got no answer from the store within "
                        f"{self.call_timeout_s:g} s; it is alive but silent (stopped, or "
                        f"recovering); nothing was lost, ask again later"
                    ) from None
                if self._pinned is None:  # restarted: our request died with it
                    future = self._send(lambda store: store.ask_async(request))

    def _maybe_report_reads(self) -> None:
        if self.direct_reads + self.fallback_reads - sum(self._reported) >= REPORT_READS_EVERY:
            self._report_reads()

    def _report_reads(self) -> None:
        direct = self.direct_reads - self._reported[0]
        fallback = self.fallback_reads - self._reported[1]
        if direct or fallback:
            report = ReadsReport(self.client_ref, direct, fallback)
            self._send(lambda store: store.tell(report))
            self._reported = (self.direct_reads, self.fallback_reads)

    # ------------------------------------------------------------------ ending

    def terminate(self) -> None:
        """Settle everything, then unregister (answered after all this client sent)."""
        self.settle()
        self._report_reads()
        self._ask(Terminate(self.client_ref))
        self._reader.close()

    def close(self) -> None:
        """Settle everything and let go, staying registered: a queue stopping cleanly,
        whose ref the store's clean-shutdown files keep naming for its next start."""
        self.settle()
        self._report_reads()
        self._reader.close()

    def delete_and_terminate(self) -> None:
        """Go away without waiting: the store ignores this client's later writes of
        messages it does not hold, and forgets it."""
        self._send(lambda store: store.tell(ClientDying(self.client_ref)))
        self._reader.close()


def _answered(future: Future) -> bool:
    """True once ``future`` holds an answer or an error (``get`` then returns at once)."""
    try:
        future.get(timeout=0)
    except AskTimeout:
        return False
    except Exception:  # an error answer: _settle_oldest raises it
        return True
    return True

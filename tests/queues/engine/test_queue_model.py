"""A model-based test of the variable queue, in the spirit of RabbitMQ's
classic_queue_prop_SUITE: random publishes, one by one and in batches (sizes across the
embed threshold, persistent or not, with and without expiry; a large batch may be written
at once), fetches, acks and requeues (also out of order), purges, RAM-target changes,
mode switches, clean restarts and dirty ones (the queue object dropped without
terminate), against a model of what must come back.

Invariants: nothing is delivered that was not published; messages come in seq-id order
(requeued ones back in their place, before newer ones); every confirmed persistent
message that was not acked survives every restart; after a dirty restart every message is
flagged redelivered (and may include acked ones: acks are not synced, at-least-once);
the per-state counts add up to the length; the byte totals, the gamma count and the
unconfirmed count ``stats()`` keeps running are what a walk of every status finds.
"""

import math
import shutil
import tempfile

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from warren.queues import VariableQueue, encode
from warren.store import LocalStoreClient, MessageStore

from ..helpers import (
    assert_counts_add_up,
    assert_running_figures_match_a_walk,
    message,
    number,
)

SIZES = st.sampled_from([10, 500, 3000, 5000, 20000])


class QueueModel(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.root = tempfile.mkdtemp(prefix="warren-model-")
        self.persistent = MessageStore(
            f"{self.root}/msg_store_persistent", file_size_limit=64 * 1024
        )
        self.transient = MessageStore(f"{self.root}/msg_store_transient")
        self.lazy = False
        self.queue = self._open()
        self.ready: dict[int, tuple[int, bool]] = {}  # seq id -> (number, persistent)
        self.pending: dict[int, tuple[int, bool]] = {}
        self.counts: dict[int, int] = {}  # seq id -> deliveries before
        self.confirmed: set[int] = set()  # numbers
        self.published: dict[int, bool] = {}  # number -> persistent
        self.acked: set[int] = set()
        self.expiries: dict[int, int] = {}  # seq id -> expiry_ms
        self.next_number = 0

    def _open(self):
        return VariableQueue(
            f"{self.root}/queue",
            segment_entry_count=16,
            io_batch_size=4,
            page_batch=20,
            lazy=self.lazy,
            persistent_store=lambda ref: LocalStoreClient(self.persistent, ref),
            transient_store=lambda ref: LocalStoreClient(self.transient, ref),
        )

    def teardown(self):
        self.queue.abandon()
        self.persistent.close()
        self.transient.close()
        shutil.rmtree(self.root)

    @rule(size=SIZES, persistent=st.booleans(), expires=st.booleans())
    def publish(self, size, persistent, expires):
        n = self.next_number
        self.next_number += 1
        seq_id = self.queue.publish(
            message(n, size=size, persistent=persistent), expiry_ms=n + 1 if expires else None
        )
        self.ready[seq_id] = (n, persistent)
        self.published[n] = persistent
        if expires:
            self.expiries[seq_id] = n + 1

    @rule(
        count=st.integers(1, 24),
        size=st.sampled_from([500, 3000, 5000]),  # 3000: a frame of 32 KiB from 11 on
        persistent=st.booleans(),
        expires=st.booleans(),
        sync_follows=st.booleans(),
    )
    def publish_batch(self, count, size, persistent, expires, sync_follows):
        """One producer's frame; a large one the sync is said to follow is written at once."""
        numbers = range(self.next_number, self.next_number + count)
        self.next_number += count
        expiry = numbers[0] + 1 if expires else None
        seq_ids = self.queue.publish_many(
            [encode(message(n, size=size, persistent=persistent)) for n in numbers],
            persistent=persistent,
            expiry_ms=expiry,
            sync_follows=sync_follows,
        )
        for seq_id, n in zip(seq_ids, numbers, strict=True):
            self.ready[seq_id] = (n, persistent)
            self.published[n] = persistent
            if expiry is not None:
                self.expiries[seq_id] = expiry

    @rule()
    def sync(self):
        by_seq = {**self.ready, **self.pending}
        for seq_id in self.queue.sync():
            if seq_id in by_seq:
                n, persistent = by_seq[seq_id]
                if persistent:
                    self.confirmed.add(n)

    @rule(ack=st.booleans())
    def fetch(self, ack):
        delivery = self.queue.fetch(ack_required=ack)
        if not self.ready:
            assert delivery is None
            return
        seq_id = min(self.ready)
        n, persistent = self.ready.pop(seq_id)
        assert (delivery.seq_id, number(delivery)) == (seq_id, n)
        assert delivery.delivery_count == self.counts.get(seq_id, 0)
        assert delivery.redelivered == (delivery.delivery_count > 0)
        if ack:
            self.pending[seq_id] = (n, persistent)
        else:
            self.acked.add(n)
            self.counts.pop(seq_id, None)

    @precondition(lambda self: self.pending)
    @rule(data=st.data(), requeue=st.booleans())
    def settle_some(self, data, requeue):
        tags = data.draw(st.lists(st.sampled_from(sorted(self.pending)), min_size=1, unique=True))
        if requeue:
            self.queue.requeue(tags)
            for seq_id in tags:
                self.ready[seq_id] = self.pending.pop(seq_id)
                self.counts[seq_id] = self.counts.get(seq_id, 0) + 1
        else:
            self.queue.ack(tags)
            for seq_id in tags:
                self.acked.add(self.pending.pop(seq_id)[0])
                self.counts.pop(seq_id, None)

    @rule()
    def purge(self):
        assert self.queue.purge() == len(self.ready)
        for seq_id, (n, _) in self.ready.items():
            self.acked.add(n)
            self.counts.pop(seq_id, None)
        self.ready.clear()

    @rule(now=st.integers(0, 200))
    def drop_expired(self, now):
        self.queue.drop_while(lambda info: 0 < info.expiry_ms <= now)
        while self.ready:
            seq_id = min(self.ready)
            if not 0 < self.expiries.get(seq_id, 0) <= now:
                break
            self.acked.add(self.ready.pop(seq_id)[0])
            self.counts.pop(seq_id, None)

    @rule(seconds=st.sampled_from([0, 0.5, math.inf]))
    def set_ram_target(self, seconds):
        self.queue.update_rates()
        self.queue.set_ram_duration_target(seconds)
        while self.queue.reduce_memory_use():
            pass

    @rule(lazy=st.booleans())
    def switch_mode(self, lazy):
        self.lazy = lazy
        self.queue.set_lazy(lazy)

    @rule()
    def clean_restart(self):
        self.queue.terminate()
        self.queue = self._open()
        assert self.queue.recovered_clean
        back = {**self.ready, **self.pending}
        for seq_id in self.pending:
            self.counts[seq_id] = self.counts.get(seq_id, 0) + 1
        self.ready = {s: v for s, v in back.items() if v[1]}
        self.pending = {}
        self.counts = {s: c for s, c in self.counts.items() if s in self.ready}
        self.expiries = {s: e for s, e in self.expiries.items() if s in self.ready}
        self.confirmed |= {n for n, persistent in self.ready.values()}

    @rule()
    def dirty_restart(self):
        self.queue.abandon()
        self.queue = self._open()
        assert not self.queue.recovered_clean
        deliveries = []
        while (delivery := self.queue.fetch()) is not None:
            deliveries.append(delivery)
        numbers = [number(d) for d in deliveries]
        assert numbers == sorted(numbers) and len(set(numbers)) == len(numbers)
        assert all(d.redelivered for d in deliveries)
        assert all(self.published[n] for n in numbers)  # persistent ones only
        must_survive = {
            n for n, _ in [*self.ready.values(), *self.pending.values()] if n in self.confirmed
        }
        assert must_survive <= set(numbers)
        self.queue.requeue([d.seq_id for d in deliveries])
        self.ready = {d.seq_id: (number(d), True) for d in deliveries}
        self.pending = {}
        self.counts = {d.seq_id: d.delivery_count + 1 for d in deliveries}
        self.expiries = {s: e for s, e in self.expiries.items() if s in self.ready}
        self.confirmed |= set(numbers)

    @invariant()
    def counts_add_up(self):
        stats = assert_counts_add_up(self.queue)
        assert stats["len"] == len(self.ready)
        assert stats["pending_acks_ram"] + stats["pending_acks_disk"] == len(self.pending)

    @invariant()
    def running_figures_match_a_walk(self):
        assert_running_figures_match_a_walk(self.queue)


QueueModel.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=50,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_the_queue_behaves_as_its_model = QueueModel.TestCase

"""A full disk fails only the writes that do not fit, reported as failed, once each; the
store stays open, serves reads and removes, and writes again by itself once space is
back. Run on a real small filesystem."""

import os

from warren.store import MessageStore

from ..helpers import body, fill_disk, msg_id

LIMIT = 256 * 1024


def test_writes_on_a_full_disk_fail_and_everything_confirmed_stays_readable(small_disk):
    directory = small_disk / "store"
    with MessageStore(directory, file_size_limit=LIMIT) as store:
        for n in range(500):
            store.write(msg_id(n), body(n, 1000))
        assert len(store.sync().durable) == 500
        filler = fill_disk(small_disk)

        for n in range(500, 2000):  # more than the reserved file holds
            store.write(msg_id(n), body(n, 1000))
        settled = store.sync()
        assert settled.failed, "nothing failed: the disk was not full"
        assert set(settled.durable).isdisjoint(settled.failed)
        assert len(settled.durable) + len(settled.failed) == 1500
        assert store.stats()["disk_full"] is True
        for ticket in settled.failed:  # tickets count the writes from 0
            assert not store.contains(msg_id(ticket))
        for ticket in settled.durable:
            assert store.read(msg_id(ticket)) == body(ticket, 1000)
        for n in range(500):
            assert store.read(msg_id(n)) == body(n, 1000)
        assert store.remove(msg_id(0))
        assert store.sync().failed == []

        os.unlink(filler)
        for n in range(2000, 2100):
            store.write(msg_id(n), body(n, 1000))
        assert len(store.sync().durable) == 100
        assert store.stats()["disk_full"] is False
        for n in range(2000, 2100):
            assert store.read(msg_id(n)) == body(n, 1000)


def test_a_store_that_crashed_on_a_full_disk_recovers_everything_confirmed(small_disk):
    directory = small_disk / "store"
    store = MessageStore(directory, file_size_limit=LIMIT)
    for n in range(300):
        store.write(msg_id(n), body(n, 1000))
    store.sync()
    fill_disk(small_disk)
    for n in range(300, 1500):
        store.write(msg_id(n), body(n, 1000))
    settled = store.sync()
    durable = set(range(300)) | set(settled.durable)
    store._release()  # a crash: no clean-shutdown files
    with MessageStore(directory, file_size_limit=LIMIT) as recovered:
        assert not recovered.recovered_clean
        for n in durable:
            assert recovered.read(msg_id(n)) == body(n, 1000), n

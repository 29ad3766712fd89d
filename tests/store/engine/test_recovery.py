"""Restarts: clean ones load the saved index, every other start rebuilds from the files,
and neither loses a synced message nor trusts a damaged shutdown file."""

import logging
import os

import pytest

from warren.store import MessageStore
from warren.store.engine.records import encode_record
from warren.store.engine.snapshot import FILES, MARKER_FILE

from ..helpers import body, fill, msg_id, record


def crash(store):
    """Stop the store the way a SIGKILL would: no shutdown files, nothing flushed."""
    store._release()


def test_a_clean_restart_loads_the_saved_index_and_deletes_the_shutdown_files(store_dir):
    with MessageStore(store_dir, file_size_limit=1000) as store:
        fill(store, range(30))
        store.write(msg_id(0), body(0))  # a second reference
        store.remove(msg_id(1))
    assert sorted(set(FILES) & set(os.listdir(store_dir))) == sorted(FILES)
    with MessageStore(store_dir, file_size_limit=1000) as store:
        assert store.recovered_clean
        assert not set(FILES) & set(os.listdir(store_dir))
        assert not store.contains(msg_id(1))
        assert all(store.read(msg_id(n)) == body(n) for n in range(2, 30))
        store.remove(msg_id(0))
        assert store.read(msg_id(0)) == body(0)  # one reference left


def test_a_dirty_restart_rebuilds_every_synced_message_from_the_files(store_dir):
    store = MessageStore(store_dir, file_size_limit=1000)
    fill(store, range(30))
    crash(store)
    with MessageStore(store_dir, file_size_limit=1000) as again:
        assert not again.recovered_clean
        assert all(again.read(msg_id(n)) == body(n) for n in range(30))
        assert again.stats()["message_count"] == 30


def test_a_crash_right_after_a_clean_start_makes_the_next_start_dirty(store_dir):
    with MessageStore(store_dir) as store:
        fill(store, range(5))
    store = MessageStore(store_dir)
    assert store.recovered_clean
    crash(store)
    with MessageStore(store_dir) as again:
        assert not again.recovered_clean
        assert all(again.read(msg_id(n)) == body(n) for n in range(5))


def test_reference_counts_come_from_the_given_source_on_a_dirty_start(store_dir):
    store = MessageStore(store_dir)
    fill(store, range(1, 101))
    crash(store)
    # A walker over queue indexes: ids 51..100, every other one referenced, twice for some.
    refs = [(msg_id(n), 1) for n in range(51, 101, 2)] + [(msg_id(99), 1)]
    refs += [(msg_id(n), 0) for n in range(52, 101, 2)] + [(msg_id(500), 1)]
    with MessageStore(store_dir, ref_counts=iter(refs)) as again:
        present = {n for n in range(1, 101) if again.contains(msg_id(n))}
        assert present == set(range(51, 101, 2))
        assert not again.contains(msg_id(500))  # referenced, but no data
        assert again.stats()["recovery_missing"] == 1
        again.remove(msg_id(99))
        assert again.read(msg_id(99)) == body(99)  # it had two references
        again.remove(msg_id(99))
        assert not again.contains(msg_id(99))


def test_without_reference_counts_the_last_copy_of_a_reused_id_wins(store_dir):
    store = MessageStore(store_dir, file_size_limit=1000)
    store.write(msg_id(1), b"old body")
    fill(store, range(2, 20))
    store.remove(msg_id(1))
    store.write(msg_id(1), b"new body")  # a fresh record in a later file
    store.sync()
    crash(store)
    with MessageStore(store_dir, file_size_limit=1000) as again:
        assert again.read(msg_id(1)) == b"new body"


def test_a_dirty_start_truncates_a_torn_tail_and_new_writes_follow_the_last_record(store_dir):
    store = MessageStore(store_dir)
    fill(store, range(3))
    crash(store)
    with open(store_dir / "0.rdq", "ab") as f:
        f.write(record(9)[:-30])  # a write torn by the crash
    with MessageStore(store_dir) as again:
        assert not again.contains(msg_id(9))
        assert os.path.getsize(store_dir / "0.rdq") == 375
        again.write(msg_id(10), body(10))
        again.sync()
        assert again.location(msg_id(10)).offset == 375
    with MessageStore(store_dir) as third:
        assert [third.read(msg_id(n)) for n in (0, 1, 2, 10)] == [body(n) for n in (0, 1, 2, 10)]


def test_a_damaged_region_is_skipped_reported_and_logged_without_stopping_the_open(
    store_dir, caplog
):
    store = MessageStore(store_dir, file_size_limit=1000)
    fill(store, range(20))
    crash(store)
    with open(store_dir / "0.rdq", "r+b") as f:
        f.seek(130)
        f.write(b"\xde\xad\xbe\xef" * 10)  # inside the second record
    with caplog.at_level(logging.WARNING, logger="warren.store"):
        with MessageStore(store_dir, file_size_limit=1000) as again:
            assert not again.contains(msg_id(1))
            assert all(again.read(msg_id(n)) == body(n) for n in [0] + list(range(2, 20)))
            assert again.stats()["damaged"] == [{"file": 0, "offset": 125, "length": 125}]
    assert "damaged bytes" in caplog.text


@pytest.mark.parametrize("damage", ["empty", "truncated", "flipped", "missing-index"])
def test_a_damaged_or_incomplete_clean_marker_means_a_dirty_start(store_dir, damage):
    with MessageStore(store_dir) as store:
        fill(store, range(10))
    if damage == "empty":
        (store_dir / MARKER_FILE).write_bytes(b"")
    elif damage == "truncated":
        data = (store_dir / MARKER_FILE).read_bytes()
        (store_dir / MARKER_FILE).write_bytes(data[:-3])
    elif damage == "flipped":
        data = bytearray((store_dir / "index.snapshot").read_bytes())
        data[-1] ^= 0xFF
        (store_dir / "index.snapshot").write_bytes(bytes(data))
    else:
        os.unlink(store_dir / "index.snapshot")
    with MessageStore(store_dir) as again:
        assert not again.recovered_clean
        assert all(again.read(msg_id(n)) == body(n) for n in range(10))


def test_a_clean_start_needs_the_same_clients_as_the_shutdown(store_dir):
    with MessageStore(store_dir) as store:
        store.register_client(b"queue-a")
        store.register_client(b"queue-b")
        fill(store, range(10))
    with MessageStore(store_dir, clean_clients=[b"queue-b", b"queue-a"]) as same:
        assert same.recovered_clean
        assert same.clients == {b"queue-a", b"queue-b"}
    with MessageStore(store_dir, clean_clients=[b"queue-a"]) as one_crashed:
        assert not one_crashed.recovered_clean
        assert all(one_crashed.read(msg_id(n)) == body(n) for n in range(10))


def test_a_data_file_changed_after_a_clean_stop_means_a_dirty_start(store_dir):
    with MessageStore(store_dir) as store:
        fill(store, range(10))
    with open(store_dir / "0.rdq", "ab") as f:
        f.write(encode_record(msg_id(77), b"appended behind the store's back"))
    with MessageStore(store_dir) as again:
        assert not again.recovered_clean
        assert again.read(msg_id(77)) == b"appended behind the store's back"


def test_a_stray_temporary_file_from_a_combine_is_deleted_at_start(store_dir):
    with MessageStore(store_dir) as store:
        fill(store, range(3))
    (store_dir / "0.rdt").write_bytes(record(1))
    with MessageStore(store_dir) as again:
        assert "0.rdt" not in os.listdir(store_dir)
        assert again.recovered_clean


def test_an_empty_directory_opens_as_an_empty_store_with_file_zero(store_dir):
    with MessageStore(store_dir) as store:
        assert store.stats()["message_count"] == 0
        assert "0.rdq" in os.listdir(store_dir)


def test_references_to_messages_never_written_are_dropped_below_warning_unless_data_was_damaged(
    store_dir, caplog
):
    """A crash between a queue's index write and the store's write leaves references
    without data: the expected loss of unconfirmed messages, logged at INFO. The same
    loss beside damaged bytes is a warning: confirmed data may have been in them."""
    store = MessageStore(store_dir, file_size_limit=1000)
    fill(store, range(20))
    crash(store)
    never_written = [(msg_id(n), 1) for n in range(100, 103)]
    refs = [(msg_id(n), 1) for n in range(20)] + never_written
    with caplog.at_level(logging.INFO, logger="warren.store"):
        again = MessageStore(store_dir, file_size_limit=1000, ref_counts=iter(refs))
        assert again.stats()["recovery_missing"] == 3
        crash(again)
    dropped = [r for r in caplog.records if "were not yet written" in r.getMessage()]
    assert [r.levelno for r in dropped] == [logging.INFO]
    assert "3 referenced messages" in dropped[0].getMessage()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    caplog.clear()
    with open(store_dir / "0.rdq", "r+b") as f:
        f.seek(130)
        f.write(b"\xde\xad\xbe\xef" * 10)  # inside the second record: its data is gone
    with caplog.at_level(logging.INFO, logger="warren.store"):
        with MessageStore(store_dir, file_size_limit=1000, ref_counts=iter(refs)):
            pass
    warned = [r for r in caplog.records if "have no data on disk" in r.getMessage()]
    assert [r.levelno for r in warned] == [logging.WARNING]

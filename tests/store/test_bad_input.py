"""Bad input gets a clear error from store.errors and changes nothing."""

import os
import shutil
import subprocess

import pytest

from warren.store import (
    InvalidBody,
    InvalidMessageId,
    MessageStore,
    StoreClosed,
    StoreDirectoryError,
    StoreLocked,
)

from .helpers import body, msg_id


@pytest.mark.parametrize("bad_id", [b"short", b"x" * 17, b"", "a str of sixteen", 16, None])
def test_a_msg_id_that_is_not_16_bytes_is_refused_everywhere(open_store, bad_id):
    store = open_store()
    for call in (
        lambda: store.write(bad_id, b"body"),
        lambda: store.remove(bad_id),
        lambda: store.read(bad_id),
        lambda: store.contains(bad_id),
    ):
        with pytest.raises(InvalidMessageId, match="16 bytes"):
            call()
    assert store.stats()["message_count"] == 0


@pytest.mark.parametrize("bad_body", ["text", 42, None, [b"a"]])
def test_a_body_that_is_not_bytes_is_refused_and_nothing_is_stored(open_store, bad_body):
    store = open_store()
    with pytest.raises(InvalidBody, match="must be bytes"):
        store.write(msg_id(1), bad_body)
    assert not store.contains(msg_id(1))


def test_bytearray_and_memoryview_bodies_are_stored_as_bytes(open_store):
    store = open_store()
    store.write(msg_id(1), bytearray(b"abc"))
    store.write(msg_id(2), memoryview(b"def"))
    store.sync()
    assert (store.read(msg_id(1)), store.read(msg_id(2))) == (b"abc", b"def")


def test_a_directory_that_is_a_file_is_refused(tmp_path):
    path = tmp_path / "not-a-dir"
    path.write_text("hello")
    with pytest.raises(StoreDirectoryError, match="not a directory"):
        MessageStore(path)
    assert path.read_text() == "hello"


def _make_unwritable(directory) -> None:
    if os.geteuid() == 0 and shutil.which("chattr"):
        subprocess.run(["chattr", "+i", str(directory)], check=True)
    else:
        os.chmod(directory, 0o555)


def _make_writable(directory) -> None:
    if os.geteuid() == 0 and shutil.which("chattr"):
        subprocess.run(["chattr", "-i", str(directory)], check=True)
    os.chmod(directory, 0o755)


def test_a_directory_that_is_not_writable_is_refused(tmp_path):
    directory = tmp_path / "read-only"
    directory.mkdir()
    try:
        _make_unwritable(directory)
        if os.access(directory, os.W_OK) and os.geteuid() != 0:
            pytest.skip("cannot make a directory unwritable here")
        with pytest.raises(StoreDirectoryError, match="not writable"):
            MessageStore(directory)
    finally:
        _make_writable(directory)
    assert os.listdir(directory) == []


def test_a_second_store_on_the_same_directory_in_one_process_is_refused(
    open_store, store_dir, held_lock_refused_at_once
):
    store = open_store()
    store.write(msg_id(1), body(1))
    with pytest.raises(StoreLocked):
        MessageStore(store_dir)
    store.sync()
    assert store.read(msg_id(1)) == body(1)


def test_a_closed_store_refuses_every_call(open_store):
    store = open_store()
    store.close()
    with pytest.raises(StoreClosed):
        store.write(msg_id(1), b"x")
    with pytest.raises(StoreClosed):
        store.read(msg_id(1))


@pytest.mark.parametrize(
    "option,value",
    [
        ("sync_policy", "sometimes"),
        ("file_size_limit", 0),
        ("file_size_limit", 2**40),
        ("garbage_fraction", 1.5),
    ],
)
def test_invalid_options_are_refused_with_their_name_and_value(store_dir, option, value):
    with pytest.raises(ValueError, match=option):
        MessageStore(store_dir, **{option: value})


def test_a_failed_fsync_breaks_the_store_which_then_recovers_dirty(
    open_store, store_dir, monkeypatch
):
    store = open_store()
    store.write(msg_id(1), body(1))
    store.sync()
    store.write(msg_id(2), body(2))

    def failing_fdatasync(fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", failing_fdatasync)
    with pytest.raises(OSError, match="Input/output"):
        store.sync()
    monkeypatch.undo()
    with pytest.raises(StoreClosed, match="failed"):
        store.write(msg_id(3), b"x")
    store.close()
    with MessageStore(store_dir) as again:
        assert not again.recovered_clean
        assert again.read(msg_id(1)) == body(1)


def test_ids_given_as_bytearray_or_memoryview_name_the_same_message(open_store):
    store = open_store()
    store.write(bytearray(msg_id(1)), body(1))
    store.sync()
    assert store.read(memoryview(msg_id(1))) == body(1)
    assert store.read(bytearray(msg_id(1))) == body(1)
    assert store.contains(bytearray(msg_id(1)))

"""An exception that lands inside a multi-step change of the store (a KeyboardInterrupt in
an embedding program, a bug, an OS error) never lets a clean snapshot describe files that
disagree with it: the store stops, the next open recovers dirty, and every confirmed
message reads back its exact body. Once a SIGTERM unwound a store actor in the middle of a
combine's apply and the "clean" snapshot then pointed into a file never renamed in. A
combine interrupted while it is only being staged has changed nothing at all."""

import os

import pytest

from warren.store import MessageStore, rewrite_combine
from warren.store.engine import index as idx
from warren.store.engine import snapshot

from ..helpers import body, build_fragmented_store, msg_id


class Interrupted(BaseException):
    """What a signal handler or Ctrl-C raises in the middle of anything."""


def interrupt_after(calls: int, real):
    seen = [0]

    def wrapper(*args, **kwargs):
        seen[0] += 1
        if seen[0] > calls:
            raise Interrupted
        return real(*args, **kwargs)

    return wrapper


def reopen_and_check(store_dir, live):
    with MessageStore(store_dir) as reopened:
        assert not reopened.recovered_clean
        for n, expected in live.items():
            assert reopened.read(msg_id(n)) == expected, n


@pytest.mark.parametrize("share_staged", [0.0, 0.1, 0.5, 0.99])
def test_a_combine_interrupted_while_staging_changes_nothing(store_dir, monkeypatch, share_staged):
    store = MessageStore(store_dir, file_size_limit=4096, auto_gc=False)
    live = build_fragmented_store(store)
    first = store.plan_combine()
    staged = len(first.dst_records) + len(first.src_records)
    store.abandon_combine(first)  # the same pair is chosen again below
    monkeypatch.setattr(idx, "relocate", interrupt_after(int(share_staged * staged), idx.relocate))
    with pytest.raises(Interrupted):
        store.plan_combine()
    monkeypatch.undo()
    for n, expected in live.items():  # the index was never touched
        assert store.read(msg_id(n)) == expected
    store.close()
    with MessageStore(store_dir) as reopened:
        assert reopened.recovered_clean
        for n, expected in live.items():
            assert reopened.read(msg_id(n)) == expected, n


@pytest.mark.parametrize("step", ["rename", "unlink"])
def test_a_combine_interrupted_while_switching_files_never_closes_clean(
    store_dir, monkeypatch, step
):
    store = MessageStore(store_dir, file_size_limit=4096, auto_gc=False)
    live = build_fragmented_store(store)
    plan = store.plan_combine()
    result = rewrite_combine(store_dir, plan)
    monkeypatch.setattr(os, step, interrupt_after(0, getattr(os, step)))
    with pytest.raises(Interrupted):
        store.apply_combine(plan, result)
    monkeypatch.undo()
    assert store.close() is None
    assert not any((store_dir / name).exists() for name in snapshot.FILES)
    reopen_and_check(store_dir, live)


@pytest.mark.parametrize("writes", [0, 1, 3])
def test_a_flush_or_rollover_interrupted_mid_write_never_closes_clean(
    store_dir, monkeypatch, writes
):
    store = MessageStore(store_dir, file_size_limit=2000, auto_gc=False)
    live = {n: body(n, 300) for n in range(20)}
    for n, expected in live.items():
        store.write(msg_id(n), expected)
    store.sync()
    for n in range(20, 40):
        store.write(msg_id(n), body(n, 300))
    monkeypatch.setattr(os, "write", interrupt_after(writes, os.write))
    with pytest.raises(Interrupted):
        store.sync()
    monkeypatch.undo()
    store.close()
    reopen_and_check(store_dir, live)


def test_a_write_interrupted_between_its_index_and_its_record_never_closes_clean(
    store_dir, monkeypatch
):
    store = MessageStore(store_dir, auto_gc=False, write_buffer_bytes=1000)
    live = {n: body(n, 300) for n in range(5)}
    for n, expected in live.items():
        store.write(msg_id(n), expected)
    store.sync()
    monkeypatch.setattr(store, "_flush", interrupt_after(0, store._flush))
    with pytest.raises(Interrupted):
        for n in range(5, 20):
            store.write(msg_id(n), body(n, 300))
    monkeypatch.undo()
    store.close()
    reopen_and_check(store_dir, live)

"""A child process for the crash tests: it works on a store until the test kills it.

python -m tests.store.crash_child write DIR
    writes batches of 50, syncs, removes the batch written five batches earlier,
    syncs, prints the batch number; forever.
python -m tests.store.crash_child combine DIR POINT
    builds a fragmented store, then SIGKILLs itself at POINT of the first combine:
    after-plan, mid-copy, before-fsync, after-rename, before-delete.
python -m tests.store.crash_child compact DIR POINT
    builds the same store, then SIGKILLs itself at POINT of the first compaction:
    after-journal, mid-blank, mid-move, before-fsync, after-journal-delete, after-cut.
python -m tests.store.crash_child gc DIR FILE TOKEN_HEX POINT
    the GC's part of a compaction the test's store planned (its journal written):
    SIGKILLs itself at POINT (mid-move, before-fsync).
python -m tests.store.crash_child hold DIR
    opens the store, prints "open", and waits to be killed.
python -m tests.store.crash_child churn DIR [restart]
    writes CHURN messages, removes the odd ones, writes some removed ids again with new
    bodies (``churned_bodies``), syncs after each step; with "restart", stops cleanly
    and opens the store again; prints "ready", and waits to be killed.
"""

import os
import signal
import sys
import time

import warren.store.engine.compacting
import warren.store.engine.gc
from warren.store import MessageStore

from .helpers import body, build_fragmented_store, msg_id

BATCH = 50


def batch_size(n: int) -> int:
    return 1000 + n % 3000


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def write_forever(directory: str) -> None:
    store_ = MessageStore(directory, file_size_limit=64 * 1024)
    batch = 0
    while True:
        for n in range(batch * BATCH, (batch + 1) * BATCH):
            store_.write(msg_id(n), body(n, batch_size(n)))
        store_.sync()
        if batch >= 5:
            for n in range((batch - 5) * BATCH, (batch - 4) * BATCH):
                store_.remove(msg_id(n))
            store_.sync()
        print(batch, flush=True)
        batch += 1


def kill_at(point: str) -> None:
    """Arrange for this process to SIGKILL itself at one step of a combine."""
    real_rewrite = warren.store.engine.gc.rewrite_combine
    real_write, real_fdatasync = os.write, os.fdatasync
    real_rename, real_unlink = os.rename, os.unlink
    copying = []

    def rewrite_then(directory, plan):
        if point == "after-plan":
            die()
        copying.append(True)
        return real_rewrite(directory, plan)

    def write(fd, data):
        if point == "mid-copy" and copying:
            real_write(fd, bytes(data[: len(data) // 2]))  # a torn Dst.rdt
            die()
        return real_write(fd, data)

    def fdatasync(fd):
        if point == "before-fsync" and copying:
            die()
        return real_fdatasync(fd)

    def rename(src, dst, **kwargs):
        real_rename(src, dst, **kwargs)
        if point == "after-rename" and str(src).endswith(".rdt"):
            die()

    def unlink(path, **kwargs):
        if point == "before-delete" and str(path).endswith(".rdq"):
            die()
        return real_unlink(path, **kwargs)

    warren.store.engine.gc.rewrite_combine = rewrite_then
    os.write, os.fdatasync, os.rename, os.unlink = write, fdatasync, rename, unlink


def kill_in_compaction_at(point: str) -> None:
    """Arrange for this process to SIGKILL itself at one step of a compaction."""
    real_compact = warren.store.engine.compacting.compact_in_place
    real_pwrite, real_fdatasync = os.pwrite, os.fdatasync
    real_unlink, real_ftruncate = os.unlink, os.ftruncate
    moving = []

    def compact_then(directory, file, token=None):
        if point == "after-journal":
            die()
        moving.append(True)
        return real_compact(directory, file, token)

    def pwrite(fd, data, offset):
        zeros = not any(data)
        if moving and ((point == "mid-blank" and zeros) or (point == "mid-move" and not zeros)):
            real_pwrite(fd, bytes(data[: len(data) // 2]), offset)  # torn
            die()
        return real_pwrite(fd, data, offset)

    def fdatasync(fd):
        if (
            point == "before-fsync"
            and moving
            and os.readlink(f"/proc/self/fd/{fd}").endswith(".rdq")
        ):
            die()  # the moves written, not yet durable
        return real_fdatasync(fd)

    def unlink(path, **kwargs):
        real_unlink(path, **kwargs)
        if point == "after-journal-delete" and str(path).endswith(".compact"):
            die()

    def ftruncate(fd, length):
        real_ftruncate(fd, length)
        if point == "after-cut":
            die()

    warren.store.engine.compacting.compact_in_place = compact_then
    os.pwrite, os.fdatasync, os.unlink, os.ftruncate = pwrite, fdatasync, unlink, ftruncate


def compact_and_die(directory: str, point: str) -> None:
    store_ = MessageStore(directory, file_size_limit=4096, auto_gc=False, gc="compact")
    build_fragmented_store(store_)
    kill_in_compaction_at(point)
    print("compacting", flush=True)
    store_.collect_garbage()
    print("compaction finished without reaching the crash point", flush=True)


def gc_compacts_and_dies(directory: str, file: str, token: str, point: str) -> None:
    kill_in_compaction_at(point)
    print("moving", flush=True)
    warren.store.engine.compacting.compact_in_place(directory, int(file), bytes.fromhex(token))
    print("compaction finished without reaching the crash point", flush=True)


def combine_and_die(directory: str, point: str) -> None:
    store_ = MessageStore(directory, file_size_limit=4096, auto_gc=False, gc="combine")
    build_fragmented_store(store_)
    kill_at(point)
    print("combining", flush=True)
    store_.collect_garbage()
    print("combine finished without reaching the crash point", flush=True)


CHURN = 3000


def churned_bodies() -> dict[int, bytes]:
    """What a churned store holds: the even messages, and every 10th odd id rewritten."""
    live = {n: body(n) for n in range(0, CHURN, 2)}
    live.update({n: body(n, 80, generation=1) for n in range(1, CHURN, 20)})
    return live


def churn(directory: str, restart: bool) -> None:
    store_ = MessageStore(directory, file_size_limit=16 * 1024, auto_gc=False)
    for n in range(CHURN):
        store_.write(msg_id(n), body(n))
    store_.sync()
    for n in range(1, CHURN, 2):
        store_.remove(msg_id(n))
    store_.sync()
    for n in range(1, CHURN, 20):
        store_.write(msg_id(n), body(n, 80, generation=1))
    store_.sync()
    if restart:
        store_.close()
        store_ = MessageStore(directory, file_size_limit=16 * 1024, auto_gc=False)
    print("ready", flush=True)
    while True:
        time.sleep(60)


def hold(directory: str) -> None:
    MessageStore(directory)
    print("open", flush=True)
    while True:
        time.sleep(60)


if __name__ == "__main__":
    command, directory, *rest = sys.argv[1:]
    {
        "write": lambda: write_forever(directory),
        "combine": lambda: combine_and_die(directory, rest[0]),
        "compact": lambda: compact_and_die(directory, rest[0]),
        "gc": lambda: gc_compacts_and_dies(directory, *rest),
        "hold": lambda: hold(directory),
        "churn": lambda: churn(directory, rest == ["restart"]),
    }[command]()

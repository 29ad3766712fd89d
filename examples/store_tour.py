"""A guided tour of the message store engine, embedded in this process, in a temporary directory.

    .venv/bin/python examples/store_tour.py

It writes, reads and removes messages, runs a GC pass, kills a writing process with SIGKILL
in the middle of its work, and shows what recovery brings back. Each step prints what
happened and why it matters.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from warren.store import MessageStore  # noqa: E402  (the path above only makes examples.* importable; warren comes from the install)

FILE_SIZE_LIMIT = 64 * 1024  # small files, so rollover and GC show up quickly
BATCH = 200


def msg_id(n: int) -> bytes:
    return hashlib.md5(f"demo message {n}".encode()).digest()


def body(n: int) -> bytes:
    return f"order #{n}: ".encode() + bytes([n % 251]) * (500 + n % 1500)


def step(title: str) -> None:
    print(f"\n== {title}")


def files_of(directory: str) -> list[str]:
    return sorted(
        (n for n in os.listdir(directory) if n.endswith(".rdq")), key=lambda n: int(n[:-4])
    )


def tour(directory: str) -> None:
    step("1. Writing 2,000 messages (group commit: one fsync covers a whole batch)")
    with MessageStore(directory, file_size_limit=FILE_SIZE_LIMIT) as store:
        confirmed = 0
        for start in range(0, 2000, BATCH):
            for n in range(start, start + BATCH):
                store.write(msg_id(n), body(n), ticket=n)
            confirmed += len(store.sync().durable)
        stats = store.stats()
        print(
            f"   {confirmed} writes confirmed durable; {stats['file_count']} files of at most "
            f"{FILE_SIZE_LIMIT // 1024} KiB ({stats['bytes_on_disk']:,} bytes)"
        )

        step("2. Reading them back, and a message shared by two queues")
        assert all(store.read(msg_id(n)) == body(n) for n in range(2000))
        store.write(msg_id(7), body(7))  # a second queue's reference
        store.remove(msg_id(7))
        print(
            f"   all 2000 bodies read back intact; message 7, referenced twice and removed "
            f"once, is still there: {store.contains(msg_id(7))}"
        )

        step("3. A write cancelled before it reached the disk")
        store.write(msg_id(5000), body(5000), ticket="cancelled")
        store.remove(msg_id(5000))
        settled = store.sync()
        print(
            f"   written then removed before the sync: reported ignored {settled.ignored}, "
            f"and no byte of it was written"
        )

        step("4. Consumers ack two thirds of the messages; the GC combines files")
        for n in range(2000):
            if n % 3:
                store.remove(msg_id(n))
        before = store.stats()
        print(
            f"   after the removes: {before['file_count']} files (a file is deleted as soon "
            f"as it empties; none did), garbage {before['garbage_fraction']:.0%}"
        )
        combines = store.collect_garbage()
        after = store.stats()
        print(
            f"   GC pass: {combines} combines of adjacent files moved "
            f"{after['gc_bytes_moved']:,} bytes; now {after['file_count']} files, garbage "
            f"{after['garbage_fraction']:.0%}"
        )
        assert all(store.read(msg_id(n)) == body(n) for n in range(0, 2000, 3))
        print("   every remaining message still reads back intact")
    print("   closed cleanly: the index and file summary were saved for a fast restart")

    step("5. Restart after a clean stop")
    with MessageStore(directory, file_size_limit=FILE_SIZE_LIMIT) as store:
        survivors = store.stats()["message_count"]
        print(f"   recovered clean: {store.recovered_clean}, {survivors} messages")

    step("6. A writer process killed with SIGKILL in the middle of writing")
    writer = subprocess.Popen(
        [sys.executable, __file__, "--write-until-killed", directory],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        synced_upto = 0
        for line in writer.stdout:
            synced_upto = int(line)
            if synced_upto >= 10_000 + 20 * BATCH:
                break
        writer.send_signal(signal.SIGKILL)
    finally:
        writer.kill()
        writer.wait()
        writer.stdout.close()
    print(
        f"   the writer confirmed messages up to #{synced_upto - 1}, kept writing, and was "
        f"killed (exit {writer.returncode})"
    )

    step("7. Recovery after the crash")
    with MessageStore(directory, file_size_limit=FILE_SIZE_LIMIT) as store:
        stats = store.stats()
        intact = sum(store.read(msg_id(n)) == body(n) for n in range(10_000, synced_upto))
        print(
            f"   recovered clean: {store.recovered_clean} (no shutdown files: every file was "
            f"scanned; {len(files_of(directory))} files)"
        )
        unconfirmed = stats["message_count"] - survivors - intact
        print(
            f"   {intact} of {synced_upto - 10_000} confirmed messages read back intact, beside "
            f"the {survivors} from before; {unconfirmed} written after the last confirm had "
            f"reached the kernel and came back too"
        )
        assert intact == synced_upto - 10_000


def write_until_killed(directory: str) -> None:
    store = MessageStore(directory, file_size_limit=FILE_SIZE_LIMIT)
    n = 10_000
    while True:
        for m in range(n, n + BATCH):
            store.write(msg_id(m), body(m))
        store.sync()
        n += BATCH
        print(n, flush=True)


def main() -> None:
    if sys.argv[1:2] == ["--write-until-killed"]:
        write_until_killed(sys.argv[2])
        return
    with tempfile.TemporaryDirectory(prefix="warren-demo-") as root:
        directory = os.path.join(root, "msg_store_persistent")
        print(f"Warren message store demo, in {directory}")
        tour(directory)
        print("\nDone: nothing confirmed was lost.")


if __name__ == "__main__":
    main()

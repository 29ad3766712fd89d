"""Shared helpers for the store tests: deterministic ids and bodies, record bytes."""

import errno
import hashlib
import os
import shutil

from warren.store.engine.records import encode_record


def msg_id(n: int, generation: int = 0) -> bytes:
    """A 16-byte id derived from a number (MD5-sized, like RabbitMQ's guids)."""
    return hashlib.md5(f"{generation}:{n}".encode()).digest()


def body(n: int, size: int = 100, generation: int = 0) -> bytes:
    """A body that tells which message and which write it came from."""
    seed = hashlib.sha256(f"body {generation}:{n}".encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


def record(n: int, size: int = 100) -> bytes:
    return encode_record(msg_id(n), body(n, size))


def fill(store, numbers, size: int = 100) -> None:
    """Write messages ``numbers`` (bodies of ``size`` bytes) and sync them."""
    for n in numbers:
        store.write(msg_id(n), body(n, size))
    store.sync()


def build_fragmented_store(store) -> dict[int, bytes]:
    """Many files, more than half garbage, and ids reused with new bodies in later files.

    Returns the live messages: number -> body (the latest body of a reused id).
    """
    live: dict[int, bytes] = {}
    for n in range(400):
        store.write(msg_id(n), body(n, 300))
        live[n] = body(n, 300)
    store.sync()
    for n in range(400):
        if n % 4 != 0:
            store.remove(msg_id(n))
            del live[n]
    for n in range(1, 400, 8):  # reused ids, new bodies, newer files
        store.write(msg_id(n), body(n, 200, generation=1))
        live[n] = body(n, 200, generation=1)
    for n in range(400, 420):
        store.write(msg_id(n), body(n, 300))
        live[n] = body(n, 300)
    store.sync()
    return live


def fill_disk(directory, leave_bytes: int = 0):
    """Fill the filesystem holding ``directory`` with one file until about ``leave_bytes``
    are free (all of it for 0); the file's path, to delete when space should come back."""
    filler = os.path.join(directory, "filler")
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        while (room := shutil.disk_usage(directory).free - leave_bytes) > 0:
            try:
                os.write(fd, b"\0" * min(2**20, max(4096, room)))
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                break
    finally:
        os.close(fd)
    return filler

"""Small helpers shared by the queue tests."""

import errno
import os

from warren.queues import Message

N = 16


def message(n: int, size: int = 10, persistent: bool = True, **properties) -> Message:
    """Message ``n``: a body of ``size`` bytes that names it."""
    label = b"%d:" % n
    return Message(label + b"x" * max(0, size - len(label)), persistent=persistent, **properties)


def number(delivery) -> int:
    return int(delivery.message.body.split(b":")[0])


def drain(queue, ack=True):
    """Fetch everything (awaiting acks); the deliveries, acked when ``ack``."""
    out = []
    while (delivery := queue.fetch()) is not None:
        out.append(delivery)
    if ack and out:
        queue.ack([d.seq_id for d in out])
    return out


def fail_the_next_fdatasync(monkeypatch) -> None:
    """The next ``os.fdatasync`` raises EIO, as on a disk that lost a write; later ones
    run as usual."""
    fdatasync = os.fdatasync

    def io_error_once(fd: int) -> None:
        monkeypatch.setattr(os, "fdatasync", fdatasync)
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", io_error_once)


def assert_counts_add_up(queue):
    stats = queue.stats()
    assert stats["alpha"] + stats["beta"] + stats["gamma"] + stats["delta"] == len(queue)
    assert stats["q1"] + stats["q2"] + stats["q3"] + stats["q4"] + stats["delta"] == len(queue)
    assert stats["depth"] == len(queue) + stats["pending_acks_ram"] + stats["pending_acks_disk"]
    return stats

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


def drained(connection, queue: str) -> list[bytes]:
    """The bodies of what ``queue`` holds, each got through ``connection`` and acked
    until the queue has none ready."""
    bodies = []
    while (delivery := connection.get(queue)) is not None:
        bodies.append(delivery.body)
        delivery.ack()
    return bodies


def store_messages(node) -> int:
    """How many messages ``node``'s persistent store holds."""
    return node.store_stats()["msg_store_persistent"]["message_count"]


def fail_the_next_fdatasync(monkeypatch, of: str = "", error: int = errno.EIO) -> None:
    """The next ``os.fdatasync`` (of a file whose name starts with ``of``) raises
    ``error``, EIO as on a disk that lost a write by default; later ones run as usual."""
    fdatasync = os.fdatasync

    def io_error_once(fd: int) -> None:
        if not os.path.basename(os.readlink(f"/proc/self/fd/{fd}")).startswith(of):
            return fdatasync(fd)
        monkeypatch.setattr(os, "fdatasync", fdatasync)
        raise OSError(error, os.strerror(error))

    monkeypatch.setattr(os, "fdatasync", io_error_once)


def assert_counts_add_up(queue):
    stats = queue.stats()
    assert stats["alpha"] + stats["beta"] + stats["gamma"] + stats["delta"] == len(queue)
    assert stats["q1"] + stats["q2"] + stats["q3"] + stats["q4"] + stats["delta"] == len(queue)
    assert stats["depth"] == len(queue) + stats["pending_acks_ram"] + stats["pending_acks_disk"]
    return stats


def walked_stats(queue) -> dict:
    """The figures ``stats()`` keeps running, found the slow way: a walk of every status
    the queue holds in RAM (what ``stats()`` did before it kept them)."""
    middle = [*queue.q2, *queue.q3]
    in_ram = [*queue.q1, *queue.q4, *queue._ram_pending.values()]
    everything = [*in_ram, *middle, *queue._disk_pending.values()]
    gamma = sum(1 for s in middle if s.index_on_disk)
    return {
        "beta": len(middle) - gamma,
        "gamma": gamma,
        "ram_bytes": sum(s.size for s in in_ram),
        "disk_bytes": sum(s.size for s in everything if s.body_on_disk) + queue.delta.bytes,
        "unconfirmed": len(queue._unconfirmed)
        + sum(
            1
            for s in [*queue._index_unsynced, *queue._shared_unsynced]
            if s not in queue._unconfirmed
        )
        + len(queue._unwritten_payloads),
    }


def assert_running_figures_match_a_walk(queue) -> None:
    walked = walked_stats(queue)
    stats = queue.stats()
    assert {name: stats[name] for name in walked} == walked

"""A node whose disk fills up: the disk alarm holds writers before the disk is full, a
write that still finds it full fails alone with DiskFull, the stores stay up serving
reads and removes (even one restarted on the full disk), and writing resumes by itself
once space is back. On a real small filesystem."""

import os
import signal
import threading

import pytest

from warren.store import DiskFull, WritesBlocked
from warren.store.client import StoreClient
from warren.store.protocol import StoreStats
from warren.supervisor import AlarmLimits, Node

from ..waiting import wait_for
from .helpers import body, fill_disk, msg_id

MiB = 2**20


def disk_node(directory, disk_free_limit_bytes):
    return Node(
        directory / "data",
        file_size_limit=256 * 1024,
        alarm_limits=AlarmLimits(disk_free_limit_bytes=disk_free_limit_bytes, check_interval_s=0.1),
    )


def stats(node):
    return node.store().ask(StoreStats(), timeout=10)


def test_the_disk_alarm_holds_writers_and_releases_them_when_space_returns(small_disk):
    with disk_node(small_disk, disk_free_limit_bytes=MiB) as node:
        client = StoreClient(node.store())
        for n in range(100):
            client.write(msg_id(n), body(n, 1000))
        client.settle()
        filler = fill_disk(small_disk, leave_bytes=MiB // 2)
        wait_for(lambda: stats(node)["writes_blocked"])
        assert node.status()["alarms"] == ["disk"]

        held = StoreClient(node.store())
        finished = threading.Event()

        def write_more():
            for n in range(100, 110):
                held.write(msg_id(n), body(n, 1000))
            held.settle()
            finished.set()

        writer = threading.Thread(target=write_more, daemon=True)
        writer.start()
        assert not finished.wait(1.0)  # held: nothing of it was sent
        assert stats(node)["message_count"] == 100
        client.remove([msg_id(0)])  # removes still go
        client.settle()
        assert client.read(msg_id(1)) == body(1, 1000)

        os.unlink(filler)
        assert finished.wait(30)
        writer.join()
        assert stats(node)["message_count"] == 109
        assert held.read(msg_id(105)) == body(105, 1000)
        held.terminate()
        client.terminate()


def test_held_writes_give_up_with_a_clear_error_after_the_call_timeout(small_disk):
    with disk_node(small_disk, disk_free_limit_bytes=MiB) as node:
        client = StoreClient(node.store(), call_timeout_s=0.5)
        filler = fill_disk(small_disk, leave_bytes=MiB // 2)
        wait_for(lambda: stats(node)["writes_blocked"])
        client.write(msg_id(1), body(1))
        with pytest.raises(WritesBlocked, match="free disk space"):
            client.settle()
        os.unlink(filler)
        wait_for(lambda: not stats(node)["writes_blocked"])
        client.settle()
        assert client.read(msg_id(1)) == body(1)
        client.terminate()


def test_a_full_disk_fails_only_the_writes_that_do_not_fit_and_the_store_stays_up(small_disk):
    with disk_node(small_disk, disk_free_limit_bytes=0) as node:
        pids = {
            name: node.actors.whereis(name).pid
            for name in ("msg_store_persistent", "msg_store_transient")
        }
        client = StoreClient(node.store())
        for n in range(200):
            client.write(msg_id(n), body(n, 1000))
        client.settle()
        filler = fill_disk(small_disk)
        for n in range(200, 2000):
            client.write(msg_id(n), body(n, 1000))
        with pytest.raises(DiskFull, match="the disk is full") as refused:
            client.settle()
        failed = set(refused.value.msg_ids)
        assert failed and len(failed) < 1800
        stored = [n for n in range(200, 2000) if msg_id(n) not in failed]
        reader = StoreClient(node.store())
        assert reader.contains_many([msg_id(n) for n in range(2000)]) == [
            msg_id(n) not in failed for n in range(2000)
        ]
        for n in list(range(200)) + stored:
            assert reader.read(msg_id(n)) == body(n, 1000), n
        client.remove([msg_id(n) for n in range(50)])
        client.settle()
        assert {name: node.actors.whereis(name).pid for name in pids} == pids

        os.kill(pids["msg_store_persistent"], signal.SIGKILL)  # a restart on a full disk
        wait_for(
            lambda: (
                getattr(node.actors.whereis("msg_store_persistent"), "pid", None)
                not in (None, pids["msg_store_persistent"])
            )
        )
        after_restart = StoreClient(node.store())
        assert after_restart.read(msg_id(100)) == body(100, 1000)

        os.unlink(filler)
        for ident in sorted(failed)[:300]:
            after_restart.write(ident, b"stored at last")
        after_restart.settle()
        assert after_restart.read(sorted(failed)[0]) == b"stored at last"
        after_restart.terminate()
        reader.terminate()

"""A persistent store killed under load: what was acknowledged stays gone, and re-sending
what the client was told is in doubt, then removing everything once, leaves it empty."""

import os
import signal

import pytest

from warren.store.client import StoreClient
from warren.store.errors import StoreRestarted
from warren.store.protocol import StoreStats
from warren.supervisor import Node

from ..waiting import wait_for
from .helpers import body, msg_id


@pytest.fixture
def node(tmp_path):
    with Node(tmp_path / "data", file_size_limit=256 * 1024) as running:
        yield running


def kill_store_and_wait_for_the_next(node):
    old = node.store().pid
    os.kill(old, signal.SIGKILL)
    wait_for(
        lambda: (
            getattr(node.actors.whereis("msg_store_persistent"), "pid", old) != old
            and node.store().ping(timeout=5) is not None
        )
    )


def test_acknowledged_messages_do_not_come_back_after_a_store_crash(node):
    client = StoreClient(node.store())
    for n in range(5000):
        client.write(msg_id(n), body(n, 300))
    client.settle()
    client.remove([msg_id(n) for n in range(0, 5000, 2)])
    client.settle()
    kill_store_and_wait_for_the_next(node)
    fresh = StoreClient(node.store())
    assert fresh.contains_many([msg_id(n) for n in range(5000)]) == [
        n % 2 == 1 for n in range(5000)
    ]
    assert node.store().ask(StoreStats())["message_count"] == 2500
    fresh.terminate()


def test_resending_what_was_in_doubt_then_removing_everything_once_empties_the_store(node):
    client = StoreClient(node.store(), restart_check_s=0.2)
    in_doubt: list[bytes] = []
    for n in range(20000):
        try:
            client.write(msg_id(n), body(n, 200))
            if n == 9000:
                kill_store_and_wait_for_the_next(node)
        except StoreRestarted as exc:
            in_doubt += exc.in_doubt
    try:
        client.settle()
    except StoreRestarted as exc:
        in_doubt += exc.in_doubt
    assert in_doubt, "the crash left nothing in doubt; the test proves nothing"
    number = {msg_id(n): n for n in range(20000)}
    for resent in in_doubt:
        client.write(resent, body(number[resent], 200))
    client.settle()
    client.remove([msg_id(n) for n in range(20000)])
    client.settle()
    figures = node.store().ask(StoreStats())
    assert figures["message_count"] == 0
    assert figures["valid_bytes"] == 0
    client.terminate()

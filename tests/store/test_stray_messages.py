"""Stray, malformed and mis-sent messages to the store actors and the GC: an error for an
ask, a log line and a counter for a tell, and never a restart (a persistent-store restart
would wipe the transient store too, as rest_for_one)."""

import os

import pytest

from warren.actors import UnhandledMessage
from warren.store.client import StoreClient
from warren.store.engine.records import HEADER
from warren.store.protocol import (
    Compacted,
    CompactJob,
    CompactScan,
    Contains,
    FileScanned,
    Read,
    ReadMany,
    Register,
    ScanJob,
    StoreStats,
    WriteBatch,
)

from ..waiting import wait_for
from .helpers import body, msg_id

STORES = ("msg_store_persistent", "msg_store_transient")


def incarnations(node):
    return {
        name: node.actors.whereis(name).ping(timeout=10).incarnation
        for name in (*STORES, "msg_store_gc")
    }


def record(n: int) -> bytes:
    return HEADER.pack(16 + 100, msg_id(n)) + body(n, 100) + b"\xff"


def test_stray_tells_to_the_stores_and_the_gc_are_counted_and_restart_nothing(node):
    before = incarnations(node)
    persistent = node.store()
    transient_client = StoreClient(node.store("msg_store_transient"))
    transient_client.write(msg_id(1), b"transient survives")
    transient_client.settle()
    strays = [
        "hello",
        42,
        {"a": 1},
        Read(b"short"),
        ReadMany([b"x"]),
        Contains("ids"),
        Register(b""),
        StoreStats(),
        WriteBatch(b"client", 0, record(7), []),  # needs an answer
        WriteBatch(b"client", 0, record(8)[:-1] + b"\0", []),  # not whole records
        WriteBatch(b"client", -1, record(9), []),
    ]
    for stray in strays:
        persistent.tell(stray)
    node.actors.whereis("msg_store_gc").tell("collect everything")
    gc = node.actors.whereis("msg_store_gc")
    gc.tell(ScanJob(1, "relative/dir", 0, 1, persistent))
    gc.tell(CompactScan(2, "relative/dir", 0, persistent))
    gc.tell(CompactJob(3, "/no/such/store", -1, b"token", persistent))
    # A compaction's answers with no job of the store's to match: dropped.
    persistent.tell(FileScanned(4, 0, b"", b"", b"", b"", b""))
    persistent.tell(Compacted(5, 0, 0))

    # what the codec refuses by its fields counts as malformed, the rest as unhandled
    def refused(stats):
        return stats["unhandled"] + stats["malformed"]

    wait_for(lambda: refused(persistent.stats(timeout=10)) == len(strays) - 1)
    wait_for(lambda: node.actors.whereis("msg_store_gc").stats(timeout=10)["unhandled"] == 4)
    assert incarnations(node) == before
    client = StoreClient(persistent)
    assert client.contains_many([msg_id(7), msg_id(8), msg_id(9)]) == [False] * 3
    client.write(msg_id(10), b"still confirms")
    client.settle()
    assert client.read(msg_id(10)) == b"still confirms"
    assert transient_client.read(msg_id(1)) == b"transient survives"
    client.terminate()
    transient_client.terminate()


@pytest.mark.parametrize(
    "request_, complaint",
    [
        (42, "does not handle int"),
        (Read(b"short"), "msg_id must be 16 bytes"),
        (ReadMany([msg_id(1), "text"]), "msg_ids must be a list of 16-byte ids"),
        (WriteBatch(b"client", 0, record(1) + record(2)[:30], []), "not whole records"),
        (WriteBatch(b"client", 0, record(1), [[5, [msg_id(1)]]]), "removes out of place"),
        (WriteBatch("client", 0, record(1), []), "client_ref must be 1..65535 bytes"),
    ],
)
def test_a_malformed_ask_gets_an_error_naming_the_problem_and_applies_nothing(
    node, request_, complaint
):
    persistent = node.store()
    before = incarnations(node)
    with pytest.raises(UnhandledMessage, match=complaint):
        persistent.ask(request_, timeout=10)
    assert persistent.ask(Contains([msg_id(1), msg_id(2)]), timeout=10) == [False, False]
    assert persistent.ask(StoreStats(), timeout=10)["message_count"] == 0
    assert incarnations(node) == before
    assert os.path.isdir(node.data_dir)

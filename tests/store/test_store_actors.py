"""The stores as actor processes in a node: group commit, settlement, direct reads, and
what survives when a store, the GC or a reader is killed or stopped."""

import contextlib
import dataclasses
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from warren.actors import RemoteError
from warren.store.client import StoreClient
from warren.store.errors import StoreRestarted
from warren.store.protocol import StoreStats, WriteBatch
from warren.supervisor import Node

from ..waiting import wait_for
from .helpers import body, msg_id

ROOT = Path(__file__).resolve().parents[2]
STORE = "msg_store_persistent"


@pytest.fixture
def node(tmp_path):
    with Node(tmp_path / "data", file_size_limit=64 * 1024) as running:
        yield running


@pytest.fixture(params=["compact", "combine"])
def gc_node(tmp_path, request):
    """A node whose stores run the GC the test is parametrized with."""
    with Node(tmp_path / "data", file_size_limit=64 * 1024, store_gc=request.param) as running:
        yield running


def stats(node, name="msg_store_persistent"):
    return node.store(name).ask(StoreStats())


def gc_jobs_done(node) -> int:
    """Pairs combined and files compacted by the persistent store."""
    figures = stats(node)
    return figures["gc_runs"] + figures["gc_compactions"]


def test_every_write_is_settled_exactly_once_and_read_back_directly(node):
    settlements = []
    client = StoreClient(node.store(), on_settled=settlements.append)
    for n in range(3000):
        client.write(msg_id(n), body(n, 1000))
    client.remove([msg_id(n) for n in range(2990, 3000)])
    client.settle()
    covered = [s.up_to_seq for s in settlements]
    assert covered == sorted(covered) and covered[-1] == 2999
    durable = {seq for s in settlements for seq, *_ in s.locations}
    ignored = {seq for s in settlements for seq in s.ignored}
    assert not durable & ignored and durable | ignored <= set(range(3000))
    assert durable >= set(range(2990))
    assert all(client.read(msg_id(n)) == body(n, 1000) for n in range(0, 2990, 7))
    assert client.direct_reads > 0
    assert client.read(msg_id(2995)) is None
    client.terminate()
    figures = stats(node)
    assert figures["message_count"] == 2990
    assert figures["clients"] == 0 and figures["longest_confirm_wait_ms"] > 0


def test_back_to_back_write_remove_pairs_cost_almost_no_disk_writes(node):
    client = StoreClient(node.store())
    pairs = 2000
    for n in range(pairs):
        client.write(msg_id(n), body(n, 1000))
        client.remove([msg_id(n)])
    client.settle()
    written_records = stats(node)["bytes_on_disk"] // 1025
    assert written_records <= pairs // 100
    client.terminate()


def test_a_store_killed_under_write_load_keeps_every_settled_message(node):
    settled_seqs = []
    client = StoreClient(
        node.store(),
        on_settled=lambda s: settled_seqs.extend([seq for seq, *_ in s.locations] + s.ignored),
    )
    old_pid = node.store().pid
    attempted = 0  # seq n is message n: one client, from 0
    with pytest.raises(StoreRestarted) as restarted:
        for n in range(200_000):
            attempted = n + 1  # a write whose call raises is in doubt too
            client.write(msg_id(n), body(n, 4000))
            if n == 5000:
                os.kill(old_pid, signal.SIGKILL)
        client.settle()
    number_of = {msg_id(n): n for n in range(attempted)}
    in_doubt = [number_of[m] for m in restarted.value.in_doubt]
    assert settled_seqs and in_doubt
    assert sorted(settled_seqs + in_doubt) == list(range(attempted))  # each exactly once
    assert node.store().pid != old_pid
    fresh = StoreClient(node.store())
    bodies = fresh.read_many([msg_id(n) for n in settled_seqs])
    assert bodies == [body(n, 4000) for n in settled_seqs]
    fresh.terminate()
    client.terminate()


def test_a_write_sent_across_a_store_restart_is_never_applied_twice(node):
    client = StoreClient(node.store())
    old = node.store().pid
    os.kill(old, signal.SIGSTOP)
    for n in range(10):
        client.write(msg_id(n), body(n))
    client.flush()  # batch A: sent, never answered
    os.kill(old, signal.SIGKILL)  # a stopped process dies of it too; its parent reaps it
    wait_for(lambda: getattr(node.actors.whereis("msg_store_persistent"), "pid", old) != old)
    for n in range(10, 20):
        client.write(msg_id(n), body(n))  # batch B, after the restart
    with pytest.raises(StoreRestarted) as restarted:
        client.settle()
    assert sorted(restarted.value.in_doubt) == sorted(msg_id(n) for n in range(20))
    for n in range(20):  # send them again, as told
        client.write(msg_id(n), body(n))
    client.settle()
    client.remove([msg_id(n) for n in range(20)])  # one reference each: all gone
    client.settle()
    assert client.contains_many([msg_id(n) for n in range(20)]) == [False] * 20
    client.terminate()


def fill_and_fragment(client, count=600):
    for n in range(count):
        client.write(msg_id(n), body(n, 1000))
    client.settle()
    client.remove([msg_id(n) for n in range(count) if n % 4])
    client.settle()
    return [n for n in range(count) if n % 4 == 0]


def test_a_gc_killed_mid_job_loses_nothing_and_the_node_carries_on(gc_node, tmp_path):
    node = gc_node
    gc = node.actors.whereis("msg_store_gc")
    os.kill(gc.pid, signal.SIGSTOP)  # it takes the job and never finishes
    client = StoreClient(node.store())
    live = fill_and_fragment(client)
    wait_for(lambda: stats(node)["gc_job_in_flight"])
    store_pid = node.store().pid
    os.kill(gc.pid, signal.SIGKILL)
    wait_for(lambda: stats(node)["gc_jobs_abandoned"] == 1)
    assert not [
        f for f in os.listdir(tmp_path / "data" / "msg_store_persistent") if f.endswith(".rdt")
    ]
    assert all(client.read(msg_id(n)) == body(n, 1000) for n in live)
    wait_for(lambda: gc_jobs_done(node) > 0, timeout=30)  # the restarted GC's work
    assert all(client.read(msg_id(n)) == body(n, 1000) for n in live)
    assert node.store().pid == store_pid
    client.terminate()


def test_the_gc_yields_to_a_writer_and_still_gets_through_the_backlog(gc_node):
    """Without writers (acks alone count for none) the GC goes at full speed; while a
    client writes, the store makes its GC wait after each job (so that the GC takes a
    small share of the store's loop), and the GC still gets through a backlog as the
    writer goes on."""
    node = gc_node
    client = StoreClient(node.store())
    with beside(acks_of_unknown_ids(node)):
        fill_and_fragment(client)
        wait_for(lambda: gc_jobs_done(node) >= 2, timeout=30)
    assert stats(node)["gc_yields"] == 0

    with beside(writes_acked_50_behind(node)):
        for n in range(1000, 1600):
            client.write(msg_id(n), body(n, 1000))
        client.settle()  # on disk: else the removes below cancel the writes
        client.remove([msg_id(n) for n in range(1000, 1600) if n % 4])
        client.settle()
        backlog = stats(node)["bytes_on_disk"]  # 450 KB of it garbage
        wait_for(lambda: stats(node)["bytes_on_disk"] < backlog - 100_000, timeout=60)
        wait_for(lambda: stats(node)["gc_yields"] >= 2, timeout=60)
    assert stats(node)["gc_yield_seconds"] > 0
    assert all(client.read(msg_id(n)) == body(n, 1000) for n in range(1000, 1600, 4))
    client.terminate()


def acks_of_unknown_ids(node) -> Callable[[threading.Event], None]:
    """A client sending batches of removes alone (of ids the store never held)."""

    def ack(stop: threading.Event) -> None:
        acker = StoreClient(node.store())
        n = 200_000
        while not stop.is_set():
            acker.remove([msg_id(m) for m in range(n, n + 10)])
            acker.settle()
            n += 10
        acker.terminate()

    return ack


def writes_acked_50_behind(node) -> Callable[[threading.Event], None]:
    """A client writing 100-byte messages and acking each 50 messages later: no backlog
    of its own."""

    def write(stop: threading.Event) -> None:
        writer = StoreClient(node.store())
        n = 100_000
        while not stop.is_set():
            for m in range(n, n + 10):
                writer.write(msg_id(m), body(m, 100))
            writer.remove([msg_id(m) for m in range(n - 50, n - 40)])
            writer.settle()
            n += 10
        writer.terminate()

    return write


@contextlib.contextmanager
def beside(work: Callable[[threading.Event], None]) -> Iterator[None]:
    """Run ``work(stop)`` in a thread for the block; its error, if any, fails the test."""
    stop = threading.Event()
    failed: list[BaseException] = []

    def run() -> None:
        try:
            work(stop)
        except BaseException as exc:
            failed.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=60)
    assert not thread.is_alive(), "the client beside the test did not stop"
    if failed:
        raise failed[0]


def test_the_transient_store_is_empty_after_a_restart(node):
    client = StoreClient(node.store("msg_store_transient"))
    for n in range(100):
        client.write(msg_id(n), body(n))
    client.settle()
    assert client.contains(msg_id(5))
    old = node.store("msg_store_transient").pid
    os.kill(old, signal.SIGKILL)
    wait_for(lambda: getattr(node.actors.whereis("msg_store_transient"), "pid", old) != old)
    assert stats(node, "msg_store_transient")["message_count"] == 0
    fresh = StoreClient(node.store("msg_store_transient"))
    assert not fresh.contains(msg_id(5))
    fresh.terminate()


def reader_process(ref, ids_file, seconds):
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.store.client_child",
            json.dumps(dataclasses.asdict(ref)),
            str(ids_file),
            str(seconds),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )


def test_readers_in_other_processes_read_right_bodies_while_the_gc_works(gc_node, tmp_path):
    node = gc_node
    client = StoreClient(node.store())
    for n in range(600):
        client.write(msg_id(n), body(n, 1000))
    client.settle()
    live = [n for n in range(600) if n % 4 == 0]
    ids_file = tmp_path / "ids"
    ids_file.write_text(
        "".join(f"{msg_id(n).hex()} {hashlib.sha256(body(n, 1000)).hexdigest()}\n" for n in live)
    )
    readers = [reader_process(node.store(), ids_file, 4) for _ in range(3)]
    victims = [reader_process(node.store(), ids_file, 60) for _ in range(2)]
    try:
        for process in readers + victims:
            assert process.stdout.readline().strip() == "started"
        os.kill(victims[0].pid, signal.SIGKILL)
        os.kill(victims[1].pid, signal.SIGSTOP)
        client.remove([msg_id(n) for n in range(600) if n % 4])
        client.settle()
        wait_for(lambda: gc_jobs_done(node) >= 2, timeout=30)
        outcomes = [tuple(map(int, r.stdout.readline().split())) for r in readers]
        client.write(msg_id(9999), body(9999))  # the store still serves
        client.settle()
    finally:
        for process in readers + victims:
            process.send_signal(signal.SIGKILL)
            process.send_signal(signal.SIGCONT)
            process.wait()
            process.stdout.close()
    assert all(wrong == 0 for _, _, wrong in outcomes), outcomes
    assert all(direct > 0 for direct, _, _ in outcomes), outcomes
    assert all(client.read(msg_id(n)) == body(n, 1000) for n in live)
    client.terminate()


def test_a_malformed_batch_is_refused_and_the_store_keeps_serving(node):
    with pytest.raises(RemoteError, match="malformed WriteBatch"):
        node.store().ask(WriteBatch(b"client", 0, b"\x00\x00\x00\x00\x00\x00\x00\x05abc", []))
    with pytest.raises(RemoteError, match="removes out of place"):
        node.store().ask(WriteBatch(b"client", 0, b"", [[1, [msg_id(1)]]]))
    with pytest.raises(RemoteError, match="does not handle"):
        node.store().ask("hello")
    assert stats(node)["malformed_batches"] == 2
    client = StoreClient(node.store())
    client.write(msg_id(1), body(1))
    client.settle()
    assert client.read(msg_id(1)) == body(1)
    client.terminate()


def test_a_clean_stop_through_the_tree_makes_the_next_start_clean(tmp_path):
    with Node(tmp_path / "data") as first:
        client = StoreClient(first.store())
        for n in range(100):
            client.write(msg_id(n), body(n))
        client.terminate()
    with Node(tmp_path / "data") as second:
        assert stats(second)["recovered_clean"]
        client = StoreClient(second.store())
        assert client.recovered_clean  # learnt when it registered
        assert all(client.read(msg_id(n)) == body(n) for n in range(100))
        client.terminate()


def test_a_killed_store_takes_its_reference_counts_from_the_nodes_source(tmp_path, monkeypatch):
    from .ref_counts_source import listed_ids

    wanted = tmp_path / "still-referenced"
    wanted.write_text("".join(f"{msg_id(n).hex()}\n" for n in range(0, 100, 2)))
    monkeypatch.setenv("WARREN_TEST_REF_COUNTS", str(wanted))
    with Node(
        tmp_path / "data", ref_counts=listed_ids, preload=("tests.store.ref_counts_source",)
    ) as node:
        client = StoreClient(node.store())
        for n in range(100):
            client.write(msg_id(n), body(n))
        client.settle()
        old = node.store().pid
        os.kill(old, signal.SIGKILL)
        wait_for(lambda: getattr(node.actors.whereis("msg_store_persistent"), "pid", old) != old)
        figures = stats(node)
        assert not figures["recovered_clean"] and figures["message_count"] == 50
        fresh = StoreClient(node.store())
        assert not fresh.recovered_clean
        assert fresh.contains_many([msg_id(n) for n in range(4)]) == [True, False, True, False]
        fresh.terminate()


def test_a_request_meant_for_an_older_store_incarnation_is_dropped_and_counted(node):
    old = node.store().pin()
    os.kill(old.pid, signal.SIGKILL)
    wait_for(
        lambda: getattr(node.actors.whereis("msg_store_persistent"), "pid", old.pid) != old.pid,
        timeout=60,
    )
    current = node.store()
    before = current.stats()["dropped_stale"]
    # From a process that has not heard of the death, the old pinned ref still sends. Its
    # ask after the tell, on the same channel, is answered only once the store has taken
    # the tell: a tell still queued when the sender exits would be lost (after a linger
    # that a loaded machine can outlast), and the count could not be told from a loss.
    sender = (
        "import json; from warren.actors import ActorRef; "
        "from warren.store.protocol import Register, StoreStats; "
        f"ref = ActorRef(**json.loads({json.dumps(json.dumps(dataclasses.asdict(old)))}));"
        "ref.tell(Register(b'stale client')); ref.unpin().ask(StoreStats(), timeout=60)"
    )
    subprocess.run([sys.executable, "-c", sender], cwd=ROOT, check=True, timeout=120)
    assert current.stats()["dropped_stale"] == before + 1
    assert stats(node)["clients"] == 0  # never applied


def test_a_reader_stopped_holding_one_file_delays_only_that_files_gc(gc_node):
    node = gc_node
    client = StoreClient(node.store())
    for n in range(1000):
        client.write(msg_id(n), body(n, 1000))
    client.settle()
    directory = os.path.join(node.data_dir, "msg_store_persistent")
    holder = subprocess.Popen(
        [sys.executable, "-m", "tests.store.reader_child", "hold", directory, "0", "stop"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        client.remove([msg_id(n) for n in range(1000) if n % 4])
        client.settle()
        wait_for(lambda: gc_jobs_done(node) >= 3, timeout=30)
        assert os.path.exists(os.path.join(directory, "0.rdq"))  # the held one waits
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.send_signal(signal.SIGCONT)
        holder.wait()
        holder.stdout.close()
    assert all(client.read(msg_id(n)) == body(n, 1000) for n in range(0, 1000, 4))
    client.terminate()


def test_the_gc_process_runs_below_the_stores_priority(node):
    gc = node.actors.whereis("msg_store_gc")
    assert psutil.Process(gc.pid).nice() > psutil.Process(node.store().pid).nice()


def test_a_store_sigtermed_with_a_compaction_out_loses_nothing_once_its_gc_goes_on(tmp_path):
    with Node(tmp_path / "data", file_size_limit=64 * 1024, store_gc="compact") as node:
        gc = node.actors.whereis("msg_store_gc")
        os.kill(gc.pid, signal.SIGSTOP)  # the job goes out and waits in its mailbox
        try:
            client = StoreClient(node.store())
            live = fill_and_fragment(client)
            wait_for(lambda: stats(node)["gc_job_in_flight"])
            store_pid = node.store().pid
            os.kill(store_pid, signal.SIGTERM)  # a clean stop, then its supervisor's restart
            wait_for(lambda: getattr(node.actors.whereis(STORE), "pid", store_pid) != store_pid)
        finally:
            os.kill(gc.pid, signal.SIGCONT)  # it answers the old store's job: dropped
        client = StoreClient(node.store())
        wait_for(lambda: gc_jobs_done(node) > 0, timeout=60)
        assert all(client.read(msg_id(n)) == body(n, 1000) for n in live)
        directory = tmp_path / "data" / STORE

        def settled() -> bool:  # no job out, no journal left behind
            journals = [name for name in os.listdir(directory) if name.endswith(".compact")]
            return not journals and not stats(node)["gc_job_in_flight"]

        wait_for(settled, timeout=60)
        assert all(client.read(msg_id(n)) == body(n, 1000) for n in live)
        client.terminate()

"""Streams on a real node: declared, published to, read by offset and by time, by named
consumers that resume, trimmed by retention, and killed (the stream's process, the whole
node) while producers publish with confirms: every confirmed message must be read back
whole, once per producer sequence. Also stopped by signals (the process alone, the
node's whole group), killed under a reader's call, and run out of disk."""

import contextlib
import datetime
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from warren import connect
from warren.actors import ActorError
from warren.errors import WarrenError
from warren.queues import Nacked, PreconditionFailed
from warren.queues.client.stream import StreamConsumer, Timestamp
from warren.queues.engine.stream_inspect import inspect_stream
from warren.queues.engine.stream_log import StreamLog, numbered_files
from warren.queues.errors import (
    NotFound,
    OffsetOutOfRange,
    OutOfSequence,
    StreamCorrupt,
    UnsupportedOperation,
)
from warren.queues.protocol import Fetch, StreamRead
from warren.supervisor import AlarmLimits, Node
from warren.supervisor.chaos.workload import checked_id, ledger_lines

from ...store.helpers import fill_disk
from ...waiting import wait_for

ROOT = Path(__file__).resolve().parents[3]
WARREN = [sys.executable, "-m", "warren.supervisor.cli"]
LOOPBACK_ANY_PORT = "tcp://127.0.0.1:*"


@pytest.fixture
def node(tmp_path):
    with Node(tmp_path / "data", listen=LOOPBACK_ANY_PORT) as running:
        yield running


def read_through(consumer, last_offset, wait_s=60.0):
    """What ``consumer`` reads up to the record at ``last_offset``, each record waited for
    as long as a loaded machine may take (a pause in the reading ends nothing), then a
    short look that no record follows; the consumer is cancelled (a named one stores the
    offset it read last)."""
    deliveries = []
    with consumer:
        last_read = consumer.next_offset - 1
        while last_read < last_offset:
            delivery = consumer.get(timeout=wait_s)
            assert delivery is not None, f"no record after offset {last_read} in {wait_s} s"
            deliveries.append(delivery)
            last_read = delivery.offset
        assert consumer.get(timeout=0.3) is None, "a record beyond the last one"
    return deliveries


def read_to_the_end(connection, **options):
    """``read_through`` the end the stream has committed now (its last record is a
    user's, not a stored offset)."""
    end = connection.queue_stats("events")["committed_offset"]
    return read_through(connection.consume("events", **options), end)


def stream_pid(node, name="events"):
    wait_for(lambda: node.actors.whereis(f"stream {name}") is not None, timeout=60)
    return node.actors.whereis(f"stream {name}").pid


def test_a_stream_is_declared_with_its_own_arguments_and_refuses_a_queues(node):
    connection = node.connect()
    connection.declare_queue("events", type="stream", max_age="7D", max_length_bytes=10**9)
    # the same stream again, its age given in seconds: the same definition
    connection.declare_queue("events", type="stream", max_age=7 * 86400, max_length_bytes=10**9)
    with pytest.raises(PreconditionFailed, match="max_age"):
        connection.declare_queue("events", type="stream", max_age="1h", max_length_bytes=10**9)
    with pytest.raises(ValueError, match="a stream takes no lazy=True"):
        connection.declare_queue("logs", type="stream", lazy=True)
    with pytest.raises(ValueError, match="always durable"):
        connection.declare_queue("logs", type="stream", durable=False)
    with pytest.raises(ValueError, match="max_age: stream arguments"):
        connection.declare_queue("jobs", max_age="1h")
    with pytest.raises(ValueError, match="'7 days'"):
        connection.declare_queue("logs", type="stream", max_age="7 days")
    assert connection.list_queues() == ["events"]
    title = " ".join(psutil.Process(stream_pid(node)).cmdline()).strip()
    assert title == "warren: stream events"


def test_every_kind_of_start_reads_from_where_it_says(node):
    connection = node.connect()
    connection.declare_queue("events", type="stream")
    connection.publish_many("events", [b"a0", b"a1", b"a2"])
    time.sleep(0.05)  # the next chunks are written later than the first
    between = datetime.datetime.now()
    time.sleep(0.05)  # and later than the moment between them
    connection.publish_many("events", [b"b3", b"b4"])
    connection.publish("events", b"c5")

    def read(offset):
        return [(d.offset, d.body) for d in read_to_the_end(connection, offset=offset)]

    everything = [(0, b"a0"), (1, b"a1"), (2, b"a2"), (3, b"b3"), (4, b"b4"), (5, b"c5")]
    assert read("first") == everything
    assert read(4) == everything[4:]
    assert read("last") == [(5, b"c5")]
    assert read(between) == everything[3:]
    assert read(Timestamp(int(between.timestamp() * 1000))) == everything[3:]
    assert read("1h") == everything
    assert read(6) == []
    with pytest.raises(OffsetOutOfRange, match="it holds offsets 0 to 5"):
        read(7)
    with pytest.raises(ValueError, match="an interval like '1h'"):
        read("yesterday")
    # "next" waits for what comes after it starts
    consumer = connection.consume("events", offset="next")
    assert consumer.get(timeout=0.2) is None
    connection.publish("events", b"d6", headers={"k": "v"})
    delivery = consumer.get(timeout=10)
    assert (delivery.offset, delivery.body, delivery.headers) == (6, b"d6", {"k": "v"})
    assert abs(delivery.timestamp_ms - time.time() * 1000) < 60_000
    consumer.cancel()


def test_a_stream_refuses_what_only_a_queue_does_and_a_queue_what_only_a_stream_does(node):
    connection = node.connect()
    connection.declare_queue("events", type="stream")
    connection.declare_queue("jobs")
    with pytest.raises(UnsupportedOperation, match="read it with consume"):
        connection.get("events")
    with pytest.raises(UnsupportedOperation, match="takes no Purge"):
        connection.purge_queue("events")
    with pytest.raises(UnsupportedOperation, match="classic queue"):
        connection.consume("jobs", offset="first")
    with pytest.raises(UnsupportedOperation, match="classic queue"):
        connection.query_offset("jobs", "billing")
    # a peer that sends them anyway gets the same errors, and both processes stay up
    stream = node.actors.whereis("stream events")
    with pytest.raises(Exception, match="UnsupportedOperation"):
        stream.ask(Fetch(b"c" * 16, os.getpid(), 1, True))
    with pytest.raises(Exception, match="UnsupportedOperation"):
        node.actors.whereis("queue jobs").ask(StreamRead(0, 1))
    with pytest.raises(Exception, match="max_records"):
        stream.ask(StreamRead(0, 10**9))
    assert node.actors.whereis("stream events").pid == stream.pid
    connection.publish("events", b"still here")
    assert [d.body for d in read_to_the_end(connection, offset="first")] == [b"still here"]


def test_a_named_consumer_stores_its_offset_and_resumes_after_it(node):
    connection = node.connect()
    connection.declare_queue("events", type="stream")
    connection.publish_many("events", [b"%d" % i for i in range(100)])
    assert connection.query_offset("events", "billing") is None
    consumer = connection.consume("events", name="billing", offset="first", store_every=10)
    for _ in range(35):
        next(consumer)
    # stored automatically every 10 records processed (a record handed out is processed
    # once the next is asked for): 9, 19, 29
    wait_for(lambda: connection.query_offset("events", "billing") == 29, timeout=10)
    consumer.cancel()  # stores the last handed out
    assert connection.query_offset("events", "billing") == 34
    resumed = connection.consume("events", name="billing", offset="first")
    assert [d.offset for d in read_through(resumed, 99)] == list(range(35, 100))
    assert connection.query_offset("events", "billing") == 99
    stats = connection.queue_stats("events")
    assert stats["consumer_offsets"] == {"billing": {"offset": 99, "lag": 0}}
    # a failure inside the with block stores only what was processed before it
    with pytest.raises(RuntimeError):
        with connection.consume("events", name="audit", offset=10) as audit:
            next(audit)
            next(audit)
            raise RuntimeError("the application failed on offset 11")
    assert connection.query_offset("events", "audit") == 10
    connection.reset_offset("events", "billing")
    assert connection.query_offset("events", "billing") is None
    again = connection.consume("events", name="billing", offset=98)
    assert [d.offset for d in read_through(again, 99)] == [98, 99]
    connection.store_offset("events", "manual", 42)
    assert connection.query_offset("events", "manual") == 42


def test_ready_and_lag_count_user_records_not_the_offsets_tracking_entries_take(node):
    """A stored offset is a tracking chunk, and a new segment starts with a snapshot:
    each takes an offset, and neither is a record anyone will read."""
    connection = node.connect()
    connection.declare_queue("events", type="stream", max_segment_size_bytes=200)
    connection.publish_many("events", [b"a", b"b", b"c"])
    with connection.consume("events", name="billing", offset="first") as consumer:
        assert [next(consumer).body for _ in range(3)] == [b"a", b"b", b"c"]
    wait_for(lambda: connection.query_offset("events", "billing") == 2, timeout=10)
    stats = connection.queue_stats("events")
    assert stats["messages_ready"] == 3
    assert stats["consumer_offsets"] == {"billing": {"offset": 2, "lag": 0}}
    for n in range(5):  # each a chunk of its own, most in a new segment after a snapshot
        connection.publish("events", b"new %d" % n + b"x" * 100)
    stats = connection.queue_stats("events")
    assert stats["segments"] > 2 and stats["offsets"] > 8
    assert stats["messages_ready"] == 8
    assert stats["consumer_offsets"] == {"billing": {"offset": 2, "lag": 5}}
    table = subprocess.run(
        [*WARREN, "queues", "--data-dir", node.data_dir], capture_output=True, text=True
    )
    row = next(line.split() for line in table.stdout.splitlines() if line.startswith("events"))
    assert row[2] == "8", table.stdout  # the ready column
    with connection.consume("events", name="billing", inactivity_timeout=0.3) as consumer:
        assert len(list(consumer)) == 5
    wait_for(
        lambda: connection.queue_stats("events")["consumer_offsets"]["billing"]["lag"] == 0,
        timeout=10,
    )


@pytest.mark.parametrize("where", ["local", "remote"])
def test_an_offset_stored_past_the_streams_end_is_refused_and_the_stored_one_kept(node, where):
    node.declare_queue("events", type="stream")
    client = node.connect() if where == "local" else connect(node.listen_endpoint)
    with client:
        client.publish_many("events", [b"a", b"b", b"c"])
        client.store_offset("events", "billing", 1)
        with pytest.raises(OffsetOutOfRange, match="offset 10 is past the end of stream"):
            client.store_offset("events", "billing", 10)
        assert client.query_offset("events", "billing") == 1
        client.store_offset("events", "billing", 2)  # the last record: taken
        assert client.query_offset("events", "billing") == 2
        resumed = client.consume("events", name="billing", offset="first")
        assert resumed.get(timeout=0.3) is None  # nothing skipped, nothing read again
        client.publish("events", b"d")
        assert resumed.get(timeout=10).body == b"d"
        resumed.cancel()


def test_a_producer_resumes_after_its_last_sequence_and_repeats_are_dropped(node):
    connection = node.connect()
    connection.declare_queue("events", type="stream")
    assert connection.last_sequence("events", "spark-1") is None
    connection.publish_many("events", [b"s0", b"s1", b"s2"], producer_id="spark-1", sequence=0)
    assert connection.last_sequence("events", "spark-1") == 2
    # a retry of a batch in doubt: its first two are repeats
    connection.publish_many("events", [b"s1", b"s2", b"s3"], producer_id="spark-1", sequence=1)
    connection.publish("events", b"s3", producer_id="spark-1", sequence=3)
    bodies = [d.body for d in read_to_the_end(connection, offset="first")]
    assert bodies == [b"s0", b"s1", b"s2", b"s3"]
    assert connection.last_sequence("events", "spark-1") == 3
    assert connection.queue_stats("events")["repeats_dropped"] == 3


def test_a_batch_is_one_chunk_up_to_a_quarter_of_the_window_and_a_queues_frames_if_routed_to_one(
    node,
):
    connection = node.connect()
    connection.declare_queue("events", type="stream")
    connection.declare_queue("copies")
    connection.declare_exchange("both", "fanout")
    connection.bind_queue("events", "both")
    connection.bind_queue("copies", "both")
    connection.publish_many("events", [b"%d" % n for n in range(1_000)])
    connection.publish_many_async("events", [b"%d" % n for n in range(5_000)]).result()
    connection.publish_many("events", [b"x" * 2**20] * 6)
    connection.publish_many("any", [b"both %d" % n for n in range(1_200)], exchange="both")
    connection.wait_for_confirms()

    shown = inspect_stream(Path(node.data_dir) / "queues" / "events")
    assert sum(segment.records for segment in shown) == 1_000 + 5_000 + 6 + 1_200
    # 1,000 whole (a quarter of the default window of 4,000); 5,000 read 4,096 at a time,
    # each cut into chunks of 1,000; six 1 MiB in frames of at most 4 MiB; the batch
    # routed to a queue too in its frames of 500
    assert sum(segment.user_chunks for segment in shown) == 1 + (5 + 1) + 2 + 3
    assert connection.queue_stats("copies")["messages_ready"] == 1_200


def test_retention_by_bytes_deletes_the_oldest_segments_and_frees_the_disk(node):
    connection = node.connect()
    connection.declare_queue(
        "events", type="stream", max_segment_size_bytes=64 * 1024, max_length_bytes=256 * 1024
    )
    for _ in range(40):
        connection.publish_many("events", [os.urandom(1000) for _ in range(20)])
    stats = connection.queue_stats("events")
    assert stats["segments_deleted"] > 0
    assert stats["first_offset"] > 0
    directory = Path(node.data_dir) / "queues" / "events"
    on_disk = sum(p.stat().st_size for p in directory.iterdir() if p.suffix != ".lock")
    assert on_disk <= 256 * 1024 + 64 * 1024
    first = [d.offset for d in read_to_the_end(connection, offset="first")]
    assert first[0] == stats["first_offset"]
    assert first[-1] == stats["committed_offset"]


def test_an_idle_stream_is_trimmed_by_age_on_a_timer(node):
    connection = node.connect()
    connection.declare_queue("events", type="stream", max_segment_size_bytes=8192, max_age=1)
    for _ in range(10):
        connection.publish_many("events", [b"x" * 1000 for _ in range(5)])
    assert connection.queue_stats("events")["segments"] > 3
    # no publish from here: the timer alone trims it to the newest segment
    wait_for(lambda: connection.queue_stats("events")["segments"] == 1, timeout=20)


def test_retention_racing_a_reader_in_the_oldest_segment_never_breaks_its_order(node):
    connection = node.connect()
    connection.declare_queue(
        "events", type="stream", max_segment_size_bytes=16 * 1024, max_length_bytes=48 * 1024
    )
    connection.publish_many("events", [b"%06d" % i + b"x" * 500 for i in range(30)])
    reader = connection.consume("events", offset="first")
    assert next(reader).offset == 0  # its file is open in the oldest segment
    for i in range(30, 600, 30):
        connection.publish_many("events", [b"%06d" % n + b"x" * 500 for n in range(i, i + 30)])
    assert connection.queue_stats("events")["first_offset"] > 0
    seen = []
    while (delivery := reader.get(timeout=0.3)) is not None:
        seen.append(delivery.offset)
        assert int(delivery.body[:6]) == delivery.offset
    reader.cancel()
    assert seen == sorted(seen) and len(set(seen)) == len(seen)
    assert seen[-1] == 599


@pytest.mark.parametrize("when", ["before its first read", "after the stream restarted"])
def test_a_remote_reader_whose_next_offset_retention_deleted_moves_on_to_the_first(node, when):
    """As a reader of the files does: no ``OffsetOutOfRange`` in the middle of an
    iteration, whatever the listener's side had open for it."""
    node.declare_queue(
        "events", type="stream", max_segment_size_bytes=16 * 1024, max_length_bytes=48 * 1024
    )
    local = node.connect()

    def publish(numbers):
        local.publish_many("events", [b"%06d" % n + b"x" * 500 for n in numbers])

    publish(range(30))
    with connect(node.listen_endpoint) as remote:
        reader = remote.consume("events", offset="first", prefetch=10)
        if when == "after the stream restarted":
            assert next(reader).offset == 0
            old = stream_pid(node)
            os.kill(old, signal.SIGKILL)  # what it had open for the reader dies with it
            wait_for(lambda: stream_pid(node) != old, timeout=60)
            local = node.connect()
        for start in range(30, 600, 30):
            publish(range(start, start + 30))
        first = local.queue_stats("events")["first_offset"]
        assert first > 30  # the reader's next offset is gone
        seen = []
        while (delivery := reader.get(timeout=0.5)) is not None:
            seen.append(delivery.offset)
            assert int(delivery.body[:6]) == delivery.offset
        reader.cancel()
    assert seen[0] == (first if when == "before its first read" else 1) and seen[-1] == 599
    assert seen == sorted(seen) and len(set(seen)) == len(seen)
    assert set(range(first, 600)) <= set(seen)


def test_a_remote_reader_among_more_than_the_stream_keeps_open_moves_on_past_retention(node):
    """The stream's process keeps 16 readers open for the next reads; the reader of a
    17th remote consumer closes the oldest, whose next read retention then deleted."""
    node.declare_queue(
        "events", type="stream", max_segment_size_bytes=16 * 1024, max_length_bytes=48 * 1024
    )
    local = node.connect()
    for n in range(17):  # a chunk each
        local.publish("events", b"%06d" % n + b"x" * 500)
    with connect(node.listen_endpoint) as remote:
        readers = [remote.consume("events", offset=n, prefetch=1) for n in range(17)]
        assert [next(reader).offset for reader in readers] == list(range(17))
        end = 17 + 20 * 30
        for start in range(17, end, 30):
            local.publish_many(
                "events", [b"%06d" % n + b"x" * 500 for n in range(start, start + 30)]
            )
        first = local.queue_stats("events")["first_offset"]
        assert first > 17
        seen = []
        while (delivery := readers[0].get(timeout=0.5)) is not None:
            seen.append(delivery.offset)
        for reader in readers:
            reader.cancel()
    assert seen == list(range(first, end))


def test_remote_readers_at_one_offset_leave_the_stream_no_open_file_behind(node):
    """The stream's process keeps a reader open per offset for the next read; a second
    reader there replaces the first, which must be closed, not dropped."""
    node.declare_queue("events", type="stream")
    node.connect().publish_many("events", [b"%d" % n for n in range(30)])
    stream = psutil.Process(stream_pid(node))
    with connect(node.listen_endpoint) as remote:
        first = remote.consume("events", offset="first")
        assert next(first).offset == 0
        before = stream.num_fds()
        for _ in range(40):
            reader = remote.consume("events", offset="first")
            assert next(reader).offset == 0  # each reads the chunk, and ends at offset 30
            reader.cancel()
        assert stream.num_fds() <= before + 2


def test_a_remote_client_publishes_reads_and_stores_offsets_through_the_listener(node):
    node.declare_queue("events", type="stream")
    with connect(node.listen_endpoint) as remote:
        assert remote.is_stream("events")
        remote.publish_many("events", [b"r%d" % i for i in range(250)])
        consumer = remote.consume("events", prefetch=100, name="far", offset="first")
        assert isinstance(consumer, StreamConsumer)
        assert not consumer._local  # behind a listener: the records come over the wire
        assert [d.body for d in read_through(consumer, 249)] == [b"r%d" % i for i in range(250)]
        assert remote.query_offset("events", "far") == 249
        # a long poll: a record published while it waits is read within the poll
        waiting = remote.consume("events", offset="next")
        node.connect().publish("events", b"later")
        assert waiting.get(timeout=10).body == b"later"
        waiting.cancel()


def test_a_flipped_bit_in_a_committed_chunk_is_an_error_never_bad_bytes(tmp_path):
    data = tmp_path / "data"
    with Node(data) as node:
        connection = node.connect()
        connection.declare_queue("events", type="stream")
        for i in range(3):
            connection.publish_many("events", [b"chunk%d-%d" % (i, n) for n in range(10)])
    segment = data / "queues" / "events" / f"{0:020d}.segment"
    raw = bytearray(segment.read_bytes())
    where = raw.index(b"chunk1-5")
    raw[where] ^= 0x01
    segment.write_bytes(bytes(raw))
    with Node(data) as node:
        connection = node.connect()
        consumer = connection.consume("events", offset="first")
        good = [next(consumer).body for _ in range(10)]
        assert good == [b"chunk0-%d" % n for n in range(10)]
        with pytest.raises(StreamCorrupt, match="CRC"):
            next(consumer)
        consumer.cancel()
        # read behind the listener's path too: the stream process refuses to serve it
        with pytest.raises(StreamCorrupt):
            connection._request("events", StreamRead(10, 100))


def test_a_torn_chunk_at_the_tail_is_cut_and_everything_before_it_survives(tmp_path):
    data = tmp_path / "data"
    with Node(data) as node:
        connection = node.connect()
        connection.declare_queue("events", type="stream")
        connection.publish_many("events", [b"kept%d" % n for n in range(50)])
    segment = data / "queues" / "events" / f"{0:020d}.segment"
    with open(segment, "ab") as file:  # half a chunk: a header and a few bytes of data
        file.write(bytes([0x50, 0, 0, 1, 0, 0, 0, 1]) + bytes(40) + b"torn")
    with Node(data) as node:
        connection = node.connect()
        bodies = [d.body for d in read_to_the_end(connection, offset="first")]
        assert bodies == [b"kept%d" % n for n in range(50)]
        connection.publish("events", b"after")
        assert connection.queue_stats("events")["committed_offset"] == 50


def start_producer(data, name, ledger, count):
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "warren.supervisor.chaos.roles",
            "produce",
            data,
            "events",
            name,
            ledger,
            "--count",
            str(count),
            "--deduplicate",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout.readline().strip() == "ready"
    return process


def read_all(connection):
    """(offset, message id) of every record, each body checked against its id."""
    return [(d.offset, checked_id(d.body)) for d in read_to_the_end(connection, offset="first")]


def start_node(data):
    """``warren node`` in a session of its own (a group to kill whole), once it answers."""
    node = subprocess.Popen(
        [*WARREN, "node", "--data-dir", str(data)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    wait_for(lambda: warren_cli("queues", "--data-dir", str(data)).returncode == 0, timeout=60)
    return node


def warren_cli(*arguments):
    return subprocess.run([*WARREN, *arguments], capture_output=True, text=True, timeout=60)


def stream_process(node):
    for process in psutil.Process(node.pid).children(recursive=True):
        try:
            if process.cmdline()[:1] == ["warren: stream events"]:
                return process.pid
        except psutil.Error:
            pass
    return None


def kill_the_stream_process(node):
    """SIGKILL ``warren: stream events`` once it runs, and wait for its successor."""
    wait_for(lambda: stream_process(node) is not None, timeout=60)
    old = stream_process(node)
    os.kill(old, signal.SIGKILL)
    wait_for(lambda: stream_process(node) not in (None, old), timeout=60)


@pytest.mark.slow
@pytest.mark.parametrize("victim", ["stream", "node"])
def test_every_confirmed_message_survives_sigkill_while_producers_publish(tmp_path, victim):
    """Two producers publish one at a time with confirms (deduplicating: a publish in
    doubt is sent again under its sequence) while the stream's process, or the whole node
    (its process group, as a machine's crash leaves it) and the producers, is SIGKILLed
    three times. Then every confirmed id is in the stream, exactly once, its body whole."""
    data = tmp_path / "data"
    ledgers = [str(tmp_path / f"confirmed-{i}") for i in range(2)]
    count = 400
    node = start_node(data)
    producers = []
    try:
        declared = warren_cli(
            "declare", "queue", "events", "--data-dir", str(data), "--type", "stream",
            "--max-segment-size", "32KiB",
        )  # fmt: skip
        assert declared.returncode == 0, declared.stderr
        producers = [start_producer(data, f"p{i}", ledgers[i], count) for i in range(2)]
        for round_ in range(1, 4):
            wait_for(
                lambda round_=round_: sum(len(ledger_lines(p)) for p in ledgers) >= 150 * round_,
                timeout=120,
            )
            if victim == "stream":
                kill_the_stream_process(node)
            else:  # a connection is to one run of a node: its producers start again
                for producer in producers:
                    producer.kill()
                    producer.wait()
                    producer.stdout.close()
                os.killpg(node.pid, signal.SIGKILL)
                node.wait()
                node = start_node(data)
                # from sequence 0 again: what the stream took before is dropped as repeats
                producers = [start_producer(data, f"p{i}", ledgers[i], count) for i in range(2)]
        for producer in producers:
            assert producer.wait(timeout=180) == 0
        with connect(str(data)) as connection:
            records = read_all(connection)
    finally:
        for producer in producers:
            if producer.returncode is None:
                producer.kill()
                producer.wait()
                producer.stdout.close()
        try:
            os.killpg(node.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        node.wait()
    offsets_read = [offset for offset, _ in records]
    assert offsets_read == sorted(set(offsets_read))
    ids = [message_id for _, message_id in records]
    confirmed = {m for ledger in ledgers for m in ledger_lines(ledger)}
    assert len(confirmed) == 2 * count
    assert confirmed <= set(ids), sorted(confirmed - set(ids))[:5]
    assert len(ids) == len(set(ids)), "a producer's sequence was taken twice"


def test_the_cli_declares_lists_and_reads_a_stream(node):
    data = node.data_dir

    def warren(*arguments, stdin=None):
        return subprocess.run(
            [*WARREN, *arguments, "--data-dir", data],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
        )

    declared = warren("declare", "queue", "events", "--type", "stream", "--max-age", "12h")
    assert declared.returncode == 0, declared.stderr
    refused = warren("declare", "queue", "jobs", "--max-age", "12h")
    assert refused.returncode == 2 and "type='stream'" in refused.stderr
    assert warren("publish", "events", stdin="one\ntwo\nthree\n").returncode == 0
    read = warren("consume", "events", "--offset", "1", "--name", "cli", "--json")
    assert read.returncode == 0, read.stderr
    lines = [json.loads(line) for line in read.stdout.splitlines()]
    assert [(r["offset"], r["body"]) for r in lines] == [(1, "two"), (2, "three")]
    listed = warren("streams")
    assert listed.returncode == 0, listed.stderr
    assert "events" in listed.stdout and "cli(0)" in listed.stdout
    as_json = json.loads(warren("streams", "--json").stdout)
    assert as_json[0]["stats"]["consumer_offsets"] == {"cli": {"offset": 2, "lag": 0}}
    queues = warren("queues")
    assert "stream" in queues.stdout


def test_store_inspect_reads_a_stream_directory(tmp_path):
    """Each segment's chunks, records and the epochs (a cluster's leaderships) that
    wrote them: here a writer of epoch 4, then one of epoch 7 after it."""
    directory = tmp_path / "events"
    for epoch, records in ((4, range(20)), (7, range(20, 22))):
        stream = StreamLog(directory, max_segment_size_bytes=4096, epoch=epoch)
        for n in records:
            stream.append([b"r%d" % n * 50])
        stream.close()
    shown = subprocess.run(
        [*WARREN, "store", "inspect", str(directory)], capture_output=True, text=True, timeout=60
    )
    assert shown.returncode == 0, shown.stderr
    assert "stream" in shown.stdout and "epochs" in shown.stdout
    assert f"{len(numbered_files(str(directory), '.segment'))} segments" in shown.stdout
    epochs = [e for segment in inspect_stream(directory) for e in segment.epochs]
    assert epochs in ([4, 7], [4, 4, 7], [4, 7, 7])  # a segment may hold both


def test_errors_are_the_same_classes_over_tcp_as_on_the_node(node):
    node.declare_queue("events", type="stream")
    node.declare_queue("jobs")
    with connect(node.listen_endpoint) as remote:
        remote.publish("events", b"one")
        with pytest.raises(OffsetOutOfRange, match="it holds offsets 0 to 0"):
            remote.consume("events", offset=5)
        with pytest.raises(UnsupportedOperation, match="takes no Purge"):
            remote.purge_queue("events")
        with pytest.raises(UnsupportedOperation, match="classic queue"):
            remote.last_sequence("jobs", "p")


@pytest.mark.parametrize("where", ["local", "remote"])
def test_bad_stream_arguments_and_a_sequence_gap_are_warren_errors_of_one_class(node, where):
    """``except WarrenError`` catches a bad argument (still a ValueError for callers that
    catch that), and a producer's gap is ``OutOfSequence`` whichever the transport."""
    node.declare_queue("events", type="stream")
    client = node.connect() if where == "local" else connect(node.listen_endpoint)
    with client:
        client.publish("events", b"one")
        with pytest.raises(WarrenError, match="got 'banana'") as bad_offset:
            client.consume("events", offset="banana")
        assert isinstance(bad_offset.value, ValueError)
        with pytest.raises(WarrenError, match="max_age is a positive number"):
            client.declare_queue("logs", type="stream", max_age="seven days")
        with pytest.raises(WarrenError, match="an int >= 0, got -1"):
            client.store_offset("events", "billing", -1)
        client.publish_many("events", [b"s0", b"s1"], producer_id="p", sequence=0)
        with pytest.raises(OutOfSequence, match="send again from 2"):
            client.publish_many("events", [b"s5"], producer_id="p", sequence=5)
        assert client.list_queues() == ["events"]


@pytest.mark.parametrize("where", ["local", "remote"])
def test_a_reader_waiting_when_the_stream_is_killed_reads_on_from_its_successor(node, where):
    """The stream's process dies while a reader's long poll is in flight: the poll is
    asked again of the next incarnation, and the reader gets what is published then."""
    node.declare_queue("events", type="stream")
    client = node.connect() if where == "local" else connect(node.listen_endpoint)
    with client:
        client.publish("events", b"before")
        reader = client.consume("events", offset="first")
        assert next(reader).body == b"before"
        got = []
        waiting = threading.Thread(target=lambda: got.append(reader.get(timeout=30)))
        waiting.start()
        time.sleep(0.3)  # the reader is in its long poll
        old = stream_pid(node)
        os.kill(old, signal.SIGKILL)
        wait_for(lambda: stream_pid(node) != old, timeout=60)
        node.connect().publish("events", b"after")
        waiting.join(timeout=60)
        assert [d.body for d in got] == [b"after"]
        reader.cancel()


def test_sigterm_to_the_stream_process_alone_stops_it_cleanly_and_it_comes_back(node):
    connection = node.connect()
    connection.declare_queue("events", type="stream")
    connection.publish_many("events", [b"%d" % n for n in range(100)])
    connection.store_offset("events", "billing", 41)
    old = stream_pid(node)
    os.kill(old, signal.SIGTERM)
    wait_for(lambda: stream_pid(node) != old, timeout=60)
    connection.publish("events", b"100")
    bodies = [d.body for d in read_to_the_end(connection, offset="first")]
    assert bodies == [b"%d" % n for n in range(101)]
    assert connection.query_offset("events", "billing") == 41


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_stop_signal_to_the_whole_node_group_keeps_every_record_and_offset(tmp_path, signum):
    """What systemd's stop does (the signal to every process of the group at once): the
    node stops in order, exit 0, and the next run has every record and stored offset."""
    data = tmp_path / "data"
    node = start_node(data)
    try:
        with connect(str(data)) as connection:
            connection.declare_queue("events", type="stream")
            connection.publish_many("events", [b"%d" % n for n in range(500)])
            connection.store_offset("events", "billing", 250)
        os.killpg(node.pid, signum)
        assert node.wait(timeout=60) == 0
        node = start_node(data)
        with connect(str(data)) as connection:
            records = connection.consume("events", offset="first")
            assert [d.body for d in read_through(records, 499)] == [b"%d" % n for n in range(500)]
            assert connection.query_offset("events", "billing") == 250
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(node.pid, signal.SIGKILL)
        node.wait()


def test_a_full_disk_refuses_the_batch_that_does_not_fit_and_loses_nothing_confirmed(
    small_disk,
):
    # No disk alarm (its limit 0): the write itself meets the full disk.
    limits = AlarmLimits(disk_free_limit_bytes=0, check_interval_s=60.0)
    with Node(small_disk / "data", file_size_limit=256 * 1024, alarm_limits=limits) as node:
        connection = node.connect()
        connection.declare_queue("events", type="stream", max_segment_size_bytes=64 * 1024)
        kept = [b"kept %d " % n + b"k" * 1000 for n in range(50)]
        connection.publish_many("events", kept)
        filler = fill_disk(small_disk)
        with pytest.raises(Nacked):
            connection.publish_many("events", [b"x" * 1000] * 200)
        read: list[list[bytes]] = []

        def read_all() -> bool:
            try:  # the stream is stopping, then restarting: asked until its successor serves
                records = read_through(connection.consume("events", offset="first"), 49)
                read.append([d.body for d in records])
            except (ActorError, Nacked, NotFound):
                return False
            return True

        wait_for(read_all, timeout=60)
        assert read[-1] == kept  # no part of the refused batch
        os.unlink(filler)

        def published() -> bool:
            try:
                connection.publish("events", b"after the disk was freed")
            except Nacked:  # still restarting
                return False
            return True

        wait_for(published, timeout=60)
        reader = read_to_the_end(connection, offset="first")
        assert [d.body for d in reader] == [*kept, b"after the disk was freed"]

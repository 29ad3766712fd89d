"""Spark reading Warren streams and writing into them (``format("warren")`` on a local[2,2]
session, every listener on loopback): ranges, timestamps and checkpoints read each offset
once, damage and retention fail a read by name, and a retried task adds nothing twice."""

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

if shutil.which("java") is None:
    pytest.skip(
        "Spark needs Java (a JRE 17 or newer on PATH); none is installed here",
        allow_module_level=True,
    )

from warren.queues.client.spark_read import (
    OffsetRange,
    Source,
    WarrenStreamReader,
    read_range,
)
from warren.queues.client.spark_records import record_batch
from warren.queues.engine.stream_log import (
    CHUNK_HEADER_BYTES,
    CHUNK_USER,
    FILE_HEADER_BYTES,
    StreamLog,
    encode_simple_entries,
    numbered_files,
    pack_chunk,
    parse_chunk_header,
    segment_file_name,
)
from warren.queues.errors import StreamCorrupt, WarrenReadError
from warren.queues.message import Message, decode, encode
from warren.queues.protocol import StreamAttach
from warren.supervisor import Node

from ...waiting import wait_for

# A Spark job takes minutes on a loaded machine, and a test stopped by the timeout inside
# a call into the JVM leaves the one Spark session broken for every test after it.
pytestmark = pytest.mark.timeout(600)


@pytest.fixture
def node(tmp_path):
    with Node(tmp_path / "data", listen="tcp://127.0.0.1:*") as running:
        yield running


def publish(node, stream, count, first=0, **properties):
    connection = node.connect()
    for start in range(first, first + count, 1000):
        bodies = [f"event {i}".encode() for i in range(start, min(first + count, start + 1000))]
        connection.publish_many(stream, bodies, **properties)


def load(spark, node, **options):
    """A batch read of "events" (``stream=None``: of none named, as with a pattern)."""
    reader = spark.read.format("warren").option("endpoint", node.listen_endpoint)
    for name, value in {"stream": "events", **options}.items():
        if value is not None:
            reader = reader.option(name, str(value))
    return reader.load()


def offsets_and_bodies(frame):
    return sorted((row.offset, row.body) for row in frame.select("offset", "body").collect())


def test_a_batch_read_gives_every_record_with_its_offset_and_properties(spark, node):
    connection = node.connect()
    connection.declare_queue("events", type="stream", max_segment_size_bytes=64 * 1024)
    publish(node, "events", 3000)
    connection.publish(
        "events", b"tagged", message_id="m-1", headers={"x-routing-key": "eu.orders", "n": 7}
    )
    frame = load(spark, node, partitionBytes=20_000)
    assert frame.rdd.getNumPartitions() > 3  # ranges cut on chunk boundaries
    read = offsets_and_bodies(frame)
    assert read == [(i, f"event {i}".encode()) for i in range(3000)] + [(3000, b"tagged")]
    tagged = frame.where("offset = 3000").collect()[0]
    assert tagged.message_id == "m-1"
    assert tagged.routing_key == "eu.orders"
    assert tagged.headers == {"x-routing-key": "eu.orders", "n": "7"}
    assert abs(tagged.timestamp.timestamp() - time.time()) < 60


def test_a_read_gives_what_each_publisher_set_in_properties_amqp_ones_too(spark, tmp_path):
    import datetime
    import decimal

    import pika

    with Node(tmp_path / "amqp", listen="tcp://127.0.0.1:*", amqp="127.0.0.1:0") as node:
        host, port = node.amqp_endpoint.rsplit(":", 1)
        amqp = pika.BlockingConnection(pika.ConnectionParameters(host, int(port)))
        channel = amqp.channel()
        channel.queue_declare("events", durable=True, arguments={"x-queue-type": "stream"})
        channel.confirm_delivery()
        sent = pika.BasicProperties(
            content_type="application/json",
            content_encoding="utf-8",
            correlation_id="c-1",
            reply_to="replies",
            message_id="a-1",
            timestamp=1_700_000_000,
            priority=3,
            expiration="60000",
            type="task",
            app_id="tests",
            user_id="guest",
            headers={"task": "add", "price": decimal.Decimal("1.25")},
        )
        channel.basic_publish("", "events", b"{}", sent)
        amqp.close()
        connection = node.connect()
        connection.publish("events", b"own", message_id="w-1")
        connection.publish_many("events", [b"bare"])
        rows = {row.body: row for row in load(spark, node).collect()}
    by_amqp, own, bare = rows[b"{}"], rows[b"own"], rows[b"bare"]
    assert by_amqp.properties.asDict() == {
        "message_id": "a-1",
        "correlation_id": "c-1",
        "content_type": "application/json",
        "content_encoding": "utf-8",
        "reply_to": "replies",
        "expiration": "60000",
        "timestamp": datetime.datetime.fromtimestamp(1_700_000_000),
        "priority": 3,
        "type": "task",
        "app_id": "tests",
        "user_id": "guest",
    }
    assert (by_amqp.message_id, by_amqp.routing_key) == ("a-1", "events")
    assert by_amqp.headers == {"task": "add", "price": '"1.25"'}
    assert own.properties.message_id == "w-1"
    assert own.properties.timestamp is None  # the client's clock stamp: not a property set
    assert bare.properties is None


def test_a_batch_read_takes_offset_and_timestamp_ranges(spark, node):
    connection = node.connect()
    connection.declare_queue("events", type="stream")
    publish(node, "events", 2000)
    time.sleep(0.05)  # the wall clock moves past the first chunks' timestamps
    middle_ms = int(time.time() * 1000)
    time.sleep(0.05)  # and the next chunks are stamped later than middle_ms
    publish(node, "events", 2000, first=2000)
    ranged = load(spark, node, startingOffsets=1500, endingOffsets=2500)
    assert [o for o, _ in offsets_and_bodies(ranged)] == list(range(1500, 2500))
    since = load(spark, node, startingOffsets=f"timestamp:{middle_ms}")
    assert [o for o, _ in offsets_and_bodies(since)] == list(range(2000, 4000))
    until = load(spark, node, endingOffsets=f"timestamp:{middle_ms}")
    assert [o for o, _ in offsets_and_bodies(until)] == list(range(2000))
    by_time = load(spark, node, endingOffsetsByTimestamp=json.dumps({"events": middle_ms}))
    assert [o for o, _ in offsets_and_bodies(by_time)] == list(range(2000))  # Kafka's name
    with pytest.raises(Exception, match="in place of endingOffsets"):
        load(
            spark, node, endingOffsets="latest", endingOffsetsByTimestamp='{"events": 0}'
        ).collect()
    assert load(spark, node, startingOffsets="latest").count() == 0
    last_chunk = [o for o, _ in offsets_and_bodies(load(spark, node, startingOffsets="last"))]
    assert 0 < len(last_chunk) <= 1000
    assert last_chunk == list(range(last_chunk[0], 4000))


def test_starting_offsets_by_timestamp_reads_from_the_first_chunk_at_or_after_it(spark, node):
    """Kafka's option names: startingOffsetsByTimestamp, and its strategy where no record
    is at or after the timestamp (error, or latest: start at the end)."""
    connection = node.connect()
    connection.declare_queue("events", type="stream")
    publish(node, "events", 500)
    middle_ms = int(time.time() * 1000) + 1
    wait_for(lambda: time.time() * 1000 > middle_ms, timeout=5)  # the next chunk is later
    publish(node, "events", 500, first=500)
    since = load(spark, node, startingOffsetsByTimestamp=json.dumps({"events": middle_ms}))
    assert [o for o, _ in offsets_and_bodies(since)] == list(range(500, 1000))
    by_partition = json.dumps({"events": {"0": middle_ms}})  # Kafka's shape: one partition
    assert load(spark, node, startingOffsetsByTimestamp=by_partition).count() == 500
    future = json.dumps({"events": int(time.time() * 1000) + 3_600_000})
    with pytest.raises(Exception, match="has no record at or after timestamp"):
        load(spark, node, startingOffsetsByTimestamp=future).count()
    latest = load(
        spark,
        node,
        startingOffsetsByTimestamp=future,
        startingOffsetsByTimestampStrategy="latest",
    )
    assert latest.count() == 0
    with pytest.raises(Exception, match="names stream 'other', which this read does not"):
        load(spark, node, startingOffsetsByTimestamp=json.dumps({"other": middle_ms})).count()
    with pytest.raises(Exception, match="not both"):
        load(spark, node, startingOffsets="first", startingOffsetsByTimestamp=future).count()


def test_a_read_of_several_streams_gives_each_record_once_with_its_stream(spark, node):
    """Kafka's subscribe with several topics, and subscribePattern: a comma list or a
    pattern, each stream's own offsets (Kafka's JSON), classic queues left out."""
    connection = node.connect()
    for name in ("events-eu", "events-us", "audit"):
        connection.declare_queue(name, type="stream")
    connection.declare_queue("events-queue")  # the pattern matches it: a queue, not read
    publish(node, "events-eu", 300)
    publish(node, "events-us", 200)
    connection.publish("audit", b"typed", headers={"raw": b"\x00\xff", "n": 7, "text": "\u00e9"})

    def read(**options):
        frame = load(spark, node, **options).select("stream", "offset")
        return sorted((row.stream, row.offset) for row in frame.collect())

    eu, us = [("events-eu", i) for i in range(300)], [("events-us", i) for i in range(200)]
    both = load(spark, node, stream="events-eu, events-us")
    assert both.rdd.getNumPartitions() >= 2  # a stream's ranges are its own tasks
    assert read(stream="events-eu, events-us") == eu + us
    assert read(stream=None, streamPattern="events-.*") == eu + us
    assert read(stream=None, streamPattern="nothing-.*") == []
    ranged = json.dumps({"events-eu": 250, "events-us": -2})  # -2: the first offset
    ending = json.dumps({"events-us": {"0": 20}})  # Kafka's by partition: one here
    assert read(stream="events-eu,events-us", startingOffsets=ranged, endingOffsets=ending) == (
        eu[250:] + us[:20]
    )
    with pytest.raises(Exception, match="an offset of one stream, and this read reads several"):
        read(stream="events-eu,events-us", startingOffsets=5)
    with pytest.raises(Exception, match="names stream 'audit', which this read does not read"):
        read(stream=None, streamPattern="events-.*", startingOffsets=json.dumps({"audit": 0}))
    with pytest.raises(Exception, match="one of the three"):
        read(streamPattern="events-.*")  # and stream "events"
    # includeHeaders: Kafka's lossless list, each value's bytes, in the order published
    (typed,) = load(spark, node, stream="audit", includeHeaders="true").collect()
    assert [(header.key, bytes(header.value)) for header in typed.headers] == [
        ("raw", b"\x00\xff"),
        ("n", b"7"),
        ("text", "\u00e9".encode()),
    ]
    assert typed.stream == "audit"


@pytest.mark.timeout(480)  # four queries in turn on a loaded machine
def test_a_query_over_a_pattern_shares_its_limit_and_takes_up_streams_declared_later(
    spark, node, tmp_path
):
    connection = node.connect()
    for name in ("events-eu", "events-us"):
        connection.declare_queue(name, type="stream")
    publish(node, "events-eu", 900)
    publish(node, "events-us", 300)
    options = {"stream": None, "streamPattern": "events-.*", "consumerName": "counts"}
    first_run: list = []
    query = stream_query(
        spark,
        node,
        tmp_path / "checkpoint",
        first_run,
        startingOffsets="first",
        maxRecordsPerTrigger=400,
        **options,
    )
    assert query.exception() is None
    per_stream = [
        {
            name: sum(1 for stream, _ in read if stream == name)
            for name in ("events-eu", "events-us")
        }
        for _, read in first_run
    ]  # the limit shared as each stream has records waiting
    assert per_stream == [{"events-eu": 300, "events-us": 100}] * 3
    connection.declare_queue("events-apac", type="stream")  # read from its first offset
    publish(node, "events-apac", 100)
    publish(node, "events-eu", 100, first=900)
    second_run: list = []
    query = stream_query(spark, node, tmp_path / "checkpoint", second_run, **options)
    assert query.exception() is None
    read = [pair for _, batch in first_run + second_run for pair in batch]
    every = load(spark, node, stream=None, streamPattern="events-.*").select("stream", "offset")
    assert sorted(read) == sorted((row.stream, row.offset) for row in every.collect())
    assert len(read) == 1400  # each once: none again, none skipped
    for name in ("events-eu", "events-us", "events-apac"):  # progress stored in each
        last = max(offset for stream, offset in read if stream == name)
        assert connection.query_offset(name, "counts") == last
    # a stream the pattern matched deleted: data loss, unless the query is told to go on
    connection.delete_queue("events-us")
    publish(node, "events-eu", 10, first=1000)
    failed = stream_query(spark, node, tmp_path / "checkpoint", [], **options)
    assert "stream 'events-us', which this query read, was deleted" in str(failed.exception())
    third_run: list = []
    query = stream_query(
        spark, node, tmp_path / "checkpoint", third_run, failOnDataLoss="false", **options
    )
    assert query.exception() is None
    assert [stream for _, batch in third_run for stream, _ in batch] == ["events-eu"] * 10


def test_min_partitions_cuts_a_small_stream_into_at_least_that_many_tasks(spark, node):
    connection = node.connect()
    connection.declare_queue("events", type="stream")
    publish(node, "events", 8000)  # 8 chunks of 1,000 records: far under partitionBytes
    assert load(spark, node).rdd.getNumPartitions() == 1
    frame = load(spark, node, minPartitions=4)
    assert frame.rdd.getNumPartitions() >= 4
    assert [o for o, _ in offsets_and_bodies(frame)] == list(range(8000))
    # a hint: chunks are never cut, so asking for more tasks than chunks gives a chunk each
    assert load(spark, node, minPartitions=100).rdd.getNumPartitions() == 8


def test_a_flipped_bit_in_a_chunk_fails_the_read_naming_the_chunk(spark, node, tmp_path):
    connection = node.connect()
    connection.declare_queue("events", type="stream")
    publish(node, "events", 2000)
    directory = connection._request("events", StreamAttach("first"))["directory"]
    segment = os.path.join(directory, segment_file_name(numbered_files(directory, ".segment")[0]))
    with open(segment, "r+b") as file:
        file.seek(FILE_HEADER_BYTES)
        first = parse_chunk_header(file.read(CHUNK_HEADER_BYTES), FILE_HEADER_BYTES)
        second_data = first.end + CHUNK_HEADER_BYTES + 100
        file.seek(second_data)
        byte = file.read(1)
        file.seek(second_data)
        file.write(bytes([byte[0] ^ 0x10]))
    with pytest.raises(Exception, match=rf"\(chunk {first.next_offset}\): its data fails its CRC"):
        load(spark, node).count()


def test_a_read_gives_each_record_as_decoding_it_alone_would(tmp_path):
    """Chunks of messages without properties have their bodies found in the chunk's bytes;
    any other chunk is decoded record by record: both read alike, whole or in part."""
    plain = encode(Message(b""))[:8]  # how a message without properties starts
    chunks = [
        [encode(Message(b"x" * size)) for size in (0, 1, 255, 256, 65_535, 65_536, 2)],
        [encode(Message(b"\x98\x01\xc0" * i, persistent=False)) for i in range(50)],
        [encode(Message(b"%d" % i, timestamp_ms=1_700_000_000_000 + i)) for i in range(20)],
        # bodies holding a message's first bytes: neither is taken for a record
        [encode(Message(b"a" + plain + b"\xc4\x05hello")) for _ in range(5)],
        [encode(Message(b"a" + plain + b"\xc4\x01z", message_id="m-0")), encode(Message(b"b"))],
        [
            encode(Message(b"tagged", message_id="m-1", headers={"x-routing-key": "eu", "n": 7})),
            encode(Message(b"plain", timestamp_ms=5)),
        ],
    ]
    with StreamLog(tmp_path / "events") as log:
        for records in chunks:
            log.append(records)
        log.sync()
        with log.reader() as reader:
            raws = list(iter(reader.read_raw_chunk, None))
    messages = [decode(record) for records in chunks for record in records]
    for start, end in [(0, len(messages)), (3, len(messages) - 1), (5, 9), (60, 61), (4, 4)]:
        rows = record_batch(raws, start, end, "test", "events").to_pylist()
        assert [row["offset"] for row in rows] == list(range(start, end))
        for row in rows:
            message = messages[row["offset"]]
            assert (row["body"], row["message_id"]) == (message.body, message.message_id)
            if message.headers:
                assert dict(row["headers"]) == {"x-routing-key": "eu", "n": "7"}
                assert row["routing_key"] == "eu"
            else:
                assert row["headers"] is None and row["routing_key"] is None
            assert row["stream"] == "events"
        lossless = record_batch(raws, start, end, "test", "events", include_headers=True)
        for row in lossless.to_pylist():
            if messages[row["offset"]].headers:  # Kafka's shape, the order published
                assert row["headers"] == [
                    {"key": "x-routing-key", "value": b"eu"},
                    {"key": "n", "value": b"7"},
                ]
    records = [encode(Message(b"one")), encode(Message(b"two"))]
    short = pack_chunk(CHUNK_USER, encode_simple_entries(records), 3, 3, 0, 0, 0)
    with pytest.raises(StreamCorrupt, match=r"test \(chunk 0\): it says 3 records and holds 2"):
        record_batch([short], 0, 3, "test")


def stream_query(spark, node, checkpoint, seen, **options):
    """A streaming read of "events" (``stream=None``: of none named) with
    trigger(availableNow=True), recording each micro-batch's offsets in ``seen`` (with
    their streams' names for a read of several); waits for it to end and returns it."""
    several = options.get("stream", "events") is None or "," in options.get("stream", "")

    def keep(frame, batch_id):
        if several:
            rows = frame.select("stream", "offset").collect()
            seen.append((batch_id, sorted((row.stream, row.offset) for row in rows)))
        else:
            seen.append((batch_id, sorted(row.offset for row in frame.select("offset").collect())))

    reader = spark.readStream.format("warren").option("endpoint", node.listen_endpoint)
    for name, value in {"stream": "events", **options}.items():
        if value is not None:
            reader = reader.option(name, str(value))
    query = (
        reader.load()
        .writeStream.foreachBatch(keep)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        query.awaitTermination(timeout=180)
    except Exception:  # noqa: BLE001  (the caller looks at query.exception())
        assert query.exception() is not None
    assert not query.isActive, "the query did not end within 180 s"
    return query


def test_a_streaming_query_restarted_from_its_checkpoint_reads_each_offset_once(
    spark, node, tmp_path
):
    connection = node.connect()
    connection.declare_queue("events", type="stream")
    publish(node, "events", 2500)
    first_run: list = []
    query = stream_query(
        spark,
        node,
        tmp_path / "checkpoint",
        first_run,
        startingOffsets="first",
        maxRecordsPerTrigger=1000,
        consumerName="counts",
    )
    assert query.exception() is None
    assert [len(offsets) for _, offsets in first_run] == [1000, 1000, 500]  # the limit held
    publish(node, "events", 1500, first=2500)
    second_run: list = []
    query = stream_query(
        spark, node, tmp_path / "checkpoint", second_run, maxRecordsPerTrigger=1000
    )
    assert query.exception() is None
    read = [o for _, offsets in first_run + second_run for o in offsets]
    every_record = [o for o, _ in offsets_and_bodies(load(spark, node))]
    assert len(every_record) == 4000  # (the stored offsets took offsets of their own)
    assert sorted(read) == every_record  # each once: none again, none skipped
    assert connection.query_offset("events", "counts") is not None  # commit stores progress


def test_a_progress_listener_computes_the_lag_docs_spark_shows(spark, node, tmp_path):
    """docs/spark.md's recipe: latestOffset minus endOffset, from each query progress."""
    from pyspark.sql.streaming import StreamingQueryListener

    lags: list[tuple[str, int]] = []  # (query id, lag): other tests' queries' events may come

    def next_offsets(text):
        found = json.loads(text)  # one stream named, or any other read
        by_stream = found["streams"] if "streams" in found else {found["stream"]: found}
        return {stream: each["offset"] for stream, each in by_stream.items()}

    class WarrenLag(StreamingQueryListener):
        def onQueryProgress(self, event):
            for source in event.progress.sources:
                latest, end = source.latestOffset, source.endOffset
                if latest and end and '"identity"' in latest:
                    latest, end = next_offsets(latest), next_offsets(end)
                    lag = sum(latest[name] - end[name] for name in end if name in latest)
                    lags.append((str(event.progress.id), lag))

        def onQueryStarted(self, event): ...

        def onQueryIdle(self, event): ...

        def onQueryTerminated(self, event): ...

    node.connect().declare_queue("events", type="stream")
    publish(node, "events", 3000)
    listener = WarrenLag()
    spark.streams.addListener(listener)
    try:
        query = stream_query(
            spark,
            node,
            tmp_path / "checkpoint",
            [],
            startingOffsets="first",
            maxRecordsPerTrigger=1000,
        )
        assert query.exception() is None

        def ours() -> list[int]:
            return [lag for query_id, lag in lags if query_id == str(query.id)]

        wait_for(lambda: 0 in ours(), timeout=60)  # progress reaches listeners after the end
    finally:
        spark.streams.removeListener(listener)
    assert ours()[:3] == [2000, 1000, 0]


def test_a_stream_deleted_and_declared_again_fails_the_query_that_read_it(spark, node, tmp_path):
    connection = node.connect()
    connection.declare_queue("events", type="stream")
    publish(node, "events", 100)
    assert stream_query(spark, node, tmp_path / "checkpoint", [], startingOffsets="first")
    connection.delete_queue("events")
    connection.declare_queue("events", type="stream")
    publish(node, "events", 300)
    query = stream_query(spark, node, tmp_path / "checkpoint", [])
    assert "deleted and declared again" in str(query.exception())


def test_max_bytes_per_trigger_cuts_micro_batches_on_chunk_boundaries(spark, node, tmp_path):
    connection = node.connect()
    connection.declare_queue("events", type="stream")
    for _ in range(20):  # 20 chunks of 50 records of 1,000 bytes: one chunk a call
        connection.publish_many("events", [b"x" * 1000] * 50)
    seen: list = []
    query = stream_query(
        spark,
        node,
        tmp_path / "checkpoint",
        seen,
        startingOffsets="first",
        maxBytesPerTrigger=120_000,
    )
    assert query.exception() is None
    sizes = [len(offsets) for _, offsets in seen if offsets]
    assert sorted(o for _, offsets in seen for o in offsets) == list(range(1000))
    # a micro-batch ends at the first chunk boundary at or past the bytes: three chunks
    # (two hold some 103 KB), never the whole stream at once
    assert max(sizes) <= 150 and len(sizes) >= 6


def continuous_query(spark, node, checkpoint, seen, **options):
    """A streaming read of "events" triggered every 100 ms, recording each micro-batch's
    offsets in ``seen``; the caller stops it."""

    def keep(frame, batch_id):
        seen.append((batch_id, sorted(row.offset for row in frame.select("offset").collect())))

    reader = spark.readStream.format("warren").option("endpoint", node.listen_endpoint)
    for name, value in {"stream": "events", **options}.items():
        reader = reader.option(name, str(value))
    return (
        reader.load()
        .writeStream.foreachBatch(keep)
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="100 milliseconds")
        .start()
    )


def test_min_offsets_per_trigger_waits_for_enough_records_or_for_max_trigger_delay(
    spark, node, tmp_path
):
    """As Kafka's source: the first trigger after a start is never held back; later ones
    wait for minOffsetsPerTrigger offsets, or for maxTriggerDelay since the last."""
    connection = node.connect()
    connection.declare_queue("events", type="stream")
    # a progress report for every trigger, with data or not: the triggers can be counted
    spark.conf.set("spark.sql.streaming.noDataProgressEventInterval", "10")
    seen: list = []
    options = {"startingOffsets": "latest", "minOffsetsPerTrigger": 100}
    query = continuous_query(spark, node, tmp_path / "waits", seen, maxTriggerDelay="1h", **options)
    try:
        wait_for(lambda: len(query.recentProgress) >= 3, timeout=120)  # it has started
        publish(node, "events", 30)
        triggers = len(query.recentProgress)
        wait_for(lambda: len(query.recentProgress) >= triggers + 5, timeout=120)
        assert not [offsets for _, offsets in seen if offsets]  # 30 < 100: held back
        publish(node, "events", 80, first=30)
        wait_for(lambda: any(offsets for _, offsets in seen), timeout=120)
        assert [offsets for _, offsets in seen if offsets][0] == list(range(110))
    finally:
        query.stop()
    late: list = []
    query = continuous_query(
        spark, node, tmp_path / "delayed", late, maxTriggerDelay="1s", **options
    )
    try:
        wait_for(lambda: len(query.recentProgress) >= 3, timeout=120)
        publish(node, "events", 30, first=110)  # never 100: the delay lets them through
        wait_for(lambda: any(offsets for _, offsets in late), timeout=120)
        assert [len(offsets) for _, offsets in late if offsets][0] == 30
    finally:
        query.stop()
        spark.conf.unset("spark.sql.streaming.noDataProgressEventInterval")


def test_retention_past_a_query_fails_it_by_name_or_is_skipped_when_asked(spark, node, tmp_path):
    connection = node.connect()
    connection.declare_queue(
        "events", type="stream", max_segment_size_bytes=20_000, max_length_bytes=60_000
    )
    publish(node, "events", 200)
    for checkpoint in ("checkpoint", "bounded"):  # two queries stopped at offset 200
        stream_query(spark, node, tmp_path / checkpoint, [], startingOffsets="first")
    publish(node, "events", 19_000, first=200)  # retention deletes offsets 200 onwards
    for start in range(19_200, 20_200, 100):  # what it keeps, in chunks of 100
        connection.publish_many(
            "events", [f"event {i}".encode() for i in range(start, start + 100)]
        )
    first = connection.queue_stats("events")["first_offset"]
    assert first > 200
    failed = stream_query(spark, node, tmp_path / "checkpoint", [])
    assert f"offsets 200 to {first - 1}" in str(failed.exception())
    assert "deleted by retention" in str(failed.exception())
    skipped: list = []
    query = stream_query(spark, node, tmp_path / "checkpoint", skipped, failOnDataLoss="false")
    assert query.exception() is None
    read = sorted(o for _, offsets in skipped for o in offsets)
    # every record the stream kept, none twice: the offsets the queries stored took
    # offsets of their own among them
    with connection.consume("events", offset="first", inactivity_timeout=2) as reader:
        kept = [record.offset for record in reader]
    assert read == kept and kept[0] >= first and len(kept) > 100
    # The other query, planning its first micro-batch past the skip with a bound in
    # bytes: the bound still counts (from the first offset kept), batch after batch.
    bounded: list = []
    query = stream_query(
        spark,
        node,
        tmp_path / "bounded",
        bounded,
        failOnDataLoss="false",
        maxBytesPerTrigger=10_000,
    )
    assert query.exception() is None
    assert len([offsets for _, offsets in bounded if offsets]) >= 3, bounded
    assert sorted(o for _, offsets in bounded for o in offsets)[: len(kept)] == kept


def test_writing_into_a_stream_with_a_failed_task_adds_no_duplicate(spark, node):
    from pyspark import TaskContext

    connection = node.connect()
    connection.declare_queue("events", type="stream")

    def fail_first_attempt(value):
        context = TaskContext.get()
        if value == 7_000 and context.attemptNumber() == 0:
            raise RuntimeError("the first attempt of this task fails, on purpose")
        return value

    spark.udf.register("fail_first_attempt", fail_first_attempt, "long")
    frame = spark.range(10_000, numPartitions=2).selectExpr(
        "cast(fail_first_attempt(id) as string) as body"
    )
    frame.write.format("warren").mode("append").option("endpoint", node.listen_endpoint).option(
        "stream", "events"
    ).option("producer", "loader").save()
    frame.write.format("warren").mode("append").option("endpoint", node.listen_endpoint).option(
        "stream", "events"
    ).option("producer", "loader").save()  # the job run again
    bodies = sorted(int(row.body) for row in load(spark, node).select("body").collect())
    assert bodies == list(range(10_000))


def test_a_super_stream_written_by_key_through_a_failed_task_reads_back_by_partition(spark, node):
    """Kafka's keyed topic: each row to the partition its routing_key hashes to (where
    Warren's client and RabbitMQ's put that key), keyless rows to their task's, exactly
    once through a failed task; read back as the partitions, one task each at least."""
    from pyspark import TaskContext

    from warren.queues.routing import partition_of

    connection = node.connect()
    connection.declare_queue("orders", type="super-stream", partitions=3)

    def fail_first_attempt(value):
        if value == 1_500 and TaskContext.get().attemptNumber() == 0:
            raise RuntimeError("the first attempt of this task fails, on purpose")
        return value

    spark.udf.register("fail_first_attempt", fail_first_attempt, "long")
    frame = spark.range(2_000, numPartitions=2).selectExpr(
        "cast(fail_first_attempt(id) as string) as body",
        "case when id % 10 = 0 then null else concat('customer-', id % 37) end as routing_key",
        "case when id % 100 = 1 then concat('m-', id) end as message_id",  # the row path
    )
    writer = frame.write.format("warren").mode("append")
    writer = writer.option("endpoint", node.listen_endpoint).option("superStream", "orders")
    writer.option("producer", "loader").save()
    writer.option("producer", "loader").save()  # the job run again: nothing twice
    read = load(spark, node, stream=None, superStream="orders")
    assert read.rdd.getNumPartitions() >= 3
    rows = read.select("stream", "offset", "body", "message_id").collect()
    assert sorted(int(row.body) for row in rows) == list(range(2_000))
    for row in rows:
        n = int(row.body)
        task = 0 if n < 1_000 else 1  # spark.range's partitions
        expected = task % 3 if n % 10 == 0 else partition_of(f"customer-{n % 37}", 3)
        assert row.stream == f"orders-{expected}", (n, row.stream)
        assert row.message_id == (f"m-{n}" if n % 100 == 1 else None)
    partition_one = sorted((row.offset, int(row.body)) for row in rows if row.stream == "orders-1")
    assert [offset for offset, _ in partition_one] == list(range(len(partition_one)))
    for task_rows in (
        [n for _, n in partition_one if n < 1_000],
        [n for _, n in partition_one if n >= 1_000],
    ):
        assert task_rows == sorted(task_rows)  # a task's rows in their order
    # Rows of a body and a key alone go the columnar way: a column of keys hashed at
    # once, batches joined, one chunk a partition; each lands where its key says too.
    connection.declare_queue("ledger", type="super-stream", partitions=3)
    plain = spark.range(30_000, numPartitions=2).selectExpr(
        "cast(id as string) as body", "concat('customer-', id % 37) as routing_key"
    )
    plain.write.format("warren").mode("append").option("endpoint", node.listen_endpoint).option(
        "superStream", "ledger"
    ).save()
    ledger = load(spark, node, stream=None, superStream="ledger").select("stream", "body")
    placed = [(row.stream, int(row.body)) for row in ledger.collect()]
    assert sorted(n for _, n in placed) == list(range(30_000))
    assert all(p == f"ledger-{partition_of(f'customer-{n % 37}', 3)}" for p, n in placed)
    with pytest.raises(Exception, match="super stream 'nothing' is not declared"):
        frame.write.format("warren").mode("append").option("endpoint", node.listen_endpoint).option(
            "superStream", "nothing"
        ).save()
    with pytest.raises(Exception, match="one of the three"):
        load(spark, node, superStream="orders").collect()  # and stream "events"


def test_rows_with_and_without_properties_written_into_a_stream_read_back_as_written(spark, node):
    connection = node.connect()
    connection.declare_queue("events", type="stream")
    tagged = "id >= 4000 and id % 7 = 0"  # in the last partition only: the others carry bodies
    frame = spark.range(6_000, numPartitions=3).selectExpr(
        "cast(id as string) as body",
        f"case when {tagged} then map('x-routing-key', 'eu', 'n', cast(id as string)) end "
        "as headers",
        "case when id >= 4000 and id % 5 = 0 then concat('m-', id) end as message_id",
    )
    frame.write.format("warren").mode("append").option("endpoint", node.listen_endpoint).option(
        "stream", "events"
    ).save()
    rows = load(spark, node).collect()
    assert sorted(int(row.body) for row in rows) == list(range(6_000))
    for row in rows:
        i = int(row.body)
        headers = {"x-routing-key": "eu", "n": str(i)} if i >= 4000 and i % 7 == 0 else None
        assert (row.headers, row.routing_key) == (headers, headers and "eu")
        assert row.message_id == (f"m-{i}" if i >= 4000 and i % 5 == 0 else None)


def test_the_trigger_options_are_checked_before_a_query_starts():
    streaming = {"endpoint": "tcp://127.0.0.1:1", "stream": "events"}
    with pytest.raises(WarrenReadError, match="give minOffsetsPerTrigger too"):
        Source.from_options({**streaming, "maxTriggerDelay": "5s"}, streaming=True)
    with pytest.raises(WarrenReadError, match="maxTriggerDelay is a positive number of seconds"):
        Source.from_options(
            {**streaming, "minOffsetsPerTrigger": "10", "maxTriggerDelay": "soon"}, streaming=True
        )
    with pytest.raises(WarrenReadError, match="minOffsetsPerTrigger"):
        Source.from_options({**streaming, "minOffsetsPerTrigger": "-1"}, streaming=True)
    too_large = {**streaming, "maxBytesPerTrigger": str(2**31 + 1)}
    with pytest.raises(WarrenReadError, match=r"maxBytesPerTrigger is an int in 1\.\.2147483648"):
        Source.from_options(too_large, streaming=True)
    with pytest.raises(WarrenReadError, match="partitionBytes is an int in 1"):
        Source.from_options({**streaming, "partitionBytes": str(2**40)}, streaming=True)
    with pytest.raises(WarrenReadError, match="maxBytesPerTrigger is for a streaming read only"):
        Source.from_options({**streaming, "maxBytesPerTrigger": "1000"}, streaming=False)
    source = Source.from_options(
        {**streaming, "minOffsetsPerTrigger": "10", "maxTriggerDelay": "2m"}, streaming=True
    )
    assert (source.min_offsets_per_trigger, source.max_trigger_delay_s) == (10, 120.0)
    default = Source.from_options({**streaming, "minOffsetsPerTrigger": "10"}, streaming=True)
    assert default.max_trigger_delay_s == 15 * 60  # Kafka's source waits as long


def test_every_trigger_option_shapes_a_micro_batch_unless_spark_asks_for_everything():
    """What ``latestOffset`` lets through (no node: nothing here asks one)."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMinRows

    options = {"endpoint": "tcp://127.0.0.1:1", "stream": "events"}
    options |= {"minOffsetsPerTrigger": "100", "maxRecordsPerTrigger": "50"}
    reader = WarrenStreamReader(Source.from_options(options, streaming=True))
    limit = reader.getDefaultReadLimit()
    assert isinstance(limit, ReadMinRows)  # not ReadAllAvailable: a once trigger shows

    def shaped(start, end, limit):
        return reader._shaped({"events": start}, {"events": end}, limit)["events"]

    assert shaped(0, 30, limit) == 30  # the first after a start is never held
    assert shaped(30, 60, limit) == 30  # then under the minimum: held back
    assert shaped(30, 10_000, limit) == 80  # a backlog: the maximum, not held
    assert shaped(80, 90, ReadAllAvailable()) == 90  # trigger(once=True): all
    # several streams: the minimum counts them all, the maximum is shared as each has
    # records waiting (Kafka's), every record of the limit given to one
    options |= {"stream": "a,b,c"}
    reader = WarrenStreamReader(Source.from_options(options, streaming=True))
    starts = {"a": 0, "b": 10, "c": 5}
    assert reader._shaped(starts, {"a": 30, "b": 20, "c": 5}, limit) == {"a": 30, "b": 20, "c": 5}
    assert reader._shaped(starts, {"a": 60, "b": 40, "c": 10}, limit) == starts  # 95 < 100
    assert reader._shaped(starts, {"a": 100, "b": 110, "c": 55}, limit) == {
        "a": 20,
        "b": 30,
        "c": 15,
    }
    assert reader._shaped(starts, {"a": 7, "b": 10, "c": 5_000}, limit) == {
        "a": 1,  # 0.07 of a record: never starved (Kafka's), past the limit by one
        "b": 10,
        "c": 55,  # the one rounding lost most from took the rest
    }


def test_bad_options_and_targets_fail_with_what_is_wrong(spark, node):
    connection = node.connect()
    connection.declare_queue("orders")
    connection.declare_queue("events", type="stream")
    with pytest.raises(Exception, match="stream 'missing' is not declared"):
        load(spark, node, stream="missing").count()
    with pytest.raises(Exception, match="'orders' is a classic queue, not a stream"):
        load(spark, node, stream="orders").count()
    with pytest.raises(Exception, match="option startingOffsets is"):
        load(spark, node, startingOffsets="yesterday").count()
    with pytest.raises(Exception, match="endingOffsets 99 is past the end of stream 'events'"):
        load(spark, node, endingOffsets=99).count()
    with pytest.raises(Exception, match="maxRecordsPerTrigger is for a streaming read"):
        load(spark, node, maxRecordsPerTrigger=10).count()
    with pytest.raises(Exception, match="'orders' is a classic queue, not a stream"):
        spark.range(3).selectExpr("cast(id as string) as body").write.format("warren").mode(
            "append"
        ).option("endpoint", node.listen_endpoint).option("stream", "orders").save()


@pytest.mark.timeout(300)  # a loaded machine: several Spark jobs and queries in turn
def test_an_option_the_source_does_not_take_is_refused_whatever_its_case(spark, node, tmp_path):
    """A misspelt option would leave its default in force: an ending read to the end, a
    streaming start that skips the backlog, a rerun's producer made up anew."""
    connection = node.connect()
    connection.declare_queue("events", type="stream")
    publish(node, "events", 20)
    with pytest.raises(Exception, match="option 'endingoffset' is not one .*'endingOffsets'"):
        load(spark, node, endingOffset=5).count()
    failed = stream_query(spark, node, tmp_path / "checkpoint", [], startingOffset="first")
    assert "did you mean 'startingOffsets'" in str(failed.exception())
    frame = spark.range(3).selectExpr("cast(id as string) as body")
    with pytest.raises(Exception, match="option 'producr' is not one a write takes"):
        frame.write.format("warren").mode("append").option("endpoint", node.listen_endpoint).option(
            "stream", "events"
        ).option("producr", "nightly").save()
    assert connection.queue_stats("events")["messages_ready"] == 20  # nothing written
    # the options it takes, in any case, as Spark's own are (it passes them in lower case)
    from pyspark.sql.datasource import CaseInsensitiveDict

    given = CaseInsensitiveDict(endpoint="tcp://127.0.0.1:1", STREAM="events", FailOnDataLoss="0")
    with pytest.raises(WarrenReadError, match="option failOnDataLoss is true or false, not '0'"):
        Source.from_options(given, streaming=True)  # known, whatever its case: then checked


@pytest.mark.timeout(300)
def test_a_start_past_the_streams_end_is_refused_not_read_from_the_first(spark, node, tmp_path):
    """Only a start below the first offset is data loss (skipped with failOnDataLoss=false);
    one past the end is a mistake either way, and never reads the stream again."""
    connection = node.connect()
    connection.declare_queue("events", type="stream")
    publish(node, "events", 100)
    for flag in ("true", "false"):
        with pytest.raises(Exception, match="offset 5000 is past the end of stream 'events'"):
            load(spark, node, startingOffsets=5000, failOnDataLoss=flag).count()
    seen: list = []
    failed = stream_query(
        spark, node, tmp_path / "checkpoint", seen, startingOffsets=5000, failOnDataLoss="false"
    )
    assert "offset 5000 is past the end" in str(failed.exception())
    assert seen == []


@pytest.mark.timeout(480)
def test_a_query_that_read_everything_leaves_its_consumer_at_lag_0(spark, node, tmp_path):
    """Spark commits a micro-batch only when it plans the next one, which a finished
    query never does: the last one is stored all the same, and never one the query did
    not finish."""
    connection = node.connect()
    connection.declare_queue("events", type="stream")
    publish(node, "events", 2500)
    seen: list = []
    query = stream_query(
        spark, node, tmp_path / "done", seen, startingOffsets="first", consumerName="counts"
    )
    assert query.exception() is None
    assert sum(len(offsets) for _, offsets in seen) == 2500
    assert connection.query_offset("events", "counts") == 2499
    assert connection.queue_stats("events")["consumer_offsets"]["counts"]["lag"] == 0

    def fail_the_second_batch(frame, batch_id):
        if batch_id == 1:
            raise RuntimeError("the second micro-batch fails, on purpose")

    reader = spark.readStream.format("warren").option("endpoint", node.listen_endpoint)
    options = {"stream": "events", "startingOffsets": "first", "maxRecordsPerTrigger": 1000}
    for name, value in {**options, "consumerName": "halfway"}.items():
        reader = reader.option(name, str(value))
    failing = (
        reader.load()
        .writeStream.foreachBatch(fail_the_second_batch)
        .option("checkpointLocation", str(tmp_path / "failing"))
        .trigger(availableNow=True)
        .start()
    )
    with pytest.raises(Exception, match="the second micro-batch fails"):
        failing.awaitTermination(timeout=180)
    assert not failing.isActive
    wait_for(lambda: connection.query_offset("events", "halfway") is not None, timeout=30)
    assert connection.query_offset("events", "halfway") == 999  # the first batch alone


def test_a_node_that_stays_down_fails_the_task_naming_its_offsets(tmp_path):
    with Node(tmp_path / "data", listen="tcp://127.0.0.1:*") as running:
        endpoint = running.listen_endpoint
        connection = running.connect()
        connection.declare_queue("events", type="stream")
        publish(running, "events", 10)
        identity = connection.queue_stats("events")["identity"]
    source = Source.from_options(
        {"endpoint": endpoint, "stream": "events", "timeout_s": "1"}, streaming=False
    )
    started = time.monotonic()
    with pytest.raises(WarrenReadError, match="offsets 0 to 9.*offsets from 0 were not read"):
        list(read_range(source, OffsetRange("events", 0, 10, identity)))
    assert time.monotonic() - started < 30  # retried for timeout_s, then failed


EXAMPLE_HANG_S = 1200  # three Spark sessions in turn; minutes each on a loaded machine


@pytest.mark.timeout(EXAMPLE_HANG_S + 120)
def test_the_stream_pipeline_example_counts_every_event_once_through_a_killed_driver(
    short_tmp_path,
):
    """The example end to end at a small size: it exits non-zero on any loss or repeat."""
    example = Path(__file__).resolve().parents[3] / "examples" / "spark_stream_pipeline.py"
    run = subprocess.Popen(
        [sys.executable, str(example), "--events", "8000", "--per-trigger", "4000"]
        + ["--kill-after", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env={**os.environ, "TMPDIR": str(short_tmp_path)},
    )
    try:
        # under the test's timeout, so that a hang fails here with what the example said
        output, _ = run.communicate(timeout=EXAMPLE_HANG_S)
    except subprocess.TimeoutExpired:
        # every process that may hold its output open, its group's and any outside it
        for process in [*psutil.Process(run.pid).children(recursive=True), run]:
            with contextlib.suppress(psutil.Error, ProcessLookupError):
                process.kill()
        output, _ = run.communicate(timeout=60)
        pytest.fail(
            f"the example did not finish in {EXAMPLE_HANG_S} s; its output ended:\n{output[-3000:]}"
        )
    finally:
        # the example's group: its own process, its Spark JVMs and their workers
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.pid, signal.SIGKILL)
        run.wait()
    assert run.returncode == 0, output[-3000:]
    assert "SIGKILLed the driver's process group after 1 micro-batches" in output
    assert re.search(r"events counted\s+8,000", output)
    assert re.search(r"duplicate result messages\s+0\n", output)

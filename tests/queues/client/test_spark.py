"""Spark executors publishing into Warren through ``format("warren")`` (local[2,2], every
listener on loopback): exactly the rows written arrive, whatever is retried or killed.

And executors reaching a node that wants CURVE keys without a key file placed on their
machines by hand: the key's content given inline (option ``key``, base64) or the key
file shipped with ``SparkContext.addFile`` (option ``key_file`` names it); and the
mistakes a user makes with either, each failing the job with what is wrong. (One module
for both: one Spark session, one JVM start fewer on a worker.)"""

import base64
import os
import shutil
import signal
import subprocess
import sys
import threading
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

if shutil.which("java") is None:
    pytest.skip(
        "Spark needs Java (a JRE 17 or newer on PATH); none is installed here",
        allow_module_level=True,
    )

from warren import connect
from warren.errors import WarrenWriteError
from warren.queues.broker.listener import with_free_port
from warren.queues.client.keys import create_client_key
from warren.queues.client.spark import encode_bodies, partition_publisher
from warren.queues.message import Message, decode, encode
from warren.supervisor import Node
from warren.supervisor.chaos.faults import kill_processes

from ...waiting import wait_for

ROOT = Path(__file__).resolve().parents[3]

# A Spark job takes minutes on a loaded machine, and a test stopped by the timeout inside
# a call into the JVM leaves the one Spark session broken for every test after it.
pytestmark = pytest.mark.timeout(600)


@pytest.fixture
def node(tmp_path):
    with Node(tmp_path / "data", listen="tcp://127.0.0.1:*") as running:
        yield running


def drain(node, queue):
    """Every body in ``queue``, counted: consumed, a thousand unacked at most, and acked."""
    connection = node.connect()
    waiting = connection.queue_stats(queue)["messages_ready"]
    bodies = Counter()
    if waiting:
        for taken, delivery in enumerate(connection.consume(queue, prefetch=1000), 1):
            bodies[delivery.body] += 1
            if taken % 500 == 0 or taken == waiting:
                delivery.ack(multiple=True)
            if taken == waiting:
                break
    connection.close()
    return bodies


def rows(spark, count, partitions=4):
    return spark.range(count, numPartitions=partitions).selectExpr("cast(id as string) as body")


def write(frame, endpoint, **options):
    writer = frame.write.format("warren").mode("append").option("endpoint", endpoint)
    for name, value in options.items():
        writer = writer.option(name, str(value))
    writer.save()


def body_failing_first_attempt():
    """A ``body`` column of each ``id`` as text, whose task in partition 1 fails halfway
    (at id 15,000) in its first attempt."""
    from pyspark.sql.functions import col, udf

    @udf("string")
    def fail_first_attempt(value):
        from pyspark import TaskContext

        context = TaskContext.get()
        if context.partitionId() == 1 and context.attemptNumber() == 0 and value == 15_000:
            raise RuntimeError("the first attempt of partition 1 fails halfway")
        return str(value)

    return fail_first_attempt(col("id")).alias("body")


def test_a_write_of_n_rows_gives_exactly_n_messages_with_their_properties(spark, node):
    node.declare_queue("orders")
    write(rows(spark, 20_000), node.listen_endpoint, queue="orders")
    assert drain(node, "orders") == Counter({b"%d" % i: 1 for i in range(20_000)})
    node.declare_exchange("events", kind="topic")
    node.declare_queue("eu")
    node.bind_queue("eu", "events", "order.eu")
    frame = spark.createDataFrame(
        [(b"a", "order.eu", {"k": "v"}, "m-1"), (b"b", "order.us", None, "m-2")],
        "body binary, routing_key string, headers map<string,string>, message_id string",
    )
    with pytest.raises(Exception, match="routes 'order.us' to no queue"):
        write(frame, node.listen_endpoint, exchange="events", producer="routing")
    # Run again under the same job name: the row the failed run delivered is not repeated.
    write(frame, node.listen_endpoint, exchange="events", mandatory="false", producer="routing")
    delivery = node.connect().get("eu")
    assert (delivery.body, delivery.headers, delivery.message_id) == (b"a", {"k": "v"}, "m-1")
    assert node.connect().get("eu") is None


def test_an_exchange_sending_each_rows_key_to_its_own_queue_gets_every_row_once(spark, node):
    """Through an exchange that routes rows by key to different queues, each queue sees
    only its rows: they carry sequences without gaps for it, and a task that fails
    halfway and runs again adds nothing twice."""
    from pyspark.sql.functions import col

    node.declare_exchange("regions", kind="direct")
    for region in ("eu", "us"):
        node.declare_queue(region)
        node.bind_queue(region, "regions", region)

    frame = spark.range(40_000, numPartitions=4).select(
        body_failing_first_attempt(),
        # runs of 3 rows to eu, then 7 to us, and so on: neither queue gets every row
        ((col("id") % 10) < 3).cast("int").alias("eu"),
    )
    frame = frame.selectExpr("body", "CASE WHEN eu = 1 THEN 'eu' ELSE 'us' END AS routing_key")
    write(frame, node.listen_endpoint, exchange="regions", producer="by-region")
    eu = {b"%d" % i: 1 for i in range(40_000) if i % 10 < 3}
    us = {b"%d" % i: 1 for i in range(40_000) if i % 10 >= 3}
    assert drain(node, "eu") == Counter(eu) and drain(node, "us") == Counter(us)
    write(frame, node.listen_endpoint, exchange="regions", producer="by-region")  # again
    assert drain(node, "eu") == Counter() and drain(node, "us") == Counter()


def test_binary_and_typed_header_values_arrive_as_their_types(spark, node):
    node.declare_queue("orders")
    frame = spark.createDataFrame(
        [(b"a", {"raw": b"\x00\xff"}, {"n": 7}, {"ok": True})],
        "body binary, raw map<string,binary>, counts map<string,bigint>, flags map<string,boolean>",
    )
    for column in ("raw", "counts", "flags"):
        headers = frame.selectExpr("body", f"{column} as headers")
        write(headers, node.listen_endpoint, queue="orders")
    connection = node.connect()
    headers = [connection.get("orders").headers for _ in range(3)]
    assert headers == [{"raw": b"\x00\xff"}, {"n": 7}, {"ok": True}]


def test_bodies_encoded_a_batch_at_a_time_are_the_bytes_of_encoding_each_alone():
    import pyarrow as pa

    sizes = [0, 1, 255, 256, 65_535, 65_536, 3, 300]  # msgpack's bin 8, 16 and 32
    bodies = [bytes([size % 251]) * size for size in sizes]
    for persistent in (True, False):
        expected = [encode(Message(body, persistent=persistent)) for body in bodies]
        assert encode_bodies(pa.array(bodies, pa.binary()), persistent) == expected
        assert encode_bodies(pa.array(bodies[:2], pa.binary()), persistent) == expected[:2]
        sliced = pa.array(bodies, pa.large_binary()).slice(2, 3)  # an offset into its buffers
        assert encode_bodies(sliced, persistent) == expected[2:5]
    texts = ["", "é", "ü" * 200]
    assert encode_bodies(pa.array(texts, pa.string()), True) == [
        encode(Message(text.encode())) for text in texts
    ]
    assert encode_bodies(pa.array([], pa.binary()), True) == []


def test_a_task_failing_its_first_attempt_and_a_repeated_write_add_no_duplicates(spark, node):
    node.declare_queue("orders")
    frame = spark.range(40_000, numPartitions=4).select(body_failing_first_attempt())
    write(frame, node.listen_endpoint, queue="orders", producer="nightly-orders")
    assert drain(node, "orders") == Counter({b"%d" % i: 1 for i in range(40_000)})
    # The same job once more, as a speculative copy of every task would send it.
    write(rows(spark, 40_000), node.listen_endpoint, queue="orders", producer="nightly-orders")
    assert drain(node, "orders") == Counter()  # every row was a repeat


def test_rows_naming_their_own_queue_or_stream_arrive_there_once_each(spark, node):
    """Kafka's topic column: a queue or stream column names each row's destination where
    no option names one (an option overrides it); a retried task adds nothing twice, each
    destination counting its own rows."""
    from pyspark.sql.functions import expr

    for region in ("eu", "us"):
        node.declare_queue(f"orders-{region}")
        node.declare_queue(f"events-{region}", type="stream")
    node.declare_queue("orders-all")
    region = expr("case when id % 3 = 0 then 'orders-us' else 'orders-eu' end").alias("queue")
    frame = spark.range(40_000, numPartitions=4).select(body_failing_first_attempt(), region)
    write(frame, node.listen_endpoint, producer="by-region")
    us = Counter({b"%d" % i: 1 for i in range(0, 40_000, 3)})
    assert drain(node, "orders-us") == us
    assert drain(node, "orders-eu") == Counter({b"%d" % i: 1 for i in range(40_000) if i % 3})
    write(frame.limit(30), node.listen_endpoint, queue="orders-all")  # the option overrides
    overridden = rows(spark, 20).selectExpr("body", "1 as stream")  # of any type then
    write(overridden, node.listen_endpoint, queue="orders-all")
    assert sum(drain(node, "orders-all").values()) == 50
    streams = rows(spark, 300).selectExpr(  # with properties: encoded row by row
        "body",
        "body as message_id",
        "case when cast(body as int) % 2 = 0 then 'events-eu' else 'events-us' end as stream",
    )
    write(streams, node.listen_endpoint)
    read = (
        spark.read.format("warren")
        .option("endpoint", node.listen_endpoint)
        .option("stream", "events-eu,events-us")
        .load()
    )
    assert Counter((row.stream, row.body, row.message_id) for row in read.collect()) == Counter(
        {(f"events-{'us' if i % 2 else 'eu'}", b"%d" % i, str(i)): 1 for i in range(300)}
    )
    with pytest.raises(Exception, match=r"row 0: queue is null; every row names its queue"):
        write(
            rows(spark, 5).selectExpr("body", "cast(null as string) as queue"), node.listen_endpoint
        )
    with pytest.raises(Exception, match=r"row 2: stream is null; every row names its stream"):
        write(
            rows(spark, 5, partitions=1).selectExpr(
                "body", "case when body = '2' then null else 'events-eu' end as stream"
            ),
            node.listen_endpoint,
        )
    with pytest.raises(Exception, match="'orders-eu' is a classic queue, not a stream"):
        write(rows(spark, 5).selectExpr("body", "'orders-eu' as stream"), node.listen_endpoint)
    with pytest.raises(Exception, match="the rows have a queue and a stream column"):
        write(
            rows(spark, 5).selectExpr("body", "'orders-eu' as queue", "'events-eu' as stream"),
            node.listen_endpoint,
        )


def test_bad_rows_and_settings_fail_the_job_with_what_and_where(spark, node):
    node.declare_queue("orders")
    nulls = spark.range(10, numPartitions=1).selectExpr(
        "case when id = 5 then null else cast(id as string) end as body"
    )
    with pytest.raises(Exception, match=r"partition 0 \(attempt \d\), row 5: body is null"):
        write(nulls, node.listen_endpoint, queue="orders")
    with pytest.raises(Exception, match="column 'body' is bigint"):
        write(spark.range(3).withColumnRenamed("id", "body"), node.listen_endpoint, queue="orders")
    with pytest.raises(Exception, match="column 'extra' is not one Warren publishes"):
        write(rows(spark, 3).selectExpr("body", "1 as extra"), node.listen_endpoint, queue="orders")
    with pytest.raises(
        Exception, match="exactly one of the options queue, stream, superStream and exchange"
    ):
        write(rows(spark, 3), node.listen_endpoint)
    with pytest.raises(Exception, match="no queue 'missing'"):
        write(rows(spark, 3), node.listen_endpoint, queue="missing")
    with pytest.raises(Exception, match="cannot be overwritten"):
        rows(spark, 3).write.format("warren").mode("overwrite").option(
            "endpoint", node.listen_endpoint
        ).option("queue", "orders").save()


def test_columns_warren_does_not_publish_are_left_out_with_ignore_unknown_columns(spark, node):
    node.declare_queue("orders")
    frame = rows(spark, 300).selectExpr("body", "cast(body as int) * 2 as doubled", "'x' as note")
    with pytest.raises(Exception, match="column 'doubled' is not one Warren publishes"):
        write(frame, node.listen_endpoint, queue="orders")
    write(frame, node.listen_endpoint, queue="orders", ignoreUnknownColumns="true")
    assert drain(node, "orders") == Counter({b"%d" % i: 1 for i in range(300)})
    with pytest.raises(Exception, match="column 'message_id' is bigint"):  # still checked
        write(
            frame.selectExpr("body", "1L as message_id", "note"),
            node.listen_endpoint,
            queue="orders",
            ignoreUnknownColumns="true",
        )
    with pytest.raises(Exception, match="option ignoreUnknownColumns is true or false"):
        write(frame, node.listen_endpoint, queue="orders", ignoreunknowncolumns="yes")


def test_a_streamed_micro_batch_leaves_out_unknown_columns_with_the_option_too():
    """A streaming write's rows come as columns of Python values, not Arrow batches."""
    from warren.queues.client.spark import _encoded_runs
    from warren.queues.client.spark_options import Target

    options = {"endpoint": "tcp://127.0.0.1:1", "queue": "orders"}
    chunk = {"body": [b"a", b"b"], "message_id": ["1", None], "note": ["x", "y"]}
    ignoring = Target.from_options({**options, "ignoreUnknownColumns": "true"})
    runs = _encoded_runs(chunk, ignoring, "micro-batch 0", 0)
    kept = {"body": [b"a", b"b"], "message_id": ["1", None]}
    assert runs == _encoded_runs(kept, Target.from_options(options), "micro-batch 0", 0)
    assert [decode(payload).message_id for payload in runs[0][1]] == ["1", None]


def test_rows_naming_their_destinations_are_grouped_alike_whole_or_row_by_row():
    """An Arrow batch of bodies and a queue column is grouped by destination with Arrow
    and encoded whole; the same rows as Python values, row by row: the same runs, the
    same bytes, each destination's rows in their order."""
    import pyarrow as pa

    from warren.queues.client.spark import _encoded_runs
    from warren.queues.client.spark_options import Target

    target = Target.from_options({"endpoint": "tcp://127.0.0.1:1"}, columns=("body", "queue"))
    bodies = [b"%d" % i for i in range(10)]
    queues = ["b", "a", "b", "c", "a", "b", "b", "c", "a", "b"]
    batch = pa.RecordBatch.from_arrays(
        [pa.array(bodies), pa.array(queues)], names=["body", "queue"]
    )
    whole = _encoded_runs(batch, target, "partition 0", 0)
    assert whole == _encoded_runs({"body": bodies, "queue": queues}, target, "partition 0", 0)
    assert [(name, [decode(p).body for p in payloads]) for name, payloads in whole] == [
        ("b", [b"0", b"2", b"5", b"6", b"9"]),
        ("a", [b"1", b"4", b"8"]),
        ("c", [b"3", b"7"]),
    ]


def test_a_node_killed_mid_job_loses_nothing_confirmed_and_the_job_completes(spark, tmp_path):
    data = tmp_path / "data"
    endpoint = with_free_port("tcp://127.0.0.1:*")
    command = [
        sys.executable,
        "-m",
        "tests.supervisor.node_child",
        str(data),
        "--queue",
        "orders",
        "--listen",
        endpoint,
    ]
    nodes = []

    def start_node():
        process = subprocess.Popen(
            command, cwd=ROOT, stdout=subprocess.PIPE, text=True, start_new_session=True
        )
        nodes.append(process)
        return [psutil.Process(int(p)) for p in process.stdout.readline().split()]

    family = start_node()
    job_ended = threading.Event()

    def kill_the_node_mid_job_and_start_it_again():
        # Spark's Python data sources are found through the session of the thread that
        # writes, so the job runs on the test's thread and the kill on this one.
        with connect(endpoint) as client:
            wait_for(lambda: client.queue_stats("orders")["len"] > 30_000, timeout=120)
        assert not job_ended.is_set(), "the job ended before the kill"
        assert not kill_processes(family)  # every process of the node at once
        start_node()

    killer = ThreadPoolExecutor(max_workers=1)
    try:
        killed = killer.submit(kill_the_node_mid_job_and_start_it_again)
        try:
            write(rows(spark, 300_000), endpoint, queue="orders", timeout_s=60)
            job_ended.set()
        finally:
            killed.result(timeout=120)  # a kill or restart that failed says why the job did
        with connect(endpoint) as check:
            assert check.queue_stats("orders")["len"] == 300_000
    finally:
        killer.shutdown()
        for process in nodes:
            process.kill()
            process.wait()
            process.stdout.close()


def test_partition_publisher_serves_spark_3_style_foreach_partition(spark, node):
    node.declare_queue("orders")
    rows(spark, 1_000).foreachPartition(
        partition_publisher(node.listen_endpoint, queue="orders", producer="legacy")
    )
    rows(spark, 1_000).foreachPartition(
        partition_publisher(node.listen_endpoint, queue="orders", producer="legacy")
    )
    assert drain(node, "orders") == Counter({b"%d" % i: 1 for i in range(1_000)})
    assert os.environ["SPARK_LOCAL_IP"] == "127.0.0.1"


def test_a_streaming_write_publishes_each_micro_batch_once(spark, node, tmp_path):
    node.declare_queue("stream")
    source = tmp_path / "incoming"
    source.mkdir()
    for batch in range(3):
        (source / f"part-{batch}.json").write_text(
            "".join(f'{{"body": "event {batch}-{i}"}}\n' for i in range(100))
        )
    query = (
        spark.readStream.schema("body string")
        .option("maxFilesPerTrigger", 1)
        .json(str(source))
        .writeStream.format("warren")
        .option("endpoint", node.listen_endpoint)
        .option("queue", "stream")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(timeout=120)
    assert query.exception() is None
    expected = Counter({f"event {b}-{i}".encode(): 1 for b in range(3) for i in range(100)})
    assert drain(node, "stream") == expected


def test_chunks_in_flight_through_a_queue_killed_mid_write_arrive_once_each(node):
    """A task's chunks are sent ahead of the oldest confirm (max_in_flight): with the
    queue's process stopped, the task still takes and sends eight chunks; the process is
    then killed with all eight unconfirmed, they are sent again, and every row arrives
    exactly once (no Spark needed: the task's publishing loop itself)."""
    from warren.queues.client.spark import BATCH_ROWS, publish_columns
    from warren.queues.client.spark_options import Target

    node.declare_queue("orders")
    target = Target.from_options(
        {"endpoint": node.listen_endpoint, "queue": "orders", "max_in_flight": "8"}
    )
    stopped = node.queue("orders").pid
    taken_at_the_kill: list[int] = []
    taken = 0

    def kill_when_eight_are_out() -> None:
        wait_for(lambda: taken >= 8, timeout=60)
        taken_at_the_kill.append(taken)
        os.kill(stopped, signal.SIGKILL)

    def chunks():
        nonlocal taken
        for n in range(20):
            taken += 1
            yield {"body": [b"%d-%d" % (n, i) for i in range(BATCH_ROWS)]}

    os.kill(stopped, signal.SIGSTOP)  # it confirms nothing from now on
    killer = threading.Thread(target=kill_when_eight_are_out)
    killer.start()
    try:
        published, _ = publish_columns(target, "job/0", chunks(), "partition 0")
    finally:
        killer.join(timeout=60)
    assert taken_at_the_kill == [8]  # eight sent, none confirmed, the ninth not taken
    # The eight in doubt went again: by the connection's own recovery, or by the task's
    # retry when the connection gave up (retries counts those).
    assert published == 20 * BATCH_ROWS
    bodies = drain(node, "orders")
    assert len(bodies) == 20 * BATCH_ROWS and set(bodies.values()) == {1}


@pytest.mark.parametrize("value", ["0", "65", "two", "-1"])
def test_max_in_flight_is_checked_before_anything_is_sent(value):
    from warren.queues.client.spark_options import Target

    with pytest.raises(WarrenWriteError, match="option max_in_flight is the chunks a task"):
        Target.from_options({"endpoint": "tcp://127.0.0.1:1", "queue": "q", "max_in_flight": value})


def test_an_endpoint_naming_a_clusters_nodes_writes_through_the_one_that_serves(spark, node):
    # A cluster's nodes, separated by commas, as connect([...]) takes them: the first
    # here is down (a lost leader's machine), and the write goes through the one serving.
    from warren.queues.client.spark_options import Target

    from .node_process import free_port

    node.declare_queue("orders")
    nodes = f"tcp://127.0.0.1:{free_port()},{node.listen_endpoint}"
    write(rows(spark, 1000), nodes, queue="orders")
    assert drain(node, "orders") == Counter({b"%d" % i: 1 for i in range(1000)})
    with pytest.raises(WarrenWriteError, match="or a cluster's nodes, tcp://host:port,tcp://"):
        Target.from_options({"endpoint": f"{node.listen_endpoint},10.0.0.1:5673", "queue": "q"})


# -- CURVE keys for executors ---------------------------------------------------------


@pytest.fixture
def curve_node(tmp_path):
    with Node(tmp_path / "data", listen="tcp://127.0.0.1:*", curve=True) as running:
        yield running


def inline(key_file):
    return base64.b64encode(Path(key_file).read_bytes()).decode()


def test_a_key_given_inline_writes_into_a_queue_and_a_stream_and_reads_the_stream_back(
    spark, curve_node, tmp_path
):
    key = inline(create_client_key(curve_node.data_dir, "spark-inline", tmp_path))
    curve_node.declare_queue("orders")
    curve_node.declare_queue("events", type="stream")
    endpoint = curve_node.listen_endpoint
    write(rows(spark, 2_000), endpoint, queue="orders", key=key)
    assert drain(curve_node, "orders") == Counter({b"%d" % i: 1 for i in range(2_000)})
    write(rows(spark, 1_000), endpoint, stream="events", key=key)
    read = (
        spark.read.format("warren")
        .option("endpoint", endpoint)
        .option("stream", "events")
        .option("key", key)
        .load()
    )
    assert sorted(int(row.body) for row in read.select("body").collect()) == list(range(1_000))


def test_a_key_file_shipped_with_add_file_is_found_where_its_path_is_not(
    spark, curve_node, tmp_path
):
    (tmp_path / "keys").mkdir()
    # a file shipped stays shipped for the session's life: a name of this test's own
    name = f"spark-shipped-{uuid.uuid4().hex[:12]}"
    shipped = create_client_key(curve_node.data_dir, name, tmp_path / "keys")
    spark.sparkContext.addFile(shipped)
    curve_node.declare_queue("orders")
    # the path the job names exists on no machine: each task finds the file by its name
    nowhere = str(tmp_path / "not-placed" / f"{name}.key")
    write(rows(spark, 500), curve_node.listen_endpoint, queue="orders", key_file=nowhere)
    assert drain(curve_node, "orders") == Counter({b"%d" % i: 1 for i in range(500)})


def test_a_wrong_key_option_fails_the_job_saying_what_is_wrong(spark, curve_node, tmp_path):
    curve_node.declare_queue("orders")
    endpoint = curve_node.listen_endpoint
    key_file = create_client_key(curve_node.data_dir, "spark-wrong", tmp_path)
    with pytest.raises(Exception, match="option key is a client key file's content in base64"):
        write(rows(spark, 3), endpoint, queue="orders", key="not base64!")
    with pytest.raises(Exception, match="option key is not a Warren client key file"):
        write(rows(spark, 3), endpoint, queue="orders", key=base64.b64encode(b"hello").decode())
    with pytest.raises(Exception, match="give option key or option key_file, not both"):
        write(rows(spark, 3), endpoint, queue="orders", key=inline(key_file), key_file=key_file)
    missing = str(tmp_path / "missing.key")
    with pytest.raises(Exception, match="ship it with spark.sparkContext.addFile"):
        write(rows(spark, 3), endpoint, queue="orders", key_file=missing)
    assert drain(curve_node, "orders") == Counter()

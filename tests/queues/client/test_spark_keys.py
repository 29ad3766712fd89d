"""Spark executors reaching a node that wants CURVE keys without a key file placed on
their machines by hand: the key's content given inline (option ``key``, base64) or the
key file shipped with ``SparkContext.addFile`` (option ``key_file`` names it); and the
mistakes a user makes with either, each failing the job with what is wrong."""

import base64
import shutil
import uuid
from collections import Counter
from pathlib import Path

import pytest

if shutil.which("java") is None:
    pytest.skip(
        "Spark needs Java (a JRE 17 or newer on PATH); none is installed here",
        allow_module_level=True,
    )

from warren.queues.client.keys import create_client_key
from warren.supervisor import Node

from .test_spark import drain, rows, write

pytestmark = pytest.mark.timeout(600)


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

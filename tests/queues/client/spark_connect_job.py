"""A Spark Connect job for tests/queues/client/test_spark_connect.py, run as a process of
its own (one SparkContext a process: the tests' classic session holds theirs): it starts
a local Spark Connect server on loopback (a free port, a token), connects a
``pyspark.sql.connect`` client to it, and through that client writes rows into the
stream and reads them back with ``format("warren")``, printing what it read as JSON.

    python spark_connect_job.py ENDPOINT STREAM ROWS
"""

import json
import os
import socket
import sys
import uuid


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def main(endpoint: str, stream: str, rows: int) -> None:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    from warren.queues.client.spark import WarrenDataSource

    port, token = free_port(), uuid.uuid4().hex
    server = (
        SparkSession.builder.master("local[2]")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.plugins", "org.apache.spark.sql.connect.SparkConnectPlugin")
        .config("spark.connect.grpc.binding.address", "127.0.0.1")
        .config("spark.connect.grpc.binding.port", str(port))
        .config("spark.connect.authenticate.token", token)
        .getOrCreate()
    )
    server.sparkContext.setLogLevel("ERROR")
    # "localhost": the client's plain (not TLS) channel that still carries the token
    os.environ["SPARK_CONNECT_AUTHENTICATE_TOKEN"] = token
    client = ConnectSession.builder.remote(f"sc://localhost:{port}").getOrCreate()
    try:
        client.dataSource.register(WarrenDataSource)
        frame = client.range(rows, numPartitions=2).selectExpr("cast(id as string) as body")
        frame.write.format("warren").mode("append").option("endpoint", endpoint).option(
            "stream", stream
        ).save()
        read = (
            client.read.format("warren")
            .option("endpoint", endpoint)
            .option("stream", stream)
            .load()
            .select("offset", "body")
            .collect()
        )
        print(
            json.dumps(
                {
                    "client": type(client).__module__,
                    "rows": sorted([row.offset, row.body.decode()] for row in read),
                }
            ),
            flush=True,
        )
    finally:
        client.stop()
        server.stop()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))

"""Packaging for Warren: one distribution, one top-level import name (``warren``), one command.

The repository keeps a folder per part (``actors/``, ``store/``, ``supervisor/``,
``queues/``); they install beneath ``warren`` (``warren.store`` ...) so that Warren never
claims a name another package owns (``supervisor`` is supervisord's). The ``warren``
package itself is ``supervisor/facade/``.
"""

import re

from setuptools import find_packages, setup

PARTS = ("actors", "store", "supervisor", "queues")


def warren_packages() -> tuple[list[str], dict[str, str]]:
    """Every package of every part, named beneath ``warren``, and where each one lives."""
    packages = ["warren"]
    package_dir = {"warren": "supervisor/facade"}
    for part in PARTS:
        for found in find_packages(where=part, exclude=["facade"]):
            packages.append(f"warren.{part}.{found}")
            package_dir[f"warren.{part}.{found}"] = f"{part}/{found.replace('.', '/')}"
        packages.append(f"warren.{part}")
        package_dir[f"warren.{part}"] = part
    return packages, package_dir


def warren_version() -> str:
    """``warren.__version__``, read from its file as text: nothing of Warren is importable
    while it is being installed."""
    with open("supervisor/version.py", encoding="utf-8") as file:
        found = re.search(r'^__version__ = "([^"]+)"', file.read(), re.MULTILINE)
    assert found, "supervisor/version.py states no __version__"
    return found.group(1)


PACKAGES, PACKAGE_DIR = warren_packages()

setup(
    name="warren-mq",
    version=warren_version(),
    description="A durable message broker you can embed, with RabbitMQ's persistence design",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    packages=PACKAGES,
    package_dir=PACKAGE_DIR,
    # The node's management page (served at / by its HTTP endpoint): files, not modules.
    package_data={
        "warren.supervisor.node": ["page/*.html", "page/*.css", "page/*.js", "page/*.svg"]
    },
    python_requires=">=3.11",
    install_requires=[
        "isal>=1.6,<2",
        "msgpack>=1.0,<2",
        # AMQP 0-9-1's rarely sent methods (the hot ones are coded by hand)
        "pamqp>=4.0,<5",
        "prometheus_client>=0.17,<1",
        "psutil>=5.9,<8",
        "pykka>=4.0,<5",
        "pyzmq>=25.1,<28",
        "setproctitle>=1.3,<2",
    ],
    extras_require={
        "test": [
            # examples/celery_app.py, run by a test with a real worker; its results
            # in SQLite through Celery's database backend
            "celery>=5.3,<6",
            "hypothesis>=6.100,<7",
            "mypy>=1.10",
            # an AMQP 0-9-1 client to test the amqp port with
            "pika>=1.3,<2",
            "pytest>=7.4,<10",
            "pytest-timeout>=2.2,<3",
            "pytest-xdist>=3.5,<4",
            "ruff>=0.6",
            "sqlalchemy>=2.0,<3",
        ],
        # Spark executors as producers and readers (warren.queues.client.spark and
        # spark_read): Spark 4's Python data sources, which trade Arrow batches; numpy
        # encodes and finds a batch's bodies. With Spark Connect's client (its gRPC), so
        # that a pyspark.sql.connect session uses the data source too.
        "spark": ["pyspark[connect]>=4.0,<5", "pyarrow>=15", "pandas>=2.2,<3", "numpy>=1.26"],
        # A node in a cluster (warren.supervisor.cluster): etcd's HTTP gateway client,
        # no gRPC.
        "cluster": ["etcd3gw>=2.7,<3"],
        # The chaos report's plot.
        "plot": ["matplotlib>=3.7,<4"],
        # bench amqp's asyncio client (pika, its other client, is in the test extra).
        "bench": ["aio-pika>=9.4,<11"],
        # Profiling the bench's workloads (bench/README.md): sampling from outside a
        # process, and a call-tree view from inside.
        "profile": ["py-spy>=0.3", "pyinstrument>=4.6"],
    },
    entry_points={
        "console_scripts": ["warren=warren.supervisor.cli:main"],
        # the warren_chaos fixture, for the tests of applications built on Warren
        "pytest11": ["warren_chaos=warren.supervisor.chaos.pytest_plugin"],
    },
)

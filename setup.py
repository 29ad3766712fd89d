"""Packaging for Warren: one distribution, four packages, one command."""

from setuptools import find_packages, setup

setup(
    name="warren-mq",
    version="0.1.0",
    description="RabbitMQ's message persistence layer as Erlang-style actors in Python",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["actors", "actors.*", "store", "store.*",
                                    "queues", "queues.*", "supervisor", "supervisor.*"]),
    python_requires=">=3.11",
    install_requires=[
        "msgpack>=1.0,<2",
        "psutil>=5.9,<8",
        "pykka>=4.0,<5",
        "pyzmq>=25.1,<28",
        "setproctitle>=1.3,<2",
    ],
    extras_require={
        "test": ["pytest>=7.4,<10", "pytest-timeout>=2.2,<3"],
    },
    entry_points={"console_scripts": ["warren=supervisor.cli:main"]},
)

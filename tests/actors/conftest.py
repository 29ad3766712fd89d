"""Fixtures for the actor runtime's tests: a fresh node per test, closed even on failure."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator

import pytest

from warren.actors import Node
from warren.actors.runtime_dir import create_runtime_dir

PRELOAD = ("tests.actors.sample_actors",)


@pytest.fixture
def runtime_dir() -> Iterator[str]:
    """A private directory for ipc sockets under the system's temporary directory."""
    path = create_runtime_dir(tempfile.gettempdir())
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def node(runtime_dir: str) -> Iterator[Node]:
    with Node("test", runtime_dir=runtime_dir, preload=PRELOAD) as running:
        yield running


@pytest.fixture(params=["ipc", "tcp"])
def transport(request: pytest.FixtureRequest) -> str:
    return request.param

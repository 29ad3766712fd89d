"""Fixtures for the supervision tests: an actor node per test, closed even on failure."""

from collections.abc import Iterator

import pytest

from warren.actors import Node

PRELOAD = ("tests.supervisor.sample_actors",)


@pytest.fixture
def actor_node() -> Iterator[Node]:
    with Node("supervision-test", preload=PRELOAD) as node:
        yield node

"""The registry is per node: names resolve inside one node and never leak to another."""

from __future__ import annotations

import shutil
import tempfile

import pytest

from tests.actors.conftest import PRELOAD
from tests.actors.sample_actors import Recorder
from warren.actors import InvalidSpec, Node, Registry
from warren.actors.runtime_dir import create_runtime_dir


def test_spawn_registers_the_name_and_death_unregisters_it(node: Node) -> None:
    ref = node.spawn(Recorder, name="orders")
    assert node.whereis("orders") == ref
    ref.stop(timeout=10)
    assert node.whereis("orders") is None


def test_two_nodes_in_one_process_never_see_each_others_names(node: Node) -> None:
    other_dir = create_runtime_dir(tempfile.gettempdir())
    try:
        with Node("other", runtime_dir=other_dir, preload=PRELOAD) as other:
            mine = node.spawn(Recorder, "mine", name="shared-name")
            theirs = other.spawn(Recorder, "theirs", name="shared-name")
            assert node.whereis("shared-name") == mine
            assert other.whereis("shared-name") == theirs
            assert mine.address != theirs.address
            assert mine.ask(("whereis", "shared-name"), timeout=10) == mine
            assert theirs.ask(("whereis", "shared-name"), timeout=10) == theirs
    finally:
        shutil.rmtree(other_dir, ignore_errors=True)


def test_an_actor_can_register_itself_and_others_find_it(node: Node) -> None:
    first = node.spawn(Recorder, "first")
    second = node.spawn(Recorder)
    assert first.ask(("register", "alias"), timeout=10) == "registered"
    found = second.ask(("whereis", "alias"), timeout=10)
    assert found == first
    assert second.ask(("ask_other", found, "label"), timeout=10) == "first"


def test_a_name_held_by_another_actor_is_not_taken_silently() -> None:
    registry = Registry()
    from warren.actors.ref import ActorRef

    one = ActorRef("a", "ipc:///x/1", "ipc:///x/1c", 1, 10, "ipc:///x/n")
    two = ActorRef("b", "ipc:///x/2", "ipc:///x/2c", 1, 11, "ipc:///x/n")
    registry.register("name", one)
    with pytest.raises(InvalidSpec, match="already registered"):
        registry.register("name", two)
    registry.register("name", two, replace=True)
    assert registry.whereis("name") == two
    assert not registry.unregister("name", one)
    assert registry.unregister("name", two)
    assert registry.names() == []

"""A process actor may host pykka actors that talk to each other inside its process."""

from __future__ import annotations

from tests.actors.sample_actors import PykkaHost
from warren.actors import Node


def test_hosted_pykka_actors_receive_each_batch_as_one_message_and_talk_in_process(
    node: Node,
) -> None:
    host = node.spawn(PykkaHost)
    host.tell_many(["a", "b", "c"])
    host.tell("d")
    received = host.ask("received", timeout=10)
    batches = received["first"]
    assert [item for batch in batches for item in batch] == ["a", "b", "c", "d"]
    assert len(batches) <= 2, "one pykka message per batch, never one per tell"
    assert received["second"] == batches

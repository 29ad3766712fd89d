"""How a queue's dead letters fare when their exchange cannot take them: what can never
go is dropped and settled, what cannot go now is handed back for the next round.

The moments these tests need (a queue of the exchange between two incarnations, the node
stopping, an alarm raised) cannot be held open from outside while a dead letter is in
flight, so the connection the dead letters go through is a stand-in that fails as the
real one does at that moment; tests/queues/broker/test_broker.py has the dead letters of
a real node."""

from __future__ import annotations

import pytest

from warren.queues import Message, encode
from warren.queues.broker import dead_letters
from warren.queues.errors import (
    Blocked,
    ConnectionClosed,
    NotFound,
    QueueDown,
    QueueRestarting,
)


class StandInConnection:
    """Takes dead letters until the one numbered ``fail_at`` (from 0), which raises
    ``error``; then takes the rest again."""

    def __init__(self, error: Exception | None, fail_at: int) -> None:
        self.error, self.fail_at = error, fail_at
        self.sent: list[bytes] = []
        self.closed = False
        self.blocked = isinstance(error, Blocked)

    def publish_message(self, routing_key, message, *, exchange, mandatory):
        if self.error is not None and len(self.sent) == self.fail_at:
            error, self.error = self.error, None
            raise error
        self.sent.append(message.body)
        return Settled()

    def close(self) -> None:
        self.closed = True


class Settled:
    """A confirm that came back."""

    def done(self) -> bool:
        return True

    def result(self, timeout: float) -> None:
        return None


@pytest.fixture
def connections(monkeypatch):
    """Every stand-in connection the dead letters made, in order; each next one is made
    from the entries of ``plan`` (error, fail_at), then failing nothing."""
    made: list[StandInConnection] = []
    plan: list[tuple[Exception | None, int]] = []

    def connect(node, linger_s):
        error, fail_at = plan.pop(0) if plan else (None, -1)
        made.append(StandInConnection(error, fail_at))
        return made[-1]

    monkeypatch.setattr(dead_letters, "RemoteNode", lambda data_dir: None)
    monkeypatch.setattr(dead_letters, "Connection", connect)
    return made, plan


DEAD = [(seq, encode(Message(b"dead %d" % seq))) for seq in (10, 11, 12)]


@pytest.mark.parametrize(
    "error",
    [
        QueueRestarting("queue 'dead' is restarting"),
        Blocked("the node's memory alarm is raised"),
        ConnectionClosed("the node went away"),
    ],
    ids=["a queue of the exchange restarting", "an alarm", "the node stopping"],
)
def test_a_dead_letter_that_cannot_go_now_is_handed_back_with_those_after_it(connections, error):
    made, plan = connections
    plan.append((error, 1))
    letters = dead_letters.DeadLetters("/nowhere", "work", "dlx")
    assert letters.send(DEAD, "maxlen") == [11, 12]  # put back, for the next round
    assert made[0].sent == [b"dead 10"]
    assert letters.settled() == [10]
    assert letters.counters["dead_letters_nacked"] == 0
    assert letters.send(DEAD[1:], "maxlen") == []  # the next round takes them
    assert letters.settled() == [11, 12]
    # a connection that went away is closed and made again; any other is kept
    assert [c.closed for c in made] == ([True, False] if len(made) == 2 else [False])
    assert len(made) == (2 if isinstance(error, ConnectionClosed) else 1)


@pytest.mark.parametrize(
    "error",
    [NotFound("no exchange 'dlx' on this node"), QueueDown("queue 'dead' stays down")],
    ids=["no such exchange", "a bound queue that stays down"],
)
def test_a_dead_letter_that_can_never_go_is_dropped_and_settled(connections, error):
    made, plan = connections
    plan.append((error, 1))
    letters = dead_letters.DeadLetters("/nowhere", "work", "dlx")
    assert letters.send(DEAD, "expired") == []
    assert made[0].sent == [b"dead 10", b"dead 12"]
    assert letters.pending == 3
    assert sorted(letters.settled()) == [10, 11, 12]  # the dropped one acked too
    counters = letters.counters
    assert (counters["dead_letters_nacked"], counters["dead_lettered_expired"]) == (1, 2)


def test_no_dead_letter_is_sent_while_the_node_blocks_publishers(connections):
    made, plan = connections
    plan.append((Blocked("the node's disk alarm is raised"), 0))
    letters = dead_letters.DeadLetters("/nowhere", "work", "dlx")
    assert letters.room() == 0  # the queue keeps its expired messages for now
    made[0].blocked = False
    assert letters.room() > 0

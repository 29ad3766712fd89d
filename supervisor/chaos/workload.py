"""Warren's own workload: producers and consumers that keep ledgers of what was
confirmed and what was consumed, so that a crash-recovery run can say what was lost.

A producer publishes messages ``NAME-0``, ``NAME-1`` ... whose bodies check themselves
(an order event, then a digest of the message id padding it to a size), one at a time;
each confirmed id goes to its ledger. A publish refused before anything was sent (the
node's alarm held it past the timeout, no queue is bound) is sent again; any other that
failed (no answer, a queue restarted before confirming, or between incarnations) is sent
again and its id noted in the ledger's ``.resent`` file, since its first attempt may have
reached a queue too. A consumer acks everything it gets and writes ``queue id
redelivered count`` lines (the delivery count the queue gave).
``audit`` compares the ledgers: a confirmed message never consumed from a queue it went
to is lost; a message consumed twice from a queue must be flagged redelivered the second
time, unless its producer sent it twice; a message consumed from a queue it was not
routed to is misrouted; a body unlike its id's is wrong; in a queue whose delivery counts
survive restarts (a quorum queue), a message delivered again with a lower count than
before went backwards.

Each role runs as a process of its own (``warren.supervisor.chaos.roles``).

Races: a consumer's line is written before its ack, so a message can be recorded twice
but never acked unrecorded; a producer's line is written after the confirm, so a message
in its ledger is one the node promised to keep.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from warren.actors import ActorError
from warren.queues.client.connection import Connection
from warren.queues.errors import Blocked, InvalidMessage, MessageTooLarge, QueueError, Unroutable

__all__ = [
    "Audit",
    "Producer",
    "audit",
    "body_of",
    "checked_id",
    "connect_node",
    "consume",
    "ledger_lines",
    "produce",
    "size_of",
]

SIZES = (40, 900, 6000)  # bytes of padding: small, and past 4 KiB
RETRY_S = 0.05
# Publishes refused before anything was sent (a fanout publish that fails on its second
# queue may be in the first): sending them again makes no duplicate.
REFUSED = (Blocked, Unroutable)


def connect_node(node: str, wait: float = 0.0) -> Connection:
    """A connection to ``node``: a node's data directory, a listener's ``tcp://`` address
    (its first answer waited for up to a minute: a node a fault has just restarted may
    still be starting), or a cluster's ``tcp://`` addresses separated by commas (each
    given the client's usual two seconds, so a paused node holds nobody up). ``wait``:
    see ``warren.queues.client.connect``."""
    from warren.queues.client import connect

    if "," in node:
        return connect(node.split(","), wait=wait)
    if node.startswith("tcp://"):
        return connect(node, connect_timeout_s=60, wait=wait)
    return connect(node, wait=wait)


def body_of(message_id: str, size: int | None = None) -> bytes:
    """The body of message ``message_id``: a small order event, padded with its digest to
    ``size`` bytes (at least the event's), or by one of ``SIZES``."""
    n = int(message_id.rsplit("-", 1)[1])
    fields = {"order": message_id, "customer": f"c{n % 97}", "amount_cents": 100 + n * 37 % 90_000}
    if size is not None:
        fields["size"] = size
    event = json.dumps(fields).encode()
    digest = hashlib.sha256(message_id.encode()).hexdigest().encode()
    padding = SIZES[n % len(SIZES)] if size is None else max(0, size - len(event) - 1)
    return event + b"\n" + (digest * (padding // len(digest) + 1))[:padding]


def checked_id(body: bytes) -> str:
    """The id of the message ``body`` is; AssertionError if the body is damaged."""
    try:
        event = json.loads(body.split(b"\n", 1)[0])
        message_id = event["order"]
        expected = body_of(message_id, event.get("size"))
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        raise AssertionError(f"a damaged body: {body[:60]!r}") from None
    if body != expected:
        raise AssertionError(f"the body of {message_id} is damaged")
    return message_id


def size_of(message_id: str, sizes: tuple[int, int]) -> int:
    """The body size of ``message_id``, drawn from its id within ``sizes`` (from, to)."""
    low, high = sizes
    digest = hashlib.blake2b(message_id.encode(), digest_size=8).digest()
    return low + int.from_bytes(digest, "big") % (high - low + 1)


def produce(
    connection: Connection,
    routing_key: str,
    name: str,
    count: int | None,
    ledger: str,
    exchange: str = "",
    *,
    sizes: tuple[int, int] | None = None,
    size_key: str | None = None,
    deduplicate: bool = False,
) -> None:
    """Publish ``count`` messages (None: until stopped) ``NAME-0``, ``NAME-1`` ..., of
    ``sizes`` (from, to) bytes or the ``SIZES``; a size is drawn from ``SIZE_KEY-n``
    (``size_key``, by default the name), so a run given the same key publishes the same
    bytes. With ``deduplicate``, under producer id ``name`` and sequence ``n``, so a
    re-send is a repeat the queue drops. A publish refused (the node's alarm held it,
    the queue was between incarnations) is sent again; one in doubt (no answer, or the
    queue restarted before confirming it) is sent again and noted in ``.resent``, and so
    is one the connection sent again itself, recovering from the node going away, and
    the one whose publish a stop interrupted (it may have been sent twice)."""
    size_key = name if size_key is None else size_key
    with (
        open(ledger, "a", buffering=1) as confirmed,
        open(ledger + ".resent", "a", buffering=1) as resent,
    ):
        for n in itertools.count() if count is None else range(count):
            message_id = f"{name}-{n}"
            body = body_of(message_id, None if sizes is None else size_of(f"{size_key}-{n}", sizes))
            while True:
                recoveries = connection.recoveries
                try:
                    connection.publish(
                        routing_key,
                        body,
                        exchange=exchange,
                        timeout=30,
                        producer_id=name if deduplicate else None,
                        sequence=n if deduplicate else None,
                    )
                    if connection.recoveries != recoveries:
                        resent.write(message_id + "\n")
                    break
                except (InvalidMessage, MessageTooLarge):
                    raise  # the workload's own mistake: no retry cures it
                except REFUSED:
                    time.sleep(RETRY_S)
                except (QueueError, ActorError, TimeoutError):
                    resent.write(message_id + "\n")
                    time.sleep(RETRY_S)
                except BaseException:
                    # Stopped in the middle of it (the run's end): its connection may
                    # have sent it again while recovering, before it could say so.
                    resent.write(message_id + "\n")
                    raise
            confirmed.write(message_id + "\n")


def consume(
    connection: Connection,
    queues: str | list[str],
    ledger: str,
    stop_after_idle_s: float | None = None,
) -> None:
    """Ack every message of ``queues`` (one name, or several taken in turn); until
    stopped, or idle for ``stop_after_idle_s``. Each delivery is a ledger line, ``queue id
    redelivered count`` (or ``queue ? wrong`` for a damaged body), written before the
    ack."""
    queues = [queues] if isinstance(queues, str) else queues
    idle_since = time.monotonic()
    empty = 0  # queues found empty in a row: a round of them, a nap
    with open(ledger, "a", buffering=1) as consumed:
        for queue in itertools.cycle(queues):
            if stop_after_idle_s is not None and (
                time.monotonic() - idle_since >= stop_after_idle_s
            ):
                return
            try:
                delivery = connection.get(queue)
            except (QueueError, ActorError, TimeoutError):
                time.sleep(RETRY_S)
                continue
            if delivery is None:
                empty += 1
                if empty >= len(queues):
                    empty = 0
                    time.sleep(0.005)
                continue
            empty, idle_since = 0, time.monotonic()
            try:
                line = (
                    f"{checked_id(delivery.body)} {int(delivery.redelivered)} "
                    f"{delivery.delivery_count}"
                )
            except AssertionError:
                line = "? wrong"
            consumed.write(f"{queue} {line}\n")
            try:
                delivery.ack()
            except (QueueError, ActorError, TimeoutError):
                pass  # the queue restarted: it delivers the message again


@dataclass(frozen=True)
class Producer:
    """A producer as the audit knows it: its name, its ledger, the queues it reaches."""

    name: str
    ledger: str
    queues: tuple[str, ...]


@dataclass
class Audit:
    """The ledgers compared: counts of (queue, message) pairs, and the failing ones."""

    confirmed: int = 0  # pairs confirmed
    consumed: int = 0  # deliveries recorded
    redelivered: int = 0
    duplicates: int = 0  # deliveries of a pair seen before
    wrong_bodies: int = 0
    lost: list[str] = field(default_factory=list)
    destroyed: list[str] = field(default_factory=list)
    unflagged: list[str] = field(default_factory=list)
    misrouted: list[str] = field(default_factory=list)
    backwards: list[str] = field(default_factory=list)  # delivery counts that went down

    @property
    def ok(self) -> bool:
        return not (
            self.lost or self.unflagged or self.misrouted or self.wrong_bodies or self.backwards
        )

    def counts(self) -> dict:
        """A report's figures, and the ids behind the failing ones."""
        return {
            "confirmed": self.confirmed,
            "consumed": self.consumed,
            "lost": len(self.lost),
            "duplicates": self.duplicates,
            "unflagged_duplicates": len(self.unflagged),
            "misrouted": len(self.misrouted),
            "wrong_bodies": self.wrong_bodies,
            "destroyed": len(self.destroyed),
            "counts_backwards": len(self.backwards),
            "lost_ids": self.lost,
            "unflagged_ids": self.unflagged,
            "misrouted_ids": self.misrouted,
            "destroyed_ids": self.destroyed,
            "backwards_ids": self.backwards,
        }


def ledger_lines(path: str) -> list[str]:
    """The whole lines of a ledger (none if it does not exist yet)."""
    try:
        with open(path) as file:
            return file.read().split("\n")[:-1]
    except FileNotFoundError:
        return []


def audit(
    producers: list[Producer],
    consumer_ledgers: list[str],
    destroyed: Callable[[str, str], bool] | None = None,
    counted: tuple[str, ...] = (),
) -> Audit:
    """What the ledgers say. A confirmed message that was not consumed from a queue it
    reached is lost, unless ``destroyed(queue, id)`` says damage on disk took it; a
    message consumed twice from a queue must be flagged redelivered the second time,
    unless its producer sent it twice (in doubt); a message of these producers consumed
    from a queue it does not reach is misrouted; in the ``counted`` queues, a delivery
    whose count is below an earlier one's of the same message went backwards. Messages of
    other producers (an earlier run's, still in the queues) count as consumed and nothing
    else."""
    routes = {producer.name: producer.queues for producer in producers}
    expected = {
        (queue, message_id)
        for producer in producers
        for message_id in ledger_lines(producer.ledger)
        for queue in producer.queues
    }
    resent = {m for producer in producers for m in ledger_lines(producer.ledger + ".resent")}
    result = Audit(confirmed=len(expected))
    seen: set[tuple[str, str]] = set()
    # the highest delivery count a consumer saw of a pair (a ledger is in time order;
    # two ledgers are not, so each is held to its own)
    counts: dict[tuple[str, str, str], int] = {}
    for path in consumer_ledgers:
        for line in ledger_lines(path):
            queue, message_id, redelivered, *count = line.split()
            result.consumed += 1
            if message_id == "?":
                result.wrong_bodies += 1
                continue
            result.redelivered += redelivered == "1"
            pair = (queue, message_id)
            if pair in seen:
                result.duplicates += 1
                if redelivered != "1" and message_id not in resent:
                    result.unflagged.append(f"{queue} {message_id}")
            seen.add(pair)
            if queue in counted and count:
                highest = counts.get((path, *pair), 0)
                if int(count[0]) < highest:
                    result.backwards.append(f"{queue} {message_id}")
                counts[(path, *pair)] = max(int(count[0]), highest)
            reaches = routes.get(message_id.rsplit("-", 1)[0])
            if reaches is not None and queue not in reaches:
                result.misrouted.append(f"{queue} {message_id}")
    for queue, message_id in sorted(expected - seen):
        name = f"{queue} {message_id}"
        (
            result.destroyed
            if destroyed is not None and destroyed(queue, message_id)
            else result.lost
        ).append(name)
    return result

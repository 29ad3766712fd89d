"""Warren's own workload: producers and consumers that keep ledgers of what was
confirmed and what was consumed, so that a crash-recovery run can say what was lost.

A producer publishes messages ``NAME-0``, ``NAME-1`` ... whose bodies check themselves
(an order event, then a digest of the message id padding it to a size on either side of
the 4 KiB threshold), one at a time; each confirmed id goes to its ledger, and a publish
that fails while the node restarts a queue or a store is sent again, its id noted in the
ledger's ``.resent`` file (its first attempt may have reached the queue too). A consumer
acks everything it gets and writes ``id redelivered`` lines. ``audit`` compares the
ledgers: a confirmed message never consumed is lost; a message consumed twice must be
flagged redelivered the second time, unless its producer sent it twice.

Run one as a process of its own: ``python -m warren.queues.workload produce DATA_DIR
ROUTING_KEY NAME COUNT LEDGER [EXCHANGE]`` or ``... consume DATA_DIR QUEUE LEDGER``; each
prints ``ready`` once connected.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from dataclasses import dataclass, field

from warren.actors import ActorError

from .connection import Connection
from .errors import QueueError
from .remote_node import RemoteNode

__all__ = ["Audit", "audit", "body_of", "checked_id", "consume", "produce"]

SIZES = (40, 900, 6000)               # bytes of padding: small, and past 4 KiB
RETRY_S = 0.05


def body_of(message_id: str, size: int | None = None) -> bytes:
    """The body of message ``message_id``: a small order event, padded with its digest to
    ``size`` bytes (at least the event's), or by one of ``SIZES``."""
    n = int(message_id.rsplit("-", 1)[1])
    fields = {"order": message_id, "customer": f"c{n % 97}",
              "amount_cents": 100 + n * 37 % 90_000}
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


def produce(connection: Connection, routing_key: str, name: str, count: int, ledger: str,
            exchange: str = "") -> None:
    with open(ledger, "a", buffering=1) as confirmed, \
            open(ledger + ".resent", "a", buffering=1) as resent:
        for n in range(count):
            message_id = f"{name}-{n}"
            while True:
                try:
                    connection.publish(routing_key, body_of(message_id), exchange=exchange,
                                       timeout=30)
                    break
                except (QueueError, ActorError, TimeoutError):
                    resent.write(message_id + "\n")
                    time.sleep(RETRY_S)
            confirmed.write(message_id + "\n")


def consume(connection: Connection, queue: str, ledger: str,
            stop_after_idle_s: float | None = None) -> None:
    """Ack every message of ``queue``; until killed, or idle for ``stop_after_idle_s``."""
    idle_since = time.monotonic()
    with open(ledger, "a", buffering=1) as consumed:
        while stop_after_idle_s is None or time.monotonic() - idle_since < stop_after_idle_s:
            try:
                delivery = connection.get(queue)
            except (QueueError, ActorError, TimeoutError):
                time.sleep(RETRY_S)
                continue
            if delivery is None:
                time.sleep(0.01)
                continue
            idle_since = time.monotonic()
            consumed.write(f"{checked_id(delivery.body)} {int(delivery.redelivered)}\n")
            try:
                delivery.ack()
            except (QueueError, ActorError):
                pass                  # the queue restarted: it delivers the message again


@dataclass
class Audit:
    confirmed: int = 0
    consumed: int = 0
    redelivered: int = 0
    duplicates: int = 0
    lost: list[str] = field(default_factory=list)
    unflagged_duplicates: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.lost and not self.unflagged_duplicates


def _lines(path: str) -> list[str]:
    try:
        with open(path) as file:
            return file.read().split("\n")[:-1]
    except FileNotFoundError:
        return []


def audit(producer_ledgers: list[str], consumer_ledger: str) -> Audit:
    confirmed = {m for path in producer_ledgers for m in _lines(path)}
    resent = {m for path in producer_ledgers for m in _lines(path + ".resent")}
    result = Audit(confirmed=len(confirmed))
    seen: set[str] = set()
    for line in _lines(consumer_ledger):
        message_id, redelivered = line.split()
        result.consumed += 1
        result.redelivered += redelivered == "1"
        if message_id in seen:
            result.duplicates += 1
            if redelivered != "1" and message_id not in resent:
                result.unflagged_duplicates.append(message_id)
        seen.add(message_id)
    result.lost = sorted(confirmed - seen)
    return result


def main(argv: list[str]) -> None:
    role, data_dir = argv[0], argv[1]
    connection = Connection(RemoteNode(data_dir))
    print("ready", flush=True)
    if role == "produce":
        produce(connection, argv[2], argv[3], int(argv[4]), argv[5],
                argv[6] if len(argv) > 6 else "")
    elif role == "consume":
        consume(connection, argv[2], argv[3])
    else:
        raise SystemExit(f"unknown role {role!r}: produce or consume")


if __name__ == "__main__":
    main(sys.argv[1:])

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
import itertools
import json
import sys
import time
from dataclasses import dataclass, field

from warren.actors import ActorError

from .connection import Connection
from .errors import QueueError
from .remote_node import RemoteNode

__all__ = ["Audit", "audit", "body_of", "checked_id", "consume", "ledger_lines", "produce",
           "size_of"]

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


def size_of(message_id: str, sizes: tuple[int, int]) -> int:
    """The body size of ``message_id``, drawn from its id within ``sizes`` (from, to)."""
    low, high = sizes
    digest = hashlib.blake2b(message_id.encode(), digest_size=8).digest()
    return low + int.from_bytes(digest, "big") % (high - low + 1)


def produce(connection: Connection, routing_key: str, name: str, count: int | None,
            ledger: str, exchange: str = "", *, sizes: tuple[int, int] | None = None,
            deduplicate: bool = False) -> None:
    """Publish ``count`` messages (None: until killed) ``NAME-0``, ``NAME-1`` ..., of
    ``sizes`` (from, to) bytes or the ``SIZES``; with ``deduplicate``, under producer id
    ``name`` and sequence ``n``, so a re-send is a repeat the queue drops."""
    with open(ledger, "a", buffering=1) as confirmed, \
            open(ledger + ".resent", "a", buffering=1) as resent:
        for n in itertools.count() if count is None else range(count):
            message_id = f"{name}-{n}"
            body = body_of(message_id, None if sizes is None else size_of(message_id, sizes))
            dedup = {"producer_id": name, "sequence": n} if deduplicate else {}
            while True:
                try:
                    connection.publish(routing_key, body, exchange=exchange, timeout=30,
                                       **dedup)
                    break
                except (QueueError, ActorError, TimeoutError):
                    resent.write(message_id + "\n")
                    time.sleep(RETRY_S)
            confirmed.write(message_id + "\n")


def consume(connection: Connection, queues: str | list[str], ledger: str,
            stop_after_idle_s: float | None = None) -> None:
    """Ack every message of ``queues`` (one name, or several taken in turn); until
    killed, or idle for ``stop_after_idle_s``. Each delivery is a ledger line, ``id
    redelivered`` or ``? wrong`` for a damaged body, after the queue's name when
    ``queues`` is a list, written before the ack."""
    names = [queues] if isinstance(queues, str) else list(queues)
    idle_since = time.monotonic()
    empty = 0                         # queues found empty in a row: a round of them, a nap
    with open(ledger, "a", buffering=1) as consumed:
        for queue in itertools.cycle(names):
            if stop_after_idle_s is not None and (
                    time.monotonic() - idle_since >= stop_after_idle_s):
                return
            try:
                delivery = connection.get(queue)
            except (QueueError, ActorError, TimeoutError):
                time.sleep(RETRY_S)
                continue
            if delivery is None:
                empty += 1
                if empty >= len(names):
                    empty = 0
                    time.sleep(0.005)
                continue
            empty, idle_since = 0, time.monotonic()
            try:
                line = f"{checked_id(delivery.body)} {int(delivery.redelivered)}"
            except AssertionError:
                line = "? wrong"
            consumed.write(line + "\n" if isinstance(queues, str) else f"{queue} {line}\n")
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


def ledger_lines(path: str) -> list[str]:
    """The whole lines of a ledger (none if it does not exist yet)."""
    try:
        with open(path) as file:
            return file.read().split("\n")[:-1]
    except FileNotFoundError:
        return []


def audit(producer_ledgers: list[str], consumer_ledger: str) -> Audit:
    confirmed = {m for path in producer_ledgers for m in ledger_lines(path)}
    resent = {m for path in producer_ledgers for m in ledger_lines(path + ".resent")}
    result = Audit(confirmed=len(confirmed))
    seen: set[str] = set()
    for line in ledger_lines(consumer_ledger):
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

"""Which client holds each reference the store counts: what a client restarted after a
crash needs to claim the references it held, and no other client's.

The store counts references per message id, as RabbitMQ's msg_store does: a message
routed to several queues has one id and one reference per queue. A queue process killed
after its index named such a message but before its own write reached the store leaves
an entry that no reference of its own backs, while the other queue's reference keeps the
body there. Asked only "is it there", its recovery would keep the entry: a producer's
re-send of that message would then be dropped as a repeat of one the queue has (a
confirmed message lost), and the queue's ack of it would take the other queue's
reference, and the body with it.

So each write and remove names its holder (a client ref), and ``Holders`` keeps, per id,
the holder of each reference added since the store started. References the store
recovered at its start (from the queues' indexes or its clean-shutdown files) have no
known holder: for an id, *recovered* = its reference count less the references of known
holders. A client restarted after a crash names its predecessors' refs, and ``claim``
gives it a reference for an entry of its index that a predecessor's reference backs,
or, only for an entry its index had when the store started, a recovered one.

Rules, which keep every id's known references within its reference count:

- a write adds a reference of its holder; a write that adopts a record recovered without
  a source adds no reference, and takes a recovered one if any is left;
- a remove takes a reference of its holder, else a recovered one; a remove by a named
  holder that holds none while none is recovered is refused (``take`` answers False,
  the store changes nothing and counts it): it would take another client's (a body kept
  for good is the price, never a body lost); a remove naming no holder takes any;
- an id without references leaves the table (its last remove, its write failed on a
  full disk).

Layout: a plain dict, key (the id as an int) -> the holder's number while the id has one
known reference, else the numbers of its holders packed in bytes (four bytes a
reference). Holders are numbered once (``number``), so a value is an int shared by all
the ids of its holder: the commonest steps cost a dict store or pop, and no value is a
container, so the cyclic garbage collector never walks the table (as it never walks the
index).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

__all__ = ["Holders"]


def _pack(numbers: list[int]) -> int | bytes:
    return numbers[0] if len(numbers) == 1 else array("I", numbers).tobytes()


def _unpack(held: int | bytes) -> list[int]:
    return [held] if isinstance(held, int) else array("I", held).tolist()


class Holders:
    """The holders of the references added since the store started, per index key.

    ``table`` is the plain dict itself, for the store's commonest steps: the first write
    of an id sets its holder (``table[key] = number``), the remove of its last reference
    drops it (``table.pop(key, None)``)."""

    def __init__(self) -> None:
        self.table: dict[int, int | bytes] = {}
        self._numbers: dict[bytes, int] = {}

    def number(self, holder: bytes) -> int:
        """The holder's number (the same int object every time)."""
        number = self._numbers.get(holder)
        if number is None:
            number = self._numbers[holder] = len(self._numbers)
        return number

    def added(self, key: int, number: int) -> None:
        """A write of holder ``number`` added a reference to ``key``."""
        held = self.table.get(key)
        self.table[key] = number if held is None else _pack([*_unpack(held), number])

    def adopted(self, key: int, number: int, ref_count: int) -> None:
        """A write of holder ``number`` adopted a recovered record of ``key`` (no new
        reference): it takes a recovered one, if any is left."""
        held = self.table.get(key)
        if held is None or ref_count > len(_unpack(held)):
            self.added(key, number)

    def take(self, key: int, number: int | None, ref_count: int) -> bool:
        """A remove of holder ``number`` (None: any) of one of the ``ref_count``
        references of ``key``: whether it may go (see the module docstring)."""
        held = self.table.get(key)
        if held is None:
            return True  # every reference is a recovered one
        if isinstance(held, int) and held == number:  # the commonest: its one reference
            del self.table[key]
            return True
        numbers = _unpack(held)
        if number is not None and number in numbers:
            numbers.remove(number)
        elif ref_count > len(numbers):
            return True  # a recovered one
        elif number is not None:
            return False
        else:
            numbers.pop()
        self._set(key, numbers)
        return True

    def claim(
        self,
        key: int,
        number: int,
        predecessors: Sequence[int],
        ref_count: int,
        nth: int,
        recovered: bool,
    ) -> bool:
        """Whether holder ``number`` holds ``nth`` references of ``key`` (which has
        ``ref_count``), taking one of a predecessor's, else (``recovered``: the entry is
        older than the store's start) a recovered one, if it holds fewer."""
        held = self.table.get(key)
        numbers = [] if held is None else _unpack(held)
        if numbers.count(number) >= nth:
            return True
        for predecessor in predecessors:
            if predecessor != number and predecessor in numbers:
                numbers[numbers.index(predecessor)] = number
                self._set(key, numbers)
                return True
        if recovered and ref_count > len(numbers):
            self._set(key, [*numbers, number])
            return True
        return False

    def _set(self, key: int, numbers: list[int]) -> None:
        if numbers:
            self.table[key] = _pack(numbers)
        else:
            del self.table[key]

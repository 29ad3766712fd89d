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

So each write and remove names its holder (a client ref), and ``Holders`` counts, per
id, the references each holder added since the store opened. References the store
recovered at its start (from the queues' indexes or its clean-shutdown files) have no
known holder: for an id, *unknown* = its reference count less the references its holders
have. A client restarted after a crash names its predecessors' refs, and ``claim`` gives
it one reference for each entry of its index that a predecessor's reference, or an
unknown one, backs.

Rules, which keep every id's holders within its reference count:

- a write adds one reference to its holder; a write that adopts a record recovered
  without a source adds no reference, and takes an unknown one if any is left;
- a remove takes one reference of its holder, else an unknown one, else (a remove by a
  client that holds none: a predecessor's late batch) one of any holder, so that the
  counts still add up;
- an id without references (its last remove, its write failed on a full disk) leaves
  the table.

Races it leaves as they are, each costing a body kept, never one lost: a dead client's
write that reaches the store after its successor claimed is held by the dead client
alone, until the store restarts and counts from the indexes again.

Memory: one dict entry per id written since the store opened, its value the holder's ref
(one object shared by all that holder's ids) while the id has one holder with one
reference, a small dict of counts beyond.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["Holders"]

# An id's holders: the one holder of its one reference, or each holder's count.
_Held = bytes | dict[bytes, int]


class Holders(dict[int, _Held]):
    """The references of each holder, per index key (the id as an int). A dict, so that
    the store's commonest steps cost no call: the first write of an id sets its holder
    (``holders[key] = holder``), its last remove drops it (``holders.pop(key, None)``)."""

    def added(self, key: int, holder: bytes) -> None:
        """A write of ``holder`` added a reference to ``key``."""
        held = self.get(key)
        if held is None:
            self[key] = holder
        elif isinstance(held, bytes):
            self[key] = {held: 2} if held == holder else {held: 1, holder: 1}
        else:
            held[holder] = held.get(holder, 0) + 1

    def adopted(self, key: int, holder: bytes, ref_count: int) -> None:
        """A write of ``holder`` adopted a recovered record of ``key`` (no new reference)."""
        held = self.get(key)
        if held is None or ref_count > sum(_counts(held).values()):
            self.added(key, holder)

    def removed(self, key: int, holder: bytes | None, ref_count: int) -> None:
        """A remove of ``holder`` took one of the ``ref_count`` (more than one) references
        of ``key`` (the remove of its last drops the key)."""
        held = self.get(key)
        if held is None:
            return
        counts = _counts(held)
        if holder is None or holder not in counts:
            if ref_count > sum(counts.values()):
                return  # an unknown reference
            holder = next(iter(counts))
        self._take(key, counts, holder)

    def claim(
        self, key: int, holder: bytes, predecessors: Sequence[bytes], ref_count: int, nth: int
    ) -> bool:
        """Whether ``holder`` holds ``nth`` references of ``key`` (which has ``ref_count``),
        taking one of a predecessor's, else an unknown one, if it holds fewer."""
        held = self.get(key)
        counts = {} if held is None else _counts(held)
        if counts.get(holder, 0) >= nth:
            return True
        for predecessor in predecessors:
            if predecessor != holder and counts.get(predecessor, 0) > 0:
                self._take(key, counts, predecessor)
                self.added(key, holder)
                return True
        if ref_count > sum(counts.values()):
            self.added(key, holder)
            return True
        return False

    def _take(self, key: int, counts: dict[bytes, int], holder: bytes) -> None:
        """One reference less for ``holder`` (which has one) among ``counts``."""
        if counts[holder] > 1:
            counts[holder] -= 1
        else:
            del counts[holder]
        if not counts:
            del self[key]
        elif len(counts) == 1 and next(iter(counts.values())) == 1:
            self[key] = next(iter(counts))
        else:
            self[key] = counts


def _counts(held: _Held) -> dict[bytes, int]:
    """Each holder's count (the table's own dict, or a new one for a single holder)."""
    return {held: 1} if isinstance(held, bytes) else held

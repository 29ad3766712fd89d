"""How a process holding a large ``VariableQueue`` runs Python's cyclic garbage collector:
its automatic collections left to the youngest generation (a queue holds one
``MsgStatus`` per message in RAM, and a collection of an older generation walks them all);
``warren.queues.broker.queue_actor`` runs the full collections itself.
"""

from __future__ import annotations

import gc

__all__ = ["collect_only_the_young_automatically", "collector_is_generational"]

_NO_AUTOMATIC_COLLECTION = 2**31 - 1  # an older generation's collection threshold


def collector_is_generational() -> bool:
    """Whether this Python's cyclic garbage collector has three generations, each collected
    once the one below it has been collected ``threshold`` times (CPython up to 3.13, and
    3.14.5 on). CPython 3.14.0 to 3.14.4 collect their old generation incrementally
    instead, a slice at a time, and report a third threshold of 0."""
    return gc.get_threshold()[2] != 0


def collect_only_the_young_automatically() -> tuple[int, int, int]:
    """Leave this process's automatic garbage collections to the youngest generation, as a
    process holding a large ``VariableQueue`` runs: what outlives one collection waits for
    a full one the process runs itself (a collection of an older generation walks every
    ``MsgStatus`` that reached it: the queue process's docstring,
    ``warren.queues.broker.queue_actor``, says why and when it collects instead); the
    thresholds before, for ``gc.set_threshold`` to restore. An incremental collector is
    left as it is: it already walks the old generation a slice at a time, and its
    thresholds mean other things."""
    before = gc.get_threshold()
    if collector_is_generational():
        gc.set_threshold(before[0], _NO_AUTOMATIC_COLLECTION, _NO_AUTOMATIC_COLLECTION)
    return before

"""``LatencyHistogram``: how long something took, counted into fixed buckets, as a store
actor keeps its confirm waits and its syncs for the node's metrics.

A histogram counts observations (durations in seconds) into ``LATENCY_BUCKETS_S``, the
upper bounds of its buckets, and keeps their number and sum. ``reading()`` is what a
``StoreStats`` answer carries: ``{"counts": [...], "count": n, "sum": s}``, where
``counts[i]`` is how many observations were at or below ``LATENCY_BUCKETS_S[i]``
(cumulative, Prometheus's ``le`` buckets; the ``+Inf`` bucket is ``count``). Every figure
only grows while the process lives and starts from 0 with it, as the store's counters do:
the node's metrics book them as counters (``warren.supervisor.node.metrics``), so a
quantile over a rate stays right across a store's restarts.

Observing is a bisect and two additions: cheap enough for every write batch.
"""

from __future__ import annotations

import bisect

__all__ = ["LATENCY_BUCKETS_S", "LatencyHistogram"]

# Upper bounds in seconds: from half a millisecond (an fdatasync on a fast SSD) to ten
# seconds (a stalled disk), about three buckets a decade.
LATENCY_BUCKETS_S = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)


class LatencyHistogram:
    """Durations in seconds, counted into ``LATENCY_BUCKETS_S``; see the module docstring."""

    __slots__ = ("_in_bucket", "_count", "_sum")

    def __init__(self) -> None:
        # observations per bucket, not cumulative; the last slot is above every bound
        self._in_bucket = [0] * (len(LATENCY_BUCKETS_S) + 1)
        self._count = 0
        self._sum = 0.0

    def observe(self, seconds: float) -> None:
        self._in_bucket[bisect.bisect_left(LATENCY_BUCKETS_S, seconds)] += 1
        self._count += 1
        self._sum += seconds

    def reading(self) -> dict[str, object]:
        """The cumulative counts per bound, the number and the sum of the observations."""
        counts = []
        below = 0
        for observed in self._in_bucket[:-1]:
            below += observed
            counts.append(below)
        return {"counts": counts, "count": self._count, "sum": self._sum}

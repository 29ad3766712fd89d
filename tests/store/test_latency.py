"""A latency histogram counts as Prometheus reads one: each bucket holds what was at or
below its bound, so the counts never decrease from bound to bound, and what is above
every bound is only in the count."""

from warren.store.latency import LATENCY_BUCKETS_S, LatencyHistogram


def test_an_observation_counts_in_every_bucket_at_or_above_it_and_in_the_count_and_sum():
    histogram = LatencyHistogram()
    for seconds in (0.0001, 0.001, 0.0011, 0.3, 60.0):
        histogram.observe(seconds)
    reading = histogram.reading()
    counts = dict(zip(LATENCY_BUCKETS_S, reading["counts"], strict=True))
    assert counts[0.0005] == 1
    assert counts[0.001] == 2  # a bound holds what equals it
    assert counts[0.0025] == 3
    assert counts[0.25] == 3 and counts[0.5] == 4
    assert counts[10.0] == 4  # a minute is above every bound: in the count alone
    assert reading["count"] == 5
    assert abs(reading["sum"] - 60.3022) < 1e-9


def test_a_new_histogram_reads_all_zeros():
    assert LatencyHistogram().reading() == {
        "counts": [0] * len(LATENCY_BUCKETS_S),
        "count": 0,
        "sum": 0.0,
    }

"""queen_timers_fire_lag_seconds, observed a batch at a time (one observation per distinct lag
with its count), reads exactly as prometheus_client's Histogram observed once per timer."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from queen_trio.metrics import FIRE_LAG_BUCKETS, BrokerMetrics

NAME = "queen_timers_fire_lag_seconds"


def exposition(registry: CollectorRegistry) -> dict[str, float]:
    out = {}
    for line in generate_latest(registry).decode().splitlines():
        if line.startswith(NAME):
            series, value = line.rsplit(" ", 1)
            out[series] = float(value)
    return out


@pytest.mark.parametrize("together", [False, True], ids=["each", "together"])
def test_counted_lags_read_as_one_observation_per_timer(together: bool) -> None:
    # Exactly on a bound (a lag equal to a bound counts in that bucket), between bounds,
    # zero, and past the last bound; counts of one and of thousands. ``together``: a
    # sweeper cycle's lags observed in one call (observe_fire_lags).
    lags = {0.0: 3, 0.0001: 1, 0.00011: 2, 0.001: 5000, 0.0295: 7, 1.0: 1, 2.5: 4999,
            27.3: 1000, 600.0: 2, 601.5: 3}
    reference = CollectorRegistry()
    histogram = Histogram(NAME, "Fire commit minus deliver_at, on PostgreSQL's clock",
                          buckets=FIRE_LAG_BUCKETS, registry=reference)
    metrics = BrokerMetrics()
    for seconds, n in lags.items():
        for _ in range(n):
            histogram.observe(seconds)
        if not together:
            metrics.observe_fire_lag(7, seconds, n)
    if together:
        metrics.observe_fire_lags(7, list(lags.items()))
    ours, theirs = exposition(metrics.registry), exposition(reference)
    assert list(ours) == list(theirs)  # the same series, in the same order
    total_s = f"{NAME}_sum"
    assert ours.pop(total_s) == pytest.approx(theirs.pop(total_s), rel=1e-12)
    assert ours == theirs
    assert ours[f"{NAME}_count"] == sum(lags.values())
    # The tenant's tally (GET /api/v1/stats) counts the same buckets.
    tally = metrics.tally(7)
    assert tally.fires == sum(lags.values())
    assert [float(v) for v in tally.fire_lag_cumulative().values()] == [
        v for k, v in theirs.items() if k.startswith(f"{NAME}_bucket")]

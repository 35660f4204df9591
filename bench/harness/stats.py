"""The one percentile of the bench, and the summaries the reports are made of.

Every percentile printed or saved by a bench script is the **nearest rank**: of n ascending
values, the p-th percentile is the value at 1-based rank ``ceil(p / 100 * n)`` (at least 1).
It is always one of the samples (never an interpolation between two), p = 100 is the maximum,
and values such as ``math.inf`` sort last as they are, so a percentile that lands on one is
``inf`` (``quantiles`` reports it as None: "more than the wait"). The broker's histograms are
the exception: their quantiles can only be interpolated inside buckets (see
``bench.harness.metrics.histogram_quantile``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

T = TypeVar("T", int, float)


def percentile(sorted_values: Sequence[T], p: float) -> T:
    """Nearest-rank ``p``-th percentile (0 < p <= 100) of values already sorted ascending.

    Raises ValueError for no values: a percentile of nothing has no value to be."""
    if not sorted_values:
        raise ValueError("percentile of no values")
    rank = max(1, math.ceil(p / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def median(values: Iterable[T]) -> T:
    """The nearest-rank p50 of ``values`` in any order (of an even count, the lower middle
    value: a value that was measured, never the mean of two)."""
    return percentile(sorted(values), 50)


def distribution(samples_s: list[float]) -> dict[str, Any]:
    """p50/p90/p99/max/mean in milliseconds of samples in seconds."""
    if not samples_s:
        return {"n": 0}
    ms = sorted(x * 1000 for x in samples_s)
    return {
        "n": len(ms),
        "p50": round(percentile(ms, 50), 2),
        "p90": round(percentile(ms, 90), 2),
        "p99": round(percentile(ms, 99), 2),
        "max": round(ms[-1], 2),
        "mean": round(sum(ms) / len(ms), 2),
    }


QUANTILES = (50, 90, 99, 99.9)


CDF_POINTS = 200


def qname(q: float) -> str:
    return f"p{q:g}".replace(".", "_")  # p50, p99_9


def quantiles(samples_s: list[float]) -> dict[str, Any]:
    """p50/p90/p99/p99.9/max in ms (nearest rank). A timer that never arrived counts as
    +inf (``missing``): a percentile that lands on one is None, i.e. "more than the wait"."""
    if not samples_s:
        return {"n": 0}
    ordered = sorted(samples_s)
    finite = [x for x in ordered if math.isfinite(x)]

    def ms(x: float) -> float | None:
        return round(x * 1000, 2) if math.isfinite(x) else None

    out: dict[str, Any] = {"n": len(ordered), "missing": len(ordered) - len(finite)}
    for q in QUANTILES:
        out[qname(q)] = ms(percentile(ordered, q))
    out["max"] = ms(ordered[-1])
    out["mean"] = round(sum(finite) / len(finite) * 1000, 2) if finite else None
    out["cdf_ms"] = cdf_points(finite, len(ordered))
    return out


def cdf_points(finite_s: list[float], total: int) -> list[list[float]]:
    """[lag ms, fraction <= it] at ranks spaced evenly in log(1 - F), so the tail is drawn
    as finely as the body; small enough for the JSON."""
    n = len(finite_s)
    if not n:
        return []
    ranks = {n - 1}
    for i in range(CDF_POINTS):
        tail = 10 ** (-4 * i / (CDF_POINTS - 1))  # 1 .. 1e-4 of the timers above
        ranks.add(min(n - 1, max(0, round(total * (1 - tail)) - 1)))
    return [[round(finite_s[r] * 1000, 3), round((r + 1) / total, 6)] for r in sorted(ranks)]

"""The bench's one percentile (nearest rank) and the summaries built on it."""

import math

import pytest

from bench.harness.stats import distribution, percentile, qname, quantiles


def test_nearest_rank_on_known_lists() -> None:
    values = [15, 20, 35, 40, 50]  # the textbook example
    assert percentile(values, 5) == 15
    assert percentile(values, 30) == 20
    assert percentile(values, 40) == 20
    assert percentile(values, 50) == 35
    assert percentile(values, 100) == 50
    ten = list(range(1, 11))
    assert [percentile(ten, p) for p in (10, 11, 50, 90, 99, 100)] == [1, 2, 5, 9, 10, 10]


def test_always_a_sample_never_an_interpolation() -> None:
    assert percentile([1.0, 2.0], 50) == 1.0
    assert percentile([1.0, 2.0], 51) == 2.0
    assert percentile([7.5], 0.1) == 7.5
    assert percentile([7.5], 99.9) == 7.5


def test_empty_list_is_an_error() -> None:
    with pytest.raises(ValueError):
        percentile([], 50)
    assert distribution([]) == {"n": 0}
    assert quantiles([]) == {"n": 0}


def test_inf_sorts_last_and_quantiles_report_it_as_none() -> None:
    assert percentile([0.001, 0.002, math.inf], 50) == 0.002
    assert percentile([0.001, 0.002, math.inf], 99) == math.inf
    # 99 arrived (1..99 ms), one never did: p50/p90/p99 are samples, p99.9 and max "> wait"
    q = quantiles([i / 1000 for i in range(1, 100)] + [math.inf])
    assert q["n"] == 100 and q["missing"] == 1
    assert (q["p50"], q["p90"], q["p99"]) == (50.0, 90.0, 99.0)
    assert q[qname(99.9)] is None and q["max"] is None
    assert q["mean"] == 50.0  # over the finite ones


def test_distribution_in_milliseconds() -> None:
    d = distribution([0.004, 0.001, 0.003, 0.002])
    assert d == {"n": 4, "p50": 2.0, "p90": 4.0, "p99": 4.0, "max": 4.0, "mean": 2.5}


def test_qname() -> None:
    assert qname(50) == "p50" and qname(99.9) == "p99_9"

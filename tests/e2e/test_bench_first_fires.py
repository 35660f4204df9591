"""``bench.first_fires`` stays working: fresh brokers, with and without a warm-up queue, each
timer's handler lag recorded in firing order, on the test session's server."""

from __future__ import annotations

import pytest

from bench import first_fires
from tests.pgserver import Databases

pytestmark = pytest.mark.slow


def test_cold_and_warm_rounds_record_every_fire(databases: Databases) -> None:
    out = first_fires.run(1, 3, 0.05, 300, True, databases.admin_url)

    assert set(out["rounds"]) == {"cold", "warm"}
    for kind, rounds in out["rounds"].items():
        (r,) = rounds
        assert r["round"] == 1, kind
        lags = r["lags_ms"]
        assert len(lags) == 3, kind  # every timer handled, once
        # (never before the due instant; the bound is wide: a loaded machine)
        assert all(-1.0 < lag < 5_000 for lag in lags), (kind, lags)

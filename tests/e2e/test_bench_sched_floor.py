"""``bench.sched_floor``'s ladder stays working: every rung, from a bare insert to the SDK's
call through the broker, makes its call and is timed, on the test session's server."""

from __future__ import annotations

import pytest

from bench import sched_floor
from bench.harness import peer_procrastinate
from tests.pgserver import Databases

pytestmark = pytest.mark.slow


def test_every_rung_is_called_and_timed_at_each_gap(databases: Databases) -> None:
    out = sched_floor.run(3, [0.001, 0.002], databases.admin_url)

    assert list(out["gaps_ms"]) == ["1", "2"]
    rungs = [r for r in sched_floor.RUNGS
             if r != "procrastinate" or peer_procrastinate.missing() is None]
    for by_rung in out["gaps_ms"].values():
        assert list(by_rung) == rungs
        for rung, d in by_rung.items():
            assert d["n"] == 3, rung
            assert 0 < d["p50"] <= d["max"], rung
    # each timed call of a rung that schedules a timer left one pending, at both gaps
    assert out["timers"] == {rung: 6 for rung in ("blocking", "broker", "hypercorn", "sdk",
                                                  "statement", "sync-sdk", "trio")}
    assert out["calls"] == 3 and len(out["load"]) == 2

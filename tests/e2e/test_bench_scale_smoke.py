"""The timer scale bench stays runnable: ``bench.timer_scale`` at a tiny N, every
phase (fill, ops and idle lag side by side, the held snapshot, a burst), its own embedded
server with pg_stat_statements, two real broker subprocesses and the SDK consumers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import timer_scale

pytestmark = pytest.mark.slow


def test_smoke_every_phase_at_a_tiny_n(tmp_path: Path) -> None:
    code = timer_scale.main(["--pending", "300", "--rounds", "5", "--idle", "5",
                             "--snapshot-minutes", "0.1", "--churn", "20", "--burst", "300",
                             "--out-dir", str(tmp_path)])

    summary = json.loads((tmp_path / "timer_scale.json").read_text())
    assert code == 0, summary["failures"]
    assert (tmp_path / "timer_scale.txt").read_text().startswith("timer_scale")
    assert summary["fill"]["timers"] == 300
    for op in ("schedule", "peek", "list", "cancel", "idle_lag_consume"):
        for side in ("empty", "full"):
            row = summary["ops"][op][side]
            assert row["n"] == 5 and 0 <= row["p50"] <= row["p99"] <= row["max"], (op, side)
        assert summary["ops"][op]["ratio_p50"] is not None
    for side in ("empty", "full"):
        assert summary["idle_delivery"][side] == {"scheduled": 5, "lost": 0, "duplicates": 0,
                                                  "early": 0}
        assert summary["sweep"][side]["calls"] > 0
    snapshot = summary["snapshot"]
    assert snapshot["scheduled"] > 0 and snapshot["lost"] == snapshot["duplicates"] == 0
    assert snapshot["lag_per_minute_ms"]["0"]["n"] == snapshot["scheduled"]
    assert len(snapshot["table_samples"]) >= 2
    assert snapshot["table_samples"][-1]["n_dead_tup"] >= 0
    burst = summary["burst"]
    assert burst["timers"] == 300 and burst["left"] == 0 and burst["drain_per_s"] > 0
    assert summary["load"]["start"] and summary["load"]["end"]

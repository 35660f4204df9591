"""The wake-up latency suite's smallest run stays working: ``bench.fire_lag --smoke``, ours
only, a real broker subprocess on the test session's server, with the bench extra (the peer,
matplotlib) made unimportable as it is in CI."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from bench.fire_lag import suite as fire_lag
from tests.pgserver import Databases

pytestmark = pytest.mark.slow


def test_smoke_idle_ours_only_without_the_bench_extra(
    databases: Databases, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "procrastinate", None)  # import raises ImportError
    monkeypatch.setitem(sys.modules, "matplotlib", None)

    code = fire_lag.main(["--smoke", "--admin-url", databases.admin_url,
                          "--out-dir", str(tmp_path), "--no-readme"])

    summary = json.loads((tmp_path / "fire_lag.json").read_text())
    assert code == 0, summary["failures"]
    assert "procrastinate is not installed" in summary["peer"]["skipped"]
    assert list(summary["scenarios"]) == ["idle"]
    assert list(summary["scenarios"]["idle"]) == ["ours", *fire_lag.OURS_BESIDE]
    ours = summary["scenarios"]["idle"]["ours"]
    scheduled = fire_lag.SIZES["smoke"].idle_timers
    assert ours["delivery"]["scheduled"] == ours["delivery"]["received_distinct"] == scheduled
    assert ours["delivery"]["lost"] == ours["delivery"]["duplicates"] == 0
    assert ours["lag"]["n"] == scheduled and ours["lag"]["missing"] == 0
    assert 0 <= ours["lag"]["p50"] <= ours["lag"]["p99"] <= ours["lag"]["max"]
    assert ours["metric_lag"]["count"] == scheduled
    assert not list(tmp_path.glob("*.png"))  # no matplotlib: plots skipped, the rest written

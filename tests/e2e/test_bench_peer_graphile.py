"""Issue 32's side-by-side bench stays working: ``bench.peer_graphile --smoke`` for schedule
and steady, ours beside graphile-worker tuned and beside Procrastinate tuned, on the test
session's server. Graphile's is skipped where Node or the pinned graphile-worker is not
installed (``npm ci --prefix bench/peers/graphile``); Procrastinate is a dev extra."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import peer_graphile
from bench.harness import peer_procrastinate
from tests.pgserver import Databases

pytestmark = pytest.mark.slow


def test_node_url_is_the_same_server_spelled_for_node_postgres() -> None:
    assert peer_graphile.node_url("host=127.0.0.1 port=5433 user=postgres dbname=peers32_x") \
        == "postgresql://postgres@127.0.0.1:5433/peers32_x"
    assert peer_graphile.node_url("postgresql://u:p%40ss@h:6000/d") \
        == "postgresql://u:p%40ss@h:6000/d"


def test_smoke_schedule_and_steady_beside_graphile_tuned(databases: Databases,
                                                         tmp_path: Path) -> None:
    why = peer_graphile.missing()
    if why:
        pytest.skip(why)

    code = peer_graphile.main(["--smoke", "--admin-url", databases.admin_url,
                               "--scenario", "schedule", "steady",
                               "--parties", "ours", "graphile-tuned",
                               "--out-dir", str(tmp_path), "--out", "smoke"])

    summary = json.loads((tmp_path / "smoke.json").read_text())
    assert code == 0, summary["failures"]
    sizes = peer_graphile.SIZES["smoke"]
    schedule = summary["scenarios"]["schedule"]
    # (the peer's schedule rows run with its parties; Procrastinate's did not)
    assert set(schedule) == {"ours", "graphile", "graphile-jobkey"}
    for party, (result,) in schedule.items():
        assert result["scheduled"] == sizes.schedule_timers, party
        assert result["timers_per_s"] > 0 and result["cpu_ms_per_timer"]["total"] > 0, party
    steady = summary["scenarios"]["steady"]
    assert set(steady) == {"ours", "graphile-tuned"}
    n = sizes.steady_rate * sizes.steady_seconds
    for party, (result,) in steady.items():
        assert result["delivery"]["handled"] == result["delivery"]["scheduled"] == n, party
        assert result["settle_s"] >= 0, party  # the server was settled before the unit
        assert result["delivery"]["lost"] == result["delivery"]["duplicates"] == 0, party
        assert result["lag"]["n"] == n and result["lag"]["missing"] == 0, party
        assert 0 <= result["lag"]["p50"] <= result["lag"]["p99"] <= result["lag"]["max"], party
        cost = result["cpu_ms_per_timer"]
        assert cost["total"] > 0 and cost["postgres"] > 0, party
    assert "consumer" in steady["ours"][0]["cpu_ms_per_timer"]
    assert "worker" in steady["graphile-tuned"][0]["cpu_ms_per_timer"]
    text = (tmp_path / "smoke.txt").read_text()
    assert "| steady: lag p50 / p90 / p99 / max ms |" in text and "uptime at start" in text


def test_smoke_schedule_and_steady_beside_procrastinate_tuned(databases: Databases,
                                                              tmp_path: Path) -> None:
    why = peer_procrastinate.missing()
    if why:
        pytest.skip(why)

    code = peer_graphile.main(["--smoke", "--admin-url", databases.admin_url,
                               "--scenario", "schedule", "steady",
                               "--parties", "ours", "procrastinate-tuned",
                               "--out-dir", str(tmp_path), "--out", "smoke"])

    summary = json.loads((tmp_path / "smoke.json").read_text())
    assert code == 0, summary["failures"]
    sizes = peer_graphile.SIZES["smoke"]
    schedule = summary["scenarios"]["schedule"]
    assert set(schedule) == {"ours", "procrastinate"}
    for party, (result,) in schedule.items():
        # (Procrastinate's: the jobs counted in its table afterwards)
        assert result["scheduled"] == sizes.schedule_timers, party
        assert result["timers_per_s"] > 0 and result["cpu_ms_per_timer"]["total"] > 0, party
    steady = summary["scenarios"]["steady"]
    assert set(steady) == {"ours", "procrastinate-tuned"}
    n = sizes.steady_rate * sizes.steady_seconds
    for party, (result,) in steady.items():
        assert result["delivery"]["handled"] == result["delivery"]["scheduled"] == n, party
        assert result["delivery"]["lost"] == result["delivery"]["duplicates"] == 0, party
        assert result["lag"]["n"] == n and result["lag"]["missing"] == 0, party
        assert 0 <= result["lag"]["p50"] <= result["lag"]["p99"] <= result["lag"]["max"], party
    assert steady["procrastinate-tuned"][0]["cpu_ms_per_timer"]["worker"] > 0
    assert summary["machine"]["procrastinate_profiles"]["tuned"]["worker"][
        "fetch_job_polling_interval"] == 0.01
    text = (tmp_path / "smoke.txt").read_text()
    header = next(line for line in text.splitlines() if line.startswith("| measure |"))
    assert header.split(" | ")[1:] == ["ours", "procrastinate tuned",
                                       "ours / procrastinate tuned |"]
    schedule_row = next(line for line in text.splitlines() if line.startswith("| schedule, "))
    assert schedule_row.count(" | ") == 3 and "(same)" not in schedule_row

"""Issue 32's side-by-side bench stays working: ``bench.peer_graphile --smoke`` for schedule
and steady, ours beside graphile-worker tuned and beside Procrastinate tuned, on the test
session's server. Graphile's is skipped where Node or the pinned graphile-worker is not
installed (``npm ci --prefix bench/peers/graphile``); Procrastinate is a dev extra."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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


def _smoke(databases: Databases, tmp_path: Path, peer: str, schedule_rows: set[str]
           ) -> tuple[dict[str, Any], str]:
    """``--smoke`` schedule and steady, ours beside the party ``peer``: every timer and job
    scheduled and handled once, lags and CPU recorded; the summary and the text report."""
    code = peer_graphile.main(["--smoke", "--admin-url", databases.admin_url,
                               "--scenario", "schedule", "steady", "--parties", "ours", peer,
                               "--out-dir", str(tmp_path), "--out", "smoke"])

    summary = json.loads((tmp_path / "smoke.json").read_text())
    assert code == 0, summary["failures"]
    sizes = peer_graphile.SIZES["smoke"]
    schedule = summary["scenarios"]["schedule"]
    # (a peer's schedule rows run with its parties, another peer's do not)
    assert set(schedule) == schedule_rows
    for party, (result,) in schedule.items():
        # (a peer's: the jobs counted in its table afterwards)
        assert result["scheduled"] == sizes.schedule_timers, party
        assert result["timers_per_s"] > 0 and result["cpu_ms_per_timer"]["total"] > 0, party
    steady = summary["scenarios"]["steady"]
    assert set(steady) == {"ours", peer}
    n = sizes.steady_rate * sizes.steady_seconds
    for party, (result,) in steady.items():
        assert result["delivery"]["handled"] == result["delivery"]["scheduled"] == n, party
        assert result["settle_s"] >= 0, party  # the server was settled before the unit
        assert result["delivery"]["lost"] == result["delivery"]["duplicates"] == 0, party
        assert result["lag"]["n"] == n and result["lag"]["missing"] == 0, party
        assert 0 <= result["lag"]["p50"] <= result["lag"]["p99"] <= result["lag"]["max"], party
        cost = result["cpu_ms_per_timer"]
        assert cost["total"] > 0 and cost["postgres"] > 0, party
    assert steady["ours"][0]["cpu_ms_per_timer"]["consumer"] > 0
    assert steady[peer][0]["cpu_ms_per_timer"]["worker"] > 0
    text = (tmp_path / "smoke.txt").read_text()
    assert "| steady: lag p50 / p90 / p99 / max ms |" in text and "uptime at start" in text
    return summary, text


def test_smoke_schedule_and_steady_beside_graphile_tuned(databases: Databases,
                                                         tmp_path: Path) -> None:
    why = peer_graphile.missing()
    if why:
        pytest.skip(why)

    _smoke(databases, tmp_path, "graphile-tuned", {"ours", "graphile", "graphile-jobkey"})


def test_smoke_schedule_and_steady_beside_procrastinate_tuned(databases: Databases,
                                                              tmp_path: Path) -> None:
    why = peer_procrastinate.missing()
    if why:
        pytest.skip(why)

    summary, text = _smoke(databases, tmp_path, "procrastinate-tuned",
                           {"ours", "procrastinate"})

    assert summary["machine"]["procrastinate_profiles"]["tuned"]["worker"][
        "fetch_job_polling_interval"] == 0.01
    header = next(line for line in text.splitlines() if line.startswith("| measure |"))
    assert header.split(" | ")[1:] == ["ours", "procrastinate tuned",
                                       "ours / procrastinate tuned |"]
    schedule_row = next(line for line in text.splitlines() if line.startswith("| schedule, "))
    assert schedule_row.count(" | ") == 3 and "(same)" not in schedule_row

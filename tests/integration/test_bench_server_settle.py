"""The side-by-side benches settle the shared server before every measured unit
(``bench.harness.pg.Server.settle``): a checkpoint is taken then, not inside the next party's
window, and the wait ends once the server is quiet."""

from __future__ import annotations

import psycopg

from bench.harness.pg import Server, local_postmaster
from tests.pgserver import Databases


def _checkpoints(admin_url: str) -> int:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        # (PostgreSQL 17 moved the counts from pg_stat_bgwriter to pg_stat_checkpointer.)
        newer = conn.execute("SELECT to_regclass('pg_catalog.pg_stat_checkpointer')").fetchone()
        row = conn.execute(
            "SELECT num_requested + num_timed FROM pg_stat_checkpointer" if newer and newer[0]
            else "SELECT checkpoints_req + checkpoints_timed FROM pg_stat_bgwriter").fetchone()
    assert row is not None
    return int(row[0])


def test_settle_checkpoints_and_waits_for_a_quiet_server(databases: Databases) -> None:
    server = Server(databases.admin_url, "the test session's", local_postmaster(
        databases.admin_url))
    before = _checkpoints(databases.admin_url)

    settled = server.settle(quiet_cores=0.5, longest_s=5.0)

    assert _checkpoints(databases.admin_url) > before
    assert 0 <= settled["settle_s"] <= 10.0
    if server.postmaster_pid is not None:  # on this machine: its processes were watched
        assert 0 <= settled["server_cores_before"] < 0.5

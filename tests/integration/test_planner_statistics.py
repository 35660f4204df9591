"""Tables that outgrow their planner statistics are analyzed within seconds
(schema/functions/ops.sql, queen_trio/db/analyze.py), which drops the plans connections made
while they were small."""

from __future__ import annotations

import time
import uuid
from typing import Any

import httpx
import trio

from queen_trio.db.analyze import analyze_grown_tables
from queen_trio.db.rows import DictConnection
from queen_trio.log import store as log_store

from .test_timer_races import asql, connect, default_tenant


def _analyzed(rows: list[dict[str, Any]]) -> set[str]:
    return {r["table_name"] for r in rows}


def _read_plan(conn: DictConnection) -> str:
    rows = conn.execute(f"EXPLAIN EXECUTE read_one('{uuid.uuid4()}', 7)").fetchall()
    return "\n".join(next(iter(r.values())) for r in rows)


def test_a_plan_made_on_a_small_log_is_dropped_once_the_log_has_grown(database_url: str) -> None:
    with connect(database_url, autocommit=True) as conn, \
            connect(database_url, autocommit=True) as reader:
        conn.execute("ALTER TABLE queen.frames SET (autovacuum_enabled = false)")
        tenant = default_tenant(conn)
        with conn.transaction():
            log_store.append(conn, tenant, [log_store.NewFrame("grow", "Default", 0, "t0")])
        conn.execute("ANALYZE queen.frames")
        # A generic plan made now, as a connection keeps one: a one-row table is read whole.
        reader.execute("SET plan_cache_mode = force_generic_plan")
        reader.execute('PREPARE read_one(uuid, bigint) AS SELECT payload FROM queen.frames '
                       'WHERE partition_id = $1 AND "offset" = $2')
        assert "Seq Scan on frames" in _read_plan(reader)
        assert "queen.frames" not in _analyzed(analyze_grown_tables(conn))

        with conn.transaction():
            log_store.append(conn, tenant, [log_store.NewFrame("grow", "Default", i, f"t{i}")
                                            for i in range(1, 5001)])
            conn.execute("SELECT pg_stat_force_next_flush()")
        deadline = time.monotonic() + 10  # the statistics of a commit reach pg_stat promptly
        while not (done := [r for r in analyze_grown_tables(conn)
                            if r["table_name"] == "queen.frames"]):
            assert time.monotonic() < deadline, "queen.frames was never found grown"
            time.sleep(0.1)
        assert done[0]["live_rows"] >= 5001 and done[0]["rows_before"] <= 1
        # The ANALYZE invalidated the reader's plan; its next one is made for 5,001 rows.
        plan = _read_plan(reader)
        assert "Seq Scan" not in plan and "Index" in plan, plan
        # Once per doubling: statistics that describe the table leave it alone.
        assert "queen.frames" not in _analyzed(analyze_grown_tables(conn))
        # Statistics of the columns plans filter on, none of the payloads (which no plan reads
        # and which cost most of an ANALYZE: migration 014).
        gathered = {r["attname"] for r in conn.execute(
            "SELECT attname FROM pg_stats WHERE schemaname = 'queen' AND tablename = 'frames'")}
        assert {"partition_id", "offset", "transaction_id"} <= gathered, gathered
        assert not gathered & {"payload", "meta"}, gathered


async def test_the_broker_analyzes_a_table_that_grew_under_it(
    database_url: str, http: httpx.AsyncClient,
) -> None:
    async def frames_statistics() -> float:
        (row,) = await asql(database_url, "SELECT reltuples FROM pg_class "
                                          "WHERE oid = 'queen.frames'::regclass")
        return row["reltuples"]

    # (Autovacuum would analyze it too, within a minute: not in this test.)
    await asql(database_url, "ALTER TABLE queen.frames SET (autovacuum_enabled = false)")
    before = await frames_statistics()
    for batch in range(5):
        items = [{"queue": "grown", "payload": {"n": batch * 1000 + i}} for i in range(1000)]
        assert (await http.post("/api/v1/push", json={"items": items})).status_code == 201
    with trio.fail_after(15):  # the analyzer looks every 2 s; statistics reach it within ~1 s
        while await frames_statistics() < 5000:
            await trio.sleep(0.2)
    assert before < 5000

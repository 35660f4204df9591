"""A burst drained by the sweep statement alone, with N timers pending (issue 31): where a
sweep's shared buffers go, per timer, as the drain goes on.

A temporary embedded server (``pg_stat_statements.track = all``, planning tracked); N
far-future timers written by SQL and the table VACUUMed and ANALYZEd (as bench.timer_scale
does); then a burst of B timers due at one instant (one statement, as bench.timer_scale's
``--fill sql`` burst), drained by ``queen.sweep_timers`` (batch 5,000, as a broker draining a
backlog) on one connection, with no broker. At every tenth of the drain: wall µs, and shared
buffers per timer of the sweep and of each statement inside it (planning and execution), and
one ``EXPLAIN (ANALYZE, BUFFERS)`` of the due-row scan from the current floor (rolled back).
Several bursts may be drained one after the other (``--burst 100000 1000000``). Run from the
repository root::

    python -m bench.burst_scan --pending 10000000 --burst 100000 1000000
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

from bench.harness.fill import sql_fill
from bench.harness.report import load, now_iso, save_json, source_revision
from queen_trio.db.migrations import apply_migrations
from queen_trio.embedded import EmbeddedPostgres

RESULTS_DIR = Path(__file__).resolve().parent / "results"
BATCH = 5000
SWEEP = ("SELECT count(*) AS n FROM queen.sweep_timers(%s, 'bench', %s, 30000, 1048576, true, "
         "NULL) WHERE fired")
DUE_SCAN = """
EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)
SELECT due.ctid FROM queen.timers due
WHERE due.visible_at >= queen.sweep_floor() AND due.visible_at <= now()
ORDER BY due.visible_at LIMIT {batch} FOR UPDATE SKIP LOCKED"""
STATEMENTS = """
SELECT query, toplevel, calls, plans,
       shared_blks_hit + shared_blks_read AS blocks, total_exec_time AS ms,
       total_plan_time AS plan_ms
FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"""


def statements(conn: psycopg.Connection[dict[str, Any]]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for r in conn.execute(STATEMENTS).fetchall():
        key = ("top " if r["toplevel"] else "") + re.sub(r"\s+", " ", r["query"])[:90]
        d = out.setdefault(key, {"calls": 0.0, "blocks": 0.0, "ms": 0.0})
        d["calls"] += float(r["calls"])
        d["blocks"] += float(r["blocks"])
        d["ms"] += float(r["ms"]) + float(r["plan_ms"] or 0)
    return out


def due_scan(conn: psycopg.Connection[dict[str, Any]]) -> dict[str, Any]:
    with conn.transaction(force_rollback=True):
        plan = conn.execute(DUE_SCAN.format(batch=BATCH)).fetchone()["QUERY PLAN"][0]
    top = plan["Plan"]
    scan = top
    while scan.get("Plans"):
        scan = scan["Plans"][0]
    planning = plan.get("Planning", {})
    return {"exec_blocks": top["Shared Hit Blocks"] + top["Shared Read Blocks"],
            "plan_blocks": planning.get("Shared Hit Blocks", 0)
            + planning.get("Shared Read Blocks", 0),
            "rows": top.get("Actual Rows"), "ms": plan.get("Execution Time"),
            "plan_ms": plan.get("Planning Time"), "scan": scan.get("Node Type"),
            "index": scan.get("Index Name")}


def drain(conn: psycopg.Connection[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    tenths: list[dict[str, Any]] = []
    fired = 0
    prev_stats, prev_t, prev_fired = statements(conn), time.perf_counter(), 0
    while True:
        if fired >= (len(tenths)) * n / 10:
            scan = due_scan(conn)
        else:
            scan = None
        got = conn.execute(SWEEP, (uuid.uuid4(), BATCH)).fetchone()["n"]
        fired += got
        if scan is not None:
            tenths.append({"fired_from": fired - got, "due_scan": scan})
        done = got == 0
        if fired >= len(tenths) * n / 10 or done:
            now, stats = time.perf_counter(), statements(conn)
            d = fired - prev_fired
            if d and tenths:
                per = {}
                for k, v in stats.items():
                    b = prev_stats.get(k, {"calls": 0.0, "blocks": 0.0, "ms": 0.0})
                    if v["calls"] > b["calls"]:
                        per[k] = {"blocks_per_timer": round((v["blocks"] - b["blocks"]) / d, 2),
                                  "us_per_timer": round((v["ms"] - b["ms"]) / d * 1e3, 2),
                                  "calls": int(v["calls"] - b["calls"])}
                tenths[-1].update(fired_to=fired, us_per_timer=round((now - prev_t) / d * 1e6, 1),
                                  statements=per)
                row = conn.execute("SELECT n_dead_tup, autovacuum_count, autoanalyze_count "
                                   "FROM pg_stat_user_tables WHERE relid = 'queen.timers'::regclass"
                                   ).fetchone()
                tenths[-1].update(row or {})
            prev_stats, prev_t, prev_fired = stats, now, fired
        if done:
            return tenths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.burst_scan")
    parser.add_argument("--pending", type=int, default=1_000_000)
    parser.add_argument("--burst", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--name", default="burst_scan")
    parser.add_argument("--setting", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--sql", action="append", default=[],
                        help="SQL run after the migrations (a variant under test)")
    args = parser.parse_args(argv)
    summary: dict[str, Any] = {"started": now_iso(), "checkout": source_revision(),
                               "argv": sys.argv[1:] if argv is None else argv,
                               "load": {"start": load()}}
    root = Path(tempfile.mkdtemp(prefix="queen-bench-burst-"))
    settings = {"shared_preload_libraries": "pg_stat_statements",
                "pg_stat_statements.track": "all", "pg_stat_statements.track_planning": "on",
                **dict(kv.split("=", 1) for kv in args.setting)}
    pg = EmbeddedPostgres(root, database="queen", server_settings=settings)
    try:
        pg.start()
        apply_migrations(pg.url)
        with psycopg.connect(pg.url, autocommit=True, row_factory=dict_row) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            for s in args.sql:
                conn.execute(s)
            if args.pending:
                t0 = time.perf_counter()
                sql_fill(pg.url, "scale-fill", args.pending, base_ms=30 * 86_400_000,
                         step_ms=1, prefix="fill")
                conn.execute("VACUUM (ANALYZE) queen.timers")
                conn.execute("CHECKPOINT")
                summary["fill_s"] = round(time.perf_counter() - t0, 1)
            for n in args.burst:
                sql_fill(pg.url, "scale-burst", n, base_ms=1000, step_ms=0,
                         prefix=f"burst{n}", chunk=n, connections=1)
                time.sleep(1.2)
                t0 = time.perf_counter()
                tenths = drain(conn, n)
                summary.setdefault("bursts", []).append({
                    "timers": n, "us_per_timer": round((time.perf_counter() - t0) / n * 1e6, 1),
                    "tenths": tenths, "load": load()})
                b = summary["bursts"][-1]
                print(f"burst {n:,}: {b['us_per_timer']} us/timer, load {b['load']}")
                for t in tenths:
                    if "us_per_timer" not in t:
                        print(f"  after the drain: due scan {t['due_scan']}")
                        continue
                    sweep = sum(v["blocks_per_timer"] for k, v in t.get("statements", {}).items()
                                if k.startswith("top ") and "sweep_timers" in k)
                    print(f"  {t['fired_from']:>9,} {t.get('us_per_timer'):>7} us "
                          f"sweep {sweep:>6.2f} blk/timer  due scan {t['due_scan']}  "
                          f"dead {t.get('n_dead_tup')} av {t.get('autovacuum_count')} "
                          f"aa {t.get('autoanalyze_count')}")
                    for k, v in sorted(t.get("statements", {}).items(),
                                       key=lambda kv: -kv[1]["blocks_per_timer"])[:8]:
                        print(f"      {v['blocks_per_timer']:>7} blk {v['us_per_timer']:>7} us "
                              f"{v['calls']:>5}  {k}")
    finally:
        pg.stop()
        shutil.rmtree(root, ignore_errors=True)
    summary["load"]["end"] = load()
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    save_json(RESULTS_DIR / f"{args.name}.json", summary)
    print(json.dumps(summary["load"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

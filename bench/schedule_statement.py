"""The statement of a 500-timer bundle alone (``store.schedule_many`` on one connection, far-future
timers of new names, autocommit as the broker runs it): the broker's CPU around it (the
arrays, psycopg, the outcomes) and the PostgreSQL backend's CPU, per bundle, on a temporary
server of the PostgreSQL installed in ``--pg-bin`` (default settings, durable). With
``--statements`` the server loads pg_stat_statements (track = all) and the function's own
statements are listed by time per call (their tracking adds to the figures).

    PYTHONPATH=$PWD python -m bench.schedule_statement [--bundles 150] [--statements]

Against a branch: run it from each checkout (``PYTHONPATH`` set to it), alternating.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import statistics
import time
import uuid
from pathlib import Path

import psycopg
from psycopg.rows import dict_row

from bench.harness.pg import installed_server
from queen_trio import transactions
from queen_trio.api import transaction as api_tx
from queen_trio.db.migrations import apply_migrations
from queen_trio.models import codec
from queen_trio.models import transaction as models
from queen_trio.timers import rules, store

N = 500
LIMITS = transactions.Limits(message_ceiling=1 << 20, timer_payload_ceiling=65536,
                             timer_horizon_s=86400 * 365, notify_within_ms=1000)


def backend_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bundle(tag: str) -> list[rules.Schedule]:
    """A bundle as the broker has it after the rules (what the SDK's schedule_many sends)."""
    body = json.dumps({"operations": [], "timers": [
        {"op": "schedule", "queue": "q", "timerKey": f"{tag}-{i}", "delayMs": 3_600_000,
         "txn": str(uuid.uuid4()),
         "payload": base64.b64encode(json.dumps({"k": f"{tag}-{i}"}).encode()).decode()}
        for i in range(N)]}).encode()
    parsed = transactions.parse(api_tx._bundle_builtins(codec.fast(body, models.BUNDLE_DECODER)),
                                LIMITS)
    return [t for t in parsed.timers if isinstance(t, rules.Schedule)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundles", type=int, default=150)
    parser.add_argument("--pg-bin", type=Path, default=Path("/usr/lib/postgresql/15/bin"))
    parser.add_argument("--statements", action="store_true")
    args = parser.parse_args()
    settings = (["shared_preload_libraries=pg_stat_statements", "pg_stat_statements.track=all"]
                if args.statements else [])
    with installed_server(args.pg_bin, settings) as server:
        url = server.create_database("schedule_statement")
        apply_migrations(url)
        with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
            pid = conn.info.backend_pid
            (tenant,) = conn.execute("SELECT tenant_id FROM queen.tenants "
                                     "WHERE name = 'default'").fetchone().values()
            bundles = [bundle(f"b{j}") for j in range(args.bundles + 5)]
            for b in bundles[:5]:  # plans made, caches warm
                store.schedule_many(conn, tenant, b, notify_within_ms=1000)
            if args.statements:
                conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                conn.execute("SELECT pg_stat_statements_reset()")
            python, backend, wall = [], [], []
            for b in bundles[5:]:
                c0, p0, w0 = time.process_time(), backend_cpu_s(pid), time.perf_counter()
                outcomes = store.schedule_many(conn, tenant, b, notify_within_ms=1000)
                python.append(time.process_time() - c0)
                backend.append(backend_cpu_s(pid) - p0)
                wall.append(time.perf_counter() - w0)
                assert {o.status for o in outcomes} == {"scheduled"}
            print(f"per {N}-timer bundle ({args.bundles} bundles): broker CPU "
                  f"{statistics.fmean(python) * 1e3:.2f} ms, PostgreSQL backend CPU "
                  f"{statistics.fmean(backend) * 1e3:.2f} ms, wall p50 "
                  f"{statistics.median(wall) * 1e3:.2f} ms; load {os.getloadavg()[0]:.1f}")
            if args.statements:
                for r in conn.execute(
                        "SELECT calls, total_exec_time / calls AS ms, left(regexp_replace("
                        "query, '\\s+', ' ', 'g'), 100) AS q FROM pg_stat_statements "
                        "WHERE calls >= %s ORDER BY total_exec_time DESC LIMIT 14",
                        (args.bundles,)):
                    print(f"{r['ms']:8.3f} ms {r['calls']:5d} calls  {r['q']}")


if __name__ == "__main__":
    main()

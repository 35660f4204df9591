"""What scheduling and firing timers cost PostgreSQL itself, without the broker or HTTP.

Schedules N timers in 500-timer ``schedule_many`` calls (one statement each, as a bundle does),
then, once they are all due, runs the sweep statement back to back until nothing is left, as
the sweeper does while draining a burst. For both phases it reports the wall time and the CPU
time of the PostgreSQL backend that ran the statements (read from /proc), so the figures say
how much database work a timer is, whatever else the machine is doing at the time: with two
cores shared by the broker, the client and PostgreSQL, that CPU figure bounds the burst drain
rate the whole system can reach.

Run from the repository root::

    python -m bench.sweep_cost | tee bench/results/sweep_cost.txt
    python -m bench.sweep_cost --timers 100000

Uses a temporary embedded PostgreSQL.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

from bench.harness.pg import installed_server, scratch_database
from queen_trio.timers import store
from queen_trio.timers.rules import Schedule

BUNDLE = 500


def backend_cpu_s(pid: int) -> float:
    """utime + stime of a process (here: a PostgreSQL backend), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(url: str, timers: int, batch: int) -> None:
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        tenant = conn.execute(
            "SELECT tenant_id FROM queen.tenants WHERE name = 'default'").fetchone()["tenant_id"]
        pid = conn.execute("SELECT pg_backend_pid() AS pid").fetchone()["pid"]
        version = conn.execute("SHOW server_version").fetchone()["server_version"]
        print(f"platform {platform.platform()}, {os.cpu_count()} CPUs, PostgreSQL {version}, "
              f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        print(f"{timers:,} timers, payload {{\"key\": i}}, schedule bundles of {BUNDLE}, "
              f"sweep batch {batch}")

        due = time.time() + 1.0 + timers / 15_000  # all due at one instant, after scheduling
        def schedule_all() -> None:
            for b in range(0, timers, BUNDLE):
                _schedule(conn, tenant, b, min(BUNDLE, timers - b), due)

        phase("schedule", conn, pid, timers, schedule_all)
        time.sleep(max(0.0, due - time.time()) + 0.05)

        def drain() -> None:
            while store.sweep(conn, uuid.uuid4(), "bench", batch, 30_000,
                              max_payload=1 << 20).fired:
                pass
        phase("fire", conn, pid, timers, drain)
        left = conn.execute("SELECT count(*) AS n FROM queen.timers").fetchone()["n"]
        frames = conn.execute("SELECT count(*) AS n FROM queen.frames").fetchone()["n"]
        print(f"timers left {left}, frames {frames:,} (expected {timers:,})")


def _schedule(conn: Any, tenant: int, start: int, count: int, due: float) -> None:
    delay = int((due - time.time()) * 1000)
    store.schedule_many(conn, tenant, [
        Schedule("bench.cost", f"k{i}", delay, {"key": i}, "Default", None)
        for i in range(start, start + count)], notify_within_ms=0)


def wal_lsn(conn: Any) -> int:
    return int(conn.execute("SELECT pg_current_wal_lsn() - '0/0' AS b").fetchone()["b"])


def phase(name: str, conn: Any, pid: int, timers: int, work: Any) -> None:
    wal, cpu, wall = wal_lsn(conn), backend_cpu_s(pid), time.perf_counter()
    work()
    cpu, wall = backend_cpu_s(pid) - cpu, time.perf_counter() - wall
    wal = wal_lsn(conn) - wal
    print(f"{name:<9} wall {wall:6.2f} s = {timers / wall:8,.0f} timers/s; PostgreSQL backend "
          f"CPU {cpu:5.2f} s = {cpu / timers * 1e6:5.1f} us/timer "
          f"(= {timers / cpu if cpu else float('inf'):,.0f} timers per CPU-second); "
          f"WAL {wal / timers:,.0f} B/timer")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--timers", type=int, default=30_000)
    parser.add_argument("--batch", type=int, default=500, help="QUEEN_SWEEPER_BATCH")
    parser.add_argument("--pg-bin", type=Path, default=None,
                        help="a temporary server of the PostgreSQL installed there (e.g. "
                             "/usr/lib/postgresql/15/bin; default: the embedded one)")
    args = parser.parse_args()
    if args.pg_bin is None:
        with scratch_database(None, "queen-bench-cost-", migrate=True) as url:
            measure(url, args.timers, args.batch)
        return
    from queen_trio.db.migrations import apply_migrations

    with installed_server(args.pg_bin) as server, server.database("sweepcost") as url:
        apply_migrations(url)
        measure(url, args.timers, args.batch)


if __name__ == "__main__":
    main()

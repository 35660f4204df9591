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

``--steady RATE`` measures the sweep of a steady flow instead: RATE timers/s due one after the
other, a sweep every ``--every-ms`` (the sweeper's MIN_SLEEP, 10 ms) firing what has come due,
as the sweeper's floor cycles do under a steady load; it reports PostgreSQL's CPU per sweep
and per timer. ``--baseline DIR`` (another checkout) runs the same on a second database of the
same server migrated by that checkout's schema, rounds interleaved (the sweep statement the
broker sends is this checkout's)::

    python -m bench.sweep_cost --pg-bin /usr/lib/postgresql/15/bin --steady 500 \
        --baseline /work/wt/base --rounds 4

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


def steady_round(url: str, rate: int, seconds: float, every_s: float) -> dict[str, float]:
    """``rate`` timers/s due for ``seconds``, swept every ``every_s``: PostgreSQL's CPU per
    sweep and per timer over the sweeps (the scheduling is not counted)."""
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        tenant = conn.execute(
            "SELECT tenant_id FROM queen.tenants WHERE name = 'default'").fetchone()["tenant_id"]
        pid = conn.execute("SELECT pg_backend_pid() AS pid").fetchone()["pid"]
        n = int(rate * seconds)
        first = time.time() + 1.0 + n / 10_000
        for b in range(0, n, BUNDLE):
            delay0 = first - time.time()
            store.schedule_many(conn, tenant, [
                Schedule("bench.steady", f"s{i}", int((delay0 + i / rate) * 1000), {"key": i},
                         "Default", None)
                for i in range(b, min(n, b + BUNDLE))], notify_within_ms=0)
        conn.execute("ANALYZE queen.timers")
        time.sleep(max(0.0, first - time.time()))
        cpu, fired, sweeps = backend_cpu_s(pid), 0, 0
        next_at = time.monotonic()
        while fired < n:
            fired += len(store.sweep(conn, uuid.uuid4(), "bench", 500, 30_000,
                                     max_payload=1 << 20).fired)
            sweeps += 1
            next_at += every_s
            time.sleep(max(0.0, next_at - time.monotonic()))
        cpu = backend_cpu_s(pid) - cpu
        conn.execute("TRUNCATE queen.frames")
    return {"sweeps": sweeps, "timers": fired, "per_sweep_us": cpu / sweeps * 1e6,
            "per_timer_us": cpu / fired * 1e6}


def steady(url: str, baseline_url: str | None, args: argparse.Namespace) -> None:
    print(f"platform {platform.platform()}, {os.cpu_count()} CPUs, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"steady {args.steady} timers/s for {args.seconds} s, a sweep every {args.every_ms} ms")
    sides = [("this checkout", url)] + ([("baseline", baseline_url)] if baseline_url else [])
    totals: dict[str, list[float]] = {name: [0.0, 0.0, 0.0] for name, _ in sides}
    for r in range(args.rounds):
        for name, u in (sides if r % 2 == 0 else sides[::-1]):
            out = steady_round(u, args.steady, args.seconds, args.every_ms / 1000)
            t = totals[name]
            t[0] += out["per_sweep_us"] * out["sweeps"]
            t[1] += out["sweeps"]
            t[2] += out["timers"]
            print(f"round {r + 1} {name:<14} {out['sweeps']:5d} sweeps, "
                  f"{out['timers'] / out['sweeps']:5.2f} timers/sweep, PostgreSQL CPU "
                  f"{out['per_sweep_us']:7.1f} us/sweep = {out['per_timer_us']:6.1f} us/timer")
    for name, (cpu, sweeps, timers) in totals.items():
        print(f"all rounds {name:<14} {cpu / sweeps:7.1f} us/sweep = {cpu / timers:6.1f} us/timer")
    print(f"load average at the end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def migrate_with(checkout: Path, url: str) -> None:
    """``url`` migrated by the schema of another checkout (its own migrations and functions)."""
    import subprocess
    import sys

    subprocess.run([sys.executable, "-c", "import sys; from queen_trio.db.migrations import "
                    "apply_migrations; apply_migrations(sys.argv[1])", url],
                   cwd=checkout, env={**os.environ, "PYTHONPATH": str(checkout)}, check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--timers", type=int, default=30_000)
    parser.add_argument("--batch", type=int, default=500, help="QUEEN_SWEEPER_BATCH")
    parser.add_argument("--pg-bin", type=Path, default=None,
                        help="a temporary server of the PostgreSQL installed there (e.g. "
                             "/usr/lib/postgresql/15/bin; default: the embedded one)")
    parser.add_argument("--steady", type=int, default=0, metavar="RATE",
                        help="a steady flow of RATE timers/s swept every --every-ms instead")
    parser.add_argument("--seconds", type=float, default=10.0, help="with --steady")
    parser.add_argument("--every-ms", type=float, default=10.0, help="with --steady")
    parser.add_argument("--rounds", type=int, default=2, help="with --steady")
    parser.add_argument("--baseline", type=Path, default=None,
                        help="with --steady and --pg-bin: another checkout, A/B")
    args = parser.parse_args()
    if args.steady:
        if args.pg_bin is None:
            parser.error("--steady needs --pg-bin")
        from queen_trio.db.migrations import apply_migrations

        with installed_server(args.pg_bin) as server, server.database("steady") as url:
            apply_migrations(url)
            if args.baseline is None:
                steady(url, None, args)
                return
            with server.database("steadybase") as base_url:
                migrate_with(args.baseline, base_url)
                steady(url, base_url, args)
        return
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

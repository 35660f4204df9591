"""Which statements PostgreSQL runs per timer on the fire -> pop -> ack path, and what they cost.

Runs ``bench.peer_graphile``'s ``steady`` or ``burst`` scenario for ``ours`` (one broker, one
SDK ``consume()``) on a temporary server of an installed PostgreSQL with pg_stat_statements
(``track = all``: the statements inside the plpgsql functions are counted too), and between
the scenario's two CPU snapshots (the measured window) takes the difference of
pg_stat_statements and of pg_stat_database's commits. Prints the scenario's figures, then
transactions per timer and the statements by time per timer, planning included (a function's
row includes the statements it runs: "top" marks the statements the clients sent; plans per
call below 1: a cached generic plan).

    PYTHONPATH=$PWD python -m bench.pg_path --scenario steady
    PYTHONPATH=$PWD python -m bench.pg_path --scenario burst --burst 20000 --top 40
    PYTHONPATH=$PWD python -m bench.pg_path --perf /tmp/pg.perf   # + perf record of the backends
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg

from bench import peer_graphile
from bench.harness.cpu import TreeCpu, children_of, proc_stats
from bench.harness.pg import installed_server
from bench.harness.report import Failures

_STATEMENTS = """
SELECT queryid, toplevel, dbid, calls, total_exec_time, plans, total_plan_time, query
FROM pg_stat_statements
"""
_COMMITS = "SELECT sum(xact_commit)::bigint, sum(xact_rollback)::bigint FROM pg_stat_database"
_BACKENDS = """
SELECT pid, coalesce(nullif(application_name, ''), backend_type) AS who FROM pg_stat_activity
"""


@dataclasses.dataclass
class Snapshot:
    # (queryid, toplevel, dbid) -> (calls, exec ms, plans, plan ms, text)
    statements: dict[tuple[Any, ...], tuple[int, float, int, float, str]]
    commits: int
    rollbacks: int
    backends: dict[int, tuple[str, float]]  # pid -> (application or process, CPU seconds)


def take(admin_url: str) -> Snapshot:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        rows = conn.execute(_STATEMENTS).fetchall()
        commits, rollbacks = conn.execute(_COMMITS).fetchone()  # type: ignore[misc]
        who: dict[int, str] = dict(conn.execute(_BACKENDS).fetchall())
    stats = proc_stats()
    return Snapshot({(q, top, db): (calls, ms, plans, plan_ms, text)
                     for q, top, db, calls, ms, plans, plan_ms, text in rows}, commits, rollbacks,
                    {pid: (name, stats[pid][1] / TreeCpu.TICK)
                     for pid, name in who.items() if pid in stats})


def report(before: Snapshot, after: Snapshot, timers: int, top: int) -> list[str]:
    lines = [f"transactions per timer: {(after.commits - before.commits) / timers:.2f} "
             f"committed, {(after.rollbacks - before.rollbacks) / timers:.3f} rolled back"]
    by_who: dict[str, float] = {}
    for pid, (name, cpu) in after.backends.items():
        if pid in before.backends:
            by_who[name] = by_who.get(name, 0.0) + cpu - before.backends[pid][1]
    lines.append("server processes' CPU per timer (us), those alive over the whole window: " +
                 ", ".join(f"{name} {s * 1e6 / timers:.0f}"
                           for name, s in sorted(by_who.items(), key=lambda kv: -kv[1])))
    diffs = []
    for key, (calls, ms, plans, plan_ms, text) in after.statements.items():
        c0, ms0, p0, pms0, _ = before.statements.get(key, (0, 0.0, 0, 0.0, ""))
        if calls > c0:
            diffs.append((ms - ms0 + plan_ms - pms0, calls - c0, plans - p0, plan_ms - pms0,
                          key[1], text))
    diffs.sort(reverse=True)
    lines.append(f"{'us/timer':>9} {'calls/timer':>11} {'us/call':>8} {'plans/call':>10} "
                 f"{'plan us/call':>12} top statement")
    for ms, calls, plans, plan_ms, toplevel, text in diffs[:top]:
        short = " ".join(text.split())[:160]
        lines.append(f"{ms * 1000 / timers:9.1f} {calls / timers:11.3f} "
                     f"{ms * 1000 / calls:8.1f} {plans / calls:10.2f} "
                     f"{plan_ms * 1000 / calls:12.1f} {'top' if toplevel else '   '} {short}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pg_path",
                                     description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--scenario", choices=("steady", "burst"), default="steady")
    parser.add_argument("--pg-bin", type=Path, default=Path("/usr/lib/postgresql/15/bin"))
    parser.add_argument("--steady-rate", type=int, default=500)
    parser.add_argument("--steady-seconds", type=int, default=20)
    parser.add_argument("--burst", type=int, default=50_000)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--perf", type=Path, default=None,
                        help="perf record the server's processes over the window into this file")
    args = parser.parse_args(argv)
    sizes = dataclasses.replace(peer_graphile.SIZES["moderate"], rounds=1,
                                steady_rate=args.steady_rate,
                                steady_seconds=args.steady_seconds, burst_timers=args.burst)
    settings = ("shared_preload_libraries=pg_stat_statements", "pg_stat_statements.track=all",
                "pg_stat_statements.max=10000", "pg_stat_statements.track_planning=on")
    with installed_server(args.pg_bin, settings) as server:
        with psycopg.connect(server.admin_url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION pg_stat_statements")
        snapshots: list[Snapshot] = []
        perf: list[subprocess.Popen[bytes]] = []

        class Profiled(TreeCpu):
            def snapshot(self) -> dict[str, float]:
                snapshots.append(take(server.admin_url))
                if args.perf is not None and server.postmaster_pid is not None:
                    if not perf:
                        pids = children_of(proc_stats()).get(server.postmaster_pid, [])
                        perf.append(subprocess.Popen(
                            ["perf", "record", "-q", "-F", "1999", "-o", str(args.perf), "-p",
                             ",".join(map(str, [server.postmaster_pid, *pids]))]))
                    elif perf[0].poll() is None:
                        perf[0].send_signal(signal.SIGINT)
                        perf[0].wait()
                return super().snapshot()

        peer_graphile.TreeCpu = Profiled  # type: ignore[misc]
        failures = Failures()
        result = peer_graphile.run_unit(server, args.scenario, "ours", sizes, failures)
    print(peer_graphile.unit_line(args.scenario, "ours", result))
    print(json.dumps({k: result.get(k) for k in ("cpu_ms_per_timer", "cpu_cores")}))
    if len(snapshots) < 2:
        print("no measured window", file=sys.stderr)
        return 1
    timers = (args.steady_rate * args.steady_seconds if args.scenario == "steady"
              else args.burst)
    print("\n".join(report(snapshots[-2], snapshots[-1], timers, args.top)))
    failures.print_details(examples=5, width=300)
    return 0 if failures.total() == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

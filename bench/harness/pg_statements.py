"""PostgreSQL's statements over a measured window (``bench.peer_graphile --statements``):
pg_stat_statements with ``track = all`` (the statements inside the plpgsql functions counted
too, planning included), commits, and CPU per server process, snapshotted whenever the
scenario takes its CPU snapshots (:attr:`bench.harness.cpu.TreeCpu.observers`); ``perf``
records the server's processes over the same window."""

from __future__ import annotations

import dataclasses
import signal
import subprocess
from pathlib import Path
from typing import Any

import psycopg

from bench.harness.cpu import TreeCpu, children_of, proc_stats

#: The server settings the watch needs (the server must be started with them).
SETTINGS = ("shared_preload_libraries=pg_stat_statements", "pg_stat_statements.track=all",
            "pg_stat_statements.max=10000", "pg_stat_statements.track_planning=on")

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


class StatementWatch:
    """Snapshots of the server at every CPU snapshot of a unit (its measured window is the
    last two); ``perf``: a perf record of the server's processes from the first to the
    second."""

    def __init__(self, admin_url: str, postmaster_pid: int | None, perf: Path | None) -> None:
        self.admin_url, self.postmaster_pid, self.perf_path = admin_url, postmaster_pid, perf
        self.snapshots: list[Snapshot] = []
        self._perf: subprocess.Popen[bytes] | None = None
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")

    def observe(self) -> None:
        self.snapshots.append(take(self.admin_url))
        if self.perf_path is None or self.postmaster_pid is None:
            return
        if self._perf is None:
            pids = children_of(proc_stats()).get(self.postmaster_pid, [])
            self._perf = subprocess.Popen(
                ["perf", "record", "-q", "-F", "1999", "-o", str(self.perf_path), "-p",
                 ",".join(map(str, [self.postmaster_pid, *pids]))])
        elif self._perf.poll() is None:
            self._perf.send_signal(signal.SIGINT)
            self._perf.wait()

    def report(self, timers: int, top: int) -> list[str]:
        if len(self.snapshots) < 2:
            return ["statements: no measured window"]
        return report(self.snapshots[-2], self.snapshots[-1], timers, top)

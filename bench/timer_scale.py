"""Timers at scale (issue 31): what N pending timers, a held snapshot and a large burst do to
the operations a user feels.

One embedded PostgreSQL server (``shared_preload_libraries=pg_stat_statements``) with two
databases, ``empty`` and ``full``, each served by its own broker subprocess
(``python -m queen_trio serve``); both brokers run for the whole run, so every comparison is
made side by side, rounds interleaved (which side goes first alternates):

1. fill: ``full`` gets N far-future timers (30 days + i ms) on the queue ``scale-fill``.
   They are written by the broker's own ``queen_trio.timers.store.schedule_many`` (the one
   statement, ``queen.schedule_timers``, that ``POST /api/v1/timers`` and bundles run), 5,000
   timers a statement on 2 connections: exactly the rows the broker writes, without HTTP's
   256-operation ceiling per call, so 10^6 take minutes rather than tens of minutes. With
   ``--fill sql`` they are written by SQL (``generate_series``, rows of the same shape), so
   10^7 take minutes rather than an hour. The table is then VACUUMed and ANALYZEd (the state
   autovacuum leaves it in), a CHECKPOINT finishes the ones the fill's WAL requested (they
   would otherwise run through the measurements), and the fill rate reported.
2. ops: through the SDK (``queen_trio.SyncClient``, timed in a worker thread around the
   call): a single schedule (``timer(q).key(k).delay(1h).schedule()``, a new key each
   time), its peek, the first page (100) of ``timers(q).list()`` for a queue of 100 pending,
   and a cancel; on ``full`` also a page from the middle of ``scale-fill`` (keyset ``after``).
   p50/p90/p99/max each and the ratio full / empty.
3. idle lag: ``Client.consume(queue, handler)`` at its defaults in a subprocess per broker
   (``bench/sdk_consumer.py``); timers scheduled one at a time (PUT), alternately on each
   broker, delays 300–1500 ms with due instants kept 25 ms apart across both
   (``bench.harness.spacing``); lag = handler start − ``deliverAt``.
4. sweep cost per cycle: from ``pg_stat_statements`` (top-level statements whose text calls
   ``queen.sweep_timers``, per database): calls, mean execution time and shared buffers
   touched per call over phases 2–3. The broker has no sweep-duration metric; this counts
   the statement inside PostgreSQL, without the round trip. The mean time includes the
   statement's own wait for the due instant (``not_before``, up to 100 ms), so the buffers
   per call are the cost figure; the time is the upper bound.
5. ``--snapshot-minutes M --churn R`` (on ``full``): a separate connection opens a REPEATABLE
   READ transaction, reads one row (its snapshot is now held) and keeps it open while R
   timers/s (delay 1 s, batches of R/10 through ``POST /api/v1/timers`` every 100 ms) are
   scheduled and consumed by the SDK consumer; lag p50/p99 per minute (by due instant),
   lost/duplicated, and every 10 s the table and index sizes of queen.timers, n_live_tup,
   n_dead_tup and the (auto)vacuum counts from pg_stat_user_tables, and the sweep
   statements run since the last sample with their shared buffers per call.
6. ``--burst N [N ...]`` (on ``full``): N timers due at one instant (written as in 1), the
   drain's wall time per timer from its batches' own instants (each fired batch's frames carry
   the instant its sweep statement appended them: first batch to last, over the timers after
   the first batch), and from ``queen_timers_fired_total`` polled every 100 ms (first poll
   showing a fire to the first showing all; the figure used when the burst's frames were
   sealed before the drain ended). ``--burst 100000 1000000`` compares the two sizes;
   repeated and interleaved (``100000 1000000 1000000 100000``), each burst is reported and
   the sizes compared by their medians (the machine's speed drifts, and each drain leaves
   dead rows and log frames to the next).

Writes bench/results/timer_scale.{txt,json} (``--out-dir``) with the load average at every
phase. Run from the repository root::

    python -m bench.timer_scale --pending 10000000 --fill sql --snapshot-minutes 10 \
        --churn 500 --burst 100000 1000000
    python -m bench.timer_scale --pending 200 --rounds 20 --idle 20 --snapshot-minutes 0.1
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import os
import random
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import trio
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row

import queen_trio
from bench.harness.api import Api
from bench.harness.brokers import brokers
from bench.harness.cpu import machine_busy_ticks
from bench.harness.fill import FILL_CONNECTIONS, SQL_FILL_CHUNK, in_parts, sql_fill
from bench.harness.lines import LineProcess
from bench.harness.pg import Server
from bench.harness.report import Failures, load, now_iso, save_json, source_revision
from bench.harness.spacing import SpacedDelays
from bench.harness.stats import distribution, median
from bench.harness.timers import Delivery, new_key, timer_ops
from queen_trio.client.wire import LeanClient
from queen_trio.timers import store
from queen_trio.timers.rules import Schedule

RESULTS_DIR = Path(__file__).resolve().parent / "results"
SIDES = ("empty", "full")
FILL_QUEUE = "scale-fill"
OPS_QUEUE = "scale-ops"
LAG_QUEUE = "scale-lag"
CHURN_QUEUE = "scale-churn"
BURST_QUEUE = "scale-burst"
FILL_BATCH = 5000
FAR_MS = 30 * 86_400_000
OPS_PENDING = 100  # the listed queue's size on both sides
IDLE_DELAY_MS = (300, 1500)
CHURN_DELAY_MS = 1000
SAMPLE_S = 10.0
TABLE_STATS = """
SELECT pg_relation_size('queen.timers') AS table_bytes,
       pg_indexes_size('queen.timers') AS index_bytes,
       n_live_tup, n_dead_tup, n_tup_ins, n_tup_del, n_tup_upd, n_tup_hot_upd,
       vacuum_count, autovacuum_count, analyze_count, autoanalyze_count,
       last_autovacuum::text AS last_autovacuum
FROM pg_stat_user_tables WHERE schemaname = 'queen' AND relname = 'timers'"""
# The log's hot rows behind a held snapshot: a consumer group's cursor (updated by every pop and
# ack) and a partition's row (by every push and fire). Buffers touched on each table (heap and
# indexes, all backends), its updates and HOT updates, its heap pages; and the pop and ack
# statements' shared buffers (pg_stat_statements).
LOG_SIDE_TABLES = ("cursors", "partitions")
LOG_SIDE_STATS = """
SELECT s.relname, coalesce(io.heap_blks_hit, 0) + coalesce(io.heap_blks_read, 0)
                  + coalesce(io.idx_blks_hit, 0) + coalesce(io.idx_blks_read, 0) AS blocks,
       s.n_tup_upd AS upd, s.n_tup_hot_upd AS hot_upd,
       pg_relation_size(s.relid) / 8192 AS pages
FROM pg_stat_user_tables s JOIN pg_statio_user_tables io USING (relid)
WHERE s.schemaname = 'queen' AND s.relname = ANY(%(tables)s)"""
LOG_STATEMENTS = """
SELECT coalesce(sum(calls) FILTER (WHERE toplevel AND query LIKE '%%queen.pop_head%%'), 0)::float8
           AS pop_calls,
       coalesce(sum(shared_blks_hit + shared_blks_read)
                FILTER (WHERE toplevel AND query LIKE '%%queen.pop_head%%'), 0)::float8
           AS pop_blocks,
       coalesce(sum(calls) FILTER (WHERE toplevel AND query LIKE '%%queen.ack_head%%'), 0)::float8
           AS ack_calls,
       coalesce(sum(shared_blks_hit + shared_blks_read)
                FILTER (WHERE toplevel AND query LIKE '%%queen.ack_head%%'), 0)::float8
           AS ack_blocks
FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"""


# What the whole server wrote while a drain ran (PostgreSQL 17+: pg_stat_checkpointer,
# pg_stat_io): WAL and its full-page images, checkpoints and who wrote dirty buffers out. A
# drain whose working set outgrows shared_buffers, or whose WAL outgrows max_wal_size, pays
# here what its buffers-touched count does not show. WAL bytes are the insert position's advance
# (pg_current_wal_insert_lsn, exact at any instant); the cumulative views (pg_stat_wal,
# pg_stat_io, pg_stat_statements' WAL) count what each backend has flushed to them, which a busy
# backend does at most once a second and an idle one up to 10 s later: over a 2-second drain
# they can show nothing at all.
SERVER_STATS = """
SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0') AS wal_lsn_bytes,
       w.wal_bytes, w.wal_fpi, w.wal_records, w.wal_buffers_full,
       c.num_timed + c.num_requested AS checkpoints, c.num_requested AS checkpoints_req,
       c.buffers_written AS checkpoint_buffers,
       (SELECT sum(writes) FROM pg_stat_io WHERE backend_type = 'client backend')
           AS backend_writes,
       (SELECT sum(reads) FROM pg_stat_io WHERE backend_type = 'client backend')
           AS backend_reads,
       (SELECT sum(writes) FROM pg_stat_io WHERE backend_type = 'background writer')
           AS bgwriter_writes,
       -- with track_wal_io_timing / track_io_timing on (--setting): µs spent writing and
       -- fsyncing WAL, by client backends (a commit's flush) and by everyone
       (SELECT coalesce(sum(write_time + fsync_time), 0) * 1000 FROM pg_stat_io
        WHERE object = 'wal' AND backend_type = 'client backend') AS wal_io_us_backends,
       (SELECT coalesce(sum(write_time + fsync_time), 0) * 1000 FROM pg_stat_io
        WHERE object = 'wal') AS wal_io_us_all,
       (SELECT coalesce(sum(fsyncs), 0) FROM pg_stat_io WHERE object = 'wal') AS wal_fsyncs,
       (SELECT coalesce(sum(write_time + fsync_time + read_time), 0) * 1000 FROM pg_stat_io
        WHERE object = 'relation' AND backend_type = 'client backend') AS rel_io_us_backends,
       (SELECT sum(writes) FROM pg_stat_io WHERE backend_type = 'autovacuum worker')
           AS autovacuum_writes,
       (SELECT coalesce(sum(shared_blks_read), 0) FROM pg_stat_statements
        WHERE toplevel AND query LIKE '%queen.sweep_timers%'
          AND dbid = (SELECT oid FROM pg_database
                      WHERE datname = current_database())) AS sweep_blocks_read,
       (SELECT coalesce(sum(wal_bytes), 0) FROM pg_stat_statements
        WHERE toplevel AND query LIKE '%queen.sweep_timers%'
          AND dbid = (SELECT oid FROM pg_database
                      WHERE datname = current_database())) AS sweep_wal_bytes,
       (SELECT coalesce(sum(wal_fpi), 0) FROM pg_stat_statements
        WHERE toplevel AND query LIKE '%queen.sweep_timers%'
          AND dbid = (SELECT oid FROM pg_database
                      WHERE datname = current_database())) AS sweep_wal_fpi
FROM pg_stat_wal w, pg_stat_checkpointer c"""


# -- the server and the fill ------------------------------------------------------------------


@contextlib.contextmanager
def stats_server(settings: dict[str, str] | None = None) -> Iterator[Server]:
    """A temporary embedded server that tracks statements (pg_stat_statements)."""
    import shutil
    import tempfile

    from queen_trio.embedded import EmbeddedPostgres

    root = Path(tempfile.mkdtemp(prefix="queen-bench-scale-"))
    server = EmbeddedPostgres(root, database="postgres", server_settings={
        "shared_preload_libraries": "pg_stat_statements", "pg_stat_statements.track": "top",
        **(settings or {})})
    try:
        server.start()
        yield Server(server.admin_url, "embedded (temporary), pg_stat_statements", server.pid)
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


def server_settings(url: str) -> dict[str, str]:
    """The settings a drain's cost depends on, as the server runs them."""
    with psycopg.connect(url, autocommit=True) as conn:
        return {n: conn.execute(f"SHOW {n}").fetchone()[0] for n in (
            "shared_buffers", "max_wal_size", "checkpoint_timeout", "wal_compression",
            "full_page_writes", "synchronous_commit", "autovacuum_vacuum_cost_limit")}


def write_timers(url: str, queue: str, count: int, delay_ms: Callable[[int], int],
                 prefix: str) -> float:
    """``count`` timers through the broker's own schedule statement, FILL_BATCH a statement
    on FILL_CONNECTIONS connections; timers/s."""
    t0 = time.perf_counter()

    def worker(part: int) -> None:
        with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
            tenant = conn.execute("SELECT tenant_id FROM queen.tenants "
                                  "WHERE name = 'default'").fetchone()["tenant_id"]
            for start in range(part * FILL_BATCH, count, FILL_BATCH * FILL_CONNECTIONS):
                with conn.transaction():
                    store.schedule_many(conn, tenant, [
                        Schedule(queue, new_key(prefix, i), delay_ms(i), {"i": i},
                                 "Default", None)
                        for i in range(start, min(count, start + FILL_BATCH))],
                        notify_within_ms=0)
                if start % 100_000 == 0 and start:
                    print(f"  {prefix}: {start:,} of {count:,} written, "
                          f"{start / (time.perf_counter() - t0):,.0f}/s", file=sys.stderr)

    in_parts(FILL_CONNECTIONS, worker)
    return count / (time.perf_counter() - t0)


def table_stats(url: str) -> dict[str, Any]:
    """queen.timers' sizes and pg_stat_user_tables row, with the sweep statements' cumulative
    calls / ms / shared blocks on this database (pg_stat_statements)."""
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        row = conn.execute(TABLE_STATS).fetchone() or {}
        sweep = conn.execute("""
            SELECT coalesce(sum(calls), 0)::float8 AS sweep_calls,
                   coalesce(sum(total_exec_time), 0)::float8 AS sweep_ms,
                   coalesce(sum(shared_blks_hit + shared_blks_read), 0)::float8 AS sweep_blocks
            FROM pg_stat_statements
            WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
              AND toplevel AND query LIKE '%queen.sweep_timers%'""").fetchone() or {}
        server = conn.execute(SERVER_STATS).fetchone() or {}
        log_side = {f"{r['relname']}_{k}": float(r[k] or 0)
                    for r in conn.execute(LOG_SIDE_STATS, {"tables": list(LOG_SIDE_TABLES)})
                    for k in ("blocks", "upd", "hot_upd", "pages")}
        log_side.update(conn.execute(LOG_STATEMENTS).fetchone() or {})
    return {"t": round(time.time(), 1), **row, **sweep, **log_side,
            **{k: float(v or 0) for k, v in server.items()}}


BURST_STATEMENTS = """
SELECT queryid, toplevel, left(regexp_replace(query, '\\s+', ' ', 'g'), 100) AS query,
       calls::float8, (shared_blks_hit + shared_blks_read)::float8 AS blocks,
       (total_exec_time + total_plan_time)::float8 AS ms
FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"""


def burst_statements(url: str) -> dict[tuple[Any, bool], dict[str, Any]]:
    """Every statement's cumulative calls, shared blocks and ms (with --setting
    pg_stat_statements.track=all, the ones inside the sweep functions too)."""
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        return {(r["queryid"], r["toplevel"]): r for r in conn.execute(BURST_STATEMENTS)}


def statements_per_timer(before: dict[tuple[Any, bool], dict[str, Any]],
                         after: dict[tuple[Any, bool], dict[str, Any]],
                         n: int) -> list[dict[str, Any]]:
    """The 12 statements that touched the most shared blocks in between, per timer."""
    rows = []
    for k, a in after.items():
        b = before.get(k, {"calls": 0.0, "blocks": 0.0, "ms": 0.0})
        if a["calls"] > b["calls"]:
            rows.append({"query": ("top " if a["toplevel"] else "") + a["query"],
                         "calls": int(a["calls"] - b["calls"]),
                         "blocks_per_timer": round((a["blocks"] - b["blocks"]) / n, 2),
                         "us_per_timer": round((a["ms"] - b["ms"]) / n * 1e3, 2)})
    return sorted(rows, key=lambda r: -r["blocks_per_timer"])[:12]


def sweep_statements(admin_url: str) -> dict[str, dict[str, float]]:
    """Per database: calls, total ms and shared blocks of the top-level sweep statements."""
    with psycopg.connect(admin_url, autocommit=True, row_factory=dict_row) as conn:
        rows = conn.execute("""
            SELECT d.datname, sum(calls) AS calls, sum(total_exec_time) AS ms,
                   sum(shared_blks_hit + shared_blks_read) AS blocks
            FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
            WHERE toplevel AND query LIKE '%queen.sweep_timers%'
            GROUP BY d.datname""").fetchall()
    return {r["datname"]: {"calls": float(r["calls"]), "ms": float(r["ms"]),
                           "blocks": float(r["blocks"])} for r in rows}


def sweep_cost(before: dict[str, dict[str, float]], after: dict[str, dict[str, float]],
               db: str) -> dict[str, Any]:
    a, b = after.get(db, {}), before.get(db, {})
    calls = a.get("calls", 0) - b.get("calls", 0)
    if calls <= 0:
        return {"calls": 0}
    return {"calls": int(calls),
            "mean_ms": round((a["ms"] - b.get("ms", 0)) / calls, 3),
            "blocks_per_call": round((a["blocks"] - b.get("blocks", 0)) / calls, 1)}


# -- the SDK consumer -------------------------------------------------------------------------


class Consumer(LineProcess):
    """``bench/sdk_consumer.py`` (``Client.consume()`` at its defaults) as a child process;
    each handler start goes to ``delivery`` as a frame-like record."""

    def __init__(self, url: str, queue: str, delivery: Delivery) -> None:
        super().__init__("bench.sdk_consumer", ["--url", url, "--queue", queue],
                         what="consumer", log_prefix="queen-bench-scale-consumer-")
        self.delivery = delivery

    def on_line(self, line: str) -> None:
        parts = line.split("\t")
        if len(parts) == 4:
            key, due, started, created = parts
            self.delivery.receive([{"timer": {"key": key,
                                              "deliverAt": due.replace("+00:00", "Z")},
                                    "createdAt": created.replace("+00:00", "Z")}],
                                  float(started))


def lags(delivery: Delivery) -> list[float]:
    return [copies[0][0] - delivery.expected[k][0]
            for k, copies in delivery.frames.items() if k in delivery.expected]


# -- one side ---------------------------------------------------------------------------------


class Side:
    def __init__(self, name: str, url: str, db_url: str, failures: Failures,
                 broker_pid: int | None = None, postmaster_pid: int | None = None) -> None:
        self.name, self.url, self.db_url = name, url, db_url
        self.broker_pid, self.postmaster_pid = broker_pid, postmaster_pid
        self.sdk = queen_trio.SyncClient(url)
        self.api = Api(LeanClient(url), failures)
        self.ops: dict[str, list[float]] = {}
        self.lag = Delivery(f"idle-{name}")

    def timed(self, op: str, call: Callable[[], Any]) -> Any:
        t0 = time.perf_counter()
        result = call()
        self.ops.setdefault(op, []).append(time.perf_counter() - t0)
        return result

    def op_round(self, i: int, pending: int) -> None:
        """One schedule, peek, list page and cancel through the SDK (blocking: a thread)."""
        key = new_key(f"op-{uuid.uuid4().hex[:6]}", i)
        timer = self.sdk.timer(OPS_QUEUE).key(key)
        self.timed("schedule", lambda: timer.delay(3_600_000).payload({"i": i}).schedule())
        found = self.timed("peek", timer.peek)
        assert found is not None, f"{self.name}: peek of {key} found nothing"
        page = self.timed("list", lambda: next(iter(
            self.sdk.timers(OPS_QUEUE).list(page_size=100).pages())))
        assert page.items, f"{self.name}: list of {OPS_QUEUE} empty"
        result = self.timed("cancel", timer.cancel)
        assert result.status == "cancelled", f"{self.name}: cancel answered {result.status}"
        if pending:
            after = new_key("fill", random.randrange(pending))
            self.timed("list_fill_middle", lambda: self.sdk._call(
                queen_trio.client.calls.list_timers(FILL_QUEUE, 100, after)))


async def in_thread(fn: Callable[[], Any]) -> Any:
    return await trio.to_thread.run_sync(fn)


# -- phases -----------------------------------------------------------------------------------


async def phase_ops_and_lag(sides: dict[str, Side], args: argparse.Namespace,
                            failures: Failures) -> None:
    """Op rounds and idle-lag timers, interleaved between the sides."""
    rng = random.Random(20261204)
    spaced = SpacedDelays(rng, IDLE_DELAY_MS)
    for s in sides.values():
        await in_thread(functools.partial(
            lambda s: [s.sdk.timer(OPS_QUEUE).key(f"standing-{j:04d}").delay(FAR_MS).schedule()
                       for j in range(OPS_PENDING)], s))
    for s in sides.values():  # warm-up, not counted
        await in_thread(functools.partial(s.op_round, 0, 0))
        s.ops.clear()
    async with trio.open_nursery() as nursery:
        for s in sides.values():
            consumer = Consumer(s.url, LAG_QUEUE, s.lag)
            await nursery.start(consumer.run)
        for i in range(max(args.rounds, args.idle)):
            order = list(sides.values()) if i % 2 == 0 else list(sides.values())[::-1]
            for s in order:
                if i < args.idle:
                    answer = await s.api.put_timer(s.lag.scenario, LAG_QUEUE, new_key("lag", i),
                                                   spaced.draw(time.time()), {"i": i})
                    if answer:
                        s.lag.schedule_answer(answer)
                if i < args.rounds:
                    await in_thread(functools.partial(
                        s.op_round, i, args.pending if s.name == "full" else 0))
            await trio.sleep(0.05)
        for s in sides.values():
            s.lag.scheduling_done = True
        deadline = trio.current_time() + IDLE_DELAY_MS[1] / 1000 + 15
        while not all(s.lag.complete for s in sides.values()):  # noqa: ASYNC110 - polled
            if trio.current_time() > deadline:
                break
            await trio.sleep(0.1)
        for s in sides.values():
            if not s.lag.complete:
                failures.add(s.lag.scenario, "undelivered",
                             f"{s.lag.got_expected} of {len(s.lag.expected)} timers handled")
        nursery.cancel_scope.cancel()


async def phase_snapshot(side: Side, minutes: float, rate: int,
                         failures: Failures) -> dict[str, Any]:
    """Churn ``rate`` timers/s for ``minutes`` while a REPEATABLE READ snapshot is held."""
    delivery = Delivery("snapshot")
    seconds = minutes * 60
    samples = [table_stats(side.db_url)]
    holder = await in_thread(lambda: psycopg.connect(side.db_url))
    await in_thread(lambda: holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ"))
    await in_thread(lambda: holder.execute("SELECT count(*) FROM queen.tenants").fetchone())
    xmin = await in_thread(lambda: holder.execute(
        "SELECT backend_xmin::text FROM pg_stat_activity WHERE pid = pg_backend_pid()"
    ).fetchone())
    t0 = time.time()
    per_tick = max(1, rate // 10)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(Consumer(side.url, CHURN_QUEUE, delivery).run)

            async def sample() -> None:
                while True:
                    await trio.sleep(SAMPLE_S)
                    samples.append(await in_thread(lambda: table_stats(side.db_url)))

            nursery.start_soon(sample)
            start, tick = trio.current_time(), 0
            while time.time() - t0 < seconds:
                tick += 1
                ops = timer_ops(CHURN_QUEUE, [(new_key(f"churn{tick}", j), CHURN_DELAY_MS,
                                               {"t": tick}) for j in range(per_tick)])
                for chunk in range(0, len(ops), 256):
                    for answer in await side.api.batch("snapshot", ops[chunk:chunk + 256]) or []:
                        delivery.schedule_answer(answer)
                await trio.sleep_until(start + tick * 0.1)
            delivery.scheduling_done = True
            deadline = trio.current_time() + CHURN_DELAY_MS / 1000 + 20
            while not delivery.complete:  # noqa: ASYNC110 - the consumer's lines, polled
                if trio.current_time() > deadline:
                    break
                await trio.sleep(0.1)
            nursery.cancel_scope.cancel()
    finally:
        await in_thread(holder.close)
    samples.append(table_stats(side.db_url))
    report = delivery.report()
    per_minute: dict[int, list[float]] = {}
    for key, copies in delivery.frames.items():
        if key in delivery.expected:
            due = delivery.expected[key][0]
            # by the minute it was scheduled in (due one CHURN_DELAY_MS later)
            minute = int((due - t0 - CHURN_DELAY_MS / 1000) // 60)
            per_minute.setdefault(max(0, minute), []).append(copies[0][0] - due)
    if report["lost"] or report["duplicates"]:
        failures.add("snapshot", "exactly-once",
                     f"{report['lost']} lost, {report['duplicates']} duplicated")
    full_minutes = [m for m in sorted(per_minute) if m < int(minutes)] or sorted(per_minute)
    first, last = (distribution(per_minute[full_minutes[i]]).get("p99") for i in (0, -1))
    return {"minutes": minutes, "churn_per_s": rate, "snapshot_xmin": xmin[0] if xmin else None,
            "last_over_first_p99": ratio(last, first),
            "scheduled": report["scheduled"], "lost": report["lost"],
            "duplicates": report["duplicates"],
            "lag_per_minute_ms": {m: distribution(v) for m, v in sorted(per_minute.items())},
            "table_samples": samples}


CPU_PARTIES = ("cpu_broker_main", "cpu_broker_threads", "cpu_pg_clients", "cpu_pg_autovacuum",
               "cpu_pg_background", "cpu_pg_exited", "cpu_machine")


def party_cpu(side: Side) -> dict[str, float]:
    """CPU µs used so far (/proc) by the broker's main thread (the event loop) and its other
    threads (the sweeper's drain, the housekeeper's sealing), by PostgreSQL's client backends,
    autovacuum workers, background processes (checkpointer, writers, io workers), and by its
    exited processes (the postmaster's reaped children), and by the whole machine. A drain's
    CPU per timer, by party, does not depend on what else the machine runs as its wall time
    does."""
    if side.broker_pid is None or side.postmaster_pid is None or not Path("/proc").is_dir():
        return {}
    tick = 1e6 / os.sysconf("SC_CLK_TCK")

    def ticks(path: Path) -> tuple[float, float]:
        try:
            text = path.read_text()
        except OSError:
            return 0.0, 0.0
        f = text[text.rindex(")") + 2:].split()
        return float(int(f[11]) + int(f[12])), float(int(f[13]) + int(f[14]))

    out = dict.fromkeys(CPU_PARTIES, 0.0)
    # (A thread that has exited is gone from task/, its time is still the process's.)
    out["cpu_broker_main"] = ticks(
        Path(f"/proc/{side.broker_pid}/task/{side.broker_pid}/stat"))[0] * tick
    out["cpu_broker_threads"] = (ticks(Path(f"/proc/{side.broker_pid}/stat"))[0] * tick
                                 - out["cpu_broker_main"])
    out["cpu_pg_exited"] = sum(ticks(Path(f"/proc/{side.postmaster_pid}/stat"))) * tick
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            if int(stat[stat.rindex(")") + 2:].split()[1]) != side.postmaster_pid:
                continue
            cmd = (entry / "cmdline").read_bytes().decode(errors="replace")
        except (OSError, ValueError):
            continue
        own = ticks(entry / "stat")[0] * tick
        if "autovacuum worker" in cmd:
            out["cpu_pg_autovacuum"] += own
        elif any(w in cmd for w in ("checkpointer", "background writer", "walwriter",
                                    "io worker", "autovacuum launcher", "launcher")):
            out["cpu_pg_background"] += own
        else:
            out["cpu_pg_clients"] += own
    out["cpu_machine"] = machine_busy_ticks() * tick
    return out


# Each fired batch's frames carry the instant the sweep statement appended them
# (queen.append_timer_frames: clock_timestamp(), one per statement): the burst's batches as
# PostgreSQL ran them, read once the drain is over (frames stay in the head for
# QUEEN_SEGMENT_MIN_AGE_MS, a minute, before they are sealed).
BATCH_STAMPS = """
SELECT extract(epoch FROM f.created_at)::float8 AS t, count(*)::int AS n
FROM queen.frames f JOIN queen.partitions p USING (partition_id)
     JOIN queen.queues q ON q.queue_id = p.queue_id
WHERE q.name = %s AND f.created_at > to_timestamp(%s)
GROUP BY 1 ORDER BY 1"""


def batch_stamps(url: str, queue: str, since: float) -> list[tuple[float, int]]:
    with psycopg.connect(url, autocommit=True) as conn:
        return [(float(t), int(c)) for t, c in conn.execute(BATCH_STAMPS, (queue, since))]


def batch_timing(stamps: list[tuple[float, int]], n: int) -> dict[str, Any]:
    """The drain's wall µs per timer from the batches' own instants: from the first batch's
    append to the last's, over the timers of every batch but the first (whose claim started
    before the first instant). Exact to one statement, where polling the broker's fired count
    (every 100 ms, which moves once per 0.2-s drain slice) misses up to a slice's timers at the
    start: a tenth of a 10^5 burst. Also the µs per timer of each batch (the gap since the
    previous batch's append, over its timers) and of each tenth of the drain."""
    if len(stamps) < 3 or sum(c for _, c in stamps) != n:
        return {}
    (t0, c0), t1 = stamps[0], stamps[-1][0]
    # (distribution() reports its samples × 1000: µs given in ms)
    gaps = [(b[0] - a[0]) / b[1] * 1000 for a, b in zip(stamps, stamps[1:], strict=False)]
    tenths: list[float] = []
    done, t_prev, c_prev = c0, t0, c0
    for (t, c) in stamps[1:]:
        done += c
        if done >= (len(tenths) + 1) * n / 10:
            tenths.append(round((t - t_prev) / (done - c_prev) * 1e6, 1))
            t_prev, c_prev = t, done
    return {"us_per_timer": round((t1 - t0) / (n - c0) * 1e6, 2), "batches": len(stamps),
            "first_batch": c0, "batch_us_per_timer": {
                k: v for k, v in distribution(gaps).items() if k != "n"},
            "tenths_us_per_timer": tenths}


async def phase_burst(side: Side, n: int, fill: str, failures: Failures) -> dict[str, Any]:
    """N timers due at one instant (written as the fill is), drained by the broker. With the
    SQL fill, one statement writes them all, due 1 s after it starts: they appear at its
    commit, all due at once (deliver_at is that one instant, so the last lag includes the
    write)."""
    # The fired count before the write: read after it, a drain quick enough to begin before
    # the read (10^5 on a busy machine) left the count short of N for good ("not drained").
    m0 = (await side.api.metrics())
    base = m0.value("queen_timers_fired_total") if m0 else 0.0
    t_write = time.time()
    prefix = f"burst{n}"
    if fill == "sql":
        due = t_write + 1
        rate = await in_thread(lambda: sql_fill(side.db_url, BURST_QUEUE, n, base_ms=1000,
                                                step_ms=0, prefix=prefix, chunk=n,
                                                connections=1))
    else:
        # Every timer due at one instant after the write: estimate it at 5,000/s, then a margin.
        due = t_write + n / 5000 + 5
        rate = await in_thread(lambda: write_timers(
            side.db_url, BURST_QUEUE, n, lambda _: int((due - time.time()) * 1000), prefix))
        if time.time() > due:
            failures.add("burst", "late write", "the burst was written after its due instant")
    stmts0 = await in_thread(lambda: burst_statements(side.db_url))
    first = last = None
    limit = trio.current_time() + 60 + n / 1000
    samples: list[dict[str, Any]] = []
    polls = 0
    while trio.current_time() < limit:
        fired = (await side.api.fired_total() or base) - base
        now = time.time()
        if fired > 0 and first is None:
            first = now
        if first is not None and (polls % 10 == 0 or fired >= n):
            samples.append({"fired": fired, **await in_thread(
                lambda: table_stats(side.db_url)), **party_cpu(side)})
        polls += 1
        if fired >= n:
            last = now
            break
        await trio.sleep(0.1)
    left = await in_thread(lambda: psycopg.connect(side.db_url).execute(
        "SELECT count(*) FROM queen.timers WHERE queue = %s", (BURST_QUEUE,)).fetchone()[0])
    if last is None or first is None:
        failures.add("burst", "not drained", f"{left} timers still pending")
        return {"timers": n, "write_per_s": round(rate), "left": left}
    span = max(last - first, 0.1)
    stmts1 = await in_thread(lambda: burst_statements(side.db_url))
    stamps = await in_thread(lambda: batch_stamps(side.db_url, BURST_QUEUE, t_write))
    polled = samples[0]["fired"] if samples else 0
    return {"timers": n, "write_per_s": round(rate), "drain_s": round(span, 2),
            "drain_per_s": round(n / span), "us_per_timer": round(span / n * 1e6, 1),
            # the polled span over the timers fired within it (not those the first poll saw)
            "polled_us_per_timer": round(span / max(1, n - polled) * 1e6, 1),
            "batches": batch_timing(stamps, n),
            "last_lag_s": round(last - due, 2), "left": left,
            "cpu_us_per_timer": drain_cpu(samples),
            "profile": drain_profile(samples, n),
            "statements": statements_per_timer(stmts0, stmts1, n)}


PER_TIMER = (*CPU_PARTIES, "wal_io_us_backends", "wal_io_us_all", "wal_fsyncs",
             "rel_io_us_backends", "wal_buffers_full", "wal_lsn_bytes", "wal_fpi",
             "sweep_wal_bytes", "sweep_wal_fpi", "sweep_blocks_read",
             "backend_writes", "backend_reads", "checkpoint_buffers", "bgwriter_writes",
             "autovacuum_writes")


def drain_cpu(samples: list[dict[str, Any]]) -> dict[str, float]:
    """CPU µs per timer fired by party (:func:`party_cpu`), first sample of the drain to its
    last."""
    if len(samples) < 2 or "cpu_machine" not in samples[0]:
        return {}
    a, b = samples[0], samples[-1]
    fired = b["fired"] - a["fired"]
    if fired <= 0:
        return {}
    out = {k.removeprefix("cpu_"): round((b[k] - a[k]) / fired, 2) for k in CPU_PARTIES}
    out["broker_and_pg"] = round(sum(v for k, v in out.items() if k != "machine"), 2)
    return out


def drain_profile(samples: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """The drain in tenths (by timers fired): per timer, the wall time, and the sweep
    statements' time and shared buffers (pg_stat_statements), with the timer table's dead
    rows and vacuum count at the tenth's end: what grows as the burst drains."""
    out: list[dict[str, Any]] = []
    prev = samples[0] if samples else None
    for s in samples[1:]:
        assert prev is not None
        if s["fired"] < (len(out) + 1) * n / 10 and s is not samples[-1]:
            continue
        fired = s["fired"] - prev["fired"]
        if fired > 0:
            out.append({
                "fired_to": int(s["fired"]),
                "us_per_timer": round((s["t"] - prev["t"]) / fired * 1e6, 1),
                "sweep_us_per_timer": round((s["sweep_ms"] - prev["sweep_ms"]) / fired * 1e3, 1),
                "sweep_blocks_per_timer": round((s["sweep_blocks"] - prev["sweep_blocks"])
                                                / fired, 2),
                "timers_per_sweep": round(fired / max(1, s["sweep_calls"]
                                                      - prev["sweep_calls"]), 1),
                "dead": s["n_dead_tup"],
                "autovacuum": s["autovacuum_count"],
                **{f"{k}_per_timer": round((s.get(k, 0) - prev.get(k, 0)) / fired, 3)
                   for k in PER_TIMER},
                "checkpoints": s.get("checkpoints"),
                "checkpoints_req": s.get("checkpoints_req")})
        prev = s
    return out


# -- report -----------------------------------------------------------------------------------


def ratio(full: Any, empty: Any) -> float | None:
    return round(full / empty, 2) if isinstance(full, (int, float)) and empty else None


def render_log_side(p: Callable[..., None], samples: list[dict[str, Any]]) -> None:
    """The log's hot rows per sample interval: per table, buffers touched per update, updates
    per second, the share of them HOT, heap pages; the pop and ack statements' buffers per
    call."""
    if "cursors_blocks" not in samples[0]:
        return
    p(f"  {'t s':>6}" + "".join(f"{t + ' blk/upd':>19}{'upd/s':>7}{'HOT%':>6}{'pages':>6}"
                                for t in LOG_SIDE_TABLES)
      + f"{'pop blk/call':>13}{'ack blk/call':>13}")
    t0, prev = samples[0]["t"], samples[0]
    for r in samples[1:]:
        dt = max(r["t"] - prev["t"], 0.1)
        cells = []
        for t in LOG_SIDE_TABLES:
            upd = r[f"{t}_upd"] - prev[f"{t}_upd"]
            hot = r[f"{t}_hot_upd"] - prev[f"{t}_hot_upd"]
            blk = r[f"{t}_blocks"] - prev[f"{t}_blocks"]
            cells.append(f"{blk / upd if upd else 0:>19.1f}{upd / dt:>7.1f}"
                         f"{100 * hot / upd if upd else 0:>6.0f}{r[f'{t}_pages']:>6.0f}")
        per_call = [(r[f"{k}_blocks"] - prev[f"{k}_blocks"])
                    / max(r[f"{k}_calls"] - prev[f"{k}_calls"], 1) for k in ("pop", "ack")]
        p(f"  {r['t'] - t0:>6.0f}" + "".join(cells)
          + f"{per_call[0]:>13.1f}{per_call[1]:>13.1f}")
        prev = r


def drained_us(b: dict[str, Any]) -> float:
    """A burst's drain, µs per timer: from its batches' instants where they were read, else
    from polling the broker's fired count."""
    return float(b.get("batches", {}).get("us_per_timer") or b["us_per_timer"])


def render_burst_summary(p: Callable[..., None], bursts: list[dict[str, Any]]) -> None:
    """Every burst in the order drained, then per size the median µs per timer and the ratio
    of the largest size's to the smallest's."""
    if not bursts:
        return
    p("")
    p("bursts in the order drained, wall us per timer (batches: first batch's append to the "
      "last's; polled: broker's fired count every 100 ms)")
    p(f"  {'#':>2}{'timers':>11}{'batches':>9}{'polled':>8}{'polled*':>8}{'batch p50/p90/max':>20}"
      "  by tenth")
    for i, b in enumerate(bursts, 1):
        bt = b.get("batches", {})
        d = bt.get("batch_us_per_timer", {})
        dist = f"{d['p50']:g}/{d['p90']:g}/{d['max']:g}" if d else "-"
        p(f"  {i:>2}{b['timers']:>11,}{bt.get('us_per_timer', '-'):>9}{b['us_per_timer']:>8}"
          f"{b.get('polled_us_per_timer', '-'):>8}{dist:>20}  "
          + " ".join(f"{x:g}" for x in bt.get("tenths_us_per_timer", [])))
    p("  (polled*: the polled span over the timers fired after the first poll)")
    by_size: dict[int, list[float]] = {}
    for b in bursts:
        by_size.setdefault(b["timers"], []).append(drained_us(b))
    for size, values in sorted(by_size.items()):
        p(f"  {size:>11,}: median {median(values):g}, mean {sum(values) / len(values):.1f} "
          "us/timer of " + ", ".join(f"{v:g}" for v in values))
    if len(by_size) >= 2:
        small, large = min(by_size), max(by_size)
        means = {k: sum(v) / len(v) for k, v in by_size.items()}
        p(f"burst drain per timer, {large:,} / {small:,}: "
          f"{ratio(median(by_size[large]), median(by_size[small]))} (medians; "
          f"means {ratio(means[large], means[small])}; target <= 1)")


def render(summary: dict[str, Any]) -> str:
    out = io.StringIO()
    p = lambda *a: print(*a, file=out)  # noqa: E731
    p(f"timer_scale  {summary['started']}  checkout {summary['checkout']}  "
      f"pending N = {summary['pending']:,}")
    p(f"load average: start {summary['load']['start']}, end {summary['load'].get('end')}")
    if summary.get("server_settings"):
        p(f"server: {summary['server_settings']}")
    if "fill" in summary:
        f = summary["fill"]
        p(f"fill: {f['timers']:,} timers in {f['seconds']} s = {f['per_s']:,}/s "
          f"({f['method']}); table {f['table_bytes'] / 2**20:.0f} MiB + indexes "
          f"{f['index_bytes'] / 2**20:.0f} MiB; then a CHECKPOINT, "
          f"{f.get('checkpoint_s', '-')} s, before anything is measured")
    p("")
    p(f"{'operation (ms)':<22}{'empty p50/p90/p99/max':>30}{'full p50/p90/p99/max':>30}"
      f"{'ratio p50 / p99':>18}")
    for op, row in summary["ops"].items():
        e, f = row.get("empty", {}), row.get("full", {})

        def cell(d: dict[str, Any]) -> str:
            return "/".join(f"{d[q]:g}" for q in ("p50", "p90", "p99", "max")) if d.get("n") \
                else "-"
        p(f"{op:<22}{cell(e):>30}{cell(f):>30}"
          f"{str(row.get('ratio_p50'))+' / '+str(row.get('ratio_p99')):>18}")
    p("(target: ratios <= 1.2)")
    p("")
    for side, cost in summary["sweep"].items():
        p(f"sweep statement, {side}: {cost}")
    if "snapshot" in summary:
        s = summary["snapshot"]
        p("")
        p(f"snapshot held {s['minutes']} min, churn {s['churn_per_s']}/s: scheduled "
          f"{s['scheduled']:,}, lost {s['lost']}, duplicated {s['duplicates']}")
        for m, d in s["lag_per_minute_ms"].items():
            p(f"  minute {m}: lag p50 {d.get('p50')} p99 {d.get('p99')} max {d.get('max')} "
              f"(n {d.get('n')})")
        if s.get("last_over_first_p99") is not None:
            p(f"  last full minute's lag p99 / first minute's: {s['last_over_first_p99']} "
              f"(target <= 1.5)")
        p(f"  {'t s':>6}{'table MiB':>10}{'index MiB':>10}{'live':>10}{'dead':>10}"
          f"{'autovac':>8}{'vac':>5}{'sweeps':>8}{'blocks/sweep':>13}")
        t0 = s["table_samples"][0]["t"]
        prev = s["table_samples"][0]
        for r in s["table_samples"]:
            calls = r["sweep_calls"] - prev["sweep_calls"]
            blocks = (r["sweep_blocks"] - prev["sweep_blocks"]) / calls if calls else 0
            prev = r
            p(f"  {r['t'] - t0:>6.0f}{r['table_bytes'] / 2**20:>10.1f}"
              f"{r['index_bytes'] / 2**20:>10.1f}{r['n_live_tup']:>10}{r['n_dead_tup']:>10}"
              f"{r['autovacuum_count']:>8}{r['vacuum_count']:>5}{calls:>8.0f}{blocks:>13.1f}")
        render_log_side(p, s["table_samples"])
    for b in summary.get("bursts", []):
        shown = {k: v for k, v in b.items()
                 if k not in ("profile", "statements", "cpu_us_per_timer", "batches")}
        p(f"burst: {shown}")
        if b.get("cpu_us_per_timer"):
            p(f"  CPU us per timer, whole drain: {b['cpu_us_per_timer']}")
        if b.get("profile"):
            p(f"  {'fired to':>10}{'us/timer':>10}{'sweep us':>10}{'blocks':>8}"
              f"{'per sweep':>10}{'dead':>10}{'autovac':>8}  (per timer, by tenth of the drain)")
            for r in b["profile"]:
                p(f"  {r['fired_to']:>10,}{r['us_per_timer']:>10}{r['sweep_us_per_timer']:>10}"
                  f"{r['sweep_blocks_per_timer']:>8}{r['timers_per_sweep']:>10}{r['dead']:>10}"
                  f"{r['autovacuum']:>8}")
            p(f"  {'fired to':>10}{'WAL B':>8}{'FPI':>7}{'sweep B':>8}{'read':>7}"
              f"{'be wr':>7}{'ckpt wr':>8}{'bgw wr':>7}{'av wr':>7}{'ckpts':>6}"
              "  (per timer; be = client backends, the whole server)")
            for r in b["profile"]:
                if "wal_fpi_per_timer" not in r:
                    continue
                p(f"  {r['fired_to']:>10,}{r.get('wal_lsn_bytes_per_timer', 0):>8.0f}"
                  f"{r['wal_fpi_per_timer']:>7.3f}{r['sweep_wal_bytes_per_timer']:>8.0f}"
                  f"{r['sweep_blocks_read_per_timer']:>7.3f}{r['backend_writes_per_timer']:>7.3f}"
                  f"{r['checkpoint_buffers_per_timer']:>8.3f}{r['bgwriter_writes_per_timer']:>7.3f}"
                  f"{r['autovacuum_writes_per_timer']:>7.3f}"
                  f"{r['checkpoints']:>4.0f}/{r['checkpoints_req']:.0f}")
        if b.get("profile") and "cpu_machine_per_timer" in b["profile"][0]:
            p(f"  {'fired to':>10}{'main':>7}{'threads':>8}{'pg cl':>7}{'autovac':>8}"
              f"{'pg bg':>7}{'exited':>7}{'machine':>8}  (CPU us per timer, /proc)")
            for r in b["profile"]:
                p(f"  {r['fired_to']:>10,}" + "".join(
                    f"{r[k + '_per_timer']:>{w}.1f}" for k, w in zip(
                        CPU_PARTIES, (7, 8, 7, 8, 7, 7, 8), strict=True)))
        if b.get("profile") and "wal_io_us_all_per_timer" in b["profile"][0]:
            p(f"  {'fired to':>10}{'WAL io be':>10}{'WAL io all':>11}{'fsyncs':>8}"
              f"{'rel io be':>10}{'WAL buf full':>13}"
              "  (per timer; io in us: track_wal_io_timing, track_io_timing)")
            for r in b["profile"]:
                p(f"  {r['fired_to']:>10,}{r['wal_io_us_backends_per_timer']:>10.2f}"
                  f"{r['wal_io_us_all_per_timer']:>11.2f}{r['wal_fsyncs_per_timer']:>8.4f}"
                  f"{r['rel_io_us_backends_per_timer']:>10.2f}"
                  f"{r.get('wal_buffers_full_per_timer', 0):>13.4f}")
        if b.get("statements"):
            p("  statements, whole drain (blocks, us per timer; calls):")
            for r in b["statements"]:
                p(f"  {r['blocks_per_timer']:>8} {r['us_per_timer']:>8} {r['calls']:>7}  "
                  f"{r['query']}")
    render_burst_summary(p, [b for b in summary.get("bursts", []) if "us_per_timer" in b])
    p("")
    p(f"failures: {summary['failures']['total']} {summary['failures']['counts']}")
    return out.getvalue()


# -- main -------------------------------------------------------------------------------------


async def run(args: argparse.Namespace, server: Server, urls: dict[str, str],
              handles: dict[str, Any], summary: dict[str, Any], failures: Failures) -> None:
    sides = {name: Side(name, handles[name].url, urls[name], failures, handles[name].pid,
                        server.postmaster_pid) for name in SIDES}
    try:
        if args.pending:
            t0 = time.perf_counter()
            if args.fill == "sql":
                rate = await in_thread(lambda: sql_fill(
                    urls["full"], FILL_QUEUE, args.pending, base_ms=FAR_MS, step_ms=1,
                    prefix="fill"))
                method = (f"SQL generate_series, {SQL_FILL_CHUNK:,}/statement, "
                          f"{FILL_CONNECTIONS} connections")
            else:
                rate = await in_thread(lambda: write_timers(
                    urls["full"], FILL_QUEUE, args.pending, lambda i: FAR_MS + i, "fill"))
                method = (f"store.schedule_many, {FILL_BATCH}/statement, "
                          f"{FILL_CONNECTIONS} connections")
            with psycopg.connect(urls["full"], autocommit=True) as conn:
                conn.execute("VACUUM (ANALYZE) queen.timers")
                fill_s = time.perf_counter() - t0
                # The fill's WAL requests checkpoints that would otherwise run, spread, through
                # the measurements (idle lag p99 ~780 ms on both sides at 10^7): finish them.
                conn.execute("CHECKPOINT")
            stats = table_stats(urls["full"])
            summary["fill"] = {
                "timers": args.pending, "seconds": round(fill_s, 1),
                "checkpoint_s": round(time.perf_counter() - t0 - fill_s, 1),
                "per_s": round(rate), "table_bytes": stats["table_bytes"],
                "index_bytes": stats["index_bytes"], "method": method}
            summary["load"]["after_fill"] = load()
        before = await in_thread(lambda: sweep_statements(server.admin_url))
        await phase_ops_and_lag(sides, args, failures)
        after = await in_thread(lambda: sweep_statements(server.admin_url))
        summary["load"]["after_ops"] = load()
        ops: dict[str, dict[str, Any]] = {}
        for name, s in sides.items():
            for op, samples in s.ops.items():
                ops.setdefault(op, {})[name] = distribution(samples)
            ops.setdefault("idle_lag_consume", {})[name] = distribution(lags(s.lag))
        for row in ops.values():
            if "empty" in row and "full" in row:
                row["ratio_p50"] = ratio(row["full"].get("p50"), row["empty"].get("p50"))
                row["ratio_p99"] = ratio(row["full"].get("p99"), row["empty"].get("p99"))
        summary["ops"] = ops
        summary["sweep"] = {
            "source": "pg_stat_statements (top-level statements calling queen.sweep_timers)",
            **{name: sweep_cost(before, after, str(conninfo_to_dict(urls[name])["dbname"]))
               for name in SIDES}}
        for name, s in sides.items():
            summary.setdefault("idle_delivery", {})[name] = {
                k: v for k, v in s.lag.report().items() if k in ("scheduled", "lost",
                                                                   "duplicates", "early")}
        if args.snapshot_minutes:
            summary["snapshot"] = await phase_snapshot(sides["full"], args.snapshot_minutes,
                                                       args.churn, failures)
            summary["load"]["after_snapshot"] = load()
        for n in args.burst:
            summary.setdefault("bursts", []).append(
                await phase_burst(sides["full"], n, args.fill, failures))
            summary["load"][f"after_burst_{len(summary['bursts'])}_{n}"] = load()
    finally:
        for s in sides.values():
            s.sdk.close()
            await s.api.client.aclose()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.timer_scale",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--pending", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=300, help="op rounds per side")
    parser.add_argument("--idle", type=int, default=300, help="idle-lag timers per side")
    parser.add_argument("--snapshot-minutes", type=float, default=0.0)
    parser.add_argument("--churn", type=int, default=500, help="timers/s while the snapshot")
    parser.add_argument("--burst", type=int, nargs="*", default=[],
                        help="burst sizes, drained one after the other (e.g. 100000 1000000; "
                             "interleave repeats to compare sizes: 100000 1000000 100000 ...)")
    parser.add_argument("--fill", choices=("broker", "sql"), default="broker",
                        help="how the pending timers and bursts are written: the broker's "
                             "schedule statement, or SQL generate_series (10^7 in minutes)")
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--name", default="timer_scale",
                        help="the results' file name (NAME.txt, NAME.json)")
    parser.add_argument("--setting", action="append", default=[], metavar="NAME=VALUE",
                        help="a server setting of the embedded PostgreSQL (repeatable), "
                             "on top of the broker's own (queen_trio.embedded)")
    args = parser.parse_args(argv)

    failures = Failures()
    summary: dict[str, Any] = {"started": now_iso(), "checkout": source_revision(),
                               "argv": sys.argv[1:] if argv is None else argv,
                               "pending": args.pending, "cpu_count": os.cpu_count(),
                               "load": {"start": load()}}
    settings = dict(kv.split("=", 1) for kv in args.setting)
    with stats_server(settings) as server:
        urls = {name: server.create_database(f"scale_{name}") for name in SIDES}
        summary["postgresql"] = server.settings()
        summary["server_settings"] = server_settings(server.admin_url)
        for url in (server.admin_url, *urls.values()):
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        with brokers(urls["empty"]) as (empty,), brokers(urls["full"]) as (full,):
            trio.run(run, args, server, urls, {"empty": empty, "full": full}, summary, failures)
    summary["load"]["end"] = load()
    summary["failures"] = {"total": failures.total(), "counts": failures.counts,
                           "examples": failures.examples}
    text = render(summary)
    print(text, end="")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / f"{args.name}.txt").write_text(text)
    save_json(args.out_dir / f"{args.name}.json", summary)
    return 1 if failures.total() else 0


if __name__ == "__main__":
    sys.exit(main())

"""What one sweeper cycle costs, taken apart, for a single due timer, through the same
trio⇄psycopg bridge the broker uses, without HTTP:

* sweep: a small JSON payload, fired by PostgreSQL inside the sweep statement (queen.sweep_timers);
* claim + fire: a compressed payload, claimed under a lease by the sweep statement, then fired
  by the broker (decompressed, appended, deleted) in a second transaction.

Two modes:
* back to back: the next timer is claimed as soon as the previous one was fired (warm
  caches, busy CPUs);
* after idle: 200 ms of quiet before each claim, as when timers are spaced out. On a small VM the
  first round trips after a quiet spell are markedly slower (idle vCPUs, cold backend), and that
  is most of an idle timer's fire lag.

Run from the repository root::

    python -m bench.sweeper_cycle | tee bench/results/sweeper_cycle.txt

``--steady RATE`` and ``--carry RATE``: a steady flow's cycles, see their sections below.

Uses $QUEEN_DATABASE_URL if set (the database must be migrated and disposable: it schedules and
fires timers on queue ``bench.cycle``), else a temporary embedded PostgreSQL.
"""

from __future__ import annotations

import functools
import os
import platform
import time
import uuid

import trio

from bench.harness.pg import measure_on_scratch
from bench.harness.stats import percentile
from queen_trio.db import Database
from queen_trio.timers import rules, store

ROUNDS = 150
IDLE_S = 0.2


SMALL = {"accountId": 42}
COMPRESSED = {"events": [{"type": "booking.held", "bookingId": i} for i in range(20)]}


async def schedule_due(db: Database, tenant_id: int, i: int, payload: object) -> None:
    s = rules.schedule({"delayMs": -10, "payload": payload}, "bench.cycle",
                       f"k{i}-{uuid.uuid4()}", horizon_s=3600, ceiling=1 << 20)
    await db.run_transaction(store.schedule, tenant_id, s, notify_within_ms=0)


async def sweep_cycle(db: Database, tenant_id: int, i: int) -> dict[str, float]:
    await schedule_due(db, tenant_id, i, SMALL)
    t0 = time.perf_counter()
    async with db.connection() as conn:  # as the sweeper: one statement in autocommit
        swept = await conn.run_raw(functools.partial(store.sweep, max_payload=1 << 20),
                                   uuid.uuid4(), "bench", 500, 30_000)
    assert len(swept.fired) == 1 and not swept.rows
    return {"sweep": (time.perf_counter() - t0) * 1000}


async def claim_and_fire_cycle(db: Database, tenant_id: int, i: int) -> dict[str, float]:
    await schedule_due(db, tenant_id, i, COMPRESSED)
    token = uuid.uuid4()
    t0 = time.perf_counter()
    async with db.connection() as conn:
        claimed = await conn.run_raw(functools.partial(store.sweep, max_payload=1 << 20),
                                     token, "bench", 500, 30_000)
    t1 = time.perf_counter()
    assert len(claimed.rows) == 1 and not claimed.fired
    with trio.move_on_after(10, shield=True):
        await db.run_transaction(store.fire, token, claimed.rows, ceilings={}, max_attempts=5,
                                 backoff_ms=1000)
    t2 = time.perf_counter()
    return {"claim": (t1 - t0) * 1000, "fire": (t2 - t1) * 1000}


async def measure(url: str) -> None:
    async with Database(url, max_size=2) as db:
        async with db.connection() as conn:
            tenant_id = await conn.fetchval(
                "SELECT tenant_id FROM queen.tenants WHERE name = 'default'")
            version = await conn.fetchval("SHOW server_version")
        print(f"platform {platform.platform()}, {os.cpu_count()} CPUs, PostgreSQL {version}")
        print(f"{ROUNDS} cycles per mode, one due timer per cycle; milliseconds")
        print(f"{'mode':<14} {'step':<6} {'p50':>7} {'p90':>7} {'p99':>7} {'max':>7}")
        for mode, pause in (("back to back", 0.0), ("after idle", IDLE_S)):
            for cycle in (sweep_cycle, claim_and_fire_cycle):
                steps: dict[str, list[float]] = {}
                for i in range(ROUNDS):
                    if pause:
                        await trio.sleep(pause)
                    for step, ms in (await cycle(db, tenant_id, i)).items():
                        steps.setdefault(step, []).append(ms)
                for step, values in steps.items():
                    ordered = sorted(values)
                    print(f"{mode:<14} {step:<6} " + " ".join(
                        f"{percentile(ordered, p):7.2f}" for p in (50, 90, 99, 100)))




# -- a steady flow through the broker's own Sweeper (``--steady``) -----------------------------
#
# The Sweeper of whichever checkout is on PYTHONPATH, in this process with its own listener and
# pool (no HTTP, no parked pops), fires RATE timers/s due one after the other for SECONDS:
# under a steady flow its cycles come at the MIN_SLEEP floor. Reports this process's CPU (the
# broker's sweeper) and the sweeper backends' CPU per cycle and per timer. With ``--baseline
# DIR`` the same runs, rounds interleaved, on a second database of one temporary server with
# that checkout's code and schema (each side in its own process: this file run by path with
# that side's PYTHONPATH)::
#
#     python -m bench.sweeper_cycle --steady 500 --pg-bin /usr/lib/postgresql/15/bin \
#         --baseline /work/wt/base --rounds 4


def _schedstat_s(pid: int) -> float:
    """CPU time of a process (nanosecond resolution), in seconds."""
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0]) / 1e9


async def steady_side(url: str, rate: int, seconds: float) -> dict[str, float]:
    from queen_trio.config import Settings
    from queen_trio.db import Listener
    from queen_trio.metrics import BrokerMetrics
    from queen_trio.timers.store import NOTIFY_CHANNEL
    from queen_trio.timers.sweeper import Sweeper

    settings = Settings(pop_fire_wait_ms=0)
    n = int(rate * seconds)
    async with Database(url, max_size=2) as setup:
        async with setup.connection() as conn:
            tenant_id = await conn.fetchval(
                "SELECT tenant_id FROM queen.tenants WHERE name = 'default'")
        first = time.time() + 1.0 + n / 5_000
        for b in range(0, n, 500):
            delay0 = first - time.time()
            await setup.run_autocommit(store.schedule_many, tenant_id, [
                rules.schedule({"delayMs": int((delay0 + i / rate) * 1000), "payload": {"i": i}},
                               "bench.steady", f"s{i}", horizon_s=3600, ceiling=1 << 20)
                for i in range(b, min(n, b + 500))], notify_within_ms=None)
        async with setup.connection() as conn:
            await conn.execute("ANALYZE queen.timers")
    async with Database(url, max_size=2, application_name="queen-trio-sweeper") as db, \
            Database(url, max_size=1) as setup_db:
        listener = Listener(url, [NOTIFY_CHANNEL])
        sweeper = Sweeper(db, listener, settings, BrokerMetrics(), lambda _: 1 << 20)
        async with trio.open_nursery() as nursery:
            await nursery.start(listener.run)
            await trio.sleep(max(0.0, first - time.time()))
            await nursery.start(sweeper.run)
            async def backends() -> dict[int, float]:
                # (A connection the pool opens later counts from its start.)
                async with setup_db.connection() as conn:
                    rows = await conn.fetch("SELECT pid FROM pg_stat_activity WHERE "
                                            "application_name = 'queen-trio-sweeper'")
                return {r["pid"]: _schedstat_s(r["pid"]) for r in rows}

            cycles0, fired0 = sweeper.statistics().cycles, sweeper.statistics().fired
            cpu0, pg0, t0 = time.process_time(), await backends(), time.time()
            while (sweeper.statistics().fired < n  # noqa: ASYNC110 - a counter, polled
                   and time.time() < first + seconds + 10):
                await trio.sleep(0.05)
            stats = sweeper.statistics()
            cpu, pg1 = time.process_time() - cpu0, await backends()
            pg = sum(v - pg0.get(pid, 0.0) for pid, v in pg1.items())
            window = time.time() - t0
            nursery.cancel_scope.cancel()
    cycles, fired = stats.cycles - cycles0, stats.fired - fired0
    return {"cycles": cycles, "fired": fired, "window_s": window,
            "broker_us_per_cycle": cpu / cycles * 1e6, "pg_us_per_cycle": pg / cycles * 1e6,
            "broker_us_per_timer": cpu / fired * 1e6, "pg_us_per_timer": pg / fired * 1e6}


def steady_main() -> None:
    import argparse
    import json
    import subprocess
    import sys
    from pathlib import Path

    from bench.harness.pg import installed_server

    parser = argparse.ArgumentParser()
    parser.add_argument("--steady", type=int, required=True, metavar="RATE")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--pg-bin", type=Path, required=True)
    parser.add_argument("--baseline", type=Path, default=None)
    parser.add_argument("--side-url", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side_url:  # one side's round, in its own process
        out = trio.run(steady_side, args.side_url, args.steady, args.seconds)
        print(json.dumps(out))
        return
    here = Path(__file__).resolve().parent.parent
    sides = [("this checkout", here)] + ([("baseline", args.baseline.resolve())]
                                         if args.baseline else [])
    print(f"platform {platform.platform()}, {os.cpu_count()} CPUs, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"steady {args.steady} timers/s for {args.seconds} s through the Sweeper; CPU us")
    totals: dict[str, list[float]] = {name: [0, 0, 0, 0] for name, _ in sides}
    with installed_server(args.pg_bin) as server:
        urls = {}
        for name, checkout in sides:
            urls[name] = server.create_database("steady")
            subprocess.run([sys.executable, "-c", "import sys; from queen_trio.db.migrations "
                            "import apply_migrations; apply_migrations(sys.argv[1])",
                            urls[name]], cwd=checkout,
                           env={**os.environ, "PYTHONPATH": str(checkout)}, check=True)
        for r in range(args.rounds):
            for name, checkout in (sides if r % 2 == 0 else sides[::-1]):
                done = subprocess.run(
                    [sys.executable, str(Path(__file__).resolve()), "--steady",
                     str(args.steady), "--seconds", str(args.seconds), "--pg-bin",
                     str(args.pg_bin), "--side-url", urls[name]],
                    cwd=checkout, env={**os.environ, "PYTHONPATH": str(checkout)},
                    capture_output=True, text=True, check=True)
                out = json.loads(done.stdout.strip().splitlines()[-1])
                t = totals[name]
                t[0] += out["broker_us_per_cycle"] * out["cycles"]
                t[1] += out["pg_us_per_cycle"] * out["cycles"]
                t[2] += out["cycles"]
                t[3] += out["fired"]
                print(f"round {r + 1} {name:<14} {out['cycles']:5d} cycles "
                      f"{out['fired'] / out['cycles']:5.2f} timers/cycle; per cycle broker "
                      f"{out['broker_us_per_cycle']:7.1f} PostgreSQL {out['pg_us_per_cycle']:7.1f}"
                      f"; per timer broker {out['broker_us_per_timer']:6.1f} PostgreSQL "
                      f"{out['pg_us_per_timer']:6.1f}")
    for name, (broker, pg, cycles, fired) in totals.items():
        print(f"all rounds {name:<14} per cycle broker {broker / cycles:7.1f} PostgreSQL "
              f"{pg / cycles:7.1f}; per timer broker {broker / fired:6.1f} PostgreSQL "
              f"{pg / fired:6.1f}")
    print(f"load average at the end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


# -- the statement of a steady cycle with a stream's settlement carried (``--carry``) -----------
#
# Under a steady flow with a streaming consumer every sweeper cycle is one statement,
# queen.sweep_settle_and_pop: the due timers fired, the stream's last batch settled, its next
# batch popped (issue 32). This sends that statement as the sweeper would, without the broker:
# RATE timers/s due one after the other, a cycle every 10 ms (MIN_SLEEP) on one connection,
# each carrying the settlement of the batch the previous one popped, and reports the backend's
# CPU per cycle (/proc schedstat: the statement, its commit and the protocol around it). With
# ``--baseline DIR`` the same runs on a second database of the same temporary server migrated
# by that checkout's schema, rounds interleaved (the statement sent is this checkout's; its
# signature is the same)::
#
#     python -m bench.sweeper_cycle --carry 500 --pg-bin /usr/lib/postgresql/15/bin \
#         --baseline /work/wt/base --rounds 6


def carry_round(url: str, rate: int, seconds: float) -> tuple[int, int, float]:
    """One round: (cycles, timers fired, backend CPU us per cycle)."""
    import psycopg
    from psycopg.rows import dict_row

    from queen_trio.log import store as log_store
    from queen_trio.log.rules import QUEUE_MODE_GROUP, PopRequest

    queue = "bench.carry"
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        tenant = conn.execute(
            "SELECT tenant_id FROM queen.tenants WHERE name = 'default'").fetchone()["tenant_id"]
        pid = conn.execute("SELECT pg_backend_pid() AS pid").fetchone()["pid"]
        n = int(rate * seconds)
        first = time.time() + 1.0 + n / 10_000
        tag = uuid.uuid4().hex[:6]
        for b in range(0, n, 500):
            d0 = first - time.time()
            store.schedule_many(conn, tenant, [
                rules.schedule({"delayMs": int((d0 + i / rate) * 1000), "payload": {"i": i}},
                               queue, f"{tag}{i}", horizon_s=3600, ceiling=1 << 20)
                for i in range(b, min(n, b + 500))], notify_within_ms=0)
        req = PopRequest(queue=queue, partition=None, group=QUEUE_MODE_GROUP, batch=100,
                         wait=False, timeout_ms=0, auto_ack=False)
        lock = store.NextDue(tenant, queue, "Default", 0.0)
        time.sleep(max(0.0, first - time.time()) + 0.05)
        # The first fire and the stream's first (general) pop: its lease and cursor.
        fired = len(store.sweep(conn, uuid.uuid4(), "bench", 500, 30_000,
                                max_payload=1 << 20).fired)
        with conn.transaction():
            batch = log_store.pop(conn, tenant, req).batch
        cpu0, cycles, next_at = _schedstat_s(pid), 0, time.monotonic()
        while fired < n:
            swept = store.sweep(conn, uuid.uuid4(), "bench", 500, 30_000, max_payload=1 << 20,
                                fire_lock=lock, pop=req, settle=batch, drained=True)
            assert swept.settled in (True, None), swept
            fired += len(swept.fired)
            cycles += 1
            batch = swept.popped.batch if swept.popped is not None else None
            next_at += 0.010
            time.sleep(max(0.0, next_at - time.monotonic()))
        cpu = _schedstat_s(pid) - cpu0
        assert conn.execute("SELECT count(*) AS n FROM queen.timers").fetchone()["n"] == 0
        # The next round starts from an empty log and no dead rows.
        conn.execute("TRUNCATE queen.frames")
        conn.execute("UPDATE queen.partitions SET next_offset = 0, log_start = 0")
        conn.execute("DELETE FROM queen.cursors")
        conn.execute("VACUUM")
    return cycles, fired, cpu / cycles * 1e6


def carry_main() -> None:
    import argparse
    import statistics
    import subprocess
    import sys
    from pathlib import Path

    from bench.harness.pg import installed_server
    from queen_trio.db.migrations import apply_migrations

    parser = argparse.ArgumentParser()
    parser.add_argument("--carry", type=int, required=True, metavar="RATE")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--pg-bin", type=Path, required=True)
    parser.add_argument("--baseline", type=Path, default=None)
    args = parser.parse_args()
    print(f"platform {platform.platform()}, {os.cpu_count()} CPUs, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"steady {args.carry} timers/s for {args.seconds} s, queen.sweep_settle_and_pop every "
          "10 ms carrying the last batch's settlement; the backend's CPU per cycle")
    with installed_server(args.pg_bin) as server:
        sides = [("this checkout", server.create_database("carry"))]
        apply_migrations(sides[0][1])
        if args.baseline is not None:
            sides.append(("baseline", server.create_database("carrybase")))
            subprocess.run([sys.executable, "-c", "import sys; from queen_trio.db.migrations "
                            "import apply_migrations; apply_migrations(sys.argv[1])",
                            sides[1][1]], cwd=args.baseline,
                           env={**os.environ, "PYTHONPATH": str(args.baseline)}, check=True)
        for _, url in sides:
            carry_round(url, args.carry, 2.0)  # (warm-up)
        per_cycle: dict[str, list[float]] = {name: [] for name, _ in sides}
        for r in range(args.rounds):
            for name, url in (sides if r % 2 == 0 else sides[::-1]):
                cycles, fired, us = carry_round(url, args.carry, args.seconds)
                per_cycle[name].append(us)
                print(f"round {r + 1} {name:<14} {cycles:5d} cycles {fired / cycles:5.2f} "
                      f"timers/cycle {us:7.1f} us/cycle", flush=True)
    for name, values in per_cycle.items():
        print(f"all rounds {name:<14} median {statistics.median(values):7.1f} us/cycle, range "
              f"{min(values):.1f}-{max(values):.1f}")
    print(f"load average at the end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    import sys as _sys

    if "--steady" in _sys.argv:
        steady_main()
    elif "--carry" in _sys.argv:
        carry_main()
    else:
        measure_on_scratch(measure, "queen-bench-cycle-")

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


if __name__ == "__main__":
    measure_on_scratch(measure, "queen-bench-cycle-")

"""What retention of the unsealed head costs (queen_trio/log/housekeeping.py, ``cut_head``).

Without HTTP, on one PostgreSQL: (1) cutting 20,000 head frames past ``retentionSeconds``, one
transaction per 1,000 frames, beside sealing the same number of frames into segments (what
sealing early and dropping would cost instead); (2) the per-round scan for heads to cut
(``head_cut_candidates``) over 1,000 partitions of retention queues when nothing is due, which
every housekeeping round pays.
"""

from __future__ import annotations

import os
import platform
import time
import uuid
from typing import Any

from bench.harness.pg import measure_on_scratch
from bench.harness.stats import percentile
from queen_trio.db import Database
from queen_trio.log import housekeeping, rules, store
from queen_trio.log.segments import SealPolicy

FRAMES = 20_000
PARTITIONS = 1_000
SEAL_ALL = SealPolicy(max_frames=1000, max_bytes=1 << 30, min_age_ms=0, max_age_ms=0)


def event(i: int) -> dict[str, Any]:
    return {"orderId": f"o-{i}", "customer": f"c-{i % 97}", "amount": i % 1000 / 10,
            "items": [{"sku": f"s-{i % 13}", "qty": 1 + i % 3}], "status": "created"}


def pcts(values: list[float]) -> str:
    ms = sorted(values)
    return (f"p50 {percentile(ms, 50):6.1f} ms  p90 {percentile(ms, 90):6.1f} ms  "
            f"max {max(ms):6.1f} ms")


async def push(db: Database, tenant: int, queue: str, n: int, partition: str = "Default") -> None:
    for start in range(0, n, 500):
        frames = [store.NewFrame(queue, partition, event(i), rules.new_transaction_id())
                  for i in range(start, min(n, start + 500))]
        await db.run_transaction(store.append, tenant, frames)


async def partition_of(db: Database, queue: str) -> uuid.UUID:
    async with db.connection() as conn:
        return await conn.fetchval(
            "SELECT p.partition_id FROM queen.partitions p JOIN queen.queues q USING (queue_id) "
            "WHERE q.name = %s", (queue,))


async def backdate(db: Database, queue: str) -> None:
    async with db.connection() as conn:
        await conn.execute(
            "UPDATE queen.frames f SET created_at = f.created_at - interval '1 hour' "
            "FROM queen.partitions p JOIN queen.queues q USING (queue_id) "
            "WHERE f.partition_id = p.partition_id AND q.name = %s", (queue,))


async def measure(url: str) -> None:
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"platform {platform.platform()}, {os.cpu_count()} CPUs, load average at start {load}")
    async with Database(url, max_size=2) as db:
        async with db.connection() as conn:
            tenant = await conn.fetchval(
                "SELECT tenant_id FROM queen.tenants WHERE name = 'default'")
        tag = uuid.uuid4().hex[:6]
        options = rules.QueueOptions(retention_s=60)

        cut_q, seal_q = f"bench.cut.{tag}", f"bench.seal.{tag}"
        for q in (cut_q, seal_q):
            await db.run_transaction(store.configure, tenant, q, options)
            await push(db, tenant, q, FRAMES)
            await backdate(db, q)

        pid = await partition_of(db, cut_q)
        cut_ms = []
        while True:
            t = time.perf_counter()
            d = await db.run_transaction(housekeeping.cut_head, pid)
            if d is None:
                break
            cut_ms.append((time.perf_counter() - t) * 1000)
        pid = await partition_of(db, seal_q)
        seal_ms = []
        while True:
            t = time.perf_counter()
            s = await db.run_transaction(housekeeping.seal_partition, pid, SEAL_ALL)
            if s is None:
                break
            seal_ms.append((time.perf_counter() - t) * 1000)
        print(f"\n== {FRAMES:,} head frames past retentionSeconds, 1,000 per transaction")
        print(f"cut (delete + log_start): {len(cut_ms)} x  {pcts(cut_ms)}  "
              f"total {sum(cut_ms):7.0f} ms")
        print(f"seal instead:             {len(seal_ms)} x  {pcts(seal_ms)}  "
              f"total {sum(seal_ms):7.0f} ms (then still to drop)")

        scan_q = f"bench.scan.{tag}"
        await db.run_transaction(store.configure, tenant, scan_q, options)
        for i in range(PARTITIONS):
            await push(db, tenant, scan_q, 3, partition=f"p{i}")
        scan_ms = []
        for _ in range(30):
            t = time.perf_counter()
            assert await db.run_transaction(housekeeping.head_cut_candidates) == []
            scan_ms.append((time.perf_counter() - t) * 1000)
        print(f"\n== the round's scan for heads to cut, {PARTITIONS:,} partitions of a retention "
              "queue, none due")
        print(f"head_cut_candidates:      30 x  {pcts(scan_ms)}")
        print(f"load average at end {', '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    measure_on_scratch(measure, "queen-bench-head-retention-")

"""The sweep's floor under a held snapshot (issue 31): an idle sweep's cost, from the floor and
from the beginning of ``timers_visible``, as timers are fired behind a REPEATABLE READ snapshot.

A temporary embedded server; a connection holds the snapshot; rounds of 500 timers due now are
written and fired by one sweep each. Every 50 rounds, 15 idle sweeps (``queen.sweep_timers``,
nothing due) are run under ``EXPLAIN (ANALYZE, BUFFERS)`` each way: "floor" as the broker runs
them, "beginning" with the floor set back to 0 before each (the scan the sweep made before
migration 010). Wall time per sweep (median, min) and shared buffers touched. The firing
sweep of that round is measured too ("firing": its 500 timers fired, frames appended), with the
size of queen.partitions: a fire updates its partition's row (next_offset), and behind the
snapshot every version stays (the log side of a sweep's cost). Run from the
repository root::

    python -m bench.sweep_floor [--rounds 200]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
import uuid
from pathlib import Path

import psycopg
from psycopg.rows import dict_row

from bench.harness.stats import median
from queen_trio.db.migrations import apply_migrations
from queen_trio.embedded import EmbeddedPostgres

WRITE = """
INSERT INTO queen.timers (tenant_id, queue, timer_key, partition, txn, payload, payload_zstd,
                          payload_bytes, deliver_at, visible_at)
SELECT tenant_id, 'q', %s || g, 'Default', 't' || g, '{"a":1}', false, 7, now(), now()
FROM queen.tenants, generate_series(1, 500) AS g WHERE name = 'default'"""
SWEEP = "SELECT count(*) FROM queen.sweep_timers(%s, 'bench', 500, 30000, 1048576, true, NULL)"


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.sweep_floor")
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="queen-bench-floor-"))
    pg = EmbeddedPostgres(root, database="queen")
    try:
        pg.start()
        apply_migrations(pg.url)
        with psycopg.connect(pg.url) as held, \
                psycopg.connect(pg.url, autocommit=True, row_factory=dict_row) as conn:
            held.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            held.execute("SELECT count(*) FROM queen.tenants").fetchone()
            print(f"{'fired':>8}  {'scan from':<10}{'median ms':>10}{'min ms':>8}{'buffers':>9}")
            for rnd in range(args.rounds + 1):
                conn.execute(WRITE, (f"r{rnd}-",))
                if rnd % 50:
                    conn.execute(SWEEP, (uuid.uuid4(),)).fetchone()
                    continue
                t0 = time.perf_counter()
                (plan,) = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + SWEEP,
                                       (uuid.uuid4(),)).fetchone().values()
                ms_firing = (time.perf_counter() - t0) * 1000
                top = plan[0]["Plan"]
                pages = conn.execute("SELECT pg_relation_size('queen.partitions') / 8192 AS n"
                                     ).fetchone()["n"]
                print(f"{(rnd + 1) * 500:>8}  {'firing':<10}{ms_firing:>10.2f}{'':>8}"
                      f"{top['Shared Hit Blocks'] + top['Shared Read Blocks']:>9.0f}"
                      f"  (queen.partitions: {pages} pages)", flush=True)
                for way in ("beginning", "floor"):
                    ms, buffers = [], []
                    for _ in range(15):
                        if way == "beginning":
                            conn.execute("SELECT setval('queen.timer_sweep_floor', 0)")
                        t0 = time.perf_counter()
                        (plan,) = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + SWEEP,
                                               (uuid.uuid4(),)).fetchone().values()
                        ms.append((time.perf_counter() - t0) * 1000)
                        top = plan[0]["Plan"]
                        buffers.append(top["Shared Hit Blocks"] + top["Shared Read Blocks"])
                    print(f"{(rnd + 1) * 500:>8}  {way:<10}{median(ms):>10.2f}"
                          f"{min(ms):>8.2f}{median(buffers):>9.0f}", flush=True)
            held.rollback()
    finally:
        pg.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

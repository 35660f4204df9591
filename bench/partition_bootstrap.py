"""A queue of many partitions, bootstrapped as Queen's JavaScript client's bootstrap tests do,
through the SDK: this checkout beside a baseline checkout, rounds interleaved (issue 32:
"5,000 partitions should take seconds, not minutes").

Each round, on each side (a broker subprocess of that checkout, on its own database of one
shared PostgreSQL server, driven by a client subprocess importing that checkout's SDK):

- ``push``: one message into each of ``--partitions`` new partitions, ``--concurrency`` pushes
  at once (50, as the JS test): wall time and per-push latency;
- ``queue drain``: ``consume()`` in queue mode, batch 1, 10 workers, until idle: wall time;
- ``group drain``: the same messages again through a consumer group's first pass
  (``consume(group=...)``), as the JS test's group does: wall time.

``python -m bench.partition_bootstrap --baseline /work/main [--partitions 5000] [--rounds 1]``;
the table goes to stdout and the numbers to ``bench/results/partition_bootstrap.json``.

``--pop-scan 100,1000,5000,20000``: instead, what one pop costs by the number of partitions of
its queue (issue 30: the pop's choice of partition). For each count, on each side (a database
migrated by that checkout, driven in a subprocess importing it, no broker): a queue of that many
partitions, a consumer group registered by a first pop, then rounds of one message pushed into
each of ``--with-data`` partitions and popped one at a time (``queen.pop_head``, autoAck, as
a consumer that keeps up), plus one pop finding nothing. Latency of the pops that found a
message, of the empty ones, and the shared buffers one of each touches (EXPLAIN (ANALYZE,
BUFFERS) of the pop). Numbers to ``bench/results/pop_scan.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.harness.brokers import free_port, serve_checkout, wait_healthy
from bench.harness.pg import shared_server
from bench.harness.report import load, now_iso, save_json, source_revision
from bench.harness.stats import distribution

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results" / "partition_bootstrap.json"
SCAN_RESULTS = REPO / "bench" / "results" / "pop_scan.json"
IDLE_S = 5  # seconds: a drain ends after this long without a message (counted out of its time)


async def _client(url: str, args: dict[str, Any]) -> dict[str, Any]:
    import trio

    import queen_trio

    queue, n, c = f"boot-{args['tag']}", args["partitions"], args["concurrency"]
    out: dict[str, Any] = {}
    async with queen_trio.Client(url) as q:
        samples: list[float] = []

        async def one(j: int) -> None:
            t = time.perf_counter()
            await q.push(queue, {"id": j}, partition=f"p-{j}")
            samples.append(time.perf_counter() - t)

        t0 = time.perf_counter()
        for i in range(0, n, c):  # as the JS bootstrap test: groups of c at once
            async with trio.open_nursery() as nursery:
                for j in range(i, min(i + c, n)):
                    nursery.start_soon(one, j)
        wall = time.perf_counter() - t0
        out["push"] = {"wall_s": round(wall, 2), "per_s": round(n / wall), **distribution(samples)}
        for phase, group in (("queue_drain", None), ("group_drain", "boot-group")):
            t0 = time.perf_counter()
            stats = await q.consume(queue, lambda m: None, group=group, concurrency=10, batch=1,
                                    idle_timeout=f"{IDLE_S}s")
            wall = time.perf_counter() - t0 - IDLE_S
            out[phase] = {"wall_s": round(wall, 2), "handled": stats.handled,
                          "per_s": round(stats.handled / wall) if wall > 0 else None}
    return out


def _scan_child(url: str, args: dict[str, Any]) -> dict[str, Any]:
    """One side of ``--pop-scan``, in this process (it imports the checkout's queen_trio)."""
    import uuid

    import psycopg
    from psycopg.rows import dict_row

    from queen_trio.db.migrations import apply_migrations
    from queen_trio.log import store
    from queen_trio.log.rules import PopRequest

    apply_migrations(url)
    out: dict[str, Any] = {}
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        tenant = conn.execute("SELECT tenant_id FROM queen.tenants WHERE name = 'default'"
                              ).fetchone()["tenant_id"]
        for n in args["counts"]:
            queue = f"scan-{n}"
            names = [f"p-{i}" for i in range(n)]
            with conn.transaction():
                conn.execute("SELECT * FROM queen.take_partitions(%s, %s, %s)",
                             (tenant, [queue] * n, names))
            req = PopRequest(queue=queue, partition=None, group="scan", batch=1, wait=False,
                             timeout_ms=0, auto_ack=True)
            # Data in a spread of partitions: every (n // k)-th.
            step = max(1, n // args["with_data"])
            busy = names[::step][:args["with_data"]]

            def fill(queue: str = queue, busy: list[str] = busy) -> None:
                with conn.transaction():
                    store.append(conn, tenant, [store.NewFrame(queue, name, {"n": 1},
                                                               f"t-{uuid.uuid4()}")
                                                for name in busy])

            fill()
            with conn.transaction():  # the group's first pop: registers / seeds it
                store.pop(conn, tenant, req)
            while store.pop_head(conn, tenant, req) is None:  # (drain what fell back)
                with conn.transaction():
                    store.pop(conn, tenant, req)
            hit: list[float] = []
            empty: list[float] = []
            for _ in range(args["rounds"]):
                fill()
                while True:
                    t = time.perf_counter()
                    outcome = store.pop_head(conn, tenant, req)
                    took = time.perf_counter() - t
                    if outcome is None:
                        with conn.transaction():
                            store.pop(conn, tenant, req)
                        continue
                    if outcome.batch is None:
                        empty.append(took)
                        break
                    hit.append(took)
            fill()
            sql = ("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "
                   "SELECT * FROM queen.pop_head(%s, %s, 'scan', NULL, 1, true)")
            plans = [conn.execute(sql, (tenant, queue)).fetchone() for _ in range(2)]
            while (o := store.pop_head(conn, tenant, req)) is not None and o.batch is not None:
                pass
            plans.append(conn.execute(sql, (tenant, queue)).fetchone())

            def buffers(row: Any) -> int:
                plan = next(iter(row.values()))[0]["Plan"]
                return int(plan.get("Shared Hit Blocks", 0) + plan.get("Shared Read Blocks", 0))

            out[str(n)] = {"pop_ms": distribution(hit), "empty_ms": distribution(empty),
                           "pop_buffers": buffers(plans[0]), "empty_buffers": buffers(plans[2])}
    return out


def scan_main(opts: argparse.Namespace, sides: dict[str, Path]) -> None:
    counts = [int(c) for c in opts.pop_scan.split(",")]
    report: dict[str, Any] = {"when": now_iso(), "revision": source_revision(),
                              "baseline": str(opts.baseline), "counts": counts,
                              "with_data": opts.with_data, "load_start": load(), "runs": []}
    with shared_server(opts.admin_url) as server:
        for r in range(opts.rounds):
            order = list(sides) if r % 2 == 0 else list(reversed(sides))
            for side in order:
                with server.database(f"scan_{side}_{r}") as db:
                    env = {**os.environ, "PYTHONPATH": str(sides[side])}
                    args = {"counts": counts, "with_data": opts.with_data, "rounds": 20}
                    done = subprocess.run(
                        [sys.executable, __file__, "--scan-child", db, json.dumps(args)],
                        cwd=sides[side], env=env, capture_output=True, text=True,
                        timeout=3600, check=False)
                    if done.returncode != 0:
                        raise RuntimeError(f"scan failed:\n{done.stderr[-3000:]}")
                    row = {"round": r, "side": side, "load": load(),
                           "by_partitions": json.loads(done.stdout.strip().splitlines()[-1])}
                report["runs"].append(row)
                for n, m in row["by_partitions"].items():
                    print(f"{side:8} {n:>6} partitions: pop p50 {m['pop_ms']['p50']} "
                          f"p90 {m['pop_ms']['p90']} max {m['pop_ms']['max']} ms, "
                          f"{m['pop_buffers']} buffers; empty p50 {m['empty_ms']['p50']} ms, "
                          f"{m['empty_buffers']} buffers", flush=True)
    report["load_end"] = load()
    save_json(SCAN_RESULTS, report)
    print(f"load {report['load_start']} -> {report['load_end']}; saved {SCAN_RESULTS}")


def child_main(url: str, args: str) -> None:
    import trio

    print(json.dumps(trio.run(_client, url, json.loads(args))), flush=True)


def run_client(checkout: Path, url: str, args: dict[str, Any]) -> dict[str, Any]:
    """This script as a client of ``url``, importing ``checkout``'s SDK."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    done = subprocess.run(
        [sys.executable, __file__, "--child", url, json.dumps(args)],
        cwd=checkout, env=env, capture_output=True, text=True, timeout=3600, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"client failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@contextlib.contextmanager
def checkout_broker(checkout: Path, database_url: str) -> Iterator[str]:
    """A broker of ``checkout`` on ``database_url``, healthy; stopped on the way out."""
    port = free_port()
    proc = serve_checkout(checkout, database_url, port)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, None)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.partition_bootstrap",
                                     description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, default=None,
                        help="checkout to compare with (none: this checkout only)")
    parser.add_argument("--partitions", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--admin-url", default=os.environ.get("QUEEN_DATABASE_URL"))
    parser.add_argument("--pop-scan", default=None, metavar="COUNTS",
                        help="measure one pop's cost at these partition counts (e.g. "
                             "100,1000,5000,20000) instead of the bootstrap")
    parser.add_argument("--with-data", type=int, default=10,
                        help="--pop-scan: partitions holding a message each round")
    opts = parser.parse_args(argv)
    sides = {"this": REPO}
    if opts.baseline is not None:
        sides["baseline"] = opts.baseline.resolve()
    if opts.pop_scan:
        scan_main(opts, sides)
        return
    report: dict[str, Any] = {"when": now_iso(), "revision": source_revision(),
                              "baseline": str(opts.baseline), "partitions": opts.partitions,
                              "load_start": load(), "rounds": []}
    with shared_server(opts.admin_url) as server:
        for r in range(opts.rounds):
            order = list(sides) if r % 2 == 0 else list(reversed(sides))
            for side in order:
                with server.database(f"boot_{side}_{r}") as db, \
                        checkout_broker(sides[side], db) as url:
                    args = {"tag": f"{side}{r}", "partitions": opts.partitions,
                            "concurrency": opts.concurrency}
                    row = {"round": r, "side": side, "load": load(),
                           **run_client(sides[side], url, args)}
                report["rounds"].append(row)
                print(json.dumps(row), flush=True)
    report["load_end"] = load()
    save_json(RESULTS, report)
    print(f"load {report['load_start']} -> {report['load_end']}; saved {RESULTS}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child_main(*sys.argv[2:])
    elif sys.argv[1:2] == ["--scan-child"]:
        print(json.dumps(_scan_child(sys.argv[2], json.loads(sys.argv[3]))), flush=True)
    else:
        main()

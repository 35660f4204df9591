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

``--pop-scan 50,500,2000,5000``: instead, what one pop of a consumer group costs by the number
of partitions of the queue, every one holding messages and the group's cursors created (its
first pop did): the shared buffers the one-statement pop touches (EXPLAIN (ANALYZE, BUFFERS)
of ``queen.pop_head``, the median of 20, each taking a lease as a pop does) and the wall time
of 200 HTTP pops with their acks (as many as partitions, when fewer), one after the other
(p50/p90). Numbers to ``bench/results/pop_scan.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.harness.brokers import free_port, serve_checkout, stop_process, wait_healthy
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
            handled_at: list[float] = []
            t0 = time.perf_counter()
            stats = await q.consume(queue, functools.partial(_handled, handled_at),
                                    group=group, concurrency=10, batch=1,
                                    idle_timeout=f"{IDLE_S}s")
            wall = time.perf_counter() - t0 - IDLE_S
            handled_at.sort()
            # The longest wait between two handled messages, and when it began: a drain far
            # slower than its others shows here whether it stalled or just went slowly.
            gap, gap_at = max(((b - a, a - t0) for a, b in itertools.pairwise(handled_at)),
                              default=(0.0, 0.0))
            out[phase] = {"wall_s": round(wall, 2), "handled": stats.handled,
                          "per_s": round(stats.handled / wall) if wall > 0 else None,
                          "longest_gap_s": round(gap, 3), "longest_gap_at_s": round(gap_at, 2)}
    return out


def _handled(handled_at: list[float], message: Any) -> None:
    handled_at.append(time.perf_counter())


def _scan(url: str, database_url: str, partitions: int) -> dict[str, Any]:
    """One side of ``--pop-scan`` at one partition count (any checkout's broker at ``url``)."""
    import httpx
    import psycopg

    queue, group = f"scan-{partitions}", "scan-group"
    api = f"{url}/api/v1"
    with httpx.Client(timeout=120) as http:
        for _ in range(3):  # three messages in each partition, one push each round
            r = http.post(f"{api}/push", json={"items": [
                {"queue": queue, "partition": f"p-{i:05d}", "payload": {"i": i}}
                for i in range(partitions)]})
            r.raise_for_status()
        first = http.get(f"{api}/pop/queue/{queue}",
                         params={"consumerGroup": group, "batch": 1, "wait": "false"})
        first.raise_for_status()  # the group's first pop: its cursors on every partition
        with psycopg.connect(database_url, autocommit=True) as conn:
            [tenant] = conn.execute("SELECT tenant_id FROM queen.tenants WHERE name = 'default'"
                                    ).fetchone() or (1,)
            buffers = []
            for _ in range(21):
                [plan] = conn.execute(
                    "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "
                    "SELECT * FROM queen.pop_head(%s, %s, %s, NULL, 1, false, NULL)",
                    (tenant, queue, group)).fetchone() or ([],)
                node = (json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"]
                buffers.append(node.get("Shared Hit Blocks", 0) + node.get("Shared Read Blocks", 0))
        samples = []
        for _ in range(min(200, partitions)):  # (fewer than the messages not leased above)
            t = time.perf_counter()
            r = http.get(f"{api}/pop/queue/{queue}",
                         params={"consumerGroup": group, "batch": 1, "wait": "false"})
            r.raise_for_status()
            [m] = r.json()["messages"]
            http.post(f"{api}/ack/batch", json={"acknowledgments": [
                {"transactionId": m["transactionId"], "partitionId": m["partitionId"],
                 "leaseId": m["leaseId"], "consumerGroup": group, "status": "completed"}]}
                      ).raise_for_status()
            samples.append(time.perf_counter() - t)
    return {"partitions": partitions, "buffers_per_pop": sorted(buffers[1:])[len(buffers) // 2],
            "pop_ack": distribution(samples)}


def scan_main(opts: argparse.Namespace, sides: dict[str, Path]) -> None:
    counts = [int(c) for c in opts.pop_scan.split(",")]
    report: dict[str, Any] = {"when": now_iso(), "revision": source_revision(),
                              "baseline": str(opts.baseline), "load_start": load(), "rows": []}
    with shared_server(opts.admin_url) as server:
        for n in counts:
            for side in sides:
                with server.database(f"scan_{side}_{n}") as db, \
                        checkout_broker(sides[side], db) as url:
                    row = {"side": side, "load": load(), **_scan(url, db, n)}
                report["rows"].append(row)
                print(json.dumps(row), flush=True)
    report["load_end"] = load()
    out = opts.out or SCAN_RESULTS
    save_json(out, report)
    print(f"load {report['load_start']} -> {report['load_end']}; saved {out}")


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
    # What the SDK warned of (a stream that fell silent, a refused settlement): the last few
    # lines, kept with the round's numbers.
    warnings = [line for line in done.stderr.splitlines() if line.strip()]
    if warnings:
        result["client_warnings"] = warnings[-20:]
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
        stop_process(proc)


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
                        help="pop cost by partition count (comma-separated counts) instead")
    parser.add_argument("--out", type=Path, default=None,
                        help="where the JSON goes (default: bench/results/<mode>.json)")
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
    out = opts.out or RESULTS
    save_json(out, report)
    print(f"load {report['load_start']} -> {report['load_end']}; saved {out}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child_main(*sys.argv[2:])
    else:
        main()

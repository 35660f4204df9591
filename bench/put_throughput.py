"""Single-timer PUT throughput: ``wrk`` against one broker process, then against QUEEN_WORKERS.

The timer issue's target is 1,000 single ``PUT /api/v1/timers/{queue}/{key}`` per second from
32 concurrent clients. Python HTTP clients cannot generate that load on this 2-core machine
without taking the CPU the broker needs (``bench.timer_lag``'s PUT row is client-bound), so
this bench drives the broker with ``wrk`` (C, a Lua script giving every request its own key,
``delayMs`` one hour so nothing fires). For each QUEEN_WORKERS value, each round: a fresh
database, a broker (``queen-trio serve``), a 2 s warm-up, then ``--seconds`` of load. Reported:
requests/s, wrk's latency distribution, CPU per party (broker processes, PostgreSQL, the rest:
wrk and the kernel) and per request, and an integrity check: the timers in the database match
the 200 answers (a request cut off by the end of the run may be in the database unanswered).

    python -m bench.put_throughput                 # workers 1 and 2, 3 rounds of 10 s
    python -m bench.put_throughput --workers 1 2 4 --rounds 5 --connections 64

Needs ``wrk`` on PATH. Writes bench/results/put_throughput.{txt,json}.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg

from bench.harness.brokers import brokers
from bench.harness.cpu import PartyCpu
from bench.harness.pg import shared_server
from bench.harness.report import source_revision
from bench.harness.stats import median

RESULTS = Path(__file__).resolve().parent / "results"
TARGET_PUT_RATE = 1_000.0
DELAY_MS = 3_600_000
WARMUP_S = 2

LUA = r"""
-- Every request its own timer key: the run's queue and tag (wrk -- <queue> <tag>), thread id
-- and a counter.
local counter, queue, tag = 0, "put", "x"
local threads = {}
id = 0  -- a global: setup() gives each thread its own
setup = function(thread)
  thread:set("id", #threads)
  table.insert(threads, thread)
end
init = function(args)
  queue, tag = args[1], args[2]
end
request = function()
  counter = counter + 1
  local path = "/api/v1/timers/" .. queue .. "/" .. tag .. "-" .. id .. "-" .. counter
  return wrk.format("PUT", path, {["Content-Type"] = "application/json"},
    '{"delayMs": DELAY_MS, "payload": {"kind": "reminder", "n": ' .. counter .. '}}')
end
""".replace("DELAY_MS", str(DELAY_MS))

_UNIT_MS = {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60_000.0}


def parse_wrk(text: str) -> dict[str, Any]:
    """requests, seconds, req/s, non-2xx, socket errors and latency percentiles (ms)."""
    def duration(value: str) -> float:
        m = re.fullmatch(r"([\d.]+)(us|ms|s|m)", value)
        if m is None:
            raise ValueError(f"not a wrk duration: {value!r}")
        return float(m.group(1)) * _UNIT_MS[m.group(2)]

    done = re.search(r"(\d+) requests in ([\d.]+)(\w+),", text)
    if done is None:
        raise ValueError("no 'N requests in' line in wrk's output")
    out: dict[str, Any] = {
        "requests": int(done.group(1)),
        "seconds": duration(done.group(2) + done.group(3)) / 1000,
        "non_2xx": int(m.group(1)) if (m := re.search(r"Non-2xx or 3xx responses: (\d+)",
                                                       text)) else 0,
        "socket_errors": 0,
    }
    if m := re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)",
                      text):
        out["socket_errors"] = sum(int(x) for x in m.groups())
    out["rate"] = round(out["requests"] / out["seconds"], 1)
    latency = {}
    for pct, value in re.findall(r"^\s+(50|75|90|99)%\s+(\S+)$", text, re.M):
        latency[f"p{pct}"] = round(duration(value), 2)
    if m := re.search(r"Latency\s+\S+\s+\S+\s+(\S+)", text):
        latency["max"] = round(duration(m.group(1)), 2)
    out["latency_ms"] = latency
    return out


def wrk(url: str, script: Path, queue: str, seconds: int, connections: int) -> dict[str, Any]:
    proc = subprocess.run(
        ["wrk", "-t2", f"-c{connections}", f"-d{seconds}s", "--latency", "-s", str(script),
         url, "--", queue, uuid.uuid4().hex[:8]],
        capture_output=True, text=True, timeout=seconds + 60, check=True)
    return parse_wrk(proc.stdout)


def timers_in(database_url: str, queue: str) -> int:
    with psycopg.connect(database_url) as conn:
        return conn.execute("SELECT count(*) FROM queen.timers WHERE queue = %s",
                            (queue,)).fetchone()[0]


def one_round(server: Any, workers: int, script: Path, args: argparse.Namespace
              ) -> dict[str, Any]:
    with server.database("put_bench") as url, \
            brokers(url, 1, env={"QUEEN_WORKERS": str(workers)}) as (broker,):
        queue = f"put-{uuid.uuid4().hex[:8]}"
        warm = wrk(broker.url, script, queue, WARMUP_S, args.connections)
        assert broker.pid is not None
        cpu = PartyCpu([broker.pid], server.postmaster_pid)
        before, t0 = cpu.snapshot(), time.perf_counter()
        run = wrk(broker.url, script, queue, args.seconds, args.connections)
        cores = PartyCpu.cores(before, cpu.snapshot(), time.perf_counter() - t0)
        answered = (warm["requests"] - warm["non_2xx"]) + (run["requests"] - run["non_2xx"])
        stored = timers_in(url, queue)
    per_request = {k: round(1000 * v / run["rate"], 3) for k, v in cores.items()
                   if k != "client" and run["rate"]}
    return {**run, "cpu_cores": cores, "cpu_ms_per_request": per_request,
            "answered_200": answered, "timers_stored": stored,
            # a request wrk cut off at the end may have been stored without its answer read
            "integrity_ok": run["non_2xx"] == 0 and warm["non_2xx"] == 0
            and answered <= stored <= answered + 2 * args.connections}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--admin-url", help="an existing server (default: a temporary embedded)")
    args = parser.parse_args(argv)
    if shutil.which("wrk") is None:
        print("bench.put_throughput needs wrk on PATH (apt install wrk)", file=sys.stderr)
        return 2
    command = "python -m bench.put_throughput " + " ".join(argv or sys.argv[1:])
    script = Path(tempfile.mkdtemp(prefix="queen-put-")) / "put.lua"
    script.write_text(LUA)
    rows: dict[int, list[dict[str, Any]]] = {w: [] for w in args.workers}
    with shared_server(args.admin_url) as server:
        header = {"command": command.strip(), "checkout": source_revision(),
                  "platform": platform.platform(), "python": platform.python_version(),
                  "postgresql": server.settings(), "server": server.description,
                  "connections": args.connections, "seconds": args.seconds,
                  "delay_ms": DELAY_MS}
        for r in range(args.rounds):  # interleaved, so a noisy minute hits every setting
            for w in args.workers:
                row = one_round(server, w, script, args)
                rows[w].append(row)
                print(f"[put_throughput] round {r + 1} workers {w}: {row['rate']:,.0f} PUT/s, "
                      f"p50 {row['latency_ms'].get('p50')} ms, CPU {row['cpu_cores']}, "
                      f"integrity {'ok' if row['integrity_ok'] else 'FAILED'}", flush=True)
    summary = {w: {"median_rate": median(r["rate"] for r in rs),
                   "rates": [r["rate"] for r in rs]} for w, rs in rows.items()}
    results = {**header, "rounds": {str(w): rs for w, rs in rows.items()},
               "summary": {str(w): s for w, s in summary.items()}}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "put_throughput.json").write_text(json.dumps(results, indent=1) + "\n")
    text = report(header, rows, summary)
    (RESULTS / "put_throughput.txt").write_text(text)
    print(text)
    return 0 if all(r["integrity_ok"] for rs in rows.values() for r in rs) else 1


def report(header: dict[str, Any], rows: dict[int, list[dict[str, Any]]],
           summary: dict[int, dict[str, Any]]) -> str:
    lines = ["queen-trio single-timer PUT throughput (wrk)"]
    lines += [f"  {k:<12} {v}" for k, v in header.items()]
    lines.append("")
    lines.append("  workers  round   PUT/s   latency ms p50    p90    p99     max   "
                 "CPU cores broker/pg/other   CPU ms per PUT broker/pg   stored/answered")
    for w, rs in rows.items():
        for i, r in enumerate(rs, 1):
            lat, c, per = r["latency_ms"], r["cpu_cores"], r["cpu_ms_per_request"]
            lines.append(
                f"  {w:>7}  {i:>5}  {r['rate']:>6,.0f}   {lat.get('p50', 0):>14.1f} "
                f"{lat.get('p90', 0):>6.1f} {lat.get('p99', 0):>6.1f} {lat.get('max', 0):>7.1f}"
                f"   {c.get('broker', 0):.2f}/{c.get('postgres', 0):.2f}/{c.get('other', 0):.2f}"
                f"{'':>17}{per.get('broker', 0):.3f}/{per.get('postgres', 0):.3f}"
                f"{'':>13}{r['timers_stored']}/{r['answered_200']}"
                f"{'' if r['integrity_ok'] else '  INTEGRITY FAILED'}")
    lines.append("")
    base = summary.get(1, {}).get("median_rate")
    for w, s in summary.items():
        ratio = f", {s['median_rate'] / base:.2f}x one worker" if base and w != 1 else ""
        verdict = "PASS" if s["median_rate"] >= TARGET_PUT_RATE else "FAIL"
        lines.append(f"  workers {w}: median {s['median_rate']:,.0f} PUT/s over "
                     f"{len(s['rates'])} rounds {s['rates']}{ratio}; target >= "
                     f"{TARGET_PUT_RATE:,.0f}: {verdict}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())

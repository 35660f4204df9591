"""What one schedule call costs the broker and PostgreSQL, per call and per timer: Queen's batch
route (``POST /api/v1/timers``) against transaction bundles (``POST /api/v1/transaction`` with a
``timers`` array), at the same sizes and at each route's own size (256 and 500 timers).

One broker on its own embedded PostgreSQL; one client sending calls back to back (bodies built
before the clock starts); CPU read from /proc (broker process, PostgreSQL below it). The rows
alternate, ``--rounds`` times, so that each pair ran under much the same load. A row of 1-timer
calls gives the fixed cost of a call; the rest, divided by the timers, is the cost of a timer.

    python -m bench.timer_call_cost [--rounds 2] [--timers 10240]
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import httpx

from bench.harness.brokers import broker_process
from bench.harness.cpu import CpuMeter
from bench.harness.report import load
from bench.harness.timers import FAR_DELAY_MS, timer_ops

ROWS = (("batch", 1), ("bundle", 1), ("batch", 256), ("bundle", 256), ("bundle", 500))
ONE_TIMER_CALLS = 200


def bodies(kind: str, size: int, calls: int, tag: str) -> list[bytes]:
    out = []
    for c in range(calls):
        ops = timer_ops("cost", [(f"{tag}-{c:05d}-{i:04d}", FAR_DELAY_MS, {"i": i})
                                 for i in range(size)])
        out.append(json.dumps({"operations": ops} if kind == "batch"
                              else {"operations": [], "timers": ops}).encode())
    return out


def row(client: httpx.Client, meter: CpuMeter, kind: str, size: int, calls: int, tag: str
        ) -> dict[str, Any]:
    path = "/api/v1/timers" if kind == "batch" else "/api/v1/transaction"
    sent = bodies(kind, size, calls, tag)
    before, t0 = meter.snapshot(), time.monotonic()
    for body in sent:
        answer = client.post(path, content=body)
        if answer.status_code != 200 or '"ok":false' in answer.text:
            raise SystemExit(f"{kind} {size}: {answer.status_code} {answer.text[:300]}")
    wall, after = time.monotonic() - t0, meter.snapshot()
    timers = size * calls
    broker, pg = after["broker"] - before["broker"], after["postgres"] - before["postgres"]
    return {"kind": kind, "size": size, "calls": calls, "timers_per_s": round(timers / wall),
            "broker_ms_per_call": round(broker * 1e3 / calls, 2),
            "pg_ms_per_call": round(pg * 1e3 / calls, 2),
            "broker_us_per_timer": round(broker * 1e6 / timers, 1),
            "pg_us_per_timer": round(pg * 1e6 / timers, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--timers", type=int, default=10240, help="timers per row (about)")
    args = parser.parse_args()
    with broker_process(None) as broker, httpx.Client(
            base_url=broker.url, timeout=60, headers={"content-type": "application/json"}
    ) as client:
        meter = CpuMeter(broker.pid)
        for kind, size in ROWS:  # warm-up: connections, prepared statements
            row(client, meter, kind, size, 3, f"w-{kind}-{size}")
        print(f"load avg {load()}")
        print(f"{'route':8} {'size':>5} {'calls':>5} {'timers/s':>9} {'broker ms/call':>15} "
              f"{'pg ms/call':>11} {'broker us/timer':>16} {'pg us/timer':>12}")
        for r in range(args.rounds):
            for kind, size in ROWS:
                calls = ONE_TIMER_CALLS if size == 1 else max(1, args.timers // size)
                x = row(client, meter, kind, size, calls, f"r{r}-{kind}-{size}")
                print(f"{kind:8} {size:5} {calls:5} {x['timers_per_s']:9} "
                      f"{x['broker_ms_per_call']:15} {x['pg_ms_per_call']:11} "
                      f"{x['broker_us_per_timer']:16} {x['pg_us_per_timer']:12}")
        print(f"load avg {load()}")


if __name__ == "__main__":
    main()

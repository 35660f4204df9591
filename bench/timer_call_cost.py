"""What one schedule call costs the broker and PostgreSQL, per call and per timer: Queen's batch
route (``POST /api/v1/timers``) against transaction bundles (``POST /api/v1/transaction`` with a
``timers`` array), at the same sizes and at each route's own size (256 and 500 timers).

One broker on its own embedded PostgreSQL; one client sending calls back to back (bodies built
before the clock starts); CPU read from /proc (broker process, PostgreSQL below it). The rows
alternate, ``--rounds`` times, so that each pair ran under much the same load. A row of 1-timer
calls gives the fixed cost of a call; the rest, divided by the timers, is the cost of a timer.

Single calls as well, each one request: ``put`` (PUT of one timer), ``cancel`` (DELETE of a
pending timer, the ones the ``batch 1`` row made), ``absent`` (DELETE of no timer), ``peek``
(GET of one) and ``list`` (GET of a page of 100). With ``--against PATH`` a second broker runs
that checkout's code (say /work/main) on its own embedded PostgreSQL, and every row runs on
both, one after the other, so that the two columns saw the same load.

    python -m bench.timer_call_cost [--rounds 2] [--timers 10240] [--against /work/main]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from pathlib import Path
from typing import Any

import httpx

from bench.harness.brokers import broker_process
from bench.harness.cpu import CpuMeter
from bench.harness.report import load
from bench.harness.timers import FAR_DELAY_MS, timer_ops

ROWS = (("batch", 1), ("bundle", 1), ("put", 1), ("cancel", 1), ("absent", 1), ("peek", 1),
        ("list", 1), ("batch", 256), ("bundle", 256), ("bundle", 500))
ONE_TIMER_CALLS = 200
LIST_PAGE = 100
IDLE_S = 5.0


def bodies(kind: str, size: int, calls: int, tag: str) -> list[bytes]:
    out = []
    for c in range(calls):
        ops = timer_ops("cost", [(f"{tag}-{c:05d}-{i:04d}", FAR_DELAY_MS, {"i": i})
                                 for i in range(size)])
        out.append(json.dumps({"operations": ops} if kind == "batch"
                              else {"operations": [], "timers": ops}).encode())
    return out


def requests(kind: str, size: int, calls: int, prefix: str
             ) -> list[tuple[str, str, bytes | None]]:
    """(method, path, body) of each call. A cancel row cancels the timers of the round's
    ``batch 1`` row, a peek row reads those of its ``bundle 1`` row."""
    tag = f"{prefix}-{kind}-{size}"
    if kind in ("batch", "bundle"):
        path = "/api/v1/timers" if kind == "batch" else "/api/v1/transaction"
        return [("POST", path, body) for body in bodies(kind, size, calls, tag)]
    if kind == "put":
        return [("PUT", f"/api/v1/timers/cost/{tag}-{c:05d}",
                 json.dumps({"payload": {"i": c}, "delayMs": FAR_DELAY_MS}).encode())
                for c in range(calls)]
    if kind in ("cancel", "peek"):
        method, made = ("DELETE", "batch-1") if kind == "cancel" else ("GET", "bundle-1")
        return [(method, f"/api/v1/timers/cost/{prefix}-{made}-{c:05d}-0000", None)
                for c in range(calls)]
    if kind == "absent":
        return [("DELETE", f"/api/v1/timers/cost/{tag}-none-{c:05d}", None)
                for c in range(calls)]
    assert kind == "list"
    return [("GET", f"/api/v1/timers/cost?limit={LIST_PAGE}", None)] * calls


def expected(kind: str, text: str) -> bool:
    if kind == "cancel":
        return '"cancelled"' in text
    if kind == "absent":
        return '"absent"' in text
    if kind == "peek":
        return '"found":true' in text
    return '"ok":false' not in text


def row(client: httpx.Client, meter: CpuMeter, kind: str, size: int, calls: int, prefix: str
        ) -> dict[str, Any]:
    sent = requests(kind, size, calls, prefix)
    before, t0 = meter.snapshot(), time.monotonic()
    for method, path, body in sent:
        answer = client.request(method, path, content=body)
        if answer.status_code != 200 or not expected(kind, answer.text):
            raise SystemExit(f"{kind} {size}: {answer.status_code} {answer.text[:300]}")
    wall, after = time.monotonic() - t0, meter.snapshot()
    timers = size * calls
    broker, pg = after["broker"] - before["broker"], after["postgres"] - before["postgres"]
    return {"kind": kind, "size": size, "calls": calls, "timers_per_s": round(timers / wall),
            "wall_ms_per_call": wall * 1e3 / calls,
            "broker_ms_per_call": round(broker * 1e3 / calls, 2),
            "pg_ms_per_call": round(pg * 1e3 / calls, 2),
            "broker_us_per_timer": round(broker * 1e6 / timers, 1),
            "pg_us_per_timer": round(pg * 1e6 / timers, 1)}


def idle_pg_rate(meter: CpuMeter, seconds: float = IDLE_S) -> float:
    """PostgreSQL CPU seconds per second while the broker is idle (its sweeper, its pollers):
    what a call is charged for merely lasting, which a loaded machine stretches."""
    before, t0 = meter.snapshot(), time.monotonic()
    time.sleep(seconds)
    return (meter.snapshot()["postgres"] - before["postgres"]) / (time.monotonic() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--timers", type=int, default=10240, help="timers per row (about)")
    parser.add_argument("--against", type=Path, default=None,
                        help="a baseline checkout (e.g. /work/main) run side by side")
    args = parser.parse_args()
    sides: list[tuple[str, Path | None]] = [("this", None)]
    if args.against is not None:
        sides.append(("base", args.against.resolve()))
    with contextlib.ExitStack() as stack:
        runs = []
        for name, checkout in sides:
            broker = stack.enter_context(broker_process(None, checkout=checkout))
            client = stack.enter_context(httpx.Client(
                base_url=broker.url, timeout=60, headers={"content-type": "application/json"}))
            runs.append((name, client, CpuMeter(broker.pid)))
        for _, client, meter in runs:  # warm-up: connections, prepared statements
            for kind, size in ROWS:
                row(client, meter, kind, size, 6, "w")
        idle = [idle_pg_rate(meter) for _, _, meter in runs]
        rates = ", ".join(f"{name} {rate * 1e3:.1f}"
                          for (name, _, _), rate in zip(runs, idle, strict=True))
        print(f"load avg {load()}; idle PostgreSQL CPU (ms/s): {rates}")
        print("(net: PostgreSQL CPU less the idle rate times the call's wall time)")
        print(f"{'side':5} {'route':8} {'size':>5} {'calls':>5} {'timers/s':>9} "
              f"{'broker ms/call':>15} {'pg ms/call':>11} {'net pg ms/call':>15} "
              f"{'broker us/timer':>16} {'pg us/timer':>12} {'net pg us/timer':>16}")
        for r in range(args.rounds):
            for kind, size in ROWS:
                calls = ONE_TIMER_CALLS if size == 1 else max(1, args.timers // size)
                for (name, client, meter), rate in zip(runs, idle, strict=True):
                    x = row(client, meter, kind, size, calls, f"r{r}")
                    net_ms = x["pg_ms_per_call"] - rate * x["wall_ms_per_call"]
                    print(f"{name:5} {kind:8} {size:5} {calls:5} {x['timers_per_s']:9} "
                          f"{x['broker_ms_per_call']:15} {x['pg_ms_per_call']:11} "
                          f"{net_ms:15.2f} {x['broker_us_per_timer']:16} "
                          f"{x['pg_us_per_timer']:12} {net_ms * 1e3 / size:16.1f}",
                          flush=True)
        print(f"load avg {load()}")


if __name__ == "__main__":
    main()

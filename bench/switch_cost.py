"""What the runtime switches cost a call (queen_trio/switches.py).

Every KV, locks and timer-schedule call reads its switch from the broker's in-memory copy; the
copy is refreshed by a NOTIFY and a half-second poll, off the request path. Two measurements:

1. the check itself, in process: ``require_kv(broker)`` as a handler calls it (with the broker
   it has already fetched: an attribute read and a branch), timed with ``timeit`` against an
   empty call;
2. end to end over HTTP, interleaved rounds against a broker of this checkout and one of
   ``--baseline`` (a checkout without the switches, e.g. /work/main): sequential ``GET
   /api/v1/kv/{ns}/{key}`` and one-op ``POST /api/v1/timers`` schedules, p50 and mean.

    python -m bench.switch_cost                       # the check only
    python -m bench.switch_cost --baseline /work/main --rounds 3 --requests 1000

Writes bench/results/switch_cost.json.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import time
import timeit
import uuid
from pathlib import Path
from typing import Any

import httpx

from bench.harness.brokers import free_port, serve_checkout, wait_healthy
from bench.harness.pg import shared_server
from bench.harness.stats import median

HERE = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results"


def check_cost(number: int = 1_000_000) -> dict[str, float]:
    """ns per ``require_kv(broker)`` as a handler calls it (with the broker it has fetched),
    and per call of an empty function of one argument."""
    from queen_trio.api.switches import require_kv
    from queen_trio.switches import RuntimeSwitches

    class _Broker:
        switches = RuntimeSwitches(None, None)  # type: ignore[arg-type]  # never refreshed here

    broker: Any = _Broker()

    def empty(_: Any) -> None:
        return None

    out: dict[str, float] = {}
    for name, fn in (("empty_call_ns", empty), ("require_kv_ns", require_kv)):
        best = min(timeit.repeat(functools.partial(fn, broker), number=number, repeat=5))
        out[name] = best / number * 1e9
    out["check_ns"] = out["require_kv_ns"] - out["empty_call_ns"]
    return out




def _timed(http: httpx.Client, n: int, request: Any) -> list[float]:
    out = []
    for i in range(n):
        t = time.perf_counter()
        r = request(http, i)
        out.append(time.perf_counter() - t)
        assert r.status_code == 200, r.text
    return out


def _kv_get(http: httpx.Client, i: int) -> httpx.Response:
    return http.get("/api/v1/kv/bench/k")


def _schedule(http: httpx.Client, i: int) -> httpx.Response:
    key = uuid.uuid4().hex
    return http.post("/api/v1/timers", json=[{
        "op": "schedule", "queue": "bench", "timerKey": key, "delayMs": 3_600_000,
        "payload": "bnVsbA==", "txn": key}])


def end_to_end(baseline: Path, rounds: int, n: int) -> dict[str, Any]:
    samples: dict[str, dict[str, list[float]]] = {
        side: {"kv_get": [], "timer_schedule": []} for side in ("switches", "baseline")}
    with shared_server(os.environ.get("QUEEN_DATABASE_URL")) as server:
        for _ in range(rounds):
            for side, checkout in (("switches", HERE), ("baseline", baseline)):
                url = server.create_database(f"switch_cost_{side}")
                port = free_port()
                proc = serve_checkout(checkout, url, port)
                base = f"http://127.0.0.1:{port}"
                try:
                    wait_healthy(base, None, None)
                    with httpx.Client(base_url=base, timeout=10) as http:
                        http.put("/api/v1/kv/bench/k", json={"value": 1, "forever": True})
                        _timed(http, 200, _kv_get)  # warm-up
                        samples[side]["kv_get"] += _timed(http, n, _kv_get)
                        samples[side]["timer_schedule"] += _timed(http, n, _schedule)
                finally:
                    proc.terminate()
                    proc.wait(timeout=30)
                    server.drop_database(url)
    summary: dict[str, Any] = {}
    for side, per in samples.items():
        for what, xs in per.items():
            summary[f"{side}.{what}"] = {"p50_ms": median(xs) * 1000,
                                         "mean_ms": statistics.fmean(xs) * 1000, "n": len(xs)}
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, help="a checkout without the switches")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=1000)
    args = parser.parse_args()
    result: dict[str, Any] = {"load_average": os.getloadavg(), "check": check_cost()}
    print("the check, in process: " + ", ".join(f"{k} {v:.1f}"
                                                for k, v in result["check"].items()))
    if args.baseline is not None:
        result["end_to_end"] = end_to_end(args.baseline, args.rounds, args.requests)
        for name, row in result["end_to_end"].items():
            print(f"{name:<28} p50 {row['p50_ms']:.3f} ms  mean {row['mean_ms']:.3f} ms  "
                  f"(n={row['n']})")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "switch_cost.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()

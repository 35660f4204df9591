"""What a single-op KV call costs the broker outside PostgreSQL, before and after its request
and answer went through the wire models by the cheap paths (issue 29).

1. In process (CPU, ``timeit``, best of 5): the Python steps of ``PUT /api/v1/kv/{ns}/{key}``
   and ``GET`` around the database: the body decoded (strict_json, or the model's fast path),
   the op judged by the rules, the store's result dict turned into its model
   (``msgspec.convert``, or encode + decode: ``codec.as_model``) and encoded.
2. With ``--baseline <checkout>``: the rules' ``parse_op`` of a put and a get, the baseline's
   ``queen_trio/kv/rules.py`` against this one's, in this process (best of 5, 3 rounds);
   then over HTTP, interleaved rounds against a broker of this
   checkout and one of the baseline (sequential single-op PUTs and GETs on one key; a fresh
   database each), p50/p90/p99/max per side.

    python -m bench.kv_answer
    python -m bench.kv_answer --baseline /path/to/main --rounds 3 --requests 1000

Writes bench/results/kv_answer.json.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import timeit
from pathlib import Path
from typing import Any

import httpx
import msgspec

from bench.harness.brokers import free_port, serve_checkout, wait_healthy
from bench.harness.pg import shared_server
from bench.harness.stats import percentile

HERE = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results"
PATH = "/api/v1/kv/saga/booking-17"

PUT_BODY = json.dumps({"value": {"bookingId": 17, "step": "held", "seats": [3, 4]},
                       "forever": True}).encode()
PUT_RESULT = [{"index": 0, "op": "put", "applied": True, "key": "booking-17",
               "value": {"bookingId": 17, "step": "held", "seats": [3, 4]}, "version": 42,
               "expiresAt": None}]
GET_RESULT = [{"index": 0, "op": "get", "found": True, "key": "booking-17",
               "value": {"bookingId": 17, "step": "held", "seats": [3, 4]}, "version": 42,
               "expiresAt": None, "updatedAt": "2026-12-04T16:00:00.000000Z"}]


def in_process(number: int = 20_000) -> dict[str, float]:
    """µs per call of each variant's Python steps (best of 5)."""
    from queen_trio import strict_json
    from queen_trio.kv import rules
    from queen_trio.models import codec
    from queen_trio.models import kv as models

    def judged(body: dict[str, Any]) -> rules.Op:
        return rules.parse_op(0, {**body, "op": "put", "ns": "saga", "key": "booking-17"},
                              ceiling=rules.MAX_VALUE_BYTES, where="")

    def put_before() -> bytes:
        judged(strict_json.loads(PUT_BODY))
        return codec.encode(msgspec.convert(PUT_RESULT, list[models.KvResult])[0])

    def put_after() -> bytes:
        judged(codec.fast_builtins(PUT_BODY, models.PUT_DECODER))
        return codec.encode(codec.as_model(PUT_RESULT, models.RESULTS_DECODER)[0])

    def get_before() -> bytes:
        return codec.encode(msgspec.convert(GET_RESULT, list[models.KvResult])[0])

    def get_after() -> bytes:
        return codec.encode(codec.as_model(GET_RESULT, models.RESULTS_DECODER)[0])

    assert put_before() == put_after() and get_before() == get_after()
    out = {}
    for name, fn in (("put_before_us", put_before), ("put_after_us", put_after),
                     ("get_before_us", get_before), ("get_after_us", get_after)):
        out[name] = min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6
    return out


def rules_ab(baseline: Path, number: int = 5_000) -> list[dict[str, float]]:
    """µs per ``parse_op`` of a put and a get: the baseline's rules module against this one's,
    interleaved (three rounds)."""
    import importlib.util

    from queen_trio.kv import rules

    spec = importlib.util.spec_from_file_location(
        "queen_trio.kv.rules_baseline", baseline / "queen_trio" / "kv" / "rules.py")
    assert spec is not None and spec.loader is not None
    old = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = old  # (dataclasses look their module up)
    spec.loader.exec_module(old)
    put = {**json.loads(PUT_BODY), "op": "put", "ns": "saga", "key": "booking-17"}
    get = {"op": "get", "ns": "saga", "key": "booking-17"}
    rounds = []
    for _ in range(3):
        row = {}
        for side, module in (("baseline", old), ("this", rules)):
            for what, op in (("put", put), ("get", get)):
                best = min(timeit.repeat(
                    functools.partial(module.parse_op, 0, op, ceiling=65_536, where=""),
                    number=number, repeat=5))
                row[f"{what}_{side}_us"] = best / number * 1e6
        rounds.append(row)
    return rounds


def end_to_end(baseline: Path, rounds: int, n: int) -> dict[str, Any]:
    sides = (("this", HERE), ("baseline", baseline))
    samples: dict[str, dict[str, list[float]]] = {
        side: {"kv_put": [], "kv_get": []} for side, _ in sides}
    with shared_server(os.environ.get("QUEEN_DATABASE_URL")) as server:
        for round_no in range(rounds):
            # Each side goes first every other round: the load of a shared machine drifts.
            for side, checkout in (sides if round_no % 2 == 0 else sides[::-1]):
                url = server.create_database(f"kv_answer_{side}")
                port = free_port()
                proc = serve_checkout(checkout, url, port)
                base = f"http://127.0.0.1:{port}"
                try:
                    wait_healthy(base, None, None)
                    with httpx.Client(base_url=base, timeout=10) as http:
                        for _ in range(200):  # warm-up
                            http.put(PATH, content=PUT_BODY)
                        for what, call in (("kv_put", lambda: http.put(PATH, content=PUT_BODY)),
                                           ("kv_get", lambda: http.get(PATH))):
                            for _ in range(n):
                                t = timeit.default_timer()
                                r = call()
                                samples[side][what].append(timeit.default_timer() - t)
                                assert r.status_code == 200, r.text
                finally:
                    proc.terminate()
                    proc.wait(timeout=30)
                    server.drop_database(url)
    summary: dict[str, Any] = {}
    for side, per in samples.items():
        for what, xs in per.items():
            ordered = sorted(xs)
            summary[f"{side}.{what}"] = {
                "p50_ms": percentile(ordered, 50) * 1000, "p90_ms": percentile(ordered, 90) * 1000,
                "p99_ms": percentile(ordered, 99) * 1000, "max_ms": ordered[-1] * 1000,
                "n": len(xs)}
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, help="a checkout before the change")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=1000)
    args = parser.parse_args()
    result: dict[str, Any] = {"load_average": os.getloadavg(), "in_process": in_process()}
    print("in process, µs per call: " + ", ".join(
        f"{k} {v:.2f}" for k, v in result["in_process"].items()))
    if args.baseline is not None:
        result["rules"] = rules_ab(args.baseline)
        for row in result["rules"]:
            print("parse_op, µs: " + ", ".join(f"{k} {v:.2f}" for k, v in row.items()))
        result["end_to_end"] = end_to_end(args.baseline, args.rounds, args.requests)
        for name, row in result["end_to_end"].items():
            print(f"{name:<20} p50 {row['p50_ms']:.3f}  p90 {row['p90_ms']:.3f}  "
                  f"p99 {row['p99_ms']:.3f}  max {row['max_ms']:.3f} ms  (n={row['n']})")
    result["load_average_end"] = os.getloadavg()
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "kv_answer.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()

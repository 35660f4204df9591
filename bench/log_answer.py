"""What the answers of configure, fetch and partitions/changed cost to build and encode, before
and after they became wire models (issue 29 item 8), in process (CPU, no database).

Before: the dicts the handlers built, encoded as ``api/common.json_response`` encodes them (one
compact ``json.JSONEncoder``, Flask's defaults, then the text to UTF-8 bytes). After: the models
of :mod:`queen_trio.models.log` built from the same values, encoded as ``model_response`` does
(``models.codec.encode``). Both sides build from the same rows; each answer is checked to be
the same JSON on both sides. Two modes: ``encode`` (the answer already built) and
``build+encode``. Rounds are interleaved (each round times both sides, the order alternating),
and the percentiles are over the rounds' µs per answer.

    python -m bench.log_answer [--rounds 300] [--number 20]

Writes bench/results/log_answer.json.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import timeit
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from flask.json.provider import DefaultJSONProvider

from bench.harness.report import now_iso, save_json, source_revision
from bench.harness.stats import percentile
from queen_trio.formats import iso
from queen_trio.log import rules
from queen_trio.models import codec
from queen_trio.models import log as models

RESULTS = Path(__file__).resolve().parent / "results" / "log_answer.json"

# What api/common.json_response encodes with (sort_keys off, compact, ASCII, Flask's default).
_COMPACT = json.JSONEncoder(
    default=DefaultJSONProvider.default, ensure_ascii=DefaultJSONProvider.ensure_ascii,
    sort_keys=False, separators=(",", ":"))
T0 = datetime(2026, 12, 4, 18, 0, tzinfo=UTC)


def json_bytes(body: Any) -> bytes:
    """What json_response sends (before)."""
    return (_COMPACT.encode(body) + "\n").encode()


def model_bytes(model: Any) -> bytes:
    """What model_response sends (after)."""
    return codec.encode(model) + b"\n"


Sides = tuple[Callable[[], Any], Callable[[], Any]]  # (the dicts, the model) of one answer


def _frames(n: int) -> list[tuple[int, str, Any, datetime]]:
    return [(i, f"txn-{i:06d}", {"orderId": i, "sku": "A-17", "qty": 3, "price": 12.5,
                                 "tags": ["eu", "prio"]}, T0 + timedelta(milliseconds=i))
            for i in range(n)]


def configure_sides() -> Sides:
    name, req = rules.configure_request({"queue": "orders", "options": {
        "leaseTime": 30, "retryLimit": 5, "priority": 2}, "namespace": "shop"})
    queue_id, partition_id = uuid.uuid4(), uuid.uuid4()

    def before() -> Any:
        return {"configured": True, "created": True, "queue": name, "queueId": str(queue_id),
                "partitionId": str(partition_id), "namespace": "shop", "task": "",
                "options": req.echo, "ignored": req.ignored, "unknown": req.unknown}

    def after() -> Any:
        return models.Configured(
            configured=True, created=True, queue=name, queueId=str(queue_id),
            partitionId=str(partition_id), namespace="shop", task="",
            options=models.ConfiguredOptions(**req.echo), ignored=req.ignored,
            unknown=req.unknown)

    return before, after


def fetch_sides(entries: int, records: int) -> Sides:
    frames = _frames(records)

    def before() -> Any:
        out = []
        for e in range(entries):
            entry: dict[str, Any] = {"queue": "orders", "partition": f"p{e}", "records": []}
            entry["records"] = [{"offset": o, "transactionId": t, "payload": p, "ts": iso(at)}
                                for o, t, p, at in frames]
            entry["highWatermark"] = records
            entry["logStartOffset"] = 0
            out.append(entry)
        return {"entries": out}

    def after() -> Any:
        return models.Fetched(entries=[
            models.FetchedEntry(
                queue="orders", partition=f"p{e}",
                records=[models.FetchedRecord(offset=o, transactionId=t, payload=p,
                                              ts=iso(at))  # type: ignore[arg-type]
                         for o, t, p, at in frames],
                highWatermark=records, logStartOffset=0)
            for e in range(entries)])

    return before, after


def changed_sides(partitions: int) -> Sides:
    rows: list[dict[str, Any]] = [
        {"name": f"customer-{i:05d}", "partition_id": uuid.uuid4(), "last_offset": i,
         "log_start": 0, "at": T0 + timedelta(seconds=i)} for i in range(partitions)]

    def before() -> Any:
        parts = [{"name": r["name"], "id": str(r["partition_id"]),
                  "lastOffset": r["last_offset"], "logStart": r["log_start"],
                  "lastWriteAt": iso(r["at"])} for r in rows]
        return {"safeTime": iso(T0), "safeTimeDegraded": False, "entries": [
            {"queue": "orders", "partitions": parts, "next": "n|" + rows[-1]["name"]}]}

    def after() -> Any:
        parts = [models.ChangedPartition(name=r["name"], id=str(r["partition_id"]),
                                         lastOffset=r["last_offset"], logStart=r["log_start"],
                                         lastWriteAt=iso(r["at"]))  # type: ignore[arg-type]
                 for r in rows]
        return models.PartitionsChanged(
            safeTime=iso(T0), safeTimeDegraded=False,  # type: ignore[arg-type]
            entries=[models.ChangedQueue(queue="orders", partitions=parts,
                                         next="n|" + rows[-1]["name"])])

    return before, after


CASES: dict[str, Callable[[], Sides]] = {
    "configure": configure_sides,
    "fetch 1x500": lambda: fetch_sides(1, 500),  # one partition read in one call
    "fetch 64x8": lambda: fetch_sides(64, 8),
    "changed 1000": lambda: changed_sides(1000),
}


def _stats(values: list[float]) -> dict[str, float]:
    values = sorted(values)
    out = {f"p{p}": round(percentile(values, p), 2) for p in (50, 90, 99)}
    out["max"] = round(values[-1], 2)
    return out


def _built(encode: Callable[[Any], bytes], build: Callable[[], Any]) -> bytes:
    return encode(build())


def measure(rounds: int, number: int) -> dict[str, Any]:
    """Per answer and per mode (``encode``: of the answer already built; ``build+encode``),
    µs per answer of each side."""
    out: dict[str, Any] = {}
    for case, make in CASES.items():
        build_before, build_after = make()
        built_before, built_after = build_before(), build_after()
        assert json.loads(json_bytes(built_before)) == json.loads(model_bytes(built_after)), case
        n = number * 100 if case == "configure" else number  # (configure's is tiny)
        modes: dict[str, tuple[Callable[[], bytes], Callable[[], bytes]]] = {
            "encode": (functools.partial(json_bytes, built_before),
                       functools.partial(model_bytes, built_after)),
            "build+encode": (functools.partial(_built, json_bytes, build_before),
                             functools.partial(_built, model_bytes, build_after)),
        }
        for mode, (before, after) in modes.items():
            samples: dict[str, list[float]] = {"before": [], "after": []}
            for r in range(rounds):
                sides = (("before", before), ("after", after))
                for side, fn in (sides if r % 2 == 0 else sides[::-1]):
                    samples[side].append(timeit.timeit(fn, number=n) / n * 1e6)
            row: dict[str, Any] = {"bytes": len(after()), "answers_per_sample": n,
                                   "before": _stats(samples["before"]),
                                   "after": _stats(samples["after"])}
            row["after_over_before_p50"] = round(row["after"]["p50"] / row["before"]["p50"], 3)
            out[f"{case} {mode}"] = row
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--number", type=int, default=20, help="answers timed per sample")
    args = parser.parse_args()
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    result = measure(args.rounds, args.number)
    print(f"µs per answer, {args.rounds} interleaved rounds; load {load}")
    print(f"{'answer':<27} {'bytes':>7} {'side':<7} {'p50':>9} {'p90':>9} {'p99':>9} "
          f"{'max':>9}  after/before p50")
    for case, row in result.items():
        for side in ("before", "after"):
            d = row[side]
            tail = f"  {row['after_over_before_p50']:.3f}" if side == "after" else ""
            print(f"{case:<27} {row['bytes']:>7} {side:<7} {d['p50']:>9.2f} {d['p90']:>9.2f} "
                  f"{d['p99']:>9.2f} {d['max']:>9.2f}{tail}")
    save_json(RESULTS, {"when": now_iso(), "revision": source_revision(), "load_start": load,
                        "rounds": args.rounds, "cases": result})


if __name__ == "__main__":
    main()

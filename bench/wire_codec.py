"""What typed msgspec models would cost against today's JSON path, without HTTP: one process,
CPU only, the variants interleaved ``--rounds`` times, each the best of 5 timings of this
process's CPU time (so other work on the machine weighs less).

1. A 256-op ``POST /api/v1/timers`` body (Queen's ceiling), ops shaped by the SDK
   (``TimerSpec.to_wire``): decode + validate into ``Schedule`` values.
   today: ``strict_json.loads`` then ``timers.rules.operations`` (dict walking; each
   payload's JSON goes through the broker's ``payload_value``, whose msgspec fast path is the
   same on both sides: the bench does not switch broker code off);
   msgspec: ``msgspec.json.decode(type=TimerBatch)`` (shape and types checked in C), then the
   same name/payload rules, the payload's JSON decoded and re-encoded by msgspec.
2. Its answer (256 results): encode. today: the route's dicts (``iso()``, ``str(uuid)``) and
   the broker's JSONEncoder; msgspec: Structs, datetimes and UUIDs encoded natively.
3. A KV ``getMany`` answer of 100 rows (small JSON values): encode (broker), and decode
   (SDK). today: dicts + JSONEncoder / ``strict_json.loads``; msgspec: Structs both ways.
4. A pop answer of 100 messages (queen_trio/models/log.py): encode. today: the route's
   dicts as they were and the broker's JSONEncoder; msgspec: the PopResponse model. Then the
   same with each payload arriving as its stored JSON text: today decoded, then encoded;
   msgspec: handed through as ``msgspec.Raw``, never decoded.

    python -m bench.wire_codec [--rounds 5]
"""

from __future__ import annotations

import argparse
import datetime
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from bench.harness.report import source_revision
from bench.harness.stats import median
from queen_trio import strict_json
from queen_trio.api.common import _COMPACT
from queen_trio.client.calls import TimerSpec
from queen_trio.formats import iso
from queen_trio.models import codec
from queen_trio.models import log as log_models
from queen_trio.models import timers as models
from queen_trio.timers import rules
from queen_trio.timers.store import Outcome

RESULTS = Path(__file__).parent / "results" / "wire_codec.txt"
CEILING = 64 * 1024
HORIZON_S = 30 * 86400


def batch_body() -> bytes:
    ops = [TimerSpec("reminders", f"trial-ending:{i}", 3_600_000,
                     {"accountId": i, "plan": "pro", "note": "trial ends"}).to_wire()
           for i in range(models.MAX_OPS_PER_CALL)]
    return strict_json.dumps({"operations": ops})


def decode_today(body: bytes) -> list[Any]:
    """The broker's dict path (the route's fallback for a body its models refuse)."""
    return rules.operations(strict_json.loads(body), horizon_s=HORIZON_S, ceiling=CEILING)


def decode_models(body: bytes) -> list[Any]:
    ops = rules.operations_from_bytes(body, horizon_s=HORIZON_S, ceiling=CEILING)
    assert ops is not None
    return ops


def outcomes(n: int) -> list[Outcome]:
    at = datetime.datetime.now(datetime.UTC)
    return [Outcome("scheduled", "reminders", f"trial-ending:{i}", str(uuid.uuid4()), "Default",
                    at, str(uuid.uuid4())) for i in range(n)]


def encode_today(os: list[Outcome]) -> bytes:
    """The route's dicts as they were (iso(), str(uuid)) and the broker's JSONEncoder."""
    return _COMPACT.encode({"results": [
        {"ok": o.ok, "status": o.status, "queue": o.queue, "timerKey": o.key, "txn": o.txn,
         "messageId": str(o.message_id), "deliverAt": iso(o.deliver_at),
         "partition": o.partition} for o in os]}).encode()


def encode_models(os: list[Outcome]) -> bytes:
    return codec.encode(models.TimerResults([models.TimerResult(
        ok=o.ok, status="scheduled", queue=o.queue, timer_key=o.key, txn=o.txn,
        # (the store's id is its text, which the model writes as it writes a UUID)
        message_id=o.message_id,  # type: ignore[arg-type]
        deliver_at=iso(o.deliver_at), partition=o.partition)
        for o in os]))


# A KV getMany answer, as kv/store.py builds it; the Struct is the shape a model would have.
class KvEntry(msgspec.Struct, rename="camel"):
    key: str
    value: Any
    version: int
    expires_at: str | None
    updated_at: str


class KvGetMany(msgspec.Struct, rename="camel"):
    index: int
    op: str
    rows: list[KvEntry]
    missing: list[str]
    truncated: bool


class KvAnswer(msgspec.Struct):
    results: list[KvGetMany]


def kv_rows(n: int) -> list[dict[str, Any]]:
    at = datetime.datetime.now(datetime.UTC)
    return [{"key": f"booking-{i}", "value": {"state": "held", "seats": [i, i + 1]},
             "version": i + 1, "expires_at": None, "updated_at": at} for i in range(n)]


def kv_encode_today(rows: list[dict[str, Any]]) -> bytes:
    return _COMPACT.encode({"results": [{
        "index": 0, "op": "getMany", "rows": [
            {"key": r["key"], "value": r["value"], "version": r["version"],
             "expiresAt": iso(r["expires_at"]), "updatedAt": iso(r["updated_at"])}
            for r in rows], "missing": [], "truncated": False}]}).encode()


def kv_encode_models(rows: list[dict[str, Any]]) -> bytes:
    return codec.encode(KvAnswer([KvGetMany(0, "getMany", [
        KvEntry(r["key"], r["value"], r["version"], iso(r["expires_at"]),
                iso(r["updated_at"]) or "") for r in rows], [], False)]))


_KV_DECODER = msgspec.json.Decoder(KvAnswer)


def pop_messages(n: int) -> list[dict[str, Any]]:
    at = datetime.datetime.now(datetime.UTC)
    return [{"offset": i, "transaction_id": str(uuid.uuid4()), "created_at": at,
             "payload": {"orderId": i, "state": "paid", "lines": [{"sku": "a-1", "qty": 2}]}}
            for i in range(n)]


_PID, _LEASE = str(uuid.uuid4()), str(uuid.uuid4())


def pop_encode_today(ms: list[dict[str, Any]], data: Callable[[Any], Any] = lambda d: d) -> bytes:
    """The route's dicts as they were (api/log.py before models/log.py)."""
    at = iso(ms[0]["created_at"])
    return _COMPACT.encode({
        "success": True, "queue": "orders", "partition": "Default", "partitionId": _PID,
        "leaseId": _LEASE, "leaseExpiresAt": at, "consumerGroup": "billing",
        "messages": [{"id": f"{_PID}:{m['offset']}", "transactionId": m["transaction_id"],
                      "partitionId": _PID, "partition": "Default", "queue": "orders",
                      "offset": m["offset"], "leaseId": _LEASE, "consumerGroup": "billing",
                      "data": data(m["payload"]), "createdAt": iso(m["created_at"]),
                      "retryCount": 0, "deliveryAttempt": 1} for m in ms],
        "skipped": None}).encode()


def pop_encode_models(ms: list[dict[str, Any]], data: Callable[[Any], Any] = lambda d: d) -> bytes:
    at = iso(ms[0]["created_at"])
    return codec.encode(log_models.PopResponse(
        success=True, queue="orders", partition="Default", partitionId=_PID, leaseId=_LEASE,
        leaseExpiresAt=at, consumerGroup="billing",
        messages=[log_models.Message(
            id=f"{_PID}:{m['offset']}", transactionId=m["transaction_id"], partitionId=_PID,
            partition="Default", queue="orders", offset=m["offset"], leaseId=_LEASE,
            consumerGroup="billing", data=data(m["payload"]),
            createdAt=iso(m["created_at"]) or "", retryCount=0, deliveryAttempt=1)
            for m in ms],
        skipped=None))


def cpu_us(fn: Callable[[], Any], number: int) -> float:
    best = float("inf")
    for _ in range(5):
        t0 = time.process_time()
        for _ in range(number):
            fn()
        best = min(best, (time.process_time() - t0) / number)
    return best * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    body = batch_body()
    assert [(s.key, s.json_bytes) for s in decode_today(body)] == \
        [(s.key, s.json_bytes) for s in decode_models(body)]
    os, rows = outcomes(256), kv_rows(100)
    assert strict_json.loads(encode_today(os)) == strict_json.loads(encode_models(os))
    kv_body = kv_encode_today(rows)
    assert strict_json.loads(kv_body) == strict_json.loads(kv_encode_models(rows))
    ms = pop_messages(100)
    assert strict_json.loads(pop_encode_today(ms)) == strict_json.loads(pop_encode_models(ms))
    texts = [{**m, "payload": strict_json.dumps(m["payload"])} for m in ms]
    assert strict_json.loads(pop_encode_today(texts, strict_json.loads)) == \
        strict_json.loads(pop_encode_models(texts, msgspec.Raw))
    cases: list[tuple[str, str, Callable[[], Any], int]] = [
        ("timer batch, 256 ops: decode + validate", "today", lambda: decode_today(body), 20),
        ("timer batch, 256 ops: decode + validate", "msgspec", lambda: decode_models(body), 20),
        ("timer batch answer, 256 results: encode", "today", lambda: encode_today(os), 50),
        ("timer batch answer, 256 results: encode", "msgspec", lambda: encode_models(os), 50),
        ("kv getMany answer, 100 rows: encode", "today", lambda: kv_encode_today(rows), 100),
        ("kv getMany answer, 100 rows: encode", "msgspec", lambda: kv_encode_models(rows), 100),
        ("kv getMany answer, 100 rows: decode (SDK)", "today",
         lambda: strict_json.loads(kv_body), 100),
        ("kv getMany answer, 100 rows: decode (SDK)", "msgspec",
         lambda: _KV_DECODER.decode(kv_body), 100),
        ("pop answer, 100 messages: encode", "today", lambda: pop_encode_today(ms), 100),
        ("pop answer, 100 messages: encode", "msgspec", lambda: pop_encode_models(ms), 100),
        ("pop answer, 100 payloads as JSON text", "today",
         lambda: pop_encode_today(texts, strict_json.loads), 100),
        ("pop answer, 100 payloads as JSON text", "msgspec",
         lambda: pop_encode_models(texts, msgspec.Raw), 100),
    ]
    timings: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.rounds):
        for what, how, fn, number in cases:
            timings.setdefault((what, how), []).append(cpu_us(fn, number))
    lines = [f"wire codec: today's JSON path vs msgspec models (CPU µs per call, median of "
             f"{args.rounds} rounds, each the best of 5; checkout {source_revision()})",
             f"  {'what':<44} {'today':>9} {'msgspec':>9} {'speed-up':>9}"]
    for what in dict.fromkeys(w for w, _, _, _ in cases):
        today = median(timings[(what, "today")])
        fast = median(timings[(what, "msgspec")])
        lines.append(f"  {what:<44} {today:>9,.0f} {fast:>9,.0f} {today / fast:>8.1f}x")
    lines.append(f"  batch body {len(body):,} bytes; timer batch decode today = strict_json.loads "
                 "+ rules.operations (payloads through the broker's payload_value on both sides)")
    text = "\n".join(lines)
    print(text)
    RESULTS.write_text(text + "\n")


if __name__ == "__main__":
    main()

"""The Python CPU of one 500-timer bundle per timer, without network or database: the SDK's
part (builders, body encoding, answer decoding, as ``bench.peer_graphile.sdk_bundle`` reads the
answer; and the same through ``schedule_many``) and the broker's part (body decode, rules, the
statement's array parameters, answer models, answer encoding). Stages of the broker:
``decode+rules`` is what ``POST /api/v1/transaction`` does before the statement, ``arrays`` the
statement's parameters (``store.timer_arrays``), ``outcomes`` the store's outcomes of a bundle
of new names (``store._all_scheduled``), ``answer`` the full answer's models and encoding (the
compact answer, ``?answer=compact``, costs nothing per timer; the SDK's reading of it is
``reading the compact answer``). Each figure is the
minimum of ``--runs`` runs (process CPU time), the least disturbed by a loaded machine.

    PYTHONPATH=$PWD python -m bench.schedule_python [--runs 15]

Against a branch: run it from each checkout (``PYTHONPATH`` set to it) one after the other.
"""

from __future__ import annotations

import argparse
import base64
import json
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from queen_trio import strict_json, transactions
from queen_trio.api import transaction as api_tx
from queen_trio.client.builders import TransactionBuilder
from queen_trio.models import codec
from queen_trio.models import transaction as models
from queen_trio.timers import store

N = 500
HOUR_MS = 3_600_000


def sdk_once(answer: bytes) -> None:
    tx: Any = TransactionBuilder(lambda call: call)
    for i in range(N):
        key = f"k-{i}"
        tx = tx.timer("q").key(key).delay(HOUR_MS).payload({"k": key}).schedule()
    call = tx.commit()
    _ = getattr(call, "content", None) or strict_json.dumps(call.body)  # as the transport
    fast = getattr(call, "fast", None)
    result = fast(answer) if fast is not None else codec.FALLBACK
    if result is codec.FALLBACK:
        result = call.parse(strict_json.loads(answer))
    _ = [(t.key, t.deliver_at.timestamp()) for t in result.timers if t.ok]


def sdk_many_once(answer: bytes) -> None:
    """:func:`sdk_once` through ``schedule_many`` instead of a builder chain per timer."""
    tx: Any = TransactionBuilder(lambda call: call)
    call = tx.schedule_many("q", [(f"k-{i}", HOUR_MS, {"k": f"k-{i}"}) for i in range(N)]
                            ).commit()
    _ = getattr(call, "content", None) or strict_json.dumps(call.body)
    result = call.fast(answer)
    if result is codec.FALLBACK:
        result = call.parse(strict_json.loads(answer))
    _ = [(t.key, t.deliver_at.timestamp()) for t in result.timers if t.ok]


def best(run: Callable[[], Any], runs: int) -> float:
    out = float("inf")
    for _ in range(runs):
        t0 = time.process_time()
        run()
        out = min(out, time.process_time() - t0)
    return out / N * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15)
    runs = parser.parse_args().runs
    answer = json.dumps({"success": True, "transactionId": str(uuid.uuid4()), "results": [
        {"type": "timer", "index": i, "ok": True, "status": "scheduled", "queue": "q",
         "timerKey": f"k-{i}", "txn": str(uuid.uuid4()), "messageId": str(uuid.uuid4()),
         "deliverAt": f"2030-01-01T00:00:00.{i:06d}Z", "partition": "Default"}
        for i in range(N)]}).encode()
    body = json.dumps({"operations": [], "timers": [
        {"op": "schedule", "queue": "q", "timerKey": f"k-{i}", "delayMs": HOUR_MS,
         "txn": str(uuid.uuid4()),
         "payload": base64.b64encode(json.dumps({"k": f"k-{i}"}).encode()).decode()}
        for i in range(N)]}).encode()
    limits = transactions.Limits(message_ceiling=1 << 20, timer_payload_ceiling=65536,
                                 timer_horizon_s=86400 * 365, notify_within_ms=1000)

    def parse() -> transactions.Bundle:
        decoded = codec.fast(body, models.BUNDLE_DECODER)
        return transactions.parse(api_tx._bundle_builtins(decoded), limits)

    bundle = parse()
    # psycopg's instants carry the session's zone (Etc/UTC here), not datetime.UTC: the answer
    # formats what the broker really holds.
    now = datetime.now(ZoneInfo("Etc/UTC"))
    outcomes = [store.Outcome("scheduled", s.queue, s.key, s.txn, s.partition,
                              now + timedelta(hours=1, microseconds=i), str(uuid.uuid4()))
                for i, s in enumerate(bundle.timers)]

    def answer_of() -> bytes:
        return codec.encode(models.TransactionDone(
            success=True, transaction_id="t",
            results=api_tx._flat_results(bundle, [], [], outcomes)))

    compact_answer = json.dumps({"success": True, "transactionId": str(uuid.uuid4()),
                                 "scheduled": {"count": N, "now": "2030-01-01T00:00:00.000001Z",
                                               "messageIdBase": str(uuid.uuid4()),
                                               "defaultPartition": "Default"}}).encode()
    all_scheduled = getattr(store, "_all_scheduled", None)
    base_id = str(uuid.uuid4())
    schedules: Any = bundle.timers
    txns = [s.txn for s in schedules]

    def outcomes_of() -> Any:  # the store's outcomes of a bundle of new names
        return None if all_scheduled is None else all_scheduled(schedules, txns, base_id, now)

    sdk, rules, answers = best(lambda: sdk_once(answer), runs), best(parse, runs), \
        best(answer_of, runs)
    many = best(lambda: sdk_many_once(answer), runs)
    compact = best(lambda: sdk_many_once(compact_answer), runs)  # the SDK reads either
    arrays = best(lambda: store.timer_arrays(schedules), runs)
    made = best(outcomes_of, runs)
    print(f"µs per timer of a {N}-timer bundle (min of {runs}): SDK {sdk:.1f} (schedule_many "
          f"{many:.1f}, reading the compact answer {compact:.1f}); broker decode+rules "
          f"{rules:.1f}, statement's arrays {arrays:.1f}, outcomes of new names {made:.1f}, "
          f"full answer {answers:.1f}, together {rules + arrays + made + answers:.1f} "
          f"({rules + arrays + made:.1f} with the compact answer)")


if __name__ == "__main__":
    main()

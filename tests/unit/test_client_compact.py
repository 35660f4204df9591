"""The SDK's side of the compact answer to a bundle of timers (``?answer=compact``): read in C
or strictly, the same results or the same refusal; and the txns a bundle mints at once.
(Against a live broker: tests/integration/test_transaction_compact.py.)"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from queen_trio import strict_json
from queen_trio.client import TimerStatus, calls
from queen_trio.client.builders import TransactionBuilder
from queen_trio.models import codec

BASE = "01a24625-ce0c-79ec-b218-02fc8f3cfba0"
NOW = "2026-12-05T12:20:12.426566Z"


def _compact(count: Any, **fields: Any) -> bytes:
    return json.dumps({"success": True, "transactionId": "tx-1", "scheduled": {
        "count": count, "now": NOW, "messageIdBase": BASE, "defaultPartition": "Default",
        **fields}}).encode()


def _bundle(n: int, *, cancel: bool = False) -> calls.Call[Any]:
    tx: Any = TransactionBuilder(lambda call: call)
    tx = tx.schedule_many("q", [(f"k{i}", i * 1000 - 1000, {"i": i}) for i in range(n)],
                          partition=None)
    if cancel:
        tx = tx.timer("q").key("gone").cancel()
    call: calls.Call[Any] = tx.commit()
    return call


def _outcome(read: Any) -> Any:
    try:
        return read()
    except Exception as exc:  # noqa: BLE001 - compared, not hidden
        return type(exc)


@pytest.mark.parametrize("raw", [
    _compact(3), _compact(2), _compact(4), _compact(3, messageIdBase="nope"),
    _compact(3, now="yesterday"), _compact(3, extra="ignored"), _compact("3"),
    json.dumps({"success": True, "transactionId": "t", "scheduled": None}).encode(),
    b'{"success": true, "transactionId": "t\\u0000", "scheduled": {"count": 3, "now": "'
    + NOW.encode() + b'", "messageIdBase": "' + BASE.encode()
    + b'", "defaultPartition": "Default"}}',
])
def test_a_compact_answer_read_in_c_reads_as_the_strict_path(raw: bytes) -> None:
    call = _bundle(3)
    assert call.params == {"answer": "compact"} and call.fast is not None
    quick = _outcome(lambda: call.fast(raw))
    precise = _outcome(lambda: call.parse(strict_json.loads(raw)))
    assert quick is codec.FALLBACK or quick == precise
    if raw == _compact(3):
        assert quick == precise
        assert [(t.ok, t.status, t.key, t.partition, t.message_id[-3:]) for t in quick.timers] == [
            (True, TimerStatus.SCHEDULED, f"k{i}", "Default", f"{0xba0 ^ (i + 1):03x}")
            for i in range(3)]
        now = datetime(2026, 12, 5, 12, 20, 12, 426566, tzinfo=UTC)
        assert [t.deliver_at for t in quick.timers] == [
            now + timedelta(seconds=i - 1) for i in range(3)]
        assert [t.txn for t in quick.timers] == [t["txn"] for t in call.body["timers"]]
    if raw in (_compact(2), _compact(4)):  # not this bundle's answer: refused both ways
        assert quick is codec.FALLBACK and precise is not None and isinstance(precise, type)


def test_a_bundle_that_did_not_ask_takes_no_compact_answer() -> None:
    """A bundle with a cancel does not ask; a compact answer to it is refused both ways."""
    call = _bundle(2, cancel=True)
    assert call.params is None and call.fast is not None
    assert call.fast(_compact(3)) is codec.FALLBACK
    assert isinstance(_outcome(lambda: call.parse(strict_json.loads(_compact(3)))), type)


def test_the_message_ids_past_4096_timers_are_the_base_xor_their_position() -> None:
    n = 5000
    timers = [{"op": "schedule", "queue": "q", "timerKey": f"k{i}", "delayMs": 0,
               "txn": f"t{i}", "payload": "MQ=="} for i in range(n)]
    call = calls.transaction([], [], timers, ())
    result = call.fast(_compact(n))  # type: ignore[misc]
    low = int(BASE.replace("-", "")[16:], 16)
    assert [t.message_id for t in result.timers] == [
        str(uuid.UUID(int=(int(BASE.replace("-", ""), 16) >> 64 << 64) | (low ^ i)))
        for i in range(1, n + 1)]


@pytest.mark.parametrize("n", [1, 7, 8, 500, 4096, 4097])
def test_a_bundles_txns_are_distinct_random_uuids(n: int) -> None:
    first, second = calls.new_txns(n), calls.new_txns(n)
    assert len(set(first + second)) == 2 * n
    assert {uuid.UUID(t).version for t in first} == {4}
    assert all(str(uuid.UUID(t)) == t for t in first)

"""``POST /api/v1/transaction?answer=compact`` (the SDK's bundles of timers) answered before
Quart (queen_trio/api/fast.py) answers exactly as Quart's route does: the same requests sent
both ways give the same statuses, headers, bodies and metrics; any other transaction request
still reaches Quart."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import httpx
import pytest
import trio

from queen_trio.api import fast
from queen_trio.client import Client
from queen_trio.config import Settings
from queen_trio.server import BrokerHandle, run_broker

from ..timer_ops import timer_op
from .test_fast_routes import _headers

TRANSACTION = "/api/v1/transaction"
HOUR_MS = 3_600_000
COMPACT = {"answer": "compact"}


@pytest.fixture
def settings(database_url: str) -> Settings:
    return Settings(database_url=database_url, port=0, graceful_timeout_ms=1000, db_pool_size=5,
                    timers_max_horizon_s=7200)


def _requests(q: str) -> list[dict[str, Any]]:
    """Run in order on a queue of their own (``q``): each a request's options."""
    new = [timer_op(q, f"k{i}", HOUR_MS, {"i": i}, txn=f"t{i}") for i in range(300)]
    return [
        {"json": {"timers": new}},  # all new names: the compact answer
        {"json": {"timers": new[:2]}},  # rescheduled: in full
        {"json": {"timers": [timer_op(q, "n1", HOUR_MS, 1, txn="x1"),
                             timer_op(q, "k3", 0, op="cancel")]}},  # with a cancel
        {"json": {"operations": [{"type": "push", "items": [{"queue": q, "payload": 1}]}],
                  "timers": [timer_op(q, "n2", HOUR_MS, 2, txn="x2")]}},  # with a push
        {"json": {"kv": [{"op": "check", "ns": q, "key": "absent", "expect": 3,
                          "required": True}],
                  "timers": [timer_op(q, "n3", HOUR_MS, 3, txn="x3")]}},  # precondition lost
        {"content": b"{", "headers": {"content-type": "application/json"}},
        {"content": b"[]", "headers": {"content-type": "application/json"}},
        {"content": b"{\"timers\": [], \"\\u0000\": 1}"},
        {"json": {"timers": new[:1], "surprise": True}},  # unknown field: 400
        {"json": {"timers": [timer_op(q, "far", 10 * HOUR_MS, 1, txn="x4")]}},  # horizon: 403
        {"json": {"timers": [timer_op(q, "dup", HOUR_MS, 1, txn="x5"),
                             timer_op(q, "dup", HOUR_MS, 2, txn="x6")]}},  # twice: 400
        {"json": {}},  # nothing to do: 400
    ]


_VARYING = ("messageId", "deliverAt", "transactionId", "now", "messageIdBase", "partitionId",
            "message_id", "transaction_id", "partition_id")


def _normal(value: Any, q: str) -> Any:
    """An answer's JSON with what differs from one run to the next (minted ids, instants,
    the run's queue) replaced by whether it is there."""
    if isinstance(value, dict):
        return {k: (v is not None) if k in _VARYING else _normal(v, q) for k, v in value.items()}
    if isinstance(value, list):
        return [_normal(v, q) for v in value]
    return value.replace(q, "<q>") if isinstance(value, str) else value


_COUNTED = re.compile(r'^(queen_http_requests_total\{[^}]*route="/api/v1/transaction[^}]*\}|'
                      r'queen_timers_(?:scheduled|cancel)_total\{[^}]*\}|'
                      r'queen_messages_pushed_total\{[^}]*\}) (\S+)$', re.M)


async def _counts(http: httpx.AsyncClient) -> Counter[str]:
    text = (await http.get("/metrics")).text
    return Counter({name: float(value) for name, value in _COUNTED.findall(text)})


async def _run(http: httpx.AsyncClient, q: str) -> tuple[list[Any], Counter[str]]:
    before = await _counts(http)
    answers = []
    for options in _requests(q):
        r = await http.post(TRANSACTION, params=COMPACT, **options)
        answers.append((r.status_code, _headers(r), _normal(r.json(), q)))
    after = await _counts(http)
    after.subtract(before)
    return answers, +after


async def test_a_transaction_answered_before_quart_answers_and_counts_alike(
        http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fast, "ENABLED", False)
    answered = fast.answered
    through_quart, quart_counts = await _run(http, "viaquart")
    assert fast.answered == answered

    monkeypatch.setattr(fast, "ENABLED", True)
    fast_answers, fast_counts = await _run(http, "viafast2")
    assert fast.answered == answered + len(_requests("q"))  # all of them took the fast path

    for quart_answer, fast_answer in zip(through_quart, fast_answers, strict=True):
        assert fast_answer == quart_answer
    assert fast_counts == quart_counts
    assert [a[0] for a in fast_answers] == [200, 200, 200, 200, 200, 400, 400, 400, 400, 403,
                                            400, 400]
    assert set(fast_answers[0][2]) == {"success", "transactionId", "scheduled"}
    assert fast_answers[0][2]["scheduled"]["count"] == 300
    assert [t["status"] for t in fast_answers[1][2]["results"]] == ["rescheduled"] * 2
    assert fast_answers[4][2]["success"] is False
    assert fast_counts['queen_timers_scheduled_total{status="scheduled"}'] == 300 + 2


async def test_a_paused_schedule_is_refused_alike(
        http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch) -> None:
    r = await http.post("/api/v1/system/kv-timers", json={"timersSchedule": False})
    assert r.status_code == 200, r.text
    answers = []
    for enabled in (False, True):
        monkeypatch.setattr(fast, "ENABLED", enabled)
        answered = fast.answered
        r = await http.post(TRANSACTION, params=COMPACT, json={"timers": [
            timer_op("paused", "p", HOUR_MS, {"a": 1}, txn="t-9")]})
        assert fast.answered == answered + enabled
        answers.append((r.status_code, _headers(r), _normal(r.json(), "paused")))
    assert answers[0] == answers[1]
    assert answers[1][0] == 403 and answers[1][2]["error"] == "timers_disabled"


async def test_other_transactions_reach_quart(http: httpx.AsyncClient) -> None:
    """Without the flag, with another query, a chunked or empty body, from a web page: Quart
    answers (nothing counted here), as it always did."""
    answered = fast.answered
    body = {"timers": [timer_op("other", "a", HOUR_MS, 1, txn="a")]}
    r = await http.post(TRANSACTION, json=body)
    assert r.status_code == 200 and "results" in r.json()
    r = await http.post(TRANSACTION, params={"answer": "full"}, json=body)
    assert r.status_code == 200 and "results" in r.json()
    r = await http.post(f"{TRANSACTION}?answer=compact&x=1", json=body)
    assert r.status_code == 200 and r.json()["results"][0]["status"] == "rescheduled"
    r = await http.post(TRANSACTION, params=COMPACT, content=b"")
    assert r.status_code == 400 and r.json()["error"] == "malformed_json"

    async def chunks() -> Any:
        yield b'{"timers": ['
        yield b"]}"

    r = await http.post(TRANSACTION, params=COMPACT, content=chunks())
    assert r.status_code == 400
    r = await http.post(TRANSACTION, params=COMPACT, json=body,
                        headers={"Origin": "http://evil.example"})
    assert r.status_code == 403 and r.json()["error"] == "cross_origin"
    assert fast.answered == answered


async def test_the_sdk_bundle_is_answered_before_quart(database_url: str) -> None:
    """The SDK's bundle of timers at its defaults takes the fast path, a large one too (past
    the lone routes' 64 KiB), and is refused by the body limit alike."""
    settings = Settings(database_url=database_url, port=0, graceful_timeout_ms=1000,
                        db_pool_size=5, max_message_bytes=256 * 1024)
    async with trio.open_nursery() as nursery:
        broker: BrokerHandle = await nursery.start(run_broker, settings)
        async with Client(broker.url, timeout=10) as queen:
            answered = fast.answered
            result = await queen.transaction().schedule_many(
                "sdk", [(f"k{i}", HOUR_MS, {"i": i, "pad": "x" * 200}) for i in range(900)]
            ).commit()
            assert fast.answered == answered + 1
            assert [t.key for t in result.timers] == [f"k{i}" for i in range(900)]
            assert len({t.message_id for t in result.timers}) == 900
            peeked = await queen.timer("sdk").key("k899").peek()
            assert peeked is not None and peeked.message_id == result.timers[-1].message_id
        broker.shutdown()

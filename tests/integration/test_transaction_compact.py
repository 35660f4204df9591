"""``POST /api/v1/transaction?answer=compact`` (our extension, which the SDK asks for when a
bundle only schedules timers): a bundle of new names answered in a few hundred bytes, which
the SDK expands into the very results the full answer gives; every other bundle answered in
full; the flag's wrong values a 400 before anything is written. Queen's own client never sends
the flag and gets Queen's wire (tests/integration/test_queen_mq*.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import httpx
import psycopg
import pytest
import trio

from queen_trio.client import Client, TimerResult, TimerStatus
from queen_trio.client import calls as sdk_calls
from queen_trio.client import models as sdk_models
from queen_trio.config import Settings
from queen_trio.server import BrokerHandle, run_broker

from ..timer_ops import timer_op
from .test_log import API

DAY_MS = 86_400_000
# Past, now, within a second, an hour, and across changes of summer time in both hemispheres.
DELAYS = [-5_000, 0, 1, 999, 3_600_000, 120 * DAY_MS, 200 * DAY_MS + 7, 0]


@pytest.fixture
def settings(database_url: str) -> Settings:
    return Settings(database_url=database_url, port=0, graceful_timeout_ms=1000, db_pool_size=5,
                    timers_max_horizon_s=365 * 86_400)


@pytest.fixture
async def queen(broker: BrokerHandle) -> AsyncIterator[Client]:
    async with Client(broker.url, timeout=10) as client:
        yield client


def _entries(prefix: str) -> list[tuple[str, int, Any]]:
    return [(f"{prefix}-{i}", d, {"i": i}) for i, d in enumerate(DELAYS)]


async def _stored(http: httpx.AsyncClient, queue: str) -> dict[str, dict[str, Any]]:
    r = await http.get(f"{API}/timers/{queue}", params={"limit": 1000})
    assert r.status_code == 200, r.text
    return {row["timerKey"]: row for row in r.json()["rows"]}


def _as_stored(t: TimerResult) -> tuple[Any, ...]:
    assert t.deliver_at is not None
    return (t.key, t.partition, t.txn, t.message_id,
            t.deliver_at.isoformat(timespec="microseconds").replace("+00:00", "Z"))


def _pending(timers: tuple[TimerResult, ...], stored: dict[str, dict[str, Any]]
             ) -> list[tuple[Any, ...]]:
    """The results of the timers due an hour ahead or later (the others may have fired and
    left the table by now), and the same timers as stored."""
    far = [i for i, d in enumerate(DELAYS) if d >= 3_600_000]
    assert len(far) == 3
    return [(_as_stored(timers[i]), _row(stored[timers[i].key])) for i in far]


def _row(row: dict[str, Any]) -> tuple[Any, ...]:
    return (row["timerKey"], row["partition"], row["txn"], row["messageId"], row["deliverAt"])


def test_the_sdk_asks_for_the_compact_answer_only_for_a_bundle_that_only_schedules() -> None:
    def params(timers: list[dict[str, Any]], **more: Any) -> Any:
        return sdk_calls.transaction(more.get("operations", []), [], timers, ()).params

    schedule = timer_op("q", "a", 1000, 1)
    assert params([schedule]) == {"answer": "compact"}
    assert params([schedule, timer_op("q", "b", 0, op="cancel")]) is None
    assert params([schedule], operations=[{"type": "push", "items": [
        {"queue": "q", "payload": 1, "transactionId": "t"}]}]) is None


async def _zoned_broker(settings: Settings, zone: str,
                        nursery: trio.Nursery) -> BrokerHandle:
    """A broker whose database sessions are in ``zone`` (psycopg's instants then carry it)."""
    assert settings.database_url is not None
    with psycopg.connect(settings.database_url, autocommit=True) as conn:
        name = conn.execute("SELECT current_database()").fetchone()[0]
        conn.execute(f"ALTER DATABASE \"{name}\" SET TimeZone = '{zone}'")
    handle: BrokerHandle = await nursery.start(run_broker, settings)
    return handle


@pytest.mark.parametrize("zone", ["Etc/UTC", "Europe/Berlin", "America/St_Johns"])
async def test_the_compact_answer_expands_to_the_full_answers_results(
    settings: Settings, zone: str
) -> None:
    """The same bundle (keys, delays, partitions, txns) once with the flag and once without,
    on two queues: the SDK's results agree field by field, each with the timer as stored
    (message id, due instant, partition, txn), the due instants at the same offsets from the
    statement's now; the flagged answer is the compact one, a few hundred bytes."""
    async with trio.open_nursery() as nursery:
        broker = await _zoned_broker(settings, zone, nursery)
        async with httpx.AsyncClient(base_url=broker.url, timeout=10) as http:
            results = {}
            for queue, flag in (("compact", {"answer": "compact"}), ("full", {})):
                ops = [timer_op(queue, f"k{i}", d, {"i": i}, txn=f"txn-{i}",
                                **({"partition": "p2"} if i % 3 == 2 else {}))
                       for i, d in enumerate(DELAYS)]
                r = await http.post(f"{API}/transaction", params=flag, json={"timers": ops})
                assert r.status_code == 200, r.text
                call = sdk_calls.transaction([], [], ops, ())
                assert call.fast is not None
                result = call.fast(r.content)
                assert isinstance(result, sdk_models.TransactionResult)
                results[queue] = (r, result.timers, await _stored(http, queue))
            compact, full = results["compact"], results["full"]
            assert set(compact[0].json()) == {"success", "transactionId", "scheduled"}
            assert len(compact[0].content) < 400
            assert [t["type"] for t in full[0].json()["results"]] == ["timer"] * len(DELAYS)
            for (_, timers, stored) in (compact, full):
                for answered, as_stored in _pending(timers, stored):
                    assert answered == as_stored
                assert [(t.ok, t.status, t.key) for t in timers] == [
                    (True, TimerStatus.SCHEDULED, f"k{i}") for i in range(len(DELAYS))]
            ours, theirs = compact[1], full[1]
            assert [dataclasses.astuple(_fields(t)) for t in ours] == [
                dataclasses.astuple(_fields(t)) for t in theirs]
            assert [_offset(t, ours[1]) for t in ours] == [
                timedelta(milliseconds=d) for d in DELAYS]
            assert [_offset(t, theirs[1]) for t in theirs] == [
                timedelta(milliseconds=d) for d in DELAYS]
            assert {t.deliver_at.tzinfo for t in ours} == {
                t.deliver_at.tzinfo for t in theirs}
            assert len({t.message_id for t in ours}) == len(DELAYS)
        broker.shutdown()


@dataclasses.dataclass
class _Fields:
    ok: bool
    status: str
    key: str
    txn: str | None
    partition: str | None


def _fields(t: TimerResult) -> _Fields:
    """What two bundles on two queues share (their message ids and now() differ)."""
    return _Fields(t.ok, t.status, t.key, t.txn, t.partition)


def _offset(t: TimerResult, zero_delay: TimerResult) -> timedelta:
    assert t.deliver_at is not None and zero_delay.deliver_at is not None
    return t.deliver_at - zero_delay.deliver_at


async def test_the_sdk_reads_its_bundle_from_the_compact_answer(
    queen: Client, http: httpx.AsyncClient
) -> None:
    """Through the SDK at its defaults (schedule_many, and a builder chain with partitions):
    the results are the timers as stored."""
    result = await queen.transaction().schedule_many("sdk", _entries("m")).commit()
    tx = queen.transaction()
    for i, d in enumerate(DELAYS):
        tx = tx.timer("sdk").key(f"c-{i}").delay(d).payload(i).partition(f"p{i % 2}").schedule()
    chained = await tx.commit()
    stored = await _stored(http, "sdk")
    for timers in (result.timers, chained.timers):
        for answered, as_stored in _pending(timers, stored):
            assert answered == as_stored
        assert [t.key for t in timers[:2]] == [f"{timers[0].key[0]}-{i}" for i in range(2)]
        assert all(t.ok and t.status is TimerStatus.SCHEDULED and t.queue == "sdk"
                   for t in timers)
    assert [t.partition for t in result.timers] == ["Default"] * len(DELAYS)


async def test_a_bundle_with_stored_names_is_answered_in_full(
    queen: Client, http: httpx.AsyncClient
) -> None:
    """Names already stored (rescheduled), the same bundle again, cancels, a push beside
    the timers: each answered in full even when the flag asks, and read right by the SDK."""
    first = await queen.transaction().schedule_many("mixed", _entries("old")).commit()
    again = await queen.transaction().schedule_many(
        "mixed", [("new-1", 1000, 1), ("old-4", 2000, 2), ("new-2", 0, None)]).commit()
    assert [t.status for t in again.timers] == [
        TimerStatus.SCHEDULED, TimerStatus.RESCHEDULED, TimerStatus.SCHEDULED]
    stored = await _stored(http, "mixed")
    assert _as_stored(again.timers[1]) == _row(stored["old-4"])
    assert again.timers[1].message_id != first.timers[4].message_id
    assert first.timers[4].deliver_at != again.timers[1].deliver_at
    ops = [timer_op("mixed", "old-5", 5000, 3), timer_op("mixed", "old-6", 0, op="cancel")]
    for body in ({"timers": ops}, {"timers": ops[:1], "operations": [
            {"type": "push", "items": [{"queue": "side", "payload": 1}]}]}):
        r = await http.post(f"{API}/transaction", params={"answer": "compact"}, json=body)
        assert r.status_code == 200, r.text
        assert "results" in r.json() and "scheduled" not in r.json()
    cancelled = await queen.transaction().timer("mixed").key("old-5").cancel().commit()
    # (old-5 was rescheduled above, 5 s ahead: still pending)
    assert [t.status for t in cancelled.timers] == [TimerStatus.CANCELLED]


@pytest.mark.parametrize("query", [
    "answer=", "answer=COMPACT", "answer=compact,full", "answer=compact&answer=compact",
    "answer=compact&answer=full", "answer=%00", "answer=compact%20", "answer=" + "x" * 5000,
    "answer=%FF%FE", "answer=true", "answer=1",
], ids=lambda query: query[:32])
async def test_a_wrong_answer_flag_is_a_400_and_nothing_is_written(
    http: httpx.AsyncClient, query: str
) -> None:
    r = await http.post(f"{API}/transaction?{query}",
                        json={"timers": [timer_op("flagged", "k", 60_000, 1)]})
    assert r.status_code == 400, r.text
    assert r.json()["error"] == "invalid_parameter"
    found = await http.get(f"{API}/timers/flagged/k")
    assert found.json()["found"] is False
    # A wrong flag on a body that is wrong too is still a 400 (the flag is judged first).
    r = await http.post(f"{API}/transaction?{query}", content=b"{not json")
    assert r.status_code == 400, r.text


async def test_answer_full_is_the_default_answer(http: httpx.AsyncClient) -> None:
    ops = [timer_op("plain", f"k{i}", 60_000, i) for i in range(3)]
    r = await http.post(f"{API}/transaction", params={"answer": "full"}, json={"timers": ops})
    assert r.status_code == 200, r.text
    assert [t["status"] for t in r.json()["results"]] == ["scheduled"] * 3
    r = await http.post(f"{API}/transaction", json={"timers": [
        timer_op("plain", f"n{i}", 60_000, i) for i in range(3)]})
    assert set(r.json()) == {"success", "transactionId", "results"}

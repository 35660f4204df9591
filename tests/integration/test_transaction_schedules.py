"""POST /api/v1/transaction with a ``timers`` rider that only schedules: one statement, its
own transaction (the broker's schedule writer), answered as every bundle is."""

from __future__ import annotations

import httpx

from queen_trio.server import BrokerHandle

from ..timer_ops import timer_op
from .test_log import API, pop

TIMERS = f"{API}/timers"


async def test_a_bundle_that_only_schedules_is_one_statement_of_the_schedule_writer(
    broker: BrokerHandle, http: httpx.AsyncClient
) -> None:
    writer = broker.context.schedules
    before = writer.statistics()
    r = await http.post(f"{API}/transaction", json={"timers": [
        timer_op("only", f"k{i}", 3_600_000, {"i": i}) for i in range(100)]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["success"] is True
    assert [(t["index"], t["type"], t["status"], t["timerKey"]) for t in body["results"]] == [
        (i, "timer", "scheduled", f"k{i}") for i in range(100)]
    # One statement, no BEGIN and COMMIT around it: the writer's, whose commit is its own.
    after = writer.statistics()
    assert (after.batches - before.batches, after.scheduled - before.scheduled) == (1, 100)
    found = (await http.get(f"{TIMERS}/only/k42")).json()
    assert (found["found"], found["data"], found["messageId"]) == (
        True, {"i": 42}, body["results"][42]["messageId"])
    # Rescheduled as an upsert, by name.
    r = await http.post(f"{API}/transaction", json={"timers": [
        timer_op("only", "k42", 7_200_000, "again"), timer_op("only", "new", 1000, "n")]})
    assert [t["status"] for t in r.json()["results"]] == ["rescheduled", "scheduled"]
    assert (await http.get(f"{TIMERS}/only/k42")).json()["data"] == "again"


async def test_a_bundle_that_also_cancels_or_pushes_stays_a_transaction(
    broker: BrokerHandle, http: httpx.AsyncClient
) -> None:
    writer = broker.context.schedules
    await http.post(f"{API}/transaction", json={"timers": [timer_op("mixed", "gone", 60_000, 1)]})
    before = writer.statistics().batches
    r = await http.post(f"{API}/transaction", json={"timers": [
        timer_op("mixed", "kept", 60_000, 2), timer_op("mixed", "gone", 0, op="cancel")]})
    assert [t["status"] for t in r.json()["results"]] == ["scheduled", "cancelled"]
    r = await http.post(f"{API}/transaction", json={
        "operations": [{"type": "push", "items": [{"queue": "side", "payload": 3}]}],
        "timers": [timer_op("mixed", "pushed-with", 60_000, 3)]})
    assert [t.get("status") for t in r.json()["results"]] == ["queued", "scheduled"]
    assert writer.statistics().batches == before  # both in the bundle's own transaction
    assert (await pop(http, "side"))["messages"][0]["data"] == 3
    assert (await http.get(f"{TIMERS}/mixed/gone")).json()["found"] is False

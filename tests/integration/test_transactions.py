"""POST /api/v1/transaction: every operation commits or none does."""

from __future__ import annotations

import httpx
import pytest

from .test_log import API, pop, push


def _ack_op(message: dict, status: str = "completed") -> dict:
    return {"type": "ack", "transactionId": message["transactionId"],
            "partitionId": message["partitionId"], "leaseId": message["leaseId"],
            "status": status}


async def test_ack_push_and_state_commit_together(http: httpx.AsyncClient) -> None:
    await push(http, "bookings", [{"id": "b1"}])
    message = (await pop(http, "bookings"))["messages"][0]
    r = await http.post(f"{API}/transaction", json={"operations": [
        _ack_op(message),
        {"type": "push", "items": [{"queue": "audit", "payload": {"event": "booking.held"}}]},
        {"type": "kv.put", "namespace": "saga", "key": "b1", "value": {"step": "held"},
         "ttlSeconds": 86400},
        {"type": "kv.delete", "namespace": "saga", "key": "never-there"},
    ]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["success"] is True
    assert [res["type"] for res in body["results"]] == ["ack", "push", "kv.put", "kv.delete"]
    assert body["results"][0]["leaseReleased"] is True
    assert body["results"][1]["items"][0]["status"] == "queued"
    assert body["results"][3]["deleted"] is False
    audit = await pop(http, "audit")
    assert audit["messages"][0]["data"] == {"event": "booking.held"}
    assert (await http.get(f"{API}/kv/saga/b1")).json()["value"] == {"step": "held"}
    assert await pop(http, "bookings") is None


async def test_a_failing_last_operation_leaves_no_trace(http: httpx.AsyncClient) -> None:
    await http.put(f"{API}/kv/saga/b2", json={"value": {"step": "old"}})
    await push(http, "bookings", [{"id": "b2"}])
    message = (await pop(http, "bookings"))["messages"][0]
    r = await http.post(f"{API}/transaction", json={"operations": [
        _ack_op(message),
        {"type": "push", "items": [{"queue": "audit", "payload": "should vanish"}]},
        {"type": "kv.put", "namespace": "saga", "key": "b2", "value": {"step": "new"}},
        {"type": "ack", "transactionId": "ghost", "partitionId": message["partitionId"]},
    ]})
    assert r.status_code == 404
    body = r.json()
    assert (body["ok"], body["error"], body["operation"]) == (False, "message_not_found", 3)
    assert body["message"].startswith("operations[3]:")
    # Nothing happened: no audit message, the KV value is unchanged, the ack was undone.
    assert await pop(http, "audit") is None
    assert (await http.get(f"{API}/kv/saga/b2")).json()["value"] == {"step": "old"}
    r = await http.post(f"{API}/ack", json={
        "transactionId": message["transactionId"], "partitionId": message["partitionId"]})
    assert r.json()[0]["alreadyAcked"] is False


@pytest.mark.parametrize(
    ("operations", "status", "code", "index"),
    [
        ([{"type": "timer", "queue": "q"}], 400, "timer_in_operations", 0),
        ([{"type": "push", "items": []}, {"type": "schedule"}], 400, "invalid_items", 0),
        ([{"type": "kv.put", "namespace": "n", "key": "k", "value": 1},
          {"type": "timer.schedule", "queue": "q"}], 400, "timer_in_operations", 1),
        ([{"type": "mystery"}], 400, "invalid_operation", 0),
        (["not an object"], 400, "invalid_operation", 0),
        ([{"type": "kv.put", "namespace": "n", "key": "k", "value": 1, "ttlSeconds": 0.5}],
         400, "invalid_ttl", 0),
        ([{"type": "push", "items": [{"queue": "q", "payload": "x" * (1024 * 1024 + 1)}]}],
         413, "payload_too_large", 0),
    ],
)
async def test_invalid_bundles_are_refused_whole(
    http: httpx.AsyncClient, operations: list, status: int, code: str, index: int
) -> None:
    r = await http.post(f"{API}/transaction", json={"operations": operations})
    assert r.status_code == status
    assert (r.json()["error"], r.json()["operation"]) == (code, index)
    assert (await http.get(f"{API}/resources/queues")).json() == {"queues": []}
    assert (await http.get(f"{API}/kv/n/k")).status_code == 404


async def test_timer_message_points_at_the_timers_array(http: httpx.AsyncClient) -> None:
    r = await http.post(f"{API}/transaction", json={"operations": [{"type": "timer"}]})
    assert "top-level 'timers' array" in r.json()["message"]


async def test_empty_or_missing_operations(http: httpx.AsyncClient) -> None:
    for body in ({}, {"operations": []}, {"operations": {}}):
        r = await http.post(f"{API}/transaction", json=body)
        assert (r.status_code, r.json()["error"]) == (400, "invalid_operations")

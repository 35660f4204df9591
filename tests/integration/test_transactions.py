"""POST /api/v1/transaction: every operation commits or none does."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import trio

from .test_log import API, pop, push


def _ack_op(message: dict, status: str = "completed") -> dict:
    return {"type": "ack", "transactionId": message["transactionId"],
            "partitionId": message["partitionId"], "leaseId": message["leaseId"],
            "status": status}


async def test_ack_push_and_state_commit_together(http: httpx.AsyncClient) -> None:
    await push(http, "bookings", [{"id": "b1"}])
    message = (await pop(http, "bookings"))["messages"][0]
    r = await http.post(f"{API}/transaction", json={
        "operations": [
            _ack_op(message),
            {"type": "push", "items": [{"queue": "audit", "payload": {"event": "booking.held"}},
                                       {"queue": "audit", "payload": {"event": "saga.open"}}]},
        ],
        "kv": [
            {"op": "put", "ns": "saga", "key": "b1", "value": {"step": "held"},
             "ttlSeconds": 86400},
            {"op": "delete", "ns": "saga", "key": "never-there"},
        ],
        "requiredLeases": [message["leaseId"]],
    })
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["success"] is True
    # One flat array: the ack, each pushed item, then the kv ops; index counts in it.
    assert [(res["index"], res["type"]) for res in body["results"]] == [
        (0, "ack"), (1, "push"), (2, "push"), (3, "kv"), (4, "kv")]
    assert body["results"][0]["leaseReleased"] is True
    assert body["results"][2]["status"] == "queued"
    assert (body["results"][3]["op"], body["results"][3]["applied"]) == ("put", True)
    assert (body["results"][4]["applied"], body["results"][4]["reason"]) == (False, "absent")
    audit = await pop(http, "audit", batch=10)
    assert [m["data"] for m in audit["messages"]] == [{"event": "booking.held"},
                                                      {"event": "saga.open"}]
    assert (await http.get(f"{API}/kv/saga/b1")).json()["value"] == {"step": "held"}
    assert await pop(http, "bookings") is None


async def test_a_failing_last_operation_leaves_no_trace(http: httpx.AsyncClient) -> None:
    await http.put(f"{API}/kv/saga/b2", json={"value": {"step": "old"}, "forever": True})
    await push(http, "bookings", [{"id": "b2"}])
    message = (await pop(http, "bookings"))["messages"][0]
    r = await http.post(f"{API}/transaction", json={"operations": [
        _ack_op(message),
        {"type": "push", "items": [{"queue": "audit", "payload": "should vanish"}]},
        {"type": "ack", "transactionId": "ghost", "partitionId": message["partitionId"]},
    ], "kv": [{"op": "put", "ns": "saga", "key": "b2", "value": {"step": "new"},
               "forever": True}]})
    # Refused whole as Queen answers it: 200, success false, the text in error.
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["success"], body["code"], body["operation"], body["failedIndex"],
            body["results"]) == (False, "unresolvable", 2, 2, [])
    assert body["error"].startswith("operations[2]:") and "rolled back" in body["error"]
    # Nothing happened: no audit message, the KV value is unchanged, the ack was undone.
    assert await pop(http, "audit") is None
    assert (await http.get(f"{API}/kv/saga/b2")).json()["value"] == {"step": "old"}
    r = await http.post(f"{API}/ack", json={
        "transactionId": message["transactionId"], "partitionId": message["partitionId"]})
    assert r.json()[0]["noop"] is False


async def test_a_top_level_kv_gate_that_loses_commits_nothing(http: httpx.AsyncClient) -> None:
    """The silent drop this broker had: a bundle with Queen's top-level ``kv`` array used to
    commit with the array ignored, so a gate that should have refused it pushed anyway."""
    def bundle(attempt: int) -> dict:
        return {"operations": [{"type": "push", "items": [
                    {"queue": "once", "payload": {"attempt": attempt}}]}],
                "kv": [{"op": "putIfAbsent", "ns": "dedup", "key": "evt-1", "value": attempt,
                        "ttlSeconds": 300, "required": True},
                       {"op": "incr", "ns": "dedup", "key": "count", "delta": 1,
                        "ttlSeconds": 300}],
                "requiredLeases": []}

    first = await http.post(f"{API}/transaction", json=bundle(1))
    assert first.json()["success"] is True
    second = await http.post(f"{API}/transaction", json=bundle(2))
    assert second.status_code == 200
    lost = second.json()
    assert {k: lost[k] for k in ("success", "ok", "reason", "failedIndex", "kvReason",
                                 "value", "results")} == {
        "success": False, "ok": False, "reason": "kv_precondition", "failedIndex": 1,
        "kvReason": "exists", "value": 1, "results": []}
    assert lost["version"] > 0 and lost["transactionId"]
    once = await pop(http, "once", batch=10)
    assert [m["data"] for m in once["messages"]] == [{"attempt": 1}]
    r = await http.post(f"{API}/kv", json=[{"op": "get", "ns": "dedup", "key": "count"}])
    assert r.json()["results"][0]["value"] == 1  # the losing bundle's incr rolled back too


async def test_required_leases_must_be_live(http: httpx.AsyncClient) -> None:
    await http.post(f"{API}/configure", json={"queue": "leased", "options": {"leaseTime": 1}})
    await push(http, "leased", [1, 2])
    message = (await pop(http, "leased"))["messages"][0]
    lease = message["leaseId"]
    # An ack that names no lease borrows the bundle's one required lease.
    bare = {k: v for k, v in _ack_op(message).items() if k != "leaseId"}
    await trio.sleep(1.2)  # the lease runs out
    r = await http.post(f"{API}/transaction", json={
        "operations": [bare, {"type": "push", "items": [{"queue": "after", "payload": 1}]}],
        "kv": [{"op": "put", "ns": "leases", "key": "k", "value": 1, "forever": True}],
        "requiredLeases": [lease]})
    body = r.json()
    assert (r.status_code, body["success"], body["code"], body["lease"], body["results"]) == (
        200, False, "lease_lost", lease, [])
    assert "rolled back" in body["error"] and "failedIndex" not in body
    assert await pop(http, "after") is None
    assert (await http.get(f"{API}/kv/leases/k")).json()["found"] is False
    again = (await pop(http, "leased"))["messages"][0]
    assert again["transactionId"] == message["transactionId"]  # never acked
    r = await http.post(f"{API}/transaction", json={
        "operations": [bare], "requiredLeases": [again["leaseId"]]})
    assert r.status_code == 200 and r.json()["results"][0]["status"] == "completed"


async def test_an_ack_under_an_expired_lease_refuses_the_bundle_whole(
        http: httpx.AsyncClient) -> None:
    """Queen's answer (py26 test_a_bundle_with_an_ack_under_an_expired_lease_is_refused_whole):
    200 ``success: false`` with the text in ``error`` and no results, not a 409; nothing of
    the bundle is written, and each holder still settles its own message afterwards."""
    await http.post(f"{API}/configure", json={"queue": "fenced-a", "options": {"leaseTime": 1}})
    await push(http, "fenced-a", ["a"])
    await push(http, "fenced-b", ["b"])
    a = (await pop(http, "fenced-a"))["messages"][0]
    b = (await pop(http, "fenced-b"))["messages"][0]
    await trio.sleep(1.2)  # lease A runs out, and another consumer takes the message
    taken = (await pop(http, "fenced-a"))["messages"][0]
    assert taken["transactionId"] == a["transactionId"]
    r = await http.post(f"{API}/transaction", json={
        "operations": [_ack_op(b), _ack_op(a),
                       {"type": "push", "items": [{"queue": "fenced-out", "payload": 1}]}],
        "kv": [{"op": "put", "ns": "fenced", "key": "k", "value": 1, "forever": True}]})
    body = r.json()
    assert (r.status_code, body["success"], body["ok"], body["results"]) == (200, False, False, [])
    assert (body["code"], body["operation"], body["failedIndex"]) == ("lease_lost", 1, 1)
    assert "rolled back" in body["error"] and body["transactionId"]
    assert await pop(http, "fenced-out") is None
    assert (await http.get(f"{API}/kv/fenced/k")).json()["found"] is False
    for holder in (taken, b):  # b's ack was rolled back with the rest
        r = await http.post(f"{API}/transaction", json={"operations": [_ack_op(holder)]})
        assert (r.status_code, r.json()["success"]) == (200, True), r.text


@pytest.mark.parametrize(
    ("operations", "status", "code", "index"),
    [
        ([{"type": "timer", "queue": "q"}], 400, "timer_in_operations", 0),
        ([{"type": "push", "items": "nope"}, {"type": "schedule"}], 400, "invalid_items", 0),
        ([{"type": "push", "items": [{"queue": "q", "payload": 1}]},
          {"type": "timer.schedule", "queue": "q"}], 400, "timer_in_operations", 1),
        ([{"type": "kv.put", "namespace": "n", "key": "k", "value": 1}], 400,
         "kv_in_operations", 0),
        ([{"type": "mystery"}], 400, "invalid_operation", 0),
        (["not an object"], 400, "invalid_operation", 0),
        ([{"type": "push", "items": [{"queue": "q", "payload": "x" * (16 * 1024 * 1024 + 1)}]}],
         413, "payload_too_large", 0),
    ],
)
async def test_invalid_bundles_are_refused_whole(
    http: httpx.AsyncClient, operations: list, status: int, code: str, index: int
) -> None:
    r = await http.post(f"{API}/transaction", json={
        "operations": operations,
        "kv": [{"op": "put", "ns": "n", "key": "k", "value": 1, "forever": True}]})
    assert r.status_code == status
    assert (r.json()["error"], r.json()["operation"]) == (code, index)
    assert (await http.get(f"{API}/resources/queues")).json() == {"queues": []}
    assert (await http.get(f"{API}/kv/n/k")).json()["found"] is False


@pytest.mark.parametrize(("body", "code", "reason"), [
    ({"operations": [], "kv": [], "extra": 1}, "unknown_field", None),
    ({"operations": [], "Kv": [{"op": "get", "ns": "n", "key": "k"}]}, "unknown_field", None),
    ({"kv": {"op": "get"}}, "invalid_operations", None),
    ({"kv": [{"op": "put", "ns": "n", "key": "k", "value": 1}]}, "kv_bad_request",
     "kv_expiry_not_specified"),
    ({"kv": [{"op": "getPrefix", "ns": "n", "prefix": "k"}]}, "kv_bad_request",
     "kv_prefix_in_transaction"),
    ({"kv": [{"op": "get", "ns": "n", "key": f"k{i}"} for i in range(65)]}, "kv_bad_request",
     "kv_too_many_ops"),
    ({"kv": [{"op": "put", "ns": "BAD", "key": "k", "value": 1, "forever": True}]},
     "kv_bad_request", "kv_bad_namespace"),
    ({"operations": [], "requiredLeases": ["not-a-uuid"]}, "invalid_lease_id", None),
    ({"operations": [], "requiredLeases": "x"}, "invalid_operations", None),
])
async def test_bad_top_level_fields_are_refused(
    http: httpx.AsyncClient, body: dict, code: str, reason: str | None
) -> None:
    body = {**body, "operations": [*body.get("operations", []), {"type": "push", "items": [
        {"queue": "never", "payload": 1}]}]}
    r = await http.post(f"{API}/transaction", json=body)
    assert (r.status_code, r.json()["error"], r.json().get("reason")) == (400, code, reason)
    assert (await http.get(f"{API}/resources/queues")).json() == {"queues": []}


async def test_timer_message_points_at_the_timers_array(http: httpx.AsyncClient) -> None:
    r = await http.post(f"{API}/transaction", json={"operations": [{"type": "timer"}]})
    assert "top-level 'timers' array" in r.json()["message"]
    r = await http.post(f"{API}/transaction", json={"operations": [{"type": "kv.delete"}]})
    assert "top-level 'kv' array" in r.json()["message"]


async def test_empty_or_missing_operations(http: httpx.AsyncClient) -> None:
    body: dict[str, Any]
    for body in ({}, {"operations": []}, {"operations": {}}, {"operations": [], "kv": []},
                 {"operations": None, "kv": None, "timers": None}):
        r = await http.post(f"{API}/transaction", json=body)
        assert (r.status_code, r.json()["error"]) == (400, "invalid_operations")

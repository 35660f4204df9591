"""The OpenAPI document's schemas are generated from the wire models (queen_trio/models): each
answer the broker gives on the timer and log routes validates against the schema /openapi.json
declares for it, a body the schema declares is one the route takes, and the SDK decodes the
log's answers through the same models."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import jsonschema
import msgspec
import pytest

from queen_trio.client import models as sdk

from ..timer_ops import timer_op

API = "/api/v1"


@pytest.fixture
async def document(http: httpx.AsyncClient) -> dict[str, Any]:
    r = await http.get("/openapi.json")
    assert r.status_code == 200
    return r.json()


def check(document: dict[str, Any], path: str, method: str, answer: httpx.Response,
          status: int = 200) -> None:
    """``answer`` validates against the ``status`` schema ``document`` gives ``method path``,
    its $refs resolved in the document itself."""
    assert answer.status_code == status, answer.text
    declared = document["paths"][path][method]["responses"][str(status)]["content"][
        "application/json"]["schema"]
    schema = {**declared, "components": document["components"]}
    jsonschema.validate(answer.json(), schema, cls=jsonschema.Draft202012Validator)


def refuses(document: dict[str, Any], path: str, method: str, answer: Any,
            status: int = 200) -> bool:
    try:
        check(document, path, method, httpx.Response(status, json=answer), status)
    except jsonschema.ValidationError:
        return True
    return False


async def test_timer_answers_validate_against_the_generated_schemas(
    http: httpx.AsyncClient, document: dict[str, Any],
) -> None:
    batch_body = {"operations": [timer_op("wm", "a", 60_000, {"n": 1}),
                                 timer_op("wm", "b/c", 60_000, ["x", 2.5, None]),
                                 timer_op("wm", "gone", 0, op="cancel", txn="t-1")]}
    # The body the schema declares is the one the route takes.
    body_schema = {**document["paths"][f"{API}/timers"]["post"]["requestBody"]["content"][
        "application/json"]["schema"], "components": document["components"]}
    jsonschema.validate(batch_body, body_schema, cls=jsonschema.Draft202012Validator)
    batch = await http.post(f"{API}/timers", json=batch_body)
    check(document, f"{API}/timers", "post", batch)
    assert [r["status"] for r in batch.json()["results"]] == ["scheduled", "scheduled", "absent"]

    put = await http.put(f"{API}/timers/wm/a", json={"delayMs": 60_000, "payload": {"n": 2}})
    check(document, f"{API}/timers/{{queue}}/{{key}}", "put", put)
    assert put.json()["status"] == "rescheduled"

    found = await http.get(f"{API}/timers/wm/a")
    check(document, f"{API}/timers/{{queue}}/{{key}}", "get", found)
    assert found.json()["found"] is True and found.json()["data"] == {"n": 2}
    missing = await http.get(f"{API}/timers/wm/nothing")
    check(document, f"{API}/timers/{{queue}}/{{key}}", "get", missing)
    assert missing.json() == {"found": False, "queue": "wm", "timerKey": "nothing"}

    page = await http.get(f"{API}/timers/wm?limit=1")
    check(document, f"{API}/timers/{{queue}}", "get", page)
    assert page.json()["truncated"] is True and page.json()["nextAfter"] == "a"
    count = await http.get(f"{API}/timers/wm?mode=count&prefix=b")
    check(document, f"{API}/timers/{{queue}}", "get", count)
    assert count.json() == {"queue": "wm", "prefix": "b", "count": 1}

    cancelled = await http.delete(f"{API}/timers/wm/a")
    check(document, f"{API}/timers/{{queue}}/{{key}}", "delete", cancelled)
    assert cancelled.json()["status"] == "cancelled"

    # The schemas are not vacuous: an answer missing a required field is refused by them.
    wrong = {k: v for k, v in cancelled.json().items() if k != "timerKey"}
    assert refuses(document, f"{API}/timers/{{queue}}/{{key}}", "delete", wrong)
    assert refuses(document, f"{API}/timers", "post", {"results": [{"ok": "yes"}]})


async def test_log_answers_validate_against_the_generated_schemas(
    http: httpx.AsyncClient, document: dict[str, Any],
) -> None:
    items = [{"queue": "wl", "partition": p, "payload": {"n": i, "p": p},
              "transactionId": f"t-{p}-{i}"} for p in ("a", "b") for i in range(3)]
    pushed = await http.post(f"{API}/push", json={"items": items})
    check(document, f"{API}/push", "post", pushed, status=201)
    again = await http.post(f"{API}/push", json={"items": items[:1]})
    check(document, f"{API}/push", "post", again, status=201)
    assert again.json()[0]["status"] == "duplicate"
    assert again.json()[0]["message_id"] == pushed.json()[0]["messageId"]

    pop_path = f"{API}/pop/queue/{{queue}}"
    one = await http.get(f"{API}/pop/queue/wl/partition/a",
                         params={"consumerGroup": "g", "batch": 2})
    check(document, f"{pop_path}/partition/{{partition}}", "get", one)
    got = one.json()
    assert [m["data"] for m in got["messages"]] == [{"n": 0, "p": "a"}, {"n": 1, "p": "a"}]

    several = await http.get(f"{API}/pop/queue/wl", params={
        "consumerGroup": "h", "partitions": 2, "autopilot": "true"})
    check(document, pop_path, "get", several)
    assert len(several.json()["partitions"]) == 2 and "autopilot" in several.json()

    lease = got["leaseId"]
    extended = await http.post(f"{API}/lease/{lease}/extend", json={"seconds": 30})
    check(document, f"{API}/lease/{{lease_id}}/extend", "post", extended)
    assert extended.json()["renewed"] == 1
    unknown = await http.post(f"{API}/lease/{uuid.uuid4()}/extend", json={})
    check(document, f"{API}/lease/{{lease_id}}/extend", "post", unknown)
    assert unknown.json()["code"] == "lease_not_found"

    first, second = got["messages"]
    acked = await http.post(f"{API}/ack", json={
        "transactionId": first["transactionId"], "partitionId": first["partitionId"],
        "leaseId": lease, "consumerGroup": "g", "status": "completed"})
    check(document, f"{API}/ack", "post", acked)
    assert acked.json()[0]["success"] is True
    batch = await http.post(f"{API}/ack/batch", json={"consumerGroup": "g", "acknowledgments": [
        {"transactionId": first["transactionId"], "partitionId": first["partitionId"],
         "leaseId": lease, "status": "completed"},
        {"transactionId": "nope", "partitionId": first["partitionId"], "leaseId": lease,
         "status": "completed"}]})
    check(document, f"{API}/ack/batch", "post", batch)
    assert [r["success"] for r in batch.json()] == [True, False]
    assert batch.json()[0]["noop"] is True

    settled = await http.post(f"{API}/pop/queue/wl/partition/a", params={
        "consumerGroup": "g", "batch": 5}, json={"consumerGroup": "g", "acknowledgments": [
            {"transactionId": second["transactionId"], "partitionId": second["partitionId"],
             "leaseId": lease, "status": "completed"},
            {"transactionId": "nope", "partitionId": second["partitionId"], "leaseId": lease,
             "status": "completed"}]})
    check(document, f"{pop_path}/partition/{{partition}}", "post", settled)
    answer = settled.json()
    assert answer["acks"]["completed"] == 1 and len(answer["ackRefused"]) == 1
    assert [m["data"]["n"] for m in answer["messages"]] == [2]

    # A broken answer is refused by these schemas.
    assert refuses(document, f"{API}/push", "post",
                   [{k: v for k, v in pushed.json()[0].items() if k != "message_id"}],
                   status=201)
    broken = {**got, "messages": [{**first, "offset": "1"}]}
    assert refuses(document, pop_path, "get", broken)
    assert refuses(document, f"{API}/ack/batch", "post", [{**batch.json()[1], "code": "odd"}])
    assert refuses(document, f"{API}/lease/{{lease_id}}/extend", "post",
                   {**extended.json(), "renewed": None})

    # The SDK decodes these answers through the same models, and refuses the broken one.
    assert sdk.PushResult.from_wire(again.json()[0]).message_id == pushed.json()[0]["messageId"]
    assert [m.data for m in sdk.Batch.from_wire(got)] == [{"n": 0, "p": "a"}, {"n": 1, "p": "a"}]
    settled_sdk = sdk.SettledPop.from_wire(answer)
    assert [r.refused for r in settled_sdk.refused] == ["unresolvable"]
    assert len(settled_sdk.batch) == 1
    with pytest.raises(msgspec.ValidationError):
        sdk.Batch.from_wire(broken)

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
from queen_trio.models import log as log_models
from queen_trio.models import schema

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


async def test_kv_answers_validate_against_the_generated_schemas(
    http: httpx.AsyncClient, document: dict[str, Any],
) -> None:
    kv = f"{API}/kv"
    batch = await http.post(kv, json={"operations": [
        {"op": "put", "ns": "wm", "key": "a", "value": {"n": 1}, "ttlSeconds": 600},
        {"op": "putIfAbsent", "ns": "wm", "key": "b", "value": [1, None], "forever": True},
        {"op": "incr", "ns": "wm", "key": "n", "delta": 2, "max": 10, "forever": True},
        {"op": "delete", "ns": "wm", "key": "never-there"},
    ]})
    check(document, kv, "post", batch)
    assert [(r["op"], r["applied"]) for r in batch.json()["results"]] == [
        ("put", True), ("putIfAbsent", True), ("incr", True), ("delete", False)]
    b_version = batch.json()["results"][1]["version"]
    reads = await http.post(kv, json=[
        {"op": "get", "ns": "wm", "key": "a"}, {"op": "get", "ns": "wm", "key": "nothing"},
        {"op": "getMany", "ns": "wm", "keys": ["a", "b", "zz"]},
        {"op": "getPrefix", "ns": "wm", "prefix": "a", "limit": 1},
        {"op": "getPrefix", "ns": "wm", "prefix": "b", "keysOnly": True},
        {"op": "check", "ns": "wm", "key": "b", "expect": b_version},
        {"op": "putIfAbsent", "ns": "wm", "key": "b", "value": 0, "forever": True},
        {"op": "incr", "ns": "wm", "key": "n", "delta": 9, "max": 10, "forever": True},
    ])
    check(document, kv, "post", reads)
    got, miss, many, page, keys, checked, exists, limit = reads.json()["results"]
    assert got["found"] is True and got["value"] == {"n": 1} and got["expiresAt"]
    assert miss == {"index": 1, "op": "get", "found": False, "key": "nothing"}
    assert many["missing"] == ["zz"] and [r["key"] for r in many["rows"]] == ["a", "b"]
    assert many["rows"][1]["expiresAt"] is None  # forever: a null, not left out
    assert page["truncated"] is False and page["nextAfter"] is None
    assert "value" not in keys["rows"][0]
    assert checked["applied"] is True and "value" not in checked
    assert (exists["reason"], exists["value"]) == ("exists", [1, None])
    assert (limit["reason"], limit["value"]) == ("limit", 2)

    lost = await http.post(kv, json=[{"op": "check", "ns": "wm", "key": "a", "expect": 99,
                                      "required": True}])
    check(document, kv, "post", lost)
    assert lost.json()["reason"] == "kv_precondition" and lost.json()["kvReason"] == "version"

    path = f"{kv}/{{namespace}}/{{key}}"
    put = await http.put(f"{kv}/wm/c/d", json={"value": "x", "forever": True})
    check(document, path, "put", put)
    assert (put.json()["op"], put.json()["applied"], put.json()["expiresAt"]) == ("put", True,
                                                                                 None)
    found = await http.get(f"{kv}/wm/c/d")
    check(document, path, "get", found)
    assert found.headers["ETag"] == f'"{found.json()["version"]}"'
    check(document, path, "get", await http.get(f"{kv}/wm/nothing"))
    refused = await http.request("DELETE", f"{kv}/wm/c/d",
                                 json={"expect": 99, "required": True})
    check(document, path, "delete", refused)
    assert refused.json()["failedIndex"] == 0
    deleted = await http.delete(f"{kv}/wm/c/d")
    check(document, path, "delete", deleted)
    assert (deleted.json()["applied"], deleted.json()["value"]) == (True, "x")

    # Not vacuous: a result without its key, or a reason Queen's clients do not know.
    assert refuses(document, kv, "post", {"results": [{"index": 0, "op": "put",
                                                       "applied": True, "version": 1}]})
    assert refuses(document, path, "get", {**got, "version": "1"})
    assert refuses(document, kv, "post", {"results": [{**exists, "reason": "busy"}]})


async def test_lock_answers_validate_against_the_generated_schemas(
    http: httpx.AsyncClient, document: dict[str, Any],
) -> None:
    locks = f"{API}/locks"

    async def call(*ops: dict[str, Any]) -> list[dict[str, Any]]:
        r = await http.post(locks, json={"operations": list(ops)})
        check(document, locks, "post", r)
        results: list[dict[str, Any]] = r.json()["results"]
        return results

    (mine,) = await call({"op": "acquire", "name": "wm", "ttlSeconds": 60, "owner": "w1"})
    assert mine["acquired"] is True and mine["guard"]["op"] == "check"
    (again,) = await call({"op": "acquire", "name": "wm", "ttlSeconds": 60, "owner": "w1"})
    taken, sem = await call({"op": "acquire", "name": "wm", "ttlSeconds": 60, "owner": "w2"},
                            {"op": "acquire", "name": "wm-sem", "ttlSeconds": 60, "limit": 3})
    assert again["already"] is True and again["token"] == mine["token"]
    assert (taken["acquired"], taken["reason"]) == (False, "held")
    assert taken["holders"] == [{"slot": 0, "owner": "w1"}]
    assert sem["owner"] is None  # none given: a null, not left out
    (held,) = await call({"op": "get", "name": "wm"})
    renew = {"op": "renew", "name": "wm", "token": mine["token"], "ttlSeconds": 60}
    (renewed,) = await call(renew)
    (stale,) = await call(renew)
    assert held["held"] is True and held["holders"][0]["token"] == mine["token"]
    assert renewed["renewed"] is True and renewed["token"] > mine["token"]
    assert (stale["renewed"], stale["reason"]) == (False, "lost")
    release = {"op": "release", "name": "wm", "token": renewed["token"]}
    (released,) = await call(release)
    (gone,) = await call(release)
    assert released == {"index": 0, "op": "release", "name": "wm", "released": True,
                        "slot": 0}
    assert (gone["released"], gone["reason"], gone["holders"]) == (False, "lost", [])

    assert refuses(document, locks, "post", {"results": [{**mine, "acquired": "yes"}]})
    assert refuses(document, locks, "post", {"results": [{**held, "op": "steal"}]})
    assert refuses(document, locks, "post", {"results": [
        {k: v for k, v in released.items() if k != "slot"}]})


async def test_transaction_answers_validate_against_the_generated_schemas(
    http: httpx.AsyncClient, document: dict[str, Any],
) -> None:
    path = f"{API}/transaction"
    done = await http.post(path, json={
        "operations": [{"type": "push", "items": [{"queue": "wm-audit", "payload": {"a": 1}}]}],
        "kv": [{"op": "put", "ns": "wm-t", "key": "k", "value": 1, "forever": True},
               {"op": "get", "ns": "wm-t", "key": "nothing"}],
        "timers": [timer_op("wm-t", "t", 60_000, {"n": 1})],
    })
    check(document, path, "post", done)
    results = done.json()["results"]
    assert [(r["index"], r["type"]) for r in results] == [
        (0, "push"), (1, "kv"), (2, "kv"), (3, "timer")]
    # The kv items are KV results, the timer's a timer result: each validates against its own.
    schemas = document["components"]["schemas"]
    kv_item = {**schemas["KvResults"]["properties"]["results"]["items"],
               "components": document["components"]}
    timer_item = {"$ref": "#/components/schemas/TimerResult",
                  "components": document["components"]}
    for item in results[1:3]:
        jsonschema.validate(item, kv_item, cls=jsonschema.Draft202012Validator)
    jsonschema.validate(results[3], timer_item, cls=jsonschema.Draft202012Validator)

    lost = await http.post(path, json={
        "operations": [{"type": "push", "items": [{"queue": "wm-audit", "payload": {"a": 2}}]}],
        "kv": [{"op": "check", "ns": "wm-t", "key": "k", "expect": 99, "required": True}]})
    check(document, path, "post", lost)
    assert (lost.json()["success"], lost.json()["failedIndex"]) == (False, 1)
    assert lost.json()["transactionId"]

    refused = await http.post(path, json={"operations": [
        {"type": "ack", "transactionId": "ghost", "partitionId": results[0]["partitionId"]}]})
    check(document, path, "post", refused)
    assert (refused.json()["success"], refused.json()["code"]) == (False, "unresolvable")

    assert refuses(document, path, "post", {**done.json(), "success": "yes"})
    assert refuses(document, path, "post", {k: v for k, v in lost.json().items()
                                            if k != "kvReason"})
    assert refuses(document, path, "post", {**refused.json(), "code": "whatever"})
    assert refuses(document, path, "post", {**done.json(), "results": [
        {**results[0], "type": "mystery"}]})


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


def _request_schema(document: dict[str, Any], path: str, method: str = "post") -> dict[str, Any]:
    declared = document["paths"][path][method]["requestBody"]["content"]["application/json"][
        "schema"]
    return {**declared, "components": document["components"]}


def _declared(document: dict[str, Any], path: str, body: Any, method: str = "post") -> bool:
    try:
        jsonschema.validate(body, _request_schema(document, path, method),
                            cls=jsonschema.Draft202012Validator)
    except jsonschema.ValidationError:
        return False
    return True


async def test_kv_locks_and_transaction_requests_are_the_models_the_routes_take(
    http: httpx.AsyncClient, document: dict[str, Any],
) -> None:
    """The request bodies /openapi.json declares for KV, locks and transactions are the models
    the routes decode through (issue 29): what queen-mq sends is declared and taken; a field
    the model does not have is neither (the route names it, as its rules always did)."""
    from queen.kv import ops as queen_kv

    kv_ops = [queen_kv.put("wm-req", "k", {"n": 1}, forever=True),
              queen_kv.put_if_absent("wm-req", "once", True, ttl_seconds=60),
              queen_kv.incr("wm-req", "hits", delta=2, forever=True),
              queen_kv.get_many("wm-req", ["k", "nothing"]),
              queen_kv.get_prefix("wm-req", "k"),
              queen_kv.check("wm-req", "k", expect=0)]
    call = {"operations": kv_ops}
    assert _declared(document, f"{API}/kv", call) and _declared(document, f"{API}/kv", kv_ops)
    r = await http.post(f"{API}/kv", json=call)
    check(document, f"{API}/kv", "post", r)
    assert [x["op"] for x in r.json()["results"]] == [o["op"] for o in kv_ops]
    typo = {"operations": [{**kv_ops[0], "vaule": 2}]}
    assert not _declared(document, f"{API}/kv", typo)
    r = await http.post(f"{API}/kv", json=typo)
    assert (r.status_code, r.json()["error"], r.json()["reason"]) == (
        400, "kv_bad_request", "kv_unknown_field")

    path = f"{API}/kv/{{namespace}}/{{key}}"
    assert _declared(document, path, {"value": [1, 2], "ttlSeconds": 30}, "put")
    assert not _declared(document, path, {"value": 1, "forever": True, "key": "x"}, "put")
    assert not _declared(document, path, {"expect": 1, "value": 2}, "delete")

    locks = {"operations": [{"op": "acquire", "name": "wm-lock", "ttlSeconds": 30,
                             "owner": "me", "limit": 2}, {"op": "get", "name": "other"}]}
    assert _declared(document, f"{API}/locks", locks)
    r = await http.post(f"{API}/locks", json=locks)
    check(document, f"{API}/locks", "post", r)
    assert r.json()["results"][0]["acquired"] is True
    forever = [{"op": "acquire", "name": "wm-lock2", "ttlSeconds": 30, "forever": True}]
    assert not _declared(document, f"{API}/locks", forever)
    r = await http.post(f"{API}/locks", json=forever)
    assert (r.status_code, r.json()["reason"]) == (400, "locks_ttl_required")

    bundle = {"operations": [{"type": "push", "items": [
                  {"queue": "wm-req", "payload": {"a": 1}, "transactionId": "wm-req-1"}]}],
              "requiredLeases": [],
              "kv": [queen_kv.put("wm-req", "tx", 1, forever=True)],
              "timers": [timer_op("wm-req", "t", 60_000, {"n": 1})]}
    assert _declared(document, f"{API}/transaction", bundle)
    r = await http.post(f"{API}/transaction", json=bundle)
    check(document, f"{API}/transaction", "post", r)
    assert r.json()["success"] is True
    bare_ack = {"operations": [{"type": "ack", "partitionId": str(uuid.uuid4())}]}
    assert not _declared(document, f"{API}/transaction", bare_ack)
    r = await http.post(f"{API}/transaction", json=bare_ack)
    assert (r.status_code, r.json()["error"]) == (400, "missing_field")
    assert not _declared(document, f"{API}/transaction", {**bundle, "kvOps": []})


async def test_log_requests_are_the_models_the_routes_take(
    http: httpx.AsyncClient, document: dict[str, Any],
) -> None:
    """The request bodies /openapi.json declares for push, ack, ack/batch, settle-and-pop and
    lease extend are the models the routes decode through (issue 29): a declared body is
    taken; one the model refuses is not declared, and the route answers the precise 400 its
    rules always gave (fields a model does not name are ignored, as Queen ignores them)."""
    push = {"items": [{"queue": "wm-log", "partition": "a", "payload": {"n": 1},
                       "transactionId": "wm-log-1", "traceId": "ignored"},
                      {"queue": "wm-log", "payload": [1, "two", None]}]}
    assert _declared(document, f"{API}/push", push)
    r = await http.post(f"{API}/push", json=push)
    check(document, f"{API}/push", "post", r, status=201)
    assert [x["partition"] for x in r.json()] == ["a", "Default"]
    refused: list[tuple[Any, str]] = [
        ({"items": [{"queue": 7, "payload": 1}]}, "invalid_queue"),
        ({"items": [{"queue": "wm-log"}]}, "missing_field"),
        ({"items": [{"queue": "wm-log", "payload": 1, "transactionId": 5}]},
         "invalid_transaction_id"),
        ({"items": "no"}, "invalid_items")]
    for bad, code in refused:
        assert not _declared(document, f"{API}/push", bad)
        r = await http.post(f"{API}/push", json=bad)
        assert (r.status_code, r.json()["error"]) == (400, code), bad

    got = (await http.get(f"{API}/pop/queue/wm-log/partition/a",
                          params={"consumerGroup": "g"})).json()
    m = got["messages"][0]
    one = {"transactionId": m["transactionId"], "partitionId": m["partitionId"],
           "leaseId": got["leaseId"], "consumerGroup": "g", "status": "completed",
           "error": None}
    assert _declared(document, f"{API}/ack", one)
    no_partition = {k: v for k, v in one.items() if k != "partitionId"}
    assert not _declared(document, f"{API}/ack", no_partition)
    r = await http.post(f"{API}/ack", json=no_partition)
    assert (r.status_code, r.json()["error"]) == (400, "missing_field")
    # In a batch, the batch's partitionId and leaseId stand in for an entry's.
    batch = {"consumerGroup": "g", "partitionId": m["partitionId"], "leaseId": got["leaseId"],
             "acknowledgments": [{"transactionId": m["transactionId"], "status": "success"}]}
    assert _declared(document, f"{API}/ack/batch", batch)
    r = await http.post(f"{API}/ack/batch", json=batch)
    check(document, f"{API}/ack/batch", "post", r)
    assert r.json()[0]["success"] is True
    refused = [({"acknowledgments": []}, "invalid_body"),
               ({"acknowledgments": [{**one, "partitionId": "nope"}]}, "invalid_partition_id"),
               ([one], "invalid_body")]
    for bad, code in refused:
        r = await http.post(f"{API}/ack/batch", json=bad)
        assert (r.status_code, r.json()["error"]) == (400, code), bad
    assert not _declared(document, f"{API}/ack/batch", {"acknowledgments": []})

    settle_path = f"{API}/pop/queue/{{queue}}/partition/{{partition}}"
    assert _declared(document, settle_path, batch)
    r = await http.post(f"{API}/pop/queue/wm-log/partition/a", params={"consumerGroup": "g"},
                        json=batch)
    check(document, settle_path, "post", r)
    assert r.json()["acks"]["count"] == 1

    reads: list[tuple[str, dict[str, Any], str | None]] = [
            ("fetch", {"entries": [{"queue": "wm-log", "offset": 0, "partition": "a"}],
                       "maxWaitMs": None}, None),
            ("fetch", {"entries": [{"queue": "wm-log"}]}, "missing_field"),
            ("fetch", {"entries": [{"queue": "wm-log", "offset": 0, "max": 1}]},
             "unknown_field"),
            ("fetch", {"entries": [{"queue": "wm-log", "offset": -1}]}, "invalid_field"),
            ("partitions/changed", {"entries": [{"queue": "wm-log", "limit": 5,
                                                 "since": "2020-01-01T00:00:00Z"}]}, None),
            ("partitions/changed", {"entries": [{"queue": "wm-log", "after": 3}]},
             "invalid_field"),
            ("partitions/changed", {"entries": [], "cursor": "x"}, "unknown_field")]
    for path, body, want in reads:
        assert _declared(document, f"{API}/{path}", body) is (want is None), body
        r = await http.post(f"{API}/{path}", json=body)
        if want is None:
            check(document, f"{API}/{path}", "post", r)
        else:
            assert (r.status_code, r.json()["error"]) == (400, want), body
    changed = (await http.post(f"{API}/partitions/changed",
                               json={"entries": [{"queue": "wm-log"}]})).json()
    assert {p["name"] for p in changed["entries"][0]["partitions"]} >= {"a", "Default"}

    configure = {"queue": "wm-conf", "options": {"leaseTime": 30, "ttl": None,
                                                 "priority": 2},
                 "namespace": "ns"}
    assert _declared(document, f"{API}/configure", configure)
    r = await http.post(f"{API}/configure", json=configure)
    check(document, f"{API}/configure", "post", r)
    assert (r.json()["options"]["leaseTime"], r.json()["ignored"]) == (30, ["priority",
                                                                            "namespace"])
    # An option name nobody knows is declared and taken (listed), as Queen takes it.
    odd = {"queue": "wm-conf", "options": {"leaseTime": 30, "shinyNew": 1}}
    assert _declared(document, f"{API}/configure", odd)
    r = await http.post(f"{API}/configure", json=odd)
    assert (r.status_code, r.json()["unknown"]) == (200, ["shinyNew"])
    no_lease = {"queue": "wm-conf", "options": {"leaseTime": 0}}
    assert not _declared(document, f"{API}/configure", no_lease)
    r = await http.post(f"{API}/configure", json=no_lease)
    assert (r.status_code, r.json()["error"]) == (400, "invalid_option")

    lease_path = f"{API}/lease/{{lease_id}}/extend"
    assert _declared(document, lease_path, {"seconds": 30})
    assert not _declared(document, lease_path, {"seconds": 0})
    r = await http.post(f"{API}/lease/{uuid.uuid4()}/extend", json={"seconds": 0})
    assert (r.status_code, r.json()["error"]) == (400, "invalid_parameter")


def _answer_schema(document: dict[str, Any], path: str) -> Any:
    return document["paths"][path]["post"]["responses"]["200"]["content"]["application/json"][
        "schema"]


async def test_configure_and_read_answers_are_their_models(
    http: httpx.AsyncClient, document: dict[str, Any],
) -> None:
    """configure, fetch and partitions/changed answer through their models (issue 29): the
    schema /openapi.json declares for each is the model's, generated from it; the answers keep
    the fields queen-mq 2.6.0 reads, by the same names, with the same nulls and the same fields
    left out; the SDK decodes configure's through the model."""
    generated = schema.components()
    for path, model in (("configure", log_models.Configured), ("fetch", log_models.Fetched),
                        ("partitions/changed", log_models.PartitionsChanged)):
        assert _answer_schema(document, f"{API}/{path}") == schema.ref(model), path
        assert document["components"]["schemas"][model.__name__] == generated[model.__name__]

    r = await http.post(f"{API}/configure", json={
        "queue": "wm-ans", "options": {"leaseTime": 30, "priority": 2}, "namespace": "ns"})
    check(document, f"{API}/configure", "post", r)
    configured = r.json()
    assert list(configured) == ["configured", "created", "queue", "queueId", "partitionId",
                                "namespace", "task", "options", "ignored", "unknown"]
    assert list(configured["options"]) == [
        "leaseTime", "retryLimit", "retryDelay", "maxSize", "ttl", "deadLetterQueue",
        "delayedProcessing", "retentionSeconds", "completedRetentionSeconds",
        "retentionEnabled", "retainUntilConsumed", "maxWaitTimeSeconds", "windowBuffer",
        "encryptionEnabled", "priority", "dlqAfterMaxRetries"]
    assert (configured["namespace"], configured["task"], configured["options"]["priority"],
            configured["ignored"], configured["unknown"]) == ("ns", "", 2, ["priority",
                                                                           "namespace"], [])
    config = sdk.QueueConfig.from_wire(configured)
    assert (config.queue, config.lease_time_s, config.ignored) == ("wm-ans", 30,
                                                                   ("priority", "namespace"))
    broken = {**configured, "options": {**configured["options"], "leaseTime": "30"}}
    assert refuses(document, f"{API}/configure", "post", broken)
    with pytest.raises(msgspec.ValidationError):
        sdk.QueueConfig.from_wire(broken)

    await http.post(f"{API}/push", json={"items": [
        {"queue": "wm-ans", "partition": "a", "payload": {"n": i}, "transactionId": f"a{i}"}
        for i in range(2)]})
    r = await http.post(f"{API}/fetch", json={"entries": [
        {"queue": "wm-ans", "partition": "a", "offset": 0},
        {"queue": "wm-nobody", "offset": 0},
        {"queue": "wm-ans", "partition": "a", "offset": 9}]})
    check(document, f"{API}/fetch", "post", r)
    read, unknown, past = r.json()["entries"]
    assert list(read) == ["queue", "partition", "records", "highWatermark", "logStartOffset"]
    assert [list(x) for x in read["records"]] == [["offset", "transactionId", "payload", "ts"]] * 2
    assert [x["payload"] for x in read["records"]] == [{"n": 0}, {"n": 1}]
    assert (unknown["error"], unknown["partition"], unknown["records"]) == (
        "UNKNOWN_TOPIC_OR_PARTITION", "Default", [])
    assert (past["error"], past["highWatermark"]) == ("OFFSET_OUT_OF_RANGE", 2)
    assert list(past) == [*read, "error"]
    assert refuses(document, f"{API}/fetch", "post", {"entries": [{**past, "error": "NOPE"}]})
    assert (await http.post(f"{API}/fetch", json={"entries": []})).json() == {"entries": []}

    r = await http.post(f"{API}/partitions/changed", json={"entries": [
        {"queue": "wm-ans"}, {"queue": "wm-nobody"}, {"queue": "wm-ans", "after": "t|1|x"}]})
    check(document, f"{API}/partitions/changed", "post", r)
    changed = r.json()
    assert list(changed) == ["safeTime", "safeTimeDegraded", "entries"]
    page, nobody, bad_cursor = changed["entries"]
    assert list(page) == ["queue", "partitions", "next"] and page["next"] is None
    assert [list(p) for p in page["partitions"]] == [
        ["name", "id", "lastOffset", "logStart", "lastWriteAt"]] * 2
    assert [(p["name"], p["lastOffset"]) for p in page["partitions"]] == [("Default", -1),
                                                                          ("a", 1)]
    assert nobody == {"queue": "wm-nobody", "error": "UNKNOWN_TOPIC_OR_PARTITION"}
    assert bad_cursor == {"queue": "wm-ans", "error": "BAD_CURSOR"}
    no_id = {k: v for k, v in page["partitions"][0].items() if k != "id"}
    assert refuses(document, f"{API}/partitions/changed", "post",
                   {**changed, "entries": [{**page, "partitions": [no_id]}]})


async def test_a_transactions_ack_is_declared_as_the_ack_route_takes_it(
    document: dict[str, Any],
) -> None:
    """A transaction's ack op is ``POST /api/v1/ack``'s body with its tag: one declaration."""
    schemas = document["components"]["schemas"]
    ack_op = dict(schemas["AckOp"]["properties"])
    assert ack_op.pop("type") == {"enum": ["ack"]}
    assert ack_op == schemas["Ack"]["properties"]
    assert schemas["AckOp"]["required"] == ["type", *schemas["Ack"]["required"]]


async def test_a_paused_rider_answers_its_model(
    http: httpx.AsyncClient, document: dict[str, Any],
) -> None:
    """A transaction whose rider uses a paused surface answers 403 as TransactionPaused
    declares it (the code in error and reason, an empty results, no detail)."""
    switches = f"{API}/system/kv-timers"
    assert (await http.post(switches, json={"kv": False})).status_code == 200
    try:
        r = await http.post(f"{API}/transaction", json={
            "kv": [{"op": "put", "ns": "wm-p", "key": "k", "value": 1, "forever": True}]})
    finally:
        assert (await http.post(switches, json={"kv": True})).status_code == 200
    check(document, f"{API}/transaction", "post", r, status=403)
    answer = r.json()
    assert list(answer) == ["ok", "success", "transactionId", "error", "message", "reason",
                            "results"]
    assert (answer["error"], answer["reason"], answer["results"]) == ("kv_disabled",
                                                                      "kv_disabled", [])
    assert refuses(document, f"{API}/transaction", "post",
                   {**answer, "error": "kv_busy", "reason": "kv_busy"}, status=403)


async def test_queue_resource_answers_are_their_models(
    http: httpx.AsyncClient, document: dict[str, Any],
) -> None:
    """The queue list, a queue's detail and its deletion answer through their models, and
    /openapi.json declares each by its generated schema (they were an untyped object, and a
    hand-written QueueDetail)."""
    generated = schema.components()
    for model in (log_models.QueueList, log_models.QueueDetail, log_models.QueueDeleted,
                  log_models.PartitionStorage):
        assert document["components"]["schemas"][model.__name__] == generated[model.__name__]
    await http.post(f"{API}/configure", json={"queue": "wm-res", "options": {"leaseTime": 40}})
    await http.post(f"{API}/push", json={"items": [
        {"queue": "wm-res", "partition": p, "payload": {"n": 1}} for p in ("a", "b", "b")]})
    await http.get(f"{API}/pop/queue/wm-res/partition/b", params={"consumerGroup": "g"})

    listed = await http.get(f"{API}/resources/queues")
    check(document, f"{API}/resources/queues", "get", listed)
    (mine,) = [q for q in listed.json()["queues"] if q["name"] == "wm-res"]
    assert list(mine) == ["name", "createdAt", "partitions", "messages", "options"]
    assert (mine["messages"], mine["options"]["leaseTime"]) == (
        {"total": 3, "pending": 2, "processing": 1}, 40)

    path = f"{API}/resources/queues/{{queue}}"
    detail = await http.get(f"{API}/resources/queues/wm-res")
    check(document, path, "get", detail)
    d = detail.json()
    assert list(d) == ["name", "createdAt", "options", "partitions", "consumerGroups",
                       "totals", "timers", "storage"]
    b = next(p for p in d["partitions"] if p["name"] == "b")
    assert list(b) == ["id", "name", "createdAt", "logStart", "nextOffset", "messages",
                       "storage", "groups"]
    assert b["groups"] == {"g": {"committed": -1, "lag": 2, "leased": True}}
    assert (d["consumerGroups"], d["totals"], d["timers"]) == (
        ["g"], {"messages": 3, "deadLetters": 0}, {"pending": 0, "nextDeliverAt": None})
    assert d["storage"]["headFrames"] == 3 and list(d["storage"]) == [
        "headFrames", "headBytes", "segments", "segmentFrames", "rawBytes", "compressedBytes"]
    assert refuses(document, path, "get", {**d, "storage": {**d["storage"], "segments": None}})
    assert refuses(document, f"{API}/resources/queues", "get",
                   {"queues": [{**mine, "messages": {"total": 3}}]})

    deleted = await http.delete(f"{API}/resources/queues/wm-res")
    check(document, path, "delete", deleted)
    assert deleted.json() == {"deleted": True, "queue": "wm-res", "existed": True}
    again = await http.delete(f"{API}/resources/queues/wm-res")
    assert again.json() == {"deleted": True, "queue": "wm-res", "existed": False}

"""KV on Queen's wire, over plain HTTP: the path routes (ETag, 200 on a miss), the shapes of
the batch route, expiry and the purger, and every kind of bad input answered with a clear 4xx
that leaves nothing written. The operations themselves, driven by Queen's own client, are in
test_queen_mq_kv.py."""

from __future__ import annotations

from typing import Any

import httpx
import psycopg
import pytest
import trio

from queen_trio.kv import store

KV = "/api/v1/kv"


async def batch(http: httpx.AsyncClient, *ops: dict[str, Any]) -> list[dict[str, Any]]:
    r = await http.post(KV, json={"operations": list(ops)})
    assert r.status_code == 200, r.text
    return r.json()["results"]


def rows(database_url: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(database_url) as conn:
        return conn.execute("SELECT namespace, key, value FROM queen.kv ORDER BY 1, 2").fetchall()


async def test_path_routes_put_get_delete(http: httpx.AsyncClient) -> None:
    r = await http.put(f"{KV}/saga/booking/1", json={"value": {"step": "held"}, "forever": True})
    assert r.status_code == 200
    put = r.json()
    assert (put["op"], put["applied"], put["key"], put["expiresAt"]) == ("put", True,
                                                                        "booking/1", None)
    r = await http.get(f"{KV}/saga/booking/1")
    got = r.json()
    assert got["found"] is True and got["value"] == {"step": "held"}
    assert got["version"] == put["version"] and r.headers["ETag"] == f'"{put["version"]}"'
    # A write that names the version it read; the stale one loses and is told the current.
    r = await http.put(f"{KV}/saga/booking/1",
                       json={"value": "shipped", "ttlSeconds": 60, "expect": put["version"]})
    assert r.json()["applied"] is True and r.json()["version"] > put["version"]
    r = await http.put(f"{KV}/saga/booking/1",
                       json={"value": "lost", "ttlSeconds": 60, "expect": put["version"]})
    assert (r.status_code, r.json()["applied"], r.json()["reason"], r.json()["value"]) == (
        200, False, "version", "shipped")
    r = await http.delete(f"{KV}/saga/booking/1")
    assert (r.json()["applied"], r.json()["value"]) == (True, "shipped")
    # A miss is an answer, not an error: 200, found false, no ETag.
    r = await http.get(f"{KV}/saga/booking/1")
    assert (r.status_code, r.json(), r.headers.get("ETag")) == (
        200, {"index": 0, "op": "get", "found": False, "key": "booking/1"}, None)
    r = await http.delete(f"{KV}/saga/booking/1")
    assert (r.status_code, r.json()["applied"], r.json()["reason"]) == (200, False, "absent")


async def test_keys_may_contain_slashes_and_unicode(http: httpx.AsyncClient) -> None:
    key = "user/42/préférences café"
    path = f"{KV}/ns/{key}"  # httpx percent-encodes the spaces and accents
    assert (await http.put(path, json={"value": 1, "forever": True})).status_code == 200
    [got] = await batch(http, {"op": "get", "ns": "ns", "key": key})
    assert got["found"] and got["value"] == 1


async def test_the_batch_route_answers_in_input_order(http: httpx.AsyncClient) -> None:
    results = await batch(
        http,
        {"op": "put", "ns": "b", "key": "z", "value": "last", "forever": True},
        {"op": "get", "ns": "b", "key": "z"},  # sees the put before it, though after by key
        {"op": "put", "ns": "b", "key": "a", "value": "first", "forever": True},
        {"op": "getMany", "ns": "b", "keys": ["z", "nope", "a"]},
        {"op": "getPrefix", "ns": "b", "prefix": "a"},
        {"op": "check", "ns": "b", "key": "nope", "expect": 0},
    )
    assert [(r["index"], r["op"]) for r in results] == [
        (0, "put"), (1, "get"), (2, "put"), (3, "getMany"), (4, "getPrefix"), (5, "check")]
    assert results[1]["value"] == "last"
    assert [r["key"] for r in results[3]["rows"]] == ["a", "z"]
    assert results[3]["missing"] == ["nope"] and results[3]["truncated"] is False
    assert [r["value"] for r in results[4]["rows"]] == ["first"]
    assert results[5] == {"index": 5, "op": "check", "applied": True, "key": "nope",
                          "version": 0}
    # A bare array of ops is the same call.
    r = await http.post(KV, json=[{"op": "get", "ns": "b", "key": "a"}])
    assert r.json()["results"][0]["value"] == "first"
    assert (await http.post(KV, json=[])).json() == {"results": []}


async def test_get_prefix_pages_in_byte_order(http: httpx.AsyncClient) -> None:
    keys = ["p:B", "p:a", "p:é", "p:Z", "p_x", "q:a"]
    await batch(http, *({"op": "put", "ns": "pre", "key": k, "value": k, "forever": True}
                        for k in keys))
    first = (await batch(http, {"op": "getPrefix", "ns": "pre", "prefix": "p:", "limit": 2,
                                "keysOnly": True}))[0]
    assert [r["key"] for r in first["rows"]] == ["p:B", "p:Z"]
    assert "value" not in first["rows"][0]
    assert (first["truncated"], first["nextAfter"]) == (True, "p:Z")
    rest = (await batch(http, {"op": "getPrefix", "ns": "pre", "prefix": "p:",
                               "after": first["nextAfter"], "limit": 5000}))[0]
    assert [r["key"] for r in rest["rows"]] == ["p:a", "p:é"]  # 5000 is clamped, not refused
    assert (rest["truncated"], rest["nextAfter"]) == (False, None)


async def test_an_expired_key_is_gone_at_once_then_purged(
    http: httpx.AsyncClient, database_url: str
) -> None:
    await batch(http, {"op": "put", "ns": "ns", "key": "short", "value": 1, "ttlSeconds": 1},
                {"op": "put", "ns": "ns", "key": "long", "value": 2, "ttlSeconds": 3600})
    await trio.sleep(1.2)
    [got, claim] = await batch(
        http, {"op": "get", "ns": "ns", "key": "short"},
        {"op": "putIfAbsent", "ns": "ns", "key": "again", "value": 3, "ttlSeconds": 1})
    assert got["found"] is False and claim["applied"] is True
    # An expired, unpruned row counts as absent: putIfAbsent takes its place.
    [resurrected] = await batch(http, {"op": "putIfAbsent", "ns": "ns", "key": "short",
                                       "value": "new", "ttlSeconds": 60})
    assert resurrected["applied"] is True
    await trio.sleep(1.2)
    with psycopg.connect(database_url, row_factory=psycopg.rows.dict_row) as raw:
        with raw.transaction():
            assert store.purge_expired(raw) == 1  # "again"
        assert [r["key"] for r in raw.execute("SELECT key FROM queen.kv ORDER BY key")] == [
            "long", "short"]


async def test_a_lost_required_precondition_rolls_the_whole_call_back(
    http: httpx.AsyncClient, database_url: str
) -> None:
    await batch(http, {"op": "put", "ns": "gate", "key": "taken", "value": "first",
                       "forever": True})
    r = await http.post(KV, json=[
        {"op": "put", "ns": "gate", "key": "a-side-effect", "value": 1, "forever": True},
        {"op": "putIfAbsent", "ns": "gate", "key": "taken", "value": "second", "forever": True,
         "required": True},
    ])
    assert r.status_code == 200
    assert {k: r.json()[k] for k in ("ok", "reason", "failedIndex", "kvReason", "value")} == {
        "ok": False, "reason": "kv_precondition", "failedIndex": 1, "kvReason": "exists",
        "value": "first"}
    assert rows(database_url) == [("gate", "taken", "first")]


async def test_incr_refuses_past_max_and_keeps_its_window(http: httpx.AsyncClient) -> None:
    incr = {"op": "incr", "ns": "rate", "key": "acme", "delta": 2, "max": 5, "ttlSeconds": 60}
    assert [(await batch(http, incr))[0]["value"] for _ in range(2)] == [2, 4]
    [refused] = await batch(http, incr)
    assert (refused["applied"], refused["reason"], refused["value"]) == (False, "limit", 4)
    [first] = await batch(http, {"op": "get", "ns": "rate", "key": "acme"})
    [frac] = await batch(http, {**incr, "delta": 0.5, "ttlSeconds": 3600})
    [after] = await batch(http, {"op": "get", "ns": "rate", "key": "acme"})
    assert frac["value"] == 4.5 and after["expiresAt"] == first["expiresAt"]
    await batch(http, {"op": "put", "ns": "rate", "key": "obj", "value": {}, "forever": True})
    [wrong] = await batch(http, {**incr, "key": "obj"})
    assert (wrong["applied"], wrong["reason"]) == (False, "type")


_OK_PUT = {"op": "put", "ns": "ok", "key": "k", "value": 1, "forever": True}


@pytest.mark.parametrize(("body", "status", "reason"), [
    ({"operations": [{**_OK_PUT, "forever": False}]}, 400, "kv_expiry_not_specified"),
    ({"operations": [{**_OK_PUT, "ttlSeconds": 60}]}, 400, "kv_expiry_not_specified"),
    ({"operations": [{**_OK_PUT, "forever": "yes"}]}, 400, "kv_bad_request"),
    ({"operations": [{**_OK_PUT, "forever": False, "ttlSeconds": 0}]}, 400, "kv_bad_ttl"),
    ({"operations": [{**_OK_PUT, "forever": False, "ttlSeconds": 1.5}]}, 400, "kv_bad_ttl"),
    ({"operations": [{**_OK_PUT, "ns": "Upper"}]}, 400, "kv_bad_namespace"),
    ({"operations": [{**_OK_PUT, "ns": "-lead"}]}, 400, "kv_bad_namespace"),
    ({"operations": [{**_OK_PUT, "ns": "n" * 65}]}, 400, "kv_bad_namespace"),
    ({"operations": [{**_OK_PUT, "key": "k" * 513}]}, 400, "kv_bad_key"),
    ({"operations": [{**_OK_PUT, "key": "a\nb"}]}, 400, "kv_bad_key"),
    ({"operations": [{**_OK_PUT, "key": ""}]}, 400, "kv_bad_key"),
    ({"operations": [{**_OK_PUT, "value": "x" * 65_536}]}, 413, "kv_value_too_large"),
    ({"operations": [{**_OK_PUT, "expect": None}]}, 400, "kv_bad_expect"),
    ({"operations": [{**_OK_PUT, "expect": -1}]}, 400, "kv_bad_expect"),
    ({"operations": [{**_OK_PUT, "op": "putIfAbsent", "expect": 3}]}, 400, "kv_bad_expect"),
    ({"operations": [{**_OK_PUT, "required": "yes"}]}, 400, "kv_bad_request"),
    ({"operations": [{**_OK_PUT, "tenant": "other"}]}, 400, "kv_tenant_not_an_input"),
    ({"operations": [{**_OK_PUT, "colour": "red"}]}, 400, "kv_unknown_field"),
    ({"operations": [{k: v for k, v in _OK_PUT.items() if k != "value"}]}, 400,
     "kv_bad_request"),
    ({"operations": [{"op": "incr", "ns": "ok", "key": "k", "forever": True}]}, 400,
     "kv_bad_request"),
    ({"operations": [{"op": "incr", "ns": "ok", "key": "k", "delta": True, "forever": True}]},
     400, "kv_bad_request"),
    ({"operations": [{"op": "incr", "ns": "ok", "key": "k", "delta": 1, "expect": 0,
                      "forever": True}]}, 400, "kv_unknown_field"),
    ({"operations": [{"op": "check", "ns": "ok", "key": "k"}]}, 400, "kv_bad_expect"),
    ({"operations": [{"op": "getPrefix", "ns": "ok", "prefix": ""}]}, 400, "kv_prefix_required"),
    ({"operations": [{"op": "getMany", "ns": "ok", "keys": "k"}]}, 400, "kv_bad_request"),
    ({"operations": [{"op": "merge", "ns": "ok", "key": "k"}]}, 400, "kv_unknown_op"),
    ({"operations": [{"op": {}, "ns": "ok", "key": "k"}]}, 400, "kv_unknown_op"),
    ({"operations": ["put"]}, 400, "kv_bad_request"),
    ({"operations": [_OK_PUT, {**_OK_PUT, "value": 2}]}, 400, "kv_duplicate_key_in_call"),
    ({"operations": [{**_OK_PUT, "key": f"k{i}"} for i in range(257)]}, 400, "kv_too_many_ops"),
    ({"operations": [_OK_PUT, {"op": "getMany", "ns": "ok", "keys": ["x"] * 1024}]}, 400,
     "kv_too_many_keys"),
    ({"operations": [_OK_PUT], "also": 1}, 400, "kv_bad_body"),
    ({"ops": []}, 400, "kv_bad_body"),
    ("put", 400, "kv_bad_body"),
])
async def test_bad_batches_are_refused_whole(
    http: httpx.AsyncClient, database_url: str, body: Any, status: int, reason: str
) -> None:
    # A valid write goes first: nothing of a refused call is written, not even it.
    if isinstance(body, dict) and isinstance(body.get("operations"), list) and all(
            isinstance(o, dict) and o.get("key") != "first" for o in body["operations"]):
        body = {**body, "operations": [{**_OK_PUT, "key": "first"}, *body["operations"]]}
    r = await http.post(KV, json=body)
    assert r.status_code == status, r.text
    error = r.json()
    assert error["reason"] == reason, error
    assert error["error"] == ("payload_too_large" if status == 413 else "kv_bad_request")
    assert error["detail"] and error["ok"] is False
    assert rows(database_url) == []


@pytest.mark.parametrize(("method", "path", "body", "reason"), [
    ("PUT", f"{KV}/ns/k", {"value": 1}, "kv_expiry_not_specified"),
    ("PUT", f"{KV}/ns/k", {"value": 1, "forever": True, "key": "other"}, "kv_field_in_path"),
    ("PUT", f"{KV}/ns/k", {"value": 1, "forever": True, "colour": 1}, "kv_unknown_field"),
    ("PUT", f"{KV}/ns/k", [1], "kv_bad_body"),
    ("PUT", f"{KV}/Bad NS/k", {"value": 1, "forever": True}, "kv_bad_namespace"),
    ("PUT", f"{KV}/ns/" + "k" * 600, {"value": 1, "forever": True}, "kv_bad_key"),
    ("PUT", f"{KV}/ns/k?forever=true", {"value": 1}, "kv_no_query_string"),
    ("GET", f"{KV}/ns/k?prefix=quota", None, "kv_no_query_string"),
    ("GET", f"{KV}/bad ns/k", None, "kv_bad_namespace"),
    ("DELETE", f"{KV}/ns/k", {"expect": "3"}, "kv_bad_expect"),
    ("DELETE", f"{KV}/ns/k", {"ttlSeconds": 3}, "kv_unknown_field"),
])
async def test_bad_path_requests(
    http: httpx.AsyncClient, database_url: str, method: str, path: str, body: Any, reason: str
) -> None:
    r = await http.request(method, path, json=body)
    assert (r.status_code, r.json()["reason"]) == (400, reason), r.text
    assert rows(database_url) == []


async def test_a_blank_body_on_a_path_route_is_no_body(http: httpx.AsyncClient) -> None:
    """The path routes' body is optional, and blank is empty, as on every route whose body is
    optional (api/errors.py read_body_via): a DELETE sent with a line break deletes."""
    await http.put(f"{KV}/ns/blank", json={"value": 1, "forever": True})
    r = await http.request("DELETE", f"{KV}/ns/blank", content=b" \r\n",
                           headers={"Content-Type": "application/json"})
    assert (r.status_code, r.json()["applied"], r.json()["value"]) == (200, True, 1), r.text
    r = await http.put(f"{KV}/ns/blank", content=b"\n",
                       headers={"Content-Type": "application/json"})
    assert (r.status_code, r.json()["reason"]) == (400, "kv_expiry_not_specified"), r.text


async def test_a_value_over_the_ceiling_is_413(http: httpx.AsyncClient,
                                                database_url: str) -> None:
    r = await http.put(f"{KV}/ns/big", json={"value": "x" * 70_000, "forever": True})
    assert (r.status_code, r.json()["error"], r.json()["reason"]) == (
        413, "payload_too_large", "kv_value_too_large")
    # 64 KiB of JSON text is the ceiling, the quotes included.
    ok = await http.put(f"{KV}/ns/big", json={"value": "x" * (65_536 - 2), "forever": True})
    assert ok.status_code == 200
    assert len(rows(database_url)) == 1

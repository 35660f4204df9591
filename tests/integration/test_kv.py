"""KV state over HTTP: JSON values, whole-second TTLs, expiry, purge."""

from __future__ import annotations

import httpx
import psycopg
import pytest
import trio

from queen_trio.kv import store

KV = "/api/v1/kv"


async def test_put_get_overwrite_delete(http: httpx.AsyncClient) -> None:
    r = await http.put(f"{KV}/saga/booking-1", json={"value": {"step": "held", "n": [1, 2]}})
    assert r.status_code == 200
    assert r.json() == {"ok": True, "namespace": "saga", "key": "booking-1", "created": True,
                        "expiresAt": None}
    r = await http.get(f"{KV}/saga/booking-1")
    assert r.json()["value"] == {"step": "held", "n": [1, 2]}
    r = await http.put(f"{KV}/saga/booking-1", json={"value": "shipped"})
    assert r.json()["created"] is False
    assert (await http.get(f"{KV}/saga/booking-1")).json()["value"] == "shipped"
    r = await http.delete(f"{KV}/saga/booking-1")
    assert r.json()["deleted"] is True
    r = await http.get(f"{KV}/saga/booking-1")
    assert (r.status_code, r.json()["error"]) == (404, "key_not_found")
    assert (await http.delete(f"{KV}/saga/booking-1")).json()["deleted"] is False


async def test_keys_may_contain_slashes_and_unicode(http: httpx.AsyncClient) -> None:
    key = "user/42/préférences café"
    path = f"{KV}/ns/{key}"  # httpx percent-encodes the spaces and accents
    assert (await http.put(path, json={"value": 1})).status_code == 200
    r = await http.get(path)
    assert r.json()["key"] == key and r.json()["value"] == 1


@pytest.mark.parametrize(
    ("ttl", "ok"),
    [(1, True), (86400, True), (0, False), (-1, False), (1.5, False), (1.0, False),
     ("60", False), (True, False), (500.0, False)],
)
async def test_ttl_is_whole_seconds(http: httpx.AsyncClient, ttl: object, ok: bool) -> None:
    r = await http.put(f"{KV}/ns/k", json={"value": 1, "ttlSeconds": ttl})
    if ok:
        assert r.status_code == 200 and r.json()["expiresAt"] is not None
    else:
        assert (r.status_code, r.json()["error"]) == (400, "invalid_ttl")


async def test_an_expired_key_is_invisible_at_once_then_purged(
    http: httpx.AsyncClient, database_url: str
) -> None:
    await http.put(f"{KV}/ns/short", json={"value": "soon gone", "ttlSeconds": 1})
    await http.put(f"{KV}/ns/long", json={"value": "stays", "ttlSeconds": 3600})
    assert (await http.get(f"{KV}/ns/short")).status_code == 200
    await trio.sleep(1.05)
    assert (await http.get(f"{KV}/ns/short")).status_code == 404
    # Rewriting an expired key creates it afresh.
    r = await http.put(f"{KV}/ns/short", json={"value": "again", "ttlSeconds": 1})
    assert r.json()["created"] is True
    await trio.sleep(1.05)
    with psycopg.connect(database_url, row_factory=psycopg.rows.dict_row) as raw:
        assert raw.execute("SELECT count(*) AS n FROM queen.kv").fetchone()["n"] == 2
        with raw.transaction():
            assert store.purge_expired(raw) == 1
        assert [r["key"] for r in raw.execute("SELECT key FROM queen.kv")] == ["long"]


@pytest.mark.parametrize(
    ("path", "body", "code"),
    [
        (f"{KV}/bad ns/k", {"value": 1}, "invalid_namespace"),
        (f"{KV}/ns/k", {"ttlSeconds": 5}, "missing_field"),
        (f"{KV}/ns/" + "k" * 600, {"value": 1}, "invalid_key"),
        (f"{KV}/ns/k", {"value": "x" * (1024 * 1024 + 1)}, "payload_too_large"),
    ],
)
async def test_bad_kv_requests(http: httpx.AsyncClient, path: str, body: dict, code: str) -> None:
    r = await http.put(path, json=body)
    assert r.status_code in (400, 413)
    assert r.json()["error"] == code

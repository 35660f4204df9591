"""POST /api/v1/locks over plain HTTP: the shapes of its answers, and bad input refused whole
with a clear 400 before anything is written. Locks driven by Queen's own client, their races
and guarded bundles are in test_queen_mq_kv.py."""

from __future__ import annotations

from typing import Any

import httpx
import psycopg
import pytest
import trio

LOCKS = "/api/v1/locks"


def permits(database_url: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(database_url) as conn:
        return conn.execute("SELECT key, value FROM queen.kv WHERE namespace = 'queen-locks' "
                            "ORDER BY key").fetchall()


async def test_acquire_renew_release_get(http: httpx.AsyncClient, database_url: str) -> None:
    r = await http.post(LOCKS, json={"operations": [
        {"op": "acquire", "name": "report", "ttlSeconds": 30, "owner": "w-1"},
        {"op": "acquire", "name": "gpu", "ttlSeconds": 30, "limit": 2}]})
    lock, gpu = r.json()["results"]
    assert (lock["index"], lock["op"], lock["acquired"], lock["slot"], lock["owner"]) == (
        0, "acquire", True, 0, "w-1")
    assert lock["guard"] == {"op": "check", "ns": "queen-locks", "key": "report#0",
                             "expect": lock["token"], "required": True}
    assert gpu["acquired"] and gpu["slot"] in (0, 1) and gpu["owner"] is None
    assert permits(database_url) == sorted([("report#0", {"owner": "w-1"}),
                                            (f"gpu#{gpu['slot']}", {"owner": None})])
    [held] = (await http.post(LOCKS, json=[{"op": "acquire", "name": "report",
                                            "ttlSeconds": 30}])).json()["results"]
    assert (held["acquired"], held["reason"], held["holders"]) == (
        False, "held", [{"slot": 0, "owner": "w-1"}])
    [renewed] = (await http.post(LOCKS, json=[{"op": "renew", "name": "report", "ttlSeconds": 60,
                                               "token": lock["token"]}])).json()["results"]
    assert renewed["renewed"] and renewed["token"] > lock["token"]
    [got] = (await http.post(LOCKS, json=[{"op": "get", "name": "report"}])).json()["results"]
    [holder] = got["holders"]
    assert got["held"] and (holder["owner"], holder["token"]) == ("w-1", renewed["token"])
    assert holder["since"] < holder["renewedAt"]  # since: the acquire, kept by the renew
    [stale] = (await http.post(LOCKS, json=[{"op": "release", "name": "report",
                                             "token": lock["token"]}])).json()["results"]
    assert (stale["released"], stale["reason"]) == (False, "lost")
    [done] = (await http.post(LOCKS, json=[{"op": "release", "name": "report",
                                            "token": renewed["token"]}])).json()["results"]
    assert done["released"] is True
    assert [k for k, _ in permits(database_url)] == [f"gpu#{gpu['slot']}"]


_ACQUIRE = {"op": "acquire", "name": "job", "ttlSeconds": 30}


@pytest.mark.parametrize(("ops", "reason"), [
    ([{**_ACQUIRE, "ttlSeconds": 0}], "locks_bad_ttl"),
    ([{**_ACQUIRE, "ttlSeconds": "30"}], "locks_bad_ttl"),
    ([{k: v for k, v in _ACQUIRE.items() if k != "ttlSeconds"}], "locks_ttl_required"),
    ([{**_ACQUIRE, "forever": True}], "locks_ttl_required"),
    ([{**_ACQUIRE, "name": "a#b"}], "locks_bad_name"),
    ([{**_ACQUIRE, "name": ""}], "locks_bad_name"),
    ([{**_ACQUIRE, "name": "x" * 257}], "locks_bad_name"),
    ([{**_ACQUIRE, "name": "a\u0085b"}], "locks_bad_name"),
    ([{**_ACQUIRE, "owner": ""}], "locks_bad_owner"),
    ([{**_ACQUIRE, "limit": 0}], "locks_bad_limit"),
    ([{**_ACQUIRE, "limit": 1025}], "locks_bad_limit"),
    ([{**_ACQUIRE, "tenant": "other"}], "locks_tenant_not_an_input"),
    ([{**_ACQUIRE, "colour": "red"}], "locks_unknown_field"),
    ([{"op": "renew", "name": "job", "ttlSeconds": 30}], "locks_token_required"),
    ([{"op": "release", "name": "job", "token": 0}], "locks_bad_token"),
    ([{"op": "release", "name": "job", "token": True}], "locks_bad_token"),
    ([{"op": "release", "name": "job", "token": 3, "slot": 1024}], "locks_bad_slot"),
    ([{"op": "lock", "name": "job"}], "locks_unknown_op"),
    ([{"op": ["acquire"], "name": "job"}], "locks_unknown_op"),
    (["acquire"], "locks_bad_request"),
    ([{"op": "get", "name": "job"}], "locks_duplicate_in_call"),
    ([{**_ACQUIRE, "name": f"l{i}"} for i in range(64)], "locks_too_many_ops"),
    ([{**_ACQUIRE, "name": f"s{i}", "limit": 1024} for i in range(4)], "locks_too_many_keys"),
    ({"ops": []}, "locks_bad_body"),
])
async def test_bad_lock_calls_are_refused_whole(
    http: httpx.AsyncClient, database_url: str, ops: Any, reason: str
) -> None:
    # A valid acquire first: nothing of a refused call happens, not even it.
    body = [_ACQUIRE, *ops] if isinstance(ops, list) else ops
    r = await http.post(LOCKS, json=body)
    assert r.status_code == 400, r.text
    error = r.json()
    assert (error["ok"], error["error"], error["reason"]) == (False, "locks_bad_request", reason)
    assert error["detail"]
    assert permits(database_url) == []


async def test_a_crowd_on_a_semaphore_gets_answers_never_errors(
    http: httpx.AsyncClient, database_url: str
) -> None:
    """Acquirers that lose a slot read again and try another, each try a transaction of its
    own (so two of them never wait on each other's lost slot): every one gets an answer, and
    the semaphore never grants more than its limit."""
    answers: list[httpx.Response] = []

    async def acquire(i: int) -> None:
        answers.append(await http.post(LOCKS, json=[{
            "op": "acquire", "name": "crowd", "ttlSeconds": 60, "limit": 6, "owner": f"w{i}"}]))

    for _ in range(4):
        async with trio.open_nursery() as nursery:
            for i in range(24):
                nursery.start_soon(acquire, i)
    assert {r.status_code for r in answers} == {200}, [r.text for r in answers
                                                       if r.status_code != 200][:3]
    granted = {r.json()["results"][0]["owner"] for r in answers
               if r.json()["results"][0]["acquired"]}
    assert len(granted) == 6 and len(permits(database_url)) == 6

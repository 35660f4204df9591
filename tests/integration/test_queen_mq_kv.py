"""KV, locks and transaction riders driven by Queen's own Python client (``queen-mq`` 2.6.0),
unchanged, against a live broker and a real PostgreSQL: every KV operation, locks and
semaphores, a guarded bundle, and the races, with real concurrency (requests in flight
together, each in its own transaction at the broker).

The client is asyncio; each flow runs in a thread with its own loop (test_queen_mq.run).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import psycopg
import pytest

from queen_trio.server import BrokerHandle

from .test_queen_mq import _quiet_signals, name, run  # noqa: F401 (a fixture)

queen = pytest.importorskip("queen")
KvError = queen.errors.KvError


def kv_rows(database_url: str, namespace: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(database_url) as conn:
        return conn.execute("SELECT key, value, version FROM queen.kv WHERE namespace = %s "
                            "ORDER BY key", (namespace,)).fetchall()


async def drain(c: Any, q: str) -> list[Any]:
    seen: list[Any] = []
    while msgs := await c.queue(q).batch(100).wait(False).pop():
        seen += [m["data"] for m in msgs]
        await c.ack(msgs, True)
    return seen


# -- every KV operation -----------------------------------------------------------------------


async def test_every_kv_operation(broker: BrokerHandle) -> None:
    async def flow(c: Any) -> None:
        put = await c.kv.put("saga", "booking-17", {"step": "held"}, forever=True)
        assert put and put["version"] > 0 and put["value"] == {"step": "held"}
        got = await c.kv.get("saga", "booking-17")
        assert got["found"] and got["version"] == put["version"] and got["expiresAt"] is None
        assert not await c.kv.get("saga", "never")
        # expect: the version read; a stale writer loses and learns the current value.
        moved = await c.kv.put("saga", "booking-17", {"step": "paid"}, ttl_seconds=60,
                               expect=put["version"])
        stale = await c.kv.put("saga", "booking-17", {"step": "lost"}, ttl_seconds=60,
                               expect=put["version"])
        assert moved and not stale
        assert (stale["reason"], stale["value"], stale["version"]) == (
            "version", {"step": "paid"}, moved["version"])
        assert not await c.kv.put("saga", "nothing", 1, ttl_seconds=60, expect=42)
        assert not (await c.kv.get("saga", "nothing"))["found"]  # expect never creates
        assert await c.kv.once("dedup", "evt-1", ttl_seconds=60) is True
        assert await c.kv.once("dedup", "evt-1", ttl_seconds=60) is False
        n = await c.kv.incr("rate", "acme", delta=2, max=3, ttl_seconds=60)
        refused = await c.kv.incr("rate", "acme", delta=2, max=3, ttl_seconds=60)
        assert n["value"] == 2 and (refused["applied"], refused["reason"]) == (False, "limit")
        many = await c.kv.get_many("saga", ["booking-17", "nope"])
        assert [r["key"] for r in many["rows"]] == ["booking-17"] and many["missing"] == ["nope"]
        for i in range(5):
            await c.kv.put("walk", f"w:{i}", i, ttl_seconds=60)
        page = await c.kv.get_prefix("walk", "w:", limit=2)
        assert page["truncated"] and page["nextAfter"] == "w:1"
        assert [r["value"] for r in await c.kv.list_all("walk", "w:", limit=2)] == list(range(5))
        assert await c.kv.check("saga", "booking-17", expect=moved["version"])
        assert (await c.kv.check("saga", "booking-17", expect=0))["reason"] == "exists"
        assert await c.kv.check("saga", "nope", expect=0)
        assert await c.kv.delete("saga", "booking-17")
        assert (await c.kv.delete("saga", "booking-17"))["reason"] == "absent"
        results = await c.kv.batch([c.kv.op.put("b", "1", "one", ttl_seconds=60),
                                    c.kv.op.get("b", "absent"),
                                    c.kv.op.incr("b", "n", delta=2, ttl_seconds=60)])
        assert [r["index"] for r in results] == [0, 1, 2] and results[2]["value"] == 2
        with pytest.raises(KvError) as refused_call:
            await c.kv.put("NOT A NAMESPACE", "k", 1, ttl_seconds=60)
        assert (refused_call.value.status, refused_call.value.code,
                refused_call.value.reason) == (400, "kv_bad_request", "kv_bad_namespace")

    await run(broker, flow)


# -- races --------------------------------------------------------------------------------------


async def test_concurrent_put_if_absent_has_exactly_one_winner(
    broker: BrokerHandle, database_url: str
) -> None:
    async def flow(c: Any) -> list[Any]:
        return list(await asyncio.gather(*(
            c.kv.put_if_absent("claims", "order-9", {"by": i}, ttl_seconds=60)
            for i in range(12))))

    for _ in range(3):  # a few rounds: each one a fresh key race
        results = await run(broker, flow)
        [winner] = [r for r in results if r["applied"]]
        losers = [r for r in results if not r["applied"]]
        assert len(losers) == 11
        assert all((r["reason"], r["value"], r["version"]) ==
                   ("exists", winner["value"], winner["version"]) for r in losers)
        assert kv_rows(database_url, "claims") == [("order-9", winner["value"],
                                                    winner["version"])]
        with psycopg.connect(database_url) as conn:
            conn.execute("DELETE FROM queen.kv WHERE namespace = 'claims'")


async def test_concurrent_incr_adds_up_exactly(broker: BrokerHandle, database_url: str) -> None:
    async def flow(c: Any) -> list[Any]:
        async def worker() -> list[Any]:
            return [await c.kv.incr("count", "hits", delta=1, ttl_seconds=600)
                    for _ in range(20)]

        return [r for rs in await asyncio.gather(*(worker() for _ in range(6))) for r in rs]

    results = await run(broker, flow)
    assert all(r["applied"] for r in results)
    # Every increment saw a distinct count: none was lost, none applied twice.
    assert sorted(r["value"] for r in results) == list(range(1, 121))
    assert [(k, v) for k, v, _ in kv_rows(database_url, "count")] == [("hits", 120)]


async def test_concurrent_incr_under_a_ceiling_admits_exactly_the_ceiling(
    broker: BrokerHandle,
) -> None:
    async def flow(c: Any) -> list[Any]:
        return list(await asyncio.gather(*(
            c.kv.incr("quota", "acme", delta=1, max=10, ttl_seconds=600) for _ in range(30))))

    results = await run(broker, flow)
    assert sum(r["applied"] for r in results) == 10
    assert all(r["reason"] == "limit" for r in results if not r["applied"])


# -- locks --------------------------------------------------------------------------------------


async def test_a_lock_has_one_holder_and_a_later_holder_a_higher_token(
    broker: BrokerHandle,
) -> None:
    lock_name = name()

    async def flow(c: Any) -> None:
        handles = [c.lock(lock_name, ttl_seconds=30) for _ in range(10)]
        got = await asyncio.gather(*(h.acquire() for h in handles))
        assert sum(got) == 1, got
        [holder] = [h for h, ok in zip(handles, got, strict=True) if ok]
        who = await c.locks.get(lock_name)
        assert [(h["slot"], h["owner"], h["token"]) for h in who["holders"]] == [
            (0, holder.owner, holder.token)]
        row = await c.kv.get("queen-locks", f"{lock_name}#0")
        assert row["version"] == holder.token and row["value"]["owner"] == holder.owner
        assert await c.lock(lock_name, ttl_seconds=30).acquire() is False
        await holder.release()

    await run(broker, flow)


async def test_tokens_strictly_increase_across_contending_holders(broker: BrokerHandle) -> None:
    lock_name = name()

    async def flow(c: Any) -> tuple[list[int], int]:
        tokens: list[int] = []
        inside = 0
        most = 0

        async def worker() -> None:
            nonlocal inside, most
            for _ in range(4):
                lock = c.lock(lock_name, ttl_seconds=30, retry_min=0.01, retry_max=0.05)
                assert await lock.acquire(wait=60)
                inside += 1
                most = max(most, inside)
                tokens.append(lock.token)
                await asyncio.sleep(0.01)
                inside -= 1
                assert await lock.release()

        await asyncio.gather(*(worker() for _ in range(5)))
        return tokens, most

    tokens, most = await run(broker, flow)
    assert most == 1 and len(tokens) == 20
    # In the order the lock was held, each holder's token is above the one before it.
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)


async def test_an_owner_sending_again_gets_the_same_permit(broker: BrokerHandle) -> None:
    lock_name = name()

    async def flow(c: Any) -> None:
        first = await c.locks.acquire(lock_name, ttl_seconds=30, owner="me")
        again = await c.locks.acquire(lock_name, ttl_seconds=30, owner="me")
        assert again["already"] is True and again["token"] == first["token"]
        renewed = await c.locks.renew(lock_name, token=first["token"], ttl_seconds=30,
                                      owner="me")
        resent = await c.locks.renew(lock_name, token=first["token"], ttl_seconds=30,
                                     owner="me")
        assert renewed and resent and resent["token"] > renewed["token"] > first["token"]
        stranger = await c.locks.renew(lock_name, token=first["token"], ttl_seconds=30,
                                       owner="other")
        assert (stranger["renewed"], stranger["reason"], stranger["holders"]) == (
            False, "lost", [{"slot": 0, "owner": "me"}])
        assert not await c.locks.release(lock_name, token=first["token"])
        assert await c.locks.release(lock_name, token=resent["token"])
        assert not await c.locks.get(lock_name)

    await run(broker, flow)


async def test_a_semaphore_never_grants_more_than_its_limit(broker: BrokerHandle) -> None:
    lock_name = name()

    async def flow(c: Any) -> None:
        permits = [c.semaphore(lock_name, 3, ttl_seconds=30) for _ in range(12)]
        got = await asyncio.gather(*(p.acquire() for p in permits))
        holders = [p for p, ok in zip(permits, got, strict=True) if ok]
        assert 1 <= len(holders) <= 3
        for p in permits:  # one at a time, the semaphore fills up, and no further
            if not p.held and await p.acquire():
                holders.append(p)
        assert sorted(p.slot for p in holders) == [0, 1, 2]
        assert len((await c.locks.get(lock_name))["holders"]) == 3
        for p in permits:
            await p.release()

    await run(broker, flow)


# -- transaction riders -------------------------------------------------------------------------


async def test_a_gate_and_its_push_are_one_transaction(broker: BrokerHandle) -> None:
    q = name()

    async def flow(c: Any) -> None:
        first = await (c.transaction().queue(q).push([{"data": {"attempt": 1}}])
                       .once("dedup", f"{q}:evt-1", ttl_seconds=300).commit())
        second = await (c.transaction().queue(q).push([{"data": {"attempt": 2}}])
                        .once("dedup", f"{q}:evt-1", ttl_seconds=300).commit())
        assert first["success"] is True
        assert (second["success"], second["reason"], second["kvReason"]) == (
            False, "kv_precondition", "exists")
        assert second["failedIndex"] == 1  # one pushed item first, then the kv array
        assert await drain(c, q) == [{"attempt": 1}]

    await run(broker, flow)


async def test_a_kv_only_bundle_and_a_kv_write_sharing_its_ack_fate(
    broker: BrokerHandle,
) -> None:
    q = name()

    async def flow(c: Any) -> None:
        res = await (c.transaction().kv.put("solo", "a", {"a": 1}, ttl_seconds=300)
                     .kv.incr("solo", "n", delta=5, ttl_seconds=300).commit())
        assert res["success"] is True
        assert [(r["type"], r["index"]) for r in res["results"]] == [("kv", 0), ("kv", 1)]
        assert (await c.kv.get("solo", "a"))["value"] == {"a": 1}
        await c.queue(q).push([{"data": 1}])
        [message] = await c.queue(q).batch(1).wait(False).pop()
        bogus = {**message, "transactionId": "00000000-0000-4000-8000-000000000000"}
        with pytest.raises(Exception):  # noqa: B017 - whatever the client raises
            await c.transaction().ack(bogus).kv.put("solo", "marker", 1, ttl_seconds=300).commit()
        assert not await c.kv.get("solo", "marker")

    await run(broker, flow)


async def test_a_guarded_bundle_commits_only_while_the_lock_is_held(
    broker: BrokerHandle,
) -> None:
    lock_name, q = name(), name()

    async def flow(c: Any) -> None:
        old = c.lock(lock_name, ttl_seconds=1, auto_renew=False)
        nxt = c.lock(lock_name, ttl_seconds=30)
        assert await old.acquire()
        ok = await c.transaction().guard(old).queue(q).push([{"data": "while held"}]).commit()
        assert ok["success"] is True
        stale_guard = old.guard()
        await asyncio.sleep(1.3)  # the old holder is "paused" past its lifetime
        assert await nxt.acquire() and nxt.token > stale_guard["expect"]
        stale = await (c.transaction()
                       .kv.check(stale_guard["ns"], stale_guard["key"],
                                 expect=stale_guard["expect"], required=True)
                       .kv.put("saga", f"{q}-step", "done", ttl_seconds=60)
                       .queue(q).push([{"data": "from the old holder"}]).commit())
        assert (stale["success"], stale["reason"], stale["kvReason"]) == (
            False, "kv_precondition", "version")
        assert not await c.kv.get("saga", f"{q}-step")
        fresh = await c.transaction().guard(nxt).queue(q).push([{"data": "next"}]).commit()
        assert fresh["success"] is True
        assert await drain(c, q) == ["while held", "next"]
        await nxt.release()

    await run(broker, flow)


async def test_a_guard_survives_the_locks_own_renewal(broker: BrokerHandle) -> None:
    lock_name, q = name(), name()

    async def flow(c: Any) -> int:
        lock = c.lock(lock_name, ttl_seconds=3, renew_every=0.1)
        assert await lock.acquire()
        first, committed = lock.token, 0
        end = time.monotonic() + 1.5
        while time.monotonic() < end:
            res = await (c.transaction().guard(lock).queue(q)
                         .push([{"data": committed}]).commit())
            assert res["success"], res
            committed += 1
        assert lock.token > first and lock.held
        assert len(await drain(c, q)) == committed
        await lock.release()
        return committed

    assert await run(broker, flow) > 0

"""Push as Queen does it, driven through Queen's own client (``queen-mq`` 2.6.0, unchanged)
against a broker and a real PostgreSQL: a ``message_id`` per pushed item (a duplicate answers
with the id of the message that won), an empty push answered 201 ``[]``, and
``subscriptionMode=from_beginning`` (what Queen's client and tests send) read as Queen reads it.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import psycopg
import pytest
import trio
from psycopg.rows import dict_row

from queen_trio.config import Settings
from queen_trio.log import housekeeping
from queen_trio.log.segments import SealPolicy
from queen_trio.server import BrokerHandle

from .test_queen_mq import _quiet_signals, name, run  # noqa: F401 (_quiet_signals: a fixture)

pytest.importorskip("queen")

API = "/api/v1"


@pytest.fixture
def settings(database_url: str) -> Settings:
    # Housekeeping stays out of the way (a test seals by hand); a quick sweeper for the timer.
    return Settings(database_url=database_url, port=0, graceful_timeout_ms=1000, db_pool_size=5,
                    housekeeping_interval_ms=3_600_000, sweeper_min_sleep_ms=5,
                    sweeper_max_sleep_ms=500)


async def pop_all(c: Any, queue: str, n: int, timeout_s: float = 10.0) -> list[Any]:
    got: list[Any] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < n and time.monotonic() < deadline:
        got += await c.queue(queue).batch(n).wait(True).timeout_millis(1000).pop()
    return got


# -- message_id -------------------------------------------------------------------------------


async def test_each_pushed_item_has_the_id_its_delivery_carries(broker: BrokerHandle) -> None:
    q = name()

    async def flow(c: Any) -> tuple[list[Any], list[Any]]:
        pushed = await c.queue(q).push([{"data": {"n": i}} for i in range(3)])
        return pushed, await pop_all(c, q, 3)

    pushed, popped = await run(broker, flow)
    assert [p["status"] for p in pushed] == ["queued"] * 3
    ids = [p["message_id"] for p in pushed]
    assert len(set(ids)) == 3 and all(ids)
    assert [p["messageId"] for p in pushed] == ids
    assert {m["transactionId"]: m["id"] for m in popped} == {
        p["transaction_id"]: p["message_id"] for p in pushed}


async def test_a_duplicate_answers_with_the_id_of_the_message_that_won(
    broker: BrokerHandle,
) -> None:
    q = name()

    async def flow(c: Any) -> tuple[Any, Any, Any]:
        first = await c.queue(q).partition("eu").push([{"transactionId": "t-1", "data": 1}])
        again = await c.queue(q).partition("eu").push([{"transactionId": "t-1", "data": 2}])
        # In one push: the first of the same transaction id wins, the rest point at it; beside
        # them the earlier message's duplicates.
        batch = await c.queue(q).partition("eu").push([
            {"transactionId": "t-2", "data": 3}, {"transactionId": "t-2", "data": 4},
            {"transactionId": "t-1", "data": 5}, {"transactionId": "t-1", "data": 6},
        ])
        return first, again, batch

    first, again, batch = await run(broker, flow)
    winner = first[0]["message_id"]
    assert first[0]["status"] == "queued"
    assert (again[0]["status"], again[0]["message_id"]) == ("duplicate", winner)
    assert [r["status"] for r in batch] == ["queued", "duplicate", "duplicate", "duplicate"]
    assert batch[1]["message_id"] == batch[0]["message_id"] != winner
    assert batch[2]["message_id"] == batch[3]["message_id"] == winner


async def test_concurrent_pushes_of_one_transaction_id_all_name_the_winner(
    broker: BrokerHandle,
) -> None:
    q = name()

    async def flow(c: Any) -> list[Any]:
        await c.queue(q).create()
        answers = await asyncio.gather(*(
            c.queue(q).push([{"transactionId": "same", "data": {"i": i}}]) for i in range(8)))
        return [a[0] for a in answers]

    results = await run(broker, flow)
    queued = [r for r in results if r["status"] == "queued"]
    assert len(queued) == 1
    assert {r["message_id"] for r in results} == {queued[0]["message_id"]}


def _seal(url: str, queue: str) -> int:
    policy = SealPolicy(max_frames=5, max_bytes=1 << 20, min_age_ms=0, max_age_ms=0)
    made = 0
    with psycopg.connect(url, row_factory=dict_row, autocommit=True) as conn:
        pids = [r["partition_id"] for r in conn.execute(
            "SELECT p.partition_id FROM queen.partitions p JOIN queen.queues q USING (queue_id) "
            "WHERE q.name = %s", (queue,))]
        for pid in pids:
            while True:
                with conn.transaction():
                    if housekeeping.seal_partition(conn, pid, policy) is None:
                        break
                made += 1
    return made


async def test_a_duplicate_of_a_sealed_message_names_it(
    broker: BrokerHandle, database_url: str,
) -> None:
    q = name()
    items = [{"transactionId": f"t-{i}", "data": i} for i in range(7)]

    async def push(c: Any) -> list[Any]:
        return await c.queue(q).push(items)

    first = await run(broker, push)
    assert await trio.to_thread.run_sync(_seal, database_url, q) == 2  # 5 + 2 frames
    again = await run(broker, push)
    assert [r["status"] for r in again] == ["duplicate"] * 7
    assert [r["message_id"] for r in again] == [r["message_id"] for r in first]


async def test_a_push_repeating_a_fired_timers_txn_names_the_timers_message(
    broker: BrokerHandle, database_url: str,
) -> None:
    """A timer's frame carries the id promised when it was scheduled: a push that repeats
    its txn (the same queue and partition) is a duplicate of that message, sealed or not."""
    q = name()

    async def flow(c: Any) -> tuple[Any, list[Any], Any]:
        scheduled = await c.timers.schedule(q, "k", {"v": 1}, delay_ms=-1, txn="timer-txn")
        fired = await pop_all(c, q, 1)
        again = await c.queue(q).push([{"transactionId": "timer-txn", "data": {"v": 2}}])
        return scheduled, fired, again

    async def push_again(c: Any) -> Any:
        return await c.queue(q).push([{"transactionId": "timer-txn", "data": {"v": 3}}])

    scheduled, fired, again = await run(broker, flow)
    promised = scheduled["messageId"]
    assert [m["id"] for m in fired] == [promised]
    assert (again[0]["status"], again[0]["message_id"]) == ("duplicate", promised)
    assert await trio.to_thread.run_sync(_seal, database_url, q) == 1
    sealed = await run(broker, push_again)
    assert (sealed[0]["status"], sealed[0]["message_id"]) == ("duplicate", promised)


async def test_a_transaction_push_carries_message_ids(broker: BrokerHandle) -> None:
    q = name()

    async def flow(c: Any) -> tuple[Any, list[Any]]:
        await c.queue(q).create()
        res = await c.transaction().queue(q).push([{"data": {"n": 1}}]).commit()
        return res, await pop_all(c, q, 1)

    res, popped = await run(broker, flow)
    pushes = [r for r in res["results"] if r.get("type") == "push"]
    assert [r["message_id"] for r in pushes] == [m["id"] for m in popped]


# -- an empty push ----------------------------------------------------------------------------


async def test_an_empty_push_is_201_with_no_results(
    broker: BrokerHandle, http: httpx.AsyncClient,
) -> None:
    q = name()

    async def flow(c: Any) -> Any:
        await c.queue(q).create()
        return await c.queue(q).push([])

    assert await run(broker, flow) == []
    r = await http.post(f"{API}/push", json={"items": []})
    assert (r.status_code, r.json()) == (201, [])
    # Still refused: no items array at all.
    for body in ({}, {"items": "nope"}, {"items": None}):
        r = await http.post(f"{API}/push", json=body)
        assert (r.status_code, r.json()["error"]) == (400, "invalid_items"), body


async def test_an_empty_push_in_a_transaction_adds_nothing(
    broker: BrokerHandle, http: httpx.AsyncClient,
) -> None:
    """Queen flattens a bundle's push operations into their items: none is no error."""
    q = name()
    r = await http.post(f"{API}/transaction", json={"operations": [
        {"type": "push", "items": []},
        {"type": "push", "items": [{"queue": q, "payload": 1}]}]})
    assert r.status_code == 200 and r.json()["success"] is True
    assert [(x["type"], x["operation"], x["status"]) for x in r.json()["results"]] == [
        ("push", 1, "queued")]


# -- subscriptionMode=from_beginning ----------------------------------------------------------


async def test_from_beginning_starts_a_new_group_at_the_first_message(
    broker: BrokerHandle, http: httpx.AsyncClient,
) -> None:
    q = name()

    async def flow(c: Any) -> tuple[list[Any], list[Any], list[Any]]:
        await c.queue(q).push([{"data": {"n": i}} for i in range(3)])
        seen: list[Any] = []

        async def handler(msgs: list[Any]) -> None:  # batch > 1: the handler gets a list
            seen.extend(m["data"]["n"] for m in msgs)

        # As Queen's own consume tests do it.
        await (c.queue(q).subscription_mode("from_beginning").group("g1").batch(3).limit(1)
               .wait(False).consume(handler))
        popped = await (c.queue(q).subscription_mode("from_beginning").group("g2").batch(10)
                        .wait(False).pop())
        new = await c.queue(q).subscription_mode("new").group("g3").batch(10).wait(False).pop()
        return seen, popped, new

    seen, popped, new = await run(broker, flow)
    assert sorted(seen) == [0, 1, 2]
    assert [m["data"]["n"] for m in popped] == [0, 1, 2]
    assert new == []
    # A mode Queen does not have is still a typo, refused.
    r = await http.get(f"{API}/pop/queue/{q}",
                       params={"consumerGroup": "g4", "subscriptionMode": "from-beginning"})
    assert (r.status_code, r.json()["error"]) == (400, "invalid_subscription_mode")
    assert "from_beginning" in r.json()["message"]

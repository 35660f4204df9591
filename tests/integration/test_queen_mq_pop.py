"""Queen 2's pop semantics through Queen's own client (``queen-mq`` 2.6.0, unchanged): one
lease for a multi-partition pop, the consume loop on it, pop autopilot (the client's default),
conflation (the client raises unless every answer says ``"conflation": true``), and the queue
option ``windowBuffer``."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from queen_trio.server import BrokerHandle

from .test_queen_mq import _quiet_signals, name, run

queen = pytest.importorskip("queen")

__all__ = ["_quiet_signals"]  # the autouse fixture, for this module too


async def test_consume_across_partitions_under_one_lease(broker: BrokerHandle) -> None:
    """Queen's own multi-partition consume test, with the lease assertion made exact."""
    q = name()

    async def flow(c: Any) -> list[Any]:
        await c.queue(q).create()
        for p in range(3):
            await c.queue(q).partition(f"p{p}").push(
                [{"data": {"p": p, "m": 0}}, {"data": {"p": p, "m": 1}}])
        received: list[Any] = []

        async def handler(msgs: Any) -> None:
            received.extend(msgs if isinstance(msgs, list) else [msgs])

        await (c.queue(q).batch(100).partitions(3).wait(False).limit(1).auto_ack(True)
               .consume(handler))
        leftover = await c.queue(q).batch(100).partitions(3).wait(False).pop()
        return [received, leftover]

    received, leftover = await run(broker, flow)
    assert len(received) == 6 and len({m["partitionId"] for m in received}) == 3
    assert len({m["leaseId"] for m in received}) == 1
    assert leftover == []  # the batch ack under the one lease settled all three partitions


async def test_renew_and_lease_seconds_act_on_every_partition(broker: BrokerHandle) -> None:
    q = name()

    async def flow(c: Any) -> None:
        await c.queue(q).config({"lease_time": 2}).create()
        for p in ("a", "b"):
            await c.queue(q).partition(p).push([{"data": {"p": p}}])
        msgs = await c.queue(q).group("g").batch(10).partitions(2).wait(False).pop()
        assert len(msgs) == 2 and len({m["leaseId"] for m in msgs}) == 1
        for _ in range(3):  # kept alive past its 2-second lease by renewals of the one lease
            await asyncio.sleep(1)
            renewed = await c.renew(msgs)
            assert len(renewed) == 1 and renewed[0]["success"] is True, renewed
        assert await c.queue(q).group("g").batch(10).partitions(2).wait(False).pop() == []
        acked = await c.ack(msgs, True, {"group": "g"})
        assert acked["success"] is True
        # not renewed, the lease runs out for both partitions at once: both come back
        await c.queue(q).partition("a").push([{"data": {"p": "a2"}}])
        await c.queue(q).partition("b").push([{"data": {"p": "b2"}}])
        held = await c.queue(q).group("g").batch(10).partitions(2).wait(False).pop()
        assert len(held) == 2
        await asyncio.sleep(2.5)
        back = await c.queue(q).group("g").batch(10).partitions(2).wait(False).pop()
        assert sorted(m["data"]["p"] for m in back) == ["a2", "b2"]
        assert back[0]["leaseId"] != held[0]["leaseId"]

    await run(broker, flow)


async def test_autopilot_is_the_clients_default_and_the_broker_sizes_the_pop(
    broker: BrokerHandle,
) -> None:
    q = name()

    async def flow(c: Any) -> list[Any]:
        await c.queue(q).create()
        for p in range(4):
            await c.queue(q).partition(f"p{p}").push([{"data": {"p": p, "m": m}}
                                                      for m in range(5)])
        # Queen's own test: with autopilot on, one consumer takes all four ready partitions
        res = await c.queue(q).group("g").wait(False).pop_result()
        pinned = await c.queue(q).group("h").partitions(1).wait(False).pop_result()
        off = await c.queue(q).group("k").batch(100).autopilot(False).wait(False).pop()
        return [res, pinned, off]

    res, pinned, off = await run(broker, flow)
    assert len(res.messages) == 20 and len({m["partitionId"] for m in res.messages}) == 4
    assert res.autopilot is not None and res.autopilot.batch == 100
    assert res.autopilot.partitions >= 4
    assert len({m["leaseId"] for m in res.messages}) == 1
    assert pinned.autopilot.partitions == 1 and len(pinned.messages) == 5
    assert len({m["partitionId"] for m in off}) == 1  # autopilot off: one partition


async def test_conflation_through_pop_and_consume(broker: BrokerHandle) -> None:
    q = name()

    async def flow(c: Any) -> list[Any]:
        await c.queue(q).create()
        # an empty answer says "conflation": true as well, or the client would raise here
        empty = await c.queue(q).group("w").conflation().wait(False).pop()
        for key in ("x", "y"):
            for v in range(20):
                await c.queue(q).partition(key).push([{"data": {"key": key, "v": v}}])
        seen: list[Any] = []

        async def handler(msg: Any) -> None:
            seen.append(msg["data"])

        await c.queue(q).group("w").conflation().wait(False).limit(2).each().consume(handler)
        after = await c.queue(q).group("w").conflation().wait(False).pop()
        return [empty, seen, after]

    empty, seen, after = await run(broker, flow)
    assert empty == []
    assert sorted((d["key"], d["v"]) for d in seen) == [("x", 19), ("y", 19)]
    assert after == []  # acking the newest retired everything behind it


async def test_conflation_is_the_consumer_groups_policy(broker: BrokerHandle) -> None:
    """Queen keeps conflation per consumer group, registered by the group's first pop: a
    consumer of a conflating group that does not ask for it still gets the newest message
    only, and one asking for it on a group registered without it gets every message, a
    ``conflationConflict`` answer and the client's warning (not its error)."""
    from queen.utils import conflation as client_conflation

    q = name()

    async def flow(c: Any) -> list[Any]:
        await c.queue(q).create()
        # each group's first pop registers its policy
        assert await c.queue(q).group("latest").conflation().wait(False).pop() == []
        assert await c.queue(q).group("audit").wait(False).pop() == []
        await c.queue(q).push([{"data": {"v": v}} for v in range(10)])
        undeclared = await c.queue(q).group("latest").batch(10).wait(False).pop()
        client_conflation.reset_conflict_warnings()
        declared = await c.queue(q).group("audit").conflation().batch(10).wait(False).pop()
        warned = client_conflation.warn_conflict_once(q, "audit")
        return [undeclared, declared, warned]

    undeclared, declared, warned = await run(broker, flow)
    assert [m["data"]["v"] for m in undeclared] == [9]  # the group's policy, not the pop's
    assert [m["data"]["v"] for m in declared] == list(range(10))
    assert warned is False  # the conflict was reported to the client already


async def test_a_lease_that_runs_out_spends_no_retry(broker: BrokerHandle) -> None:
    """Queen charges retryLimit only for a failed ack: a consumer that dies holding the
    message (its lease runs out) does not use up the message's retries."""
    q = name()

    async def flow(c: Any) -> list[Any]:
        await c.queue(q).config({"lease_time": 1, "retry_limit": 1}).create()
        await c.queue(q).push([{"data": {"n": 1}}])
        for _ in range(3):  # three consumers die holding it
            assert [m["data"] for m in await c.queue(q).wait(False).pop()] == [{"n": 1}]
            await asyncio.sleep(1.3)
        again = await c.queue(q).wait(False).pop()
        failed = await c.ack(again, False)  # a real failure: one retry spent, one left
        last = await c.queue(q).wait(False).pop()
        done = await c.ack(last, True)
        return [again, failed, last, done]

    again, failed, last, done = await run(broker, flow)
    assert [m["data"] for m in again] == [{"n": 1}] and failed["success"] is True
    assert [m["data"] for m in last] == [{"n": 1}] and done["success"] is True


async def test_window_buffer_through_the_client(broker: BrokerHandle) -> None:
    """Queen's JS client test pushWindowBuffer, with Queen's Python client."""
    q = name()

    async def flow(c: Any) -> list[Any]:
        created = await c.queue(q).config({"window_buffer": 2}).create()
        await c.queue(q).push([{"data": {"n": n}} for n in range(3)])
        early = await c.queue(q).batch(1).wait(False).pop()
        await asyncio.sleep(2.5)
        late = await c.queue(q).batch(4).wait(False).pop()
        return [created, early, late]

    created, early, late = await run(broker, flow)
    assert created["options"]["windowBuffer"] == 2
    assert early == [] and [m["data"]["n"] for m in late] == [0, 1, 2]


async def test_delivery_attempt_counts_the_times_a_batch_is_handed_out(
    broker: BrokerHandle,
) -> None:
    """Queen's ``deliveryAttempt``: 1 for a batch's first delivery, one more each time the
    group is handed the same batch again (a nack, or a lease that runs out), 1 again once the
    cursor has moved; autoAck never redelivers, so it is always 1."""
    q = name()

    async def flow(c: Any) -> list[Any]:
        await c.queue(q).config({"lease_time": 1, "retry_limit": 10}).create()
        await c.queue(q).push([{"data": {"n": n}} for n in range(3)])
        seen = []
        first = await c.queue(q).group("g").batch(3).wait(False).pop()
        seen.append(first)
        await c.ack(first, False, {"group": "g"})  # a nack: the batch comes back
        seen.append(await c.queue(q).group("g").batch(3).wait(False).pop())
        await asyncio.sleep(1.5)  # its lease runs out unacknowledged: back again
        third = await c.queue(q).group("g").batch(3).wait(False).pop()
        seen.append(third)
        await c.ack(third[0], True, {"group": "g"})  # the cursor moves past the first
        await asyncio.sleep(1.5)
        seen.append(await c.queue(q).group("g").batch(3).wait(False).pop())
        await c.ack(seen[-1], True, {"group": "g"})
        await c.queue(q).push([{"data": {"n": 3}}])
        seen.append(await c.queue(q).group("g").batch(3).wait(False).pop())  # fresh work
        seen.append(await c.queue(q).group("auto").batch(4).auto_ack(True).wait(False).pop())
        return seen

    seen = await run(broker, flow)
    assert [[(m["data"]["n"], m["deliveryAttempt"]) for m in msgs] for msgs in seen] == [
        [(0, 1), (1, 1), (2, 1)],
        [(0, 2), (1, 2), (2, 2)],
        [(0, 3), (1, 3), (2, 3)],
        [(1, 1), (2, 1)],  # a new batch: it starts after the committed offset
        [(3, 1)],
        [(0, 1), (1, 1), (2, 1), (3, 1)],
    ]


async def test_a_batch_handed_back_with_retry_counts_another_attempt(
    broker: BrokerHandle,
) -> None:
    """A ``retry`` ack hands the batch back without spending a retry; the next pop (which the
    one-statement pop would otherwise serve) is the batch's next delivery attempt."""
    q = name()

    async def flow(c: Any) -> list[Any]:
        await c.queue(q).create()
        await c.queue(q).partition("p").push([{"data": {"n": n}} for n in range(2)])
        seen = []
        for _ in range(3):
            # (one partition named: the pop the one-statement pop serves when it can)
            msgs = await c.queue(q).partition("p").group("g").batch(2).wait(False).pop()
            seen.append([(m["data"]["n"], m["deliveryAttempt"], m["retryCount"]) for m in msgs])
            await c.ack(msgs, "retry", {"group": "g"})
        return seen

    assert await run(broker, flow) == [[(0, a, 0), (1, a, 0)] for a in (1, 2, 3)]


async def test_a_conflated_lease_commits_the_cursor_when_its_message_is_acked(
    broker: BrokerHandle,
) -> None:
    """As Queen's: a conflating pop hands out the newest message under a lease over everything
    up to it and leaves the cursor where it is; the ack of that message commits it there. Until
    then the group's lag counts every message, and a nack leaves them all pending."""
    q = name()

    async def lag(c: Any) -> int:
        groups = await c.admin.list_consumer_groups()
        return next(g["totalLag"] for g in groups if g["name"] == "latest")

    async def flow(c: Any) -> list[Any]:
        await c.queue(q).create()
        await c.queue(q).push([{"data": {"v": v}} for v in range(5)])
        popped = await c.queue(q).group("latest").conflation().wait(False).pop()
        leased = await lag(c)
        await c.ack(popped, False, {"group": "latest"})
        nacked = await lag(c)
        again = await c.queue(q).group("latest").conflation().wait(False).pop()
        await c.ack(again, True, {"group": "latest"})
        return [popped, leased, nacked, again, await lag(c),
                await c.queue(q).group("latest").conflation().wait(False).pop()]

    popped, leased, nacked, again, acked, after = await run(broker, flow)
    assert [(m["data"]["v"], m["deliveryAttempt"]) for m in popped] == [(4, 1)]
    assert leased == 5 and nacked == 5  # nothing committed before the ack
    assert [(m["data"]["v"], m["deliveryAttempt"]) for m in again] == [(4, 2)]
    assert acked == 0 and after == []

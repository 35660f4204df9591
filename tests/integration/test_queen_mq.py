"""Queen's own Python client (``queen-mq`` from PyPI) against a live broker, unchanged: every
core flow as a Queen user writes it.

The client is asyncio (httpx); the broker runs in the test's trio loop, so each flow runs in a
worker thread with its own asyncio loop (``run``). Two things are worked around here, in the
test, because they are the client's and not the broker's:
- ``Queen()`` installs SIGINT/SIGTERM handlers, which Python allows only in the main thread:
  they are not installed (``_quiet_signals``).
- pop autopilot (on by default in 2.6) omits ``batch`` so the broker sizes it (see
  test_queen_mq_pop.py): flows that expect a size set ``batch`` explicitly.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
import trio

from queen_trio.server import BrokerHandle

queen = pytest.importorskip("queen")
Queen = queen.Queen


@pytest.fixture(autouse=True)
def _quiet_signals(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(Queen, "_setup_graceful_shutdown", lambda self: None)
    yield


async def run(broker: BrokerHandle, flow: Callable[[Any], Awaitable[Any]]) -> Any:
    """Run ``flow(client)`` with a fresh queen-mq client in a thread of its own."""
    async def main() -> Any:
        client = Queen(url=broker.url, retry_attempts=1, timeout_millis=10_000)
        try:
            return await flow(client)
        finally:
            await client.close()

    return await trio.to_thread.run_sync(asyncio.run, main())


def name() -> str:
    return "q-" + uuid.uuid4().hex[:8]


# -- configure, push, pop, ack ----------------------------------------------------------------


async def test_configure_push_pop_ack(broker: BrokerHandle) -> None:
    q = name()

    async def flow(c: Any) -> None:
        created = await c.queue(q).config({"lease_time": 30, "retry_limit": 2}).create()
        assert created["configured"] is True
        await c.queue(q).push([{"data": {"n": 1}}, {"data": {"n": 2}}])
        msgs = await c.queue(q).batch(10).wait(False).pop()
        assert [m["data"] for m in msgs] == [{"n": 1}, {"n": 2}]
        assert all(m["partitionId"] and m["leaseId"] for m in msgs)
        single = await c.ack(msgs[0], True)
        assert single["success"] is True
        many = await c.ack(msgs[1:], True)
        assert many["success"] is True
        assert await c.queue(q).wait(False).pop() == []

    await run(broker, flow)


async def test_partitions_and_transaction_id_dedupe(broker: BrokerHandle) -> None:
    q = name()

    async def flow(c: Any) -> None:
        await c.queue(q).partition("eu").push([{"transactionId": "t-1", "data": {"n": 1}}])
        dup: list[Any] = []

        async def on_duplicate(items: list[Any], err: Exception) -> None:
            dup.extend(items)

        await (c.queue(q).partition("eu").push([{"transactionId": "t-1", "data": {"n": 1}}])
               .on_duplicate(on_duplicate))
        assert len(dup) == 1
        await c.queue(q).partition("us").push([{"data": {"n": 2}}])
        eu = await c.queue(q).partition("eu").batch(10).wait(False).pop()
        assert [(m["partition"], m["transactionId"]) for m in eu] == [("eu", "t-1")]
        us = await c.queue(q).partition("us").batch(10).wait(False).pop()
        assert [m["data"] for m in us] == [{"n": 2}]

    await run(broker, flow)


async def test_pop_waits_for_a_push(broker: BrokerHandle) -> None:
    q = name()

    async def flow(c: Any) -> None:
        async def later() -> None:
            await asyncio.sleep(0.3)
            await c.queue(q).push([{"data": "late"}])

        task = asyncio.create_task(later())
        msgs = await c.queue(q).batch(1).wait(True).timeout_millis(5000).pop()
        await task
        assert [m["data"] for m in msgs] == ["late"]
        await c.ack(msgs, True)

    await run(broker, flow)


async def test_multi_partition_pop(broker: BrokerHandle) -> None:
    q = name()

    async def flow(c: Any) -> None:
        for p in ("a", "b", "c"):
            await c.queue(q).partition(p).push([{"data": {"p": p, "i": i}} for i in range(2)])
        msgs = await c.queue(q).group("g").batch(100).partitions(3).wait(False).pop()
        assert sorted({m["partition"] for m in msgs}) == ["a", "b", "c"]
        for p in ("a", "b", "c"):
            assert [m["data"]["i"] for m in msgs if m["partition"] == p] == [0, 1]
        assert len({m["leaseId"] for m in msgs}) == 1  # one lease for the pop, as Queen's
        renewed = await c.renew(msgs)  # one renewal per distinct lease
        assert len(renewed) == 1 and all(r["success"] for r in renewed)
        acked = await c.ack(msgs, True, {"group": "g"})
        assert acked["success"] is True

    await run(broker, flow)


async def test_subscription_modes(broker: BrokerHandle) -> None:
    q = name()

    async def flow(c: Any) -> None:
        await c.queue(q).push([{"data": "old"}])
        new = c.queue(q).group("fresh").subscription_mode("new").batch(10).wait(False)
        assert await new.pop() == []
        await c.queue(q).push([{"data": "new"}])
        assert [m["data"] for m in await new.pop()] == ["new"]
        now = c.queue(q).group("now").subscription_from("now").batch(10).wait(False)
        assert await now.pop() == []
        everything = c.queue(q).group("all").batch(10).wait(False)
        assert [m["data"] for m in await everything.pop()] == ["old", "new"]
        stamp = c.queue(q).group("ts").subscription_from("2000-01-01T00:00:00Z").batch(10)
        assert len(await stamp.wait(False).pop()) == 2

    await run(broker, flow)


# -- consume ----------------------------------------------------------------------------------


async def test_consume_with_auto_ack(broker: BrokerHandle) -> None:
    q = name()

    async def flow(c: Any) -> list[Any]:
        await c.queue(q).push([{"data": {"n": i}} for i in range(5)])
        seen: list[Any] = []

        async def handler(message: Any) -> None:
            seen.append(message["data"]["n"])

        await c.queue(q).batch(2).limit(5).idle_millis(2000).each().consume(handler)
        assert await c.queue(q).wait(False).pop() == []  # all acked by the client
        return seen

    assert sorted(await run(broker, flow)) == [0, 1, 2, 3, 4]


async def test_consume_with_manual_acks_and_a_failure_to_the_dlq(broker: BrokerHandle) -> None:
    q = name()

    async def flow(c: Any) -> None:
        await c.queue(q).config({"retry_limit": 0}).create()
        await c.queue(q).push([{"data": {"n": 1}}, {"data": {"n": 2}}])
        done: list[int] = []

        async def handler(message: Any) -> None:
            if message["data"]["n"] == 1:
                await c.ack(message, False, {"group": "g", "error": "boom"})
            else:
                await c.ack(message, True, {"group": "g"})
            done.append(message["data"]["n"])

        await (c.queue(q).group("g").auto_ack(False).batch(1).limit(2).idle_millis(2000)
               .each().consume(handler))
        assert sorted(done) == [1, 2]
        dlq = await c.queue(q).dlq("g").limit(10).get()
        assert [m["data"] for m in dlq["messages"]] == [{"n": 1}]

    await run(broker, flow)


async def test_dlq_pagination(broker: BrokerHandle) -> None:
    q = name()

    async def flow(c: Any) -> None:
        await c.queue(q).config({"retry_limit": 0}).create()
        await c.queue(q).push([{"data": {"n": i}} for i in range(3)])
        msgs = await c.queue(q).group("g").batch(10).wait(False).pop()
        await c.ack(msgs, False, {"group": "g"})
        page = await c.queue(q).dlq("g").limit(2).offset(1).get()
        assert page["pagination"]["limit"] == 2 and page["pagination"]["offset"] == 1
        assert [m["data"]["n"] for m in page["messages"]] == [1, 2]

    await run(broker, flow)


# -- leases, transactions, queues -------------------------------------------------------------


async def test_lease_renew(broker: BrokerHandle) -> None:
    q = name()

    async def flow(c: Any) -> None:
        await c.queue(q).push([{"data": 1}])
        (msg,) = await c.queue(q).batch(1).wait(False).pop()
        renewed = await c.renew(msg)
        assert renewed["success"] is True and renewed["newExpiresAt"]
        by_id = await c.renew(msg["leaseId"])
        assert by_id["success"] is True
        await c.ack(msg, True)
        gone = await c.renew(msg)  # released by the ack
        assert gone["success"] is False

    await run(broker, flow)


async def test_transaction_acks_and_pushes_atomically(broker: BrokerHandle) -> None:
    src, dst = name(), name()

    async def flow(c: Any) -> None:
        await c.queue(src).push([{"data": {"step": 1}}])
        (msg,) = await c.queue(src).batch(1).wait(False).pop()
        result = await (c.transaction().ack(msg).queue(dst).push([{"data": {"step": 2}}])
                        .commit())
        assert result["success"] is True
        assert await c.queue(src).wait(False).pop() == []
        out = await c.queue(dst).batch(10).wait(False).pop()
        assert [m["data"] for m in out] == [{"step": 2}]

    await run(broker, flow)


async def test_queue_delete(broker: BrokerHandle) -> None:
    q = name()

    async def flow(c: Any) -> None:
        await c.queue(q).push([{"data": 1}])
        deleted = await c.queue(q).delete()
        assert deleted["deleted"] is True
        assert await c.queue(q).wait(False).pop() == []

    await run(broker, flow)


# -- consumer-group admin, configure options, admin reads ---------------------------------------


async def test_delete_consumer_group(broker: BrokerHandle) -> None:
    q = name()

    async def flow(c: Any) -> None:
        await c.queue(q).push([{"data": 1}])
        await c.queue(q).group("g").batch(1).wait(False).pop()
        await c.delete_consumer_group("g", delete_metadata=True)

    await run(broker, flow)


async def test_configure_echoes_queen_options(broker: BrokerHandle) -> None:
    q = name()

    async def flow(c: Any) -> None:
        created = await c.queue(q).config({"max_size": 10, "retention_seconds": 60}).create()
        assert created["options"]["maxSize"] == 10

    await run(broker, flow)


async def test_admin_partitions(broker: BrokerHandle) -> None:
    q = name()

    async def flow(c: Any) -> None:
        await c.queue(q).push([{"data": 1}])
        partitions = await c.admin.get_partitions(queue=q)
        assert partitions

    await run(broker, flow)

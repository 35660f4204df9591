"""The consume loop against a real broker: acks, handler failures, leases kept and lost."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from queen_trio.client import BadRequest, Client, Message

from . import test_sdk
from .test_sdk import pop_one

settings, queen = test_sdk.settings, test_sdk.queen  # the same fixtures


async def test_a_failing_handler_is_retried_then_completed(queen: Client) -> None:
    await queen.configure("work", retry_limit=3)
    await queen.push_many("work", [{"n": 0}, {"n": 1}, {"n": 2}])
    seen: list[tuple[int, int]] = []

    async def handler(message: Message) -> None:
        seen.append((message.data["n"], message.retry_count))
        if message.data["n"] == 1 and message.retry_count == 0:
            raise RuntimeError("flaky")

    stats = await queen.consume("work", handler, max_messages=4)
    assert seen == [(0, 0), (1, 0), (1, 1), (2, 0)]
    assert (stats.handled, stats.completed, stats.failed, stats.ack_errors) == (4, 3, 1, 0)
    assert len(await queen.pop("work")) == 0


async def test_a_handler_that_always_fails_ends_in_the_dead_letters(queen: Client) -> None:
    await queen.configure("doomed", retry_limit=1)
    await queen.push("doomed", {"poison": True})

    def handler(message: Message) -> None:  # plain functions are handlers too
        raise ValueError("cannot parse")

    stats = await queen.consume("doomed", handler, idle_timeout="300ms", poll="100ms")
    assert (stats.handled, stats.failed, stats.completed) == (2, 2, 0)
    [letter] = [d async for d in queen.dlq.list("doomed")]
    assert letter.data == {"poison": True}
    assert letter.error == "ValueError: cannot parse"


async def test_the_lease_is_renewed_while_a_slow_handler_runs(queen: Client) -> None:
    await queen.configure("slow", lease_time=1)
    await queen.push("slow", "patience")
    meanwhile: list[int] = []

    async def handler(message: Message) -> None:
        await trio.sleep(1.6)  # well past the 1 s lease
        meanwhile.append(len(await queen.pop("slow")))  # nobody else can take it
        await trio.sleep(0.5)

    stats = await queen.consume("slow", handler, max_messages=1)
    assert meanwhile == [0]
    assert (stats.completed, stats.ack_errors, stats.leases_lost) == (1, 0, 0)
    assert len(await queen.pop("slow")) == 0


async def test_without_renewal_an_expired_lease_hands_the_message_over(queen: Client) -> None:
    await queen.configure("expiring", lease_time=1)
    await queen.push("expiring", "contested")
    stolen: list[Message] = []

    async def handler(message: Message) -> None:
        await trio.sleep(1.3)
        stolen.extend(await queen.pop("expiring"))  # a second consumer, under a new lease

    stats = await queen.consume("expiring", handler, max_messages=1, renew_leases=False)
    assert [m.data for m in stolen] == ["contested"]
    # The loop's ack is refused (its lease is gone); that is counted, not raised.
    assert (stats.handled, stats.completed, stats.ack_errors) == (1, 0, 1)
    assert (await queen.ack(stolen[0])).lease_released


async def test_a_crashed_consumers_message_comes_back_after_its_lease(queen: Client) -> None:
    await queen.configure("orphans", lease_time=1)
    await queen.push("orphans", "left behind")
    abandoned = await pop_one(queen, "orphans")  # popped and never acked
    got: list[Message] = []
    started = trio.current_time()
    stats = await queen.consume("orphans", got.append, max_messages=1)
    assert trio.current_time() - started > 0.5
    assert got[0].transaction_id == abandoned.transaction_id
    assert got[0].lease_id != abandoned.lease_id and stats.completed == 1


async def test_concurrent_workers_take_different_partitions(queen: Client) -> None:
    for p in ("p1", "p2"):
        await queen.push_many("parallel", [f"{p}-a", f"{p}-b"], partition=p)
    in_flight, peak, handled = 0, 0, []

    async def handler(message: Message) -> None:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await trio.sleep(0.2)
        handled.append(message.data)
        in_flight -= 1

    stats = await queen.consume("parallel", handler, concurrency=2, max_messages=4)
    assert peak == 2 and stats.completed == 4
    assert sorted(handled) == ["p1-a", "p1-b", "p2-a", "p2-b"]


async def test_a_handler_may_settle_its_message_in_a_transaction(queen: Client) -> None:
    await queen.push("settling", {"order": 9})
    await queen.push("settling", {"order": 10})

    async def handler(message: Message) -> None:
        order = message.data["order"]
        if order == 9:  # settles it with its state write, atomically
            await (queen.transaction().ack(message)
                   .kv.put("orders", str(order), "done").commit())
        else:
            await queen.kv.put("orders", str(order), "done")

    stats = await queen.consume("settling", handler, max_messages=2)
    assert (stats.settled_by_handler, stats.completed, stats.ack_errors) == (1, 1, 0)
    assert [(await queen.kv.get("orders", k)).value for k in ("9", "10")] == ["done", "done"]
    assert len(await queen.pop("settling")) == 0


async def test_an_api_error_on_pop_ends_the_loop(queen: Client) -> None:
    with pytest.raises(BadRequest) as bad:
        await queen.consume("not a queue name", lambda m: None, max_messages=1)
    assert bad.value.code == "invalid_queue"


async def test_idle_timeout_stops_an_idle_loop(queen: Client) -> None:
    started = trio.current_time()
    stats = await queen.consume("quiet", lambda m: None, idle_timeout="300ms",
                                concurrency=3)
    assert 0.25 < trio.current_time() - started < 2
    assert stats.handled == 0


async def test_consume_rejects_bad_arguments_before_popping(queen: Client) -> None:
    for options in ({"concurrency": 0}, {"batch": 0}, {"poll": "0s"}, {"max_messages": 0},
                    {"idle_timeout": "soon"}):
        kwargs: dict[str, Any] = {"max_messages": 1, **options}
        with pytest.raises(ValueError):
            await queen.consume("q", lambda m: None, **kwargs)


async def test_stopping_leaves_no_abandoned_poll_behind(queen: Client) -> None:
    await queen.push("after-stop", "first", partition="a")
    stats = await queen.consume("after-stop", lambda m: None, concurrency=3, max_messages=1,
                                poll="300ms")
    assert stats.handled == 1
    # Pushed the moment the loop returned: no poll of that loop can still be waiting on the
    # broker to lease it away from us.
    await queen.push("after-stop", "second", partition="b")
    got = await queen.pop("after-stop", wait="1s")
    assert [m.data for m in got] == ["second"]


async def test_a_batch_arriving_after_the_stop_is_given_back_whole(queen: Client) -> None:
    from queen_trio.client.consumer import _Loop

    await queen.push_many("give-back", [1, 2, 3])
    batch = await queen.pop("give-back", batch=3)
    loop = _Loop(queen, "give-back", lambda m: None, group=None, batch=3, partition=None,
                 max_messages=None, idle_s=None, poll_s=1, renew=True)
    await loop.give_back(batch)
    again = await queen.pop("give-back", batch=3)
    assert [(m.data, m.retry_count) for m in again] == [(1, 0), (2, 0), (3, 0)]

"""consume() under asyncio, against a real broker: the stream is then the socket's own
asyncio protocol (client/stream.py ``NativePopStream``, no reader task, no wsproto per frame),
and every behaviour the trio tests check holds there too: each message once, handler failures
retried in order, a handler's own settlement, lease renewal, cancellation, the idle timeout,
backpressure, a broker going away, the HTTP pop loop where the stream is off, refusals."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
import trio

from queen_trio.client import Client, Message, Unauthorized
from queen_trio.client import stream as sdk_stream
from queen_trio.config import Settings
from queen_trio.server import BrokerHandle, run_broker
from tests.conftest import replace_settings

from . import test_sdk
from .test_sdk_consume import POP_ROUTE, _acks_applied, _http_requests
from .test_stream import _pops_and_acks

settings, queen = test_sdk.settings, test_sdk.queen  # the same fixtures
FAST_RETRY = test_sdk.FAST_RETRY
T = TypeVar("T")


class _CountingLoop(asyncio.SelectorEventLoop):
    """Counts its turns (each runs what became ready, after a look at the sockets)."""

    turns = 0

    def _run_once(self) -> None:
        self.turns += 1
        super()._run_once()  # type: ignore[misc]


async def under_asyncio(url: str, main: Callable[[Client], Awaitable[T]],
                        loop: Callable[[], asyncio.AbstractEventLoop] | None = None) -> T:
    """``main(client)`` in a thread of its own under asyncio, with a Client of ``url``; the
    streams it opened are checked to be the asyncio protocol's."""
    opened: list[type] = []

    async def run() -> T:
        real_open = sdk_stream.PopStream.open

        async def spying(*args: Any, **kwargs: Any) -> sdk_stream.PopStream:
            stream = await real_open(*args, **kwargs)
            opened.append(type(stream))
            return stream

        sdk_stream.PopStream.open = spying  # type: ignore[method-assign]
        try:
            async with Client(url, retry=FAST_RETRY, timeout=10) as client:
                return await main(client)
        finally:
            sdk_stream.PopStream.open = real_open  # type: ignore[method-assign]

    def in_thread() -> T:
        with asyncio.Runner(loop_factory=loop) as runner:
            return runner.run(run())

    result = await trio.to_thread.run_sync(in_thread)
    assert set(opened) <= {sdk_stream.NativePopStream}, opened
    return result


async def test_timers_are_handled_once_each_over_one_native_stream(
    queen: Client, broker: BrokerHandle
) -> None:
    await queen.configure("aio-fired")
    n = 200
    bundle = queen.transaction()
    for i in range(n):  # due over 0.3-0.9 s: small batches, as a steady rate brings them
        bundle = bundle.timer("aio-fired").key(f"t{i}").delay(300 + i * 3).payload(i).schedule()
    await bundle.commit()
    requests_before = _pops_and_acks(broker)
    acks_before = _acks_applied(broker).get("completed", 0)
    handled: list[str] = []

    def handler(message: Message) -> None:
        assert message.timer is not None and message.timer.deliver_at is not None
        assert message.created_at.tzinfo is not None
        handled.append(message.timer.key)

    stats = await under_asyncio(
        broker.url, lambda c: c.consume("aio-fired", handler, max_messages=n))
    assert sorted(handled) == sorted(f"t{i}" for i in range(n))  # each once
    assert (stats.handled, stats.completed, stats.ack_errors) == (n, n, 0)
    assert _acks_applied(broker)["completed"] - acks_before == n
    assert _pops_and_acks(broker) == requests_before  # the stream carried it all
    assert stats.requests == 1
    assert len(await queen.pop("aio-fired")) == 0


async def test_a_batch_costs_the_event_loop_two_turns(queen: Client, broker: BrokerHandle) -> None:
    """A batch of a steady trickle wakes the consumer once (its socket) and its worker once:
    no reader task, no watchdog, no anyio checkpoint in between (there were 5)."""
    await queen.configure("aio-turns")
    loop = _CountingLoop()
    leases: set[str | None] = set()
    n = 150

    async def trickle() -> None:
        await trio.sleep(0.3)  # (the stream is open)
        for i in range(n):
            await queen.push("aio-turns", i)
            await trio.sleep(0.004)

    async def main(client: Client) -> tuple[Any, int]:
        # The first batch arms the worker's watchdog (a lease renewal's one look-up).
        await client.push("aio-turns", "first")
        await client.consume("aio-turns", lambda m: None, max_messages=1)
        loop.turns = 0
        stats = await client.consume("aio-turns", lambda m: leases.add(m.lease_id),
                                     max_messages=n, concurrency=1)
        return stats, loop.turns

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trickle)
        stats, turns = await under_asyncio(broker.url, main, lambda: loop)
    assert stats.completed == n and len(leases) > n / 10  # (mostly one message a batch)
    # The stream's opening and ending take a few turns of their own.
    assert turns / len(leases) < 3, (turns, len(leases))


async def test_failures_are_retried_in_order_and_a_handler_may_settle_itself(
    queen: Client, broker: BrokerHandle
) -> None:
    await queen.configure("aio-ordered", retry_limit=2)
    await queen.push_many("aio-ordered", list(range(6)))
    seen: list[tuple[int, int]] = []

    async def main(client: Client) -> Any:
        async def handler(message: Message) -> None:
            seen.append((message.data, message.retry_count))
            await asyncio.sleep(0)
            if message.data == 2 and message.retry_count < 2:
                raise RuntimeError("not yet")
            if message.data == 4:  # settled by the handler itself, with its state
                await client.transaction().ack(message).kv.put(
                    "aio", "4", "ok", forever=True).commit()

        return await client.consume("aio-ordered", handler, max_messages=8)

    stats = await under_asyncio(broker.url, main)
    # 3..5 were handed back untouched (no retry spent) and come after 2's redeliveries.
    assert seen == [(0, 0), (1, 0), (2, 0), (2, 1), (2, 2), (3, 0), (4, 0), (5, 0)]
    assert (stats.completed, stats.failed, stats.settled_by_handler, stats.ack_errors) == (
        5, 2, 1, 0)
    assert (await queen.kv.get("aio", "4")).value == "ok"
    assert len(await queen.pop("aio-ordered")) == 0


async def test_a_backlog_drains_in_order_each_once_a_batch_at_a_time(
    queen: Client, broker: BrokerHandle
) -> None:
    n = 3000  # several default batches, each frame larger than a socket read
    await queen.push_many("aio-backlog", [{"n": i, "pad": "x" * 200} for i in range(n)])
    handled: list[int] = []
    stats = await under_asyncio(broker.url, lambda c: c.consume(
        "aio-backlog", lambda m: handled.append(m.data["n"]), max_messages=n))
    assert handled == list(range(n))
    assert (stats.handled, stats.completed, stats.ack_errors) == (n, n, 0)
    assert len(await queen.pop("aio-backlog")) == 0


async def test_the_lease_is_renewed_while_a_slow_handler_runs(
    queen: Client, broker: BrokerHandle
) -> None:
    await queen.configure("aio-slow", lease_time=1)
    await queen.push_many("aio-slow", ["quick", "patience"])
    meanwhile: list[int] = []

    async def main(client: Client) -> Any:
        async def handler(message: Message) -> None:
            if message.data == "patience":
                await asyncio.sleep(1.6)  # well past the 1 s lease
                meanwhile.append(len(await client.pop("aio-slow")))  # nobody else can
                await asyncio.sleep(0.5)

        # The first batch ("quick") arms the watchdog; the second is renewed on time.
        return await client.consume("aio-slow", handler, max_messages=2, batch=1,
                                    concurrency=1)

    stats = await under_asyncio(broker.url, main)
    assert meanwhile == [0]
    assert (stats.completed, stats.ack_errors, stats.leases_lost) == (2, 0, 0)
    assert len(await queen.pop("aio-slow")) == 0


async def test_cancelling_mid_batch_redelivers_only_unfinished_messages(
    queen: Client, broker: BrokerHandle
) -> None:
    await queen.push_many("aio-crash", list(range(10)))
    finished: list[int] = []

    async def main(client: Client) -> None:
        task: asyncio.Task[Any] | None = None

        async def handler(message: Message) -> None:
            if message.data == 5:
                assert task is not None
                task.cancel()  # the consumer dies while handling 5
                await asyncio.sleep(1)
            finished.append(message.data)

        task = asyncio.ensure_future(client.consume("aio-crash", handler))
        with pytest.raises(asyncio.CancelledError):
            await task

    await under_asyncio(broker.url, main)
    assert finished == [0, 1, 2, 3, 4]
    # At once, not after the lease: 0-4 were settled on the way out, 5-9 given back.
    again = await queen.pop("aio-crash", batch=100)
    assert [(m.data, m.retry_count) for m in again] == [(n, 0) for n in range(5, 10)]


async def test_idle_timeout_stops_an_idle_loop(broker: BrokerHandle) -> None:
    started = trio.current_time()
    stats = await under_asyncio(broker.url, lambda c: c.consume(
        "aio-nothing", lambda m: None, idle_timeout="300ms", poll="5s"))
    assert stats.handled == 0
    assert trio.current_time() - started < 4  # the idle timeout, not the poll, ended it


async def test_no_more_batches_are_out_than_the_consumer_takes(
    queen: Client, broker: BrokerHandle
) -> None:
    for p in range(8):
        await queen.push_many("aio-wide", [f"{p}:{k}" for k in range(12)], partition=f"p{p}")
    running = 0
    most = 0
    order: collections.defaultdict[str, list[int]] = collections.defaultdict(list)

    async def handler(message: Message) -> None:
        nonlocal running, most
        running += 1
        most = max(most, running)
        p, k = message.data.split(":")
        order[p].append(int(k))
        await asyncio.sleep(0.01)
        running -= 1

    stats = await under_asyncio(broker.url, lambda c: c.consume(
        "aio-wide", handler, concurrency=3, batch=4, max_messages=96))
    assert stats.handled == 96 and stats.completed == 96
    assert 2 <= most <= 3  # in parallel, never more than concurrency at once
    assert all(ks == list(range(12)) for ks in order.values()) and len(order) == 8


async def test_a_consumer_outlives_a_broker_restart(database_url: str, settings: Settings) -> None:
    """The stream ends with the broker (1001); consume() reconnects to the next one."""
    handled: list[Any] = []
    async with trio.open_nursery() as nursery:
        first: BrokerHandle = await nursery.start(run_broker, settings)
        port = int(first.url.rsplit(":", 1)[1])
        again = replace_settings(settings, port=port)

        async def lifecycle() -> None:
            async with Client(first.url, retry=FAST_RETRY) as client:
                await client.push("aio-restart", "before")
                while not handled:
                    await trio.sleep(0.05)
                first.shutdown()
                await trio.sleep(0.5)
                second: BrokerHandle = await nursery.start(run_broker, again)
                await client.push("aio-restart", "after")
                while len(handled) < 2:
                    await trio.sleep(0.05)
                second.shutdown()

        nursery.start_soon(lifecycle)
        stats = await under_asyncio(first.url, lambda c: c.consume(
            "aio-restart", lambda m: handled.append(m.data), max_messages=2))
    assert handled == ["before", "after"]
    assert stats.completed == 2 and stats.requests >= 2  # a second stream was opened


async def test_the_http_pop_loop_serves_where_the_stream_is_off(settings: Settings) -> None:
    off = replace_settings(settings, stream_pop=False)
    async with trio.open_nursery() as nursery:
        broker: BrokerHandle = await nursery.start(run_broker, off)

        async def main(client: Client) -> tuple[Any, list[int], bool]:
            await client.push_many("aio-plain", list(range(20)))
            handled: list[int] = []
            stats = await client.consume("aio-plain", lambda m: handled.append(m.data),
                                         max_messages=20)
            return stats, handled, client._no_stream

        stats, handled, no_stream = await under_asyncio(broker.url, main)
        assert handled == list(range(20)) and (stats.handled, stats.completed) == (20, 20)
        assert no_stream  # the upgrade was answered 404: popped over HTTP
        assert _http_requests(broker, "POST", POP_ROUTE) >= 1
        broker.shutdown()


async def test_a_refused_upgrade_raises_the_brokers_error(database_url: str) -> None:
    secured = Settings(database_url=database_url, port=0, graceful_timeout_ms=1000,
                       db_pool_size=5, auth=True)
    async with trio.open_nursery() as nursery:
        broker: BrokerHandle = await nursery.start(run_broker, secured)

        async def main(client: Client) -> str:
            with pytest.raises(Unauthorized) as refused:
                await client.consume("guarded", lambda m: None, max_messages=1)
            return refused.value.code

        assert await under_asyncio(broker.url, main) == "unauthorized"
        broker.shutdown()

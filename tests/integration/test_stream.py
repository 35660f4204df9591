"""The streaming pop (queen_trio/api/stream.py) through the SDK's consume(), against a real
broker: timers handled once over one connection, a consumer killed mid-stream loses nothing,
backpressure, the broker's idle timeout, auth, and the fallback to the HTTP pop loop."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import textwrap
import time
from typing import Any

import pytest
import trio

from queen_trio.client import Client, Message, Unauthorized
from queen_trio.config import Settings
from queen_trio.server import BrokerHandle, run_broker
from tests.conftest import replace_settings

from . import test_sdk
from .test_sdk_consume import POP_ROUTE, _acks_applied, _http_requests

settings, queen = test_sdk.settings, test_sdk.queen  # the same fixtures
FAST_RETRY = test_sdk.FAST_RETRY
ACK_ROUTES = ("/api/v1/ack", "/api/v1/ack/batch")


def _pops_and_acks(broker: BrokerHandle) -> float:
    return (sum(_http_requests(broker, m, POP_ROUTE) for m in ("GET", "POST"))
            + sum(_http_requests(broker, "POST", r) for r in ACK_ROUTES))


async def test_timers_are_handled_once_each_over_one_stream(queen: Client,
                                                            broker: BrokerHandle) -> None:
    await queen.configure("fired")
    n = 200
    bundle = queen.transaction()
    for i in range(n):  # due over 0.3-0.9 s
        bundle = bundle.timer("fired").key(f"t{i}").delay(300 + i * 3).payload(i).schedule()
    await bundle.commit()
    requests_before = _pops_and_acks(broker)
    acks_before = _acks_applied(broker).get("completed", 0)
    handled: list[str] = []

    def handler(message: Message) -> None:
        assert message.timer is not None
        handled.append(message.timer.key)

    stats = await queen.consume("fired", handler, max_messages=n)
    assert sorted(handled) == sorted(f"t{i}" for i in range(n))  # each once
    assert (stats.handled, stats.completed, stats.ack_errors) == (n, n, 0)
    assert _acks_applied(broker)["completed"] - acks_before == n
    # No pop and no ack request: one connection carried the batches and their settlements.
    assert _pops_and_acks(broker) == requests_before
    assert stats.requests == 1
    assert len(await queen.pop("fired")) == 0


async def test_a_stream_never_has_more_batches_out_than_the_consumer_takes(
    queen: Client, broker: BrokerHandle
) -> None:
    for p in range(8):
        await queen.push_many("wide", [f"{p}:{k}" for k in range(12)], partition=f"p{p}")
    running = 0
    most = 0
    leased_seen: list[int] = []

    async def handler(message: Message) -> None:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await trio.sleep(0.01)
        running -= 1

    async def watch() -> None:
        while True:
            detail = await queen._http.get(f"{broker.url}/api/v1/resources/queues/wide")
            leased_seen.append(sum(
                1 for p in detail.json()["partitions"]
                for g in p["groups"].values() if g["leased"]))
            await trio.sleep(0.02)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch)
        stats = await queen.consume("wide", handler, concurrency=3, batch=4, max_messages=96)
        nursery.cancel_scope.cancel()
    assert stats.handled == 96 and stats.completed == 96
    assert most <= 3  # the handler never ran more than concurrency at once ...
    # ... and the broker never leased more partitions (batches) than the stream's inflight.
    assert leased_seen and max(leased_seen) <= 3, leased_seen
    assert max(leased_seen) >= 2  # the partitions did run in parallel


async def test_a_stream_outlives_the_brokers_idle_timeout(database_url: str) -> None:
    quick_idle = Settings(database_url=database_url, port=0, graceful_timeout_ms=1000,
                          db_pool_size=5, http_idle_timeout_s=1)
    async with trio.open_nursery() as nursery:
        broker: BrokerHandle = await nursery.start(run_broker, quick_idle)
        async with Client(broker.url, retry=FAST_RETRY, timeout=10) as client:
            got: list[Any] = []

            async def late_push() -> None:
                await trio.sleep(2.5)  # the stream has been idle past the 1 s timeout
                await client.push("late", "hello")

            nursery.start_soon(late_push)
            stats = await client.consume("late", lambda m: got.append(m.data), max_messages=1,
                                         poll="5s")
        broker.shutdown()
    assert got == ["hello"]
    assert stats.requests == 1  # the same connection, never reopened


async def test_consume_pops_over_http_where_the_stream_is_off(
    settings: Settings, database_url: str
) -> None:
    off = replace_settings(settings, stream_pop=False)
    async with trio.open_nursery() as nursery:
        broker: BrokerHandle = await nursery.start(run_broker, off)
        async with Client(broker.url, retry=FAST_RETRY, timeout=10) as client:
            await client.push_many("plain", list(range(20)))
            handled: list[int] = []
            stats = await client.consume("plain", lambda m: handled.append(m.data),
                                         max_messages=20)
            assert handled == list(range(20))
            assert (stats.handled, stats.completed) == (20, 20)
            assert _http_requests(broker, "POST", POP_ROUTE) >= 1  # the pop loop served it
            # Asked once: the next consume() pops over HTTP straight away.
            assert client._no_stream
            await client.push("plain", 20)
            stats = await client.consume("plain", lambda m: handled.append(m.data),
                                         max_messages=1)
            assert handled[-1] == 20 and stats.requests >= 1
        broker.shutdown()


async def test_a_stream_asks_for_the_token_as_a_pop_does(database_url: str) -> None:
    secured = Settings(database_url=database_url, port=0, graceful_timeout_ms=1000,
                       db_pool_size=5, auth=True)
    async with trio.open_nursery() as nursery:
        broker: BrokerHandle = await nursery.start(run_broker, secured)
        async with Client(broker.url, retry=FAST_RETRY, timeout=10) as client:
            with pytest.raises(Unauthorized):
                await client.consume("guarded", lambda m: None, max_messages=1)
        broker.shutdown()


_KILLED_CONSUMER = textwrap.dedent("""
    import sys, time, trio
    from queen_trio.client import Client

    async def main(url):
        async with Client(url) as queen:
            def handler(message):
                print(message.data, flush=True)
                time.sleep(60)  # stuck mid-batch: SIGKILLed here
            await queen.consume("killed", handler)

    trio.run(main, sys.argv[1])
""")


async def test_a_consumer_killed_mid_stream_loses_nothing(queen: Client,
                                                         broker: BrokerHandle) -> None:
    await queen.configure("killed", lease_time=30)
    await queen.push_many("killed", list(range(10)))
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    proc = await trio.to_thread.run_sync(lambda: subprocess.Popen(
        [sys.executable, "-c", _KILLED_CONSUMER, broker.url], stdout=subprocess.PIPE, env=env))
    try:
        assert proc.stdout is not None
        first = await trio.to_thread.run_sync(proc.stdout.readline)
        assert first.strip() == b"0"  # it holds the batch 0..9, stuck on 0
    finally:
        proc.send_signal(signal.SIGKILL)
        await trio.to_thread.run_sync(proc.wait)
    started = time.monotonic()
    handled: list[int] = []
    stats = await queen.consume("killed", lambda m: handled.append(m.data), max_messages=10)
    # Every message, in order, and long before the 30 s lease: the broker gave the dead
    # stream's batch back when its connection closed.
    assert handled == list(range(10)) and stats.completed == 10
    assert time.monotonic() - started < 15


async def test_a_broker_shutting_down_ends_its_streams_at_once(settings: Settings) -> None:
    patient = replace_settings(settings, graceful_timeout_ms=20_000)
    got: list[Any] = []
    async with trio.open_nursery() as outer:
        async with trio.open_nursery() as nursery:
            broker: BrokerHandle = await nursery.start(run_broker, patient)
            client = Client(broker.url, retry=FAST_RETRY, timeout=10)
            await client.push("calm", "first")

            async def consume() -> None:
                await client.consume("calm", lambda m: got.append(m.data), poll="30s")

            outer.start_soon(consume)  # outlives the broker: it waits for it to come back
            while not got:
                await trio.sleep(0.05)
            await trio.sleep(0.3)  # the stream's pop is parked for up to 30 s now
            started = trio.current_time()
            broker.shutdown()
        # The stream ended with the broker's other long polls, not at the 20 s grace.
        assert trio.current_time() - started < 5
        outer.cancel_scope.cancel()
    await client.aclose()
    assert got == ["first"]


def _looks(broker: BrokerHandle, reason: str) -> float:
    """Looks of waiting pops at the database, by what woke them (the broker's own counter)."""
    return sum(s.value for metric in broker.context.metrics.registry.collect()
               for s in metric.samples
               if s.name == "queen_longpoll_looks_total" and s.labels["reason"] == reason)


async def test_a_trickle_costs_one_look_per_message_not_one_more_for_the_acks_notify(
    queen: Client, broker: BrokerHandle
) -> None:
    # Each message pushed wakes the stream's parked pop once. The consumer's settlement frees
    # the partition, and that ack NOTIFYs the queue; the stream's next pop looks after the ack
    # has returned, so that NOTIFY is no news to it, and wakes it no more (it used to: a look
    # and a next_look at the database per message, for nothing).
    await queen.configure("trickle")
    n = 30
    handled: list[int] = []
    arrived = trio.Event()

    def handler(message: Message) -> None:
        handled.append(message.data["i"])
        arrived.set()

    async def feed() -> None:
        nonlocal arrived
        for i in range(n):
            arrived = trio.Event()
            await queen.push("trickle", {"i": i})
            with trio.fail_after(10):
                await arrived.wait()
            await trio.sleep(0.1)  # the pop parks again; the ack's NOTIFY comes meanwhile

    before = _looks(broker, "notify")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(feed)
        stats = await queen.consume("trickle", handler, max_messages=n)
    assert handled == list(range(n)) and stats.completed == n
    # (Without the fix, about a third of those NOTIFYs came after the next pop had looked:
    # 43-45 looks.)
    assert _looks(broker, "notify") - before <= n + n // 6


def _pops(broker: BrokerHandle, outcome: str) -> float:
    """Pops the broker made, by outcome ("messages" or "empty": its own counter)."""
    return sum(s.value for metric in broker.context.metrics.registry.collect()
               for s in metric.samples
               if s.name == "queen_pop_requests_total" and s.labels.get("result") == outcome)


async def test_a_backlog_drains_one_statement_per_batch_each_message_once_in_order(
    queen: Client, broker: BrokerHandle
) -> None:
    # A full batch settled whole is acknowledged and followed by the next pop in one
    # statement (queen.settle_pop_head): the partition is never seen free in between, so the
    # stream's parked pop is not woken to look for each batch, and pops nothing empty.
    n, batch = 120, 10
    await queen.push_many("backlog", list(range(n)))
    handled: list[int] = []
    looks = {r: _looks(broker, r) for r in ("notify", "next")}
    empty = _pops(broker, "empty")

    async def handler(message: Message) -> None:
        handled.append(message.data)
        if len(handled) % batch == 0:
            # A batch that takes longer than the stream's wait for its settlement (20 ms):
            # the stream's own pop looks meanwhile, finds the partition leased and parks.
            await trio.sleep(0.05)

    stats = await queen.consume("backlog", handler, batch=batch, max_messages=n)
    assert handled == list(range(n))  # each once, in order
    assert (stats.completed, stats.ack_errors) == (n, 0)
    assert _acks_applied(broker)["completed"] >= n
    assert len(await queen.pop("backlog")) == 0
    # Without it: a look (woken by the settlement's NOTIFY) and an empty pop per batch.
    woken = sum(_looks(broker, r) - v for r, v in looks.items())
    assert woken <= 3, woken
    assert _pops(broker, "empty") - empty <= 4


async def test_a_whole_batch_settled_after_its_lease_was_lost_is_refused(
    queen: Client, broker: BrokerHandle
) -> None:
    # The one-statement settlement takes a batch only under its live lease, the cursor as its
    # pop left it; a batch whose lease expired and was taken by another consumer is refused
    # (and that consumer's lease stands), as every other ack.
    await queen.configure("lapsed", lease_time=1)
    await queen.push_many("lapsed", ["a", "b"])
    stolen: list[Message] = []

    async def handler(message: Message) -> None:
        if not stolen:
            await trio.sleep(1.3)
            stolen.extend(await queen.pop("lapsed", batch=10))

    stats = await queen.consume("lapsed", handler, max_messages=2, renew_leases=False,
                                concurrency=1, batch=2)
    assert [m.data for m in stolen] == ["a", "b"]
    assert (stats.handled, stats.completed, stats.ack_errors) == (2, 0, 2)
    for message in stolen:
        assert (await queen.ack(message)).refused is None


class _Statements:
    """Counts the statements (and transactions) the broker's pool runs, by what runs them,
    while it is installed: the real pool, only counted."""

    def __init__(self, broker: BrokerHandle) -> None:
        self.db = broker.context.db
        self.calls: list[str] = []

    def __enter__(self) -> _Statements:
        db, calls = self.db, self.calls
        self.saved = db.run_autocommit, db.run_transaction

        def counted(run: Any) -> Any:
            async def wrapper(fn: Any, *args: Any, **kwargs: Any) -> Any:
                calls.append(getattr(fn, "__name__", repr(fn)))
                return await run(fn, *args, **kwargs)
            return wrapper

        db.run_autocommit = counted(db.run_autocommit)  # type: ignore[method-assign]
        db.run_transaction = counted(db.run_transaction)  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        self.db.run_autocommit, self.db.run_transaction = self.saved  # type: ignore[method-assign]


async def test_a_trickle_settles_and_looks_again_in_one_statement_per_message(
    queen: Client, broker: BrokerHandle
) -> None:
    # Messages one at a time: each is pushed (a statement), wakes the stream's parked pop,
    # which looks and takes it (one), and the consumer settles it within the stream's wait
    # for it: the stream's next pop applies that settlement and looks again in one statement
    # (queen.settle_pop_head), and parks on what it found. (Before: an ack, then a look.)
    await queen.configure("drip")
    n = 30
    handled: list[int] = []
    arrived = trio.Event()

    def handler(message: Message) -> None:
        handled.append(message.data)
        arrived.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(queen.consume, "drip", handler)  # (warm: the stream is open)
        await queen.push("drip", -1)
        with trio.fail_after(10):
            await arrived.wait()
        await trio.sleep(0.3)
        handled.clear()
        with _Statements(broker) as statements:
            for i in range(n):
                arrived = trio.Event()
                await queen.push("drip", i)
                with trio.fail_after(10):
                    await arrived.wait()
                await trio.sleep(0.1)  # settled, and parked again before the next
        nursery.cancel_scope.cancel()
    assert handled == list(range(n))
    calls = collections.Counter(statements.calls)
    # Consuming each message: the look that takes it, and its settlement with the next look
    # (before: a look, an ack, and a look after it: 3 per message). On a loaded machine a
    # settlement may come after the stream stopped waiting for it (20 ms): then it is applied
    # on its own and the pop looks as before (the margin).
    consuming = sum(v for k, v in calls.items()
                    if k in ("pop_head", "pop_head_after", "pop", "next_look_in_s",
                             "_ack_head_noted", "ack", "_settle_whole_noted"))
    assert consuming <= 2 * n + n // 2, calls

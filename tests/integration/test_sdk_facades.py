"""The sync facade and the async client (under trio and under asyncio) answer alike.

One scenario, written once, runs on each: with the async client every step is awaited; with
the sync client each step already returned its result and the scenario's awaits never suspend,
so it runs to completion in a worker thread (the broker runs in this test's trio loop).
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import threading
from collections.abc import Callable
from datetime import datetime
from enum import Enum
from typing import Any

import msgspec
import trio

from queen_trio.client import ApiError, Client, Message, SyncClient
from queen_trio.client.blocking import run_blocking
from queen_trio.server import BrokerHandle

from . import test_sdk
from .test_sdk import FAST_RETRY

settings = test_sdk.settings

_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


class Facade:
    """How the scenario gets a result out of a call and the items out of a listing."""

    def __init__(self, queen: Client | SyncClient) -> None:
        self.queen = queen

    async def __call__(self, step: Any) -> Any:
        return await step if isinstance(self.queen, Client) else step

    async def items(self, listing: Any) -> list[Any]:
        if isinstance(self.queen, Client):
            return [item async for item in listing]
        return list(listing)

    async def error(self, step: Callable[[], Any]) -> Any:
        try:
            await self(step())
        except ApiError as exc:
            return (type(exc).__name__, exc.status, exc.code)
        raise AssertionError("expected an ApiError")


async def scenario(ev: Facade, p: str) -> list[Any]:
    queen, q = ev.queen, f"{p}-q"
    timer = queen.timer(f"{p}-t").key("user:1/trial end")
    out = [
        await ev(queen.configure(q, retry_limit=2, lease_time="30s")),
        await ev(timer.delay("1h").payload({"a": 1}).txn(f"{p}-t1").schedule()),
        await ev(timer.delay("50m30s").payload({"a": 2}).txn(f"{p}-t2").schedule()),
        await ev(queen.timer(f"{p}-t").key("second").delay(60_000).payload(None).schedule()),
        await ev(timer.peek()),
        await ev.items(queen.timers(f"{p}-t").list(page_size=1)),
        await ev(timer.cancel(txn=f"{p}-t2")),
        await ev(timer.cancel()),
        await ev(timer.peek()),
        await ev(queen.push(q, {"n": 1}, txn=f"{p}-m1")),
        await ev(queen.push(q, {"n": 1}, txn=f"{p}-m1")),
        await ev(queen.push_many(q, [2, 3], txns=[f"{p}-m2", f"{p}-m3"])),
    ]
    batch = await ev(queen.pop(q, batch=3))
    first, second, third = batch.messages
    out += [
        batch,
        await ev(queen.ack(first)),
        await ev(queen.ack(first)),
        await ev(queen.transaction().ack(second).ack(third, "failed", error="later")
                 .push(f"{p}-audit", {"done": 2}, txn=f"{p}-a1")
                 .kv.put("saga", p, {"step": "held"}, ttl_seconds=3600)
                 .kv.delete("saga", f"{p}-none")
                 .timer(f"{p}-t").key("second").cancel()
                 .timer(f"{p}-t").key("third").delay("15m").payload([1]).txn(f"{p}-t3")
                 .schedule()
                 .commit()),
        await ev(queen.pop(q, wait="2s", auto_ack=True)),
        await ev(queen.kv.get("saga", p)),
        await ev(queen.kv.delete("saga", p)),
        await ev(queen.kv.get("saga", p)),
        await ev.items(queen.dlq.list(q)),
        await ev.error(lambda: queen.timer(f"{p}-t").key("k").delay("30d").payload(1)
                       .schedule()),
        await ev.error(lambda: queen.dlq.replay(123_456)),
        await ev(queen.pop(f"{p}-empty")),
    ]
    return out


def normalized(value: Any, prefix: str) -> Any:
    """The results with what legitimately differs between runs blanked out."""
    names = ([f.name for f in dataclasses.fields(value)]
             if dataclasses.is_dataclass(value) and not isinstance(value, type)
             else list(value.__struct_fields__) if isinstance(value, msgspec.Struct) else None)
    if names is not None:  # a result: a dataclass, or a msgspec Struct (TimerResult)
        fields = {name: "<version>" if name == "version"  # a sequence: differs by run
                  else normalized(getattr(value, name), prefix) for name in names}
        return (type(value).__name__, fields)
    if isinstance(value, Enum):
        return (type(value).__name__, value.value)
    if isinstance(value, datetime):
        return "<time>"
    if isinstance(value, list | tuple):
        return [normalized(v, prefix) for v in value]
    if isinstance(value, dict):
        return {k: normalized(v, prefix) for k, v in value.items()}
    if isinstance(value, str):
        if _UUID.match(value.split(":")[0]):  # a UUID, or a message id "<partition>:<offset>"
            return "<uuid>" + value[36:]
        return value.replace(prefix, "P")
    return value


async def test_sync_async_and_asyncio_give_identical_results(broker: BrokerHandle) -> None:
    async with Client(broker.url, retry=FAST_RETRY) as queen:
        under_trio = await scenario(Facade(queen), "trio")

    def with_sync_client() -> list[Any]:
        with SyncClient(broker.url, retry=FAST_RETRY) as queen:
            return run_blocking(scenario(Facade(queen), "sync"))

    async def with_asyncio() -> list[Any]:
        async with Client(broker.url, retry=FAST_RETRY) as queen:
            return await scenario(Facade(queen), "aio")

    under_sync = await trio.to_thread.run_sync(with_sync_client)
    under_asyncio = await trio.to_thread.run_sync(asyncio.run, with_asyncio())

    expected = normalized(under_trio, "trio")
    assert normalized(under_sync, "sync") == expected
    assert normalized(under_asyncio, "aio") == expected
    # And the scenario saw what it should (so equal is not equally wrong).
    statuses = [r[1]["status"][1] for r in expected[1:4]]
    assert statuses == ["scheduled", "rescheduled", "scheduled"]
    assert [r[1]["status"][1] for r in expected[6:8]] == ["cancelled", "absent"]
    assert expected[8] is None and expected[-1] == ("Batch", {
        "messages": [], "queue": None, "partition": None, "lease_id": None,
        "lease_expires_at": None})
    assert expected[-3] == ["Forbidden", 403, "timer_horizon_exceeded"]
    assert expected[-2] == ["NotFound", 404, "dead_letter_not_found"]


async def test_sync_consume_runs_sync_handlers(broker: BrokerHandle) -> None:
    def run() -> tuple[Any, list[Any]]:
        with SyncClient(broker.url, retry=FAST_RETRY) as queen:
            queen.push_many("sync-jobs", [1, 2, 3])
            seen: list[Any] = []
            threads: set[int] = set()

            def handler(message: Message) -> None:
                threads.add(threading.get_ident())
                seen.append(message.data)
                if message.data == 2 and message.retry_count == 0:
                    raise RuntimeError("try again")
                if message.data == 3:  # settled by the handler itself, with its state
                    queen.transaction().ack(message).kv.put("jobs", "3", "ok",
                                                            forever=True).commit()

            stats = queen.consume("sync-jobs", handler, max_messages=4)
            # Off the loop's thread: a blocking handler never stalls the loop.
            assert threading.get_ident() not in threads
            assert queen.kv.get("jobs", "3").value == "ok"
            assert len(queen.pop("sync-jobs")) == 0
            return stats, seen

    stats, seen = await trio.to_thread.run_sync(run)
    assert seen == [1, 2, 2, 3]
    assert (stats.handled, stats.completed, stats.failed, stats.settled_by_handler,
            stats.ack_errors) == (4, 2, 1, 1, 0)


def test_listings_refuse_the_wrong_kind_of_loop() -> None:
    sync_listing = SyncClient("http://127.0.0.1:9").timers("q").list()
    async_listing = Client("http://127.0.0.1:9").timers("q").list()
    try:
        sync_listing.__aiter__()
    except TypeError as exc:
        assert "for" in str(exc)
    else:
        raise AssertionError("async iteration of a sync listing must fail")
    try:
        iter(async_listing)
    except TypeError as exc:
        assert "async for" in str(exc)
    else:
        raise AssertionError("sync iteration of an async listing must fail")


"""Wake-up NOTIFYs sent after their commit (queen_trio/db/notifier.py): every hint arrives,
the same hint pending twice goes once, several go in one statement, and a push's still
reaches a listener."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
import trio

from queen_trio.db import Database, Listener, Notification
from queen_trio.db.notifier import Notifier
from queen_trio.server import BrokerHandle


async def _received(rx: trio.MemoryReceiveChannel[object], quiet_s: float = 0.5
                    ) -> list[tuple[str, str]]:
    got: list[tuple[str, str]] = []
    while True:
        with trio.move_on_after(quiet_s) as scope:
            item = await rx.receive()
        if scope.cancelled_caught:
            return got
        assert isinstance(item, Notification)
        got.append((item.channel, item.payload))


@pytest.fixture
async def listener(database_url: str) -> AsyncIterator[Listener]:
    listener = Listener(database_url, ["alpha", "beta", "queen_log"])
    async with trio.open_nursery() as nursery:
        await nursery.start(listener.run)
        yield listener
        nursery.cancel_scope.cancel()


async def test_pending_hints_go_once_each_in_one_statement(
    listener: Listener, database_url: str
) -> None:
    async with Database(database_url, max_size=2) as db:
        notifier = Notifier(db)
        with listener.subscribe("alpha") as alpha, listener.subscribe("beta") as beta:
            for payload in ("q1", "q2", "q1", "q1"):
                notifier.notify("alpha", payload)
            notifier.notify("beta", "q1")
            async with trio.open_nursery() as nursery:
                await nursery.start(notifier.run)
                assert await _received(alpha) == [("alpha", "q1"), ("alpha", "q2")]
                assert await _received(beta, 0.1) == [("beta", "q1")]
                assert (notifier.statements, notifier.sent) == (1, 3)
                notifier.notify("alpha", "q1")  # sent again once it is new news
                assert await _received(alpha) == [("alpha", "q1")]
                assert (notifier.statements, notifier.sent) == (2, 4)
                nursery.cancel_scope.cancel()


async def test_a_push_still_wakes_its_queue_once_committed(
    broker: BrokerHandle, http: httpx.AsyncClient, listener: Listener
) -> None:
    with listener.subscribe("queen_log") as rx:
        r = await http.post("/api/v1/push", json={"items": [
            {"queue": "wake-a", "payload": {"n": 1}},
            {"queue": "wake-b", "partition": "p1", "payload": {"n": 2}},
            {"queue": "wake-a", "partition": "p2", "payload": {"n": 3}}]})
        assert r.status_code == 201, r.text
        got = sorted(p for _, p in await _received(rx))
    tenant = got[0].split(":", 1)[0]
    assert got == [f"{tenant}:wake-a", f"{tenant}:wake-b"]
    notifier = broker.context.notifier
    assert notifier is not None and notifier.sent >= 2

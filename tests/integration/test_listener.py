"""LISTEN/NOTIFY to trio tasks: delivery, fan-out, overflow, and healing after a dropped link."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import psycopg
import pytest
import trio

from queen_trio.db import MISSED, Listener, Notification


def _notify(url: str, channel: str, payload: str) -> float:
    with psycopg.connect(url, autocommit=True) as conn:
        sent = time.perf_counter()
        conn.execute("SELECT pg_notify(%s, %s)", (channel, payload))
    return sent


@pytest.fixture
async def listener(database_url: str) -> AsyncIterator[Listener]:
    listener = Listener(database_url, ["alpha", "beta"], buffer_size=4, reconnect_initial_s=0.02)
    async with trio.open_nursery() as nursery:
        await nursery.start(listener.run)
        yield listener
        nursery.cancel_scope.cancel()


async def test_notifications_reach_subscribers_of_their_channel(
    listener: Listener, database_url: str
) -> None:
    with listener.subscribe("alpha") as a1, listener.subscribe("alpha") as a2, \
            listener.subscribe("beta") as b:
        await trio.to_thread.run_sync(_notify, database_url, "alpha", "hello")
        with trio.fail_after(2):
            first, second = await a1.receive(), await a2.receive()
        assert first == second
        assert isinstance(first, Notification)
        assert (first.channel, first.payload) == ("alpha", "hello")
        with pytest.raises(trio.WouldBlock):
            b.receive_nowait()
    assert listener.statistics().subscribers == 0


async def test_wake_up_is_prompt(listener: Listener, database_url: str) -> None:
    """Sender's execute to the subscriber waking: a few ms at most on a loaded 2-core box."""
    lags = []
    with listener.subscribe("alpha") as rx:
        for i in range(20):
            sent = await trio.to_thread.run_sync(_notify, database_url, "alpha", str(i))
            with trio.fail_after(2):
                item = await rx.receive()
            lags.append(time.perf_counter() - sent)
            assert item.payload == str(i)
    lags.sort()
    assert lags[len(lags) // 2] < 0.02, lags


async def test_unknown_channel_is_refused(listener: Listener) -> None:
    with pytest.raises(ValueError, match="gamma"):
        with listener.subscribe("gamma"):
            pass


async def test_a_full_subscriber_gets_missed_instead_of_silence(
    listener: Listener, database_url: str
) -> None:
    with listener.subscribe("alpha") as rx:
        for i in range(7):  # buffer holds 4
            await trio.to_thread.run_sync(_notify, database_url, "alpha", str(i))
        with trio.fail_after(2):
            while listener.statistics().notifications_total < 7:
                await trio.sleep(0.01)
        got = [rx.receive_nowait() for _ in range(4)]
        assert [n.payload for n in got] == ["0", "1", "2", "3"]
        await trio.to_thread.run_sync(_notify, database_url, "alpha", "after")
        with trio.fail_after(2):
            assert await rx.receive() is MISSED
            assert (await rx.receive()).payload == "after"
    assert listener.statistics().dropped_total == 3


async def test_reconnects_after_the_backend_is_terminated(
    listener: Listener, database_url: str
) -> None:
    with listener.subscribe("beta") as rx:
        old_pid = listener.backend_pid
        with psycopg.connect(database_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (old_pid,))
        with trio.fail_after(5):
            assert await rx.receive() is MISSED
        assert listener.connected
        assert listener.backend_pid != old_pid
        assert listener.statistics().reconnects_total == 1
        await trio.to_thread.run_sync(_notify, database_url, "beta", "still here")
        with trio.fail_after(2):
            item = await rx.receive()
        assert item.payload == "still here"


async def test_first_connection_failure_is_raised() -> None:
    listener = Listener("postgresql://postgres@127.0.0.1:1/none", ["alpha"])
    with pytest.raises(psycopg.OperationalError):
        await listener.run()


async def test_a_calling_subscriber_hears_each_notification_in_order_and_missed(
    listener: Listener, database_url: str
) -> None:
    """Listener.calling: each notification of its channel (never another's) is handed to the
    call on the listener's task, in order and without a buffer to overflow; a call that raises
    is counted and the next notification is delivered as usual; after the connection is lost
    the call hears MISSED, then what comes next."""
    heard: list[object] = []

    def call(item: object) -> None:
        heard.append(item)
        if getattr(item, "payload", None) == "boom":
            raise RuntimeError("a subscriber's bug")

    with listener.calling("alpha", call):
        for payload in ("0", "1", "boom", "2", "3", "4", "5"):  # more than buffer_size
            await trio.to_thread.run_sync(_notify, database_url, "alpha", payload)
        await trio.to_thread.run_sync(_notify, database_url, "beta", "other")
        with trio.fail_after(5):
            while len(heard) < 7:
                await trio.sleep(0.01)
        assert [getattr(n, "payload", n) for n in heard] == ["0", "1", "boom", "2", "3", "4",
                                                             "5"]
        assert listener.statistics().dropped_total == 0
        old_pid = listener.backend_pid
        with psycopg.connect(database_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (old_pid,))
        with trio.fail_after(5):
            while len(heard) < 8:
                await trio.sleep(0.01)
        assert heard[7] is MISSED
        await trio.to_thread.run_sync(_notify, database_url, "alpha", "still here")
        with trio.fail_after(5):
            while len(heard) < 9:
                await trio.sleep(0.01)
        assert getattr(heard[8], "payload", None) == "still here"
    await trio.to_thread.run_sync(_notify, database_url, "alpha", "gone")
    await trio.sleep(0.2)
    assert len(heard) == 9  # (the block has ended: no more calls)
    with pytest.raises(ValueError, match="gamma"):
        with listener.calling("gamma", call):
            pass

"""The SDK's locks against a real broker: ``async with queen.lock(...)`` (and the sync
client's ``with``), contention with strictly rising fencing tokens, renewal in the background,
a guarded transaction that commits nothing once the lock is lost, release on an exception,
semaphores, and the raw operations."""

from __future__ import annotations

import time

import pytest
import trio

from queen_trio.client import (
    Client,
    LockNotAcquired,
    LockNotHeld,
    LockResult,
    RetryPolicy,
    SyncClient,
)
from queen_trio.server import BrokerHandle

FAST_RETRY = RetryPolicy(retries=2, base_backoff_s=0.01, max_backoff_s=0.05)


async def test_contending_holders_take_turns_with_strictly_rising_tokens(
    broker: BrokerHandle,
) -> None:
    holding: list[str] = []
    tokens: list[int] = []
    overlaps: list[tuple[str, ...]] = []

    async def worker(me: str) -> None:
        async with Client(broker.url, retry=FAST_RETRY) as queen:
            for _ in range(3):
                async with queen.lock("report", ttl="30s", timeout="60s") as lock:
                    holding.append(me)
                    if len(holding) > 1:
                        overlaps.append(tuple(holding))
                    tokens.append(lock.token)
                    await trio.sleep(0.02)
                    holding.remove(me)

    async with trio.open_nursery() as nursery:
        for i in range(4):
            nursery.start_soon(worker, f"w{i}")
    assert not overlaps, overlaps
    assert len(tokens) == 12
    assert tokens == sorted(tokens) and len(set(tokens)) == 12, tokens  # strictly rising


async def test_a_lock_is_renewed_while_held_and_released_at_the_end(
    broker: BrokerHandle,
) -> None:
    async with Client(broker.url, retry=FAST_RETRY) as queen:
        async with queen.lock("long-job", ttl=1) as lock:
            first = lock.token
            # Three lifetimes: without renewal the permit would have expired twice over.
            await trio.sleep(3.2)
            assert lock.held and lock.token > first  # renewed: a new token each time
            with pytest.raises(LockNotAcquired):
                await queen.lock("long-job", ttl=1, timeout=0).acquire()
            held = await queen.locks.get("long-job")
            assert held and held.holders[0].owner == lock.owner
            assert (held.holders[0].token or 0) > first
        assert not lock.held
        assert not await queen.locks.get("long-job")  # released on the way out
        with pytest.raises(LockNotHeld):
            lock.guard()


async def test_a_guarded_transaction_commits_nothing_once_the_lock_is_lost(
    broker: BrokerHandle,
) -> None:
    async with Client(broker.url, retry=FAST_RETRY) as queen:
        async with queen.lock("exporter", ttl=1, renew=False) as lock:
            done = await queen.transaction().guard(lock).push("exports", {"n": 1}).commit()
            assert done.committed
            await trio.sleep(2.5)  # not renewed: it expires, and somebody else takes it
            other = await queen.lock("exporter", ttl="30s", timeout="10s").acquire()
            assert other.token > lock.token
            late = await queen.transaction().guard(lock).push("exports", {"n": 2}).commit()
            assert not late.committed and late.precondition is not None
            assert late.precondition.reason == "version"
            # The new holder's guard still commits.
            assert await queen.transaction().guard(other).push("exports", {"n": 3}).commit()
            await other.release()
        batch = await queen.pop("exports", batch=10)
        assert [m.data for m in batch.messages] == [{"n": 1}, {"n": 3}]  # never n=2


async def test_a_guarded_commit_that_meets_its_own_renewal_still_commits(
    broker: BrokerHandle,
) -> None:
    """The token moved under the bundle (a renew of this holder's landed first, its answer not
    yet read): the bundle is sent again at the new token and commits once."""
    async with Client(broker.url, retry=FAST_RETRY) as queen:
        async with queen.lock("guarded", ttl="30s", renew=False) as lock:
            moved = await queen.locks.renew("guarded", lock.token, ttl="30s", owner=lock.owner)
            assert moved and moved.token > lock.token  # the handle has not seen it
            done = await queen.transaction().guard(lock).push("guarded-out", 1).commit()
            assert done.committed and lock.token == moved.token
        batch = await queen.pop("guarded-out", batch=10)
        assert [m.data for m in batch.messages] == [1]


async def test_leaving_the_block_by_an_exception_releases_the_lock(
    broker: BrokerHandle,
) -> None:
    async with Client(broker.url, retry=FAST_RETRY) as queen:
        with pytest.raises(RuntimeError, match="boom"):
            async with queen.lock("fragile", ttl="1h"):
                raise RuntimeError("boom")
        # Released at once, not in an hour: another holder gets it without waiting.
        async with queen.lock("fragile", ttl="1h", timeout=0) as again:
            assert again.held


async def test_a_semaphore_admits_limit_holders(broker: BrokerHandle) -> None:
    async with Client(broker.url, retry=FAST_RETRY) as queen:
        a = await queen.lock("pool", ttl="30s", limit=2, timeout=0).acquire()
        b = await queen.lock("pool", ttl="30s", limit=2, timeout=0).acquire()
        assert {a.slot, b.slot} == {0, 1}
        with pytest.raises(LockNotAcquired) as refused:
            await queen.lock("pool", ttl="30s", limit=2, timeout="300ms").acquire()
        assert {h.owner for h in refused.value.holders} == {a.owner, b.owner}
        freed, last = a.slot, max(a.token, b.token)
        await a.release()
        assert not a.held
        c = await queen.lock("pool", ttl="30s", limit=2, timeout="5s").acquire()
        assert c.slot == freed and c.token > last


async def test_the_raw_operations(broker: BrokerHandle) -> None:
    async with Client(broker.url, retry=FAST_RETRY) as queen:
        got = await queen.locks.acquire("raw", ttl="30s", owner="me")
        assert isinstance(got, LockResult) and got and got.token and got.guard
        again = await queen.locks.acquire("raw", ttl="30s", owner="me")
        assert again and again.already and again.token == got.token  # a repeat is safe
        taken = await queen.locks.acquire("raw", ttl="30s", owner="you")
        assert not taken and taken.reason == "held" and taken.holders[0].owner == "me"
        renewed = await queen.locks.renew("raw", got.token, ttl="30s")
        assert renewed and renewed.token > got.token
        stale = await queen.locks.release("raw", got.token)
        assert not stale and stale.reason == "lost"
        assert await queen.locks.release("raw", renewed.token or 0)


async def test_the_sync_client_holds_renews_and_releases(broker: BrokerHandle) -> None:
    def run() -> None:
        with SyncClient(broker.url, retry=FAST_RETRY) as queen:
            with pytest.raises(KeyError):
                with queen.lock("sync-job", ttl=1) as lock:
                    first = lock.token
                    time.sleep(2.5)  # past two lifetimes: kept by the renewing thread
                    assert lock.held and lock.token > first
                    assert queen.transaction().guard(lock).push("sync-out", 1).commit()
                    raise KeyError("out")
            assert not lock.held
            assert not queen.locks.get("sync-job")

    await trio.to_thread.run_sync(run)

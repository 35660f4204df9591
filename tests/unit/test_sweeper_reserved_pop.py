"""A pop the sweeper reserved for a fire (log/wakeups.py ``announce_fire``) waits for its
hand-over, bounded by HANDOVER_WAIT_S (a second): every way the cycle that reserved it can end
must hand it something or free it, or a streaming consumer's delivery stalls that second."""

from __future__ import annotations

import socket
import time
import uuid

import pytest
import trio

from queen_trio.config import Settings
from queen_trio.db import Database
from queen_trio.log import longpoll
from queen_trio.log.rules import PopRequest
from queen_trio.log.store import PopBatch
from queen_trio.log.wakeups import HANDOVER_WAIT_S, DeferredSettle, ParkedPop, QueueWakeups
from queen_trio.metrics import BrokerMetrics
from queen_trio.timers.store import NextDue
from queen_trio.timers.sweeper import TRANSIENT, Sweeper


def _req() -> PopRequest:
    return PopRequest(queue="q", partition=None, group="g", batch=10, wait=True,
                      timeout_ms=30_000, auto_ack=False)


async def test_a_cycle_failing_before_its_sweep_frees_the_pop_it_reserved() -> None:
    """A cycle after the database was away first hands back the claims it could not release
    then; when that fails too (the database is still away), the pop the cycle's announcement
    reserved is handed "nothing" at once (it pops for itself), and the stream's carried
    settlement is told its fate is unknown (it settles as usual), rather than both waiting
    out HANDOVER_WAIT_S."""
    wakeups = QueueWakeups()
    key = "1:q"
    # The sweeper's database is away: nothing listens where its pool connects.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"postgresql://127.0.0.1:{port}/queen"
    settings = Settings(database_url=url, port=0)
    db = Database(url, max_size=2)
    async with db:
        sweeper = Sweeper(db, None, settings, BrokerMetrics(),  # type: ignore[arg-type]
                          lambda _: 0,
                          announce_fire=lambda t, due_local: wakeups.announce_fire(
                              key, t.partition, t.due, due_local))
        # A claim an earlier cycle could not hand back (the database went away then).
        leftover = uuid.uuid4()
        sweeper._unreleased.append(leftover)
        told: list[bool | None] = []
        batch = PopBatch("q", "Default", uuid.uuid4(), "g", uuid.uuid4(), None, [])
        with wakeups.watching(key) as watch, wakeups.waiting(key, 1, _req()) as waiter:
            now = trio.current_time()
            pop = ParkedPop(1, _req(), now + 30, waiter=waiter, watch=watch,
                            settle=DeferredSettle(batch, now + 0.03, told.append))
            wakeups.offer(key, pop)
            timer = NextDue(1, "q", "Default", time.time())
            # As Sweeper._loop does: the announcement, then the cycle.
            handover = sweeper._announce_fire(timer, now)  # type: ignore[misc]
            assert handover is pop and pop.reserved and pop.settle is not None
            with pytest.raises(TRANSIENT):
                await sweeper._cycle(not_before=None, announced=timer, handover=handover)
            assert pop.handed.is_set() and pop.outcome is None
            assert told == [None]
            started = trio.current_time()
            assert await longpoll._take_handover(wakeups, pop) is None
            assert trio.current_time() - started < HANDOVER_WAIT_S / 2
        # The leftover claim is still to be handed back; the cycle's own token, never sent,
        # is not.
        assert sweeper._unreleased == [leftover]

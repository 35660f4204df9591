"""Sealing waits while a backlog of timers drains on the broker (fires at thousands a second),
for a bounded time, then seals as usual; once the drain is over it seals at once. The drain is
the broker's own fired-timer count (what the sweeper reports), advanced here by hand; the
sealing is the real one, over a real PostgreSQL."""

from __future__ import annotations

import httpx
import pytest
import trio

from queen_trio.config import Settings
from queen_trio.log import housekeeping
from queen_trio.server import BrokerHandle

from ..conftest import replace_settings
from .test_segments import EAGER, backdate, metric, push, where_frames_are

DRAIN = 100_000  # fires within a window of ~0.6 s: above 5,000/s even if the window took 20 s


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """The broker's own housekeeping stays out of the way: these tests run rounds by hand."""
    return replace_settings(settings, housekeeping_interval_ms=3_600_000)


async def aged_head(http: httpx.AsyncClient, url: str, queue: str) -> None:
    await push(http, queue, list(range(12)))
    backdate(url, queue)  # an hour old: sealed by any round that seals
    assert where_frames_are(url, queue) == (12, [])


async def test_sealing_waits_for_a_timer_backlog_then_seals(
    broker: BrokerHandle, http: httpx.AsyncClient, database_url: str
) -> None:
    await aged_head(http, database_url, "aged")
    metrics = broker.context.metrics
    keeper = housekeeping.Housekeeper(broker.context.db, EAGER, metrics=metrics)
    assert not keeper.seal_waits()  # no fires yet
    await trio.sleep(0.6)
    metrics.observe_fire_lag(1, 0.5, DRAIN)
    assert (await keeper.run_once()).sealed == []
    assert where_frames_are(database_url, "aged") == (12, [])
    text = (await http.get("/metrics")).text
    assert metric(text, "queen_segments_seal_deferrals_total") == 1
    await trio.sleep(0.6)  # no fires since: the drain is over
    sealed = (await keeper.run_once()).sealed
    assert [(s.first_offset, s.last_offset) for s in sealed] == [(0, 4), (5, 9), (10, 11)]


async def test_a_drain_that_goes_on_holds_sealing_back_for_a_bounded_time(
    broker: BrokerHandle, http: httpx.AsyncClient, database_url: str
) -> None:
    await aged_head(http, database_url, "held")
    metrics = broker.context.metrics
    keeper = housekeeping.Housekeeper(broker.context.db, EAGER, metrics=metrics,
                                      seal_defer_max_s=0.5)
    assert not keeper.seal_waits()
    await trio.sleep(0.6)
    metrics.observe_fire_lag(1, 0.5, DRAIN)
    assert (await keeper.run_once()).sealed == []  # the drain began: sealing waits
    await trio.sleep(0.6)
    metrics.observe_fire_lag(1, 0.5, DRAIN)  # still draining, but it has waited 0.5 s
    assert len((await keeper.run_once()).sealed) == 3
    assert where_frames_are(database_url, "held") == (0, [(0, 4), (5, 9), (10, 11)])

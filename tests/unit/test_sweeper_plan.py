"""The sweeper's planning: when its next cycle starts and what for; no database.

The pure rules (:func:`next_plan`, :func:`floored`) are checked alone, then the sweeper's own
loop is driven on trio's ``MockClock`` (autojump) with the sweep statement replaced by a
script of results, so each cycle's start is read off the virtual clock exactly.
"""

from __future__ import annotations

import dataclasses
import math
import types
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio
import trio.testing

from queen_trio.config import Settings
from queen_trio.db import MISSED
from queen_trio.db.listener import Notification
from queen_trio.errors import DatabaseUnavailable
from queen_trio.metrics import BrokerMetrics
from queen_trio.timers import sweeper as sweeper_module
from queen_trio.timers.store import NOTIFY_CHANNEL, NextDue, SweepResult
from queen_trio.timers.sweeper import (
    Plan,
    Sweeper,
    floored,
    narrowed,
    next_batch,
    next_plan,
    retry_delay,
    widened,
)

MIN_SLEEP = 0.010
MAX_SLEEP = 1.0
EARLY = sweeper_module._EARLY_SEND_S  # a planned sweep is sent this long before its instant
LOOK_AHEAD = sweeper_module._LOOK_AHEAD_S
EPOCH = 1000.0  # the (fake) database clock reads EPOCH + the trio clock


def _plan(**kwargs: Any) -> Plan:
    args: dict[str, Any] = {"now": 5.0, "last_start": 4.9, "full": False, "due_at": None,
                            "due_db": None, "min_sleep": MIN_SLEEP, "max_sleep": MAX_SLEEP,
                            "announcing": False}
    return next_plan(**{**args, **kwargs})


# --- the pure rules ---------------------------------------------------------------------------


def test_a_full_batch_plans_the_next_cycle_at_once() -> None:
    plan = _plan(full=True, due_at=5.5, due_db=EPOCH + 5.5)
    assert (plan.start_at, plan.due_db, plan.reason) == (-math.inf, None, "backlog")
    assert floored(plan, 5.0, MIN_SLEEP) is plan  # a backlog drains back to back


def test_a_backlog_is_swept_in_growing_batches_and_an_ordinary_cycle_at_the_base() -> None:
    grown, batch = [], 500
    for _ in range(4):  # every sweep full
        batch = next_batch(batch, batch, 500, 5000)
        grown.append(batch)
    assert grown == [2000, 5000, 5000, 5000]
    assert next_batch(5000, 4999, 500, 5000) == 500  # the backlog is gone
    assert next_batch(500, 120, 500, 5000) == 500
    # A backlog batch below the base never shrinks the sweep.
    assert next_batch(500, 500, 500, 100) == 500


def test_a_sweep_cut_off_by_its_timeout_halves_the_batch_and_roomy_cycles_double_it_back() -> None:
    # A statement that ran out of the lease: half as many next time, down to one timer.
    assert narrowed(3200) == 1600
    assert narrowed(3) == 1 and narrowed(1) == 1
    lease = 0.3
    # Back up only while a backlog is there and the slowest statement left room (< lease/4).
    assert widened(1600, 5000, full=True, slowest_s=0.05, lease_s=lease) == 3200
    assert widened(3200, 5000, full=True, slowest_s=0.05, lease_s=lease) == 5000
    assert widened(1600, 5000, full=True, slowest_s=0.08, lease_s=lease) == 1600
    assert widened(1600, 5000, full=False, slowest_s=0.01, lease_s=lease) == 1600
    # The cap bounds what next_batch grows a backlog's sweeps to (as the sweeper applies it).
    cap, batch = narrowed(3200), 800
    assert min(cap, next_batch(batch, batch, 200, 5000)) == 1600


def test_without_timers_the_next_cycle_is_max_sleep_away() -> None:
    assert _plan() == Plan(5.0 + MAX_SLEEP, None, "max_sleep")
    assert _plan(due_at=6.5, due_db=EPOCH + 6.5) == Plan(5.0 + MAX_SLEEP, None, "max_sleep")


def test_the_next_timer_sets_the_next_cycle() -> None:
    assert _plan(due_at=5.3, due_db=EPOCH + 5.3) == Plan(5.3, EPOCH + 5.3, "deadline")


def test_a_plan_looks_ahead_for_a_timer_unless_at_the_floor() -> None:
    assert _plan(due_at=5.3, due_db=EPOCH + 5.3, announcing=True).look_ahead
    assert not _plan(due_at=4.905, due_db=EPOCH + 4.905, announcing=True).look_ahead
    assert _plan(announcing=True).look_ahead  # a NOTIFY may yet bring a timer forward
    assert not _plan(due_at=5.3, due_db=EPOCH + 5.3).look_ahead


def test_the_floor_holds_cycles_min_sleep_apart() -> None:
    soon = Plan(5.001, EPOCH + 5.001, "deadline", True)
    assert floored(soon, 5.0, MIN_SLEEP) == Plan(5.0 + MIN_SLEEP, None, "min_sleep")
    later = Plan(5.02, EPOCH + 5.02, "deadline", True)
    assert floored(later, 5.0, MIN_SLEEP) is later


def test_after_database_trouble_the_retry_comes_quickly_then_backs_off() -> None:
    """A failover's new primary is tried for within 50 ms, then at a doubling interval that
    never exceeds MAX_SLEEP (a database that stays down is not hammered)."""
    delays = [retry_delay(n, max_sleep=MAX_SLEEP) for n in range(1, 9)]
    assert delays == pytest.approx([0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0])
    assert retry_delay(1, max_sleep=0.02) == 0.02  # MAX_SLEEP below the first step wins
    assert retry_delay(10_000, max_sleep=MAX_SLEEP) == MAX_SLEEP


# --- the loop on a mock clock -----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Cycle:
    sent: float  # trio clock: when the sweep statement went out
    not_before: float | None  # database clock
    for_timer: bool
    announced: NextDue | None


def _result(next_due: float | None = None, fired: int = 0, *, told: bool = False
            ) -> SweepResult:
    """``told``: the sweep answers where the timer due at ``next_due`` lands."""
    upcoming = NextDue(1, "q", "Default", next_due) if told and next_due is not None else None
    return SweepResult(fired=[None] * fired, rows=[], next_due=next_due,  # type: ignore[list-item]
                       db_now=0.0, upcoming=upcoming)


class Harness:
    """A sweeper whose sweeps return ``results`` in turn, each at its ``not_before`` at the
    earliest; the loop stops at the sweep after the last."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch,
                 results: list[SweepResult | Exception], *,
                 batch: int = 500, announcing: bool = False) -> None:
        settings = Settings(sweeper_min_sleep_ms=int(MIN_SLEEP * 1000),
                            sweeper_max_sleep_ms=int(MAX_SLEEP * 1000), sweeper_batch=batch,
                            pop_fire_wait_ms=10 if announcing else 0)
        self.metrics = BrokerMetrics()
        self.announcements: list[tuple[NextDue, float, float]] = []
        self.look_ups: list[float] = []
        self.sweeper = Sweeper(
            None, None, settings, self.metrics, lambda _: 0,  # type: ignore[arg-type]
            announce_fire=lambda t, at: self.announcements.append(
                (t, at, trio.current_time())),
        )
        self.results = list(results)
        self.cycles: list[Cycle] = []
        self.send, self.receive = trio.open_memory_channel[Any](10)
        self._stop = trio.CancelScope()
        monkeypatch.setattr(self.sweeper, "_cycle", self._cycle)
        monkeypatch.setattr(self.sweeper, "_look_up", self._look_up)
        monkeypatch.setattr(sweeper_module, "time",
                            types.SimpleNamespace(time=lambda: EPOCH + trio.current_time()))

    async def _cycle(self, *, not_before: float | None, announced: NextDue | None = None,
                     for_timer: bool = False, handover: Any = None) -> SweepResult:
        self.cycles.append(Cycle(trio.current_time(), not_before, for_timer, announced))
        if not_before is not None:
            await trio.sleep_until(not_before - EPOCH)  # as queen.sweep_timers does
        if not self.results:
            self._stop.cancel()
            await trio.sleep_forever()
        result = self.results.pop(0)
        if isinstance(result, Exception):
            raise result  # the database in trouble
        return result

    async def _look_up(self, due_db: float) -> NextDue:
        self.look_ups.append(trio.current_time())
        return NextDue(1, "q", "Default", due_db)

    async def run(self, meanwhile: Callable[[], Awaitable[None]] | None = None) -> list[Cycle]:
        with self._stop:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self.sweeper._loop, self.receive)
                if meanwhile is not None:
                    await meanwhile()
        return self.cycles

    async def notify(self, due: float) -> None:
        await self.send.send(Notification(NOTIFY_CHANNEL, str(round((EPOCH + due) * 1e6)), 1))

    def wakeups(self, reason: str) -> float:
        return self.metrics.sweeper_wakeups.labels(reason)._value.get()


async def test_spaced_out_timers_are_swept_at_their_instants(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch,
) -> None:
    t0 = trio.current_time()
    h = Harness(monkeypatch, [_result(EPOCH + t0 + 0.3), _result(EPOCH + t0 + 0.7)])
    first, second, third = await h.run()
    assert (first.sent, first.not_before, first.for_timer) == (t0, None, False)
    for cycle, due in ((second, t0 + 0.3), (third, t0 + 0.7)):
        assert cycle.sent == pytest.approx(due - EARLY, abs=1e-9)
        assert cycle.not_before == pytest.approx(EPOCH + due, abs=1e-6)  # PostgreSQL waits
        assert cycle.for_timer
    assert h.wakeups("deadline") == 2


async def test_back_to_back_cycles_are_min_sleep_apart(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch,
) -> None:
    t0 = trio.current_time()
    # Each sweep reports a timer already due: the next cycle waits for the floor. It is the
    # floor's cycle, not a timer's: the backend works as soon as it is sent (no wait, no spin
    # on the clock, for an instant nothing is due at).
    h = Harness(monkeypatch, [_result(EPOCH + t0), _result(EPOCH + t0 + 0.001)])
    first, second, third = await h.run()
    assert second.sent == pytest.approx(t0 + MIN_SLEEP - EARLY, abs=1e-9)
    assert third.sent == pytest.approx(t0 + 2 * MIN_SLEEP - EARLY, abs=1e-9)
    for cycle in (second, third):
        assert not cycle.for_timer
        assert cycle.not_before is None


async def test_a_full_batch_is_followed_by_a_sweep_at_once(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch,
) -> None:
    t0 = trio.current_time()
    h = Harness(monkeypatch, [_result(EPOCH + t0, fired=3), _result(EPOCH + t0, fired=3),
                              _result(None, fired=1)], batch=3)
    cycles = await h.run()
    assert [c.sent for c in cycles[:3]] == [t0, t0, t0]
    assert [(c.not_before, c.for_timer) for c in cycles[:3]] == [(None, False)] * 3
    assert cycles[3].sent == pytest.approx(t0 + MAX_SLEEP - EARLY, abs=1e-9)


async def test_without_timers_the_sweeper_sleeps_max_sleep(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch,
) -> None:
    t0 = trio.current_time()
    h = Harness(monkeypatch, [_result(None), _result(None)])
    _, second, third = await h.run()
    assert second.sent == pytest.approx(t0 + MAX_SLEEP - EARLY, abs=1e-9)
    assert third.sent == pytest.approx(t0 + 2 * MAX_SLEEP - EARLY, abs=1e-9)
    assert not second.for_timer and second.not_before is None
    assert h.wakeups("max_sleep") == 2


async def test_a_notify_of_a_sooner_timer_brings_the_cycle_forward(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch,
) -> None:
    t0 = trio.current_time()
    h = Harness(monkeypatch, [_result(EPOCH + t0 + 0.8)])

    async def meanwhile() -> None:
        await trio.sleep_until(t0 + 0.1)
        await h.notify(t0 + 0.9)  # later than planned: no change
        await h.notify(t0 + 0.25)
        await h.notify(t0 + 0.5)  # sooner than planned, but not than the last NOTIFY

    _, second = await h.run(meanwhile)
    assert second.sent == pytest.approx(t0 + 0.25 - EARLY, abs=1e-6)
    assert second.not_before == pytest.approx(EPOCH + t0 + 0.25, abs=1e-6)
    assert second.for_timer
    assert (h.wakeups("notify"), h.wakeups("deadline")) == (1, 0)


async def test_missed_notifications_mean_a_sweep_now(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch,
) -> None:
    t0 = trio.current_time()
    h = Harness(monkeypatch, [_result(None)])

    async def meanwhile() -> None:
        await trio.sleep_until(t0 + 0.4)
        await h.send.send(MISSED)

    _, second = await h.run(meanwhile)
    assert second.sent == pytest.approx(t0 + 0.4, abs=1e-9)
    assert (second.not_before, second.for_timer) == (None, False)


async def test_a_timer_is_looked_up_ahead_and_announced_at_its_cycle(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch,
) -> None:
    t0 = trio.current_time()
    due = t0 + 0.3
    h = Harness(monkeypatch, [_result(EPOCH + due)], announcing=True)
    _, second = await h.run()
    assert h.look_ups == [pytest.approx(due - EARLY - LOOK_AHEAD, abs=1e-9)]
    assert second.sent == pytest.approx(due - EARLY, abs=1e-9)
    assert second.announced is not None and second.announced.due == EPOCH + due
    ((timer, instant, told_at),) = h.announcements
    assert timer is second.announced and instant == pytest.approx(due, abs=1e-9)
    assert told_at == second.sent  # told as the sweep goes out


async def test_a_sooner_notify_after_the_look_up_drops_it(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch,
) -> None:
    t0 = trio.current_time()
    due = t0 + 0.3
    h = Harness(monkeypatch, [_result(EPOCH + due)], announcing=True)

    async def meanwhile() -> None:
        await trio.sleep_until(due - EARLY - LOOK_AHEAD / 2)  # after the look-up
        await h.notify(due - 0.003)

    _, second = await h.run(meanwhile)
    assert len(h.look_ups) == 1
    assert second.sent == pytest.approx(due - 0.003 - EARLY, abs=1e-6)
    assert second.not_before == pytest.approx(EPOCH + due - 0.003, abs=1e-6)
    assert second.announced is None and h.announcements == []


async def test_a_failed_cycle_is_retried_after_a_short_backoff_not_max_sleep(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch,
) -> None:
    down = DatabaseUnavailable("connection refused")
    h = Harness(monkeypatch, [down, down, down, _result(None), _result(None)])
    cycles = await h.run()
    gaps = [b.sent - a.sent for a, b in zip(cycles, cycles[1:], strict=False)]
    # 50 ms, then 100 ms, then 200 ms after each failure (each sweep is sent EARLY before its
    # start, and fails at once); once a cycle succeeds, the plan is the usual one again
    # (MAX_SLEEP without timers).
    assert gaps == pytest.approx([0.05 - EARLY, 0.1 - EARLY, 0.2 - EARLY, MAX_SLEEP, MAX_SLEEP],
                                 abs=1e-6)
    assert h.metrics.timer_failures.labels("transient")._value.get() == 3


async def test_the_listener_coming_back_cuts_the_backoff_short(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch,
) -> None:
    t0 = trio.current_time()
    down = DatabaseUnavailable("connection refused")
    h = Harness(monkeypatch, [down, down, down, down, down, _result(None)])

    async def meanwhile() -> None:
        # Five failures: the backoff has reached 800 ms. The LISTEN connection reconnects
        # (the database is back) and says MISSED: the sweeper looks at once.
        await trio.sleep_until(t0 + 0.8)
        await h.send.send(MISSED)

    cycles = await h.run(meanwhile)
    assert cycles[5].sent == pytest.approx(t0 + 0.8, abs=1e-6)


async def test_a_timer_the_sweep_answered_is_announced_without_a_look_up(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch,
) -> None:
    t0 = trio.current_time()
    due = t0 + 0.3
    h = Harness(monkeypatch, [_result(EPOCH + due, told=True)], announcing=True)
    _, second = await h.run()
    assert h.look_ups == []  # the sweep said where it lands: no statement of its own
    assert second.sent == pytest.approx(due - EARLY, abs=1e-9)
    assert second.for_timer and second.not_before == pytest.approx(EPOCH + due, abs=1e-6)
    assert second.announced == NextDue(1, "q", "Default", EPOCH + due)
    ((timer, instant, told_at),) = h.announcements
    assert timer is second.announced and instant == pytest.approx(due, abs=1e-9)
    assert told_at == second.sent


async def test_a_sooner_notify_than_the_timer_the_sweep_answered_is_looked_up(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch,
) -> None:
    t0 = trio.current_time()
    due = t0 + 0.3
    h = Harness(monkeypatch, [_result(EPOCH + due, told=True)], announcing=True)

    async def meanwhile() -> None:
        await trio.sleep_until(t0 + 0.1)
        await h.notify(t0 + 0.2)  # where that one lands, the last sweep did not say

    _, second = await h.run(meanwhile)
    assert h.look_ups == [pytest.approx(t0 + 0.2 - EARLY - LOOK_AHEAD, abs=1e-9)]
    assert second.sent == pytest.approx(t0 + 0.2 - EARLY, abs=1e-6)
    assert second.announced is not None
    assert second.announced.due == pytest.approx(EPOCH + t0 + 0.2, abs=1e-6)


async def test_under_steady_load_the_floors_cycle_announces_the_timer_it_fires(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Timers due closer together than MIN_SLEEP: every cycle is the floor's, and each still
    tells the parked pops of the first timer it fires (the sweep then pops for one of them)."""
    t0 = trio.current_time()
    h = Harness(monkeypatch, [_result(EPOCH + t0 + 0.002, fired=1, told=True),
                              _result(EPOCH + t0 + MIN_SLEEP + 0.002, fired=5, told=True)],
                announcing=True)
    _, second, third = await h.run()
    assert h.look_ups == []
    for cycle, start in ((second, t0 + MIN_SLEEP), (third, t0 + 2 * MIN_SLEEP)):
        assert cycle.sent == pytest.approx(start - EARLY, abs=1e-9)
        assert not cycle.for_timer and cycle.not_before is None
        assert cycle.announced is not None
        assert (cycle.announced.queue, cycle.announced.partition) == ("q", "Default")
        # (a pop waiting for it in PostgreSQL queues behind the sweep's fire lock)
        assert cycle.announced.due == pytest.approx(
            EPOCH + start - EARLY + sweeper_module._FLOOR_ANNOUNCE_S, abs=1e-6)
    assert [told_at for _, _, told_at in h.announcements] == pytest.approx(
        [t0 + MIN_SLEEP - EARLY, t0 + 2 * MIN_SLEEP - EARLY], abs=1e-9)

"""The sweeper: sleeps until the next timer is due, then fires what is due.

One cycle is one statement, ``queen.sweep_timers`` (schema 005), run in autocommit: it locks the
due rows, fires those stored as plain JSON (frames appended, rows deleted, one commit) and
claims the rest under a lease. Claimed rows (compressed payloads, payloads over the ceiling)
are then fired by the broker in a second transaction that deletes only the rows still carrying
its claim token. Either way a cancel arriving meanwhile finds the row locked or claimed and
answers too_late.

Between cycles it sleeps until the earliest ``visible_at`` the database reported, a NOTIFY of
a sooner timer, or ``MAX_SLEEP``, whichever comes first; two cycles start at least
``MIN_SLEEP`` apart unless the last one came back full (a backlog is draining).

Clocks: due times are PostgreSQL's. Each sweep also reads the database clock, so the sweeper
can turn "due at T (database time)" into a local deadline; it rounds towards waking a little
late rather than early, because a sweep that runs a hair before the due instant finds nothing
and costs a whole MIN_SLEEP."""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
import os
import socket
import time
import uuid
from collections.abc import Callable
from datetime import datetime

import trio

from .config import ONE_MIB, Settings
from .db import MISSED, Database, Listener
from .db.transient import TRANSIENT_ERRORS
from .metrics import BrokerMetrics
from .timers import store
from .timers.store import NOTIFY_CHANNEL, Claimed, SweepResult

log = logging.getLogger(__name__)

_FIRE_TIMEOUT_S = 10.0  # bound on the shielded fire at shutdown
_PENDING_REFRESH_S = 5.0
# How long before a planned cycle trio wakes; the worker thread sleeps the rest precisely.
_EARLY_WAKE_S = 0.002
# Longest run of back-to-back sweeps a worker thread makes while a backlog drains.
_DRAIN_SLICE_S = 0.2
# Database trouble, not a broken timer: it spends no attempt.
TRANSIENT = TRANSIENT_ERRORS


@dataclasses.dataclass(frozen=True, slots=True)
class SweeperStatistics:
    cycles: int
    fired: int
    last_cycle_at: float | None  # trio clock
    alive: bool


class Sweeper:
    def __init__(
        self,
        db: Database,
        listener: Listener,
        settings: Settings,
        metrics: BrokerMetrics,
        ceiling_for: Callable[[int], int],
    ) -> None:
        self._db = db
        self._listener = listener
        self._settings = settings
        self._metrics = metrics
        self._ceiling_for = ceiling_for
        self.name = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self._min_sleep = settings.sweeper_min_sleep_ms / 1000
        self._max_sleep = settings.sweeper_max_sleep_ms / 1000
        # The ceiling PostgreSQL applies when it fires a timer itself (least of this and the
        # tenant's plan ceiling, read from the tenants table at the fire).
        self._max_payload = settings.timer_payload_ceiling(ONE_MIB)
        self._cycles = 0
        self._fired = 0
        self._last_cycle_at: float | None = None
        self._alive = False
        # database clock - local wall clock: each claim proves a lower bound for it (the
        # database read its clock before we got the answer); the largest recent bound is the
        # tightest that still errs on the late side.
        self._offset_bounds: collections.deque[float] = collections.deque(maxlen=32)
        # Claims whose release failed (the database was down): retried once it is back, so
        # their rows wait for the next cycle rather than for the whole lease.
        self._unreleased: list[uuid.UUID] = []
        self._clock_offset = 0.0

    def statistics(self) -> SweeperStatistics:
        return SweeperStatistics(self._cycles, self._fired, self._last_cycle_at, self._alive)

    @property
    def alive(self) -> bool:
        return self._alive

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        with self._listener.subscribe(NOTIFY_CHANNEL) as notifications:
            self._alive = True
            task_status.started()
            try:
                await self._loop(notifications)
            finally:
                self._alive = False

    async def _loop(self, notifications: trio.MemoryReceiveChannel) -> None:
        last_start = -math.inf
        pending_refreshed = -math.inf
        start_at = -math.inf  # trio clock: when the next cycle should run
        while True:
            start_at = max(start_at, last_start + self._min_sleep)
            # trio's sleep may overshoot by a millisecond (epoll's resolution): wake a little
            # early and let the worker thread sleep the rest precisely before its statement.
            await trio.sleep_until(start_at - _EARLY_WAKE_S)
            last_start = max(start_at, trio.current_time())
            self._last_cycle_at = last_start
            self._cycles += 1
            try:
                result = await self._cycle(not_before=time.time() + start_at - trio.current_time())
            except TRANSIENT as exc:
                self._metrics.timer_failures.labels("transient").inc()
                log.warning("sweeper cycle failed (transient, no attempt spent): %s", exc)
                start_at, _ = await self._sleep_or_wake(
                    notifications, trio.current_time() + self._max_sleep)
                continue
            if trio.current_time() - pending_refreshed > _PENDING_REFRESH_S:
                pending_refreshed = trio.current_time()
                await self._refresh_pending()
            if len(result.fired) + len(result.rows) >= self._settings.sweeper_batch:
                start_at = -math.inf  # a backlog is draining: go on at once
                last_start = -math.inf
                continue
            deadline = trio.current_time() + self._max_sleep
            reason_deadline = "max_sleep"
            if result.next_due is not None:
                due_deadline = self._local_deadline(result.next_due)
                if due_deadline < deadline:
                    deadline, reason_deadline = due_deadline, "deadline"
            start_at, woke = await self._sleep_or_wake(notifications, deadline)
            self._metrics.sweeper_wakeups.labels(woke or reason_deadline).inc()

    async def _sleep_or_wake(
        self, notifications: trio.MemoryReceiveChannel, deadline: float
    ) -> tuple[float, str | None]:
        """Sleep until shortly before ``deadline``, brought forward by NOTIFYs of sooner timers.

        Returns the (possibly earlier) deadline, and "notify" if a notification decided it,
        None if the planned deadline stood.
        """
        reason = None
        while True:
            with trio.move_on_at(deadline - _EARLY_WAKE_S) as sleep:
                item = await notifications.receive()
            if sleep.cancelled_caught:
                return deadline, reason
            if item is MISSED:
                # A sooner timer may have been announced while we were deaf: look now.
                return trio.current_time(), "notify"
            try:
                due = self._local_deadline(int(item.payload) / 1_000_000)  # epoch µs
            except ValueError:
                continue
            if due < deadline:
                deadline, reason = due, "notify"

    def _local_deadline(self, db_epoch: float) -> float:
        """The trio-clock instant at which the database clock will read ``db_epoch``."""
        return trio.current_time() + (db_epoch - self._clock_offset - time.time())

    async def _cycle(self, *, not_before: float) -> SweepResult:
        """One sweep statement, started no earlier than ``not_before`` (local wall clock), then
        the broker's fire of whatever it claimed. While a backlog drains, the worker thread
        runs further sweeps back to back (see :meth:`_sweep_at`); the last one is returned."""
        while self._unreleased:
            await self._db.run(store.release, self._unreleased[0])
            self._unreleased.pop(0)
        token = uuid.uuid4()
        # The sweep is a single statement: it runs in autocommit (its own transaction; a fire
        # inside it is committed or rolled back as a whole, even if we are cancelled).
        async with self._db.connection() as conn:
            swept: list[tuple[SweepResult, float]] = await conn.run(
                self._sweep_at, not_before, token)
        self._cycles += len(swept) - 1
        for result, returned_at in swept:
            self._offset_bounds.append(result.db_now - returned_at)
            self._clock_offset = max(self._offset_bounds)
            if result.fired:
                self._fired_now(result.fired, returned_at + self._clock_offset)
            if result.fired or result.rows:
                self._metrics.claim_batch_size.observe(len(result.fired) + len(result.rows))
        result = swept[-1][0]
        if result.rows:
            await self._fire(token, result.rows)
        return result

    def _sweep_at(
        self, raw: store.Raw, not_before: float, token: uuid.UUID
    ) -> list[tuple[SweepResult, float]]:
        """In the worker thread: wait out the last moments precisely, then sweep.

        A full batch fired by PostgreSQL means a backlog: sweep again at once, here, for up to
        _DRAIN_SLICE_S, rather than hand back to the event loop between batches (its HTTP
        work would hold every batch up). Stops at the first rows claimed for the broker.
        Answers each sweep with the local time it returned."""
        delay = not_before - time.time()
        if delay > 0:
            time.sleep(min(delay, _EARLY_WAKE_S * 2))
        s = self._settings
        slice_ends = time.monotonic() + _DRAIN_SLICE_S
        swept = []
        while True:
            result = store.sweep(raw, token, self.name, s.sweeper_batch, s.sweeper_lease_ms,
                                 max_payload=self._max_payload)
            swept.append((result, time.time()))
            if (len(result.fired) < s.sweeper_batch or result.rows
                    or time.monotonic() >= slice_ends):
                return swept

    def _fired_now(self, deliver_ats: list[datetime], committed_at_db: float) -> None:
        for at in deliver_ats:
            self._metrics.fire_lag.observe(max(0.0, committed_at_db - at.timestamp()))
        self._fired += len(deliver_ats)
        self._metrics.timers_fired.inc(len(deliver_ats))

    async def _fire(self, token: uuid.UUID, rows: list[Claimed]) -> None:
        ceilings = {tid: self._ceiling_for(tid) for tid in {c.tenant_id for c in rows}}
        settings = self._settings
        # The one commit that must finish: a shutdown waits for it (bounded), so a fire is
        # either committed or rolled back, never abandoned half-way.
        with trio.move_on_after(_FIRE_TIMEOUT_S, shield=True):
            try:
                fired = await self._db.run(
                    store.fire, token, rows, ceilings=ceilings,
                    max_attempts=settings.sweeper_max_attempts,
                    backoff_ms=settings.sweeper_backoff_ms,
                )
            except TRANSIENT:
                await self._release(token)
                raise
        self._fired_now([c.deliver_at for c in fired.fired], time.time() + self._clock_offset)
        if fired.failed or fired.dead_lettered:
            self._metrics.timer_failures.labels("permanent").inc(
                len(fired.failed) + len(fired.dead_lettered)
            )
        for c, error in fired.failed:
            log.warning("timer %s/%s failed (attempt %d): %s", c.queue, c.key, c.attempts + 1,
                        error)
        for c, error in fired.dead_lettered:
            log.warning("timer %s/%s dead-lettered after %d attempts: %s", c.queue, c.key,
                        c.attempts + 1, error)
        self._metrics.timers_dead_lettered.inc(len(fired.dead_lettered))
        if fired.lost:
            log.info("%d claimed timers were taken over before we fired them", fired.lost)

    async def _release(self, token: uuid.UUID) -> None:
        """After transient trouble, hand our claimed rows back now rather than at lease end."""
        with trio.move_on_after(2.0):
            try:
                await self._db.run(store.release, token)
                return
            except TRANSIENT:
                pass
        self._unreleased.append(token)  # the next cycle tries again

    async def _refresh_pending(self) -> None:
        try:
            self._metrics.timers_pending.set(await self._db.run(store.pending_count))
        except TRANSIENT:
            pass

"""The sweeper: sleeps until the next timer is due, claims due timers under a lease, fires them.

One cycle = claim (its own short transaction, so cancels see the claim at once and answer
too_late) + fire (one transaction: delete the rows still claimed by us, append their frames).
Between cycles it sleeps until the earliest ``visible_at`` the database reported, a NOTIFY of
a sooner timer, or ``MAX_SLEEP``, whichever comes first; two cycles start at least
``MIN_SLEEP`` apart unless the last claim came back full (a backlog is draining).

Clocks: due times are PostgreSQL's. Each claim also reads the database clock and the sweeper
brackets it with its own, so it can turn "due at T (database time)" into a local deadline; it
rounds towards waking a little late rather than early, because a claim that runs a hair before
the due instant finds nothing and costs a whole MIN_SLEEP.
"""

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

import trio

from .config import Settings
from .db import MISSED, Database, Listener
from .db.transient import TRANSIENT_ERRORS
from .metrics import BrokerMetrics
from .timers import store
from .timers.store import NOTIFY_CHANNEL, Claimed, ClaimResult

log = logging.getLogger(__name__)

_FIRE_TIMEOUT_S = 10.0  # bound on the shielded fire at shutdown
_PENDING_REFRESH_S = 5.0
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
        draining = False
        while True:
            if not draining:
                await trio.sleep_until(last_start + self._min_sleep)
            last_start = trio.current_time()
            self._last_cycle_at = last_start
            self._cycles += 1
            try:
                result = await self._cycle()
            except TRANSIENT as exc:
                self._metrics.timer_failures.labels("transient").inc()
                log.warning("sweeper cycle failed (transient, no attempt spent): %s", exc)
                draining = False
                await self._sleep_or_wake(notifications, trio.current_time() + self._max_sleep)
                continue
            draining = len(result.rows) >= self._settings.sweeper_batch
            if trio.current_time() - pending_refreshed > _PENDING_REFRESH_S:
                pending_refreshed = trio.current_time()
                await self._refresh_pending()
            if draining:
                continue
            deadline = trio.current_time() + self._max_sleep
            reason_deadline = "max_sleep"
            if result.next_due is not None:
                due_deadline = self._local_deadline(result.next_due)
                if due_deadline < deadline:
                    deadline, reason_deadline = due_deadline, "deadline"
            woke = await self._sleep_or_wake(notifications, deadline)
            self._metrics.sweeper_wakeups.labels(woke or reason_deadline).inc()

    async def _sleep_or_wake(
        self, notifications: trio.MemoryReceiveChannel, deadline: float
    ) -> str | None:
        """Sleep until ``deadline``, brought forward by NOTIFYs of sooner timers.

        Returns "notify" if a notification decided the wake-up, None if the deadline did.
        """
        reason = None
        while True:
            with trio.move_on_at(deadline) as sleep:
                item = await notifications.receive()
            if sleep.cancelled_caught:
                return reason
            if item is MISSED:
                return "notify"  # a sooner timer may have been announced while we were deaf
            try:
                due = self._local_deadline(int(item.payload) / 1000)
            except ValueError:
                continue
            if due < deadline:
                deadline, reason = due, "notify"

    def _local_deadline(self, db_epoch: float) -> float:
        """The trio-clock instant at which the database clock will read ``db_epoch``."""
        return trio.current_time() + (db_epoch - self._clock_offset - time.time())

    async def _cycle(self) -> ClaimResult:
        while self._unreleased:
            await self._db.run(store.release, self._unreleased[0])
            self._unreleased.pop(0)
        token = uuid.uuid4()
        settings = self._settings
        # The claim is a single statement: run it in autocommit (its own transaction) and save
        # the BEGIN and COMMIT round trips of an explicit one.
        async with self._db.connection() as conn:
            result: ClaimResult = await conn.run(
                store.claim, token, self.name, settings.sweeper_batch, settings.sweeper_lease_ms
            )
        self._offset_bounds.append(result.db_now - time.time())
        self._clock_offset = max(self._offset_bounds)
        if result.rows:
            self._metrics.claim_batch_size.observe(len(result.rows))
            await self._fire(token, result.rows)
        return result

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
        committed_at_db = time.time() + self._clock_offset
        for c in fired.fired:
            self._metrics.fire_lag.observe(max(0.0, committed_at_db - c.deliver_at.timestamp()))
        self._fired += len(fired.fired)
        self._metrics.timers_fired.inc(len(fired.fired))
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

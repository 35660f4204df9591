"""The sweeper: sleeps until the next timer is due, then fires what is due.

One cycle is one statement, ``queen.sweep_timers``, run in autocommit: it locks the
due rows, fires those stored as plain JSON (frames appended, rows deleted, one commit) and
claims the rest under a lease. Claimed rows (compressed payloads, payloads over the ceiling)
are then fired by the broker in a second transaction that deletes only the rows still carrying
its claim token. Either way a cancel arriving meanwhile finds the row locked or claimed and
answers too_late.

Between cycles it sleeps until the earliest ``visible_at`` the database reported, a NOTIFY of
a sooner timer, or ``MAX_SLEEP``, whichever comes first; two cycles start at least
``MIN_SLEEP`` apart unless the last one came back full (a backlog is draining).

Clocks: due times are PostgreSQL's. Each sweep also reads the database clock, so the sweeper
can turn "due at T (database time)" into a local deadline. It wakes a few milliseconds before
that deadline and sends the statement with T itself as ``not_before``: the backend waits for T
(queen.wait_until) so the instant is kept by PostgreSQL's own clock and the work starts in a process
that is already running, not in one a packet has to wake. The backend does the fire's work a
millisecond ahead of T, with the rows locked, and returns (then commits) at T, so
the commit follows the instant rather than the work. A sweep that ran a hair early would find
nothing and cost a whole MIN_SLEEP. Only a cycle for a timer's own instant is kept that way: a
cycle held back to MIN_SLEEP (every cycle under steady load) or at MAX_SLEEP has no instant to
keep (what it fires has been due for a while, and the cycles' spacing, not their phase, sets
the lag), so its sweep works as soon as it is sent. Keeping the instant costs the backend
about a millisecond of CPU per cycle, the last of it a spin on the clock (pg_sleep wakes to the
millisecond): at 100 cycles a second, a third of PostgreSQL's CPU at a steady 500 timers/s.

Each sweep also answers where the earliest timer left will land. The sweeper tells the pops
parked on that queue when it sends the sweep that fires it (one planned for the timer's own
instant, or the MIN_SLEEP floor's cycle under steady load), and the sweep holds the queue's
fire lock until it commits: the sweep itself pops for one of those pops
(queen.sweep_timers_and_pop), or one can take the frame the moment it is visible
(queen.pop_head_after). A timer a NOTIFY brought forward is looked up a little ahead instead.

These functions of the schema are in schema/functions/timers.sql and schema/functions/log.sql."""

from __future__ import annotations

import collections
import contextlib
import ctypes
import dataclasses
import itertools
import logging
import math
import os
import socket
import sys
import time
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any, Literal

import trio

from ..config import ONE_MIB, Settings
from ..db import MISSED, Database, Listener
from ..db.rows import DictConnection
from ..db.transient import TRANSIENT_ERRORS, describe, survived, timed_out
from ..log import store as log_store
from ..log.rules import PopRequest
from ..log.wakeups import ParkedPop
from ..metrics import BrokerMetrics
from ..switches import RuntimeSwitches
from . import store
from .store import NOTIFY_CHANNEL, Claimed, SweepResult

log = logging.getLogger(__name__)

_FIRE_TIMEOUT_S = 10.0  # bound on the shielded fire at shutdown
# How long before a planned cycle its statement is sent; PostgreSQL waits out the rest. More
# than trio's sleep overshoot (epoll counts whole milliseconds) plus the hop to the backend.
_EARLY_SEND_S = 0.006
# How much earlier still the sweeper looks up where an idle sweep's timer will land.
_LOOK_AHEAD_S = 0.01
# A cycle that is not for a timer's instant announces the timer it fires for a little after
# it is sent: a pop waiting for the fire inside PostgreSQL (queen.pop_head_after) sleeps until
# just before that, then queues behind the fire lock the sweep takes as it arrives.
_FLOOR_ANNOUNCE_S = 0.003
# Longest run of back-to-back sweeps a worker thread makes while a backlog drains.
_DRAIN_SLICE_S = 0.2
# Database trouble, not a broken timer: it spends no attempt.
TRANSIENT = TRANSIENT_ERRORS
# After a cycle failed on such trouble, the next try comes this soon, doubling per further
# failure up to MAX_SLEEP: a failover's new primary is found within moments of its promotion,
# while a database that stays down is asked at most every MAX_SLEEP.
RETRY_FIRST_S = 0.05
_UUID_MASK = (1 << 128) - 1


#: Why a cycle starts when it does. "deadline", "max_sleep" and "notify" are the reasons counted
#: in ``queen_sweeper_wakeups`` (with "resume": the fire's runtime switch came back on);
#: "min_sleep", "backlog" and "start" are never waited out.
Reason = Literal["deadline", "max_sleep", "notify", "min_sleep", "backlog", "start"]


@dataclasses.dataclass(frozen=True, slots=True)
class Plan:
    """The sweeper's next cycle: when it starts and what it is for."""

    start_at: float  # trio clock; -inf: at once
    # The database instant start_at stands for (the due instant of the timer the cycle is
    # for), if any: the sweep is sent with it as not_before.
    due_db: float | None
    # "deadline": the earliest timer the last sweep saw; "max_sleep": none sooner than
    # MAX_SLEEP; "notify": a NOTIFY of a sooner timer (or of missed ones); "min_sleep": held
    # back to MIN_SLEEP after the last cycle's start; "backlog": the last batch was full.
    reason: Reason
    # Announce the timer due at due_db: wake _LOOK_AHEAD_S early to look up where it will land
    # unless ``upcoming`` says so already.
    look_ahead: bool = False
    # The timer the cycle fires first, as the last sweep answered it or as looked up: announced
    # to the parked pops when the cycle starts.
    upcoming: store.NextDue | None = None


_FIRST = Plan(-math.inf, None, "start")
_BACKLOG = Plan(-math.inf, None, "backlog")


def next_plan(
    *, now: float, last_start: float, full: bool, due_at: float | None, due_db: float | None,
    min_sleep: float, max_sleep: float, announcing: bool,
    upcoming: store.NextDue | None = None,
) -> Plan:
    """The next cycle, planned when a cycle that started at ``last_start`` returns at ``now``
    (trio clock). ``full``: its batch was full (a backlog is draining: go on at once). Else
    the next is at the earliest timer it saw (due at ``due_at``, trio clock, which is
    ``due_db`` on the database's) if that comes before ``now + max_sleep``, else at MAX_SLEEP.
    ``announcing``: the sweeper tells parked pops of a timer about to fire; a plan looks ahead
    for it unless the cycle falls at the MIN_SLEEP floor (then, under load, the cycle is the
    floor's, not a timer's). ``upcoming``: the timer due at ``due_db`` as the sweep answered
    it (where it lands), kept for the announcement. NOTIFYs may bring the plan forward while
    the sweeper sleeps; :func:`floored` keeps it MIN_SLEEP after ``last_start``."""
    if full:
        return _BACKLOG
    if due_at is not None and due_at < now + max_sleep:
        return Plan(due_at, due_db, "deadline", announcing and due_at > last_start + min_sleep,
                    upcoming if announcing and upcoming is not None
                    and upcoming.due == due_db else None)
    # (From the cycle's start, not its return: sent ahead, it returns before its start.)
    return Plan(max(now, last_start) + max_sleep, None, "max_sleep", announcing)


def next_batch(batch: int, taken: int, base: int, backlog: int) -> int:
    """How many timers the sweep after one that asked for ``batch`` and took ``taken`` asks
    for. A full sweep means a backlog: 4 times as many, up to ``backlog`` (at least ``base``),
    so a burst is fired in few large transactions (one commit, one statement's fixed costs,
    one NOTIFY per queue for thousands of timers) while its first frames still come in a small
    one. Anything less than full: back to ``base``."""
    if taken < batch:
        return base
    return max(base, min(batch * 4, backlog))


def narrowed(asked: int) -> int:
    """The most timers a sweep may ask for after a sweep that asked for ``asked`` (or the fire
    of what it claimed) ran into its statement timeout, the lease: half as many, at least one.
    Asking for as many again would time out again, every cycle, and nothing would fire."""
    return max(1, asked // 2)


def widened(cap: int, top: int, *, full: bool, slowest_s: float, lease_s: float) -> int:
    """The cap after a cycle that succeeded: twice ``cap`` (at most ``top``) when its sweep
    took all it asked for (a backlog is still there) and none of its statements used more
    than a quarter of the lease; else ``cap``."""
    if full and slowest_s * 4 < lease_s:
        return min(top, cap * 2)
    return cap


def retry_delay(failures: int, *, max_sleep: float, first: float = RETRY_FIRST_S) -> float:
    """How long the sweeper waits before its next cycle after ``failures`` cycles in a row
    failed on transient database trouble (``failures`` >= 1): ``first``, doubling, at most
    ``max_sleep``. A NOTIFY, or the MISSED the listener sends when it is back, cuts it short."""
    return min(max_sleep, first * 2 ** min(failures - 1, 30))


def floored(plan: Plan, last_start: float, min_sleep: float) -> Plan:
    """``plan``, or a cycle ``min_sleep`` after ``last_start`` if it would start sooner (not
    for a timer's instant then, but it fires the timer ``plan`` was for, still announced to
    its queue's parked pops: under steady load every cycle is the floor's). A backlog drains
    back to back."""
    floor = last_start + min_sleep
    if floor > plan.start_at and plan.reason != "backlog":
        return Plan(floor, None, "min_sleep", upcoming=plan.upcoming)
    return plan


@dataclasses.dataclass(frozen=True, slots=True)
class SweeperStatistics:
    cycles: int
    fired: int
    last_cycle_at: float | None  # trio clock
    alive: bool


class Sweeper:
    name = "sweeper"

    def __init__(
        self,
        db: Database,
        listener: Listener,
        settings: Settings,
        metrics: BrokerMetrics,
        ceiling_for: Callable[[int], int],
        announce_fire: Callable[[store.NextDue, float], ParkedPop | None] | None = None,
        look_up_db: Database | None = None,
        switches: RuntimeSwitches | None = None,
        plan_fire: Callable[[store.NextDue | None, float], None] | None = None,
    ) -> None:
        self._db = db
        # timers_fire_enabled: while an operator has it off, this sweeper fires nothing.
        self._switches = switches
        self._listener = listener
        self._settings = settings
        self._metrics = metrics
        self._ceiling_for = ceiling_for
        # Told (the timer, its local due instant) before an idle sweep fires a timer. It answers
        # a pop parked on the timer's queue that it reserved for the fire (the sweep pops for
        # it), or None, and then the pops parked there wait for the frame in PostgreSQL
        # (queen.pop_head_after).
        self._announce_fire = announce_fire if settings.pop_fire_wait_ms > 0 else None
        # Told, as each cycle is planned, the timer it will fire first (as the last sweep saw
        # it, None if not known) and when its statement will be sent (trio clock): a streaming
        # consumer's settlement waits that long for the sweep that pops for it
        # (queen_trio/api/stream.py).
        self._plan_fire = plan_fire if self._announce_fire is not None else None
        # Where the look-up for an announcement runs: not on the sweeper's own connections,
        # so a look-up that is cut short never costs the sweep its connection.
        self._look_up_db = look_up_db or db
        # Who claims: the claims this sweeper takes carry it.
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
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
        # Each cycle's claim token: a random one drawn at start, counted on from there (a
        # uuid4 per cycle cost a getrandom(2) and its Python each, a hundred a second).
        self._tokens = itertools.count(uuid.uuid4().int)
        self._clock_offset = 0.0
        # Timers the next sweep takes: sweeper_batch, grown after each full sweep while a
        # backlog drains (see next_batch), never above _cap.
        self._batch = settings.sweeper_batch
        # The most a sweep asks for: lowered after a statement ran into its timeout (the
        # lease; see narrowed), raised again by cycles that had time to spare (widened).
        self._top = max(settings.sweeper_batch, settings.sweeper_backlog_batch)
        self._cap = self._top
        self._asked = self._batch  # what the last sweep asked for
        self._took_all = False  # ... and whether it took that many
        self._slowest_s = 0.0  # the longest statement (a sweep or a fire) of this cycle
        # The last cycle's batch came back full: a backlog is draining (see _sweep).
        self._draining = False

    def _fire_mark(self) -> contextlib.AbstractContextManager[None]:
        """The cycle in flight, for an operator's pause to wait for (see switches.firing)."""
        return contextlib.nullcontext() if self._switches is None else self._switches.firing()

    def _fire_on(self) -> bool:
        return self._switches is None or self._switches.timers_fire

    def statistics(self) -> SweeperStatistics:
        return SweeperStatistics(self._cycles, self._fired, self._last_cycle_at, self._alive)

    @property
    def alive(self) -> bool:
        return self._alive

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        with self._listener.subscribe(NOTIFY_CHANNEL) as notifications:
            alarm = _Alarm.open()
            self._alive = True
            task_status.started()
            try:
                await self._loop(notifications, alarm)
            finally:
                self._alive = False
                if alarm is not None:
                    alarm.close()

    async def _loop(self, notifications: trio.MemoryReceiveChannel,
                    alarm: _Alarm | None = None) -> None:
        last_start = -math.inf  # trio clock: when the last cycle started
        plan = _FIRST
        failures = 0  # cycles in a row that met transient database trouble
        announcing = self._announce_fire is not None
        while True:
            plan = floored(plan, last_start, self._min_sleep)
            start_at = plan.start_at
            if alarm is None:
                await trio.sleep_until(start_at - _EARLY_SEND_S)
            else:
                await alarm.sleep_until(start_at - _EARLY_SEND_S)
            if self._switches is not None and not self._switches.timers_fire:
                # Paused by an operator: due timers stay pending (nothing is lost), and the
                # sweeper waits for the resume rather than wake for them. Then it sweeps at once.
                await self._switches.wait_fire_enabled()
                self._metrics.sweeper_wakeups.labels("resume").inc()
                plan = _FIRST
                continue
            now = trio.current_time()
            last_start = max(start_at, now)
            self._last_cycle_at = last_start
            self._cycles += 1
            not_before = plan.due_db  # (only a timer's instant is waited for in the backend)
            announced = plan.upcoming
            handover = None
            if announced is not None:
                assert self._announce_fire is not None
                if not_before is None:
                    # The floor's cycle fires it (it was due sooner), as the cycle is sent.
                    announced = store.NextDue(
                        announced.tenant_id, announced.queue, announced.partition,
                        self._db_instant(trio.current_time()) + _FLOOR_ANNOUNCE_S)
                handover = self._announce_fire(announced, start_at)
            if self._plan_fire is not None:
                self._plan_fire(None, start_at)  # (sent: the next is planned when it returns)
            self._slowest_s = 0.0
            try:
                with self._fire_mark():
                    result = await self._cycle(not_before=not_before, announced=announced,
                                               for_timer=plan.due_db is not None,
                                               handover=handover)
            except Exception as exc:
                failures += 1
                delay = retry_delay(failures, max_sleep=self._max_sleep)
                if isinstance(exc, TRANSIENT):
                    self._metrics.timer_failures.labels("transient").inc()
                    narrower = ""
                    if timed_out(exc):
                        # (statement_timeout, the lease: the database is slower than this
                        # batch allows)
                        self._cap = narrowed(self._asked)
                        self._batch = min(self._batch, self._cap)
                        narrower = f"; sweeps now ask for at most {self._cap} timers"
                    log.warning("sweeper cycle failed (transient, no attempt spent; next try "
                                "in %.0f ms%s): %s", delay * 1000, narrower,
                                str(exc).strip().splitlines()[0])
                else:
                    # Not tied to a row (a row's own failure spends its attempt in the fire):
                    # logged and counted, and the sweeper goes on after the same back-off.
                    self._survived(exc, "a sweeper cycle")
                plan = await self._sleep_or_wake(
                    notifications, Plan(trio.current_time() + delay, None, "max_sleep"))
                continue
            failures = 0
            if self._cap < self._top:
                self._cap = widened(self._cap, self._top, full=self._took_all,
                                    slowest_s=self._slowest_s,
                                    lease_s=self._settings.sweeper_lease_ms / 1000)
            # (Against the base batch: a grown sweep that took less than it asked for is
            # followed by one more at once, which finds the last of the backlog, or nothing.)
            full = len(result.fired) + len(result.rows) >= self._settings.sweeper_batch
            self._draining = full
            due_db = None if full else result.next_due
            plan = next_plan(
                now=trio.current_time(), last_start=last_start, full=full,
                due_at=None if due_db is None else self._local_deadline(due_db), due_db=due_db,
                min_sleep=self._min_sleep, max_sleep=self._max_sleep, announcing=announcing,
                upcoming=result.upcoming,
            )
            if full:
                continue
            if self._plan_fire is not None:
                floor = floored(plan, last_start, self._min_sleep)
                self._plan_fire(floor.upcoming, floor.start_at - (
                    _EARLY_SEND_S if floor.due_db is None else 0.0))
            if plan.look_ahead:
                plan = await self._sleep_and_look_up(notifications, plan)
            elif plan.start_at <= last_start + self._min_sleep:
                # Due by the MIN_SLEEP floor (every cycle under a steady flow): no NOTIFY can
                # bring the cycle sooner than the floor, so the only sleep is the loop's, until
                # the floor. (Each sleep that ends at its deadline costs trio a cancellation: with
                # two a cycle, a fifth of the sweeper's CPU under a steady flow.) What was
                # notified meanwhile is dropped: the floor's cycle sweeps those timers if they are
                # due by then, and its answer tells of any due later (they are committed).
                _drop_waiting(notifications)
            else:
                plan = await self._sleep_or_wake(notifications, plan)
            self._metrics.sweeper_wakeups.labels(plan.reason).inc()

    async def _sleep_and_look_up(
        self, notifications: trio.MemoryReceiveChannel, plan: Plan
    ) -> Plan:
        """:meth:`_sleep_or_wake`, looking up a little ahead where the timer due at the end
        will land (off the path of the sweep itself), unless the last sweep said so. A NOTIFY
        of a sooner timer after the look-up cancels the announcement."""
        plan = await self._sleep_or_wake(notifications, plan,
                                         lead_s=_EARLY_SEND_S + _LOOK_AHEAD_S)
        if plan.start_at <= trio.current_time():
            return plan  # deaf for a while: sweep now
        # (A plan a NOTIFY brought forward has none.)
        planned, upcoming = plan.due_db, plan.upcoming
        if planned is not None and upcoming is None:
            # Never at the sweep's expense: a look-up that has not answered by the send is
            # dropped (the database is slow, or its answers are not reaching us).
            with trio.move_on_at(plan.start_at - _EARLY_SEND_S):
                upcoming = await self._look_up(planned)
        plan = await self._sleep_or_wake(notifications, plan)
        if upcoming is None or plan.due_db != planned:
            return plan
        return Plan(plan.start_at, planned, plan.reason, plan.look_ahead, upcoming)

    async def _sleep_or_wake(
        self, notifications: trio.MemoryReceiveChannel, plan: Plan,
        *, lead_s: float = _EARLY_SEND_S,
    ) -> Plan:
        """Sleep until ``lead_s`` before ``plan.start_at``, brought forward by NOTIFYs of
        sooner timers.

        Returns ``plan`` if it stood, else the plan for the soonest timer notified (reason
        "notify"), or for an immediate cycle if notifications were missed.
        """
        deadline, due_db, notified = plan.start_at, plan.due_db, False
        while True:
            with trio.move_on_at(deadline - lead_s) as sleep:
                item = await notifications.receive()
            if sleep.cancelled_caught:
                return Plan(deadline, due_db, "notify", plan.look_ahead) if notified else plan
            if item is MISSED:
                # A sooner timer may have been announced while we were deaf: look now.
                return Plan(trio.current_time(), None, "notify")
            try:
                announced = int(item.payload) / 1_000_000  # epoch µs, the database's clock
            except ValueError:
                continue
            due = self._local_deadline(announced)
            if due < deadline:
                deadline, due_db, notified = due, announced, True

    async def _look_up(self, due_db: float) -> store.NextDue | None:
        """The timer due at ``due_db``: at the cycle, the pops parked on its queue are told it
        is about to fire, and the sweep holds that queue's fire lock for them
        (queen.sweep_timers_for)."""
        try:
            upcoming = await self._look_up_db.run_autocommit(store.next_due)
        except TRANSIENT:
            return None  # only a hint: the cycle itself will meet the trouble
        except Exception as exc:
            self._survived(exc, "the look-up of the next timer")
            return None
        # Only the timer this cycle is for.
        if upcoming is None or abs(upcoming.due - due_db) >= 0.001:
            return None
        return upcoming

    def _local_deadline(self, db_epoch: float) -> float:
        """The trio-clock instant at which the database clock will read ``db_epoch``."""
        return trio.current_time() + (db_epoch - self._clock_offset - time.time())

    def _db_instant(self, deadline: float) -> float:
        """The database clock's reading at the trio-clock instant ``deadline``."""
        return time.time() + (deadline - trio.current_time()) + self._clock_offset

    async def _cycle(self, *, not_before: float | None, announced: store.NextDue | None = None,
                     for_timer: bool = False, handover: ParkedPop | None = None
                     ) -> SweepResult:
        """One sweep statement, started no earlier than ``not_before`` (the database's clock), then
        the broker's fire of whatever it claimed. ``for_timer``: the cycle is planned for a
        timer's due instant (not for the MIN_SLEEP floor, nor to drain a backlog). While a
        backlog drains, the worker thread runs further sweeps back to back (see
        :meth:`_sweep_at`); the last one is returned. ``handover``: the parked pop reserved for
        the announced timer; the sweep pops for it, and it is handed the outcome (None if the
        sweep failed) before anything else."""
        token = uuid.UUID(int=next(self._tokens) & _UUID_MASK)
        # A settlement the reserved pop carries (a stream's last batch, completed whole): the
        # sweep applies it before its pop.
        settle = None if handover is None else handover.settle
        sent = False
        try:
            # First the claims an earlier cycle could not hand back (the database was away).
            # Inside the try: the pop reserved for this cycle waits for its hand-over from
            # the announcement on, and a release that fails too (the database still away)
            # must free it at once, not leave it waiting out HANDOVER_WAIT_S.
            while self._unreleased:
                try:
                    await self._db.run_transaction(store.release, self._unreleased[0])
                except TRANSIENT as exc:
                    if not timed_out(exc):
                        raise
                    # (Too many rows to hand back within the lease: the lease hands them
                    # back as it ends, and asking again would cut off every cycle here.)
                self._unreleased.pop(0)
            sent = True
            swept = await self._sweep(token, not_before, announced, for_timer, handover,
                                      None if settle is None else settle.batch,
                                      drained=handover is not None and handover.watch is not None)
        except BaseException as exc:
            if sent and isinstance(exc, TRANSIENT):
                # The sweep may have committed a claim whose answer never came back (the
                # server died after the commit, or a failover): hand the rows back at the next
                # cycle rather than leave them to wait out the lease.
                self._unreleased.append(token)
            if settle is not None:
                settle.finish(None)  # not known: the stream settles as usual (a repeat is no harm)
            if handover is not None:
                # No answer: the pop pops for itself. (A pop the fire's commit leased to it
                # before the answer was lost gets its batch again when the lease expires.)
                handover.hand(None)
            raise
        if handover is not None:
            first = swept[0][0]
            if settle is not None:
                settle.finish(first.settled)
            if handover.watch is not None and first.drained:
                handover.watch.drained_by = first.backend_pid
            await self._hand_over(handover, first.popped)
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

    async def _sweep(self, token: uuid.UUID, not_before: float | None,
                     announced: store.NextDue | None, for_timer: bool,
                     handover: ParkedPop | None = None,
                     settle: log_store.PopBatch | None = None, *, drained: bool = False,
                     ) -> list[tuple[SweepResult, float]]:
        # The sweep is a single statement: it runs in autocommit (its own transaction; a fire
        # inside it is committed or rolled back as a whole, even if we are cancelled).
        req = None if handover is None else handover.req
        if for_timer or not self._draining:
            # One statement, run from this task: its return is seen (and timed) as it comes
            # back, where a worker thread would queue for the GIL behind the pop it has just
            # served, and it costs no hand-over to a thread and back (under a steady flow, a
            # hundred floor cycles a second: a seventh of the broker's CPU went to those
            # hand-overs), nor a context manager around the pool's connection. Sent straight
            # through libpq (store.sweep_lone): psycopg's cursor path cost the broker twice the
            # CPU of the statement's whole trip (issue 32). A backlog found here is drained by
            # the next cycles, in a worker thread.
            return [await self._sweep_lone(token, not_before, announced, req, settle, drained)]
        async with self._db.connection() as conn:
            # The last sweep came back full (a backlog): in a worker thread, where a drain
            # runs sweeps back to back without queueing behind HTTP tasks for the event
            # loop, and each return is timed where it happens.
            return await conn.run_raw_in_thread(self._sweep_at, not_before, token, announced,
                                                req, settle, drained)

    async def _sweep_lone(self, token: uuid.UUID, not_before: float | None,
                          announced: store.NextDue | None, pop: PopRequest | None,
                          settle: log_store.PopBatch | None = None, drained: bool = False,
                          ) -> tuple[SweepResult, float]:
        """One sweep, from this task (see :meth:`_sweep_at`), answered with the local time it
        returned."""
        s = self._settings
        batch = self._asked = self._batch
        sent = time.monotonic()
        result = await store.sweep_lone(self._db, token, self.owner, batch, s.sweeper_lease_ms,
                                        max_payload=self._max_payload, not_before=not_before,
                                        fire_lock=announced, pop=pop, settle=settle,
                                        drained=drained, pop_sync=s.pop_commit_sync)
        returned_at = time.time()
        self._next_batch_after(batch, result, time.monotonic() - sent)
        return result, returned_at

    def _next_batch_after(self, batch: int, result: SweepResult, took_s: float) -> None:
        """The next sweep's batch, from what a sweep of ``batch`` found (a backlog: larger)
        in ``took_s``, within the cap."""
        s = self._settings
        taken = len(result.fired) + len(result.rows)
        self._took_all = taken >= batch
        self._slowest_s = max(self._slowest_s, took_s)
        self._batch = min(self._cap, next_batch(batch, taken, s.sweeper_batch,
                                                s.sweeper_backlog_batch))

    def _sweep_at(
        self, raw: DictConnection, not_before: float | None, token: uuid.UUID,
        announced: store.NextDue | None = None, pop: PopRequest | None = None,
        settle: log_store.PopBatch | None = None, drained: bool = False,
    ) -> list[tuple[SweepResult, float]]:
        """Sweep in the worker thread, after a sweep came back full (the first statement waits
        for ``not_before`` in the backend). A full batch fired by PostgreSQL means a backlog:
        sweep again at once, here, for up to _DRAIN_SLICE_S, rather than hand back to the event
        loop between batches (its HTTP work would hold every batch up). Stops at the first rows
        claimed for the broker. Answers each sweep with the local time it returned."""
        s = self._settings
        slice_ends = time.monotonic() + _DRAIN_SLICE_S
        swept = []
        while True:
            batch = self._asked = self._batch
            sent = time.monotonic()
            result = store.sweep(raw, token, self.owner, batch, s.sweeper_lease_ms,
                                 max_payload=self._max_payload, not_before=not_before,
                                 fire_lock=announced, pop=pop, settle=settle,
                                 drained=drained, pop_sync=s.pop_commit_sync)
            swept.append((result, time.time()))
            self._next_batch_after(batch, result, time.monotonic() - sent)
            not_before = announced = pop = settle = None
            drained = False
            if (len(result.fired) < batch or result.rows or time.monotonic() >= slice_ends
                    or not self._fire_on()):
                # (An operator's pause stops a drain between two sweeps: the flip's answer
                # waits for this cycle to end.)
                return swept

    async def _hand_over(self, pop: ParkedPop, outcome: log_store.PopOutcome | None) -> None:
        """Give the reserved pop what the fire popped for it. If it has gone meanwhile (its
        client left, or the sweep came too late for it), release the batch at once rather
        than leave it leased to nobody."""
        self._metrics.pop_fire_waits.labels(
            "handed_over" if outcome is not None and outcome.batch is not None
            else "handed_nothing").inc()
        left = pop.hand(outcome)
        if left is None or left.batch is None:
            return
        self._metrics.pop_fire_waits.labels("handed_back").inc()
        try:
            await self._look_up_db.run_transaction(log_store.release_batch, pop.tenant_id,
                                                   left.batch)
        except TRANSIENT as exc:
            log.warning("a fired timer's batch for a pop that has gone stays leased until its "
                        "lease expires: %s", exc)
        except Exception as exc:
            self._survived(exc, "the release of a fired timer's batch for a pop that has gone")

    def _fired_now(self, fired: list[tuple[int, datetime]], committed_at_db: float) -> None:
        """``fired``: (tenant, deliver_at) of each timer just fired. The fire lag is observed
        once per distinct (tenant, deliver_at) with its count: a batch's timers share a few
        instants (a burst's, one), and one observation per timer was half the event loop's
        CPU per timer while a burst drained."""
        lags: dict[int, list[tuple[float, int]]] = {}
        for (tenant_id, at), n in collections.Counter(fired).items():
            lag = (max(0.0, committed_at_db - at.timestamp()), n)
            tenant = lags.get(tenant_id)
            if tenant is None:
                lags[tenant_id] = [lag]
            else:
                tenant.append(lag)
        for tenant_id, observed in lags.items():  # (one call per tenant, not per lag)
            self._metrics.observe_fire_lags(tenant_id, observed)
        self._fired += len(fired)
        self._metrics.timers_fired.inc(len(fired))

    async def _fire(self, token: uuid.UUID, rows: list[Claimed]) -> None:
        settings = self._settings
        budget = {"ceilings": {tid: self._ceiling_for(tid) for tid in {c.tenant_id for c in rows}},
                  "max_attempts": settings.sweeper_max_attempts,
                  "backoff_ms": settings.sweeper_backoff_ms}
        fired = None
        # The one commit that must finish: a shutdown waits for it (bounded), so a fire is
        # either committed or rolled back, never abandoned half-way.
        sent = time.monotonic()
        with trio.move_on_after(_FIRE_TIMEOUT_S, shield=True):
            try:
                fired = await self._fire_batch(token, rows, budget)
            except TRANSIENT:
                await self._release(token)
                raise
            finally:
                self._slowest_s = max(self._slowest_s, time.monotonic() - sent)
        if fired is None:
            log.warning("a fire of %d claimed timers did not finish within %.0f s; they are "
                        "fired again once their lease ends", len(rows), _FIRE_TIMEOUT_S)
            return
        for c, exc in fired.unexpected:
            self._survived(exc, f"the fire of timer {_identity(c)}")
        self._fired_now([(c.tenant_id, c.deliver_at) for c in fired.fired],
                        time.time() + self._clock_offset)
        if fired.failed or fired.dead_lettered:
            self._metrics.timer_failures.labels("permanent").inc(
                len(fired.failed) + len(fired.dead_lettered)
            )
        for c, error in fired.failed:
            log.warning("timer %s failed (attempt %d): %s", _identity(c), c.attempts + 1, error)
        for c, error in fired.dead_lettered:
            log.warning("timer %s dead-lettered after %d attempts: %s", _identity(c),
                        c.attempts + 1, error)
        self._metrics.timers_dead_lettered.inc(len(fired.dead_lettered))
        if fired.lost:
            log.info("%d claimed timers were taken over before we fired them", fired.lost)

    async def _fire_batch(self, token: uuid.UUID, rows: list[Claimed],
                          budget: dict[str, Any]) -> store.FireResult:
        try:
            return await self._db.run_transaction_in_thread(  # decompresses payloads
                store.fire, token, rows, **budget)
        except TRANSIENT:
            raise
        except Exception as exc:
            # Rolled back whole: a row PostgreSQL refused (a payload jsonb cannot hold), or
            # something nobody foresaw. Row by row now, so only the rows at fault spend an
            # attempt.
            log.warning("a fire of %d claimed timers failed as a whole (%s); firing them one "
                        "by one", len(rows), describe(exc))
            return await self._db.run_transaction_in_thread(store.fire_each, token, rows, **budget)

    def _survived(self, exc: BaseException, what: str) -> None:
        survived(log, self.name, what, exc, self._metrics.count_background_error)

    async def _release(self, token: uuid.UUID) -> None:
        """After transient trouble, hand our claimed rows back now rather than at lease end."""
        with trio.move_on_after(2.0):
            try:
                await self._db.run_transaction(store.release, token)
                return
            except TRANSIENT as exc:
                if timed_out(exc):
                    return  # the lease hands them back as it ends (see _cycle)
        self._unreleased.append(token)  # the next cycle tries again


class _Alarm:
    """The sweeper's sleep between cycles on a Linux timerfd: under a steady flow every cycle
    starts after one (at the MIN_SLEEP floor), and trio's sleep, a cancel scope whose
    deadline cancels it, cost the broker ~25 µs more CPU per wake-up than a descriptor
    becoming readable (issue 32). It wakes as trio's would: after the delay counted in whole
    milliseconds, rounded up (trio's wait on epoll counts them so)."""

    def __init__(self, fd: int, settime: Any) -> None:
        self.fd = fd
        self._settime = settime
        self._spec = (ctypes.c_long * 4)()  # struct itimerspec: interval 0, then the value

    @classmethod
    def open(cls) -> _Alarm | None:
        """A timerfd on CLOCK_MONOTONIC (trio's clock counts from it), or None: not Linux,
        a clock of trio's that is not the system's (a test's MockClock), or no timerfd."""
        # (trio.testing is looked up, not imported: it imports pytest, which a broker has no
        # use for; a MockClock exists only if a test imported it.)
        testing = sys.modules.get("trio.testing")
        if sys.platform != "linux" or (
                testing is not None
                and isinstance(trio.lowlevel.current_clock(), testing.MockClock)):
            return None
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            create, settime = libc.timerfd_create, libc.timerfd_settime
        except (OSError, AttributeError):
            return None
        settime.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
        fd = create(_CLOCK_MONOTONIC, os.O_NONBLOCK | os.O_CLOEXEC)
        return None if fd < 0 else cls(fd, settime)

    async def sleep_until(self, deadline: float) -> None:
        """:func:`trio.sleep_until`: a checkpoint, returning once ``deadline`` (trio clock)
        has passed."""
        delay = deadline - trio.current_time()
        if delay <= 0:
            await trio.lowlevel.checkpoint()
            return
        ms = math.ceil(delay * 1000)
        spec = self._spec
        spec[2], spec[3] = ms // 1000, ms % 1000 * 1_000_000
        # (Arming it again also clears an expiry a cancelled sleep left unread.)
        if self._settime(self.fd, 0, spec, None) != 0:
            raise OSError(ctypes.get_errno(), "timerfd_settime failed")
        while True:
            await trio.lowlevel.wait_readable(self.fd)
            try:
                os.read(self.fd, 8)
                return
            except BlockingIOError:
                continue

    def close(self) -> None:
        trio.lowlevel.notify_closing(self.fd)
        os.close(self.fd)


_CLOCK_MONOTONIC = 1


def _drop_waiting(notifications: trio.MemoryReceiveChannel) -> None:
    """Read every notification waiting, without waiting for more."""
    while True:
        try:
            notifications.receive_nowait()
        except trio.WouldBlock:
            return


def _identity(c: Claimed) -> str:
    return f"{c.queue}/{c.key} (tenant {c.tenant_id})"

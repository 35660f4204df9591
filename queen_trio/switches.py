"""Runtime switches: an operator pauses the KV surface, the scheduling of timers or their fire,
while the broker keeps running (Queen's kill switches, PLAN_KV_TIMERS.md §12.1).

Three rows of ``queen.runtime_switches``: ``kv_enabled``, ``timers_schedule_enabled`` and
``timers_fire_enabled``, born on (a missing row counts as on). The operator flips them with
``queen-trio switches pause|resume`` or ``POST /api/v1/system/kv-timers``; both write the
table and NOTIFY ``queen_switches`` in the same transaction.

Every broker keeps the three values in memory and every call reads them there (an attribute
read: nothing on the hot path waits for the database). :meth:`RuntimeSwitches.run` re-reads the
table at once on the NOTIFY (milliseconds after the commit, on every broker of the database)
and at least every :data:`POLL_S` anyway, so a NOTIFY missed while the LISTEN connection was
down, or a row changed by hand in psql, is seen within a second.

What a pause does (Queen's answers):

- ``kv_enabled`` off: every KV route and ``POST /api/v1/locks`` answer 503 ``kv_disabled`` with
  ``Retry-After: 1``; a transaction with a ``kv`` rider answers 403 ``kv_disabled`` (permanent
  on purpose: a bundle carries messages, and retrying it in a loop against a paused cell is a
  storm on the hot path). Stored keys are untouched.
- ``timers_schedule_enabled`` off: schedules (``POST /api/v1/timers`` with a schedule or
  reschedule, ``PUT``) answer 503 ``timers_disabled``; a transaction scheduling in its
  ``timers`` rider answers 403. Cancels and timer reads are never paused: a tenant must always
  be able to stop a message it no longer wants and to see whether it is still pending.
- ``timers_fire_enabled`` off: the sweepers fire nothing; due timers stay pending, nothing is
  lost, and on resume every sweeper wakes at once and fires them, each once. The broker that
  takes the flip answers it only once its own sweeper has no cycle in flight (a cycle started
  before the flip could otherwise still fire a timer scheduled after the answer); the other
  brokers stop within a second, on the NOTIFY.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Iterator
from typing import Final

import trio

from .db import Database, Listener, queries
from .db.rows import DictConnection
from .db.transient import CountError, refresh_on_notify

log = logging.getLogger(__name__)
Q = queries.load("switches")

CHANNEL: Final = "queen_switches"
KV: Final = "kv_enabled"
TIMERS_SCHEDULE: Final = "timers_schedule_enabled"
TIMERS_FIRE: Final = "timers_fire_enabled"
NAMES: Final = (KV, TIMERS_SCHEDULE, TIMERS_FIRE)
# The longest a broker goes without re-reading the table, NOTIFY or not.
POLL_S: Final = 0.5
# What a paused route answers in Retry-After (seconds), as Queen does.
RETRY_AFTER_S: Final = 1

# What each switch stops, for the log line of its flip and the CLI.
EFFECTS: Final = {
    KV: "every KV and locks route answers 503 kv_disabled; a transaction's kv rider is "
        "refused (403); stored keys are untouched",
    TIMERS_SCHEDULE: "new timers are refused (503 timers_disabled; 403 in a transaction); "
                     "pending ones still fire; cancels and reads are never paused",
    TIMERS_FIRE: "due timers are NOT being fired: nothing is lost (they stay pending) and they "
                 "fire, each once, when it is resumed",
}



def read(raw: DictConnection) -> dict[str, bool]:
    """Every switch's state (a switch without a row is on)."""
    state = dict.fromkeys(NAMES, True)
    for row in raw.execute(Q.read).fetchall():
        if row["name"] in state:
            state[row["name"]] = row["enabled"]
    return state


def set_switches(raw: DictConnection, changes: dict[str, bool]) -> dict[str, bool]:
    """Set some switches (in the caller's transaction: every broker is told at its commit) and
    answer them all."""
    for name, enabled in changes.items():
        if name not in NAMES:
            raise ValueError(f"no runtime switch {name!r} (one of {', '.join(NAMES)})")
        raw.execute(Q.set, {"name": name, "enabled": enabled})
    return read(raw)


@dataclasses.dataclass(frozen=True, slots=True)
class SwitchStatistics:
    state: dict[str, bool]
    refreshes: int
    last_refresh_at: float | None  # trio clock


class RuntimeSwitches:
    """This broker's copy of the switches. Start with ``await nursery.start(switches.run)``
    (it follows the NOTIFYs of ``listener``); until then (and in tests that never start it)
    every switch reads as on."""

    name = "switches"

    def __init__(self, db: Database, listener: Listener | None, *,
                 count_error: CountError | None = None,
                 on_change: Callable[[str, bool], None] | None = None) -> None:
        self._listener = listener
        self._alive = False
        self._db = db
        self._count_error = count_error
        self._state = dict.fromkeys(NAMES, True)
        self._changed = trio.Event()  # a fresh one per change (an Event is never cleared)
        self._refreshes = 0
        self._last_refresh_at: float | None = None
        # Told (name, enabled) of every switch at start and at each flip (the metrics gauge).
        self._on_change = on_change
        # Sweeper cycles of this broker in flight (see firing), and the event a waiter for
        # their end holds (made only when somebody waits: nothing per cycle otherwise).
        self._firing = 0
        self._adoptions = 0  # states adopted so far (see refresh)
        self._fire_settled: trio.Event | None = None

    # -- what every call reads ---------------------------------------------------------------

    @property
    def kv(self) -> bool:
        return self._state[KV]

    @property
    def timers_schedule(self) -> bool:
        return self._state[TIMERS_SCHEDULE]

    @property
    def timers_fire(self) -> bool:
        return self._state[TIMERS_FIRE]

    def state(self) -> dict[str, bool]:
        return dict(self._state)

    async def wait_fire_enabled(self) -> None:
        """Return once the fire is on (at once if it is)."""
        while not self._state[TIMERS_FIRE]:
            await self._changed.wait()

    @contextlib.contextmanager
    def firing(self) -> Iterator[None]:
        """Marks a sweeper cycle in flight: it read the fire as on, and may fire until it ends."""
        self._firing += 1
        try:
            yield
        finally:
            self._firing -= 1
            if not self._firing and self._fire_settled is not None:
                self._fire_settled.set()
                self._fire_settled = None

    async def fire_settled(self) -> None:
        """Return once no sweeper cycle of this broker is in flight (at once if none is).
        After a pause, the cycles that start read it, so from then on this broker fires
        nothing."""
        while self._firing:
            if self._fire_settled is None:
                self._fire_settled = trio.Event()
            await self._fire_settled.wait()

    def statistics(self) -> SwitchStatistics:
        return SwitchStatistics(self.state(), self._refreshes, self._last_refresh_at)

    # -- the service -------------------------------------------------------------------------

    @property
    def alive(self) -> bool:
        return self._alive

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        assert self._listener is not None, "RuntimeSwitches(db, listener) runs as a service"
        # Subscribed before the first read: a flip committed in between is not missed.
        with self._listener.subscribe(CHANNEL) as changes:
            await self.refresh()
            if self._on_change is not None:
                for name, enabled in self._state.items():
                    self._on_change(name, enabled)
            self._alive = True
            try:
                task_status.started()
                # A switch changed (or MISSED): read now; the last values stand on an error.
                await refresh_on_notify(changes, self.refresh, period_s=POLL_S, logger=log,
                                        service=self.name, what="the runtime switches",
                                        count=self._count_error)
            finally:
                self._alive = False

    async def refresh(self) -> None:
        adopted = self._adoptions
        state = await self._db.run_autocommit(read)
        # A flip adopted while the read was out (this broker's own route, answered with the
        # committed state) is newer than what the read may have seen: keep it. Adopting the
        # read would un-pause this broker until the flip's NOTIFY is read (a sweep in that
        # window fires while the operator was told it is paused).
        if self._adoptions == adopted:
            self.adopt(state)
        self._refreshes += 1
        self._last_refresh_at = trio.current_time()

    def adopt(self, state: dict[str, bool]) -> None:
        """Take ``state`` as the switches' values; log and announce each flip."""
        self._adoptions += 1
        flipped = {n: v for n, v in state.items() if n in self._state and self._state[n] != v}
        if not flipped:
            return
        self._state.update(flipped)
        changed, self._changed = self._changed, trio.Event()
        changed.set()  # wakes wait_fire_enabled (the sweeper, on resume)
        for name, enabled in flipped.items():
            if enabled:
                log.warning("runtime switch %s is on again", name)
            else:
                log.warning("runtime switch %s is OFF: %s", name, EFFECTS[name])
            if self._on_change is not None:
                self._on_change(name, enabled)

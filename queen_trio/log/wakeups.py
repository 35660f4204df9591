"""Long-poll wake-ups: pops waiting for a queue sleep until a NOTIFY names it.

Pushes (and acks that release a lease) NOTIFY ``queen_log`` with ``<tenant>:<queue>`` inside
their transaction, so every broker hears of it only once it has committed. A waiter takes the
queue's current event before it looks at the database, then sleeps on it: a push that commits
between the look and the sleep has already set that event, so no wake-up is lost. Each event is
set once and replaced, never cleared.

The sweeper also says when a timer is about to fire into a queue (:meth:`announce_fire`).
If a pop is parked on that queue here and can take the frame (:meth:`park`), the sweeper
reserves it and the fire's own transaction pops for it (queen.sweep_timers_and_pop): the
sweeper hands it the popped batch (:meth:`ParkedPop.hand`) when the sweep returns. Else the
queue's waiters are woken ahead of the fire, and the first to :meth:`claim_fire` it waits for
the frame inside PostgreSQL (queen.pop_head_after, schema/functions/log.sql) instead of for
the NOTIFY.
"""

from __future__ import annotations

import dataclasses

import trio

from ..db import MISSED, Listener
from .rules import PopRequest
from .store import NOTIFY_CHANNEL, PopOutcome

# An announced fire nobody claimed is forgotten this long after its due instant.
_EXPECTATION_TTL_S = 0.05


@dataclasses.dataclass(frozen=True, slots=True)
class ExpectedFire:
    due_db: float  # the due instant, epoch seconds on the database's clock
    partition: str
    due_local: float  # the same instant on the trio clock
    expires_at: float  # trio clock


# A reserved pop waits for its hand-over at most this long after the fire's due instant (a
# sweep is late only when the database is); then it pops as usual and the sweeper, finding it
# gone, hands back whatever the fire leased to it.
HANDOVER_WAIT_S = 1.0
# A parked pop is reserved for a fire only if it waits at least this long past the due instant.
_HANDOVER_MARGIN_S = 0.05


@dataclasses.dataclass(eq=False, slots=True)
class ParkedPop:
    """A long-poll parked on a queue that one pop statement can serve (one partition): the
    sweeper may reserve it for a timer about to fire there and hand it the fire's batch
    (unless it acks on delivery, ``autoAck``: see :meth:`QueueWakeups.announce_fire`)."""

    tenant_id: int
    req: PopRequest
    deadline: float  # trio clock: when it answers "nothing"
    key: str = ""
    due_local: float | None = None  # set once reserved: the fire's due instant, trio clock
    gone: bool = False  # it stopped waiting: a batch handed to it now must go back
    handed: trio.Event = dataclasses.field(default_factory=trio.Event)
    outcome: PopOutcome | None = None  # with ``handed``: the sweep's pop (None: no answer)
    wakeups: QueueWakeups | None = None  # where it is parked

    @property
    def reserved(self) -> bool:
        return self.due_local is not None

    def hand(self, outcome: PopOutcome | None) -> PopOutcome | None:
        """The fire's pop, from the sweeper. Answers the outcome back if this pop has gone
        (its batch must then be released), else None."""
        if self.gone:
            return outcome
        self.outcome = outcome
        self.handed.set()
        if self.wakeups is not None:
            self.wakeups.wake(self.key)  # it sleeps on its queue's event
        return None


class QueueWakeups:
    def __init__(self) -> None:
        self._events: dict[str, trio.Event] = {}
        self._expected: dict[str, ExpectedFire] = {}
        self._parked: dict[str, list[ParkedPop]] = {}
        self.waiting = 0
        # Set when the broker begins to shut down: parked long-polls answer "nothing" at once.
        self.stopping = False

    def watch(self, key: str) -> trio.Event:
        """The event the next change to this queue will set."""
        event = self._events.get(key)
        if event is None:
            event = self._events[key] = trio.Event()
        return event

    def wake(self, key: str) -> None:
        event = self._events.pop(key, None)
        if event is not None:
            event.set()

    def expect_fire(self, key: str, partition: str, due_db: float, due_local: float) -> None:
        """A timer due at ``due_db`` (``due_local`` on the trio clock) is about to fire into
        this queue's ``partition``. Only queues somebody is watching keep the news."""
        if key in self._events:
            if len(self._expected) > 1000:  # announced to queues whose waiters left
                now = trio.current_time()
                self._expected = {k: e for k, e in self._expected.items() if e.expires_at >= now}
            self._expected[key] = ExpectedFire(due_db, partition, due_local,
                                               due_local + _EXPECTATION_TTL_S)
            self.wake(key)

    def park(self, key: str, pop: ParkedPop) -> None:
        pop.key, pop.wakeups = key, self
        self._parked.setdefault(key, []).append(pop)

    def unpark(self, pop: ParkedPop) -> None:
        """The pop stops waiting (answered, timed out, or its client left)."""
        pop.gone = True
        parked = self._parked.get(pop.key)
        if parked is not None and pop in parked:
            parked.remove(pop)
            if not parked:
                del self._parked[pop.key]

    def announce_fire(self, key: str, partition: str, due_db: float,
                      due_local: float) -> ParkedPop | None:
        """A timer due at ``due_db`` (``due_local`` on the trio clock) is about to fire into
        this queue's ``partition``: the pop parked longest that can take it is reserved and
        returned (the sweep pops for it), or, if none can, the queue's waiters are told
        (:meth:`expect_fire`)."""
        for pop in self._parked.get(key, ()):
            # Not an autoAck pop: one that stops waiting before the fire commits (it found
            # other messages) could not be given its batch back, and the group would lose it.
            if (not pop.reserved and not pop.req.auto_ack
                    and pop.req.partition in (None, partition)
                    and pop.deadline > due_local + _HANDOVER_MARGIN_S):
                pop.due_local = due_local
                return pop
        self.expect_fire(key, partition, due_db, due_local)
        return None

    def claim_fire(self, key: str) -> ExpectedFire | None:
        """The fire announced for this queue, for one waiter only; None if none is current."""
        expected = self._expected.pop(key, None)
        if expected is None or trio.current_time() > expected.expires_at:
            return None
        return expected

    def stop(self) -> None:
        """Shutdown begins: wake every waiter, and let none park again."""
        self.stopping = True
        self.wake_all()

    def wake_all(self) -> None:
        events, self._events = self._events, {}
        for event in events.values():
            event.set()

    async def run(
        self, listener: Listener, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        with listener.subscribe(NOTIFY_CHANNEL) as notifications:
            task_status.started()
            async for item in notifications:
                if item is MISSED:
                    self.wake_all()  # anything may have changed while we were deaf
                else:
                    self.wake(item.payload)

"""Long-poll wake-ups: pops waiting for a queue sleep until a NOTIFY names it.

Pushes (and acks that release a lease) NOTIFY ``queen_log`` with ``<tenant>:<queue>`` inside
their transaction, so every broker hears of it only once it has committed. A waiter takes the
queue's current event before it looks at the database, then sleeps on it: a push that commits
between the look and the sleep has already set that event, so no wake-up is lost. Each event is
set once and replaced, never cleared.

The sweeper also says when a timer is about to fire into a queue (:meth:`expect_fire`): the
queue's waiters are woken ahead of the fire, and the first to :meth:`claim_fire` it waits for
the frame inside PostgreSQL (queen.pop_head_after, schema/functions/log.sql) instead of for
the NOTIFY.
"""

from __future__ import annotations

import dataclasses

import trio

from ..db import MISSED, Listener
from .store import NOTIFY_CHANNEL

# An announced fire nobody claimed is forgotten this long after its due instant.
_EXPECTATION_TTL_S = 0.05


@dataclasses.dataclass(frozen=True, slots=True)
class ExpectedFire:
    due_db: float  # the due instant, epoch seconds on the database's clock
    partition: str
    due_local: float  # the same instant on the trio clock
    expires_at: float  # trio clock


class QueueWakeups:
    def __init__(self) -> None:
        self._events: dict[str, trio.Event] = {}
        self._expected: dict[str, ExpectedFire] = {}
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

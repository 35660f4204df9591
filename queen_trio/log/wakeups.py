"""Long-poll wake-ups: pops waiting for a queue sleep until a NOTIFY names it.

Pushes (and acks that release a lease) NOTIFY ``queen_log`` with ``<tenant>:<queue>`` inside
their transaction, so every broker hears of it only once it has committed. A waiter takes the
queue's current event before it looks at the database, then sleeps on it: a push that commits
between the look and the sleep has already set that event, so no wake-up is lost. Each event is
set once and replaced, never cleared.
"""

from __future__ import annotations

import trio

from ..db import MISSED, Listener
from .store import NOTIFY_CHANNEL


class QueueWakeups:
    def __init__(self) -> None:
        self._events: dict[str, trio.Event] = {}
        self.waiting = 0

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

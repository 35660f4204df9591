"""The cyclic garbage collector's pauses, as the broker's metrics show them.

A collection stops the event loop, the sweeper included, while it walks the objects it tracks:
a young one costs well under a millisecond, a full one with thousands of parked polls can cost
half a second (RELIABILITY.md, section 7). ``queen_gc_pause_seconds{generation}`` makes those
pauses visible, so that a fire-lag outlier can be matched with a collection.
"""

from __future__ import annotations

import dataclasses
import gc
import time
from typing import Any

import trio

from .metrics import BrokerMetrics


def freeze_startup_objects() -> None:
    """Keep the collector off what start-up built and the process keeps.

    A started broker holds some 50,000 tracked objects (modules, the app, the pools): walked by
    each full collection, they stopped the event loop and the sweeper for 25-50 ms (measured at
    1,000 timers/s: a 66 ms fire lag where the rest stayed under 12 ms). Frozen, they are never
    walked again; collections see only what was made since."""
    gc.collect()
    gc.freeze()


class PauseObserver:
    """A ``gc.callbacks`` entry timing each collection into the broker's metrics.

    Observing from inside the callback is safe: the histogram's lock guards float arithmetic
    only, which allocates nothing the collector tracks, so no collection can start under it."""

    def __init__(self, metrics: BrokerMetrics) -> None:
        self._metrics = metrics
        self._started: float | None = None
        self.collections = 0
        self.unrecorded = 0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started is not None:
            seconds, self._started = time.perf_counter() - self._started, None
            self.collections += 1
            try:
                self._metrics.observe_gc_pause(info["generation"], seconds)
            except RecursionError:
                # The collection ran in a frame at the stack's limit (a deeply nested body
                # being parsed, which the parser then refuses): no room to record it. Python
                # would print the error as "Exception ignored" into the broker's log.
                self.unrecorded += 1


@dataclasses.dataclass(frozen=True, slots=True)
class GcPauseStatistics:
    collections: int  # timed since the service started


class GcPauses:
    """A service of the broker's nursery: collections are timed while the broker runs."""

    name = "gc_pauses"

    def __init__(self, metrics: BrokerMetrics) -> None:
        self._observer = PauseObserver(metrics)
        self._alive = False

    @property
    def alive(self) -> bool:
        return self._alive

    def statistics(self) -> GcPauseStatistics:
        return GcPauseStatistics(self._observer.collections)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        gc.callbacks.append(self._observer)
        self._alive = True
        try:
            task_status.started()
            await trio.sleep_forever()
        finally:
            self._alive = False
            gc.callbacks.remove(self._observer)

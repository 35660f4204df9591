"""Concurrent client loops timed together: warm-up calls first, then a fixed measured time."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from bench.harness.cpu import CpuMeter


@dataclasses.dataclass
class TimedRun:
    """What ``timed_loop`` saw over its measured time."""

    requests: int
    failed: int
    items: int  # what the successful requests carried (messages, timers)
    latencies: list[float]  # seconds, of the successful requests
    elapsed: float  # clock start to the last successful answer
    start: float  # perf_counter at the clock start
    cpu_before: dict[str, float]

    def cores(self, meter: Any) -> dict[str, float]:
        """Cores per party from the clock start until now."""
        return CpuMeter.cores(self.cpu_before, meter.snapshot(), time.perf_counter() - self.start)


async def timed_loop(meter: Any, clients: int, seconds: float, warmup: int,
                     prepare: Callable[[int, int], Any],
                     request: Callable[[Any], Awaitable[int | None]]) -> TimedRun:
    """``clients`` loops; call n of client c is ``request(prepare(c, n))``, only the request
    timed. ``request`` returns how many items it carried, or None on failure. Each client makes
    ``warmup`` calls; once all have, the CPU meter is read and the clock runs for ``seconds``
    (a request started before the stop counts)."""
    latencies: list[float] = []
    counters = {"requests": 0, "failed": 0, "items": 0}
    clock: dict[str, float] = {}
    started = trio.Event()
    warmed = [0]
    cpu: dict[str, dict[str, float]] = {}

    async def client(c: int) -> None:
        n = 0
        while True:
            if n == warmup:
                warmed[0] += 1
                if warmed[0] == clients:
                    cpu["before"] = meter.snapshot()
                    clock["start"] = time.perf_counter()
                    clock["stop"] = clock["start"] + seconds
                    started.set()
                await started.wait()
            measuring = n >= warmup
            if measuring and time.perf_counter() >= clock["stop"]:
                return
            arg = prepare(c, n)
            t0 = time.perf_counter()
            carried = await request(arg)
            t1 = time.perf_counter()
            if measuring:
                counters["requests"] += 1
                if carried is None:
                    counters["failed"] += 1
                else:
                    latencies.append(t1 - t0)
                    counters["items"] += carried
                    clock["end"] = max(clock.get("end", t1), t1)
            n += 1

    async with trio.open_nursery() as nursery:
        for c in range(clients):
            nursery.start_soon(client, c)
    return TimedRun(counters["requests"], counters["failed"], counters["items"], latencies,
                    clock.get("end", clock["start"]) - clock["start"], clock["start"],
                    cpu["before"])

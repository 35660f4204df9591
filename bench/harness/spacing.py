"""Due instants kept apart: what "idle" means in the README's figures and the timer issues.

An idle broker sees timers come due one at a time. Random delays alone do not give that: two
timers due a few milliseconds apart make the second wait for QUEEN_SWEEPER_MIN_SLEEP_MS after
the first one's sweep, which is the contract's floor between cycles, not wake-up latency. The
idle scenarios therefore draw each delay again until its due instant is at least ``gap_s`` from
every other due instant of the run (the steady scenarios measure the packed case).
"""

from __future__ import annotations

import bisect
import random

# Two and a half default MIN_SLEEPs: room for the due instants' own jitter (the broker adds the
# delay to PostgreSQL's clock when the PUT arrives, a millisecond or two after we draw it).
IDLE_GAP_S = 0.025


class SpacedDelays:
    def __init__(self, rng: random.Random, delay_ms: tuple[int, int], gap_s: float = IDLE_GAP_S):
        self._rng = rng
        self._delay_ms = delay_ms
        self._gap_s = gap_s
        self._dues: list[float] = []  # sorted

    def draw(self, now: float) -> int:
        """A delay (ms) whose due instant, counted from ``now`` (epoch s), keeps the gap."""
        for _ in range(10_000):
            delay = self._rng.randint(*self._delay_ms)
            due = now + delay / 1000
            at = bisect.bisect_left(self._dues, due)
            if all(abs(due - self._dues[i]) >= self._gap_s
                   for i in (at - 1, at) if 0 <= i < len(self._dues)):
                self._dues.insert(at, due)
                return delay
        raise RuntimeError("no delay keeps the due instants apart: too many timers pending")

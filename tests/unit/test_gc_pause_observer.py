"""The collector's callback (queen_trio/gc_pauses.py) never raises: a collection that runs in
a frame at the stack's limit (a deeply nested body being parsed) is counted but not recorded,
where recording it raised RecursionError, which Python printed into the broker's log as an
"Exception ignored" traceback (tests/hostile/test_stream_messages.py caught one)."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest
from prometheus_client import generate_latest

from queen_trio.gc_pauses import PauseObserver
from queen_trio.metrics import BrokerMetrics


def pauses(metrics: BrokerMetrics, generation: int) -> float:
    text = generate_latest(metrics.registry).decode()
    line = f'queen_gc_pause_seconds_count{{generation="{generation}"}} '
    return float(text.split(line, 1)[1].split("\n", 1)[0]) if line in text else 0.0


@pytest.fixture
def shallow_stack() -> Iterator[int]:
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(300)
    try:
        yield 300
    finally:
        sys.setrecursionlimit(limit)


def test_a_collection_at_the_stack_limit_is_counted_not_raised(shallow_stack: int) -> None:
    metrics = BrokerMetrics()
    observer = PauseObserver(metrics)

    def deep(n: int) -> None:
        if n:
            deep(n - 1)
            return
        observer("start", {"generation": 0})
        observer("stop", {"generation": 0})  # no room left for the histogram's own calls

    # From too deep to call the observer at all, up to the first depth at which it returns:
    # there, the histogram had no room (before the fix, its RecursionError came out here).
    for depth in range(shallow_stack, 0, -1):
        try:
            deep(depth)
        except RecursionError:
            continue
        break
    assert (observer.collections, observer.unrecorded) == (1, 1)
    assert pauses(metrics, 0) == 0
    observer("start", {"generation": 0})
    observer("stop", {"generation": 0})  # with room again: recorded
    assert (observer.collections, observer.unrecorded) == (2, 1)
    assert pauses(metrics, 0) == 1

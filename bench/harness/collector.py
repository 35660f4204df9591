"""The benchmark client's own garbage collector, kept out of the measurements.

A bench process keeps a record per timer (30,000 in a steady run, 100,000 in a burst) and its
long-poll consumer runs on the same event loop: a full collection walking those records stopped
the consumer for 35-115 ms (gc callbacks during ``bench.fire_lag --scenario steady``), which
showed up as end-to-end lag that no broker had caused. A scenario runs with the collector off;
its cycles are collected once it is over. (The broker freezes its own start-up objects:
``queen_trio.server``.)
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.collect()

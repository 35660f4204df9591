"""bench.harness.cpu: a process tree's CPU, read from /proc while children come and go, never
goes down between two snapshots (a backend reaped mid-walk was lost, or counted twice)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from bench.harness.cpu import children_of, proc_stats, tree_ticks

# A child that burns about 30 ms of CPU, then exits.
_BURN = "import time\nend = time.process_time() + 0.03\nwhile time.process_time() < end: pass"


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc")
def test_a_tree_with_children_exiting_never_loses_cpu() -> None:
    stop = threading.Event()

    def churn() -> None:
        while not stop.is_set():
            subprocess.run([sys.executable, "-c", _BURN], check=True)

    def tree() -> float:
        stats = proc_stats()
        return tree_ticks(stats, children_of(stats), [os.getpid()])

    churners = [threading.Thread(target=churn) for _ in range(2)]
    for t in churners:
        t.start()
    readings = []
    try:
        for _ in range(300):
            readings.append(tree())
    finally:
        stop.set()
        for t in churners:
            t.join()
    drops = [(a, b) for a, b in zip(readings, readings[1:], strict=False) if b < a]
    assert not drops, f"{len(drops)} of {len(readings) - 1} readings went down: {drops[:5]}"

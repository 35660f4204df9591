"""bench.harness.cpu: a process tree's CPU, read from /proc while children come and go, never
goes down between two snapshots (a backend reaped mid-walk was lost, or counted twice)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.harness.cpu import children_of, proc_stats, tree_ticks

# A process whose four threads each start, one after another, children that burn about 30 ms
# of CPU and exit: a tree of its own (the test process's holds the test session's PostgreSQL,
# whose backends come and go with the other tests).
_CHURN = """
import subprocess, sys, threading
BURN = "import time\\nend = time.process_time() + 0.03\\nwhile time.process_time() < end: pass"
def churn():
    while True:
        subprocess.run([sys.executable, "-c", BURN], check=True)
for _ in range(4):
    threading.Thread(target=churn, daemon=True).start()
print("ready", flush=True)
sys.stdin.read()
"""


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc")
def test_a_tree_with_children_exiting_never_loses_cpu() -> None:
    churner = subprocess.Popen([sys.executable, "-c", _CHURN], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    try:
        assert churner.stdout is not None and churner.stdout.readline().strip() == "ready"

        def tree() -> float:
            stats = proc_stats()
            return tree_ticks(stats, children_of(stats), [churner.pid])

        readings = [tree() for _ in range(400)]
    finally:
        churner.kill()
        churner.wait()
    drops = [(a, b) for a, b in zip(readings, readings[1:], strict=False) if b < a]
    assert readings[-1] > readings[0]  # (children did run and exit meanwhile)
    assert not drops, f"{len(drops)} of {len(readings) - 1} readings went down: {drops[:5]}"

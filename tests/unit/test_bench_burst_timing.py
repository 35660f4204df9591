"""bench.timer_scale times a burst's drain by its batches' own instants: from the first batch's
append to the last's, over the timers of every batch but the first."""

from __future__ import annotations

from bench.timer_scale import batch_timing


def test_drain_per_timer_from_the_batch_instants() -> None:
    # 500, then 2,000, then 5,000 a batch every 0.1 s (20 µs a timer), a last partial batch.
    stamps = [(100.0, 500), (100.04, 2000)] + [(100.04 + 0.1 * i, 5000) for i in range(1, 20)]
    stamps.append((102.04 + 0.05, 2500))
    n = sum(c for _, c in stamps)
    t = batch_timing(stamps, n)
    assert t["us_per_timer"] == round((102.09 - 100.0) / (n - 500) * 1e6, 2)
    assert t["batches"] == len(stamps) and t["first_batch"] == 500
    assert t["batch_us_per_timer"]["p50"] == 20.0  # 0.1 s / 5,000 timers
    assert len(t["tenths_us_per_timer"]) == 10


def test_no_figure_from_batches_that_do_not_add_up() -> None:
    # Frames sealed away (or another burst's mixed in): the polled figure stands alone.
    assert batch_timing([(1.0, 10), (2.0, 10), (3.0, 10)], 100) == {}

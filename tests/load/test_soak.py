"""The soak of bench/soak.py, 40 seconds of it, in CI (the 10-minute run is in RELIABILITY.md):
two brokers, 16 clients scheduling, cancelling, pushing and popping; nothing lost or
duplicated, no unexpected answer, fire lag p99 within target, broker RSS flat."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import soak

pytestmark = pytest.mark.slow


def test_a_40_second_soak_loses_nothing_and_holds_memory_and_lag(
    database_url: str, tmp_path: Path
) -> None:
    out = tmp_path / "soak.json"
    # Fire lag p99 at most 750 ms here, not the soak's 300 ms: in CI the soak shares two cores
    # with the other test worker (at load ~10 one broker's p99 reached the 500 ms bucket, p50
    # 75-100 ms). What the bound is for still fails it: a wake-up bug waits up to MAX_SLEEP
    # (1 s), a p99 in the 1 s bucket. RELIABILITY.md's 300 ms is the quiet 10-minute run's.
    code = soak.main(["--seconds", "40", "--database-url", database_url, "--json", str(out),
                      "--lag-p99-ms", "750"])
    result = json.loads(out.read_text())
    print(f"\nsoak: {result['requests']} requests, {result['timers_scheduled']} timers "
          f"({result['timers_cancelled']} cancelled), {result['messages_pushed']} messages; "
          f"lost {result['timers_lost']}+{result['messages_lost']}, fire lag p99 <= "
          f"{result['fire_lag_p99_s_bucket']} s, RSS {result['rss_mib_warm']} -> "
          f"{result['rss_mib_end']} MiB")
    nothing_lost = ("timers_lost", "timers_duplicated", "cancelled_but_fired", "messages_lost",
                    "messages_duplicated")
    assert [result[k] for k in nothing_lost] == [0] * 5, result
    assert result["failures"] == [] and code == 0, result
    # The load was real: both paths of the fire, cancels that raced it, the log.
    assert result["timers_scheduled"] > 1000 and result["messages_pushed"] > 5000, result
    assert result["cancel_answers"].get("cancelled", 0) > 0, result


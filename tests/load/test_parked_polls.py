"""3,000 parked long-polls against a broker process (bench/parked_polls.py, which has the tight
targets and the figures in RELIABILITY.md): while they wait, nothing they are parked for
happens, so the database sees no look from them, a single push stays fast, /health stays 200;
each is answered by its deadline, and nothing pushed is lost. Bounds here are wide: the machine
is shared."""

from __future__ import annotations

import json
from typing import Any

import pytest

from bench import parked_polls

from ..pgserver import Databases

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

POLLS = 3000
# The polls' timeout, so that all of them are parked at once through the quiet spell and the
# pushes. They are answered at their deadline, so it is most of the test's time: on a quiet
# machine parking takes about 20 s and the steps after it (11 s for PostgreSQL's counts, 5 s
# quiet, 300 pushes) about 20 s more, so 55 s leave a wide margin. On a loaded machine
# (parking a minute) that is not enough: a run whose steps were not done 3 s before the first
# poll's deadline (or that did not park every poll within PARK_WITHIN_S) is set aside, checked
# for nothing, and the test runs again, on a fresh database, with the 90 s it always had.
QUICK = {"timeout_ms": 55_000, "park_within_s": 30.0}
ROOMY = {"timeout_ms": 90_000, "park_within_s": 80.0}
SLACK_S = 3.0


async def run(database_url: str, timing: dict[str, Any]) -> dict[str, Any]:
    result = await parked_polls.run(database_url, polls=POLLS, queues=30, quiet_s=5.0,
                                    pushes=300, margin_s=5.0, **timing)
    print(f"\nparked polls: {json.dumps(result)}")
    return result


async def test_3000_parked_polls_cost_nothing_while_nothing_changes(
    database_url: str, databases: Databases
) -> None:
    result = await run(database_url, QUICK)
    if result["parked"] < POLLS or result["first_deadline_left_s"] < SLACK_S:
        print(f"too slow for {QUICK}: again with {ROOMY}")
        roomy_url = databases.create()
        try:
            result = await run(roomy_url, ROOMY)
        finally:
            databases.drop(roomy_url)
    assert result["first_deadline_left_s"] >= 0, result  # every poll parked throughout
    assert result["parked"] == POLLS, result
    # While they wait, nothing concerns them: none looks at the database, but for the safety
    # net (each queue's lane at most once in 30 s: 30 lanes, 5 s). PostgreSQL counts only the
    # broker's own services then (sweeper, housekeeping, usage: a few per second); the polls
    # re-querying once a second made it 1,400-2,900 (as many as the pool could carry).
    idle = result["idle"]
    assert idle["db_transactions_per_s"] < 60, idle
    looks = idle["longpoll_looks_per_s"]
    assert isinstance(looks, dict), idle
    assert sum(v for k, v in looks.items() if k != "safety") == 0, idle
    assert looks["safety"] * idle["seconds"] <= 30, idle
    # A single push meanwhile: p99 under 250 ms here (the target, 50 ms, is the bench's).
    assert result["push_with_crowd_parked_ms"]["n"] == 300, result
    assert result["push_with_crowd_parked_ms"]["p99"] < 250, result
    assert set(result["health"]) == {"200"}, result
    # Every poll answered, by its deadline plus 5 s; each push into the crowd woke one.
    assert result["unanswered_polls"] == 0 and result["late_polls"] == 0, result
    assert set(result["poll_answers"]) <= {"200", "204"}, result
    messages = result["messages"]
    assert (messages["lost"], messages["duplicated"]) == (0, 0), messages
    assert messages["received_by_polls"] == messages["pushed"] == 30, messages

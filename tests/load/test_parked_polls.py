"""3,000 parked long-polls against a broker process (bench/parked_polls.py, which has the tight
targets and the figures in RELIABILITY.md): while they wait, nothing they are parked for
happens, so the database sees no look from them, a single push stays fast, /health stays 200;
each is answered by its deadline, and nothing pushed is lost. Bounds here are wide: the machine
is shared."""

from __future__ import annotations

import json

import pytest

from bench import parked_polls

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

POLLS = 3000


async def test_3000_parked_polls_cost_nothing_while_nothing_changes(database_url: str) -> None:
    # Parking 3,000 takes 20 s on a quiet machine, a minute when others load it: the polls
    # wait long enough for all of them to be parked at once.
    result = await parked_polls.run(database_url, polls=POLLS, queues=30, timeout_ms=90_000,
                                    quiet_s=5.0, pushes=300, margin_s=5.0,
                                    park_within_s=80.0)
    print(f"\nparked polls: {json.dumps(result)}")
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

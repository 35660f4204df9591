"""The service contract (queen_trio/services.py) as a periodic service keeps it: alive while it
runs, its rounds and failed rounds in its statistics, a failure counted under its name and
survived."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from queen_trio.errors import DatabaseUnavailable
from queen_trio.services import Periodic, Service


async def test_a_periodic_service_counts_its_rounds_and_survives_failures(
    autojump_clock: trio.testing.MockClock,
) -> None:
    outcomes = [None, DatabaseUnavailable("away"), ValueError("a bad row"), None]
    counted: list[str] = []

    async def step() -> None:
        outcome = outcomes.pop(0) if outcomes else None
        if outcome is not None:
            raise outcome

    service: Service = Periodic("kv_purger", 1.0, step, what="KV purge",
                                count_error=counted.append, at_once=True)
    assert not service.alive
    async with trio.open_nursery() as nursery:
        start = trio.current_time()
        await nursery.start(service.run)
        assert service.alive
        # Rounds at 0, 1 (transient trouble), 2 (an error it survives), 3, 4.
        await trio.sleep(4.5)
        stats = service.statistics()
        nursery.cancel_scope.cancel()
    assert not service.alive
    assert (stats.rounds, stats.failed_rounds) == (5, 2)
    assert stats.last_round_at == pytest.approx(start + 4.0)
    assert counted == ["kv_purger"]  # only the error that was not transient trouble

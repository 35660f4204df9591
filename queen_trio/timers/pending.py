"""The pending gauge: keeps ``queen_timers_pending`` current."""

from __future__ import annotations

from ..db import Database
from ..db.transient import Periodic
from ..metrics import BrokerMetrics
from . import store

PENDING_REFRESH_S = 5.0


def pending_gauge(db: Database, metrics: BrokerMetrics, *,
                  interval_s: float = PENDING_REFRESH_S) -> Periodic:
    """Every pending timer counted, every ``interval_s`` (the first at once), on the API's
    connections. Not in the sweeper's own loop: with a million timers pending the count takes
    20-30 ms (longer before a vacuum), and the sweeper would fire nothing meanwhile."""
    async def count() -> None:
        metrics.timers_pending.set(await db.run_transaction(store.pending_count))

    return Periodic("pending_gauge", interval_s, count, what="pending-timers count",
                    count_error=metrics.count_background_error, at_once=True)

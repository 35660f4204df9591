"""The KV purger: deletes expired keys in the background (reads never see them already)."""

from __future__ import annotations

import trio

from ..db import Database
from ..db.transient import CountError, Periodic
from .store import PURGE_BATCH, purge_expired

PURGE_INTERVAL_S = 5.0


def purger(db: Database, *, interval_s: float = PURGE_INTERVAL_S,
           count_error: CountError | None = None) -> Periodic:
    """The service: expired keys deleted in batches every ``interval_s`` (they are already
    invisible to reads)."""
    async def purge() -> None:
        while await db.run_transaction(purge_expired) == PURGE_BATCH:
            await trio.lowlevel.checkpoint()

    return Periodic("kv_purger", interval_s, purge, what="KV purge", count_error=count_error)

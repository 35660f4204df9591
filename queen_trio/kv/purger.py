"""The KV purger: deletes expired keys in the background (reads never see them already)."""

from __future__ import annotations

import trio

from ..db import Database
from ..db.transient import CountError, every
from .store import PURGE_BATCH, purge_expired

PURGE_INTERVAL_S = 5.0


async def run_purger(
    db: Database, *, interval_s: float = PURGE_INTERVAL_S,
    count_error: CountError | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Housekeeping: delete expired keys in batches (they are already invisible to reads)."""
    async def purge() -> None:
        while await db.run_transaction(purge_expired) == PURGE_BATCH:
            await trio.lowlevel.checkpoint()

    task_status.started()
    await every(interval_s, purge, what="KV purge", service="kv_purger",
                count_error=count_error)

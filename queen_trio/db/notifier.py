"""NOTIFYs sent after the commit they announce, several in one statement.

A transaction that NOTIFYs takes a database-wide lock at commit and holds it until its commit
record is flushed (PostgreSQL's async.c, PreCommit_Notify): every other notifying
transaction waits for it, so their commits cannot share a WAL flush. Concurrent pushes that
each NOTIFY their queue inside their own transaction therefore commit one fsync at a time:
on this VM 20 connections committing an insert managed ~2,000 transactions/s without the
NOTIFY and ~230-370 with it (``bench.sched_path --notify``).

So a route whose NOTIFY is only a wake-up hint hands it here once its transaction has
committed (the change is visible before anyone is woken, as before). One task sends whatever
is waiting in one statement, each (channel, payload) once, with ``synchronous_commit`` off:
the lock is held for a commit that does not wait for the disk, and a hint lost to a crash is
what listeners already recover from (a reconnect delivers MISSED; lanes recheck anyway).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import psycopg
import trio

from .pool import Database
from .transient import TRANSIENT_ERRORS, CountError, survived

log = logging.getLogger(__name__)

# Coalesced notifications waiting at most this many at once; past it the oldest go first,
# and a flood of distinct payloads costs one statement per this many.
MAX_PER_STATEMENT = 1000
# After a failed send the hints are kept and sent again this much later.
RETRY_S = 0.1

_SEND = """
SELECT count(pg_notify(u.channel, u.payload))
FROM (SELECT set_config('synchronous_commit', 'off', true)) AS asynchronous,
     unnest(%(channels)s::text[], %(payloads)s::text[]) AS u(channel, payload)
"""


def _send(raw: psycopg.Connection[Any], pending: list[tuple[str, str]]) -> None:
    raw.execute(_SEND, {"channels": [c for c, _ in pending], "payloads": [p for _, p in pending]})


@dataclasses.dataclass(frozen=True, slots=True)
class NotifierStatistics:
    statements: int  # statements sent
    sent: int  # notifications those statements carried
    pending: int  # waiting to be sent


class Notifier:
    """``notify(channel, payload)`` after a commit; ``await nursery.start(notifier.run)``."""

    name = "notifier"

    def __init__(self, db: Database, *, count_error: CountError | None = None) -> None:
        self._alive = False
        self._db = db
        self._count_error = count_error
        self._pending: dict[tuple[str, str], None] = {}  # insertion-ordered set
        self._wake = trio.Event()
        self.statements = 0  # statements sent, for tests and diagnostics
        self.sent = 0  # notifications those statements carried

    def notify(self, channel: str, payload: str) -> None:
        """Send ``pg_notify(channel, payload)`` soon; the same pair pending twice goes once."""
        self._pending[(channel, payload)] = None
        self._wake.set()

    @property
    def alive(self) -> bool:
        return self._alive

    def statistics(self) -> NotifierStatistics:
        return NotifierStatistics(self.statements, self.sent, len(self._pending))

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        self._alive = True
        try:
            task_status.started()
            await self._send_forever()
        finally:
            self._alive = False

    async def _send_forever(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            while self._pending:
                batch = list(self._pending)[:MAX_PER_STATEMENT]
                for key in batch:
                    del self._pending[key]
                try:
                    await self._db.run_autocommit(_send, batch)
                except TRANSIENT_ERRORS as exc:
                    log.warning("wake-up hints not sent yet: %s", str(exc).strip())
                    self._pending = dict.fromkeys([*batch, *self._pending])
                    await trio.sleep(RETRY_S)
                    continue
                except Exception as exc:  # noqa: BLE001 - a hint is never worth the broker
                    survived(log, self.name, "sending wake-up hints", exc, self._count_error)
                    await trio.sleep(RETRY_S)
                    continue
                self.statements += 1
                self.sent += len(batch)

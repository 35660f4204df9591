"""Single-timer schedules that arrive together share one statement and one commit.

A lone PUT of a timer costs PostgreSQL about a millisecond of CPU, nearly all of it per
statement and per commit (function entry, planning, the WAL flush); a statement of 30 timers
costs some 70 µs a timer (bench: ``python -m bench.timer_lag --scenario schedule``). So schedules
are not sent one by one: a writer takes every schedule that is waiting when it is free and sends
them in one ``queen.schedule_timers`` statement, which decides each timer under its own row lock
in arrival order (the same key twice in one batch is scheduled, then rescheduled, exactly as two
PUTs one after the other). Each caller waits for its batch's commit, so its answer still means
"durable". With nothing else waiting a schedule goes alone and at once: batching costs no
latency, it only stops concurrent schedules from queueing for a statement each.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Iterator

import trio

from ..db import Database
from ..errors import DatabaseUnavailable
from . import store
from .rules import Schedule
from .store import Outcome

log = logging.getLogger(__name__)

# Timers per statement: large enough that the per-statement cost vanishes, small enough that a
# batch's commit is not held up by its own size.
MAX_BATCH = 64
# Batches in flight at once: while one commits, the next is collected and sent.
WRITERS = 2


@dataclasses.dataclass(eq=False)
class _Request:
    tenant_id: int
    schedule: Schedule
    done: trio.Event = dataclasses.field(default_factory=trio.Event)
    outcome: Outcome | None = None
    error: Exception | None = None

    def answer(self, outcome: Outcome) -> None:
        self.outcome = outcome
        self.done.set()

    def fail(self, error: Exception) -> None:
        self.error = error
        self.done.set()


class ScheduleBatcher:
    """Start it with ``await nursery.start(batcher.run)``; then ``await batcher.schedule(...)``."""

    def __init__(self, db: Database, *, notify_within_ms: int, max_batch: int = MAX_BATCH):
        self._db = db
        self._notify_within_ms = notify_within_ms
        self._max_batch = max_batch
        self._send, self._receive = trio.open_memory_channel[_Request](math.inf)
        self.batches = 0  # statements sent, for tests and diagnostics
        self.scheduled = 0

    async def schedule(self, tenant_id: int, s: Schedule) -> Outcome:
        """Create or replace one timer; answers once the statement carrying it has committed."""
        request = _Request(tenant_id, s)
        self._send.send_nowait(request)
        await request.done.wait()
        if request.error is not None:
            raise request.error
        assert request.outcome is not None
        return request.outcome

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            for _ in range(WRITERS):
                nursery.start_soon(self._writer, self._receive.clone())
            task_status.started()

    async def _writer(self, receive: trio.MemoryReceiveChannel[_Request]) -> None:
        async for first in receive:
            batch = [first]
            while len(batch) < self._max_batch:
                try:
                    batch.append(receive.receive_nowait())
                except trio.WouldBlock:
                    break
            for tenant_id, requests in _by_tenant(batch):
                try:
                    await self._write(tenant_id, requests)
                except Exception as exc:  # noqa: BLE001 - never take the broker down for one batch
                    log.exception("schedule batch failed unexpectedly")
                    for r in requests:
                        if not r.done.is_set():
                            r.fail(exc)

    async def _write(self, tenant_id: int, requests: list[_Request]) -> None:
        self.batches += 1
        try:
            if len(requests) == 1:
                outcomes = [await self._one(tenant_id, requests[0].schedule)]
            else:
                outcomes = await self._db.run_statement(
                    store.schedule_many, tenant_id, [r.schedule for r in requests],
                    notify_within_ms=self._notify_within_ms)
        except DatabaseUnavailable as exc:
            for r in requests:
                r.fail(DatabaseUnavailable(str(exc)))
            return
        except Exception as exc:  # noqa: BLE001 - one timer's failure must not fail the batch
            if len(requests) == 1:
                requests[0].fail(exc)
                return
            for r in requests:  # find out whose it is: each timer again, on its own
                try:
                    r.answer(await self._one(tenant_id, r.schedule))
                except Exception as own:  # noqa: BLE001 - handed to that timer's caller
                    r.fail(own)
            return
        if len(outcomes) != len(requests):
            raise RuntimeError(f"{len(outcomes)} answers for {len(requests)} timers")
        self.scheduled += len(requests)
        for r, outcome in zip(requests, outcomes, strict=True):
            r.answer(outcome)

    async def _one(self, tenant_id: int, s: Schedule) -> Outcome:
        return await self._db.run_statement(
            store.schedule, tenant_id, s, notify_within_ms=self._notify_within_ms)


def _by_tenant(batch: list[_Request]) -> Iterator[tuple[int, list[_Request]]]:
    """The batch split by tenant (one statement serves one tenant), arrival order kept."""
    groups: dict[int, list[_Request]] = {}
    for r in batch:
        groups.setdefault(r.tenant_id, []).append(r)
    yield from groups.items()

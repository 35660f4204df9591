"""Schedules that arrive together share one statement and one commit.

A lone PUT of a timer costs PostgreSQL about half a millisecond of CPU, nearly all of it per
statement and per commit (the WAL flush); a timer in a statement of hundreds some 30-40 µs
(``bench/results/timer_pg_cost.md``). So schedules
are not sent one by one: a writer takes every schedule that is waiting when it is free and sends
them in one ``queen.schedule_timer_list`` statement, which decides each timer under its own row lock
in arrival order (the same key twice in one batch is scheduled, then rescheduled, exactly as two
PUTs one after the other). Each caller waits for its batch's commit, so its answer still means
"durable". With nothing else being written a schedule goes alone and at once, from its own
request's task (no hand-over to a writer): batching costs no latency, it only stops concurrent
schedules from queueing for a statement each.

A request may carry several timers (a ``POST /api/v1/timers`` batch): they travel in the same
statement as whatever else is waiting, and commit with it or not at all. Statements are capped
by timers (:data:`MAX_TIMERS`) as well as by requests; a request is never split. A request of
:data:`ALONE` timers or more already spreads a statement's fixed cost thinly: it is sent at once
in its own statement, on its own pool connection. Merged, it would only wait for the others'
timers (four 256-op batches in one statement each answer after all 1,024 are written) and leave
the pool's other connections idle: ``POST /api/v1/timers`` at 256 ops a call then scheduled
fewer timers a second than 500-timer transaction bundles, which never wait for each other.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Iterator

import trio

from ..db import Database
from ..errors import DatabaseUnavailable
from ..sealing import PayloadCipher
from . import store
from .rules import Schedule
from .store import Outcome

log = logging.getLogger(__name__)

# Requests per statement: large enough that the per-statement cost vanishes, small enough that
# a batch's commit is not held up by its own size.
MAX_BATCH = 64
# Timers per statement, when requests carry several: beyond a thousand or so the statement's
# own duration outweighs what one more commit would cost.
MAX_TIMERS = 1024
# Batches in flight at once: while one commits, the next is collected and sent.
WRITERS = 2
# A request with this many timers goes alone, at once: its statement's fixed cost (about a
# millisecond of PostgreSQL's CPU) is already under half of what its timers cost (~35 µs
# each), and merging it would mostly delay its answer.
ALONE = 64


@dataclasses.dataclass(eq=False)
class _Request:
    tenant_id: int
    schedules: list[Schedule]  # committed together or not at all
    done: trio.Event = dataclasses.field(default_factory=trio.Event)
    outcomes: list[Outcome] | None = None
    error: Exception | None = None

    def answer(self, outcomes: list[Outcome]) -> None:
        self.outcomes = outcomes
        self.done.set()

    def fail(self, error: Exception) -> None:
        self.error = error
        self.done.set()


@dataclasses.dataclass(frozen=True, slots=True)
class BatcherStatistics:
    batches: int  # statements sent
    scheduled: int  # timers those statements scheduled (or answered too_late for)
    retried: int  # of those statements, requests sent again alone after a shared one failed


class ScheduleBatcher:
    """Start it with ``await nursery.start(batcher.run)``; then ``await batcher.schedule(...)``."""

    name = "schedules"
    _alive = False

    def __init__(self, db: Database, *, notify_within_ms: int, max_batch: int = MAX_BATCH,
                 cipher: PayloadCipher | None = None,
                 wake: Callable[[int], None] | None = None):
        self._db = db
        self._cipher = cipher  # seals the timers of encrypted queues (store.sealed)
        self._notify_within_ms = notify_within_ms
        # This broker's sweeper, told the due instant (epoch µs) of the soonest timer of a
        # statement due within notify_within_ms once it has committed, in place of the
        # statement's NOTIFY: that one made the commit take a database-wide lock and woke a
        # listening backend and this broker's listener while the answer was on its way, and
        # these schedules all come through this broker, whose sweeper fires them in time.
        self._wake = wake
        self._max_batch = max_batch
        self._send, self._receive = trio.open_memory_channel[_Request](math.inf)
        self._in_flight = 0  # statements being written (a writer's, or one sent at once)
        self.batches = 0  # statements sent, for tests and diagnostics
        self.scheduled = 0  # timers those statements scheduled (or answered too_late for)
        self.retried = 0  # statements that sent a request again alone (a shared one failed)

    async def schedule(self, tenant_id: int, s: Schedule) -> Outcome:
        """Create or replace one timer; answers once the statement carrying it has committed."""
        (outcome,) = await self.schedule_many(tenant_id, [s])
        return outcome

    async def schedule_many(self, tenant_id: int, schedules: list[Schedule]) -> list[Outcome]:
        """Create or replace distinct timers, all in one statement (with whatever else is
        waiting); answers once it has committed, in order."""
        if len(schedules) >= ALONE or not self._in_flight:
            # Alone (nothing else being written) or large: sent at once, from the caller's
            # own task. A hand-over to a writer task would only add a wait to a single
            # schedule on an idle broker; what arrives meanwhile queues for the writers.
            self._in_flight += 1
            try:
                return await self._one(tenant_id, schedules)
            finally:
                self._in_flight -= 1
        request = _Request(tenant_id, schedules)
        self._send.send_nowait(request)
        await request.done.wait()
        if request.error is not None:
            raise request.error
        assert request.outcomes is not None
        return request.outcomes

    @property
    def alive(self) -> bool:
        return self._alive

    def statistics(self) -> BatcherStatistics:
        return BatcherStatistics(self.batches, self.scheduled, self.retried)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self._alive = True
        try:
            async with trio.open_nursery() as nursery:
                for _ in range(WRITERS):
                    nursery.start_soon(self._writer, self._receive.clone())
                task_status.started()
        finally:
            self._alive = False

    async def _writer(self, receive: trio.MemoryReceiveChannel[_Request]) -> None:
        held: _Request | None = None  # taken, but past this statement's cap: the next one's
        while True:
            if held is None:
                try:
                    held = await receive.receive()
                except trio.EndOfChannel:
                    return
            batch, held = [held], None
            timers = len(batch[0].schedules)
            while len(batch) < self._max_batch and timers < MAX_TIMERS:
                try:
                    request = receive.receive_nowait()
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
                if timers + len(request.schedules) > MAX_TIMERS:
                    held = request
                    break
                batch.append(request)
                timers += len(request.schedules)
            self._in_flight += 1
            try:
                for tenant_id, requests in _by_tenant(batch):
                    try:
                        await self._write(tenant_id, requests)
                    except Exception as exc:  # noqa: BLE001 - never take the broker down for one batch
                        log.exception("schedule batch failed unexpectedly")
                        for r in requests:
                            if not r.done.is_set():
                                r.fail(exc)
            finally:
                self._in_flight -= 1

    async def _write(self, tenant_id: int, requests: list[_Request]) -> None:
        try:
            outcomes = await self._one(tenant_id, [s for r in requests for s in r.schedules])
        except DatabaseUnavailable as exc:
            for r in requests:
                r.fail(DatabaseUnavailable(str(exc)))
            return
        except Exception as exc:  # noqa: BLE001 - one timer's failure must not fail the batch
            if len(requests) == 1:
                requests[0].fail(exc)
                return
            for r in requests:  # find out whose it is: each request again, on its own
                self.retried += 1
                try:
                    r.answer(await self._one(tenant_id, r.schedules))
                except Exception as own:  # noqa: BLE001 - handed to that request's caller
                    r.fail(own)
            return
        answers = iter(outcomes)
        for r in requests:
            r.answer([next(answers) for _ in r.schedules])

    async def _one(self, tenant_id: int, schedules: list[Schedule]) -> list[Outcome]:
        """One statement: its own transaction, so it may run in autocommit."""
        self.batches += 1
        notify = None if self._wake is not None else self._notify_within_ms
        if len(schedules) == 1:
            outcomes = [await store.schedule_lone(
                self._db, tenant_id, schedules[0], notify_within_ms=notify,
                cipher=self._cipher)]
        else:
            outcomes = await self._db.run_autocommit(
                store.schedule_many, tenant_id, schedules, notify_within_ms=notify,
                cipher=self._cipher)
        if len(outcomes) != len(schedules):
            raise RuntimeError(f"{len(outcomes)} answers for {len(schedules)} timers")
        self.scheduled += len(outcomes)
        if self._wake is not None:
            soonest = store.soonest_due(schedules, outcomes, self._notify_within_ms)
            if soonest is not None:
                self._wake(soonest)
        return outcomes


def _by_tenant(batch: list[_Request]) -> Iterator[tuple[int, list[_Request]]]:
    """The batch split by tenant (one statement serves one tenant), arrival order kept."""
    groups: dict[int, list[_Request]] = {}
    for r in batch:
        groups.setdefault(r.tenant_id, []).append(r)
    yield from groups.items()

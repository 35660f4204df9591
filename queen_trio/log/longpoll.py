"""The log's pop, waiting: a pop with ``wait`` looks, and while nothing comes it is parked in
its lane until something may have changed for it (log/wakeups.py) or its timeout ends.

A parked pop on a queue a timer is about to fire into is offered to the sweeper: the fire pops
for it in its own transaction and hands the outcome over (:func:`_take_handover`), or the pop
waits for the frame in PostgreSQL (``queen.pop_head_after``). The HTTP route (api/log.py) only
reads the request and writes the answer.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Awaitable, Callable
from typing import Protocol

import trio

from ..config import Settings
from ..db import Database
from ..metrics import BrokerMetrics
from . import rules, store
from .segments import SegmentCache
from .wakeups import (
    BACKGROUND_REASONS,
    HANDOVER_WAIT_S,
    DeferredSettle,
    ExpectedFire,
    ParkedPop,
    ParkLimit,
    QueueWakeups,
    Waiter,
    Watch,
)


class PopBroker(Protocol):
    """What a pop uses of its broker (queen_trio.context.BrokerContext is one)."""

    @property
    def settings(self) -> Settings: ...
    @property
    def db(self) -> Database: ...
    @property
    def metrics(self) -> BrokerMetrics: ...
    @property
    def wakeups(self) -> QueueWakeups: ...
    @property
    def segment_cache(self) -> SegmentCache: ...


class Abandon:
    """Lets the owner of a waiting pop end its wait early (a stream whose consumer stopped or
    left, queen_trio/api/stream.py): the pop then answers with what it has, like a timeout.
    Only the sleep between looks is cut short, never a statement (which may take a lease)."""

    def __init__(self) -> None:
        self.abandoned = False
        self._sleeping: trio.CancelScope | None = None

    def now(self) -> None:
        self.abandoned = True
        if self._sleeping is not None:
            self._sleeping.cancel()

    async def sleep_until(self, deadline: float, woken: trio.Event,
                          scope: trio.CancelScope | None = None) -> None:
        """Until ``deadline``, ``woken`` or :meth:`now`; ``scope``: the one to sleep in (its
        deadline, which its owner may move, is set to ``deadline``)."""
        if scope is None:
            scope = trio.CancelScope()
        scope.deadline = deadline
        with scope:
            self._sleeping = scope
            try:
                if not self.abandoned:
                    await woken.wait()
            finally:
                self._sleeping = None


FirstLook = Callable[[], Awaitable[store.PopOutcome]]


@dataclasses.dataclass(frozen=True, slots=True)
class Deferral:
    """A stream's settlement that its pop carries for the sweep that pops for it
    (:class:`~.wakeups.DeferredSettle`), with what the stream does instead if no sweep
    applies it: ``first_look`` the settlement and a look (as at once, had it not waited), or
    ``settle_alone`` when the sweep handed a batch without applying it."""

    settle: DeferredSettle
    first_look: FirstLook
    settle_alone: Callable[[], Awaitable[None]]


async def pop_batches(broker: PopBroker, tenant: int, req: rules.PopRequest,
                      abandon: Abandon | None = None,
                      first_look: FirstLook | None = None, *, watch: Watch | None = None,
                      deferral: Deferral | None = None) -> list[store.PopBatch]:
    """The pop ``req`` of ``tenant``: one look, or with ``wait`` a long-poll
    (:func:`_wait_for_messages`); :class:`~.wakeups.ParkLimit` when it may not wait.
    ``abandon``: ends the wait early when told to. ``first_look``: the pop's first look
    instead of :func:`look` (a stream's settlement and the pop after it in one statement),
    made after the pop has joined its lane (no wake-up after it goes unseen). ``watch``: a
    stream's watch of its queue (a sweep that hands it a batch says whether it drained the
    queue for it). ``deferral``: instead of a first look, the pop parks at once carrying a
    settlement for the sweep that pops for it (:class:`Deferral`)."""
    if req.subscribe_from == rules.SUBSCRIBE_NOW:
        # The group's subscription instant, before it looks: what is pushed from now on is
        # new to it, whichever partition it lands in (store.subscribe).
        await broker.db.run_transaction(store.subscribe, tenant, req)
    if not req.wait or req.timeout_ms == 0 or not head_served(req):
        if deferral is not None:
            first_look = deferral.first_look
            deferral = None
    if not req.wait or req.timeout_ms == 0:
        outcome = await (first_look() if first_look is not None else look(broker, tenant, req))
        return _popped(broker.metrics, tenant, outcome)
    key = store.wake_key(tenant, req.queue)
    with broker.wakeups.waiting(key, tenant, req) as waiter:
        return _popped(broker.metrics, tenant,
                       await _wait_for_messages(broker, tenant, req, key, waiter, abandon,
                                                first_look, watch, deferral))


async def look(broker: PopBroker, tenant: int, req: rules.PopRequest,
               fire: ExpectedFire | None = None) -> store.PopOutcome:
    """One pop: most are served by one statement, the rest by the general pop (which alone
    takes several partitions). ``fire``: a timer is about to fire into the queue; wait for its
    frame in PostgreSQL."""
    sync_commit = broker.settings.pop_commit_sync
    if not head_served(req):
        outcome = None
    elif fire is not None:
        fire_wait_s = broker.settings.pop_fire_wait_ms / 1000
        outcome = await broker.db.run_autocommit(
            store.pop_head_after, tenant, req, fire.due_db, fire.due_db + fire_wait_s,
            sync_commit=sync_commit)
        broker.metrics.pop_fire_waits.labels(
            "fallback" if outcome is None
            else "delivered" if outcome.batch is not None else "gave_up").inc()
    else:
        outcome = await broker.db.run_autocommit(store.pop_head, tenant, req,
                                                 sync_commit=sync_commit)
    if outcome is None:
        outcome = await broker.db.run_transaction(store.pop, tenant, req, broker.segment_cache,
                                                  sync_commit=sync_commit)
    if outcome.skipped:
        broker.metrics.messages_skipped.inc(outcome.skipped)
    return outcome


async def _wait_for_messages(broker: PopBroker, tenant: int, req: rules.PopRequest, key: str,
                             waiter: Waiter, abandon: Abandon | None = None,
                             first_look: FirstLook | None = None, watch: Watch | None = None,
                             deferral: Deferral | None = None) -> store.PopOutcome:
    """A pop with ``wait``: look, and while nothing comes, sleep until the lane wakes this pop
    (log/wakeups.py) or its timeout ends. Past the bounds on parked pops it is refused
    instead of waiting (:class:`~.wakeups.ParkLimit`)."""
    wakeups, metrics = broker.wakeups, broker.metrics
    deadline = trio.current_time() + req.timeout_ms / 1000
    fire_wait_s = broker.settings.pop_fire_wait_ms / 1000
    parked: ParkedPop | None = None  # offered to the sweeper, while this pop waits
    # A lane whose last look found nothing, with no news since: join it without a look (a
    # client polling again after its timeout costs no query).
    known_empty = waiter.lane_known_empty and first_look is None and deferral is None
    outcome = store.PopOutcome(None)
    if watch is not None:
        # Known again once a sweep hands this pop a batch, or its first look (a settlement
        # and a pop) takes one, having drained the queue for it; news counts from now on.
        watch.reset()
    try:
        if deferral is not None:
            parked = await _carry_settlement(broker, tenant, req, key, waiter, deadline,
                                             abandon, watch, deferral)
            if not parked.reserved:
                # No sweep took it: the stream settles now, and looks in the same statement.
                parked.settle = None
                first_look, deferral = deferral.first_look, None
        while True:
            reason = waiter.begin_look()  # a wake from now on means: look again
            if parked is not None and parked.reserved:
                # The sweeper is firing a timer into this queue and pops for us in the fire's
                # own transaction: wait for its answer rather than look ourselves.
                handed = await _take_handover(wakeups, parked)
                parked = None
                if deferral is not None:
                    if deferral.settle.result is not True:
                        # The sweep did not apply it (or its fate is not known: a repeated
                        # completion is no harm): the stream settles as usual.
                        if handed is not None and handed.batch is not None:
                            await deferral.settle_alone()
                        else:
                            first_look = deferral.first_look
                    deferral = None
                if handed is not None and handed.batch is not None:
                    waiter.served = True
                    return handed
            fire = wakeups.claim_fire(key) if waiter.parked and head_served(req) else None
            if fire is not None and (req.partition not in (None, fire.partition)
                                     or fire.due_local + fire_wait_s > deadline):
                fire = None
            if waiter.parked:
                metrics.longpoll_looks.labels(reason).inc()
            if first_look is not None:
                outcome = await first_look()
                first_look = None
            elif known_empty:
                waiter.take_lane_knowledge()
                metrics.longpoll_looks_spared.inc()
            elif waiter.parked and reason in BACKGROUND_REASONS:
                async with wakeups.rechecks:  # every lane at once: a few at a time
                    outcome = await look(broker, tenant, req, fire)
            else:
                outcome = await look(broker, tenant, req, fire)
            if outcome.batch is not None:
                waiter.served = True  # there may be more: the next of the lane looks
                return outcome
            if (deadline <= trio.current_time() or wakeups.stopping
                    or (abandon is not None and abandon.abandoned)):
                return outcome
            if not waiter.parked:
                _park(broker, waiter)
                metrics.longpoll_waiters.inc()
            if parked is None and head_served(req):
                parked = ParkedPop(tenant, req, deadline, waiter=waiter, watch=watch)
                wakeups.offer(key, parked)
            if known_empty:
                known_empty = False  # the lane's timer is set already
            else:
                # When something becomes poppable that nobody will NOTIFY (a lease or a retry
                # hold ending, a delayed frame maturing): the lane's timer goes off then. (The
                # one-statement pop answers it with "nothing".)
                look_in = outcome.look_in_s if outcome.looked else await broker.db.run_autocommit(
                    store.next_look_in_s, tenant, req)
                if outcome.retry_in_s is not None:  # delayedProcessing, as the pop saw it
                    look_in = min(math.inf if look_in is None else look_in, outcome.retry_in_s)
                wakeups.look_again_in(waiter, look_in)
            if abandon is None:
                with trio.move_on_at(deadline):
                    await waiter.woken.wait()
            else:
                await abandon.sleep_until(deadline, waiter.woken)
                if abandon.abandoned:
                    return outcome
            if wakeups.stopping:  # shutting down: answer "nothing", lease nothing
                return store.PopOutcome(None)
            if not waiter.woken.is_set():
                return outcome  # its time is up, and nothing changed for it since it looked
    finally:
        if parked is not None:
            # Gone (answered, timed out, cancelled): a fire's batch reserved for it goes back.
            wakeups.withdraw(parked)
        if waiter.parked:
            metrics.longpoll_waiters.dec()


async def _carry_settlement(broker: PopBroker, tenant: int, req: rules.PopRequest, key: str,
                            waiter: Waiter, deadline: float, abandon: Abandon | None,
                            watch: Watch | None, deferral: Deferral) -> ParkedPop:
    """Park at once, offered to the sweeper with the stream's settlement, without a look: the
    stream knows there is nothing for it (its watch is quiet). Answers the offer once a sweep
    has reserved it (that sweep applies the settlement), or when the settlement's time is up,
    or on any news for the pop (a NOTIFY, its lane's timer, a shutdown, its consumer gone)
    but the handing sweep's own NOTIFY."""
    wakeups = broker.wakeups
    _park(broker, waiter)
    broker.metrics.longpoll_waiters.inc()
    parked = ParkedPop(tenant, req, deadline, waiter=waiter, watch=watch,
                       settle=deferral.settle)
    wakeups.offer(key, parked)
    waiter.begin_look()  # (what it knows is as of now: nothing came since the sweep looked)
    while not (wakeups.stopping or (abandon is not None and abandon.abandoned)):
        until = min(deadline, deferral.settle.until)
        # (Once a sweep reserves it, the sleep lasts until the hand-over, bounded as
        # _take_handover bounds it: QueueWakeups.announce_fire moves the scope's deadline.)
        parked.sleep = trio.CancelScope()
        try:
            if abandon is None:
                with parked.sleep:
                    parked.sleep.deadline = until
                    await waiter.woken.wait()
            else:
                await abandon.sleep_until(until, waiter.woken, parked.sleep)
        finally:
            parked.sleep = None
        if parked.reserved or not waiter.woken.is_set():
            break
        if waiter.reason == "notify" and watch is not None and watch.quiet():
            waiter.begin_look()  # the handing sweep's own NOTIFY: no news to this pop
            continue
        break
    return parked


def head_served(req: rules.PopRequest) -> bool:
    """Whether the one-statement pop (queen.pop_head, which the sweeper's hand-over uses too)
    can serve this pop: one partition, the queue's lease, no conflation."""
    return req.partitions == 1 and not req.conflation and req.lease_s is None


def _park(broker: PopBroker, waiter: Waiter) -> None:
    try:
        broker.wakeups.park(waiter)
    except ParkLimit as limit:
        broker.metrics.longpoll_refused.labels(limit.scope).inc()
        raise


def _popped(metrics: BrokerMetrics, tenant: int,
            outcome: store.PopOutcome) -> list[store.PopBatch]:
    batches = outcome.batches
    metrics.count_pop(tenant, sum(len(b.messages) for b in batches))
    return batches


async def _take_handover(wakeups: QueueWakeups, parked: ParkedPop) -> store.PopOutcome | None:
    """What the sweeper popped for this reserved pop (None: nothing came, or the sweep failed).
    Bounded: a sweep held up past HANDOVER_WAIT_S after the due instant, or past the pop's own
    timeout, is not waited for (the sweeper then gives the batch back), nor is one during a
    shutdown."""
    assert parked.due_local is not None
    if not (wakeups.stopping or parked.handed.is_set()):
        with trio.move_on_at(min(parked.deadline, parked.due_local + HANDOVER_WAIT_S)):
            await parked.handed.wait()
    wakeups.withdraw(parked)
    return parked.outcome if parked.handed.is_set() else None

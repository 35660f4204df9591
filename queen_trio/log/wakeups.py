"""Long-poll wake-ups: a parked pop looks at the database again only when something may have
changed for it, and then one pop looks, not every one.

**Lanes.** The pops waiting on one queue for one consumer group and one partition (or any)
form a lane, oldest first: whatever one of them would find, the others would too. Each of
these reaches a lane and wakes *one* of its pops (:meth:`QueueWakeups.notify`, ``reason``):

- ``notify``: a NOTIFY of ``queen_log`` naming the queue (``<tenant>:<queue>``). It is sent
  inside the committing transaction, so it arrives only once the change is visible, by every
  change that can make a message poppable: a push, a timer's fire, a dead letter replayed, an
  ack that frees a partition (its lease released: completed, retried, failed with or without
  retryDelay), a batch given back, a seek, a consumer group deleted, a queue reconfigured.
- ``due``: an instant the lane's last look read from the database (``next_look`` in
  queen_trio/sql/log.sql): the earliest end of a lease or of a retryDelay hold, or the
  maturing of a delayedProcessing frame, on a partition with messages for the group. Nobody
  NOTIFYs these; the lane's timer (:meth:`QueueWakeups.run`) goes off then.
- ``missed``: the listener lost notifications (it reconnected, or its buffer overflowed).
- ``safety``: nothing for ``SAFETY_RECHECK_S`` (jittered): a hint may have gone astray.
- ``fire``: a timer is about to fire into the queue (see below).

A pop that looks and gets messages wakes the next one of its lane (``next``: there may be
more); one that finds nothing goes back to sleep and so does the lane. A push thus costs one
look per lane of its queue, and pops that nothing concerns cost nothing: 3,000 of them parked
issue no query at all. ``missed`` and ``safety`` looks, which come to every lane at once,
take a slot of a small :attr:`QueueWakeups.rechecks` limiter first.

**No lost wake-up.** A pop joins its lane before its first look and takes a fresh event before
each look: a wake that comes while it looks sets that event, and it looks again. A pop that
leaves with a wake it did not use (it was answered, timed out or its client left) passes it
on.

**Bounds.** At most ``max_parked`` pops wait at once on this broker and ``max_per_tenant`` per
tenant (:meth:`QueueWakeups.park`); past them a pop that would wait is answered 503 or 429.

**Timer fires.** The sweeper also says when a timer is about to fire into a queue
(:meth:`announce_fire`). If a pop is parked on that queue here and can take the frame
(:meth:`offer`), the sweeper reserves it and the fire's own transaction pops for it
(queen.sweep_timers_and_pop): the sweeper hands it the popped batch (:meth:`ParkedPop.hand`)
when the sweep returns. Else one pop of each lane the frame can serve is woken ahead of the
fire, and the first to :meth:`claim_fire` it waits for the frame inside PostgreSQL
(queen.pop_head_after, schema/functions/log.sql) instead of for the NOTIFY.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import heapq
import math
import random
from collections.abc import Callable, Iterator
from typing import Literal

import trio

from ..db import MISSED, Listener
from ..db.listener import Heard
from .rules import PopRequest
from .store import NOTIFY_CHANNEL, PopBatch, PopOutcome

Reason = Literal["notify", "next", "due", "missed", "safety", "fire", "handover", "stop"]
#: Looks that come to every lane at once, not because of anything known to have happened.
BACKGROUND_REASONS = ("missed", "safety")

# With no news for this long a lane looks once anyway (times a random 0.5-1): a safety net,
# since every change that makes a message poppable is notified or read as an instant.
SAFETY_RECHECK_S = 60.0
# A look found nothing although something seemed poppable (another consumer held the cursor
# at that moment): look again after this, doubling each time nothing comes of it.
RACE_RECHECK_S = (0.02, 5.0)

# An announced fire nobody claimed is forgotten this long after its due instant.
_EXPECTATION_TTL_S = 0.05


@dataclasses.dataclass(frozen=True, slots=True)
class ExpectedFire:
    due_db: float  # the due instant, epoch seconds on the database's clock
    partition: str
    due_local: float  # the same instant on the trio clock
    expires_at: float  # trio clock


# A reserved pop waits for its hand-over at most this long after the fire's due instant (a
# sweep is late only when the database is); then it pops as usual and the sweeper, finding it
# gone, hands back whatever the fire leased to it.
HANDOVER_WAIT_S = 1.0
# A parked pop is reserved for a fire only if it waits at least this long past the due instant.
_HANDOVER_MARGIN_S = 0.05


class ParkLimit(Exception):
    """A pop would wait past a bound on parked pops (``scope``: "tenant" or "broker")."""

    def __init__(self, scope: Literal["tenant", "broker"], limit: int) -> None:
        super().__init__(f"{scope} limit of {limit} parked pops")
        self.scope = scope
        self.limit = limit


@dataclasses.dataclass(eq=False, slots=True)
class Lane:
    """The pops waiting on one queue for one group and partition filter, oldest first."""

    key: str
    group: str
    partition: str | None
    waiters: dict[Waiter, None] = dataclasses.field(default_factory=dict)  # ordered set
    look_at: float | None = None  # trio clock: the lane's timer, if set
    look_reason: Reason = "due"
    # Counts what reached the lane (wakes, timers); ``empty_at`` is the count at which a
    # look found nothing and nothing has reached it since: a pop joining then need not look.
    news: int = 0
    empty_at: int = -1
    empty_looked_at: float = -math.inf  # when the look that found it empty began (trio clock)


@dataclasses.dataclass(eq=False, slots=True)
class Waiter:
    """One waiting pop, in its lane from before its first look until it answers."""

    lane: Lane
    tenant_id: int
    woken: trio.Event = dataclasses.field(default_factory=trio.Event)
    reason: Reason = "notify"  # why ``woken`` was set
    parked: bool = False  # counted against the bounds (it found nothing and waits)
    served: bool = False  # it got messages: there may be more for the next of its lane
    offer: ParkedPop | None = None  # its offer to the sweeper, while it has one
    race_wait_s: float = 0.0
    looked_at_news: int = 0  # the lane's news when this pop's last look began
    # When what this pop knows was looked up (trio clock): its last look began then, or the
    # lane's empty look it took for its own. A change committed before it is no news to it.
    looked_at: float = dataclasses.field(default_factory=trio.current_time)

    def begin_look(self) -> Reason:
        """About to look: later wakes set a fresh event. Answers why it was woken."""
        if self.woken.is_set():
            self.woken = trio.Event()
        self.looked_at_news = self.lane.news
        self.looked_at = trio.current_time()
        return self.reason

    def take_lane_knowledge(self) -> None:
        """It joins a lane known to be empty without looking: it knows what that look did."""
        self.looked_at = self.lane.empty_looked_at

    @property
    def lane_known_empty(self) -> bool:
        """A look of its lane found nothing, and nothing has reached the lane since: a look
        now would find nothing either (every change that makes a message poppable is
        notified or timed)."""
        return self.lane.empty_at == self.lane.news and self.lane.look_at is not None

    def wake(self, reason: Reason) -> None:
        if not self.woken.is_set():
            self.reason = reason
            self.woken.set()

    def race_backoff(self) -> float:
        """The wait before the next look after one that raced another consumer."""
        low, high = RACE_RECHECK_S
        self.race_wait_s = min(high, max(low, 2 * self.race_wait_s))
        return self.race_wait_s


@dataclasses.dataclass(eq=False, slots=True)
class Watch:
    """What a streaming consumer's pop knows of its queue between two pops
    (:meth:`QueueWakeups.watching`): the NOTIFYs of the queue heard since the sweeper reserved
    it for a fire (the backend of each), and, once that fire's pop was handed to it, the
    backend of that sweep if the sweep found nothing else poppable for it (``drained_by``).
    Then the sweep's own NOTIFY of the queue (one per transaction) is no news to it, and
    :meth:`quiet` says whether a look now would find nothing."""

    key: str
    heard: list[int | None] = dataclasses.field(default_factory=list)
    drained_by: int | None = None

    def reset(self) -> None:
        """The sweeper is about to send the sweep that pops for this stream."""
        self.heard.clear()
        self.drained_by = None

    def quiet(self) -> bool:
        """Nothing can have become poppable for this stream's group since the sweep that
        handed it its batch looked: that sweep drained the queue for it, and no NOTIFY of the
        queue came since but that sweep's own (at most one)."""
        by = self.drained_by
        heard = self.heard
        return by is not None and (not heard or (len(heard) == 1 and heard[0] == by))


@dataclasses.dataclass(eq=False, slots=True)
class DeferredSettle:
    """A streaming consumer's settlement of the batch it was handed last (completed whole),
    carried by its next pop while that pop waits parked: a sweep that pops for it applies the
    settlement first, in the same statement (queen.sweep_settle_and_pop), so a consumer's cycle
    under a steady flow costs one statement. It waits for a sweep only until ``until`` (trio
    clock), and not past any news for the pop: then the stream applies it itself, with a
    look, as it would have at once."""

    batch: PopBatch
    until: float
    # Told once, at once, what the sweep that took it did: True applied, False not (its case
    # needs the general ack; nothing was changed), None not known (the sweep failed).
    done: Callable[[bool | None], None]
    taken: bool = False  # a sweep carries it: only that sweep's outcome says what became of it
    result: bool | None = None  # with ``done`` called: what it was told

    def finish(self, result: bool | None) -> None:
        self.result = result
        self.done(result)


@dataclasses.dataclass(eq=False, slots=True)
class ParkedPop:
    """A long-poll parked on a queue that one pop statement can serve (one partition): the
    sweeper may reserve it for a timer about to fire there and hand it the fire's batch
    (unless it acks on delivery, ``autoAck``: see :meth:`QueueWakeups.announce_fire`)."""

    tenant_id: int
    req: PopRequest
    deadline: float  # trio clock: when it answers "nothing"
    key: str = ""
    due_local: float | None = None  # set once reserved: the fire's due instant, trio clock
    gone: bool = False  # it stopped waiting: a batch handed to it now must go back
    handed: trio.Event = dataclasses.field(default_factory=trio.Event)
    outcome: PopOutcome | None = None  # with ``handed``: the sweep's pop (None: no answer)
    waiter: Waiter | None = None  # the waiting pop it stands for
    # A stream's pop: what it knows of its queue, and the settlement the sweep that pops for
    # it applies first (taken when it is reserved).
    watch: Watch | None = None
    settle: DeferredSettle | None = None
    # Reserved without waking its waiter (one carrying a settlement waits for the hand-over
    # where it is parked, in ``sleep``): the hand-over wakes it.
    wake_on_hand: bool = False
    sleep: trio.CancelScope | None = None

    @property
    def reserved(self) -> bool:
        return self.due_local is not None

    def hand(self, outcome: PopOutcome | None) -> PopOutcome | None:
        """The fire's pop, from the sweeper. Answers the outcome back if this pop has gone
        (its batch must then be released), else None."""
        if self.gone:
            return outcome
        self.outcome = outcome
        self.handed.set()  # it waits for this since it was reserved (announce_fire woke it)
        if self.wake_on_hand and self.waiter is not None:
            self.waiter.wake("handover")
        return None


@dataclasses.dataclass(eq=False, slots=True)
class OwnNotify:
    """A NOTIFY that a statement of this broker, on the pool connection whose backend is
    ``pid``, may send (an ack that frees a partition): :meth:`QueueWakeups.expect_own_notify`.
    ``key`` is set once the statement has returned having sent it, ``committed_by`` to the
    instant it returned (trio clock): the change was committed by then."""

    pid: int
    key: str | None = None
    committed_by: float = math.inf
    # The statement that sent it also looked, after its change, and found nothing for this
    # broker's pops of the queue: it is news to none of them.
    no_news: bool = False
    # NOTIFYs of its backend that arrived before the statement had returned (the listener's
    # socket was read first): judged when it returns (key, reason, partition).
    heard: list[tuple[str, Reason, str | None]] = dataclasses.field(default_factory=list)


# Marks kept per pool connection at most (each is taken by the next NOTIFY of its backend).
_OWN_NOTIFY_KEPT = 16
# A NOTIFY arrives within milliseconds of its commit: one expected longer ago is not waited for.
_OWN_NOTIFY_TTL_S = 2.0


@dataclasses.dataclass(frozen=True, slots=True)
class WakeupStatistics:
    parked: int
    lanes: int
    timers: int  # lane timers pending (some may be stale)


class QueueWakeups:
    """The long-poll lanes; as a service (``run``) it hands the NOTIFYs of ``listener`` to the
    lanes and runs the lanes' timers."""

    name = "wakeups"

    def __init__(self, *, max_parked: int = 10_000, max_per_tenant: int = 5_000,
                 recheck_concurrency: int = 4, listener: Listener | None = None) -> None:
        self._listener = listener
        self._alive = False
        self.max_parked = max_parked
        self.max_per_tenant = max_per_tenant
        # Looks of every lane at once (missed notifications, the safety net) go a few at a
        # time, so they never crowd out the pool's other work.
        self.rechecks = trio.CapacityLimiter(recheck_concurrency)
        self._lanes: dict[str, dict[tuple[str, str | None], Lane]] = {}
        self._parked_by_tenant: dict[int, int] = {}
        self._parked_count = 0
        self._timers: list[tuple[float, int, Lane]] = []  # (instant, tie-break, lane): a heap
        self._timer_seq = 0
        self._sooner = trio.Event()  # set when a timer earlier than every other is added
        self._expected: dict[str, ExpectedFire] = {}
        self._offers: dict[str, list[ParkedPop]] = {}
        self._own: dict[int, collections.deque[OwnNotify]] = {}  # by backend pid, oldest first
        self._watches: dict[str, list[Watch]] = {}
        # The sweeper's next cycle: the queue of the timer it fires first, and when it is
        # sent (trio clock).
        self._planned_fire: tuple[str, float] | None = None
        # Set when the broker begins to shut down: parked long-polls answer "nothing" at once.
        self.stopping = False

    def statistics(self) -> WakeupStatistics:
        return WakeupStatistics(self._parked_count,
                                sum(len(lanes) for lanes in self._lanes.values()),
                                len(self._timers))

    # -- waiting pops -------------------------------------------------------------------

    @contextlib.contextmanager
    def waiting(self, key: str, tenant_id: int, req: PopRequest) -> Iterator[Waiter]:
        """Join the lane of ``req`` on queue ``key`` for the block: before the pop's first
        look, so that no change after it goes unseen."""
        lanes = self._lanes.setdefault(key, {})
        lane = lanes.get((req.group, req.partition))
        if lane is None:
            lane = lanes[(req.group, req.partition)] = Lane(key, req.group, req.partition)
        waiter = Waiter(lane, tenant_id)
        lane.waiters[waiter] = None
        try:
            yield waiter
        finally:
            self._leave(waiter)

    def pops_in_lane(self, key: str, req: PopRequest) -> int:
        """How many pops of ``req``'s lane are waiting on this broker now (pop autopilot
        shares the sweep among them)."""
        lane = self._lanes.get(key, {}).get((req.group, req.partition))
        return 0 if lane is None else len(lane.waiters)

    def park(self, waiter: Waiter) -> None:
        """The pop found nothing and will wait: count it, or raise :class:`ParkLimit`."""
        if waiter.parked:
            return
        tenant = waiter.tenant_id
        if self._parked_by_tenant.get(tenant, 0) >= self.max_per_tenant:
            raise ParkLimit("tenant", self.max_per_tenant)
        if self._parked_count >= self.max_parked:
            raise ParkLimit("broker", self.max_parked)
        waiter.parked = True
        self._parked_count += 1
        self._parked_by_tenant[tenant] = self._parked_by_tenant.get(tenant, 0) + 1

    def look_again_in(self, waiter: Waiter, seconds: float | None) -> None:
        """The pop's look found nothing; ``seconds``: when something will become poppable
        unannounced (None: never; 0 or less: it seemed poppable already)."""
        now = trio.current_time()
        if seconds is not None and seconds <= 0:
            self._set_timer(waiter.lane, now + waiter.race_backoff(), "due")
            return
        waiter.race_wait_s = 0.0
        if waiter.looked_at_news == waiter.lane.news:
            waiter.lane.empty_at = waiter.lane.news
            waiter.lane.empty_looked_at = waiter.looked_at
        safety = now + SAFETY_RECHECK_S * random.uniform(0.5, 1.0)
        if seconds is not None and now + seconds < safety:
            self._set_timer(waiter.lane, now + seconds, "due")
        else:
            self._set_timer(waiter.lane, safety, "safety")

    def _leave(self, waiter: Waiter) -> None:
        lane = waiter.lane
        lane.waiters.pop(waiter, None)
        if waiter.parked:
            self._parked_count -= 1
            left = self._parked_by_tenant[waiter.tenant_id] - 1
            if left:
                self._parked_by_tenant[waiter.tenant_id] = left
            else:
                del self._parked_by_tenant[waiter.tenant_id]
        if not lane.waiters:
            lane.look_at = None  # its timer, if any, is stale now
            lanes = self._lanes.get(lane.key)
            if lanes is not None and lanes.get((lane.group, lane.partition)) is lane:
                del lanes[(lane.group, lane.partition)]
                if not lanes:
                    del self._lanes[lane.key]
            return
        # Served: there may be more for the next one. A wake it will not use: pass it on.
        if waiter.woken.is_set() and waiter.reason not in ("handover", "stop"):
            self._wake_one(lane, waiter.reason)
        elif waiter.served:
            self._wake_one(lane, "next")

    def _wake_one(self, lane: Lane, reason: Reason, before: float | None = None) -> None:
        """Wake the oldest pop of the lane that is not already woken, preferring one that is
        not waiting for a fire's hand-over (it looks only once that is over); none if all
        are woken. ``before``: the change was committed by then (trio clock); a pop whose
        look began since has seen it, and the lane's empty look too: it is news to neither."""
        if before is not None and not (
                any(w.looked_at < before for w in lane.waiters)
                or (lane.empty_at == lane.news and lane.empty_looked_at < before)):
            return
        lane.news += 1
        reserved = None
        for waiter in lane.waiters:
            if not waiter.woken.is_set() and (before is None or waiter.looked_at < before):
                if waiter.offer is None or not waiter.offer.reserved:
                    waiter.wake(reason)
                    return
                reserved = reserved or waiter
        if reserved is not None:
            reserved.wake(reason)

    def notify(self, key: str, reason: Reason = "notify", partition: str | None = None,
               *, pid: int | None = None) -> None:
        """Something changed in the queue: one pop of each of its lanes looks (only those
        whose partition filter admits ``partition``, when given). ``pid``: the backend that
        sent the NOTIFY; one this broker expected (:meth:`expect_own_notify`) wakes only the
        pops that looked before its change was committed."""
        if reason in ("notify", "missed"):  # (not this broker's own "fire": no change yet)
            watches = self._watches.get(key)
            if watches is not None:
                for watch in watches:
                    if len(watch.heard) < 2:  # (two are news, whoever sent them)
                        watch.heard.append(pid)
        before = None
        if pid is not None and self._own:
            marks = self._own.get(pid)
            if marks and marks[0].key is None:
                # Its statement has not returned yet (the NOTIFY was read first): the change
                # was committed, and is judged as soon as the statement returns.
                marks[0].heard.append((key, reason, partition))
                return
            before = self._own_notify(pid, key)
        self._wake_lanes(key, reason, partition, before)

    def _wake_lanes(self, key: str, reason: Reason, partition: str | None,
                    before: float | None) -> None:
        for lane in self._lanes.get(key, {}).values():
            if partition is None or lane.partition in (None, partition):
                self._wake_one(lane, reason, before)

    @contextlib.contextmanager
    def watching(self, key: str) -> Iterator[Watch]:
        """A streaming consumer's :class:`Watch` of queue ``key``, for the block."""
        watch = Watch(key)
        self._watches.setdefault(key, []).append(watch)
        try:
            yield watch
        finally:
            watches = self._watches.get(key)
            if watches is not None:
                watches.remove(watch)
                if not watches:
                    del self._watches[key]

    # -- NOTIFYs of this broker's own statements ----------------------------------------
    #
    # An ack that frees a partition NOTIFYs its queue, for the pops of every broker. The pop
    # its consumer sends next (the stream's, or a settle-and-pop's) looks after the ack has
    # returned: the NOTIFY, arriving while or after it looks, is old news to it, and used to
    # cost it a look and a next_look (two statements per message at a steady trickle).
    # NOTIFYs of one backend arrive in the order of its commits: the first one from the
    # ack's backend after the mark was set was committed by the time the ack returned.

    def expect_own_notify(self, pid: int) -> OwnNotify:
        """Before a statement that may NOTIFY runs on the connection of backend ``pid``."""
        marks = self._own.setdefault(pid, collections.deque())
        if len(marks) >= _OWN_NOTIFY_KEPT:
            old = marks.popleft()  # (never seen: its NOTIFY is then news, which is safe)
            for key, reason, partition in old.heard:
                self._wake_lanes(key, reason, partition, None)
        mark = OwnNotify(pid)
        marks.append(mark)
        return mark

    def own_notify_sent(self, mark: OwnNotify, key: str | None, *,
                        news: bool = True) -> None:
        """The statement has returned (committed), having NOTIFYed ``key`` (None: nothing,
        or not known: the mark is dropped, and what comes from that backend is news).
        ``news=False``: the statement then looked for the queue's pops itself (a settlement
        followed by a pop in one statement, queen.settle_pop_head) and found nothing."""
        if key is not None:
            mark.key, mark.committed_by, mark.no_news = key, trio.current_time(), not news
            if not mark.heard:
                return
        marks = self._own.get(mark.pid)
        if marks is not None and mark in marks:
            marks.remove(mark)
            if not marks:
                del self._own[mark.pid]
        # NOTIFYs that came while it ran: the first is its own (those of one backend arrive in
        # the order of its commits) unless it names another queue; any more are news to all.
        heard, mark.heard = mark.heard, []
        for i, (heard_key, reason, partition) in enumerate(heard):
            before = None
            if i == 0 and heard_key == key:
                before = -math.inf if mark.no_news else mark.committed_by
            self._wake_lanes(heard_key, reason, partition, before)

    def _own_notify(self, pid: int, key: str) -> float | None:
        """The NOTIFY of ``key`` by backend ``pid`` has arrived: the instant its change had
        committed by, if this broker knows it (else None: news to every pop)."""
        marks = self._own.get(pid)
        if not marks:
            return None
        mark = marks.popleft()
        if not marks:
            del self._own[pid]
        # A mark still pending (the statement has not returned) or for another queue: an
        # older NOTIFY of that backend took it, news to all. So is one long overdue (its
        # backend gone, say, and its pid another's since).
        if mark.key != key or trio.current_time() - mark.committed_by > _OWN_NOTIFY_TTL_S:
            return None
        return -math.inf if mark.no_news else mark.committed_by

    def notify_all(self, reason: Reason) -> None:
        for key in list(self._lanes):
            self.notify(key, reason)

    # -- lane timers --------------------------------------------------------------------

    def _set_timer(self, lane: Lane, at: float, reason: Reason) -> None:
        if lane.look_at is not None and lane.look_at <= at:
            return
        lane.look_at, lane.look_reason = at, reason
        if len(self._timers) > 1024 and len(self._timers) > 4 * self._parked_count:
            # Mostly stale: lanes emptied or given earlier timers. Keep the live ones.
            self._timers = [t for t in self._timers if t[2].look_at == t[0]]
            heapq.heapify(self._timers)
        self._timer_seq += 1
        if not self._timers or at < self._timers[0][0]:
            self._sooner.set()
        heapq.heappush(self._timers, (at, self._timer_seq, lane))

    async def _run_timers(self) -> None:
        while True:
            now = trio.current_time()
            while self._timers and self._timers[0][0] <= now:
                at, _, lane = heapq.heappop(self._timers)
                if lane.look_at == at:  # else replaced by an earlier one, or already spent
                    lane.look_at = None
                    if lane.waiters:
                        self._wake_one(lane, lane.look_reason)
            self._sooner = trio.Event()
            with trio.move_on_at(self._timers[0][0] if self._timers else math.inf):
                await self._sooner.wait()

    # -- timer fires --------------------------------------------------------------------

    def plan_fire(self, key: str | None, sent_at: float) -> None:
        """The sweeper's next cycle is sent at ``sent_at`` (trio clock) and fires a timer
        into queue ``key`` first (None: nobody knows which)."""
        self._planned_fire = None if key is None else (key, sent_at)

    def fire_planned(self, key: str) -> float | None:
        """When the sweeper's next cycle, firing into queue ``key``, is sent (trio clock), if
        one is planned for it."""
        planned = self._planned_fire
        return planned[1] if planned is not None and planned[0] == key else None

    def offer(self, key: str, pop: ParkedPop) -> None:
        """Offer a parked pop to the sweeper for the fires into its queue."""
        pop.key = key
        if pop.waiter is not None:
            pop.waiter.offer = pop
        self._offers.setdefault(key, []).append(pop)

    def withdraw(self, pop: ParkedPop) -> None:
        """The pop stops waiting (answered, timed out, or its client left), or its offer
        was used: a batch handed to it from now on goes back."""
        pop.gone = True
        if pop.waiter is not None and pop.waiter.offer is pop:
            pop.waiter.offer = None
        offers = self._offers.get(pop.key)
        if offers is not None and pop in offers:
            offers.remove(pop)
            if not offers:
                del self._offers[pop.key]

    def expect_fire(self, key: str, partition: str, due_db: float, due_local: float) -> None:
        """A timer due at ``due_db`` (``due_local`` on the trio clock) is about to fire into
        this queue's ``partition``. Only queues somebody waits on keep the news."""
        if key in self._lanes:
            if len(self._expected) > 1000:  # announced to queues whose waiters left
                now = trio.current_time()
                self._expected = {k: e for k, e in self._expected.items() if e.expires_at >= now}
            self._expected[key] = ExpectedFire(due_db, partition, due_local,
                                               due_local + _EXPECTATION_TTL_S)
            self.notify(key, "fire", partition)

    def announce_fire(self, key: str, partition: str, due_db: float,
                      due_local: float) -> ParkedPop | None:
        """A timer due at ``due_db`` (``due_local`` on the trio clock) is about to fire into
        this queue's ``partition``: the pop parked longest that can take it is reserved and
        returned (the sweep pops for it), or, if none can, the queue's lanes are told
        (:meth:`expect_fire`)."""
        for pop in self._offers.get(key, ()):
            # Not an autoAck pop: one that stops waiting before the fire commits (it found
            # other messages) could not be given its batch back, and the group would lose it.
            if (not pop.reserved and not pop.req.auto_ack
                    and pop.req.partition in (None, partition)
                    and pop.deadline > due_local + _HANDOVER_MARGIN_S):
                pop.due_local = due_local
                if pop.watch is not None:
                    pop.watch.reset()
                if pop.settle is not None:
                    pop.settle.taken = True  # (the sweep applies it)
                    # A stream's pop carrying its settlement waits parked until the sweep's
                    # hand-over wakes it (or its settlement's time is up: then it waits for
                    # the hand-over, bounded): one wake-up per cycle, not two.
                    pop.wake_on_hand = True
                    if pop.sleep is not None:  # now bounded as a reserved pop's wait is
                        pop.sleep.deadline = min(pop.deadline, due_local + HANDOVER_WAIT_S)
                elif pop.waiter is not None:
                    pop.waiter.wake("handover")  # it waits for the hand-over, bounded
                return pop
        self.expect_fire(key, partition, due_db, due_local)
        return None

    def claim_fire(self, key: str) -> ExpectedFire | None:
        """The fire announced for this queue, for one waiter only; None if none is current."""
        expected = self._expected.pop(key, None)
        if expected is None or trio.current_time() > expected.expires_at:
            return None
        return expected

    # -- the service --------------------------------------------------------------------

    def _heard(self, item: Heard) -> None:
        """A notification of ``queen_log`` (or MISSED), from the listener."""
        if item is MISSED:
            self._own.clear()  # their NOTIFYs may be among those lost
            for watches in self._watches.values():
                for watch in watches:
                    watch.heard.extend((None, None))  # news, whatever it was
            self.notify_all("missed")  # anything may have changed meanwhile
        else:
            self.notify(item.payload, pid=item.pid)

    def stop(self) -> None:
        """Shutdown begins: wake every waiter, and let none park again."""
        self.stopping = True
        for lanes in self._lanes.values():
            for lane in lanes.values():
                for waiter in lane.waiters:
                    waiter.wake("stop")

    @property
    def alive(self) -> bool:
        return self._alive

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Hand notifications to the lanes, and run the lanes' timers."""
        listener = self._listener
        assert listener is not None, "QueueWakeups(listener=...) runs as a service"
        self._alive = True
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._run_timers)
                # Each NOTIFY is handed to the lanes on the listener's task as it is read (a
                # lane's wake-up never waits): under a steady flow every sweeper cycle's own
                # NOTIFY comes back, and a task of our own cost a hop per cycle.
                with listener.calling(NOTIFY_CHANNEL, self._heard):
                    task_status.started()
                    await trio.sleep_forever()
        finally:
            self._alive = False

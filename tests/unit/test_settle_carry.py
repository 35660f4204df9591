"""What a streaming consumer's pop knows of its queue between two pops
(queen_trio/log/wakeups.py ``Watch``), which decides whether its settlement may wait for the
sweep that pops for it: only the handing sweep's own NOTIFY is no news."""

from __future__ import annotations

import uuid

import trio

from queen_trio.log.rules import PopRequest
from queen_trio.log.store import PopBatch
from queen_trio.log.wakeups import HANDOVER_WAIT_S, DeferredSettle, ParkedPop, QueueWakeups


def _req() -> PopRequest:
    return PopRequest(queue="q", partition=None, group="g", batch=10, wait=True,
                      timeout_ms=5000, auto_ack=False)


async def test_only_the_handing_sweeps_own_notify_keeps_a_watch_quiet() -> None:
    wakeups = QueueWakeups()
    with wakeups.watching("1:q") as watch, wakeups.watching("1:other") as other:
        assert not watch.quiet()  # nothing known yet
        watch.drained_by = 42  # a sweep on backend 42 handed a batch, draining the queue
        assert watch.quiet()
        wakeups.notify("1:q", pid=42)  # that sweep's own NOTIFY
        assert watch.quiet() and other.heard == []
        wakeups.notify("1:q", pid=42)  # a second one from that backend: a later statement
        assert not watch.quiet()
        watch.reset()
        assert not watch.quiet() and watch.heard == []
        watch.drained_by = 42
        wakeups.notify("1:q", pid=7)  # anyone else's
        assert not watch.quiet()
        watch.reset()
        watch.drained_by = -1  # drained, and no NOTIFY of its own expected
        wakeups.notify("1:q", pid=42)
        assert not watch.quiet()
        # The broker's own announcement of a fire is no NOTIFY: no news yet.
        watch.reset()
        watch.drained_by = 42
        wakeups.expect_fire("1:q", "p", 0.0, 0.0)
        assert watch.quiet()
    assert wakeups._watches == {}


async def test_the_sweep_reserving_a_pop_takes_its_settlement_and_resets_its_watch() -> None:
    wakeups = QueueWakeups()
    batch = PopBatch("q", "p", uuid.uuid4(), "g", uuid.uuid4(), None, [])
    told: list[bool | None] = []
    settle = DeferredSettle(batch, 1.0, told.append)
    with wakeups.watching("1:q") as watch, wakeups.waiting("1:q", 1, _req()):
        watch.heard.append(5)
        pop = ParkedPop(1, _req(), deadline=100.0, watch=watch, settle=settle)
        wakeups.offer("1:q", pop)
        wakeups.plan_fire("1:q", 3.0)
        assert wakeups.fire_planned("1:q") == 3.0 and wakeups.fire_planned("1:x") is None
        assert wakeups.announce_fire("1:q", "p", 10.0, 10.0) is pop
        assert settle.taken and watch.heard == []
        settle.finish(True)
        assert told == [True] and settle.result is True
        wakeups.plan_fire(None, 0.0)
        assert wakeups.fire_planned("1:q") is None


async def test_a_pop_carrying_its_settlement_is_woken_by_the_hand_over_alone() -> None:
    """Reserved for a fire, a plain parked pop is woken at once (it goes to wait for the
    hand-over); one carrying its stream's settlement waits for the hand-over where it is
    parked, and the hand-over wakes it: one wake-up of its task per sweeper cycle."""
    wakeups = QueueWakeups()
    batch = PopBatch("q", "p", uuid.uuid4(), "g", uuid.uuid4(), None, [])
    with wakeups.waiting("1:q", 1, _req()) as carrying, wakeups.waiting("1:x", 1, _req()) as plain:
        carrying.begin_look()
        plain.begin_look()
        pop = ParkedPop(1, _req(), deadline=100.0, waiter=carrying,
                        settle=DeferredSettle(batch, 1.0, lambda result: None))
        other = ParkedPop(1, _req(), deadline=100.0, waiter=plain)
        wakeups.offer("1:q", pop)
        wakeups.offer("1:x", other)
        pop.sleep = trio.CancelScope(deadline=10.5)  # parked until its settlement's time
        assert wakeups.announce_fire("1:q", "p", 10.0, 10.0) is pop
        assert wakeups.announce_fire("1:x", "p", 10.0, 10.0) is other
        assert not carrying.woken.is_set()
        # Now it sleeps until the hand-over, bounded as a reserved pop's wait for it is.
        assert pop.sleep.deadline == 10.0 + HANDOVER_WAIT_S
        assert plain.woken.is_set() and plain.reason == "handover"
        assert pop.hand(None) is None and other.hand(None) is None
        assert carrying.woken.is_set() and carrying.reason == "handover"
        assert pop.handed.is_set()

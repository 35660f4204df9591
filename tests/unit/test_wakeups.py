"""Which waiting pop is woken, and when (queen_trio/log/wakeups.py): one per lane, never the
whole crowd; which parked pop the sweeper reserves for a fire, and what happens to a batch
handed to a pop that has gone."""

from __future__ import annotations

import contextlib
import uuid

import pytest
import trio

from queen_trio.log.rules import PopRequest
from queen_trio.log.store import PopBatch, PopOutcome
from queen_trio.log.wakeups import ParkedPop, ParkLimit, QueueWakeups, Waiter


def req(partition: str | None = None, *, auto_ack: bool = False, group: str = "g") -> PopRequest:
    return PopRequest(queue="q", partition=partition, group=group, batch=10, wait=True,
                      timeout_ms=5000, auto_ack=auto_ack)


def outcome() -> PopOutcome:
    return PopOutcome(PopBatch("q", "p1", uuid.uuid4(), "g", uuid.uuid4(), None, []))


def woken(*waiters: Waiter) -> list[bool]:
    return [w.woken.is_set() for w in waiters]


async def test_a_notification_wakes_one_pop_of_each_lane_and_one_served_wakes_the_next() -> None:
    w = QueueWakeups()
    with contextlib.ExitStack() as stack:
        a, b, c = (stack.enter_context(w.waiting("1:q", 1, req())) for _ in range(3))
        other_group = stack.enter_context(w.waiting("1:q", 1, req(group="h")))
        other_queue = stack.enter_context(w.waiting("1:r", 1, req()))
        for waiter in (a, b, c, other_group, other_queue):
            waiter.begin_look()
        w.notify("1:q")
        assert woken(a, b, c, other_group, other_queue) == [True, False, False, True, False]
        assert a.reason == "notify"
        w.notify("1:q")  # a has not looked yet: the next one is woken
        assert woken(a, b, c) == [True, True, False]
        w.notify("1:q")
        w.notify("1:q")  # every one of the lane will look already: nothing more to do
        assert woken(a, b, c) == [True, True, True]

    w = QueueWakeups()
    with w.waiting("1:q", 1, req()) as first, w.waiting("1:q", 1, req()) as second:
        with w.waiting("1:q", 1, req()) as third:
            for waiter in (first, second, third):
                waiter.begin_look()
            third.served = True  # it got messages and leaves: there may be more
        assert woken(first, second) == [True, False] and first.reason == "next"
        first.begin_look()
    # The lane has gone with its last pop.
    assert w.statistics().lanes == 0


async def test_a_pop_that_leaves_with_a_wake_it_did_not_use_passes_it_on() -> None:
    w = QueueWakeups()
    with w.waiting("1:q", 1, req()) as stays:
        stays.begin_look()
        with w.waiting("1:q", 1, req()) as leaves:
            leaves.begin_look()
            w.notify("1:q")  # the oldest, ``stays``, is woken
            stays.begin_look()
            w.notify("1:q")  # ``stays`` is looking, not woken: it is woken again
            assert woken(stays, leaves) == [True, False]
            stays.begin_look()
            leaves.woken.set()  # as if chosen, then its client goes (timeout, cancel)
            leaves.reason = "notify"
        assert woken(stays) == [True] and stays.reason == "notify"


async def test_a_lane_looks_once_when_a_lease_ends_and_the_safety_net_is_jittered(
    autojump_clock: trio.testing.MockClock,
) -> None:
    class Listener:  # no notifications: only the lanes' timers run
        @contextlib.contextmanager
        def calling(self, channel: str, call: object):  # type: ignore[no-untyped-def]
            yield

    w = QueueWakeups(listener=Listener())  # type: ignore[arg-type]

    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        with w.waiting("1:q", 1, req()) as a, w.waiting("1:q", 1, req()) as b:
            start = trio.current_time()
            for waiter, seconds in ((a, 2.0), (b, 5.0)):  # each saw the lease; the earliest counts
                waiter.begin_look()
                w.look_again_in(waiter, seconds)
            await a.woken.wait()
            assert trio.current_time() - start == pytest.approx(2.0)
            assert (a.reason, woken(b)) == ("due", [False])
            a.begin_look()
            w.look_again_in(a, None)  # nothing will come unannounced: only the safety net
            await a.woken.wait()
            assert 30.0 <= trio.current_time() - start - 2.0 <= 60.0
            assert (a.reason, woken(b)) == ("safety", [False])
            # Something looked poppable yet the look found nothing (another consumer held
            # it): soon again, then less and less soon.
            waits = []
            for _ in range(3):
                a.begin_look()
                looked = trio.current_time()
                w.look_again_in(a, 0.0)
                await a.woken.wait()
                waits.append(trio.current_time() - looked)
            assert waits == pytest.approx([0.02, 0.04, 0.08])
        nursery.cancel_scope.cancel()


async def test_a_pop_joining_a_lane_known_to_be_empty_need_not_look() -> None:
    w = QueueWakeups()
    with w.waiting("1:q", 1, req()) as first:
        first.begin_look()
        w.look_again_in(first, 3.0)  # it found nothing; a lease ends in 3 s
        with w.waiting("1:q", 1, req()) as second:
            assert second.lane_known_empty  # nothing came since: it would find nothing too
        w.notify("1:q")
        with w.waiting("1:q", 1, req()) as third:
            assert not third.lane_known_empty  # news: it looks
            third.begin_look()
            first.begin_look()
            w.notify("1:q")  # news during their looks: what they found is stale
            w.look_again_in(third, None)
            w.look_again_in(first, None)
            with w.waiting("1:q", 1, req()) as fourth:
                assert not fourth.lane_known_empty
                fourth.begin_look()
                w.look_again_in(fourth, 0.0)  # something seemed poppable: not known empty
                with w.waiting("1:q", 1, req()) as fifth:
                    assert not fifth.lane_known_empty
    with w.waiting("1:q", 1, req()) as alone:
        assert not alone.lane_known_empty  # the lane went with its pops, and what it knew


async def test_missed_notifications_wake_one_pop_of_every_lane() -> None:
    w = QueueWakeups()
    with w.waiting("1:q", 1, req()) as a, w.waiting("1:q", 1, req()) as b, \
            w.waiting("2:r", 2, req("p1")) as c:
        for waiter in (a, b, c):
            waiter.begin_look()
        w.notify_all("missed")
        assert woken(a, b, c) == [True, False, True] and c.reason == "missed"


async def test_pops_park_within_the_bounds_of_their_tenant_and_of_the_broker() -> None:
    w = QueueWakeups(max_parked=3, max_per_tenant=2)
    with contextlib.ExitStack() as stack:
        one, two, three = (stack.enter_context(w.waiting("1:q", 1, req())) for _ in range(3))
        w.park(one)
        w.park(two)
        with pytest.raises(ParkLimit) as refused:
            w.park(three)
        assert (refused.value.scope, refused.value.limit) == ("tenant", 2)
        other = stack.enter_context(w.waiting("2:q", 2, req()))
        w.park(other)
        with pytest.raises(ParkLimit) as refused:
            w.park(stack.enter_context(w.waiting("3:q", 3, req())))
        assert (refused.value.scope, refused.value.limit) == ("broker", 3)
        assert w.statistics().parked == 3
    assert w.statistics().parked == 0
    with w.waiting("1:q", 1, req()) as again:
        w.park(again)  # room again once they have gone


async def test_the_pop_parked_longest_that_fits_is_reserved_once() -> None:
    w = QueueWakeups()
    other_partition = ParkedPop(1, req("p2"), deadline=100.0)
    too_short = ParkedPop(1, req(), deadline=10.02)
    # A batch handed to an autoAck pop that has just left with other messages could not go back.
    acks_itself = ParkedPop(1, req(auto_ack=True), deadline=100.0)
    fits = ParkedPop(1, req("p1"), deadline=100.0)
    later = ParkedPop(1, req(), deadline=100.0)
    for pop in (other_partition, too_short, acks_itself, fits, later):
        w.offer("1:q", pop)
    assert w.announce_fire("1:q", "p1", due_db=5.0, due_local=10.0) is fits
    assert fits.reserved and not later.reserved
    assert w.announce_fire("1:q", "p1", due_db=6.0, due_local=10.0) is later
    # Nobody left who fits: a pop of each lane the frame can serve is told instead (the fire
    # lock's path), and the first to claim the fire has it.
    with w.waiting("1:q", 1, req()) as any_partition, \
            w.waiting("1:q", 1, req("p2")) as elsewhere:
        any_partition.begin_look()
        elsewhere.begin_look()
        assert w.announce_fire("1:q", "p1", due_db=7.0, due_local=10.0) is None
        assert woken(any_partition, elsewhere) == [True, False]
        assert any_partition.reason == "fire"
    assert w.announce_fire("1:other", "p1", due_db=7.0, due_local=10.0) is None


async def test_a_reserved_pop_is_woken_to_wait_for_its_batch_and_one_for_a_gone_pop_comes_back(
) -> None:
    w = QueueWakeups()
    with w.waiting("1:q", 1, req()) as waiter, w.waiting("1:q", 1, req()) as neighbour:
        waiter.begin_look()
        neighbour.begin_look()
        pop = ParkedPop(1, req(), deadline=100.0, waiter=waiter)
        w.offer("1:q", pop)
        assert w.announce_fire("1:q", "p1", 5.0, 10.0) is pop
        assert woken(waiter) == [True] and waiter.reason == "handover"
        waiter.begin_look()
        # While it waits for the hand-over, news of the queue goes to its neighbour.
        w.notify("1:q")
        assert woken(waiter, neighbour) == [False, True]
        got = outcome()
        assert pop.hand(got) is None  # taken
        assert pop.handed.is_set() and pop.outcome is got

    gone = ParkedPop(1, req(), deadline=100.0)
    w.offer("1:q", gone)
    assert w.announce_fire("1:q", "p1", 5.0, 10.0) is gone
    w.withdraw(gone)
    back = outcome()
    assert gone.hand(back) is back  # the sweeper must release it
    assert not gone.handed.is_set()
    # A withdrawn pop is never reserved again.
    assert w.announce_fire("1:q", "p1", 5.0, 10.0) is None


async def test_the_notify_of_this_brokers_own_ack_is_news_only_to_pops_that_looked_before_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    w = QueueWakeups()
    with w.waiting("1:q", 1, req()) as early:
        early.begin_look()
        w.look_again_in(early, None)  # it found nothing, before the ack below committed
        mark = w.expect_own_notify(77)  # the ack runs on backend 77 ...
        await trio.sleep(0.01)
        w.own_notify_sent(mark, "1:q")  # ... and has returned: it freed a partition of q
        await trio.sleep(0.01)
        with w.waiting("1:q", 1, req()) as late:
            late.begin_look()  # the consumer's next pop: it looks after the ack
            w.notify("1:q", pid=77)
            assert woken(early, late) == [True, False]  # the NOTIFY was old news to ``late``
            early.begin_look()
            w.look_again_in(early, None)
            w.look_again_in(late, None)
            # A later NOTIFY of that backend, or of another one, is news to both.
            w.notify("1:q", pid=77)
            assert woken(early, late) == [True, False]
            w.notify("1:q", pid=78)
            assert woken(early, late) == [True, True]

    w = QueueWakeups()
    with w.waiting("1:q", 1, req()) as alone:
        mark = w.expect_own_notify(77)
        await trio.sleep(0.01)
        w.own_notify_sent(mark, "1:q")
        await trio.sleep(0.01)
        alone.begin_look()
        w.look_again_in(alone, None)
        w.notify("1:q", pid=77)
        assert woken(alone) == [False]
        with w.waiting("1:q", 1, req()) as joiner:
            assert joiner.lane_known_empty  # its empty look saw the ack: still known empty

    # Arrived while the ack had not returned yet (the listener's socket was read first): judged
    # once it returns, as if it had come then; a pop that looked while it ran is woken.
    w = QueueWakeups()
    with w.waiting("1:q", 1, req()) as pop:
        mark = w.expect_own_notify(77)
        await trio.sleep(0.01)
        pop.begin_look()
        w.look_again_in(pop, None)
        w.notify("1:q", pid=77)
        assert woken(pop) == [False]  # not yet
        await trio.sleep(0.01)
        w.own_notify_sent(mark, "1:q")
        assert woken(pop) == [True]

    # Naming another queue, or after an ack that notified nothing, or long after its ack:
    # news to every pop.
    for sent in ("1:other", None, "overdue"):
        w = QueueWakeups()
        with w.waiting("1:q", 1, req()) as pop:
            mark = w.expect_own_notify(77)
            if sent != "pending":
                w.own_notify_sent(mark, "1:q" if sent == "overdue" else sent)
            await trio.sleep(3.0 if sent == "overdue" else 0.01)
            pop.begin_look()
            w.look_again_in(pop, None)
            w.notify("1:q", pid=77)
            assert woken(pop) == [True], sent


async def test_the_notify_of_a_settlement_whose_own_look_found_nothing_is_news_to_none(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # A stream's settlement and its next look in one statement (queen.settle_pop_head): the
    # pop that runs it looks before the statement commits, yet the partition it frees is the
    # one it then looked at and found empty. Its NOTIFY wakes nobody here, and the lane stays
    # known to be empty; the same NOTIFY from a statement that did not look wakes a pop that
    # looked before it.
    for news, expected in ((False, [False, False]), (True, [True, False])):
        w = QueueWakeups()
        with w.waiting("1:q", 1, req()) as other, w.waiting("1:q", 1, req()) as stream:
            other.begin_look()
            w.look_again_in(other, None)  # parked earlier, on nothing
            stream.begin_look()
            mark = w.expect_own_notify(77)
            await trio.sleep(0.01)
            w.own_notify_sent(mark, "1:q", news=news)
            w.look_again_in(stream, None)
            await trio.sleep(0.01)
            w.notify("1:q", pid=77)
            assert woken(other, stream) == expected, news
            with w.waiting("1:q", 1, req()) as joiner:
                assert joiner.lane_known_empty is (not news)

    # The same, its NOTIFY read before the statement's answer (a loaded machine: a third of
    # a trickle's settlements): held until the answer, then judged the same way.
    for news, expected in ((False, [False, False]), (True, [True, False])):
        w = QueueWakeups()
        with w.waiting("1:q", 1, req()) as other, w.waiting("1:q", 1, req()) as stream:
            other.begin_look()
            w.look_again_in(other, None)
            stream.begin_look()
            mark = w.expect_own_notify(77)
            await trio.sleep(0.01)
            w.notify("1:q", pid=77)
            assert woken(other, stream) == [False, False]
            w.own_notify_sent(mark, "1:q", news=news)
            w.look_again_in(stream, None)
            assert woken(other, stream) == expected, news
            with w.waiting("1:q", 1, req()) as joiner:
                assert joiner.lane_known_empty is (not news)

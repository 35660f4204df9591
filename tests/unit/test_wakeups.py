"""Which parked pop the sweeper reserves for a fire, and what happens to a batch handed to a
pop that has gone (queen_trio/log/wakeups.py)."""

from __future__ import annotations

import uuid

from queen_trio.log.rules import PopRequest
from queen_trio.log.store import PopBatch, PopOutcome
from queen_trio.log.wakeups import ParkedPop, QueueWakeups


def req(partition: str | None = None, *, auto_ack: bool = False) -> PopRequest:
    return PopRequest(queue="q", partition=partition, group="g", batch=10, wait=True,
                      timeout_ms=5000, auto_ack=auto_ack)


def outcome() -> PopOutcome:
    return PopOutcome(PopBatch("q", "p1", uuid.uuid4(), "g", uuid.uuid4(), None, []))


async def test_the_pop_parked_longest_that_fits_is_reserved_once() -> None:
    w = QueueWakeups()
    other_partition = ParkedPop(1, req("p2"), deadline=100.0)
    too_short = ParkedPop(1, req(), deadline=10.02)
    # A batch handed to an autoAck pop that has just left with other messages could not go back.
    acks_itself = ParkedPop(1, req(auto_ack=True), deadline=100.0)
    fits = ParkedPop(1, req("p1"), deadline=100.0)
    later = ParkedPop(1, req(), deadline=100.0)
    for pop in (other_partition, too_short, acks_itself, fits, later):
        w.park("1:q", pop)
    assert w.announce_fire("1:q", "p1", due_db=5.0, due_local=10.0) is fits
    assert fits.reserved and not later.reserved
    assert w.announce_fire("1:q", "p1", due_db=6.0, due_local=10.0) is later
    # Nobody left who fits: the queue's waiters are told instead (the fire lock's path).
    changed = w.watch("1:q")
    assert w.announce_fire("1:q", "p1", due_db=7.0, due_local=10.0) is None
    assert changed.is_set()
    assert w.announce_fire("1:other", "p1", due_db=7.0, due_local=10.0) is None


async def test_a_handed_batch_wakes_its_pop_and_one_for_a_gone_pop_comes_back() -> None:
    w = QueueWakeups()
    pop = ParkedPop(1, req(), deadline=100.0)
    w.park("1:q", pop)
    assert w.announce_fire("1:q", "p1", 5.0, 10.0) is pop
    changed = w.watch("1:q")
    got = outcome()
    assert pop.hand(got) is None  # taken
    assert pop.handed.is_set() and pop.outcome is got and changed.is_set()

    gone = ParkedPop(1, req(), deadline=100.0)
    w.park("1:q", gone)
    assert w.announce_fire("1:q", "p1", 5.0, 10.0) is gone
    w.unpark(gone)
    back = outcome()
    assert gone.hand(back) is back  # the sweeper must release it
    assert not gone.handed.is_set()
    # An unparked pop is never reserved again.
    assert w.announce_fire("1:q", "p1", 5.0, 10.0) is None

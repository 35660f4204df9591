"""The broker's copy of the runtime switches (no database: the read is held at a gate, so the
interleavings a loaded machine produces by chance happen here every time)."""

from __future__ import annotations

from typing import Any

import trio

from queen_trio.switches import KV, TIMERS_FIRE, TIMERS_SCHEDULE, RuntimeSwitches

ON = {KV: True, TIMERS_SCHEDULE: True, TIMERS_FIRE: True}


class HeldRead:
    """Answers the switches' read with what the table held when the read was sent, once let
    go: a read that was out while a flip committed."""

    def __init__(self) -> None:
        self.table = dict(ON)
        self.sent = trio.Event()
        self.go = trio.Event()

    async def run_autocommit(self, fn: Any, *args: Any) -> dict[str, bool]:
        seen = dict(self.table)
        self.sent.set()
        await self.go.wait()
        return seen


async def test_a_read_sent_before_a_flip_does_not_undo_it() -> None:
    db = HeldRead()
    switches = RuntimeSwitches(db, None)  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(switches.refresh)
        await db.sent.wait()
        # The operator's flip commits, and this broker's route adopts what it committed.
        db.table[TIMERS_FIRE] = False
        switches.adopt(dict(db.table))
        db.go.set()  # the stale read comes back: fire on
    assert switches.timers_fire is False
    # The next read (sent after the flip) is adopted as usual.
    db.go = trio.Event()
    db.go.set()
    db.table[TIMERS_FIRE] = True
    await switches.refresh()
    assert switches.timers_fire is True


async def test_fire_settled_waits_for_every_cycle_in_flight() -> None:
    switches = RuntimeSwitches(HeldRead(), None)  # type: ignore[arg-type]
    with trio.fail_after(1):
        await switches.fire_settled()  # none in flight: at once
    settled_at: list[float] = []

    async def waiter() -> None:
        await switches.fire_settled()
        settled_at.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        with switches.firing():
            with switches.firing():
                nursery.start_soon(waiter)
                await trio.sleep(0.05)
            await trio.sleep(0.05)
            assert settled_at == []  # one cycle still in flight
            ended = trio.current_time()
    assert settled_at and settled_at[0] >= ended

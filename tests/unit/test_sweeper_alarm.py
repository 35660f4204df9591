"""The sweeper's sleep between cycles (queen_trio/timers/sweeper.py ``_Alarm``, a timerfd):
it wakes no earlier than the deadline, as trio's own sleep would (whole milliseconds, rounded
up), an expiry a cancelled sleep left behind never ends the next sleep early, and a test's
MockClock gets trio's own sleep."""

from __future__ import annotations

import sys

import pytest
import trio
import trio.testing

from queen_trio.timers.sweeper import _Alarm

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="a timerfd is Linux's")


async def test_it_wakes_at_the_deadline_not_before() -> None:
    alarm = _Alarm.open()
    assert alarm is not None
    try:
        for delay in (0.0004, 0.003, 0.012, 0.0301):
            deadline = trio.current_time() + delay
            await alarm.sleep_until(deadline)
            woke = trio.current_time()
            assert woke >= deadline
            assert woke - deadline < 0.5  # (a loaded machine may wake late, never early)
    finally:
        alarm.close()


async def test_a_passed_deadline_is_a_checkpoint() -> None:
    alarm = _Alarm.open()
    assert alarm is not None
    try:
        with trio.CancelScope() as scope:
            scope.cancel()
            await alarm.sleep_until(trio.current_time() - 1)  # cancelled there: a checkpoint
        assert scope.cancelled_caught
        await alarm.sleep_until(trio.current_time() - 1)
    finally:
        alarm.close()


async def test_an_expiry_left_by_a_cancelled_sleep_does_not_end_the_next() -> None:
    alarm = _Alarm.open()
    assert alarm is not None
    try:
        with trio.move_on_after(0.001):
            await alarm.sleep_until(trio.current_time() + 0.02)
        await trio.sleep(0.05)  # the cancelled sleep's timer expires, unread
        deadline = trio.current_time() + 0.1
        await alarm.sleep_until(deadline)
        assert trio.current_time() >= deadline
    finally:
        alarm.close()


def test_a_mock_clock_sleeps_as_trio_does() -> None:
    async def main() -> _Alarm | None:
        return _Alarm.open()

    assert trio.run(main, clock=trio.testing.MockClock()) is None

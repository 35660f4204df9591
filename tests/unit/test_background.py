"""How a background service outlives errors (queen_trio/db/transient.py), on trio's clock."""

from __future__ import annotations

import psycopg
import pytest
import trio
import trio.testing

from queen_trio.db.transient import BACKOFF_MAX_S, Shunned, backoff_s, every


async def test_every_goes_on_after_an_error_backing_off_until_a_round_succeeds(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture,
) -> None:
    starts: list[float] = []
    outcomes = iter([ValueError("a row it cannot process"), ValueError("again"), None,
                     psycopg.OperationalError("the server went away"), None])
    counted: list[str] = []

    async def step() -> None:
        starts.append(trio.current_time())
        error = next(outcomes, None)
        if error is not None:
            raise error

    with trio.move_on_after(7.5):
        await every(1.0, step, what="the step", service="svc", count_error=counted.append,
                    at_once=True)
    # 0: failed, 1 s later failed again, 2 s later (backed off) succeeded; then every second,
    # a transient error neither counted nor backed off.
    assert starts == [0.0, 1.0, 3.0, 4.0, 5.0, 6.0, 7.0]
    assert counted == ["svc", "svc"]
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert [r.exc_info is not None for r in errors] == [True, True]  # a bug is not hidden
    assert "a row it cannot process" in errors[0].getMessage()


async def test_every_lets_cancellation_and_keyboard_interrupt_through(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def interrupted() -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        await every(1.0, interrupted, what="the step", service="svc", at_once=True)
    with trio.move_on_after(0.5) as scope:
        await every(1.0, trio.sleep_forever, what="the step", service="svc", at_once=True)
    assert scope.cancelled_caught


def test_back_off_doubles_from_the_interval_up_to_the_cap() -> None:
    assert [backoff_s(n, 1.0) for n in (0, 1, 2, 3)] == [1.0, 1.0, 2.0, 4.0]
    assert backoff_s(100, 1.0) == BACKOFF_MAX_S
    assert backoff_s(3, 120.0) == 120.0  # never shorter than the interval itself


def test_a_shunned_item_waits_until_it_succeeds() -> None:
    shunned = Shunned(first_s=60.0)
    assert not shunned.waiting("p1")
    assert shunned.failed("p1") == 60.0
    assert shunned.waiting("p1") and not shunned.waiting("p2")
    shunned.succeeded("p1")
    assert not shunned.waiting("p1")

"""Every script in examples/ runs against a live broker and does what its docstring says."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import trio

from queen_trio.client import Client, TimerStatus
from queen_trio.server import BrokerHandle

from . import test_sdk

settings = test_sdk.settings  # a quick sweeper

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"examples_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_example_is_tested() -> None:
    assert sorted(p.stem for p in EXAMPLES.glob("*.py")) == [
        "booking_saga", "retry_backoff", "trial_reminder"]


async def test_booking_saga(broker: BrokerHandle) -> None:
    saga = load("booking_saga")
    # The raced payment must be pushed before its hold expires: two settle rounds come first,
    # and on a loaded two-core machine they can take most of a second.
    summary = await saga.main(broker.url, hold_for="1500ms", idle="300ms")
    b = summary["bookings"]
    assert summary["states"] == {b["paid_on_time"]: "confirmed", b["abandoned"]: "expired",
                                 b["raced"]: "confirmed"}
    # The raced booking's timer went out before its payment was handled: the cancel answered
    # absent, and the expiry consumer, seeing "confirmed", did not release the seat.
    assert summary["cancel_verdicts"][b["raced"]] is TimerStatus.ABSENT
    assert summary["cancel_verdicts"][b["paid_on_time"]] in (TimerStatus.CANCELLED,
                                                             TimerStatus.ABSENT)
    async with Client(broker.url) as queen:
        released = await queen.pop(saga.RELEASES, batch=10, auto_ack=True)
        refunded = await queen.pop(saga.REFUNDS, batch=10, auto_ack=True)
        audit = await queen.pop(saga.AUDIT, batch=10, auto_ack=True)
        assert [m.data["bookingId"] for m in released] == [b["abandoned"]]
        assert [m.data["bookingId"] for m in refunded] == [b["abandoned"]]
        assert sorted(m.data["event"] for m in audit) == ["booking.confirmed"] * 2 + [
            "booking.held"] * 3
        assert [t async for t in queen.timers(saga.BOOKINGS).list()] == []
        assert len(await queen.pop(saga.BOOKINGS)) == 0


async def test_trial_reminder(broker: BrokerHandle) -> None:
    trial = load("trial_reminder")
    summary = await trio.to_thread.run_sync(
        lambda: trial.main(broker.url, remind_after="400ms", idle="400ms"))
    accounts = summary["accounts"]
    assert summary["scheduled"] == {accounts["converts"]: TimerStatus.SCHEDULED,
                                    accounts["lapses"]: TimerStatus.SCHEDULED}
    assert summary["cancelled"] is TimerStatus.CANCELLED
    assert summary["emailed"] == [accounts["lapses"]]


async def test_retry_backoff_under_asyncio(broker: BrokerHandle) -> None:
    example = load("retry_backoff")
    summary = await trio.to_thread.run_sync(asyncio.run, example.main(broker.url))
    jobs, outcomes, gaps = summary["jobs"], summary["outcomes"], summary["gaps_ms"]
    assert outcomes == {jobs["ok"]: "done after 1 attempt(s)",
                        jobs["flaky"]: "done after 3 attempt(s)",
                        jobs["broken"]: "gave up after 3 attempt(s)"}
    assert gaps[jobs["ok"]] == []
    for job in ("flaky", "broken"):
        first, second = gaps[jobs[job]]
        # "No earlier than": each retry waits at least its backoff (allowing for the clock
        # read on either side of the request), and not absurdly longer.
        assert 245 <= first < 1500 and 495 <= second < 2000, gaps
    async with Client(broker.url) as queen:
        gave_up = await queen.pop(example.GAVE_UP, auto_ack=True)
        assert [m.data["job"] for m in gave_up] == [jobs["broken"]]


async def test_an_example_runs_as_a_script(broker: BrokerHandle) -> None:
    # This checkout's queen_trio, whichever one is installed.
    env = {**os.environ, "PYTHONPATH": str(EXAMPLES.parent)}
    done = await trio.run_process(
        [sys.executable, str(EXAMPLES / "trial_reminder.py"), broker.url,
         "--remind-after", "300ms"],
        env=env, capture_stdout=True, capture_stderr=True, check=False,
    )
    assert done.returncode == 0, done.stderr.decode()
    lines = done.stdout.decode().splitlines()
    assert lines[0].endswith("converted, reminder cancelled")
    assert lines[1].endswith("reminder sent")

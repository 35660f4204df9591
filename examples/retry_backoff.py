"""Retrying a failed job after 250 ms, 500 ms, 1 s …: backoff with timers (asyncio client).

Run it against a broker:  python examples/retry_backoff.py [URL]

Acking a message ``failed`` makes the broker hand it out again at once. To wait first, the
consumer instead acks the failed job and, in the same transaction, schedules a timer that puts
the job back into the queue after the backoff. If the transaction fails, neither happens and
the job is simply redelivered; it is never lost and never doubled. The timer is named after the
job and the attempt, so a repeated schedule is the same timer.

This one runs on asyncio to show the SDK does not mind which event loop it is on.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
import uuid
from typing import Any

from queen_trio.client import Client, Message, format_ms

JOBS, GAVE_UP = "jobs", "jobs.failed"


class Downstream:
    """A flaky dependency: fails each job a set number of times, then works."""

    def __init__(self, failures: dict[str, int]) -> None:
        self.failures = failures
        self.calls: dict[str, list[float]] = {}

    def call(self, job: str) -> None:
        self.calls.setdefault(job, []).append(time.monotonic())
        if len(self.calls[job]) <= self.failures.get(job, 0):
            raise ConnectionError(f"{job}: downstream unavailable")


class Worker:
    def __init__(self, queen: Client, downstream: Downstream, *, base_ms: int,
                 max_attempts: int) -> None:
        self.queen, self.downstream = queen, downstream
        self.base_ms, self.max_attempts = base_ms, max_attempts
        self.outcomes: dict[str, str] = {}

    async def handle(self, message: Message) -> None:
        job, attempt = message.data["job"], message.data.get("attempt", 1)
        try:
            self.downstream.call(job)
        except ConnectionError as exc:
            await self.retry_later(message, job, attempt, str(exc))
            return
        self.outcomes[job] = f"done after {attempt} attempt(s)"

    async def retry_later(self, message: Message, job: str, attempt: int, error: str) -> None:
        tx = self.queen.transaction().ack(message)
        if attempt >= self.max_attempts:
            tx = tx.push(GAVE_UP, {"job": job, "error": error}, txn=f"{job}:gave-up")
            self.outcomes[job] = f"gave up after {attempt} attempt(s)"
        else:
            backoff = self.base_ms * 2 ** (attempt - 1)  # 250 ms, 500 ms, 1 s, …
            tx = (tx.timer(JOBS).key(f"retry:{job}:{attempt + 1}").delay(backoff)
                  .payload({"job": job, "attempt": attempt + 1}).schedule())
            print(f"{job}: attempt {attempt} failed, next in {format_ms(backoff)}")
        await tx.commit()  # the ack and the retry (or the give-up) together


async def main(url: str, *, base: int = 250, max_attempts: int = 3) -> dict[str, Any]:
    run = uuid.uuid4().hex[:8]
    ok, flaky, broken = (f"job-{run}-{n}" for n in ("ok", "flaky", "broken"))
    downstream = Downstream({flaky: 2, broken: 99})
    async with Client(url) as queen:
        worker = Worker(queen, downstream, base_ms=base, max_attempts=max_attempts)
        for job in (ok, flaky, broken):
            await queen.push(JOBS, {"job": job}, txn=f"{job}:1")
        longest_ms = base * 2 ** (max_attempts - 2)
        await queen.consume(JOBS, worker.handle, idle_timeout=longest_ms + 1000)
    gaps = {job: [round((b - a) * 1000) for a, b in zip(times, times[1:], strict=False)]
            for job, times in downstream.calls.items()}
    for job in (ok, flaky, broken):
        print(f"{job}: {worker.outcomes[job]}; gaps between attempts (ms): {gaps[job]}")
    return {"outcomes": worker.outcomes, "gaps_ms": gaps,
            "jobs": {"ok": ok, "flaky": flaky, "broken": broken}}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", nargs="?", default=os.environ.get("QUEEN_URL",
                                                                 "http://127.0.0.1:6632"))
    args = parser.parse_args()
    asyncio.run(main(args.url))

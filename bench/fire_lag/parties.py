"""The two sides of ``bench.fire_lag``, behind one small interface.

A *party* schedules timers (key, delayMs), reports each timer's arrival into a
``bench.harness.timers.Delivery`` (which does the exactly-once bookkeeping), and says what is left
afterwards. ``Ours`` talks HTTP to one or more brokers (arrival = a long-polling consumer's
receive time); ``Peer`` defers Procrastinate jobs with ``schedule_in`` (arrival = the job's start
time in the worker). Lag is arrival minus due in both cases; for ours the broker's own histogram
(fire commit - deliver_at, PostgreSQL's clock) is read too.
"""

from __future__ import annotations

import math
import time
from typing import Any

import trio

from bench.harness import peer_procrastinate as peer
from bench.harness.api import Api
from bench.harness.metrics import Metrics, merge
from bench.harness.report import Failures
from bench.harness.sdk_consumer import SdkConsumer
from bench.harness.timers import (
    BUNDLE,
    FAR_DELAY_MS,
    Delivery,
    calibration_rate,
    consume,
    final_check,
    settle_metrics,
    timer_ops,
)

CALIBRATION_BUNDLES = 6


def arrival_lags(delivery: Delivery) -> list[float]:
    """Per scheduled timer: first arrival minus due (seconds), +inf if it never arrived."""
    out = []
    for key, (due, _) in delivery.expected.items():
        copies = delivery.frames.get(key)
        out.append(copies[0][0] - due if copies else math.inf)
    return out


# -- parties ----------------------------------------------------------------------------------


CONSUMERS = {
    # party name -> how its timers are received
    "ours": "sdk",            # Client.consume() at its defaults, asyncio, its own process
    "ours-sync": "sdk-sync",  # SyncClient.consume() at its defaults, its own process
    "ours-wire": "wire",      # a long-polling autoAck pop loop in the bench (the wire's view)
    "ours-w2": "sdk",         # as "ours", against a broker of QUEEN_WORKERS=2 (burst only)
}


class Ours:
    """queen-trio brokers over HTTP; timers scheduled round-robin over ``apis``; received by
    the consumer ``CONSUMERS[name]`` names. Lag is the handler's start for the SDK consumers
    (what a user feels) and the answer's arrival for the wire-level one."""

    has_metrics = True

    def __init__(self, apis: list[Api], failures: Failures, database_url: str,
                 name: str = "ours") -> None:
        self.apis = apis
        self.database_url = database_url
        self.failures = failures
        self.delivery: Delivery | None = None
        self._next = 0
        self.name = name
        self.consumer = CONSUMERS[name]

    def _api(self) -> Api:
        self._next = (self._next + 1) % len(self.apis)
        return self.apis[self._next]

    async def prepare(self, scenario: str, queue: str) -> None:
        await self.apis[0].configure(scenario, queue)

    async def schedule(self, scenario: str, queue: str, entries: list[tuple[str, int]]) -> None:
        """One PUT for a single timer, else 500-timer transactions; answers go to the
        delivery's expectations (with the deliverAt the broker computed)."""
        assert self.delivery is not None
        api = self._api()
        if len(entries) == 1:
            key, delay = entries[0]
            answer = await api.put_timer(scenario, queue, key, delay, {"k": key})
            answers = [answer] if answer else []
        else:
            answers = []
            for i in range(0, len(entries), BUNDLE):
                got = await api.bundle(scenario, timer_ops(
                    queue, [(key, delay, {"k": key}) for key, delay in entries[i:i + BUNDLE]]))
                answers += got or []
        for answer in answers:
            self.delivery.schedule_answer(answer)

    async def receive(self, queue: str, batch: int, *,
                      task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        delivery = self.delivery
        assert delivery is not None
        if self.consumer == "wire":
            task_status.started()
            await consume(self.apis[0], delivery, queue, batch)
            return
        process = SdkConsumer(self.apis[0].client.base_url, queue, sync=self.consumer == "sdk-sync")
        process.on_start = lambda frame, started: delivery.receive([frame], started)
        try:
            await process.run(task_status=task_status)
            await trio.sleep_forever()
        finally:
            if process.process is not None and process.process.returncode not in (0, None):
                self.failures.add(delivery.scenario, "consumer exit",
                                  f"exit {process.process.returncode}: {process.log_tail()}")

    async def calibrate(self, scenario: str, queue: str) -> float:
        """Timers/s through 500-timer transactions, far-future timers on a side queue."""
        return await _calibrate(lambda entries: self._side(scenario, queue, entries))

    async def _side(self, scenario: str, queue: str, entries: list[tuple[str, int]]) -> None:
        await self._api().bundle(f"{scenario} calibration", timer_ops(
            f"{queue}-calibration", [(key, delay, {}) for key, delay in entries]))

    async def analyze(self) -> None:
        await analyze(self.database_url)

    async def metrics(self) -> Metrics | None:
        return merge([await api.metrics() for api in self.apis])

    async def settled_metrics(self, fired: int) -> Metrics | None:
        if len(self.apis) == 1:
            return await settle_metrics(self.apis[0], fired)
        await trio.sleep(1.0)  # the fires observe their lag after the commit
        return await self.metrics()

    async def leftovers(self, queue: str) -> dict[str, Any]:
        assert self.delivery is not None
        return await final_check(self.apis[0], self.delivery, queue)


class Peer:
    """Procrastinate: a worker subprocess with one of ``peer.PROFILES``."""

    has_metrics = False

    def __init__(self, client: peer.PeerClient, worker: peer.PeerWorker) -> None:
        self.name = f"peer-{worker.profile}"
        self.client = client
        self.worker = worker
        self.delivery: Delivery | None = None
        worker.on_job = self._started

    def _started(self, key: str, scheduled: float, started: float) -> None:
        if self.delivery is not None:
            self.delivery.receive(peer.job_messages([(key, scheduled, started)]), started)

    async def prepare(self, scenario: str, queue: str) -> None:
        pass

    async def schedule(self, scenario: str, queue: str, entries: list[tuple[str, int]]) -> None:
        assert self.delivery is not None
        for i in range(0, len(entries), BUNDLE):
            for key, scheduled in await self.client.defer(entries[i:i + BUNDLE]):
                self.delivery.schedule_answer({"timerKey": key, "deliverAt": peer.iso(scheduled)})

    async def receive(self, queue: str, batch: int, *,
                      task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await trio.sleep_forever()  # the worker's stdout feeds the delivery

    async def calibrate(self, scenario: str, queue: str) -> float:
        rate = await _calibrate(lambda entries: self.client.defer(entries, peer.SIDE_QUEUE))
        await self.client.drop_side()
        return rate

    async def analyze(self) -> None:
        await analyze(self.client.dsn)

    async def metrics(self) -> Metrics | None:
        return None

    async def settled_metrics(self, fired: int) -> Metrics | None:
        return None

    async def leftovers(self, queue: str) -> dict[str, Any]:
        """Jobs still waiting: not lost, just not started within the scenario's limit."""
        await trio.sleep(0.5)  # a duplicate start would show up by now
        return {"pending_left": await self.client.pending(), "final_pop_empty": True}


async def analyze(database_url: str) -> None:
    """Table statistics once the timers are in. A fresh database has none, and a planner
    without them can pick a plan that sorts the whole backlog on every claim (Procrastinate's
    fetch: 16 ms instead of 0.1 ms with 10,000 jobs waiting); a long-running service has had
    autovacuum's ANALYZE by then. Both parties get it, at the same point."""
    import psycopg

    def run() -> None:
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute("ANALYZE")

    await trio.to_thread.run_sync(run)


async def _calibrate(send: Any) -> float:
    """Timers/s of 500-timer batches, timed after CALIBRATION_WARMUP untimed ones (the first
    requests on each pool connection are slower)."""
    stamp = f"{time.monotonic_ns()}"
    return await calibration_rate(
        lambda b: send([(f"cal-{stamp}-{b}-{i}", FAR_DELAY_MS) for i in range(BUNDLE)]),
        CALIBRATION_BUNDLES)

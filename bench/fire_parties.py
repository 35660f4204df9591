"""The two sides of ``bench.fire_lag``, behind one small interface, and its statistics.

A *party* schedules timers (key, delayMs), reports each timer's arrival into a
``bench.timer_lag.Delivery`` (which does the exactly-once bookkeeping), and says what is left
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

from bench import peer_procrastinate as peer
from bench.log_throughput import Failures, percentile
from bench.sdk_consumer import SdkConsumer
from bench.timer_lag import (
    BUNDLE,
    CALIBRATION_WARMUP,
    FAR_DELAY_MS,
    FIRE_LAG,
    Api,
    Delivery,
    Metrics,
    consume,
    final_check,
    histogram_quantile,
    lag_summary,
    settle_metrics,
)

CALIBRATION_BUNDLES = 6
QUANTILES = (50, 90, 99, 99.9)
CDF_POINTS = 200


# -- statistics -------------------------------------------------------------------------------


def qname(q: float) -> str:
    return f"p{q:g}".replace(".", "_")  # p50, p99_9


def quantiles(samples_s: list[float]) -> dict[str, Any]:
    """p50/p90/p99/p99.9/max in ms (nearest rank). A timer that never arrived counts as
    +inf (``missing``): a percentile that lands on one is None, i.e. "more than the wait"."""
    if not samples_s:
        return {"n": 0}
    ordered = sorted(samples_s)
    finite = [x for x in ordered if math.isfinite(x)]

    def ms(x: float) -> float | None:
        return round(x * 1000, 2) if math.isfinite(x) else None

    out: dict[str, Any] = {"n": len(ordered), "missing": len(ordered) - len(finite)}
    for q in QUANTILES:
        out[qname(q)] = ms(percentile(ordered, q))
    out["max"] = ms(ordered[-1])
    out["mean"] = round(sum(finite) / len(finite) * 1000, 2) if finite else None
    out["cdf_ms"] = cdf_points(finite, len(ordered))
    return out


def cdf_points(finite_s: list[float], total: int) -> list[list[float]]:
    """[lag ms, fraction <= it] at ranks spaced evenly in log(1 - F), so the tail is drawn
    as finely as the body; small enough for the JSON."""
    n = len(finite_s)
    if not n:
        return []
    ranks = {n - 1}
    for i in range(CDF_POINTS):
        tail = 10 ** (-4 * i / (CDF_POINTS - 1))  # 1 .. 1e-4 of the timers above
        ranks.add(min(n - 1, max(0, round(total * (1 - tail)) - 1)))
    return [[round(finite_s[r] * 1000, 3), round((r + 1) / total, 6)] for r in sorted(ranks)]


def metric_lag(m: Metrics | None) -> dict[str, Any]:
    """``lag_summary`` of the broker histogram plus p99.9 (interpolated inside buckets)."""
    out = lag_summary(m)
    if m is not None and out.get("count"):
        value = histogram_quantile(m.buckets(FIRE_LAG), 0.999)
        out["p99_9_ms"] = None if value is None else round(value * 1000, 2)
        out["cdf_ms"] = [[round(le * 1000, 3), round(c / out["count"], 6)]
                         for le, c in m.buckets(FIRE_LAG) if math.isfinite(le)]
    return out


def arrival_lags(delivery: Delivery) -> list[float]:
    """Per scheduled timer: first arrival minus due (seconds), +inf if it never arrived."""
    out = []
    for key, (due, _) in delivery.expected.items():
        copies = delivery.frames.get(key)
        out.append(copies[0][0] - due if copies else math.inf)
    return out


def merge(metrics: list[Metrics | None]) -> Metrics | None:
    """Several brokers' scrapes as one (counters and histogram buckets add up)."""
    known = [m for m in metrics if m is not None]
    if not known:
        return None
    samples: dict[Any, float] = {}
    for m in known:
        for k, v in m.samples.items():
            samples[k] = samples.get(k, 0.0) + v
    return Metrics(samples)


# -- parties ----------------------------------------------------------------------------------


CONSUMERS = {
    # party name -> how its timers are received
    "ours": "sdk",            # Client.consume() at its defaults, asyncio, its own process
    "ours-sync": "sdk-sync",  # SyncClient.consume() at its defaults, its own process
    "ours-wire": "wire",      # a long-polling autoAck pop loop in the bench (the wire's view)
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
                got = await api.bundle(scenario, [
                    {"action": "schedule", "queue": queue, "key": key, "delayMs": delay,
                     "payload": {"k": key}} for key, delay in entries[i:i + BUNDLE]])
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
        await self._api().bundle(f"{scenario} calibration", [
            {"action": "schedule", "queue": f"{queue}-calibration", "key": key,
             "delayMs": delay, "payload": {}} for key, delay in entries])

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
                self.delivery.schedule_answer({"key": key, "deliverAt": peer.iso(scheduled)})

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
    for b in range(CALIBRATION_WARMUP + CALIBRATION_BUNDLES):
        if b == CALIBRATION_WARMUP:
            t0 = time.perf_counter()
        await send([(f"cal-{stamp}-{b}-{i}", FAR_DELAY_MS) for i in range(BUNDLE)])
    return CALIBRATION_BUNDLES * BUNDLE / (time.perf_counter() - t0)

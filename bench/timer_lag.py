"""Timer fire lag, burst drain and schedule throughput over real HTTP, end to end.

What it measures, against a broker subprocess (``python -m queen_trio serve``; a fresh one per
scenario, so its metrics start at zero) reached over TCP with the SDK's HTTP client
(``queen_trio.client.wire.LeanClient``) under trio:

1. ``idle``: 300 timers, one ``PUT /api/v1/timers/{q}/{key}`` every 100 ms, each with a
   random ``delayMs`` in 200..3000 drawn so that no two come due within 25 ms of each other
   (``bench.harness.spacing``): they come due one at a time (~10/s) on an idle broker. Lag
   two ways:
   (a) the broker's histogram ``queen_timers_fire_lag_seconds`` (fire commit minus
       ``deliver_at`` on PostgreSQL's clock): count and p50/p90/p99 interpolated inside the
       buckets (as Prometheus' ``histogram_quantile`` does; the buckets are 1 ms wide up to
       30 ms, so the figures are good to about a millisecond);
   (b) end to end: a consumer long-polls the destination queue
       (``GET /api/v1/pop/queue/{q}?wait=true&timeout=5000&batch=100&autoAck=true``) and notes
       the wall clock (``time.time()``) when each answer arrives; lag = that minus the
       ``deliverAt`` the schedule response returned. The broker, PostgreSQL and this script run
       on the same machine and read the same clock, so no clock offset enters.
   A third view needs no clock comparison at all: the frame's ``createdAt`` (PostgreSQL's
   ``clock_timestamp()`` when the fire inserted it) minus its ``deliverAt``; it is also the
   "no earlier than" check (a frame with createdAt < deliverAt is counted as "early").
1b. ``idle-lean``: the same, but the consumer is a minimal HTTP/1.1 client on a blocking
   socket (``LeanConsumer``) instead of the SDK's HTTP client on trio: what the broker
   delivers to the wire, without the consumer library's own cost.
2. ``steady``: 500 timers/s due for 20 s (10,000 timers). They are scheduled ahead of time in
   500-timer ``POST /api/v1/transaction`` bundles (top-level ``timers`` array), one client,
   with delays computed at send time so that timer i is due at T0 + i/500 s, T0 being ~3 s after
   scheduling ends (the scheduling time is estimated from 3 calibration bundles, after 10
   warm-up bundles, on another queue, due in an hour). Metric lag percentiles and end-to-end
   lag percentiles.
3. ``burst``: 100,000 timers (20,000 with ``--quick``) all due at the same instant, scheduled
   in 500-timer bundles by one client, the delay of each bundle computed at send time so that
   all come due ~2 s after the last schedule request (the scheduling rate is first estimated
   from 6 calibration bundles, after 10 warm-up bundles, on another queue, due in an hour; the
   lead actually obtained is printed). Drain rate three ways: the fired counter
   ``queen_timers_fired_total`` polled from /metrics every 100 ms (first poll showing a fire to
   the first showing all; this one is compared with the target), the frames' ``createdAt``
   span, and the frames' arrival at one consumer (pop batch=1000, autoAck). The
   lag of the last timer, and an exactly-once check: every frame is read and its
   ``message["timer"]["key"]`` counted; lost = scheduled keys never received, duplicated =
   frames beyond the first per key; then a last pop must find nothing and the queue must list
   no pending timer.
4. ``schedule``: (a) single PUTs from 32 concurrent clients for 10 s: requests/s and latency
   p50/p90/p99/max; (b) 500-timer bundles from C = 1 and C = 4 clients for 10 s: timers/s;
   (c) the same through Queen's batch route, ``POST /api/v1/timers`` with 256 operations (its
   ceiling) a call.
   Delays are one hour, so nothing fires. Each row runs on its own fresh broker, so a broker
   that dies in one row does not take the others with it.

Every response is checked (status, shape, per-timer status); failures are recorded with the
request and the broker's answer and printed at the end, together with the broker's own request
counts by status (from /metrics) and its log from its first ERROR on. Each scenario has a time
limit, so a hang is reported, not waited out; a watchdog stops a scenario at once if the
broker process dies (its exit code, e.g. -11 for SIGSEGV, is reported). The CPU each party
used (client / broker / PostgreSQL / the rest of the machine) and the load average are printed
per scenario: the machine has few cores and other work may be running.

Targets (PASS/FAIL): idle metric p50 <= 2 ms and p99 <= 5 ms; idle end-to-end p50 <= 4 ms and
p99 <= 10 ms; steady metric p99 <= QUEEN_SWEEPER_MIN_SLEEP_MS (10 ms) + 5 ms; burst drain
>= 20,000 timers/s with 0 lost and 0 duplicated; schedule >= 1,000 PUT/s with 32 clients and
>= 10,000 timers/s through 500-timer bundles.

Run from the repository root::

    python -m bench.timer_lag | tee bench/results/timer_lag.txt
    python -m bench.timer_lag --scenario idle burst --quick

``--quick`` shortens everything (idle 100 timers, steady 5 s, burst 20,000, schedule 3 s per
row). ``--scenario`` picks scenarios (idle, steady, burst, schedule; default all, in that order).
The broker gets a free port and a temporary QUEEN_DATA_DIR (an embedded PostgreSQL), or uses
``$QUEEN_DATABASE_URL`` if set; ``--url http://host:port`` measures a running broker instead
(its metrics are then read as differences). The summary goes to bench/results/timer_lag.json
(``--json`` to change).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import math
import os
import random
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import trio

from bench.harness.api import REQUEST_TIMEOUT_S, Api, epoch
from bench.harness.brokers import broker_process
from bench.harness.collector import collector_paused
from bench.harness.cpu import CpuMeter, cpu_cell
from bench.harness.metrics import Metrics, lag_summary, request_counts, sweeper_summary
from bench.harness.report import Failures, load, machine_info, save_json, verdict
from bench.harness.spacing import IDLE_GAP_S, SpacedDelays
from bench.harness.stats import distribution
from bench.harness.timers import (
    BATCH,
    BUNDLE,
    FAR_DELAY_MS,
    FINAL_POP_BATCH,
    METRIC_SETTLE_S,
    SCHEDULE_ESTIMATE_MARGIN,
    Ctx,
    Delivery,
    bundle_entries,
    calibration_rate,
    consume,
    consume_lean,
    delivery_failures,
    final_check,
    hang,
    new_key,
    settle_metrics,
    timed_clients,
    undelivered,
    wait_delivered,
    watchdog,
)
from queen_trio.client.wire import LeanClient

RESULTS_DIR = Path(__file__).resolve().parent / "results"
SCENARIOS = ("idle", "idle-lean", "steady", "burst", "schedule")

MIN_SLEEP_MS = int(os.environ.get("QUEEN_SWEEPER_MIN_SLEEP_MS") or 10)

IDLE_TIMERS = 300
IDLE_SPACING_S = 0.1
IDLE_DELAY_MS = (200, 3000)
IDLE_SEED = 20250101
IDLE_LIMIT_S = 90.0

STEADY_RATE = 500  # timers due per second
STEADY_SECONDS = 20
STEADY_LEAD_S = 3.0  # first due instant after scheduling ends
STEADY_LIMIT_S = 180.0

BURST_TIMERS = 100_000
BURST_TIMERS_QUICK = 20_000
# One scheduling client: concurrent schedule requests can crash the broker (see the
# schedule scenario), and the burst is about the drain, not about scheduling.
BURST_CLIENTS = 1
BURST_CALIBRATION_BUNDLES = 6
BURST_LEAD_S = 2.0  # due instant after the last schedule request
BURST_POLL_S = 0.1
BURST_POP_BATCH = FINAL_POP_BATCH
BURST_LIMIT_S = 480.0
STEADY_CALIBRATION_BUNDLES = 3

SCHEDULE_SECONDS = 10.0
PUT_CLIENTS = 32
BUNDLE_CLIENTS = (1, 4)
SCHEDULE_LIMIT_S = 120.0

DRAIN_GRACE_S = 15.0  # after the last due instant, how long to wait for the rest

TARGET_IDLE_METRIC_P50_MS = 2.0
TARGET_IDLE_METRIC_P99_MS = 5.0
TARGET_IDLE_E2E_P50_MS = 4.0
TARGET_IDLE_E2E_P99_MS = 10.0
TARGET_STEADY_P99_MS = MIN_SLEEP_MS + 5.0
TARGET_BURST_RATE = 20_000.0
TARGET_PUT_RATE = 1_000.0
TARGET_BUNDLE_RATE = 10_000.0

CLOCK_NOTE = ("end-to-end lag = consumer's time.time() when the pop answer arrived - deliverAt "
              "from the schedule response (PostgreSQL's clock); broker, PostgreSQL and this "
              "script share one machine and one clock")


# -- scenario plumbing ------------------------------------------------------------------------


async def calibrate(ctx: Ctx, scenario: str, bundles: int) -> float:
    """Timers/s one client schedules through 500-timer bundles (on a side queue, due in an
    hour), timed after CALIBRATION_WARMUP untimed bundles: a fresh broker's first requests on
    each pool connection are slower, and an estimate made from them leaves a long lead."""
    queue = f"lag-{scenario}-calibration-{ctx.run}"
    return await calibration_rate(lambda b: ctx.api.bundle(
        f"{scenario} calibration",
        bundle_entries(queue, f"cal-{b}", range(BUNDLE), lambda _: FAR_DELAY_MS, scenario)),
        bundles)


async def wrap_up(ctx: Ctx, name: str, delivery: Delivery, queue: str, m0: Metrics | None,
                  out: dict[str, Any]) -> tuple[Metrics | None, Metrics | None]:
    """Once a scenario's timers are in: the load average, the settled metrics, the final
    check and the delivery report into ``out``; the metrics and their change since ``m0``."""
    out["load_avg_end"] = load()
    m1 = await settle_metrics(ctx.api, len(delivery.expected))
    delta = m1.minus(m0) if m1 else None
    out.update(final_check=await final_check(ctx.api, delivery, queue))
    report = delivery.report()
    delivery_failures(ctx.api, name, report)
    out.update(report)
    return m1, delta


# -- 1. idle ----------------------------------------------------------------------------------


async def scenario_idle(ctx: Ctx, *, lean: bool = False) -> dict[str, Any]:
    name = "idle-lean" if lean else "idle"
    n = 100 if ctx.quick else IDLE_TIMERS
    queue = f"lag-idle-{ctx.run}"
    spaced = SpacedDelays(random.Random(IDLE_SEED), IDLE_DELAY_MS)
    delivery = Delivery(name)
    put_rtt: list[float] = []
    phase = "starting"
    out: dict[str, Any] = {"timers": n, "spacing_ms": IDLE_SPACING_S * 1000,
                           "delay_ms": list(IDLE_DELAY_MS), "due_gap_ms": IDLE_GAP_S * 1000,
                           "seed": IDLE_SEED}
    await ctx.api.configure(name, queue)
    m0 = await ctx.api.metrics()
    cpu0, t0 = ctx.cpu.snapshot(), time.perf_counter()
    out["load_avg_start"] = load()
    with ctx.limit(IDLE_LIMIT_S) as scope:
        async with trio.open_nursery() as nursery:
            if lean:
                nursery.start_soon(consume_lean, ctx, delivery, queue, 100)
            else:
                nursery.start_soon(consume, ctx.api, delivery, queue, 100)
            phase = "scheduling"
            start = trio.current_time()
            last_due = 0.0
            for i in range(n):
                await trio.sleep_until(start + i * IDLE_SPACING_S)
                delay = spaced.draw(time.time())
                ts = time.perf_counter()
                answer = await ctx.api.put_timer(name, queue, new_key("idle", i), delay,
                                                 {"scenario": name, "i": i})
                put_rtt.append(time.perf_counter() - ts)
                if answer is not None:
                    delivery.schedule_answer(answer)
                    last_due = max(last_due, delivery.expected[answer["timerKey"]][0])
            delivery.scheduling_done = True
            phase = "waiting for the last timers"
            deadline = time.monotonic() + max(0.0, last_due - time.time()) + DRAIN_GRACE_S
            why = await wait_delivered(delivery, deadline, stall_after=deadline)
            if why:
                undelivered(ctx, name, delivery, why)
            nursery.cancel_scope.cancel()
    if scope.cancelled_caught:
        hang(ctx, name, IDLE_LIMIT_S, phase)
    out["cpu_cores"] = CpuMeter.cores(cpu0, ctx.cpu.snapshot(), time.perf_counter() - t0)
    m1, delta = await wrap_up(ctx, name, delivery, queue, m0, out)
    out["metric_lag"] = lag_summary(delta)
    out["sweeper"] = sweeper_summary(delta)
    out["put_rtt_ms"] = distribution(put_rtt)
    out["requests"] = request_counts(m1)
    return out


# -- 2. steady --------------------------------------------------------------------------------


async def scenario_steady(ctx: Ctx) -> dict[str, Any]:
    name = "steady"
    seconds = 5 if ctx.quick else STEADY_SECONDS
    n = STEADY_RATE * seconds
    queue = f"lag-steady-{ctx.run}"
    delivery = Delivery(name)
    phase = "calibrating"
    out: dict[str, Any] = {"rate": STEADY_RATE, "seconds": seconds, "timers": n,
                           "bundle": BUNDLE, "lead_target_s": STEADY_LEAD_S}
    await ctx.api.configure(name, queue)
    m0 = await ctx.api.metrics()
    out["load_avg_start"] = load()
    cpu: dict[str, Any] = {}
    with ctx.limit(STEADY_LIMIT_S) as scope:
        rate = await calibrate(ctx, name, STEADY_CALIBRATION_BUNDLES)
        estimate = n / rate * SCHEDULE_ESTIMATE_MARGIN
        first_due = time.time() + estimate + STEADY_LEAD_S
        out["calibration_timers_per_s"] = round(rate)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(consume, ctx.api, delivery, queue, 100)
            phase = "scheduling"
            t_sched = time.time()
            for b in range(n // BUNDLE):
                now = time.time()
                answers = await ctx.api.bundle(name, bundle_entries(
                    queue, "steady", range(b * BUNDLE, (b + 1) * BUNDLE),
                    functools.partial(
                        lambda i, now: round((first_due + i / STEADY_RATE - now) * 1000),
                        now=now), name))
                for answer in answers or []:
                    delivery.schedule_answer(answer)
            sched_end = time.time()
            delivery.scheduling_done = True
            out["scheduling_s"] = round(sched_end - t_sched, 2)
            out["lead_s"] = round(first_due - sched_end, 2)
            if first_due - sched_end < 1.0:
                out["note"] = (f"scheduling took longer than estimated: it ended "
                               f"{first_due - sched_end:.2f} s before the first due instant "
                               f"(planned: {STEADY_LEAD_S} s)")
            phase = "waiting for the first due instant"
            await trio.sleep_until(trio.current_time() + max(0.0, first_due - time.time()))
            cpu["before"], cpu["t"] = ctx.cpu.snapshot(), time.perf_counter()
            phase = "timers coming due"
            await trio.sleep_until(trio.current_time() + max(0.0, first_due + seconds
                                                             - time.time()))
            out["cpu_cores"] = CpuMeter.cores(cpu["before"], ctx.cpu.snapshot(),
                                              time.perf_counter() - cpu["t"])
            phase = "waiting for the last timers"
            deadline = time.monotonic() + DRAIN_GRACE_S
            why = await wait_delivered(delivery, deadline, stall_after=deadline)
            if why:
                undelivered(ctx, name, delivery, why)
            nursery.cancel_scope.cancel()
    if scope.cancelled_caught:
        hang(ctx, name, STEADY_LIMIT_S, phase)
    m1, delta = await wrap_up(ctx, name, delivery, queue, m0, out)
    dues = sorted(d for d, _ in delivery.expected.values())
    if len(dues) > 1:
        out["due_span_s"] = round(dues[-1] - dues[0], 3)
        out["due_rate_per_s"] = round((len(dues) - 1) / (dues[-1] - dues[0]))
    out["metric_lag"] = lag_summary(delta)
    out["sweeper"] = sweeper_summary(delta)
    out["requests"] = request_counts(m1)
    return out


# -- 3. burst ---------------------------------------------------------------------------------


async def scenario_burst(ctx: Ctx) -> dict[str, Any]:
    name = "burst"
    n = BURST_TIMERS_QUICK if ctx.quick else BURST_TIMERS
    queue = f"lag-burst-{ctx.run}"
    delivery = Delivery(name)
    polls: list[tuple[float, float]] = []  # (wall clock, fired counter)
    phase = "calibrating"
    out: dict[str, Any] = {"timers": n, "bundle": BUNDLE, "schedule_clients": BURST_CLIENTS,
                           "lead_target_s": BURST_LEAD_S, "pop_batch": BURST_POP_BATCH}
    await ctx.api.configure(name, queue)
    m0 = await ctx.api.metrics()
    fired0 = m0.value("queen_timers_fired_total") if m0 else 0.0
    out["load_avg_start"] = load()
    cpu: dict[str, Any] = {}
    sched = {"last_sent": 0.0, "last_answer": 0.0}

    async def poller(counted_all: trio.Event, start_at: float) -> None:
        """The fired counter every 100 ms from ``start_at`` (wall clock) until it shows every
        scheduled timer."""
        await trio.sleep(max(0.0, start_at - time.time()))
        next_at = trio.current_time()
        while True:
            value = await ctx.api.fired_total()
            if value is not None:
                polls.append((time.time(), value - fired0))
                if delivery.scheduling_done and value - fired0 >= len(delivery.expected):
                    counted_all.set()
                    return
            next_at += BURST_POLL_S
            await trio.sleep_until(max(next_at, trio.current_time()))

    with ctx.limit(BURST_LIMIT_S) as scope:
        rate = await calibrate(ctx, name, BURST_CALIBRATION_BUNDLES)
        out["calibration_timers_per_s"] = round(rate)
        due = time.time() + n / rate * SCHEDULE_ESTIMATE_MARGIN + BURST_LEAD_S
        todo = iter(range(n // BUNDLE))

        async def scheduler() -> None:
            for b in todo:
                now = time.time()
                sched["last_sent"] = max(sched["last_sent"], now)
                delay = round((due - now) * 1000)
                answers = await ctx.api.bundle(name, bundle_entries(
                    queue, "burst", range(b * BUNDLE, (b + 1) * BUNDLE),
                    functools.partial(lambda _, d: d, d=delay),
                    name))
                sched["last_answer"] = max(sched["last_answer"], time.time())
                for answer in answers or []:
                    delivery.schedule_answer(answer)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(consume, ctx.api, delivery, queue, BURST_POP_BATCH)
            counted_all = trio.Event()
            nursery.start_soon(poller, counted_all, due - 1.0)
            phase = "scheduling"
            t_sched = time.time()
            async with trio.open_nursery() as schedulers:
                for _ in range(BURST_CLIENTS):
                    schedulers.start_soon(scheduler)
            delivery.scheduling_done = True
            out["scheduling_s"] = round(time.time() - t_sched, 2)
            out["scheduled_timers_per_s"] = round(len(delivery.expected)
                                                  / max(1e-9, time.time() - t_sched))
            out["lead_s"] = round(due - sched["last_sent"], 2)
            if due - sched["last_answer"] < 0.5:
                out["note"] = (f"scheduling took longer than estimated: the last schedule "
                               f"request was answered {sched['last_answer'] - due:+.2f} s after "
                               "the due instant, so the drain began while scheduling went on")
            phase = "waiting for the due instant"
            await trio.sleep(max(0.0, due - time.time()))
            cpu["before"], cpu["t"] = ctx.cpu.snapshot(), time.perf_counter()
            phase = "draining"
            stall_after = time.monotonic()
            why = await wait_delivered(delivery, math.inf, stall_after=stall_after)
            if why:
                undelivered(ctx, name, delivery, why)
            out["cpu_cores"] = CpuMeter.cores(cpu["before"], ctx.cpu.snapshot(),
                                              time.perf_counter() - cpu["t"])
            phase = "waiting for the fired counter"
            with trio.move_on_after(METRIC_SETTLE_S):  # it can trail the consumer a little
                await counted_all.wait()
            nursery.cancel_scope.cancel()
    if scope.cancelled_caught:
        hang(ctx, name, BURST_LIMIT_S, phase)
    m1, delta = await wrap_up(ctx, name, delivery, queue, m0, out)
    out.update(burst_drain(delivery, polls, len(delivery.expected)))
    if delta is not None and delta.value("queen_timers_fired_total") != len(delivery.expected):
        ctx.failures.add(name, "fired counter",
                         f"queen_timers_fired_total rose by "
                         f"{delta.value('queen_timers_fired_total'):.0f}, "
                         f"{len(delivery.expected)} timers were scheduled")
    out["metric_lag"] = lag_summary(delta)
    out["sweeper"] = sweeper_summary(delta)
    out["requests"] = request_counts(m1)
    return out


def burst_drain(delivery: Delivery, polls: list[tuple[float, float]], n: int) -> dict[str, Any]:
    """Drain rate and last-timer lag, from the fired counter, createdAt and arrivals."""
    out: dict[str, Any] = {}
    dues = [d for d, _ in delivery.expected.values()]
    if dues:
        out["deliver_at_spread_ms"] = round((max(dues) - min(dues)) * 1000, 1)
    due_last = max(dues) if dues else None
    # Fired counter: the drain started between the last poll showing 0 and the first showing
    # more, ended between the last poll below n and the first at n; take the midpoints.
    first = next((i for i, (_, f) in enumerate(polls) if f > 0), None)
    full = next((i for i, (_, f) in enumerate(polls) if f >= n), None)
    if first is not None and full is not None and first > 0 and full > first:
        start = (polls[first - 1][0] + polls[first][0]) / 2
        end = (polls[full - 1][0] + polls[full][0]) / 2
        out["drain_counter"] = {
            "seconds": round(end - start, 3),
            "timers_per_s": round(n / (end - start)) if end > start else None,
            "resolution_s": BURST_POLL_S, "polls": len(polls),
            "first_fire_after_due_s": round(start - min(dues), 3) if dues else None,
            "last_timer_lag_s": round(end - due_last, 3) if due_last else None,
        }
    elif polls:
        out["drain_counter"] = {"polls": len(polls), "last_fired": polls[-1][1],
                                "note": "the counter did not go from 0 to all between polls"}
    created = []
    last_lag = None
    for copies in delivery.frames.values():
        try:
            created.append(epoch(copies[0][2]))
        except ValueError:
            continue
    if len(created) > 1:
        span = max(created) - min(created)
        out["drain_created_at"] = {
            "seconds": round(span, 3),
            "timers_per_s": round((len(created) - 1) / span) if span > 0 else None,
        }
    arrivals = sorted(c[0][0] for c in delivery.frames.values())
    if len(arrivals) > 1:
        span = arrivals[-1] - arrivals[0]
        out["drain_arrival"] = {
            "seconds": round(span, 3),
            "timers_per_s": round((len(arrivals) - 1) / span) if span > 0 else None,
        }
    if delivery.frames and delivery.expected:
        last_key = max((k for k in delivery.frames if k in delivery.expected),
                       key=lambda k: delivery.frames[k][0][0], default=None)
        if last_key is not None:
            due_k = delivery.expected[last_key][0]
            last_lag = {"key": last_key,
                        "at_consumer_s": round(delivery.frames[last_key][0][0] - due_k, 3)}
            try:
                last_created = max(created)
                last_lag["in_log_s"] = round(last_created - due_k, 3)
            except ValueError:
                pass
    out["last_timer_lag"] = last_lag
    return out


# -- 4. schedule throughput -------------------------------------------------------------------


# Bundles and batches alternate, so that each pair ran under much the same machine load.
SCHEDULE_PARTS = ("put", *(f"{kind}-c{c}" for c in BUNDLE_CLIENTS for kind in ("bundle", "batch")))


async def scenario_schedule(ctx: Ctx, part: str) -> dict[str, Any]:
    """One row of the schedule-throughput table (each row gets its own fresh broker)."""
    name = f"schedule[{part}]"
    seconds = 3.0 if ctx.quick else SCHEDULE_SECONDS
    out: dict[str, Any] = {"part": part, "seconds": seconds, "delay_ms": FAR_DELAY_MS,
                           "row": None}
    m0 = await ctx.api.metrics()
    out["load_avg_start"] = load()
    with ctx.limit(SCHEDULE_LIMIT_S) as scope:
        queue = f"sched-{part}-{ctx.run}"
        if part == "put":
            async def put(c: int, n: int) -> int | None:
                answer = await ctx.api.put_timer(name, queue, f"put-{c:02d}-{n:07d}",
                                                 FAR_DELAY_MS, {"scenario": name, "c": c, "n": n})
                return None if answer is None else 1

            out["row"] = await timed_clients(ctx, PUT_CLIENTS, seconds, 2, put)
        else:
            kind, _, c_clients = part.partition("-c")
            send, size = (ctx.api.bundle, BUNDLE) if kind == "bundle" else (ctx.api.batch, BATCH)

            async def bundle(c: int, n: int) -> int | None:
                answers = await send(name, bundle_entries(
                    queue, f"b-{c:02d}-{n:05d}", range(size), lambda _: FAR_DELAY_MS, name))
                return None if answers is None else len(answers)

            out["row"] = await timed_clients(ctx, int(c_clients), seconds, 1, bundle)
    if scope.cancelled_caught:
        hang(ctx, name, SCHEDULE_LIMIT_S, part)
    out["load_avg_end"] = load()
    m1 = await ctx.api.metrics()
    delta = m1.minus(m0) if m1 else None
    out["sweeper"] = sweeper_summary(delta)
    if delta is not None and delta.value("queen_timers_fired_total"):
        ctx.failures.add(name, "fired", f"{delta.value('queen_timers_fired_total'):.0f} timers "
                                        "fired although all were due in an hour")
    out["requests"] = request_counts(m1)
    return out


async def scenario(ctx: Ctx, name: str, part: str | None) -> dict[str, Any]:
    if name == "idle":
        return await scenario_idle(ctx)
    if name == "idle-lean":
        return await scenario_idle(ctx, lean=True)
    if name == "steady":
        return await scenario_steady(ctx)
    if name == "burst":
        return await scenario_burst(ctx)
    assert part is not None
    return await scenario_schedule(ctx, part)


async def run_scenario(name: str, part: str | None, url: str, failures: Failures,
                       cpu: CpuMeter, quick: bool) -> dict[str, Any]:
    # The SDK's HTTP client (queen_trio.client.wire), as a user's consumer would have.
    async with LeanClient(url, timeout=REQUEST_TIMEOUT_S) as client:
        ctx = Ctx(Api(client, failures), failures, cpu, uuid.uuid4().hex[:8], quick)
        t0 = time.monotonic()
        async with trio.open_nursery() as nursery:
            if cpu.broker_pid is not None and Path("/proc").is_dir():  # noqa: ASYNC240
                nursery.start_soon(watchdog, ctx, cpu.broker_pid)
            with collector_paused():
                result = await scenario(ctx, name, part)
            nursery.cancel_scope.cancel()
        result["elapsed_s"] = round(time.monotonic() - t0, 1)
        result["broker_died"] = ctx.broker_died
        return result


# -- report -----------------------------------------------------------------------------------


def ms(value: Any, width: int = 7) -> str:
    return f"{value:{width}.1f}" if isinstance(value, int | float) else f"{'-':>{width}}"


def dist_row(label: str, d: dict[str, Any]) -> str:
    return (f"   {label:<38} {d.get('n', 0):>7} {ms(d.get('p50'))} {ms(d.get('p90'))} "
            f"{ms(d.get('p99'))} {ms(d.get('max'), 8)}")


def metric_row(label: str, lag: dict[str, Any]) -> str:
    return (f"   {label:<38} {lag.get('count', 0):>7} {ms(lag.get('p50_ms'))} "
            f"{ms(lag.get('p90_ms'))} {ms(lag.get('p99_ms'))} "
            f"{lag.get('max_bucket_ms', '-'):>8}   (mean {ms(lag.get('mean_ms'), 0)})")


LAG_HEADER = (f"   {'lag (ms)':<38} {'n':>7} {'p50':>7} {'p90':>7} {'p99':>7} {'max':>8}")


def delivery_line(r: dict[str, Any]) -> str:
    fc = r.get("final_check", {})
    ok = (not r.get("lost") and not r.get("duplicates") and not r.get("unexpected")
          and not r.get("early") and fc.get("final_pop_empty") and fc.get("pending_left") == 0)
    return (f"   delivery: scheduled {r.get('scheduled', 0):,}, received "
            f"{r.get('received_distinct', 0):,} distinct, lost {r.get('lost')}, duplicated "
            f"{r.get('duplicates')}, unexpected "
            f"{r.get('unexpected')}, early (createdAt < deliverAt) {r.get('early')}, final pop "
            f"empty {'yes' if fc.get('final_pop_empty') else 'NO'}, pending left "
            f"{fc.get('pending_left')} -> {'OK' if ok else 'FAILED'}")


def sweeper_line(s: dict[str, Any]) -> str:
    if not s:
        return "   sweeper: metrics unavailable"
    return (f"   sweeper: fired {s['fired']:,}, claims {s['claims']:,} "
            f"({s['timers_per_claim']} timers/claim), wake-ups {s['wakeups']}, failures "
            f"{s['failures']}, dead-lettered {s['dead_lettered']}; parked pops behind the fire "
            f"lock {s.get('pop_fire_waits') or {}}")


def context_line(r: dict[str, Any]) -> str:
    cores = r.get("cpu_cores")
    cell = cpu_cell(cores) if cores else "-"
    return (f"   CPU cores client/broker/pg/other: {cell}; load average "
            f"{r.get('load_avg_start')} -> {r.get('load_avg_end')}; {r.get('elapsed_s')} s")


def print_idle(r: dict[str, Any], *, title: str = "1. idle") -> None:
    print(f"{title}: {r['timers']} timers, one PUT every {r['spacing_ms']:.0f} ms, delayMs "
          f"uniform in {r['delay_ms'][0]}..{r['delay_ms'][1]} (seed {r['seed']})")
    print(LAG_HEADER)
    print(metric_row("(a) metric: fire commit - deliverAt", r.get("metric_lag", {})))
    print(dist_row("(b) end to end: pop arrival - deliverAt", r.get("e2e_lag_ms", {})))
    print(dist_row("    in log: createdAt - deliverAt", r.get("in_log_lag_ms", {})))
    print(dist_row("    PUT round trip", r.get("put_rtt_ms", {})))
    print(f"   metric max is the bucket the slowest timer fell in; {CLOCK_NOTE}")
    print(delivery_line(r))
    print(sweeper_line(r.get("sweeper", {})))
    print(context_line(r))


def print_steady(r: dict[str, Any]) -> None:
    print(f"2. steady: {r['rate']} timers/s due for {r['seconds']} s ({r['timers']:,} timers), "
          f"scheduled ahead in {r['bundle']}-timer bundles (1 client, "
          f"{r.get('scheduling_s', '-')} s; calibration {r.get('calibration_timers_per_s', '-')} "
          f"timers/s); first due {r.get('lead_s', '-')} s after scheduling ended; deliverAt span "
          f"{r.get('due_span_s', '-')} s = {r.get('due_rate_per_s', '-')} timers/s")
    if r.get("note"):
        print(f"   NOTE: {r['note']}")
    print(LAG_HEADER)
    print(metric_row("metric: fire commit - deliverAt", r.get("metric_lag", {})))
    print(dist_row("end to end: pop arrival - deliverAt", r.get("e2e_lag_ms", {})))
    print(dist_row("in log: createdAt - deliverAt", r.get("in_log_lag_ms", {})))
    print(delivery_line(r))
    print(sweeper_line(r.get("sweeper", {})))
    print(context_line(r) + f" (CPU over the {r['seconds']} s the timers came due)")


def print_burst(r: dict[str, Any]) -> None:
    print(f"3. burst: {r['timers']:,} timers due at one instant (deliverAt spread "
          f"{r.get('deliver_at_spread_ms', '-')} ms), scheduled in {r['bundle']}-timer bundles by "
          f"{r['schedule_clients']} client(s) in {r.get('scheduling_s', '-')} s "
          f"({r.get('scheduled_timers_per_s', '-')} timers/s; calibration "
          f"{r.get('calibration_timers_per_s', '-')}); due {r.get('lead_s', '-')} s after the "
          f"last schedule request; one consumer pop(batch={r['pop_batch']}, autoAck)")
    print(f"   {'drain':<38} {'seconds':>8} {'timers/s':>9}")
    for key, label in (("drain_counter", "fired counter, polled every 100 ms"),
                       ("drain_created_at", "frames' createdAt, first to last"),
                       ("drain_arrival", "arrival at the consumer, first to last")):
        d = r.get(key) or {}
        rate = d.get("timers_per_s")
        print(f"   {label:<38} {ms(d.get('seconds'), 8)} "
              f"{(f'{rate:,}' if isinstance(rate, int) else '-'):>9}")
    dc = r.get("drain_counter") or {}
    last = r.get("last_timer_lag") or {}
    if r.get("note"):
        print(f"   NOTE: {r['note']}")
    print(f"   first fire {dc.get('first_fire_after_due_s', '-')} s after the due instant; "
          f"last timer's lag: {dc.get('last_timer_lag_s', '-')} s by the counter, "
          f"{last.get('in_log_s', '-')} s in the log (createdAt), "
          f"{last.get('at_consumer_s', '-')} s at the consumer")
    print(LAG_HEADER)
    print(metric_row("metric: fire commit - deliverAt", r.get("metric_lag", {})))
    print(dist_row("end to end: pop arrival - deliverAt", r.get("e2e_lag_ms", {})))
    print(dist_row("in log: createdAt - deliverAt", r.get("in_log_lag_ms", {})))
    print("   (the histogram's buckets above 1 s are 1.5, 2, 3, 5, 10, 30 s: its percentiles here "
          "are interpolations inside wide buckets; the end-to-end and in-log rows are exact)")
    print(delivery_line(r))
    print(sweeper_line(r.get("sweeper", {})))
    print(context_line(r) + " (CPU from the due instant to the last frame's arrival)")


def print_schedule(r: dict[str, Any]) -> None:
    print(f"4. schedule throughput: delayMs {r['delay_ms']} (nothing fires), "
          f"{r['seconds']:.0f} s per row after warm-up, a fresh broker per row")
    print(f"   {'mode':<19} {'C':>3} {'requests':>9} {'failed':>7} {'req/s':>8} {'timers/s':>9}"
          f"   latency ms: p50     p90     p99      max   CPU client/broker/pg/other   "
          f"load avg (1 min) start -> end")
    for part in SCHEDULE_PARTS:
        p = r["parts"].get(part)
        label = ("PUT (1 timer)" if part == "put" else f"bundle ({BUNDLE} timers)"
                 if part.startswith("bundle") else f"batch ({BATCH} timers)")
        row = (p or {}).get("row")
        if row is None:
            why = "broker died" if (p or {}).get("broker_died") else "not run or hung"
            print(f"   {label:<19} {'-':>3}   no result ({why})")
            continue
        d = row["latency_ms"]
        print(f"   {label:<19} {row['clients']:>3} {row['requests']:>9} {row['failed']:>7} "
              f"{row['requests_per_s']:>8,} {row['timers_per_s']:>9,}          "
              f"{ms(d.get('p50'))} {ms(d.get('p90'))} {ms(d.get('p99'))} {ms(d.get('max'), 8)}"
              f"   {cpu_cell(row['cpu_cores']):<27}  {p['load_avg_start'].split()[0]} -> "
              f"{p['load_avg_end'].split()[0]}"
              + ("   BROKER DIED" if p.get("broker_died") else ""))


def print_idle_lean(r: dict[str, Any]) -> None:
    print_idle(r, title="1b. idle, consumer a minimal HTTP/1.1 client (blocking socket) instead "
                        "of the SDK's HTTP client on trio")


PRINTERS = {"idle": print_idle, "idle-lean": print_idle_lean, "steady": print_steady,
            "burst": print_burst}


def targets(results: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []

    def add(target: str, measured: Any, unit: str, ok: bool, where: str = "") -> None:
        rows.append({"target": target, "measured": measured, "unit": unit,
                     "pass": bool(ok), "where": where})

    def le(value: Any, bound: float) -> bool:
        return isinstance(value, int | float) and value <= bound

    idle = results.get("idle")
    if idle:
        lag, e2e = idle.get("metric_lag", {}), idle.get("e2e_lag_ms", {})
        add(f"idle metric p50 <= {TARGET_IDLE_METRIC_P50_MS:g} ms", lag.get("p50_ms"), "ms",
            le(lag.get("p50_ms"), TARGET_IDLE_METRIC_P50_MS), f"{lag.get('count', 0)} fires")
        add(f"idle metric p99 <= {TARGET_IDLE_METRIC_P99_MS:g} ms", lag.get("p99_ms"), "ms",
            le(lag.get("p99_ms"), TARGET_IDLE_METRIC_P99_MS), f"{lag.get('count', 0)} fires")
        add(f"idle end-to-end p50 <= {TARGET_IDLE_E2E_P50_MS:g} ms", e2e.get("p50"), "ms",
            le(e2e.get("p50"), TARGET_IDLE_E2E_P50_MS), f"{e2e.get('n', 0)} frames")
        add(f"idle end-to-end p99 <= {TARGET_IDLE_E2E_P99_MS:g} ms", e2e.get("p99"), "ms",
            le(e2e.get("p99"), TARGET_IDLE_E2E_P99_MS), f"{e2e.get('n', 0)} frames")
    lean = results.get("idle-lean")
    if lean:
        e2e = lean.get("e2e_lag_ms", {})
        for q, bound in (("p50", TARGET_IDLE_E2E_P50_MS), ("p99", TARGET_IDLE_E2E_P99_MS)):
            rows.append({"target": f"  (info) idle end-to-end {q}, minimal consumer, vs "
                                   f"{bound:g} ms", "measured": e2e.get(q), "unit": "ms",
                         "pass": None, "where": "the broker to the wire; not the SDK's client"})
    steady = results.get("steady")
    if steady:
        lag, e2e = steady.get("metric_lag", {}), steady.get("e2e_lag_ms", {})
        add(f"steady {STEADY_RATE}/s metric p99 <= {TARGET_STEADY_P99_MS:g} ms",
            lag.get("p99_ms"), "ms", le(lag.get("p99_ms"), TARGET_STEADY_P99_MS),
            f"MIN_SLEEP {MIN_SLEEP_MS} ms + 5 ms; {lag.get('count', 0)} fires")
        rows.append({"target": f"  (info) steady end-to-end p99 vs {TARGET_STEADY_P99_MS:g} ms",
                     "measured": e2e.get("p99"), "unit": "ms", "pass": None,
                     "where": "not a target: includes the long-poll wake"})
    burst = results.get("burst")
    if burst:
        rate = (burst.get("drain_counter") or {}).get("timers_per_s")
        add(f"burst drain >= {TARGET_BURST_RATE:,.0f} timers/s", rate, "timers/s",
            isinstance(rate, int) and rate >= TARGET_BURST_RATE,
            f"{burst['timers']:,} timers, fired counter")
        fc = burst.get("final_check", {})
        lost = burst.get("lost")
        missing = burst["timers"] - burst.get("scheduled", 0)
        add("burst lost = 0", lost, "", lost == 0 and fc.get("pending_left") == 0
            and not missing,
            f"{burst.get('received_distinct', 0):,} of {burst.get('scheduled', 0):,} scheduled "
            "received" + (f"; {missing:,} never scheduled (requests failed)" if missing else ""))
        dup = burst.get("duplicates")
        add("burst duplicated = 0", dup, "", dup == 0 and fc.get("final_pop_empty"),
            "frames beyond the first per timer key")
    sched = results.get("schedule")
    if sched and sched.get("put"):
        put = sched["put"]
        add(f"schedule PUT >= {TARGET_PUT_RATE:,.0f} req/s, C={PUT_CLIENTS}",
            put["requests_per_s"], "req/s",
            put["requests_per_s"] >= TARGET_PUT_RATE and put["failed"] == 0,
            f"p50 {put['latency_ms'].get('p50')} ms, p99 {put['latency_ms'].get('p99')} ms")
    if sched and sched.get("bundles"):
        best = max(sched["bundles"], key=lambda b: b["timers_per_s"])
        add(f"schedule bundles >= {TARGET_BUNDLE_RATE:,.0f} timers/s", best["timers_per_s"],
            "timers/s", best["timers_per_s"] >= TARGET_BUNDLE_RATE and best["failed"] == 0,
            f"{BUNDLE}-timer bundles, best C={best['clients']}")
    return rows


def print_targets(rows: list[dict[str, Any]]) -> None:
    print("targets:")
    for t in rows:
        m = t["measured"]
        if isinstance(m, float):
            shown = f"{m:.1f} {t['unit']}"
        elif isinstance(m, int):
            shown = f"{m:,} {t['unit']}".strip()
        else:
            shown = "-"
        mark = "" if t["pass"] is None else verdict(t["pass"])
        print(f"   {t['target']:<44} {shown:>16}  {mark:<4}  ({t['where']})")


def print_failures(failures: Failures, brokers: dict[str, dict[str, Any]]) -> None:
    for name, b in brokers.items():
        req = b.get("requests") or {}
        print(f"broker [{name}]: exit code {b.get('exit_code')}, requests by status "
              f"{req.get('by_class') or 'unavailable'}"
              + (f", non-2xx {req['non_2xx']}" if req.get("non_2xx") else ""))
        if b.get("log_errors"):
            print(f"   broker [{name}] log from its first error on:")
            for line in b["log_errors"]:
                print(f"   | {line}")
    if not failures.total():
        print("failures: none (every response had the expected status and shape, every timer "
              "delivered exactly once)")
        return
    failures.print_details()


# -- main -------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.timer_lag",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--scenario", nargs="+", action="extend", choices=SCENARIOS,
                        metavar="NAME", help=f"one or more of {', '.join(SCENARIOS)} "
                                             "(default: all)")
    parser.add_argument("--quick", action="store_true",
                        help="shorter runs (burst 20,000 timers, idle 100, steady 5 s, "
                             "schedule 3 s per row)")
    parser.add_argument("--url", help="an already running broker (default: a fresh one per "
                                      "scenario)")
    parser.add_argument("--json", type=Path, default=RESULTS_DIR / "timer_lag.json",
                        help="where to write the summary (default: %(default)s)")
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    chosen = [s for s in SCENARIOS if s in (args.scenario or SCENARIOS)]
    command = " ".join(["python -m bench.timer_lag", *sys.argv[1:]])
    failures = Failures()
    started = time.monotonic()
    info: dict[str, Any] | None = None
    results: dict[str, dict[str, Any]] = {}
    brokers: dict[str, dict[str, Any]] = {}
    units = [(name, part) for name in chosen
             for part in (SCHEDULE_PARTS if name == "schedule" else (None,))]
    for name, part in units:
        unit = name if part is None else f"{name}[{part}]"
        print(f"[timer_lag] {unit}: starting a broker ...", file=sys.stderr, flush=True)
        try:
            with broker_process(args.url) as handle:
                if info is None:
                    info = machine_info(handle)
                    info["command"] = command
                    info["sweeper_min_sleep_ms"] = MIN_SLEEP_MS
                    info["clock"] = CLOCK_NOTE
                    print("queen-trio timer lag, burst drain and schedule throughput (HTTP)")
                    for key, value in info.items():
                        print(f"  {key:<21} {value}")
                    print("  (a fresh broker per scenario; CPU and load average per scenario "
                          "below)")
                    print(flush=True)
                print(f"[timer_lag] {unit}: running (broker pid {handle.pid}) ...",
                      file=sys.stderr, flush=True)
                result = trio.run(run_scenario, name, part, handle.url, failures,
                                  CpuMeter(handle.pid), args.quick)
        except RuntimeError as exc:  # the broker did not start
            failures.add(unit, "broker start", str(exc)[:2000])
            print(f"[timer_lag] {unit}: broker did not start: {exc}", file=sys.stderr)
            continue
        brokers[unit] = {"exit_code": handle.exit_code, "log_errors": handle.log_errors,
                         "requests": result.get("requests")}
        if handle.exit_code not in (0, None):
            failures.add(unit, "broker exit", f"broker exited with {handle.exit_code}"
                         + (" (SIGSEGV)" if handle.exit_code == -11 else ""))
        if part is None:
            results[name] = result
            PRINTERS[name](result)
            print(flush=True)
            continue
        merged = results.setdefault(name, {"seconds": result["seconds"],
                                           "delay_ms": result["delay_ms"], "put": None,
                                           "bundles": [], "parts": {}})
        merged["parts"][part] = result
        if result["row"] is not None:
            if part == "put":
                merged["put"] = result["row"]
            elif part.startswith("bundle"):
                merged["bundles"].append(result["row"])
        if part == SCHEDULE_PARTS[-1]:
            print_schedule(merged)
            print(flush=True)

    verdicts = targets(results)
    if verdicts:
        print_targets(verdicts)
        print()
    print_failures(failures, brokers)
    elapsed = round(time.monotonic() - started, 1)
    print(f"load average at the end {load()}; elapsed {elapsed} s")

    summary = {
        "timestamp": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": info,
        "command": command,
        "elapsed_s": elapsed,
        "config": {"quick": args.quick, "scenarios": chosen, "bundle": BUNDLE,
                   "min_sleep_ms": MIN_SLEEP_MS, "idle_timers": IDLE_TIMERS,
                   "steady_rate": STEADY_RATE, "steady_seconds": STEADY_SECONDS,
                   "burst_timers": BURST_TIMERS_QUICK if args.quick else BURST_TIMERS,
                   "schedule_estimate_margin": SCHEDULE_ESTIMATE_MARGIN,
                   "put_clients": PUT_CLIENTS, "bundle_clients": list(BUNDLE_CLIENTS),
                   "schedule_seconds": SCHEDULE_SECONDS},
        "results": results,
        "brokers": brokers,
        "targets": verdicts,
        "failures": {"total": failures.total(), "counts": failures.counts,
                     "examples": failures.examples},
    }
    save_json(args.json, summary)
    return 0 if failures.total() == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

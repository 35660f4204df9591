"""Timer wake-up latency: queen-trio beside a peer (Procrastinate), same PostgreSQL server.

Scenarios (each bounded in time; a fresh database and a fresh broker or peer worker per party):

* ``idle``: 500 timers, one PUT every 100 ms, each with a random delay in 0.2–3 s, drawn so
  that no two come due within 25 ms of each other (``bench.harness.spacing``): they come due
  one at a time on an otherwise idle service;
* ``steady``: 1,000 and 500 timers/s due for 30 s, scheduled ahead in 500-timer batches;
* ``burst``: 100,000 timers due at one instant (``--million``: 1,000,000 for ours): drain rate,
  last timer's lag, lost and duplicated;
* ``api-load`` (ours): 500 timers/s due for 20 s while 4 clients push 100-message batches and
  4 pop (autoAck) another queue as fast as they can;
* ``multi-broker`` (ours): 3 broker processes on one database, 500 timers/s for 15 s then a
  30,000 burst, scheduled round-robin through all three; exactly-once across them;
* ``cancel-race`` (ours): 300 timers, each cancelled at a random instant within ±30 ms of its
  due instant: cancel latency, and how often the answer is too_late / cancelled / absent;
  cancelled timers must never fire, the others exactly once.

Lag, for every scheduled timer: ours end to end = a long-polling consumer's receive time minus
the ``deliverAt`` the broker returned (and the broker's histogram
``queen_timers_fire_lag_seconds``: fire commit minus deliver_at on PostgreSQL's clock); the peer
= job start time minus ``scheduled_at``. All parties run on this machine and read one clock.
The peer runs idle, steady and burst at Procrastinate's default settings and at its best
latency settings (see ``bench.harness.peer_procrastinate.PROFILES``); a peer that has not
started a job by the end of the scenario's wait has it counted as not started in time (shown
as "> wait"), never as lost.

``--explore`` instead runs idle and burst (smaller: 150 timers, 30,000) for every
QUEEN_SWEEPER_MIN_SLEEP_MS in {1, 5, 10, 25} x QUEEN_SWEEPER_BATCH in {100, 500, 2000}.

Writes bench/results/fire_lag.json (merged: a scenario run replaces only its own entry),
fire_lag_explore.json, the PNG plots, and the generated section of docs/performance.md.

    pip install -e '.[dev,bench]'              # procrastinate (dev) + matplotlib (bench)
    python -m bench.fire_lag                   # everything (about 12 minutes here)
    python -m bench.fire_lag --scenario idle --quick
    python -m bench.fire_lag --explore
    python -m bench.fire_lag --readme-only     # redraw plots and README from the JSON

A temporary embedded PostgreSQL (default, durable settings) is started unless ``--admin-url``
(or QUEEN_DATABASE_URL) names a server where databases may be created.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import random
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import trio

from bench.fire_lag import report
from bench.fire_lag.parties import Ours, Peer, arrival_lags
from bench.harness import peer_procrastinate as peer
from bench.harness.api import API, REQUEST_TIMEOUT_S, Api, epoch, event
from bench.harness.brokers import brokers
from bench.harness.collector import collector_paused
from bench.harness.cpu import PartyCpu, cpu_cell
from bench.harness.metrics import metric_lag, request_counts, sweeper_summary
from bench.harness.pg import Server, shared_server
from bench.harness.report import Failures, json_default, load, now_iso, source_revision
from bench.harness.spacing import IDLE_GAP_S, SpacedDelays
from bench.harness.stats import quantiles
from bench.harness.timers import (
    SCHEDULE_ESTIMATE_MARGIN,
    Ctx,
    Delivery,
    delivery_failures,
    hang,
    new_key,
    undelivered,
    wait_delivered,
    watchdog,
)
from queen_trio.client.wire import LeanClient

RESULTS_DIR = Path(__file__).resolve().parents[1] / "results"
SCENARIOS = ("idle", "steady", "burst", "api-load", "multi-broker", "cancel-race")
WITH_PEER = ("idle", "steady", "burst")
# Beside the verdict (``ours``: Client.consume() at its defaults), in the peer's scenarios: the
# sync client's consume() and the wire-level consumer (see bench.fire_lag.parties.CONSUMERS).
OURS_BESIDE = ("ours-sync", "ours-wire")
PARTY_ENV = {"ours-w2": {"QUEEN_WORKERS": "2"}}  # the burst again with two broker processes
EXPLORE_MIN_SLEEP_MS = (1, 5, 10, 25)
EXPLORE_BATCH = (100, 500, 2000)
IDLE_SEED = 20250707
LEAD_S = 2.0  # first due instant after scheduling ends


@dataclasses.dataclass(frozen=True)
class Sizes:
    idle_timers: int = 300
    idle_spacing_s: float = 0.1
    idle_delay_ms: tuple[int, int] = (200, 3000)
    steady_rates: tuple[int, ...] = (1000, 500)
    steady_seconds: int = 20
    burst_timers: int = 50_000
    peer_burst_timers: int = 50_000
    load_rate: int = 500
    load_seconds: int = 20
    load_clients: int = 4  # pushers, and as many poppers
    multi_brokers: int = 3
    multi_rate: int = 500
    multi_seconds: int = 15
    multi_burst: int = 30_000
    cancel_timers: int = 300
    cancel_spacing_s: float = 0.05
    cancel_delay_ms: int = 1000
    cancel_window_ms: float = 30.0
    explore_idle_timers: int = 150
    explore_idle_spacing_s: float = 0.1
    explore_idle_delay_ms: tuple[int, int] = (200, 3000)
    explore_burst: int = 30_000
    # how long after the last due instant a party may take before the rest counts as
    # "not started in time" (the peer's default polls every 5 s)
    wait_idle_s: float = 8.0
    wait_steady_s: float = 15.0
    wait_burst_ours_s: float = 300.0
    wait_burst_peer_s: float = 60.0


SIZES = {
    "full": Sizes(),
    "quick": Sizes(idle_timers=60, steady_seconds=5, burst_timers=10_000,
                   peer_burst_timers=10_000, load_seconds=5, multi_seconds=4, multi_burst=5_000,
                   cancel_timers=80, explore_idle_timers=40, explore_burst=5_000,
                   wait_burst_peer_s=20.0),
    "smoke": Sizes(idle_timers=12, idle_spacing_s=0.03, idle_delay_ms=(200, 1000),
                   wait_idle_s=5.0),
}


# -- scenario drivers (either party) ----------------------------------------------------------


async def finish(party: Ours | Peer, ctx: Ctx, name: str, queue: str, out: dict[str, Any],
                 m0: Any, why: str | None, scope: trio.CancelScope, limit: float
                 ) -> dict[str, Any]:
    """Exactly-once check, lag views and what was left, once the scenario has run."""
    delivery = party.delivery
    assert delivery is not None
    if scope.cancelled_caught:
        hang(ctx, name, limit, "running")
    out["load_avg_end"] = load()
    if party.has_metrics:
        m1 = await party.settled_metrics(len(delivery.expected))
        delta = m1.minus(m0) if m1 else None
        out["metric_lag"] = metric_lag(delta)
        out["sweeper"] = sweeper_summary(delta)
        out["requests"] = request_counts(m1)
    left = await party.leftovers(queue)
    result = delivery.report()
    if isinstance(party, Ours):
        if why:
            undelivered(ctx, name, delivery, why)
        delivery_failures(party.apis[0], name, result)
    else:
        # not started by the end of the wait: slow, not lost
        result["not_started_in_time"] = left.get("pending_left") or 0
        result["lost"] = max(0, result["lost"] - result["not_started_in_time"])
    out["incomplete"] = why
    out["final_check"] = left
    out["delivery"] = {k: result.get(k) for k in (
        "scheduled", "received_distinct", "lost", "duplicates", "unexpected", "early",
        "deliver_at_mismatch", "no_timer_meta", "not_started_in_time")}
    out["lag"] = quantiles(arrival_lags(delivery))
    out["in_log_lag_ms"] = result["in_log_lag_ms"]
    return out


async def begin(party: Ours | Peer, name: str, queue: str, out: dict[str, Any]) -> Any:
    """The queue prepared, the load average noted; the metrics before (ours)."""
    await party.prepare(name, queue)
    m0 = await party.metrics()
    out["load_avg_start"] = load()
    return m0


async def calibrated_due(party: Ours | Peer, name: str, queue: str, n: int,
                         out: dict[str, Any]) -> float:
    """When the first of ``n`` timers scheduled from now can come due: the calibrated
    scheduling time (with its margin) plus LEAD_S."""
    calibrated = await party.calibrate(name, queue)
    out["calibration_timers_per_s"] = round(calibrated)
    return time.time() + n / calibrated * SCHEDULE_ESTIMATE_MARGIN + LEAD_S


async def scenario_idle(party: Ours | Peer, ctx: Ctx, sizes: Sizes, *,
                        explore: bool = False) -> dict[str, Any]:
    name = "idle"
    n = sizes.explore_idle_timers if explore else sizes.idle_timers
    spacing = sizes.explore_idle_spacing_s if explore else sizes.idle_spacing_s
    delays = sizes.explore_idle_delay_ms if explore else sizes.idle_delay_ms
    queue = f"fire-idle-{ctx.run}"
    spaced = SpacedDelays(random.Random(IDLE_SEED), delays)
    delivery = party.delivery = Delivery(name)
    limit = n * spacing + delays[1] / 1000 + sizes.wait_idle_s + 30
    out: dict[str, Any] = {"timers": n, "spacing_ms": spacing * 1000, "delay_ms": list(delays),
                           "due_gap_ms": IDLE_GAP_S * 1000, "seed": IDLE_SEED,
                           "wait_s": sizes.wait_idle_s}
    await party.prepare(name, queue)
    m0 = await party.metrics()
    cpu0, t0 = ctx.cpu.snapshot(), time.perf_counter()
    out["load_avg_start"] = load()
    why = None
    with ctx.limit(limit) as scope:
        async with trio.open_nursery() as nursery:
            await nursery.start(party.receive, queue, 100)
            start = trio.current_time()
            for i in range(n):
                await trio.sleep_until(start + i * spacing)
                delay = spaced.draw(time.time())
                await party.schedule(name, queue, [(new_key("idle", i), delay)])
            delivery.scheduling_done = True
            last_due = max((d for d, _ in delivery.expected.values()), default=time.time())
            deadline = time.monotonic() + max(0.0, last_due - time.time()) + sizes.wait_idle_s
            why = await wait_delivered(delivery, deadline, stall_after=deadline)
            nursery.cancel_scope.cancel()
    out["cpu_cores"] = ctx.cpu.cores(cpu0, ctx.cpu.snapshot(), time.perf_counter() - t0)
    return await finish(party, ctx, name, queue, out, m0, why, scope, limit)


Background = Callable[[dict[str, Any]], Awaitable[None]]


async def scenario_steady(party: Ours | Peer, ctx: Ctx, sizes: Sizes, rate: int, seconds: int,
                          *, name: str | None = None, during: Background | None = None
                          ) -> dict[str, Any]:
    """``rate`` timers/s due for ``seconds``, scheduled ahead; ``during`` runs over the window
    in which they come due (its stats land in out["during"])."""
    name = name or f"steady-{rate}"
    n = rate * seconds
    queue = f"fire-{name}-{ctx.run}"
    delivery = party.delivery = Delivery(name)
    limit = 600.0
    out: dict[str, Any] = {"rate": rate, "seconds": seconds, "timers": n,
                           "wait_s": sizes.wait_steady_s}
    m0 = await begin(party, name, queue, out)
    why = None
    with ctx.limit(limit) as scope:
        first_due = await calibrated_due(party, name, queue, n, out)
        async with trio.open_nursery() as nursery:
            await nursery.start(party.receive, queue, 100)
            t_sched = time.time()
            for b in range(0, n, 500):
                now = time.time()
                await party.schedule(name, queue, [
                    (new_key("st", i), round((first_due + i / rate - now) * 1000))
                    for i in range(b, min(n, b + 500))])
            delivery.scheduling_done = True
            out["scheduling_s"] = round(time.time() - t_sched, 2)
            await party.analyze()
            out["lead_s"] = round(first_due - time.time(), 2)
            background = trio.CancelScope()
            if during is not None:
                out["during"] = {}
                nursery.start_soon(_in_scope, background, during, out["during"])
            await trio.sleep(max(0.0, first_due - time.time()))
            cpu0, t0 = ctx.cpu.snapshot(), time.perf_counter()
            await trio.sleep(max(0.0, first_due + seconds - time.time()))
            out["cpu_cores"] = ctx.cpu.cores(cpu0, ctx.cpu.snapshot(), time.perf_counter() - t0)
            background.cancel()
            deadline = time.monotonic() + sizes.wait_steady_s
            why = await wait_delivered(delivery, deadline, stall_after=deadline)
            nursery.cancel_scope.cancel()
    return await finish(party, ctx, name, queue, out, m0, why, scope, limit)


async def _in_scope(scope: trio.CancelScope, fn: Background, stats: dict[str, Any]) -> None:
    with scope:
        await fn(stats)


async def scenario_burst(party: Ours | Peer, ctx: Ctx, sizes: Sizes, n: int, wait_s: float,
                         *, name: str = "burst") -> dict[str, Any]:
    """``n`` timers due at one instant: they are scheduled so (the delay of each batch computed
    at send time) after a calibration says how long scheduling will take."""
    queue = f"fire-{name}-{ctx.run}"
    delivery = party.delivery = Delivery(name)
    limit = 1800.0
    out: dict[str, Any] = {"timers": n, "wait_s": wait_s}
    m0 = await begin(party, name, queue, out)
    why = None
    with ctx.limit(limit) as scope:
        due = await calibrated_due(party, name, queue, n, out)
        async with trio.open_nursery() as nursery:
            await nursery.start(party.receive, queue, 1000)
            t_sched = time.time()
            for b in range(0, n, 500):
                delay = round((due - time.time()) * 1000)
                await party.schedule(name, queue, [(new_key("burst", i), delay)
                                                   for i in range(b, min(n, b + 500))])
            delivery.scheduling_done = True
            out["scheduling_s"] = round(time.time() - t_sched, 2)
            await party.analyze()
            out["lead_s"] = round(due - time.time(), 2)
            if due - time.time() < 0.3:
                out["note"] = "scheduling ended after the due instant: the drain overlapped it"
            await trio.sleep(max(0.0, due - time.time()))
            cpu0, t0 = ctx.cpu.snapshot(), time.perf_counter()
            why = await wait_delivered(delivery, time.monotonic() + wait_s,
                                       stall_after=time.monotonic())
            cpu1 = ctx.cpu.snapshot()
            out["cpu_cores"] = ctx.cpu.cores(cpu0, cpu1, time.perf_counter() - t0)
            if delivery.got_expected and "broker" in cpu1:
                # Everything the service did for the burst (fires, pops, settlements) per
                # timer handled: an upper bound of what consuming costs it.
                out["service_cpu_ms_per_timer"] = round(
                    (cpu1["broker"] - cpu0["broker"]) * 1000 / delivery.got_expected, 4)
            nursery.cancel_scope.cancel()
    out = await finish(party, ctx, name, queue, out, m0, why, scope, limit)
    out.update(drain(delivery))
    return out


def drain(delivery: Delivery) -> dict[str, Any]:
    """Drain rate from the fire instants (ours: the frame's createdAt, PostgreSQL's clock at
    the fire; the peer: the job's start), the last timer's lag, the drain curve for the plot."""
    dues = [d for d, _ in delivery.expected.values()]
    fired = []
    for key, copies in delivery.frames.items():
        if key in delivery.expected:
            try:
                fired.append(epoch(copies[0][2]))
            except ValueError:
                continue
    if not dues or len(fired) < 2:
        return {}
    fired.sort()
    handled = sorted(copies[0][0] for key, copies in delivery.frames.items()
                     if key in delivery.expected)
    handled_span = handled[-1] - handled[0]
    due = min(dues)
    span = fired[-1] - fired[0]
    complete = len(fired) == len(dues)
    step = max(1, len(fired) // 300)
    return {
        "deliver_at_spread_ms": round((max(dues) - due) * 1000, 1),
        "drained": len(fired),
        "drain_timers_per_s": round((len(fired) - 1) / span) if span > 0 else None,
        # at the consumer: handler starts (ours) or job starts (the peer)
        "handled_per_s": round((len(handled) - 1) / handled_span) if handled_span > 0 else None,
        "last_handled_lag_s": round(handled[-1] - due, 3) if complete else None,
        "first_fire_after_due_s": round(fired[0] - due, 3),
        "last_timer_lag_s": round(fired[-1] - due, 3) if complete else None,
        "last_seen_lag_s": round(fired[-1] - due, 3),
        "drain_curve": [[round(fired[i] - due, 4), round((i + 1) / len(dues), 5)]
                        for i in [*range(0, len(fired), step), len(fired) - 1]],
    }


# -- ours only --------------------------------------------------------------------------------


async def scenario_api_load(party: Ours, ctx: Ctx, sizes: Sizes) -> dict[str, Any]:
    """Steady timers while clients push and pop another queue at full speed."""
    api = party.apis[0]
    queue = f"fire-load-{ctx.run}"
    await api.configure("api-load", queue)

    async def traffic(stats: dict[str, Any]) -> None:
        stats.update(pushed=0, popped=0, push_failed=0, pop_failed=0, clients=sizes.load_clients)
        t0 = time.perf_counter()
        try:
            async with trio.open_nursery() as nursery:
                for c in range(sizes.load_clients):
                    nursery.start_soon(_pusher, api, queue, c, stats)
                    nursery.start_soon(_popper, api, queue, stats)
        finally:
            elapsed = time.perf_counter() - t0
            stats["seconds"] = round(elapsed, 2)
            stats["push_msgs_per_s"] = round(stats["pushed"] / elapsed) if elapsed else None
            stats["pop_msgs_per_s"] = round(stats["popped"] / elapsed) if elapsed else None

    return await scenario_steady(party, ctx, sizes, sizes.load_rate, sizes.load_seconds,
                                 name="api-load", during=traffic)


async def _pusher(api: Api, queue: str, client: int, stats: dict[str, Any]) -> None:
    seq = 0
    while True:
        body = {"items": [{"queue": queue, "partition": f"p{(client + i) % 8}",
                           "payload": event(seq + i, f"c{client}")} for i in range(100)]}
        seq += 100
        try:
            response = await api.client.post(f"{API}/push", json=body, timeout=REQUEST_TIMEOUT_S)
        except httpx.HTTPError as exc:
            api.failures.exception("api-load", "POST", f"{API}/push", None, exc)
            stats["push_failed"] += 1
            continue
        if response.status_code in (200, 201):
            stats["pushed"] += 100
        else:
            api.failures.bad_response("api-load", "POST", f"{API}/push", None, response,
                                      "expected 200/201")
            stats["push_failed"] += 1


async def _popper(api: Api, queue: str, stats: dict[str, Any]) -> None:
    while True:
        body = await api.pop("api-load", queue, batch=100, timeout_ms=1000)
        if body is False:
            stats["pop_failed"] += 1
            await trio.sleep(0.05)
        elif body:
            stats["popped"] += len(body["messages"])


async def scenario_multi_broker(party: Ours, ctx: Ctx, sizes: Sizes) -> dict[str, Any]:
    """Steady then burst, scheduled round-robin through every broker; fires per broker."""
    before = [await api.metrics() for api in party.apis]
    steady = await scenario_steady(party, ctx, sizes, sizes.multi_rate, sizes.multi_seconds,
                                   name="multi-steady")
    burst = await scenario_burst(party, ctx, sizes, sizes.multi_burst,
                                 sizes.wait_burst_ours_s, name="multi-burst")
    after = [await api.metrics() for api in party.apis]
    per_broker = [int(a.minus(b).value("queen_timers_fired_total")) if a else None
                  for a, b in zip(after, before, strict=True)]
    return {"brokers": len(party.apis), "steady": steady, "burst": burst,
            "fired_per_broker": per_broker}


async def scenario_cancel_race(party: Ours, ctx: Ctx, sizes: Sizes) -> dict[str, Any]:
    """Each timer cancelled at due + a random offset in ±window: latency and answers by
    offset; cancelled timers must not fire, the rest must fire exactly once."""
    name = "cancel-race"
    api = party.apis[0]
    queue = f"fire-cancel-{ctx.run}"
    rng = random.Random(IDLE_SEED)
    delivery = party.delivery = Delivery(name)
    window = sizes.cancel_window_ms / 1000
    cancels: list[dict[str, Any]] = []
    limit = sizes.cancel_timers * sizes.cancel_spacing_s + 60
    await party.prepare(name, queue)
    out: dict[str, Any] = {"timers": sizes.cancel_timers, "window_ms": sizes.cancel_window_ms,
                           "delay_ms": sizes.cancel_delay_ms, "load_avg_start": load()}
    cpu0, t0 = ctx.cpu.snapshot(), time.perf_counter()

    async def cancel_at(key: str, txn: str, due: float, offset: float) -> None:
        await trio.sleep(max(0.0, due + offset - time.time()))
        path = f"{API}/timers/{queue}/{key}?txn={txn}"
        sent = time.perf_counter()
        try:
            response = await api.client.delete(path, timeout=REQUEST_TIMEOUT_S)
        except httpx.HTTPError as exc:
            ctx.failures.exception(name, "DELETE", path, None, exc)
            return
        latency = time.perf_counter() - sent
        body = response.json() if response.status_code == 200 else {}
        status = body.get("status")
        if status not in ("cancelled", "absent", "too_late") or body.get("txn") != txn:
            ctx.failures.bad_response(name, "DELETE", path, None, response,
                                      "expected 200 cancelled/absent/too_late echoing the txn")
            return
        cancels.append({"key": key, "offset_ms": offset * 1000, "status": status,
                        "latency_s": latency})

    with ctx.limit(limit) as scope:
        async with trio.open_nursery() as nursery:
            await nursery.start(party.receive, queue, 100)
            async with trio.open_nursery() as cancellers:
                start = trio.current_time()
                for i in range(sizes.cancel_timers):
                    await trio.sleep_until(start + i * sizes.cancel_spacing_s)
                    key = new_key("cancel", i)
                    answer = await api.put_timer(name, queue, key, sizes.cancel_delay_ms, {})
                    if answer:
                        delivery.schedule_answer(answer)
                        cancellers.start_soon(cancel_at, key, answer["txn"],
                                              epoch(answer["deliverAt"]),
                                              rng.uniform(-window, window))
            delivery.scheduling_done = True
            cancelled = {c["key"] for c in cancels if c["status"] == "cancelled"}
            for key in cancelled:  # must never arrive: no longer expected
                delivery.expected.pop(key, None)
            delivery.got_expected = sum(1 for k in delivery.frames if k in delivery.expected)
            deadline = time.monotonic() + 10.0
            why = await wait_delivered(delivery, deadline, stall_after=deadline)
            await trio.sleep(1.0)  # a cancelled timer that fired anyway would show up by now
            nursery.cancel_scope.cancel()
    out["cpu_cores"] = ctx.cpu.cores(cpu0, ctx.cpu.snapshot(), time.perf_counter() - t0)
    out = await finish(party, ctx, name, queue, out, None, why, scope, limit)
    fired_anyway = sorted(k for k in cancelled if k in delivery.frames)
    if fired_anyway:
        ctx.failures.add(name, "cancelled but fired",
                         f"{len(fired_anyway)} timers answered cancelled and still fired, "
                         f"e.g. {fired_anyway[:3]}")
    out.update(cancel_stats(cancels, sizes.cancel_window_ms))
    out["cancelled_but_fired"] = len(fired_anyway)
    return out


def cancel_stats(cancels: list[dict[str, Any]], window_ms: float) -> dict[str, Any]:
    bins = [(-window_ms, -10.0), (-10.0, 0.0), (0.0, 10.0), (10.0, window_ms)]
    by_offset = []
    for lo, hi in bins:
        inside = [c for c in cancels if lo <= c["offset_ms"] < hi]
        shares = {s: round(sum(c["status"] == s for c in inside) / len(inside), 3)
                  if inside else None for s in ("cancelled", "too_late", "absent")}
        by_offset.append({"offset_ms": [lo, hi], "n": len(inside), **shares})
    near = [c for c in cancels if abs(c["offset_ms"]) <= 10.0]
    return {
        "cancel_latency": quantiles([c["latency_s"] for c in cancels]),
        "cancel_latency_by_status": {
            s: quantiles([c["latency_s"] for c in cancels if c["status"] == s])
            for s in ("cancelled", "too_late", "absent")},
        "answers": {s: sum(c["status"] == s for c in cancels)
                    for s in ("cancelled", "too_late", "absent")},
        "too_late_share_near_due": round(sum(c["status"] == "too_late" for c in near)
                                         / len(near), 4) if near else None,
        "near_due_cancels": len(near),
        "by_offset": by_offset,
    }


async def scenario_explore(party: Ours, ctx: Ctx, sizes: Sizes) -> dict[str, Any]:
    idle = await scenario_idle(party, ctx, sizes, explore=True)
    burst = await scenario_burst(party, ctx, sizes, sizes.explore_burst, sizes.wait_burst_ours_s)
    return {"idle": idle, "burst": burst}


# -- one party, one scenario ------------------------------------------------------------------


async def run_driver(unit: str, party: Ours | Peer, ctx: Ctx, sizes: Sizes) -> dict[str, Any]:
    with collector_paused():
        return await _drive(unit, party, ctx, sizes)


async def _drive(unit: str, party: Ours | Peer, ctx: Ctx, sizes: Sizes) -> dict[str, Any]:
    if unit == "idle":
        return await scenario_idle(party, ctx, sizes)
    if unit.startswith("steady-"):
        return await scenario_steady(party, ctx, sizes, int(unit.split("-")[1]),
                                     sizes.steady_seconds)
    if unit == "burst":
        if isinstance(party, Ours):
            return await scenario_burst(party, ctx, sizes, sizes.burst_timers,
                                        sizes.wait_burst_ours_s)
        return await scenario_burst(party, ctx, sizes, sizes.peer_burst_timers,
                                    sizes.wait_burst_peer_s)
    assert isinstance(party, Ours)
    drivers = {"api-load": scenario_api_load, "multi-broker": scenario_multi_broker,
               "cancel-race": scenario_cancel_race, "explore": scenario_explore}
    return await drivers[unit](party, ctx, sizes)


async def ours_unit(unit: str, party: str, urls: list[str], pids: list[int], cpu: PartyCpu,
                    failures: Failures, sizes: Sizes, database_url: str) -> dict[str, Any]:
    # The SDK's HTTP client (queen_trio.client.wire), as a user's consumer would have.
    clients = [LeanClient(url, timeout=REQUEST_TIMEOUT_S) for url in urls]
    try:
        apis = [Api(client, failures) for client in clients]
        ctx = Ctx(apis[0], failures, cpu, uuid.uuid4().hex[:8], False)
        async with trio.open_nursery() as nursery:
            for pid in pids:
                nursery.start_soon(watchdog, ctx, pid)
            result = await run_driver(unit, Ours(apis, failures, database_url, party), ctx,
                                      sizes)
            nursery.cancel_scope.cancel()
        result["broker_died"] = ctx.broker_died
        return result
    finally:
        for client in clients:
            await client.aclose()


async def peer_unit(unit: str, dsn: str, profile: str, postmaster: int | None,
                    failures: Failures, sizes: Sizes) -> dict[str, Any]:
    client = peer.PeerClient(dsn)
    try:
        await trio.to_thread.run_sync(client.apply_schema)
        worker = peer.PeerWorker(dsn, profile)
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            assert worker.pid is not None
            cpu = PartyCpu([worker.pid], postmaster)
            ctx = Ctx(None, failures, cpu, uuid.uuid4().hex[:8], False)  # type: ignore[arg-type]
            result = await run_driver(unit, Peer(client, worker), ctx, sizes)
            nursery.cancel_scope.cancel()
        result["profile"] = peer.PROFILES[profile]
        return result
    finally:
        client.close()


def run_unit(server: Server, unit: str, party: str, sizes: Sizes, failures: Failures,
             env: dict[str, str] | None = None) -> dict[str, Any]:
    """A fresh database, the party's processes on it, the scenario, the cleanup."""
    started = time.monotonic()
    if party.startswith("ours"):
        count = sizes.multi_brokers if unit == "multi-broker" else 1
        with server.database("fire_lag_ours") as db:
            try:
                with brokers(db, count, env) as handles:
                    pids = [h.pid for h in handles if h.pid]
                    result = trio.run(ours_unit, unit, party, [h.url for h in handles], pids,
                                      PartyCpu(pids, server.postmaster_pid), failures, sizes,
                                      db)
            except RuntimeError as exc:  # a broker did not start
                failures.add(unit, "broker start", str(exc)[:2000])
                return {"error": f"broker did not start: {str(exc)[:300]}"}
            result["brokers_exit"] = [{"exit_code": h.exit_code, "log_errors": h.log_errors}
                                      for h in handles]
            for h in handles:
                if h.exit_code not in (0, None):
                    failures.add(unit, "broker exit", f"broker exited with {h.exit_code}")
    else:
        with server.database("fire_lag_peer") as db:
            result = trio.run(peer_unit, unit, db, party.removeprefix("peer-"),
                              server.postmaster_pid, failures, sizes)
    result["elapsed_s"] = round(time.monotonic() - started, 1)
    return result


# -- main -------------------------------------------------------------------------------------


def units(chosen: list[str], sizes: Sizes) -> list[str]:
    out = []
    for name in chosen:
        out += [f"steady-{r}" for r in sizes.steady_rates] if name == "steady" else [name]
    return out


def machine(server: Server, command: str) -> dict[str, Any]:
    return {
        "command": command,
        "checkout": source_revision(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
        "postgresql": server.settings(),
        "postgresql_server": server.description,
        "load_avg_at_start": load(),
        "sweeper_env": {k: v for k, v in os.environ.items() if k.startswith("QUEEN_SWEEPER_")},
    }


def line(unit: str, party: str, r: dict[str, Any]) -> str:
    lag, d = r.get("lag") or {}, r.get("delivery") or {}
    cells = " ".join(report.ms_cell(lag.get(report.qname(q))) for q in (50, 90, 99, 99.9))
    metric = r.get("metric_lag") or {}
    extra = (f" metric p50/p99 {metric.get('p50_ms')}/{metric.get('p99_ms')} ms"
             if metric else "")
    if r.get("drain_timers_per_s"):
        extra += f" drain {r['drain_timers_per_s']:,}/s"
    cores = r.get("cpu_cores")
    return (f"[fire_lag] {unit:<13} {party:<12} n={lag.get('n', 0)} lag p50/p90/p99/p99.9 "
            f"{cells} max {report.ms_cell(lag.get('max'))} ms{extra}; lost {d.get('lost')} "
            f"dup {d.get('duplicates')} late {d.get('not_started_in_time') or 0}; CPU "
            f"{cpu_cell(cores) if cores else '-'}; load {r.get('load_avg_end')}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.fire_lag",
                                     description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--scenario", nargs="+", action="extend", choices=SCENARIOS,
                        metavar="NAME", help=f"some of {', '.join(SCENARIOS)} (default: all)")
    parser.add_argument("--quick", action="store_true", help="small sizes, a few minutes")
    parser.add_argument("--smoke", action="store_true", help="tiny idle run, for the test suite")
    parser.add_argument("--million", action="store_true",
                        help="burst of 1,000,000 timers for ours (the peer keeps 100,000)")
    parser.add_argument("--explore", action="store_true",
                        help="MIN_SLEEP x BATCH grid on idle and burst (ours only)")
    parser.add_argument("--no-peer", action="store_true", help="ours only")
    parser.add_argument("--admin-url", default=os.environ.get("QUEEN_DATABASE_URL") or None,
                        help="a server where databases may be created (default: a temporary "
                             "embedded PostgreSQL)")
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--no-readme", action="store_true",
                        help="do not rewrite the generated section of docs/performance.md")
    parser.add_argument("--readme-only", action="store_true",
                        help="redraw plots and the README section from the JSON files")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    if args.readme_only:
        report.publish(args.out_dir, readme=not args.no_readme)
        return 0
    sizes = SIZES["smoke" if args.smoke else "quick" if args.quick else "full"]
    if args.million:
        sizes = dataclasses.replace(sizes, burst_timers=1_000_000)
    command = " ".join(["python -m bench.fire_lag", *(sys.argv[1:] if argv is None else argv)])
    peer_missing = "--no-peer" if args.no_peer else peer.missing()
    default = ("idle",) if args.smoke else SCENARIOS
    chosen = [s for s in SCENARIOS if s in (args.scenario or default)]
    failures = Failures()
    started = time.monotonic()
    with shared_server(args.admin_url) as server:
        info = machine(server, command)
        print("queen-trio timer wake-up latency vs Procrastinate")
        for key, value in info.items():
            print(f"  {key:<18} {value}")
        print(f"  {'peer':<18} " + (f"skipped: {peer_missing}" if peer_missing
                                    else f"procrastinate {peer.version()}"), flush=True)
        if args.explore:
            results = explore(server, sizes, failures)
            summary = {"machine": info, "sizes": dataclasses.asdict(sizes), "grid": results,
                       "failures": failures.counts}
            stamp(summary, started)
            (args.out_dir / "fire_lag_explore.json").write_text(json.dumps(summary, indent=1))
        else:
            scenarios: dict[str, dict[str, Any]] = {}
            for unit in units(chosen, sizes):
                beside = unit.split("-")[0] in WITH_PEER
                parties = (["ours", *(OURS_BESIDE if beside else ()),
                            *(PARTY_ENV if unit == "burst" else ())]
                           + ([f"peer-{p}" for p in peer.LAG_PROFILES]
                              if not peer_missing and beside else []))
                for party in parties:
                    print(f"[fire_lag] {unit} {party}: running ...", file=sys.stderr, flush=True)
                    result = run_unit(server, unit, party, sizes, failures, PARTY_ENV.get(party))
                    result.update(ran_at=now_iso(), command=command)
                    scenarios.setdefault(unit, {})[party] = result
                    for sub, r in ([("steady", result["steady"]), ("burst", result["burst"])]
                                   if unit == "multi-broker" and "steady" in result
                                   else [("", result)]):
                        print(line(f"{unit} {sub}".strip(), party, r), flush=True)
            save(args.out_dir / "fire_lag.json", info, sizes, scenarios, peer_missing,
                 failures, started)
    report.publish(args.out_dir, readme=not args.no_readme, print_table=not args.explore)
    report.print_failures(failures)
    print(f"load average at the end {load()}; elapsed {time.monotonic() - started:.0f} s")
    return 0 if failures.total() == 0 else 1


def explore(server: Server, sizes: Sizes, failures: Failures) -> list[dict[str, Any]]:
    out = []
    for min_sleep in EXPLORE_MIN_SLEEP_MS:
        for batch in EXPLORE_BATCH:
            env = {"QUEEN_SWEEPER_MIN_SLEEP_MS": str(min_sleep),
                   "QUEEN_SWEEPER_BATCH": str(batch)}
            print(f"[fire_lag] explore MIN_SLEEP={min_sleep} BATCH={batch} ...",
                  file=sys.stderr, flush=True)
            r = run_unit(server, "explore", "ours", sizes, failures, env)
            for sub in ("idle", "burst"):
                if sub in r:
                    print(line(f"{sub} {min_sleep}/{batch}", "ours", r[sub]), flush=True)
            out.append({"min_sleep_ms": min_sleep, "batch": batch, **r})
    return out


def stamp(summary: dict[str, Any], started: float) -> None:
    summary["timestamp"] = now_iso()
    summary["elapsed_s"] = round(time.monotonic() - started, 1)
    summary["load_avg_at_end"] = load()


def save(path: Path, info: dict[str, Any], sizes: Sizes, scenarios: dict[str, Any],
         peer_missing: str | None, failures: Failures, started: float) -> None:
    """Merge into the existing file: a run of some scenarios keeps the others' last results."""
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError):
        summary = {}
    summary.setdefault("scenarios", {}).update(scenarios)
    summary.update(machine=info, sizes=dataclasses.asdict(sizes),
                   peer={"skipped": peer_missing,
                         "version": None if peer_missing else peer.version(),
                         "profiles": {p: peer.PROFILES[p] for p in peer.LAG_PROFILES}},
                   failures={"total": failures.total(), "counts": failures.counts,
                             "examples": failures.examples})
    stamp(summary, started)
    path.write_text(json.dumps(summary, indent=1, default=json_default) + "\n")


"""Timer fire lag, burst drain and schedule throughput over real HTTP, end to end.

What it measures, against a broker subprocess (``python -m queen_trio serve``; a fresh one per
scenario, so its metrics start at zero) reached over TCP with the SDK's HTTP client
(``queen_trio.client.wire.LeanClient``) under trio:

1. ``idle``: 300 timers, one ``PUT /api/v1/timers/{q}/{key}`` every 100 ms, each with a
   random ``delayMs`` in 200..3000 drawn so that no two come due within 25 ms of each other
   (``bench.spacing``): they come due one at a time (~10/s) on an otherwise idle broker. Lag
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
   p50/p90/p99/max; (b) 500-timer bundles from C = 1 and C = 4 clients for 10 s: timers/s.
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
import dataclasses
import datetime
import json
import math
import os
import random
import re
import socket
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import trio

from bench.client_gc import collector_paused
from bench.log_throughput import (
    CpuMeter,
    Failures,
    _clip,
    _json_or_none,
    broker_process,
    cpu_cell,
    distribution,
    machine_info,
    verdict,
)
from bench.spacing import IDLE_GAP_S, SpacedDelays
from queen_trio.client.wire import Answer, LeanClient

RESULTS_DIR = Path(__file__).resolve().parent / "results"
API = "/api/v1"
SCENARIOS = ("idle", "idle-lean", "steady", "burst", "schedule")

MIN_SLEEP_MS = int(os.environ.get("QUEEN_SWEEPER_MIN_SLEEP_MS") or 10)
BUNDLE = 500  # timers per transaction
FAR_DELAY_MS = 3_600_000  # one hour: never fires during the run

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
BURST_POP_BATCH = 1000
BURST_LIMIT_S = 480.0
# Scheduling time = timers / calibrated rate x this margin (the rate drops a little as the
# table grows; an overrun would make the first timers come due while scheduling goes on).
SCHEDULE_ESTIMATE_MARGIN = 1.25
CALIBRATION_WARMUP = 10  # untimed bundles first (the broker's pool has 10 connections)
STEADY_CALIBRATION_BUNDLES = 3

SCHEDULE_SECONDS = 10.0
PUT_CLIENTS = 32
BUNDLE_CLIENTS = (1, 4)
SCHEDULE_LIMIT_S = 120.0

POP_TIMEOUT_MS = 5000
DRAIN_GRACE_S = 15.0  # after the last due instant, how long to wait for the rest
STALL_S = 15.0  # no progress for this long: the rest is declared lost
METRIC_SETTLE_S = 3.0  # wait for the fired counter to catch up with what the consumer saw
REQUEST_TIMEOUT_S = 30.0

TARGET_IDLE_METRIC_P50_MS = 2.0
TARGET_IDLE_METRIC_P99_MS = 5.0
TARGET_IDLE_E2E_P50_MS = 4.0
TARGET_IDLE_E2E_P99_MS = 10.0
TARGET_STEADY_P99_MS = MIN_SLEEP_MS + 5.0
TARGET_BURST_RATE = 20_000.0
TARGET_PUT_RATE = 1_000.0
TARGET_BUNDLE_RATE = 10_000.0

FIRE_LAG = "queen_timers_fire_lag_seconds"
CLOCK_NOTE = ("end-to-end lag = consumer's time.time() when the pop answer arrived - deliverAt "
              "from the schedule response (PostgreSQL's clock); broker, PostgreSQL and this "
              "script share one machine and one clock")


# -- Prometheus text --------------------------------------------------------------------------

_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
Labels = tuple[tuple[str, str], ...]


@dataclasses.dataclass
class Metrics:
    """One scrape of /metrics: (name, labels) -> value."""

    samples: dict[tuple[str, Labels], float]

    @classmethod
    def parse(cls, text: str) -> Metrics:
        samples: dict[tuple[str, Labels], float] = {}
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            match = _SAMPLE.match(line)
            if not match:
                continue
            labels = tuple(sorted(_LABEL.findall(match.group(2) or "")))
            try:
                samples[(match.group(1), labels)] = float(match.group(3))
            except ValueError:
                continue
        return cls(samples)

    def minus(self, before: Metrics | None) -> Metrics:
        if before is None:
            return self
        return Metrics({k: v - before.samples.get(k, 0.0) for k, v in self.samples.items()})

    def value(self, name: str, **labels: str) -> float:
        """Sum of the samples of ``name`` whose labels include ``labels``."""
        want = set(labels.items())
        return sum(v for (n, lab), v in self.samples.items() if n == name and want <= set(lab))

    def by_label(self, name: str, label: str) -> dict[str, float]:
        out: dict[str, float] = {}
        for (n, lab), v in self.samples.items():
            if n == name:
                key = dict(lab).get(label, "?")
                out[key] = out.get(key, 0.0) + v
        return out

    def buckets(self, histogram: str) -> list[tuple[float, float]]:
        """(upper bound, cumulative count), ascending, the last one +Inf."""
        rows = [(float(dict(lab)["le"]), v) for (n, lab), v in self.samples.items()
                if n == f"{histogram}_bucket" and "le" in dict(lab)]
        return sorted(rows)


def histogram_quantile(buckets: list[tuple[float, float]], q: float) -> float | None:
    """Linear interpolation inside the bucket holding rank q * count (lower edge of the first
    bucket 0), as Prometheus' histogram_quantile; None for an empty histogram."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    prev_le, prev_count = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if math.isinf(le):
                return prev_le
            if count == prev_count:
                return le
            return prev_le + (le - prev_le) * (rank - prev_count) / (count - prev_count)
        prev_le, prev_count = le, count
    return prev_le


def lag_summary(m: Metrics | None) -> dict[str, Any]:
    """The fire-lag histogram in milliseconds: count, mean, interpolated p50/p90/p99, the
    bucket the slowest timer fell in, and the non-empty buckets."""
    if m is None:
        return {"count": 0}
    buckets = m.buckets(FIRE_LAG)
    count = int(m.value(f"{FIRE_LAG}_count"))
    if not buckets or count <= 0:
        return {"count": count}
    total = m.value(f"{FIRE_LAG}_sum")
    out: dict[str, Any] = {"count": count, "mean_ms": round(total / count * 1000, 2)}
    for q in (50, 90, 99):
        value = histogram_quantile(buckets, q / 100)
        out[f"p{q}_ms"] = None if value is None else round(value * 1000, 2)
    prev_le, prev = 0.0, 0.0
    per_bucket: dict[str, int] = {}
    for le, cum in buckets:
        if cum > prev:  # the last non-empty bucket holds the slowest timer
            per_bucket[_le_ms(le)] = int(cum - prev)
            out["max_bucket_ms"] = f"({_le_ms(prev_le)}, {_le_ms(le)}]"
        prev_le, prev = le, cum
    out["buckets_ms"] = per_bucket  # upper bound (ms) -> timers in that bucket
    return out


def _le_ms(le: float) -> str:
    return "+Inf" if math.isinf(le) else f"{le * 1000:g}"


def sweeper_summary(m: Metrics | None) -> dict[str, Any]:
    if m is None:
        return {}
    claims = m.value("queen_sweeper_claim_batch_size_count")
    timers = m.value("queen_sweeper_claim_batch_size_sum")
    return {
        "fired": int(m.value("queen_timers_fired_total")),
        "wakeups": {k: int(v) for k, v in
                    sorted(m.by_label("queen_sweeper_wakeups_total", "reason").items())},
        "claims": int(claims),
        "timers_per_claim": round(timers / claims, 1) if claims else None,
        "failures": {k: int(v) for k, v in
                     sorted(m.by_label("queen_timers_failures_total", "kind").items())},
        "dead_lettered": int(m.value("queen_timers_dead_lettered_total")),
        "scheduled": {k: int(v) for k, v in
                      sorted(m.by_label("queen_timers_scheduled_total", "status").items())},
        # Parked pops that took their frame behind the fire lock (queen.pop_head_after), or did not.
        "pop_fire_waits": {k: int(v) for k, v in
                           sorted(m.by_label("queen_pop_fire_waits_total", "result").items())},
    }


def request_counts(m: Metrics | None) -> dict[str, Any]:
    """queen_http_requests_total by status class, and every non-2xx (route, method, status)."""
    if m is None:
        return {}
    classes: dict[str, int] = {}
    odd: dict[str, int] = {}
    for (name, labels), v in m.samples.items():
        if name != "queen_http_requests_total" or v <= 0:
            continue
        lab = dict(labels)
        status = lab.get("status", "?")
        classes[f"{status[:1]}xx"] = classes.get(f"{status[:1]}xx", 0) + int(v)
        if not status.startswith("2"):
            odd[f"{lab.get('method')} {lab.get('route')} {status}"] = int(v)
    return {"by_class": dict(sorted(classes.items())), "non_2xx": odd}


# -- HTTP -------------------------------------------------------------------------------------


def epoch(iso: str) -> float:
    return datetime.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


class Api:
    """The broker's HTTP API; every answer is checked and failures are recorded."""

    def __init__(self, client: LeanClient, failures: Failures) -> None:
        self.client = client
        self.failures = failures

    async def _call(self, scenario: str, method: str, path: str, body: Any = None,
                    limit_s: float = REQUEST_TIMEOUT_S) -> Answer | None:
        try:
            return await self.client.request(method, path, json=body, timeout=limit_s)
        except httpx.HTTPError as exc:
            self.failures.exception(scenario, method, path, _clip(body), exc)
            return None

    def _bad(self, scenario: str, method: str, path: str, body: Any,
             response: Answer, why: str) -> None:
        self.failures.bad_response(scenario, method, path, _clip(body), response, why)

    async def configure(self, scenario: str, queue: str) -> bool:
        path = f"{API}/configure"
        body = {"queue": queue}
        response = await self._call(scenario, "POST", path, body)
        if response is None:
            return False
        if response.status_code not in (200, 201):
            self._bad(scenario, "POST", path, body, response, "expected 200/201")
            return False
        return True

    async def put_timer(self, scenario: str, queue: str, key: str, delay_ms: int,
                        payload: Any) -> dict[str, Any] | None:
        """PUT one timer; the answer if it was scheduled, else None."""
        path = f"{API}/timers/{queue}/{key}"
        body = {"delayMs": delay_ms, "payload": payload}
        response = await self._call(scenario, "PUT", path, body)
        if response is None:
            return None
        answer = _json_or_none(response)
        why = None
        if response.status_code != 200:
            why = "expected 200"
        elif not isinstance(answer, dict) or answer.get("status") != "scheduled" \
                or answer.get("ok") is not True:
            why = "expected ok: true, status: scheduled"
        elif answer.get("key") != key or not isinstance(answer.get("deliverAt"), str):
            why = "expected the key back and a deliverAt"
        if why:
            self._bad(scenario, "PUT", path, body, response, why)
            return None
        return answer

    async def bundle(self, scenario: str, timers: list[dict[str, Any]]
                     ) -> list[dict[str, Any]] | None:
        """POST /transaction with only a timers array; the per-timer answers if all were
        scheduled, else None."""
        path = f"{API}/transaction"
        body = {"operations": [], "timers": timers}
        response = await self._call(scenario, "POST", path, body)
        if response is None:
            return None
        answer = _json_or_none(response)
        why = None
        if response.status_code != 200:
            why = "expected 200"
        elif not isinstance(answer, dict) or answer.get("success") is not True \
                or not isinstance(answer.get("timers"), list):
            why = "expected success: true and a timers array"
        elif len(answer["timers"]) != len(timers):
            why = f"expected {len(timers)} timer answers, got {len(answer['timers'])}"
        else:
            bad = [t for t, sent in zip(answer["timers"], timers, strict=True)
                   if t.get("status") != "scheduled" or t.get("key") != sent["key"]
                   or not isinstance(t.get("deliverAt"), str)]
            if bad:
                why = f"{len(bad)} timer(s) not scheduled, first: {bad[0]}"
        if why:
            self._bad(scenario, "POST", path, body, response, why)
            return None
        return answer["timers"]

    async def pop(self, scenario: str, queue: str, *, batch: int,
                  timeout_ms: int) -> dict[str, Any] | None | bool:
        """Long-poll pop with autoAck: the body (200), None (204), False on failure."""
        path = (f"{API}/pop/queue/{queue}?wait=true&timeout={timeout_ms}&batch={batch}"
                "&autoAck=true")
        response = await self._call(scenario, "GET", path,
                                    limit_s=timeout_ms / 1000 + REQUEST_TIMEOUT_S)
        if response is None:
            return False
        if response.status_code == 204:
            return None
        body = _json_or_none(response)
        why = None
        if response.status_code != 200:
            why = "expected 200 or 204"
        elif not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            why = "expected an object with messages"
        elif not body["messages"] or len(body["messages"]) > batch:
            why = f"expected 1..{batch} messages, got {len(body['messages'])}"
        if why:
            self._bad(scenario, "GET", path, None, response, why)
            return False
        return body

    async def pending(self, scenario: str, queue: str) -> int | None:
        """How many timers the queue still lists as pending (at most 10 looked at)."""
        path = f"{API}/timers/{queue}?limit=10"
        response = await self._call(scenario, "GET", path)
        if response is None:
            return None
        body = _json_or_none(response)
        if response.status_code != 200 or not isinstance(body, dict) \
                or not isinstance(body.get("timers"), list):
            self._bad(scenario, "GET", path, None, response, "expected 200 with a timers array")
            return None
        return len(body["timers"])

    async def metrics(self) -> Metrics | None:
        try:
            response = await self.client.get("/metrics", timeout=10.0)
        except httpx.HTTPError:
            return None
        return Metrics.parse(response.text) if response.status_code == 200 else None

    async def fired_total(self) -> float | None:
        try:
            response = await self.client.get("/metrics", timeout=5.0)
        except httpx.HTTPError:
            return None
        match = re.search(r"^queen_timers_fired_total (\S+)$", response.text, re.MULTILINE)
        return float(match.group(1)) if match else None


# -- delivery ---------------------------------------------------------------------------------


@dataclasses.dataclass
class Delivery:
    """Every frame a consumer received, by timer key, with its arrival wall clock."""

    scenario: str
    expected: dict[str, tuple[float, str]] = dataclasses.field(default_factory=dict)
    # key -> list of (arrival wall clock, frame deliverAt string, frame createdAt string)
    frames: dict[str, list[tuple[float, str, str]]] = dataclasses.field(default_factory=dict)
    no_timer_meta: int = 0
    scheduling_done: bool = False
    got_expected: int = 0  # distinct scheduled keys received
    last_progress: float = dataclasses.field(default_factory=time.monotonic)
    first_arrival: float | None = None
    last_arrival: float | None = None

    def schedule_answer(self, answer: dict[str, Any]) -> None:
        key = answer["key"]
        if key not in self.expected and key in self.frames:
            self.got_expected += 1
        self.expected[key] = (epoch(answer["deliverAt"]), answer["deliverAt"])

    def receive(self, messages: list[dict[str, Any]], at: float) -> None:
        for m in messages:
            timer = m.get("timer")
            if not isinstance(timer, dict) or "key" not in timer:
                self.no_timer_meta += 1
                continue
            copies = self.frames.setdefault(timer["key"], [])
            if not copies:
                self.last_progress = time.monotonic()
                if timer["key"] in self.expected:
                    self.got_expected += 1
            copies.append((at, str(timer.get("deliverAt")), str(m.get("createdAt"))))
        if self.first_arrival is None:
            self.first_arrival = at
        self.last_arrival = at

    @property
    def distinct(self) -> int:
        return len(self.frames)

    @property
    def complete(self) -> bool:
        """Scheduling is over and every timer it scheduled has arrived."""
        return self.scheduling_done and self.got_expected >= len(self.expected)

    def report(self) -> dict[str, Any]:
        """Exactly-once check and the lag views, over the timers whose schedule was answered."""
        received = set(self.frames)
        expected = set(self.expected)
        duplicates = sum(len(v) - 1 for v in self.frames.values())
        e2e, in_log = [], []
        early = mismatch = 0
        for key, copies in self.frames.items():
            if key not in self.expected:
                continue
            due, due_text = self.expected[key]
            arrived, frame_due, created = copies[0]
            e2e.append(arrived - due)
            if frame_due != due_text:
                mismatch += 1
            try:
                lag = epoch(created) - due
            except ValueError:
                continue
            in_log.append(lag)
            if lag < 0:
                early += 1
        return {
            "scheduled": len(expected),
            "received_distinct": len(received & expected),
            "lost": len(expected - received),
            "duplicates": duplicates,
            "unexpected": len(received - expected),
            "no_timer_meta": self.no_timer_meta,
            "early": early,
            "deliver_at_mismatch": mismatch,
            "e2e_lag_ms": distribution(e2e),
            "in_log_lag_ms": distribution(in_log),
        }


class LeanConsumer:
    """A minimal HTTP/1.1 keep-alive client on a blocking socket, for ``idle-lean``.

    It shows what the broker delivers to the wire, without what the SDK's HTTP client on trio
    that the other scenarios use costs the consumer itself."""

    def __init__(self, url: str) -> None:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        self._sock = socket.create_connection((host, int(port)))
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buffer = b""

    def get(self, path: str) -> tuple[int, bytes, float]:
        """Status, body and the wall-clock time the whole answer had arrived."""
        self._sock.sendall(f"GET {path} HTTP/1.1\r\nHost: bench\r\n\r\n".encode())
        while b"\r\n\r\n" not in self._buffer:
            self._buffer += self._receive()
        head, self._buffer = self._buffer.split(b"\r\n\r\n", 1)
        lines = head.split(b"\r\n")
        status = int(lines[0].split()[1])
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
            elif name.strip().lower() == b"transfer-encoding":
                raise RuntimeError("LeanConsumer reads Content-Length answers only")
        while len(self._buffer) < length:
            self._buffer += self._receive()
        at = time.time()
        body, self._buffer = self._buffer[:length], self._buffer[length:]
        return status, body, at

    def _receive(self) -> bytes:
        chunk = self._sock.recv(1 << 16)
        if not chunk:
            raise ConnectionError("the broker closed the connection")
        return chunk

    def close(self) -> None:
        self._sock.close()


async def consume_lean(ctx: Ctx, delivery: Delivery, queue: str, batch: int) -> None:
    """As :func:`consume`, through a :class:`LeanConsumer` in a worker thread; the arrival
    time is taken in that thread as the answer's last byte is read."""
    consumer = LeanConsumer(str(ctx.api.client.base_url).rstrip("/"))
    path = (f"{API}/pop/queue/{queue}?wait=true&timeout={POP_TIMEOUT_MS}&batch={batch}"
            "&autoAck=true")
    try:
        while True:
            status, body, at = await trio.to_thread.run_sync(
                consumer.get, path, abandon_on_cancel=True)
            if status == 200:
                delivery.receive(json.loads(body)["messages"], at)
            elif status != 204:
                ctx.failures.add(delivery.scenario, "pop", f"answered {status}: {body[:200]!r}")
                await trio.sleep(0.05)
    finally:
        consumer.close()


async def consume(api: Api, delivery: Delivery, queue: str, batch: int) -> None:
    """Long-poll pops (autoAck), noting every frame, until cancelled."""
    while True:
        body = await api.pop(delivery.scenario, queue, batch=batch, timeout_ms=POP_TIMEOUT_MS)
        at = time.time()
        if body is False:
            await trio.sleep(0.05)
            continue
        if body is None:
            continue
        delivery.receive(body["messages"], at)


async def wait_delivered(delivery: Delivery, deadline: float,
                         stall_after: float = 0.0) -> str | None:
    """Wait until every scheduled timer arrived; a reason if not: past ``deadline``, or no new
    frame for STALL_S, counted from the later of the last new frame and ``stall_after``."""
    while not delivery.complete:
        now = time.monotonic()
        if now > deadline:
            return "deadline"
        if now - max(delivery.last_progress, stall_after) > STALL_S:
            return "stalled"
        await trio.sleep(0.02)
    return None


def undelivered(ctx: Ctx, scenario: str, delivery: Delivery, why: str) -> None:
    seconds = time.monotonic() - delivery.last_progress
    ctx.failures.add(scenario, f"delivery {why}",
                     f"{delivery.got_expected} of {len(delivery.expected)} scheduled timers "
                     f"received; last new frame {seconds:.1f} s ago")


async def settle_metrics(api: Api, fired_at_least: int) -> Metrics | None:
    """/metrics once the fired counter shows what the consumer saw (the fire observes its lag
    after its commit, a consumer can be faster)."""
    deadline = time.monotonic() + METRIC_SETTLE_S
    while True:
        m = await api.metrics()
        if m is None or m.value("queen_timers_fired_total") >= fired_at_least \
                or time.monotonic() > deadline:
            return m
        await trio.sleep(0.05)


async def final_check(api: Api, delivery: Delivery, queue: str) -> dict[str, Any]:
    """After the drain: one more pop must find nothing, the queue must list no pending timer."""
    body = await api.pop(delivery.scenario, queue, batch=BURST_POP_BATCH, timeout_ms=1000)
    extra = 0
    if isinstance(body, dict):
        extra = len(body["messages"])
        delivery.receive(body["messages"], time.time())
        api.failures.add(delivery.scenario, "final pop not empty",
                         f"{extra} frame(s) handed out after the drain")
    pending = await api.pending(delivery.scenario, queue)
    if pending:
        api.failures.add(delivery.scenario, "timers still pending",
                         f"GET /timers/{queue} lists {pending} pending timer(s) after the drain")
    return {"final_pop_empty": body is None, "final_pop_frames": extra, "pending_left": pending}


def delivery_failures(api: Api, scenario: str, report: dict[str, Any]) -> None:
    for field, what in (("lost", "timers never delivered"), ("duplicates", "duplicated frames"),
                        ("unexpected", "frames of keys never scheduled"),
                        ("early", "frames created before their deliverAt"),
                        ("deliver_at_mismatch", "frame deliverAt differs from the schedule's"),
                        ("no_timer_meta", "frames without timer metadata")):
        if report.get(field):
            api.failures.add(scenario, field, f"{report[field]} {what}")


# -- scenario plumbing ------------------------------------------------------------------------


@dataclasses.dataclass
class Ctx:
    api: Api
    failures: Failures
    cpu: CpuMeter
    run: str
    quick: bool
    broker_died: bool = False
    scopes: list[trio.CancelScope] = dataclasses.field(default_factory=list)

    def limit(self, seconds: float) -> trio.CancelScope:
        """The scenario's time limit; the watchdog cancels it too if the broker dies."""
        scope = trio.move_on_after(seconds)
        self.scopes.append(scope)
        if self.broker_died:
            scope.cancel()
        return scope


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def new_key(prefix: str, i: int) -> str:
    return f"{prefix}-{i:07d}"


def bundle_entries(queue: str, prefix: str, indices: range, delay_ms: Callable[[int], int],
                   scenario: str) -> list[dict[str, Any]]:
    return [{"action": "schedule", "queue": queue, "key": new_key(prefix, i),
             "delayMs": delay_ms(i), "payload": {"scenario": scenario, "i": i}}
            for i in indices]


async def calibrate(ctx: Ctx, scenario: str, bundles: int) -> float:
    """Timers/s one client schedules through 500-timer bundles (on a side queue, due in an
    hour), timed after CALIBRATION_WARMUP untimed bundles: a fresh broker's first requests on
    each pool connection are slower, and an estimate made from them leaves a long lead."""
    queue = f"lag-{scenario}-calibration-{ctx.run}"
    for b in range(CALIBRATION_WARMUP + bundles):
        if b == CALIBRATION_WARMUP:
            t0 = time.perf_counter()
        await ctx.api.bundle(f"{scenario} calibration", bundle_entries(
            queue, f"cal-{b}", range(BUNDLE), lambda _: FAR_DELAY_MS, scenario))
    return bundles * BUNDLE / (time.perf_counter() - t0)


def hang(ctx: Ctx, scenario: str, limit: float, phase: str) -> None:
    if ctx.broker_died:
        ctx.failures.add(scenario, "broker died", f"the broker process ended while {phase}")
        return
    ctx.failures.add(scenario, "hang", f"scenario did not finish in {limit:.0f} s "
                                       f"(stopped while {phase})")


def process_alive(pid: int) -> bool:
    """False once the process has exited (gone, or a zombie not yet reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2:].split()[0] != "Z"


async def watchdog(ctx: Ctx, pid: int) -> None:
    """Stop the scenario at once if the broker process dies (its exit code is reported)."""
    while process_alive(pid):  # noqa: ASYNC110 - polling /proc is the only signal
        await trio.sleep(0.25)
    ctx.broker_died = True
    for scope in ctx.scopes:
        scope.cancel()


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
                    last_due = max(last_due, delivery.expected[answer["key"]][0])
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
    out["load_avg_end"] = load()
    m1 = await settle_metrics(ctx.api, len(delivery.expected))
    delta = m1.minus(m0) if m1 else None
    out.update(final_check=await final_check(ctx.api, delivery, queue))
    report = delivery.report()
    delivery_failures(ctx.api, name, report)
    out.update(report)
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
                    lambda i, now=now: round((first_due + i / STEADY_RATE - now) * 1000), name))
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
    out["load_avg_end"] = load()
    m1 = await settle_metrics(ctx.api, len(delivery.expected))
    delta = m1.minus(m0) if m1 else None
    out.update(final_check=await final_check(ctx.api, delivery, queue))
    report = delivery.report()
    delivery_failures(ctx.api, name, report)
    out.update(report)
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
                    queue, "burst", range(b * BUNDLE, (b + 1) * BUNDLE), lambda _, d=delay: d,
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
    out["load_avg_end"] = load()
    m1 = await settle_metrics(ctx.api, len(delivery.expected))
    delta = m1.minus(m0) if m1 else None
    out.update(final_check=await final_check(ctx.api, delivery, queue))
    report = delivery.report()
    delivery_failures(ctx.api, name, report)
    out.update(report)
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


async def timed_clients(ctx: Ctx, clients: int, seconds: float, warmup: int,
                        request: Callable[[int, int], Awaitable[int | None]]
                        ) -> dict[str, Any]:
    """``clients`` loops calling ``request(client, n)`` (returns timers scheduled or None on
    failure); ``warmup`` calls each before the clock starts, then ``seconds`` measured."""
    latencies: list[float] = []
    counters = {"requests": 0, "failed": 0, "timers": 0}
    clock: dict[str, float] = {}
    started = trio.Event()
    warmed = [0]
    cpu: dict[str, dict[str, float]] = {}

    async def client(c: int) -> None:
        n = 0
        while True:
            if n == warmup:
                warmed[0] += 1
                if warmed[0] == clients:
                    cpu["before"] = ctx.cpu.snapshot()
                    clock["start"] = time.perf_counter()
                    clock["stop"] = clock["start"] + seconds
                    started.set()
                await started.wait()
            measuring = n >= warmup
            if measuring and time.perf_counter() >= clock["stop"]:
                return
            t0 = time.perf_counter()
            scheduled = await request(c, n)
            t1 = time.perf_counter()
            if measuring:
                counters["requests"] += 1
                if scheduled is None:
                    counters["failed"] += 1
                else:
                    latencies.append(t1 - t0)
                    counters["timers"] += scheduled
                    clock["end"] = max(clock.get("end", t1), t1)
            n += 1

    async with trio.open_nursery() as nursery:
        for c in range(clients):
            nursery.start_soon(client, c)
    elapsed = clock.get("end", clock["start"]) - clock["start"]
    return {
        "clients": clients, "seconds": round(elapsed, 2), **counters,
        "requests_per_s": round(counters["requests"] / elapsed) if elapsed > 0 else 0,
        "timers_per_s": round(counters["timers"] / elapsed) if elapsed > 0 else 0,
        "latency_ms": distribution(latencies),
        "cpu_cores": CpuMeter.cores(cpu["before"], ctx.cpu.snapshot(),
                                    time.perf_counter() - clock["start"]),
    }


SCHEDULE_PARTS = ("put", *(f"bundle-c{c}" for c in BUNDLE_CLIENTS))


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
            async def bundle(c: int, n: int) -> int | None:
                answers = await ctx.api.bundle(name, bundle_entries(
                    queue, f"b-{c:02d}-{n:05d}", range(BUNDLE), lambda _: FAR_DELAY_MS, name))
                return None if answers is None else len(answers)

            clients = int(part.removeprefix("bundle-c"))
            out["row"] = await timed_clients(ctx, clients, seconds, 1, bundle)
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
        label = "PUT (1 timer)" if part == "put" else f"bundle ({BUNDLE} timers)"
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
    print(f"failures: {failures.total()}")
    for key, n in failures.counts.items():
        print(f"   {n:>6} x {key}")
    for ex in failures.examples:
        print(f"   - {json.dumps(ex)}")


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
            else:
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
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(summary, indent=2) + "\n")
    return 0 if failures.total() == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

"""Timer scenarios' plumbing, shared by ``bench.timer_lag`` and ``bench.fire_lag``: the
exactly-once bookkeeping of every timer scheduled and every frame received (``Delivery``), the
consumers that feed it, the waits and checks around a drain, and a scenario's context (time
limit, watchdog on the broker process, CPU meter)."""

from __future__ import annotations

import dataclasses
import json
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from bench.harness.api import API, Api, epoch
from bench.harness.clients import timed_loop
from bench.harness.cpu import CpuMeter, PartyCpu, process_alive
from bench.harness.metrics import Metrics
from bench.harness.report import Failures
from bench.harness.stats import distribution
from queen_trio.client.calls import TimerSpec

BUNDLE = 500  # timers per transaction
BATCH = 256  # timers per POST /api/v1/timers (Queen's ceiling)
FAR_DELAY_MS = 3_600_000  # one hour: never fires during the run
# Scheduling time = timers / calibrated rate x this margin (the rate drops a little as the
# table grows; an overrun would make the first timers come due while scheduling goes on).
SCHEDULE_ESTIMATE_MARGIN = 1.25
CALIBRATION_WARMUP = 10  # untimed bundles first (the broker's pool has 10 connections)
POP_TIMEOUT_MS = 5000
FINAL_POP_BATCH = 1000
STALL_S = 15.0  # no progress for this long: the rest is declared lost
METRIC_SETTLE_S = 3.0  # wait for the fired counter to catch up with what the consumer saw


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
        key = answer["timerKey"]
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
        self._sock.sendall(f"GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())
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
    body = await api.pop(delivery.scenario, queue, batch=FINAL_POP_BATCH, timeout_ms=1000)
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


@dataclasses.dataclass
class Ctx:
    api: Api
    failures: Failures
    cpu: CpuMeter | PartyCpu
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


def new_key(prefix: str, i: int) -> str:
    return f"{prefix}-{i:07d}"


def timer_ops(queue: str, entries: list[tuple[str, int, Any]]) -> list[dict[str, Any]]:
    """Schedule operations of Queen's timer wire, (key, delayMs, payload) each, shaped by the
    SDK (queen_trio.client.calls.TimerSpec) as a client would send them."""
    return [TimerSpec(queue, key, delay, payload).to_wire() for key, delay, payload in entries]


def bundle_entries(queue: str, prefix: str, indices: range, delay_ms: Callable[[int], int],
                   scenario: str) -> list[dict[str, Any]]:
    return timer_ops(queue, [(new_key(prefix, i), delay_ms(i), {"scenario": scenario, "i": i})
                             for i in indices])


def hang(ctx: Ctx, scenario: str, limit: float, phase: str) -> None:
    if ctx.broker_died:
        ctx.failures.add(scenario, "broker died", f"the broker process ended while {phase}")
        return
    ctx.failures.add(scenario, "hang", f"scenario did not finish in {limit:.0f} s "
                                       f"(stopped while {phase})")


async def watchdog(ctx: Ctx, pid: int) -> None:
    """Stop the scenario at once if the broker process dies (its exit code is reported)."""
    while process_alive(pid):  # noqa: ASYNC110 - polling /proc is the only signal
        await trio.sleep(0.25)
    ctx.broker_died = True
    for scope in ctx.scopes:
        scope.cancel()


async def timed_clients(ctx: Ctx, clients: int, seconds: float, warmup: int,
                        request: Callable[[int, int], Awaitable[int | None]]
                        ) -> dict[str, Any]:
    """``clients`` loops calling ``request(client, n)`` (returns timers scheduled or None on
    failure); ``warmup`` calls each before the clock starts, then ``seconds`` measured."""
    run = await timed_loop(ctx.cpu, clients, seconds, warmup, lambda c, n: (c, n),
                           lambda cn: request(*cn))
    elapsed = run.elapsed
    return {
        "clients": clients, "seconds": round(elapsed, 2), "requests": run.requests,
        "failed": run.failed, "timers": run.items,
        "requests_per_s": round(run.requests / elapsed) if elapsed > 0 else 0,
        "timers_per_s": round(run.items / elapsed) if elapsed > 0 else 0,
        "latency_ms": distribution(run.latencies),
        "cpu_cores": run.cores(ctx.cpu),
    }


async def calibration_rate(send: Callable[[int], Awaitable[Any]], bundles: int) -> float:
    """Timers/s of ``BUNDLE``-timer batches, ``send(b)`` sending batch b: timed after
    CALIBRATION_WARMUP untimed ones (a fresh broker's first requests on each pool connection
    are slower, and an estimate made from them leaves a long lead)."""
    for b in range(CALIBRATION_WARMUP + bundles):
        if b == CALIBRATION_WARMUP:
            t0 = time.perf_counter()
        await send(b)
    return bundles * BUNDLE / (time.perf_counter() - t0)

"""Throughput and latency of the log over real HTTP (Queen v1 wire), end to end.

What it measures, against one broker (``python -m queen_trio serve``) reached over TCP with
``httpx.AsyncClient`` under trio:

1. Push throughput. C concurrent clients (C in 1, 4, 8), each in a loop ``POST /api/v1/push``
   with 100 items of ~200-byte JSON event objects, for a fixed time, into one queue with 8
   partitions. Two layouts of a request's items: ``mixed`` (item i goes to partition i mod 8,
   so every request appends to all 8 partitions) and ``single`` (each request to one partition,
   rotating). Messages/s and request latency p50/p90/p99/max.
2. Pop+ack throughput. 50,000 messages are pushed across 8 partitions of a fresh queue, then C
   consumers each loop ``GET /pop/queue/q?batch=100&wait=true`` → ``POST /ack/batch`` (all
   ``completed``) until every message has been received. Messages/s over the drain, pop and ack
   latency, and a delivery check: distinct transactionIds received == pushed, duplicates and
   lost messages counted, payloads matched to what was pushed, and a final pop must find nothing.
   A reference row drains the same way with ``autoAck=true`` (no ack requests) at C=4.
3. Long-poll wake latency. A consumer waits (``wait=true&timeout=5000``) on an empty queue; once
   the broker reports it waiting (``queen_longpoll_waiters`` on /metrics), a producer takes
   t0 = ``time.perf_counter()`` and pushes one message; the latency is the arrival of the pop's
   response minus t0. 300 times, sequentially, after 10 warm-up rounds. The push's own round
   trip and the pop's arrival after the push's answer are shown next to it.

Every response is checked (status, shape, per-item results); failures are recorded with the
request and the broker's answer, and printed at the end. The broker's own /metrics request
counts by status are printed too, so a 5xx cannot go unnoticed. Client, broker and database
share the machine; each row shows the cores each used (client/broker/PostgreSQL) and what the
rest of the machine used meanwhile ("other"), read from /proc, so a noisy neighbour is visible.
The targets from the issue (push and pop+ack >= 5,000 msgs/s, wake p99 <= 20 ms) are printed
with PASS/FAIL for the best configuration.

Run from the repository root::

    python -m bench.log_throughput | tee bench/results/log_throughput.txt

By default a broker is started as a subprocess on a free port with a temporary QUEEN_DATA_DIR
(an embedded PostgreSQL, or ``$QUEEN_DATABASE_URL`` if set) and stopped with SIGTERM at the end.
``--url http://host:port`` targets a broker that is already running instead. The summary also
goes to bench/results/log_throughput.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import re
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import trio

from bench.harness.api import REQUEST_TIMEOUT_S, event, pop_problem
from bench.harness.brokers import broker_process
from bench.harness.clients import timed_loop
from bench.harness.cpu import CpuMeter, cpu_cell
from bench.harness.report import Failures, json_or_none, machine_info, save_json, verdict
from bench.harness.stats import distribution

RESULTS_DIR = Path(__file__).resolve().parent / "results"
API = "/api/v1"

PARTITIONS = 8
PUSH_BATCH = 100
PUSH_CONCURRENCY = (1, 4, 8)
PUSH_LAYOUTS = ("mixed", "single")
PUSH_SECONDS = 5.0  # measured time per (layout, C)
PUSH_WARMUP_REQUESTS = 3  # per client, before the clock starts

POP_MESSAGES = 50_000
POP_CONCURRENCY = (1, 4, 8)
POP_AUTOACK_CONCURRENCY = 4  # reference row: pop(autoAck=true), no ack requests
POP_BATCH = 100
POP_WAIT_MS = 1000  # a consumer's long-poll while others hold the remaining partitions
POP_STALL_S = 15.0  # no new message for this long: the rest is declared lost
PREFILL_CLIENTS = 8

WAKE_ROUNDS = 300
WAKE_WARMUP = 10
WAKE_TIMEOUT_MS = 5000
WAITER_POLL_S = 0.002
WAITER_REGISTER_TIMEOUT_S = 3.0

SCENARIO_LIMIT_S = 120.0  # a hang must not hang the script

TARGET_PUSH = 5_000.0  # msgs/s
TARGET_POP_ACK = 5_000.0  # msgs/s
TARGET_WAKE_P99_MS = 20.0


# -- payloads ---------------------------------------------------------------------------------


def partition_of(layout: str, client: int, request: int, item: int) -> str:
    if layout == "mixed":
        index = item
    else:
        index = client + request
    return f"p{index % PARTITIONS}"


def push_body(queue: str, layout: str, client: int, request: int, seq0: int,
              source: str) -> dict[str, Any]:
    return {"items": [
        {"queue": queue, "partition": partition_of(layout, client, request, i),
         "payload": event(seq0 + i, source)}
        for i in range(PUSH_BATCH)
    ]}


# -- HTTP -------------------------------------------------------------------------------------


class Broker:
    """An httpx client for one broker, checking every answer and recording failures."""

    def __init__(self, client: httpx.AsyncClient, failures: Failures, cpu: CpuMeter) -> None:
        self.client = client
        self.failures = failures
        self.cpu = cpu

    async def _post(self, scenario: str, path: str, body: dict[str, Any]
                    ) -> httpx.Response | None:
        """The answer, or None (recorded) if the request itself failed."""
        try:
            return await self.client.post(path, json=body)
        except httpx.HTTPError as exc:
            self.failures.exception(scenario, "POST", path, body, exc)
            return None

    async def push(self, scenario: str, body: dict[str, Any]) -> list[dict[str, Any]] | None:
        """POST /push; the per-item results if every item was queued, else None."""
        path = f"{API}/push"
        response = await self._post(scenario, path, body)
        if response is None:
            return None
        results = json_or_none(response)
        items = body["items"]
        why = None
        if response.status_code != 201:
            why = "expected 201"
        elif not isinstance(results, list) or len(results) != len(items):
            why = f"expected an array of {len(items)} results"
        else:
            bad = [r for r in results if r.get("status") != "queued" or r.get("offset") is None]
            if bad:
                why = f"{len(bad)} item(s) not queued, first: {bad[0]}"
        if why:
            self.failures.bad_response(scenario, "POST", path, body, response, why)
            return None
        return results

    async def pop(self, scenario: str, queue: str, *, batch: int, timeout_ms: int,
                  auto_ack: bool) -> dict[str, Any] | None | bool:
        """GET /pop; the body (200), None when empty (204), False on failure."""
        path = (f"{API}/pop/queue/{queue}?batch={batch}&wait=true&timeout={timeout_ms}"
                f"&autoAck={'true' if auto_ack else 'false'}")
        try:
            response = await self.client.get(path, timeout=timeout_ms / 1000 + REQUEST_TIMEOUT_S)
        except httpx.HTTPError as exc:
            self.failures.exception(scenario, "GET", path, None, exc)
            return False
        if response.status_code == 204:
            return None
        body = json_or_none(response)
        why = pop_problem(response.status_code, body, batch)
        if why is None and not auto_ack and not body.get("leaseId"):
            why = "no leaseId without autoAck"
        if why:
            self.failures.bad_response(scenario, "GET", path, None, response, why)
            return False
        return body

    async def ack_all(self, scenario: str, messages: list[dict[str, Any]]) -> bool:
        path = f"{API}/ack/batch"
        body = {"acknowledgments": [
            {"transactionId": m["transactionId"], "partitionId": m["partitionId"],
             "leaseId": m["leaseId"], "status": "completed"}
            for m in messages
        ]}
        response = await self._post(scenario, path, body)
        if response is None:
            return False
        results = json_or_none(response)
        why = None
        if response.status_code != 200:
            why = "expected 200"
        elif not isinstance(results, list) or len(results) != len(messages):
            why = f"expected an array of {len(messages)} results"
        else:
            bad = [r for r in results if not r.get("success") or r.get("alreadyAcked")
                   or r.get("status") != "completed"]
            if bad:
                why = f"{len(bad)} ack(s) not applied as completed, first: {bad[0]}"
        if why:
            self.failures.bad_response(scenario, "POST", path, body, response, why)
            return False
        return True

    async def longpoll_waiters(self) -> float | None:
        try:
            response = await self.client.get("/metrics")
        except httpx.HTTPError:
            return None
        match = re.search(r"^queen_longpoll_waiters (\S+)$", response.text, re.MULTILINE)
        return float(match.group(1)) if match else None

    async def request_counts(self) -> dict[str, int]:
        """``queen_http_requests_total`` summed by status class, from /metrics."""
        try:
            text = (await self.client.get("/metrics")).text
        except httpx.HTTPError:
            return {}
        counts: dict[str, int] = {}
        for line in text.splitlines():
            if line.startswith("queen_http_requests_total{"):
                status = re.search(r'status="(\d)', line)
                key = f"{status.group(1)}xx" if status else "?"
                counts[key] = counts.get(key, 0) + int(float(line.rsplit(" ", 1)[1]))
        return counts


# -- 1. push ----------------------------------------------------------------------------------


async def push_scenario(broker: Broker, run: str, layout: str, clients: int) -> dict[str, Any]:
    scenario = f"push[{layout},C={clients}]"
    queue = f"bench-push-{layout}-c{clients}-{run}"

    def body(c: int, request: int) -> dict[str, Any]:
        return push_body(queue, layout, c, request, c * 10_000_000 + request * PUSH_BATCH,
                         scenario)

    async def push(items: dict[str, Any]) -> int | None:
        results = await broker.push(scenario, items)
        return None if results is None else len(results)

    timed = await timed_loop(broker.cpu, clients, PUSH_SECONDS, PUSH_WARMUP_REQUESTS, body, push)
    cores = timed.cores(broker.cpu)
    elapsed = timed.elapsed
    rate = timed.items / elapsed if elapsed > 0 else 0.0
    return {"layout": layout, "clients": clients, "batch": PUSH_BATCH, "seconds": round(elapsed, 2),
            "messages": timed.items, "requests": timed.requests, "failed": timed.failed,
            "msgs_per_s": round(rate), "latency_ms": distribution(timed.latencies),
            "cpu_cores": cores}


# -- 2. pop + ack -----------------------------------------------------------------------------


async def prefill(broker: Broker, scenario: str, queue: str, total: int) -> dict[str, str]:
    """Push ``total`` messages (each request to one partition); transactionId -> eventId."""
    pushed: dict[str, str] = {}
    requests = total // PUSH_BATCH
    next_request = iter(range(requests))

    async def pusher() -> None:
        for r in next_request:
            body = push_body(queue, "single", 0, r, r * PUSH_BATCH, scenario)
            results = await broker.push(f"{scenario} prefill", body)
            for item, result in zip(body["items"], results or [], strict=False):
                pushed[result["transactionId"]] = item["payload"]["eventId"]

    async with trio.open_nursery() as nursery:
        for _ in range(PREFILL_CLIENTS):
            nursery.start_soon(pusher)
    return pushed


@dataclasses.dataclass
class Delivery:
    expected: dict[str, str]
    seen: set[str] = dataclasses.field(default_factory=set)
    duplicates: int = 0
    unexpected: int = 0
    wrong_payload: int = 0
    last_progress: float = dataclasses.field(default_factory=time.perf_counter)

    def receive(self, messages: list[dict[str, Any]]) -> None:
        for m in messages:
            txn = m.get("transactionId")
            if txn not in self.expected:
                self.unexpected += 1
            elif txn in self.seen:
                self.duplicates += 1
            else:
                self.seen.add(txn)
                self.last_progress = time.perf_counter()
                data = m.get("data")
                if not isinstance(data, dict) or data.get("eventId") != self.expected[txn]:
                    self.wrong_payload += 1

    @property
    def done(self) -> bool:
        return len(self.seen) >= len(self.expected)


async def pop_scenario(broker: Broker, run: str, consumers: int, total: int,
                       auto_ack: bool = False) -> dict[str, Any]:
    mode = "autoAck" if auto_ack else "ack"
    scenario = f"pop+{mode}[C={consumers}]"
    queue = f"bench-pop-{mode}-c{consumers}-{run}"
    t_fill = time.perf_counter()
    pushed = await prefill(broker, scenario, queue, total)
    fill_s = time.perf_counter() - t_fill
    delivery = Delivery(pushed)
    pop_lat: list[float] = []
    ack_lat: list[float] = []
    counters = {"pops": 0, "empty_pops": 0, "failed_pops": 0, "failed_acks": 0}
    clock: dict[str, float] = {}
    acking = [0]  # acks in flight

    async def consumer(cancel: trio.CancelScope) -> None:
        while not delivery.done:
            if time.perf_counter() - delivery.last_progress > POP_STALL_S:
                broker.failures.add(scenario, "stalled",
                                    f"no new message for {POP_STALL_S:.0f} s with "
                                    f"{len(pushed) - len(delivery.seen)} not yet received")
                cancel.cancel()
                return
            t0 = time.perf_counter()
            body = await broker.pop(scenario, queue, batch=POP_BATCH, timeout_ms=POP_WAIT_MS,
                                    auto_ack=auto_ack)
            t1 = time.perf_counter()
            counters["pops"] += 1
            if body is False:
                counters["failed_pops"] += 1
                continue
            if body is None:
                counters["empty_pops"] += 1
                continue
            pop_lat.append(t1 - t0)
            delivery.receive(body["messages"])
            if auto_ack:
                if delivery.done and "end" not in clock:
                    clock["end"] = t1
                    cancel.cancel()
                continue
            acking[0] += 1
            t2 = time.perf_counter()
            ok = await broker.ack_all(scenario, body["messages"])
            t3 = time.perf_counter()
            acking[0] -= 1
            if ok:
                ack_lat.append(t3 - t2)
            else:
                counters["failed_acks"] += 1
            if delivery.done and not acking[0] and "end" not in clock:
                clock["end"] = t3  # all received and all acks answered
                cancel.cancel()  # the others may be parked in a long-poll

    cpu_before = broker.cpu.snapshot()
    clock["start"] = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(consumers):
            nursery.start_soon(consumer, nursery.cancel_scope)
    cores = CpuMeter.cores(cpu_before, broker.cpu.snapshot(), time.perf_counter() - clock["start"])
    end = clock.get("end", time.perf_counter())
    leftover = await broker.pop(scenario, queue, batch=POP_BATCH, timeout_ms=0, auto_ack=False)
    if isinstance(leftover, dict):
        delivery.receive(leftover["messages"])
        broker.failures.add(scenario, "final pop not empty",
                            f"{len(leftover['messages'])} message(s) handed out after the drain")
    elapsed = end - clock["start"]
    received = len(delivery.seen)
    return {
        "consumers": consumers, "auto_ack": auto_ack, "batch": POP_BATCH, "pushed": len(pushed),
        "prefill_s": round(fill_s, 2), "prefill_msgs_per_s": round(len(pushed) / fill_s),
        "seconds": round(elapsed, 2),
        "msgs_per_s": round(received / elapsed) if elapsed > 0 else 0,
        "received_distinct": received, "duplicates": delivery.duplicates,
        "lost": len(pushed) - received, "unexpected": delivery.unexpected,
        "wrong_payload": delivery.wrong_payload,
        "final_pop_empty": not isinstance(leftover, dict),
        **counters,
        "pop_latency_ms": distribution(pop_lat), "ack_latency_ms": distribution(ack_lat),
        "cpu_cores": cores,
    }


# -- 3. long-poll wake ------------------------------------------------------------------------


async def wait_for_waiter(broker: Broker, baseline: float) -> bool:
    with trio.move_on_after(WAITER_REGISTER_TIMEOUT_S):
        while True:
            waiters = await broker.longpoll_waiters()
            if waiters is not None and waiters > baseline:
                return True
            await trio.sleep(WAITER_POLL_S)
    return False


async def wake_round(broker: Broker, queue: str, seq: int, baseline: float
                     ) -> tuple[float, float] | None:
    """One wake: (pop arrival - t0, push round trip), or None if it failed."""
    scenario = "long-poll wake"
    got: dict[str, Any] = {}

    async def waiter() -> None:
        got["body"] = await broker.pop(scenario, queue, batch=1, timeout_ms=WAKE_TIMEOUT_MS,
                                       auto_ack=True)
        got["at"] = time.perf_counter()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        if not await wait_for_waiter(broker, baseline):
            broker.failures.add(scenario, "waiter not registered",
                                f"queen_longpoll_waiters stayed at {baseline} for "
                                f"{WAITER_REGISTER_TIMEOUT_S} s after the pop was sent")
        body = {"items": [{"queue": queue, "payload": event(seq, "wake")}]}
        t0 = time.perf_counter()
        results = await broker.push(scenario, body)
        push_rtt = time.perf_counter() - t0
    popped = got.get("body")
    if results is None or popped is False:
        return None
    if popped is None:
        broker.failures.add(scenario, "pop timed out",
                            f"GET pop wait=true timeout={WAKE_TIMEOUT_MS} answered 204 although "
                            f"message {results[0]['transactionId']} was pushed (push 201)")
        return None
    txn = popped["messages"][0]["transactionId"]
    if txn != results[0]["transactionId"]:
        broker.failures.add(scenario, "wrong message",
                            f"popped {txn}, pushed {results[0]['transactionId']}")
        return None
    return got["at"] - t0, push_rtt


async def wake_scenario(broker: Broker, run: str) -> dict[str, Any]:
    queue = f"bench-wake-{run}"
    baseline = await broker.longpoll_waiters() or 0.0
    wakes: list[float] = []
    pushes: list[float] = []
    failed = 0
    for i in range(WAKE_WARMUP + WAKE_ROUNDS):
        if i == WAKE_WARMUP:
            cpu_before, t_start = broker.cpu.snapshot(), time.perf_counter()
        outcome = await wake_round(broker, queue, i, baseline)
        if i < WAKE_WARMUP:
            continue
        if outcome is None:
            failed += 1
        else:
            wakes.append(outcome[0])
            pushes.append(outcome[1])
    cores = CpuMeter.cores(cpu_before, broker.cpu.snapshot(), time.perf_counter() - t_start)
    after_push = [w - p for w, p in zip(wakes, pushes, strict=True)]
    return {"rounds": WAKE_ROUNDS, "warmup": WAKE_WARMUP, "failed": failed,
            "wake_latency_ms": distribution(wakes), "push_rtt_ms": distribution(pushes),
            "wake_after_push_answer_ms": distribution(after_push), "cpu_cores": cores}


# -- report -----------------------------------------------------------------------------------


def dist_cells(d: dict[str, Any]) -> str:
    if not d.get("n"):
        return f"{'-':>7} {'-':>7} {'-':>7} {'-':>8}"
    return f"{d['p50']:7.1f} {d['p90']:7.1f} {d['p99']:7.1f} {d['max']:8.1f}"


def print_push(rows: list[dict[str, Any]]) -> None:
    print(f"1. push: {PUSH_BATCH}-item batches, ~{event_size()}-byte events, {PARTITIONS} "
          f"partitions, {PUSH_SECONDS:.0f} s per row after {PUSH_WARMUP_REQUESTS} warm-up "
          f"requests per client")
    print("   layout  C  requests  failed    msgs/s   latency ms: p50     p90     p99      max"
          "   CPU cores client/broker/pg/other")
    for r in rows:
        print(f"   {r['layout']:<6} {r['clients']:>2} {r['requests']:>9} {r['failed']:>7} "
              f"{r['msgs_per_s']:>9,}               {dist_cells(r['latency_ms'])}"
              f"   {cpu_cell(r['cpu_cores'])}")


def print_pop(rows: list[dict[str, Any]]) -> None:
    print(f"2. pop+ack: {POP_MESSAGES:,} messages pre-pushed over {PARTITIONS} partitions, "
          f"C consumers loop pop(batch={POP_BATCH}, wait=true) -> ack/batch(completed)")
    print("   (row 'autoAck': pop(autoAck=true), no ack requests - a reference, not the target)")
    print("   ack      C   msgs/s  seconds  pop ms: p50     p90     p99      max   "
          "ack ms: p50     p90     p99      max   CPU cores client/broker/pg/other")
    for r in rows:
        print(f"   {pop_mode(r):<7} {r['consumers']:>2} {r['msgs_per_s']:>8,} {r['seconds']:>8.2f}"
              f"        {dist_cells(r['pop_latency_ms'])}"
              f"          {dist_cells(r['ack_latency_ms'])}"
              f"   {cpu_cell(r['cpu_cores'])}")
    print("   delivery check:")
    for r in rows:
        print(f"     {pop_mode(r)} C={r['consumers']}: pushed {r['pushed']:,}, received "
              f"{r['received_distinct']:,} distinct, duplicates {r['duplicates']}, "
              f"lost {r['lost']}, unexpected {r['unexpected']}, wrong payload "
              f"{r['wrong_payload']}, final pop empty {'yes' if r['final_pop_empty'] else 'NO'}"
              f" -> {'OK' if delivered_exactly_once(r) else 'FAILED'}")
        print(f"          pops {r['pops']:,} (empty {r['empty_pops']}, failed {r['failed_pops']}), "
              f"failed acks {r['failed_acks']}; prefill {r['prefill_msgs_per_s']:,} msgs/s "
              f"with {PREFILL_CLIENTS} clients")


def pop_mode(r: dict[str, Any]) -> str:
    return "autoAck" if r["auto_ack"] else "batch"


def delivered_exactly_once(r: dict[str, Any]) -> bool:
    return (r["lost"] == 0 and r["duplicates"] == 0 and r["unexpected"] == 0
            and r["wrong_payload"] == 0 and r["final_pop_empty"])


def print_wake(w: dict[str, Any]) -> None:
    print(f"3. long-poll wake: pop(wait=true, timeout={WAKE_TIMEOUT_MS}) parked on an empty queue, "
          f"one push; {w['rounds']} rounds after {w['warmup']} warm-up, failed {w['failed']}")
    print("                                  p50     p90     p99      max")
    print(f"   wake latency (ms)         {dist_cells(w['wake_latency_ms'])}")
    print(f"   push round trip (ms)      {dist_cells(w['push_rtt_ms'])}")
    print(f"   wake - push round trip    {dist_cells(w['wake_after_push_answer_ms'])}"
          "   (pop answered after the push was)")
    print(f"   CPU cores client/broker/pg/other: {cpu_cell(w['cpu_cores'])}")


def event_size() -> int:
    return len(json.dumps(event(123_456, "push[mixed,C=8]"), separators=(",", ":")))


def targets(push: list[dict[str, Any]], pop: list[dict[str, Any]],
            wake: dict[str, Any]) -> list[dict[str, Any]]:
    best_push = max(push, key=lambda r: r["msgs_per_s"])
    best_pop = max((r for r in pop if not r["auto_ack"]), key=lambda r: r["msgs_per_s"])
    delivered = all(delivered_exactly_once(r) for r in pop)
    p99 = wake["wake_latency_ms"].get("p99", math.inf)
    return [
        {"target": f"push >= {TARGET_PUSH:,.0f} msgs/s", "measured": best_push["msgs_per_s"],
         "where": f"{best_push['layout']} layout, C={best_push['clients']}",
         "pass": best_push["msgs_per_s"] >= TARGET_PUSH},
        {"target": f"pop+ack >= {TARGET_POP_ACK:,.0f} msgs/s", "measured": best_pop["msgs_per_s"],
         "where": f"C={best_pop['consumers']}",
         "pass": best_pop["msgs_per_s"] >= TARGET_POP_ACK and delivered},
        {"target": f"long-poll wake p99 <= {TARGET_WAKE_P99_MS:.0f} ms", "measured": p99,
         "where": f"{wake['wake_latency_ms'].get('n', 0)} wakes",
         "pass": p99 <= TARGET_WAKE_P99_MS and wake["failed"] == 0},
    ]


def print_targets(rows: list[dict[str, Any]]) -> None:
    print("targets (best configuration):")
    for t in rows:
        measured = t["measured"]
        shown = f"{measured:,}" if isinstance(measured, int) else f"{measured:.1f} ms"
        print(f"   {t['target']:<32} {shown:>12}  ({t['where']})  {verdict(t['pass'])}")


def print_failures(failures: Failures, counts: dict[str, int], log_errors: list[str]) -> None:
    print(f"broker requests by status (from /metrics): {counts or 'unavailable'}")
    if log_errors:
        print("broker log from its first error on:")
        for line in log_errors:
            print(f"   | {line}")
    if not failures.total():
        print("failures: none (every response had the expected status and shape)")
        return
    failures.print_details()


# -- main -------------------------------------------------------------------------------------


async def run_scenarios(url: str, failures: Failures, cpu: CpuMeter) -> dict[str, Any]:
    run = uuid.uuid4().hex[:8]
    limits = httpx.Limits(max_connections=32, max_keepalive_connections=32)
    async with httpx.AsyncClient(base_url=url, limits=limits,
                                 timeout=REQUEST_TIMEOUT_S) as client:
        broker = Broker(client, failures, cpu)
        out: dict[str, Any] = {"push": [], "pop_ack": [], "wake": None}
        for layout in PUSH_LAYOUTS:
            for c in PUSH_CONCURRENCY:
                with guard(failures, f"push[{layout},C={c}]"):
                    out["push"].append(await push_scenario(broker, run, layout, c))
        for c in POP_CONCURRENCY:
            with guard(failures, f"pop+ack[C={c}]"):
                out["pop_ack"].append(await pop_scenario(broker, run, c, POP_MESSAGES))
        with guard(failures, f"pop+autoAck[C={POP_AUTOACK_CONCURRENCY}]"):
            out["pop_ack"].append(await pop_scenario(broker, run, POP_AUTOACK_CONCURRENCY,
                                                     POP_MESSAGES, auto_ack=True))
        with guard(failures, "long-poll wake"):
            out["wake"] = await wake_scenario(broker, run)
        out["broker_requests"] = await broker.request_counts()
    return out


@contextmanager
def guard(failures: Failures, scenario: str) -> Iterator[None]:
    with trio.move_on_after(SCENARIO_LIMIT_S) as scope:
        yield
    if scope.cancelled_caught:
        failures.add(scenario, "hang", f"scenario did not finish in {SCENARIO_LIMIT_S:.0f} s")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", help="an already running broker (default: start one)")
    parser.add_argument("--json", type=Path, default=RESULTS_DIR / "log_throughput.json",
                        help="where to write the summary (default: %(default)s)")
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    failures = Failures()
    started = time.monotonic()
    with broker_process(args.url) as handle:
        info = machine_info(handle)
        results = trio.run(run_scenarios, handle.url, failures, CpuMeter(handle.pid))
    info["broker_exit_code"] = handle.exit_code

    print("queen-trio log throughput (HTTP, Queen v1 wire)")
    for key, value in info.items():
        print(f"  {key:<17} {value}")
    print()
    if results["push"]:
        print_push(results["push"])
        print()
    if results["pop_ack"]:
        print_pop(results["pop_ack"])
        print()
    if results["wake"]:
        print_wake(results["wake"])
        print()
    verdicts: list[dict[str, Any]] = []
    if results["push"] and results["pop_ack"] and results["wake"]:
        verdicts = targets(results["push"], results["pop_ack"], results["wake"])
        print_targets(verdicts)
        print()
    print_failures(failures, results["broker_requests"], handle.log_errors)
    elapsed = round(time.monotonic() - started, 1)
    print(f"elapsed {elapsed} s")

    summary = {
        "timestamp": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": info,
        "elapsed_s": elapsed,
        "config": {"partitions": PARTITIONS, "push_batch": PUSH_BATCH,
                   "push_seconds": PUSH_SECONDS, "pop_messages": POP_MESSAGES,
                   "pop_batch": POP_BATCH, "wake_rounds": WAKE_ROUNDS,
                   "event_bytes": event_size()},
        **{k: v for k, v in results.items()},
        "targets": verdicts,
        "failures": {"total": failures.total(), "counts": failures.counts,
                     "examples": failures.examples, "broker_log_errors": handle.log_errors},
    }
    save_json(args.json, summary)
    return 0 if failures.total() == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

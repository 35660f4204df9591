"""Bounded soak: timers scheduled, cancelled and fired, messages pushed and popped, from many
clients at once, against real broker processes; nothing may be lost or duplicated, the broker's
memory must stay flat and its fire lag within target.

    python -m bench.soak --minutes 10            # the long run (RELIABILITY.md)
    python -m bench.soak --seconds 60 --json out.json

Traffic (each client paced, so the load is steady rather than as-fast-as-possible):

* timer clients schedule timers (delays 50–1500 ms, client txns, payloads alternating small
  JSON and compressible ones, so both fire paths run) and cancel a quarter of them at a random
  moment before or around their due instant;
* timer consumers long-poll the timer queue (autoAck) and note each txn and its arrival;
* pushers push 20-message batches to a log queue; log consumers pop them (autoAck).

Checked at the end, after a drain: every timer not answered ``cancelled`` arrived exactly
once, no cancelled one arrived, every pushed message arrived exactly once; no answer other
than 200/201/204 (cancel answers are all 200); the broker's fire-lag p99 (its histogram,
PostgreSQL's clock) within ``--lag-p99-ms``; broker RSS (``/proc/<pid>/status``) at the end no
more than ``--rss-growth-mib`` above its level once warmed up (median of the second quarter
against the median of the last). Exit code 1 if any check fails.

PostgreSQL: ``--database-url`` (a database the run may use), else a temporary embedded one.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import trio

from bench.harness.brokers import free_port
from bench.harness.metrics import FIRE_LAG, Metrics, histogram_bucket_bound
from bench.harness.pg import scratch_database
from bench.harness.stats import median, percentile

REPO = Path(__file__).resolve().parent.parent
API = "/api/v1"
TIMER_QUEUE = "soak-timers"
LOG_QUEUE = "soak-log"


# -- processes ----------------------------------------------------------------------------------


@contextlib.contextmanager
def database(url: str | None) -> Iterator[str]:
    with scratch_database(url, "queen-soak-", database="queen") as scratch:
        yield scratch


class Broker:
    def __init__(self, url: str, n: int, env: dict[str, str]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile(prefix=f"soak-broker{n}-", suffix=".log",  # noqa: SIM115
                                               delete=False)
        clean = {k: v for k, v in os.environ.items() if not k.startswith("QUEEN_")}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "queen_trio", "serve"], cwd=REPO, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=self.log,
            env={**clean, "QUEEN_DATABASE_URL": url, "QUEEN_PORT": str(self.port),
                 "QUEEN_LOG_LEVEL": "WARNING", **env})

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise RuntimeError("no VmRSS")

    def stderr_tail(self, n: int = 3000) -> str:
        return Path(self.log.name).read_text(errors="replace")[-n:]

    async def wait_healthy(self, within: float = 30) -> None:
        async with httpx.AsyncClient(timeout=2) as http:
            with trio.fail_after(within):
                while True:
                    if self.proc.poll() is not None:
                        raise RuntimeError(f"broker exited: {self.stderr_tail()}")
                    with contextlib.suppress(httpx.HTTPError):
                        if (await http.get(f"{self.url}/health")).status_code == 200:
                            return
                    await trio.sleep(0.1)

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.last_words = self.stderr_tail(6000)
        os.unlink(self.log.name)
        return self.proc.returncode


# -- the run ------------------------------------------------------------------------------------


class Tally:
    def __init__(self) -> None:
        self.statuses: Counter[str] = Counter()
        self.unexpected: list[str] = []
        self.timers: dict[str, float] = {}  # txn -> deliverAt (epoch s)
        self.cancelled: set[str] = set()
        self.cancel_answers: Counter[str] = Counter()
        self.timer_arrivals: Counter[str] = Counter()
        self.arrival_lag: list[float] = []
        self.pushed: set[str] = set()
        self.popped: Counter[str] = Counter()

    def answer(self, what: str, r: httpx.Response, ok: tuple[int, ...]) -> bool:
        self.statuses[f"{what} {r.status_code}"] += 1
        if r.status_code not in ok:
            self.unexpected.append(f"{what}: {r.status_code} {r.text[:200]}")
            return False
        return True


def _epoch(iso: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


async def timer_client(c: int, base: str, t: Tally, stop_at: float, rate: float) -> None:
    rnd = random.Random(c)
    async with httpx.AsyncClient(base_url=base, timeout=30) as http, trio.open_nursery() as n:
        i = 0
        while trio.current_time() < stop_at:
            i += 1
            key, txn = f"c{c}-{i}", str(uuid.uuid4())
            payload = {"i": i} if i % 2 else {"i": i, "pad": "abcdefgh" * 32}
            delay = rnd.randrange(50, 1500)
            r = await http.put(f"{API}/timers/{TIMER_QUEUE}/{key}",
                               json={"delayMs": delay, "payload": payload, "txn": txn})
            if t.answer("schedule", r, (200,)):
                t.timers[txn] = _epoch(r.json()["deliverAt"])
                if rnd.random() < 0.25:
                    n.start_soon(_cancel_later, http, key, txn, delay * rnd.uniform(0.5, 1.1),
                                 t)
            await trio.sleep(1 / rate)


async def _cancel_later(http: httpx.AsyncClient, key: str, txn: str, after_ms: float,
                        t: Tally) -> None:
    await trio.sleep(after_ms / 1000)
    r = await http.delete(f"{API}/timers/{TIMER_QUEUE}/{key}", params={"txn": txn})
    if t.answer("cancel", r, (200,)):
        status = r.json()["status"]
        t.cancel_answers[status] += 1
        if status == "cancelled":
            t.cancelled.add(txn)


async def consumer(base: str, queue: str, t: Tally, stop: trio.Event, timers: bool) -> None:
    async with httpx.AsyncClient(base_url=base, timeout=30) as http:
        while not stop.is_set():
            r = await http.get(f"{API}/pop/queue/{queue}",
                               params={"batch": 200, "wait": "true", "timeout": 500,
                                       "autoAck": "true"})
            if not t.answer(f"pop {queue}", r, (200, 204)) or r.status_code == 204:
                continue
            now = time.time()
            for m in r.json()["messages"]:
                if timers:
                    t.timer_arrivals[m["transactionId"]] += 1
                    t.arrival_lag.append(now - _epoch(m["timer"]["deliverAt"]))
                else:
                    t.popped[m["transactionId"]] += 1


async def pusher(c: int, base: str, t: Tally, stop_at: float, rate: float) -> None:
    async with httpx.AsyncClient(base_url=base, timeout=30) as http:
        i = 0
        while trio.current_time() < stop_at:
            items: list[dict[str, Any]] = [
                {"queue": LOG_QUEUE, "partition": f"p{c}", "payload": {"c": c, "i": i + k},
                      "transactionId": f"push-{c}-{i + k}"} for k in range(20)]
            i += 20
            r = await http.post(f"{API}/push", json={"items": items})
            if t.answer("push", r, (201,)):
                t.pushed |= {x["transactionId"] for x in items}
            await trio.sleep(1 / rate)


async def rss_sampler(brokers: list[Broker], samples: list[list[int]], stop: trio.Event) -> None:
    while not stop.is_set():
        samples.append([b.rss_kib() for b in brokers])
        with trio.move_on_after(1.0):
            await stop.wait()


async def soak(args: argparse.Namespace, url: str) -> dict[str, Any]:
    env = {"QUEEN_SWEEPER_MAX_SLEEP_MS": "1000"}
    brokers = [Broker(url, n, env) for n in range(args.brokers)]
    try:
        for b in brokers:
            await b.wait_healthy()
        t = Tally()
        rss: list[list[int]] = []
        started = trio.current_time()
        stop_at = started + args.seconds
        stop_consumers, stop_rss = trio.Event(), trio.Event()
        async with trio.open_nursery() as outer:
            outer.start_soon(rss_sampler, brokers, rss, stop_rss)
            for i in range(args.consumers):
                outer.start_soon(consumer, brokers[i % len(brokers)].url, TIMER_QUEUE, t,
                                 stop_consumers, True)
                outer.start_soon(consumer, brokers[i % len(brokers)].url, LOG_QUEUE, t,
                                 stop_consumers, False)
            async with trio.open_nursery() as load:
                for c in range(args.timer_clients):
                    load.start_soon(timer_client, c, brokers[c % len(brokers)].url, t, stop_at,
                                    args.timer_rate)
                for c in range(args.pushers):
                    load.start_soon(pusher, c, brokers[c % len(brokers)].url, t, stop_at,
                                    args.push_rate)
            # Drain: every timer due by now + 1.5 s, consumers catch up.
            expected = set(t.timers) - t.cancelled
            with trio.move_on_after(20):
                while True:
                    await trio.sleep(0.25)
                    if expected <= set(t.timer_arrivals) and t.pushed <= set(t.popped):
                        await trio.sleep(1.0)  # anything arriving late or twice shows up
                        break
            stop_consumers.set()
            stop_rss.set()
        elapsed = trio.current_time() - started
        async with httpx.AsyncClient(timeout=10) as http:
            scrapes = [(await http.get(f"{b.url}/metrics")).text for b in brokers]
        lag_buckets = [Metrics.parse(s).buckets(FIRE_LAG) for s in scrapes]
        alive = [b.proc.poll() is None for b in brokers]
    finally:
        codes = [b.stop() for b in brokers]

    expected = set(t.timers) - t.cancelled
    arrived = set(t.timer_arrivals)
    q = max(1, len(rss) // 4)
    rss_warm = [median(s[i] for s in rss[q:2 * q]) / 1024 for i in range(len(brokers))]
    rss_end = [median(s[i] for s in rss[-q:]) / 1024 for i in range(len(brokers))]
    lags = sorted(t.arrival_lag)
    result = {
        "seconds": round(elapsed, 1), "brokers": args.brokers,
        "clients": args.timer_clients + args.pushers + 2 * args.consumers,
        "requests": sum(t.statuses.values()), "statuses": dict(t.statuses),
        "timers_scheduled": len(t.timers), "timers_cancelled": len(t.cancelled),
        "cancel_answers": dict(t.cancel_answers),
        "timers_fired_received": sum(t.timer_arrivals.values()),
        "timers_lost": len(expected - arrived),
        "timers_duplicated": sum(1 for n in t.timer_arrivals.values() if n > 1),
        "cancelled_but_fired": len(t.cancelled & arrived),
        "messages_pushed": len(t.pushed), "messages_lost": len(t.pushed - set(t.popped)),
        "messages_duplicated": sum(1 for n in t.popped.values() if n > 1),
        "unexpected_responses": t.unexpected[:20], "unexpected_count": len(t.unexpected),
        "fire_lag_p50_s_bucket": [histogram_bucket_bound(b, 0.50) for b in lag_buckets],
        "fire_lag_p99_s_bucket": [histogram_bucket_bound(b, 0.99) for b in lag_buckets],
        "received_lag_p50_ms": round(percentile(lags, 50) * 1000, 1) if lags else None,
        "received_lag_p99_ms": round(percentile(lags, 99) * 1000, 1) if lags else None,
        "rss_mib_warm": [round(x, 1) for x in rss_warm],
        "rss_mib_end": [round(x, 1) for x in rss_end],
        "rss_mib_max": [round(max(s[i] for s in rss) / 1024, 1) for i in range(len(brokers))],
        "brokers_alive_at_end": alive, "broker_exit_codes": codes,
    }
    failures = []
    if result["timers_lost"] or result["timers_duplicated"] or result["cancelled_but_fired"]:
        failures.append("timers lost, duplicated or fired after cancelled")
    if result["messages_lost"] or result["messages_duplicated"]:
        failures.append("messages lost or duplicated")
    if t.unexpected:
        failures.append(f"{len(t.unexpected)} unexpected responses")
    if any(p is None or p > args.lag_p99_ms / 1000 for p in result["fire_lag_p99_s_bucket"]):
        failures.append(f"fire lag p99 above {args.lag_p99_ms} ms")
    growth = [e - w for e, w in zip(rss_end, rss_warm, strict=True)]
    if any(g > args.rss_growth_mib for g in growth):
        failures.append(f"RSS grew {max(growth):.1f} MiB (limit {args.rss_growth_mib})")
    if not all(alive) or any(c != 0 for c in codes):
        failures.append("a broker died or did not stop cleanly")
    result["failures"] = failures
    if failures:
        result["broker_stderr_tails"] = [b.last_words for b in brokers]
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    span = p.add_mutually_exclusive_group()
    span.add_argument("--minutes", type=float)
    span.add_argument("--seconds", type=float)
    p.add_argument("--database-url")
    p.add_argument("--brokers", type=int, default=2)
    p.add_argument("--timer-clients", type=int, default=8)
    p.add_argument("--timer-rate", type=float, default=25.0, help="schedules/s per client")
    p.add_argument("--pushers", type=int, default=4)
    p.add_argument("--push-rate", type=float, default=10.0, help="20-message pushes/s each")
    p.add_argument("--consumers", type=int, default=2, help="per queue")
    p.add_argument("--lag-p99-ms", type=float, default=300.0,
                   help="target: well under MAX_SLEEP (1 s), the line of a wake-up bug")
    p.add_argument("--rss-growth-mib", type=float, default=16.0)
    p.add_argument("--json", type=Path, help="write the result here too")
    args = p.parse_args(argv)
    args.seconds = args.seconds or (args.minutes or 10) * 60
    with database(args.database_url) as url:
        result = trio.run(soak, args, url)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 1 if result["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())

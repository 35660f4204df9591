"""Thousands of parked long-polls against one broker process: what they cost while nothing
happens, and what a single push costs meanwhile.

    python -m bench.parked_polls                      # 3,000 polls, the figures in RELIABILITY.md
    python -m bench.parked_polls --polls 500 --json out.json

The run, against a broker subprocess (the polls' client is this process, as in production):

1. ``--polls`` pops with ``wait=true`` (autoAck, batch 1, ``--timeout-ms``) spread over
   ``--queues`` queues, each on its own connection (raw HTTP/1.1: httpx would cost this process
   more than the broker), opened ``--connect-concurrency`` at a time; then until the broker
   reports them all waiting (``queen_longpoll_waiters``; at most ``--park-within-s``).
2. A quiet spell of ``--quiet-s``, once PostgreSQL's counts have caught up (11 s): the
   transactions it counts for the database (``pg_stat_database``, which includes the broker's
   own services: sweeper, housekeeping, usage) and the broker's long-poll looks
   (``queen_longpoll_looks``) per second.
3. ``--pushes`` single-message pushes, one at a time, to a queue nobody waits on: their round
   trip (p50/p99) while the crowd is parked; ``/health`` is asked every 0.25 s meanwhile.
4. One push into each crowd queue: each must wake one parked poll with that message. The
   summary's ``first_deadline_left_s`` says how long before the first poll's deadline this
   step was done (below zero: the run was too slow for its ``--timeout-ms``).
5. Every poll is waited for: answered (200 with a message or 204) by its deadline plus
   ``--margin-s``; afterwards each crowd queue is drained, and every pushed message must have
   been received exactly once, by a poll or by the drain.

The summary (printed, and with ``--json`` saved) holds the figures and a list of failures;
exit code 1 if any check fails (``--push-p99-ms`` is the target for the push round trip).
PostgreSQL: ``--database-url`` (a migrated or empty database the run may use), else a
temporary embedded server.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import psycopg
import trio

from bench.harness.brokers import brokers, raise_fd_limit
from bench.harness.cpu import CpuMeter
from bench.harness.metrics import Metrics
from bench.harness.pg import scratch_database
from bench.harness.report import load, save_json, source_revision
from bench.harness.stats import distribution

API = "/api/v1"
BYSTANDER = "parked-bystander"
STATS_FLUSH_S = 11.0  # PGSTAT_IDLE_INTERVAL (10 s) and a margin


@dataclasses.dataclass
class Poll:
    queue: str
    deadline: float  # trio clock: when it must have been answered (its timeout)
    status: int | None = None
    answered_at: float | None = None
    txns: list[str] = dataclasses.field(default_factory=list)
    error: str | None = None


async def read_answer(stream: trio.abc.Stream) -> tuple[int, bytes]:
    """An HTTP/1.1 answer's status and body (by its Content-Length; none for a 204)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = await stream.receive_some(65536)
        if not chunk:
            raise ConnectionError(f"connection closed before an answer ({data[:80]!r})")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip())
    while len(body) < length:
        chunk = await stream.receive_some(65536)
        if not chunk:
            raise ConnectionError("connection closed in the middle of an answer")
        body += chunk
    return int(lines[0].split()[1]), body


async def park(poll: Poll, host: str, port: int, timeout_ms: int,
               connecting: trio.Semaphore) -> None:
    path = f"{API}/pop/queue/{poll.queue}?wait=true&timeout={timeout_ms}&autoAck=true&batch=1"
    try:
        async with connecting:
            # Released once the request is out: the rest is the wait.
            stream = await trio.open_tcp_stream(host, port)
        async with stream:
            await stream.send_all(f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n"
                                  .encode())
            poll.deadline = trio.current_time() + timeout_ms / 1000
            poll.status, body = await read_answer(stream)
        poll.answered_at = trio.current_time()
        if poll.status == 200:
            poll.txns = [m["transactionId"] for m in json.loads(body)["messages"]]
    except (OSError, ValueError, IndexError, KeyError) as exc:
        poll.answered_at = trio.current_time()
        poll.error = f"{type(exc).__name__}: {exc}"


def note(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def db_transactions(database_url: str) -> int:
    """Transactions committed and rolled back in the broker's database so far."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute("SELECT xact_commit + xact_rollback FROM pg_stat_database "
                           "WHERE datname = current_database()").fetchone()
    assert row is not None
    return int(row[0])


def rss_kib(pid: int | None) -> int | None:
    if pid is None:
        return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


async def scrape(http: httpx.AsyncClient) -> Metrics:
    return Metrics.parse((await http.get("/metrics")).text)


async def run(database_url: str, *, polls: int = 3000, queues: int = 30,
              timeout_ms: int = 120_000, quiet_s: float = 5.0, pushes: int = 300,
              margin_s: float = 2.0, connect_concurrency: int = 64,
              push_p99_ms: float = 50.0, push_phase_s: float = 60.0, park_within_s: float = 90.0,
              env: dict[str, str] | None = None) -> dict[str, Any]:
    raise_fd_limit(2 * polls + 1024)
    failures: list[str] = []
    summary: dict[str, Any] = {"checkout": source_revision(), "polls": polls, "queues": queues,
                               "timeout_ms": timeout_ms, "load_avg_at_start": load()}
    crowd = [f"parked-{i}" for i in range(queues)]
    with brokers(database_url, 1, env=env) as (handle,):
        host, port = "127.0.0.1", int(handle.url.rsplit(":", 1)[1])
        async with httpx.AsyncClient(base_url=handle.url, timeout=30) as http:
            for name in [*crowd, BYSTANDER]:
                (await http.post(f"{API}/configure", json={"queue": name})).raise_for_status()
            rss_before = rss_kib(handle.pid)
            meter = CpuMeter(handle.pid)
            cpu: dict[str, Any] = {}
            phase = (time.monotonic(), meter.snapshot())

            def phase_done(name: str) -> None:
                nonlocal phase
                now = (time.monotonic(), meter.snapshot())
                cpu[name] = {"s": round(now[0] - phase[0], 2),
                             **{f"{k}_cpu_s": round(now[1][k] - phase[1][k], 2)
                                for k in now[1]}}
                phase = now

            summary["cpu"] = cpu
            started = trio.current_time()
            crowd_polls: list[Poll] = []
            async with trio.open_nursery() as nursery:
                connecting = trio.Semaphore(connect_concurrency)
                for i in range(polls):
                    poll = Poll(crowd[i % queues], trio.current_time() + timeout_ms / 1000)
                    crowd_polls.append(poll)
                    nursery.start_soon(park, poll, host, port, timeout_ms, connecting)
                # 1. Parked: every pop is waiting.
                parked = 0.0
                with trio.move_on_after(park_within_s):
                    while True:
                        parked = (await scrape(http)).value("queen_longpoll_waiters")
                        if parked >= polls:
                            break
                        await trio.sleep(0.2)
                summary["parked"] = int(parked)
                phase_done("parking")
                note(f"{int(parked)} of {polls} polls parked")
                summary["parking_s"] = round(trio.current_time() - started, 2)
                summary["broker_rss_mib"] = {
                    "before": None if rss_before is None else round(rss_before / 1024, 1),
                    "parked": None if (kib := rss_kib(handle.pid)) is None
                    else round(kib / 1024, 1)}
                if parked < polls:
                    failures.append(f"only {int(parked)} of {polls} polls parked within "
                                    f"{park_within_s:.0f} s")

                # 2. Quiet: what the parked crowd costs while nothing changes. PostgreSQL's
                # backends report their counts up to 10 s late once idle: wait that out first.
                await trio.sleep(STATS_FLUSH_S)
                m0, x0 = await scrape(http), await trio.to_thread.run_sync(
                    db_transactions, database_url)
                t0 = time.monotonic()
                await trio.sleep(quiet_s)
                m1, x1 = await scrape(http), await trio.to_thread.run_sync(
                    db_transactions, database_url)
                quiet = time.monotonic() - t0
                phase_done("idle")
                looks = m1.minus(m0).by_label("queen_longpoll_looks_total", "reason")
                summary["idle"] = {
                    "seconds": round(quiet, 2),
                    "db_transactions_per_s": round((x1 - x0) / quiet, 1),
                    "longpoll_looks_per_s": ({k: round(v / quiet, 2) for k, v in looks.items()}
                                             if looks else "metric absent"),
                    "pool_waiting": m1.value("queen_db_pool_waiting"),
                }

                note(f"idle: {summary['idle']}")

                # 3. Single pushes to a queue nobody waits on, /health asked meanwhile.
                health: Counter[str] = Counter()
                latencies: list[float] = []
                pool_waiting_max = 0.0

                async def ask_health(done: trio.Event) -> None:
                    nonlocal pool_waiting_max
                    async with httpx.AsyncClient(base_url=handle.url, timeout=10) as own:
                        while not done.is_set():
                            try:
                                health[str((await own.get("/health")).status_code)] += 1
                                pool_waiting_max = max(pool_waiting_max, (await scrape(own))
                                                       .value("queen_db_pool_waiting"))
                            except httpx.HTTPError as exc:
                                health[type(exc).__name__] += 1
                            await trio.sleep(0.25)

                done = trio.Event()
                async with trio.open_nursery() as side:
                    side.start_soon(ask_health, done)
                    give_up = trio.current_time() + push_phase_s
                    for i in range(pushes):
                        if trio.current_time() > give_up:
                            failures.append(f"only {i} of {pushes} pushes in {push_phase_s} s")
                            break
                        t = time.perf_counter()
                        r = await http.post(f"{API}/push", json={"items": [
                            {"queue": BYSTANDER, "payload": {"i": i}}]})
                        latencies.append(time.perf_counter() - t)
                        if r.status_code != 201:
                            failures.append(f"bystander push answered {r.status_code}")
                    done.set()
                summary["push_with_crowd_parked_ms"] = distribution(latencies)
                phase_done("pushes")
                summary["health"] = dict(health)
                summary["pool_waiting_max"] = pool_waiting_max

                # 4. One push into each crowd queue: each wakes one of its parked polls.
                pushed: dict[str, str] = {}
                wake_pushes: list[float] = []
                for name in crowd:
                    txn = f"crowd-{uuid.uuid4()}"
                    t = time.perf_counter()
                    r = await http.post(f"{API}/push", json={"items": [
                        {"queue": name, "payload": {"q": name}, "transactionId": txn}]})
                    wake_pushes.append(time.perf_counter() - t)
                    if r.status_code != 201:
                        failures.append(f"crowd push answered {r.status_code}")
                    pushed[txn] = name
                summary["push_waking_a_poll_ms"] = distribution(wake_pushes)
                # How long before the first poll's deadline the steps above were done: below
                # zero, some polls were answered by their timeout before the quiet spell or the
                # pushes (the run was too slow for its --timeout-ms), and its figures mean less.
                summary["first_deadline_left_s"] = round(
                    min(p.deadline for p in crowd_polls) - trio.current_time(), 2)
                note(f"pushes done: {summary['push_with_crowd_parked_ms']}; waiting for the polls")
                # Polls still unanswered this long after the last one's deadline are given up.
                nursery.cancel_scope.deadline = (max(p.deadline for p in crowd_polls)
                                                 + margin_s + 30)
            # 5. Every poll answered (the nursery above waited for them all).
            phase_done("answering")
            lateness = [p.answered_at - p.deadline for p in crowd_polls
                        if p.answered_at is not None]
            late = [x for x in lateness if x > margin_s]
            statuses = Counter(str(p.status) if p.error is None else p.error.split(":")[0]
                               for p in crowd_polls)
            summary["poll_answers"] = dict(statuses)
            summary["late_polls"] = len(late)
            summary["unanswered_polls"] = sum(1 for p in crowd_polls if p.answered_at is None)
            summary["latest_answer_past_deadline_s"] = round(max(lateness), 3) if lateness else None
            received = Counter(t for p in crowd_polls for t in p.txns)
            drained: Counter[str] = Counter()
            for name in crowd:
                r = await http.get(f"{API}/pop/queue/{name}",
                                   params={"batch": 100, "autoAck": "true"})
                if r.status_code == 200:
                    drained.update(m["transactionId"] for m in r.json()["messages"])
            got = received + drained
            summary["messages"] = {"pushed": len(pushed),
                                   "received_by_polls": sum(received.values()),
                                   "drained_after": sum(drained.values()),
                                   "lost": sum(1 for t in pushed if got[t] == 0),
                                   "duplicated": sum(1 for t in pushed if got[t] > 1)}

    p99 = summary["push_with_crowd_parked_ms"].get("p99", float("inf"))
    if p99 > push_p99_ms:
        failures.append(f"push p99 {p99} ms with the crowd parked (target {push_p99_ms} ms)")
    if summary["unanswered_polls"]:
        failures.append(f"{summary['unanswered_polls']} polls never answered")
    if late:
        failures.append(f"{len(late)} polls answered more than {margin_s} s past their deadline")
    errors = [s for s in statuses if s not in ("200", "204")]
    if errors:
        failures.append(f"unexpected poll answers: { {s: statuses[s] for s in errors} }")
    if set(health) != {"200"}:
        failures.append(f"/health answered {dict(health)}")
    if summary["messages"]["lost"] or summary["messages"]["duplicated"]:
        failures.append(f"messages: {summary['messages']}")
    summary["failures"] = failures
    summary["load_avg_at_end"] = load()
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--polls", type=int, default=3000)
    parser.add_argument("--queues", type=int, default=30)
    parser.add_argument("--timeout-ms", type=int, default=120_000,
                        help="the polls' timeout: long enough to park them all first")
    parser.add_argument("--park-within-s", type=float, default=90.0)
    parser.add_argument("--quiet-s", type=float, default=5.0)
    parser.add_argument("--pushes", type=int, default=300)
    parser.add_argument("--margin-s", type=float, default=2.0)
    parser.add_argument("--connect-concurrency", type=int, default=64)
    parser.add_argument("--push-p99-ms", type=float, default=50.0)
    parser.add_argument("--push-phase-s", type=float, default=60.0,
                        help="stop the single pushes after this long")
    parser.add_argument("--database-url", default=os.environ.get("QUEEN_DATABASE_URL"))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    with scratch_database(args.database_url, "queen-parked-", database="queen") as url:
        summary = trio.run(lambda: run(
            url, polls=args.polls, queues=args.queues, timeout_ms=args.timeout_ms,
            quiet_s=args.quiet_s, pushes=args.pushes, margin_s=args.margin_s,
            connect_concurrency=args.connect_concurrency, push_p99_ms=args.push_p99_ms,
            push_phase_s=args.push_phase_s, park_within_s=args.park_within_s))
    print(json.dumps(summary, indent=2))
    if args.json:
        save_json(args.json, summary)
    return 1 if summary["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())

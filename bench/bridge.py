"""Latency of the trio⇄psycopg bridge (``queen_trio.db``) next to plain-psycopg baselines.

What it measures:

1. Round trip of ``SELECT 1``, sequential calls, for
   a.  the bridge: ``Database(url, max_size=1)``, one connection borrowed once and reused;
   a'. the bridge again, borrowing the connection per call (adds the checkout cost);
   b.  a plain psycopg sync connection called through ``trio.to_thread.run_sync`` in trio
       ("plain psycopg in a thread", the naive baseline);
   c.  the same kind of plain connection called directly: no event loop, no thread (the floor);
   d.  psycopg's ``AsyncConnection`` on asyncio (reference).
   All connections are autocommit. The bridge returns dict rows, the plain ones tuples.
2. NOTIFY → wake latency. A sender thread stamps the clock right before
   ``execute("NOTIFY bench_wake, '<seq>'")``; the receiver stamps it as soon as it holds the
   notification and only then sets a ``threading.Event`` that lets the sender send the next
   one, so the hand-off lies outside both timed windows. Receivers: a trio task subscribed to
   ``queen_trio.db.listener.Listener`` (the bridge), and a thread blocked in a plain LISTEN
   connection's ``notifies()`` generator (the baseline).

Small VMs drift a lot from one second to the next, so every variant runs in ROUNDS batches,
interleaved and in rotating order, each batch on a fresh connection with its own warm-up. The
distributions pool all measured samples; the per-round p50 spread is shown as a noise gauge.
Clock: ``time.perf_counter_ns()`` (one monotonic clock for all threads).

Run from the repository root::

    python -m bench.bridge | tee bench/results/bridge.txt

The database is ``$QUEEN_DATABASE_URL`` if set, else an embedded PostgreSQL in a temporary
directory (stopped and removed at the end). The summary also goes to bench/results/bridge.json.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import gc
import json
import os
import platform
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import trio

from bench.harness.pg import scratch_database
from bench.harness.stats import percentile
from queen_trio.db.listener import Listener, Notification
from queen_trio.db.pool import Database

ROUNDS = 20
QUERY = "SELECT 1"
QUERY_N = 3000  # measured calls per variant, in ROUNDS batches
QUERY_BATCH = QUERY_N // ROUNDS
QUERY_WARMUP = 50  # per batch
WAKE_N = 2000  # measured notifications per receiver, in ROUNDS batches
WAKE_BATCH = WAKE_N // ROUNDS
WAKE_WARMUP = 20  # per batch
WAKE_CHANNEL = "bench_wake"
WAKE_TIMEOUT_S = 30.0  # per batch: a lost notification must not hang the script
RESULTS_DIR = Path(__file__).resolve().parent / "results"

Samples = list[int]  # nanoseconds


# -- statistics -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Summary:
    """A latency distribution pooled over all rounds, in microseconds."""

    n: int
    p50: float
    p90: float
    p99: float
    max: float
    mean: float
    round_p50s: list[float]

    @classmethod
    def of(cls, rounds: list[Samples]) -> Summary:
        s = sorted(x for batch in rounds for x in batch)
        return cls(
            n=len(s),
            p50=percentile(s, 50) / 1000,
            p90=percentile(s, 90) / 1000,
            p99=percentile(s, 99) / 1000,
            max=s[-1] / 1000,
            mean=round(sum(s) / len(s) / 1000, 1),
            round_p50s=[percentile(sorted(b), 50) / 1000 for b in rounds],
        )


# -- running -----------------------------------------------------------------------------------


def run_rounds(batches: dict[str, Callable[[], Samples]]) -> dict[str, list[Samples]]:
    """Run every batch ROUNDS times, interleaved, rotating which variant goes first."""
    keys = list(batches)
    results: dict[str, list[Samples]] = {key: [] for key in keys}
    for r in range(ROUNDS):
        shift = r % len(keys)
        for key in keys[shift:] + keys[:shift]:
            results[key].append(batches[key]())
    return results


def time_sync(call: Callable[[], object]) -> Samples:
    for _ in range(QUERY_WARMUP):
        call()
    gc.collect()
    samples = []
    for _ in range(QUERY_BATCH):
        t0 = time.perf_counter_ns()
        call()
        samples.append(time.perf_counter_ns() - t0)
    return samples


async def time_async(call: Callable[[], Awaitable[object]]) -> Samples:
    """Same as :func:`time_sync` for a coroutine function (works on trio and asyncio)."""
    for _ in range(QUERY_WARMUP):
        await call()
    gc.collect()
    samples = []
    for _ in range(QUERY_BATCH):
        t0 = time.perf_counter_ns()
        await call()
        samples.append(time.perf_counter_ns() - t0)
    return samples


def plain_connect(url: str) -> psycopg.Connection[Any]:
    return psycopg.connect(url, autocommit=True)


# -- 1. query round trip -----------------------------------------------------------------------


def query_batches(url: str, pool_stats: list[dict[str, Any]]) -> dict[str, Callable[[], Samples]]:
    """One batch function per variant; bridge batches append their pool statistics."""

    def bridge(*, borrow_per_call: bool) -> Samples:
        async def main() -> Samples:
            async with Database(url, max_size=1) as db:
                async with db.connection() as conn:
                    assert await conn.fetchval(QUERY) == 1

                    async def reuse() -> None:
                        await conn.fetchval(QUERY)

                    samples = None if borrow_per_call else await time_async(reuse)

                async def borrow() -> None:
                    async with db.connection() as c:
                        await c.fetchval(QUERY)

                if borrow_per_call:
                    samples = await time_async(borrow)
                pool_stats.append(dataclasses.asdict(db.statistics()))
                assert samples is not None
                return samples

        return trio.run(main)

    def thread() -> Samples:
        with plain_connect(url) as conn:

            def query() -> object:
                return conn.execute(QUERY).fetchone()

            async def call() -> None:
                await trio.to_thread.run_sync(query)

            return trio.run(time_async, call)

    def direct() -> Samples:
        with plain_connect(url) as conn:
            return time_sync(lambda: conn.execute(QUERY).fetchone())

    def on_asyncio() -> Samples:
        async def main() -> Samples:
            async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:

                async def call() -> None:
                    await (await conn.execute(QUERY)).fetchone()

                return await time_async(call)

        return asyncio.run(main())

    return {
        "bridge": lambda: bridge(borrow_per_call=False),
        "bridge_checkout": lambda: bridge(borrow_per_call=True),
        "thread": thread,
        "direct": direct,
        "asyncio": on_asyncio,
    }


# -- 2. NOTIFY -> wake latency -----------------------------------------------------------------


class NotifySender:
    """Sends ``NOTIFY bench_wake, '<seq>'`` from its own thread, one each time ``go`` is set.

    ``sent_at[seq]`` is stamped right before the ``execute``. The receiver sets ``go`` once it
    holds notification ``seq`` (and once before the first).
    """

    def __init__(self, url: str, total: int) -> None:
        self.total = total
        self.go = threading.Event()
        self.sent_at: Samples = [0] * total
        self.error: BaseException | None = None
        self._conn = plain_connect(url)
        self._thread = threading.Thread(target=self._run, name="notify-sender", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.go.set()  # in case the receiver gave up early
        self._thread.join(timeout=5)
        self._conn.close()
        if self.error is not None:
            raise RuntimeError("the NOTIFY sender failed") from self.error

    def latencies(self, received_at: Samples) -> Samples:
        """Per-notification latency, warm-up dropped."""
        if len(received_at) != self.total:
            raise RuntimeError(f"received {len(received_at)} of {self.total} notifications")
        pairs = zip(self.sent_at, received_at, strict=True)
        return [received - sent for sent, received in pairs][WAKE_WARMUP:]

    def _run(self) -> None:
        try:
            for seq in range(self.total):
                if not self.go.wait(timeout=WAKE_TIMEOUT_S):
                    raise TimeoutError(f"the receiver never asked for notification {seq}")
                self.go.clear()
                self.sent_at[seq] = time.perf_counter_ns()
                self._conn.execute(f"NOTIFY {WAKE_CHANNEL}, '{seq}'")
        except BaseException as exc:  # reported by stop()
            self.error = exc


def check_payload(payload: str, seq: int) -> None:
    if payload != str(seq):
        raise RuntimeError(f"expected notification {seq}, received payload {payload!r}")


def wake_batches(
    url: str, listener_stats: list[dict[str, Any]]
) -> dict[str, Callable[[], Samples]]:
    """Bridge and baseline receivers; the bridge batch appends its listener statistics."""
    total = WAKE_WARMUP + WAKE_BATCH

    def bridge() -> Samples:
        sender = NotifySender(url, total)
        received_at: Samples = []

        async def main() -> None:
            async with trio.open_nursery() as nursery:
                listener = Listener(url, [WAKE_CHANNEL])
                await nursery.start(listener.run)
                with listener.subscribe(WAKE_CHANNEL) as rx, trio.fail_after(WAKE_TIMEOUT_S):
                    sender.start()
                    for seq in range(total):
                        sender.go.set()
                        item = await rx.receive()
                        received_at.append(time.perf_counter_ns())
                        if not isinstance(item, Notification):
                            raise RuntimeError(f"expected notification {seq}, received {item!r}")
                        check_payload(item.payload, seq)
                listener_stats.append(dataclasses.asdict(listener.statistics()))
                nursery.cancel_scope.cancel()

        try:
            trio.run(main)
        finally:
            sender.stop()
        return sender.latencies(received_at)

    def plain() -> Samples:
        sender = NotifySender(url, total)
        received_at: Samples = []
        errors: list[BaseException] = []

        def receive(conn: psycopg.Connection[Any]) -> None:
            try:
                sender.go.set()
                notifies = conn.notifies(timeout=WAKE_TIMEOUT_S, stop_after=total)
                for seq, item in enumerate(notifies):
                    received_at.append(time.perf_counter_ns())
                    check_payload(item.payload, seq)
                    if seq + 1 < total:
                        sender.go.set()
            except BaseException as exc:  # re-raised below, in the main thread
                errors.append(exc)

        try:
            with plain_connect(url) as conn:
                conn.execute(f"LISTEN {WAKE_CHANNEL}")
                receiver = threading.Thread(target=receive, args=(conn,), name="notify-receiver")
                sender.start()
                receiver.start()
                receiver.join()
        finally:
            sender.stop()
        if errors:
            raise RuntimeError("the plain LISTEN receiver failed") from errors[0]
        return sender.latencies(received_at)

    return {"bridge": bridge, "plain": plain}


# -- environment -------------------------------------------------------------------------------


@contextmanager
def database_url() -> Iterator[tuple[str, str]]:
    """Yield (url, where it comes from): $QUEEN_DATABASE_URL, or a throw-away embedded server."""
    url = os.environ.get("QUEEN_DATABASE_URL")
    with scratch_database(url, "queen-bench-") as scratch:
        yield scratch, "QUEEN_DATABASE_URL" if url else "embedded (temporary)"


def machine_info(url: str, source: str) -> dict[str, Any]:
    with plain_connect(url) as conn:
        row = conn.execute("SHOW server_version").fetchone()
    return {
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
        "psycopg": f"{psycopg.__version__} ({psycopg.pq.__impl__})",
        "trio": trio.__version__,
        "server_version": row[0] if row else None,
        "database": source,
    }


def totals(stats: list[dict[str, Any]], *keys: str) -> dict[str, int]:
    return {"batches": len(stats), **{key: sum(s[key] for s in stats) for key in keys}}


# -- report ------------------------------------------------------------------------------------

QUERY_LABELS = {
    "bridge": "(a)  bridge, borrowed once",
    "bridge_checkout": "(a') bridge, borrow per call",
    "thread": "(b)  plain psycopg in a trio thread",
    "direct": "(c)  plain psycopg, direct (floor)",
    "asyncio": "(d)  psycopg AsyncConnection, asyncio",
}
WAKE_LABELS = {
    "bridge": "bridge: Listener -> trio task",
    "plain": "baseline: notifies() in a thread",
}


def format_table(labels: dict[str, str], rows: dict[str, Summary]) -> str:
    width = max(len(label) for label in labels.values())
    lines = [f"{'':<{width}}  {'p50':>7} {'p90':>7} {'p99':>7} {'max':>8}   rounds' p50"]
    for key, label in labels.items():
        s = rows[key]
        spread = f"{min(s.round_p50s):.0f}-{max(s.round_p50s):.0f}"
        lines.append(
            f"{label:<{width}}  {s.p50:7.1f} {s.p90:7.1f} {s.p99:7.1f} {s.max:8.1f}   {spread}"
        )
    return "\n".join(lines)


def query_comparison(q: dict[str, Summary]) -> dict[str, Any]:
    floor = q["direct"].p50
    bridge_overhead = q["bridge"].p50 - floor
    thread_overhead = q["thread"].p50 - floor
    return {
        "overhead_vs_direct_p50_us": {key: round(s.p50 - floor, 1) for key, s in q.items()},
        "bridge_over_thread_p50_ratio": round(q["bridge"].p50 / q["thread"].p50, 2),
        "bridge_over_thread_overhead_ratio": (
            round(bridge_overhead / thread_overhead, 2) if thread_overhead > 0 else None
        ),
    }


def wake_comparison(w: dict[str, Summary]) -> dict[str, float]:
    bridge, plain = w["bridge"], w["plain"]
    return {p: round(getattr(bridge, p) - getattr(plain, p), 1) for p in ("p50", "p90", "p99")}


def print_report(info: dict[str, Any], q: dict[str, Summary], qc: dict[str, Any],
                 w: dict[str, Summary], wc: dict[str, float],
                 pool: dict[str, int], listener: dict[str, int]) -> None:
    print("queen-trio bridge benchmark")
    for key, value in info.items():
        print(f"  {key:<15} {value}")
    print(f"  rounds          {ROUNDS} (variants interleaved, fresh connection per batch)")
    print()
    print(f"1. {QUERY!r} round trip, µs: {ROUNDS} x {QUERY_BATCH} sequential calls per variant, "
          f"{QUERY_WARMUP} warm-up calls per batch")
    print(format_table(QUERY_LABELS, q))
    print()
    print("   overhead vs (c) at p50, µs:")
    for key, label in QUERY_LABELS.items():
        if key != "direct":
            print(f"     {label:<38} {qc['overhead_vs_direct_p50_us'][key]:+7.1f}")
    print(f"   bridge (a) / plain-in-thread (b), p50 round trip:  "
          f"{qc['bridge_over_thread_p50_ratio']:.2f}x")
    if qc["bridge_over_thread_overhead_ratio"] is not None:
        print(f"   bridge (a) / plain-in-thread (b), p50 overhead over (c): "
              f"{qc['bridge_over_thread_overhead_ratio']:.2f}x")
    print()
    print(f"2. NOTIFY -> wake, µs: {ROUNDS} x {WAKE_BATCH} notifications per receiver, one at a "
          f"time, {WAKE_WARMUP} warm-up per batch")
    print(format_table(WAKE_LABELS, w))
    print("   bridge - baseline (bridge overhead): "
          + ", ".join(f"{p} {v:+.1f}" for p, v in wc.items()))
    print()
    print(f"pool statistics (sum over bridge batches):     {pool}")
    print(f"listener statistics (sum over bridge batches): {listener}")


def main() -> None:
    pool_stats: list[dict[str, Any]] = []
    listener_stats: list[dict[str, Any]] = []
    started = time.monotonic()
    with database_url() as (url, source):
        info = machine_info(url, source)
        query_runs = run_rounds(query_batches(url, pool_stats))
        wake_runs = run_rounds(wake_batches(url, listener_stats))

    q = {key: Summary.of(runs) for key, runs in query_runs.items()}
    w = {key: Summary.of(runs) for key, runs in wake_runs.items()}
    qc, wc = query_comparison(q), wake_comparison(w)
    pool = totals(pool_stats, "connects_total", "discarded_total", "in_use", "waiting")
    listener = totals(listener_stats, "connects_total", "reconnects_total",
                      "notifications_total", "dropped_total")
    print_report(info, q, qc, w, wc, pool, listener)

    summary = {
        "timestamp": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": info,
        "unit": "microseconds",
        "elapsed_s": round(time.monotonic() - started, 1),
        "query": {
            "sql": QUERY, "n": QUERY_N, "rounds": ROUNDS, "batch": QUERY_BATCH,
            "warmup_per_batch": QUERY_WARMUP,
            "variants": {key: dataclasses.asdict(s) for key, s in q.items()},
            **qc,
        },
        "wake": {
            "channel": WAKE_CHANNEL, "n": WAKE_N, "rounds": ROUNDS, "batch": WAKE_BATCH,
            "warmup_per_batch": WAKE_WARMUP,
            "variants": {key: dataclasses.asdict(s) for key, s in w.items()},
            "bridge_minus_plain_us": wc,
        },
        "pool_statistics": pool,
        "listener_statistics": listener,
    }
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / "bridge.json"
    path.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"\nraw summary written to {path}")


if __name__ == "__main__":
    main()

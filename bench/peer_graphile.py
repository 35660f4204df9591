"""queen-trio beside graphile-worker and Procrastinate on one PostgreSQL server: issue 32's
side-by-side runs.

Parties (each unit on a fresh database of the same server, its processes started for it):

* ``ours``: one broker (``python -m queen_trio serve`` at its defaults), timers scheduled
  through the SDK in bundles of 500 (``queen.transaction().schedule_many(q, 500 timers)``,
  ``commit()``: :func:`sdk_bundle`), received by one ``Client.consume()`` at its defaults in a
  process of its own (``bench.harness.sdk_consumer``);
* ``graphile-default`` / ``graphile-tuned``: one graphile-worker ``run()`` in a Node process
  (``bench/peers/graphile/peer.mjs worker``; profiles there: ``tuned`` is concurrency 16,
  pollInterval 10 ms, pool 18, localQueue 500, completeJobBatchDelay 0), jobs added with
  ``addJobs`` in bundles of 500 by another Node process (``peer.mjs add``);
* ``procrastinate-default`` / ``procrastinate-tuned``: one Procrastinate worker in a Python
  process of its own (``bench.harness.peer_procrastinate``; ``tuned`` is graphile-worker
  tuned's profile spelled for it: concurrency 16, a poll every 10 ms, pool 18), jobs deferred
  from this process through its synchronous connector (``batch_defer_jobs`` of 500, or
  ``defer_job`` of one), each at its due instant (``schedule_at``). Procrastinate is a dev
  extra; where it is not installed its parties are left out and the run says so.

Before every unit the server is settled (:meth:`bench.harness.pg.Server.settle`: a
CHECKPOINT, then a wait for its processes to go quiet), so that no party pays in its window for
what the unit before it left (a burst's dirty pages, autovacuum): the unit's ``settle_s`` and
``server_cores_before`` are in the JSON.

Scenarios (``--scenario``), rounds A/B interleaved (the party order reverses every round):

* ``schedule``: N far-future timers/jobs in bundles of 500, one caller, after 2 untimed
  bundles: timers/s and CPU per timer of the caller, the broker and PostgreSQL. Graphile rows:
  ``addJobs`` plain, and with a ``jobKey`` per job (a keyed upsert, what our timers are);
  Procrastinate: ``batch_defer_jobs``. A peer's schedule rows run when one of its parties is
  chosen;
* ``burst``: N due at one instant, drained by the one consumer/worker: handled/s from the due
  instant to the last handler start, the first-to-last rate, CPU per timer;
* ``steady``: R/s due for S seconds (scheduled ahead): lag (due -> handler start) p50/p90/
  p99/max, every timer handled once, CPU per timer of every party (PostgreSQL's backends,
  the broker, the consumer or worker) from the first due instant until the last is handled;
* ``idle``: timers scheduled one at a time, their due instants at least 25 ms apart
  (``bench.harness.spacing``): lag p50/p90/p99/max.

Lag is the handler's start (its first act: a timestamp) minus the due instant: for ours the
``deliverAt`` the broker answered, for graphile the job's ``runAt``, for Procrastinate its
``scheduled_at``. One machine, one clock.

    npm ci --prefix bench/peers/graphile        # once: graphile-worker, pinned
    python -m bench.peer_graphile               # moderate sizes, 2 rounds (about 15 min)
    python -m bench.peer_graphile --quick       # small sizes, 1 round (about 3 min)
    python -m bench.peer_graphile --scenario steady --steady-seconds 30 --rounds 3

Writes bench/results/peers32.txt and peers32.json (``--out NAME`` for another name;
``--table-only`` rewrites the text's table from the JSON).

Against a branch: the broker, the consumer and the SDK that schedules are the checkout's on
PYTHONPATH (run from its root with ``PYTHONPATH=$PWD``); compare the ``ours / tuned`` ratios of
runs, not their absolute figures, unless the load was the same. The SDK's bundle is
:func:`sdk_bundle` and the single call :func:`sdk_one`: a faster SDK call for many timers goes
there, in one place.
A temporary embedded PostgreSQL is started unless ``--admin-url`` (or QUEEN_DATABASE_URL)
names a server where databases may be created.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import trio

import queen_trio
from bench.harness import peer_procrastinate, pg_statements
from bench.harness.api import epoch
from bench.harness.brokers import brokers
from bench.harness.collector import collector_paused
from bench.harness.cpu import TreeCpu
from bench.harness.lines import LineProcess
from bench.harness.pg import Server, shared_server
from bench.harness.report import Failures, json_default, load, now_iso, source_revision
from bench.harness.sdk_consumer import SdkConsumer
from bench.harness.spacing import SpacedDelays
from bench.harness.stats import distribution, median, quantiles
from bench.harness.timers import BUNDLE, FAR_DELAY_MS, Delivery, wait_delivered

RESULTS_DIR = Path(__file__).resolve().parent / "results"
PEER_DIR = Path(__file__).resolve().parent / "peers" / "graphile"
PEER_JS = PEER_DIR / "peer.mjs"
SCENARIOS = ("schedule", "burst", "steady", "idle")
PARTIES = ("ours", "graphile-default", "graphile-tuned", "procrastinate-default",
           "procrastinate-tuned")
SCHEDULE_PARTIES = ("ours", "graphile", "graphile-jobkey", "procrastinate")
# The peers, each with its parties' common prefix: its columns in the table, the party its
# ratio column is over, its schedule rows, and the schedule row its ratio is over.
PEERS = {"graphile": ("graphile-tuned", ("graphile", "graphile-jobkey"), "graphile"),
         "procrastinate": ("procrastinate-tuned", ("procrastinate",), "procrastinate")}
QUEUE = "peers32"
CALIBRATION_QUEUE = "peers32-calibration"
CALIBRATION_BUNDLES = 3
MARGIN = 1.5  # scheduling time = timers / calibrated rate x this (a loaded machine varies)
LEAD_S = 2.0  # first due instant after scheduling is expected to end
IDLE_SEED = 20261204


@dataclasses.dataclass(frozen=True)
class Sizes:
    rounds: int = 2
    schedule_timers: int = 20_000
    burst_timers: int = 50_000
    steady_rate: int = 500
    steady_seconds: int = 20
    idle_timers: int = 100
    idle_spacing_s: float = 0.25
    idle_delay_ms: tuple[int, int] = (200, 1000)
    wait_burst_s: float = 300.0  # after the due instant
    wait_steady_s: float = 15.0  # after the last due instant
    wait_idle_s: float = 8.0  # after the last due instant (graphile's default polls every 2 s)
    # graphile-worker at its defaults starts one job at a time, a commit each (about 100/s
    # here): the burst and the steady run stop waiting for it after this, the rest counted
    # as not started in time (not lost, not a failure of the run).
    wait_capped_s: float = 30.0


SIZES = {
    "moderate": Sizes(),
    "quick": Sizes(rounds=1, schedule_timers=5_000, burst_timers=10_000, steady_seconds=5,
                   idle_timers=30),
    "smoke": Sizes(rounds=1, schedule_timers=1_000, burst_timers=1_000, steady_rate=100,
                   steady_seconds=2, idle_timers=5, wait_steady_s=10.0),
}


# -- graphile-worker's processes ----------------------------------------------------------


def node() -> str | None:
    return shutil.which("node")


def missing() -> str | None:
    """Why graphile-worker cannot run here, or None."""
    if node() is None:
        return "node is not on PATH (Node 20 or later)"
    if not (PEER_DIR / "node_modules" / "graphile-worker" / "package.json").exists():
        return f"graphile-worker is not installed: npm ci --prefix {PEER_DIR}"
    return None


def graphile_version() -> str:
    package = PEER_DIR / "node_modules" / "graphile-worker" / "package.json"
    return str(json.loads(package.read_text())["version"])


def graphile_profiles() -> dict[str, Any]:
    import subprocess

    out = subprocess.run([node() or "node", str(PEER_JS), "profiles"], capture_output=True,
                         text=True, check=True, cwd=PEER_DIR).stdout
    return dict(json.loads(out))


def node_url(dsn: str) -> str:
    """A libpq DSN (``key=value`` or URL) as the URL node-postgres reads."""
    from urllib.parse import quote

    from psycopg.conninfo import conninfo_to_dict

    p = {k: str(v) for k, v in conninfo_to_dict(dsn).items()}
    auth = quote(p.get("user", "postgres"), safe="")
    if p.get("password"):
        auth += ":" + quote(p["password"], safe="")
    return (f"postgresql://{auth}@{p.get('host', 'localhost')}:{p.get('port', '5432')}/"
            f"{quote(p.get('dbname', 'postgres'), safe='')}")


class NodeProcess(LineProcess):
    """``node peer.mjs <args>``, in the LineProcess protocol (READY, then lines)."""

    def __init__(self, args: list[str], *, what: str) -> None:
        super().__init__("-", [], what=what, log_prefix="queen-bench-graphile-")
        self.cmd = [node() or "node", str(PEER_JS), *args]


class GraphileWorker(NodeProcess):
    """``on_job(key, due, started)`` (epoch seconds) for every job the worker starts."""

    def __init__(self, dsn: str, profile: str) -> None:
        super().__init__(["worker", "--dsn", node_url(dsn), "--profile", profile],
                         what=f"graphile worker ({profile})")
        self.on_job: Callable[[str, float, float], None] = lambda *_: None

    def on_line(self, line: str) -> None:
        parts = line.split("\t")
        if len(parts) == 3:
            self.on_job(parts[0], float(parts[1]) / 1000, float(parts[2]) / 1000)


class GraphileAdd(NodeProcess):
    """One ``peer.mjs add --gate``: ready once connected (and warm), then adds the jobs of its
    file when told (SIGUSR1) and prints its statistics."""

    def __init__(self, dsn: str, path: Path, warmup: int) -> None:
        super().__init__(["add", "--dsn", node_url(dsn), "--file", str(path),
                          "--warmup", str(warmup), "--gate"], what="graphile addJobs")
        self.stats: dict[str, Any] | None = None
        self.done = trio.Event()

    def on_line(self, line: str) -> None:
        if line.startswith("{"):
            self.stats = json.loads(line)
            self.done.set()


Job = tuple[str, float, float | None]  # key, due (epoch s), send at (epoch s) or None


async def graphile_add(dsn: str, make_jobs: Callable[[], Sequence[Job]], *, warmup: int = 0,
                       job_key: bool = False, cpu: TreeCpu | None = None,
                       limit_s: float = 900.0) -> tuple[dict[str, Any], dict[str, float]]:
    """Adds the jobs ``make_jobs()`` gives, called once the adder is connected (so the due
    instants it computes need no allowance for Node's start-up). Its statistics, and the
    CPU seconds per party from the go to the answer."""
    fd, name = tempfile.mkstemp(prefix="queen-bench-graphile-", suffix=".json")
    os.close(fd)
    path = Path(name)
    adder = GraphileAdd(dsn, path, warmup)

    async def run(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            await adder.run(task_status=task_status)
        finally:
            adder.done.set()

    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(run)
            jobs = [[key, round(due * 1000), None if at is None else round(at * 1000)]
                    for key, due, at in make_jobs()]
            # a local file, before the measured part
            path.write_text(json.dumps(  # noqa: ASYNC240
                {"bundle": BUNDLE, "jobKey": job_key, "jobs": jobs}))
            before = cpu.snapshot() if cpu else {}
            assert adder.process is not None
            adder.process.send_signal(signal.SIGUSR1)
            with trio.fail_after(limit_s):
                await adder.done.wait()
            after = cpu.snapshot() if cpu else {}
            nursery.cancel_scope.cancel()
    finally:
        path.unlink(missing_ok=True)  # noqa: ASYNC240 - a local file, after it
    if adder.stats is None:
        raise RuntimeError(f"graphile addJobs gave no statistics: {adder.log_tail()}")
    return adder.stats, TreeCpu.seconds(before, after)


def graphile_sql(dsn: str, statement: str) -> int:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        cursor = conn.execute(statement)
        row = cursor.fetchone() if cursor.description else None
    return int(row[0]) if row else 0


# -- the two sides behind one interface ---------------------------------------------------


class Side(Protocol):
    delivery: Delivery
    call_s: list[float]
    capped: bool  # waits at most Sizes.wait_capped_s for a backlog

    async def calibrate(self) -> float: ...

    async def schedule(self, make_jobs: Callable[[], Sequence[Job]]) -> None: ...

    async def analyze(self) -> None: ...

    async def pending(self) -> set[str]: ...


def wire_time(epoch_s: float) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(round(epoch_s, 6), datetime.UTC).isoformat() \
        .replace("+00:00", "Z")


async def sdk_bundle(queen: queen_trio.Client, queue: str, entries: Sequence[tuple[str, int]]
                     ) -> list[queen_trio.TimerResult]:
    """The SDK's bundle of timers: one transaction (``schedule_many``), ``(key, delayMs)``
    each; the timers the broker scheduled (:func:`answers_of` makes what
    ``Delivery.schedule_answer`` takes: the schedule scenario only counts them, as graphile's
    rows count their jobs)."""
    result = await queen.transaction().schedule_many(
        queue, [(key, delay, {"k": key}) for key, delay in entries]).commit()
    return [t for t in result.timers if t.ok and t.deliver_at is not None]


def answers_of(timers: Sequence[queen_trio.TimerResult]) -> list[dict[str, Any]]:
    return [{"timerKey": t.key, "deliverAt": wire_time(t.deliver_at.timestamp())}
            for t in timers if t.deliver_at is not None]


async def sdk_one(queen: queen_trio.Client, queue: str, key: str, delay_ms: int
                  ) -> list[dict[str, Any]]:
    """One timer through the SDK's single call (``queen.timer(q)….schedule()``)."""
    t = await queen.timer(queue).key(key).delay(delay_ms).payload({"k": key}).schedule()
    if not t.ok or t.deliver_at is None:
        return []
    return [{"timerKey": t.key, "deliverAt": wire_time(t.deliver_at.timestamp())}]


class Ours:
    capped = False

    def __init__(self, queen: queen_trio.Client, dsn: str, delivery: Delivery,
                 failures: Failures) -> None:
        self.queen, self.dsn, self.delivery, self.failures = queen, dsn, delivery, failures
        self.call_s: list[float] = []  # each schedule call's round trip

    async def calibrate(self) -> float:
        await self.queen.configure(CALIBRATION_QUEUE)
        stamp = time.monotonic_ns()
        for b in range(1 + CALIBRATION_BUNDLES):
            if b == 1:
                t0 = time.perf_counter()
            await sdk_bundle(self.queen, CALIBRATION_QUEUE,
                             [(f"cal-{stamp}-{b}-{i}", FAR_DELAY_MS) for i in range(BUNDLE)])
        return CALIBRATION_BUNDLES * BUNDLE / (time.perf_counter() - t0)

    async def schedule(self, make_jobs: Callable[[], Sequence[Job]]) -> None:
        jobs = list(make_jobs())
        i = 0
        while i < len(jobs):
            if jobs[i][2] is not None:  # paced: alone, at its instant, as one call
                key, due, at = jobs[i]
                await trio.sleep(max(0.0, (at or 0.0) - time.time()))
                group = [jobs[i]]
                sent = time.perf_counter()
                answers = await sdk_one(self.queen, QUEUE, key, round((due - time.time()) * 1000))
            else:
                group = [j for j in jobs[i:i + BUNDLE] if j[2] is None]
                now = time.time()
                entries = [(key, round((due - now) * 1000)) for key, due, _ in group]
                sent = time.perf_counter()
                scheduled = await sdk_bundle(self.queen, QUEUE, entries)
            self.call_s.append(time.perf_counter() - sent)
            if jobs[i][2] is None:
                answers = answers_of(scheduled)
            if len(answers) != len(group):
                self.failures.add(self.delivery.scenario, "schedule",
                                  f"{len(group) - len(answers)} of {len(group)} not scheduled")
            for answer in answers:
                self.delivery.schedule_answer(answer)
            i += len(group)

    async def analyze(self) -> None:
        await trio.to_thread.run_sync(graphile_sql, self.dsn, "ANALYZE")

    async def pending(self) -> set[str]:
        return set()  # a timer that never fired shows as lost


class Graphile:
    def __init__(self, dsn: str, delivery: Delivery, capped: bool) -> None:
        self.dsn, self.delivery, self.capped = dsn, delivery, capped
        self.call_s: list[float] = []  # each addJobs call's round trip

    async def calibrate(self) -> float:
        far = time.time() + FAR_DELAY_MS / 1000
        stats, _ = await graphile_add(self.dsn, lambda: [
            (f"cal-{i}", far, None) for i in range(CALIBRATION_BUNDLES * BUNDLE)], warmup=1)
        await trio.to_thread.run_sync(graphile_sql, self.dsn,
                                      "DELETE FROM graphile_worker._private_jobs")
        return float(stats["jobs"]) / (stats["elapsed_ms"] / 1000)

    async def schedule(self, make_jobs: Callable[[], Sequence[Job]]) -> None:
        made: list[Job] = []

        def keep() -> Sequence[Job]:
            made.extend(make_jobs())
            return made

        stats, _ = await graphile_add(self.dsn, keep)
        self.call_s += [x / 1000 for x in stats["call_ms"]]
        for key, due, _ in made:  # addJobs answered every one (peer.mjs checks the count)
            self.delivery.schedule_answer({"timerKey": key, "deliverAt": wire_time(
                round(due * 1000) / 1000)})

    async def analyze(self) -> None:
        await trio.to_thread.run_sync(graphile_sql, self.dsn, "ANALYZE")

    async def pending(self) -> set[str]:
        """Keys of the jobs still in its table (waiting, or in flight)."""
        return await trio.to_thread.run_sync(self._pending)

    def _pending(self) -> set[str]:
        import psycopg

        with psycopg.connect(self.dsn) as conn:
            rows = conn.execute("SELECT payload->>'k' FROM graphile_worker._private_jobs")
            return {str(k) for (k,) in rows}


class Procrastinate:
    """Jobs deferred from this process through Procrastinate's synchronous connector, one
    statement a bundle (or a job), called on the event loop's thread: the call's time is its
    own, as the SDK's and addJobs' are (a worker thread's hand-over would add to it)."""

    def __init__(self, client: peer_procrastinate.PeerClient, delivery: Delivery,
                 capped: bool) -> None:
        self.client, self.delivery, self.capped = client, delivery, capped
        self.call_s: list[float] = []  # each defer call's round trip

    async def calibrate(self) -> float:
        far = time.time() + FAR_DELAY_MS / 1000
        for b in range(1 + CALIBRATION_BUNDLES):
            if b == 1:
                t0 = time.perf_counter()
            self.client.defer_at([(f"cal-{b}-{i}", far) for i in range(BUNDLE)],
                                 peer_procrastinate.SIDE_QUEUE)
            await trio.lowlevel.checkpoint()
        rate = CALIBRATION_BUNDLES * BUNDLE / (time.perf_counter() - t0)
        await self.client.drop_side()  # (its fetch would walk them: see drop_side)
        return rate

    async def schedule(self, make_jobs: Callable[[], Sequence[Job]]) -> None:
        jobs = list(make_jobs())
        i = 0
        while i < len(jobs):
            if jobs[i][2] is not None:  # paced: alone, at its instant, as one call
                await trio.sleep(max(0.0, (jobs[i][2] or 0.0) - time.time()))
                group = [jobs[i]]
            else:
                group = [j for j in jobs[i:i + BUNDLE] if j[2] is None]
            sent = time.perf_counter()
            deferred = self.client.defer_at([(key, due) for key, due, _ in group])
            self.call_s.append(time.perf_counter() - sent)
            await trio.lowlevel.checkpoint()
            if deferred != len(group):
                raise RuntimeError(f"Procrastinate deferred {deferred} of {len(group)} jobs")
            for key, due, _ in group:  # (scheduled_at is the instant given, to the µs)
                self.delivery.schedule_answer({"timerKey": key, "deliverAt": wire_time(due)})
            i += len(group)

    async def analyze(self) -> None:
        await trio.to_thread.run_sync(graphile_sql, self.client.dsn, "ANALYZE")

    async def pending(self) -> set[str]:
        return await trio.to_thread.run_sync(self.client.pending_keys)


def job_frame(key: str, due: float, started: float) -> dict[str, Any]:
    """A started job in the shape of a popped timer frame (``Delivery`` reads it)."""
    return {"timer": {"key": key, "deliverAt": wire_time(due)}, "createdAt": wire_time(started)}


# -- scenario drivers (either side) -------------------------------------------------------


def lags(delivery: Delivery) -> list[float]:
    """Per scheduled timer: first handler start minus due (s), +inf if never handled."""
    out = []
    for key, (due, _) in delivery.expected.items():
        copies = delivery.frames.get(key)
        out.append(copies[0][0] - due if copies else math.inf)
    return out


def per_timer_ms(seconds: dict[str, float], n: int) -> dict[str, float]:
    """CPU milliseconds per timer by party, and the total of the service's parties (all but
    this bench client and the rest of the machine)."""
    if not n:
        return {}
    out = {k: round(v * 1000 / n, 4) for k, v in seconds.items()}
    out["total"] = round(sum(v for k, v in seconds.items() if k not in ("client", "other"))
                         * 1000 / n, 4)
    return out


def delivery_summary(delivery: Delivery, pending: set[str]) -> dict[str, Any]:
    report = delivery.report()
    not_started = len((pending & set(delivery.expected)) - set(delivery.frames))
    return {"scheduled": report["scheduled"], "handled": report["received_distinct"],
            "lost": max(0, report["lost"] - not_started), "not_started_in_time": not_started,
            "duplicates": report["duplicates"], "unexpected": report["unexpected"]}


async def finish(side: Side, delivery: Delivery, why: str | None, out: dict[str, Any]
                 ) -> dict[str, Any]:
    await trio.sleep(0.5)  # a duplicate start would show by now
    out["incomplete"] = why
    out["capped"] = side.capped
    out["delivery"] = delivery_summary(delivery, await side.pending())
    samples = lags(delivery)
    out["lag"] = {k: v for k, v in quantiles(samples).items() if k != "cdf_ms"}
    # Which timers were slowest (their keys carry their order): an outlier that is always
    # the first of a round is the round's start, not the service.
    out["slowest_ms"] = {key: round(lag * 1000, 2) for lag, key in sorted(
        zip(samples, delivery.expected, strict=True), reverse=True)[:3]}
    out["_lags"] = samples  # pooled over rounds for the table; not saved
    out["load_avg_end"] = load()
    return out


async def scenario_burst(side: Side, cpu: TreeCpu, sizes: Sizes) -> dict[str, Any]:
    n = sizes.burst_timers
    delivery = side.delivery
    out: dict[str, Any] = {"timers": n, "load_avg_start": load()}
    rate = await side.calibrate()
    out["calibration_per_s"] = round(rate)
    due = 0.0

    def make() -> list[Job]:
        nonlocal due
        due = time.time() + n / rate * MARGIN + LEAD_S
        return [(f"burst-{i:07d}", due, None) for i in range(n)]

    t0 = time.time()
    await side.schedule(make)
    delivery.scheduling_done = True
    out["scheduling_s"] = round(time.time() - t0, 2)
    await side.analyze()
    out["lead_s"] = round(due - time.time(), 2)
    await trio.sleep(max(0.0, due - time.time()))
    before, t1 = cpu.snapshot(), time.perf_counter()
    wait_s = sizes.wait_capped_s if side.capped else sizes.wait_burst_s
    why = await wait_delivered(delivery, time.monotonic() + wait_s,
                               stall_after=time.monotonic())
    seconds = TreeCpu.seconds(before, cpu.snapshot())
    out["cpu_cores"] = {k: round(v / (time.perf_counter() - t1), 2) for k, v in seconds.items()}
    starts = sorted(copies[0][0] for key, copies in delivery.frames.items()
                    if key in delivery.expected)
    dues = [d for d, _ in delivery.expected.values()]
    if len(starts) >= 2 and dues:
        first_due = min(dues)
        out["handled_per_s"] = round(len(starts) / (starts[-1] - first_due))
        out["first_to_last_per_s"] = round((len(starts) - 1) / (starts[-1] - starts[0]))
        out["first_start_after_due_s"] = round(starts[0] - first_due, 3)
        out["last_start_after_due_s"] = round(starts[-1] - first_due, 3)
        # When the last frame was fired (ours: its createdAt; graphile's has none, it reads
        # as the start): a drain ending right after its last fire is bound by the fire rate.
        fired = [created for key, copies in delivery.frames.items() if key in delivery.expected
                 for _, _, created in copies[:1]]
        try:
            out["last_fire_after_due_s"] = round(max(map(epoch, fired)) - first_due, 3)
        except ValueError:
            pass
    out["cpu_ms_per_timer"] = per_timer_ms(seconds, len(starts))
    return await finish(side, delivery, why, out)


async def scenario_steady(side: Side, cpu: TreeCpu, sizes: Sizes) -> dict[str, Any]:
    rate, seconds_due = sizes.steady_rate, sizes.steady_seconds
    n = rate * seconds_due
    delivery = side.delivery
    out: dict[str, Any] = {"rate": rate, "seconds": seconds_due, "timers": n,
                           "load_avg_start": load()}
    calibrated = await side.calibrate()
    out["calibration_per_s"] = round(calibrated)
    first = 0.0

    def make() -> list[Job]:
        nonlocal first
        first = time.time() + n / calibrated * MARGIN + LEAD_S
        return [(f"steady-{i:07d}", first + i / rate, None) for i in range(n)]

    t0 = time.time()
    await side.schedule(make)
    delivery.scheduling_done = True
    out["scheduling_s"] = round(time.time() - t0, 2)
    await side.analyze()
    out["lead_s"] = round(first - time.time(), 2)
    if out["lead_s"] < 0.3:
        out["note"] = "scheduling ended after the first due instant"
    await trio.sleep(max(0.0, first - time.time()))
    before, t1 = cpu.snapshot(), time.perf_counter()
    await trio.sleep(max(0.0, first + seconds_due - time.time()))
    deadline = time.monotonic() + (sizes.wait_capped_s if side.capped else sizes.wait_steady_s)
    why = await wait_delivered(delivery, deadline, stall_after=deadline)
    seconds = TreeCpu.seconds(before, cpu.snapshot())
    window = time.perf_counter() - t1
    out["window_s"] = round(window, 2)
    out["cpu_cores"] = {k: round(v / window, 3) for k, v in seconds.items()}
    out["cpu_ms_per_timer"] = per_timer_ms(seconds, delivery.got_expected)
    return await finish(side, delivery, why, out)


async def scenario_idle(side: Side, cpu: TreeCpu, sizes: Sizes) -> dict[str, Any]:
    n, spacing = sizes.idle_timers, sizes.idle_spacing_s
    delivery = side.delivery
    out: dict[str, Any] = {"timers": n, "spacing_s": spacing,
                           "delay_ms": list(sizes.idle_delay_ms), "load_avg_start": load()}

    def make() -> list[Job]:
        spaced = SpacedDelays(random.Random(IDLE_SEED), sizes.idle_delay_ms)
        start = time.time() + 0.5
        plan: list[Job] = []
        for i in range(n):
            at = start + i * spacing
            plan.append((f"idle-{i:05d}", at + spaced.draw(at) / 1000, at))
        return plan

    before, t1 = cpu.snapshot(), time.perf_counter()
    await side.schedule(make)
    delivery.scheduling_done = True
    last_due = max((d for d, _ in delivery.expected.values()), default=time.time())
    deadline = time.monotonic() + max(0.0, last_due - time.time()) + sizes.wait_idle_s
    why = await wait_delivered(delivery, deadline, stall_after=deadline)
    seconds = TreeCpu.seconds(before, cpu.snapshot())
    window = time.perf_counter() - t1
    out["cpu_cores"] = {k: round(v / window, 3) for k, v in seconds.items()}
    # one timer alone: the SDK's single schedule call, graphile's addJobs of one job
    out["schedule_call_ms"] = distribution(side.call_s)
    return await finish(side, delivery, why, out)


DRIVERS: dict[str, Callable[[Side, TreeCpu, Sizes], Awaitable[dict[str, Any]]]] = {
    "burst": scenario_burst, "steady": scenario_steady, "idle": scenario_idle}


# -- schedule throughput ------------------------------------------------------------------


async def ours_schedule(queen: queen_trio.Client, cpu: TreeCpu, n: int, failures: Failures
                        ) -> dict[str, Any]:
    await queen.configure(QUEUE)
    for b in range(2):  # untimed: connections warm
        await sdk_bundle(queen, QUEUE, [(f"warm-{b}-{i}", FAR_DELAY_MS) for i in range(BUNDLE)])
    latencies, scheduled = [], 0
    before, t0 = cpu.snapshot(), time.perf_counter()
    for b in range(0, n, BUNDLE):
        sent = time.perf_counter()
        answers = await sdk_bundle(queen, QUEUE, [(f"s-{i:07d}", FAR_DELAY_MS)
                                                  for i in range(b, min(n, b + BUNDLE))])
        latencies.append(time.perf_counter() - sent)
        scheduled += len(answers)
    elapsed = time.perf_counter() - t0
    seconds = TreeCpu.seconds(before, cpu.snapshot())
    if scheduled != n:
        failures.add("schedule", "not scheduled", f"{n - scheduled} of {n}")
    return {"timers": n, "scheduled": scheduled, "seconds": round(elapsed, 3),
            "timers_per_s": round(scheduled / elapsed), "bundle_ms": distribution(latencies),
            "cpu_ms_per_timer": per_timer_ms(seconds, n)}


async def graphile_schedule(dsn: str, cpu: TreeCpu, n: int, job_key: bool) -> dict[str, Any]:
    far = time.time() + FAR_DELAY_MS / 1000
    stats, seconds = await graphile_add(
        dsn, lambda: [(f"s-{i:07d}", far, None) for i in range(n)], warmup=2, job_key=job_key,
        cpu=cpu)
    elapsed = stats["elapsed_ms"] / 1000
    seconds["client"] = stats["cpu_ms"] / 1000  # the Node adder's own, over its timed part
    pending = await trio.to_thread.run_sync(
        graphile_sql, dsn, "SELECT count(*) FROM graphile_worker._private_jobs "
                           "WHERE task_id IS NOT NULL AND payload->>'k' LIKE 's-%'")
    return {"timers": n, "scheduled": pending, "seconds": round(elapsed, 3),
            "timers_per_s": round(n / elapsed),
            "bundle_ms": distribution([x / 1000 for x in stats["call_ms"]]),
            "cpu_ms_per_timer": per_timer_ms(seconds, n)}


async def procrastinate_schedule(client: peer_procrastinate.PeerClient, cpu: TreeCpu, n: int
                                 ) -> dict[str, Any]:
    far = time.time() + FAR_DELAY_MS / 1000
    for b in range(2):  # untimed: the pool's connections and the statement warm
        client.defer_at([(f"warm-{b}-{i}", far) for i in range(BUNDLE)])
    latencies = []
    before, t0 = cpu.snapshot(), time.perf_counter()
    for b in range(0, n, BUNDLE):
        sent = time.perf_counter()
        client.defer_at([(f"s-{i:07d}", far) for i in range(b, min(n, b + BUNDLE))])
        latencies.append(time.perf_counter() - sent)
    elapsed = time.perf_counter() - t0
    seconds = TreeCpu.seconds(before, cpu.snapshot())
    scheduled = await trio.to_thread.run_sync(
        graphile_sql, client.dsn, "SELECT count(*) FROM procrastinate_jobs "
                                  "WHERE status = 'todo' AND args->>'key' LIKE 's-%'")
    return {"timers": n, "scheduled": scheduled, "seconds": round(elapsed, 3),
            "timers_per_s": round(n / elapsed), "bundle_ms": distribution(latencies),
            "cpu_ms_per_timer": per_timer_ms(seconds, n)}


# -- one party, one scenario, on a fresh database -----------------------------------------


async def ours_unit(scenario: str, url: str, dsn: str, broker_pid: int, postmaster: int | None,
                    sizes: Sizes, failures: Failures) -> dict[str, Any]:
    trees = {"postgres": [postmaster] if postmaster else [], "broker": [broker_pid]}
    async with queen_trio.Client(url) as queen:
        if scenario == "schedule":
            return await ours_schedule(queen, TreeCpu(trees), sizes.schedule_timers, failures)
        await queen.configure(QUEUE)
        delivery = Delivery(scenario)
        consumer = SdkConsumer(url, QUEUE)
        consumer.on_start = lambda frame, started: delivery.receive([frame], started)
        async with trio.open_nursery() as nursery:
            await nursery.start(consumer.run)
            assert consumer.pid is not None
            cpu = TreeCpu({**trees, "consumer": [consumer.pid]})
            result = await DRIVERS[scenario](Ours(queen, dsn, delivery, failures), cpu, sizes)
            nursery.cancel_scope.cancel()
        code = consumer.process.returncode if consumer.process else None
        if code not in (0, None):
            failures.add(scenario, "consumer exit", f"exit {code}: {consumer.log_tail()}")
        return result


async def graphile_unit(scenario: str, party: str, dsn: str, postmaster: int | None,
                        sizes: Sizes) -> dict[str, Any]:
    trees = {"postgres": [postmaster] if postmaster else []}
    if scenario == "schedule":
        return await graphile_schedule(dsn, TreeCpu(trees), sizes.schedule_timers,
                                       party == "graphile-jobkey")
    return await beside_worker(
        scenario, GraphileWorker(dsn, party.removeprefix("graphile-")),
        lambda delivery: Graphile(dsn, delivery, capped=party == "graphile-default"), trees,
        sizes)


class JobWorker(Protocol):
    """A peer's worker process: ``on_job(key, due, started)`` for every job it starts."""

    on_job: Callable[[str, float, float], None]

    @property
    def pid(self) -> int | None: ...

    async def run(self, *, task_status: trio.TaskStatus[None] = ...) -> None: ...


async def beside_worker(scenario: str, worker: JobWorker, side: Callable[[Delivery], Side],
                        trees: dict[str, list[int]], sizes: Sizes) -> dict[str, Any]:
    """``scenario`` driven through ``side(delivery)`` while ``worker`` runs, its CPU counted
    as the party "worker"."""
    delivery = Delivery(scenario)
    worker.on_job = lambda key, due, started: delivery.receive(
        [job_frame(key, due, started)], started)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        assert worker.pid is not None
        cpu = TreeCpu({**trees, "worker": [worker.pid]})
        result = await DRIVERS[scenario](side(delivery), cpu, sizes)
        nursery.cancel_scope.cancel()
    return result


async def procrastinate_unit(scenario: str, party: str, dsn: str, postmaster: int | None,
                             sizes: Sizes) -> dict[str, Any]:
    trees = {"postgres": [postmaster] if postmaster else []}
    client = peer_procrastinate.PeerClient(dsn)
    try:
        client.apply_schema()  # (graphile-worker's worker and adder install theirs)
        if scenario == "schedule":
            return await procrastinate_schedule(client, TreeCpu(trees), sizes.schedule_timers)
        # Capped, both: one job per fetch, so a backlog drains at the rate its fetches take;
        # what is not started within Sizes.wait_capped_s counts as not started in time (a
        # measure of the peer, not a failure of the run).
        return await beside_worker(
            scenario, peer_procrastinate.PeerWorker(dsn, party.removeprefix("procrastinate-")),
            lambda delivery: Procrastinate(client, delivery, capped=True), trees, sizes)
    finally:
        client.close()


def timers_of(scenario: str, sizes: Sizes) -> int:
    """How many timers a unit of ``scenario`` measures."""
    return {"schedule": sizes.schedule_timers, "burst": sizes.burst_timers,
            "steady": sizes.steady_rate * sizes.steady_seconds,
            "idle": sizes.idle_timers}[scenario]


def run_unit(server: Server, scenario: str, party: str, sizes: Sizes,
             failures: Failures) -> dict[str, Any]:
    started = time.monotonic()
    result: dict[str, Any]
    with server.database("peers32") as db, collector_paused():
        settled = server.settle()
        try:
            if party == "ours":
                with brokers(db, 1) as handles:
                    handle = handles[0]
                    assert handle.pid is not None
                    result = trio.run(ours_unit, scenario, handle.url, db, handle.pid,
                                      server.postmaster_pid, sizes, failures)
                if handle.exit_code not in (0, None):
                    failures.add(scenario, "broker exit", f"exit {handle.exit_code}: "
                                                          f"{handle.log_errors[:5]}")
            elif party.startswith("procrastinate"):
                result = trio.run(procrastinate_unit, scenario, party, db,
                                  server.postmaster_pid, sizes)
            else:
                result = trio.run(graphile_unit, scenario, party, db, server.postmaster_pid,
                                  sizes)
        except Exception as exc:  # noqa: BLE001 - one unit's failure is reported, the run goes on
            failures.add(scenario, f"{party} failed", repr(exc)[:2000])
            result = {"error": repr(exc)[:500]}
    if result.get("incomplete") and not result.get("capped"):
        failures.add(scenario, f"{party} incomplete", str(result["incomplete"]))
    d = result.get("delivery") or {}
    if d.get("lost") or d.get("duplicates"):
        failures.add(scenario, f"{party} exactly-once",
                     f"lost {d.get('lost')} duplicated {d.get('duplicates')}")
    result.update(settled, elapsed_s=round(time.monotonic() - started, 1), ran_at=now_iso())
    return result


# -- the table ------------------------------------------------------------------------------


def median_range(values: list[float]) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    mid = median(values)
    fmt = (lambda v: f"{v:,.0f}") if mid >= 100 else (lambda v: f"{v:.3g}")
    return fmt(mid) if len(values) == 1 else f"{fmt(mid)} ({fmt(min(values))}–{fmt(max(values))})"


def pooled(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    samples = [x for r in rounds for x in r.get("_lags", [])]
    return {k: v for k, v in quantiles(samples).items() if k != "cdf_ms"}


def lag_cell(q: dict[str, Any]) -> str:
    if not q.get("n"):
        return "-"

    def ms(v: float | None) -> str:
        return "> wait" if v is None else f"{v:.1f}"

    return " / ".join(ms(q.get(k)) for k in ("p50", "p90", "p99", "max"))


def ratio(ours: float | None, theirs: float | None) -> str:
    if not ours or not theirs:
        return "-"
    return f"{ours / theirs:.2f}"


def cpu_of(*parties: str) -> Callable[[dict[str, Any]], Any]:
    """A round's CPU ms per timer summed over ``parties`` (keys of ``cpu_ms_per_timer``)."""

    def get(r: dict[str, Any]) -> Any:
        cost = r.get("cpu_ms_per_timer") or {}
        return round(sum(cost.get(p, 0.0) for p in parties), 4) if cost else None

    return get


LABELS = {"ours": "ours", "graphile-default": "graphile default",
          "graphile-tuned": "graphile tuned", "procrastinate-default": "procrastinate default",
          "procrastinate-tuned": "procrastinate tuned"}


def peers_in(results: dict[str, dict[str, list[dict[str, Any]]]]) -> list[str]:
    """The peers (keys of PEERS) some party or schedule row of ``results`` belongs to."""
    names = {p for by_party in results.values() for p in by_party}
    return [peer for peer in PEERS if any(n.startswith(peer) for n in names)]


def table(results: dict[str, dict[str, list[dict[str, Any]]]],
          lag_by: dict[str, dict[str, dict[str, Any]]]) -> list[str]:
    """Markdown rows: a row per measure, a column per party (ours, then each peer's present in
    ``results``), then ours over each peer's tuned party (for schedule: over its plain
    schedule row). Rates and costs: median of the rounds (min–max); lags:
    ``lag_by[scenario][party]``, quantiles of every round's samples together."""
    peers = peers_in(results)
    ran = {p for by_party in results.values() for p in by_party}
    # A column per party that ran, and the tuned one of a peer that only scheduled.
    parties = ["ours", *(p for p in PARTIES[1:] if p in ran or any(
        p == PEERS[peer][0] and not any(q.startswith(peer) for q in ran & set(PARTIES))
        for peer in peers))]
    lines = ["| measure | " + " | ".join(LABELS[p] for p in parties) + " | "
             + " | ".join(f"ours / {LABELS[PEERS[peer][0]]}" for peer in peers) + " |",
             "|---|" + "--:|" * (len(parties) + len(peers))]

    def vals(scenario: str, party: str, get: Callable[[dict[str, Any]], Any]) -> list[Any]:
        return [get(r) for r in results.get(scenario, {}).get(party, []) if "error" not in r]

    def med(scenario: str, party: str, get: Callable[[dict[str, Any]], Any]) -> float | None:
        got = [v for v in vals(scenario, party, get) if v is not None]
        return median(got) if got else None

    def rate(r: dict[str, Any]) -> Any:
        return r.get("timers_per_s")

    def row(label: str, cells: list[str], ratios: list[str]) -> str:
        return f"| {label} | {' | '.join(cells)} | {' | '.join(ratios)} |"

    if "schedule" in results:
        calls = {"graphile": "graphile: addJobs; with jobKey "
                             + median_range(vals("schedule", "graphile-jobkey", rate)),
                 "procrastinate": "procrastinate: batch_defer_jobs"}
        for label, get in (
                (f"schedule, bundles of 500: timers/s ({'; '.join(calls[p] for p in peers)})",
                 rate),
                ("schedule: CPU ms per timer, caller + broker + PostgreSQL",
                 cpu_of("client", "broker", "postgres"))):
            cells = []
            for party in parties:
                peer = next((peer for peer in peers if party.startswith(peer)), None)
                if peer is None:
                    cells.append(median_range(vals("schedule", party, get)))
                else:  # the peer's schedule row, once under its first party
                    first = party == next(p for p in parties if p.startswith(peer))
                    cells.append(median_range(vals("schedule", PEERS[peer][2], get)) if first
                                 else "(same)")
            lines.append(row(label, cells, [
                ratio(med("schedule", "ours", get), med("schedule", PEERS[peer][2], get))
                for peer in peers]))
    every = cpu_of("postgres", "broker", "consumer", "worker")
    rows: list[tuple[str, str, Callable[[dict[str, Any]], Any]]] = [
        ("burst", "burst: handled/s, due instant → last handler start",
         lambda r: r.get("handled_per_s")),
        ("burst", "burst: CPU ms per timer, every party", every),
        ("steady", "steady: CPU ms per timer, every party (PostgreSQL + broker + consumer / "
                   "worker)", every),
        ("steady", "steady: of which PostgreSQL", cpu_of("postgres")),
    ]
    for scenario, label, get in rows:
        if scenario not in results:
            continue
        lines.append(row(label, [median_range(vals(scenario, p, get)) for p in parties], [
            ratio(med(scenario, "ours", get), med(scenario, PEERS[peer][0], get))
            for peer in peers]))
    for scenario, label in (("steady", "steady: lag p50 / p90 / p99 / max ms"),
                            ("burst", "burst: lag p50 / p90 / p99 / max ms"),
                            ("idle", "idle: lag p50 / p90 / p99 / max ms")):
        if scenario not in results:
            continue
        q = {p: lag_by.get(scenario, {}).get(p, {}) for p in parties}
        lines.append(row(label, [lag_cell(q[p]) for p in parties], [
            f"p99 {ratio(q['ours'].get('p99'), q.get(PEERS[peer][0], {}).get('p99'))}"
            for peer in peers]))
    if "idle" in results:
        def call_p50(r: dict[str, Any]) -> Any:
            return (r.get("schedule_call_ms") or {}).get("p50")

        lines.append(row("idle: one schedule call, p50 ms (SDK single call / addJobs of one / "
                         "defer_job)", [median_range(vals("idle", p, call_p50)) for p in parties],
                         [ratio(med("idle", "ours", call_p50), med("idle", PEERS[peer][0],
                                                                    call_p50))
                          for peer in peers]))
    for scenario in ("burst", "steady", "idle"):
        if scenario not in results:
            continue

        def handled(p: str, s: str = scenario) -> str:
            rs = [r.get("delivery", {}) for r in results[s].get(p, [])]
            if not rs:
                return "-"
            late = sum(d.get("not_started_in_time", 0) for d in rs)
            return (f"{sum(d.get('handled', 0) for d in rs):,} of "
                    f"{sum(d.get('scheduled', 0) for d in rs):,}, lost "
                    f"{sum(d.get('lost', 0) for d in rs)}, dup "
                    f"{sum(d.get('duplicates', 0) for d in rs)}"
                    + (f", not started in time {late:,}" if late else ""))

        lines.append(row(f"{scenario}: handled (all rounds)", [handled(p) for p in parties],
                         [""] * len(peers)))
    return lines


def unit_line(scenario: str, party: str, r: dict[str, Any]) -> str:
    if "error" in r:
        return f"[peers32] {scenario:<8} {party:<16} ERROR {r['error'][:200]}"
    bits = []
    if "timers_per_s" in r:
        bits.append(f"{r['timers_per_s']:,} timers/s")
    if "handled_per_s" in r:
        bits.append(f"{r['handled_per_s']:,} handled/s")
    if "lag" in r:
        bits.append(f"lag p50/p90/p99/max {lag_cell(r['lag'])} ms")
    cost = r.get("cpu_ms_per_timer")
    if cost:
        bits.append("CPU ms/timer " + " ".join(f"{k} {v:.3f}" for k, v in cost.items()))
    d = r.get("delivery")
    if d:
        bits.append(f"handled {d['handled']}/{d['scheduled']} lost {d['lost']} "
                    f"dup {d['duplicates']} late {d['not_started_in_time']}")
    return (f"[peers32] {scenario:<8} {party:<16} " + "; ".join(bits)
            + f"; load {r.get('load_avg_end') or load()}; {r.get('elapsed_s')} s")


# -- main -----------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.peer_graphile",
                                     description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--scenario", nargs="+", action="extend", choices=SCENARIOS,
                        metavar="NAME", help=f"some of {', '.join(SCENARIOS)} (default: all)")
    parser.add_argument("--parties", nargs="+", choices=PARTIES, default=None,
                        help="for burst/steady/idle, and whose schedule rows run (default: "
                             "all)")
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="small sizes, one round")
    size.add_argument("--smoke", action="store_true", help="tiny sizes (the e2e test)")
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--schedule-timers", type=int)
    parser.add_argument("--burst", type=int, dest="burst_timers")
    parser.add_argument("--steady-rate", type=int)
    parser.add_argument("--steady-seconds", type=int)
    parser.add_argument("--idle", type=int, dest="idle_timers")
    parser.add_argument("--admin-url", default=os.environ.get("QUEEN_DATABASE_URL") or None,
                        help="a server where databases may be created (default: a temporary "
                             "embedded PostgreSQL)")
    parser.add_argument("--pg-bin", type=Path, default=None,
                        help="a temporary server of the PostgreSQL installed there (e.g. "
                             "/usr/lib/postgresql/15/bin; default: the embedded one)")
    parser.add_argument("--statements", type=int, metavar="TOP", default=None,
                        help="with --pg-bin and --parties ours: after each unit, PostgreSQL's "
                             "TOP statements by time per timer over its measured window "
                             "(pg_stat_statements, track = all), commits and CPU per server "
                             "process per timer (bench.harness.pg_statements)")
    parser.add_argument("--perf", type=Path, default=None,
                        help="with --statements: perf record the server's processes over the "
                             "measured window into this file")
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--out", default="peers32", help="result file name, without suffix")
    parser.add_argument("--table-only", action="store_true",
                        help="rewrite OUT.txt's table from OUT.json (no run)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.table_only:
        saved = json.loads((args.out_dir / f"{args.out}.json").read_text())
        rows = table(saved["scenarios"], saved["pooled_lag_ms"])
        write(args.out_dir, args.out, saved["machine"], saved["scenarios"],
              saved["pooled_lag_ms"], rows, saved["failures"])
        print("\n".join(rows))
        return 0
    sizes = SIZES["smoke" if args.smoke else "quick" if args.quick else "moderate"]
    overrides = {k: getattr(args, k) for k in ("rounds", "schedule_timers", "burst_timers",
                                               "steady_rate", "steady_seconds", "idle_timers")
                 if getattr(args, k) is not None}
    sizes = dataclasses.replace(sizes, **overrides)
    chosen = [s for s in SCENARIOS if s in (args.scenario or SCENARIOS)]
    parties = [p for p in PARTIES if p in (args.parties or PARTIES)]
    graphile_missing = missing()
    if graphile_missing and any(p.startswith("graphile") for p in parties):
        print(f"graphile-worker peer unavailable: {graphile_missing}", file=sys.stderr)
        return 2
    procrastinate_missing = peer_procrastinate.missing()
    if procrastinate_missing and any(p.startswith("procrastinate") for p in parties):
        print(f"Procrastinate's parties left out: {procrastinate_missing}", file=sys.stderr)
        parties = [p for p in parties if not p.startswith("procrastinate")]
    # A peer's schedule rows run when one of its parties does.
    scheduling = [p for p in SCHEDULE_PARTIES if p == "ours" or any(
        p.startswith(peer) and any(q.startswith(peer) for q in parties) for peer in PEERS)]
    command = " ".join(["python -m bench.peer_graphile", *(sys.argv[1:] if argv is None
                                                           else argv)])
    failures = Failures()
    started = time.monotonic()
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    if args.statements is not None and (args.pg_bin is None or parties != ["ours"]):
        print("--statements takes --pg-bin and --parties ours", file=sys.stderr)
        return 2
    with shared_server(args.admin_url, args.pg_bin,
                       () if args.statements is None else pg_statements.SETTINGS) as server:
        watch = None
        if args.statements is not None:
            watch = pg_statements.StatementWatch(server.admin_url, server.postmaster_pid,
                                                 args.perf)
            TreeCpu.observers.append(watch.observe)
        info: dict[str, Any] = {"command": command, "checkout": source_revision(),
                "started_at": now_iso(), "cpu_count": os.cpu_count(),
                "python": sys.version.split()[0], "postgresql": server.settings(),
                "postgresql_server": server.description,
                "graphile_worker": graphile_missing or graphile_version(),
                "node": _node_version(),
                "graphile_profiles": {} if graphile_missing else graphile_profiles(),
                "procrastinate": procrastinate_missing or peer_procrastinate.version(),
                "procrastinate_profiles": {p: peer_procrastinate.PROFILES[p]
                                           for p in ("default", "tuned")},
                "uptime_at_start": _uptime(), "sizes": dataclasses.asdict(sizes)}
        print("queen-trio beside graphile-worker and Procrastinate, one PostgreSQL server")
        for key, value in info.items():
            print(f"  {key:<18} {value}", flush=True)
        for scenario in chosen:
            who = scheduling if scenario == "schedule" else parties
            for r in range(sizes.rounds):
                order = who if r % 2 == 0 else list(reversed(who))
                for party in order:
                    print(f"[peers32] {scenario} {party} round {r + 1}: running ...",
                          file=sys.stderr, flush=True)
                    result = run_unit(server, scenario, party, sizes, failures)
                    result["round"] = r + 1
                    results.setdefault(scenario, {}).setdefault(party, []).append(result)
                    print(unit_line(scenario, party, result), flush=True)
                    if watch is not None:
                        print("\n".join(watch.report(timers_of(scenario, sizes),
                                                      args.statements)), flush=True)
    info.update(uptime_at_end=_uptime(), elapsed_s=round(time.monotonic() - started, 1))
    lag_by = {s: {p: pooled(rounds) for p, rounds in by_party.items()}
              for s, by_party in results.items() if s != "schedule"}
    rows = table(results, lag_by)
    write(args.out_dir, args.out, info, results, lag_by, rows, failures)
    print("\n".join(rows))
    failures.print_details(examples=10, width=400)
    print(f"uptime at the end: {info['uptime_at_end']}; elapsed {info['elapsed_s']:.0f} s")
    return 0 if failures.total() == 0 else 1


def write(out_dir: Path, name: str, info: dict[str, Any],
          results: dict[str, dict[str, list[dict[str, Any]]]],
          lag_by: dict[str, dict[str, dict[str, Any]]], rows: list[str],
          failures: Failures | dict[str, Any]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    saved = {s: {p: [{k: v for k, v in r.items() if not k.startswith("_")} for r in rounds]
                 for p, rounds in by_party.items()} for s, by_party in results.items()}
    failed: dict[str, Any] = failures if isinstance(failures, dict) else {
        "total": failures.total(), "counts": failures.counts, "examples": failures.examples}
    summary = {"machine": info, "table": rows, "pooled_lag_ms": lag_by, "scenarios": saved,
               "failures": failed}
    (out_dir / f"{name}.json").write_text(json.dumps(summary, indent=1, default=json_default)
                                          + "\n")
    text = [f"# {info['command']}", f"# checkout {info['checkout']}, {info['postgresql']}, "
            f"graphile-worker {info['graphile_worker']} on Node {info['node']}, "
            f"Procrastinate {info.get('procrastinate', '-')}",
            f"# started {info['started_at']}, {info['elapsed_s']} s; uptime at start: "
            f"{info['uptime_at_start']}", f"# uptime at end: {info['uptime_at_end']}",
            f"# sizes {info['sizes']}",
            f"# graphile profiles {json.dumps(info['graphile_profiles'])}",
            f"# procrastinate profiles {json.dumps(info.get('procrastinate_profiles'))}", "",
            *rows, "",
            "Per unit (a fresh database and fresh processes each; rounds A/B interleaved):"]
    for scenario, by_party in results.items():
        for party, rounds in by_party.items():
            text += [unit_line(scenario, party, r) + f" (round {r['round']})" for r in rounds]
    text += ["", f"failures: {failed['total']}",
             *(f"  {n} x {k}" for k, n in failed["counts"].items())]
    (out_dir / f"{name}.txt").write_text("\n".join(text) + "\n")


def _uptime() -> str:
    try:
        import subprocess

        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return f"load average {load()}"


def _node_version() -> str:
    import subprocess

    if node() is None:
        return "-"
    return subprocess.run([node() or "node", "--version"], capture_output=True,
                          text=True).stdout.strip()


if __name__ == "__main__":
    sys.exit(main())

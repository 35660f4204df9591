"""Procrastinate, a PostgreSQL job queue for Python: the peer of ``bench.fire_lag`` and one
of ``bench.peer_graphile``'s.

A timer there is a job deferred with ``schedule_in``; its lag is the job's start time (the
worker's ``context.start_timestamp``) minus its ``scheduled_at``. The worker runs in its own
process (``python -m bench.harness.peer_procrastinate --dsn URL --profile NAME``), like our
broker, and reports every job it starts on stdout as ``key<TAB>scheduled_at<TAB>started``
(epoch seconds), so the suite sees arrivals live and can check exactly-once by key.

Profiles (see PROFILES): ``default`` is Procrastinate as installed (one job at a time, a poll
every 5 s, LISTEN/NOTIFY on — which wakes the worker only when a job is *inserted*, so a job
scheduled for later waits for the next poll); ``best`` is tuned for latency (LISTEN/NOTIFY on,
the poll interval at 1 ms, 16 concurrent jobs and a pool large enough for them). ``bench.fire_lag``
runs those two (LAG_PROFILES). ``tuned`` is graphile-worker's tuned profile spelled for
Procrastinate (16 concurrent jobs, a poll every 10 ms, a pool of 18): ``bench.peer_graphile``'s
throughput-per-core runs (issue 32) put it beside graphile-worker tuned.

Procrastinate is a dev extra (``pip install -e '.[dev]'``); ``missing()`` says why
the peer cannot run, and nothing here imports it at module import time.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import logging
import sys
from collections.abc import Callable, Iterable
from typing import Any

import trio

from bench.harness.lines import LineProcess

QUEUE = "fire"
SIDE_QUEUE = "calibration"  # no worker listens here: far-future jobs for rate calibration
TASK = "bench.fire"

PROFILES: dict[str, dict[str, Any]] = {
    # Procrastinate's own defaults (Worker: concurrency 1, fetch_job_polling_interval 5 s,
    # listen_notify True; the connector's pool as psycopg_pool creates it).
    "default": {"worker": {}, "pool": {}},
    # Lowest latency it offers: the poll is the only wake-up for a scheduled job, so poll as
    # often as a loop can; NOTIFY still wakes it for jobs due at insert; enough concurrent jobs
    # that finishing one (a commit) never holds up fetching the next.
    "best": {"worker": {"concurrency": 16, "fetch_job_polling_interval": 0.001,
                        "listen_notify": True},
             "pool": {"min_size": 18, "max_size": 18}},
    # As graphile-worker tuned in bench.peer_graphile (concurrency 16, pollInterval 10 ms, a
    # pool of 18): the same CPU-for-latency trade, for the CPU-per-timer comparison.
    "tuned": {"worker": {"concurrency": 16, "fetch_job_polling_interval": 0.01,
                         "listen_notify": True},
              "pool": {"min_size": 18, "max_size": 18}},
}
LAG_PROFILES = ("default", "best")  # what bench.fire_lag runs


def missing() -> str | None:
    """Why the peer cannot run here, or None."""
    try:
        import procrastinate  # noqa: F401
    except ImportError as exc:
        return f"procrastinate is not installed ({exc}); pip install -e '.[dev]'"
    return None


def version() -> str:
    from importlib.metadata import version as dist_version

    return dist_version("procrastinate")


def iso(epoch: float) -> str:
    """The same text for the same microsecond on both sides of the pipe."""
    return datetime.datetime.fromtimestamp(round(epoch, 6), datetime.UTC).isoformat()


def _make_app(connector: Any) -> Any:
    import procrastinate

    app = procrastinate.App(connector=connector)

    @app.task(name=TASK, queue=QUEUE, pass_context=True)
    async def fire(context: Any, key: str) -> None:
        scheduled = context.job.scheduled_at.timestamp()
        sys.stdout.write(f"{key}\t{scheduled:.6f}\t{context.start_timestamp:.6f}\n")
        sys.stdout.flush()  # the suite watches arrivals live

    return app


# -- the worker process -------------------------------------------------------------------


def worker_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.harness.peer_procrastinate")
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--profile", choices=sorted(PROFILES), default="default")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)  # its per-job INFO lines would cost CPU
    profile = PROFILES[args.profile]

    async def run() -> None:
        import procrastinate

        app = _make_app(procrastinate.PsycopgConnector(conninfo=args.dsn, **profile["pool"]))
        async with app.open_async():
            sys.stdout.write("READY\n")
            sys.stdout.flush()
            await app.run_worker_async(queues=[QUEUE], install_signal_handlers=True,
                                       **profile["worker"])

    asyncio.run(run())
    return 0


# -- the suite's side (trio) --------------------------------------------------------------


class PeerClient:
    """Defers jobs through Procrastinate's synchronous connector (in a worker thread) and
    counts what is left in its table."""

    def __init__(self, dsn: str) -> None:
        import procrastinate

        self.dsn = dsn
        self.app = _make_app(procrastinate.SyncPsycopgConnector(conninfo=dsn))
        self.app.open()
        self.task = self.app.tasks[TASK]

    def close(self) -> None:
        self.app.close()

    def apply_schema(self) -> None:
        self.app.schema_manager.apply_schema()

    def _defer(self, entries: list[tuple[str, int]], queue: str) -> list[tuple[str, float]]:
        jobs = [self.task.configure(schedule_in={"milliseconds": delay_ms}, queue=queue)
                .make_new_job(key=key) for key, delay_ms in entries]
        self.app.job_manager.batch_defer_jobs(jobs)
        return [(key, job.scheduled_at.timestamp()) for (key, _), job in zip(entries, jobs,
                                                                             strict=True)]

    def defer_at(self, entries: list[tuple[str, float]], queue: str = QUEUE) -> int:
        """(key, due epoch s) each, at its instant, in one statement (``batch_defer_jobs``;
        one job: ``defer_job``, what a caller deferring one job runs), from this thread: the
        jobs deferred."""
        jobs = [self.task.configure(schedule_at=datetime.datetime.fromtimestamp(due, datetime.UTC),
                                    queue=queue).make_new_job(key=key) for key, due in entries]
        if len(jobs) == 1:
            return int(self.app.job_manager.defer_job(jobs[0]).id is not None)
        return sum(job.id is not None for job in self.app.job_manager.batch_defer_jobs(jobs))

    def pending_keys(self, queue: str = QUEUE) -> set[str]:
        """Keys of the jobs of ``queue`` not finished (waiting, or in flight)."""
        import psycopg

        with psycopg.connect(self.dsn) as conn:
            rows = conn.execute("SELECT args->>'key' FROM procrastinate_jobs WHERE queue_name = "
                                "%s AND status IN ('todo', 'doing')", (queue,))
            return {str(k) for (k,) in rows}

    async def defer(self, entries: list[tuple[str, int]], queue: str = QUEUE
                    ) -> list[tuple[str, float]]:
        """(key, delayMs) -> (key, scheduled_at epoch), in one statement."""
        return await trio.to_thread.run_sync(self._defer, entries, queue)

    def _drop_side(self) -> None:
        import psycopg

        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute("DELETE FROM procrastinate_jobs WHERE queue_name = %s", (SIDE_QUEUE,))
            conn.execute("VACUUM procrastinate_jobs")

    async def drop_side(self) -> None:
        """Remove the calibration jobs: its fetch walks todo jobs in id order, so thousands of
        far-future jobs ahead of the due ones would slow every fetch (not its normal state)."""
        await trio.to_thread.run_sync(self._drop_side)

    async def pending(self, queue: str = QUEUE) -> int:
        """How many jobs of ``queue`` are not finished (:meth:`pending_keys`)."""
        return len(await trio.to_thread.run_sync(self.pending_keys, queue))


class PeerWorker(LineProcess):
    """The worker subprocess; ``on_job(key, scheduled_at, started)`` for every job it starts
    (stopped with SIGTERM first: graceful, it unregisters the worker)."""

    def __init__(self, dsn: str, profile: str) -> None:
        super().__init__("bench.harness.peer_procrastinate", ["--dsn", dsn, "--profile", profile],
                         what="peer worker", log_prefix=f"queen-bench-peer-{profile}-")
        self.dsn = dsn
        self.profile = profile
        self.on_job: Callable[[str, float, float], None] = lambda *_: None

    def on_line(self, line: str) -> None:
        parts = line.split("\t")
        if len(parts) == 3:
            self.on_job(parts[0], float(parts[1]), float(parts[2]))


def job_messages(records: Iterable[tuple[str, float, float]]) -> list[dict[str, Any]]:
    """A started job in the shape of a popped timer frame, so ``bench.harness.timers.Delivery`` can
    check it (createdAt = the job's start, deliverAt = its scheduled_at)."""
    return [{"timer": {"key": key, "deliverAt": iso(scheduled)}, "createdAt": iso(started)}
            for key, scheduled, started in records]


if __name__ == "__main__":
    sys.exit(worker_main())

"""The broker process: one nursery that owns every long-lived task.

``run_broker`` is the whole picture:

1. migrate the database (advisory-locked, so brokers starting together don't race);
2. open the connection pool;
3. in one nursery: the background services, one list started in order (the LISTEN
   connection among the first; queen_trio/services.py), then the HTTP server (hypercorn
   serving the QuartTrio app);
4. on ``BrokerHandle.shutdown()`` (SIGINT/SIGTERM/SIGHUP from the CLI): answer parked long-polls
   (204, nothing leased), stop accepting connections, let in-flight requests finish for up to
   ``QUEEN_GRACEFUL_TIMEOUT_MS``, then cancel the background services and close the pool.

A service that crashes takes the whole nursery down with it: the broker exits with an error
rather than serving HTTP with a dead service behind it. So no service lets one bad row or tenant
crash it: what is not transient database trouble is logged at ERROR with its traceback, counted
in ``queen_background_errors_total{service}``, and the service goes on after a back-off
(queen_trio/db/transient.py).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import resource
import sys
import time
from collections.abc import Awaitable, Callable
from typing import cast

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve

from . import gc_pauses
from .api import connections, create_app
from .api import protocol as http_protocol
from .api.fast import FastRoutes
from .config import Settings
from .context import BrokerContext
from .db import Database, Listener, queries
from .db.analyze import analyzer
from .db.migrations import apply_migrations
from .db.notifier import Notifier
from .errors import ListenError
from .gc_pauses import GcPauses
from .kv.purger import purger
from .log import store as log_store
from .log.housekeeping import Housekeeper
from .log.segments import SegmentCache
from .log.wakeups import QueueWakeups
from .metrics import BrokerMetrics
from .sealing import payload_cipher
from .services import Service
from .switches import CHANNEL as SWITCHES_CHANNEL
from .switches import RuntimeSwitches
from .tenants import store as tenant_store
from .tenants.directory import TenantDirectory
from .timers import store as timer_store
from .timers import warmup as timer_warmup
from .timers.batcher import ScheduleBatcher
from .timers.pending import pending_gauge
from .timers.sweeper import Sweeper

log = logging.getLogger(__name__)
_HTTP_LOG = logging.getLogger("queen_trio.http")
_HTTP_LOG.addFilter(lambda record: not str(record.msg).startswith("Running on"))

# A query run in a worker thread (Connection.run_raw_in_thread: the sweeper's drain, sealing
# segments) needs the GIL back to hand its answer over. With CPython's default switch interval
# (5 ms) a busy event loop makes it wait up to that long: a fire's commit instant late by
# milliseconds. Half a millisecond costs a
# little more switching and keeps those waits short.
GIL_SWITCH_INTERVAL_S = 0.0005

# Every NOTIFY channel the broker uses; the listener subscribes to all of them at connect.
NOTIFY_CHANNELS = (log_store.NOTIFY_CHANNEL, tenant_store.PLANS_CHANNEL, timer_store.NOTIFY_CHANNEL,
                   SWITCHES_CHANNEL)
TENANTS = queries.load("tenants")
# The services /health reports (with "http"): their loss is what an operator must see.
ON_HEALTH = ("listener", "sweeper", "housekeeping")


@dataclasses.dataclass(frozen=True)
class BrokerHandle:
    """What ``nursery.start(run_broker, …)`` hands back once the broker is serving."""

    urls: list[str]
    context: BrokerContext
    _shutdown: trio.Event

    @property
    def url(self) -> str:
        return self.urls[0]

    def shutdown(self) -> None:
        """Begin a graceful shutdown; ``run_broker`` returns when it is complete."""
        self._shutdown.set()


async def run_broker(
    settings: Settings, *, task_status: trio.TaskStatus[BrokerHandle] = trio.TASK_STATUS_IGNORED
) -> None:
    if settings.database_url is None:
        raise ValueError("run_broker needs settings.database_url (the CLI starts the embedded one)")
    url = settings.database_conninfo()  # a writable server, and a connect timeout per host
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    await trio.to_thread.run_sync(apply_migrations, url)

    metrics = BrokerMetrics()

    def read_only(event: str) -> None:
        metrics.db_read_only.labels(event).inc()

    shutdown = trio.Event()
    # The sweeper has its own connections: API load never queues a fire behind it, and a
    # broker frozen mid-fire (SIGSTOP, a stalled VM) has its transaction ended by the server
    # within one lease, so another broker can take the rows over.
    lease = str(settings.sweeper_lease_ms)
    # Each new connection runs the fire and pop paths once, rolled back, before its first use:
    # PostgreSQL builds a backend's plans the first time it runs them, and otherwise a fresh
    # broker's first fires (and each connection replaced for its age) paid for that.
    new_pool = functools.partial(
        Database, acquire_timeout_s=settings.db_pool_wait_ms / 1000,
        max_lifetime_s=settings.db_max_lifetime_s, max_idle_s=settings.db_max_idle_s,
        on_read_only=read_only, on_connect=timer_warmup.warm)
    sweeper_db = new_pool(url, max_size=2, application_name="queen-trio-sweeper",
                          session_settings={"idle_in_transaction_session_timeout": lease,
                                            "statement_timeout": lease})
    async with sweeper_db, new_pool(url, max_size=settings.db_pool_size) as db:
        async with db.connection() as conn:
            default_tenant = await conn.fetchval(TENANTS.tenant_id_by_name, {"name": "default"})
            log.info("database %s", conn.where)
        count_error = metrics.count_background_error  # queen_background_errors_total
        listener = Listener(url, NOTIFY_CHANNELS, on_read_only=read_only,
                            count_error=count_error)
        wakeups = QueueWakeups(max_parked=_parked_bound(settings),
                               max_per_tenant=settings.longpoll_max_parked_per_tenant,
                               recheck_concurrency=max(2, settings.db_pool_size // 4),
                               listener=listener)
        tenants = TenantDirectory(db, default_tenant, listener,
                                  max_message_bytes=settings.max_message_bytes,
                                  count_error=count_error,
                                  auth_failures_per_s=settings.auth_failures_per_s)
        segment_cache = SegmentCache(settings.segment_cache_bytes)
        cipher = payload_cipher(settings)
        schedules = ScheduleBatcher(
            db, notify_within_ms=settings.sweeper_max_sleep_ms, cipher=cipher,
            wake=lambda due_us: listener.deliver_here(timer_store.NOTIFY_CHANNEL, str(due_us)))
        switches = RuntimeSwitches(
            db, listener, count_error=count_error,
            on_change=lambda name, on: metrics.switch_enabled.labels(name).set(int(on)))
        notifier = Notifier(db, count_error=count_error)
        context = BrokerContext(settings, db, listener, metrics, tenants, wakeups, schedules,
                                switches, segment_cache=segment_cache, cipher=cipher,
                                notifier=notifier)
        metrics.watch(pool=db.statistics, listener=listener.statistics)
        metrics.watch_segment_cache(segment_cache.statistics)
        sweeper = Sweeper(sweeper_db, listener, settings, metrics,
                          lambda tid: settings.timer_payload_ceiling(tenants.message_ceiling(tid)),
                          announce_fire=lambda timer, due_local: wakeups.announce_fire(
                              log_store.wake_key(timer.tenant_id, timer.queue),
                              timer.partition,
                              timer.due, due_local),
                          look_up_db=db, switches=switches,
                          plan_fire=lambda timer, sent_at: wakeups.plan_fire(
                              None if timer is None
                              else log_store.wake_key(timer.tenant_id, timer.queue), sent_at))
        # Every long-lived service, started in this order (each ready before the next starts;
        # queen_trio/services.py says what a service is).
        services: tuple[Service, ...] = (
            GcPauses(metrics),  # collector pauses on /metrics
            listener,  # the LISTEN connection every NOTIFY below arrives on
            wakeups,  # long-poll pops wake on NOTIFY
            tenants,  # plans, usage, token cache
            switches,  # the operator's runtime switches
            purger(db, count_error=count_error),  # expired KV keys
            # Plans made while a table was small are dropped once it has grown.
            analyzer(db, count_error=count_error),
            schedules,  # schedules of the timer routes, batched
            notifier,  # pushes' wake-ups, after their commits
            sweeper,  # claims due timers and fires them
            pending_gauge(db, metrics),  # queen_timers_pending
            # Seals the head into zstd segments and applies retention.
            Housekeeper.from_settings(db, settings, metrics),
        )
        async with trio.open_nursery() as nursery:
            for service in services:
                await nursery.start(service.run)
                if service.name in ON_HEALTH:
                    context.services[service.name] = _alive(service)

            http_done = trio.Event()
            async def shutdown_trigger() -> None:
                await shutdown.wait()
                # Parked long-polls answer 204 now rather than be cut off by the drain.
                wakeups.stop()

            urls = await nursery.start(_serve_http, FastRoutes(create_app(context), context),
                                       settings, shutdown_trigger, http_done)
            context.services["http"] = lambda: not http_done.is_set()
            log.info("queen-trio listening on %s", ", ".join(urls))
            task_status.started(BrokerHandle(urls, context, shutdown))

            await http_done.wait()  # the API has drained: now stop the background services
            nursery.cancel_scope.cancel()
    log.info("queen-trio stopped")


def _alive(service: Service) -> Callable[[], bool]:
    return lambda: service.alive


def _parked_bound(settings: Settings) -> int:
    """QUEEN_LONGPOLL_MAX_PARKED, but at most half the process's open-file limit: each
    waiting pop holds a connection, and the other half is left to other clients and the
    database."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or settings.longpoll_max_parked <= soft // 2:
        return settings.longpoll_max_parked
    log.info("at most %d pops wait at once (QUEEN_LONGPOLL_MAX_PARKED=%d): the open-file "
             "limit is %d (LimitNOFILE, ulimit -n)", soft // 2, settings.longpoll_max_parked,
             soft)
    return soft // 2


async def _serve_http(
    app: FastRoutes,
    settings: Settings,
    shutdown_trigger: Callable[[], Awaitable[None]],
    done: trio.Event,
    *,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    http_protocol.install()  # a request h11 refuses gets a JSON error, not an empty 400
    connections.install()  # idle, Connection: close and HTTP/1.0 end every connection
    config = _Config()
    # A worker of ``serve`` with QUEEN_WORKERS > 1 accepts on the socket its parent bound.
    if settings.listen_fd is not None:
        config.bind = [f"fd://{settings.listen_fd}"]
    else:
        config.bind = [f"{settings.host}:{settings.port}"]
    config.graceful_timeout = settings.graceful_timeout_ms / 1000
    config.accesslog = None
    # hypercorn's own errors and warnings, under the broker's name; its "Running on" INFO line
    # repeats the broker's "listening on" one, from a logger named "error".
    config.errorlog = _HTTP_LOG
    # Also the deadline for each request head of a connection (slow-loris clients are cut off).
    config.keep_alive_timeout = settings.http_idle_timeout_s
    status = _NotingStarted(task_status)
    try:
        await serve(app, config, shutdown_trigger=shutdown_trigger,
                    task_status=cast(trio.TaskStatus[list[str]], status))
    except (OSError, BaseExceptionGroup) as exc:
        # Before ``started`` an OSError is the bind failing (a second broker on the port, no
        # permission); hypercorn raises it wrapped in its nurseries' exception groups.
        bind_error = _only_os_error(exc)
        if status.started_ or bind_error is None:
            raise
        raise ListenError(f"cannot listen on {config.bind[0]}: "
                          f"{bind_error.strerror or bind_error}") from None
    finally:
        done.set()


class _Config(HypercornConfig):
    """hypercorn's configuration, with the headers every answer carries (``date``,
    ``server``) built once a second rather than formatted for each answer."""

    _cached: tuple[int, str, list[tuple[bytes, bytes]]] = (-1, "", [])

    def response_headers(self, protocol: str) -> list[tuple[bytes, bytes]]:
        second, cached_protocol, headers = self._cached
        now = int(time.time())
        if now != second or protocol != cached_protocol:
            headers = super().response_headers(protocol)
            self._cached = (now, protocol, headers)
        return list(headers)  # the caller may extend its copy


class _NotingStarted:
    """A task status that remembers whether ``started`` was called."""

    def __init__(self, inner: trio.TaskStatus[list[str]]) -> None:
        self.inner, self.started_ = inner, False

    def started(self, value: list[str]) -> None:
        self.started_ = True
        self.inner.started(value)


def _only_os_error(error: BaseException) -> OSError | None:
    """The OSError ``error`` is, or the only one a chain of one-member groups holds."""
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return error if isinstance(error, OSError) else None


async def serve_until_signalled(
    settings: Settings, stop_requested_before: Callable[[], bool] = lambda: False
) -> None:
    """Run a broker until SIGINT, SIGTERM or SIGHUP, then shut it down gracefully.

    ``stop_requested_before`` reports a signal that arrived before trio was listening for them.
    """
    import signal

    # SIGHUP: the terminal that started us closed; stop as cleanly as for SIGTERM.
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
        async with trio.open_nursery() as nursery:
            broker: BrokerHandle = await nursery.start(run_broker, settings)
            gc_pauses.freeze_startup_objects()
            if stop_requested_before():
                broker.shutdown()
                return
            async for signum in signals:
                log.info("received %s; shutting down", signal.Signals(signum).name)
                broker.shutdown()
                break

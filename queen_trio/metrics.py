"""Prometheus metrics of one broker, and each tenant's own figures.

Each broker owns its own ``CollectorRegistry`` (several brokers can live in one test process
without clashing). Pool and listener figures are read from their ``statistics()`` at scrape
time rather than mirrored into gauges on every change.

``/metrics`` counts every tenant's traffic together, so with QUEEN_AUTH=on only the operator
reads it. What a tenant may see of its own (pushes, pops, acks, its timers' fire lag: what the
dashboard draws) is counted beside, per tenant (:class:`TenantTally`), and answered by
``GET /api/v1/stats``. The counting methods below do both at once.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from .db.listener import ListenerStatistics
from .db.pool import PoolStatistics
from .log.segments import CacheStatistics

CONTENT_TYPE = CONTENT_TYPE_LATEST

# Every counter and histogram would also export a `_created` timestamp series, doubling what a
# scraper stores for a value nobody graphs (process-wide: this process is the broker).
disable_created_metrics()

# Milliseconds matter for a broker sold on latency: fine buckets below 100 ms.
LATENCY_BUCKETS = (
    0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075,
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)


# Fire lag: 1 ms steps through the first 30 ms (where MIN_SLEEP lives), then up to 10 minutes.
FIRE_LAG_BUCKETS = (
    # Below 1 ms too: a healthy fire lands 0.6-0.7 ms after deliver_at (p50), which a first
    # bucket of 1 ms could not show.
    0.0001, 0.0002, 0.0003, 0.0004, 0.0005, 0.0006, 0.0007, 0.0008, 0.0009,
    *(i / 1000 for i in range(1, 31)),
    0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0,
    60.0, 120.0, 300.0, 600.0,
)

# Collector pauses: a young collection takes well under a millisecond, a full one with
# thousands of parked polls half a second or more (RELIABILITY.md, section 7).
GC_PAUSE_BUCKETS = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                    1.0, 2.5)

# The services counted in queen_background_errors_total{service} (each shown from the start).
BACKGROUND_SERVICES = ("sweeper", "housekeeping", "kv_purger", "analyzer", "tenants",
                       "pending_gauge", "listener", "switches")


@dataclasses.dataclass(slots=True)
class TenantTally:
    """One tenant's counts on this broker since it started."""

    pushed: int = 0
    popped: int = 0
    acked: int = 0
    fires: int = 0
    # Fires per FIRE_LAG_BUCKETS bucket (the last one: above them all), not cumulative.
    fire_lag: list[int] = dataclasses.field(
        default_factory=lambda: [0] * (len(FIRE_LAG_BUCKETS) + 1))

    def fire_lag_cumulative(self) -> dict[str, int]:
        """As Prometheus writes a histogram: fires at or below each bound, "+Inf" last."""
        out, total = {}, 0
        for bound, n in zip((*map(repr, FIRE_LAG_BUCKETS), "+Inf"), self.fire_lag, strict=True):
            total += n
            out[bound] = total
        return out


class _StatisticsCollector(Collector):
    def __init__(
        self,
        pool: Callable[[], PoolStatistics] | None,
        listener: Callable[[], ListenerStatistics] | None,
    ) -> None:
        self._pool = pool
        self._listener = listener

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        if self._pool is not None:
            s = self._pool()
            conns = GaugeMetricFamily(
                "queen_db_pool_connections", "Open pool connections by state", labels=["state"]
            )
            conns.add_metric(["idle"], s.idle)
            conns.add_metric(["in_use"], s.in_use)
            yield conns
            yield GaugeMetricFamily("queen_db_pool_max", "Pool size limit", value=s.max_size)
            yield GaugeMetricFamily(
                "queen_db_pool_waiting", "Tasks waiting for a pool connection", value=s.waiting
            )
            yield CounterMetricFamily(
                "queen_db_pool_connects", "Connections opened by the pool", value=s.connects_total
            )
            yield CounterMetricFamily(
                "queen_db_pool_discarded",
                "Connections discarded (broken, cancelled mid-call, or left in a transaction)",
                value=s.discarded_total,
            )
            yield CounterMetricFamily(
                "queen_db_pool_exhausted",
                "Tasks refused a connection after the bounded wait (QUEEN_DB_POOL_WAIT_MS)",
                value=s.exhausted_total,
            )
            closed = CounterMetricFamily(
                "queen_db_pool_closed", "Connections closed by the pool's limits",
                labels=["reason"])
            closed.add_metric(["lifetime"], s.closed_lifetime_total)
            closed.add_metric(["idle"], s.closed_idle_total)
            yield closed
        if self._listener is not None:
            ls = self._listener()
            yield GaugeMetricFamily(
                "queen_listener_connected", "1 while the LISTEN connection is up",
                value=int(ls.connected),
            )
            yield CounterMetricFamily(
                "queen_listener_reconnects", "LISTEN reconnections", value=ls.reconnects_total
            )
            yield CounterMetricFamily(
                "queen_listener_notifications", "NOTIFY messages received",
                value=ls.notifications_total,
            )


class _SegmentCacheCollector(Collector):
    def __init__(self, statistics: Callable[[], CacheStatistics]) -> None:
        self._statistics = statistics

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        s = self._statistics()
        yield GaugeMetricFamily("queen_segment_cache_bytes",
                                "Decoded segments held in memory (bytes)", value=s.bytes)
        yield GaugeMetricFamily("queen_segment_cache_budget_bytes",
                                "QUEEN_SEGMENT_CACHE_BYTES", value=s.budget_bytes)
        yield GaugeMetricFamily("queen_segment_cache_segments", "Decoded segments held",
                                value=s.segments)
        yield CounterMetricFamily("queen_segment_cache_hits", "Segment reads served from memory",
                                  value=s.hits_total)
        yield CounterMetricFamily("queen_segment_cache_misses",
                                  "Segment reads that fetched and decompressed the segment",
                                  value=s.misses_total)
        yield CounterMetricFamily("queen_segment_cache_evictions",
                                  "Segments evicted to stay within the budget",
                                  value=s.evictions_total)


class _FireLagHistogram(Collector):
    """``queen_timers_fire_lag_seconds``: exported exactly as a prometheus_client Histogram
    with FIRE_LAG_BUCKETS, but observed a batch at a time. A sweep fires up to thousands of
    timers that share one lag or a few (a burst's: one deliver_at, one commit); a Histogram
    observes one value per call and steps through its 60-odd bounds in turn to find the
    bucket (the further the lag, the longer the walk): about half the event loop's CPU per
    timer while a burst drained. Here one bisect per distinct lag, whatever its count."""

    def __init__(self) -> None:
        self._counts = [0] * (len(FIRE_LAG_BUCKETS) + 1)
        self._sum = 0.0
        self._lock = threading.Lock()  # a scrape sees whole batches (collect may run anywhere)

    def observe_each(self, observed: list[tuple[int, float, int]]) -> None:
        """``count`` observations of ``seconds`` in ``bucket``, for each (bucket, seconds,
        count), under the lock once."""
        with self._lock:
            counts, total = self._counts, 0.0
            for bucket, seconds, count in observed:
                counts[bucket] += count
                total += seconds * count
            self._sum += total

    def collect(self) -> Iterator[HistogramMetricFamily]:
        with self._lock:
            counts, total_seconds = list(self._counts), self._sum
        cumulative, acc = [], 0
        for bound, n in zip((*map(floatToGoString, FIRE_LAG_BUCKETS), "+Inf"), counts,
                            strict=True):
            acc += n
            cumulative.append((bound, acc))
        yield HistogramMetricFamily("queen_timers_fire_lag_seconds",
                                    "Fire commit minus deliver_at, on PostgreSQL's clock",
                                    buckets=cumulative, sum_value=total_seconds)


def _remember_labels(metric: MetricWrapperBase) -> None:
    """``metric.labels(*values)`` answered from a dict once a child exists (prometheus_client
    validates the values and takes its lock on every call: a few of them per sweeper cycle).
    Children are never removed here, so the one remembered stays the metric's."""
    children: dict[tuple[Any, ...], Any] = {}
    labels = metric.labels

    def remembered(*values: Any, **named: Any) -> Any:
        if named:
            return labels(*values, **named)
        child = children.get(values)
        if child is None:
            child = children[values] = labels(*values)
        return child

    metric.labels = remembered  # type: ignore[method-assign]


class BrokerMetrics:
    def __init__(self) -> None:
        # Which broker (process, start) the tallies belong to: a dashboard polling through
        # several workers, or across a restart, must not subtract one broker's from another's.
        self.instance = uuid.uuid4().hex[:12]
        self._tenants: dict[int, TenantTally] = {}
        self.registry = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        self.http_requests = Counter(
            "queen_http_requests",
            "HTTP requests answered, by route template, method and status",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.http_request_seconds = Histogram(
            "queen_http_request_seconds",
            "HTTP request handling time, by route rule and method",
            ["route", "method"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.auth_refused = Counter(
            "queen_auth_refused",
            "Requests refused for their credentials: unauthorized (401), or throttled (429: "
            "too many failed authentications from one address, refused before any lookup)",
            ["reason"], registry=self.registry,
        )
        for reason in ("unauthorized", "throttled"):
            self.auth_refused.labels(reason)

        # The log.
        self.messages_pushed = Counter(
            "queen_messages_pushed", "Push items by outcome", ["status"], registry=self.registry
        )
        self.pops = Counter(
            "queen_pop_requests", "Pop requests by outcome", ["result"], registry=self.registry
        )
        self.messages_popped = Counter(
            "queen_messages_popped", "Messages handed out by pops", registry=self.registry
        )
        self.acks = Counter(
            "queen_acks", "Acknowledgements applied, by status", ["status"],
            registry=self.registry,
        )
        self.dead_lettered = Counter(
            "queen_messages_dead_lettered", "Messages moved to dead letters by acks",
            registry=self.registry,
        )
        self.pop_fire_waits = Counter(
            "queen_pop_fire_waits",
            "Parked pops served by a timer about to fire into their queue: handed the fire's "
            "batch by the sweep (handed_over; handed_nothing: the sweep's pop found nothing "
            "for it; handed_back: it had gone, the batch was released), or waiting for it in "
            "PostgreSQL (delivered, gave_up, fallback)",
            ["result"], registry=self.registry,
        )
        # Failover: what a broker did with read-only servers (a standby not yet promoted, a
        # demoted or fenced primary). Nothing is ever written through such a connection.
        self.db_read_only = Counter(
            "queen_db_read_only_connections",
            "Connections to a read-only database server: refused at connect (libpq's "
            "target_session_attrs check, or the server's own report) or dropped when a "
            "statement met it (SQLSTATE 25006); pool, sweeper and LISTEN connections",
            ["event"], registry=self.registry,
        )
        for event in ("refused", "dropped"):
            self.db_read_only.labels(event)
        self.longpoll_waiters = Gauge(
            "queen_longpoll_waiters", "Pops currently waiting for messages",
            registry=self.registry,
        )
        self.longpoll_looks = Counter(
            "queen_longpoll_looks",
            "Looks at the database by waiting pops, by what woke them (notify: a NOTIFY of "
            "their queue; next: a neighbour got messages; due: a lease, retry hold or delay "
            "ended; missed: notifications were lost; safety: the periodic re-check; fire: a "
            "timer about to fire; handover: the fire's hand-over gave nothing)",
            ["reason"], registry=self.registry,
        )
        self.longpoll_looks_spared = Counter(
            "queen_longpoll_looks_spared",
            "Waiting pops that joined a lane known to be empty (its last look found nothing "
            "and no news came since) without looking: a client polling again costs no query",
            registry=self.registry,
        )
        self.longpoll_refused = Counter(
            "queen_longpoll_refused",
            "Pops refused instead of waiting: the tenant's (429) or the broker's (503) bound "
            "on waiting pops was reached", ["scope"], registry=self.registry,
        )
        for scope in ("tenant", "broker"):
            self.longpoll_refused.labels(scope)
        for reason in ("notify", "next", "due", "missed", "safety", "fire", "handover"):
            self.longpoll_looks.labels(reason)

        # Log storage: sealing and retention (the housekeeping service).
        self.segments_sealed = Counter(
            "queen_segments_sealed", "Segments sealed from the head", registry=self.registry
        )
        self.frames_sealed = Counter(
            "queen_segment_frames_sealed", "Frames moved from the head into segments",
            registry=self.registry,
        )
        self.seal_seconds = Histogram(
            "queen_segment_seal_seconds",
            "One seal: read the head range, compress, insert the segment, delete the rows",
            buckets=LATENCY_BUCKETS, registry=self.registry,
        )
        self.segments_dropped = Counter(
            "queen_segments_dropped", "Segments dropped by retention", registry=self.registry
        )
        self.frames_dropped = Counter(
            "queen_segment_frames_dropped", "Frames dropped by retention (log_start advanced)",
            registry=self.registry,
        )
        self.messages_skipped = Counter(
            "queen_messages_skipped",
            "Messages a consumer group never received because retention dropped them first "
            "(the group resumed at log_start)",
            registry=self.registry,
        )

        # Timers and the sweeper.
        self._fire_lag = _FireLagHistogram()
        self.registry.register(self._fire_lag)
        # Timers fired by this broker (as observed in the fire-lag histogram): the
        # housekeeper's way to see a backlog draining (log/housekeeping.py, sealing waits).
        self.fires = 0
        self.timers_scheduled = Counter(
            "queen_timers_scheduled", "Schedule requests by answer", ["status"],
            registry=self.registry,
        )
        self.timers_cancelled = Counter(
            "queen_timers_cancel", "Cancel requests by answer", ["status"], registry=self.registry
        )
        self.seal_deferrals = Counter(
            "queen_segments_seal_deferrals",
            "Sealing passes put off because a backlog of timers was draining on this broker",
            registry=self.registry,
        )
        self.timers_fired = Counter(
            "queen_timers_fired", "Timers appended to the log", registry=self.registry
        )
        self.timer_failures = Counter(
            "queen_timers_failures",
            "Fire failures: permanent ones spend an attempt, transient ones do not",
            ["kind"], registry=self.registry,
        )
        self.timers_dead_lettered = Counter(
            "queen_timers_dead_lettered", "Timers moved to dead letters (group __timer__)",
            registry=self.registry,
        )
        self.timers_pending = Gauge(
            "queen_timers_pending", "Pending timers in the database (refreshed every 5 s)",
            registry=self.registry,
        )
        self.switch_enabled = Gauge(
            "queen_switch_enabled",
            "1 while a runtime switch is on, 0 while an operator has it paused "
            "(queen-trio switches)", ["switch"], registry=self.registry,
        )
        self.sweeper_wakeups = Counter(
            "queen_sweeper_wakeups", "Why the sweeper woke up", ["reason"], registry=self.registry
        )
        self.claim_batch_size = Histogram(
            "queen_sweeper_claim_batch_size", "Timers per non-empty claim",
            buckets=(1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2000, 5000),
            registry=self.registry,
        )
        # Background services outlive what they cannot process (queen_trio/db/transient.py).
        self.background_errors = Counter(
            "queen_background_errors",
            "Errors a background service met that were not transient database trouble (a row "
            "or tenant it could not process, or a bug): logged at ERROR with a traceback, "
            "and the service went on",
            ["service"], registry=self.registry,
        )
        for service in BACKGROUND_SERVICES:
            self.background_errors.labels(service)
        # Each cyclic garbage collection stops the event loop (queen_trio/gc_pauses.py).
        self.gc_pause_seconds = Histogram(
            "queen_gc_pause_seconds",
            "How long each cyclic garbage collection stopped the broker, by generation "
            "(2: a full collection)",
            ["generation"], buckets=GC_PAUSE_BUCKETS, registry=self.registry,
        )
        self._gc_pauses = [self.gc_pause_seconds.labels(str(g)) for g in range(3)]
        for status in ("scheduled", "rescheduled", "too_late"):
            self.timers_scheduled.labels(status)
        for status in ("cancelled", "absent", "too_late"):
            self.timers_cancelled.labels(status)
        for kind in ("permanent", "transient"):
            self.timer_failures.labels(kind)
        for reason in ("notify", "deadline", "max_sleep"):
            self.sweeper_wakeups.labels(reason)
        for metric in vars(self).values():
            if isinstance(metric, MetricWrapperBase) and metric._labelnames:
                _remember_labels(metric)

    def observe_gc_pause(self, generation: int, seconds: float) -> None:
        self._gc_pauses[generation].observe(seconds)

    def count_background_error(self, service: str) -> None:
        self.background_errors.labels(service).inc()

    def tally(self, tenant_id: int) -> TenantTally:
        tally = self._tenants.get(tenant_id)
        if tally is None:
            tally = self._tenants[tenant_id] = TenantTally()
        return tally

    def count_pushed(self, tenant_id: int, statuses: Iterable[str]) -> None:
        """Push items appended (or found duplicate), by status."""
        n = 0
        for status in statuses:
            self.messages_pushed.labels(status).inc()
            n += 1
        self.tally(tenant_id).pushed += n

    def count_pop(self, tenant_id: int, messages: int) -> None:
        """One pop request that handed out ``messages`` (0: an empty answer)."""
        self.pops.labels("messages" if messages else "empty").inc()
        if messages:
            self.messages_popped.inc(messages)
            self.tally(tenant_id).popped += messages

    def count_acks(self, tenant_id: int, statuses: Iterable[str]) -> None:
        """Acknowledgements applied (not those already applied before), by status: one
        increment per status (a settled batch is 500 of the same)."""
        counts = collections.Counter(statuses)
        for status, n in counts.items():
            self.acks.labels(status).inc(n)
        self.tally(tenant_id).acked += counts.total()

    def observe_fire_lag(self, tenant_id: int, seconds: float, count: int = 1) -> None:
        """``count`` timers of a tenant fired ``seconds`` after their deliver_at."""
        self.observe_fire_lags(tenant_id, ((seconds, count),))

    def observe_fire_lags(self, tenant_id: int, lags: Iterable[tuple[float, int]]) -> None:
        """:meth:`observe_fire_lag` of each (seconds, count) of a tenant, in one call (a
        sweeper cycle's few timers under a steady flow each have their own lag)."""
        # (bisect_left: the first bound >= seconds)
        observed = [(bisect.bisect_left(FIRE_LAG_BUCKETS, seconds), seconds, count)
                    for seconds, count in lags]
        self._fire_lag.observe_each(observed)
        tally = self.tally(tenant_id)
        buckets, fires = tally.fire_lag, 0
        for bucket, _, count in observed:
            buckets[bucket] += count
            fires += count
        self.fires += fires
        tally.fires += fires

    def count_http(self, route: str, method: str, status: int, seconds: float | None) -> None:
        """One answered HTTP request (``seconds`` None: its start was not recorded)."""
        # (labels() remembers its children: _remember_labels)
        self.http_requests.labels(route, method, str(status)).inc()
        if seconds is not None:
            self.http_request_seconds.labels(route, method).observe(seconds)

    def watch(
        self,
        *,
        pool: Callable[[], PoolStatistics] | None = None,
        listener: Callable[[], ListenerStatistics] | None = None,
    ) -> None:
        """Expose the ``statistics()`` of the pool and the listener."""
        self.registry.register(_StatisticsCollector(pool, listener))

    def watch_segment_cache(self, statistics: Callable[[], CacheStatistics]) -> None:
        self.registry.register(_SegmentCacheCollector(statistics))

    def render(self) -> bytes:
        return generate_latest(self.registry)

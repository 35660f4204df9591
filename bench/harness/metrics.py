"""The broker's /metrics (Prometheus text) and the summaries the timer reports make of it."""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

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


def histogram_bucket_bound(buckets: list[tuple[float, float]], q: float) -> float | None:
    """The upper bound of the bucket holding rank q * count (+Inf past the last finite one):
    a bound the quantile is known to be under, where :func:`histogram_quantile` guesses inside
    the bucket; None for an empty histogram."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    return next((le for le, count in buckets if count >= rank), math.inf)


FIRE_LAG = "queen_timers_fire_lag_seconds"


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
            per_bucket[le_ms(le)] = int(cum - prev)
            out["max_bucket_ms"] = f"({le_ms(prev_le)}, {le_ms(le)}]"
        prev_le, prev = le, cum
    out["buckets_ms"] = per_bucket  # upper bound (ms) -> timers in that bucket
    return out


def le_ms(le: float) -> str:
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


def merge(metrics: list[Metrics | None]) -> Metrics | None:
    """Several brokers' scrapes as one (counters and histogram buckets add up)."""
    known = [m for m in metrics if m is not None]
    if not known:
        return None
    samples: dict[Any, float] = {}
    for m in known:
        for k, v in m.samples.items():
            samples[k] = samples.get(k, 0.0) + v
    return Metrics(samples)


def metric_lag(m: Metrics | None) -> dict[str, Any]:
    """``lag_summary`` of the broker histogram plus p99.9 (interpolated inside buckets)."""
    out = lag_summary(m)
    if m is not None and out.get("count"):
        value = histogram_quantile(m.buckets(FIRE_LAG), 0.999)
        out["p99_9_ms"] = None if value is None else round(value * 1000, 2)
        out["cdf_ms"] = [[round(le * 1000, 3), round(c / out["count"], 6)]
                         for le, c in m.buckets(FIRE_LAG) if math.isfinite(le)]
    return out

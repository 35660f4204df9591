"""A tenant's own figures: ``GET /api/v1/stats``, what the dashboard's rates and fire-lag chart
are drawn from (``/metrics`` counts every tenant together; see :mod:`queen_trio.metrics`).

Counters since this broker process started, under its ``broker`` id: a client computing
rates subtracts two answers only when they carry the same id (with QUEEN_WORKERS > 1 each
worker counts its own, and a restart starts from zero).
"""

from __future__ import annotations

from quart import Blueprint, Response

from .common import broker as _broker
from .common import json_response
from .tenancy import current_tenant_id

stats_routes = Blueprint("stats", __name__, url_prefix="/api/v1")


@stats_routes.get("/stats")
async def stats() -> Response:
    metrics = _broker().metrics
    tally = metrics.tally(current_tenant_id())
    return json_response({
        "broker": metrics.instance,
        "pushed": tally.pushed,
        "popped": tally.popped,
        "acked": tally.acked,
        "timerFireLag": {"count": tally.fires, "buckets": tally.fire_lag_cumulative()},
    })

"""Operational endpoints: /health, /metrics, /openapi.json."""

from __future__ import annotations

from typing import Any

import psycopg
import trio
from quart import Blueprint, Response, request

from ..db import queries
from ..errors import DatabaseUnavailable
from ..metrics import CONTENT_TYPE
from .common import broker as _broker
from .common import json_response
from .openapi import openapi_document
from .tenancy import require_operator

ops = Blueprint("ops", __name__)
Q = queries.load("ops")

_HEALTH_DB_TIMEOUT_S = 2.0



@ops.get("/health")
async def health() -> Response:
    broker = _broker()
    schema_version = None
    server: dict[str, Any] | None = None
    database = "down"
    with trio.move_on_after(_HEALTH_DB_TIMEOUT_S):
        try:
            async with broker.db.connection() as conn:
                row = await conn.fetchrow(Q.health)
                host, port = conn.server
            assert row is not None
            schema_version = row["schema_version"]
            # Which server the pool is on (with a multi-host URL: the one that took it).
            server = {"host": host, "port": port, "inRecovery": row["in_recovery"]}
            database = "up"
        except (DatabaseUnavailable, psycopg.Error, OSError) as exc:
            database = f"down: {exc}".splitlines()[0]
    services = {name: ("up" if alive() else "down") for name, alive in broker.services.items()}
    ok = database == "up" and all(state == "up" for state in services.values())
    body: dict[str, Any] = {
        "ok": ok,
        "database": "up" if database == "up" else "down",
        "schemaVersion": schema_version,
        "services": services,
        "server": server,
    }
    if database != "up":
        body["error"] = "database_unavailable"
        body["message"] = database if database != "down" else "no answer from the database in time"
    response = json_response(body)
    response.status_code = 200 if ok else 503
    return response


@ops.get("/metrics")
@ops.get("/metrics/prometheus")
async def metrics() -> Response:
    broker = _broker()
    await require_operator(request._get_current_object(), broker)  # type: ignore[attr-defined]
    return Response(broker.metrics.render(), content_type=CONTENT_TYPE)


@ops.get("/openapi.json")
async def openapi() -> Response:
    return json_response(openapi_document())

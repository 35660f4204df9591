"""The OpenAPI 3.1 description of the HTTP API, written by hand next to the routes.

Each area adds its paths here when its routes land; a test checks that every route the app
serves is described.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from .. import __version__


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


_ERROR = {"$ref": "#/components/schemas/Error"}


@cache
def openapi_document() -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "queen-trio",
            "version": __version__,
            "description": "A PostgreSQL-backed message broker with durable, cancellable timers. "
            "Wire conventions follow Queen's v1 HTTP API.",
        },
        "paths": {
            "/health": {
                "get": {
                    "summary": "Database round trip, schema version and service liveness",
                    "operationId": "health",
                    "responses": {
                        "200": _json({"$ref": "#/components/schemas/Health"}, "Healthy"),
                        "503": _json(
                            {"$ref": "#/components/schemas/Health"},
                            "The database is unreachable or a service is down",
                        ),
                    },
                }
            },
            "/metrics": {
                "get": {
                    "summary": "Prometheus metrics (same as /metrics/prometheus)",
                    "operationId": "metrics",
                    "responses": {
                        "200": {
                            "description": "Prometheus text exposition format",
                            "content": {"text/plain": {"schema": {"type": "string"}}},
                        }
                    },
                }
            },
            "/metrics/prometheus": {
                "get": {
                    "summary": "Prometheus metrics",
                    "operationId": "metricsPrometheus",
                    "responses": {
                        "200": {
                            "description": "Prometheus text exposition format",
                            "content": {"text/plain": {"schema": {"type": "string"}}},
                        }
                    },
                }
            },
            "/openapi.json": {
                "get": {
                    "summary": "This document",
                    "operationId": "openapi",
                    "responses": {"200": _json({"type": "object"}, "OpenAPI 3.1 document")},
                }
            },
        },
        "components": {
            "schemas": {
                "Error": {
                    "type": "object",
                    "required": ["ok", "error", "message"],
                    "properties": {
                        "ok": {"const": False},
                        "error": {"type": "string", "description": "stable snake_case code"},
                        "message": {"type": "string"},
                    },
                },
                "Health": {
                    "type": "object",
                    "required": ["ok", "database", "schemaVersion", "services"],
                    "properties": {
                        "ok": {"type": "boolean"},
                        "database": {"enum": ["up", "down"]},
                        "schemaVersion": {"type": ["integer", "null"]},
                        "services": {
                            "type": "object",
                            "additionalProperties": {"enum": ["up", "down"]},
                        },
                    },
                },
            },
            "responses": {
                "NotFound": _json(_ERROR, "No such route or resource"),
                "BadRequest": _json(_ERROR, "Malformed JSON or invalid fields"),
            },
        },
    }

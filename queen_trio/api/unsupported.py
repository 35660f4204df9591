"""Queen's surfaces this broker does not serve, answered with a JSON 404 that says why and what
to use instead (docs/queen-compatibility.md), rather than the bare "no route"."""

from __future__ import annotations

from typing import NoReturn

from quart import Blueprint

from .errors import ApiError

unsupported_routes = Blueprint("unsupported", __name__)

_ANY = ["GET", "POST", "PUT", "PATCH", "DELETE"]

_EPHEMERAL = (
    "ephemeral (in-memory) queues are not supported: every message here is stored durably in "
    "PostgreSQL. Use an ordinary queue; retentionSeconds or maxWaitTimeSeconds bound what it "
    "keeps")
_STREAMS = (
    "Queen's streams runtime (/streams/v1) is not supported: consume the queue with pop (or "
    "read it by offset with POST /api/v1/fetch) and keep window state in KV (POST /api/v1/kv)")
_MAINTENANCE = (
    "there is no maintenance mode (Queen's buffers pushes to a file while it is on): a push "
    "here is committed to PostgreSQL or refused, and while the database is unreachable it is "
    "answered 503 database_unavailable, which clients retry")


def _refuse(code: str, message: str) -> NoReturn:
    raise ApiError(404, code, message)


@unsupported_routes.route("/api/v1/ephemeral", methods=_ANY)
@unsupported_routes.route("/api/v1/ephemeral/<name:rest>", methods=_ANY)
async def ephemeral(rest: str = "") -> NoReturn:
    _refuse("ephemeral_unsupported", _EPHEMERAL)


@unsupported_routes.route("/streams/v1", methods=_ANY)
@unsupported_routes.route("/streams/v1/<name:rest>", methods=_ANY)
async def streams(rest: str = "") -> NoReturn:
    _refuse("streams_unsupported", _STREAMS)


@unsupported_routes.route("/api/v1/system/maintenance", methods=_ANY)
@unsupported_routes.route("/api/v1/system/maintenance/pop", methods=_ANY)
async def maintenance() -> NoReturn:
    _refuse("maintenance_unsupported", _MAINTENANCE)

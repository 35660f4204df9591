"""``POST /api/v1/locks``: acquire, renew, release and get, for locks and semaphores
(:mod:`queen_trio.locks`). As on the KV routes the status says how the call went: a lock held
by somebody else is a 200 with ``acquired: false``, a stale token a 200 with ``reason: lost``.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

from quart import Blueprint, Response

from .. import locks
from ..models import codec
from ..models import locks as models
from .common import broker as _broker
from .common import model_response
from .errors import install_family_errors, read_body_via
from .switches import require_kv
from .tenancy import current_tenant_id, enforce_storage_gate

lock_routes = Blueprint("locks", __name__, url_prefix="/api/v1/locks")
install_family_errors(lock_routes, "locks_bad_request")


@lock_routes.post("")
async def batch() -> Response:
    body = await read_body_via(models.CALL_DECODER)
    if isinstance(body, dict) and set(body) == {"operations"}:
        body = body["operations"]
    ops = locks.parse_call(body)
    broker = _broker()
    require_kv(broker)  # a permit is a KV row: the KV switch pauses locks too (as Queen's)
    if any(op.kind == "acquire" for op in ops):  # the one operation that adds a row
        enforce_storage_gate()
    db, tenant_id = broker.db, current_tenant_id()

    def kv(op: dict[str, Any]) -> Awaitable[dict[str, Any]]:
        return db.run_transaction(locks.kv_call, tenant_id, op)

    # Independent operations, each KV call its own transaction: a call that fails half way
    # may have applied some, and sent again with the same owners it converges.
    results = [await locks.apply(kv, op) for op in ops]
    return model_response(models.LockResults(codec.as_model(results, models.RESULTS_DECODER)))

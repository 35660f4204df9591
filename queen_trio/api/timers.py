"""Timer routes: schedule (PUT / POST), cancel (DELETE), peek and list, scoped to one queue.

``{key}`` is the rest of the path, percent-decoded, and may contain '/'. Every answer about a
single timer is HTTP 200 with a status (scheduled, rescheduled, cancelled, absent, too_late),
except peek of a timer that is not pending: 404 absent.
"""

from __future__ import annotations

from typing import Any

from quart import Blueprint, Response, request

from ..errors import ValidationError
from ..log import rules as log_rules
from ..timers import rules, store
from ..transactions import timer_outcome_wire
from ..wire import iso
from .common import broker as _broker
from .common import json_response
from .errors import error_response, read_json_object
from .tenancy import current_tenant_id, enforce_storage_gate, message_ceiling, never_refused

timer_routes = Blueprint("timers", __name__, url_prefix="/api/v1/timers")



def payload_ceiling() -> int:
    return _broker().settings.timer_payload_ceiling(message_ceiling())


def parse_schedule(body: Any, queue: Any, key: Any, where: str = "") -> rules.Schedule:
    return rules.schedule(
        body, queue, key, horizon_s=_broker().settings.timers_max_horizon_s,
        ceiling=payload_ceiling(), where=where,
    )


async def _schedule(s: rules.Schedule) -> Response:
    broker = _broker()
    # Shares a statement and a commit with the schedules arriving alongside it.
    outcome = await broker.schedules.schedule(current_tenant_id(), s)
    broker.metrics.timers_scheduled.labels(outcome.status).inc()
    return json_response(timer_outcome_wire(outcome))


@timer_routes.put("/<queue>/<name:key>")
async def schedule_put(queue: str, key: str) -> Response:
    enforce_storage_gate()
    return await _schedule(parse_schedule(await read_json_object(), queue, key))


@timer_routes.post("")
async def schedule_post() -> Response:
    enforce_storage_gate()
    body = await read_json_object()
    queue, key = body.pop("queue", None), body.pop("key", None)
    if queue is None or key is None:
        raise ValidationError("missing_field", "queue and key are required")
    return await _schedule(parse_schedule(body, queue, key))


@timer_routes.delete("/<queue>/<name:key>")
@never_refused  # a tenant must always be able to stop a message it no longer wants
async def cancel(queue: str, key: str) -> Response:
    txn = request.args.get("txn") or None
    if txn is not None:
        txn = log_rules.transaction_id(txn, "txn")
    broker = _broker()
    outcome = await broker.db.run(
        store.cancel, current_tenant_id(), log_rules.queue_name(queue), rules.timer_key(key), txn
    )
    broker.metrics.timers_cancelled.labels(outcome.status).inc()
    return json_response(timer_outcome_wire(outcome))


@timer_routes.get("/<queue>/<name:key>")
async def peek(queue: str, key: str) -> Response:
    q, k = log_rules.queue_name(queue), rules.timer_key(key)
    row = await _broker().db.run(store.peek, current_tenant_id(), q, k)
    if row is None:
        return error_response(404, "absent", f"no pending timer {k!r} on queue {q!r}",
                              status="absent", queue=q, key=k)
    return json_response({
        "queue": q, "key": k, "partition": row["partition"], "txn": row["txn"],
        "deliverAt": iso(row["deliver_at"]), "state": "claimed" if row["claimed"] else "pending",
        "attempts": row["attempts"], "lastError": row["last_error"], "payload": row["payload"],
    })


@timer_routes.get("/<queue>")
async def list_timers(queue: str) -> Response:
    q = log_rules.queue_name(queue)
    args = dict(request.args)
    limit = log_rules.query_int(args, "limit", 100, lo=1, hi=rules.MAX_LIST_LIMIT)
    after = rules.decode_cursor(args["after"]) if args.get("after") else ""
    rows = await _broker().db.run(store.list_timers, current_tenant_id(), q, after, limit)
    timers = [
        {"queue": q, "key": r["timer_key"], "partition": r["partition"], "txn": r["txn"],
         "deliverAt": iso(r["deliver_at"]), "state": "claimed" if r["claimed"] else "pending",
         "attempts": r["attempts"], "lastError": r["last_error"]}
        for r in rows
    ]
    next_cursor = rules.encode_cursor(rows[-1]["timer_key"]) if len(rows) == limit else None
    return json_response({"timers": timers, "next": next_cursor})

"""Timer routes on Queen's wire (queen-mq's ``client.timers``), scoped to one queue.

- ``POST /api/v1/timers``: ``{"operations": [...]}`` or a bare array of schedule, reschedule
  and cancel operations (payloads in base64), at most 256, in one transaction; ``{"results":
  [...]}`` in input order.
- ``PUT /api/v1/timers/{queue}/{key}``: one schedule with a JSON payload (our curl-friendly
  extension), answered like one result of the batch.
- ``DELETE /api/v1/timers/{queue}/{key}[?txn=]``: cancel, never refused by a quota or the
  storage gate.
- ``GET /api/v1/timers/{queue}/{key}``: peek (a miss is 200 ``found: false``).
- ``GET /api/v1/timers/{queue}?after=&limit=``: a keyset page; ``?mode=count&prefix=`` counts.

``{key}`` is the rest of the path, percent-decoded, and may contain '/'. Every answer about a
timer is HTTP 200 with a status (scheduled, rescheduled, cancelled, absent, too_late). A refused
request answers Queen's codes: 400 ``timers_bad_request`` (with our precise code as
``reason``), 413 ``payload_too_large``, 403 ``timer_horizon_exceeded`` and 403 for the storage
gate.
"""

from __future__ import annotations

import base64
import json
from collections import Counter
from typing import Any

from quart import Blueprint, Response, request

from ..errors import ClientError, ValidationError
from ..log import rules as log_rules
from ..timers import rules, store
from ..wire import iso
from .common import broker as _broker
from .common import json_response
from .errors import ApiError, error_response, read_json_body, read_json_object
from .tenancy import current_tenant_id, enforce_storage_gate, message_ceiling, never_refused

timer_routes = Blueprint("timers", __name__, url_prefix="/api/v1/timers")


@timer_routes.errorhandler(ClientError)
async def _timer_client_error(exc: ClientError) -> Response:
    return _queen_error(exc.status, exc.code, exc.message, exc.extra)


@timer_routes.errorhandler(ApiError)
async def _timer_api_error(exc: ApiError) -> Response:
    response = _queen_error(exc.status, exc.code, exc.message, exc.extra)
    response.headers.update(exc.headers)
    return response


def _queen_error(status: int, code: str, message: str, extra: dict[str, Any]) -> Response:
    """Queen's error shape: a 400 is ``timers_bad_request`` with our own code as ``reason``;
    ``detail`` repeats the message (queen-mq reads ``error``, ``reason`` and ``detail``)."""
    if status == 400:
        return error_response(400, "timers_bad_request", message, reason=code, detail=message,
                              **extra)
    return error_response(status, code, message, detail=message, **extra)


def payload_ceiling() -> int:
    return _broker().settings.timer_payload_ceiling(message_ceiling())


def _horizon_s() -> int:
    return _broker().settings.timers_max_horizon_s


def outcome_wire(o: store.Outcome) -> dict[str, Any]:
    """One result of Queen's timer wire (a batch, a bundle, a PUT or a DELETE)."""
    wire: dict[str, Any] = {"ok": o.ok, "status": o.status, "queue": o.queue,
                            "timerKey": o.key, "txn": o.txn}
    if o.status in ("scheduled", "rescheduled"):
        wire["messageId"] = str(o.message_id)
        wire["deliverAt"] = iso(o.deliver_at)
        wire["partition"] = o.partition
    return wire


def count_outcomes(outcomes: list[store.Outcome], ops: list[rules.Schedule | rules.Cancel]
                   ) -> None:
    metrics = _broker().metrics
    counts = Counter((isinstance(op, rules.Schedule), o.status)
                     for op, o in zip(ops, outcomes, strict=True))
    for (scheduled, status), n in counts.items():
        counter = metrics.timers_scheduled if scheduled else metrics.timers_cancelled
        counter.labels(status).inc(n)


@timer_routes.post("")
async def batch() -> Response:
    ops = rules.operations(await read_json_body(), horizon_s=_horizon_s(),
                           ceiling=payload_ceiling())
    if any(isinstance(op, rules.Schedule) for op in ops):
        # A batch that schedules is refused whole past the gate; cancels alone never are
        # (and DELETE is the route that cancels whatever the gate says).
        enforce_storage_gate(status=403)
    outcomes = await _apply(ops)
    count_outcomes(outcomes, ops)
    return json_response({"results": [outcome_wire(o) for o in outcomes]})


async def _apply(ops: list[rules.Schedule | rules.Cancel]) -> list[store.Outcome]:
    broker, tenant_id = _broker(), current_tenant_id()
    if not ops:
        return []
    schedules = [op for op in ops if isinstance(op, rules.Schedule)]
    cancels = [op for op in ops if isinstance(op, rules.Cancel)]
    if not cancels:
        # Shares a statement and a commit with the schedules arriving alongside it.
        return await broker.schedules.schedule_many(tenant_id, schedules)
    within = broker.settings.sweeper_max_sleep_ms
    if not schedules:
        return await broker.db.run_statement(store.cancel_many, tenant_id, cancels)
    return await broker.db.run(store.apply, tenant_id, ops, notify_within_ms=within,
                               cipher=broker.cipher)


@timer_routes.put("/<queue>/<name:key>")
async def schedule_put(queue: str, key: str) -> Response:
    enforce_storage_gate(status=403)
    s = rules.schedule(await read_json_object(), queue, key, horizon_s=_horizon_s(),
                       ceiling=payload_ceiling())
    broker = _broker()
    outcome = await broker.schedules.schedule(current_tenant_id(), s)
    broker.metrics.timers_scheduled.labels(outcome.status).inc()
    return json_response(outcome_wire(outcome))


@timer_routes.delete("/<queue>/<name:key>")
@never_refused  # a tenant must always be able to stop a message it no longer wants
async def cancel(queue: str, key: str) -> Response:
    txn = request.args.get("txn") or None
    if txn is not None:
        txn = log_rules.transaction_id(txn, "txn")
    broker = _broker()
    outcome = await broker.db.run_statement(
        store.cancel, current_tenant_id(), log_rules.queue_name(queue), rules.timer_key(key), txn
    )
    broker.metrics.timers_cancelled.labels(outcome.status).inc()
    return json_response(outcome_wire(outcome))


def _timer_row(queue: str, row: dict[str, Any], encrypted: bool = False) -> dict[str, Any]:
    return {
        "queue": queue, "timerKey": row["timer_key"], "partition": row["partition"],
        "deliverAt": iso(row["deliver_at"]), "txn": row["txn"],
        "messageId": str(row["message_id"]), "payloadZstd": row["payload_zstd"],
        "encrypted": encrypted, "producerSub": None, "attempts": row["attempts"],
        "lastError": row["last_error"], "claimed": row["claimed"],
        "createdAt": iso(row["created_at"]), "updatedAt": iso(row["updated_at"]),
    }


@timer_routes.get("/<queue>/<name:key>")
async def peek(queue: str, key: str) -> Response:
    q, k = log_rules.queue_name(queue), rules.timer_key(key)
    row = await _broker().db.run_statement(store.peek, current_tenant_id(), q, k)
    if row is None:
        return json_response({"found": False, "queue": q, "timerKey": k})
    blob, zstd = bytes(row["payload"]), row["payload_zstd"]
    try:  # (our extension: the payload decoded, as a popped message's data will be)
        data = rules.unpack(blob, zstd)
    except ValueError:
        data = None
    # A sealed payload (encryptionEnabled) is shown opened, as its fire will deliver it;
    # encrypted says it is stored sealed.
    cipher = _broker().cipher
    text = None if cipher is None else cipher.open_text(data)
    if text is not None:
        blob, zstd, data = text.encode(), False, json.loads(text)
    return json_response({"found": True, **_timer_row(q, row, encrypted=text is not None),
                          "payload": base64.b64encode(blob).decode(), "payloadZstd": zstd,
                          "data": data})


@timer_routes.get("/<queue>")
async def list_timers(queue: str) -> Response:
    q = log_rules.queue_name(queue)
    args = request.args
    mode = args.get("mode") or "list"
    db, tenant_id = _broker().db, current_tenant_id()
    if mode == "count":
        if "after" in args or "limit" in args:
            raise ValidationError("invalid_parameter", "mode=count takes no after or limit")
        prefix = rules.count_prefix(args.get("prefix"))
        n = await db.run_statement(store.count_timers, tenant_id, q, prefix)
        return json_response({"queue": q, "prefix": prefix, "count": n})
    if mode != "list":
        raise ValidationError("invalid_parameter", f"mode must be list or count, not {mode!r}")
    after = rules.timer_key(args["after"], "after") if args.get("after") else ""
    limit = rules.list_limit(args.get("limit"))
    rows, truncated = await db.run_statement(store.list_timers, tenant_id, q, after, limit)
    return json_response({
        "rows": [_timer_row(q, r) for r in rows], "truncated": truncated,
        "nextAfter": rows[-1]["timer_key"] if truncated else None,
    })

"""POST /api/v1/transaction: push, ack, KV writes and timers committed together or not at all."""

from __future__ import annotations

from typing import Any

from quart import Blueprint, Response, current_app

from .. import transactions
from ..context import BrokerContext
from ..log import rules as log_rules
from .common import json_response
from .errors import read_json_object
from .kv import put_to_wire
from .log import ack_to_wire, appended_to_wire
from .tenancy import current_tenant_id, enforce_storage_gate, message_ceiling
from .timers import count_outcomes, outcome_wire

transaction_routes = Blueprint("transaction", __name__, url_prefix="/api/v1")


def _result_to_wire(op: transactions.Operation, result: Any) -> dict[str, Any]:
    if op.type == "push":
        return {"index": op.index, "type": "push", "success": True,
                "items": [appended_to_wire(i, a) for i, a in enumerate(result)]}
    if op.type == "ack":
        return {**ack_to_wire(result), "index": op.index, "type": "ack"}
    if op.type == "kv.put":
        return {**put_to_wire(result), "index": op.index, "type": "kv.put", "success": True}
    return {"index": op.index, "type": "kv.delete", "success": True, "deleted": result}


@transaction_routes.post("/transaction")
async def transaction() -> Response:
    body = await read_json_object()
    broker: BrokerContext = current_app.config["BROKER"]
    settings = broker.settings
    ceiling = message_ceiling()
    limits = transactions.Limits(
        message_ceiling=ceiling,
        timer_payload_ceiling=settings.timer_payload_ceiling(ceiling),
        timer_horizon_s=settings.timers_max_horizon_s,
        notify_within_ms=settings.sweeper_max_sleep_ms,
    )
    bundle = transactions.parse(body, limits)
    if bundle.adds_storage():
        enforce_storage_gate()
    results, outcomes = await broker.db.run(
        transactions.execute, current_tenant_id(), bundle, limits
    )
    operations = bundle.operations
    count_outcomes(outcomes, bundle.timers)
    for op, result in zip(operations, results, strict=True):
        if op.type == "push":
            for appended in result:
                broker.metrics.messages_pushed.labels(appended.status).inc()
        elif op.type == "ack" and not result.already_acked:
            broker.metrics.acks.labels(result.status).inc()
    wire = [_result_to_wire(op, r) for op, r in zip(operations, results, strict=True)]
    # The timers' results follow the operations' in the one results array (Queen's layout).
    wire += [{**outcome_wire(o), "index": len(wire) + i, "type": "timer"}
             for i, o in enumerate(outcomes)]
    return json_response({
        "success": True,
        "transactionId": log_rules.new_transaction_id(),
        "results": wire,
    })



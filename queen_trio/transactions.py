"""Atomic bundles: ``POST /api/v1/transaction``.

A bundle's operations (push, ack, kv.put, kv.delete) are validated up front, then applied in
order inside one PostgreSQL transaction: everything commits or nothing does. A failure names the
operation that caused it. Timers ride the bundle in their own top-level ``timers`` array.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import psycopg

from .errors import ClientError, ValidationError
from .kv import rules as kv_rules
from .kv import store as kv_store
from .log import rules as log_rules
from .log import store as log_store

Raw = psycopg.Connection[dict[str, Any]]
OPERATION_TYPES = ("push", "ack", "kv.put", "kv.delete")
MAX_OPERATIONS = 1000


@dataclasses.dataclass(frozen=True, slots=True)
class Operation:
    index: int
    type: str
    args: Any


def _at(index: int, exc: ClientError) -> ClientError:
    """The same error, saying which operation it belongs to."""
    return type(exc)(exc.code, f"operations[{index}]: {exc.message}", status=exc.status,
                     **{**exc.extra, "operation": index})


def parse(body: dict[str, Any], ceiling: int) -> list[Operation]:
    operations = body.get("operations")
    if not isinstance(operations, list) or not operations:
        raise ValidationError("invalid_operations", "operations must be a non-empty array")
    if len(operations) > MAX_OPERATIONS:
        raise ValidationError("invalid_operations", f"at most {MAX_OPERATIONS} operations")
    timers = body.get("timers")
    if timers not in (None, []):
        raise ValidationError("timers_unavailable", "this broker does not schedule timers yet")
    return [_parse_one(i, op, ceiling) for i, op in enumerate(operations)]


def _parse_one(index: int, op: Any, ceiling: int) -> Operation:
    try:
        if not isinstance(op, dict):
            raise ValidationError("invalid_operation", "must be an object")
        kind = op.get("type")
        if isinstance(kind, str) and (kind.startswith("timer") or kind in ("schedule", "cancel")):
            raise ValidationError(
                "timer_in_operations",
                "timers do not go in operations: put them in the top-level 'timers' array, "
                "beside 'operations'",
            )
        if kind == "push":
            items = log_rules.push_items({"items": op.get("items")}, ceiling)
            frames = [log_store.NewFrame(i.queue, i.partition, i.payload, i.transaction_id,
                                         dedupe=i.client_transaction_id) for i in items]
            return Operation(index, kind, frames)
        if kind == "ack":
            return Operation(index, kind, log_rules.ack(op, 0))
        if kind == "kv.put":
            if "value" not in op:
                raise ValidationError("missing_field", "value is required")
            return Operation(index, kind, (
                kv_rules.namespace(op.get("namespace")), kv_rules.key(op.get("key")),
                op["value"], kv_rules.ttl_seconds(op.get("ttlSeconds"))))
        if kind == "kv.delete":
            return Operation(index, kind, (kv_rules.namespace(op.get("namespace")),
                                           kv_rules.key(op.get("key"))))
        raise ValidationError(
            "invalid_operation", f"type must be one of {', '.join(OPERATION_TYPES)}"
        )
    except ClientError as exc:
        raise _at(index, exc) from None


def adds_storage(operations: list[Operation]) -> bool:
    return any(op.type in ("push", "kv.put") for op in operations)


def execute(raw: Raw, tenant_id: int, operations: list[Operation], ceiling: int) -> list[Any]:
    """Apply every operation in the caller's transaction; any error aborts them all."""
    results = []
    for op in operations:
        try:
            if op.type == "push":
                results.append(log_store.append(raw, tenant_id, op.args))
            elif op.type == "ack":
                (result,) = log_store.ack(raw, tenant_id, [op.args])
                results.append(result)
            elif op.type == "kv.put":
                namespace, key, value, ttl = op.args
                results.append(kv_store.put(raw, tenant_id, namespace, key, value, ttl, ceiling))
            else:
                namespace, key = op.args
                results.append(kv_store.delete(raw, tenant_id, namespace, key))
        except ClientError as exc:
            raise _at(op.index, exc) from None
    return results

"""Atomic bundles: ``POST /api/v1/transaction``.

A bundle's operations (push, ack, kv.put, kv.delete) are validated up front, then applied in
order inside one PostgreSQL transaction: everything commits or nothing does. A failure names the
operation that caused it. Timers ride the bundle in their own top-level ``timers`` array, in
Queen's operation shape (:func:`queen_trio.timers.rules.operation`); a timer that is being fired
is ``too_late`` in its result, a verdict that does not abort the bundle.
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
from .timers import rules as timer_rules
from .timers import store as timer_store

Raw = psycopg.Connection[dict[str, Any]]
OPERATION_TYPES = ("push", "ack", "kv.put", "kv.delete")
MAX_OPERATIONS = 1000


@dataclasses.dataclass(frozen=True, slots=True)
class Operation:
    index: int
    type: str
    args: Any


@dataclasses.dataclass(frozen=True, slots=True)
class Bundle:
    operations: list[Operation]
    timers: list[timer_rules.Schedule | timer_rules.Cancel]

    def adds_storage(self) -> bool:
        return any(op.type in ("push", "kv.put") for op in self.operations) or any(
            isinstance(t, timer_rules.Schedule) for t in self.timers
        )


@dataclasses.dataclass(frozen=True, slots=True)
class Limits:
    message_ceiling: int
    timer_payload_ceiling: int
    timer_horizon_s: int
    notify_within_ms: int


def _at(index: int, exc: ClientError) -> ClientError:
    """The same error, saying which operation it belongs to."""
    return type(exc)(exc.code, f"operations[{index}]: {exc.message}",
                     **{**exc.extra, "operation": index})


def parse(body: dict[str, Any], limits: Limits) -> Bundle:
    operations = body.get("operations", [])
    timers = body.get("timers", [])
    if not isinstance(operations, list) or not isinstance(timers, list):
        raise ValidationError("invalid_operations", "operations and timers must be arrays")
    if not operations and not timers:
        raise ValidationError(
            "invalid_operations", "a transaction needs at least one operation or timer"
        )
    if len(operations) + len(timers) > MAX_OPERATIONS:
        raise ValidationError("invalid_operations", f"at most {MAX_OPERATIONS} entries")
    return Bundle(
        [_parse_one(i, op, limits.message_ceiling) for i, op in enumerate(operations)],
        _parse_timers(timers, limits),
    )


def _parse_timers(entries: list[Any], limits: Limits
                  ) -> list[timer_rules.Schedule | timer_rules.Cancel]:
    """The ``timers`` rider: Queen's timer operations, each timer at most once. A malformed
    one is Queen's 400 ``timers_bad_request`` (our precise code as ``reason``)."""
    try:
        timers = [timer_rules.operation(t, f"timers[{i}]", horizon_s=limits.timer_horizon_s,
                                        ceiling=limits.timer_payload_ceiling)
                  for i, t in enumerate(entries)]
        timer_rules.check_distinct(timers, "timers")
    except ClientError as exc:
        if exc.status != 400:
            raise
        raise ValidationError("timers_bad_request", exc.message, reason=exc.code,
                              **exc.extra) from None
    return timers


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


def execute(
    raw: Raw, tenant_id: int, bundle: Bundle, limits: Limits
) -> tuple[list[Any], list[timer_store.Outcome]]:
    """Apply every operation and timer in the caller's transaction; any error aborts all.

    A timer's verdict (too_late for one being fired, absent for a cancel that found nothing)
    is its answer, and the bundle commits.
    """
    ceiling = limits.message_ceiling
    results: list[Any] = []  # per operation type: Appended, AckResult, Put or bool
    for op in bundle.operations:
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
    outcomes = timer_store.apply(raw, tenant_id, bundle.timers,
                                 notify_within_ms=limits.notify_within_ms)
    return results, outcomes

"""Atomic bundles: ``POST /api/v1/transaction``.

A bundle's operations (push, ack, kv.put, kv.delete) are validated up front, then applied in
order inside one PostgreSQL transaction: everything commits or nothing does. A failure names the
operation that caused it. Timers ride the bundle in their own top-level ``timers`` array.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import psycopg

from .errors import ClientError, Conflict, ValidationError
from .kv import rules as kv_rules
from .kv import store as kv_store
from .log import rules as log_rules
from .log import store as log_store
from .timers import rules as timer_rules
from .timers import store as timer_store
from .wire import iso

Raw = psycopg.Connection[dict[str, Any]]
OPERATION_TYPES = ("push", "ack", "kv.put", "kv.delete")
MAX_OPERATIONS = 1000


@dataclasses.dataclass(frozen=True, slots=True)
class Operation:
    index: int
    type: str
    args: Any


@dataclasses.dataclass(frozen=True, slots=True)
class TimerAction:
    index: int
    action: str  # schedule | cancel
    schedule: timer_rules.Schedule | None = None
    queue: str = ""
    key: str = ""
    txn: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Bundle:
    operations: list[Operation]
    timers: list[TimerAction]

    def adds_storage(self) -> bool:
        return any(op.type in ("push", "kv.put") for op in self.operations) or any(
            t.action == "schedule" for t in self.timers
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
        [_parse_timer(i, t, limits) for i, t in enumerate(timers)],
    )


def _parse_timer(index: int, entry: Any, limits: Limits) -> TimerAction:
    where = f"timers[{index}]"
    if not isinstance(entry, dict):
        raise ValidationError("invalid_timer", f"{where} must be an object", timer=index)
    body = dict(entry)
    action = body.pop("action", None)
    queue, key = body.pop("queue", None), body.pop("key", None)
    if action == "schedule":
        return TimerAction(index, action, timer_rules.schedule(
            body, queue, key, horizon_s=limits.timer_horizon_s,
            ceiling=limits.timer_payload_ceiling, where=where))
    if action == "cancel":
        txn = body.pop("txn", None)
        if body:
            raise ValidationError(
                "unknown_field", f"{where}: unknown field(s): {', '.join(sorted(body))}"
            )
        return TimerAction(
            index, action, None, log_rules.queue_name(queue, f"{where}.queue"),
            timer_rules.timer_key(key, f"{where}.key"),
            None if txn is None else log_rules.transaction_id(txn, f"{where}.txn"),
        )
    raise ValidationError("invalid_timer", f"{where}.action must be 'schedule' or 'cancel'",
                          timer=index)


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
                                         dedupe=i.client_transaction_id,
                                         payload_json=i.payload_json) for i in items]
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

    A timer that is being fired (too_late) aborts the bundle with 409 and every timer's
    answer; a cancel that finds nothing (absent) does not.
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
    outcomes: list[timer_store.Outcome] = []
    run: list[timer_rules.Schedule] = []  # consecutive schedules go in one schedule_many

    def flush() -> None:
        if run:
            outcomes.extend(timer_store.schedule_many(
                raw, tenant_id, run, notify_within_ms=limits.notify_within_ms))
            run.clear()

    for t in bundle.timers:
        if t.schedule is not None:
            run.append(t.schedule)
            continue
        flush()
        outcomes.append(timer_store.cancel(raw, tenant_id, t.queue, t.key, t.txn))
    flush()
    late = [i for i, o in enumerate(outcomes) if o.status == "too_late"]
    if late:
        raise Conflict(
            "timer_too_late",
            f"timers[{late[0]}] is being fired right now; the whole transaction was rolled back",
            timers=[timer_outcome_wire(o) for o in outcomes],
        )
    return results, outcomes


def timer_outcome_wire(o: timer_store.Outcome) -> dict[str, Any]:
    wire: dict[str, Any] = {"ok": o.ok, "status": o.status, "queue": o.queue, "key": o.key,
                            "txn": o.txn}
    if o.status in ("scheduled", "rescheduled"):
        wire["partition"] = o.partition
        wire["deliverAt"] = iso(o.deliver_at)
    return wire

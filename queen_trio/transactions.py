"""Atomic bundles: ``POST /api/v1/transaction``, Queen's wire.

The body has four top-level fields and no other (an unknown one is a 400, never dropped):
``operations`` (push, ack), ``kv`` (KV ops, as on ``POST /api/v1/kv`` but getPrefix), ``timers``
(Queen's timer operations, :func:`queen_trio.timers.rules.operation`) and ``requiredLeases``.
Everything is validated up front, then applied inside one PostgreSQL transaction: everything
commits or nothing does. A failure names the entry that caused it.

The KV ops go first (their row locks come before any partition's, as on every path that
takes both), so a gate (a ``required`` putIfAbsent, a lock's guard) that does not hold stops
the bundle before anything else is written: :class:`~queen_trio.kv.rules.PreconditionLost`
rolls it all back. ``requiredLeases`` must all be live when the bundle commits; an ack that
names no lease borrows the bundle's one required lease. An ack the broker cannot take (its
lease lost, its message unknown, already committed or never delivered) or a required lease
that is not live refuses the bundle whole: :class:`Refused`, which the route answers as Queen
does, 200 ``success: false`` with the text in ``error``. A timer that is being fired is
``too_late`` in its result, a verdict that does not abort the bundle.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

from .db import queries
from .db.rows import DictConnection
from .errors import ClientError, Conflict, ValidationError
from .kv import rules as kv_rules
from .kv import store as kv_store
from .log import rules as log_rules
from .log import store as log_store
from .models.timers import TimerOp
from .sealing import PayloadCipher
from .timers import rules as timer_rules
from .timers import store as timer_store

OPERATION_TYPES = ("push", "ack")
TOP_LEVEL = ("operations", "kv", "timers", "requiredLeases")
MAX_OPERATIONS = 1000
Q = queries.load("log")


@dataclasses.dataclass(frozen=True, slots=True)
class Operation:
    index: int
    type: str
    args: Any


@dataclasses.dataclass(frozen=True, slots=True)
class Bundle:
    operations: list[Operation]
    timers: list[timer_rules.Schedule | timer_rules.Cancel]
    kv: list[kv_rules.Op] = dataclasses.field(default_factory=list)
    required_leases: tuple[uuid.UUID, ...] = ()

    def schedules(self) -> bool:
        """Whether the ``timers`` rider schedules (or reschedules) a timer."""
        return any(isinstance(t, timer_rules.Schedule) for t in self.timers)

    def adds_storage(self) -> bool:
        return (any(op.type == "push" for op in self.operations)
                or any(op.kind in ("put", "putIfAbsent", "incr") for op in self.kv)
                or self.schedules())

    @property
    def kv_base(self) -> int:
        """Where the kv results start in the flat ``results``: after every pushed item and
        every ack, which come first as the client sent them."""
        return sum(len(op.args) if op.type == "push" else 1 for op in self.operations)


@dataclasses.dataclass(frozen=True, slots=True)
class Limits:
    message_ceiling: int
    timer_payload_ceiling: int
    timer_horizon_s: int
    notify_within_ms: int


class Refused(Exception):  # noqa: N818 - a verdict, not an error
    """The bundle was refused whole by the state it found (an ack or a required lease that no
    longer holds): nothing of it commits. ``failed_index`` is the refused ack's place in the
    flat results (None for a required lease)."""

    def __init__(self, cause: ClientError, failed_index: int | None = None) -> None:
        super().__init__(cause.message)
        self.cause = cause
        self.failed_index = failed_index


def _at(index: int, exc: ClientError) -> ClientError:
    """The same error, saying which operation it belongs to."""
    return type(exc)(exc.code, f"operations[{index}]: {exc.message}",
                     **{**exc.extra, "operation": index})


def _array(body: dict[str, Any], field: str) -> list[Any]:
    value = body.get(field)
    if value is None:  # what a serializer writes for an unused optional field
        return []
    if not isinstance(value, list):
        raise ValidationError("invalid_operations", f"{field} must be an array")
    return value


def parse(body: dict[str, Any], limits: Limits) -> Bundle:
    unknown = sorted(set(body) - set(TOP_LEVEL))
    if unknown:
        raise ValidationError(
            "unknown_field", f"unknown top-level field(s): {', '.join(unknown)}; a transaction "
                             f"takes {', '.join(TOP_LEVEL)}", fields=unknown)
    operations, kv, timers = (_array(body, f) for f in ("operations", "kv", "timers"))
    leases = tuple(log_rules.lease_id(lease, f"requiredLeases[{i}]")
                   for i, lease in enumerate(_array(body, "requiredLeases")))
    if not operations and not kv and not timers:
        raise ValidationError(
            "invalid_operations",
            "a transaction needs at least one entry in operations, kv or timers")
    if len(operations) + len(timers) > MAX_OPERATIONS:
        raise ValidationError("invalid_operations", f"at most {MAX_OPERATIONS} entries")
    # An ack that names no lease is fenced by the bundle's lease when there is exactly one.
    default_lease = leases[0] if len(set(leases)) == 1 else None
    return Bundle(
        [_parse_one(i, op, limits.message_ceiling, default_lease)
         for i, op in enumerate(operations)],
        _parse_timers(timers, limits),
        kv_rules.parse_call(kv, ceiling=limits.message_ceiling, in_transaction=True,
                            where="kv: "),
        leases,
    )


def _parse_timers(entries: list[Any], limits: Limits
                  ) -> list[timer_rules.Schedule | timer_rules.Cancel]:
    """The ``timers`` rider: Queen's timer operations, each timer at most once, as JSON dicts
    or already decoded into the wire's model (:class:`TimerOp`). A malformed one is Queen's 400
    ``timers_bad_request`` (our precise code as ``reason``)."""
    try:
        if all(isinstance(t, TimerOp) for t in entries):  # decoded into the wire's model
            timers = timer_rules.typed_operations(entries, "timers",
                                                  horizon_s=limits.timer_horizon_s,
                                                  ceiling=limits.timer_payload_ceiling)
        else:
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


def _parse_one(index: int, op: Any, ceiling: int, default_lease: uuid.UUID | None) -> Operation:
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
        if isinstance(kind, str) and kind.startswith("kv"):
            raise ValidationError(
                "kv_in_operations",
                "KV operations do not go in operations: put them in the top-level 'kv' array, "
                "beside 'operations' (as on POST /api/v1/kv: put, putIfAbsent, delete, incr, "
                "check, get, getMany)",
            )
        if kind == "push":
            items = log_rules.push_items({"items": op.get("items")}, ceiling)
            frames = [log_store.NewFrame(i.queue, i.partition, i.payload, i.transaction_id,
                                         dedupe=i.client_transaction_id,
                                         payload_json=i.payload_json) for i in items]
            return Operation(index, kind, frames)
        if kind == "ack":
            return Operation(index, kind, log_rules.ack(op, 0, default_lease=default_lease))
        raise ValidationError(
            "invalid_operation", f"type must be one of {', '.join(OPERATION_TYPES)}"
        )
    except ClientError as exc:
        raise _at(index, exc) from None


def execute(
    raw: DictConnection, tenant_id: int, bundle: Bundle, limits: Limits, *,
    cipher: PayloadCipher | None = None,
) -> tuple[list[Any], list[dict[str, Any]], list[timer_store.Outcome]]:
    """Apply the kv ops, every operation and timer in the caller's transaction; any error
    aborts all. Answers (per operation: Appended list or AckResult; the kv results; the timers'
    outcomes).

    A required kv op that does not hold raises PreconditionLost. A required lease that is not
    live, or an ack the broker cannot take, raises :class:`Refused`. A timer's verdict
    (too_late for one being fired, absent for a cancel that found nothing) is its answer, and
    the bundle commits.
    """
    # First, before any partition is locked: the kv rows, in key order (kv/rules.py).
    kv_results = kv_store.apply(raw, tenant_id, bundle.kv)
    # Before the acks, which release a lease they complete.
    _check_leases(raw, tenant_id, bundle.required_leases)
    results: list[Any] = []  # per operation type: Appended list or AckResult
    flat = 0  # the place of the operation's first result in the flat results
    for op in bundle.operations:
        try:
            if op.type == "push":
                results.append(log_store.append(raw, tenant_id, op.args, cipher=cipher))
            else:
                (result,) = log_store.ack(raw, tenant_id, [op.args])
                if result.refused is not None:  # a bundle commits whole or not at all
                    raise Refused(_at(op.index, result.refused), flat)
                results.append(result)
        except ClientError as exc:
            raise _at(op.index, exc) from None
        flat += len(results[-1]) if op.type == "push" else 1
    outcomes = timer_store.apply(raw, tenant_id, bundle.timers,
                                 notify_within_ms=limits.notify_within_ms, cipher=cipher)
    return results, kv_results, outcomes


def _check_leases(raw: DictConnection, tenant_id: int, leases: tuple[uuid.UUID, ...]) -> None:
    if not leases:
        return
    live = {r["lease_id"] for r in raw.execute(
        Q.live_leases, {"tenant_id": tenant_id, "lease_ids": list(set(leases))})}
    lost = [lease for lease in leases if lease not in live]
    if lost:
        raise Refused(Conflict(
            "lease_lost", f"requiredLeases: lease {lost[0]} has expired or was released",
            lease=str(lost[0])))

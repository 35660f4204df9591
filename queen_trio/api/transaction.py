"""POST /api/v1/transaction: pushes, acks, KV ops and timers committed together or not at all.

The answer's ``results`` is one flat array, as Queen's: every pushed item and every ack in the
order sent, then the ``kv`` results, then the ``timers`` results; ``failedIndex`` counts in that
space. A ``required`` KV op that does not hold answers 200 ``success: false, reason:
"kv_precondition"``, nothing committed. So does, as Queen's, a bundle refused whole by the
state it found (an ack under a lost lease, a required lease that is not live): 200
``success: false`` with the text in ``error``, our precise ``code`` beside it, nothing
written. A timer's ``too_late`` or ``absent`` is its result, not a failure.

``?answer=compact`` (our extension; the SDK asks for it when a bundle only schedules timers):
a bundle that only scheduled timers, all of them new names, is answered
:class:`~queen_trio.models.timers.TransactionScheduled`, its results told once (a few hundred
bytes where 500 results are ~115 KB); any other bundle as without it. ``?answer=full`` is the
default; any other value, or the parameter twice, is a 400 before anything is read or written.
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec.structs import asdict
from quart import Blueprint, Response, current_app, request

from .. import transactions
from ..context import BrokerContext
from ..errors import ApiError, ValidationError
from ..formats import iso
from ..kv.rules import PreconditionLost
from ..log import rules as log_rules
from ..models import codec
from ..models import timers as timer_models
from ..models import transaction as models
from ..switches import KV, TIMERS_SCHEDULE
from ..timers import rules as timer_rules
from ..timers import store as timer_store
from .common import model_response
from .errors import parse_json_body
from .kv import precondition_answer, result_models
from .log import ack_result, pushed
from .switches import paused
from .tenancy import current_tenant_id, storage_gate
from .timers import count_outcomes, outcome_models

transaction_routes = Blueprint("transaction", __name__, url_prefix="/api/v1")


def _flat_results(bundle: transactions.Bundle, results: list[Any],
                  kv_results: list[dict[str, Any]], outcomes: list[Any]
                  ) -> list[models.TransactionItem]:
    flat: list[models.TransactionItem] = []
    for op, result in zip(bundle.operations, results, strict=True):
        if op.type == "push":
            flat += [models.TxPushed(**asdict(pushed(len(flat) + i, a)), operation=op.index)
                     for i, a in enumerate(result)]
        else:
            flat.append(models.TxAcked(**{**asdict(ack_result(result)), "index": len(flat)},
                                       operation=op.index))
    base = len(flat)
    flat += [models.TxKv(**{**asdict(r), "index": base + r.index},
                         op=r.__struct_config__.tag)  # type: ignore[arg-type]
             for r in result_models(kv_results)]
    flat += outcome_models(outcomes, models.TxTimer, len(flat))
    return flat


def _refused(refusal: transactions.Refused, transaction_id: str
             ) -> models.TransactionRefused:
    """Queen's answer to a bundle refused whole: 200, ``success: false``, the text in
    ``error`` (queen-mq raises it), nothing written."""
    cause = refusal.cause
    text = f"{cause.message}; the transaction rolled back, nothing of it was written"
    extra = cause.extra
    return models.TransactionRefused(
        ok=False, success=False, transaction_id=transaction_id, error=text,
        code=cause.code,  # type: ignore[arg-type]
        message=text, detail=text, results=[],
        failed_index=msgspec.UNSET if refusal.failed_index is None else refusal.failed_index,
        operation=extra.get("operation", msgspec.UNSET), lease=extra.get("lease", msgspec.UNSET))


def _paused_rider(bundle: transactions.Bundle, broker: BrokerContext
                  ) -> models.TransactionPaused | None:
    """403 for a bundle whose rider uses a surface an operator has paused: a ``kv`` rider
    while ``kv_enabled`` is off, a ``timers`` rider that schedules while
    ``timers_schedule_enabled`` is off (cancels are never paused). Permanent on purpose, as
    Queen's: a bundle carries messages, and one retried in a loop against a paused broker is a
    storm on the hot path. The code is in ``error`` and in ``reason`` (where Queen's clients
    read a transaction's)."""
    switches = broker.switches
    if bundle.kv and not switches.kv:
        name = KV
    elif not switches.timers_schedule and bundle.schedules():
        name = TIMERS_SCHEDULE
    else:
        return None
    refusal = paused(name, status=403)
    return models.TransactionPaused(
        ok=False, success=False, transaction_id=log_rules.new_transaction_id(),
        error=refusal.code, message=refusal.message,  # type: ignore[arg-type]
        reason=refusal.extra["reason"], results=[])


def _schedules_only(bundle: transactions.Bundle) -> list[timer_rules.Schedule] | None:
    """The bundle's timers if it only schedules timers (no push, ack, KV op, required lease
    or cancel): then it is one statement, its own transaction. None otherwise."""
    if bundle.operations or bundle.kv or bundle.required_leases or not bundle.timers:
        return None
    schedules = [t for t in bundle.timers if type(t) is timer_rules.Schedule]
    return schedules if len(schedules) == len(bundle.timers) else None


def _bundle_builtins(decoded: models.Bundle) -> dict[str, Any]:
    """A decoded bundle as the dicts the rules read, its timers left as models
    (transactions._parse_timers takes them as they are: a bundle of 500 timers as dicts cost
    more to check than to commit)."""
    timers, decoded.timers = decoded.timers, msgspec.UNSET
    body: dict[str, Any] = msgspec.to_builtins(decoded)
    if timers is not msgspec.UNSET:
        body["timers"] = timers
    return body


def _compact_asked() -> bool:
    """Whether the request asked for the compact answer (``?answer=compact``); a 400 for
    anything but ``compact`` or ``full``, once."""
    asked = request.args.getlist("answer")
    if not asked:
        return False
    if len(asked) > 1 or asked[0] not in ("compact", "full"):
        raise ValidationError("invalid_parameter",
                              "answer must be given once, as compact or full")
    return asked[0] == "compact"


def _compact(outcomes: timer_store.AllScheduled, transaction_id: str
             ) -> timer_models.TransactionScheduled:
    """The compact answer to a bundle whose timers were all new names (see the module)."""
    return timer_models.TransactionScheduled(
        success=True, transaction_id=transaction_id, scheduled=timer_models.TimersScheduled(
            count=len(outcomes), now=iso(outcomes.now),  # type: ignore[arg-type]
            message_id_base=outcomes.base_id,  # type: ignore[arg-type]
            default_partition=log_rules.DEFAULT_PARTITION))


@transaction_routes.post("/transaction")
async def transaction() -> Response:
    compact = _compact_asked()
    raw = await request.get_data(cache=False, as_text=False)
    model, status = await apply_transaction(
        current_app.config["BROKER"], current_tenant_id(),
        raw.encode() if isinstance(raw, str) else raw, compact=compact)
    return model_response(model, status)


def bundle_object(raw: bytes) -> dict[str, Any]:
    """The request body as the rules read it: through the bundle's model first, else the
    strict decoder (the answers of :func:`.errors.read_object_via`)."""
    decoded = codec.fast(raw, models.BUNDLE_DECODER)
    body = parse_json_body(raw) if decoded is codec.FALLBACK else _bundle_builtins(decoded)
    if not isinstance(body, dict):
        raise ApiError(400, "invalid_body", "the request body must be a JSON object")
    return body


async def apply_transaction(broker: BrokerContext, tenant_id: int, raw: bytes, *,
                            compact: bool) -> tuple[Any, int]:
    """``POST /api/v1/transaction`` once the request is admitted and its body read (Quart's
    route, and :mod:`.fast`'s): the answer's model and its status."""
    body = bundle_object(raw)
    settings = broker.settings
    ceiling = broker.tenants.message_ceiling(tenant_id)
    limits = transactions.Limits(
        message_ceiling=ceiling,
        timer_payload_ceiling=settings.timer_payload_ceiling(ceiling),
        timer_horizon_s=settings.timers_max_horizon_s,
        notify_within_ms=settings.sweeper_max_sleep_ms,
    )
    bundle = transactions.parse(body, limits)
    refused = _paused_rider(bundle, broker)
    if refused is not None:
        return refused, 403
    if bundle.adds_storage():
        storage_gate(broker, tenant_id)  # (the route is not one never refused)
    transaction_id = log_rules.new_transaction_id()
    metrics = broker.metrics
    if (schedules := _schedules_only(bundle)) is not None:
        # One statement commits them all (queen.schedule_timer_list), as on POST
        # /api/v1/timers: in autocommit, without a BEGIN and a COMMIT round trip around it.
        outcomes = await broker.schedules.schedule_many(tenant_id, schedules)
        count_outcomes(outcomes, schedules, metrics)
        if compact and type(outcomes) is timer_store.AllScheduled:
            return _compact(outcomes, transaction_id), 200
        flat: list[models.TransactionItem] = []
        flat += outcome_models(outcomes, models.TxTimer, 0)
        return models.TransactionDone(
            success=True, transaction_id=transaction_id, results=flat), 200
    try:
        results, kv_results, outcomes = await broker.db.run_transaction(
            transactions.execute, tenant_id, bundle, limits, cipher=broker.cipher
        )
    except PreconditionLost as lost:
        return precondition_answer(lost, bundle.kv_base + lost.result["index"],
                                   transaction_id), 200
    except transactions.Refused as refusal:
        return _refused(refusal, transaction_id), 200
    operations = bundle.operations
    count_outcomes(outcomes, bundle.timers, metrics)
    for op, result in zip(operations, results, strict=True):
        if op.type == "push":
            metrics.count_pushed(tenant_id, (appended.status for appended in result))
        elif op.type == "ack" and not result.already_acked:
            metrics.count_acks(tenant_id, (result.status,))
    return models.TransactionDone(
        success=True, transaction_id=transaction_id,
        results=_flat_results(bundle, results, kv_results, outcomes)), 200

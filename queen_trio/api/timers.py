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
from collections.abc import Sequence
from datetime import datetime
from itertools import count
from typing import Any, TypeVar

import msgspec
from quart import Blueprint, Response, request

from ..context import BrokerContext
from ..errors import ValidationError
from ..formats import iso, iso_all
from ..log import rules as log_rules
from ..metrics import BrokerMetrics
from ..models import timers as models
from ..timers import rules, store
from .common import Later, count_later, model_response
from .common import broker as _broker
from .errors import install_family_errors, parse_json_body, read_json_object
from .switches import require_timers_schedule
from .tenancy import (
    current_tenant_id,
    enforce_storage_gate,
    message_ceiling,
    never_refused,
    storage_gate,
)

timer_routes = Blueprint("timers", __name__, url_prefix="/api/v1/timers")
R = TypeVar("R", bound=models.TimerResult)


install_family_errors(timer_routes, "timers_bad_request")


def payload_ceiling() -> int:
    return _broker().settings.timer_payload_ceiling(message_ceiling())


def _horizon_s() -> int:
    return _broker().settings.timers_max_horizon_s


def outcome_models(outcomes: list[store.Outcome], model: type[R] = models.TimerResult,  # type: ignore[assignment]
                   first_index: int | None = None) -> list[R]:
    """The results of Queen's timer wire (a batch, a bundle, a PUT or a DELETE) as ``model``
    (:class:`TimerResult`, or :class:`TxTimer` numbered from ``first_index``): a bundle makes
    500 of them."""
    stamps = _isos([o.deliver_at for o in outcomes])
    # One constructor call per timer, the fields a verdict (absent, too_late) or a cancel
    # lacks are None in its outcome, as the model's defaults (omitted from the answer).
    # (make is Any: an outcome's status is a plain str, the model's a Literal)
    ok: frozenset[str] = _OK
    make: Any = model
    if first_index is None:
        return [make(ok=o.status in ok, status=o.status, queue=o.queue, timer_key=o.key,
                      txn=o.txn, message_id=o.message_id, deliver_at=at, partition=o.partition)
                for o, at in zip(outcomes, stamps, strict=True)]
    return [make(ok=o.status in ok, status=o.status, queue=o.queue, timer_key=o.key,
                  txn=o.txn, message_id=o.message_id, deliver_at=at, partition=o.partition,
                  index=index)
            for index, o, at in zip(count(first_index), outcomes, stamps)]


_OK = frozenset(("scheduled", "rescheduled", "cancelled"))  # as store.Outcome.ok


def outcome_model(o: store.Outcome) -> models.TimerResult:
    """One result of Queen's timer wire, as its model."""
    return outcome_models([o])[0]


def _isos(stamps: list[datetime | None]) -> list[str | None]:
    """:func:`~queen_trio.formats.iso` of each, the instants written in one pass
    (:func:`~queen_trio.formats.iso_all`; isoformat costs two µs an instant here)."""
    texts = iter(iso_all([at for at in stamps if at is not None]))
    return [None if at is None else next(texts) for at in stamps]


def count_outcomes(outcomes: list[store.Outcome], ops: Sequence[rules.Schedule | rules.Cancel],
                   metrics: BrokerMetrics | None = None) -> None:
    metrics = metrics or _broker().metrics
    if type(outcomes) is store.AllScheduled:  # (a bundle of new names: every one scheduled)
        metrics.timers_scheduled.labels("scheduled").inc(len(outcomes))
        return
    counts = Counter((isinstance(op, rules.Schedule), o.status)
                     for op, o in zip(ops, outcomes, strict=True))
    for (scheduled, status), n in counts.items():
        counter = metrics.timers_scheduled if scheduled else metrics.timers_cancelled
        counter.labels(status).inc(n)


@timer_routes.post("")
async def batch() -> Response:
    raw = await request.get_data(as_text=False)
    return model_response(await apply_batch(
        _broker(), current_tenant_id(), raw.encode() if isinstance(raw, str) else raw))


async def apply_batch(broker: BrokerContext, tenant_id: int, raw: bytes,
                      later: Later = None) -> models.TimerResults:
    """``POST /api/v1/timers`` once the request is admitted and its body read (Quart's route,
    and :mod:`.fast`'s). ``later``: where the outcomes' counting goes to be done once the
    answer is written (:mod:`.fast`), rather than now."""
    horizon_s = broker.settings.timers_max_horizon_s
    ceiling = broker.settings.timer_payload_ceiling(broker.tenants.message_ceiling(tenant_id))
    ops = rules.operations_from_bytes(raw, horizon_s=horizon_s, ceiling=ceiling)
    if ops is None:  # not a clean body: the strict decoder and the rules say what is wrong
        ops = rules.operations(parse_json_body(raw), horizon_s=horizon_s, ceiling=ceiling)
    if any(isinstance(op, rules.Schedule) for op in ops):
        # Paused by an operator: refused whole, as Queen does (cancels alone never are, and
        # DELETE cancels whatever the switches say).
        require_timers_schedule(broker)
        # A batch that schedules is refused whole past the gate; cancels alone never are
        # (and DELETE is the route that cancels whatever the gate says).
        storage_gate(broker, tenant_id)
    outcomes = await _apply(broker, tenant_id, ops)
    count_later(later, count_outcomes, outcomes, ops, broker.metrics)
    return models.TimerResults(outcome_models(outcomes))


async def _apply(broker: BrokerContext, tenant_id: int, ops: list[rules.Schedule | rules.Cancel]
                 ) -> list[store.Outcome]:
    if not ops:
        return []
    schedules = [op for op in ops if isinstance(op, rules.Schedule)]
    cancels = [op for op in ops if isinstance(op, rules.Cancel)]
    if not cancels:
        # Shares a statement and a commit with the schedules arriving alongside it.
        return await broker.schedules.schedule_many(tenant_id, schedules)
    within = broker.settings.sweeper_max_sleep_ms
    if not schedules:
        return await broker.db.run_autocommit(store.cancel_many, tenant_id, cancels)
    return await broker.db.run_transaction(store.apply, tenant_id, ops, notify_within_ms=within,
                                           cipher=broker.cipher)


@timer_routes.put("/<queue>/<name:key>")
async def schedule_put(queue: str, key: str) -> Response:
    broker = _broker()
    require_timers_schedule(broker)
    enforce_storage_gate()
    s = rules.schedule(await read_json_object(), queue, key, horizon_s=_horizon_s(),
                       ceiling=payload_ceiling())
    outcome = await broker.schedules.schedule(current_tenant_id(), s)
    broker.metrics.timers_scheduled.labels(outcome.status).inc()
    return model_response(outcome_model(outcome))


@timer_routes.delete("/<queue>/<name:key>")
@never_refused  # a tenant must always be able to stop a message it no longer wants
async def cancel(queue: str, key: str) -> Response:
    return model_response(await cancel_one(_broker(), current_tenant_id(), queue, key,
                                           request.args.get("txn") or None))


async def cancel_one(broker: BrokerContext, tenant_id: int, queue: str, key: str,
                     txn: str | None, later: Later = None) -> models.TimerResult:
    """``DELETE /api/v1/timers/{queue}/{key}`` once the request is admitted (Quart's route,
    and :mod:`.fast`'s); ``later`` as :func:`apply_batch`'s."""
    if txn is not None:
        txn = log_rules.transaction_id(txn, "txn")
    outcome = await store.cancel_lone(
        broker.db, tenant_id, log_rules.queue_name(queue), rules.timer_key(key), txn)
    count_later(later, broker.metrics.timers_cancelled.labels(outcome.status).inc)
    return outcome_model(outcome)


def _timer_fields(queue: str, row: dict[str, Any], encrypted: bool = False
                  ) -> dict[str, Any]:
    return {
        "queue": queue, "timer_key": row["timer_key"], "partition": row["partition"],
        "deliver_at": iso(row["deliver_at"]), "txn": row["txn"],
        "message_id": row["message_id"], "payload_zstd": row["payload_zstd"],
        "encrypted": encrypted, "producer_sub": None, "attempts": row["attempts"],
        "last_error": row["last_error"], "claimed": row["claimed"],
        "created_at": iso(row["created_at"]), "updated_at": iso(row["updated_at"]),
    }


@timer_routes.get("/<queue>/<name:key>")
async def peek(queue: str, key: str) -> Response:
    q, k = log_rules.queue_name(queue), rules.timer_key(key)
    row = await _broker().db.run_autocommit(store.peek, current_tenant_id(), q, k)
    if row is None:
        return model_response(models.TimerMissing(found=False, queue=q, timer_key=k))
    blob, zstd = bytes(row["payload"]), row["payload_zstd"]
    try:  # (our extension: the payload decoded, as a popped message's data will be)
        text: str | None = rules.unpack_text(blob, zstd)
    except ValueError:
        text = None
    # A sealed payload (encryptionEnabled) is shown opened, as its fire will deliver it;
    # encrypted says it is stored sealed.
    cipher = _broker().cipher
    opened = None if cipher is None or text is None else cipher.open_text(json.loads(text))
    if opened is not None:
        blob, zstd, text = opened.encode(), False, opened
    fields = _timer_fields(q, row, encrypted=opened is not None)
    fields["payload_zstd"] = zstd
    data = msgspec.Raw(b"null" if text is None else text.encode())
    return model_response(models.TimerFound(found=True, **fields,
                                            payload=base64.b64encode(blob).decode(), data=data))


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
        n = await db.run_autocommit(store.count_timers, tenant_id, q, prefix)
        return model_response(models.TimerCount(q, prefix, n))
    if mode != "list":
        raise ValidationError("invalid_parameter", f"mode must be list or count, not {mode!r}")
    after = rules.timer_key(args["after"], "after") if args.get("after") else ""
    limit = rules.list_limit(args.get("limit"))
    rows, truncated = await db.run_autocommit(store.list_timers, tenant_id, q, after, limit)
    return model_response(models.TimerPage(
        [models.TimerRow(**_timer_fields(q, r)) for r in rows], truncated,
        rows[-1]["timer_key"] if truncated else None))

"""The log's HTTP routes (Queen v1 wire): configure, push, pop, ack, leases, dead letters,
queue resources."""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import UNSET
from quart import Blueprint, Response, request

from ..context import BrokerContext
from ..errors import ValidationError
from ..formats import iso, iso_all, message_id
from ..log import admin as log_admin
from ..log import longpoll, rules, store
from ..log.wakeups import ParkLimit, QueueWakeups
from ..models import log as models
from ..sealing import PayloadCipher, opened
from .common import Later, count_later, model_response
from .common import broker as _broker
from .common import json_response as _json
from .errors import ApiError, read_object_via
from .tenancy import current_tenant_id, enforce_storage_gate, message_ceiling

log_routes = Blueprint("log", __name__, url_prefix="/api/v1")


# -- configure & push -------------------------------------------------------------------------


@log_routes.post("/configure")
async def configure() -> Response:
    """Queen's answer (``configured``, ``queue``, ``namespace``, ``task``, ``partitionId`` of
    the Default partition, ``options`` with every option Queen echoes), plus ``created`` and
    ``ignored``: the options sent that this broker does not act on, and unknown names (also
    listed in ``unknown``). Options it cannot honour safely are refused with a 400."""
    body = await read_object_via(models.CONFIGURE_DECODER)
    name, req = rules.configure_request(body)
    broker = _broker()
    if req.options.encryption_enabled and broker.cipher is None:
        raise ValidationError(
            "encryption_key_missing",
            "encryptionEnabled: this broker has no encryption key; start it with "
            "QUEEN_ENCRYPTION_KEY (64 hexadecimal digits) to store this queue's payloads sealed",
        )
    outcome = await broker.db.run_transaction(store.configure, current_tenant_id(), name,
                                              req.options)
    return model_response(models.Configured(
        configured=True, created=outcome["created"], queue=name,
        queueId=str(outcome["queue_id"]), partitionId=str(outcome["partition_id"]),
        namespace=body.get("namespace") or "", task=body.get("task") or "",
        options=models.ConfiguredOptions(**req.echo), ignored=req.ignored,
        unknown=req.unknown))


def appended_to_wire(index: int, a: store.Appended) -> dict[str, Any]:
    """:func:`pushed` as a dict (a transaction's answer extends it)."""
    return msgspec.structs.asdict(pushed(index, a))


def pushed(index: int, a: store.Appended) -> models.Pushed:
    pid = str(a.partition_id)
    return models.Pushed(
        index=index, status=a.status,  # type: ignore[arg-type]
        transactionId=a.transaction_id, partitionId=pid, queue=a.queue,
        partition=a.partition, offset=a.offset, messageId=a.message_id,
        message_id=a.message_id, transaction_id=a.transaction_id, partition_id=pid,
        queueName=a.queue)


@log_routes.post("/push")
async def push() -> Response:
    enforce_storage_gate()
    body = await read_object_via(models.PUSH_DECODER)
    return model_response(await apply_push(_broker(), current_tenant_id(), body,
                                           message_ceiling()), status=201)


async def apply_push(broker: BrokerContext, tenant: int, body: dict[str, Any], ceiling: int,
                     later: Later = None) -> list[models.Pushed]:
    """``POST /api/v1/push`` once the request is admitted, past the storage gate and its body
    decoded (Quart's route, and :mod:`.fast`'s); answered 201, an empty push too (as Queen).
    ``later``: where its counting goes (:func:`.common.count_later`)."""
    # Only each payload's JSON text is kept past here, not the decoded body: one copy less of
    # a large message while it travels to PostgreSQL.
    frames = [
        store.NewFrame(i.queue, i.partition, None, i.transaction_id,
                       dedupe=i.client_transaction_id, payload_json=i.payload_json)
        for i in rules.push_items(body, ceiling)
    ]
    if not frames:
        return []
    notifier = broker.notifier
    # The common push is one statement; the general append takes the rest (encryption,
    # maxSize, a duplicate of a sealed frame).
    appended = await store.append_head(broker.db, tenant, frames, notify=notifier is None)
    if appended is None:
        appended = await broker.db.run_transaction(store.append, tenant, frames,
                                                   cipher=broker.cipher, notify=notifier is None)
    if notifier is not None:  # committed: wake the queues' pops without holding up others
        for key in store.wake_keys(tenant, frames):
            notifier.notify(store.NOTIFY_CHANNEL, key)
    count_later(later, broker.metrics.count_pushed, tenant, [a.status for a in appended])
    return [pushed(i, a) for i, a in enumerate(appended)]


# -- pop --------------------------------------------------------------------------------------


def messages_to_wire(batch: store.PopBatch,
                     cipher: PayloadCipher | None = None) -> list[models.Message]:
    """``batch``'s messages as the pop answers them; ``cipher``: the broker's (payloads
    sealed at rest are opened)."""
    pid = str(batch.partition_id)
    lease = None if batch.lease_id is None else str(batch.lease_id)
    # The instants formatted in one pass (formatting them one by one was the largest cost of
    # a 500-message answer; the frames of a burst's fires rarely share theirs).
    messages = batch.messages
    stamps = iso_all([m.created_at for m in messages])
    out = []
    for m, created in zip(messages, stamps, strict=True):
        meta = m.meta
        out.append(models.Message(
            id=message_id(pid, m.offset, meta), transactionId=m.transaction_id,
            partitionId=pid, partition=batch.partition, queue=batch.queue, offset=m.offset,
            leaseId=lease, consumerGroup=batch.group,
            data=m.payload if cipher is None else opened(cipher, store.payload_value(m)),
            createdAt=created, retryCount=m.retry_count,
            deliveryAttempt=batch.delivery_attempt,
            timer=meta["timer"] if meta and "timer" in meta else UNSET))
    return out


@log_routes.get("/pop/queue/<queue>")
async def pop_queue(queue: str) -> Response:
    return await _pop(queue, None)


@log_routes.get("/pop/queue/<queue>/partition/<partition>")
async def pop_partition(queue: str, partition: str) -> Response:
    return await _pop(queue, partition)


@log_routes.post("/pop/queue/<queue>")
async def settle_and_pop_queue(queue: str) -> Response:
    return await _settle_and_pop(queue, None)


@log_routes.post("/pop/queue/<queue>/partition/<partition>")
async def settle_and_pop_partition(queue: str, partition: str) -> Response:
    return await _settle_and_pop(queue, partition)


async def _settle_and_pop(queue: str, partition: str | None) -> Response:
    """A pop that first settles what the consumer finished (``acknowledgments``, as for
    ``/ack/batch``, where a top-level ``partitionId`` and ``leaseId`` stand in for the ones
    an entry leaves out): one round trip per batch instead of an ack and a pop. The acks
    commit first, at the pop's commit level, each with its verdict as on ``/ack/batch``;
    refused ones (a lost lease, an unknown message) do not stop the pop and come back in
    ``ackRefused`` (:func:`ack_result`, the others are only counted). The answer is always
    200, with ``messages`` empty when nothing was ready and ``acks`` counting what the acks
    did (:func:`ack_summary`)."""
    req = await _resolved(rules.pop_request(queue, partition, dict(request.args)))
    body = await read_object_via(models.SETTLE_DECODER, optional=True)
    acks = rules.ack_batch(body) if body.get("acknowledgments", []) != [] else []
    broker = _broker()
    results: list[store.AckResult] = []
    if acks:
        results = await settle(acks, sync_commit=broker.settings.pop_commit_sync)
    wait_refused: models.WaitRefused | None = None
    try:
        batches = await _pop_batches(req)
    except WaitRefused as refused:
        if not acks:
            raise
        # The acks have committed: say so (a client must not send them again), and why
        # nothing waited; its next pop, with nothing to settle, is refused outright.
        wait_refused = models.WaitRefused(status=refused.status, error=refused.code,
                                          message=refused.message, **refused.extra)
        batches = []
    answer = batches_to_wire(req, batches, _broker().cipher) if batches else empty_answer(req)
    answer.acks = ack_summary(results)
    refused_acks = [ack_result(r) for r in results if r.refused is not None]
    if refused_acks:
        answer.ackRefused = refused_acks
    if wait_refused is not None:
        answer.waitRefused = wait_refused
    return model_response(answer)


async def _pop(queue: str, partition: str | None) -> Response:
    req = await _resolved(rules.pop_request(queue, partition, dict(request.args)))
    batches = await _pop_batches(req)
    if not batches:
        if req.conflation or req.conflation_conflict:
            # Queen says so on empty answers too: its clients check every one.
            return model_response(empty_answer(req))
        return Response(b"", status=204)
    return model_response(batches_to_wire(req, batches, _broker().cipher))


async def _resolved(req: rules.PopRequest) -> rules.PopRequest:
    """``req`` under its consumer group's conflation policy, then sized (:func:`_sized`)."""
    if req.group != rules.QUEUE_MODE_GROUP:
        broker = _broker()
        tenant = current_tenant_id()
        conflation = broker.group_policies.get(tenant, req.queue, req.group)
        if conflation is None:
            conflation = await broker.db.run_transaction(
                store.group_conflation, tenant, req.queue, req.group, req.conflation_asked)
            broker.group_policies.put(tenant, req.queue, req.group, conflation)
        req = rules.with_group_policy(req, conflation)
    return _sized(req)


def _sized(req: rules.PopRequest) -> rules.PopRequest:
    """Pop autopilot: the dimensions the client left to the broker (rules.autopilot_sizing),
    shared among the pops of the same lane waiting here."""
    if not (req.auto_batch or req.auto_partitions):
        return req
    key = store.wake_key(current_tenant_id(), req.queue)
    return rules.autopilot_sizing(req, _broker().wakeups.pops_in_lane(key, req))


def empty_answer(req: rules.PopRequest) -> models.PopResponse:
    return pop_echo(req, models.PopResponse(
        success=True, queue=req.queue, partition=None, partitionId=None, leaseId=None,
        leaseExpiresAt=None, consumerGroup=req.group, messages=[], skipped=None,
        partitions=[] if req.partitions > 1 else UNSET))


def pop_echo(req: rules.PopRequest, answer: models.PopResponse) -> models.PopResponse:
    """``answer`` saying how it was served: Queen's ``autopilot`` (the sizes the broker
    chose), ``conflation`` (present, true, only when the group's policy conflates) and
    ``conflationConflict`` (present, true, when the pop asked for the other policy)."""
    if req.auto_batch or req.auto_partitions:
        answer.autopilot = models.Autopilot(req.partitions, req.batch)
    if req.conflation:
        answer.conflation = True
    if req.conflation_conflict:
        answer.conflationConflict = True
    return answer


async def _pop_batches(req: rules.PopRequest) -> list[store.PopBatch]:
    """The pop (log/longpoll.py), for the request's tenant; past a bound on parked pops it is
    refused instead of waiting (429 for its tenant, 503 for the broker)."""
    try:
        return await longpoll.pop_batches(_broker(), current_tenant_id(), req)
    except ParkLimit as limit:
        raise WaitRefused.over(limit) from None


class WaitRefused(ApiError):
    """A pop found nothing and may not wait: a bound on waiting pops is reached."""

    @classmethod
    def over(cls, limit: ParkLimit) -> WaitRefused:
        if limit.scope == "tenant":
            return cls(
                429, "too_many_waiting_pops",
                f"this tenant already has {limit.limit} pops waiting for messages "
                "(QUEEN_LONGPOLL_MAX_PARKED_PER_TENANT); retry later, or pop without wait",
                headers={"Retry-After": "1"}, limit=limit.limit)
        return cls(
            503, "broker_waiting_pops_full",
            f"this broker already has {limit.limit} pops waiting for messages "
            "(QUEEN_LONGPOLL_MAX_PARKED); retry later, or on another broker",
            headers={"Retry-After": "1"}, limit=limit.limit)


def batches_to_wire(req: rules.PopRequest, batches: list[store.PopBatch],
                    cipher: PayloadCipher | None) -> models.PopResponse:
    """A pop's answer. A pop asking for several partitions (``partitions`` above 1) lists
    them in ``partitions``; as in Queen, all of them are held under one lease (the top-level
    ``leaseId``, also on every message), which one extension renews and whose acks act on
    each partition. Every message carries its partitionId, which acks name. The top-level
    partition is that of the only partition when there is one, null when there are several."""
    if req.partitions == 1:
        return pop_echo(req, batch_to_wire(batches[0], cipher))
    first = batches[0]
    wire = batch_to_wire(first, cipher) if len(batches) == 1 else models.PopResponse(
        success=True, queue=req.queue, partition=None, partitionId=None,
        leaseId=None if first.lease_id is None else str(first.lease_id),
        leaseExpiresAt=iso(first.lease_expires_at), consumerGroup=req.group,
        messages=[m for b in batches for m in messages_to_wire(b, cipher)],
        skipped=None)
    wire.partitions = [
        models.PopPartition(
            partition=b.partition, partitionId=str(b.partition_id),
            leaseId=None if b.lease_id is None else str(b.lease_id),
            leaseExpiresAt=iso(b.lease_expires_at), messages=len(b.messages),
            skipped=skip_to_wire(b.skipped))
        for b in batches
    ]
    return pop_echo(req, wire)


def batch_to_wire(batch: store.PopBatch, cipher: PayloadCipher | None) -> models.PopResponse:
    return models.PopResponse(
        success=True, queue=batch.queue, partition=batch.partition,
        partitionId=str(batch.partition_id),
        leaseId=None if batch.lease_id is None else str(batch.lease_id),
        leaseExpiresAt=iso(batch.lease_expires_at), consumerGroup=batch.group,
        messages=messages_to_wire(batch, cipher),
        skipped=skip_to_wire(batch.skipped))


def skip_to_wire(skip: store.Skip | None) -> models.Skipped | None:
    """Offsets the group never received: retention dropped them before it got there."""
    if skip is None:
        return None
    return models.Skipped(skip.from_offset, skip.to_offset, skip.count)


# -- ack & leases -----------------------------------------------------------------------------


def ack_summary(results: list[store.AckResult]) -> models.AckSummary:
    """What a pop's acknowledgements did, counted (the client knows which it sent, in order):
    newly applied ones by status, repeats (``alreadyAcked``), refused ones, dead letters, and
    whether a lease was released."""
    out: dict[str, Any] = {"count": len(results), **dict.fromkeys(rules.ACK_STATUSES, 0),
                           "alreadyAcked": 0, "refused": 0, "deadLettered": 0,
                           "leaseReleased": any(r.lease_released for r in results)}
    for r in results:
        if r.refused is not None:
            out["refused"] += 1
        elif r.already_acked:
            out["alreadyAcked"] += 1
        else:
            out[r.status] += 1
        out["deadLettered"] += r.dead_lettered
    return models.AckSummary(**out)


# Queen's words for a refused acknowledgement (its clients read ``error``): one for a lease
# that is not live, one for everything else it cannot resolve or honour.
_QUEEN_ACK_ERRORS = {"lease_lost": "invalid or expired lease"}
_QUEEN_ACK_STALE = ("transaction is unresolvable, already committed, or acknowledgment is "
                    "stale")


def ack_result(r: store.AckResult) -> models.AckResult:
    """One acknowledgement's verdict, as Queen answers it (``success``, ``error``,
    ``leaseReleased``, ``dlq``, ``noop``), with ``code`` and ``detail`` saying precisely why
    a refused one was refused."""
    refused = r.refused
    return models.AckResult(
        index=r.index, transactionId=r.transaction_id, partitionId=str(r.partition_id),
        status=r.status, success=refused is None,
        error=None if refused is None else _QUEEN_ACK_ERRORS.get(refused.code, _QUEEN_ACK_STALE),
        code=None if refused is None else refused.code,  # type: ignore[arg-type]
        detail=None if refused is None else refused.message,
        queueName=r.queue, partitionName=r.partition, leaseReleased=r.lease_released,
        dlq=r.dead_lettered, noop=r.already_acked, alreadyAcked=r.already_acked)


async def settle(acks: list[rules.Ack], *, sync_commit: bool = True) -> list[store.AckResult]:
    """Apply acknowledgements, each with its verdict: the common case in one statement, the
    rest through the general ack."""
    return await settle_for(_broker(), current_tenant_id(), acks, sync_commit=sync_commit)


async def settle_for(broker: BrokerContext, tenant: int, acks: list[rules.Ack], *,
                     sync_commit: bool = True, later: Later = None) -> list[store.AckResult]:
    """:func:`settle` for ``tenant``, outside a request context (:mod:`.fast`); ``later``:
    where its counting goes (:func:`.common.count_later`)."""
    results = await broker.db.run_autocommit(_ack_head_noted, broker.wakeups, tenant, acks,
                                             sync_commit)
    if results is None:
        results = await broker.db.run_transaction(store.ack, tenant, acks)
    count_later(later, broker.metrics.count_acks, tenant,
                [r.status for r in results if r.applied])
    dead = sum(r.dead_lettered for r in results)
    if dead:
        count_later(later, broker.metrics.dead_lettered.inc, dead)
    return results


def _ack_head_noted(raw: Any, wakeups: QueueWakeups, tenant: int, acks: list[rules.Ack],
                    sync_commit: bool) -> list[store.AckResult] | None:
    """:func:`store.ack_head`, its NOTIFY (sent when it frees the partition) noted as this
    broker's own (log/wakeups.py): the pop the consumer sends next looks after it, and the
    NOTIFY is no news to it."""
    mark = wakeups.expect_own_notify(raw.info.backend_pid)
    key = None
    try:
        results = store.ack_head(raw, tenant, acks, sync_commit=sync_commit)
        if results and results[0].lease_released and results[0].queue is not None:
            key = store.wake_key(tenant, results[0].queue)
        return results
    finally:
        wakeups.own_notify_sent(mark, key)


@log_routes.post("/ack")
async def ack() -> Response:
    """Always 200 once the body is valid: each acknowledgement says whether it was taken."""
    body = await read_object_via(models.ACK_DECODER)
    return model_response(await apply_ack(_broker(), current_tenant_id(), body))


async def apply_ack(broker: BrokerContext, tenant: int, body: dict[str, Any],
                    later: Later = None) -> list[models.AckResult]:
    """``POST /api/v1/ack`` once the request is admitted and its body decoded (Quart's route,
    and :mod:`.fast`'s)."""
    return [ack_result(r) for r in await settle_for(broker, tenant, [rules.ack(body, 0)],
                                                    later=later)]


@log_routes.post("/ack/batch")
async def ack_batch() -> Response:
    body = await read_object_via(models.ACK_BATCH_DECODER)
    return model_response([ack_result(r) for r in await settle(rules.ack_batch(body))])


@log_routes.post("/lease/<lease_id>/extend")
async def extend_lease(lease_id: str) -> Response:
    """Queen's answer, 200 whether or not anything was renewed: ``renewed`` counts the
    partitions held under the lease that were extended, and ``success`` is false (with
    ``error``) when none was: the lease expired, was released by an ack or nack, or never
    existed."""
    lease = rules.lease_id(lease_id)
    body = await read_object_via(models.EXTEND_DECODER, optional=True)
    seconds = body.get("seconds", 60)
    if isinstance(seconds, bool) or not isinstance(seconds, int) or not 1 <= seconds <= 86_400:
        raise ValidationError("invalid_parameter", "seconds must be an integer from 1 to 86400")
    renewal = await _broker().db.run_transaction(store.extend_lease, current_tenant_id(), lease,
                                                 seconds)
    expires = iso(renewal.expires_at)
    error = {"lease_expired": "lease expired or was released by an ack or nack",
             "lease_not_found": "no such lease"}.get(renewal.reason or "")
    return model_response(models.LeaseExtended(
        leaseId=str(lease), success=renewal.renewed > 0, renewed=renewal.renewed,
        newExpiresAt=expires, expiresAt=expires, lease_expires_at=expires, error=error,
        code=renewal.reason))  # type: ignore[arg-type]


# -- dead letters -----------------------------------------------------------------------------


def _optional(args: dict[str, str], key: str, check) -> Any:  # type: ignore[no-untyped-def]
    value = args.get(key)
    return None if value in (None, "") else check(value)


@log_routes.get("/dlq")
async def list_dead_letters() -> Response:
    """Two ways to page, oldest first: Queen's ``limit``/``offset`` (answered in
    ``pagination``) and the keyset ``cursor`` (``next`` of the previous page), which stays
    exact while dead letters are added. Not both at once."""
    args = dict(request.args)
    limit = rules.query_int(args, "limit", 100, lo=1, hi=1000)
    after = rules.query_int(args, "cursor", 0, lo=0, hi=10**18)
    offset = rules.query_int(args, "offset", 0, lo=0, hi=10**9)
    if after and offset:
        raise ValidationError("invalid_parameter", "page with cursor or with offset, not both")
    group = args.get("consumerGroup") or None
    if group is not None:
        group = rules.consumer_group(group, for_pop=False)
    cipher = _broker().cipher
    rows, total = await _broker().db.run_transaction(
        log_admin.dead_letter_page, current_tenant_id(),
        queue=_optional(args, "queue", rules.queue_name),
        group=group,
        partition=_optional(args, "partition", rules.partition_name),
        after=after, offset=offset, limit=limit,
        since=_optional(args, "from", lambda v: rules.timestamp(v, "from")),
        until=_optional(args, "to", lambda v: rules.timestamp(v, "to")),
    )
    messages = [
        {
            "id": row["dead_letter_id"],
            "transactionId": row["transaction_id"],
            "partitionId": None if row["partition_id"] is None else str(row["partition_id"]),
            "queue": row["queue"],
            "partition": row["partition"],
            "consumerGroup": row["consumer_group"],
            "offset": row["offset"],
            "errorMessage": row["error"],
            "retryCount": row["retry_count"],
            "data": opened(cipher, row["payload"]),
            "createdAt": iso(row["frame_created_at"]),
            "failedAt": iso(row["created_at"]),
            "replayedAt": iso(row["replayed_at"]),
            "replayTransactionId": row["replay_transaction_id"],
        }
        for row in rows
    ]
    next_cursor = str(rows[-1]["dead_letter_id"]) if len(rows) == limit else None
    return _json({"messages": messages, "next": next_cursor, "total": total,
                  "pagination": {"limit": limit, "offset": offset, "total": total,
                                 "next": next_cursor}})


@log_routes.post("/dlq/<int:dead_letter_id>/replay")
async def replay_dead_letter(dead_letter_id: int) -> Response:
    broker = _broker()
    appended = await broker.db.run_transaction(store.replay_dead_letter, current_tenant_id(),
                                               dead_letter_id, cipher=broker.cipher)
    return _json({"ok": True, "replayed": dead_letter_id, **appended_to_wire(0, appended)})


# -- queue resources --------------------------------------------------------------------------


def _options_wire(q: dict[str, Any]) -> models.QueueSettings:
    return models.QueueSettings(**rules.QueueOptions.from_row(q).to_wire())


@log_routes.get("/resources/queues")
async def list_queues() -> Response:
    tenant = current_tenant_id()

    def read(raw: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        return store.list_queues(raw, tenant), log_admin.partition_states(raw, tenant)

    rows, parts = await _broker().db.run_transaction(read)
    # Queen's shape: total retained, pending (after the slowest group's cursor; all of them
    # when no group has read the partition) and processing (leased), summed over partitions.
    messages: dict[str, dict[str, int]] = {}
    for p in parts:
        m = messages.setdefault(p["queue"], {"total": 0, "pending": 0, "processing": 0})
        for k in m:
            m[k] += p["counts"][k]
    return model_response(models.QueueList(queues=[
        models.QueueSummary(
            name=r["name"], createdAt=iso(r["created_at"]),  # type: ignore[arg-type]
            partitions=r["partitions"],
            messages=models.MessageCounts(**messages.get(r["name"], {
                "total": 0, "pending": 0, "processing": 0})),
            options=_options_wire(r))
        for r in rows
    ]))


@log_routes.get("/resources/queues/<queue>")
async def queue_detail(queue: str) -> Response:
    name = rules.queue_name(queue)
    detail = await _broker().db.run_transaction(store.queue_detail, current_tenant_id(), name)
    q = detail["queue"]
    groups: dict[str, dict[str, Any]] = {}
    for c in detail["cursors"]:
        groups.setdefault(c["consumer_group"], {})[str(c["partition_id"])] = c
    partitions = []
    for p in detail["partitions"]:
        pid = str(p["partition_id"])
        partitions.append(models.PartitionDetail(
            id=pid, name=p["name"], createdAt=iso(p["created_at"]),  # type: ignore[arg-type]
            logStart=p["log_start"], nextOffset=p["next_offset"],
            messages=p["next_offset"] - p["log_start"], storage=_storage_wire(p),
            groups={
                g: models.GroupPosition(
                    committed=c[pid]["committed"],
                    lag=p["next_offset"] - 1 - max(c[pid]["committed"], p["log_start"] - 1),
                    leased=bool(c[pid]["leased"]))
                for g, c in groups.items() if pid in c
            }))
    storage = {f: sum(getattr(p.storage, f) for p in partitions)
               for f in models.PartitionStorage.__struct_fields__}
    return model_response(models.QueueDetail(
        name=q["name"], createdAt=iso(q["created_at"]),  # type: ignore[arg-type]
        options=_options_wire(q), partitions=partitions, consumerGroups=sorted(groups),
        totals=models.QueueTotals(messages=sum(p.messages for p in partitions),
                                  deadLetters=detail["dead_letters"]),
        timers=models.QueueTimers(pending=detail["timers"]["pending"],
                                  nextDeliverAt=iso(detail["timers"]["next_deliver_at"])),
        storage=models.PartitionStorage(**storage)))


def _storage_wire(p: dict[str, Any]) -> models.PartitionStorage:
    """Where a partition's frames are: the head (plain rows) and sealed segments, whose
    payload bytes (raw) and stored zstd bytes (compressed) are both shown."""
    return models.PartitionStorage(
        headFrames=p["head_frames"], headBytes=p["head_bytes"], segments=p["segments"],
        segmentFrames=p["segment_frames"], rawBytes=p["segment_raw_bytes"],
        compressedBytes=p["segment_stored_bytes"])


@log_routes.delete("/resources/queues/<queue>")
async def delete_queue(queue: str) -> Response:
    name = rules.queue_name(queue)
    broker = _broker()
    existed = await broker.db.run_transaction(store.delete_queue, current_tenant_id(), name)
    broker.group_policies.clear(current_tenant_id(), name)
    return model_response(models.QueueDeleted(deleted=True, queue=name, existed=existed))

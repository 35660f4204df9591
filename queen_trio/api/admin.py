"""Queen's consumer-group and admin read routes: what Queen clients' admin module calls.

Consumer groups (``/consumer-groups``…) list, inspect, find lagging, delete and seek; the read
routes (``/resources/overview``, ``/resources/partitions``, ``/messages``, ``/status``…) answer
in Queen's shapes as far as this broker's model has the data (namespaces, tasks, priorities,
traces and throughput history do not exist here: those fields are empty or null, as the
OpenAPI description says). Everything is tenant-scoped.
"""

from __future__ import annotations

import statistics
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from quart import Blueprint, Response, request

from ..errors import ValidationError
from ..formats import iso, message_id
from ..log import admin, groups, rules
from ..sealing import opened
from .common import broker as _broker
from .common import json_response as _json
from .errors import read_json_object
from .tenancy import current_tenant_id

admin_routes = Blueprint("admin", __name__, url_prefix="/api/v1")

MESSAGE_STATUSES = ("pending", "processing", "completed", "dead_letter")
_LAGGING_STATE_S = 300  # Queen calls a group Lagging past five minutes




def _args() -> dict[str, str]:
    return dict(request.args)


def _group(value: str) -> str:
    return rules.consumer_group(value, for_pop=False)


def _optional_instant(args: dict[str, str], key: str) -> datetime | None:
    value = args.get(key)
    return None if value in (None, "") else rules.timestamp(value, key)


def _page(args: dict[str, str], default_limit: int) -> tuple[int, int]:
    return (rules.query_int(args, "limit", default_limit, lo=1, hi=1000),
            rules.query_int(args, "offset", 0, lo=0, hi=10**9))


# -- consumer groups --------------------------------------------------------------------------


def _partition_wire(row: dict[str, Any]) -> dict[str, Any]:
    leased = bool(row["leased"])
    return {
        "partition": row["partition"],
        "partitionId": str(row["partition_id"]),
        "workerId": None,
        "lastConsumedAt": iso(row["updated_at"]),
        "totalConsumed": max(0, row["committed"] + 1),
        "committed": row["committed"],
        "nextOffset": row["next_offset"],
        "offsetLag": row["lag_messages"],
        "timeLagSeconds": row["lag_seconds"],
        "leaseActive": leased,
        "leaseExpiresAt": iso(row["lease_expires_at"]) if leased else None,
    }


@admin_routes.get("/consumer-groups")
async def list_consumer_groups() -> Response:
    rows = await _broker().db.run_transaction(groups.group_partitions, current_tenant_id())
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for r in rows:
        g = out.setdefault((r["consumer_group"], r["queue"]), {
            "name": r["consumer_group"], "topics": [r["queue"]], "queueName": r["queue"],
            "members": 0, "partitionsWithLag": 0, "totalLag": 0, "maxTimeLag": 0,
            "state": "Dead", "subscriptionMode": None, "subscriptionTimestamp": None,
            "subscriptionCreatedAt": None, "_live": False})
        g["members"] += 1
        g["partitionsWithLag"] += r["lag_messages"] > 0
        g["totalLag"] += r["lag_messages"]
        g["maxTimeLag"] = max(g["maxTimeLag"], r["lag_seconds"])
        g["_live"] |= r["committed"] >= r["log_start"] or bool(r["leased"])
    answer = []
    for g in out.values():
        live = g.pop("_live")
        g["state"] = ("Lagging" if g["maxTimeLag"] > _LAGGING_STATE_S
                      else "Stable" if live else "Dead")
        answer.append(g)
    return _json(answer)


@admin_routes.get("/consumer-groups/lagging")
async def lagging_consumer_groups() -> Response:
    min_lag = rules.query_int(_args(), "minLagSeconds", 3600, lo=0, hi=10**9)
    rows = await _broker().db.run_transaction(groups.group_partitions, current_tenant_id())
    lagging = sorted((r for r in rows if r["lag_messages"] > 0 and r["lag_seconds"] > min_lag),
                     key=lambda r: -r["lag_seconds"])
    return _json([
        {"consumer_group": r["consumer_group"], "queue_name": r["queue"],
         "partition_name": r["partition"], "partition_id": str(r["partition_id"]),
         "worker_id": None, "offset_lag": r["lag_messages"],
         "time_lag_seconds": r["lag_seconds"], "lag_hours": round(r["lag_seconds"] / 3600, 2),
         "oldest_unconsumed_at": iso(r["oldest_at"]),
         "last_consumed_at": iso(r["updated_at"]), "committed": r["committed"]}
        for r in lagging
    ])


@admin_routes.get("/consumer-groups/<group>")
async def get_consumer_group(group: str) -> Response:
    name = _group(group)
    rows = await _broker().db.run_transaction(groups.group_partitions, current_tenant_id(),
                                              group=name)
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        out.setdefault(r["queue"], {"partitions": []})["partitions"].append(_partition_wire(r))
    return _json(out)


@admin_routes.delete("/consumer-groups/<group>")
async def delete_consumer_group(group: str) -> Response:
    return await _delete_group(group, None)


@admin_routes.delete("/consumer-groups/<group>/queues/<queue>")
async def delete_consumer_group_for_queue(group: str, queue: str) -> Response:
    return await _delete_group(group, rules.queue_name(queue))


async def _delete_group(group: str, queue: str | None) -> Response:
    name = _group(group)
    args = _args()
    delete_metadata = True if args.get("deleteMetadata") in (None, "") else rules.query_bool(
        args, "deleteMetadata")
    deleted = await _broker().db.run_transaction(groups.delete_group, current_tenant_id(), name,
                                                 queue, metadata=delete_metadata)
    answer: dict[str, Any] = {"success": True, "consumerGroup": name}
    if queue is not None:
        answer["queueName"] = queue
    answer.update({"deletedPartitions": deleted, "metadataDeleted": delete_metadata})
    return _json(answer)


@admin_routes.post("/consumer-groups/<group>/queues/<queue>/seek")
async def seek_consumer_group(group: str, queue: str) -> Response:
    name = _group(group)
    queue = rules.queue_name(queue)
    raw = await request.get_data()
    body = await read_json_object() if raw.strip() else {}
    to_end = body.get("toEnd", False)
    if not isinstance(to_end, bool):
        raise ValidationError("invalid_seek", "toEnd must be true or false")
    at = (None if body.get("timestamp") in (None, "")
          else rules.timestamp(body["timestamp"], "timestamp"))
    offset = body.get("offset")
    if offset is not None and (isinstance(offset, bool) or not isinstance(offset, int)
                               or not 0 <= offset <= 2**62):
        raise ValidationError("invalid_offset", "offset must be a non-negative integer")
    if [to_end, at is not None, offset is not None].count(True) != 1:
        raise ValidationError(
            "invalid_seek",
            "give exactly one of 'toEnd': true, 'timestamp' (ISO-8601) or 'offset' (with "
            "'partition', default 'Default')")
    partition = body.get("partition")
    if partition is not None or offset is not None:
        partition = rules.partition_name(partition)
    broker = _broker()
    moved = await broker.db.run_transaction(
        groups.seek, current_tenant_id(), name, queue, to_end=to_end, at=at, offset=offset,
        partition=partition, cache=broker.segment_cache)
    return _json({"success": True, "consumerGroup": name, "queueName": queue,
                  "seekToEnd": to_end, "targetTimestamp": iso(at), "offset": offset,
                  "partitionsUpdated": len(moved), "partitions": moved})


# -- resources --------------------------------------------------------------------------------


def _spread(values: list[int]) -> dict[str, float]:
    if not values:
        return {"avg": 0, "median": 0, "min": 0, "max": 0}
    return {"avg": round(statistics.fmean(values), 2), "median": statistics.median(values),
            "min": min(values), "max": max(values)}


def _sum_counts(parts: list[dict[str, Any]]) -> dict[str, int]:
    out = dict.fromkeys(("total", "pending", "processing", "completed"), 0)
    for p in parts:
        for k in out:
            out[k] += p["counts"][k]
    return out


@admin_routes.get("/resources/overview")
async def overview() -> Response:
    tenant = current_tenant_id()

    def read(raw: Any) -> tuple[Any, Any, Any]:
        return (admin.partition_states(raw, tenant), admin.counts(raw, tenant),
                groups.group_partitions(raw, tenant))

    parts, counts, cursors = await _broker().db.run_transaction(read)
    return _json({
        "queues": counts["queues"], "partitions": len(parts), "namespaces": 0, "tasks": 0,
        "messages": {**_sum_counts(parts), "failed": 0, "deadLetter": counts["deadLetters"]},
        "lag": {"time": _spread([r["lag_seconds"] for r in cursors]),
                "offset": _spread([r["lag_messages"] for r in cursors])},
        "throughput": {"ingestedPerSecond": None, "processedPerSecond": None},
        "storage": _storage(tenant),
        "timestamp": iso(datetime.now(UTC)), "statsAge": 0,
    })


def _storage(tenant: int) -> dict[str, Any]:
    """The tenant's stored bytes against its plan's gate (an extension to Queen's overview),
    as the broker last folded them (within a second)."""
    plan = _broker().tenants.plan(tenant)
    return {"usedBytes": plan.stored_bytes, "maxStoredBytes": plan.max_stored_bytes,
            "overGate": _broker().tenants.over_storage_gate(tenant)}


@admin_routes.get("/resources/namespaces")
async def namespaces() -> Response:
    return _json({"namespaces": []})


@admin_routes.get("/resources/tasks")
async def tasks() -> Response:
    return _json({"tasks": []})


@admin_routes.get("/resources/partitions")
async def partitions() -> Response:
    args = _args()
    limit, offset = _page(args, 100)
    queue = None if args.get("queue") in (None, "") else rules.queue_name(args["queue"])
    parts = await _broker().db.run_transaction(admin.partition_states, current_tenant_id(), queue)
    return _json({
        "partitions": [
            {"id": str(p["partition_id"]), "name": p["name"], "queue": p["queue"],
             "createdAt": iso(p["created_at"]), "logStart": p["log_start"],
             "nextOffset": p["next_offset"], "consumerGroups": p["groups"],
             "activeLeases": p["leases"], "messages": p["counts"]}
            for p in parts[offset:offset + limit]
        ],
        "pagination": {"limit": limit, "offset": offset, "total": len(parts)},
    })


@admin_routes.get("/status")
async def status() -> Response:
    args = _args()
    queue = None if args.get("queue") in (None, "") else rules.queue_name(args["queue"])
    now = datetime.now(UTC)
    since = _optional_instant(args, "from") or now - timedelta(hours=1)
    until = _optional_instant(args, "to") or now
    tenant = current_tenant_id()

    def read(raw: Any) -> tuple[Any, Any]:
        return admin.partition_states(raw, tenant, queue), admin.counts(raw, tenant, queue)

    parts, counts = await _broker().db.run_transaction(read)
    queues: dict[str, dict[str, Any]] = {}
    for p in parts:
        q = queues.setdefault(p["queue"], {"id": str(p["queue_id"]), "name": p["queue"],
                                           "namespace": None, "task": None, "partitions": 0,
                                           "totalConsumed": 0, "_total": 0})
        q["partitions"] += 1
        q["totalConsumed"] += p["counts"]["completed"]
        q["_total"] += p["counts"]["total"]
    return _json({
        "timeRange": {"from": iso(since), "to": iso(until)},
        "bucketMinutes": 1, "pointCount": 0, "throughput": [],
        "queues": [{k: v for k, v in q.items() if k != "_total"}
                   for q in queues.values() if q["_total"] > 0],
        "messages": {**_sum_counts(parts), "failed": 0, "deadLetter": counts["deadLetters"]},
        "leases": {"active": sum(p["leases"] for p in parts),
                   "partitionsWithLeases": sum(1 for p in parts if p["leases"]),
                   "totalBatchSize": sum(p["counts"]["processing"] for p in parts),
                   "totalAcked": None},
        "deadLetterQueue": {"totalMessages": counts["deadLetters"],
                            "affectedPartitions": counts["deadLetterPartitions"],
                            "topErrors": []},
        "statsAge": 0,
    })


# -- messages ---------------------------------------------------------------------------------


def _mode(has_queue_mode: bool, bus_groups: int) -> dict[str, Any]:
    kind = ("hybrid" if has_queue_mode and bus_groups else "queue" if has_queue_mode
            else "bus" if bus_groups else "none")
    return {"hasQueueMode": has_queue_mode, "busGroupsCount": bus_groups, "type": kind}


@admin_routes.get("/messages")
async def list_messages() -> Response:
    args = _args()
    limit, offset = _page(args, 200)
    queue = None if args.get("queue") in (None, "") else rules.queue_name(args["queue"])
    partition = (None if args.get("partition") in (None, "")
                 else rules.partition_name(args["partition"]))
    status = args.get("status") or None
    if status is not None and status not in MESSAGE_STATUSES:
        raise ValidationError("invalid_parameter",
                              f"status must be one of {', '.join(MESSAGE_STATUSES)}")
    now = datetime.now(UTC)
    since = _optional_instant(args, "from") or now - timedelta(hours=1)
    until = _optional_instant(args, "to") or now + timedelta(seconds=1)
    broker = _broker()
    rows, total = await broker.db.run_transaction(
        admin.message_page, current_tenant_id(), queue=queue, partition=partition,
        status=status, since=since, until=until, limit=limit, offset=offset,
        cache=broker.segment_cache)
    has_queue_mode = any(r["queue_mode"] for r in rows)
    bus = max((r["groups"] - r["queue_mode"] for r in rows), default=0)
    return _json({
        "messages": [
            {"id": f"{r['partition_id']}:{r['offset']}", "transactionId": r["transaction_id"],
             "partitionId": str(r["partition_id"]),
             "queuePath": f"{r['queue']}/{r['partition']}", "queue": r["queue"],
             "partition": r["partition"], "offset": r["offset"], "namespace": None,
             "task": None, "status": r["status"], "queueStatus": r["status"],
             "busStatus": {"consumedBy": r["consumed_by"], "totalGroups": r["groups"]},
             "traceId": None, "queuePriority": None, "createdAt": iso(r["created_at"]),
             "leaseExpiresAt": iso(r["lease_expires_at"]), "sealed": not r["head"]}
            for r in rows
        ],
        "mode": _mode(has_queue_mode, bus),
        "pagination": {"limit": limit, "offset": offset, "total": total},
    })


@admin_routes.get("/messages/<partition_id>/<transaction_id>")
async def get_message(partition_id: str, transaction_id: str) -> Response:
    try:
        pid = uuid.UUID(partition_id)
    except ValueError:
        raise ValidationError("invalid_partition_id", "partitionId must be a UUID") from None
    txn = rules.transaction_id(transaction_id)
    broker = _broker()
    found = await broker.db.run_transaction(admin.message, current_tenant_id(), pid, txn,
                                            cache=broker.segment_cache)
    part, frame, cursors, dead = (found["partition"], found["frame"], found["groups"],
                                  found["dead_letters"])
    queue_mode = any(c["consumer_group"] == rules.QUEUE_MODE_GROUP for c in cursors)
    bus = [c for c in cursors if c["consumer_group"] != rules.QUEUE_MODE_GROUP]
    leased = [c["lease_expires_at"] for c in cursors if c["lease_expires_at"] is not None]
    status = ("dead_letter" if dead
              else "completed" if cursors and all(c["consumed"] for c in cursors)
              else "processing" if leased else "pending")
    retries = [c["retry_count"] for c in cursors if c["retry_count"] is not None]
    sealed = broker.cipher is not None and broker.cipher.open_text(frame.payload) is not None
    data = opened(broker.cipher, frame.payload)
    return _json({
        "id": message_id(str(pid), frame.offset, frame.meta),
        "transactionId": frame.transaction_id,
        "partitionId": str(pid), "queuePath": f"{part['queue']}/{part['name']}",
        "queue": part["queue"], "partition": part["name"], "offset": frame.offset,
        "namespace": None, "task": None, "status": status,
        "payload": data, "data": data, "isEncrypted": sealed,
        "traceId": None, "createdAt": iso(frame.created_at),
        "errorMessage": dead[-1]["error"] if dead else next(
            (c["last_error"] for c in cursors if c["last_error"]), None),
        "retryCount": dead[-1]["retry_count"] if dead else max(retries, default=0),
        "leaseExpiresAt": iso(max(leased)) if leased else None,
        "queueConfig": {"leaseTime": part["lease_time_s"], "retryLimit": part["retry_limit"],
                        "retryDelay": None, "ttl": part["retention_s"], "priority": None},
        "mode": {**_mode(queue_mode, len(bus)),
                 "consumedByGroups": sum(1 for c in bus if c["consumed"])},
        "consumerGroups": [
            {"name": c["consumer_group"], "consumed": c["consumed"],
             "committed": c["committed"], "leaseExpiresAt": iso(c["lease_expires_at"])}
            for c in cursors
        ],
        "deadLetters": [{"consumerGroup": d["consumer_group"], "errorMessage": d["error"],
                         "retryCount": d["retry_count"], "failedAt": iso(d["created_at"])}
                        for d in dead],
    })


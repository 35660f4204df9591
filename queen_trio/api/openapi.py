"""The OpenAPI 3.1 description of the HTTP API, written by hand next to the routes; the
schemas of the answers and bodies declared as wire models (queen_trio/models) are generated
from them.

Each area adds its paths here when its routes land; a test checks that every route the app
serves is described.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from .. import __version__
from ..models import kv as kv_models
from ..models import locks as lock_models
from ..models import log as log_models
from ..models import schema
from ..models import timers as models
from ..models import transaction as transaction_models


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


_ERROR = {"$ref": "#/components/schemas/Error"}
# A 429 or a 503 always says when to come back (api/errors.py error_response).
_RETRY_AFTER = {"Retry-After": {"required": True, "description": "whole seconds to wait",
                                "schema": {"type": "integer", "minimum": 1}}}


def _error(status: int, description: str) -> dict[str, Any]:
    answer = _json(_ERROR, description)
    if status in (429, 503):
        answer["headers"] = _RETRY_AFTER
    return answer


def _errors(*statuses: int) -> dict[str, Any]:
    texts = {400: "Invalid input", 401: "Missing or invalid bearer token", 404: "Not found",
             409: "Conflict", 413: "Payload too large",
             429: "rate_limited: request-rate quota exhausted, or too many failed "
                  "authentications from this address",
             503: "database_unavailable: the database is unreachable; overloaded: the broker "
                  "holds as many request bodies as it may"}
    return {str(s): _error(s, texts[s]) for s in statuses}


def _path_param(name: str, description: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string"},
            "description": description}


def _query(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": schema,
            "description": description}


def _stream_op(operation: str, path: list[dict[str, Any]]) -> dict[str, Any]:
    """The streaming pop (api/stream.py): a WebSocket upgrade, answered like a pop if refused;
    without the upgrade, 400."""
    return {
        "summary": "Streaming pop (ours): a WebSocket of batches and their settlements",
        "description": "See docs/http-api.md#streaming-pop. `inflight`: batches out at once.",
        "operationId": operation,
        "parameters": [*path, *_POP_PARAMS,
                       _query("inflight", {"type": "integer", "minimum": 1, "maximum": 256},
                              "batches the consumer takes at once")],
        "responses": {"101": {"description": "Switching Protocols: the stream"},
                      **_errors(400, 401, 404, 429)},
    }


def _body(schema: dict[str, Any]) -> dict[str, Any]:
    return {"required": True, "content": {"application/json": {"schema": schema}}}


_POP_PARAMS = [
    _query("consumerGroup", {"type": "string"}, "default __QUEUE_MODE__ (competing consumers)"),
    _query("batch", {"type": "integer", "minimum": 1, "maximum": 10000}, "messages at most"),
    _query("wait", {"type": "boolean"}, "long-poll until a message arrives or timeout"),
    _query("timeout", {"type": "integer", "minimum": 0, "maximum": 300000}, "long-poll ms"),
    _query("autoAck", {"type": "boolean"}, "advance the cursor at delivery; no lease"),
    _query("partitions", {"type": "integer", "minimum": 1, "maximum": 100},
           "take up to this many partitions in one pop, all under one lease, sharing batch; "
           "listed in the answer's partitions (the partition route takes one)"),
    _query("leaseSeconds", {"type": "integer", "minimum": 0, "maximum": 86400},
           "this pop's lease in seconds; 0 or absent: the queue's leaseTime"),
    _query("autopilot", {"type": "boolean"},
           "the broker sizes what is not given: batch 100, and partitions up to 64 shared "
           "among this broker's waiting pops of the same group; echoed in autopilot"),
    _query("conflation", {"type": "boolean"},
           "last-value delivery (needs consumerGroup, not with autoAck): each partition "
           "delivers only its newest message, and acking it retires everything behind it. "
           "A policy of the consumer group, registered by its first pop and applied to "
           "every pop of it; a pop asking otherwise gets conflationConflict: true. Every "
           "answer under a conflating policy, empty ones too, carries conflation: true"),
    _query("subscriptionMode",
           {"type": "string", "enum": ["all", "from_beginning", "new", "new-only"]},
           "where a consumer group starts on a partition it has never popped: all or "
           "from_beginning (the beginning, the default) or new (what is pushed after the "
           "group's first pop with this mode, in any partition); queue mode ignores it"),
    _query("subscriptionFrom", {"type": "string"},
           "beginning, now (as subscriptionMode=new) or an ISO-8601 instant with a time zone: "
           "a new consumer group starts at the first message created at or after it; wins "
           "over subscriptionMode"),
]
# A pop that would wait past a bound on waiting pops (QUEEN_LONGPOLL_MAX_PARKED*,
# docs/configuration.md).
_WAIT_REFUSED = {
    "429": _error(429, "rate_limited: the tenant's request-rate quota is exhausted; "
                         "too_many_waiting_pops: with wait, the tenant already has "
                         "QUEEN_LONGPOLL_MAX_PARKED_PER_TENANT pops waiting (limit; "
                         "Retry-After)"),
    "503": _error(503, "broker_waiting_pops_full: with wait, this broker already has "
                         "QUEEN_LONGPOLL_MAX_PARKED pops waiting (limit; Retry-After); "
                         "database_unavailable"),
}
_POP_RESPONSES = {
    "200": _json(schema.ref(log_models.PopResponse), "Messages under a lease"),
    "204": {"description": "No message available"},
    **_errors(400), **_WAIT_REFUSED,
}

_ACK_AS_COMMIT = (
    "An acknowledgement is an offset commit, as in Queen: completing a message commits the "
    "group's cursor up to it (what was handed out before it is done too). A failed, retry or "
    "dlq in the same call is never skipped by a later completion: the cursor stops below it, "
    "the lease is released, and the messages from it on come back (a dead letter, or a "
    "failure past retryLimit, settles its message and the call goes on past it). Always 200 "
    "once the body is valid: each acknowledgement says success, or is refused with Queen's "
    "error text and a code: lease_lost (the lease is not live), unresolvable (no such "
    "message), already_committed (a nack at or below the committed offset), not_delivered "
    "(never handed out to the group). A completion at or below the committed offset is a "
    "success with noop: true.")
_SETTLE_AND_POP = (
    "The acknowledgements (as for /ack/batch) are applied first, each with its verdict, and "
    "committed as a pop commits (QUEEN_POP_COMMIT); then the pop runs with the query's "
    "parameters, long-polling if asked. Refused acknowledgements do not stop the pop: their "
    "verdicts come back in ackRefused (as /ack/batch answers them). A top-level partitionId "
    "and leaseId "
    "stand in for the ones an entry leaves out. Always 200 once acknowledgements were "
    "sent: messages is empty when nothing was ready; acks counts what the acknowledgements "
    "did; waitRefused says why it did not wait, past a bound on waiting pops.")
_SETTLE_AND_POP_RESPONSES = {
    "200": _json(schema.ref(log_models.PopResponse),
                 "Acknowledgement results (acks, ackRefused, waitRefused), then messages "
                 "under a lease (possibly none)"),
    **_errors(400), **_WAIT_REFUSED,
}


def _timer_paths() -> dict[str, Any]:
    key_params = [_path_param("queue", "destination queue"),
                  _path_param("key", "the timer's name (rest of the path, may contain '/')")]
    delay = {"type": "integer", "description": "relative delay in ms, counted from "
             "PostgreSQL's now; zero or negative (a delay in the past) is legal and fires on "
             "the first sweep cycle; beyond QUEEN_TIMERS_MAX_HORIZON_S: 403"}
    schedule_body: dict[str, Any] = {
        "type": "object", "required": ["delayMs", "payload"], "properties": {
            "delayMs": delay, "payload": {"description": "any JSON value"},
            "partition": {"type": "string"},
            "txn": {"type": "string", "description": "default: the broker makes one"}},
        "additionalProperties": False}
    result = schema.ref(models.TimerResult)
    answer = _json(result, "scheduled | rescheduled | cancelled | absent | too_late")
    refused = {**_errors(400, 413), "403": _json(_ERROR, "timer_horizon_exceeded: beyond the "
                                                 "horizon; storage_full: the storage gate; "
                                                 "host_not_allowed, cross_origin as anywhere")}
    return {
        "/api/v1/timers": {"post": {
            "summary": "Schedule, reschedule and cancel timers in one transaction (Queen's "
                       "batch: at most 256 operations, each timer at most once)",
            "operationId": "timersBatch",
            "requestBody": _body({"oneOf": [
                schema.ref(models.TimerBatch),
                {"type": "array", "maxItems": 256, "items": schema.ref(models.TimerOp)}]}),
            "responses": {"200": _json(schema.ref(models.TimerResults),
                                       "One result per operation, in input order"),
                          **refused},
        }},
        "/api/v1/timers/{queue}/{key}": {
            "put": {
                "summary": "Schedule or reschedule one timer with a JSON payload (an upsert "
                           "by name; this broker's curl-friendly form of the batch)",
                "operationId": "scheduleTimer",
                "parameters": key_params,
                "requestBody": _body(schedule_body),
                "responses": {"200": answer, **refused},
            },
            "delete": {
                "summary": "Cancel a pending timer; never refused by quota, gate or plan",
                "operationId": "cancelTimer",
                "parameters": [*key_params, _query("txn", {"type": "string"},
                                                    "echoed back when absent, to look for the "
                                                    "message in the log by txn")],
                "responses": {"200": answer, **_errors(400)},
            },
            "get": {
                "summary": "Peek at a pending timer (a miss is found: false, with 200)",
                "operationId": "peekTimer",
                "parameters": key_params,
                "responses": {"200": _json({"oneOf": [
                    schema.ref(models.TimerMissing), schema.ref(models.TimerFound)]},
                    "The pending timer, or found: false"), **_errors(400)},
            },
        },
        "/api/v1/timers/{queue}": {"get": {
            "summary": "One queue's pending timers by key (a keyset page), or a count by "
                       "key prefix",
            "operationId": "listTimers",
            "parameters": [_path_param("queue", "destination queue"),
                           _query("limit", {"type": "integer"},
                                  "page size: default 100, clamped to 1..1000, never refused"),
                           _query("after", {"type": "string"},
                                  "a timer key: the page starts after it (nextAfter)"),
                           _query("mode", {"enum": ["list", "count"]}, "default list"),
                           _query("prefix", {"type": "string"},
                                  "mode=count: count the keys starting with it (1-128 bytes)")],
            "responses": {"200": _json({"oneOf": [
                schema.ref(models.TimerPage), schema.ref(models.TimerCount),
            ]}, "A page of timers, or a count"), **_errors(400)},
        }},
    }


def _kv_and_transaction_paths() -> dict[str, Any]:
    kv_params = [_path_param("namespace", "namespace"),
                 _path_param("key", "key (may contain '/'; percent-encode the rest)")]
    # The request bodies are the models the routes decode them through (queen_trio/models).
    kv_body = {"oneOf": [schema.ref(kv_models.KvCall),
                         {"type": "array", "maxItems": 256, "items": schema.ref(kv_models.KvOp)}]}
    precondition = schema.ref(kv_models.KvPreconditionFailed)

    def element(*results: type) -> dict[str, Any]:
        return _json({"anyOf": [*map(schema.ref, results), precondition]}, "The op's result, "
                     "or the precondition answer for a required op that did not apply")

    return {
        "/api/v1/kv": {"post": {
            "summary": "Apply up to 256 KV ops (1,024 keys) in one transaction",
            "description": "Applied in key order, answered in input order ({results: [...]}, "
                           "each with index and op). The status says how the call went: a "
                           "miss, a lost race or a delete of nothing are 200 with an explicit "
                           "field. A key may be written once per call.",
            "operationId": "kvBatch",
            "requestBody": _body(kv_body),
            "responses": {"200": _json({"anyOf": [schema.ref(kv_models.KvResults), precondition]},
                                       "One result per op, or the precondition answer"),
                **_errors(400, 413)},
        }},
        "/api/v1/kv/{namespace}/{key}": {
            "put": {
                "summary": "Write a JSON value (exactly one of ttlSeconds and forever)",
                "operationId": "kvPut",
                "parameters": kv_params,
                "requestBody": _body(schema.ref(kv_models.KvPutBody)),
                "responses": {"200": element(kv_models.KvPut), **_errors(400, 413)},
            },
            "get": {
                "summary": "Read a key; a miss is 200 {found: false}",
                "operationId": "kvGet",
                "parameters": kv_params,
                "responses": {"200": {**element(kv_models.KvGet), "headers": {"ETag": {
                    "description": 'the version, quoted ("42"), when found',
                    "schema": {"type": "string"}}}}, **_errors(400)},
            },
            "delete": {
                "summary": "Delete a key (not applied, reason absent, when it was not there)",
                "operationId": "kvDelete",
                "parameters": kv_params,
                "requestBody": {"required": False, "content": {"application/json": {
                    "schema": schema.ref(kv_models.KvDeleteBody)}}},
                "responses": {"200": element(kv_models.KvDelete), **_errors(400)},
            },
        },
        "/api/v1/locks": {"post": {
            "summary": "Acquire, renew, release or read locks and semaphores (up to 64 ops)",
            "description": "A permit is the KV row queen-locks/<name>#<slot>; its token is the "
                           "row's version (a later holder always has a higher one) and guard "
                           "the KV check to put first in a transaction's kv array so that it "
                           "commits only while the permit is held. The ops are independent. "
                           "Answers: acquire {acquired, slot, token, owner, guard, already?} or "
                           "{acquired: false, reason: held | contended, holders}; renew "
                           "{renewed, slot, token, guard} or {renewed: false, reason: lost, "
                           "holders}; release {released}; get {held, holders: [{slot, owner, "
                           "token, since, expiresAt, renewedAt}]}.",
            "operationId": "locks",
            "requestBody": _body({"oneOf": [
                schema.ref(lock_models.LockCall),
                {"type": "array", "maxItems": 64, "items": schema.ref(lock_models.LockOp)}]}),
            "responses": {"200": _json(schema.ref(lock_models.LockResults),
                                       "One result per op, in order"), **_errors(400)},
        }},
        "/api/v1/transaction": {"post": {
            "summary": "Apply pushes, acks, KV ops and timers atomically",
            "description": "Top-level operations (push, ack), kv (as on POST /api/v1/kv, "
                           "without getPrefix, at most 64), timers and requiredLeases (leases "
                           "that must be live; an ack naming no lease borrows the one "
                           "required lease); any other field is a 400. The kv ops run first. "
                           "results is one flat array: every pushed item and every ack in "
                           "order (type push | ack), then the kv results (type kv), then "
                           "the timers' (type timer); failedIndex counts in it. A bundle "
                           "refused by the state it found answers 200 success: false with "
                           "the text in error (Queen's) and code: lease_lost (an ack's lease, "
                           "or a required lease, is not live), unresolvable, "
                           "already_committed or not_delivered.",
            "operationId": "transaction",
            "parameters": [_query(
                "answer", {"type": "string", "enum": ["full", "compact"]},
                "our extension: compact answers a bundle that only scheduled timers, all new "
                "names, with TransactionScheduled (their results told once); any other bundle "
                "is answered in full. Default full")],
            "requestBody": _body(schema.ref(transaction_models.Bundle)),
            "responses": {
                "200": _json({"anyOf": [schema.ref(transaction_models.TransactionDone),
                                        schema.ref(models.TransactionScheduled),
                                        precondition,
                                        schema.ref(transaction_models.TransactionRefused)]},
                             "Committed; or a required KV op did not apply; or refused whole "
                             "(an ack under a lost lease, a required lease not live): nothing "
                             "was written"),
                **_errors(400, 404, 409, 413),
            },
        }},
    }


def _log_paths() -> dict[str, Any]:
    ack_results = _json({"type": "array", "items": schema.ref(log_models.AckResult)},
                        "One verdict per acknowledgement, in order")
    settle_body = {"required": False, "content": {"application/json": {
        "schema": schema.ref(log_models.SettleBody)}}}
    return {
        "/api/v1/configure": {"post": {
            "summary": "Create or reconfigure a queue (omitted options take their defaults)",
            "operationId": "configure",
            "requestBody": _body(schema.ref(log_models.ConfigureBody)),
            "responses": {"200": _json(schema.ref(log_models.Configured), "Configured"),
                          **_errors(400)},
        }},
        "/api/v1/push": {"post": {
            "summary": "Append 0..N messages, any mix of queues and partitions, atomically "
                       "(no items: 201 [])",
            "operationId": "push",
            "requestBody": _body(schema.ref(log_models.PushBody)),
            "responses": {
                "201": _json({"type": "array", "items": schema.ref(log_models.Pushed)},
                             "One result per item, in order"),
                **_errors(400, 413),
                "409": _json(_ERROR, "queue_full: the push would take a queue past its "
                                     "maxSize (error carries queue, maxSize, depth, pushing); "
                                     "nothing was pushed"),
            },
        }},
        "/api/v1/pop/queue/{queue}": {
            "get": {
                "summary": "Pop from any partition of a queue not leased to the group",
                "operationId": "popQueue",
                "parameters": [_path_param("queue", "queue name"), *_POP_PARAMS],
                "responses": _POP_RESPONSES,
            },
            "post": {
                "summary": "Settle acknowledgements, then pop (one round trip per batch)",
                "description": _SETTLE_AND_POP,
                "operationId": "settleAndPopQueue",
                "parameters": [_path_param("queue", "queue name"), *_POP_PARAMS],
                "requestBody": settle_body,
                "responses": _SETTLE_AND_POP_RESPONSES,
            },
        },
        "/api/v1/pop/queue/{queue}/partition/{partition}": {
            "get": {
                "summary": "Pop from one partition",
                "operationId": "popPartition",
                "parameters": [_path_param("queue", "queue name"),
                               _path_param("partition", "partition name"), *_POP_PARAMS],
                "responses": _POP_RESPONSES,
            },
            "post": {
                "summary": "Settle acknowledgements, then pop from one partition",
                "description": _SETTLE_AND_POP,
                "operationId": "settleAndPopPartition",
                "parameters": [_path_param("queue", "queue name"),
                               _path_param("partition", "partition name"), *_POP_PARAMS],
                "requestBody": settle_body,
                "responses": _SETTLE_AND_POP_RESPONSES,
            },
        },
        "/api/v1/stream/queue/{queue}": {"get": _stream_op(
            "streamQueue", [_path_param("queue", "queue name")])},
        "/api/v1/stream/queue/{queue}/partition/{partition}": {"get": _stream_op(
            "streamPartition", [_path_param("queue", "queue name"),
                                _path_param("partition", "partition name")])},
        "/api/v1/ack": {"post": {
            "summary": "Acknowledge one message (completed, failed, dlq or retry)",
            "description": _ACK_AS_COMMIT,
            "operationId": "ack",
            "requestBody": _body(schema.ref(log_models.Ack)),
            "responses": {"200": ack_results, **_errors(400)},
        }},
        "/api/v1/ack/batch": {"post": {
            "summary": "Acknowledge several messages, each with its verdict",
            "description": _ACK_AS_COMMIT,
            "operationId": "ackBatch",
            "requestBody": _body(schema.ref(log_models.AckBatch)),
            "responses": {"200": ack_results, **_errors(400)},
        }},
        "/api/v1/lease/{lease_id}/extend": {"post": {
            "summary": "Extend a live lease (every partition it holds)",
            "description": "200 whether or not anything was renewed, as Queen answers: "
                           "renewed counts the partitions extended; success is false (with "
                           "error, and code lease_expired or lease_not_found) when none was.",
            "operationId": "extendLease",
            "parameters": [_path_param("lease_id", "lease id from a pop")],
            "requestBody": {"required": False, "content": {"application/json": {
                "schema": schema.ref(log_models.ExtendBody)}}},
            "responses": {"200": _json(schema.ref(log_models.LeaseExtended), "What was renewed"),
                          **_errors(400)},
        }},
        "/api/v1/fetch": {"post": {
            "summary": "Read records by absolute offset: no lease, no cursor (Queen's fetch)",
            "description": "Each entry answers its records from offset, highWatermark (the "
                           "next offset to be assigned) and logStartOffset (the oldest kept), "
                           "in request order; error OFFSET_OUT_OF_RANGE (below the log start "
                           "or past the high watermark) or UNKNOWN_TOPIC_OR_PARTITION (no such "
                           "queue). maxBytes counts payload JSON bytes; the first record of a "
                           "call always goes. maxWaitMs parks an answer with fewer than "
                           "minBytes payload bytes.",
            "operationId": "fetch",
            "requestBody": _body(schema.ref(log_models.FetchBody)),
            "responses": {"200": _json(schema.ref(log_models.Fetched),
                                       "Records and bounds per entry"), **_errors(400)},
        }},
        "/api/v1/partitions/changed": {"post": {
            "summary": "A queue's partitions, or those written since an instant (discovery)",
            "description": "Per entry (at most 64): every partition by name, or with since "
                           "those last written at or after it, by (last write, name); limit "
                           "1..1000 a page, next is the opaque cursor to pass as after (null: "
                           "the end; BAD_CURSOR: another mode's). safeTime: no write can still "
                           "land at or before it; pass it as the next since.",
            "operationId": "partitionsChanged",
            "requestBody": _body(schema.ref(log_models.ChangedBody)),
            "responses": {"200": _json(schema.ref(log_models.PartitionsChanged),
                                       "Partitions per entry, and the watermark"),
                          **_errors(400)},
        }},
        "/api/v1/dlq": {"get": {
            "summary": "List dead letters, oldest first: offset pages (Queen) or cursor pages",
            "description": "Two ways to page, not both at once: Queen's limit/offset (echoed "
                           "in pagination, with total) and the keyset cursor (pass next of "
                           "the previous page), which stays exact while dead letters are "
                           "added. Every answer carries messages, next, total and "
                           "pagination {limit, offset, total, next}.",
            "operationId": "listDeadLetters",
            "parameters": [
                _query("queue", {"type": "string"}, "queue name"),
                _query("consumerGroup", {"type": "string"}, "consumer group"),
                _query("partition", {"type": "string"}, "partition name"),
                _query("limit", {"type": "integer", "minimum": 1, "maximum": 1000}, "page size"),
                _query("offset", {"type": "integer", "minimum": 0}, "dead letters to skip"),
                _query("cursor", {"type": "string"}, "next from the previous page"),
                _query("from", {"type": "string", "format": "date-time"},
                       "failed at or after (ISO-8601)"),
                _query("to", {"type": "string", "format": "date-time"},
                       "failed at or before (ISO-8601)"),
            ],
            "responses": {"200": _json({"type": "object", "properties": {
                "messages": {"type": "array", "items": {"type": "object"}},
                "next": {"type": ["string", "null"]}, "total": {"type": "integer"},
                "pagination": {"type": "object"}}}, "A page of dead letters"),
                **_errors(400)},
        }},
        "/api/v1/dlq/{dead_letter_id}/replay": {"post": {
            "summary": "Push a dead letter again as a new message",
            "operationId": "replayDeadLetter",
            "parameters": [_path_param("dead_letter_id", "id from the listing")],
            "responses": {"200": _json({"type": "object"}, "Replayed"), **_errors(404, 409)},
        }},
        "/api/v1/resources/queues": {"get": {
            "summary": "The tenant's queues",
            "description": "Each: name, createdAt, partitions, options, and messages: total "
                           "(retained), pending (not yet done by the slowest consumer group; "
                           "all of them while no group has read the partition), processing "
                           "(leased).",
            "operationId": "listQueues",
            "responses": {"200": _json(schema.ref(log_models.QueueList), "Queues")},
        }},
        "/api/v1/resources/queues/{queue}": {
            "get": {
                "summary": "One queue: options, partitions, offsets, consumer groups, storage",
                "operationId": "getQueue",
                "parameters": [_path_param("queue", "queue name")],
                "responses": {"200": _json(schema.ref(log_models.QueueDetail), "Queue"),
                              **_errors(400, 404)},
            },
            "delete": {
                "summary": "Delete a queue with its messages, cursors and dead letters",
                "operationId": "deleteQueue",
                "parameters": [_path_param("queue", "queue name")],
                "responses": {"200": _json(schema.ref(log_models.QueueDeleted), "Deleted"),
                              **_errors(400)},
            },
        },
    }


_NOT_HERE = ("namespace, task, workerId, traceId, priorities, retryDelay and throughput "
             "history do not exist in this broker: such fields are null, 0 or empty.")
_OBJECT = {"type": "object"}
_ARRAY = {"type": "array", "items": {"type": "object"}}
_GROUP = _path_param("group", "consumer group name")


def _admin_paths() -> dict[str, Any]:
    """Queen's consumer-group and admin read routes (queen_trio/api/admin.py)."""
    window = [_query("from", {"type": "string", "format": "date-time"},
                     "ISO-8601; default an hour ago (as Queen)"),
              _query("to", {"type": "string", "format": "date-time"}, "ISO-8601; default now")]
    page = [_query("limit", {"type": "integer", "minimum": 1, "maximum": 1000}, "page size"),
            _query("offset", {"type": "integer", "minimum": 0}, "rows to skip")]
    delete_metadata = _query("deleteMetadata", {"type": "boolean"},
                             "default true: also forget the group's subscription records "
                             "(subscriptionMode=new), so it subscribes afresh")
    deleted = _json(_OBJECT, "{success, consumerGroup, queueName?, deletedPartitions, "
                             "metadataDeleted}")
    return {
        "/api/v1/stats": {"get": {
            "summary": "The tenant's own counts on this broker: what the dashboard draws",
            "description": "Since this broker process started: pushed (push items, by any "
                           "status), popped (messages handed out), acked (acknowledgements "
                           "applied), and timerFireLag (the tenant's timers: fire commit minus "
                           "deliverAt, as cumulative counts per bucket bound in seconds, "
                           "Prometheus style, '+Inf' last). Rates are differences between two "
                           "answers with the same broker id (each worker, and each start, has "
                           "its own). /metrics has every tenant's figures together.",
            "operationId": "stats",
            "responses": {"200": _json({"type": "object", "required": [
                "broker", "pushed", "popped", "acked", "timerFireLag"], "properties": {
                    "broker": {"type": "string"}, "pushed": {"type": "integer"},
                    "popped": {"type": "integer"}, "acked": {"type": "integer"},
                    "timerFireLag": {"type": "object", "properties": {
                        "count": {"type": "integer"},
                        "buckets": {"type": "object",
                                    "additionalProperties": {"type": "integer"}}}}}},
                "The tenant's counters")},
        }},
        "/api/v1/consumer-groups": {"get": {
            "summary": "Consumer groups, one entry per (group, queue)",
            "description": "Each entry: name, topics, queueName, members (the queue's "
                           "partitions: a group that has read a queue lags on all of them), "
                           "partitionsWithLag, totalLag (messages after the cursors), "
                           "maxTimeLag (seconds: age of the oldest unconsumed message), state "
                           "(Lagging past 300 s, Stable, Dead: never consumed), "
                           "subscriptionMode/Timestamp/CreatedAt (null here). " + _NOT_HERE,
            "operationId": "listConsumerGroups",
            "responses": {"200": _json(_ARRAY, "Consumer groups")},
        }},
        "/api/v1/consumer-groups/lagging": {"get": {
            "summary": "Partitions where a group's oldest unconsumed message is older than "
                       "minLagSeconds",
            "description": "Queen's snake_case rows: consumer_group, queue_name, "
                           "partition_name, partition_id, worker_id (null), offset_lag, "
                           "time_lag_seconds, lag_hours, oldest_unconsumed_at, "
                           "last_consumed_at, plus committed; oldest first. For a sealed "
                           "message the age is its segment's oldest (an upper bound).",
            "operationId": "laggingConsumerGroups",
            "parameters": [_query("minLagSeconds", {"type": "integer", "minimum": 0},
                                  "threshold in seconds (default 3600, as Queen)")],
            "responses": {"200": _json(_ARRAY, "Lagging partitions"), **_errors(400)},
        }},
        "/api/v1/consumer-groups/{group}": {
            "get": {
                "summary": "One group: per queue, per partition its cursor, lag and lease",
                "description": "{queue: {partitions: [{partition, partitionId, committed "
                               "(last offset done, -1: none), nextOffset, offsetLag, "
                               "timeLagSeconds, leaseActive, leaseExpiresAt, lastConsumedAt "
                               "(the cursor's last change), totalConsumed (committed + 1), "
                               "workerId (null)}]}}; {} for a group the tenant does not have.",
                "operationId": "getConsumerGroup",
                "parameters": [_GROUP],
                "responses": {"200": _json(_OBJECT, "The group by queue"), **_errors(400)},
            },
            "delete": {
                "summary": "Delete a group on every queue: its cursors and redelivery counts",
                "description": "Dead letters stay. A consumer still holding one of its leases "
                               "has its acks refused (not_delivered); the next pop starts "
                               "the group "
                               "afresh.",
                "operationId": "deleteConsumerGroup",
                "parameters": [_GROUP, delete_metadata],
                "responses": {"200": deleted, **_errors(400)},
            },
        },
        "/api/v1/consumer-groups/{group}/queues/{queue}": {"delete": {
            "summary": "Delete a group on one queue",
            "operationId": "deleteConsumerGroupForQueue",
            "parameters": [_GROUP, _path_param("queue", "queue name"), delete_metadata],
            "responses": {"200": deleted, **_errors(400)},
        }},
        "/api/v1/consumer-groups/{group}/queues/{queue}/seek": {"post": {
            "summary": "Move a group's cursor: to the end, to a timestamp or to an offset",
            "description": "Exactly one of toEnd: true; timestamp (ISO-8601: the next pop "
                           "returns the first message created after it; before every "
                           "message: from the start); offset (the next pop returns that "
                           "offset, committed = offset - 1; below log_start: from log_start; "
                           "past the end: 400). partition limits the seek to one partition "
                           "(offset: default 'Default'). Cursors are created where the group "
                           "had none. A live lease is cleared, as Queen does: its holder's "
                           "acks are then refused (lease_lost) and its messages are handed out "
                           "again from the new position. Out-of-order acks and redelivery "
                           "counts are cleared too.",
            "operationId": "seekConsumerGroup",
            "parameters": [_GROUP, _path_param("queue", "queue name")],
            "requestBody": {"required": False, "content": {"application/json": {"schema": {
                "type": "object", "properties": {
                    "toEnd": {"type": "boolean"},
                    "timestamp": {"type": "string", "format": "date-time"},
                    "offset": {"type": "integer", "minimum": 0},
                    "partition": {"type": "string"}}}}}},
            "responses": {"200": _json(_OBJECT, "{success, consumerGroup, queueName, "
                                                "seekToEnd, targetTimestamp, offset, "
                                                "partitionsUpdated, partitions: [{partition, "
                                                "partitionId, committed, nextOffset, "
                                                "leaseCleared}]}"),
                          **_errors(400, 404)},
        }},
        "/api/v1/resources/overview": {"get": {
            "summary": "The tenant at a glance: queues, partitions, message counts, lag",
            "description": "messages {total, pending, processing, completed, failed (0), "
                           "deadLetter}: completed is what every consumer group of a "
                           "partition has passed, processing what live leases hold. lag "
                           "{time, offset} {avg, median, min, max} over every group's "
                           "partitions. " + _NOT_HERE,
            "operationId": "overview",
            "responses": {"200": _json(_OBJECT, "Overview")},
        }},
        "/api/v1/resources/namespaces": {"get": {
            "summary": "Queen's namespaces: none exist in this broker (always empty)",
            "operationId": "namespaces",
            "responses": {"200": _json(_OBJECT, "{namespaces: []}")},
        }},
        "/api/v1/resources/tasks": {"get": {
            "summary": "Queen's tasks: none exist in this broker (always empty)",
            "operationId": "tasks",
            "responses": {"200": _json(_OBJECT, "{tasks: []}")},
        }},
        "/api/v1/resources/partitions": {"get": {
            "summary": "Partitions with offsets, groups, leases and message counts",
            "operationId": "listPartitions",
            "parameters": [_query("queue", {"type": "string"}, "queue name"), *page],
            "responses": {"200": _json(_OBJECT, "{partitions: [...], pagination}"),
                          **_errors(400)},
        }},
        "/api/v1/status": {"get": {
            "summary": "Dashboard status: message counts, leases, dead letters, queues",
            "description": "throughput is empty and totalAcked null: this broker keeps no "
                           "history. " + _NOT_HERE,
            "operationId": "status",
            "parameters": [_query("queue", {"type": "string"}, "queue name"), *window],
            "responses": {"200": _json(_OBJECT, "Status"), **_errors(400)},
        }},
        "/api/v1/messages": {"get": {
            "summary": "Messages created in a time window, newest first, with their status",
            "description": "status across the partition's consumer groups: dead_letter, "
                           "completed (every group passed it), processing (under a live "
                           "lease), pending. Sealed messages are included (sealed: true). "
                           + _NOT_HERE,
            "operationId": "listMessages",
            "parameters": [
                _query("queue", {"type": "string"}, "queue name"),
                _query("partition", {"type": "string"}, "partition name"),
                _query("status", {"enum": ["pending", "processing", "completed",
                                           "dead_letter"]}, "only this status"),
                *window, *page],
            "responses": {"200": _json(_OBJECT, "{messages, mode, pagination}"),
                          **_errors(400)},
        }},
        "/api/v1/messages/{partition_id}/{transaction_id}": {"get": {
            "summary": "One message with its payload and where each consumer group stands",
            "operationId": "getMessage",
            "parameters": [_path_param("partition_id", "partitionId (UUID)"),
                           _path_param("transaction_id", "the message's transactionId")],
            "responses": {"200": _json(_OBJECT, "The message"), **_errors(400, 404)},
        }},
    }


def _no_route_for_odd_names(paths: dict[str, Any]) -> dict[str, Any]:
    """A path parameter left empty (``//`` in the path) matches no route: every operation with
    a path parameter may answer 404, and says so. (A line break in a name reaches the handler,
    which answers 400.)"""
    for operations in paths.values():
        for operation in operations.values():
            if any(p.get("in") == "path" for p in operation.get("parameters", ())):
                operation["responses"].setdefault("404", _json(_ERROR, "No such route"))
    return paths


# Writes that add stored bytes: refused with 403 storage_full past the plan's maxStoredBytes
# (api/tenancy.py enforce_storage_gate; Queen never answers 507).
_STORAGE_GATED = {"kvBatch", "kvPut", "locks", "transaction", "push"}
# Never refused by the quota or the gate (api/tenancy.py never_refused).
_NEVER_REFUSED = {"cancelTimer"}


_OPERATOR_ONLY = {"metrics", "metricsPrometheus", "switches", "setSwitches"}
_REFUSED_403 = _json(_ERROR, "host_not_allowed: a Host this broker does not answer to (auth "
                             "off: localhost, IP addresses, QUEEN_ALLOWED_HOSTS); cross_origin "
                             "(/api/ only): sent by another origin's web page")


def _tenancy(paths: dict[str, Any]) -> dict[str, Any]:
    """Every /api/ operation takes the bearer token (required with QUEEN_AUTH=on, so the
    security requirement lists "none" too) and may answer 401, 503 (with Retry-After) and,
    but for a timer's cancel, 429 (with Retry-After); the writes that add stored bytes may
    answer 403 storage_full. /metrics takes a token of the
    operator tenant when auth is on (403 for another tenant's). The other ops routes
    (/health, /openapi.json) and the dashboard's files take no token at all. Anything may
    answer 403 for its Host or origin (api/origin.py)."""
    for path, operations in paths.items():
        for operation in operations.values():
            responses = operation["responses"]
            if operation["operationId"] in _STORAGE_GATED:
                responses.setdefault("403", _json(_ERROR, "storage_full: the storage gate (the "
                                                          "tenant's stored bytes are at its "
                                                          "plan's ceiling); host_not_allowed, "
                                                          "cross_origin as anywhere"))
            responses.setdefault("403", _REFUSED_403)
            if operation["operationId"] in _OPERATOR_ONLY:
                operation["security"] = [{"bearer": []}, {}]
                responses.setdefault("401", _errors(401)["401"])
                responses.setdefault("429", _errors(429)["429"])
                continue
            if not path.startswith("/api/"):
                operation["security"] = []
                continue
            operation["security"] = [{"bearer": []}, {}]
            responses.setdefault("401", _errors(401)["401"])
            responses.setdefault("503", _errors(503)["503"])
            if operation["operationId"] not in _NEVER_REFUSED:
                responses.setdefault("429", _errors(429)["429"])
    return paths


def _ui_paths() -> dict[str, Any]:
    """The operator's dashboard (api/ui.py): static files, no token (the page asks for one
    and sends it only to /api/ on this origin)."""
    def asset(summary: str, operation_id: str, media: str) -> dict[str, Any]:
        return {"get": {"summary": summary, "operationId": operation_id, "responses": {
            "200": {"description": "served with a strict Content-Security-Policy and "
                                   "X-Content-Type-Options: nosniff",
                    "content": {media: {"schema": {"type": "string"}}}}}}}
    return {
        "/ui": asset("The operator's dashboard (HTML page)", "dashboard", "text/html"),
        "/ui/": {"get": {"summary": "The dashboard's address with a trailing slash",
                         "operationId": "dashboardSlash", "responses": {
                             "308": {"description": "Permanent redirect to /ui",
                                     "headers": {"Location": {"schema": {"type": "string"}}}}}}},
        "/ui/app.js": asset("The dashboard's script", "dashboardScript", "text/javascript"),
        "/ui/app.css": asset("The dashboard's stylesheet", "dashboardStylesheet", "text/css"),
    }


# Surfaces an operator can pause (api/switches.py): 503 with Retry-After: 1, and the code.
_PAUSABLE = {
    "kvBatch": "kv_disabled", "kvPut": "kv_disabled", "kvGet": "kv_disabled",
    "kvDelete": "kv_disabled", "locks": "kv_disabled",
    "timersBatch": "timers_disabled (a batch that schedules or reschedules; cancels alone "
                   "never are)",
    "scheduleTimer": "timers_disabled",
}


def _paused(paths: dict[str, Any]) -> dict[str, Any]:
    """What a surface paused by an operator's runtime switch answers (docs/operations.md,
    "Runtime switches"): 503 on its routes, 403 on a transaction whose rider uses it. Timer
    cancels and reads are never paused."""
    for operations in paths.values():
        for operation in operations.values():
            code = _PAUSABLE.get(operation["operationId"])
            if code is not None:
                operation["responses"]["503"] = {
                    **_json(_ERROR, f"{code}: paused by an operator's runtime switch "
                                    "(error and reason carry the code); retry later"),
                    "headers": {"Retry-After": {"schema": {"type": "integer"},
                                                "description": "1 (seconds)"}}}
            if operation["operationId"] == "transaction":
                operation["responses"]["403"] = _json({"anyOf": [
                    schema.ref(transaction_models.TransactionPaused), _ERROR]}, (
                    "kv_disabled: a kv rider while an operator has paused KV; "
                    "timers_disabled: a timers rider that schedules while scheduling is "
                    "paused (permanent: not to be retried in a loop; the code is in error and "
                    "reason, nothing is written); storage_full: the storage gate (the tenant's "
                    "stored bytes are at its plan's ceiling); host_not_allowed, cross_origin as "
                    "anywhere"))
    return paths


def _switch_paths() -> dict[str, Any]:
    state = _json({"type": "object", "required": [
        "kvEnabled", "timersScheduleEnabled", "timersFireEnabled", "switches"], "properties": {
        "kvEnabled": {"type": "boolean"}, "timersScheduleEnabled": {"type": "boolean"},
        "timersFireEnabled": {"type": "boolean"},
        "switches": {"type": "object", "additionalProperties": {"type": "boolean"},
                     "description": "by their names in queen.runtime_switches"},
        "message": {"type": "string"}}}, "The switches as the database has them")
    return {"/api/v1/system/kv-timers": {
        "get": {"summary": "The runtime switches (with QUEEN_AUTH=on, a token of "
                           "QUEEN_OPERATOR_TENANT)",
                "operationId": "switches", "responses": {"200": state}},
        "post": {"summary": "Pause or resume KV, the scheduling of timers or their fire, on "
                            "every broker of the database within a second (Queen's kill "
                            "switches; the CLI: queen-trio switches)",
                 "operationId": "setSwitches",
                 "requestBody": _body({"type": "object", "minProperties": 1,
                                       "additionalProperties": False, "properties": {
                                           "kv": {"type": "boolean"},
                                           "timersSchedule": {"type": "boolean"},
                                           "timersFire": {"type": "boolean"}},
                                       "description": "each field optional and independent: "
                                                      "an omitted one is left as it is"}),
                 "responses": {"200": state, **_errors(400)}},
    }}


# Queen's surfaces answered with a JSON 404 that says why and what to use instead
# (api/unsupported.py; docs/queen-compatibility.md).
_UNSUPPORTED = {
    "ephemeral": ("ephemeral_unsupported: in-memory queues are not supported (every message "
                  "is stored durably); use an ordinary queue",
                  ("/api/v1/ephemeral", "/api/v1/ephemeral/{rest}")),
    "streams": ("streams_unsupported: Queen's streams runtime is not supported; consume with "
                "pop or POST /api/v1/fetch, keep state in KV",
                ("/streams/v1", "/streams/v1/{rest}")),
    "maintenance": ("maintenance_unsupported: there is no maintenance mode; a push is committed "
                    "or refused (503 while the database is unreachable)",
                    ("/api/v1/system/maintenance", "/api/v1/system/maintenance/pop")),
}


def _unsupported_paths() -> dict[str, Any]:
    paths: dict[str, Any] = {}
    for kind, (why, routes) in _UNSUPPORTED.items():
        for n, route in enumerate(routes):
            operations: dict[str, Any] = {}
            for method in ("get", "post", "put", "patch", "delete"):
                operation: dict[str, Any] = {
                    "summary": f"Not supported here: always 404 ({why.split(':')[0]})",
                    "operationId": f"{kind}Unsupported{n}{method.capitalize()}",
                    "responses": {"404": _error(404, why)}}
                if "{rest}" in route:
                    operation["parameters"] = [{"name": "rest", "in": "path", "required": True,
                                                "schema": {"type": "string"}}]
                operations[method] = operation
            paths[route] = operations
    return paths


@cache
def openapi_document() -> dict[str, Any]:
    document = _document()
    document["paths"].update(_switch_paths())
    document["paths"].update(_unsupported_paths())
    _paused(document["paths"])
    _no_route_for_odd_names(document["paths"])
    _tenancy(document["paths"])
    return document


def _document() -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "queen-trio",
            "version": __version__,
            "description": "A PostgreSQL-backed message broker with durable, cancellable timers. "
            "Wire conventions follow Queen's v1 HTTP API.",
        },
        "paths": {
            "/health": {
                "get": {
                    "summary": "Database round trip, schema version and service liveness",
                    "operationId": "health",
                    "responses": {
                        "200": _json({"$ref": "#/components/schemas/Health"}, "Healthy"),
                        "503": _json(
                            {"$ref": "#/components/schemas/Health"},
                            "The database is unreachable or a service is down",
                        ),
                    },
                }
            },
            "/metrics": {
                "get": {
                    "summary": "Prometheus metrics (same as /metrics/prometheus); with "
                               "QUEEN_AUTH=on, a token of QUEEN_OPERATOR_TENANT",
                    "operationId": "metrics",
                    "responses": {
                        "200": {
                            "description": "Prometheus text exposition format",
                            "content": {"text/plain": {"schema": {"type": "string"}}},
                        }
                    },
                }
            },
            "/metrics/prometheus": {
                "get": {
                    "summary": "Prometheus metrics",
                    "operationId": "metricsPrometheus",
                    "responses": {
                        "200": {
                            "description": "Prometheus text exposition format",
                            "content": {"text/plain": {"schema": {"type": "string"}}},
                        }
                    },
                }
            },
            **_log_paths(),
            **_admin_paths(),
            **_kv_and_transaction_paths(),
            **_timer_paths(),
            **_ui_paths(),
            "/openapi.json": {
                "get": {
                    "summary": "This document",
                    "operationId": "openapi",
                    "responses": {"200": _json({"type": "object"}, "OpenAPI 3.1 document")},
                }
            },
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                                           "description": "required when QUEEN_AUTH=on"}},
            "schemas": {
                **schema.components(),  # timers, log answers: declared once in queen_trio/models
                "Error": {
                    "type": "object",
                    "description": "Queen's error shape (error, detail, reason) with our "
                                   "ok and message beside it",
                    "required": ["ok", "error", "message", "detail"],
                    "properties": {
                        "ok": {"const": False},
                        "error": {"type": "string", "description": "stable snake_case code "
                                  "(queen-mq's code)"},
                        "message": {"type": "string"},
                        "reason": {"type": "string", "description": "the precise code under a "
                                   "generic one (timers_bad_request)"},
                        "detail": {"type": "string", "description": "the text (queen-mq's "
                                   "exception message)"},
                        "field": {"type": "string", "description": (
                            "with invalid_json_value: the path of the value the body may not "
                            "carry (NaN, ±Infinity, a number beyond a double, \\u0000, an "
                            "unpaired surrogate), e.g. items[3].payload.price")},
                    },
                },
                "Health": {
                    "type": "object",
                    "required": ["ok", "database", "schemaVersion", "services"],
                    "properties": {
                        "ok": {"type": "boolean"},
                        "database": {"enum": ["up", "down"]},
                        "schemaVersion": {"type": ["integer", "null"]},
                        "services": {
                            "type": "object",
                            "additionalProperties": {"enum": ["up", "down"]},
                        },
                        "server": {
                            "description": "The PostgreSQL server the broker's pool is on "
                                           "(with a multi-host QUEEN_DATABASE_URL, the "
                                           "writable one it found); null while the database "
                                           "does not answer",
                            "type": ["object", "null"],
                            "required": ["host", "port", "inRecovery"],
                            "properties": {
                                "host": {"type": "string",
                                         "description": "host name, address or socket "
                                                        "directory, as in the URL"},
                                "port": {"type": "integer"},
                                "inRecovery": {"type": "boolean",
                                               "description": "pg_is_in_recovery(): true "
                                                              "on a standby (never for a "
                                                              "serving broker)"},
                            },
                        },
                    },
                },
            },
            "responses": {
                "NotFound": _json(_ERROR, "No such route or resource"),
                "BadRequest": _json(_ERROR, "Malformed JSON or invalid fields"),
            },
        },
    }

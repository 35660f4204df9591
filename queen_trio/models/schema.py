"""JSON Schemas of the wire models for the OpenAPI document (components/schemas)."""

from __future__ import annotations

from typing import Any

import msgspec

from . import kv, locks, log, timers, transaction

REF = "#/components/schemas/{name}"
# The models whose schemas /openapi.json carries (and the ones they refer to).
MODELS: tuple[Any, ...] = (timers.TimerOp, timers.TimerBatch, timers.TimerResult,
                           timers.TimerResults, timers.TimerRow, timers.TimerFound,
                           timers.TimerMissing, timers.TimerPage, timers.TimerCount,
                           kv.KvOp, kv.KvCall, kv.KvPutBody, kv.KvDeleteBody,
                           kv.KvResults, kv.KvPreconditionFailed,
                           locks.LockOp, locks.LockCall, locks.LockResults, transaction.Bundle,
                           transaction.TransactionDone, transaction.TransactionRefused,
                           transaction.TransactionPaused, timers.TransactionScheduled,
                           log.ConfigureBody, log.PushBody, log.Ack, log.AckBatch, log.SettleBody,
                           log.ExtendBody, log.FetchBody, log.ChangedBody, log.Pushed,
                           log.PopResponse, log.AckResult, log.LeaseExtended, log.Configured,
                           log.Fetched, log.PartitionsChanged, log.QueueList, log.QueueDetail,
                           log.QueueDeleted)


def components() -> dict[str, Any]:
    """The schemas of :data:`MODELS`, by name, referring to each other by ``$ref``."""
    _, schemas = msgspec.json.schema_components(MODELS, ref_template=REF)
    for schema in schemas.values():
        schema.pop("title", None)  # (the name already says it)
    # The route takes unknown option names (and lists them); only the model refuses them.
    schemas["QueueOptions"]["additionalProperties"] = {
        "description": "unknown option names are listed in ignored and unknown"}
    return schemas


def ref(model: type) -> dict[str, str]:
    return {"$ref": REF.format(name=model.__name__)}

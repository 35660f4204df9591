"""KV routes on Queen's wire: ``POST /api/v1/kv`` (a batch of ops, one transaction, the whole
surface) and the sugar ``GET|PUT|DELETE /api/v1/kv/{ns}/{key}`` (the key may contain '/').

The status says how the call went, never what an op found: a missing key, a lost race, a
delete that hit nothing are all 200 with an explicit field. A lost ``required`` precondition
rolls the call back and is 200 too (:func:`precondition_answer`).
"""

from __future__ import annotations

from typing import Any

import msgspec
from quart import Blueprint, Response, request

from ..kv import rules, store
from ..kv.rules import PreconditionLost, bad
from ..models import codec
from ..models import kv as models
from .common import broker as _broker
from .common import model_response
from .errors import install_family_errors, read_body_via
from .switches import require_kv
from .tenancy import current_tenant_id, enforce_storage_gate, message_ceiling

kv_routes = Blueprint("kv", __name__, url_prefix="/api/v1/kv")
install_family_errors(kv_routes, "kv_bad_request")

# Ops that can add a row or bytes: refused past the tenant's storage gate.
_ADDS_STORAGE = frozenset({"put", "putIfAbsent", "incr"})


def precondition_answer(lost: PreconditionLost, failed_index: int,
                        transaction_id: str | msgspec.UnsetType = msgspec.UNSET,
                        ) -> models.KvPreconditionFailed:
    """The 200 answer of a call whose ``required`` op did not apply: nothing was committed,
    and the loser learns what it lost to (``kvReason``, ``version``, ``value``)."""
    return models.KvPreconditionFailed(
        ok=False, success=False, reason="kv_precondition", error="kv_precondition_failed",
        message=f"a required kv op did not apply ({lost.result['reason']}); "
                f"nothing was committed",
        results=[], failed_index=failed_index, kv_reason=lost.result["reason"],
        version=lost.result.get("version", 0), value=lost.result.get("value"),
        transaction_id=transaction_id)


def result_models(results: list[dict[str, Any]]) -> list[models.KvResult]:
    """The store's results as the wire models they are (each picked by its ``op``)."""
    return codec.as_model(results, models.RESULTS_DECODER)


async def apply_ops(ops: list[rules.Op]) -> list[models.KvResult] | models.KvPreconditionFailed:
    """Apply a validated call: its results, or the precondition answer."""
    broker = _broker()
    require_kv(broker)  # paused by an operator: every KV route answers 503
    if any(op.kind in _ADDS_STORAGE for op in ops):
        enforce_storage_gate()
    db = broker.db
    if len(ops) == 1 and ops[0].kind in rules.READS:
        # One statement that writes nothing: no BEGIN and COMMIT round trips around it.
        return result_models(await db.run_autocommit(store.apply, current_tenant_id(), ops))
    try:
        return result_models(await db.run_transaction(store.apply, current_tenant_id(), ops))
    except PreconditionLost as lost:
        return precondition_answer(lost, lost.result["index"])


@kv_routes.post("")
async def batch() -> Response:
    body = await read_body_via(models.CALL_DECODER)
    if isinstance(body, dict) and set(body) == {"operations"}:
        body = body["operations"]
    if not isinstance(body, list):
        raise bad("kv_bad_body", 'the body is an array of operations, or {"operations": [...]}')
    answer = await apply_ops(rules.parse_call(body, ceiling=message_ceiling()))
    if isinstance(answer, models.KvPreconditionFailed):
        return model_response(answer)
    return model_response(models.KvResults(answer))


def _no_query() -> None:
    # A prefix (or any name) in a URL lands in every access log on the way: reads by prefix
    # live in the POST body only, and these routes take no parameters at all.
    if request.args:
        raise bad("kv_no_query_string", "the KV path routes take no query parameters; "
                                        "prefix reads are POST /api/v1/kv")


async def _path_body(allowed: frozenset[str], decoder: msgspec.json.Decoder[Any]
                     ) -> dict[str, Any]:
    body = await read_body_via(decoder, optional=True)
    if not isinstance(body, dict):
        raise bad("kv_bad_body", "the body must be a JSON object")
    for field in ("op", "ns", "namespace", "key"):
        if field in body:
            raise bad("kv_field_in_path",
                      f"{field!r} comes from the URL on this route and must not be in the body")
    unknown = set(body) - allowed
    if unknown:
        raise bad("kv_unknown_field", f"this route does not take {', '.join(sorted(unknown))}")
    return body


async def _one(op: dict[str, Any]) -> Response:
    parsed = rules.parse_op(0, op, ceiling=message_ceiling(), where="")
    answer = await apply_ops([parsed])
    result = answer if isinstance(answer, models.KvPreconditionFailed) else answer[0]
    response = model_response(result)
    if isinstance(result, models.KvGet) and result.found:
        # Saves bandwidth, not the round trip: a conditional write is `expect` in a body.
        response.headers["ETag"] = f'"{result.version}"'
    return response


@kv_routes.get("/<namespace>/<name:key>")
async def get(namespace: str, key: str) -> Response:
    _no_query()
    return await _one({"op": "get", "ns": namespace, "key": key})


@kv_routes.put("/<namespace>/<name:key>")
async def put(namespace: str, key: str) -> Response:
    _no_query()
    body = await _path_body(frozenset({"value", "ttlSeconds", "forever", "expect", "required"}),
                            models.PUT_DECODER)
    return await _one({**body, "op": "put", "ns": namespace, "key": key})


@kv_routes.delete("/<namespace>/<name:key>")
async def delete(namespace: str, key: str) -> Response:
    _no_query()
    body = await _path_body(frozenset({"expect", "required"}), models.DELETE_DECODER)
    return await _one({**body, "op": "delete", "ns": namespace, "key": key})

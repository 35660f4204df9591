"""KV routes: PUT|GET|DELETE /api/v1/kv/{namespace}/{key} (the key may contain '/')."""

from __future__ import annotations

from typing import Any

from quart import Blueprint, Response

from ..errors import ValidationError
from ..kv import rules, store
from ..wire import iso
from .common import broker as _broker
from .common import json_response
from .errors import read_json_object
from .tenancy import current_tenant_id, enforce_storage_gate, message_ceiling

kv_routes = Blueprint("kv", __name__, url_prefix="/api/v1/kv")



def put_to_wire(p: store.Put) -> dict[str, Any]:
    return {"ok": True, "namespace": p.namespace, "key": p.key, "created": p.created,
            "expiresAt": iso(p.expires_at)}


def parse_put(body: dict[str, Any], where: str = "") -> tuple[Any, int | None]:
    if "value" not in body:
        raise ValidationError("missing_field", f"{where}value is required")
    return body["value"], rules.ttl_seconds(body.get("ttlSeconds"), f"{where}ttlSeconds")


@kv_routes.put("/<namespace>/<name:key>")
async def put(namespace: str, key: str) -> Response:
    enforce_storage_gate()
    ns, k = rules.namespace(namespace), rules.key(key)
    value, ttl = parse_put(await read_json_object())
    result = await _broker().db.run(
        store.put, current_tenant_id(), ns, k, value, ttl, message_ceiling()
    )
    return json_response(put_to_wire(result))


@kv_routes.get("/<namespace>/<name:key>")
async def get(namespace: str, key: str) -> Response:
    ns, k = rules.namespace(namespace), rules.key(key)
    row = await _broker().db.run(store.get, current_tenant_id(), ns, k)
    return json_response({"namespace": ns, "key": k, "value": row["value"],
                    "expiresAt": iso(row["expires_at"]), "updatedAt": iso(row["updated_at"])})


@kv_routes.delete("/<namespace>/<name:key>")
async def delete(namespace: str, key: str) -> Response:
    ns, k = rules.namespace(namespace), rules.key(key)
    deleted = await _broker().db.run(store.delete, current_tenant_id(), ns, k)
    return json_response({"ok": True, "namespace": ns, "key": k, "deleted": deleted})

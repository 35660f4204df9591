"""KV state in the database, and the purger that removes expired keys."""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime
from typing import Any

import psycopg
import trio

from ..db import Database, queries
from ..db.rows import one
from ..db.transient import CountError, every
from ..errors import NotFound, PayloadTooLarge, ValidationError
from ..log.store import add_usage

Q = queries.load("kv")
Raw = psycopg.Connection[dict[str, Any]]

PURGE_INTERVAL_S = 5.0
PURGE_BATCH = 1000


@dataclasses.dataclass(frozen=True, slots=True)
class Put:
    namespace: str
    key: str
    expires_at: datetime | None
    created: bool


def put(
    raw: Raw, tenant_id: int, namespace: str, key: str, value: Any, ttl_s: int | None,
    ceiling: int,
) -> Put:
    try:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
        size = len(text.encode())
    except UnicodeEncodeError:
        raise ValidationError("invalid_value", "value contains an unpaired surrogate") from None
    if size > ceiling:
        raise PayloadTooLarge(
            "payload_too_large", f"value is {size} bytes, above the {ceiling}-byte ceiling"
        )
    params = {"tenant_id": tenant_id, "namespace": namespace, "key": key, "value": text,
              "ttl_s": ttl_s}
    old = raw.execute(Q.lock_existing, params).fetchone()
    row = one(raw.execute(Q.put, params))
    add_usage(raw, tenant_id, row["size_bytes"] - (old["size_bytes"] if old else 0))
    return Put(namespace, key, row["expires_at"], created=old is None or old["expired"])


def get(raw: Raw, tenant_id: int, namespace: str, key: str) -> dict[str, Any]:
    row = raw.execute(
        Q.get, {"tenant_id": tenant_id, "namespace": namespace, "key": key}
    ).fetchone()
    if row is None:
        raise NotFound("key_not_found", f"no key {key!r} in namespace {namespace!r}")
    return row


def delete(raw: Raw, tenant_id: int, namespace: str, key: str) -> bool:
    """Delete a key; True if a live one was there (deleting nothing is not an error)."""
    row = raw.execute(
        Q.delete, {"tenant_id": tenant_id, "namespace": namespace, "key": key}
    ).fetchone()
    if row is None:
        return False
    add_usage(raw, tenant_id, -row["size_bytes"])
    return bool(row["live"])


def purge_expired(raw: Raw, limit: int = PURGE_BATCH) -> int:
    removed = 0
    for row in raw.execute(Q.purge_expired, {"limit": limit}).fetchall():
        add_usage(raw, row["tenant_id"], -row["bytes"])
        removed += row["n"]
    return removed


async def run_purger(
    db: Database, *, interval_s: float = PURGE_INTERVAL_S,
    count_error: CountError | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Housekeeping: delete expired keys in batches (they are already invisible to reads)."""
    async def purge() -> None:
        while await db.run(purge_expired) == PURGE_BATCH:
            await trio.lowlevel.checkpoint()

    task_status.started()
    await every(interval_s, purge, what="KV purge", service="kv_purger",
                count_error=count_error)

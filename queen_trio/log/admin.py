"""Operators' reads (Queen's admin routes) and dead-letter pages.

Read-only and tenant-scoped. Each function takes a raw connection inside a transaction, as
those of :mod:`.store` do; SQL text lives in ``queen_trio/sql/admin.sql``.

Message counts per partition follow Queen's dashboards where the model allows: ``completed``
is what every consumer group of the partition has passed (the slowest cursor), ``processing``
what live leases hold, ``pending`` the rest.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from ..db import queries
from ..db.rows import DictConnection, one
from ..errors import NotFound
from . import frames as log_frames
from .segments import SegmentCache

Q = queries.load("admin")



def dead_letter_page(
    raw: DictConnection, tenant_id: int, *, queue: str | None, group: str | None,
    partition: str | None,
    after: int, offset: int, limit: int, since: datetime | None = None,
    until: datetime | None = None,
) -> tuple[list[dict[str, Any]], int]:
    """A page of dead letters (oldest first) and how many match the filters in all."""
    rows = raw.execute(
        Q.dead_letter_page,
        {"tenant_id": tenant_id, "queue": queue, "group": group, "partition": partition,
         "after": after, "offset": offset, "limit": limit, "from": since, "to": until},
    ).fetchall()
    return [r for r in rows if r["dead_letter_id"] is not None], rows[0]["total"]


def partition_states(raw: DictConnection, tenant_id: int, queue: str | None = None
                     ) -> list[dict[str, Any]]:
    """Every partition of the tenant (of ``queue``) with its message counts."""
    rows = raw.execute(Q.partition_states, {"tenant_id": tenant_id, "queue": queue}).fetchall()
    for r in rows:
        total = r["next_offset"] - r["log_start"]
        done = 0 if r["min_committed"] is None else r["min_committed"] + 1 - r["log_start"]
        completed = min(max(done, 0), total)
        processing = min(r["leased_frames"], total - completed)
        r["counts"] = {"total": total, "pending": total - completed - processing,
                       "processing": processing, "completed": completed,
                       "deadLetter": r["dead_letters"]}
    return rows


def counts(raw: DictConnection, tenant_id: int, queue: str | None = None) -> dict[str, int]:
    """Queues, dead letters and the partitions holding them."""
    key = {"tenant_id": tenant_id, "queue": queue}
    dead = one(raw.execute(Q.dead_letter_count, key))
    return {"queues": one(raw.execute(Q.queue_count, key))["n"], "deadLetters": dead["n"],
            "deadLetterPartitions": dead["partitions"]}


def message_page(
    raw: DictConnection, tenant_id: int, *, queue: str | None, partition: str | None,
    status: str | None, since: datetime, until: datetime, limit: int, offset: int,
    cache: SegmentCache | None = None,
) -> tuple[list[dict[str, Any]], int]:
    """A page of messages, newest first, and how many match in all. A sealed frame's
    ``created_at`` is read from its segment."""
    rows = raw.execute(
        Q.message_page,
        {"tenant_id": tenant_id, "queue": queue, "partition": partition, "status": status,
         "from": since, "to": until, "limit": limit, "offset": offset},
    ).fetchall()
    page = [r for r in rows if r["partition_id"] is not None]
    for r in page:
        if r["created_at"] is None:
            frame = log_frames.read_one(raw, r["partition_id"], r["offset"], cache)
            r["created_at"] = None if frame is None else frame.created_at
    return page, rows[0]["total"]


def message(raw: DictConnection, tenant_id: int, partition_id: uuid.UUID, transaction_id: str,
            cache: SegmentCache | None = None) -> dict[str, Any]:
    """One message by its address, with where each consumer group stands with it. When a
    transactionId occurs twice in a partition (a timer re-used after it fired), the newest."""
    part = raw.execute(Q.message_partition,
                       {"partition_id": partition_id, "tenant_id": tenant_id}).fetchone()
    if part is None:
        raise NotFound("message_not_found",
                       f"no message {transaction_id!r} in partition {partition_id}")
    for hit in raw.execute(Q.message_offsets,
                           {"partition_id": partition_id, "transaction_id": transaction_id,
                            "log_start": part["log_start"]}).fetchall():
        frame = log_frames.read_one(raw, partition_id, hit["offset"], cache)
        if frame is None:
            continue  # retention took it meanwhile
        key = {"partition_id": partition_id, "offset": frame.offset, "tenant_id": tenant_id}
        return {
            "partition": part, "frame": frame,
            "groups": raw.execute(Q.message_groups, key).fetchall(),
            "dead_letters": raw.execute(Q.message_dead_letters, key).fetchall(),
        }
    raise NotFound("message_not_found",
                   f"no message {transaction_id!r} in partition {partition_id}")

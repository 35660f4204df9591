"""Consumer-group administration: list, inspect, lag, delete, seek.

A consumer group is nothing but its cursors: one ``queen.cursors`` row per partition it has
read (or was seeked on), holding ``committed`` (the last offset done), the offsets acked out of
order and the partition lease. Each function takes a raw connection inside a transaction, as
those of :mod:`.store` do; SQL text lives in ``queen_trio/sql/groups.sql``.

Seeking clears a live lease rather than refusing (as Queen does): the holder's acks are then
refused (``lease_lost``) and its messages are handed out again from the new position.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from ..db import queries
from ..db.rows import DictConnection, one
from ..errors import NotFound, ValidationError
from . import frames as log_frames
from .segments import SegmentCache
from .store import wake_key

Q = queries.load("groups")
LOG = queries.load("log")



def group_partitions(raw: DictConnection, tenant_id: int, *, group: str | None = None,
                     queue: str | None = None) -> list[dict[str, Any]]:
    """Every cursor of the tenant (of one group, of one queue), with its lag: ``lag_messages``
    and ``lag_seconds`` (the age of the oldest message after the cursor; 0 when none)."""
    rows = raw.execute(Q.group_partitions,
                       {"tenant_id": tenant_id, "group": group, "queue": queue}).fetchall()
    for row in rows:
        oldest: datetime | None = row["oldest_at"]
        row["lag_seconds"] = (0 if oldest is None
                              else max(0, int((row["now"] - oldest).total_seconds())))
    return rows


def delete_group(raw: DictConnection, tenant_id: int, group: str, queue: str | None, *,
                 metadata: bool = True) -> int:
    """Forget the group (on one queue, or everywhere): its cursors and redelivery counts,
    and with ``metadata`` its subscription records and delivery policy (a
    ``subscriptionMode=new`` group then subscribes afresh, and its next pop registers its
    conflation again). Returns the number of cursors deleted. A consumer still holding a
    lease of the group then has its acks refused (``not_delivered``); a later pop starts
    the group afresh."""
    key = {"tenant_id": tenant_id, "group": group, "queue": queue}
    rows = raw.execute(Q.delete_group, key).fetchall()
    if metadata:
        raw.execute(Q.delete_group_subscriptions, key)
        raw.execute(Q.delete_group_policies, key)
    for name in sorted({row["queue"] for row in rows}):
        _wake(raw, tenant_id, name)  # the group starts afresh there: its pops look again
    return len(rows)


def _wake(raw: DictConnection, tenant_id: int, queue: str) -> None:
    raw.execute(LOG.notify_queue, {"payload": wake_key(tenant_id, queue)})


def seek(
    raw: DictConnection, tenant_id: int, group: str, queue: str, *, to_end: bool = False,
    at: datetime | None = None, offset: int | None = None, partition: str | None = None,
    cache: SegmentCache | None = None,
) -> list[dict[str, Any]]:
    """Move the group's cursor on each partition of ``queue`` (or on ``partition`` only):
    to the end (``to_end``), past every message created at or before ``at`` (the next pop
    returns the first one created after it), or to ``offset`` (the next pop returns that
    offset: ``committed = offset - 1``; below log_start it resumes at log_start).

    Cursors are created where the group had none. Out-of-order acks, redelivery counts and a
    live lease are cleared. Returns one dict per partition moved."""
    if not raw.execute(Q.queue_exists, {"tenant_id": tenant_id, "queue": queue}).fetchone():
        raise NotFound("queue_not_found", f"no queue {queue!r}")
    parts = raw.execute(Q.seek_partitions, {"tenant_id": tenant_id, "queue": queue,
                                            "partition": partition}).fetchall()
    if partition is not None and not parts:
        raise NotFound("partition_not_found", f"no partition {partition!r} in queue {queue!r}")
    moved = []
    for p in parts:
        pid: uuid.UUID = p["partition_id"]
        if to_end:
            committed = p["next_offset"] - 1
        elif at is not None:
            committed = _first_after(raw, pid, at, p["log_start"], p["next_offset"], cache) - 1
        else:
            assert offset is not None
            if offset > p["next_offset"]:
                raise ValidationError(
                    "invalid_offset",
                    f"offset {offset} is past the end of partition {p['name']!r} "
                    f"(next offset {p['next_offset']})")
            committed = max(offset, p["log_start"]) - 1
        row = one(raw.execute(Q.set_cursor, {"tenant_id": tenant_id, "partition_id": pid,
                                             "group": group, "committed": committed}))
        moved.append({"partition": p["name"], "partitionId": str(pid), "committed": committed,
                      "nextOffset": p["next_offset"], "leaseCleared": row["lease_cleared"]})
    if moved:
        _wake(raw, tenant_id, queue)
    return moved


def _first_after(raw: DictConnection, pid: uuid.UUID, at: datetime, log_start: int, end: int,
                 cache: SegmentCache | None) -> int:
    """The first retained offset of the partition whose message was created after ``at``
    (``end`` when none is). A partition's createdAt only grows with its offsets."""
    key = {"partition_id": pid, "at": at, "log_start": log_start}
    seg = raw.execute(Q.first_segment_after, key).fetchone()
    if seg is not None:
        if seg["first_created_at"] > at:
            return max(seg["first_offset"], log_start)
        start = max(seg["first_offset"], log_start)
        for f in log_frames.read(raw, pid, start, seg["last_offset"] - start + 1, cache=cache):
            if f.frame.created_at > at:
                return f.offset
        return seg["last_offset"] + 1  # (only if the clock went backwards)
    head = one(raw.execute(Q.first_head_after, key))["offset"]
    return end if head is None else head

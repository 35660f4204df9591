"""Reads by offset (Queen's ``POST /api/v1/fetch``) and partition discovery
(``POST /api/v1/partitions/changed``).

Neither is a pop: no lease is taken, no cursor is read or moved, nothing is written, so two
readers asking the same question get the same answer and no consumer group notices them. The
caller keeps its own position: a fetch answers each partition's records from an absolute offset
with the partition's ``highWatermark`` (the next offset it will assign) and ``logStartOffset``
(the oldest one retention kept), records or not. Discovery lists a queue's partitions with those
bounds, all of them by name or those written since an instant, a page at a time, and a
``safeTime`` below which no write can still appear.

Request rules are pure functions here (:func:`fetch_request`, :func:`changed_request`); the
reads are functions of a raw connection run in one transaction of READ COMMITTED statements.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import msgspec

from ..db import queries
from ..db.rows import DictConnection, one
from ..errors import ValidationError
from ..formats import iso
from ..models import log as models
from . import frames as log_frames
from .rules import DEFAULT_PARTITION, timestamp
from .segments import SegmentCache

Q = queries.load("reads")

OFFSET_OUT_OF_RANGE: Final = "OFFSET_OUT_OF_RANGE"
UNKNOWN_TOPIC_OR_PARTITION: Final = "UNKNOWN_TOPIC_OR_PARTITION"
BAD_CURSOR: Final = "BAD_CURSOR"

# Queen's ceilings. A fetch: entries per call, payload bytes per entry (default, most) and per
# call, records per entry. Bytes are the frames' payload JSON bytes (Queen counts compressed
# segment bytes; a frame here is read and sent as its JSON).
MAX_FETCH_ENTRIES = 1024
DEFAULT_ENTRY_BYTES = 1024 * 1024
MAX_ENTRY_BYTES = 8 * 1024 * 1024
MAX_CALL_BYTES = 64 * 1024 * 1024
MAX_RECORDS_PER_ENTRY = 10_000
MAX_WAIT_MS = 30_000
_READ_CHUNK = 500  # frames read per statement while filling an entry
# Discovery: queues per call, partitions per page (default and most).
MAX_CHANGED_ENTRIES = 64
CHANGED_PAGE = 1000
SAFE_TIME_GUARD_S = 5
SAFE_TIME_FLOOR_S = 30

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


# -- requests ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class FetchEntry:
    queue: str
    partition: str
    offset: int
    max_bytes: int


@dataclasses.dataclass(frozen=True, slots=True)
class FetchRequest:
    entries: list[FetchEntry]
    max_bytes: int  # the whole call's budget
    max_wait_ms: int  # park this long for a first record (0: answer at once)
    min_bytes: int  # payload bytes that end the park (0: never park)


def _known_fields(obj: dict[str, Any], allowed: tuple[str, ...], where: str) -> None:
    extra = sorted(k for k in obj if k not in allowed)
    if extra:
        raise ValidationError("unknown_field", f"{where}: unknown field {extra[0]!r} "
                                               f"(known: {', '.join(allowed)})")


def _int(value: Any, field: str, *, default: int | None = None, lo: int = 0) -> int:
    if value is None and default is not None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise ValidationError("invalid_field", f"{field} must be an integer of at least {lo}")
    return value


def _partition(value: Any, field: str) -> str:
    # Queen reads a number as the partition named by its digits (a Kafka facade's partitions).
    if value is None:
        return DEFAULT_PARTITION
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str) or not value:
        raise ValidationError("invalid_partition", f"{field} must be a partition name")
    return value


def _entries(body: dict[str, Any], fields: tuple[str, ...], most: int, per: str
             ) -> Iterator[tuple[str, dict[str, Any]]]:
    """The body's ``entries``: each an object naming a queue, with only ``fields``; yields
    each with its path for the error messages."""
    raw = body.get("entries", [])
    if not isinstance(raw, list):
        raise ValidationError("invalid_field", "entries must be an array")
    if len(raw) > most:
        raise ValidationError("too_many_entries", f"{len(raw)} entries: at most {most} {per}")
    for i, e in enumerate(raw):
        where = f"entries[{i}]"
        if not isinstance(e, dict):
            raise ValidationError("invalid_field", f"{where} must be an object")
        _known_fields(e, fields, where)
        if not isinstance(e.get("queue"), str) or not e["queue"]:
            raise ValidationError("missing_field", f"{where}.queue is required")
        yield where, e


def fetch_request(body: dict[str, Any]) -> FetchRequest:
    _known_fields(body, ("entries", "maxBytes", "maxWaitMs", "minBytes"), "fetch")
    entries = []
    for where, e in _entries(body, ("queue", "partition", "offset", "maxBytes"),
                             MAX_FETCH_ENTRIES, "per fetch"):
        if "offset" not in e:
            raise ValidationError("missing_field", f"{where}.offset is required (the bounds "
                                                   "are in every answer: highWatermark, "
                                                   "logStartOffset)")
        entries.append(FetchEntry(
            e["queue"], _partition(e.get("partition"), f"{where}.partition"),
            _int(e["offset"], f"{where}.offset"),
            min(max(_int(e.get("maxBytes"), f"{where}.maxBytes", default=DEFAULT_ENTRY_BYTES),
                    1), MAX_ENTRY_BYTES),
        ))
    return FetchRequest(
        entries,
        min(max(_int(body.get("maxBytes"), "maxBytes", default=MAX_CALL_BYTES), 1),
            MAX_CALL_BYTES),
        min(_int(body.get("maxWaitMs"), "maxWaitMs", default=0), MAX_WAIT_MS),
        _int(body.get("minBytes"), "minBytes", default=1),
    )


@dataclasses.dataclass(frozen=True, slots=True)
class ChangedEntry:
    queue: str
    since: datetime | None
    after: str | None
    limit: int


def changed_request(body: dict[str, Any]) -> list[ChangedEntry]:
    _known_fields(body, ("entries",), "partitions/changed")
    out = []
    for where, e in _entries(body, ("queue", "since", "after", "limit"), MAX_CHANGED_ENTRIES,
                             "per call"):
        since = e.get("since")
        after = e.get("after")
        if after is not None and not isinstance(after, str):
            raise ValidationError("invalid_field", f"{where}.after must be the next of a "
                                                   "previous answer")
        limit = _int(e.get("limit"), f"{where}.limit", default=CHANGED_PAGE, lo=-(2**63))
        out.append(ChangedEntry(
            e["queue"], None if since is None else timestamp(since, f"{where}.since"),
            after or None, min(max(limit, 1), CHANGED_PAGE)))
    return out


# -- fetch ------------------------------------------------------------------------------------


@dataclasses.dataclass(slots=True)
class FetchAnswer:
    body: models.Fetched
    bytes: int  # payload bytes delivered
    any_error: bool
    bounds: list[tuple[int, int]]  # (highWatermark, logStartOffset) of each entry


def fetch(raw: DictConnection, tenant_id: int, req: FetchRequest,
          cache: SegmentCache | None = None) -> FetchAnswer:
    """Each entry's records from its offset, contiguous, within its byte budget and the call's
    (the first record of the call always goes, so one large record cannot stall a reader), up
    to the high watermark read first."""
    rows = raw.execute(Q.fetch_bounds, {
        "tenant_id": tenant_id, "queues": [e.queue for e in req.entries],
        "partitions": [e.partition for e in req.entries]}).fetchall()
    budget = req.max_bytes
    delivered = 0
    any_error = False
    out = []
    bounds = []
    for e, b in zip(req.entries, rows, strict=True):
        high, start = b["high"], b["log_start"]
        records: list[models.FetchedRecord] = []
        error: models.FetchError | msgspec.UnsetType = msgspec.UNSET
        if b["queue_id"] is None:
            error = UNKNOWN_TOPIC_OR_PARTITION  # also another tenant's queue: the same answer
        elif e.offset < start or e.offset > high:
            error = OFFSET_OUT_OF_RANGE
        elif e.offset < high:
            records, size = _read_entry(raw, b["partition_id"], e, high, budget, delivered,
                                        cache)
            delivered += len(records)
            budget -= size
        any_error = any_error or error is not msgspec.UNSET
        out.append(models.FetchedEntry(queue=e.queue, partition=e.partition, records=records,
                                       highWatermark=high, logStartOffset=start, error=error))
        bounds.append((high, start))
    spent = req.max_bytes - budget
    return FetchAnswer(models.Fetched(entries=out), spent, any_error, bounds)


def _read_entry(raw: DictConnection, pid: uuid.UUID, e: FetchEntry, high: int, budget: int,
                delivered: int, cache: SegmentCache | None
                ) -> tuple[list[models.FetchedRecord], int]:
    records: list[models.FetchedRecord] = []
    size = 0
    at = e.offset
    while at < high and len(records) < MAX_RECORDS_PER_ENTRY:
        want = min(_READ_CHUNK, high - at, MAX_RECORDS_PER_ENTRY - len(records))
        got = log_frames.read(raw, pid, at, want, cache=cache)
        for rf in got:
            f = rf.frame
            cost = max(f.size_bytes, 1)  # an empty payload still counts: minBytes 1 = any record
            if (records or delivered) and (size + cost > e.max_bytes or cost > budget - size):
                return records, size
            records.append(models.FetchedRecord(
                offset=f.offset, transactionId=f.transaction_id, payload=f.payload,
                ts=iso(f.created_at)))  # type: ignore[arg-type]
            size += cost
        if len(got) < want:
            break  # retention dropped what followed meanwhile: the run ends at the gap
        at += len(got)
    return records, size


def moved(raw: DictConnection, tenant_id: int, req: FetchRequest,
          bounds: list[tuple[int, int]]) -> bool:
    """Whether any asked partition's bounds changed since ``bounds`` (a parked fetch's cheap
    check before reading again)."""
    rows = raw.execute(Q.fetch_bounds, {
        "tenant_id": tenant_id, "queues": [e.queue for e in req.entries],
        "partitions": [e.partition for e in req.entries]}).fetchall()
    return any((r["high"], r["log_start"]) != b for r, b in zip(rows, bounds, strict=True))


# -- partitions changed -----------------------------------------------------------------------


def _cursor_since(at: datetime, name: str) -> str:
    us = (at - _EPOCH) // timedelta(microseconds=1)
    return f"t|{us}|{name}"


def _parse_cursor(after: str, since_mode: bool) -> tuple[datetime | None, str] | None:
    """(instant, name) of an opaque cursor, or None when it is not one of this mode's."""
    if not since_mode:
        return (None, after[2:]) if after.startswith("n|") else None
    if not after.startswith("t|"):
        return None
    us, sep, name = after[2:].partition("|")
    if not sep or not us.isdigit() or len(us) > 18:
        return None
    return _EPOCH + timedelta(microseconds=int(us)), name


def partitions_changed(raw: DictConnection, tenant_id: int,
                       entries: list[ChangedEntry]) -> models.PartitionsChanged:
    # safeTime first: every statement after it sees a later snapshot (READ COMMITTED), so a
    # partition this answer misses was written by a transaction that started after it.
    safe = one(raw.execute(Q.safe_time, {"guard_s": SAFE_TIME_GUARD_S,
                                         "floor_s": SAFE_TIME_FLOOR_S}))
    out: list[models.ChangedQueue] = []
    for e in entries:
        found = raw.execute(Q.queue_id, {"tenant_id": tenant_id, "name": e.queue}).fetchone()
        if found is None:
            out.append(models.ChangedQueue(queue=e.queue, error=UNKNOWN_TOPIC_OR_PARTITION))
            continue
        cursor = None if e.after is None else _parse_cursor(e.after, e.since is not None)
        if e.after is not None and cursor is None:
            out.append(models.ChangedQueue(queue=e.queue, error=BAD_CURSOR))
            continue
        after_at, after = cursor if cursor is not None else (None, None)
        if e.since is None:
            rows = raw.execute(Q.partitions_by_name, {
                "queue_id": found["queue_id"], "after": after, "limit": e.limit}).fetchall()
        else:
            rows = raw.execute(Q.partitions_since, {
                "queue_id": found["queue_id"], "since": e.since, "after_at": after_at,
                "after": after, "limit": e.limit}).fetchall()
        parts = [models.ChangedPartition(name=r["name"], id=str(r["partition_id"]),
                                         lastOffset=r["last_offset"], logStart=r["log_start"],
                                         lastWriteAt=iso(r["at"]))  # type: ignore[arg-type]
                 for r in rows]
        nxt = None
        if len(rows) == e.limit:  # a full page: there may be more
            last = rows[-1]
            nxt = ("n|" + last["name"] if e.since is None
                   else _cursor_since(last["at"], last["name"]))
        out.append(models.ChangedQueue(queue=e.queue, partitions=parts, next=nxt))
    return models.PartitionsChanged(safeTime=iso(safe["safe_time"]),  # type: ignore[arg-type]
                                    safeTimeDegraded=safe["degraded"], entries=out)

"""Timers in the database: schedule, cancel, peek and list for clients; claim and fire for the
sweeper. SQL text lives in ``queen_trio/sql/timers.sql``.

Client-side functions run inside the caller's transaction (a single request, or a bundle of
``POST /transaction``), never wait on a row a sweeper has locked, and answer ``too_late`` for
a row under a live claim.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from datetime import datetime
from typing import Any

import psycopg

from ..db import queries
from ..log import rules as log_rules
from ..log import store as log_store
from ..wire import iso
from . import rules
from .rules import Schedule

Q = queries.load("timers")
NOTIFY_CHANNEL = "queen_timers"
TIMER_GROUP = log_rules.TIMER_GROUP

log = logging.getLogger(__name__)
Raw = psycopg.Connection[dict[str, Any]]


@dataclasses.dataclass(frozen=True, slots=True)
class Outcome:
    """The answer to a schedule or a cancel."""

    status: str  # scheduled | rescheduled | cancelled | absent | too_late
    queue: str
    key: str
    txn: str | None
    partition: str | None = None
    deliver_at: datetime | None = None

    @property
    def ok(self) -> bool:
        return self.status in ("scheduled", "rescheduled", "cancelled")


def schedule(raw: Raw, tenant_id: int, s: Schedule, *, notify_within_ms: int) -> Outcome:
    """Create or replace the timer (tenant, queue, key); decided under the row's lock."""
    (outcome,) = schedule_many(raw, tenant_id, [s], notify_within_ms=notify_within_ms)
    return outcome


def schedule_many(
    raw: Raw, tenant_id: int, schedules: list[Schedule], *, notify_within_ms: int
) -> list[Outcome]:
    """Schedule several timers in the caller's transaction, in order.

    Each timer is decided under its own row lock; what they have in common (implicit queue
    creation, the storage-usage change, the sweepers' wake-up) is written once for all.
    """
    outcomes: list[Outcome] = []
    usage = 0
    new_queues: set[str] = set()
    soonest = None
    for s in schedules:
        outcome, delta = _schedule_one(raw, tenant_id, s)
        outcomes.append(outcome)
        usage += delta
        if outcome.status == "scheduled":
            new_queues.add(s.queue)
        if outcome.ok and s.delay_ms < notify_within_ms:
            # Sweepers look again within MAX_SLEEP anyway; only sooner timers need a wake-up.
            if soonest is None or outcome.deliver_at < soonest:
                soonest = outcome.deliver_at
    for queue in sorted(new_queues):
        log_store.ensure_queue(raw, tenant_id, queue)
    log_store.add_usage(raw, tenant_id, usage)
    if soonest is not None:
        raw.execute(Q.notify_due, {"deliver_at": soonest})
    return outcomes


def _schedule_one(raw: Raw, tenant_id: int, s: Schedule) -> tuple[Outcome, int]:
    """(outcome, change of stored bytes)."""
    key = {"tenant_id": tenant_id, "queue": s.queue, "key": s.key}
    blob, size = rules.pack(s.payload)
    txn = s.txn or log_rules.new_transaction_id()
    values = {**key, "partition": s.partition, "txn": txn, "payload": blob,
              "payload_bytes": size, "delay_ms": s.delay_ms}
    for _ in range(2):
        row = raw.execute(Q.lock_timer, key).fetchone()
        if row is None:
            existing = raw.execute(Q.timer_exists, key).fetchone()
            if existing is not None:  # a firing transaction holds it right now
                return Outcome("too_late", s.queue, s.key, existing["txn"]), 0
            inserted = raw.execute(Q.insert_timer, values).fetchone()
            if inserted is None:
                continue  # created concurrently by another scheduler: look again
            return Outcome("scheduled", s.queue, s.key, txn, s.partition,
                           inserted["deliver_at"]), size
        if row["claimed"]:
            return Outcome("too_late", s.queue, s.key, row["txn"]), 0
        updated = raw.execute(Q.reschedule_timer, values).fetchone()
        return Outcome("rescheduled", s.queue, s.key, txn, s.partition,
                       updated["deliver_at"]), size - row["payload_bytes"]
    # The row appeared and vanished twice in a row: a fire is racing us.
    return Outcome("too_late", s.queue, s.key, None), 0


def cancel(raw: Raw, tenant_id: int, queue: str, key: str, echo_txn: str | None) -> Outcome:
    """Delete a pending timer. ``absent`` also covers "already delivered" and "another
    tenant's": the log, not this answer, says whether a message went out."""
    where = {"tenant_id": tenant_id, "queue": queue, "key": key}
    row = raw.execute(Q.lock_timer, where).fetchone()
    if row is None:
        existing = raw.execute(Q.timer_exists, where).fetchone()
        if existing is not None:
            return Outcome("too_late", queue, key, echo_txn or existing["txn"])
        return Outcome("absent", queue, key, echo_txn)
    if row["claimed"]:
        return Outcome("too_late", queue, key, echo_txn or row["txn"])
    raw.execute(Q.delete_timer, where)
    log_store.add_usage(raw, tenant_id, -row["payload_bytes"])
    return Outcome("cancelled", queue, key, echo_txn or row["txn"])


def peek(raw: Raw, tenant_id: int, queue: str, key: str) -> dict[str, Any] | None:
    row = raw.execute(Q.peek, {"tenant_id": tenant_id, "queue": queue, "key": key}).fetchone()
    if row is None:
        return None
    try:
        row["payload"] = rules.unpack(row["payload"])
    except ValueError:
        row["payload"] = None
    return row


def list_timers(raw: Raw, tenant_id: int, queue: str, after: str, limit: int) -> list[dict]:
    return raw.execute(
        Q.list, {"tenant_id": tenant_id, "queue": queue, "after": after, "limit": limit}
    ).fetchall()


# -- the sweeper's side -----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Claimed:
    tenant_id: int
    queue: str
    key: str
    partition: str
    txn: str
    payload: bytes
    payload_bytes: int
    deliver_at: datetime
    attempts: int
    due_at: datetime


_CLAIMED_FIELDS = [f.name for f in dataclasses.fields(Claimed)]


@dataclasses.dataclass(frozen=True, slots=True)
class ClaimResult:
    rows: list[Claimed]
    next_due: float | None  # epoch seconds (database clock) of the earliest visible_at
    db_now: float  # epoch seconds (database clock) when the claim ran


def claim(raw: Raw, token: uuid.UUID, broker: str, batch: int, lease_ms: int) -> ClaimResult:
    """One statement, so it may run in autocommit as its own transaction."""
    rows = raw.execute(
        Q.claim, {"token": token, "broker": broker, "batch": batch, "lease_ms": lease_ms},
        binary=True,  # payloads come back as raw bytes, not hex text
    ).fetchall()
    clock = rows[0]  # the clock columns ride on every row; one row even if nothing was due
    claimed = [Claimed(**{f: r[f] for f in _CLAIMED_FIELDS}) for r in rows if r["key"] is not None]
    claimed.sort(key=lambda c: c.due_at)
    return ClaimResult(claimed, clock["next_due"], clock["db_now"])


@dataclasses.dataclass(frozen=True, slots=True)
class FireResult:
    fired: list[Claimed]
    failed: list[tuple[Claimed, str]]  # permanent failures that spent an attempt
    dead_lettered: list[tuple[Claimed, str]]
    lost: int  # rows whose claim was no longer ours


def fire(
    raw: Raw, token: uuid.UUID, claimed: list[Claimed], *, ceilings: dict[int, int],
    max_attempts: int, backoff_ms: int,
) -> FireResult:
    """Append the claimed timers' frames and delete their rows, in the caller's transaction.

    Rows are deleted first, and only those still carrying our claim token; frames are appended
    for exactly those, in due order. A row whose payload cannot become a frame spends one
    attempt (or is dead-lettered once the budget is spent).
    """
    ready: list[tuple[Claimed, str]] = []
    failed: list[tuple[Claimed, str]] = []
    dead: list[tuple[Claimed, str]] = []
    for c in claimed:
        try:
            payload = rules.unpack_text(c.payload)
            ceiling = ceilings.get(c.tenant_id, log_rules.DEFAULT_MAX_MESSAGE_BYTES)
            if c.payload_bytes > ceiling:
                raise ValueError(
                    f"payload is {c.payload_bytes} bytes, above the tenant's "
                    f"{ceiling}-byte message ceiling"
                )
        except ValueError as exc:
            if _spend_attempt(raw, token, c, str(exc), max_attempts, backoff_ms):
                dead.append((c, str(exc)))
            else:
                failed.append((c, str(exc)))
            continue
        ready.append((c, payload))

    if not ready:
        return FireResult([], failed, dead, 0)
    gone = {
        (r["tenant_id"], r["queue"], r["timer_key"])
        for r in raw.execute(
            Q.delete_fired,
            {"token": token, "tenant_ids": [c.tenant_id for c, _ in ready],
             "queues": [c.queue for c, _ in ready], "keys": [c.key for c, _ in ready]},
        )
    }
    mine = [(c, p) for c, p in ready if (c.tenant_id, c.queue, c.key) in gone]
    by_tenant: dict[int, list[tuple[Claimed, str]]] = {}
    for c, p in mine:
        by_tenant.setdefault(c.tenant_id, []).append((c, p))
    for tenant_id, items in by_tenant.items():
        log_store.append(raw, tenant_id, [
            log_store.NewFrame(c.queue, c.partition, None, c.txn, payload_json=p,
                               meta={"timer": {"key": c.key, "deliverAt": iso(c.deliver_at)}})
            for c, p in items
        ], usage_offset=-sum(c.payload_bytes for c, _ in items))
    return FireResult([c for c, _ in mine], failed, dead, len(ready) - len(mine))


def _spend_attempt(
    raw: Raw, token: uuid.UUID, c: Claimed, error: str, max_attempts: int, backoff_ms: int
) -> bool:
    """Record a permanent failure; True if it exhausted the budget (row dead-lettered)."""
    where = {"tenant_id": c.tenant_id, "queue": c.queue, "key": c.key, "token": token}
    attempts = c.attempts + 1
    if attempts < max_attempts:
        raw.execute(Q.fail_timer, {**where, "error": error,
                                   "backoff_ms": rules.backoff_ms(attempts, backoff_ms)})
        return False
    deleted = raw.execute(Q.delete_claimed, where).fetchone()
    if deleted is None:
        return False  # no longer ours: whoever holds it now decides
    try:
        payload = rules.unpack(c.payload)
    except ValueError:
        payload = {"undecodablePayloadBytes": len(c.payload)}
    log_store.ensure_queue(raw, c.tenant_id, c.queue)
    raw.execute(Q.dead_letter_timer, {
        "tenant_id": c.tenant_id, "queue": c.queue, "partition": c.partition, "txn": c.txn,
        "payload": log_store.to_json(payload), "attempts": attempts, "error": error,
    })
    log_store.add_usage(raw, c.tenant_id, -c.payload_bytes)
    return True


def release(raw: Raw, token: uuid.UUID) -> int:
    return raw.execute(Q.release_claim, {"token": token}).rowcount


def pending_count(raw: Raw) -> int:
    return raw.execute(Q.pending_count).fetchone()["n"]

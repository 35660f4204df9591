"""Timers in the database: schedule, cancel, peek and list for clients; claim and fire for the
sweeper. SQL text lives in ``queen_trio/sql/timer_store.sql``.

Client-side functions run inside the caller's transaction (a single request, or a bundle of
``POST /transaction``), never wait on a row a sweeper has locked, and answer ``too_late`` for
a row under a live claim.
"""

from __future__ import annotations

import base64
import dataclasses
import logging
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import psycopg
from psycopg.rows import tuple_row

from ..db import queries
from ..db.arrays import pg_array
from ..db.bridge import LoneStatement
from ..db.pool import Database
from ..db.rows import DictConnection, one
from ..db.transient import TRANSIENT_ERRORS, describe
from ..log import rotation as log_rotation
from ..log import rules as log_rules
from ..log import store as log_store
from ..sealing import PayloadCipher
from . import rules
from .rules import Cancel, Schedule

Q = queries.load("timer_store")
NOTIFY_CHANNEL = "queen_timers"
TIMER_GROUP = log_rules.TIMER_GROUP

log = logging.getLogger(__name__)


class Outcome(msgspec.Struct, frozen=True):
    """The answer to a schedule or a cancel. (A Struct: one is made per timer of a bundle,
    and a frozen dataclass's __init__ cost several times as much.)"""

    status: str  # scheduled | rescheduled | cancelled | absent | too_late
    queue: str
    key: str
    txn: str | None
    partition: str | None = None
    deliver_at: datetime | None = None
    # Schedules: the id the fired frame will carry, as its text (a version 7 UUID's, as the
    # answer writes it). Text, not uuid.UUID: an object the garbage collector tracks, which
    # made this Outcome and its answer's model tracked too, 1,500 per bundle of 500 timers.
    message_id: str | None = None

    @property
    def ok(self) -> bool:
        return self.status in ("scheduled", "rescheduled", "cancelled")


def sealed(raw: DictConnection, tenant_id: int, schedules: list[Schedule],
           cipher: PayloadCipher | None) -> list[Schedule]:
    """The schedules, with the payloads of timers for queues configured with encryptionEnabled
    sealed (their rows, their fired frames and their dead letters then hold only ciphertext).
    A broker without a key leaves them as they are."""
    if cipher is None or not schedules:
        return schedules
    names = sorted({s.queue for s in schedules})
    encrypted = {r["name"] for r in raw.execute(Q.encrypted_queues,
                                                {"tenant_id": tenant_id, "names": names})}
    if not encrypted:
        return schedules
    return [
        dataclasses.replace(s, json_bytes=cipher.seal(_json_text(s)).encode())
        if s.queue in encrypted else s
        for s in schedules
    ]


def _json_text(s: Schedule) -> str:
    return s.json_bytes.decode() if s.json_bytes is not None else log_store.to_json(s.payload)


def schedule(raw: DictConnection, tenant_id: int, s: Schedule, *, notify_within_ms: int | None,
             cipher: PayloadCipher | None = None) -> Outcome:
    """Create or replace the timer (tenant, queue, key); decided under the row's lock.
    ``notify_within_ms`` None: no NOTIFY, whenever it is due (the caller wakes a sweeper).

    One statement (two for a broker with an encryption key): it may run in autocommit."""
    (outcome,) = schedule_many(raw, tenant_id, [s], notify_within_ms=notify_within_ms,
                               cipher=cipher)
    return outcome


def timer_arrays(schedules: list[Schedule]) -> dict[str, str]:
    """The timers as queen.schedule_timer_list takes them: parallel arrays, each one text
    written in C (:func:`pg_array`; arrays that psycopg adapted element by element cost more
    than the statement, a JSON document of objects costs PostgreSQL a hash table each)."""
    return _timer_columns(schedules)[0]


def _timer_columns(schedules: list[Schedule]) -> tuple[dict[str, str], list[str]]:
    """:func:`timer_arrays`, and each timer's txn (the minted ones included)."""
    minted = iter(log_rules.new_transaction_ids(sum(1 for s in schedules if not s.txn)))
    queues: list[str] = []
    keys: list[str] = []
    partitions: list[str] = []
    txns: list[str] = []
    delays: list[int] = []
    sizes: list[int] = []
    payloads: list[str] = []
    zstd: list[bool] = []
    pack = rules.pack
    for s in schedules:
        blob, size, compressed = pack(s.payload, s.json_bytes)
        queues.append(s.queue)
        keys.append(s.key)
        partitions.append(s.partition)
        txns.append(s.txn or next(minted))
        delays.append(s.delay_ms)
        sizes.append(size)
        payloads.append(base64.b64encode(blob).decode() if compressed else blob.decode())
        zstd.append(compressed)
    return {"queues": pg_array(queues), "keys": pg_array(keys),
            "partitions": pg_array(partitions), "txns": pg_array(txns),
            "delays": pg_array(delays), "sizes": pg_array(sizes),
            "payloads": pg_array(payloads), "zstd": pg_array(zstd)}, txns


def schedule_many(
    raw: DictConnection, tenant_id: int, schedules: list[Schedule], *,
    notify_within_ms: int | None, cipher: PayloadCipher | None = None,
) -> list[Outcome]:
    """Schedule several timers in the caller's transaction, in order, in one statement.

    Each timer is decided under its own row lock (the same timer twice is decided twice, in
    order); implicit queue creation, the storage-usage change and the sweepers' wake-up (for
    timers due within ``notify_within_ms``) are written once for all. Each scheduled timer's
    message id is minted there (its answer promises it; its fired frame carries it).
    """
    if not schedules:
        return []
    schedules = sealed(raw, tenant_id, schedules, cipher)
    if len(schedules) == 1:
        return [_schedule_one(raw, tenant_id, schedules[0], notify_within_ms)]
    arrays, txns = _timer_columns(schedules)
    # (tuples, not dicts: a row per timer of a bundle)
    rows = raw.cursor(row_factory=tuple_row).execute(Q.schedule, {
        "tenant_id": tenant_id, **arrays, "notify_within_ms": notify_within_ms,
    }, binary=True).fetchall()
    if rows and rows[0][0] == 0:
        (_, _, _, base_id, now), = rows
        return _all_scheduled(schedules, txns, base_id, now)
    return [Outcome("too_late", s.queue, s.key, txn) if status == "too_late" else
            Outcome(status, s.queue, s.key, txn, s.partition, deliver_at, message_id)
            for s, (_, status, txn, message_id, deliver_at) in zip(schedules, rows, strict=True)]


# Zones whose offset is zero at every instant: there, adding a delay to an aware datetime (wall
# clock arithmetic) gives the instant PostgreSQL computes.
_ZERO_ZONES = frozenset({"UTC", "Etc/UTC", "Etc/UCT", "UCT", "Etc/Universal", "Universal",
                         "Etc/Zulu", "Zulu", "Etc/GMT", "GMT", "Etc/GMT0", "GMT0", "Etc/GMT+0",
                         "Etc/GMT-0", "Etc/Greenwich", "Greenwich"})


class AllScheduled(list[Outcome]):
    """The outcomes of a bundle of new names (:func:`_all_scheduled`), and what they were made
    of: the statement's ``now`` (PostgreSQL's now(), the zone as psycopg read it) and the call's
    ``base_id`` (timer i's message id is it with i XORed into its last 64 bits, i from 1). Every
    outcome is ``scheduled``, its due instant ``now`` plus its delay: what the compact answer
    of ``POST /api/v1/transaction?answer=compact`` sends instead of one result per timer."""

    __slots__ = ("base_id", "now")

    def __init__(self, outcomes: list[Outcome], base_id: str, now: datetime) -> None:
        super().__init__(outcomes)
        self.base_id, self.now = base_id, now


def xored_ids(base_id: str, n: int) -> list[str]:
    """The message ids queen.schedule_timer_list mints for a call of ``n`` new names: its
    ``base_id`` (a UUID's text) with 1, 2, … n XORed into its last 64 bits. Below 4,096 only
    the last three hex digits change: one format each."""
    head, tail = base_id[:19], base_id[19:23] + base_id[24:]
    if n < 4096:
        prefix, bits = f"{head}{tail[:4]}-{tail[4:13]}", int(tail[13:], 16)
        return [f"{prefix}{bits ^ i:03x}" for i in range(1, n + 1)]
    low = int(tail, 16)
    return [f"{head}{t[:4]}-{t[4:]}" for t in (f"{low ^ i:016x}" for i in range(1, n + 1))]


def _all_scheduled(schedules: list[Schedule], txns: list[str], base_id: str,
                   now: datetime) -> AllScheduled:
    """The outcomes of a bundle of new names, from queen.schedule_timer_list's short answer
    (attempt 0): timer i's message id is the call's base id with i XORed into its last 64
    bits, as the function minted it, and its due instant PostgreSQL's now() plus its delay
    (each distinct delay computed once), in the session's zone as psycopg reads instants."""
    zone = now.tzinfo
    wall = zone is UTC or str(zone) in _ZERO_ZONES
    start = now if wall else now.astimezone(UTC)
    dues: dict[int, datetime] = {}
    for s in schedules:
        if s.delay_ms not in dues:
            due = start + timedelta(milliseconds=s.delay_ms)
            dues[s.delay_ms] = due if wall else due.astimezone(zone)
    out = [Outcome("scheduled", s.queue, s.key, txn, s.partition, dues[s.delay_ms], message_id)
           for s, txn, message_id in zip(schedules, txns, xored_ids(base_id, len(schedules)),
                                         strict=True)]
    return AllScheduled(out, base_id, now)


def _schedule_one(raw: DictConnection, tenant_id: int, s: Schedule,
                  notify_within_ms: int | None) -> Outcome:
    """One timer through queen.schedule_timer: scalar parameters, a few key probes (the
    set-based statement's start-up alone costs PostgreSQL several times more)."""
    blob, size, compressed = rules.pack(s.payload, s.json_bytes)
    row = one(raw.execute(Q.schedule_one, {
        "tenant_id": tenant_id, "queue": s.queue, "key": s.key, "partition": s.partition,
        "txn": s.txn or log_rules.new_transaction_id(), "delay_ms": s.delay_ms, "bytes": size,
        "payload": blob, "zstd": compressed, "notify_within_ms": notify_within_ms,
    }, binary=True))
    return _outcome(s, row)


_SCHEDULE_ONE = LoneStatement(Q.schedule_one)
_PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)


async def schedule_lone(db: Database, tenant_id: int, s: Schedule, *,
                        notify_within_ms: int | None,
                        cipher: PayloadCipher | None = None) -> Outcome:
    """:func:`schedule` in autocommit; without an encryption key sent straight through libpq
    (:meth:`Database.lone_row`): the same statement and answer for a lone schedule, for less
    of the broker's CPU."""
    if cipher is not None:  # (the payload may have to be sealed first: another statement)
        return await db.run_autocommit(schedule, tenant_id, s, notify_within_ms=notify_within_ms,
                                       cipher=cipher)
    blob, size, compressed = rules.pack(s.payload, s.json_bytes)
    row = await db.lone_row(_SCHEDULE_ONE, {
        "tenant_id": str(tenant_id), "queue": s.queue, "key": s.key, "partition": s.partition,
        "txn": s.txn or log_rules.new_transaction_id(), "delay_ms": str(s.delay_ms),
        "bytes": str(size), "payload": blob, "zstd": "t" if compressed else "f",
        "notify_within_ms": None if notify_within_ms is None else str(notify_within_ms),
    }, binary=True)
    if row is None:
        raise RuntimeError("expected one row, the statement returned none (SELECT 0)")
    _, status, txn, message_id, deliver_at = row
    if status == b"too_late":
        return Outcome("too_late", s.queue, s.key, None if txn is None else txn.decode())
    return Outcome(_text(status), s.queue, s.key, None if txn is None else txn.decode(),
                   s.partition, None if deliver_at is None else _PG_EPOCH + timedelta(
                       microseconds=int.from_bytes(deliver_at, "big", signed=True)),
                   None if message_id is None else message_id.decode())


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def soonest_due(schedules: list[Schedule], outcomes: list[Outcome], within_ms: int) -> int | None:
    """The due instant, in epoch microseconds as a NOTIFY on ``queen_timers`` gives it, of the
    soonest of the timers just scheduled that are due within ``within_ms`` (what
    queen.schedule_timer would have announced), or None."""
    soonest = None
    for s, o in zip(schedules, outcomes, strict=True):
        if o.deliver_at is not None and s.delay_ms < within_ms and (
                soonest is None or o.deliver_at < soonest):
            soonest = o.deliver_at
    return None if soonest is None else -((_EPOCH - soonest) // _MICROSECOND)


def _planned_now(raw: DictConnection, query: str, params: dict[str, Any] | None = None
                 ) -> psycopg.Cursor[dict[str, Any]]:
    """Run a statement that finds timers by key (or the next due), planned afresh every time.

    psycopg prepares a statement run a few times on a connection, and PostgreSQL then keeps one
    generic plan for it. Planned while queen.timers was nearly empty, that plan is a sequential
    scan, and it goes on reading the whole table for every cancel or peek once the table has
    grown, until an ANALYZE invalidates it (which queen_trio.db.analyze brings within seconds
    of the growth, for every plan). Planning a key look-up costs PostgreSQL a few tens of
    microseconds.
    """
    return raw.execute(query, params, prepare=False)


def _outcome(s: Schedule, row: dict[str, Any]) -> Outcome:
    if row["status"] == "too_late":
        return Outcome("too_late", s.queue, s.key, row["txn"])
    return Outcome(row["status"], s.queue, s.key, row["txn"], s.partition, row["deliver_at"],
                   row["message_id"])


def cancel(raw: DictConnection, tenant_id: int, queue: str, key: str,
           echo_txn: str | None) -> Outcome:
    """Delete a pending timer, in one statement (it may run in autocommit). ``absent`` also
    covers "already delivered" and "another tenant's": the log, not this answer, says whether a
    message went out."""
    row = one(raw.execute(Q.cancel_one, {"tenant_id": tenant_id, "queue": queue, "key": key,
                                         "txn": echo_txn}))
    return Outcome(row["status"], queue, key, row["txn"])


_CANCEL_ONE = LoneStatement(Q.cancel_one)


async def cancel_lone(db: Database, tenant_id: int, queue: str, key: str,
                      echo_txn: str | None) -> Outcome:
    """:func:`cancel` in autocommit, sent straight through libpq (:meth:`Database.lone_row`):
    the same statement and answer for a lone DELETE, for less of the broker's CPU."""
    row = await db.lone_row(_CANCEL_ONE, {"tenant_id": str(tenant_id), "queue": queue,
                                          "key": key, "txn": echo_txn})
    if row is None:
        raise RuntimeError("expected one row, the statement returned none (SELECT 0)")
    _, status, txn = row
    return Outcome(_text(status), queue, key, None if txn is None else txn.decode())


def _text(value: bytes | None) -> str:
    if value is None:
        raise RuntimeError("expected a value, the statement returned NULL")
    return value.decode()


def cancel_many(raw: DictConnection, tenant_id: int, cancels: list[Cancel]) -> list[Outcome]:
    """Cancel several distinct timers in the caller's transaction, in one statement."""
    if not cancels:
        return []
    if len(cancels) == 1:
        c = cancels[0]
        return [cancel(raw, tenant_id, c.queue, c.key, c.txn)]
    rows = _planned_now(raw, Q.cancel, {
        "tenant_id": tenant_id, "queues": [c.queue for c in cancels],
        "keys": [c.key for c in cancels], "txns": [c.txn for c in cancels],
    }).fetchall()
    return [Outcome(r["status"], c.queue, c.key, r["txn"])
            for c, r in zip(cancels, rows, strict=True)]


def apply(raw: DictConnection, tenant_id: int, ops: list[Schedule | Cancel], *,
          notify_within_ms: int, cipher: PayloadCipher | None = None) -> list[Outcome]:
    """Schedule and cancel distinct timers in the caller's transaction, answering in input
    order: every schedule in one statement, every cancel in another (the keys are distinct, so
    their order does not matter), after the names' locks for all of them, taken in one order."""
    schedules = [op for op in ops if isinstance(op, Schedule)]
    cancels = [op for op in ops if isinstance(op, Cancel)]
    if schedules and cancels:
        raw.execute(Q.lock_timer_names, {"tenant_id": tenant_id,
                                         "queues": [op.queue for op in ops],
                                         "keys": [op.key for op in ops]})
    scheduled = iter(schedule_many(raw, tenant_id, schedules, notify_within_ms=notify_within_ms,
                                   cipher=cipher))
    cancelled = iter(cancel_many(raw, tenant_id, cancels))
    return [next(scheduled) if isinstance(op, Schedule) else next(cancelled) for op in ops]


def peek(raw: DictConnection, tenant_id: int, queue: str, key: str) -> dict[str, Any] | None:
    """The pending timer's row (``payload`` as stored, ``payload_zstd`` says how), or None."""
    return _planned_now(
        raw, Q.peek, {"tenant_id": tenant_id, "queue": queue, "key": key}).fetchone()


def list_timers(raw: DictConnection, tenant_id: int, queue: str, after: str, limit: int
                ) -> tuple[list[dict[str, Any]], bool]:
    """Up to ``limit`` pending timers of a queue with a key after ``after``, in key order, and
    whether more follow."""
    rows = _planned_now(
        raw, Q.list, {"tenant_id": tenant_id, "queue": queue, "after": after, "limit": limit}
    ).fetchall()
    return rows[:limit], len(rows) > limit


def count_timers(raw: DictConnection, tenant_id: int, queue: str, prefix: str) -> int:
    return one(_planned_now(
        raw, Q.count, {"tenant_id": tenant_id, "queue": queue, "prefix": prefix}))["n"]


# -- the sweeper's side -----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Claimed:
    """A timer claimed under a lease, for the broker to fire."""

    tenant_id: int
    queue: str
    key: str
    partition: str
    txn: str
    payload: bytes
    payload_zstd: bool
    payload_bytes: int
    deliver_at: datetime
    attempts: int
    due_at: datetime


@dataclasses.dataclass(frozen=True, slots=True)
class NextDue:
    tenant_id: int
    queue: str
    partition: str
    due: float  # epoch seconds, the database's clock


@dataclasses.dataclass(frozen=True, slots=True)
class SweepResult:
    # (tenant, deliver_at) of each timer PostgreSQL fired (and committed)
    fired: list[tuple[int, datetime]]
    rows: list[Claimed]  # claimed for the broker to fire, in due order
    next_due: float | None  # epoch seconds (database clock) of the earliest visible_at
    db_now: float  # epoch seconds (database clock) at the end of the statement
    # With a pop handed the fire (``sweep(pop=...)``): what its queen.pop_head answered.
    popped: log_store.PopOutcome | None = None
    # The timer due at next_due, and where it will land.
    upcoming: NextDue | None = None
    # With a settlement carried by the pop (``sweep(settle=...)``): whether it was applied
    # (False: its case needs the general ack; nothing of it was), the backend that ran the
    # sweep (its NOTIFY of the pop's queue is the sweep's own), and whether the pop left
    # nothing else poppable for its group (queen.sweep_settle_and_pop).
    settled: bool | None = None
    backend_pid: int | None = None
    drained: bool = False


def sweep(
    raw: DictConnection, token: uuid.UUID, broker: str, batch: int, lease_ms: int, *,
    max_payload: int,
    fire: bool = True, not_before: float | None = None, fire_lock: NextDue | None = None,
    pop: log_rules.PopRequest | None = None, settle: log_store.PopBatch | None = None,
    drained: bool = False, pop_sync: bool = True,
) -> SweepResult:
    """One sweeper cycle in one statement (so it may run in autocommit as its own transaction).

    With ``fire`` the due timers stored as plain JSON are fired by PostgreSQL in this statement;
    the rest (compressed payloads, payloads over the tenant's ceiling, or everything after a
    malformed one) are claimed for :func:`fire`. Without ``fire`` every due row is claimed.
    With ``not_before`` (epoch seconds, the database's clock) the statement waits in the backend
    until then, up to 100 ms, and takes what is due at that instant. With ``fire_lock`` (the
    timer announced to its queue's parked pops) it holds that queue's fire lock until it
    commits (queen.sweep_timers_for, schema/functions/timers.sql). With ``pop`` as well (a
    pop parked on that queue, reserved for this fire), the same transaction then pops for it
    (queen.sweep_timers_and_pop): the outcome comes back as ``popped``. With ``settle`` too
    (the batch that pop's stream was handed last, completed whole), that batch is settled
    before the pop, in the same transaction (queen.sweep_settle_and_pop); that statement,
    without a settlement, with ``drained`` (a stream's pop: the answer says whether the pop
    left anything poppable for it). A lease the pop takes, a settlement, and the fire they share
    the transaction with commit as the server is configured with ``pop_sync``
    (QUEEN_POP_COMMIT=sync), else without waiting for the disk.
    """
    params = {"token": token, "broker": broker, "batch": batch, "lease_ms": lease_ms,
              "max_payload": max_payload, "fire": fire, "not_before": not_before,
              "lock_tenant": fire_lock.tenant_id if fire_lock else None,
              "lock_queue": fire_lock.queue if fire_lock else None}
    if pop is not None:
        assert fire_lock is not None and fire_lock.queue == pop.queue
        params.update(pop_group=pop.group, pop_partition=pop.partition, pop_batch=pop.batch,
                      pop_auto_ack=pop.auto_ack,
                      pop_commit=log_store.pop_commit_level(pop_sync))
    query = Q.sweep if pop is None else Q.sweep_and_pop
    if settle is not None or (drained and pop is not None):
        assert pop is not None and not pop.auto_ack
        assert fire_lock is not None
        params.update(_settle_values(fire_lock.tenant_id, pop, settle, pop_sync))
        query = Q.sweep_settle_and_pop
    rows = raw.cursor(row_factory=tuple_row).execute(
        query, params,
        binary=True,  # payloads come back as raw bytes, not hex text
    ).fetchall()
    return _swept(rows, pop)


def _settle_values(tenant_id: int, pop: log_rules.PopRequest, batch: log_store.PopBatch | None,
                   pop_sync: bool) -> dict[str, str | None]:
    """The settlement parameters of Q.sweep_settle_and_pop, as text, in its order: batch
    ``batch`` settled whole (through its last offset; None: no settlement), then the pop in
    the group's rotation (as the settlement's own pop would be); the settlement's commit
    waits for the disk as the server is configured with ``pop_sync`` (a stream's settlements
    commit as its pops do: QUEEN_POP_COMMIT), else not."""
    after = log_rotation.start_after(tenant_id, pop.queue, pop.group)
    commit = log_store.pop_commit_level(pop_sync)
    if batch is None:
        return {"settle_partition": None, "settle_lease": None, "settle_from": None,
                "settle_through": None, "after": after, "ack_commit": commit}
    return {"settle_partition": str(batch.partition_id), "settle_lease": str(batch.lease_id),
            "settle_from": str(batch.messages[0].offset),
            "settle_through": str(batch.messages[-1].offset), "after": after,
            "ack_commit": commit}


_SWEEP = LoneStatement(Q.sweep)
_SWEEP_AND_POP = LoneStatement(Q.sweep_and_pop)
_SWEEP_SETTLE_AND_POP = LoneStatement(Q.sweep_settle_and_pop)
# The order sweep_lone sends its values in.
assert _SWEEP.names == ("lock_tenant", "lock_queue", "token", "broker", "batch", "lease_ms",
                        "max_payload", "fire", "not_before")
assert _SWEEP_AND_POP.names == _SWEEP.names + ("pop_group", "pop_partition", "pop_batch",
                                               "pop_auto_ack", "pop_commit")
assert _SWEEP_SETTLE_AND_POP.names == _SWEEP.names + (
    "pop_group", "pop_partition", "pop_batch", "settle_partition", "settle_lease",
    "settle_from", "settle_through", "after", "ack_commit")


async def sweep_lone(
    db: Database, token: uuid.UUID, broker: str, batch: int, lease_ms: int, *,
    max_payload: int, not_before: float | None = None, fire_lock: NextDue | None = None,
    pop: log_rules.PopRequest | None = None, settle: log_store.PopBatch | None = None,
    drained: bool = False, pop_sync: bool = True,
) -> SweepResult:
    """:func:`sweep` (firing) in autocommit, sent straight through libpq
    (:meth:`Database.lone_rows`): the same statement and answer for the sweeper's cycles on
    the event loop, a hundred a second under a steady flow, for less of the broker's CPU."""
    # (The parameters as text, in the statement's order, without a dict of values first.)
    values: list[str | bytes | None] = [
        None if fire_lock is None else str(fire_lock.tenant_id),
        None if fire_lock is None else fire_lock.queue,
        str(token), broker, str(batch), str(lease_ms), str(max_payload), "t",
        None if not_before is None else repr(not_before)]
    statement = _SWEEP
    if pop is not None:
        assert fire_lock is not None and fire_lock.queue == pop.queue
        if settle is None and not drained:
            values += [pop.group, pop.partition, str(pop.batch), "t" if pop.auto_ack else "f",
                       log_store.pop_commit_level(pop_sync)]
            statement = _SWEEP_AND_POP
        else:
            assert not pop.auto_ack
            values += [pop.group, pop.partition, str(pop.batch),
                       *_settle_values(fire_lock.tenant_id, pop, settle, pop_sync).values()]
            statement = _SWEEP_SETTLE_AND_POP
    rows = await db.lone_rows(statement, values, binary=True)
    return _swept(rows, pop)


def _swept(rows: Sequence[Sequence[Any]], pop: log_rules.PopRequest | None) -> SweepResult:
    """The sweep's answer, from its rows (the columns of queen.sweep_timers, then ``popped``
    with a pop)."""
    fired: list[tuple[int, datetime]] = []
    claimed: list[Claimed] = []
    next_due = db_now = None
    popped = upcoming = None
    settled = pid = None
    drained = False
    for r in rows:
        if pop is not None and r[14] is not None:
            answer = r[14]
            if isinstance(answer, dict):  # (queen.sweep_settle_and_pop)
                settled, pid, drained = answer["settled"], answer["pid"], answer["drained"]
                answer = answer["rows"]
            popped = log_store.head_outcome_from_json(pop, answer) if answer else None
            db_now = r[13]  # read after the pop: the statement's true end
        elif r[0]:
            fired.append((r[1], r[9]))
        elif r[0] is None:
            next_due, db_now = r[12], r[13]
            if next_due is not None:
                upcoming = NextDue(r[1], r[2], r[4], next_due)
        else:
            claimed.append(Claimed(*r[1:12]))
    claimed.sort(key=lambda c: c.due_at)
    assert db_now is not None, "sweep_timers always answers its clock row"
    return SweepResult(fired, claimed, next_due, db_now, popped, upcoming, settled, pid, drained)


def claim(raw: DictConnection, token: uuid.UUID, broker: str, batch: int,
          lease_ms: int) -> SweepResult:
    """Claim every due row under a lease, firing none (the two-phase path, step one)."""
    return sweep(raw, token, broker, batch, lease_ms, max_payload=0, fire=False)


@dataclasses.dataclass(frozen=True, slots=True)
class FireResult:
    fired: list[Claimed]
    failed: list[tuple[Claimed, str]]  # permanent failures that spent an attempt
    dead_lettered: list[tuple[Claimed, str]]
    lost: int  # rows whose claim was no longer ours
    # Rows among failed or dead_lettered whose fire raised something nobody foresaw (not a
    # payload PostgreSQL refused): a trigger's error, a bug. The sweeper logs them at ERROR.
    unexpected: list[tuple[Claimed, Exception]] = dataclasses.field(default_factory=list)


def fire(
    raw: DictConnection, token: uuid.UUID, claimed: list[Claimed], *, ceilings: dict[int, int],
    max_attempts: int, backoff_ms: int,
) -> FireResult:
    """Append the claimed timers' frames and delete their rows, in the caller's transaction.

    Only rows still carrying our claim token are deleted, and frames are appended for exactly
    those, in due order. A row whose payload cannot become a frame spends one attempt (or is
    dead-lettered once the budget is spent).
    """
    ready: list[tuple[Claimed, str]] = []
    failed: list[tuple[Claimed, str]] = []
    dead: list[tuple[Claimed, str]] = []
    for c in claimed:
        try:
            text = rules.unpack_text(c.payload, c.payload_zstd)
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
        ready.append((c, text))

    if not ready:
        return FireResult([], failed, dead, 0)
    gone = {
        (r["tenant_id"], r["queue"], r["timer_key"])
        for r in raw.execute(
            Q.fire_claimed,
            {"token": token, "tenant_ids": [c.tenant_id for c, _ in ready],
             "queues": [c.queue for c, _ in ready], "keys": [c.key for c, _ in ready],
             "texts": [text for _, text in ready]},
        )
    }
    mine = [c for c, _ in ready if (c.tenant_id, c.queue, c.key) in gone]
    return FireResult(mine, failed, dead, len(ready) - len(mine))


def fire_each(
    raw: DictConnection, token: uuid.UUID, claimed: list[Claimed], *, ceilings: dict[int, int],
    max_attempts: int, backoff_ms: int,
) -> FireResult:
    """:func:`fire`, one row at a time, each under a savepoint, in the caller's transaction:
    for a batch whose :func:`fire` failed as a whole with an error that is not transient.

    PostgreSQL is the judge of each row: one whose fire raises (a payload jsonb refuses, such
    as NaN or a \\u0000 escape that Python's json accepts; a trigger's error; anything else
    that is not transient trouble) spends an attempt, or is dead-lettered once the budget is
    spent, like any permanent failure, and the others fire. Transient trouble still fails the
    whole fire, spending no attempt.
    """
    fired: list[Claimed] = []
    failed: list[tuple[Claimed, str]] = []
    dead: list[tuple[Claimed, str]] = []
    unexpected: list[tuple[Claimed, Exception]] = []
    lost = 0
    for c in claimed:
        try:
            with raw.transaction():
                one = fire(raw, token, [c], ceilings=ceilings, max_attempts=max_attempts,
                           backoff_ms=backoff_ms)
        except TRANSIENT_ERRORS:
            raise
        except Exception as exc:
            error = _failure_text(exc)
            if not isinstance(exc, psycopg.DataError):
                unexpected.append((c, exc))
            if _spend_attempt(raw, token, c, error, max_attempts, backoff_ms):
                dead.append((c, error))
            else:
                failed.append((c, error))
            continue
        fired += one.fired
        failed += one.failed
        dead += one.dead_lettered
        lost += one.lost
    return FireResult(fired, failed, dead, lost, unexpected)


# The longest error text a timer row or a dead letter keeps.
_MAX_ERROR_CHARS = 1000


def _failure_text(exc: Exception) -> str:
    """Why a row's fire failed, as its last_error and its dead letter record it."""
    if isinstance(exc, psycopg.Error) and exc.sqlstate:
        return f"PostgreSQL refused the fire: {describe(exc)}"
    return f"the fire failed: {describe(exc)}"


def _storable(error: str) -> str:
    """``error`` as a text column can hold it (no NUL) and bounded."""
    return error.replace("\x00", "\\x00")[:_MAX_ERROR_CHARS]


def _spend_attempt(
    raw: DictConnection, token: uuid.UUID, c: Claimed, error: str, max_attempts: int,
    backoff_ms: int,
) -> bool:
    """Record a permanent failure; True if it exhausted the budget (row dead-lettered)."""
    where = {"tenant_id": c.tenant_id, "queue": c.queue, "key": c.key, "token": token}
    error = _storable(error)
    attempts = c.attempts + 1
    if attempts < max_attempts:
        _planned_now(raw, Q.fail_timer, {**where, "error": error,
                                    "backoff_ms": rules.backoff_ms(attempts, backoff_ms)})
        return False
    deleted = _planned_now(raw, Q.delete_claimed, where).fetchone()
    if deleted is None:
        return False  # no longer ours: whoever holds it now decides
    log_store.ensure_queue(raw, c.tenant_id, c.queue)
    text = _dead_letter(raw, c, attempts, error)
    # The bytes move from the timer row to the dead letter (whose size is its JSON text).
    log_store.add_usage(raw, c.tenant_id, len(text.encode()) - c.payload_bytes)
    return True


def _dead_letter(raw: DictConnection, c: Claimed, attempts: int, error: str) -> str:
    """Write the dead letter of a timer past its budget; answers the JSON text it holds: the
    payload, or, if it cannot be decoded or PostgreSQL refuses it as jsonb, a description of
    it (rules.undecodable)."""
    row = {"tenant_id": c.tenant_id, "queue": c.queue, "partition": c.partition, "txn": c.txn,
           "attempts": attempts, "error": error}
    try:
        text = rules.unpack_text(c.payload, c.payload_zstd)
        with raw.transaction():  # a savepoint: PostgreSQL judges what jsonb can hold
            raw.execute(Q.dead_letter_timer, {**row, "payload": text})
        return text
    except (ValueError, psycopg.DataError):
        pass
    text = log_store.to_json(rules.undecodable(c.payload, c.payload_zstd))
    raw.execute(Q.dead_letter_timer, {**row, "payload": text})
    return text


def release(raw: DictConnection, token: uuid.UUID) -> int:
    return raw.execute(Q.release_claim, {"token": token}).rowcount


def pending_count(raw: DictConnection) -> int:
    return one(raw.execute(Q.pending_count))["n"]


def next_due(raw: DictConnection) -> NextDue | None:
    row = _planned_now(raw, Q.next_due).fetchone()
    return None if row is None else NextDue(row["tenant_id"], row["queue"], row["partition"],
                                            row["due"])

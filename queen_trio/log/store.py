"""The log's database operations.

Each public function takes a raw psycopg connection that is already inside a transaction and
does all of its statements there, so the API runs it through ``Database.run_transaction`` in one
call and one transaction (a bundle in ``POST /transaction`` runs several of them in one
transaction).
SQL text lives in ``queen_trio/sql/log.sql``.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

import msgspec
from psycopg.rows import tuple_row

from ..db import queries
from ..db.arrays import pg_array
from ..db.bridge import LoneStatement
from ..db.pool import Database
from ..db.rows import DictConnection, one
from ..errors import ClientError, Conflict, NotFound
from ..formats import message_id
from ..sealing import PayloadCipher, is_envelope
from ..slots import slot_maker
from ..text import compact_json, utf8_len
from . import frames as log_frames
from . import rotation, rules
from .rules import DEFAULT_PARTITION, Ack, PopRequest, QueueOptions
from .segments import Frame, SegmentCache

Q = queries.load("log")
NOTIFY_CHANNEL = "queen_log"



# -- append (push, replay, and later timer fires) --------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class NewFrame:
    queue: str
    partition: str
    payload: Any
    transaction_id: str
    dedupe: bool = False  # a client-supplied txn already in the partition is not appended twice
    meta: dict[str, Any] | None = None
    payload_json: str | None = None  # the payload already as compact JSON text (timer fires)
    # False: the payload is already sealed (a replayed dead letter): never sealed twice.
    seal: bool = True


@dataclasses.dataclass(frozen=True, slots=True)
class Appended:
    status: str  # "queued" | "duplicate"
    queue: str
    partition: str
    partition_id: uuid.UUID
    transaction_id: str
    offset: int | None  # None for a duplicate
    message_id: str  # as a pop gives it (wire.message_id); a duplicate's: the one that won


def append(
    raw: DictConnection, tenant_id: int, frames: Sequence[NewFrame], *, usage_offset: int = 0,
    cipher: PayloadCipher | None = None, notify: bool = True,
) -> list[Appended]:
    """Append frames to their partitions (creating queues and partitions as needed).

    Frames for a queue configured with encryptionEnabled are stored sealed with ``cipher``;
    without one they are refused (409 ``encryption_unavailable``), never stored in clear.

    Offsets are dense per partition: the partition row is locked, offsets are taken from its
    ``next_offset`` and written back in the same transaction. ``usage_offset`` is added to the
    stored-bytes change (a timer fire moves bytes from the timer row to the log: net zero).
    Without ``notify`` the queues' wake-up NOTIFY is the caller's to send after the commit
    (:func:`wake_keys`, queen_trio/db/notifier.py).
    """
    if not frames:
        return []
    queue_names = sorted({f.queue for f in frames})
    partitions = _lock_partitions(raw, tenant_id, sorted({(f.queue, f.partition) for f in frames}))

    results: list[Appended | None] = [None] * len(frames)
    stored_bytes = 0
    by_partition: dict[tuple[str, str], list[int]] = {}
    for i, frame in enumerate(frames):
        by_partition.setdefault((frame.queue, frame.partition), []).append(i)

    # First what each partition gets (duplicates left out), then maxSize, then the inserts: a
    # push refused by a full queue writes nothing.
    inserts: list[dict[str, Any]] = []
    for key, indexes in by_partition.items():
        part = partitions[key]
        pid = part["partition_id"]
        wanted = [frames[i].transaction_id for i in indexes if frames[i].dedupe]
        # transaction id -> the id of the message holding it (a duplicate answers with it)
        seen = _holders(raw, pid, wanted) if wanted else {}
        offsets, txns, payloads, metas = [], [], [], []
        next_offset = part["next_offset"]
        for i in indexes:
            frame = frames[i]
            if frame.dedupe and frame.transaction_id in seen:
                results[i] = Appended("duplicate", frame.queue, frame.partition, pid,
                                      frame.transaction_id, None, seen[frame.transaction_id])
                continue
            new_id = message_id(str(pid), next_offset, frame.meta)
            if frame.dedupe:
                seen[frame.transaction_id] = new_id  # the same txn twice in one push: once
            offsets.append(next_offset)
            txns.append(frame.transaction_id)
            text = frame.payload_json
            if text is None:
                text = to_json(frame.payload)
            if frame.seal and part["encryption_enabled"]:
                text = _sealed(cipher, frame.queue, text)
            payloads.append(text)
            stored_bytes += utf8_len(text)
            metas.append(None if frame.meta is None else to_json(frame.meta))
            results[i] = Appended("queued", frame.queue, frame.partition, pid,
                                  frame.transaction_id, next_offset, new_id)
            next_offset += 1
        if offsets:
            inserts.append(
                {"partition_id": pid, "tenant_id": tenant_id, "offsets": offsets, "txns": txns,
                 "payloads": payloads, "metas": metas, "next_offset": next_offset})
    _check_max_size(raw, partitions, inserts)
    for params in inserts:
        raw.execute(Q.insert_frames, params)
    add_usage(raw, tenant_id, stored_bytes + usage_offset)
    if notify:
        for name in queue_names:
            raw.execute(Q.notify_queue, {"payload": wake_key(tenant_id, name)})
    return [r for r in results if r is not None]


# Past this many characters of payload a push skips the one-statement attempt: its round trips
# weigh little beside the transfer.
_HEAD_PUSH_MAX_CHARS = 1 << 20


async def append_head(db: Database, tenant_id: int, frames: Sequence[NewFrame], *,
                      notify: bool = True) -> list[Appended] | None:
    """:func:`append` in one statement in autocommit (queen.push_head,
    schema/functions/push.sql) for the common case: frames in clear (no ``seal=False``), queues
    without encryptionEnabled or maxSize, duplicates only of frames still in the head. None
    when the case needs :func:`append`: then no frame was written (partitions it created stay).

    Sent straight through libpq (:meth:`Database.lone_rows`), its arrays each one text written
    in C (:func:`~queen_trio.db.arrays.pg_array`): psycopg's cursor, adapting every element,
    cost a lone push more of the broker's time than its statement took PostgreSQL (issue 32).
    """
    if not frames or not all(f.seal for f in frames):
        return None if frames else []
    payloads = [to_json(f.payload) if f.payload_json is None else f.payload_json for f in frames]
    if sum(map(len, payloads)) > _HEAD_PUSH_MAX_CHARS:
        return None  # it would travel twice should it need the general append (a sealed queue)
    pairs = sorted({(f.queue, f.partition) for f in frames})
    index = {pair: i for i, pair in enumerate(pairs, start=1)}
    rows = await db.lone_rows(_PUSH_HEAD, _PUSH_HEAD.params({
        "tenant_id": str(tenant_id), "queues": pg_array([q for q, _ in pairs]),
        "names": pg_array([p for _, p in pairs]),
        "parts": pg_array([index[(f.queue, f.partition)] for f in frames]),
        "txns": pg_array([f.transaction_id for f in frames]),
        "dedupe": pg_array([f.dedupe for f in frames]), "payloads": pg_array(payloads),
        "metas": pg_array([None if f.meta is None else to_json(f.meta) for f in frames]),
        "usage_offset": "0",
        "wake": pg_array(wake_keys(tenant_id, frames) if notify else []),
    }))
    # (queen.push_head's columns: outcome, idx, partition_id, offset, held_meta, held_by)
    if rows[0][0] == "fallback":
        return None
    results: list[Appended] = []
    for frame, (outcome, _, pid, offset, held_meta, held_by) in zip(frames, rows, strict=True):
        if outcome == "queued":
            results.append(Appended("queued", frame.queue, frame.partition, pid,
                                    frame.transaction_id, offset,
                                    message_id(str(pid), offset, frame.meta)))
        elif held_by is not None:  # an earlier frame of this push holds the id
            results.append(dataclasses.replace(results[held_by - 1], status="duplicate",
                                               offset=None))
        else:
            results.append(Appended("duplicate", frame.queue, frame.partition, pid,
                                    frame.transaction_id, None,
                                    message_id(str(pid), offset, held_meta)))
    return results


_PUSH_HEAD = LoneStatement(Q.push_head)


def wake_keys(tenant_id: int, frames: Sequence[NewFrame]) -> list[str]:
    """The NOTIFY payloads :func:`append` sends for these frames (one per queue)."""
    return [wake_key(tenant_id, name) for name in sorted({f.queue for f in frames})]


def _sealed(cipher: PayloadCipher | None, queue: str, text: str) -> str:
    if cipher is None:
        raise Conflict(
            "encryption_unavailable",
            f"queue {queue!r} is configured with encryptionEnabled, and this broker has no "
            "QUEEN_ENCRYPTION_KEY: nothing was stored (every broker needs the key)",
        )
    return cipher.seal(text)


def _holders(raw: DictConnection, partition_id: uuid.UUID, txns: list[str]) -> dict[str, str]:
    """The message id holding each of ``txns`` already in the partition, sealed or not (the
    first, should a transaction id be there twice). A frame's id may come from its ``meta``
    (a timer's promised id), which a sealed frame keeps in its segment."""
    holders: dict[str, str] = {}
    rows = raw.execute(Q.existing_transactions, {"partition_id": partition_id, "txns": txns})
    for row in sorted(rows, key=lambda r: r["offset"]):
        txn = row["transaction_id"]
        if txn in holders:
            continue
        meta = row["meta"]
        if not row["in_head"]:
            frame = log_frames.read_one(raw, partition_id, row["offset"])
            meta = frame.meta if frame is not None else None
        holders[txn] = message_id(str(partition_id), row["offset"], meta)
    return holders


def _check_max_size(raw: DictConnection, partitions: dict[tuple[str, str], dict[str, Any]],
                    inserts: list[dict[str, Any]]) -> None:
    """Refuse the push (409 ``queue_full``) if it takes a queue past its ``maxSize``."""
    capped = {p["partition_id"]: p for p in partitions.values() if p["max_size"] > 0}
    adding: dict[int, int] = {}
    for params in inserts:
        part = capped.get(params["partition_id"])
        if part is not None:
            adding[part["queue_id"]] = adding.get(part["queue_id"], 0) + len(params["offsets"])
    if not adding:
        return
    ids = sorted(adding)
    raw.execute(Q.lock_queue_capacity, {"queue_ids": ids})
    depths = {r["queue_id"]: r["depth"]
              for r in raw.execute(Q.queue_depths, {"queue_ids": ids}).fetchall()}
    for part in capped.values():
        qid = part["queue_id"]
        if qid not in adding:
            continue
        depth, limit = depths.get(qid, 0), part["max_size"]
        if depth + adding[qid] > limit:
            raise Conflict(
                "queue_full",
                f"queue {part['queue']!r} holds {depth} unconsumed messages of its maxSize "
                f"{limit}; this push of {adding[qid]} would exceed it (nothing was pushed)",
                queue=part["queue"], maxSize=limit, depth=depth, pushing=adding[qid],
            )
        adding.pop(qid)


def _lock_partitions(
    raw: DictConnection, tenant_id: int, pairs: list[tuple[str, str]]
) -> dict[tuple[str, str], dict[str, Any]]:
    """Lock the (queue, partition) rows, creating the missing ones first (one statement:
    queen.take_partitions, schema/functions/push.sql)."""
    params: dict[str, Any] = {"tenant_id": tenant_id, "queues": [q for q, _ in pairs],
                              "names": [p for _, p in pairs]}
    rows = raw.execute(Q.take_partitions, params).fetchall()
    return {(row["queue"], row["name"]): row for row in rows}


def ensure_queue(raw: DictConnection, tenant_id: int, name: str) -> None:
    """Create the queue with default options unless it exists (implicit creation)."""
    raw.execute(Q.ensure_queues, {"tenant_id": tenant_id, "names": [name]})


def add_usage(raw: DictConnection, tenant_id: int, delta_bytes: int) -> None:
    """Record a change of the tenant's stored bytes (folded into its usage every second)."""
    if delta_bytes:
        raw.execute(Q.add_usage, {"tenant_id": tenant_id, "bytes": delta_bytes})


def wake_key(tenant_id: int, queue: str) -> str:
    """NOTIFY payload naming a queue, and the key long-polling pops wait on."""
    return f"{tenant_id}:{queue}"


def to_json(value: Any) -> str:
    """Compact JSON text: what is stored and what sizes are measured on."""
    return compact_json(value)


# -- configure --------------------------------------------------------------------------------


def configure(raw: DictConnection, tenant_id: int, name: str,
              options: QueueOptions) -> dict[str, Any]:
    row = one(raw.execute(
        Q.upsert_queue, {"tenant_id": tenant_id, "name": name, **dataclasses.asdict(options)}))
    partition_id = row["default_partition_id"]
    if partition_id is None:
        partition_id = one(raw.execute(
            Q.take_partitions, {"tenant_id": tenant_id, "queues": [name],
                                "names": [DEFAULT_PARTITION]}))["partition_id"]
    # A shorter delayedProcessing may have made frames poppable: waiting pops look again.
    raw.execute(Q.notify_queue, {"payload": wake_key(tenant_id, name)})
    return {"created": row["created"], "queue_id": row["queue_id"],
            "partition_id": partition_id}


# -- pop --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Message:
    offset: int
    transaction_id: str
    payload: Any
    created_at: datetime
    retry_count: int
    meta: dict[str, Any] | None


@dataclasses.dataclass(frozen=True, slots=True)
class Skip:
    """Offsets a consumer group never received: retention dropped them before it read them,
    and it resumed at log_start."""

    from_offset: int
    to_offset: int  # inclusive
    count: int  # of those, the ones the group had not already completed out of order


@dataclasses.dataclass(frozen=True, slots=True)
class PopBatch:
    queue: str
    partition: str
    partition_id: uuid.UUID
    group: str
    lease_id: uuid.UUID | None
    lease_expires_at: datetime | None
    messages: list[Message]
    skipped: Skip | None = None
    # Queen's deliveryAttempt: how many times in a row the group has been handed this batch
    # (schema/013_delivery_attempts.sql); 1 for a first delivery and for autoAck.
    delivery_attempt: int = 1


@dataclasses.dataclass(frozen=True, slots=True)
class PopOutcome:
    batch: PopBatch | None
    retry_in_s: float | None = None  # a held-back frame matures this soon (delayedProcessing)
    skipped: int = 0  # messages skipped over log_start by this pop (all partitions it visited)
    more: tuple[PopBatch, ...] = ()  # a multi-partition pop: the other partitions' batches
    # Nothing popped, and the pop said when to look again (as next_look_in_s): ``looked``.
    looked: bool = False
    look_in_s: float | None = None

    @property
    def batches(self) -> list[PopBatch]:
        return [] if self.batch is None else [self.batch, *self.more]


def pop_commit_level(sync_commit: bool) -> str | None:
    return None if sync_commit else "off"  # None: as the server is configured


def pop_head(raw: DictConnection, tenant_id: int, req: PopRequest, *,
             sync_commit: bool = True) -> PopOutcome | None:
    """The common pop in one statement (it may run in autocommit); None when the case needs
    :func:`pop` (a named group's first pop, an expired lease, sealed or retried frames,
    delayedProcessing, a cursor behind log_start), in which case nothing was changed but the
    queue-mode cursors it created (as the general pop would have).

    ``sync_commit=False``: the commit does not wait for the WAL flush (a database crash may
    forget this pop, so its messages would be delivered again; nothing is lost). True leaves
    the commit as the server is configured."""
    rows = raw.cursor(row_factory=tuple_row).execute(
        Q.pop_head,
        {"tenant_id": tenant_id, "name": req.queue, "group": req.group,
         "partition": req.partition, "batch": req.batch, "auto_ack": req.auto_ack,
         "synchronous_commit": pop_commit_level(sync_commit), "look_after": False,
         "after": rotation.start_after(tenant_id, req.queue, req.group)},
    ).fetchall()
    return _rotated(tenant_id, _head_answer(req, rows))


def _rotated(tenant_id: int, outcome: PopOutcome | None) -> PopOutcome | None:
    """``outcome``, its last partition noted as served (the group's next pop starts after it:
    :mod:`.rotation`)."""
    if outcome is not None and outcome.batch is not None:
        last = outcome.batches[-1]
        rotation.served(tenant_id, last.queue, last.group, last.partition)
    return outcome


def pop_head_after(raw: DictConnection, tenant_id: int, req: PopRequest, not_before: float,
                   give_up: float, *, sync_commit: bool = True) -> PopOutcome | None:
    """:func:`pop_head` for a timer about to fire into the queue: the backend waits for the
    due instant ``not_before`` and tries until the frame is there or ``give_up`` has passed
    (epoch seconds, the database's clock; schema/functions/log.sql). Answers as :func:`pop_head`
    does."""
    rows = raw.cursor(row_factory=tuple_row).execute(
        Q.pop_head_after,
        {"tenant_id": tenant_id, "name": req.queue, "group": req.group,
         "partition": req.partition, "batch": req.batch, "auto_ack": req.auto_ack,
         "synchronous_commit": pop_commit_level(sync_commit), "not_before": not_before,
         "give_up": give_up, "look_after": False, "after": None},
    ).fetchall()
    return _head_answer(req, rows)


def next_look_in_s(raw: DictConnection, tenant_id: int, req: PopRequest) -> float | None:
    """For a waiting pop that found nothing: in how many seconds something in its queue
    becomes poppable for it unannounced (a lease or retry hold ends, a delayed frame
    matures); 0 or less if something looks poppable already, None if nothing will before a
    NOTIFY (queen_trio/sql/log.sql, ``next_look``)."""
    row = one(raw.execute(Q.next_look, {"tenant_id": tenant_id, "name": req.queue,
                                        "group": req.group, "partition": req.partition}))
    return row["in_s"]


def _head_answer(req: PopRequest, rows: list[tuple[Any, ...]]) -> PopOutcome | None:
    """The outcome of a one-statement pop's answer (Q.pop_head, Q.settle_pop_head,
    Q.pop_head_after: the columns of Q.pop_answer), its rows read as tuples (a dict per row
    was a third of reading them): outcome, partition_id, partition, lease_id,
    lease_expires_at (those four on the first row only), offset, transaction_id, payload and
    meta as JSON text (the payload kept as that text, ``msgspec.Raw``; the meta decoded),
    created_at, look_in_s."""
    first = rows[0]
    if first[0] == "fallback":
        return None
    if first[0] == "empty":
        return PopOutcome(None, looked=True, look_in_s=first[10])
    if first[1] is None:  # (the statement numbers its rows: the first comes first)
        first = next(r for r in rows if r[1] is not None)
    meta, make = _META.decode, _make_message
    messages = [make(r[5], r[6], None if r[7] is None else msgspec.Raw(r[7]), r[8], 0,
                     meta(r[9]) if r[9] else None) for r in rows]
    return PopOutcome(PopBatch(req.queue, first[2], first[1], req.group, first[3], first[4],
                               messages))


def head_outcome_from_json(req: PopRequest, rows: list[dict[str, Any]]) -> PopOutcome | None:
    """The outcome of queen.pop_head's rows as the sweep hands them over, one jsonb array
    (queen.sweep_timers_and_pop): the values of :func:`_head_answer`'s columns, from their JSON
    text (read straight from each row's dict: no copy of it with its values converted)."""
    first = rows[0]
    if first["outcome"] == "fallback":
        return None
    if first["outcome"] == "empty":
        return PopOutcome(None)
    make, instant = _make_message, _time_or_none
    messages = [make(r["offset"], r["transaction_id"], r["payload"], instant(r["created_at"]),
                     0, r["meta"]) for r in rows]
    return PopOutcome(PopBatch(req.queue, first["partition"],
                               uuid.UUID(first["partition_id"]), req.group,
                               _uuid_or_none(first["lease_id"]),
                               _time_or_none(first["lease_expires_at"]), messages))


_META = msgspec.json.Decoder(dict[str, Any])
# A frame of a one-statement pop's answer, 500 to a batch: its slots set without the frozen
# __init__'s object.__setattr__ per field (0.87 µs per row of _head_answer rather than 1.25).
_make_message = slot_maker(Message)


def payload_value(message: Message) -> Any:
    """A popped message's payload as a value: the one-statement pop keeps it as its stored
    JSON text (``msgspec.Raw``), which is decoded here; the other pops hold it decoded."""
    payload = message.payload
    return msgspec.json.decode(payload) if isinstance(payload, msgspec.Raw) else payload


def _uuid_or_none(text: str | None) -> uuid.UUID | None:
    return None if text is None else uuid.UUID(text)


def _time_or_none(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)


def batch_acks(batch: PopBatch, status: str) -> list[Ack]:
    """One acknowledgement of ``status`` for each message of ``batch``, under its lease."""
    return [Ack(i, m.transaction_id, batch.partition_id, status, batch.group, batch.lease_id,
                None) for i, m in enumerate(batch.messages)]


def release_batch(raw: DictConnection, tenant_id: int, batch: PopBatch) -> None:
    """Hand a leased batch back whole, no retry spent (its consumer has gone before it got
    it): the messages are delivered again from the group's cursor at the next pop."""
    if batch.lease_id is None:
        return  # autoAck: nothing is held
    results = ack(raw, tenant_id, batch_acks(batch, "retry"))
    if any(r.applied for r in results):  # (its lease was live: no other pop has leased since)
        raw.execute(Q.undo_attempt, {"partition_id": batch.partition_id, "group": batch.group})


def subscribe(raw: DictConnection, tenant_id: int, req: PopRequest) -> None:
    """Record the group's subscription instant on the queue (``subscriptionMode=new``) unless
    it has one: partitions it first pops later start there (see ``_start_after``)."""
    raw.execute(Q.subscribe_group, {"tenant_id": tenant_id, "name": req.queue, "group": req.group})


def group_conflation(raw: DictConnection, tenant_id: int, queue: str, group: str,
                     asked: bool | None) -> bool:
    """The consumer group's conflation policy on the queue, as Queen keeps it: registered by
    the group's first pop (as it ``asked``, false when it did not say), then fixed for every
    consumer of the group until the group is deleted with its metadata."""
    key = {"tenant_id": tenant_id, "name": queue, "group": group}
    for _ in range(2):
        row = raw.execute(Q.group_policy, key).fetchone()
        if row is not None:
            return bool(row["conflation"])
        row = raw.execute(Q.register_group_policy,
                          {**key, "conflation": bool(asked)}).fetchone()
        if row is not None:
            return bool(row["conflation"])
    raise Conflict("group_policy_race", f"consumer group {group}: its policy on {queue} "
                   "was registered and deleted meanwhile; pop again")


_MAX_CANDIDATE_ROUNDS = 64


def pop(raw: DictConnection, tenant_id: int, req: PopRequest,
        cache: SegmentCache | None = None, *, sync_commit: bool = True) -> PopOutcome:
    """The general pop, in the caller's transaction (``sync_commit`` as for :func:`pop_head`).

    With ``req.partitions`` above 1 it goes on to further candidates until it holds that many
    partitions or ``req.batch`` messages in all, every partition under the one lease of this
    pop (as Queen leases a pop: acks, extensions and expiry act on all of them)."""
    if not sync_commit:
        raw.execute(Q.pop_commit_level, {"synchronous_commit": pop_commit_level(sync_commit)})
    limit = max(8, 2 * req.partitions)
    lease_id = uuid.uuid4() if req.partitions > 1 and not req.auto_ack else None
    batches: list[PopBatch] = []
    retry_in: float | None = None
    skipped = 0
    left = req.batch
    for _ in range(_MAX_CANDIDATE_ROUNDS):
        candidates = raw.execute(
            Q.pop_candidates,
            {"tenant_id": tenant_id, "name": req.queue, "group": req.group,
             "partition": req.partition, "limit": limit,
             "after": rotation.start_after(tenant_id, req.queue, req.group)},
        ).fetchall()
        if not candidates:
            break  # nothing past the group's cursors, or no such queue
        queue = candidates[0]  # every row carries the queue's options
        subscribed_past = False
        for cand in candidates:
            part_req = req if left == req.batch else dataclasses.replace(req, batch=left)
            batch, matures_in, skip, past = _pop_partition(raw, tenant_id, part_req, queue, cand,
                                                           cache, lease_id)
            subscribed_past |= past
            skipped += skip.count if skip else 0
            if batch is not None:
                batches.append(batch)
                left -= len(batch.messages)
                if len(batches) == req.partitions or left <= 0:
                    break
            elif matures_in is not None:
                retry_in = matures_in if retry_in is None else min(retry_in, matures_in)
        # A group subscribing from an instant may find every candidate older than that (their
        # new cursors now leave them out): look again rather than wait with more behind them.
        if batches or not subscribed_past or len(candidates) < limit:
            break
    if not batches:
        return PopOutcome(None, retry_in, skipped)
    outcome = PopOutcome(batches[0], skipped=skipped, more=tuple(batches[1:]))
    _rotated(tenant_id, outcome)
    return outcome


def _start_after(raw: DictConnection, tenant_id: int, req: PopRequest, cand: dict[str, Any],
                 cache: SegmentCache | None) -> int:
    """Where a group's new cursor on this partition starts (its ``committed``): before
    log_start, or, for a group subscribing from an instant, before the first frame created at
    or after it (the end of the partition when there is none yet)."""
    log_start = cand["log_start"]
    if req.subscribe_from is None:
        return log_start - 1
    pid = cand["partition_id"]
    since = None if req.subscribe_from == rules.SUBSCRIBE_NOW else req.subscribe_from
    row = one(raw.execute(
        Q.subscription_start,
        {"tenant_id": tenant_id, "name": req.queue, "group": req.group, "since": since,
         "partition_id": pid, "log_start": log_start}))
    start = row["next_offset"] if row["head_first"] is None else row["head_first"]
    if row["segment_first"] is not None:
        # Sealed frames are compressed: the first new one is found by reading the segment.
        first = row["segment_first"]
        for f in log_frames.read(raw, pid, first, min(start - first, 100_000), cache=cache):
            if f.frame.created_at >= row["at"]:
                start = f.offset
                break
    return max(start, log_start) - 1


def _seed_cursors(raw: DictConnection, tenant_id: int, req: PopRequest,
                  queue: dict[str, Any]) -> bool:
    """Create the group's cursor on every partition of the queue it has none on, each where
    its first pop there would start it (``Q.seed_cursors``): a group's first pass over
    thousands of partitions then pops each in one statement. Whether it created any."""
    since = None if req.subscribe_from in (None, rules.SUBSCRIBE_NOW) else req.subscribe_from
    created = raw.execute(Q.seed_cursors, {
        "tenant_id": tenant_id, "name": req.queue, "group": req.group,
        "queue_id": queue["queue_id"], "subscribed": req.subscribe_from is not None,
        "since": since}).rowcount
    return created > 0


def _skip(committed: int, start_after: int, acked_ahead: Iterable[int]) -> Skip | None:
    if start_after <= committed:
        return None
    done = sum(1 for o in set(acked_ahead) if committed < o <= start_after)
    return Skip(committed + 1, start_after, start_after - committed - done)


def _pop_partition(
    raw: DictConnection, tenant_id: int, req: PopRequest, queue: dict[str, Any],
    cand: dict[str, Any], cache: SegmentCache | None, lease_id: uuid.UUID | None = None,
) -> tuple[PopBatch | None, float | None, Skip | None, bool]:
    """One partition's part of a pop: its batch, when a held-back frame matures, the skip over
    log_start, and whether a new cursor started past the partition's end (a subscription)."""
    pid = cand["partition_id"]
    key = {"partition_id": pid, "group": req.group, "tenant_id": tenant_id}
    if req.partitions > 1 and raw.execute(Q.share_partition_unless_pushed,
                                          {"partition_id": pid}).fetchone() is None:
        return None, None, None, False  # a push holds it (see the query): not this time
    cursor = raw.execute(Q.lock_free_cursor, key).fetchone()
    if cursor is None and not one(raw.execute(Q.claim_cursor_creation, {
            "queue_id": queue["queue_id"], "group": req.group}))["claimed"]:
        return None, None, None, False  # another consumer is creating the group's cursors
    if cursor is None and _seed_cursors(raw, tenant_id, req, queue):
        cursor = raw.execute(Q.lock_free_cursor, key).fetchone()
        if cursor is not None and cursor["committed"] >= cand["log_start"]:
            batch, matures_in, skip = _pop_cursor(raw, tenant_id, req, queue, cand, cache,
                                                  key, cursor, lease_id)
            return batch, matures_in, skip, batch is None
    if cursor is None:
        committed = _start_after(raw, tenant_id, req, cand, cache)
        cursor = raw.execute(Q.create_cursor, {**key, "committed": committed}).fetchone()
        if cursor is not None and committed >= cand["log_start"]:
            batch, matures_in, skip = _pop_cursor(raw, tenant_id, req, queue, cand, cache,
                                                  key, cursor, lease_id)
            return batch, matures_in, skip, batch is None
    if cursor is None:
        return None, None, None, False  # another consumer of the group holds (or is taking) it
    return (*_pop_cursor(raw, tenant_id, req, queue, cand, cache, key, cursor, lease_id), False)


def _pop_cursor(
    raw: DictConnection, tenant_id: int, req: PopRequest, queue: dict[str, Any],
    cand: dict[str, Any], cache: SegmentCache | None, key: dict[str, Any], cursor: dict[str, Any],
    lease_id: uuid.UUID | None = None,
) -> tuple[PopBatch | None, float | None, Skip | None]:
    pid = cand["partition_id"]
    # A group behind log_start resumes there (start_after): retention took what it skipped.
    committed = cursor["start_after"]
    skip = _skip(cursor["committed"], committed, cursor["acked_ahead"])
    ahead = {o for o in cursor["acked_ahead"] if o > committed}

    # A lease that ran out with deliveries unacknowledged hands them out again, spending no
    # retry: as in Queen, only a failed ack counts against retryLimit.
    read_from = committed + 1
    if req.conflation:
        # Conflation: only the newest message is delivered. The lease covers everything up to
        # it and the cursor stays: the ack of that message commits it there, retiring what lies
        # behind (as Queen's does); a nack or an expiry leaves it all pending.
        read_from = max(read_from, cand["next_offset"] - 1)
        req = dataclasses.replace(req, batch=1)

    frames = log_frames.read(
        raw, pid, read_from, req.batch + len(ahead), group=req.group,
        delay_s=queue["delayed_processing_s"], cache=cache,
    )
    picked: list[Message] = []
    matures_in = None
    start = committed
    for f in frames:
        offset = f.offset
        if offset in ahead:
            continue
        if f.retry_count > queue["retry_limit"]:
            _dead_letter(raw, tenant_id, queue, pid, req.group, f.frame, f.retry_count,
                         f.last_error or "retries exhausted")
            if req.conflation:
                committed = offset  # settled, and with it what it had retired
            ahead.add(offset)
            continue
        if f.matures_in_s > 0:
            matures_in = f.matures_in_s
            break  # contiguous scan: nothing after a held-back frame is handed out
        frame = f.frame
        picked.append(Message(offset, frame.transaction_id, frame.payload, frame.created_at,
                              f.retry_count, frame.meta))
        if len(picked) == req.batch:
            break

    if req.auto_ack:
        ahead.update(m.offset for m in picked)
    committed, ahead_left = advance(committed, ahead)
    cursor_key = {**key, "committed": committed, "acked_ahead": ahead_left}
    if picked and not req.auto_ack:
        lease = one(raw.execute(
            Q.take_lease,
            {**cursor_key, "lease_s": req.lease_s or queue["lease_time_s"],
             "leased_to": picked[-1].offset, "lease_id": lease_id}))
        batch = PopBatch(req.queue, cand["name"], pid, req.group, lease["lease_id"],
                         lease["lease_expires_at"], picked, skip, lease["attempt_count"])
        return batch, None, skip
    # The skip over log_start is written (and reported) with the next change of the cursor.
    changed = (committed != start or ahead_left != sorted(cursor["acked_ahead"])
               or cursor["lease_expires_at"] is not None or bool(picked))
    if changed:
        raw.execute(Q.save_cursor, {**cursor_key, "release": True})
    else:
        skip = None
    if req.auto_ack and committed > start:
        raw.execute(Q.forget_retries, {**key, "committed": committed})
    if not picked:
        return None, matures_in, skip
    return (PopBatch(req.queue, cand["name"], pid, req.group, None, None, picked, skip), None,
            skip)


def advance(committed: int, ahead: Iterable[int]) -> tuple[int, list[int]]:
    """Move the cursor over the offsets done out of order that now touch it."""
    pending = set(ahead)
    while committed + 1 in pending:
        committed += 1
        pending.remove(committed)
    return committed, sorted(o for o in pending if o > committed)


def _dead_letter(
    raw: DictConnection, tenant_id: int, queue: dict[str, Any], partition_id: uuid.UUID, group: str,
    frame: Frame | int, retry_count: int, error: str | None,
) -> bool:
    """Copy a frame (or the frame at an offset) into the group's dead letters."""
    if not queue["dead_letter_queue"]:
        return False
    if isinstance(frame, int):
        found = log_frames.read_one(raw, partition_id, frame)
        if found is None:
            return False  # retention dropped it meanwhile: nothing left to keep
        frame = found
    row = one(raw.execute(
        Q.dead_letter_frame,
        {"tenant_id": tenant_id, "partition_id": partition_id, "group": group,
         "offset": frame.offset, "transaction_id": frame.transaction_id,
         "payload": to_json(frame.payload), "size_bytes": frame.size_bytes,
         "created_at": frame.created_at, "retry_count": retry_count, "error": error}))
    add_usage(raw, tenant_id, row["size_bytes"])
    return True


# -- ack --------------------------------------------------------------------------------------
#
# An acknowledgement is an offset commit, as in Queen: acking a message commits the group's
# cursor up to it, which completes every message before it that the consumer was handed (a
# gap it said nothing about was done). An explicit signal (``failed``, ``retry``, ``dlq``) is
# never skipped by a later success in the same call: the cursor stops below the lowest one,
# the lease is released, and everything from the signal on is delivered again (unless the
# signal settled its message: a dead letter, or ``failed`` with the retry budget spent, moves
# the cursor past it and the call's later acks go on from there).
#
# Each acknowledgement gets its own verdict: one the broker cannot honour is answered as
# refused (``AckResult.refused``) and the others still apply; a transaction raises the first
# refusal instead, and rolls back.

# Strength of a status at one offset: a dead letter beats a failure beats a retry beats a
# completion (Queen's tie-break).
_RANK = {"dlq": 0, "failed": 1, "retry": 2, "completed": 3}


class AckResult(msgspec.Struct, frozen=True):
    """One acknowledgement's verdict (a struct: a settled batch makes 500 per request, and a
    frozen dataclass' __init__ costs several times as much)."""

    index: int
    transaction_id: str
    partition_id: uuid.UUID
    status: str
    queue: str | None
    partition: str | None
    lease_released: bool
    dead_lettered: bool
    # A completion at or below the committed offset: nothing to do (Queen's ``noop``).
    already_acked: bool
    # Why the broker did not take it (None: taken): its code says which rule refused it.
    refused: ClientError | None = None

    @property
    def applied(self) -> bool:
        """Whether this acknowledgement changed something (not a repeat, not refused)."""
        return self.refused is None and not self.already_acked


def ack(raw: DictConnection, tenant_id: int, acks: Sequence[Ack]) -> list[AckResult]:
    """Apply acknowledgements in the caller's transaction, each with its own verdict (see the
    top of this section). Acks are grouped per (partition, consumer group): one lookup of
    their frames, one lock of the cursor, one write of it, whatever the batch size."""
    groups: dict[tuple[uuid.UUID, str], list[tuple[int, Ack]]] = {}
    for position, a in enumerate(acks):
        groups.setdefault((a.partition_id, a.group), []).append((position, a))
    results: dict[int, AckResult] = {}
    # Cursors are locked in one order whatever order the acks came in, so two batches over the
    # same partitions never wait for each other crosswise.
    for (partition_id, group), items in sorted(groups.items()):
        results.update(_ack_partition(raw, tenant_id, partition_id, group, items))
    ordered = [results[position] for position in range(len(acks))]
    for queue in {r.queue for r in ordered if r.lease_released and r.queue is not None}:
        raw.execute(Q.notify_queue, {"payload": wake_key(tenant_id, queue)})
    return ordered


def ack_head(raw: DictConnection, tenant_id: int, acks: Sequence[Ack], *,
             sync_commit: bool = True) -> list[AckResult] | None:
    """The common acknowledgement in one statement (it may run in autocommit): ``completed``
    for frames of one partition and group, each still in the head and open under the
    group's live lease (or given without a lease). None when the case needs :func:`ack`
    (then nothing was changed). ``sync_commit`` as for :func:`pop_head`."""
    first = acks[0]
    if any(a.status != "completed" or a.partition_id != first.partition_id
           or a.group != first.group or a.lease_id != first.lease_id for a in acks):
        return None
    rows = raw.execute(
        Q.ack_head,
        {"tenant_id": tenant_id, "partition_id": first.partition_id, "group": first.group,
         "lease_id": first.lease_id, "txns": [a.transaction_id for a in acks],
         "synchronous_commit": pop_commit_level(sync_commit)},
    ).fetchall()
    head = rows[0]
    if head["outcome"] == "fallback":
        return None
    # The cursor moved to the highest acked offset (and over what was done out of order
    # right after it); the lease is released when that covers everything it handed out.
    committed, _ = advance(max(head["committed_before"], head["offset"]),
                           head["acked_ahead_before"])
    released = committed >= head["leased_to"]
    return [AckResult(a.index, a.transaction_id, a.partition_id, a.status, head["queue"],
                      head["partition"], released, False, False)
            for a in acks]


@dataclasses.dataclass(frozen=True, slots=True)
class BatchSettled:
    """:func:`settle_pop_head`'s answer: the batch's completions applied (``results``, as
    :func:`ack_head` gives them) and what the pop after them found (``popped``: a batch, or
    nothing with when to look again, as :func:`pop_head` answers; None: no pop was asked
    for, or its case needs :func:`pop`)."""

    results: list[AckResult]
    popped: PopOutcome | None


def completes_whole(batch: PopBatch, acks: Sequence[Ack]) -> bool:
    """Whether ``acks`` complete exactly ``batch``'s messages, and the batch is one
    contiguous run of offsets under a lease: the case :func:`settle_pop_head` serves."""
    messages = batch.messages
    if (batch.lease_id is None or not messages or len(acks) != len(messages)
            or messages[-1].offset - messages[0].offset != len(messages) - 1):
        return False
    pid, group, lease = batch.partition_id, batch.group, batch.lease_id
    for a in acks:
        if (a.status != "completed" or a.partition_id != pid or a.group != group
                or a.lease_id not in (None, lease)):
            return False
    return {a.transaction_id for a in acks} == {m.transaction_id for m in messages}


def settle_pop_head(raw: DictConnection, tenant_id: int, req: PopRequest, batch: PopBatch,
                    acks: Sequence[Ack], *, pop: bool,
                    sync_commit: bool = True, look_after: bool = False) -> BatchSettled | None:
    """A batch this broker handed out, completed whole by ``acks``
    (:func:`completes_whole`), as one offset commit through its last offset while the cursor
    is as its pop left it, then (``pop``) the next pop of ``req`` (as :func:`pop_head`), in
    one statement that may run in autocommit. None when the acknowledgement's case needs
    :func:`ack` (then nothing was changed). ``sync_commit`` as for :func:`pop_head`.
    ``look_after``: a pop that took messages says when to look again too (``look_in_s``, as
    an empty one does: whether anything else is poppable for the group)."""
    rows = raw.cursor(row_factory=tuple_row).execute(
        Q.settle_pop_head,
        {"tenant_id": tenant_id, "name": req.queue, "group": batch.group,
         "partition_id": batch.partition_id, "lease_id": batch.lease_id,
         "from": batch.messages[0].offset, "through": batch.messages[-1].offset,
         "partition": req.partition, "batch": req.batch if pop else 0,
         "synchronous_commit": pop_commit_level(sync_commit),
         "after": rotation.start_after(tenant_id, req.queue, req.group),
         "look_after": look_after and pop},
    ).fetchall()
    if rows[0][0] == "unsettled":
        return None
    results = [AckResult(a.index, a.transaction_id, a.partition_id, a.status, batch.queue,
                         batch.partition, True, False, False) for a in acks]
    if not pop:
        return BatchSettled(results, None)
    outcome = _head_answer(req, rows)
    if look_after and outcome is not None and outcome.batch is not None:
        first = next(r for r in rows if r[1] is not None)
        outcome = dataclasses.replace(outcome, looked=True, look_in_s=first[10])
    return BatchSettled(results, _rotated(tenant_id, outcome))


def _where(a: Ack) -> str:
    return f"acknowledgement {a.index}" if a.index else "acknowledgement"


def _ack_partition(
    raw: DictConnection, tenant_id: int, partition_id: uuid.UUID, group: str,
    items: list[tuple[int, Ack]],
) -> dict[int, AckResult]:
    key = {"partition_id": partition_id, "group": group, "tenant_id": tenant_id}
    rows = raw.execute(
        Q.frames_for_acks, {**key, "txns": [a.transaction_id for _, a in items]}
    ).fetchall()
    offsets: dict[str, list[int]] = {}
    for row in rows:
        offsets.setdefault(row["transaction_id"], []).append(row["offset"])
    info = rows[0] if rows else None
    cursor = raw.execute(Q.lock_cursor, key).fetchone() if rows else None
    out: dict[int, AckResult] = {}

    def refuse(position: int, a: Ack, exc: ClientError) -> None:
        out[position] = AckResult(
            a.index, a.transaction_id, partition_id, a.status,
            None if info is None else info["queue"],
            None if info is None else info["partition"], False, False, False, exc)

    # -- each acknowledgement: the offset it names, or its verdict now
    named: dict[int, tuple[int, Ack]] = {}  # position -> (offset, ack)
    for position, a in items:
        mine = offsets.get(a.transaction_id)
        if mine is None:
            refuse(position, a, NotFound(
                "unresolvable",
                f"{_where(a)}: no message with transactionId {a.transaction_id!r} in partition "
                f"{a.partition_id}", index=a.index))
            continue
        if cursor is None:
            refuse(position, a, Conflict(
                "not_delivered",
                f"{_where(a)}: consumer group {group!r} has never popped this partition",
                index=a.index))
            continue
        if a.lease_id is not None and a.lease_id != cursor["lease_id"]:
            refuse(position, a, _lease_lost(a))
            continue
        committed, leased_to = cursor["committed"], cursor["leased_to"]
        leased_to = committed if leased_to is None else leased_to
        open_offsets = [o for o in mine
                        if committed < o <= leased_to and o not in cursor["acked_ahead"]]
        if open_offsets and (a.lease_id is None or cursor["lease_live"]):
            named[position] = (open_offsets[0], a)
        elif any(o <= committed or o in cursor["acked_ahead"] for o in mine):
            # Below the cursor: a completion is a repeat; a signal can no longer be honoured.
            if a.status == "completed":
                assert info is not None
                out[position] = AckResult(a.index, a.transaction_id, partition_id, a.status,
                                          info["queue"], info["partition"], False, False, True)
            else:
                refuse(position, a, Conflict(
                    "already_committed",
                    f"{_where(a)}: message {a.transaction_id!r} is at or below the committed "
                    f"offset of group {group!r}; a {a.status!r} can no longer be honoured",
                    index=a.index))
        elif a.lease_id is not None:
            refuse(position, a, _lease_lost(a))  # named under a lease that expired or ended
        else:
            refuse(position, a, Conflict(
                "not_delivered",
                f"{_where(a)}: message {a.transaction_id!r} has not been delivered to group "
                f"{group!r}", index=a.index))
    if not named:
        return out
    assert info is not None and cursor is not None

    # -- the commit
    start = cursor["committed"]
    leased_to = start if cursor["leased_to"] is None else cursor["leased_to"]
    strongest: dict[int, tuple[str, Ack | None]] = {}
    for offset, a in named.values():
        held = strongest.get(offset)
        if held is None or _RANK[a.status] < _RANK[held[0]]:
            strongest[offset] = (a.status, a)
    signals = [o for o, (s, _) in strongest.items() if s != "completed"]
    completions = [o for o, (s, _) in strongest.items() if s == "completed"]
    head = min(signals, default=None)
    committed = max([start, *(o for o in completions if head is None or o < head)])
    release = head is not None
    hold = False
    dead_at: set[int] = set()
    if head is not None:
        # From the lowest signal up: settle what this call settles, stop at the first
        # message that must come back.
        top_completion = max(completions, default=-1)
        p = head
        while p <= leased_to:
            status, named_by = strongest.get(p, ("completed" if p < top_completion else "", None))
            if status in ("", "retry"):
                break
            if status == "failed":
                assert named_by is not None
                count = one(raw.execute(
                    Q.bump_retry, {**key, "offset": p, "error": named_by.error}))["retry_count"]
                if count <= info["retry_limit"]:
                    hold = info["retry_delay_ms"] > 0  # redelivered no sooner than retryDelay
                    break
                if _dead_letter(raw, tenant_id, info, partition_id, group, p, count,
                                named_by.error or "retries exhausted"):
                    dead_at.add(p)
            elif status == "dlq":
                assert named_by is not None
                counted = raw.execute(Q.retry_count, {**key, "offset": p}).fetchone()
                if _dead_letter(raw, tenant_id, info, partition_id, group, p,
                                counted["retry_count"] if counted else 0,
                                named_by.error or "sent to dead letters"):
                    dead_at.add(p)
            committed = p
            p += 1
    committed, ahead = advance(committed, cursor["acked_ahead"])
    release |= committed >= leased_to
    raw.execute(Q.save_cursor, {**key, "committed": committed, "acked_ahead": ahead,
                                "release": release})
    if hold:
        raw.execute(Q.hold_for_retry, {**key, "delay_ms": info["retry_delay_ms"]})
    if committed > start:
        raw.execute(Q.forget_retries, {**key, "committed": committed})
    for position, (offset, a) in named.items():
        out[position] = AckResult(a.index, a.transaction_id, partition_id, a.status,
                                  info["queue"], info["partition"], release,
                                  offset in dead_at and strongest[offset][1] is a, False)
    return out


def _lease_lost(a: Ack) -> Conflict:
    return Conflict(
        "lease_lost",
        f"{_where(a)}: lease {a.lease_id} is no longer live on this partition (it expired, "
        "was released, or the messages were handed out again)", index=a.index)


# -- leases -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Renewal:
    """What extending a lease did: how many partitions it holds were renewed (a pop over
    several partitions holds them under one lease), and the earliest new expiry."""
    renewed: int
    expires_at: datetime | None
    # Why nothing was renewed: "lease_not_found", or "lease_expired" (ended or released).
    reason: str | None = None


def extend_lease(raw: DictConnection, tenant_id: int, lease_id: uuid.UUID, seconds: int) -> Renewal:
    row = one(raw.execute(
        Q.extend_lease, {"lease_id": lease_id, "tenant_id": tenant_id, "seconds": seconds}))
    if row["renewed"]:
        return Renewal(row["renewed"], row["expires_at"])
    exists = raw.execute(Q.lease_exists, {"lease_id": lease_id, "tenant_id": tenant_id}).fetchone()
    return Renewal(0, None, "lease_expired" if exists else "lease_not_found")


# -- dead letters -----------------------------------------------------------------------------


def replay_dead_letter(raw: DictConnection, tenant_id: int, dead_letter_id: int, *,
                       cipher: PayloadCipher | None = None) -> Appended:
    row = raw.execute(Q.lock_dead_letter, {"id": dead_letter_id, "tenant_id": tenant_id}).fetchone()
    if row is None:
        raise NotFound("dead_letter_not_found", f"no dead letter {dead_letter_id}")
    if row["consumer_group"] == rules.TIMER_GROUP:
        raise Conflict(
            "timer_dead_letter_not_replayable",
            "this dead letter comes from a timer that could not be fired: it never had a "
            "consumer group and has no offset to return to; schedule a new timer instead",
        )
    if row["replayed_at"] is not None:
        raise Conflict(
            "already_replayed",
            f"dead letter {dead_letter_id} was already replayed as "
            f"{row['replay_transaction_id']}",
        )
    txn = rules.new_transaction_id()
    (appended,) = append(
        raw, tenant_id,
        [NewFrame(row["queue"], row["partition"] or DEFAULT_PARTITION, row["payload"], txn,
                  meta={"replayOf": dead_letter_id}, seal=not is_envelope(row["payload"]))],
        cipher=cipher,
    )
    raw.execute(Q.mark_replayed, {"id": dead_letter_id, "transaction_id": txn})
    return appended


# -- resources --------------------------------------------------------------------------------


def list_queues(raw: DictConnection, tenant_id: int) -> list[dict[str, Any]]:
    return raw.execute(Q.list_queues, {"tenant_id": tenant_id}).fetchall()


def queue_detail(raw: DictConnection, tenant_id: int, name: str) -> dict[str, Any]:
    queue = raw.execute(Q.queue_detail, {"tenant_id": tenant_id, "name": name}).fetchone()
    if queue is None:
        raise NotFound("queue_not_found", f"no queue {name!r}")
    key = {"queue_id": queue["queue_id"]}
    return {
        "queue": queue,
        "partitions": raw.execute(Q.queue_partitions, key).fetchall(),
        "cursors": raw.execute(Q.queue_cursors, key).fetchall(),
        "dead_letters": one(raw.execute(Q.queue_dead_letter_count, key))["n"],
        "timers": one(raw.execute(Q.queue_timers, {"tenant_id": tenant_id, "name": name})),
    }


def delete_queue(raw: DictConnection, tenant_id: int, name: str) -> bool:
    gone = raw.execute(Q.delete_queue, {"tenant_id": tenant_id, "name": name}).fetchone()
    if gone is None:
        return False
    add_usage(raw, tenant_id, -int(gone["bytes"]))
    return True

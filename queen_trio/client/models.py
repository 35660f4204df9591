"""Typed results: frozen dataclasses built from the broker's JSON, statuses as str enums.

The enums are ``StrEnum``\\s, so ``result.status == "scheduled"`` holds as well as
``result.status is TimerStatus.SCHEDULED``.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import re
from collections.abc import Iterator
from datetime import datetime
from enum import StrEnum
from typing import Any, Generic, Literal, TypeVar, overload

import msgspec
import zstandard

from ..models import codec
from ..models import kv as wire_kv
from ..models import locks as wire_locks
from ..models import log as wire_log
from ..models import timers as wire_timers
from ..models import transaction as wire_transaction
from ..slots import slot_maker
from .errors import TransactionRefused

T = TypeVar("T")


#: The consumer group of a pop without one (queue mode), as it travels on the wire (the
#: broker's log/rules.py names it too: the SDK ships without the broker).
QUEUE_MODE_GROUP = "__QUEUE_MODE__"


class TimerStatus(StrEnum):
    """The answer to a schedule or a cancel."""

    SCHEDULED = "scheduled"      # a new pending timer
    RESCHEDULED = "rescheduled"  # an existing pending timer was replaced
    CANCELLED = "cancelled"      # it was pending and now is gone
    ABSENT = "absent"            # not pending: never was, cancelled, or ALREADY DELIVERED
    TOO_LATE = "too_late"        # a broker is firing it right now


_TIMER_STATUS = {s.value: s for s in TimerStatus}  # (a lookup costs less than an enum call)


class TimerState(StrEnum):
    PENDING = "pending"
    CLAIMED = "claimed"  # a sweeper holds it and is firing it


class PushStatus(StrEnum):
    QUEUED = "queued"
    DUPLICATE = "duplicate"  # a frame with this client-supplied transactionId already exists


class AckStatus(StrEnum):
    COMPLETED = "completed"
    FAILED = "failed"  # redeliver (up to the queue's retryLimit, then dead-letter)
    RETRY = "retry"    # give the lease back without spending a retry
    DLQ = "dlq"        # dead-letter it now


@overload
def parse_time(text: str) -> datetime: ...
@overload
def parse_time(text: str | None) -> datetime | None: ...
def parse_time(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text.replace("Z", "+00:00"))


# The messageIds of a bundle's answer as the broker writes them (str(UUID)), joined by commas:
# what the quick path takes as they are; any other spelling takes the strict path, which makes
# that of it. (Checked all at once: a pattern checked per field cost 1.2 µs a timer.)
_UUID = "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
_MESSAGE_IDS = re.compile(f"(?:{_UUID}(?:,{_UUID})*)?")
# TimerResult's fields as the wire names them (its other fields are spelled alike)
_TIMER_RESULT_NAMES = {"key": "timerKey", "deliver_at": "deliverAt", "message_id": "messageId"}


class TimerResult(msgspec.Struct, frozen=True, rename=_TIMER_RESULT_NAMES):
    """The answer to a schedule or cancel. ``ok`` is False for ``absent`` and ``too_late``.

    ``txn`` is the transactionId the timer's message has (or would have) in the log: for a
    cancel that found the timer, the stored one; when absent, the one you passed (None if you
    passed none). After ``absent`` the log is the authority: look for that txn in the
    destination queue. ``message_id`` (schedules) is the id the fired message will have.

    (A frozen msgspec Struct, not a dataclass: a bundle's answer is decoded straight into 500
    of them in C, where building each in Python cost the SDK more than decoding the JSON.)
    """

    ok: bool
    status: TimerStatus
    queue: str
    key: str
    txn: str | None
    partition: str | None = None       # schedules only
    deliver_at: datetime | None = None  # schedules only
    message_id: str | None = None       # schedules only

    @classmethod
    def from_wire(cls, w: dict[str, Any]) -> TimerResult:
        return cls.from_model(msgspec.convert(w, wire_timers.TimerResult))

    @classmethod
    def from_model(cls, r: wire_timers.TimerResult) -> TimerResult:
        """From the broker's own model of it."""
        return cls(r.ok, _TIMER_STATUS[r.status], r.queue, r.timer_key, r.txn, r.partition,
                   parse_time(r.deliver_at), None if r.message_id is None else str(r.message_id))


@dataclasses.dataclass(frozen=True, slots=True)
class TimerInfo:
    """A pending timer as peek and list see it (list entries carry no payload)."""

    queue: str
    key: str
    partition: str
    txn: str
    deliver_at: datetime
    state: TimerState
    attempts: int
    last_error: str | None
    payload: Any = None
    message_id: str | None = None

    @classmethod
    def from_wire(cls, w: dict[str, Any]) -> TimerInfo:
        """From a list's row or a peek (the row's fields, and the payload)."""
        r = msgspec.convert(w, wire_timers.TimerRow)  # the broker's own model of it
        state = TimerState.CLAIMED if r.claimed else TimerState.PENDING
        return cls(r.queue, r.timer_key, r.partition, r.txn, parse_time(r.deliver_at), state,
                   r.attempts, r.last_error, _timer_payload(w), str(r.message_id))


def _timer_payload(w: dict[str, Any]) -> Any:
    """A peeked timer's payload: this broker sends it decoded (``data``); Queen's wire has only
    ``payload``, base64 of the stored bytes (zstd-compressed when ``payloadZstd``)."""
    if "data" in w:
        return w["data"]
    if not isinstance(w.get("payload"), str):
        return None
    raw = base64.b64decode(w["payload"])
    if w.get("payloadZstd"):
        raw = zstandard.ZstdDecompressor().decompressobj().decompress(raw)
    return json.loads(raw)


@dataclasses.dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    """One keyset page of a listing; ``next`` is the cursor of the following page, if any."""

    items: tuple[T, ...]
    next: str | None


@dataclasses.dataclass(frozen=True, slots=True)
class PushResult:
    status: PushStatus
    transaction_id: str
    partition_id: str
    queue: str
    partition: str
    offset: int | None  # None for a duplicate
    # The message's id, as its delivery carries it; a duplicate's is the one that won. None
    # from a broker older than this field.
    message_id: str | None = None

    @classmethod
    def from_wire(cls, w: dict[str, Any]) -> PushResult:
        r = msgspec.convert(w, wire_log.Pushed)  # the broker's own model of it
        return cls(PushStatus(r.status), r.transactionId, r.partitionId, r.queue, r.partition,
                   r.offset, r.messageId)


@dataclasses.dataclass(frozen=True, slots=True)
class TimerMark:
    """On a message made by a timer: which timer, and the instant it was due."""

    key: str
    deliver_at: datetime | None


@dataclasses.dataclass(frozen=True, slots=True)
class Message:
    transaction_id: str
    partition_id: str
    queue: str
    partition: str
    offset: int
    lease_id: str | None  # None when popped with auto_ack
    consumer_group: str
    data: Any
    created_at: datetime
    retry_count: int
    timer: TimerMark | None = None
    # The message's id: for a timer's message, the one its schedule answered (message_id).
    id: str | None = None

    @classmethod
    def from_wire(cls, w: dict[str, Any]) -> Message:
        return cls.from_model(msgspec.convert(w, wire_log.Message))

    @classmethod
    def from_model(cls, r: wire_log.Message,
                   times: dict[str | None, datetime | None] | None = None) -> Message:
        """``times``: instants already parsed, shared by the messages of one answer."""
        times = {} if times is None else times
        t = r.timer or None
        mark = None if t is None else _make_mark(t["key"], _time(times, t.get("deliverAt")))
        make: Any = _make_message if cls is Message else cls
        made: Message = make(r.transactionId, r.partitionId, r.queue, r.partition, r.offset,
                             r.leaseId, r.consumerGroup, r.data, _time(times, r.createdAt),
                             r.retryCount, mark, r.id)
        return made


# (Their __init__ set each field through the frozen object.__setattr__: twice the time.)
_make_mark = slot_maker(TimerMark)
_make_message = slot_maker(Message)


def _time(times: dict[str | None, datetime | None], text: str | None) -> datetime | None:
    """:func:`parse_time`, once per distinct text: the frames of one fire or one push share
    their instants, and a 500-message answer parsed each of them anew."""
    parsed = times.get(text)
    if parsed is None:
        parsed = times[text] = parse_time(text)
    return parsed


@dataclasses.dataclass(frozen=True, slots=True)
class Batch:
    """What a pop returned: messages of one partition under one lease (empty: nothing ready)."""

    messages: tuple[Message, ...] = ()
    queue: str | None = None
    partition: str | None = None
    lease_id: str | None = None
    lease_expires_at: datetime | None = None

    def __iter__(self) -> Iterator[Message]:
        return iter(self.messages)

    def __len__(self) -> int:
        return len(self.messages)

    @classmethod
    def from_wire(cls, w: dict[str, Any]) -> Batch:
        return cls.from_model(msgspec.convert(w, wire_log.PopResponse))

    @classmethod
    def from_model(cls, r: wire_log.PopResponse) -> Batch:
        # Message.from_model's work, in one loop (a consumer builds every message it gets).
        times: dict[str | None, datetime | None] = {}
        made = []
        make, mark = _make_message, _make_mark
        for m in r.messages:
            t = m.timer or None
            if t is None:
                timer = None
            else:
                due = t.get("deliverAt")
                at = times.get(due)
                if at is None:
                    at = times[due] = parse_time(due)
                timer = mark(t["key"], at)
            created = times.get(m.createdAt)
            if created is None:
                created = times[m.createdAt] = parse_time(m.createdAt)
            made.append(make(m.transactionId, m.partitionId, m.queue, m.partition, m.offset,
                             m.leaseId, m.consumerGroup, m.data, created, m.retryCount, timer,
                             m.id))
        return cls(tuple(made), r.queue, r.partition, r.leaseId, parse_time(r.leaseExpiresAt))


@dataclasses.dataclass(frozen=True, slots=True)
class AckResult:
    """One acknowledgement's verdict. ``refused`` is the broker's code when it did not take
    it (``lease_lost``, ``unresolvable``, ``already_committed``, ``not_delivered``), with
    ``detail`` saying why; ``already_acked`` a completion at or below the committed offset,
    which changed nothing."""

    transaction_id: str
    partition_id: str
    status: AckStatus
    lease_released: bool
    dead_lettered: bool
    already_acked: bool
    refused: str | None = None
    detail: str | None = None

    @classmethod
    def from_wire(cls, w: dict[str, Any]) -> AckResult:
        return cls.from_model(msgspec.convert(w, wire_log.AckResult))

    @classmethod
    def from_model(cls, r: wire_log.AckResult) -> AckResult:
        return cls(r.transactionId, r.partitionId, AckStatus(r.status), r.leaseReleased, r.dlq,
                   r.noop, None if r.success else r.code, r.detail)


@dataclasses.dataclass(frozen=True, slots=True)
class SettledPop:
    """The answer to a pop that carried acknowledgements: what the acks did (``acks``: counts
    by status of those newly applied, plus ``alreadyAcked``, ``refused``, ``deadLettered``
    and ``leaseReleased``; ``refused``: the verdicts of those the broker did not take), then
    the batch."""

    batch: Batch
    acks: dict[str, Any]
    refused: tuple[AckResult, ...] = ()

    @classmethod
    def from_wire(cls, w: dict[str, Any]) -> SettledPop:
        return cls.from_model(msgspec.convert(w, wire_log.PopResponse))  # the broker's model

    @classmethod
    def from_bytes(cls, raw: bytes) -> Any:
        """The answer's bytes decoded straight into the broker's model (msgspec, in C), or
        ``codec.FALLBACK``: then the strict decoder and :meth:`from_wire` take it (they
        refuse, naming why, what this would not read)."""
        r = codec.fast(raw, _POP_ANSWER)
        return r if r is codec.FALLBACK else cls.from_model(r)

    @classmethod
    def from_model(cls, r: wire_log.PopResponse) -> SettledPop:
        acks = {} if r.acks is msgspec.UNSET else msgspec.structs.asdict(r.acks)
        return cls(Batch.from_model(r), acks,
                   tuple(AckResult.from_model(a) for a in r.ackRefused or ()))


_POP_ANSWER = msgspec.json.Decoder(wire_log.PopResponse)


@dataclasses.dataclass(frozen=True, slots=True)
class QueueConfig:
    queue: str
    created: bool
    lease_time_s: int
    retry_limit: int
    delayed_processing_s: int
    retention_s: int
    dead_letter_queue: bool
    max_size: int = 0
    retry_delay_ms: int = 0
    ttl_s: int = 0
    completed_retention_s: int = 0
    retention_enabled: bool = True
    ignored: tuple[str, ...] = ()  # options sent that the broker does not act on
    max_wait_s: int = 0  # Queen's maxWaitTimeSeconds: older messages are evicted

    @classmethod
    def from_wire(cls, w: dict[str, Any]) -> QueueConfig:
        r = msgspec.convert(w, wire_log.Configured)  # the broker's own model of it
        o = r.options
        return cls(r.queue, r.created, o.leaseTime, o.retryLimit, o.delayedProcessing,
                   o.retentionSeconds, o.deadLetterQueue, o.maxSize, o.retryDelay, o.ttl,
                   o.completedRetentionSeconds, o.retentionEnabled, tuple(r.ignored),
                   o.maxWaitTimeSeconds)


@dataclasses.dataclass(frozen=True, slots=True)
class KvEntry:
    """A live key as a read sees it. ``version`` changes with every write (``expect`` names
    it); ``expires_at`` None: forever."""

    namespace: str
    key: str
    value: Any
    version: int
    expires_at: datetime | None
    updated_at: datetime | None

    @classmethod
    def from_model(cls, namespace: str, r: wire_kv.KvEntry | wire_kv.KvGet) -> KvEntry:
        assert not isinstance(r.version, msgspec.UnsetType)  # (a get that found it)
        return cls(namespace, r.key, _unset(r.value), r.version,
                   parse_time(_unset(r.expires_at)), parse_time(_unset(r.updated_at)))


def _unset(value: T | msgspec.UnsetType) -> T | None:
    """A field the wire left out, as None."""
    return None if isinstance(value, msgspec.UnsetType) else value


@dataclasses.dataclass(frozen=True, slots=True)
class KvWrite:
    """The verdict of a put, put_if_absent, delete, incr or check; truthy when it applied.

    When it did not, ``reason`` says why (``exists``, ``absent``, ``version``, ``limit``,
    ``type``) and ``value``/``version`` are what a reader sees now (version 0: no live key),
    so the loser needs no second call. ``expires_at`` is set for a write that stored a value.
    """

    op: str
    namespace: str
    key: str
    applied: bool
    value: Any
    version: int
    reason: str | None = None
    expires_at: datetime | None = None

    def __bool__(self) -> bool:
        return self.applied

    @classmethod
    def from_model(cls, namespace: str, r: wire_kv.KvWrite) -> KvWrite:
        op: str = r.__struct_config__.tag  # type: ignore[assignment]
        return cls(op, namespace, r.key, r.applied, _unset(r.value), r.version,
                   _unset(r.reason), parse_time(_unset(r.expires_at)))


@dataclasses.dataclass(frozen=True, slots=True)
class KvRows:
    """``get_many``: the live keys asked for, by key, and the keys that are not there.
    ``truncated``: the call's read budget (4 MiB of values) cut rows that are in neither."""

    rows: tuple[KvEntry, ...]
    missing: tuple[str, ...]
    truncated: bool = False

    @classmethod
    def from_model(cls, namespace: str, r: wire_kv.KvGetMany) -> KvRows:
        return cls(tuple(KvEntry.from_model(namespace, e) for e in r.rows), tuple(r.missing),
                   r.truncated)


@dataclasses.dataclass(frozen=True, slots=True)
class KvPage:
    """One ``get_prefix`` page in key (byte) order; pass ``next_after`` as ``after`` for the
    next one. Each page is its own snapshot. ``keys_only`` rows carry ``value`` None."""

    rows: tuple[KvEntry, ...]
    truncated: bool
    next_after: str | None

    @classmethod
    def from_model(cls, namespace: str, r: wire_kv.KvGetPrefix) -> KvPage:
        return cls(tuple(KvEntry.from_model(namespace, e) for e in r.rows), r.truncated,
                   r.next_after)


def kv_result(namespace: str, w: dict[str, Any]) -> KvEntry | KvWrite | KvRows | KvPage | None:
    """One element of a KV answer, typed by its ``op`` (a ``get`` miss is None)."""
    r = msgspec.convert(w, wire_kv.KvResult)  # the broker's own model of it
    if isinstance(r, wire_kv.KvGet):
        return KvEntry.from_model(namespace, r) if r.found else None
    if isinstance(r, wire_kv.KvGetMany):
        return KvRows.from_model(namespace, r)
    if isinstance(r, wire_kv.KvGetPrefix):
        return KvPage.from_model(namespace, r)
    return KvWrite.from_model(namespace, r)


@dataclasses.dataclass(frozen=True, slots=True)
class LockHolder:
    """Who holds one permit of a lock (``token``, ``since`` and ``expires_at`` from ``get``)."""

    slot: int
    owner: str | None
    token: int | None = None
    since: datetime | None = None
    expires_at: datetime | None = None

    @classmethod
    def from_model(cls, h: wire_locks.LockHolder) -> LockHolder:
        return cls(h.slot, h.owner, _unset(h.token), parse_time(_unset(h.since)),
                   parse_time(_unset(h.expires_at)))


@dataclasses.dataclass(frozen=True, slots=True)
class LockResult:
    """One locks operation's verdict; truthy when it did what it was asked (acquired,
    renewed, released; for ``get``: the lock is held).

    A granted permit has its ``slot``, its fencing ``token`` (only rises on a lock; a renew
    answers a new one) and its ``guard``, the KV check that makes a transaction commit only
    while the permit is still held. Otherwise ``reason`` says why (``held``, ``contended``,
    ``lost``) and ``holders`` who has it."""

    op: str
    name: str
    ok: bool
    slot: int | None = None
    token: int | None = None
    guard: dict[str, Any] | None = None
    reason: str | None = None
    holders: tuple[LockHolder, ...] = ()
    already: bool = False

    def __bool__(self) -> bool:
        return self.ok

    @classmethod
    def from_wire(cls, w: dict[str, Any]) -> LockResult:
        r = msgspec.convert(w, wire_locks.LockResult)  # the broker's own model of it
        holders = tuple(LockHolder.from_model(h) for h in _unset(r.holders) or ())
        if isinstance(r, wire_locks.LockGet):
            return cls("get", r.name, r.held, holders=holders)
        if isinstance(r, wire_locks.LockRelease):
            return cls("release", r.name, r.released, r.slot, reason=_unset(r.reason),
                       holders=holders)
        guard = None if isinstance(r.guard, msgspec.UnsetType) else msgspec.to_builtins(r.guard)
        if isinstance(r, wire_locks.LockRenew):
            return cls("renew", r.name, r.renewed, r.slot, _unset(r.token), guard,
                       _unset(r.reason), holders)
        return cls("acquire", r.name, r.acquired, _unset(r.slot), _unset(r.token), guard,
                   _unset(r.reason), holders, r.already is True)


@dataclasses.dataclass(frozen=True, slots=True)
class KvPrecondition:
    """Why a transaction committed nothing: its ``required`` KV op at ``failed_index`` (in the
    flat ``results`` space: pushed items and acks first, then the kv ops) did not apply, for
    ``reason``; ``value`` and ``version`` are what it found."""

    failed_index: int
    reason: str
    version: int
    value: Any


@dataclasses.dataclass(frozen=True, slots=True)
class DeadLetter:
    id: int
    transaction_id: str
    queue: str
    partition: str
    consumer_group: str  # "__timer__" for timers that could not be fired
    offset: int | None
    error: str | None
    retry_count: int
    data: Any
    created_at: datetime | None
    failed_at: datetime | None
    replayed_at: datetime | None
    replay_transaction_id: str | None

    @classmethod
    def from_wire(cls, w: dict[str, Any]) -> DeadLetter:
        return cls(w["id"], w["transactionId"], w["queue"], w["partition"], w["consumerGroup"],
                   w.get("offset"), w.get("errorMessage"), w.get("retryCount", 0), w.get("data"),
                   parse_time(w.get("createdAt")), parse_time(w.get("failedAt")),
                   parse_time(w.get("replayedAt")), w.get("replayTransactionId"))


@dataclasses.dataclass(frozen=True, slots=True)
class Replayed:
    dead_letter_id: int
    pushed: PushResult


OperationResult = PushResult | AckResult | KvEntry | KvWrite | KvRows | KvPage | None


@dataclasses.dataclass(frozen=True, slots=True)
class TransactionResult:
    """What a transaction did; truthy when it committed.

    ``results`` is flat, as on the wire: one :class:`PushResult` per pushed item and one
    :class:`AckResult` per ack, in the order added, then one result per KV op (a ``get``
    that found nothing is None). ``timers``: one :class:`TimerResult` per timer entry (the
    wire's results after the KV ones; a ``too_late`` is a verdict: the bundle committed).
    A transaction whose ``required`` KV op did not hold committed nothing: ``committed`` is
    False, ``results`` empty and ``precondition`` says why. That is an answer, not an error.
    A bundle the broker refused whole (an ack under a lost lease, say) raises
    :class:`~queen_trio.client.errors.TransactionRefused`: nothing of it was written either.
    """

    results: tuple[OperationResult, ...]
    timers: tuple[TimerResult, ...]
    committed: bool = True
    precondition: KvPrecondition | None = None

    def __bool__(self) -> bool:
        return self.committed

    @classmethod
    def from_wire(cls, w: dict[str, Any], kv: list[dict[str, Any]]) -> TransactionResult:
        if not w.get("success", True):
            if w.get("reason") != "kv_precondition":  # refused whole: raised, as Queen's client
                msgspec.convert(w, wire_transaction.TransactionRefused)  # the broker's model
                raise TransactionRefused(w)
            lost = msgspec.convert(w, wire_kv.KvPreconditionFailed)
            return cls((), (), False, KvPrecondition(lost.failed_index, lost.kv_reason,
                                                     lost.version, lost.value))
        done = msgspec.convert(w, wire_transaction.TransactionDone)  # the broker's own model
        entries = list(zip(done.results, w["results"], strict=True))
        flat = [raw for typed, raw in entries if not isinstance(typed, wire_transaction.TxTimer)]
        base = sum(not isinstance(typed, wire_transaction.TxKv) for typed, _ in entries
                   if not isinstance(typed, wire_transaction.TxTimer))
        return cls(tuple(_flat_result(r, kv, base) for r in flat),
                   tuple(TimerResult.from_model(typed) for typed in done.results
                         if isinstance(typed, wire_transaction.TxTimer)))


class _TimersCommitted(msgspec.Struct):
    """A committed bundle of timers alone, as the SDK reads it: the broker's TransactionDone
    whose results are decoded straight into :class:`TimerResult` (their ``type`` and
    ``index`` unread). Any other answer fails to decode, and takes ``from_wire``'s path."""

    success: Literal[True]
    results: list[TimerResult]


_TIMERS_COMMITTED = msgspec.json.Decoder(_TimersCommitted)


def timers_committed(raw: bytes, count: int) -> TransactionResult:
    """The result of a committed bundle of ``count`` timers alone, decoded in C, or
    codec.FALLBACK (anything else: a refusal, a KV precondition, a result of another kind)."""
    done = codec.fast(raw, _TIMERS_COMMITTED)
    if done is codec.FALLBACK or len(done.results) != count or not _MESSAGE_IDS.fullmatch(
            ",".join([r.message_id for r in done.results if r.message_id is not None])):
        return codec.FALLBACK
    return TransactionResult((), tuple(done.results))


def _flat_result(w: dict[str, Any], kv: list[dict[str, Any]], base: int) -> OperationResult:
    kind = w.get("type")
    if kind == "push":
        return PushResult.from_wire(w)
    if kind == "ack":
        return AckResult.from_wire(w)
    return kv_result(kv[w["index"] - base]["ns"], w)

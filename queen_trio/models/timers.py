"""Queen's timer wire (``POST /api/v1/timers``, a transaction's ``timers``, the timer routes'
answers). What each field may hold beyond its type (names, the horizon, the payload ceiling)
is decided by :mod:`queen_trio.timers.rules`."""

from __future__ import annotations

import uuid
from typing import Annotated, Literal

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

MAX_OPS_PER_CALL = 256  # Queen's ceiling on the operations of one POST /api/v1/timers

class TimerOp(Struct, forbid_unknown_fields=True, kw_only=True, rename="camel", omit_defaults=True):
    """One operation. Server-owned fields (messageId, producerSub, tenant, deliverAt,
    attempts, any name starting with '_') are refused by name."""

    op: Literal["schedule", "reschedule", "cancel"]
    queue: str
    timer_key: str
    # UNSET, not None: a null is refused here, and the rules' own path says what it means.
    payload: Annotated[str, Meta(description="schedules: base64 of the JSON document the "
                                             "message will carry")] | UnsetType = UNSET
    payload_zstd: Annotated[bool, Meta(description="the base64 bytes are zstd-compressed")] \
        | UnsetType = UNSET
    delay_ms: Annotated[int, Meta(description="schedules: relative ms, counted from "
                                              "PostgreSQL's now")] | UnsetType = UNSET
    txn: Annotated[str, Meta(description="schedules: required, minted by the client; "
                                         "cancels: echoed back when absent")] | UnsetType = UNSET
    partition: str | UnsetType = UNSET
    encrypted: Literal[False] | UnsetType = UNSET


class TimerBatch(Struct, forbid_unknown_fields=True, rename="camel", omit_defaults=True):
    operations: Annotated[list[TimerOp], Meta(max_length=MAX_OPS_PER_CALL)]


TimerStatus = Literal["scheduled", "rescheduled", "cancelled", "absent", "too_late"]


class TimerResult(Struct, kw_only=True, rename="camel", omit_defaults=True):
    """The answer to one schedule or cancel (``ok`` is false for absent and too_late);
    messageId, deliverAt and partition for a schedule only."""

    ok: bool
    status: TimerStatus
    queue: str
    timer_key: str
    txn: str | None
    message_id: Annotated[uuid.UUID, Meta(description="schedules: the id the fired message "
                                                      "will carry")] | None = None
    deliver_at: str | None = None
    partition: str | None = None


class TimerResults(Struct, rename="camel", omit_defaults=True):
    results: list[TimerResult]


class TimersScheduled(Struct, kw_only=True, rename="camel"):
    """Our extension's compact answer to a bundle of timers that were all new names, every one
    of them ``scheduled``: what each of its results would say, told once. Timer i of the
    bundle (i from 1, in the order sent) has the message id ``messageIdBase`` with i XORed
    into its last 64 bits, is due ``now`` plus its delayMs, and is in its partition, or
    ``defaultPartition`` if it named none; its queue, timerKey and txn are those it was sent
    with."""

    count: Annotated[int, Meta(description="the timers scheduled: all of the bundle's")]
    now: Annotated[str, Meta(description="PostgreSQL's now() of the commit's statement")]
    message_id_base: uuid.UUID
    default_partition: str


class TransactionScheduled(Struct, kw_only=True, rename="camel"):
    """``POST /api/v1/transaction?answer=compact`` when the bundle only scheduled timers, all
    of new names (any other bundle is answered as without the flag): the results told once
    (:class:`TimersScheduled`), a few hundred bytes for a bundle of hundreds of timers."""

    success: Literal[True]
    transaction_id: str
    scheduled: TimersScheduled


class TimerRow(Struct, kw_only=True, rename="camel", omit_defaults=True):
    """A pending timer (a list's row; a peek adds found, payload and data)."""

    queue: str
    timer_key: str
    partition: str
    deliver_at: str
    txn: str
    message_id: uuid.UUID
    payload_zstd: bool
    encrypted: bool
    producer_sub: str | None
    attempts: int
    last_error: str | None
    claimed: Annotated[bool, Meta(description="a sweeper is firing it")]
    created_at: str
    updated_at: str


class TimerFound(TimerRow, kw_only=True, rename="camel", omit_defaults=True):
    found: Literal[True]
    payload: Annotated[str, Meta(description="base64 of the stored bytes (zstd when "
                                             "payloadZstd)")]
    data: Annotated[msgspec.Raw, Meta(description="the payload decoded: the message's data "
                                                  "(null if it cannot be decoded)")]


class TimerMissing(Struct, rename="camel", omit_defaults=True):
    found: Literal[False]
    queue: str
    timer_key: str


class TimerPage(Struct, rename="camel", omit_defaults=True):
    rows: list[TimerRow]
    truncated: bool
    next_after: str | None


class TimerCount(Struct, rename="camel", omit_defaults=True):
    queue: str
    prefix: str
    count: int


BATCH_DECODER = msgspec.json.Decoder(TimerBatch | list[TimerOp])

"""Queen's transaction wire: the request of ``POST /api/v1/transaction`` (:class:`Bundle`) and
its answers. Committed:
:class:`TransactionDone`, whose ``results`` is one flat array, each entry tagged by ``type``.
Refused whole by the state it found (an ack under a lost lease, say): :class:`TransactionRefused`
(a required KV op that did not apply answers :class:`.kv.KvPreconditionFailed`)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

from .kv import KvEntry, KvOp, KvReason, Stamp
from .log import Ack, AckCode, AckResult, Pushed, PushItem
from .timers import TimerOp, TimerResult

MAX_KV_OPS = 64  # (kv.rules.MAX_OPS_IN_TRANSACTION, which the rules enforce)

# -- the request ------------------------------------------------------------------------------


class PushOp(Struct, tag="push", tag_field="type", kw_only=True):
    items: list[PushItem]


class AckOp(Ack, tag="ack", tag_field="type", kw_only=True):
    """An acknowledgement (as ``POST /api/v1/ack`` takes it), fenced by its leaseId (default:
    the bundle's one required lease, when it names exactly one); other fields are ignored."""


class Bundle(Struct, forbid_unknown_fields=True, kw_only=True, rename="camel",
             omit_defaults=True):
    """Top-level operations (push, ack), kv (as on POST /api/v1/kv, without getPrefix, at
    most 64), timers and requiredLeases (leases that must be live; an ack naming no lease
    borrows the one required lease); at least one entry in operations, kv or timers, at
    most 1,000 in operations and timers. Any other field is a 400."""

    operations: list[PushOp | AckOp] | None | UnsetType = UNSET
    kv: Annotated[list[KvOp], Meta(max_length=MAX_KV_OPS)] | None | UnsetType = UNSET
    timers: list[TimerOp] | None | UnsetType = UNSET
    required_leases: list[str] | None | UnsetType = UNSET


BUNDLE_DECODER = msgspec.json.Decoder(Bundle)

# -- the answers ------------------------------------------------------------------------------

Operation = Annotated[int, Meta(description="the index of the entry of operations it answers")]


class TxPushed(Pushed, tag="push", tag_field="type", kw_only=True):
    """One pushed item (an entry of operations pushes one per item)."""

    operation: Operation


class TxAcked(AckResult, tag="ack", tag_field="type", kw_only=True):
    """An ack's verdict (in a committed bundle, always taken)."""

    operation: Operation


class TxKv(Struct, tag="kv", tag_field="type", kw_only=True, rename="camel",
           omit_defaults=True):
    """A kv op's result, as ``POST /api/v1/kv`` answers it (KvResult: the fields its ``op``
    carries), at its place in the flat results."""

    index: int
    op: Literal["get", "getMany", "put", "putIfAbsent", "delete", "incr", "check"]
    found: bool | UnsetType = UNSET
    applied: bool | UnsetType = UNSET
    key: str | UnsetType = UNSET
    value: Any | UnsetType = UNSET
    version: int | UnsetType = UNSET
    reason: KvReason | UnsetType = UNSET
    expires_at: Stamp | UnsetType = UNSET
    updated_at: Stamp | UnsetType = UNSET
    rows: list[KvEntry] | UnsetType = UNSET
    missing: list[str] | UnsetType = UNSET
    truncated: bool | UnsetType = UNSET


class TxTimer(TimerResult, tag="timer", tag_field="type", kw_only=True):
    """A timer entry's result (too_late and absent are verdicts: the bundle committed)."""

    index: int


TransactionItem = TxPushed | TxAcked | TxKv | TxTimer


class TransactionDone(Struct, kw_only=True, rename="camel", omit_defaults=True):
    success: Literal[True]
    transaction_id: str
    results: Annotated[list[TransactionItem], Meta(description=(
        "one flat array: every pushed item (type push) and every ack (type ack) in the order "
        "sent, then the kv results (type kv), then the timers' (type timer); index is the "
        "place in it"))]


RefusalCode = AckCode | Literal["lease_lost"]


class TransactionRefused(Struct, kw_only=True, rename="camel", omit_defaults=True):
    """The bundle was refused whole, nothing of it written (a 200, as Queen answers it): an
    ack the broker cannot take (its lease lost, its message unknown, at or below the
    committed offset, never delivered) or a required lease that is not live. ``error`` is
    the text, as Queen's (queen-mq raises it); ``code`` the precise reason."""

    ok: Literal[False]
    success: Literal[False]
    transaction_id: str
    error: Annotated[str, Meta(description="Queen's: the text (it says the transaction "
                                           "rolled back)")]
    code: RefusalCode
    message: str
    detail: str
    results: Annotated[list[TransactionItem], Meta(max_length=0)]
    failed_index: Annotated[int, Meta(description="the refused ack's place in the flat "
                                                  "results")] | UnsetType = UNSET
    operation: Annotated[int, Meta(description="the refused entry of operations")] \
        | UnsetType = UNSET
    lease: Annotated[str, Meta(description="the lease that is not live")] | UnsetType = UNSET


PausedCode = Literal["kv_disabled", "timers_disabled"]


class TransactionPaused(Struct, kw_only=True, rename="camel"):
    """403: a ``kv`` rider while an operator has paused KV, or a ``timers`` rider that
    schedules while scheduling is paused; nothing written. Permanent on purpose (a bundle
    carries messages: one retried in a loop against a paused broker is a storm on the hot
    path). The code is in ``error`` and in ``reason``, where Queen's clients read a
    transaction's."""

    ok: Literal[False]
    success: Literal[False]
    transaction_id: str
    error: PausedCode
    message: str
    reason: PausedCode
    results: Annotated[list[TransactionItem], Meta(max_length=0)]

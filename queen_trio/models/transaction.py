"""Queen's transaction wire: the answer of ``POST /api/v1/transaction`` when it committed
(a required KV op that did not apply answers :class:`.kv.KvPreconditionFailed`)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta, Struct


class TransactionDone(Struct, kw_only=True, rename="camel", omit_defaults=True):
    success: Literal[True]
    transaction_id: str
    results: Annotated[list[dict[str, Any]], Meta(description=(
        "one flat array, each with index and type: every pushed item (type push) and every "
        "ack (type ack) in the order sent, then the kv results (type kv, as KvResult), then "
        "the timers' (type timer, as TimerResult: too_late and absent are verdicts)"))]

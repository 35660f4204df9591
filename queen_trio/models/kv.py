"""Queen's KV wire: the requests of ``POST /api/v1/kv`` (:class:`KvOp`, :class:`KvCall`) and
of ``PUT|DELETE /api/v1/kv/{ns}/{key}``, their answers (one result per op, tagged by ``op``),
and the precondition answer a call (or a transaction) gives when its ``required`` op did not
apply. What an op may carry beyond its types is :mod:`queen_trio.kv.rules`'; what the ops do
is :mod:`queen_trio.kv.store`'s. The routes decode the requests through these models (a body
they refuse takes the rules' precise path) and encode the store's results through them."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

Stamp = str | None  # ISO 8601; None: the key lives forever (expiresAt)
Number = int | float
MAX_OPS_PER_CALL = 256  # (kv.rules.MAX_OPS, which the rules enforce)

# -- requests ---------------------------------------------------------------------------------


class KvOp(Struct, forbid_unknown_fields=True, kw_only=True, rename="camel",
           omit_defaults=True):
    """One KV op. op: get {key} | getMany {keys} | getPrefix {prefix (non-empty), after?,
    limit? (default 100, clamped to 1..1000), keysOnly?} | put {key, value, expect?} |
    putIfAbsent {key, value} | delete {key, expect?} | incr {key, delta, min?, max?} | check
    {key, expect}. Every put, putIfAbsent and incr carries exactly one of ttlSeconds (whole
    seconds) and forever: true (else 400 kv_expiry_not_specified); an incr's expiry applies
    when it creates the key. expect 0: the key must not exist; N: it must be at version N.
    required: true turns the op into the call's gate: if it does not apply, nothing commits
    and the answer is 200 kv_precondition. ns: ^[a-z0-9][a-z0-9._-]{0,63}$; key: 1-512 UTF-8
    bytes without control characters; value: any JSON, at most 64 KiB of compact JSON text
    (413). An op takes no other field."""

    op: Literal["get", "getMany", "getPrefix", "put", "putIfAbsent", "delete", "incr", "check"]
    ns: str
    key: str | UnsetType = UNSET
    keys: list[str] | UnsetType = UNSET
    prefix: str | UnsetType = UNSET
    after: str | None | UnsetType = UNSET
    limit: int | UnsetType = UNSET
    keys_only: bool | UnsetType = UNSET
    # UNSET, not None: "value": null is a value.
    value: Any | UnsetType = UNSET
    ttl_seconds: Annotated[int, Meta(ge=1)] | UnsetType = UNSET
    forever: bool | UnsetType = UNSET
    expect: Annotated[int, Meta(ge=0)] | UnsetType = UNSET
    required: bool | UnsetType = UNSET
    delta: Number | UnsetType = UNSET
    min: Number | None | UnsetType = UNSET
    max: Number | None | UnsetType = UNSET


class KvCall(Struct, forbid_unknown_fields=True):
    """``POST /api/v1/kv``: up to 256 ops (1,024 keys), one transaction (a bare array of ops
    is the same call)."""

    operations: Annotated[list[KvOp], Meta(max_length=MAX_OPS_PER_CALL)]


class KvPutBody(Struct, forbid_unknown_fields=True, kw_only=True, rename="camel",
                omit_defaults=True):
    """``PUT /api/v1/kv/{ns}/{key}``: the key comes from the URL."""

    value: Any
    ttl_seconds: Annotated[int, Meta(ge=1)] | UnsetType = UNSET
    forever: bool | UnsetType = UNSET
    expect: Annotated[int, Meta(ge=0)] | UnsetType = UNSET
    required: bool | UnsetType = UNSET


class KvDeleteBody(Struct, forbid_unknown_fields=True, kw_only=True, rename="camel",
                   omit_defaults=True):
    """``DELETE /api/v1/kv/{ns}/{key}`` (the body is optional)."""

    expect: Annotated[int, Meta(ge=0)] | UnsetType = UNSET
    required: bool | UnsetType = UNSET


CALL_DECODER = msgspec.json.Decoder(KvCall | list[KvOp])
PUT_DECODER = msgspec.json.Decoder(KvPutBody)
DELETE_DECODER = msgspec.json.Decoder(KvDeleteBody)

# -- answers ----------------------------------------------------------------------------------

class KvEntry(Struct, kw_only=True, rename="camel", omit_defaults=True):
    """A live key as a read sees it (a keysOnly page's rows carry no value)."""

    key: str
    value: Any | UnsetType = UNSET
    version: int
    expires_at: Stamp
    updated_at: Stamp


class KvGet(Struct, tag="get", tag_field="op", kw_only=True, rename="camel",
             omit_defaults=True):
    """``found: false`` carries the key alone."""

    index: int
    found: bool
    key: str
    value: Any | UnsetType = UNSET
    version: int | UnsetType = UNSET
    expires_at: Stamp | UnsetType = UNSET
    updated_at: Stamp | UnsetType = UNSET


class KvGetMany(Struct, tag="getMany", tag_field="op", kw_only=True, rename="camel",
             omit_defaults=True):
    index: int
    rows: list[KvEntry]
    missing: Annotated[list[str], Meta(description="keys with no live row")]
    truncated: Annotated[bool, Meta(description="the call's read budget cut rows that are in "
                                                "neither list")]


class KvGetPrefix(Struct, tag="getPrefix", tag_field="op", kw_only=True, rename="camel",
             omit_defaults=True):
    """One page in byte order of the keys; nextAfter is the next page's ``after``."""

    index: int
    rows: list[KvEntry]
    truncated: bool
    next_after: str | None


KvReason = Literal["exists", "absent", "version", "limit", "type"]


class KvWrite(Struct, tag_field="op", kw_only=True, rename="camel", omit_defaults=True):
    """A write's or a check's verdict. Not applied: ``reason``, with the value and version a
    reader sees now (version 0: no live key). A write that stored a value has expiresAt."""

    index: int
    applied: bool
    key: str
    value: Any | UnsetType = UNSET
    version: int
    reason: KvReason | UnsetType = UNSET
    expires_at: Stamp | UnsetType = UNSET


class KvPut(KvWrite, tag="put"):
    pass


class KvPutIfAbsent(KvWrite, tag="putIfAbsent"):
    pass


class KvDelete(KvWrite, tag="delete"):
    pass


class KvIncr(KvWrite, tag="incr"):
    pass


class KvCheck(KvWrite, tag="check"):
    pass


KvResult = KvGet | KvGetMany | KvGetPrefix | KvPut | KvPutIfAbsent | KvDelete | KvIncr | KvCheck


class KvResults(Struct, rename="camel", omit_defaults=True):
    results: list[KvResult]


RESULTS_DECODER = msgspec.json.Decoder(list[KvResult])


class KvPreconditionFailed(Struct, kw_only=True, rename="camel", omit_defaults=True):
    """A ``required`` op did not apply: nothing was committed (a 200: an answer, not an
    error). kvReason, version and value are what the op found."""

    ok: Literal[False]
    success: Literal[False]
    reason: Literal["kv_precondition"]
    error: Literal["kv_precondition_failed"]
    message: str
    results: Annotated[list[KvResult], Meta(max_length=0)]
    failed_index: Annotated[int, Meta(description="in the call's (or the transaction's flat) "
                                                  "results")]
    kv_reason: KvReason
    version: int
    value: Any
    transaction_id: Annotated[str, Meta(description="transactions only")] | UnsetType = UNSET

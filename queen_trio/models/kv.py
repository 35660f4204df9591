"""Queen's KV wire: the answers of ``POST /api/v1/kv`` and ``GET|PUT|DELETE
/api/v1/kv/{ns}/{key}`` (one result per op, tagged by ``op``), and the precondition answer a
call (or a transaction) gives when its ``required`` op did not apply. What the ops do is
:mod:`queen_trio.kv.store`'s; the routes encode its results through these models."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import UNSET, Meta, Struct, UnsetType

Stamp = str | None  # ISO 8601; None: the key lives forever (expiresAt)

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

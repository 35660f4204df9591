"""Queen's locks wire: the request of ``POST /api/v1/locks`` (:class:`LockOp`) and its
answers, one result per op, tagged by ``op``. What an op may carry beyond its types, and what
the ops do, is :mod:`queen_trio.locks`'; the route decodes the request through these models (a
body they refuse takes the rules' precise path) and encodes its results through them."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

from .kv import Stamp

MAX_OPS_PER_CALL = 64  # (locks.MAX_OPS, which the rules enforce)


class LockOp(Struct, forbid_unknown_fields=True, kw_only=True, rename="camel",
             omit_defaults=True):
    """acquire {name, ttlSeconds, owner?, limit? (1..1024 slots: a semaphore)} | renew {name,
    token, ttlSeconds, slot?, owner?} | release {name, token, slot?} | get {name}. name: 1-256
    bytes, no control characters, no '#'. A lock has no forever. A lock is named once per
    call."""

    op: Literal["acquire", "renew", "release", "get"]
    name: str
    ttl_seconds: Annotated[int, Meta(ge=1)] | UnsetType = UNSET
    owner: str | None | UnsetType = UNSET
    limit: Annotated[int, Meta(ge=1, le=1024)] | None | UnsetType = UNSET
    token: Annotated[int, Meta(ge=1)] | UnsetType = UNSET
    slot: Annotated[int, Meta(ge=0, le=1023)] | None | UnsetType = UNSET


class LockCall(Struct, forbid_unknown_fields=True):
    """``POST /api/v1/locks``: up to 64 independent ops (a bare array of ops is the same
    call)."""

    operations: Annotated[list[LockOp], Meta(max_length=MAX_OPS_PER_CALL)]


CALL_DECODER = msgspec.json.Decoder(LockCall | list[LockOp])


class LockHolder(Struct, kw_only=True, rename="camel", omit_defaults=True):
    """Who holds one permit (token, since, expiresAt and renewedAt from ``get`` only)."""

    slot: int
    owner: str | None
    token: int | UnsetType = UNSET
    since: Stamp | UnsetType = UNSET
    expires_at: Stamp | UnsetType = UNSET
    renewed_at: Stamp | UnsetType = UNSET


class LockGuard(Struct, kw_only=True, rename="camel", omit_defaults=True):
    """The KV check that holds while the permit is the caller's: first in a transaction's
    ``kv``, it makes the bundle commit only while the permit is held."""

    op: Literal["check"]
    ns: str
    key: str
    expect: int
    required: Literal[True]


Token = Annotated[int, Meta(description="the permit's fencing token: only rises on a lock")]


class LockAcquire(Struct, tag="acquire", tag_field="op", kw_only=True, rename="camel",
                  omit_defaults=True):
    """Granted: slot, token, owner, guard (``already``: the owner held it). Refused: reason
    and holders."""

    index: int
    name: str
    acquired: bool
    slot: int | UnsetType = UNSET
    token: Token | UnsetType = UNSET
    owner: str | None | UnsetType = UNSET
    guard: LockGuard | UnsetType = UNSET
    already: Literal[True] | UnsetType = UNSET
    reason: Literal["held", "contended"] | UnsetType = UNSET
    holders: list[LockHolder] | UnsetType = UNSET


class LockRenew(Struct, tag="renew", tag_field="op", kw_only=True, rename="camel",
                omit_defaults=True):
    """Renewed: a new token and its guard. Lost: reason and holders."""

    index: int
    name: str
    renewed: bool
    slot: int
    token: Token | UnsetType = UNSET
    guard: LockGuard | UnsetType = UNSET
    reason: Literal["lost"] | UnsetType = UNSET
    holders: list[LockHolder] | UnsetType = UNSET


class LockRelease(Struct, tag="release", tag_field="op", kw_only=True, rename="camel",
                  omit_defaults=True):
    index: int
    name: str
    released: bool
    slot: int
    reason: Literal["lost"] | UnsetType = UNSET
    holders: list[LockHolder] | UnsetType = UNSET


class LockGet(Struct, tag="get", tag_field="op", kw_only=True, rename="camel",
              omit_defaults=True):
    index: int
    name: str
    held: bool
    holders: list[LockHolder]


LockResult = LockAcquire | LockRenew | LockRelease | LockGet


class LockResults(Struct, rename="camel", omit_defaults=True):
    results: list[LockResult]


RESULTS_DECODER = msgspec.json.Decoder(list[LockResult])

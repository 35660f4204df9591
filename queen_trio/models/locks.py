"""Queen's locks wire: the answers of ``POST /api/v1/locks``, one result per op, tagged by
``op``. What the ops do is :mod:`queen_trio.locks`'; the route encodes its results through
these models."""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import UNSET, Meta, Struct, UnsetType

from .kv import Stamp


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

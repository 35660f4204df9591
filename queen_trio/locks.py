"""Locks and semaphores as KV leases (``POST /api/v1/locks``, Queen's wire).

A permit is one KV row: namespace ``queen-locks``, key ``<name>#<slot>``, the holder's
``{"owner": ...}`` as its value and the lock's lifetime as its expiry. A lock is a semaphore of
one slot; ``limit`` N gives the slots ``0..N-1``. Nothing else is stored, and every operation
is made of the KV store's own primitives, applied by :func:`queen_trio.kv.store.apply`:

- ``acquire``: ``putIfAbsent`` of a free slot (a semaphore reads its slots first to pick one);
- ``renew``: a read of the slot, then ``put`` with ``expect`` and a new lifetime;
- ``release``: ``delete`` with ``expect: token``;
- ``get``: the live rows under ``<name>#``.

The token is the row's version, so a later holder of a slot always has a higher one (versions
come from one sequence, in order): a fencing token. Every granted permit comes with its
``guard``, a KV ``check`` of its row at that version with ``required``: first in a
transaction's ``kv`` array, it lets the bundle commit only while the permit is still held.
A renew rewrites the row, so it answers a new token and the old one stops working.

``owner`` makes an operation safe to send again: an acquire by the owner that holds a permit
answers that permit (``already: true``); a renew whose token is stale because the owner's own
earlier renew landed is carried through. Operations of one call are independent, and a lock
is named once per call. Each KV call an operation makes is a transaction of its own, as if a
client had sent it: a lost putIfAbsent keeps its row locked until its transaction ends, and a
semaphore acquire that tried a second slot inside the first one's transaction could wait on a
contender that waits on it.
"""

from __future__ import annotations

import dataclasses
import random
import re
import unicodedata
from collections.abc import Awaitable, Callable
from typing import Any

from .db.rows import DictConnection
from .errors import ValidationError
from .kv import rules as kv_rules
from .kv import store as kv_store

# Apply one KV op (as :func:`kv_call` takes it) in a transaction of its own: its result.
Kv = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]

NAMESPACE = "queen-locks"
MAX_OPS = 64
MAX_LIMIT = 1024
MAX_NAME_BYTES = 256
MAX_OWNER_BYTES = 256
MAX_KEYS = 4096  # slot rows one call may name (a semaphore's acquire reads `limit` of them)
MAX_TTL_SECONDS = kv_rules.MAX_TTL_SECONDS
SLOT_SEP = "#"
ACQUIRE_ATTEMPTS = 4  # slots a semaphore acquire tries before it answers `contended`
RENEW_ATTEMPTS = 2  # reads and writes of a renew whose row changed in between
KINDS = ("acquire", "renew", "release", "get")
_FIELDS = {
    "acquire": frozenset({"op", "name", "ttlSeconds", "owner", "limit"}),
    "renew": frozenset({"op", "name", "token", "ttlSeconds", "slot", "owner"}),
    "release": frozenset({"op", "name", "token", "slot"}),
    "get": frozenset({"op", "name"}),
}
_DIGITS = re.compile(r"^(0|[1-9][0-9]*)$")


def bad(reason: str, detail: str) -> ValidationError:
    return ValidationError("locks_bad_request", detail, reason=reason, detail=detail)


@dataclasses.dataclass(frozen=True, slots=True)
class LockOp:
    index: int
    kind: str
    name: str
    ttl_s: int = 0
    owner: str | None = None
    limit: int = 1
    token: int = 0
    slot: int = 0

    @property
    def slot_rows(self) -> int:
        return self.limit if self.kind == "acquire" else (kv_rules.PREFIX_LIMIT_MAX
                                                          if self.kind == "get" else 1)


def _control(text: str) -> bool:
    return any(unicodedata.category(c) == "Cc" for c in text)


def _text(value: Any, max_bytes: int) -> bool:
    try:
        return (isinstance(value, str) and bool(value) and len(value.encode()) <= max_bytes
                and not _control(value))
    except UnicodeEncodeError:
        return False


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def parse_op(index: int, raw: Any) -> LockOp:
    where = f"operation at index {index}: "
    if not isinstance(raw, dict):
        raise bad("locks_bad_request", f"{where}an operation must be an object")
    kind = raw.get("op")
    if not isinstance(kind, str) or kind not in KINDS:
        raise bad("locks_unknown_op", f"{where}op must be acquire, renew, release or get, "
                                      f"got {kind!r}")
    if any(f in raw for f in ("tenant", "tenantId", "_tenant")):
        raise bad("locks_tenant_not_an_input", f"{where}the tenant is the caller's, never a "
                                               f"field")
    unknown = set(raw) - _FIELDS[kind]
    if "forever" in unknown:
        raise bad("locks_ttl_required", f"{where}a lock has no forever: it takes ttlSeconds, "
                                        f"and a holder that needs longer renews")
    if unknown:
        raise bad("locks_unknown_field", f"{where}{kind} does not take "
                                         f"{', '.join(sorted(unknown))}")
    name = raw.get("name")
    if not isinstance(name, str) or not _text(name, MAX_NAME_BYTES) or SLOT_SEP in name:
        raise bad("locks_bad_name", f"{where}a lock's name is a non-empty string of at most "
                                    f"{MAX_NAME_BYTES} bytes, without control characters and "
                                    f"without '#'")
    op = LockOp(index, kind, name)
    if kind == "get":
        return op
    if kind in ("acquire", "renew"):
        if "ttlSeconds" not in raw:
            raise bad("locks_ttl_required", f"{where}{kind} needs ttlSeconds (an integer > 0)")
        ttl = _int(raw["ttlSeconds"])
        if ttl is None or not 1 <= ttl <= MAX_TTL_SECONDS:
            raise bad("locks_bad_ttl", f"{where}ttlSeconds must be an integer from 1 to "
                                       f"{MAX_TTL_SECONDS}")
        owner = raw.get("owner")
        if owner is not None and not _text(owner, MAX_OWNER_BYTES):
            raise bad("locks_bad_owner", f"{where}owner is a non-empty string of at most "
                                         f"{MAX_OWNER_BYTES} bytes, without control characters")
        op = dataclasses.replace(op, ttl_s=ttl, owner=owner)
    if kind == "acquire":
        limit = 1 if raw.get("limit") is None else _int(raw["limit"])
        if limit is None or not 1 <= limit <= MAX_LIMIT:
            raise bad("locks_bad_limit", f"{where}limit must be an integer from 1 (a lock) "
                                         f"to {MAX_LIMIT}")
        return dataclasses.replace(op, limit=limit)
    if "token" not in raw:
        raise bad("locks_token_required", f"{where}{kind} needs the token of the permit (the "
                                          f"one the last acquire or renew answered)")
    token = _int(raw["token"])
    if token is None or token <= 0:
        raise bad("locks_bad_token", f"{where}token must be an integer above 0")
    slot = 0 if raw.get("slot") is None else _int(raw["slot"])
    if slot is None or not 0 <= slot < MAX_LIMIT:
        raise bad("locks_bad_slot", f"{where}slot must be an integer from 0 to {MAX_LIMIT - 1}")
    return dataclasses.replace(op, token=token, slot=slot)


def parse_call(raw_ops: Any) -> list[LockOp]:
    if not isinstance(raw_ops, list):
        raise bad("locks_bad_body", 'the body is an array of operations, or '
                                    '{"operations": [...]}')
    if len(raw_ops) > MAX_OPS:
        raise bad("locks_too_many_ops", f"{len(raw_ops)} operations in one call, the ceiling "
                                        f"is {MAX_OPS}")
    ops = [parse_op(i, op) for i, op in enumerate(raw_ops)]
    names = [op.name for op in ops]
    if len(set(names)) != len(names):
        raise bad("locks_duplicate_in_call", "a lock may be named by one operation per call")
    rows = sum(op.slot_rows for op in ops)
    if rows > MAX_KEYS:
        raise bad("locks_too_many_keys", f"the call names {rows} permits, the ceiling is "
                                         f"{MAX_KEYS}")
    return ops


# -- the KV underneath --------------------------------------------------------------------------


def slot_key(name: str, slot: int) -> str:
    return f"{name}{SLOT_SEP}{slot}"


def slot_of(name: str, key: str) -> int | None:
    """The slot a key of ``name`` is, for the decimal this module writes and nothing looser."""
    digits = key.removeprefix(name + SLOT_SEP)
    if digits == key or not _DIGITS.fullmatch(digits) or int(digits) >= MAX_LIMIT:
        return None
    return int(digits)


def guard(name: str, slot: int, token: int) -> dict[str, Any]:
    """The KV op that holds while the permit is the caller's: first in a bundle's ``kv``."""
    return {"op": "check", "ns": NAMESPACE, "key": slot_key(name, slot), "expect": token,
            "required": True}


def kv_call(raw: DictConnection, tenant_id: int, op: dict[str, Any]) -> dict[str, Any]:
    """One KV op of this module's own making, applied as any client's would be (run it with
    ``Database.run_transaction``: one transaction)."""
    parsed = kv_rules.parse_op(0, {"ns": NAMESPACE, **op}, ceiling=kv_rules.MAX_VALUE_BYTES)
    return kv_store.apply(raw, tenant_id, [parsed])[0]


def _owner_of(value: Any) -> str | None:
    # A row written by hand through the KV routes may hold anything: it has no owner then, and
    # holds its slot all the same.
    owner = value.get("owner") if isinstance(value, dict) else None
    return owner if isinstance(owner, str) else None


def _holders(name: str, rows: list[dict[str, Any]], limit: int | None = None
             ) -> dict[int, dict[str, Any]]:
    held: dict[int, dict[str, Any]] = {}
    for row in rows:
        slot = slot_of(name, row["key"])
        if slot is not None and (limit is None or slot < limit):
            held[slot] = row
    return dict(sorted(held.items()))


def _brief(held: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"slot": slot, "owner": _owner_of(row["value"])} for slot, row in held.items()]


def _since(row: dict[str, Any]) -> Any:
    """When the holder took the permit: the acquire's write, which a renew carries along."""
    since = row["value"].get("since") if isinstance(row["value"], dict) else None
    return since if isinstance(since, str) else row.get("updatedAt")


def _granted(op: LockOp, slot: int, token: int, *, already: bool = False) -> dict[str, Any]:
    answer = {"index": op.index, "op": "acquire", "name": op.name, "acquired": True,
              "slot": slot, "token": token, "owner": op.owner,
              "guard": guard(op.name, slot, token)}
    if already:
        answer["already"] = True
    return answer


def _refused(op: LockOp, reason: str, holders: list[dict[str, Any]]) -> dict[str, Any]:
    return {"index": op.index, "op": "acquire", "name": op.name, "acquired": False,
            "reason": reason, "holders": holders}


def _lost(op: LockOp, holders: list[dict[str, Any]]) -> dict[str, Any]:
    flag = "renewed" if op.kind == "renew" else "released"
    return {"index": op.index, "op": op.kind, "name": op.name, flag: False, "reason": "lost",
            "slot": op.slot, "holders": holders}


async def _slot_rows(kv: Kv, name: str, limit: int) -> dict[int, dict[str, Any]]:
    got = await kv({"op": "getMany", "keys": [slot_key(name, s) for s in range(limit)]})
    return _holders(name, got["rows"], limit)


async def _acquire(kv: Kv, op: LockOp) -> dict[str, Any]:
    value = {"owner": op.owner}
    held: dict[int, dict[str, Any]] = {}
    for _ in range(ACQUIRE_ATTEMPTS if op.limit > 1 else 1):
        if op.limit == 1:
            slot = 0
        else:  # read the slots to choose one; the putIfAbsent alone decides who wins it
            held = await _slot_rows(kv, op.name, op.limit)
            mine = [(s, r) for s, r in held.items()
                    if op.owner is not None and _owner_of(r["value"]) == op.owner]
            if mine:
                return _granted(op, mine[0][0], mine[0][1]["version"], already=True)
            free = [s for s in range(op.limit) if s not in held]
            if not free:
                return _refused(op, "held", _brief(held))
            slot = random.choice(free)  # contenders reading the same slots spread out
        verdict = await kv({"op": "putIfAbsent", "key": slot_key(op.name, slot),
                            "value": value, "ttlSeconds": op.ttl_s})
        if verdict["applied"]:
            return _granted(op, slot, verdict["version"])
        if op.owner is not None and _owner_of(verdict["value"]) == op.owner:
            return _granted(op, slot, verdict["version"], already=True)  # its own lost answer
        if op.limit == 1:
            return _refused(op, "held", [{"slot": 0, "owner": _owner_of(verdict["value"])}])
    return _refused(op, "contended", _brief(held))


async def _renew(kv: Kv, op: LockOp) -> dict[str, Any]:
    key = slot_key(op.name, op.slot)
    holders: list[dict[str, Any]] = []
    # Read to keep the value and its `since`; the put's expect then decides. A row that
    # changed in between (it expired, was taken, or this owner's other renew landed) is read
    # and judged once more.
    for _ in range(RENEW_ATTEMPTS):
        row = await kv({"op": "get", "key": key})
        if not row["found"]:
            return _lost(op, [])
        owner = _owner_of(row["value"])
        if row["version"] != op.token and (op.owner is None or owner != op.owner):
            return _lost(op, [{"slot": op.slot, "owner": owner}])
        value = row["value"]
        if isinstance(value, dict):
            value = {**value, "since": _since(row)}
        verdict = await kv({"op": "put", "key": key, "value": value, "ttlSeconds": op.ttl_s,
                            "expect": row["version"]})
        if verdict["applied"]:
            return {"index": op.index, "op": "renew", "name": op.name, "renewed": True,
                    "slot": op.slot, "token": verdict["version"],
                    "guard": guard(op.name, op.slot, verdict["version"])}
        holders = ([] if verdict["version"] == 0
                   else [{"slot": op.slot, "owner": _owner_of(verdict["value"])}])
    return _lost(op, holders)


async def _release(kv: Kv, op: LockOp) -> dict[str, Any]:
    verdict = await kv({"op": "delete", "key": slot_key(op.name, op.slot), "expect": op.token})
    if verdict["applied"]:
        return {"index": op.index, "op": "release", "name": op.name, "released": True,
                "slot": op.slot}
    return _lost(op, [] if verdict["version"] == 0
                 else [{"slot": op.slot, "owner": _owner_of(verdict["value"])}])


async def _get(kv: Kv, op: LockOp) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    after = None
    while True:  # a semaphore past one page of permits: the pages that remain
        page = await kv({"op": "getPrefix", "prefix": op.name + SLOT_SEP,
                         "limit": kv_rules.PREFIX_LIMIT_MAX, **({"after": after} if after else {})})
        rows += page["rows"]
        after = page["nextAfter"]
        if not after:
            break
    held = _holders(op.name, rows)
    return {"index": op.index, "op": "get", "name": op.name, "held": bool(held), "holders": [
        {"slot": slot, "owner": _owner_of(row["value"]), "token": row["version"],
         "since": _since(row), "expiresAt": row["expiresAt"], "renewedAt": row["updatedAt"]}
        for slot, row in held.items()]}


_APPLY = {"acquire": _acquire, "renew": _renew, "release": _release, "get": _get}


async def apply(kv: Kv, op: LockOp) -> dict[str, Any]:
    """One operation, its KV calls made through ``kv``."""
    return await _APPLY[op.kind](kv, op)

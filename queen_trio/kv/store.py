"""KV state in the database: one call's ops applied in the caller's transaction, and the batch
of expired keys the purger (kv/purger.py) removes.

:func:`apply` answers Queen's result elements, in input order, each with ``index`` and ``op``:

- a write (put, putIfAbsent, delete, incr) ``{applied, key, value, version}``; when it did not
  apply, ``reason`` (``exists``, ``absent``, ``version``, ``limit``, ``type``) with the value and
  version a reader would see (0: no live row), so a loser needs no second call;
- ``check`` ``{applied, key, version}``, or the same verdict as a write that did not apply;
- ``get`` ``{found, key, value, version, expiresAt, updatedAt}`` (``{found: false, key}``);
  ``getMany`` ``{rows, missing, truncated}``; ``getPrefix`` ``{rows, truncated, nextAfter}``.

A ``required`` op that does not apply raises :class:`~queen_trio.kv.rules.PreconditionLost`:
the caller's transaction rolls back whole.

Concurrency: a write or a check locks its row first (``FOR UPDATE``; ``FOR SHARE`` for a
check) and judges what it finds, so of N concurrent ``putIfAbsent`` on one key exactly one
applies and the others see its row. A key with no row is inserted with ``ON CONFLICT DO
NOTHING``: a concurrent creator wins, and the op locks that row and judges again.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from ..db import queries
from ..db.rows import DictConnection, DictRow
from ..formats import iso
from ..log.store import add_usage
from . import rules
from .rules import Op, PreconditionLost

Q = queries.load("kv")
Result = dict[str, Any]

PURGE_BATCH = 1000
_RACES = 50  # a key created and removed by others this many times between our looks: give up


def apply(raw: DictConnection, tenant_id: int, ops: list[Op]) -> list[Result]:
    """Apply one call's ops (:func:`rules.parse_call`) in the caller's transaction."""
    results: list[Result] = [{}] * len(ops)
    budget = _ReadBudget()
    written = {(op.namespace, op.key) for op in ops if op.writes}
    for op in rules.apply_order(ops):
        if op.kind == "check" and (op.namespace, op.key) in written:
            # Shared then exclusive on one row would deadlock two such calls: take the
            # write's lock at once.
            result = _check(raw, tenant_id, op, budget, shared=False)
        else:
            result = _APPLY[op.kind](raw, tenant_id, op, budget)
        if op.required and result.get("applied") is False:
            raise PreconditionLost(result)
        results[op.index] = result
    return results


class _Raced(Exception):  # noqa: N818 - control flow: look at the row again
    """Our insert stood aside for a row another call created meanwhile."""


class _ReadBudget:
    """The value bytes one call may still read (getMany and getPrefix stop there)."""

    def __init__(self) -> None:
        self.left = rules.MAX_READ_BYTES

    def keep(self, rows: list[DictRow], value_bytes: Callable[[DictRow], int]) -> list[DictRow]:
        """The rows that fit, the one that straddles the budget included."""
        kept = []
        for row in rows:
            if self.left <= 0:
                break
            kept.append(row)
            self.left -= value_bytes(row)
        return kept


def _params(tenant_id: int, op: Op) -> dict[str, Any]:
    return {"tenant_id": tenant_id, "namespace": op.namespace, "key": op.key}


def _judged(raw: DictConnection, tenant_id: int, op: Op,
            judge: Callable[[DictRow | None, DictRow | None], Result],
            *, shared: bool = False) -> Result:
    """``judge(row, live)`` with the op's row locked (``live``: the row unless it expired)."""
    query = Q.lock_shared if shared else Q.lock
    for _ in range(_RACES):
        row = raw.execute(query, _params(tenant_id, op)).fetchone()
        try:
            return judge(row, row if row is not None and row["live"] else None)
        except _Raced:
            continue
    raise RuntimeError(f"kv: key {op.key!r} kept being created and removed under this call")


def _store(raw: DictConnection, tenant_id: int, op: Op, row: DictRow | None, text: str,
           ttl_s: int | None, *, keep_expiry: bool = False) -> DictRow:
    """Write ``text`` over the locked ``row``, or insert it where there was none."""
    size = len(text.encode())
    params = {**_params(tenant_id, op), "value": text, "size": size, "ttl_s": ttl_s,
              "keep_expiry": keep_expiry}
    if row is None:
        written = raw.execute(Q.insert, params).fetchone()
        if written is None:
            raise _Raced
    else:
        written = raw.execute(Q.update, params).fetchone()
        assert written is not None  # the row is locked
    add_usage(raw, tenant_id, size - (row["size_bytes"] if row is not None else 0))
    return written


def _applied(op: Op, value: Any, version: int, written: DictRow | None = None) -> Result:
    result = {"index": op.index, "op": op.kind, "applied": True, "key": op.key, "value": value,
              "version": version}
    if written is not None:
        result["expiresAt"] = iso(written["expires_at"])
    return result


_AS_READ: Any = object()


def _lost(op: Op, reason: str, live: DictRow | None, value: Any = _AS_READ) -> Result:
    """Not applied, with what a reader sees now (an expired row is no value: version 0)."""
    if value is _AS_READ:
        value = None if live is None else live["value"]
    return {"index": op.index, "op": op.kind, "applied": False, "reason": reason, "key": op.key,
            "value": value, "version": 0 if live is None else live["version"]}


def _put(raw: DictConnection, tenant_id: int, op: Op, _budget: _ReadBudget) -> Result:
    def judge(row: DictRow | None, live: DictRow | None) -> Result:
        if op.expect == 0 and live is not None:
            return _lost(op, "exists", live)
        if op.expect and (live is None or live["version"] != op.expect):
            return _lost(op, "absent" if live is None else "version", live)
        written = _store(raw, tenant_id, op, row, op.value_text, op.ttl_s)
        return _applied(op, op.value, written["version"], written)

    return _judged(raw, tenant_id, op, judge)


def _delete(raw: DictConnection, tenant_id: int, op: Op, _budget: _ReadBudget) -> Result:
    def judge(row: DictRow | None, live: DictRow | None) -> Result:
        if op.expect == 0:  # "must not exist": done when it does not, nothing to write
            return (_applied(op, None, 0) if live is None else _lost(op, "exists", live))
        if op.expect and (live is None or live["version"] != op.expect):
            return _lost(op, "absent" if live is None else "version", live)
        if row is not None:  # an expired row goes too, but it was never there
            raw.execute(Q.delete, _params(tenant_id, op))
            add_usage(raw, tenant_id, -row["size_bytes"])
        if live is None:
            return _lost(op, "absent", None)
        return _applied(op, live["value"], live["version"])

    return _judged(raw, tenant_id, op, judge)


def _incr(raw: DictConnection, tenant_id: int, op: Op, _budget: _ReadBudget) -> Result:
    def judge(row: DictRow | None, live: DictRow | None) -> Result:
        if live is not None and live["number"] is None:
            return _lost(op, "type", live)
        current = Decimal(live["number"]) if live is not None else Decimal(0)
        after = current + op.delta
        # Refused, never saturated: an increment past max spends nothing. On a key with no
        # live row, `after` is the delta itself, so the first incr of a window is held to
        # min and max too.
        if (op.min is not None and after < op.min) or (op.max is not None and after > op.max):
            return _lost(op, "limit", live, json.loads(rules.number_text(current)))
        text = rules.number_text(after)
        # The expiry is the counter's at creation: an incr on a live one keeps it, or a
        # fixed-window limiter that is always busy would never close its window.
        written = _store(raw, tenant_id, op, row, text, op.ttl_s, keep_expiry=live is not None)
        return _applied(op, json.loads(text), written["version"], written)

    return _judged(raw, tenant_id, op, judge)


def _check(raw: DictConnection, tenant_id: int, op: Op, _budget: _ReadBudget, *,
           shared: bool = True) -> Result:
    def judge(row: DictRow | None, live: DictRow | None) -> Result:
        if op.expect == 0:
            if live is None:
                return {"index": op.index, "op": "check", "applied": True, "key": op.key,
                        "version": 0}
            return _lost(op, "exists", live)
        if live is None or live["version"] != op.expect:
            return _lost(op, "absent" if live is None else "version", live)
        return {"index": op.index, "op": "check", "applied": True, "key": op.key,
                "version": live["version"]}

    return _judged(raw, tenant_id, op, judge, shared=shared)


def _entry(row: DictRow, *, with_value: bool = True) -> Result:
    entry = {"key": row["key"], "value": row["value"], "version": row["version"],
             "expiresAt": iso(row["expires_at"]), "updatedAt": iso(row["updated_at"])}
    if not with_value:
        del entry["value"]
    return entry


def _get(raw: DictConnection, tenant_id: int, op: Op, budget: _ReadBudget) -> Result:
    row = raw.execute(Q.read, _params(tenant_id, op)).fetchone()
    if row is None:
        return {"index": op.index, "op": "get", "found": False, "key": op.key}
    budget.left -= row["size_bytes"]  # one key is bounded by the value ceiling: always read
    return {"index": op.index, "op": "get", "found": True,
            **_entry({**row, "key": op.key})}


def _get_many(raw: DictConnection, tenant_id: int, op: Op, budget: _ReadBudget) -> Result:
    rows = raw.execute(Q.get_many, {"tenant_id": tenant_id, "namespace": op.namespace,
                                    "keys": list(op.keys)}).fetchall()
    kept = budget.keep(rows, lambda r: r["size_bytes"])
    found = {r["key"] for r in rows}
    # Absence is stated, never left to be computed; keys the byte budget cut are in neither
    # list (calling them missing would be a lie), and `truncated` says so.
    return {"index": op.index, "op": "getMany", "rows": [_entry(r) for r in kept],
            "missing": [k for k in op.keys if k not in found],
            "truncated": len(kept) < len(rows)}


def _get_prefix(raw: DictConnection, tenant_id: int, op: Op, budget: _ReadBudget) -> Result:
    rows = raw.execute(Q.get_prefix, {
        "tenant_id": tenant_id, "namespace": op.namespace, "prefix": op.prefix,
        "end": rules.prefix_end(op.prefix), "after": op.after, "limit": op.limit}).fetchall()
    kept = budget.keep(rows[:op.limit], lambda r: 0 if op.keys_only else r["size_bytes"])
    truncated = len(kept) < len(rows)
    return {"index": op.index, "op": "getPrefix",
            "rows": [_entry(r, with_value=not op.keys_only) for r in kept],
            "truncated": truncated, "nextAfter": kept[-1]["key"] if truncated and kept else None}


_APPLY: dict[str, Callable[[DictConnection, int, Op, _ReadBudget], Result]] = {
    "put": _put, "putIfAbsent": _put, "delete": _delete, "incr": _incr, "check": _check,
    "get": _get, "getMany": _get_many, "getPrefix": _get_prefix,
}


def purge_expired(raw: DictConnection, limit: int = PURGE_BATCH) -> int:
    removed = 0
    for row in raw.execute(Q.purge_expired, {"limit": limit}).fetchall():
        add_usage(raw, row["tenant_id"], -row["bytes"])
        removed += row["n"]
    return removed


__all__ = ["PreconditionLost", "apply", "purge_expired"]

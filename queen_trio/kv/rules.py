"""KV operations as Queen's wire states them (pure): what each op may carry, and the limits of
one call. ``parse_call`` turns a list of JSON ops into :class:`Op` values or raises a 400
``kv_bad_request`` whose ``reason`` says which rule (Queen's codes: ``kv_expiry_not_specified``,
``kv_bad_namespace``, ``kv_duplicate_key_in_call``, ...), or a 413 for a value above the
ceiling. Nothing here touches the database: :mod:`queen_trio.kv.store` applies the ops.

Every write (put, putIfAbsent, incr) declares exactly one of ``ttlSeconds`` (whole seconds) and
``forever: true``; a put never inherits the expiry of the value it replaces.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from ..errors import PayloadTooLarge, ValidationError
from ..text import compact_json, encodable, utf8_len, utf8_name

MAX_VALUE_BYTES = 65_536  # of the value's compact JSON text (a plan's message ceiling may be lower)
MAX_KEY_BYTES = 512
MAX_TTL_SECONDS = 100 * 365 * 86_400
MAX_OPS = 256  # one POST /api/v1/kv
MAX_OPS_IN_TRANSACTION = 64  # the `kv` array of a transaction
MAX_KEYS = 1024  # keys named by one call: getMany counts its keys, getPrefix its limit
PREFIX_LIMIT_DEFAULT = 100
PREFIX_LIMIT_MAX = 1000  # a larger limit is clamped, never refused
MAX_READ_BYTES = 4 * 1024 * 1024  # values one call reads; past it a read answers truncated

_NAMESPACE_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
# What a namespace could be before this broker spoke Queen's wire: rows written then stay
# readable and deletable (nothing is lost), but nothing new is written under such a name.
_LEGACY_NAMESPACE_RE = re.compile(r"^[A-Za-z0-9_.:\-]{1,128}$")

READS = frozenset({"get", "getMany", "getPrefix"})
WRITES = frozenset({"put", "putIfAbsent", "delete", "incr"})
KINDS = READS | WRITES | {"check"}
_COMMON = {"op", "ns", "required"}
_FIELDS: dict[str, frozenset[str]] = {
    "get": frozenset({"key"}),
    "getMany": frozenset({"keys"}),
    "getPrefix": frozenset({"prefix", "after", "limit", "keysOnly"}),
    "put": frozenset({"key", "value", "ttlSeconds", "forever", "expect"}),
    "putIfAbsent": frozenset({"key", "value", "ttlSeconds", "forever", "expect"}),
    "delete": frozenset({"key", "expect"}),
    "incr": frozenset({"key", "delta", "min", "max", "ttlSeconds", "forever"}),
    "check": frozenset({"key", "expect"}),
}
_TENANT_FIELDS = ("tenant", "tenantId", "_tenant")


def bad(reason: str, detail: str, **extra: Any) -> ValidationError:
    """Queen's 400: ``error`` is always ``kv_bad_request``, ``reason`` the rule broken."""
    return ValidationError("kv_bad_request", detail, reason=reason, detail=detail, **extra)


class PreconditionLost(Exception):  # noqa: N818 - a verdict, not an error
    """A ``required`` op did not apply: the whole call (or bundle) rolls back, and the caller
    answers 200 ``success: false, reason: "kv_precondition"`` with what the op found."""

    def __init__(self, result: dict[str, Any]) -> None:
        super().__init__(f"kv precondition lost: {result.get('reason')}")
        self.result = result


@dataclasses.dataclass(frozen=True, slots=True)
class Op:
    """One validated op. ``index`` is its position in the call; ``kind`` is the op as sent
    (putIfAbsent stays putIfAbsent, with ``expect`` 0)."""

    index: int
    kind: str
    namespace: str
    key: str = ""  # every op but getMany and getPrefix
    keys: tuple[str, ...] = ()  # getMany
    prefix: str = ""  # getPrefix
    after: str | None = None
    limit: int = PREFIX_LIMIT_DEFAULT
    keys_only: bool = False
    value: Any = None  # put, putIfAbsent
    value_text: str = ""  # its compact JSON, as stored
    ttl_s: int | None = None  # a write's expiry: None is forever
    expect: int | None = None
    required: bool = False
    delta: Decimal = Decimal(0)  # incr
    min: Decimal | None = None
    max: Decimal | None = None

    @property
    def writes(self) -> bool:
        return self.kind in WRITES

    @property
    def key_count(self) -> int:
        if self.kind == "getMany":
            return len(self.keys)
        if self.kind == "getPrefix":
            return self.limit
        return 1


def namespace(value: Any, where: str = "", *, legacy_ok: bool = False) -> str:
    """Queen's namespace charset; ``legacy_ok`` (reads and deletes) also admits a name of the
    charset this broker used before, so rows written then are never out of reach."""
    if isinstance(value, str) and (
        _NAMESPACE_RE.fullmatch(value) or (legacy_ok and _LEGACY_NAMESPACE_RE.fullmatch(value))
    ):
        return value
    raise bad("kv_bad_namespace",
              f"{where}ns must match ^[a-z0-9][a-z0-9._-]{{0,63}}$, got {value!r}")


def key(value: Any, where: str = "", field: str = "key") -> str:
    try:
        return utf8_name(value, field, code="kv_bad_request", max_bytes=MAX_KEY_BYTES)
    except ValidationError as exc:
        raise bad("kv_bad_key", f"{where}{exc.message}") from None



def _integer(value: Any) -> int | None:
    """A JSON integer (5, or 5.0), else None. A bool is not a number here."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return None


def _number(value: Any, where: str, field: str) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, int | float) or (
            isinstance(value, float) and not math.isfinite(value)):
        raise bad("kv_bad_request", f"{where}{field} must be a number")
    # repr of a float is its shortest exact decimal: 0.1 stays 0.1, not 0.1000000000000000055
    return Decimal(value) if isinstance(value, int) else Decimal(repr(value))


def ttl_seconds(value: Any, where: str = "", field: str = "ttlSeconds") -> int:
    n = _integer(value)
    if n is None or not 1 <= n <= MAX_TTL_SECONDS:
        raise bad("kv_bad_ttl", f"{where}{field} must be a whole number of seconds from 1 to "
                                f"{MAX_TTL_SECONDS}")
    return n


def expiry(op: dict[str, Any], where: str) -> int | None:
    """Exactly one of ttlSeconds and forever: true (forever: false declares nothing)."""
    forever = op.get("forever", False)
    if not isinstance(forever, bool):
        raise bad("kv_bad_request", f"{where}forever must be true (or left out)")
    declared = ("ttlSeconds" in op) + forever
    if declared != 1:
        raise bad("kv_expiry_not_specified",
                  f"{where}exactly one of ttlSeconds (whole seconds > 0) and forever: true is "
                  f"required on every write, got {declared}; a put never inherits the old expiry")
    return None if forever else ttl_seconds(op["ttlSeconds"], where)


def expect(value: Any, where: str) -> int:
    n = _integer(value)
    if n is None or n < 0:
        raise bad("kv_bad_expect", f"{where}expect must be a version (an integer >= 0; 0: must "
                                   f"not exist), got {value!r}")
    return n


def value_text(value: Any, where: str, ceiling: int) -> str:
    try:
        text = compact_json(value, finite=True)
        size = utf8_len(text)
    except (UnicodeEncodeError, ValueError):
        raise bad("kv_bad_value", f"{where}value contains an unpaired surrogate or a "
                                  f"non-finite number") from None
    limit = min(ceiling, MAX_VALUE_BYTES)
    if size > limit:
        raise PayloadTooLarge("payload_too_large",
                              f"{where}value is {size} bytes, the ceiling is {limit}",
                              reason="kv_value_too_large",
                              detail=f"{where}value is {size} bytes, the ceiling is {limit}")
    return text


def parse_op(index: int, raw: Any, *, ceiling: int, in_transaction: bool = False,
             where: str | None = None) -> Op:
    where = f"op at index {index}: " if where is None else where
    if not isinstance(raw, dict):
        raise bad("kv_bad_request", f"{where}an op must be an object")
    kind = raw.get("op")
    if not isinstance(kind, str) or kind not in KINDS:
        raise bad("kv_unknown_op", f"{where}op must be one of {', '.join(sorted(KINDS))}, "
                                   f"got {kind!r}")
    if any(f in raw for f in _TENANT_FIELDS):
        raise bad("kv_tenant_not_an_input", f"{where}the tenant is the caller's, never a field")
    unknown = set(raw) - _COMMON - _FIELDS[kind]
    if unknown:
        raise bad("kv_unknown_field",
                  f"{where}{kind} does not take {', '.join(sorted(unknown))}")
    if in_transaction and kind == "getPrefix":
        raise bad("kv_prefix_in_transaction",
                  f"{where}getPrefix is not allowed inside a transaction (its cost is not "
                  f"bounded by the caller); use POST /api/v1/kv, or getMany with explicit keys")
    required = raw.get("required", False)
    if not isinstance(required, bool):
        raise bad("kv_bad_request", f"{where}required must be a boolean")
    # Reads and deletes reach rows written under the old namespace rule too.
    ns = namespace(raw.get("ns"), where, legacy_ok=kind in READS or kind == "delete")

    def base(**fields: Any) -> Op:
        # One construction (dataclasses.replace of a base Op cost 40 % of a put's parse).
        return Op(index, kind, ns, required=required, **fields)

    if kind == "getMany":
        keys = raw.get("keys")
        if not isinstance(keys, list):
            raise bad("kv_bad_request", f"{where}getMany needs keys: an array of keys")
        return base(keys=tuple(key(k, where, "keys[]") for k in keys))
    if kind == "getPrefix":
        return _prefix_op(base, raw, where)
    k = key(raw.get("key"), where)
    if kind == "get":
        return base(key=k)
    if kind in ("delete", "check"):
        if kind == "check" and "expect" not in raw:
            raise bad("kv_bad_expect", f"{where}check needs expect: the version the key must "
                                       f"be at, or 0 for a key that must not exist")
        return base(key=k, expect=None if "expect" not in raw else expect(raw["expect"], where))
    ttl = expiry(raw, where)
    if kind == "incr":
        if "delta" not in raw:
            raise bad("kv_bad_request", f"{where}incr needs a numeric delta")
        return base(
            key=k, ttl_s=ttl, delta=_number(raw["delta"], where, "delta"),
            min=None if raw.get("min") is None else _number(raw["min"], where, "min"),
            max=None if raw.get("max") is None else _number(raw["max"], where, "max"))
    if "value" not in raw:
        raise bad("kv_bad_request",
                  f'{where}{kind} needs a value ("value": null is legal, no value is not)')
    exp = None if "expect" not in raw else expect(raw["expect"], where)
    if kind == "putIfAbsent":
        if exp not in (None, 0):
            raise bad("kv_bad_expect", f"{where}putIfAbsent is put with expect 0; another "
                                       f"expect contradicts it")
        exp = 0
    return base(key=k, value=raw["value"], value_text=value_text(raw["value"], where, ceiling),
                ttl_s=ttl, expect=exp)


def _prefix_op(base: Callable[..., Op], raw: dict[str, Any], where: str) -> Op:
    prefix = raw.get("prefix")
    if not isinstance(prefix, str) or not prefix:
        raise bad("kv_prefix_required", f"{where}getPrefix needs a non-empty prefix: a "
                                        f"namespace is not a table to enumerate")
    if "\x00" in prefix or not encodable(prefix):
        raise bad("kv_bad_request", f"{where}prefix must be UTF-8 text without NUL")
    after = raw.get("after")
    if after is not None and after != "":
        after = key(after, where, "after")
    limit = raw.get("limit", PREFIX_LIMIT_DEFAULT)
    n = _integer(limit)
    if n is None:
        raise bad("kv_bad_request", f"{where}limit must be an integer")
    keys_only = raw.get("keysOnly", False)
    if not isinstance(keys_only, bool):
        raise bad("kv_bad_request", f"{where}keysOnly must be a boolean")
    return base(prefix=prefix, after=after or None, keys_only=keys_only,
                limit=max(1, min(n, PREFIX_LIMIT_MAX)))


def check_call(ops: list[Op], max_ops: int, where: str = "") -> None:
    """The limits of one call as a whole (the ops are already valid one by one)."""
    if len(ops) > max_ops:
        raise bad("kv_too_many_ops", f"{where}{len(ops)} ops in one call, the ceiling is "
                                     f"{max_ops}")
    keys = sum(op.key_count for op in ops)
    if keys > MAX_KEYS:
        raise bad("kv_too_many_keys", f"{where}{keys} keys in one call, the ceiling is "
                                      f"{MAX_KEYS}")
    # One write per key and call: it keeps the order the call locks its rows in total.
    written = [(op.namespace, op.key) for op in ops if op.writes]
    if len(set(written)) != len(written):
        raise bad("kv_duplicate_key_in_call",
                  f"{where}a key may be written at most once per call")


def parse_call(raw_ops: Any, *, ceiling: int, in_transaction: bool = False,
               where: str = "") -> list[Op]:
    """A whole call: the ``operations`` of POST /api/v1/kv, or a transaction's ``kv``."""
    if not isinstance(raw_ops, list):
        raise bad("kv_bad_body", f"{where}the operations must be an array")
    max_ops = MAX_OPS_IN_TRANSACTION if in_transaction else MAX_OPS
    if len(raw_ops) > max_ops:  # before the ops are parsed one by one
        raise bad("kv_too_many_ops", f"{where}{len(raw_ops)} ops in one call, the ceiling is "
                                     f"{max_ops}")
    ops = [parse_op(i, op, ceiling=ceiling, in_transaction=in_transaction,
                    where=f"{where}op at index {i}: ") for i, op in enumerate(raw_ops)]
    check_call(ops, max_ops, where)
    return ops


def apply_order(ops: list[Op]) -> list[Op]:
    """The order a call applies its ops in: the single-key ops by (namespace, key), so that
    concurrent calls lock shared rows in one order and cannot deadlock (Python compares code
    points, which is the byte order of the columns' "C" collation), input order among ops on
    one key; then getMany and getPrefix, which lock nothing and so see the call's writes."""
    single = sorted((op for op in ops if op.kind not in ("getMany", "getPrefix")),
                    key=lambda op: (op.namespace, op.key, op.index))
    return single + [op for op in ops if op.kind in ("getMany", "getPrefix")]


def prefix_end(prefix: str) -> str | None:
    """The least string above every string starting with ``prefix`` (the scan's upper
    bound), or None when there is none to compute (a prefix of U+10FFFF)."""
    for i in range(len(prefix) - 1, -1, -1):
        code = ord(prefix[i]) + 1
        if 0xD800 <= code <= 0xDFFF:  # surrogates are not text: skip to the next character
            code = 0xE000
        if code <= 0x10FFFF:
            return prefix[:i] + chr(code)
    return None


def number_text(n: Decimal) -> str:
    """A counter's value as JSON: an integer when it is one (3, not 3.0 or 3E+0)."""
    if n == n.to_integral_value():
        return str(int(n))
    return format(n.normalize(), "f")

"""Pure rules of timers: what a schedule or cancel may say, payload packing, backoff.

Two spellings reach the broker. Queen's wire (``POST /api/v1/timers`` and the ``timers`` array
of a transaction) sends operations: ``{"op": "schedule" | "reschedule" | "cancel", "queue",
"timerKey", "payload": <base64 of the JSON the client encoded>, "payloadZstd"?, "delayMs",
"txn", "partition"?}`` (:func:`operations`, :func:`operation`). Our curl-friendly ``PUT
/api/v1/timers/{queue}/{key}`` sends ``{"delayMs", "payload": <JSON>, "partition"?, "txn"?}``
(:func:`schedule`). Both become a :class:`Schedule` (or a :class:`Cancel`).

Only a relative ``delayMs`` travels on the wire; the due instant is computed by PostgreSQL from
its own clock, so no broker's clock can skew a timer.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import io
import json
import threading
from collections.abc import Callable
from typing import Any, TypeGuard

import msgspec
import zstandard

from .. import strict_json
from ..errors import Forbidden, PayloadTooLarge, ValidationError
from ..frozen import slotted_init
from ..log import rules as log_rules
from ..log.rules import DEFAULT_PARTITION
from ..models import codec
from ..models.timers import BATCH_DECODER, MAX_OPS_PER_CALL, TimerBatch, TimerOp
from ..text import CONTROL_RE, compact_json, encodable, utf8_name

MAX_KEY_BYTES = 512
MAX_BACKOFF_MS = 60_000
MAX_LIST_LIMIT = 1000
DEFAULT_LIST_LIMIT = 100
MAX_COUNT_PREFIX_BYTES = 128
# Below this, zstd's frame header alone outweighs what it could save.
MIN_COMPRESSED_BYTES = 64
# How much of a payload jsonb refused its dead letter shows (rules.undecodable).
PREVIEW_BYTES = 256
_SCHEDULE_FIELDS = {"delayMs", "payload", "partition", "txn"}
_INSTANT_HINTS = {"deliverAt", "deliver_at", "at", "runAt", "when", "delay", "delaySeconds"}
# Fields the broker owns (queen-mq's timers/ops.py SERVER_OWNED, and any name starting with
# '_'): a client that sends one is refused by name, never silently ignored.
SERVER_OWNED = frozenset({
    "producerSub", "producer_sub", "messageId", "message_id", "tenant", "tenantId", "tenant_id",
    "deliverAt", "deliver_at", "delaySeconds", "delay_seconds", "attempts", "claimToken",
    "claim_token", "claimedUntil",
})
_OP_FIELDS = {"op", "queue", "timerKey", "payload", "payloadZstd", "delayMs", "txn", "partition",
              "encrypted"}
_CANCEL_FIELDS = {"op", "queue", "timerKey", "txn"}
_ABSENT: Any = msgspec.UNSET  # a field the operation does not carry

# zstandard's (de)compressor objects must not be shared between threads, and the database
# work that packs and unpacks payloads runs in the event loop's thread and in the pool's
# worker threads: one pair per thread.
_codec = threading.local()


def _compressor() -> zstandard.ZstdCompressor:
    if not hasattr(_codec, "compressor"):
        _codec.compressor = zstandard.ZstdCompressor(level=3)
    return _codec.compressor


def _decompressor() -> zstandard.ZstdDecompressor:
    if not hasattr(_codec, "decompressor"):
        _codec.decompressor = zstandard.ZstdDecompressor()
    return _codec.decompressor


def timer_key(value: Any, field: str = "key") -> str:
    return utf8_name(value, field, code="invalid_key", max_bytes=MAX_KEY_BYTES)


@slotted_init  # (one per timer of a bundle: a frozen __init__ cost more than its checks)
@dataclasses.dataclass(frozen=True, slots=True)
class Schedule:
    queue: str
    key: str
    delay_ms: int
    payload: Any
    partition: str
    txn: str | None  # None: the broker generates one
    # The payload's compact JSON, UTF-8, when validation already made it (saves a second
    # serialization in pack).
    json_bytes: bytes | None = dataclasses.field(default=None, compare=False, repr=False)


@slotted_init
@dataclasses.dataclass(frozen=True, slots=True)
class Cancel:
    queue: str
    key: str
    txn: str | None  # echoed back when the timer is absent


def schedule(
    body: Any, queue: Any, key: Any, *, horizon_s: int, ceiling: int, where: str = ""
) -> Schedule:
    """Validate a schedule of ``PUT /api/v1/timers/{queue}/{key}`` (a JSON payload)."""
    if not isinstance(body, dict):
        raise ValidationError("invalid_body", f"{where or 'the body'} must be a JSON object")
    prefix = f"{where}." if where else ""
    unknown = set(body) - _SCHEDULE_FIELDS
    if unknown & _INSTANT_HINTS:
        raise ValidationError(
            "invalid_delay",
            f"{prefix}{sorted(unknown & _INSTANT_HINTS)[0]} is not accepted: only a relative "
            "delayMs (integer milliseconds) travels on the wire",
        )
    if unknown:
        raise ValidationError("unknown_field",
                              f"{prefix}unknown field(s): {', '.join(sorted(unknown))}")
    delay = _delay(body, prefix, horizon_s)
    if "payload" not in body:
        raise ValidationError("missing_field", f"{prefix}payload is required")
    raw = log_rules.payload_json(body["payload"], ceiling, where or "timer").encode()
    txn = body.get("txn")
    return Schedule(
        queue=log_rules.queue_name(queue, f"{prefix}queue"),
        key=timer_key(key, f"{prefix}key"),
        delay_ms=delay,
        payload=body["payload"],
        partition=log_rules.partition_name(body.get("partition"), f"{prefix}partition"),
        txn=None if txn is None else log_rules.transaction_id(txn, f"{prefix}txn"),
        json_bytes=raw,
    )


def _delay(body: dict[str, Any], prefix: str, horizon_s: int) -> int:
    return _delay_value(body.get("delayMs", _ABSENT), prefix, horizon_s)


def _delay_value(delay: Any, prefix: str, horizon_s: int) -> int:
    if delay is _ABSENT:
        raise ValidationError("missing_field", f"{prefix}delayMs is required")
    if isinstance(delay, bool) or not isinstance(delay, int):
        raise ValidationError(
            "invalid_delay", f"{prefix}delayMs must be an integer number of milliseconds"
        )
    if delay > horizon_s * 1000:
        raise Forbidden(
            "timer_horizon_exceeded",
            f"{prefix}delayMs {delay} is beyond the {horizon_s} s horizon "
            "(QUEEN_TIMERS_MAX_HORIZON_S)",
        )
    if delay < -horizon_s * 1000:
        raise ValidationError("invalid_delay", f"{prefix}delayMs is too far in the past")
    return delay


# -- Queen's operations -----------------------------------------------------------------------


def operations_from_bytes(raw: bytes, *, horizon_s: int, ceiling: int
                          ) -> list[Schedule | Cancel] | None:
    """:func:`operations` of a body as sent, decoded into the wire's models
    (:class:`~queen_trio.models.timers.TimerOp`); None if the body is not a clean one (not
    JSON, a value strict JSON refuses, a field of the wrong type or unknown, a null): the
    caller then decodes it with the strict decoder and calls :func:`operations`, whose answer
    names what is wrong."""
    decoded = codec.fast(raw, BATCH_DECODER)
    if decoded is codec.FALLBACK:
        return None
    ops = decoded.operations if isinstance(decoded, TimerBatch) else decoded
    if len(ops) > MAX_OPS_PER_CALL:
        return None
    parsed = typed_operations(ops, "operations", horizon_s=horizon_s, ceiling=ceiling)
    check_distinct(parsed, "operations")
    return parsed


def operations(body: Any, *, horizon_s: int, ceiling: int) -> list[Schedule | Cancel]:
    """The operations of a ``POST /api/v1/timers`` body: ``{"operations": [...]}`` or a bare
    array, at most :data:`MAX_OPS_PER_CALL`, each key at most once."""
    ops = body.get("operations") if isinstance(body, dict) else body
    if isinstance(body, dict) and set(body) - {"operations"}:
        raise ValidationError(
            "unknown_field",
            f"unknown field(s): {', '.join(sorted(set(body) - {'operations'}))}; the body is "
            '{"operations": [...]} or a bare array of operations',
        )
    if not isinstance(ops, list):
        raise ValidationError(
            "invalid_body", 'the body must be {"operations": [...]} or an array of operations'
        )
    if len(ops) > MAX_OPS_PER_CALL:
        raise ValidationError(
            "too_many_operations",
            f"{len(ops)} operations in one call; at most {MAX_OPS_PER_CALL}",
        )
    parsed = [operation(op, f"operations[{i}]", horizon_s=horizon_s, ceiling=ceiling)
              for i, op in enumerate(ops)]
    check_distinct(parsed, "operations")
    return parsed


def check_distinct(ops: list[Schedule | Cancel], where: str) -> None:
    """One (queue, timerKey) at most once in one call: two operations on one timer in one
    transaction would have no order a client could rely on."""
    seen: dict[tuple[str, str], int] = {}
    for i, op in enumerate(ops):
        first = seen.setdefault((op.queue, op.key), i)
        if first != i:
            raise ValidationError(
                "duplicate_timer",
                f"{where}[{first}] and {where}[{i}] both name timer {op.key!r} on queue "
                f"{op.queue!r}; a timer may appear at most once in one call",
            )


def operation(entry: Any, where: str, *, horizon_s: int, ceiling: int) -> Schedule | Cancel:
    """One operation of Queen's wire."""
    if not isinstance(entry, dict):
        raise ValidationError("invalid_operation", f"{where} must be an object")
    kind = entry.get("op")
    unknown = entry.keys() - (_CANCEL_FIELDS if kind == "cancel" else _OP_FIELDS)
    if unknown:
        owned = sorted(f for f in unknown if f in SERVER_OWNED or f.startswith("_"))
        if owned:
            raise ValidationError(
                "server_owned_field",
                f"{where}: {', '.join(owned)} is server-owned and cannot be supplied: the "
                "message id is minted by the broker, the tenant and the producer come from the "
                "authenticated request, and only the relative delayMs travels on the wire",
            )
    if kind not in ("schedule", "reschedule", "cancel"):
        raise ValidationError(
            "invalid_operation", f"{where}.op must be 'schedule', 'reschedule' or 'cancel'"
        )
    if unknown:
        raise ValidationError(
            "unknown_field", f"{where}: unknown field(s) for {kind}: {', '.join(sorted(unknown))}"
        )
    get = entry.get
    return _operation(kind, get("queue"), get("timerKey"), get("txn"), get("encrypted"),
                      get("delayMs", _ABSENT), get("payloadZstd", False), get("payload"),
                      get("partition"), where, horizon_s, ceiling)


def typed_operation(op: TimerOp, where: str, *, horizon_s: int, ceiling: int
                    ) -> Schedule | Cancel:
    """:func:`operation` of an operation already decoded into the wire's model (its shape
    and field types checked; the fields it does not carry are UNSET)."""
    if op.op == "cancel" and not (op.payload is op.payload_zstd is op.delay_ms is op.partition
                                  is op.encrypted is _ABSENT):
        raise ValidationError("unknown_field", f"{where}: unknown field(s) for cancel: "
                              + ", ".join(sorted(_present(op) - _CANCEL_FIELDS)))
    return _operation(op.op, op.queue, op.timer_key, _or_none(op.txn), _or_none(op.encrypted),
                      op.delay_ms, False if op.payload_zstd is _ABSENT else op.payload_zstd,
                      _or_none(op.payload), _or_none(op.partition), where, horizon_s, ceiling)


def typed_operations(ops: list[TimerOp], where: str, *, horizon_s: int, ceiling: int
                     ) -> list[Schedule | Cancel]:
    """:func:`typed_operation` of each of ``ops`` (``where[i]`` names the i-th), the same
    answers and the same refusals, at a fraction of the cost for a bundle: the names a bundle
    repeats (its queues, its partitions) are checked once, and its keys' and txns' characters
    in one pass over all of them. An operation the quick checks do not clear takes
    :func:`typed_operation`, which accepts it or names what is wrong. A lone operation
    (one schedule through the SDK) takes the quick checks too: its payload is then decoded
    once, not twice."""
    keys_and_txns = [op.timer_key for op in ops]
    keys_and_txns += [op.txn for op in ops if isinstance(op.txn, str)]
    # One search and one encode for all of them: a control character or an unpaired
    # surrogate anywhere sends every operation down the precise path.
    text = "".join(keys_and_txns)
    # (isprintable, in C, clears most text at once: a control character is not printable)
    clean = (text.isprintable() or not CONTROL_RE.search(text)) and encodable(text)
    quick = _quick_payloads(ops, ceiling) if clean else [None] * len(ops)
    queues: set[str] = set()
    partitions: set[str] = set()
    limit = horizon_s * 1000
    out: list[Schedule | Cancel] = []
    for i, op in enumerate(ops):
        queue, key, txn, partition, delay = (op.queue, op.timer_key, op.txn, op.partition,
                                             op.delay_ms)
        if (clean and op.op != "cancel" and _valid(queue, queues, log_rules.is_queue_name)
                and (partition is _ABSENT
                     or _valid(partition, partitions, log_rules.is_partition_name))
                # at most 128 characters: at most 512 UTF-8 bytes
                and 0 < len(key) <= MAX_KEY_BYTES // 4
                and isinstance(txn, str) and 0 < len(txn) <= log_rules.MAX_TRANSACTION_ID_LENGTH
                and op.payload_zstd is not True and op.encrypted is _ABSENT
                and type(delay) is int and -limit <= delay <= limit
                and type(op.payload) is str):
            decoded = quick[i]
            payload, raw = (payload_value(op.payload, False, ceiling, f"{where}[{i}]")
                            if decoded is None else decoded)
            out.append(Schedule(queue, key, delay, payload,
                                DEFAULT_PARTITION if partition is _ABSENT else partition, txn,
                                raw))
            continue
        parsed = typed_operation(op, f"{where}[{i}]", horizon_s=horizon_s, ceiling=ceiling)
        if isinstance(parsed, Schedule):
            queues.add(parsed.queue)  # valid names, now known: the next ones skip the check
            if partition is not _ABSENT:
                partitions.add(parsed.partition)
        out.append(parsed)
    return out


def _valid(name: object, seen: set[str], valid: Callable[[str], bool]) -> TypeGuard[str]:
    """Whether ``name`` is a valid name by ``valid``, remembered in ``seen`` (a bundle repeats
    its queues and partitions: each is checked once)."""
    if name in seen:
        return True
    if type(name) is str and valid(name):
        seen.add(name)
        return True
    return False


def _quick_payloads(ops: list[TimerOp], ceiling: int) -> list[tuple[Any, bytes] | None]:
    """What :func:`payload_value` answers for each plain payload of ``ops`` (base64, no zstd,
    within the ceiling), at less cost: strict base64 in C (whatever binascii's strict mode
    decodes, ``b64decode(validate=True)`` decodes alike), codec.fast's look for what
    strict_json may refuse made once over all of them, then payload_value's own decode and
    compact encode. None for an operation it does not clear (it then takes payload_value,
    which refuses it or accepts it); all None if one of them is suspect."""
    out: list[tuple[Any, bytes] | None] = [None] * len(ops)
    at: list[int] = []
    raws: list[bytes] = []
    for i, op in enumerate(ops):
        encoded = op.payload
        if type(encoded) is not str or op.payload_zstd is True:
            continue
        try:
            raw = binascii.a2b_base64(encoded, strict_mode=True)
        except (binascii.Error, ValueError):
            continue
        if len(raw) <= ceiling:
            at.append(i)
            raws.append(raw)
    if not raws or codec.suspect(b",".join(raws)):
        return out
    decode, encode = codec.ANY.decode, codec.encode
    for i, raw in zip(at, raws, strict=True):
        try:
            value = decode(raw)
        except (msgspec.DecodeError, RecursionError):
            continue
        compact = encode(value)
        if len(compact) <= ceiling:
            out[i] = (value, compact)
    return out


def _present(op: TimerOp) -> set[str]:
    return {f for f, name in (("payload", "payload"), ("payloadZstd", "payload_zstd"),
                              ("delayMs", "delay_ms"), ("partition", "partition"),
                              ("encrypted", "encrypted"), ("op", "op"), ("queue", "queue"),
                              ("timerKey", "timer_key"), ("txn", "txn"))
            if getattr(op, name) is not _ABSENT}


def _or_none(value: Any) -> Any:
    return None if value is _ABSENT else value


def _operation(kind: str, queue_name: Any, key_name: Any, txn: Any, encrypted: Any, delay_ms: Any,
               zstd: Any, encoded: Any, partition: Any, where: str, horizon_s: int, ceiling: int
               ) -> Schedule | Cancel:
    """The rules of one operation, whichever way it was decoded."""
    queue = log_rules.queue_name(queue_name, f"{where}.queue")
    key = timer_key(key_name, f"{where}.timerKey")
    if kind == "cancel":
        return Cancel(queue, key, None if txn is None else
                      log_rules.transaction_id(txn, f"{where}.txn"))
    if txn is None:
        raise ValidationError("missing_field", f"{where}.txn is required: the client mints it")
    if encrypted not in (None, False):
        raise ValidationError(
            "encryption_unsupported",
            f"{where}: encrypted payloads are not supported by this broker",
        )
    delay = _delay_value(delay_ms, f"{where}.", horizon_s)
    if not isinstance(zstd, bool):
        raise ValidationError("invalid_payload", f"{where}.payloadZstd must be a boolean")
    payload, raw = payload_value(encoded, zstd, ceiling, where)
    return Schedule(
        queue=queue, key=key, delay_ms=delay, payload=payload,
        partition=log_rules.partition_name(partition, f"{where}.partition"),
        txn=log_rules.transaction_id(txn, f"{where}.txn"), json_bytes=raw,
    )


def payload_value(encoded: Any, zstd: bool, ceiling: int, where: str) -> tuple[Any, bytes]:
    """The JSON value a Queen op's payload carries (base64 of the JSON text the client encoded,
    zstd-compressed first when ``payloadZstd``) and its compact JSON: at most ``ceiling``
    bytes."""
    if not isinstance(encoded, str):
        raise ValidationError(
            "missing_field", f"{where}.payload is required: base64 of the JSON payload"
        )
    try:
        raw = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise ValidationError("invalid_payload", f"{where}.payload is not valid base64") from None
    if zstd:
        raw = _decompress_bounded(raw, ceiling, where)
    if len(raw) > ceiling:
        raise PayloadTooLarge(
            "payload_too_large",
            f"{where}: payload is {len(raw)} bytes, above the {ceiling}-byte timer payload "
            "ceiling",
        )
    value = codec.fast(raw, codec.ANY)
    if value is not codec.FALLBACK:
        compact = codec.encode(value)
        if len(compact) <= ceiling:
            return value, compact
    try:
        value = strict_json.loads(raw, what=f"{where}.payload")
    except strict_json.JsonRefused as exc:
        raise ValidationError(
            "invalid_payload", f"{where}.payload is not a JSON document this broker can store: "
                               f"{exc.message}" + (f" (at {exc.path})" if exc.path else "")
        ) from None
    # The ceiling is measured on the compact JSON, as for every message; it is what is stored.
    return value, log_rules.payload_json(value, ceiling, where).encode()


def _decompress_bounded(raw: bytes, ceiling: int, where: str) -> bytes:
    """zstd-decompressed, reading at most one byte past the ceiling (never a bomb's worth)."""
    try:
        with _decompressor().stream_reader(io.BytesIO(raw)) as reader:
            out = reader.read(ceiling + 1)
    except zstandard.ZstdError as exc:
        raise ValidationError(
            "invalid_payload", f"{where}.payload is flagged payloadZstd but is not zstd: {exc}"
        ) from None
    if len(out) > ceiling:
        raise PayloadTooLarge(
            "payload_too_large",
            f"{where}: the decompressed payload is above the {ceiling}-byte timer payload ceiling",
        )
    return out


def list_limit(raw: str | None) -> int:
    """A list's ``limit``: default 100, clamped to 1..1000, never refused (Queen's rule)."""
    try:
        limit = int(raw) if raw not in (None, "") else DEFAULT_LIST_LIMIT
    except ValueError:
        limit = DEFAULT_LIST_LIMIT
    return min(max(limit, 1), MAX_LIST_LIMIT)


def count_prefix(value: str | None) -> str:
    """The prefix of ``?mode=count``: non-empty, at most 128 UTF-8 bytes, no NUL."""
    if not value:
        raise ValidationError("missing_field", "mode=count needs a non-empty prefix")
    if "\x00" in value:
        raise ValidationError("invalid_prefix", "the prefix must not contain NUL")
    try:
        size = len(value.encode())
    except UnicodeEncodeError:
        raise ValidationError("invalid_prefix", "the prefix contains an unpaired surrogate") \
            from None
    if size > MAX_COUNT_PREFIX_BYTES:
        raise ValidationError(
            "invalid_prefix",
            f"the prefix is {size} bytes; at most {MAX_COUNT_PREFIX_BYTES}",
        )
    return value


def pack(payload: Any, raw: bytes | None = None) -> tuple[bytes, int, bool]:
    """(stored bytes, JSON size, compressed?).

    The payload's compact JSON text (``raw``, when already made), zstd-compressed only when
    that saves at least an eighth: small JSON (most timers) does not shrink, and a payload kept
    as text is fired by PostgreSQL itself without a round trip through the broker (see
    queen.sweep_timers in schema/functions/timers.sql).
    """
    if raw is None:
        raw = compact_json(payload).encode()
    if len(raw) >= MIN_COMPRESSED_BYTES:
        packed = _compressor().compress(raw)
        if len(packed) <= len(raw) - len(raw) // 8:
            return packed, len(raw), True
    return raw, len(raw), False


def unpack(blob: bytes, compressed: bool) -> Any:
    """The payload back; raises ValueError if the stored bytes cannot be decoded."""
    return json.loads(unpack_text(blob, compressed))


def unpack_text(blob: bytes, compressed: bool) -> str:
    """The payload's JSON text, checked to be JSON; ValueError if it cannot be decoded."""
    try:
        text = (_decompressor().decompress(blob) if compressed else blob).decode()
        json.loads(text)
    except (zstandard.ZstdError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"stored payload cannot be decoded: {exc}") from exc
    return text


def undecodable(blob: bytes, compressed: bool) -> dict[str, Any]:
    """What a dead letter holds in place of a stored payload jsonb cannot hold (it cannot be
    decoded, or PostgreSQL refuses it: NaN, a \\u0000 escape…): its stored size and, if it
    can be decompressed, the start of its text, with anything jsonb would refuse escaped."""
    described: dict[str, Any] = {"undecodablePayloadBytes": len(blob)}
    data = blob[:PREVIEW_BYTES]
    if compressed:
        try:
            with _decompressor().stream_reader(blob) as reader:  # only the start is read
                data = reader.read(PREVIEW_BYTES)
        except zstandard.ZstdError:
            described["compressed"] = "cannot be decompressed"
            return described
    preview = data.decode("utf-8", "backslashreplace")
    described["payloadPreview"] = preview.replace("\x00", "\\x00")
    return described


def backoff_ms(attempts: int, first_ms: int) -> int:
    """Delay before retry number ``attempts`` (1-based): first_ms, doubling, capped at 60 s."""
    return min(MAX_BACKOFF_MS, first_ms * 2 ** max(0, attempts - 1))


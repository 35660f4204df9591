"""Pure rules of timers: what a schedule request may say, payload packing, backoff.

Only a relative ``delayMs`` travels on the wire; the due instant is computed by PostgreSQL from
its own clock, so no broker's clock can skew a timer.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import threading
from typing import Any

import zstandard

from ..errors import ValidationError
from ..log import rules as log_rules
from ..text import utf8_name

MAX_KEY_BYTES = 512
MAX_BACKOFF_MS = 60_000
MAX_LIST_LIMIT = 1000
# Below this, zstd's frame header alone outweighs what it could save.
MIN_COMPRESSED_BYTES = 64
# How much of a payload jsonb refused its dead letter shows (rules.undecodable).
PREVIEW_BYTES = 256
_SCHEDULE_FIELDS = {"delayMs", "payload", "partition", "txn"}
_INSTANT_HINTS = {"deliverAt", "deliver_at", "at", "runAt", "when", "delay", "delaySeconds"}

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


@dataclasses.dataclass(frozen=True, slots=True)
class Schedule:
    queue: str
    key: str
    delay_ms: int
    payload: Any
    partition: str
    txn: str | None  # None: the broker generates one


def schedule(
    body: Any, queue: Any, key: Any, *, horizon_s: int, ceiling: int, where: str = ""
) -> Schedule:
    """Validate a schedule (PUT body, POST body or a bundle's timer entry)."""
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
    if "delayMs" not in body:
        raise ValidationError("missing_field", f"{prefix}delayMs is required")
    delay = body["delayMs"]
    if isinstance(delay, bool) or not isinstance(delay, int):
        raise ValidationError(
            "invalid_delay", f"{prefix}delayMs must be an integer number of milliseconds"
        )
    if delay > horizon_s * 1000:
        raise ValidationError(
            "invalid_delay", f"{prefix}delayMs is beyond the {horizon_s} s horizon"
        )
    if delay < -horizon_s * 1000:
        raise ValidationError("invalid_delay", f"{prefix}delayMs is too far in the past")
    if "payload" not in body:
        raise ValidationError("missing_field", f"{prefix}payload is required")
    log_rules.payload_json(body["payload"], ceiling, where or "timer")
    txn = body.get("txn")
    return Schedule(
        queue=log_rules.queue_name(queue, f"{prefix}queue"),
        key=timer_key(key, f"{prefix}key"),
        delay_ms=delay,
        payload=body["payload"],
        partition=log_rules.partition_name(body.get("partition"), f"{prefix}partition"),
        txn=None if txn is None else log_rules.transaction_id(txn, f"{prefix}txn"),
    )


def pack(payload: Any) -> tuple[bytes, int, bool]:
    """(stored bytes, JSON size, compressed?).

    The payload's compact JSON text, zstd-compressed only when that saves at least an eighth:
    small JSON (most timers) does not shrink, and a payload kept as text is fired by
    PostgreSQL itself without a round trip through the broker (see queen.sweep_timers in
    schema/functions/timers.sql).
    """
    raw = json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()
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


def encode_cursor(key: str) -> str:
    return base64.urlsafe_b64encode(key.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> str:
    """The timer key a cursor holds; any other text (NUL bytes, say, which the database
    cannot compare with) is not a cursor this broker issued."""
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        return timer_key(base64.b64decode(padded, altchars=b"-_", validate=True).decode())
    except (ValueError, UnicodeDecodeError, ValidationError):
        raise ValidationError("invalid_cursor",
                              "after is not a cursor this broker issued") from None

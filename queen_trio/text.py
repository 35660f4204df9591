"""Rules for client-chosen text: names that travel in URL paths (KV keys, timer keys), and
the compact JSON text that payloads and values are stored and measured as."""

from __future__ import annotations

import json
import re
from typing import Any

from .errors import ValidationError

CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")

# json.dumps with any keyword builds a new encoder per call (a timer batch makes 256 of them).
_COMPACT = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
_COMPACT_FINITE = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def compact_json(value: Any, *, finite: bool = False) -> str:
    """Compact JSON text: what is stored and what sizes are measured on. ``finite`` refuses
    NaN and the infinities (ValueError), which JSON itself cannot write."""
    return (_COMPACT_FINITE if finite else _COMPACT).encode(value)


def encodable(text: str) -> bool:
    """Whether ``text`` is Unicode text (no unpaired surrogate), so UTF-8 can carry it."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def utf8_len(text: str) -> int:
    """The UTF-8 size of ``text``; ASCII text (most payloads) is measured without a copy,
    which for a 16 MiB message is 16 MiB less to hold. Raises UnicodeEncodeError for an
    unpaired surrogate."""
    return len(text) if text.isascii() else len(text.encode())


def utf8_name(value: Any, field: str, *, code: str, max_bytes: int) -> str:
    """A non-empty string of at most ``max_bytes`` UTF-8 bytes, free of control characters.

    '/', ':', spaces and any other printable character are allowed.
    """
    if not isinstance(value, str) or not value:
        raise ValidationError(code, f"{field} must be a non-empty string")
    try:
        size = len(value.encode())
    except UnicodeEncodeError:
        raise ValidationError(code, f"{field} contains an unpaired surrogate") from None
    if size > max_bytes or CONTROL_RE.search(value):
        raise ValidationError(
            code, f"{field} must be 1-{max_bytes} UTF-8 bytes without control characters"
        )
    return value

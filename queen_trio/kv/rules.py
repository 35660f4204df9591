"""KV naming and TTL rules (pure). TTLs are whole seconds: a sub-second TTL is nobody's real
case, while timers, which are, take milliseconds."""

from __future__ import annotations

import re
from typing import Any

from ..errors import ValidationError
from ..text import utf8_name

MAX_TTL_SECONDS = 10 * 365 * 86_400
MAX_KEY_BYTES = 512
_NAMESPACE_RE = re.compile(r"^[A-Za-z0-9_.:\-]{1,128}$")


def namespace(value: Any, field: str = "namespace") -> str:
    if not isinstance(value, str) or not _NAMESPACE_RE.fullmatch(value):
        raise ValidationError(
            "invalid_namespace",
            f"{field} must be 1-128 characters of letters, digits, '_', '.', ':' or '-'",
        )
    return value


def key(value: Any, field: str = "key") -> str:
    return utf8_name(value, field, code="invalid_key", max_bytes=MAX_KEY_BYTES)


def ttl_seconds(value: Any, field: str = "ttlSeconds") -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(
            "invalid_ttl", f"{field} must be a whole number of seconds (an integer >= 1)"
        )
    if not 1 <= value <= MAX_TTL_SECONDS:
        raise ValidationError("invalid_ttl", f"{field} must be from 1 to {MAX_TTL_SECONDS}")
    return value

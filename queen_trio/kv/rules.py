"""KV naming and TTL rules (pure). TTLs are whole seconds: a sub-second TTL is nobody's real
case, while timers, which are, take milliseconds."""

from __future__ import annotations

import re
from typing import Any

from ..errors import ValidationError

MAX_TTL_SECONDS = 10 * 365 * 86_400
MAX_KEY_BYTES = 512
_NAMESPACE_RE = re.compile(r"^[A-Za-z0-9_.:\-]{1,128}$")
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")


def namespace(value: Any, field: str = "namespace") -> str:
    if not isinstance(value, str) or not _NAMESPACE_RE.fullmatch(value):
        raise ValidationError(
            "invalid_namespace",
            f"{field} must be 1-128 characters of letters, digits, '_', '.', ':' or '-'",
        )
    return value


def key(value: Any, field: str = "key") -> str:
    if not isinstance(value, str) or not value:
        raise ValidationError("invalid_key", f"{field} must be a non-empty string")
    try:
        size = len(value.encode())
    except UnicodeEncodeError:
        raise ValidationError("invalid_key", f"{field} contains an unpaired surrogate") from None
    if size > MAX_KEY_BYTES or _CONTROL_RE.search(value):
        raise ValidationError(
            "invalid_key", f"{field} must be 1-{MAX_KEY_BYTES} UTF-8 bytes without control characters"
        )
    return value


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

"""Bearer tokens: generation, parsing and verification (pure, no I/O).

A token reads ``qt_<prefix>_<secret>``. The prefix is public and unique (it finds the row and
is what ``tenants token revoke`` takes); only a salted SHA-256 of the secret is stored. Secrets
are 256 random bits, so a fast hash is enough; the comparison is constant-time.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import re
import secrets

_TOKEN_RE = re.compile(r"^qt_([0-9a-f]{12})_([A-Za-z0-9_-]{43})$")
_DUMMY_SALT = b"\x00" * 16


@dataclasses.dataclass(frozen=True, slots=True)
class NewToken:
    token: str
    prefix: str
    salt: bytes
    hash: bytes


def generate() -> NewToken:
    prefix = secrets.token_hex(6)
    secret = secrets.token_urlsafe(32)
    salt = secrets.token_bytes(16)
    return NewToken(f"qt_{prefix}_{secret}", prefix, salt, digest(salt, secret))


def digest(salt: bytes, secret: str) -> bytes:
    return hashlib.sha256(salt + secret.encode()).digest()


def parse(token: str) -> tuple[str, str] | None:
    """(prefix, secret) of a well-formed token, else None."""
    match = _TOKEN_RE.fullmatch(token)
    return None if match is None else (match[1], match[2])


def verify(secret: str, salt: bytes | None, expected: bytes | None) -> bool:
    """Constant-time check; with no stored row it still hashes, so timing says nothing."""
    if salt is None or expected is None:
        hmac.compare_digest(digest(_DUMMY_SALT, secret), b"\x00" * 32)
        return False
    return hmac.compare_digest(digest(salt, secret), expected)


def bearer(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer …`` header, if that is what it is."""
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()

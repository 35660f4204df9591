"""At-rest encryption of message payloads (queues configured with ``encryptionEnabled``).

A payload of such a queue is stored as an envelope, the JSON object
``{"encrypted", "iv", "authTag", "keyId"}`` (base64 of the AES-256-GCM ciphertext, of its fresh
random 12-byte nonce and of its 16-byte tag; the id of the key), in place of the payload: in
the head, in sealed segments, in dead letters and in timer rows alike, so PostgreSQL never
holds the plaintext. Every read that hands a payload to a client opens the envelope.

Keys: ``QUEEN_ENCRYPTION_KEY`` seals and opens; ``QUEEN_ENCRYPTION_OLD_KEYS`` only open (key
rotation: docs/operations.md, "Encryption at rest"). A key's id is derived from the key, so
no id needs to be configured.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
from typing import TYPE_CHECKING, Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

if TYPE_CHECKING:
    from .config import Settings

KEY_BYTES = 32
_NONCE_BYTES = 12
_TAG_BYTES = 16
_FIELDS = frozenset(("encrypted", "iv", "authTag", "keyId"))


def key_id(key: bytes) -> str:
    """A short public name of a key: not the key, and the same on every broker."""
    return hashlib.sha256(b"queen-trio payload key\0" + key).hexdigest()[:16]


def parse_key(text: str) -> bytes | None:
    """The 32 bytes of a key written as 64 hexadecimal digits (Queen's format), else None."""
    text = text.strip()
    if len(text) != 2 * KEY_BYTES:
        return None
    try:
        return bytes.fromhex(text)
    except ValueError:
        return None


def is_envelope(value: Any) -> bool:
    """Has ``value`` the shape of a sealed payload (whoever sealed it)?"""
    return isinstance(value, dict) and value.keys() == _FIELDS


class PayloadCipher:
    """Seals payloads under the current key; opens envelopes under any configured key."""

    def __init__(self, current: bytes, old: tuple[bytes, ...] = ()) -> None:
        self._current_id = key_id(current)
        self._current = AESGCM(current)
        self._keys = {key_id(k): AESGCM(k) for k in old}
        self._keys[self._current_id] = self._current

    def seal(self, text: str) -> str:
        """The envelope (compact JSON text) of a payload's compact JSON text. Intermediate
        copies are dropped as soon as the next exists: a 16 MiB payload is held about three
        times here, not six."""
        nonce = os.urandom(_NONCE_BYTES)
        sealed = self._current.encrypt(nonce, text.encode(), None)
        tag = sealed[-_TAG_BYTES:]
        ciphertext = base64.b64encode(memoryview(sealed)[:-_TAG_BYTES])
        del sealed
        return b"".join((
            b'{"encrypted":"', ciphertext,
            b'","iv":"', base64.b64encode(nonce),
            b'","authTag":"', base64.b64encode(tag),
            b'","keyId":"', self._current_id.encode(), b'"}',
        )).decode("ascii")

    def open_text(self, value: Any) -> str | None:
        """The payload JSON text inside ``value`` if it is an envelope this broker can open;
        None for anything else (a plaintext payload, or an envelope under an unknown key or
        that fails authentication, which is then delivered exactly as stored)."""
        if not is_envelope(value):
            return None
        aes = self._keys.get(value["keyId"]) if isinstance(value["keyId"], str) else None
        if aes is None:
            return None
        try:
            nonce = base64.b64decode(value["iv"], validate=True)
            tag = base64.b64decode(value["authTag"], validate=True)
            if len(nonce) != _NONCE_BYTES or len(tag) != _TAG_BYTES:
                return None
            sealed = bytearray(base64.b64decode(value["encrypted"], validate=True))
        except (TypeError, ValueError, binascii.Error):
            return None
        sealed += tag  # (AES-GCM takes the tag after the ciphertext)
        try:
            plain = aes.decrypt(nonce, sealed, None)
            del sealed
            return plain.decode()
        except (InvalidTag, UnicodeDecodeError):
            return None

    def open(self, value: Any) -> Any:
        """``value`` with its envelope opened (see :meth:`open_text`)."""
        text = self.open_text(value)
        return value if text is None else json.loads(text)


def payload_cipher(settings: Settings) -> PayloadCipher | None:
    """The broker's cipher, or None when no QUEEN_ENCRYPTION_KEY is set."""
    if settings.encryption_key is None:
        return None
    return PayloadCipher(settings.encryption_key, settings.encryption_old_keys)


def opened(cipher: PayloadCipher | None, value: Any) -> Any:
    """A stored payload as a client sees it: opened when it is an envelope of ours."""
    return value if cipher is None else cipher.open(value)

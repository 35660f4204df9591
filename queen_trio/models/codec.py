"""Decoding a request body into a model, with every refusal of :mod:`queen_trio.strict_json`.

msgspec checks a body's shape and types in C, for valid bodies several times faster than
``strict_json.loads`` and a walk of the dicts (bench/wire_codec.py). It is the fast path only:
whatever it refuses, and anything strict_json may refuse that msgspec lets through (a
``\\u0000`` escape, a run of 309 digits), is handed back to the caller's precise path (the
strict decoder, then the route's rules), which answers the same code, message and ``field``
path as before. So msgspec never decides what a refusal says; it only lets the common case
skip the slow walk.
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

T = TypeVar("T")

_LONG_RUN = b"0" * 309  # (strict_json: an integer past a double's range has 309 digits)
_ONE_DIGIT = bytes.maketrans(b"123456789", b"000000000")


class _Fallback:
    """What :func:`fast` answers when the caller must take its precise path."""


FALLBACK: Any = _Fallback()
ANY = msgspec.json.Decoder()


def fast(raw: bytes, decoder: msgspec.json.Decoder[T]) -> T:
    """``raw`` decoded by ``decoder``, or :data:`FALLBACK`: the caller then takes its precise
    path (which refuses it, naming why, or accepts it: a leading byte order mark, say)."""
    if suspect(raw):
        return FALLBACK
    try:
        return decoder.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return FALLBACK


def suspect(raw: bytes) -> bool:
    """Whether ``raw`` holds what strict_json may refuse and msgspec would take (a ``\\u0000``
    escape, a run of 309 digits): :func:`fast` leaves such a body to the precise path. Of
    texts joined by commas, true exactly when it is for one of them."""
    return b"\\u0000" in raw or (len(raw) >= len(_LONG_RUN)
                                  and _LONG_RUN in raw.translate(_ONE_DIGIT))


def fast_builtins(raw: bytes, decoder: msgspec.json.Decoder[Any]) -> Any:
    """:func:`fast`, given back as the JSON builtins a clean body decodes to (the fields its
    model leaves out are absent, those it ignores dropped): for routes whose rules read the
    body as dicts. The model has checked the shape and types; the rules still judge it, on
    the same dicts whichever path decoded them, so their answers cannot differ."""
    decoded = fast(raw, decoder)
    return decoded if decoded is FALLBACK else msgspec.to_builtins(decoded)


_ENCODER = msgspec.json.Encoder()


def encode(value: Any) -> bytes:
    """A model (or a list or dict of them) as compact UTF-8 JSON."""
    return _ENCODER.encode(value)


def as_model(value: Any, decoder: msgspec.json.Decoder[T]) -> T:
    """Builtins named as on the wire (a store's result dicts) as their model: encoded and
    decoded again in C, several times faster than ``msgspec.convert`` (bench/kv_answer.py)."""
    return decoder.decode(_ENCODER.encode(value))

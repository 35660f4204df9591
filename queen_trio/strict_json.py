"""JSON by the standard (RFC 8259), and only what PostgreSQL can store: the one decoder of
request bodies (the broker's routes, the CLI's arguments, the SDK's answers) and the SDK's one
encoder.

Refused, with the path of the value (``items[3].payload.price``):

* ``NaN``, ``Infinity``, ``-Infinity``: not JSON at all (Python's json module accepts them);
* numbers beyond the range of an IEEE 754 double (about ±1.8e308), whether they overflow as a
  float (``1e999``, which Python would turn into ``inf``) or are written out as an integer of
  309 digits or more. RFC 8259 §6 names binary64 as the range implementations interoperate
  on, and it is what every JSON reader can hold as a finite number: JavaScript's
  ``JSON.parse`` reads such a number as ``Infinity``, Go's ``encoding/json`` refuses it, and
  Python's int parser gives up past 4,300 digits (which used to answer 500). Integers inside
  the range are kept exactly (64-bit ids round-trip; jsonb's numeric holds them);
* strings, and object names, holding U+0000 (``\\u0000``): neither jsonb nor text can store
  it;
* strings holding an unpaired UTF-16 surrogate (``"\\ud800"``): not Unicode text, so not
  UTF-8 (RFC 8259 §8.2), and not storable either;
* a body that is not UTF-8 (RFC 8259 §8.1; UTF-16 and UTF-32 included). A leading UTF-8 byte
  order mark is ignored, as §8.1 allows.

What it costs over ``json.loads`` (bench/json_decode.py): NUL and surrogates can only be
written as ``\\u`` escapes (raw control characters are a syntax error, raw surrogates are not
UTF-8), so strings are looked at only when the text holds ``\\u0000`` or a lone surrogate
escape; floats go through the scanner's hook (about 0.25 µs each); integers keep the C path,
and the text is searched for a run of 309 digits instead (0.7 ns a byte). A single-event push
decodes as fast as before, a 100-event one about 20 % slower. What was refused, or looks as
if it may be (such a run of digits inside a string), is decoded again by a slower pass that
names the path.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

MALFORMED = "malformed_json"
INVALID_VALUE = "invalid_json_value"

_DOUBLE_MAX = int(sys.float_info.max)  # the largest finite double, as an integer
_DOUBLE_MAX_DIGITS = len(str(_DOUBLE_MAX))  # 309
_BOM = b"\xef\xbb\xbf"
_ONE_DIGIT = bytes.maketrans(b"123456789", b"000000000")
_LONG_RUN = b"0" * _DOUBLE_MAX_DIGITS
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
# An escape that writes U+0000, or a lone surrogate: a \uD800-\uDBFF escape not followed by a
# \uDC00-\uDFFF one, or the second without the first. (It starts with a literal, so the
# regex engine skips from one "\u" to the next; an escaped backslash before "u0000" is a
# false alarm, which the walk settles.)
_SUSPECT_ESCAPE = re.compile(
    r"\\u(?:0000|[dD](?:[89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F])"
    r"|(?<!\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD])[c-fC-F][0-9a-fA-F]{2}))")
_PLAIN_NAME = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*")


class JsonRefused(ValueError):
    """Text that is not JSON (``code`` ``malformed_json``), or a JSON value this broker does
    not accept (``invalid_json_value``) at ``path`` (``""``: the whole document)."""

    def __init__(self, code: str, message: str, path: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.path = path


class _Refusal:
    """What the locating decoder puts where a number it refuses stood."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


class _Refused(Exception):
    """Raised by the fast decoder's hooks: the document holds a refused number."""


# -- numbers ----------------------------------------------------------------------------------


def _constant_reason(name: str) -> str:
    return f"{name} is not a JSON value (JSON has no NaN or infinities)"


def _float_reason(text: str) -> str:
    return f"{_shorten(text)} is beyond the range of a double (about ±1.8e308)"


def _int_reason(text: str) -> str:
    return _big_int_reason(f"{len(text.lstrip('-'))}", _shorten(text))


def _big_int_reason(digits: str, shown: str) -> str:
    return (f"an integer of {digits} digits ({shown}) is beyond the range of a double "
            "(about ±1.8e308)")


def _shorten(text: str) -> str:
    return text if len(text) <= 24 else f"{text[:10]}…{text[-6:]}"


def _int_fits(text: str) -> bool:
    size = len(text) - (text[0] == "-")
    return size < _DOUBLE_MAX_DIGITS or (size == _DOUBLE_MAX_DIGITS
                                         and abs(int(text)) <= _DOUBLE_MAX)


def _fast_constant(name: str) -> Any:
    raise _Refused


def _fast_float(text: str, _float: type[float] = float) -> float:
    value = _float(text)
    if value - value:  # inf - inf is NaN, which is truthy; a finite x - x is 0.0
        raise _Refused
    return value


def _locating_float(text: str) -> Any:
    value = float(text)
    return _Refusal(_float_reason(text)) if value - value else value


def _locating_int(text: str) -> Any:
    return int(text) if _int_fits(text) else _Refusal(_int_reason(text))


# Made once: json.loads with any keyword builds a new decoder per call. Integers keep the
# scanner's C path: a hook costs about 0.25 µs an integer, more than looking through the
# text for a run of 309 digits, which an integer out of range must have.
_FAST = json.JSONDecoder(parse_constant=_fast_constant, parse_float=_fast_float)
_LOCATING = json.JSONDecoder(parse_constant=lambda name: _Refusal(_constant_reason(name)),
                             parse_float=_locating_float, parse_int=_locating_int)


# -- decoding ---------------------------------------------------------------------------------


def loads(data: bytes | str, *, what: str = "the JSON text") -> Any:
    """The JSON document in ``data`` (UTF-8 bytes, or text), or :class:`JsonRefused`;
    ``what`` names ``data`` in a syntax error's message ("the request body")."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    if raw.startswith(_BOM):
        raw = raw[3:]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise JsonRefused(MALFORMED, f"{what} is not UTF-8 (byte {exc.start}); JSON travels "
                          "as UTF-8 (RFC 8259 §8.1)") from None
    try:
        value = _FAST.decode(text)
    except json.JSONDecodeError as exc:
        raise JsonRefused(MALFORMED, f"{what} is not valid JSON: {exc}") from None
    except RecursionError:
        raise JsonRefused(MALFORMED, f"{what} is nested too deeply") from None
    except (_Refused, ValueError):  # (ValueError: an integer past Python's 4,300 digits)
        suspect = True
    else:
        suspect = _long_digit_run(raw)
    if suspect:
        # Again, slowly: what the fast pass refused, or a run of digits (maybe in a string).
        try:
            value = _LOCATING.decode(text)
        except RecursionError:
            raise JsonRefused(MALFORMED, f"{what} is nested too deeply") from None
        check(value)
    elif "\\" in text and _SUSPECT_ESCAPE.search(text):  # (the first test is a memchr)
        check(value)
    return value


_RUN_CHUNK = 1 << 20


def _long_digit_run(raw: bytes) -> bool:
    """Whether ``raw`` holds a run of 309 digits: looked for a MiB at a time (the pieces
    overlap by a run's length), so a 16 MiB body costs one more MiB, not 16."""
    if len(raw) < _DOUBLE_MAX_DIGITS:
        return False
    step = _RUN_CHUNK - _DOUBLE_MAX_DIGITS
    return any(_LONG_RUN in raw[i:i + _RUN_CHUNK].translate(_ONE_DIGIT)
               for i in range(0, max(1, len(raw) - _DOUBLE_MAX_DIGITS + 1), step))


# -- checking and encoding --------------------------------------------------------------------


def check(value: Any) -> None:
    """Raise :class:`JsonRefused` naming the first value (in document order) that JSON or
    PostgreSQL cannot carry: see the module's description. Tuples count as arrays."""
    if not _clean(value):
        _locate(value)


def _clean(value: Any) -> bool:
    """True if nothing in ``value`` is refused; False if something may be (a subclass of a
    JSON type, say): a quick walk that keeps no paths."""
    stack = [value]
    pop, push, extend = stack.pop, stack.append, stack.extend
    seen: set[int] = set()  # containers walked: a circular one is walked once, not forever
    while stack:
        item = pop()
        kind = type(item)
        if (kind is dict or kind is list or kind is tuple) and _seen_before(item, seen):
            continue
        if kind is str:
            if not item.isascii() and _UNSTORABLE.search(item) or "\x00" in item:
                return False
        elif kind is dict:
            for name in item:
                if type(name) is not str or not name.isascii() or "\x00" in name:
                    push(name)  # looked at as a value: a string, or anything else
            extend(item.values())
        elif kind is list or kind is tuple:
            extend(item)
        elif kind is int:
            if not -_DOUBLE_MAX <= item <= _DOUBLE_MAX:
                return False
        elif kind is float:
            if item - item:
                return False
        elif not (item is None or kind is bool):
            return False  # _Refusal, or a subclass: the slow walk decides
    return True


def _locate(value: Any) -> None:
    """:func:`check`'s walk with the path of every value."""
    stack: list[tuple[Any, str]] = [(value, "")]
    seen: set[int] = set()
    while stack:
        item, path = stack.pop()
        if isinstance(item, dict | list | tuple) and _seen_before(item, seen):
            continue
        if isinstance(item, str):
            _check_text(item, path, "a string")
        elif isinstance(item, dict):
            children = []
            for name, child in item.items():
                child_path = _member(path, name)
                if isinstance(name, str):
                    _check_text(name, child_path, "a member name")
                children.append((child, child_path))
            stack.extend(reversed(children))
        elif isinstance(item, list | tuple):
            stack.extend((item[i], f"{path}[{i}]") for i in range(len(item) - 1, -1, -1))
        elif isinstance(item, _Refusal):
            raise JsonRefused(INVALID_VALUE, _located(path, item.reason), path)
        elif isinstance(item, float):
            if item - item:  # (a Python float: the decoder never makes one of these)
                name = "NaN" if item != item else "Infinity" if item > 0 else "-Infinity"
                raise JsonRefused(INVALID_VALUE, _located(path, _constant_reason(name)), path)
        elif isinstance(item, int) and not isinstance(item, bool):
            if not -_DOUBLE_MAX <= item <= _DOUBLE_MAX:
                raise JsonRefused(INVALID_VALUE, _located(path, _int_too_big(item)), path)


def _seen_before(container: Any, seen: set[int]) -> bool:
    """Whether the walk met ``container`` already. Skipping it again is right either way: a
    container referenced twice was checked the first time, and a circular one is left to the
    encoder, which refuses it ("Circular reference detected")."""
    key = id(container)
    if key in seen:
        return True
    seen.add(key)
    return False


def _int_too_big(number: int) -> str:
    try:
        return _int_reason(str(number))
    except ValueError:  # past Python's 4,300-digit limit for int -> str
        return _big_int_reason("over 4,300", "-…" if number < 0 else "…")


def _check_text(text: str, path: str, what: str) -> None:
    if text.isascii() and "\x00" not in text:
        return
    found = _UNSTORABLE.search(text)
    if found is None:
        return
    if found.group() == "\x00":
        reason = f"{what} holding U+0000 (\\u0000), which PostgreSQL cannot store"
    else:
        reason = (f"{what} holding an unpaired UTF-16 surrogate (\\u{ord(found.group()):04x}),"
                  " which is not Unicode text")
    raise JsonRefused(INVALID_VALUE, _located(path, reason), path)


def _member(path: str, name: Any) -> str:
    if isinstance(name, str) and _PLAIN_NAME.fullmatch(name):
        return f"{path}.{name}" if path else name
    return f"{path}[{json.dumps(name if isinstance(name, str) else str(name))}]"


def _located(path: str, reason: str) -> str:
    return f"{path or 'the document'}: {reason}"


# The SDK's bodies: compact, UTF-8, as httpx writes them (allow_nan=False raises ValueError).
_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def dumps(value: Any) -> bytes:
    """``value`` as compact UTF-8 JSON, or :class:`JsonRefused` naming what JSON or PostgreSQL
    cannot carry (TypeError for what is not JSON-like at all, as ``json.dumps``).

    NaN, infinities, U+0000 and unpaired surrogates are caught at C speed; integers between
    309 and 4,300 digits are not looked for (that would take a walk of every value): the
    broker refuses them with the same message.
    """
    try:
        text = _ENCODER.encode(value)
    except ValueError:
        check(value)  # names the value
        raise
    if "\\u0000" in text:
        check(value)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        check(value)
        raise

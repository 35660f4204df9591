"""Durations and TTLs as the SDK accepts them, converted to what the wire carries.

Timers take milliseconds on the wire (``delayMs``) because a sub-second delay is a real case (a
250 ms retry backoff); KV TTLs take whole seconds (``ttlSeconds``) because a sub-second TTL is
not. The SDK accepts friendlier spellings and converts them here, before any request is sent:

* an ``int``: milliseconds for a delay, seconds for a TTL;
* a :class:`datetime.timedelta`;
* a string of one or more ``<digits><unit>`` parts, units ``d``, ``h``, ``m``, ``s``, ``ms``,
  largest first, each at most once: ``"250ms"``, ``"30s"``, ``"72h"``, ``"1h30m"``.

A timer delay may be zero or negative (``-5000``, ``"-5s"``, a negative ``timedelta``): the wire
takes any ``delayMs``, and a delay in the past is legal and fires on the first sweep cycle. Every
other duration (a pop's ``wait``, ``retry_delay``, ``idle_timeout``, TTLs and queue options in
seconds) must not be negative.

Anything else (floats, bare numeric strings, ``"1.5h"``, ``"30min"``, booleans) raises
:class:`ValueError` naming what was wrong.
"""

from __future__ import annotations

import re
from datetime import timedelta

__all__ = ["Duration", "delay_ms", "format_ms", "span_ms", "ttl_seconds", "whole_seconds"]

Duration = int | timedelta | str

# Largest unit first: the order a compound is written in, and the order it is checked in.
UNIT_MS = {"d": 86_400_000, "h": 3_600_000, "m": 60_000, "s": 1_000, "ms": 1}
# ASCII digits only: \d would also take "١s" (an Arabic-Indic one) for a second.
_PART = re.compile(r"([0-9]+)(ms|d|h|m|s)")
_SHAPE = re.compile(r"-?(?:[0-9]+(?:ms|d|h|m|s))+")
_EXAMPLES = "e.g. 250 (ms), timedelta(seconds=30), '250ms', '30s', '30m', '72h', '7d', '1h30m'"


def delay_ms(value: Duration, what: str = "delay") -> int:
    """``value`` as whole milliseconds (may be zero or negative)."""
    if isinstance(value, bool):
        raise ValueError(f"{what} must be a duration ({_EXAMPLES}), not a boolean")
    if isinstance(value, int):
        return value
    if isinstance(value, timedelta):
        micros = (value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds
        if micros % 1000:
            raise ValueError(f"{what} {value!r} is not a whole number of milliseconds")
        return micros // 1000
    if isinstance(value, str):
        parsed = _PARSED.get(value)
        if parsed is None:
            parsed = _parse(value, what)
            if len(_PARSED) < _PARSED_MAX:
                _PARSED[value] = parsed
        return parsed
    raise ValueError(f"{what} must be a duration ({_EXAMPLES}), not {type(value).__name__}")


# Durations already parsed: a bundle's 500 timers usually say "1h" 500 times.
_PARSED: dict[str, int] = {}
_PARSED_MAX = 1024


def span_ms(value: Duration, what: str) -> int:
    """A duration that cannot lie in the past (a wait, a retry delay) as whole milliseconds."""
    ms = delay_ms(value, what)
    if ms < 0:
        raise ValueError(f"{what} must not be negative, got {value!r} (only a timer delay may be)")
    return ms


def _parse(text: str, what: str) -> int:
    if not _SHAPE.fullmatch(text):
        raise ValueError(f"{what} {text!r} is not a duration ({_EXAMPLES})")
    sign = -1 if text.startswith("-") else 1
    units = list(UNIT_MS)
    total, last = 0, -1
    for match in _PART.finditer(text):
        number, unit = match.groups()
        rank = units.index(unit)
        if rank <= last:
            raise ValueError(
                f"{what} {text!r}: units must go from largest to smallest, each once "
                "(d, h, m, s, ms)"
            )
        last = rank
        total += int(number) * UNIT_MS[unit]
    return sign * total


def ttl_seconds(value: Duration, what: str = "ttl_seconds") -> int:
    """A KV TTL as whole seconds, at least 1: an int (seconds), timedelta or duration string."""
    return whole_seconds(value, what, minimum=1)


def whole_seconds(value: Duration, what: str, *, minimum: int = 0) -> int:
    """A seconds-side duration (TTLs, leases): an int counts seconds, a timedelta or string
    must come to whole seconds."""
    if isinstance(value, int) and not isinstance(value, bool):
        seconds = value
    else:
        ms = delay_ms(value, what)
        if ms % 1000:
            raise ValueError(f"{what} {value!r} is not a whole number of seconds")
        seconds = ms // 1000
    if seconds < minimum:
        raise ValueError(f"{what} must be at least {minimum} second(s), got {value!r}")
    return seconds


def format_ms(ms: int) -> str:
    """The canonical compound spelling of ``ms`` (``5_400_000`` → ``"1h30m"``, 0 → ``"0ms"``)."""
    if ms == 0:
        return "0ms"
    sign, rest = ("-", -ms) if ms < 0 else ("", ms)
    parts = []
    for unit, size in UNIT_MS.items():
        count, rest = divmod(rest, size)
        if count:
            parts.append(f"{count}{unit}")
    return sign + "".join(parts)

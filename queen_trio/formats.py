"""How the answers write two of Queen's fields: an instant (ISO-8601, as Queen writes
createdAt) and a message's id."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import msgspec


def iso(ts: datetime | None) -> str | None:
    """ISO-8601 UTC with microseconds and a Z, as Queen writes createdAt."""
    # (isoformat is several times cheaper than strftime, for a bundle's 500 answers; in UTC it
    # ends in +00:00)
    return None if ts is None else ts.astimezone(UTC).isoformat(timespec="microseconds")[:-6] + "Z"


_ENCODE = msgspec.json.Encoder().encode
_DECODE_TEXTS = msgspec.json.Decoder(list[str]).decode


def iso_all(stamps: Sequence[datetime]) -> list[str]:
    """:func:`iso` of each, written by msgspec in one pass (a pop's 500 createdAt: iso costs
    microseconds each). msgspec writes an
    instant at offset zero as :func:`iso` does (a Z), whatever its tzinfo (psycopg's is the
    session's zone, e.g. Etc/UTC), except for a whole second (no fraction): those, and other
    offsets, are written by :func:`iso`."""
    # Each distinct instant once: a bundle's timers often share theirs (one delay, one now()).
    distinct = list(dict.fromkeys(stamps))
    out: list[str] = _DECODE_TEXTS(_ENCODE(distinct))
    for i, ts in enumerate(distinct):
        if not ts.microsecond or ts.utcoffset():
            out[i] = iso(ts)  # type: ignore[assignment]
    if len(distinct) == len(stamps):
        return out
    text = dict(zip(distinct, out, strict=True))
    return [text[ts] for ts in stamps]


def message_id(partition_id: str, offset: int, meta: dict[str, Any] | None) -> str:
    """A message's id: the one it was promised before it existed (a timer's, when scheduled),
    which its frame carries in ``meta``; else its position."""
    if meta and "messageId" in meta:
        return str(meta["messageId"])
    return f"{partition_id}:{offset}"

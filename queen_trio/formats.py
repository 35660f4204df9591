"""How the answers write two of Queen's fields: an instant (ISO-8601, as Queen writes
createdAt) and a message's id."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

import msgspec


def iso(ts: datetime | None) -> str | None:
    """ISO-8601 UTC with microseconds and a Z, as Queen writes createdAt."""
    # (isoformat is several times cheaper than strftime, for a bundle's 500 answers; in UTC it
    # ends in +00:00)
    return None if ts is None else ts.astimezone(UTC).isoformat(timespec="microseconds")[:-6] + "Z"


_ENCODE = msgspec.json.Encoder().encode
_DECODE_TEXTS = msgspec.json.Decoder(list[str]).decode
_UTC_ZONES = frozenset((UTC, ZoneInfo("UTC")))  # what msgspec writes with a Z


def iso_all(stamps: Sequence[datetime]) -> list[str]:
    """:func:`iso` of each, written by msgspec in one pass (a pop's 500 createdAt: iso costs
    microseconds each, and the frames of a burst rarely share theirs). msgspec writes UTC as
    :func:`iso` does except for a whole second (no fraction) and other offsets: those are
    written by :func:`iso`."""
    out: list[str] = _DECODE_TEXTS(_ENCODE(stamps))
    utc = _UTC_ZONES
    for i, ts in enumerate(stamps):
        if not ts.microsecond or ts.tzinfo not in utc:
            out[i] = iso(ts)  # type: ignore[assignment]
    return out


def message_id(partition_id: str, offset: int, meta: dict[str, Any] | None) -> str:
    """A message's id: the one it was promised before it existed (a timer's, when scheduled),
    which its frame carries in ``meta``; else its position."""
    if meta and "messageId" in meta:
        return str(meta["messageId"])
    return f"{partition_id}:{offset}"

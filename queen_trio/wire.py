"""Small helpers shared by the routes' JSON encoders."""

from __future__ import annotations

from datetime import UTC, datetime


def iso(ts: datetime | None) -> str | None:
    """ISO-8601 UTC with microseconds and a Z, as Queen writes createdAt."""
    return None if ts is None else ts.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")

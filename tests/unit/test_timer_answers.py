"""How the timer routes write an answer's deliverAt: msgspec writes a bundle's instants in C,
exactly as formats.iso writes each (microseconds, UTC, Z)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

from queen_trio.api import timers
from queen_trio.formats import iso


def test_a_bundles_instants_are_written_as_iso_writes_them() -> None:
    stamps: list[datetime | None] = [
        datetime(2030, 1, 1, 12, 0, 0, 123456, UTC), datetime(2030, 1, 1, 12, 0, 0, 0, UTC),
        datetime(2030, 1, 1, 12, 0, 0, 1, UTC), datetime(2030, 1, 1, 12, 0, 0, 120000, UTC),
        None, datetime(1, 1, 1, tzinfo=UTC), datetime(9999, 12, 31, 23, 59, 59, 999999, UTC),
        datetime(2030, 1, 1, 12, 0, 0, 5, ZoneInfo("UTC")),
        datetime(2030, 1, 1, 12, 0, 0, 5, ZoneInfo("Europe/Paris")),
        datetime(2030, 1, 1, 12, 0, 0, 5, timezone(timedelta(hours=-3, minutes=-30))),
        datetime(2030, 1, 1, 12, 0, 0, 5, timezone(timedelta(0))),
    ]
    assert timers._isos(stamps) == [iso(s) for s in stamps]

"""The instants of a pop's answer: written in one pass exactly as one by one."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

from queen_trio.formats import iso, iso_all


def test_iso_all_writes_every_instant_as_iso_does() -> None:
    base = datetime(2026, 12, 4, 21, 59, 59, 999_998, tzinfo=UTC)
    stamps = [base + timedelta(microseconds=i) for i in range(5)]  # across a whole second
    stamps += [
        base.replace(microsecond=0),                         # msgspec would drop the fraction
        base.replace(microsecond=1_000),                     # trailing zeros kept
        base.astimezone(timezone(timedelta(hours=2))),       # another offset: written in UTC
        base.astimezone(ZoneInfo("UTC")),
        base.astimezone(timezone(timedelta(0))),
        base.astimezone(ZoneInfo("America/New_York")),
        base.astimezone(ZoneInfo("Etc/UTC")),                # psycopg's, in the session's zone
        base.astimezone(ZoneInfo("Europe/London")),          # offset zero in winter
        base.replace(microsecond=0).astimezone(ZoneInfo("Etc/UTC")),
    ]
    stamps += stamps[::-1]  # the same instants again (a bundle's share theirs)
    assert iso_all(stamps) == [iso(s) for s in stamps]
    assert iso_all(stamps)[:2] == ["2026-12-04T21:59:59.999998Z", "2026-12-04T21:59:59.999999Z"]
    assert iso_all(stamps)[5] == "2026-12-04T21:59:59.000000Z"
    assert iso_all([]) == []

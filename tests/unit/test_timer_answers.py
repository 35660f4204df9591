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


def test_a_lone_schedule_or_cancel_reads_its_answer_in_c_as_the_strict_path_does() -> None:
    """The SDK reads the answer of a lone schedule or cancel with msgspec: the same
    TimerResult as the strict decoder and the model's conversion give, and answers the strict
    path must judge (a \\u0000 escape, not exactly one result) go to it."""
    from queen_trio import strict_json
    from queen_trio.client import calls
    from queen_trio.models import codec

    spec = calls.TimerSpec("q", "k", 1000, {"a": 1})
    schedule, cancel = calls.schedule_timer(spec), calls.cancel_timer("q", "k")
    assert schedule.fast is not None and cancel.fast is not None
    scheduled = (b'{"ok":true,"status":"scheduled","queue":"q","timerKey":"k","txn":"t-1",'
                 b'"messageId":"0190a8f2-7c4e-7b2a-9d3e-1f2a3b4c5d6e",'
                 b'"deliverAt":"2030-01-01T12:00:00.123456Z","partition":"Default"}')
    answers = [scheduled,
               b'{"ok":false,"status":"too_late","queue":"q","timerKey":"k","txn":"t-2"}',
               b'{"ok":false,"status":"absent","queue":"q","timerKey":"k","txn":null}',
               b'{"ok":true,"status":"cancelled","queue":"q","timerKey":"k","txn":"t-3"}']
    for one in answers:
        batch = b'{"results":[' + one + b"]}"
        assert schedule.fast(batch) == schedule.parse(strict_json.loads(batch))
        assert cancel.fast(one) == cancel.parse(strict_json.loads(one))
    assert schedule.fast(b'{"results":[]}') is codec.FALLBACK
    assert schedule.fast(b'{"results":[' + scheduled + b"," + scheduled + b"]}") is codec.FALLBACK
    assert cancel.fast(answers[3].replace(b"t-3", b"t\\u0000")) is codec.FALLBACK

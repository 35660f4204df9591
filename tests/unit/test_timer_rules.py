"""Timer payload packing and request rules (no database)."""

from __future__ import annotations

import threading

import pytest

from queen_trio.errors import ValidationError
from queen_trio.timers import rules


def test_pack_and_unpack_round_trip() -> None:
    payload = {"accountId": 42, "note": "café", "list": [1, 2.5, None, True]}
    blob, size = rules.pack(payload)
    assert size == len('{"accountId":42,"note":"café","list":[1,2.5,null,true]}'.encode())
    assert rules.unpack(blob) == payload


def test_corrupt_blobs_are_a_value_error() -> None:
    with pytest.raises(ValueError, match="cannot be decoded"):
        rules.unpack(b"\x00deadbeef")


def test_packing_from_many_threads_at_once_is_safe() -> None:
    """zstandard objects are not thread-safe; the pool packs from several worker threads."""
    errors: list[BaseException] = []
    payload = {"data": "x" * 5000}

    def work() -> None:
        try:
            for _ in range(300):
                blob, _ = rules.pack(payload)
                assert rules.unpack(blob) == payload
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


@pytest.mark.parametrize(
    ("attempts", "expected"), [(1, 1000), (2, 2000), (3, 4000), (7, 60_000), (20, 60_000)]
)
def test_backoff_doubles_and_caps_at_a_minute(attempts: int, expected: int) -> None:
    assert rules.backoff_ms(attempts, 1000) == expected


def test_cursor_round_trip_and_garbage() -> None:
    key = "trial-ending:42/ключ"
    assert rules.decode_cursor(rules.encode_cursor(key)) == key
    with pytest.raises(ValidationError):
        rules.decode_cursor("%%%")


@pytest.mark.parametrize(
    ("body", "code"),
    [({"delayMs": "30m", "payload": 1}, "invalid_delay"),
     ({"delayMs": 5, "payload": 1, "runAt": 3}, "invalid_delay"),
     ({"delayMs": 5}, "missing_field"),
     ({"delayMs": 10_001, "payload": 1}, "invalid_delay")],
)
def test_schedule_rules(body: dict, code: str) -> None:
    with pytest.raises(ValidationError) as info:
        rules.schedule(body, "q", "k", horizon_s=10, ceiling=1000)
    assert info.value.code == code


def test_schedule_accepts_negative_and_zero_delays() -> None:
    for delay in (0, -5000):
        s = rules.schedule({"delayMs": delay, "payload": None}, "q", "a/b c", horizon_s=10,
                           ceiling=1000)
        assert (s.delay_ms, s.key, s.partition, s.txn) == (delay, "a/b c", "Default", None)

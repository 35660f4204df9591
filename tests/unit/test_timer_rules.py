"""Timer payload packing and request rules (no database)."""

from __future__ import annotations

import base64
import json
import random
import threading

import pytest

from queen_trio.errors import ValidationError
from queen_trio.timers import rules


def test_small_payloads_are_kept_as_json_text() -> None:
    payload = {"accountId": 42, "note": "café", "list": [1, 2.5, None, True]}
    blob, size, compressed = rules.pack(payload)
    text = '{"accountId":42,"note":"café","list":[1,2.5,null,true]}'.encode()
    assert (blob, size, compressed) == (text, len(text), False)
    assert rules.unpack(blob, compressed) == payload


def test_payloads_that_compress_are_stored_compressed() -> None:
    payload = {"events": [{"type": "booking.held", "bookingId": i} for i in range(50)]}
    blob, size, compressed = rules.pack(payload)
    assert compressed
    assert size == len(json.dumps(payload, separators=(",", ":")).encode())
    assert len(blob) < size // 4
    assert rules.unpack(blob, compressed) == payload


def test_payloads_zstd_cannot_shrink_by_an_eighth_stay_text() -> None:
    payload = base64.b64encode(random.Random(7).randbytes(300)).decode()  # ~6 bits a byte
    blob, size, compressed = rules.pack(payload)
    assert (blob, compressed) == (f'"{payload}"'.encode(), False)
    assert rules.unpack(blob, compressed) == payload


@pytest.mark.parametrize("compressed", [True, False])
def test_corrupt_blobs_are_a_value_error(compressed: bool) -> None:
    with pytest.raises(ValueError, match="cannot be decoded"):
        rules.unpack(b"\x00deadbeef", compressed)
    with pytest.raises(ValueError, match="cannot be decoded"):
        rules.unpack(b"\xff\xfe", compressed)


def test_packing_from_many_threads_at_once_is_safe() -> None:
    """zstandard objects are not thread-safe; the pool packs from several worker threads."""
    errors: list[BaseException] = []
    payload = {"data": "x" * 5000}

    def work() -> None:
        try:
            for _ in range(300):
                blob, _, compressed = rules.pack(payload)
                assert compressed and rules.unpack(blob, compressed) == payload
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


@pytest.mark.parametrize(("blob", "compressed", "expected"), [
    # Payloads jsonb refuses: the start of the text, a NUL byte spelled out.
    (b"NaN", False, {"undecodablePayloadBytes": 3, "payloadPreview": "NaN"}),
    (b'"\xff\x00"', False, {"undecodablePayloadBytes": 4, "payloadPreview": '"\\xff\\x00"'}),
    (rules.pack({"note": "x" * 500})[0], True,
     {"undecodablePayloadBytes": len(rules.pack({"note": "x" * 500})[0]),
      "payloadPreview": '{"note":"' + "x" * (rules.PREVIEW_BYTES - 9)}),
    (b"\x28\xb5\x2f\xfd not zstd", True,
     {"undecodablePayloadBytes": 13, "compressed": "cannot be decompressed"}),
])
def test_what_a_dead_letter_holds_for_a_payload_jsonb_cannot_hold(
    blob: bytes, compressed: bool, expected: dict
) -> None:
    described = rules.undecodable(blob, compressed)
    assert described == expected
    assert "\\u0000" not in json.dumps(described)  # jsonb takes it

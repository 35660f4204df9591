"""Timer payload packing and request rules (no database)."""

from __future__ import annotations

import base64
import json
import random
import threading
from collections.abc import Callable
from typing import Any

import pytest
import zstandard

from queen_trio import strict_json
from queen_trio.errors import ClientError, PayloadTooLarge, ValidationError
from queen_trio.models import codec
from queen_trio.models.timers import BATCH_DECODER
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


@pytest.mark.parametrize(("raw", "limit"), [(None, 100), ("", 100), ("7", 7), ("0", 1),
                                            ("-5", 1), ("5000", 1000), ("lots", 100)])
def test_a_list_limit_is_clamped_never_refused(raw: str | None, limit: int) -> None:
    assert rules.list_limit(raw) == limit


@pytest.mark.parametrize(
    ("body", "code"),
    [({"delayMs": "30m", "payload": 1}, "invalid_delay"),
     ({"delayMs": 5, "payload": 1, "runAt": 3}, "invalid_delay"),
     ({"delayMs": 5}, "missing_field"),
     ({"delayMs": 10_001, "payload": 1}, "timer_horizon_exceeded")],
)
def test_schedule_rules(body: dict, code: str) -> None:
    with pytest.raises(ClientError) as info:
        rules.schedule(body, "q", "k", horizon_s=10, ceiling=1000)
    assert info.value.code == code
    assert info.value.status == (403 if code == "timer_horizon_exceeded" else 400)


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def test_a_queen_operation_carries_the_json_its_client_encoded() -> None:
    op = {"op": "schedule", "queue": "q", "timerKey": "k", "delayMs": 5, "txn": "t",
          "payload": _b64(json.dumps({"note": "caf\u00e9"}).encode())}
    s = rules.operation(op, "op", horizon_s=10, ceiling=1000)
    assert isinstance(s, rules.Schedule)
    assert (s.payload, s.txn, s.key, s.partition) == ({"note": "café"}, "t", "k", "Default")
    cancel = rules.operation({"op": "cancel", "queue": "q", "timerKey": "k"}, "op",
                             horizon_s=10, ceiling=1000)
    assert cancel == rules.Cancel("q", "k", None)


@pytest.mark.parametrize("raw", [b"{", b"NaN", b'{"a": Infinity}', b"-Infinity", b"1e400",
                                 rb'"\u0000"', rb'{"\u0000": 1}', rb'["\udc00"]', b"\xff",
                                 b"[" * 100_000])
def test_payloads_jsonb_could_not_store_are_refused(raw: bytes) -> None:
    with pytest.raises(ValidationError) as info:
        rules.payload_value(_b64(raw), False, 1 << 20, "op")
    assert info.value.code == "invalid_payload"


def test_escapes_that_jsonb_stores_pass() -> None:
    value, _ = rules.payload_value(_b64(rb'["\\u0000", "\ud83d\ude00", "\n"]'), False, 1000,
                                   "op")
    assert value == ["\\u0000", "\U0001f600", "\n"]


def test_a_zstd_payload_is_decompressed_but_never_past_the_ceiling() -> None:
    small = zstandard.ZstdCompressor().compress(b'{"a": 1}')
    assert rules.payload_value(_b64(small), True, 1000, "op") == ({"a": 1}, b'{"a":1}')
    bomb = zstandard.ZstdCompressor().compress(b'"' + b"x" * 10_000_000 + b'"')
    with pytest.raises(PayloadTooLarge):
        rules.payload_value(_b64(bomb), True, 1000, "op")


def test_one_timer_twice_in_a_call_is_refused() -> None:
    ops: list[rules.Schedule | rules.Cancel] = [
        rules.Cancel("q", "a", None), rules.Cancel("q", "b", None), rules.Cancel("q", "a", None)]
    with pytest.raises(ValidationError) as info:
        rules.check_distinct(ops, "operations")
    assert info.value.code == "duplicate_timer" and "operations[0]" in info.value.message


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


def _op(**fields: object) -> dict:
    base = {"op": "schedule", "queue": "q", "timerKey": "k", "delayMs": 1000, "txn": "t",
            "payload": _b64(b'{"a": [1, 2.5, "\\u00e9"]}')}
    return {**base, **fields}


_DROP = object()


def _both_paths(raw: bytes, shape: Callable[[Any], tuple[Any, ...]]) -> tuple[object, object]:
    """What the fast path (operations_from_bytes) and the precise one (strict decode, then
    operations) make of ``raw``: each op by ``shape``, a refusal as (type, code, message), and
    the fast path's None (it passes) as None."""
    def judged(decide: Callable[[], Any]) -> object:
        try:
            ops = decide()
        except (ClientError, strict_json.JsonRefused) as exc:
            return (type(exc), exc.code, exc.message)
        return None if ops is None else [shape(op) for op in ops]

    kw: dict[str, Any] = {"horizon_s": 3600, "ceiling": 1024}
    return (judged(lambda: rules.operations_from_bytes(raw, **kw)),
            judged(lambda: rules.operations(strict_json.loads(raw), **kw)))


@pytest.mark.parametrize("body", [
    {"operations": [_op(), _op(timerKey="k2", payloadZstd=False, partition="p")]},
    [_op(), _op(op="cancel", timerKey="k3", txn="x", payload=_DROP, delayMs=_DROP)],
    [_op(op="cancel", timerKey="k3", delayMs=_DROP)],  # a cancel carrying a payload
    [_op(delayMs=None)], [_op(delayMs=_DROP)], [_op(txn=None)], [_op(payloadZstd=None)],
    [_op(payloadZstd=1)], [_op(encrypted=True)], [_op(encrypted=False)], [_op(messageId="m")],
    [_op(_x=1)], [_op(op="fire")], [_op(queue="")], [_op(timerKey="a\u0000b")],
    [_op(delayMs=10**400)], [_op(delayMs=2.0)], [_op(delayMs=True)], [_op(payload="%%")],
    [_op(payload=_b64(b"NaN"))], [_op(payload=_b64(b'"\\u0000"'))],
    [_op(payload=_b64(b"1" + b"0" * 400))], [_op(payload=_b64(b'"\\ud800"'))],
    [_op(payload=_b64(b"\xef\xbb\xbf[1]"))], [_op(payload=_b64(b"null"))],
    [_op(delayMs=10**12)], [_op(), _op()], [_op(timerKey=f"k{i}") for i in range(257)],
    {"operations": [_op(timerKey=f"k{i}") for i in range(257)]},
    {"operations": [_op()], "extra": 1}, {"operations": None}, "text",
])
def test_the_models_fast_path_decides_as_the_rules_do(body: object) -> None:
    """A body the wire models decode (queen_trio/models) is judged exactly as the strict
    decoder and the rules judge it: the same operations, or the same refusal; whatever the
    models cannot take falls back to the rules (None)."""
    def clean(v: object) -> object:
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items() if x is not _DROP}
        return [clean(x) for x in v] if isinstance(v, list) else v

    raw = json.dumps(clean(body)).encode()

    def judged(decide: object) -> object:
        try:
            ops = decide()  # type: ignore[operator]
        except (ClientError, strict_json.JsonRefused) as exc:
            return (type(exc), exc.code, exc.message)
        return None if ops is None else [
            (type(op), op.queue, op.key, op.txn, getattr(op, "json_bytes", None) and
             json.loads(op.json_bytes), getattr(op, "delay_ms", None)) for op in ops]

    kw = {"horizon_s": 3600, "ceiling": 1024}
    fast = judged(lambda: rules.operations_from_bytes(raw, **kw))
    precise = judged(lambda: rules.operations(strict_json.loads(raw), **kw))
    assert fast is None or fast == precise


def test_a_clean_batch_takes_the_models_fast_path() -> None:
    body = [{k: v for k, v in op.items() if v is not _DROP}
            for op in (_op(), _op(timerKey="k2", op="cancel", txn="x", payload=_DROP,
                                  delayMs=_DROP))]
    ops = rules.operations_from_bytes(json.dumps(body).encode(), horizon_s=3600, ceiling=1024)
    assert ops is not None
    assert [type(op) for op in ops] == [rules.Schedule, rules.Cancel]
    assert ops[0].payload == {"a": [1, 2.5, "é"]}
    assert ops[0].json_bytes == '{"a":[1,2.5,"é"]}'.encode()


_BAD_AFTER_A_CLEAN_ONE = [
    _op(delayMs=None), _op(txn=None), _op(txn=""), _op(txn="t" * 257), _op(txn="a\u0001b"),
    _op(encrypted=False), _op(payloadZstd=1), _op(queue="no spaces"), _op(timerKey=""),
    _op(timerKey="a\u007fb"), _op(timerKey="é" * 256), _op(timerKey="é" * 257),
    _op(timerKey="x" * 129), _op(partition="p2"), _op(partition="bad partition"),
    _op(delayMs=3_600_000), _op(delayMs=3_600_001), _op(delayMs=-3_600_001), _op(delayMs=True),
    _op(payload="%%"), _op(payload=_b64(b"NaN")), _op(payload=_b64(b"x" * 2000)),
    _op(op="reschedule"), _op(op="cancel", payload=_DROP, delayMs=_DROP),
]


@pytest.mark.parametrize("second", _BAD_AFTER_A_CLEAN_ONE)
def test_a_batch_is_judged_per_operation_after_its_names_are_known(second: dict) -> None:
    """typed_operations checks a bundle's repeated names once and its keys' characters in one
    pass: an operation after clean ones (its queue and partition already known) is judged
    exactly as on its own, the same operations or the same refusal naming the same place."""
    body = [_op(timerKey="first", partition="p"),
            {k: v for k, v in second.items() if v is not _DROP}]
    raw = json.dumps(body).encode()

    fast, precise = _both_paths(raw, lambda op: (
        type(op), op.queue, op.key, op.txn, op.partition if hasattr(op, "partition") else None,
        getattr(op, "json_bytes", None), getattr(op, "delay_ms", None)))
    if codec.fast(raw, BATCH_DECODER) is not codec.FALLBACK:  # the models took it
        assert fast == precise
    else:
        assert fast is None


_LONE = [*_BAD_AFTER_A_CLEAN_ONE, _op(), _op(partition="p"), _op(queue="q" * 128),
         _op(queue="q" * 129), _op(queue="a/b"), _op(queue="q\n"), _op(partition="p" * 256),
         _op(partition="p" * 257), _op(partition="p q"), _op(partition="p\n"),
         _op(partition="a@b=c+d:e.f_g-h"), _op(queue="é")]


@pytest.mark.parametrize("lone", _LONE)
def test_a_lone_operation_is_judged_as_the_rules_judge_it(lone: dict) -> None:
    """One operation alone (the SDK's single schedule) takes the quick checks too, its queue
    and partition checked by name: the same operation or the same refusal, naming the same
    place, as the strict decoder and the rules give."""
    raw = json.dumps([{k: v for k, v in lone.items() if v is not _DROP}]).encode()
    fast, precise = _both_paths(raw, lambda op: (
        type(op), op.queue, op.key, op.txn, op.partition if hasattr(op, "partition") else None,
        getattr(op, "payload", None), getattr(op, "json_bytes", None),
        getattr(op, "delay_ms", None)))
    if codec.fast(raw, BATCH_DECODER) is not codec.FALLBACK:  # the models took it
        assert fast == precise
    else:
        assert fast is None


def test_a_clean_lone_schedule_decodes_its_payload_once(monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    """The quick checks decode a clean lone schedule's payload; the precise path's decode
    (payload_value) is not run for it a second time."""
    calls: list[object] = []
    real = rules.payload_value

    def spy(*args: Any) -> tuple[Any, bytes]:
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(rules, "payload_value", spy)
    (op,) = rules.operations_from_bytes(json.dumps([_op(partition="p")]).encode(),
                                        horizon_s=3600, ceiling=1024) or []
    assert isinstance(op, rules.Schedule) and op.partition == "p"
    assert op.json_bytes == '{"a":[1,2.5,"é"]}'.encode()
    assert calls == []


@pytest.mark.parametrize("payloads", [
    [b"1", b'{"a":[1,2.5,"\xc3\xa9"]}', b"null", b'"x"', b"[]", b"{}", b"-0.5", b"true"],
    [b"[1", b"2]", b"3,4"],  # no one of them JSON, though their array is, with 4 elements
    [b"1", b" 2", b'"\\u00e9"', b"1e5", b"1.0", b'{"a":1,"a":2}'],  # JSON, not compact
    [b"1", b""], [b"1", b'"\\u0000"'], [b"1", b"1" + b"0" * 400], [b"1", b'"\\ud800"'],
    [b"1", b'"\xff"'], [b"1", b"\xef\xbb\xbf[1]"], [b"1", b"NaN"], [b"1", b"x" * 2000],
    [b"1", b'"' + b"y" * 1020 + b'"'], [b"1", b'"' + b"y" * 1022 + b'"'],
])
def test_a_bundles_payloads_decoded_together_are_judged_one_by_one(payloads: list[bytes]) -> None:
    """typed_operations decodes a bundle's payloads as one JSON array: every operation gets
    exactly what payload_value gives it alone (its value and compact JSON), or the same
    refusal naming the same place, whatever its neighbours hold."""
    body = [_op(timerKey="first")] + [_op(timerKey=f"k{i}", payload=_b64(p))
                                      for i, p in enumerate(payloads)]
    raw = json.dumps(body).encode()

    fast, precise = _both_paths(raw, lambda op: (
        op.key, getattr(op, "payload", None), getattr(op, "json_bytes", None)))
    assert fast == precise


@pytest.mark.parametrize("encoded", ["QQ", "QQ=", "QQ===", "Q Q==", "QQ==\n", "=QQ=", "QQ==QQ==",
                                     "é", "QUJD", ""])
def test_payload_base64_is_read_as_b64decode_validate_reads_it(encoded: str) -> None:
    body = [_op(timerKey="first"), _op(timerKey="second", payload=encoded)]
    raw = json.dumps(body).encode()
    kw = {"horizon_s": 3600, "ceiling": 1024}
    try:
        fast = [(o.key, getattr(o, "json_bytes", None))
                for o in rules.operations_from_bytes(raw, **kw) or []]
    except ClientError as exc:
        fast = exc.message  # type: ignore[assignment]
    try:
        precise = [(o.key, getattr(o, "json_bytes", None))
                   for o in rules.operations(strict_json.loads(raw), **kw)]
    except ClientError as exc:
        precise = exc.message  # type: ignore[assignment]
    assert fast == precise

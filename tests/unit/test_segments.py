"""Segments without a database: the byte format, the cut rule, the cache, the settings."""

from __future__ import annotations

import functools
import json
import threading
from datetime import UTC, datetime, timedelta

import pytest

from queen_trio.config import ONE_MIB, load_settings
from queen_trio.errors import ConfigError
from queen_trio.log.segments import (
    DecodedSegment,
    HeadFrame,
    SealPolicy,
    SegmentCache,
    cut,
    decode,
    encode,
    encode_lines,
)

NOW_US = 1_800_000_000_000_000
POLICY = SealPolicy(max_frames=4, max_bytes=100, min_age_ms=1000, max_age_ms=10_000)


_ANY = object()


def frame(offset: int, *, age_ms: int = 60_000, size: int = 10, payload: object = _ANY,
          meta: str | None = None, txn: str | None = None) -> HeadFrame:
    text = json.dumps({"o": offset} if payload is _ANY else payload, ensure_ascii=False)
    return HeadFrame(offset, txn or f"txn-{offset}", text, size, NOW_US - age_ms * 1000, meta)


# -- format -----------------------------------------------------------------------------------


def test_frames_round_trip_through_a_segment() -> None:
    payloads = [{"tab": "a\tb", "nl": "x\ny", "uni": "ü🐝"}, "s", 1.5, None, [], {"k": {}}]
    frames = [frame(10 + i, payload=p, size=len(json.dumps(p)), meta='{"timer": {"key": "k"}}'
                    if i == 2 else None) for i, p in enumerate(payloads)]
    data = encode(frames, level=3)
    segment = decode(10, data)
    assert (segment.first_offset, segment.last_offset) == (10, 15)
    got = segment.frames(0, 100)
    assert [f.payload for f in got] == payloads
    assert [f.offset for f in got] == list(range(10, 16))
    assert [f.transaction_id for f in got] == [f"txn-{o}" for o in range(10, 16)]
    assert got[2].meta == {"timer": {"key": "k"}} and got[0].meta is None
    assert got[0].created_at == datetime(1970, 1, 1, tzinfo=UTC) + timedelta(
        microseconds=frames[0].created_us)
    assert [f.size_bytes for f in got] == [f.size_bytes for f in frames]


@pytest.mark.parametrize("txn", ["plain", 'has"quote', '"starts-quoted"', "tab\there",
                                 "line\nbreak", "cr\r", "ünï 🐝", "a\\b"])
def test_any_transaction_id_survives_the_format(txn: str) -> None:
    segment = decode(0, encode([frame(0, txn=txn), frame(1)], level=1))
    assert [f.transaction_id for f in segment.frames(0, 2)] == [txn, "txn-1"]
    assert segment.frames(0, 2)[0].payload == {"o": 0}


def test_a_read_takes_only_the_lines_it_asks_for() -> None:
    segment = DecodedSegment.from_text(100, encode_lines([frame(o) for o in range(100, 110)]))
    assert [f.offset for f in segment.frames(103, 106)] == [103, 104, 105]
    assert segment.frames(110, 120) == [] and segment.frames(0, 100) == []
    assert [f.offset for f in segment.frames(95, 102)] == [100, 101]


def test_event_json_compresses() -> None:
    frames = [frame(o, payload={"type": "order.created", "orderId": o, "currency": "EUR",
                                "customer": {"id": o % 50, "country": "DE"}}) for o in range(500)]
    raw = sum(len(f.payload_json) for f in frames)
    assert len(encode(frames, level=3)) < raw / 4


def test_an_unknown_codec_is_refused() -> None:
    with pytest.raises(ValueError, match="codec 9"):
        decode(0, b"", codec=9)


# -- the cut ------------------------------------------------------------------------------------


def test_a_full_segment_of_old_enough_frames_is_cut() -> None:
    assert cut([frame(o) for o in range(6)], NOW_US, POLICY) == 4


def test_bytes_bound_a_segment_too() -> None:
    frames = [frame(o, size=40) for o in range(4)]
    assert cut(frames, NOW_US, POLICY) == 3  # 120 bytes >= 100 after the third


def test_young_frames_stay_in_the_head() -> None:
    frames = [frame(0), frame(1), frame(2, age_ms=500), frame(3)]
    # Not full (the young frame stops it) and not past max_age: wait.
    assert cut(frames, NOW_US, SealPolicy(4, 100, 1000, 120_000)) == 0
    # Past max_age (the partition is quiet): the old-enough prefix goes.
    assert cut(frames, NOW_US, POLICY) == 2
    assert cut([frame(0, age_ms=10)], NOW_US, POLICY) == 0


def test_a_lone_old_frame_is_sealed_and_nothing_is_no_cut() -> None:
    assert cut([frame(0, age_ms=11_000)], NOW_US, POLICY) == 1
    assert cut([], NOW_US, POLICY) == 0


# -- the cache ----------------------------------------------------------------------------------


def segment_of(n: int, first: int = 0) -> DecodedSegment:
    """Segments of equal size whatever their offsets."""
    return DecodedSegment.from_text(first, encode_lines(
        [frame(first + i, payload={"v": 1}, txn=f"t{first + i:06d}") for i in range(n)]))


def test_the_cache_keeps_recent_segments_within_its_budget() -> None:
    one = segment_of(10)
    cache = SegmentCache(budget_bytes=one.cost_bytes * 2 + 10)
    cache.put(("p", 0), one)
    cache.put(("p", 10), segment_of(10, 10))
    assert cache.get(("p", 0)) is one  # now the most recently used
    cache.put(("p", 20), segment_of(10, 20))
    assert cache.get(("p", 10)) is None  # the least recently used went
    assert cache.get(("p", 0)) is one
    stats = cache.statistics()
    assert (stats.segments, stats.hits_total, stats.misses_total, stats.evictions_total) == (
        2, 2, 1, 1)
    assert stats.bytes <= stats.budget_bytes


def test_a_segment_larger_than_the_budget_is_not_kept() -> None:
    cache = SegmentCache(budget_bytes=100)
    loads: list[int] = []

    def load() -> DecodedSegment:
        loads.append(1)
        return segment_of(50)

    for _ in range(2):
        cache.get_or_load(("p", 0), load)
    assert len(loads) == 2 and cache.statistics().bytes == 0


def test_the_cache_is_safe_across_threads() -> None:
    cache = SegmentCache(budget_bytes=segment_of(5).cost_bytes * 8)

    def work(t: int) -> None:
        for i in range(300):
            key = ("p", (i * 7 + t) % 20)
            got = cache.get_or_load(key, functools.partial(segment_of, 5, key[1] * 5))
            assert got.first_offset == key[1] * 5

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    stats = cache.statistics()
    assert stats.bytes <= stats.budget_bytes and stats.segments <= 8


# -- settings -----------------------------------------------------------------------------------


def test_segment_settings_have_defaults_and_are_read() -> None:
    s = load_settings({})
    assert (s.segment_max_frames, s.segment_max_bytes, s.segment_zstd_level) == (
        1000, 4 * ONE_MIB, 3)
    assert (s.segment_min_age_ms, s.segment_max_age_ms) == (60_000, 600_000)
    assert (s.housekeeping_interval_ms, s.segment_cache_bytes) == (1000, 64 * ONE_MIB)
    s = load_settings({"QUEEN_SEGMENT_MAX_FRAMES": "50", "QUEEN_SEGMENT_MAX_BYTES": "2048",
                       "QUEEN_SEGMENT_MIN_AGE_MS": "0", "QUEEN_SEGMENT_MAX_AGE_MS": "5",
                       "QUEEN_SEGMENT_ZSTD_LEVEL": "19", "QUEEN_SEGMENT_CACHE_BYTES": "0",
                       "QUEEN_HOUSEKEEPING_INTERVAL_MS": "10"})
    assert (s.segment_max_frames, s.segment_max_bytes, s.segment_min_age_ms,
            s.segment_max_age_ms, s.segment_zstd_level, s.segment_cache_bytes,
            s.housekeeping_interval_ms) == (50, 2048, 0, 5, 19, 0, 10)


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({"QUEEN_SEGMENT_MAX_FRAMES": "0"}, "QUEEN_SEGMENT_MAX_FRAMES"),
        ({"QUEEN_SEGMENT_MAX_BYTES": "12"}, "QUEEN_SEGMENT_MAX_BYTES"),
        ({"QUEEN_SEGMENT_ZSTD_LEVEL": "23"}, "QUEEN_SEGMENT_ZSTD_LEVEL"),
        ({"QUEEN_SEGMENT_CACHE_BYTES": "-1"}, "QUEEN_SEGMENT_CACHE_BYTES"),
        ({"QUEEN_HOUSEKEEPING_INTERVAL_MS": "fast"}, "QUEEN_HOUSEKEEPING_INTERVAL_MS"),
        ({"QUEEN_SEGMENT_MIN_AGE_MS": "9000", "QUEEN_SEGMENT_MAX_AGE_MS": "10"},
         "QUEEN_SEGMENT_MIN_AGE_MS"),
    ],
)
def test_bad_segment_settings_stop_start_up_with_one_line(env: dict, variable: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(env)
    assert caught.value.variable == variable
    assert "\n" not in str(caught.value)

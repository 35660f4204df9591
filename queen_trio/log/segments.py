"""Sealed segments: their byte format, the rule that cuts them, and the decoded-segment cache.

A segment holds frames ``first_offset..last_offset`` of one partition as one zstd frame over
lines of tab-separated fields, one line per offset in order::

    transaction_id  created_at (µs since the epoch)  size_bytes  meta JSON (or empty)  payload JSON

None of the fields can contain a tab or a newline: PostgreSQL's jsonb text escapes them inside
strings, and the API refuses control characters in transactionIds (one that has them anyway, or
starts with a double quote, is written as a JSON string). A reader parses only the lines it
needs.

Nothing here does I/O; :mod:`queen_trio.log.frames` reads, :mod:`.housekeeping` seals.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import re
import threading
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import zstandard

CODEC_ZSTD = 1
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# What a cached segment costs beyond its decompressed text: the line index and bookkeeping.
_ENTRY_OVERHEAD = 256
_PER_LINE_OVERHEAD = 8


@dataclasses.dataclass(frozen=True, slots=True)
class Frame:
    """One frame of the log, wherever it is stored."""

    offset: int
    transaction_id: str
    payload: Any
    size_bytes: int
    created_at: datetime
    meta: dict[str, Any] | None


@dataclasses.dataclass(frozen=True, slots=True)
class HeadFrame:
    """A head row as the sealer reads it: JSON still as text, so sealing never re-encodes it."""

    offset: int
    transaction_id: str
    payload_json: str
    size_bytes: int
    created_us: int
    meta_json: str | None


# -- encoding ----------------------------------------------------------------------------------

# zstandard's (de)compressors must not be shared between threads, and segments are encoded and
# decoded in the event loop's thread and in the database pool's worker threads: one set per
# thread.
_codec = threading.local()


def _compressor(level: int) -> zstandard.ZstdCompressor:
    cache = getattr(_codec, "compressors", None)
    if cache is None:
        cache = _codec.compressors = {}
    if level not in cache:
        cache[level] = zstandard.ZstdCompressor(level=level)
    return cache[level]


def _decompressor() -> zstandard.ZstdDecompressor:
    if not hasattr(_codec, "decompressor"):
        _codec.decompressor = zstandard.ZstdDecompressor()
    return _codec.decompressor


def encode_lines(frames: Sequence[HeadFrame]) -> bytes:
    """The uncompressed text of a segment holding ``frames`` (consecutive offsets)."""
    parts = []
    for f in frames:
        parts.append(f"{_txn_field(f.transaction_id)}\t{f.created_us}\t{f.size_bytes}\t"
                     f"{f.meta_json or ''}\t{f.payload_json}\n")
    return "".join(parts).encode()


_UNSAFE_TXN = re.compile(r'[\t\n\r]|^"')


def _txn_field(txn: str) -> str:
    return json.dumps(txn, ensure_ascii=False) if _UNSAFE_TXN.search(txn) else txn


def encode(frames: Sequence[HeadFrame], level: int) -> bytes:
    """zstd-compressed segment data for ``frames``."""
    return _compressor(level).compress(encode_lines(frames))


def decode(first_offset: int, data: bytes, codec: int = CODEC_ZSTD) -> DecodedSegment:
    if codec != CODEC_ZSTD:
        raise ValueError(f"unknown segment codec {codec}")
    return DecodedSegment.from_text(first_offset, _decompressor().decompress(data))


class DecodedSegment:
    """A decompressed segment: its text plus where each line starts; frames parsed on demand."""

    __slots__ = ("first_offset", "_text", "_starts")

    def __init__(self, first_offset: int, text: bytes, starts: list[int]) -> None:
        self.first_offset = first_offset
        self._text = text
        self._starts = starts  # line i spans _starts[i] .. _starts[i + 1] - 1 (the newline)

    @classmethod
    def from_text(cls, first_offset: int, text: bytes) -> DecodedSegment:
        starts = [0]
        find = text.find
        at = find(b"\n")
        while at != -1:
            starts.append(at + 1)
            at = find(b"\n", at + 1)
        return cls(first_offset, text, starts)

    @property
    def last_offset(self) -> int:
        return self.first_offset + len(self._starts) - 2

    @property
    def cost_bytes(self) -> int:
        """What keeping it in memory costs, roughly: the cache budget is counted in these."""
        return len(self._text) + _PER_LINE_OVERHEAD * len(self._starts) + _ENTRY_OVERHEAD

    def frames(self, from_offset: int, to_offset: int) -> list[Frame]:
        """Frames with ``from_offset <= offset < to_offset`` that this segment holds."""
        lo = max(from_offset, self.first_offset) - self.first_offset
        hi = min(to_offset, self.last_offset + 1) - self.first_offset
        out = []
        for i in range(lo, hi):
            line = self._text[self._starts[i]:self._starts[i + 1] - 1].decode()
            txn, created_us, size, meta, payload = line.split("\t", 4)
            if txn.startswith('"'):
                txn = json.loads(txn)
            out.append(Frame(
                self.first_offset + i, txn, json.loads(payload), int(size),
                _EPOCH + timedelta(microseconds=int(created_us)),
                json.loads(meta) if meta else None,
            ))
        return out


# -- the cut ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class SealPolicy:
    max_frames: int
    max_bytes: int  # raw (payload) bytes per segment
    min_age_ms: int  # younger frames stay in the head
    max_age_ms: int  # a head frame this old is sealed even if its segment is not full
    zstd_level: int = 3


def cut(frames: Sequence[HeadFrame], now_us: int, policy: SealPolicy) -> int:
    """How many of the head's first ``frames`` (consecutive, oldest first) to seal now: 0, or a
    prefix that is either full (``max_frames`` frames or ``max_bytes``) or old enough that its
    partition has been quiet for ``max_age``. Frames younger than ``min_age`` never go."""
    min_age_us = policy.min_age_ms * 1000
    n = size = 0
    for f in frames:
        if n == policy.max_frames or (n and size >= policy.max_bytes):
            break
        if now_us - f.created_us < min_age_us:
            break
        n += 1
        size += f.size_bytes
    if n == 0:
        return 0
    full = n == policy.max_frames or size >= policy.max_bytes
    stale = now_us - frames[0].created_us >= policy.max_age_ms * 1000
    return n if full or stale else 0


# -- the cache ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class CacheStatistics:
    budget_bytes: int
    bytes: int
    segments: int
    hits_total: int
    misses_total: int
    evictions_total: int


SegmentKey = tuple[Any, int]  # (partition_id, first_offset): a segment never changes


class SegmentCache:
    """Decoded segments, least recently used first out, within a budget of bytes.

    Used from the event loop's thread and the pool's worker threads, hence the lock. Segments
    are immutable, so an entry is never stale; one dropped by retention simply ages out.
    """

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self._entries: collections.OrderedDict[SegmentKey, DecodedSegment] = (
            collections.OrderedDict())
        self._bytes = 0
        self._lock = threading.Lock()
        self._hits = self._misses = self._evictions = 0

    def get(self, key: SegmentKey) -> DecodedSegment | None:
        with self._lock:
            segment = self._entries.get(key)
            if segment is None:
                self._misses += 1
                return None
            self._entries.move_to_end(key)
            self._hits += 1
            return segment

    def put(self, key: SegmentKey, segment: DecodedSegment) -> None:
        cost = segment.cost_bytes
        if cost > self.budget_bytes:
            return  # larger than the whole budget: decode it each time rather than thrash
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old.cost_bytes
            self._entries[key] = segment
            self._bytes += cost
            while self._bytes > self.budget_bytes:
                _, evicted = self._entries.popitem(last=False)
                self._bytes -= evicted.cost_bytes
                self._evictions += 1

    def get_or_load(self, key: SegmentKey, load: Callable[[], DecodedSegment]) -> DecodedSegment:
        segment = self.get(key)
        if segment is None:
            segment = load()
            self.put(key, segment)
        return segment

    def statistics(self) -> CacheStatistics:
        with self._lock:
            return CacheStatistics(self.budget_bytes, self._bytes, len(self._entries),
                                   self._hits, self._misses, self._evictions)

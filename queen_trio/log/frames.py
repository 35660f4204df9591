"""The one reader of frames: it knows whether an offset is in the head or in a sealed segment.

Pop, dead-lettering and every other read of frame contents comes here. The head is read first,
with the consumer group's retry counts joined, in one statement: a consumer that keeps up never
costs more than that. Only when the range starts below the head are segments looked up,
decoded through the broker's :class:`~.segments.SegmentCache`, and merged in front of it.

Reads run in READ COMMITTED, one snapshot per statement, while a sealer may move frames from
the head into a segment between two of them: a frame is then found in both places (the copies
are identical, the segment's is kept) and never in neither, because the head is read first.
Retention dropping a segment between two statements leaves a gap, and a read stops at a gap:
the result is always a contiguous run starting exactly at ``from_offset`` (possibly empty).
"""

from __future__ import annotations

import dataclasses
import uuid
from datetime import datetime
from typing import Any

from ..db import queries
from ..db.rows import DictConnection, one
from .segments import DecodedSegment, Frame, SegmentCache, decode

Q = queries.load("log")

# At most this many segments per read: a pop batch never needs more than a few, and a read may
# return fewer frames than asked (a pop batch is a maximum, not a promise).
_MAX_SEGMENTS_PER_READ = 32


@dataclasses.dataclass(frozen=True, slots=True)
class ReadFrame:
    """A frame plus what one consumer group knows about it."""

    frame: Frame
    retry_count: int = 0
    last_error: str | None = None
    matures_in_s: float = 0.0  # delayedProcessing: seconds until it may be popped (<= 0: now)

    @property
    def offset(self) -> int:
        return self.frame.offset


def read(
    raw: DictConnection, partition_id: uuid.UUID, from_offset: int, count: int, *,
    group: str | None = None, delay_s: int = 0, cache: SegmentCache | None = None,
) -> list[ReadFrame]:
    """Frames ``from_offset, from_offset + 1, …`` (at most ``count``), contiguous.

    With ``group``, each carries that group's retry count; ``delay_s`` is the queue's
    delayedProcessing, measured on PostgreSQL's clock.
    """
    if count <= 0:
        return []
    head = raw.execute(
        Q.read_head,
        {"partition_id": partition_id, "group": group, "from_offset": from_offset,
         "count": count, "delay_s": delay_s},
    ).fetchall()
    if head and head[0]["offset"] == from_offset:
        return [_head_frame(row) for row in head]

    where = one(raw.execute(
        Q.sealed_range,
        {"partition_id": partition_id, "group": group, "from_offset": from_offset,
         "to_offset": from_offset + count, "limit": _MAX_SEGMENTS_PER_READ},
    ))
    sealed = _read_sealed(raw, partition_id, from_offset, count, where["firsts"], cache)
    if not sealed:
        return []
    end = from_offset + len(sealed)
    now: datetime = where["now"]
    retries = {o: (n, e) for o, n, e in zip(where["retry_offsets"] or [],
                                            where["retry_counts"] or [],
                                            where["retry_errors"] or [], strict=True)}
    out = []
    for f in sealed:
        retry_count, last_error = retries.get(f.offset, (0, None))
        matures = (f.created_at - now).total_seconds() + delay_s if delay_s else 0.0
        out.append(ReadFrame(f, retry_count, last_error, matures))
    room = count - len(out)
    if head and head[0]["offset"] <= end and room > 0:
        out.extend(_head_frame(row) for row in head if end <= row["offset"] < end + room)
    return out


def read_one(raw: DictConnection, partition_id: uuid.UUID, offset: int,
             cache: SegmentCache | None = None) -> Frame | None:
    got = read(raw, partition_id, offset, 1, cache=cache)
    return got[0].frame if got else None


def _head_frame(row: dict[str, Any]) -> ReadFrame:
    return ReadFrame(
        Frame(row["offset"], row["transaction_id"], row["payload"], row["size_bytes"],
              row["created_at"], row["meta"]),
        row["retry_count"], row["last_error"], row["matures_in_s"],
    )


def _read_sealed(
    raw: DictConnection, partition_id: uuid.UUID, from_offset: int, count: int, firsts: list[int],
    cache: SegmentCache | None,
) -> list[Frame]:
    """Frames from_offset… out of the segments starting at ``firsts`` (in offset order)."""
    to_offset = from_offset + count
    decoded: dict[int, DecodedSegment] = {}
    missing = []
    for first in firsts:
        segment = cache.get((partition_id, first)) if cache is not None else None
        if segment is None:
            missing.append(first)
        else:
            decoded[first] = segment
    if missing:
        for row in raw.execute(Q.segment_data,
                               {"partition_id": partition_id, "firsts": missing}):
            segment = decode(row["first_offset"], row["data"], row["codec"])
            decoded[row["first_offset"]] = segment
            if cache is not None:
                cache.put((partition_id, row["first_offset"]), segment)

    out: list[Frame] = []
    expected = from_offset
    for first in firsts:
        segment = decoded.get(first)
        if segment is None or first > expected:
            break  # dropped by retention meanwhile, or a gap: the run ends here
        got = segment.frames(expected, to_offset)
        out.extend(got)
        expected += len(got)
        if expected >= to_offset:
            break
    return out

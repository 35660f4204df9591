"""The log's housekeeping service: seal the head into segments, apply retention.

Every ``QUEEN_HOUSEKEEPING_INTERVAL_MS`` one round runs:

* **sealing** — for each partition whose head holds something to seal (see
  :func:`~.segments.cut`), one transaction reads the head's oldest frames, compresses them into
  a segment, inserts it and deletes the head rows it replaces, and moves the tenant's stored
  bytes from raw to compressed. A partition's frames are never sealed by two brokers at once
  (a transaction-level advisory lock per partition; whoever does not get it skips).
* **retention** — for queues with ``retentionSeconds``, the oldest segments whose newest frame
  is older than that (and, with ``retainUntilConsumed``, that every consumer group has
  committed past) are dropped whole, after ``log_start`` has moved past them, in one
  transaction that also gives their bytes back to the tenant's storage. Once no segment is
  left before the head, the head's oldest run is cut by the same rule (:func:`cut_head`): a
  part-filled head is sealed only after ``QUEEN_SEGMENT_MAX_AGE_MS``, and its frames must not
  outlive their age limit meanwhile. A sealed segment is still never
  changed, only dropped whole. ``maxWaitTimeSeconds`` (Queen's eviction) is one more rule of
  the same retention (``queen.segment_droppable``).

The transactional steps are plain functions of a raw connection (tests call them directly);
:class:`Housekeeper` only schedules them.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import TypeVar

import trio

from ..config import Settings
from ..db import Database, queries
from ..db.rows import DictConnection, one
from ..db.transient import TRANSIENT_ERRORS, Shunned, every, survived
from ..metrics import BrokerMetrics
from .segments import CODEC_ZSTD, HeadFrame, SealPolicy, cut, encode
from .store import add_usage

Q = queries.load("segments")
log = logging.getLogger(__name__)
T = TypeVar("T")

LOCK_SPACE = 0x5147  # first key of the advisory locks that serialise one partition's housekeeping
_CANDIDATES_PER_ROUND = 200
_SEGMENTS_PER_PARTITION_PER_ROUND = 50  # a backlog is worked off over rounds, not in one burst
_HEAD_CUT_FRAMES = 1000  # head frames one cut looks at (one transaction)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# Sealing waits while a backlog of timers drains on this broker: fires at this rate or more,
# over at least _DRAIN_WINDOW_S (the sweeper reports a drain's fires every 0.2 s). A steady
# flow fires far fewer; a burst drains at tens of thousands a second.
_DRAIN_FIRES_PER_S = 5000
_DRAIN_WINDOW_S = 0.5
# ... for this long at most: then sealing runs as if no drain, until the drain has ended (a
# flow that never drops below the rate must not grow the head for ever).
_SEAL_DEFER_MAX_S = 60.0


def policy_from_settings(settings: Settings) -> SealPolicy:
    return SealPolicy(
        max_frames=settings.segment_max_frames,
        max_bytes=settings.segment_max_bytes,
        min_age_ms=settings.segment_min_age_ms,
        max_age_ms=settings.segment_max_age_ms,
        zstd_level=settings.segment_zstd_level,
    )


# -- sealing ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Sealed:
    partition_id: uuid.UUID
    first_offset: int
    last_offset: int
    raw_bytes: int
    stored_bytes: int

    @property
    def frames(self) -> int:
        return self.last_offset - self.first_offset + 1


def seal_candidates(raw: DictConnection, policy: SealPolicy,
                    limit: int = _CANDIDATES_PER_ROUND) -> list:
    rows = raw.execute(Q.seal_candidates, {
        "min_age_s": policy.min_age_ms / 1000, "max_age_s": policy.max_age_ms / 1000,
        "max_frames": policy.max_frames, "max_bytes": policy.max_bytes, "limit": limit,
    }).fetchall()
    return [r["partition_id"] for r in rows]


def _try_lock(raw: DictConnection, partition_id: uuid.UUID) -> bool:
    row = one(raw.execute(Q.try_lock_partition,
                          {"lock_space": LOCK_SPACE, "partition_id": partition_id}))
    return bool(row["locked"])


def seal_partition(raw: DictConnection, partition_id: uuid.UUID,
                   policy: SealPolicy) -> Sealed | None:
    """Seal the head's oldest frames of one partition into a segment, if the policy says so.

    Runs in the caller's transaction: the segment insert, the head delete and the usage change
    commit together, so a frame is always in exactly one of head and segment.
    """
    if not _try_lock(raw, partition_id):
        return None
    rows = raw.execute(Q.head_to_seal,
                       {"partition_id": partition_id, "max_frames": policy.max_frames}).fetchall()
    if not rows:
        return None
    if rows[0]["offset"] != rows[0]["head_start"]:
        # Never seal around a hole: a segment must follow the previous one (or log_start).
        log.error("partition %s: head starts at %s, expected %s; not sealing", partition_id,
                  rows[0]["offset"], rows[0]["head_start"])
        return None
    frames = [HeadFrame(r["offset"], r["transaction_id"], r["payload_json"], r["size_bytes"],
                        r["created_us"], r["meta_json"]) for r in rows]
    n = cut(frames, rows[0]["now_us"], policy)
    if n == 0:
        return None
    chosen = frames[:n]
    data = encode(chosen, policy.zstd_level)
    first, last = chosen[0].offset, chosen[-1].offset
    raw_bytes = sum(f.size_bytes for f in chosen)
    stored = one(raw.execute(Q.insert_segment, {
        "partition_id": partition_id, "first_offset": first, "last_offset": last,
        "tenant_id": rows[0]["tenant_id"], "frame_count": n, "raw_bytes": raw_bytes,
        "first_created_at": _instant(chosen[0].created_us),
        "last_created_at": _instant(chosen[-1].created_us),
        "transaction_ids": [f.transaction_id for f in chosen], "codec": CODEC_ZSTD,
        "data": data,
    }))["stored_bytes"]
    deleted = raw.execute(Q.delete_sealed_head, {"partition_id": partition_id,
                                                 "first_offset": first, "last_offset": last})
    if deleted.rowcount != n:  # cannot happen under the lock; refuse to half-seal if it does
        raise RuntimeError(f"partition {partition_id}: sealing {first}..{last} deleted "
                           f"{deleted.rowcount} head rows, expected {n}")
    add_usage(raw, rows[0]["tenant_id"], stored - raw_bytes)
    return Sealed(partition_id, first, last, raw_bytes, stored)


def _instant(us: int) -> datetime:
    return _EPOCH + timedelta(microseconds=us)


# -- retention --------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Dropped:
    partition_id: uuid.UUID
    segments: int
    frames: int
    stored_bytes: int
    log_start: int  # the new one


def retention_candidates(raw: DictConnection, limit: int = _CANDIDATES_PER_ROUND) -> list:
    return [r["partition_id"] for r in raw.execute(Q.retention_candidates, {"limit": limit})]


def apply_retention(raw: DictConnection, partition_id: uuid.UUID) -> Dropped | None:
    """Drop the partition's oldest segments that retention allows, advancing log_start."""
    if not _try_lock(raw, partition_id):
        return None
    rows = raw.execute(Q.droppable_segments, {"partition_id": partition_id}).fetchall()
    # Only a prefix starting at log_start: the log never gets a hole in the middle.
    expected = rows[0]["log_start"] if rows else 0
    segments = frames = 0
    for r in rows:
        if r["first_offset"] != expected:
            break
        expected = r["last_offset"] + 1
        segments += 1
        frames += r["frame_count"]
    if segments == 0:
        return None
    raw.execute(Q.advance_log_start, {"partition_id": partition_id, "log_start": expected})
    gone = raw.execute(Q.drop_segments,
                       {"partition_id": partition_id, "log_start": expected}).fetchall()
    stored = sum(r["stored_bytes"] for r in gone)
    add_usage(raw, rows[0]["tenant_id"], -stored)
    return Dropped(partition_id, len(gone), frames, stored, expected)


def head_cut_candidates(raw: DictConnection, limit: int = _CANDIDATES_PER_ROUND) -> list:
    return [r["partition_id"] for r in raw.execute(Q.head_cut_candidates, {"limit": limit})]


def cut_head(raw: DictConnection, partition_id: uuid.UUID,
             max_frames: int = _HEAD_CUT_FRAMES) -> Dropped | None:
    """Drop the head's oldest frames that retention allows, advancing log_start, when nothing
    is retained before the head (no segment left below it).

    The frames are plain rows, deleted in the transaction that moves log_start past them, so
    the log stays ``[log_start, next_offset)`` with no hole. The sealer takes the same
    advisory lock, so a frame is never cut and sealed at once.
    """
    if not _try_lock(raw, partition_id):
        return None
    rows = raw.execute(Q.droppable_head,
                       {"partition_id": partition_id, "max_frames": max_frames}).fetchall()
    if not rows or rows[0]["offset"] != rows[0]["log_start"]:
        return None  # sealed meanwhile: segment retention decides

    def droppable(i: int) -> bool:  # the run rows[0..i]
        return bool(one(raw.execute(Q.run_droppable, {
            "partition_id": partition_id, "offset": rows[i]["offset"],
            "newest": rows[i]["newest"], "queue_id": rows[0]["queue_id"]}))["droppable"])

    # The verdict holds for a prefix of runs (each condition only gets harder as the run grows:
    # its newest frame is younger, fewer groups have committed past its end), so the longest
    # droppable run is found in a few probes: usually one, all of it or none.
    if droppable(len(rows) - 1):
        frames = len(rows)
    elif not droppable(0):
        return None
    else:
        lo, hi = 0, len(rows) - 1  # rows[0..lo] droppable, rows[0..hi] not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if droppable(mid) else (lo, mid)
        frames = lo + 1
    size = sum(r["size_bytes"] for r in rows[:frames])
    log_start = rows[0]["log_start"] + frames
    raw.execute(Q.advance_log_start, {"partition_id": partition_id, "log_start": log_start})
    raw.execute(Q.drop_head, {"partition_id": partition_id, "log_start": log_start})
    add_usage(raw, rows[0]["tenant_id"], -size)
    return Dropped(partition_id, 0, frames, size, log_start)


# -- the service ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class RoundResult:
    sealed: list[Sealed]
    dropped: list[Dropped]


@dataclasses.dataclass(frozen=True, slots=True)
class HousekeepingStatistics:
    rounds_total: int
    segments_sealed_total: int
    segments_dropped_total: int
    failed_rounds_total: int


class Housekeeper:
    def __init__(
        self, db: Database, policy: SealPolicy, *, interval_ms: int = 1000,
        metrics: BrokerMetrics | None = None, seal_defer_max_s: float = _SEAL_DEFER_MAX_S,
    ) -> None:
        self._db = db
        self.policy = policy
        self._interval_s = interval_ms / 1000
        self._metrics = metrics
        self._defer_max_s = seal_defer_max_s
        self._fires_seen, self._fires_at = 0 if metrics is None else metrics.fires, 0.0
        self._draining = False
        self._deferring_since: float | None = None
        self._rounds = self._sealed = self._dropped = self._failed = 0
        self._alive = False
        # Partitions whose sealing or retention failed with something not transient (a row
        # it cannot process): left alone for a while, the others go on.
        self._shunned = Shunned(first_s=max(self._interval_s, 1.0))

    @classmethod
    def from_settings(cls, db: Database, settings: Settings,
                      metrics: BrokerMetrics | None = None) -> Housekeeper:
        return cls(db, policy_from_settings(settings),
                   interval_ms=settings.housekeeping_interval_ms, metrics=metrics)

    name = "housekeeping"

    @property
    def alive(self) -> bool:
        return self._alive

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self._alive = True
        task_status.started()
        try:
            # A round that met transient trouble is tried again at the next; one that failed
            # otherwise is logged, counted, and the rounds back off.
            await every(self._interval_s, self._round, what="a log housekeeping round",
                        service=self.name, logger=log,
                        count_error=None if self._metrics is None
                        else self._metrics.count_background_error)
        finally:
            self._alive = False

    async def _round(self) -> None:
        try:
            await self.run_once()
        except Exception:
            self._failed += 1
            raise

    def _survived(self, exc: BaseException, what: str) -> None:
        survived(log, "housekeeping", what, exc,
                 None if self._metrics is None else self._metrics.count_background_error)

    async def _each_partition(self, work: str, pid: uuid.UUID,
                              step: Callable[[], Awaitable[T]]) -> T | None:
        """``step()`` for one partition; None if it failed with something not transient (it
        is logged with the partition and counted, and the partition left alone for a while)."""
        if self._shunned.waiting(pid):
            return None
        try:
            result = await step()
        except TRANSIENT_ERRORS:
            raise
        except Exception as exc:
            delay = self._shunned.failed(pid)
            self._survived(exc, f"{work} partition {pid} (left alone for {delay:.0f} s)")
            return None
        self._shunned.succeeded(pid)
        return result

    async def run_once(self) -> RoundResult:
        """One round: seal what is due, then apply retention. A partition that cannot be
        worked on (an error that is not transient) is skipped; the others go on."""
        sealed = await self.seal_due()
        dropped = []
        for pid in await self._db.run_transaction(retention_candidates):
            d = await self._each_partition(
                "retention of", pid,
                functools.partial(self._db.run_transaction, apply_retention, pid))
            if d is not None:
                dropped.append(d)
        dropped.extend(await self.cut_heads())
        self._rounds += 1
        self._dropped += sum(d.segments for d in dropped)
        if self._metrics is not None:
            for d in dropped:
                self._metrics.segments_dropped.inc(d.segments)
                self._metrics.frames_dropped.inc(d.frames)
        return RoundResult(sealed, dropped)

    async def cut_heads(self) -> list[Dropped]:
        """Retention of the unsealed heads: every droppable head frame of each candidate,
        a bounded transaction at a time."""
        dropped: list[Dropped] = []
        for pid in await self._db.run_transaction(head_cut_candidates):
            for _ in range(_SEGMENTS_PER_PARTITION_PER_ROUND):
                d = await self._each_partition(
                    "retention of the head of", pid,
                    functools.partial(self._db.run_transaction, cut_head, pid))
                if d is None:
                    break
                dropped.append(d)
                if d.frames < _HEAD_CUT_FRAMES:
                    break
        return dropped

    def seal_waits(self) -> bool:
        """Should sealing wait? Yes while a backlog of timers drains on this broker (fires
        at _DRAIN_FIRES_PER_S or more since the last look, at least _DRAIN_WINDOW_S ago), for
        ``seal_defer_max_s`` at most. A drain fires a batch per statement as fast as
        PostgreSQL commits them; a seal reads, compresses, writes and deletes a segment's
        frames: on a small machine each slows the other, and the frames being sealed are a
        minute old already (QUEEN_SEGMENT_MIN_AGE_MS), where a drain's fires are late."""
        if self._metrics is None:
            return False
        now = time.monotonic()
        if now - self._fires_at >= _DRAIN_WINDOW_S:
            fires = self._metrics.fires
            rate = (fires - self._fires_seen) / (now - self._fires_at)
            self._fires_seen, self._fires_at = fires, now
            self._draining = rate >= _DRAIN_FIRES_PER_S
            if not self._draining:
                self._deferring_since = None
        if not self._draining:
            return False
        if self._deferring_since is None:
            self._deferring_since = now
        return now - self._deferring_since < self._defer_max_s

    async def seal_due(self) -> list[Sealed]:
        sealed: list[Sealed] = []
        if self.seal_waits():
            self._deferred()
            return sealed
        for pid in await self._db.run_transaction(seal_candidates, self.policy):
            if self.seal_waits():  # a drain began meanwhile: the rest waits for it
                self._deferred()
                break
            await self._each_partition("sealing of", pid,
                                       functools.partial(self._seal, pid, sealed))
        return sealed

    def _deferred(self) -> None:
        if self._metrics is not None:
            self._metrics.seal_deferrals.inc()

    async def _seal(self, pid: uuid.UUID, sealed: list[Sealed]) -> None:
        for _ in range(_SEGMENTS_PER_PARTITION_PER_ROUND):
            if self.seal_waits():  # (counted by seal_due)
                break
            started = time.perf_counter()
            # Compresses a whole segment: CPU work kept off the event loop.
            one = await self._db.run_transaction_in_thread(seal_partition, pid, self.policy)
            if one is None:
                break
            sealed.append(one)
            self._sealed += 1
            if self._metrics is not None:
                self._metrics.seal_seconds.observe(time.perf_counter() - started)
                self._metrics.segments_sealed.inc()
                self._metrics.frames_sealed.inc(one.frames)

    def statistics(self) -> HousekeepingStatistics:
        return HousekeepingStatistics(self._rounds, self._sealed, self._dropped, self._failed)

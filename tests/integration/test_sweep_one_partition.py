"""A sweeper cycle's statement under a steady flow (issue 32): a few timers bound for one
partition that exists are fired by queen.sweep_take itself, not through the set-based
queen.append_timer_frames, and a stream's settlement carried by the sweep is applied by
queen.pop_head_take (written in the next lease's UPDATE), not through queen.settle_pop_head
(schema/functions/timers.sql, log.sql). Both must write and answer exactly what the general
paths do: dense offsets in the order of expiry, one createdAt never before a deliverAt, the
frame's meta, the bytes' move, the queue's NOTIFY, and the fallback to claims when a payload
cannot become a frame."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

import psycopg

from queen_trio.db.rows import DictConnection
from queen_trio.log import store as log_store
from queen_trio.log.rules import QUEUE_MODE_GROUP, Ack, PopRequest
from queen_trio.timers import store

from .test_timer_races import connect, default_tenant, sql, timer


def _frames(url: str, queue: str) -> list[dict[str, Any]]:
    return sql(url, """
        SELECT p.name AS partition, f."offset", f.payload, f.size_bytes, f.created_at,
               f.transaction_id, f.meta
        FROM queen.frames f
        JOIN queen.partitions p USING (partition_id)
        JOIN queen.queues q USING (queue_id)
        WHERE q.name = %s
        ORDER BY p.name, f."offset"
    """, (queue,))


def _calls(conn: DictConnection, action: Any) -> tuple[Any, dict[str, int]]:
    """What ``action`` answers when run in one transaction, and how many times each of queen's
    PL/pgSQL functions was called in it (the backend's function statistics not yet reported,
    before and after: they are reported between transactions only)."""
    counts = ("SELECT funcname, calls FROM pg_stat_xact_user_functions "
              "WHERE schemaname = 'queen'")
    with conn.transaction():
        conn.execute("SET LOCAL track_functions = 'pl'")
        before = {r["funcname"]: r["calls"] for r in conn.execute(counts).fetchall()}
        answer = action()
        after = {r["funcname"]: r["calls"] for r in conn.execute(counts).fetchall()}
    return answer, {f: n - before.get(f, 0) for f, n in after.items() if n > before.get(f, 0)}


def _sweep(conn: DictConnection) -> store.SweepResult:
    return store.sweep(conn, uuid.uuid4(), "test", 100, 60_000, max_payload=1 << 20)


def test_a_small_fire_into_one_partition_appends_its_frames_itself(database_url: str) -> None:
    with connect(database_url, autocommit=True) as conn:
        tenant = default_tenant(conn)
        store.schedule_many(conn, tenant, [timer("one", "first", -50, {"n": 0})],
                            notify_within_ms=0)
        # The partition's first frame: created through the set-based append.
        _, calls = _calls(conn, lambda: _sweep(conn))
        assert calls.get("append_timer_frames") == 1
        # Ties in deliverAt (one bundle, one delay) go by key; the bundle's order is not it.
        outcomes = store.schedule_many(conn, tenant, [
            timer("one", "d", -100, {"n": 4}), timer("one", "b", -100, {"n": 2}),
            timer("one", "c", -100, "three"), timer("one", "a", -200, [1]),
            timer("one", "e", -20, None)], notify_within_ms=0)
        ids = {o.key: o.message_id for o in outcomes}
        listener = psycopg.connect(database_url, autocommit=True)
        listener.execute("LISTEN queen_log")
        swept, calls = _calls(conn, lambda: _sweep(conn))
        told = [n.payload for n in listener.notifies(timeout=2, stop_after=1)]
        listener.close()
    assert "append_timer_frames" not in calls
    assert told == [f"{tenant}:one"]
    assert swept.rows == []
    frames = _frames(database_url, "one")
    assert [f["offset"] for f in frames] == [0, 1, 2, 3, 4, 5]
    fired = frames[1:]
    assert [f["meta"]["timer"]["key"] for f in fired] == ["a", "b", "c", "d", "e"]
    assert [f["payload"] for f in fired] == [[1], {"n": 2}, "three", {"n": 4}, None]
    assert [f["meta"]["messageId"] for f in fired] == [str(ids[k]) for k in "abcde"]
    pending = {o.key: o for o in outcomes}
    for f in fired:
        due = pending[f["meta"]["timer"]["key"]].deliver_at
        assert f["meta"]["timer"]["deliverAt"] == due.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        assert f["created_at"] >= due
    assert len({f["created_at"] for f in fired}) == 1  # one instant for the batch
    # The answer: one fired row per timer, in the order of expiry, with its deliverAt.
    assert [at for _, at in swept.fired] == [pending[k].deliver_at for k in "abcde"]
    assert {t for t, _ in swept.fired} == {tenant}
    (part,) = sql(database_url, "SELECT next_offset FROM queen.partitions WHERE name = 'Default'")
    assert part["next_offset"] == 6
    # Bytes moved from the timer rows to the log: the tenant's total is the frames'.
    (usage,) = sql(database_url, "SELECT coalesce(sum(bytes), 0)::bigint AS b "
                                 "FROM queen.usage_deltas")
    assert usage["b"] == sum(f["size_bytes"] for f in frames)
    assert sql(database_url, "SELECT count(*) AS n FROM queen.timers") == [{"n": 0}]


def test_fires_into_several_partitions_or_a_large_batch_take_the_set_based_append(
    database_url: str,
) -> None:
    with connect(database_url, autocommit=True) as conn:
        tenant = default_tenant(conn)
        store.schedule_many(conn, tenant, [
            dataclasses.replace(timer("two", f"k{i}", -100 + i, i), partition=f"p{i % 2}")
            for i in range(6)], notify_within_ms=0)
        _, calls = _calls(conn, lambda: _sweep(conn))
        assert calls.get("append_timer_frames") == 1
        store.schedule_many(conn, tenant, [timer("many", f"k{i:03}", -100, i)
                                           for i in range(80)], notify_within_ms=0)
        _sweep(conn)  # (the partition's first frames)
        store.schedule_many(conn, tenant, [timer("many", f"m{i:03}", -100, i)
                                           for i in range(80)], notify_within_ms=0)
        _, calls = _calls(conn, lambda: _sweep(conn))
        assert calls.get("append_timer_frames") == 1
    frames = _frames(database_url, "two")
    assert [(f["partition"], f["offset"], f["payload"]) for f in frames] == [
        ("p0", 0, 0), ("p0", 1, 2), ("p0", 2, 4), ("p1", 0, 1), ("p1", 1, 3), ("p1", 2, 5)]
    frames = _frames(database_url, "many")
    assert [f["offset"] for f in frames] == list(range(160))
    assert [f["meta"]["timer"]["key"] for f in frames] == (
        [f"k{i:03}" for i in range(80)] + [f"m{i:03}" for i in range(80)])


def test_a_payload_that_cannot_become_a_frame_falls_back_to_claims_in_one_partition(
    database_url: str,
) -> None:
    """The direct fire into an existing partition is undone as a whole, as the set-based
    append's is: nothing is appended and every due row is claimed, for the broker to fire
    one by one (the row at fault spends an attempt there)."""
    with connect(database_url, autocommit=True) as conn:
        tenant = default_tenant(conn)
        store.schedule_many(conn, tenant, [timer("bad", "zero", -500, 0)], notify_within_ms=0)
        assert len(_sweep(conn).fired) == 1  # the partition exists from here on
        for broken in (b'{"a": NaN}', b'"\\u0000"', b"\xff\x00"):
            store.schedule_many(conn, tenant, [timer("bad", k, d, k) for k, d in
                                               [("ok1", -300), ("broken", -200), ("ok2", -100)]],
                                notify_within_ms=0)
            conn.execute("UPDATE queen.timers SET payload = %s WHERE timer_key = 'broken'",
                         (broken,))
            token = uuid.uuid4()
            swept = store.sweep(conn, token, "test", 100, 60_000, max_payload=1 << 20)
            assert swept.fired == [], broken
            assert [c.key for c in swept.rows] == ["ok1", "broken", "ok2"]
            assert [c.payload for c in swept.rows][1] == broken
            assert sql(database_url, "SELECT count(*) AS n FROM queen.timers "
                                     "WHERE claim_token = %s", (token,)) == [{"n": 3}]
            conn.execute("DELETE FROM queen.timers")
            assert len(_frames(database_url, "bad")) == 1
            (part,) = sql(database_url, "SELECT next_offset FROM queen.partitions p "
                                        "JOIN queen.queues q USING (queue_id) "
                                        "WHERE q.name = 'bad'")
            assert part["next_offset"] == 1
        # And the next good fire takes the next offset.
        store.schedule_many(conn, tenant, [timer("bad", "one", -10, 1)], notify_within_ms=0)
        assert len(_sweep(conn).fired) == 1
    assert [f["offset"] for f in _frames(database_url, "bad")] == [0, 1]


def _popped_after_a_sweep(conn: Any, queue: str, n: int) -> tuple[int, PopRequest,
                                                                    store.NextDue, Any]:
    """``n`` timers of ``queue`` fired by a sweep and popped as one batch (the stream's last
    batch, still to settle): (tenant, the pop request, the queue's fire lock, the batch)."""
    tenant = default_tenant(conn)
    req = PopRequest(queue=queue, partition=None, group=QUEUE_MODE_GROUP, batch=10,
                     wait=False, timeout_ms=0, auto_ack=False)
    lock = store.NextDue(tenant, queue, "Default", 0.0)
    store.schedule_many(conn, tenant, [timer(queue, f"a{i}", -100 + i, i) for i in range(n)],
                        notify_within_ms=0)
    _sweep(conn)
    with conn.transaction():
        first = log_store.pop(conn, tenant, req).batch
    assert first is not None and [m.offset for m in first.messages] == list(range(n))
    return tenant, req, lock, first


def test_a_settlement_carried_by_the_sweep_is_applied_before_its_pop(database_url: str) -> None:
    """queen.sweep_settle_and_pop: the stream's last batch settled, then the next pop, in the
    fire's transaction, both by queen.pop_head_take: the settlement written in the new lease's
    UPDATE of the same cursor; a settlement that no longer matches the cursor is not applied
    and the pop runs all the same."""
    with connect(database_url, autocommit=True) as conn:
        tenant, req, lock, first = _popped_after_a_sweep(conn, "carry", 3)
        store.schedule_many(conn, tenant, [timer("carry", f"b{i}", -100 + i, 10 + i)
                                           for i in range(2)], notify_within_ms=0)

        def carried(batch: log_store.PopBatch) -> store.SweepResult:
            return store.sweep(conn, uuid.uuid4(), "test", 100, 60_000, max_payload=1 << 20,
                               fire_lock=lock, pop=req, settle=batch, drained=True)

        updates = ("SELECT n_tup_upd FROM pg_stat_xact_user_tables "
                   "WHERE schemaname = 'queen' AND relname = 'cursors'")

        def carried_counting_updates() -> tuple[store.SweepResult, int]:
            before = conn.execute(updates).fetchone()["n_tup_upd"]
            swept = carried(first)
            return swept, conn.execute(updates).fetchone()["n_tup_upd"] - before

        (swept, cursor_updates), calls = _calls(conn, carried_counting_updates)
        assert "settle_pop_head" not in calls and "settle_head" not in calls
        assert "pop_head" not in calls and calls.get("pop_head_take") == 1
        # The settlement and the next lease are one new version of the cursor, not two.
        assert cursor_updates == 1
        assert swept.settled is True and len(swept.fired) == 2
        assert swept.popped is not None and swept.popped.batch is not None
        second = swept.popped.batch
        assert [m.offset for m in second.messages] == [3, 4]
        assert [m.payload for m in second.messages] == [10, 11]
        assert swept.drained is True  # nothing else poppable for the group
        (cursor,) = sql(database_url, "SELECT committed, leased_to FROM queen.cursors")
        assert (cursor["committed"], cursor["leased_to"]) == (2, 4)
        # The first batch again: already settled, so not applied; the pop finds the second
        # batch leased and nothing else.
        swept = carried(first)
        assert swept.settled is False
        assert swept.popped is None or swept.popped.batch is None
        (cursor,) = sql(database_url, "SELECT committed, leased_to FROM queen.cursors")
        assert (cursor["committed"], cursor["leased_to"]) == (2, 4)
        # The second settles it; nothing is left to pop.
        swept = carried(second)
        assert swept.settled is True
        assert swept.popped is None or swept.popped.batch is None
        (cursor,) = sql(database_url, "SELECT committed, lease_expires_at FROM queen.cursors")
        assert (cursor["committed"], cursor["lease_expires_at"]) == (4, None)


def test_a_carried_settlement_of_a_redelivered_batch_drops_its_retry_history(
    database_url: str,
) -> None:
    """A batch handed out again after a failed ack has a retry history (queen.retries). Settled
    whole by the sweep that pops the same partition's next frames (the settlement written in
    the new lease's UPDATE), that history goes, as queen.settle_head drops it; the new frames
    have none, so the pop takes them."""
    with connect(database_url, autocommit=True) as conn:
        tenant, req, lock, first = _popped_after_a_sweep(conn, "redo", 2)
        with conn.transaction():
            log_store.ack(conn, tenant, [
                Ack(i, m.transaction_id, first.partition_id, "failed", QUEUE_MODE_GROUP,
                    first.lease_id, "try again") for i, m in enumerate(first.messages)])
        with conn.transaction():
            again = log_store.pop(conn, tenant, req).batch
        assert again is not None and [m.offset for m in again.messages] == [0, 1]
        assert sql(database_url, "SELECT count(*) AS n FROM queen.retries")[0]["n"] > 0
        store.schedule_many(conn, tenant, [timer("redo", f"b{i}", -100 + i, 10 + i)
                                           for i in range(2)], notify_within_ms=0)
        swept = store.sweep(conn, uuid.uuid4(), "test", 100, 60_000, max_payload=1 << 20,
                            fire_lock=lock, pop=req, settle=again, drained=True)
        assert swept.settled is True
        assert swept.popped is not None and swept.popped.batch is not None
        assert [m.offset for m in swept.popped.batch.messages] == [2, 3]
        assert sql(database_url, "SELECT count(*) AS n FROM queen.retries")[0]["n"] == 0
        (cursor,) = sql(database_url, "SELECT committed, leased_to FROM queen.cursors")
        assert (cursor["committed"], cursor["leased_to"]) == (1, 3)

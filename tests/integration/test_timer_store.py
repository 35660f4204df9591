"""The timer store's one-statement paths (schema/functions/timers.sql), at the store level
against a real PostgreSQL: schedule_many deciding a whole bundle in one statement, and the sweep
statement firing plain-JSON timers itself while the broker fires compressed ones, in one
order."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import random
import threading
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from queen_trio.db.analyze import analyze_grown_tables
from queen_trio.log import store as log_store
from queen_trio.timers import rules as timer_rules
from queen_trio.timers import store

from ..helpers import explained
from .test_timer_races import LOCK_GUARD, claim, connect, default_tenant, sql, timer

COMPRESSIBLE = {"events": [{"type": "booking.held", "bookingId": i} for i in range(20)]}


def usage(url: str) -> int:
    (row,) = sql(url, "SELECT coalesce(sum(bytes), 0)::bigint AS b FROM queen.usage_deltas")
    return row["b"]


def test_the_same_timer_twice_in_one_bundle_is_scheduled_then_rescheduled(
    database_url: str,
) -> None:
    with connect(database_url, autocommit=True) as conn, conn.transaction():
        tenant = default_tenant(conn)
        outcomes = store.schedule_many(conn, tenant, [
            timer("q", "a", 60_000, {"v": 1}), timer("q", "b", 60_000, "other"),
            timer("q", "a", 120_000, {"v": 22}),
        ], notify_within_ms=0)
    assert [(o.key, o.status) for o in outcomes] == [
        ("a", "scheduled"), ("b", "scheduled"), ("a", "rescheduled")]
    rows = sql(database_url, "SELECT timer_key, convert_from(payload, 'UTF8') AS p, txn "
                             "FROM queen.timers ORDER BY timer_key")
    assert [(r["timer_key"], r["p"]) for r in rows] == [("a", '{"v":22}'), ("b", '"other"')]
    assert rows[0]["txn"] == outcomes[2].txn
    first_due, last_due = outcomes[0].deliver_at, outcomes[2].deliver_at
    assert first_due is not None and last_due is not None and last_due > first_due
    # Stored bytes: the final payloads only (the first "a" was replaced).
    assert usage(database_url) == len('{"v":22}') + len('"other"')


def test_one_bundle_mixes_new_pending_claimed_and_locked_timers(database_url: str) -> None:
    with connect(database_url, autocommit=True) as a, connect(database_url, autocommit=True) as b:
        tenant = default_tenant(a)
        with a.transaction():
            first = store.schedule_many(a, tenant, [
                timer("q", "pending", 60_000, 1), timer("q", "claimed", -1_000, 2),
                timer("q", "locked", 60_000, 3)], notify_within_ms=0)
        token = uuid.uuid4()
        assert [c.key for c in claim(a, token, lease_ms=60_000).rows] == ["claimed"]
        a.execute("BEGIN")  # another transaction holds the row lock of "locked"
        a.execute("SELECT 1 FROM queen.timers WHERE timer_key = 'locked' FOR UPDATE")
        try:
            b.execute(f"SET lock_timeout = '{LOCK_GUARD}'")
            with b.transaction():
                outcomes = store.schedule_many(b, tenant, [
                    timer("q", "locked", 5_000, "x"), timer("q", "new", 5_000, "y"),
                    timer("q", "claimed", 5_000, "z"), timer("q", "pending", 5_000, "w"),
                ], notify_within_ms=0)
        finally:
            a.execute("ROLLBACK")
    txn = {o.key: o.txn for o in first}
    assert [(o.key, o.status, o.ok) for o in outcomes] == [
        ("locked", "too_late", False), ("new", "scheduled", True),
        ("claimed", "too_late", False), ("pending", "rescheduled", True)]
    # too_late answers carry the txn of the timer that stands.
    assert (outcomes[0].txn, outcomes[2].txn) == (txn["locked"], txn["claimed"])
    rows = {r["timer_key"]: r for r in sql(
        database_url, "SELECT timer_key, convert_from(payload, 'UTF8') AS p, claim_token "
                      "FROM queen.timers")}
    assert {k: r["p"] for k, r in rows.items()} == {
        "pending": '"w"', "claimed": "2", "locked": "3", "new": '"y"'}
    assert rows["claimed"]["claim_token"] == token


def test_concurrent_bundles_over_the_same_keys_decide_every_timer_once(
    database_url: str,
) -> None:
    """Four connections schedule the same 300 keys at once, in different orders: nothing
    fails or blocks for long, exactly one 'scheduled' per key, and each other answer is a
    reschedule or, for a row another writer held locked at that moment, too_late (a schedule
    never waits on a row lock: the holder may be a sweeper firing it)."""
    keys = [f"k{i}" for i in range(300)]

    def bundle(seed: int) -> list[store.Outcome]:
        order = keys[:]
        random.Random(seed).shuffle(order)
        with connect(database_url, autocommit=True) as conn:
            conn.execute(f"SET lock_timeout = '{LOCK_GUARD}'")
            tenant = default_tenant(conn)
            with conn.transaction():
                return store.schedule_many(
                    conn, tenant, [timer("race", k, 60_000, seed) for k in order],
                    notify_within_ms=0)

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(bundle, range(4)))
    scheduled: dict[str, int] = {}
    for outcomes in results:
        assert {o.status for o in outcomes} <= {"scheduled", "rescheduled", "too_late"}
        for o in outcomes:
            scheduled[o.key] = scheduled.get(o.key, 0) + (o.status == "scheduled")
    assert set(scheduled) == set(keys)
    assert set(scheduled.values()) == {1}
    (row,) = sql(database_url, "SELECT count(*) AS n, count(DISTINCT payload) AS seeds "
                               "FROM queen.timers")
    assert row["n"] == 300 and row["seeds"] >= 1
    assert sql(database_url, "SELECT count(*) AS n FROM queen.timers") == [{"n": 300}]


def _frames(url: str) -> list[dict[str, Any]]:
    return sql(url, "SELECT \"offset\", payload, meta->'timer'->>'key' AS key, "
                    "transaction_id FROM queen.frames ORDER BY \"offset\"")


def test_plain_and_compressed_timers_of_one_batch_enter_the_log_in_due_order(
    database_url: str,
) -> None:
    plan = [("first", -400, "a"), ("second", -300, COMPRESSIBLE), ("third", -200, "c"),
            ("fourth", -100, COMPRESSIBLE), ("fifth", -50, "e")]
    with connect(database_url, autocommit=True) as conn:
        tenant = default_tenant(conn)
        with conn.transaction():
            outcomes = store.schedule_many(
                conn, tenant, [timer("mixed", k, d, p) for k, d, p in reversed(plan)],
                notify_within_ms=0)
        stored = {r["timer_key"]: r["payload_zstd"] for r in sql(
            database_url, "SELECT timer_key, payload_zstd FROM queen.timers")}
        assert stored == {"first": False, "second": True, "third": False, "fourth": True,
                          "fifth": False}
        token = uuid.uuid4()
        swept = store.sweep(conn, token, "test", 100, 60_000, max_payload=1 << 20)
        # PostgreSQL fired the leading plain timer; from the first compressed one on, the
        # rows are the broker's to fire, in due order.
        assert len(swept.fired) == 1
        assert [c.key for c in swept.rows] == ["second", "third", "fourth", "fifth"]
        with conn.transaction():
            fired = store.fire(conn, token, swept.rows, ceilings={}, max_attempts=5,
                               backoff_ms=1000)
        assert [c.key for c in fired.fired] == ["second", "third", "fourth", "fifth"]
    frames = _frames(database_url)
    assert [f["key"] for f in frames] == ["first", "second", "third", "fourth", "fifth"]
    assert [f["offset"] for f in frames] == [0, 1, 2, 3, 4]
    assert [f["payload"] for f in frames] == [p for _, _, p in plan]
    txns = {o.key: o.txn for o in outcomes}
    assert [f["transaction_id"] for f in frames] == [txns[k] for k, _, _ in plan]
    assert sql(database_url, "SELECT count(*) AS n FROM queen.timers") == [{"n": 0}]
    # Bytes moved from the timer rows to the log: the tenant's total is the frames'.
    (total,) = sql(database_url, "SELECT sum(size_bytes)::bigint AS b FROM queen.frames")
    assert usage(database_url) == total["b"]


def test_the_sweep_fires_plain_timers_in_its_own_statement(database_url: str) -> None:
    with connect(database_url, autocommit=True) as conn:
        tenant = default_tenant(conn)
        with conn.transaction():
            store.schedule_many(conn, tenant, [timer("plain", f"p{i}", -10, {"i": i})
                                               for i in range(50)], notify_within_ms=0)
            store.schedule_many(conn, tenant, [timer("plain", "later", 60_000, 0)],
                                notify_within_ms=0)
        swept = store.sweep(conn, uuid.uuid4(), "test", 20, 60_000, max_payload=1 << 20)
        assert (len(swept.fired), swept.rows) == (20, [])  # a full batch: more to drain
        later = sql(database_url, "SELECT extract(epoch FROM visible_at)::float8 AS at "
                                  "FROM queen.timers WHERE timer_key = 'later'")[0]["at"]
        assert swept.next_due is not None and swept.next_due < later  # the rest is due now
        while swept.fired:
            swept = store.sweep(conn, uuid.uuid4(), "test", 20, 60_000, max_payload=1 << 20)
        assert swept.next_due == later
    frames = _frames(database_url)
    assert sorted(f["payload"]["i"] for f in frames) == list(range(50))
    assert [f["offset"] for f in frames] == list(range(50))


def test_the_sweep_answers_where_the_earliest_timer_left_lands(database_url: str) -> None:
    """The sweeper announces a timer to its queue's parked pops from the last sweep's answer,
    with no look-up of its own: the clock row names the earliest pending timer's queue and
    partition."""
    with connect(database_url, autocommit=True) as conn:
        tenant = default_tenant(conn)
        with conn.transaction():
            store.schedule_many(conn, tenant, [
                timer("now", "n", -10, 1),
                dataclasses.replace(timer("soon", "s", 60_000, 2), partition="p7"),
                timer("later", "l", 120_000, 3)], notify_within_ms=0)
        soon = sql(database_url, "SELECT extract(epoch FROM visible_at)::float8 AS at "
                                 "FROM queen.timers WHERE timer_key = 's'")[0]["at"]
        swept = store.sweep(conn, uuid.uuid4(), "test", 20, 60_000, max_payload=1 << 20)
        assert len(swept.fired) == 1
        assert swept.next_due == soon
        assert swept.upcoming == store.NextDue(tenant, "soon", "p7", soon)
        sql(database_url, "DELETE FROM queen.timers")
        swept = store.sweep(conn, uuid.uuid4(), "test", 20, 60_000, max_payload=1 << 20)
        assert (swept.next_due, swept.upcoming) == (None, None)


def test_schedules_and_cancels_of_one_timer_at_once_wait_for_each_other(
    database_url: str,
) -> None:
    """Schema 009: only a fire answers too_late. Concurrent schedules and cancels of one name
    queue behind each other and each gets the answer it would get alone, in some order."""
    workers = 12
    barrier = threading.Barrier(workers)

    def one(i: int) -> list[str]:
        with connect(database_url, autocommit=True) as conn:
            tenant = default_tenant(conn)
            barrier.wait()
            with conn.transaction():
                if i % 3 == 0:
                    return [store.cancel(conn, tenant, "race", "one", None).status]
                if i % 3 == 1:
                    return [store.schedule(conn, tenant, timer("race", "one", 60_000, i),
                                           notify_within_ms=0).status]
                return [o.status for o in store.schedule_many(
                    conn, tenant, [timer("race", "one", 60_000, i), timer("race", f"o{i}",
                                   60_000, i), timer("race", "one", 60_000, -i)],
                    notify_within_ms=0)]

    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        answers = [a for batch in pool.map(one, range(workers)) for a in batch]
    assert "too_late" not in answers, answers
    assert set(answers) <= {"scheduled", "rescheduled", "cancelled", "absent"}
    assert answers.count("scheduled") >= 4  # the four o{i} at least


def test_a_sweep_sent_early_waits_for_its_instant_and_takes_what_is_due_then(
    database_url: str,
) -> None:
    """not_before (queen.wait_until): the statement waits in the backend, so a timer due after the
    statement was sent, but by not_before, is fired by it, and none is fired early."""
    with connect(database_url, autocommit=True) as conn:
        tenant = default_tenant(conn)
        with conn.transaction():
            store.schedule_many(conn, tenant, [timer("early", "soon", 60, "s"),
                                               timer("early", "later", 400, "l")],
                                notify_within_ms=0)
        soon = sql(database_url, "SELECT extract(epoch FROM deliver_at)::float8 AS at "
                                 "FROM queen.timers WHERE timer_key = 'soon'")[0]["at"]
        # Sent well before "soon" is due, asking to start 5 ms after it.
        swept = store.sweep(conn, uuid.uuid4(), "test", 20, 60_000, max_payload=1 << 20,
                            not_before=soon + 0.005)
        assert len(swept.fired) == 1 and swept.rows == []
        assert swept.db_now >= soon + 0.005
        # A not_before in the past, or none, starts at once and finds "later" not yet due.
        for not_before in (soon - 10.0, None):
            again = store.sweep(conn, uuid.uuid4(), "test", 20, 60_000, max_payload=1 << 20,
                                not_before=not_before)
            assert again.fired == [] and again.db_now < soon + 0.4
        # A far-off not_before is cut short: a sweep never holds its connection for long.
        far = store.sweep(conn, uuid.uuid4(), "test", 20, 60_000, max_payload=1 << 20,
                          not_before=again.db_now + 3600)
        assert far.fired == [] and far.db_now < again.db_now + 1.0
    (frame,) = sql(database_url, "SELECT extract(epoch FROM created_at)::float8 AS created, "
                                 "meta->'timer'->>'key' AS key FROM queen.frames")
    assert frame["key"] == "soon" and frame["created"] >= soon + 0.005  # never early


def test_a_planned_sweep_stages_its_fire_ahead_and_commits_it_at_the_instant(
    database_url: str,
) -> None:
    """Schema 014: the work is done a lead before the instant (here 90 ms instead of 1, so each
    phase lasts long enough to watch) with the row locked; a cancel then answers too_late, and
    the frame becomes visible only once the instant has passed."""
    sql(database_url, "CREATE OR REPLACE FUNCTION queen.sweep_lead_s() RETURNS float8 "
                      "LANGUAGE sql IMMUTABLE AS $$ SELECT 0.09::float8 $$")
    with connect(database_url, autocommit=True) as conn, \
            connect(database_url, autocommit=True) as other:
        tenant = default_tenant(conn)
        with conn.transaction():
            store.schedule_many(conn, tenant, [timer("staged", "t", 400, "x")],
                                notify_within_ms=0)
        (row,) = sql(database_url, "SELECT extract(epoch FROM deliver_at)::float8 AS at, "
                                   "extract(epoch FROM clock_timestamp())::float8 AS now "
                                   "FROM queen.timers")
        due = row["at"]
        # Sent 95 ms ahead (a first wait of 5 ms: the backend waits at most 100 ms at a time).
        time.sleep(max(0.0, due - 0.095 - row["now"]))
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            swept = pool.submit(store.sweep, conn, uuid.uuid4(), "test", 20, 60_000,
                                max_payload=1 << 20, not_before=due)
            # Staged: the row is deleted and the frame written (uncommitted), well before the
            # instant. The probe reads the sweep's locks in pg_locks and takes none itself: a
            # probe that locked the row (FOR UPDATE SKIP LOCKED) made the sweep's own SKIP LOCKED
            # pass the row by whenever the two met, and the sweep then fired nothing.
            locked_at = None
            while locked_at is None and not swept.done():
                (probe,) = other.execute(
                    "SELECT extract(epoch FROM clock_timestamp())::float8 AS now, "
                    "EXISTS (SELECT 1 FROM pg_locks WHERE pid = %s AND granted "
                    "AND mode = 'RowExclusiveLock' "
                    "AND relation = 'queen.timers'::regclass) AS locked",
                    (conn.info.backend_pid,)).fetchall()
                if probe["locked"]:
                    locked_at = probe["now"]
            # Before the instant (90 ms ahead on a quiet machine; a probe at load 8 has been
            # seen to notice it only 28 ms ahead, so the bound is the instant itself).
            assert locked_at is not None and locked_at < due
            # The timer is being fired: a cancel answers too_late and leaves it to fire.
            with other.transaction():
                answer = store.cancel(other, tenant, "staged", "t", None)
            assert answer.status == "too_late"
            # Nothing is visible before the instant; the frame appears after it.
            visible_at = None
            while visible_at is None:
                (probe,) = other.execute(
                    "SELECT extract(epoch FROM clock_timestamp())::float8 AS now, "
                    "EXISTS (SELECT 1 FROM queen.frames) AS visible").fetchall()
                if probe["visible"]:
                    visible_at = probe["now"]
                elif swept.done():
                    break
            result = swept.result()
    assert len(result.fired) == 1 and result.db_now >= due
    assert visible_at is None or visible_at >= due
    (frame,) = sql(database_url, "SELECT extract(epoch FROM created_at)::float8 AS created, "
                                 "extract(epoch FROM (meta->'timer'->>'deliverAt')::timestamptz)"
                                 "::float8 AS deliver FROM queen.frames")
    # Written 90 ms early, stamped no earlier than its deliverAt.
    assert frame["created"] >= frame["deliver"] == pytest.approx(due, abs=1e-6)
    assert sql(database_url, "SELECT count(*) AS n FROM queen.timers")[0]["n"] == 0


def test_a_claim_is_handed_back_by_its_token_without_reading_every_pending_timer(
    database_url: str,
) -> None:
    """Schema 015: release_claim (after transient trouble during a fire) finds the claimed rows
    through an index of the claimed alone, however many timers are pending."""
    with connect(database_url, autocommit=True) as conn:
        tenant = default_tenant(conn)
        with conn.transaction():
            store.schedule_many(conn, tenant, [timer("far", f"k{i}", 3_600_000, i)
                                               for i in range(5_000)], notify_within_ms=0)
            store.schedule_many(conn, tenant, [timer("due", "a", -100, 1),
                                               timer("due", "b", -100, 2)], notify_within_ms=0)
        conn.execute("ANALYZE queen.timers")
        token = uuid.uuid4()
        assert sorted(c.key for c in claim(conn, token, lease_ms=60_000).rows) == ["a", "b"]
        plan = "\n".join(r["QUERY PLAN"] for r in conn.execute(
            "EXPLAIN " + store.Q.release_claim, {"token": token}).fetchall())
        assert "timers_claim_token" in plan and "Seq Scan" not in plan, plan
        # Handed back: due again at once, for the next claim.
        assert store.release(conn, token) == 2
        again = claim(conn, uuid.uuid4(), lease_ms=60_000)
        assert sorted(c.key for c in again.rows) == ["a", "b"]


def test_a_malformed_plain_payload_falls_back_to_the_broker_for_the_whole_batch(
    database_url: str,
) -> None:
    with connect(database_url, autocommit=True) as conn:
        tenant = default_tenant(conn)
        with conn.transaction():
            store.schedule_many(conn, tenant, [timer("bad", k, d, k) for k, d in
                                               [("ok1", -300), ("broken", -200), ("ok2", -100)]],
                                notify_within_ms=0)
        conn.execute("UPDATE queen.timers SET payload = '\\xff00'::bytea "
                     "WHERE timer_key = 'broken'")
        token = uuid.uuid4()
        swept = store.sweep(conn, token, "test", 100, 60_000, max_payload=1 << 20)
        assert swept.fired == []  # the direct fire was undone as a whole
        assert [c.key for c in swept.rows] == ["ok1", "broken", "ok2"]
        with conn.transaction():
            fired = store.fire(conn, token, swept.rows, ceilings={}, max_attempts=5,
                               backoff_ms=1000)
    assert [c.key for c in fired.fired] == ["ok1", "ok2"]
    assert [(c.key, "cannot be decoded" in e) for c, e in fired.failed] == [("broken", True)]
    assert [f["key"] for f in _frames(database_url)] == ["ok1", "ok2"]
    (row,) = sql(database_url, "SELECT attempts, claim_token FROM queen.timers")
    assert (row["attempts"], row["claim_token"]) == (1, None)


def test_small_payloads_are_stored_as_text_and_large_ones_compressed(database_url: str) -> None:
    with connect(database_url, autocommit=True) as conn, conn.transaction():
        tenant = default_tenant(conn)
        store.schedule_many(conn, tenant, [timer("codec", "small", 60_000, {"a": 1}),
                                           timer("codec", "big", 60_000, COMPRESSIBLE)],
                            notify_within_ms=0)
    rows = {r["timer_key"]: r for r in sql(
        database_url, "SELECT timer_key, payload, payload_zstd, payload_bytes "
                      "FROM queen.timers")}
    assert bytes(rows["small"]["payload"]) == b'{"a":1}' and not rows["small"]["payload_zstd"]
    big = rows["big"]
    assert big["payload_zstd"] and len(big["payload"]) < big["payload_bytes"] // 4
    assert timer_rules.unpack(bytes(big["payload"]), True) == COMPRESSIBLE


def test_schedule_many_of_nothing_writes_nothing(database_url: str) -> None:
    with connect(database_url, autocommit=True) as conn, conn.transaction():
        assert store.schedule_many(conn, default_tenant(conn), [], notify_within_ms=0) == []
    assert sql(database_url, "SELECT count(*) AS n FROM queen.usage_deltas") == [{"n": 0}]


def test_deleting_a_queue_or_a_tenant_still_deletes_its_frames(database_url: str) -> None:
    """frames has no per-row foreign key to partitions (schema/001_baseline.sql); a statement
    trigger keeps the cascade (schema/functions/log.sql)."""
    with connect(database_url, autocommit=True) as conn:
        tenant = default_tenant(conn)
        other = conn.execute("INSERT INTO queen.tenants (name) VALUES ('other') "
                             "RETURNING tenant_id").fetchone()["tenant_id"]
        for owner in (tenant, other):
            with conn.transaction():
                store.schedule_many(conn, owner, [timer(q, f"{q}{i}", -10, i)
                                                  for q in ("gone", "kept") for i in range(3)],
                                    notify_within_ms=0)
        while store.sweep(conn, uuid.uuid4(), "test", 100, 60_000, max_payload=1 << 20).fired:
            pass
        frames = "SELECT count(*) AS n FROM queen.frames"
        assert conn.execute(frames).fetchone()["n"] == 12
        with conn.transaction():
            assert log_store.delete_queue(conn, tenant, "gone")
        assert conn.execute(frames).fetchone()["n"] == 9
        conn.execute("DELETE FROM queen.tenants WHERE tenant_id = %s", (other,))
        remaining = conn.execute("SELECT DISTINCT tenant_id FROM queen.frames").fetchall()
        assert conn.execute(frames).fetchone()["n"] == 3
        assert remaining == [{"tenant_id": tenant}]


def test_a_dead_lettered_timer_moves_its_bytes_to_the_dead_letter(database_url: str) -> None:
    with connect(database_url, autocommit=True) as conn:
        tenant = default_tenant(conn)
        with conn.transaction():
            store.schedule_many(conn, tenant, [timer("dead", "big", -10, "x" * 300)],
                                notify_within_ms=0)
        token = uuid.uuid4()
        rows = claim(conn, token, lease_ms=60_000).rows
        with conn.transaction():  # a ceiling below the payload: a permanent failure
            fired = store.fire(conn, token, rows, ceilings={tenant: 100}, max_attempts=1,
                               backoff_ms=1000)
    assert [c.key for c, _ in fired.dead_lettered] == ["big"]
    (dead,) = sql(database_url, "SELECT size_bytes FROM queen.dead_letters")
    assert dead["size_bytes"] == len('"' + "x" * 300 + '"')
    assert usage(database_url) == dead["size_bytes"]  # nothing else is stored


def test_fired_timers_are_not_walked_again_by_later_sweeps(database_url: str) -> None:
    """Schema 011: a fired timer's row is deleted so that the next scan of the due-time index
    marks its entry dead for good. Otherwise every sweep (and the next-due look-up) walks the
    entries of every timer fired since the last vacuum, visiting each one's heap tuple again:
    1 ms per sweep grew to 9 ms after 27,000 fires at 1,000 timers/s."""
    fired = 3000
    with connect(database_url, autocommit=True) as conn:
        # (As a broker's commits are: the test server's default is asynchronous, and a tuple
        # whose commit is not yet flushed cannot be hinted dead.)
        conn.execute("SET synchronous_commit = on")
        tenant = default_tenant(conn)
        with conn.transaction():
            store.schedule_many(conn, tenant, [timer("walk", f"w{i}", -10, i)
                                               for i in range(fired)], notify_within_ms=0)
        done = 0
        while done < fired:
            swept = store.sweep(conn, uuid.uuid4(), "test", 50, 60_000, max_payload=1 << 20)
            assert swept.fired and not swept.rows
            done += len(swept.fired)
        conn.execute("ANALYZE queen.timers")  # (statistics only: no vacuum)
        blocks = []
        for _ in range(2):  # the first scan may still mark the last batch's entries
            plan = conn.execute(
                "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "
                "SELECT ctid FROM queen.timers WHERE visible_at <= now() "
                "ORDER BY visible_at LIMIT 50 FOR UPDATE SKIP LOCKED").fetchone()
            top = next(iter(plan.values()))[0]["Plan"]
            blocks.append(top["Shared Hit Blocks"] + top.get("Shared Read Blocks", 0))
        index_pages = conn.execute("SELECT pg_relation_size('queen.timers_visible') / 8192 "
                                   "AS n").fetchone()
    # The index's own pages, not also the heap pages of the fired rows.
    assert blocks[1] <= index_pages["n"], (blocks, index_pages)


def test_a_schedule_probes_existing_timers_by_index_even_when_the_table_looked_tiny(
    database_url: str,
) -> None:
    """Schema 012: with statistics saying the table is one page, the planner's cheapest probe
    is a sequential scan, and a plan cached then reads the whole table for every timer of every
    later bundle once it has grown (1.3-2.3 s per 500-timer bundle at 30,000 pending)."""
    with connect(database_url, autocommit=True) as conn:
        tenant = default_tenant(conn)
        store.schedule_many(conn, tenant, [timer("tiny", "seed", 60_000, 0)],
                            notify_within_ms=0)
        conn.execute("ANALYZE queen.timers")
        outcomes: list[store.Outcome] = []
        plans = _explained(conn, lambda: outcomes.extend(store.schedule_many(
            conn, tenant, [timer("tiny", "seed", 60_000, 1), timer("tiny", "new", 60_000, 2)],
            notify_within_ms=0)))
    assert [o.status for o in outcomes] == ["rescheduled", "scheduled"]
    probes = [p for p in plans if "FROM queen.timers x" in p]
    assert probes, plans
    assert not any("Seq Scan on timers" in p for p in probes), probes


def _grow_then_explain(conn: Any, tenant: int, exercise: Any, *, analyze: bool) -> list[str]:
    """Run ``exercise`` a dozen times on one-row tables (past psycopg's prepare threshold and
    PostgreSQL's five custom plans, so a kept plan is a generic one made small), grow
    queen.timers to 3,000 rows, optionally let the broker's analyzer run, and answer the plans
    of one more ``exercise`` (auto_explain, nested statements too)."""
    for round_no in range(12):
        exercise(round_no)
    with conn.transaction():
        store.schedule_many(conn, tenant, [timer("tiny", f"k{i}", 60_000, i)
                                           for i in range(3000)], notify_within_ms=0)
        conn.execute("SELECT pg_stat_force_next_flush()")
    if analyze:
        deadline = time.monotonic() + 10
        while "queen.timers" not in {r["table_name"] for r in analyze_grown_tables(conn)}:
            assert time.monotonic() < deadline, "queen.timers was never found grown"
            time.sleep(0.1)
    return _explained(conn, lambda: exercise(12))


def _explained(conn: Any, action: Any) -> list[str]:
    """The plans of every statement ``action`` runs on ``conn``, nested ones included."""
    return explained(conn, action)[1]


def _scans(plans: list[str]) -> list[str]:
    return [p for p in plans if "Seq Scan on timers" in p]


def _tiny_table(conn: Any) -> int:
    conn.execute("ALTER TABLE queen.timers SET (autovacuum_enabled = false)")
    tenant = default_tenant(conn)
    store.schedule_many(conn, tenant, [timer("tiny", "seed", 60_000, 0)], notify_within_ms=0)
    conn.execute("ANALYZE queen.timers")
    return tenant


def test_a_cancel_or_peek_finds_its_timer_by_index_however_the_table_has_grown(
    database_url: str,
) -> None:
    """store._planned_now: while queen.timers holds one row, the cheapest plan for finding a
    timer is a sequential scan, and a statement prepared then would go on reading the whole
    table for every cancel, peek, listing and next-due look-up once it has grown (14 ms a
    cancel at 100,000 timers, against 0.3-0.6). Planned at each use, they walk the index the
    moment the table is large, with no ANALYZE in between."""
    with connect(database_url, autocommit=True) as conn:
        tenant = _tiny_table(conn)

        def exercise(round_no: int) -> None:
            with conn.transaction():
                assert store.cancel(conn, tenant, "tiny", "nobody", None).status == "absent"
            assert store.peek(conn, tenant, "tiny", "seed") is not None
            assert store.list_timers(conn, tenant, "tiny", "", 10)
            assert store.next_due(conn) is not None

        plans = _grow_then_explain(conn, tenant, exercise, analyze=False)
    # cancel (queen.cancel_timers), peek, list and next-due: one plan each at least
    assert len([p for p in plans if " on timers" in p]) >= 4, plans
    assert not _scans(plans), _scans(plans)


@pytest.mark.parametrize("analyzer", [False, True], ids=["without-analyzer", "with-analyzer"])
def test_the_fire_walks_indexes_once_the_analyzer_has_seen_the_tables_grow(
    database_url: str, analyzer: bool,
) -> None:
    """The sweep, the claimed fire and the append are PL/pgSQL, whose cached plans only an
    ANALYZE replaces: made on a one-row queen.timers they read it whole (the due-row pick,
    the delete, the earliest-due look-up, the per-key probes of a claimed fire), and go on
    doing so after it has grown. The broker's analyzer (queen.analyze_grown_tables) finds it
    grown and analyzes it; the next fire's plans walk indexes. (Without it, the same run
    shows the scans: the trap is real.)"""
    with connect(database_url, autocommit=True) as conn:
        tenant = _tiny_table(conn)
        token = uuid.uuid4()
        stranger = store.Claimed(tenant, "tiny", "never-claimed", "Default", "t", b"1", False,
                                 1, datetime.now(UTC), 0, datetime.now(UTC))

        def exercise(round_no: int) -> None:
            with conn.transaction():  # a claimed fire whose row is not ours: nothing appended
                assert store.fire(conn, token, [stranger], ceilings={}, max_attempts=5,
                                  backoff_ms=1000).lost == 1
            store.schedule_many(conn, tenant, [timer("tiny", f"due{round_no}", -1, round_no)],
                                notify_within_ms=0)
            swept = store.sweep(conn, uuid.uuid4(), "test", 10, 60_000, max_payload=1 << 20)
            assert len(swept.fired) == 1  # fired by PostgreSQL, through append_timer_frames

        plans = _grow_then_explain(conn, tenant, exercise, analyze=analyzer)
    assert len([p for p in plans if " on timers" in p]) >= 4, plans
    if analyzer:
        assert not _scans(plans), _scans(plans)
    else:
        assert _scans(plans)


def test_deleting_a_tenant_deletes_its_timers_and_a_missing_tenant_schedules_none(
        database_url: str) -> None:
    """timers has no per-row foreign key to tenants (schema/012_schedule_timers_json.sql): a
    statement trigger keeps the cascade, and the schedule checks the tenant once."""
    with connect(database_url, autocommit=True) as conn:
        tenant = default_tenant(conn)
        other = conn.execute("INSERT INTO queen.tenants (name) VALUES ('leaving') "
                             "RETURNING tenant_id").fetchone()["tenant_id"]
        for owner in (tenant, other):
            with conn.transaction():
                store.schedule_many(conn, owner, [timer("q", f"k{i}", 60_000, i)
                                                  for i in range(3)], notify_within_ms=0)
        conn.execute("DELETE FROM queen.tenants WHERE tenant_id = %s", (other,))
        left = conn.execute("SELECT tenant_id, count(*) AS n FROM queen.timers "
                            "GROUP BY tenant_id").fetchall()
        assert left == [{"tenant_id": tenant, "n": 3}]
        with pytest.raises(psycopg.errors.ForeignKeyViolation), conn.transaction():
            store.schedule_many(conn, other, [timer("q", "late", 60_000, 1)],
                                notify_within_ms=0)
        assert conn.execute("SELECT count(*) AS n FROM queen.timers").fetchone()["n"] == 3


# -- one timer alone (queen.schedule_timer, queen.cancel_timer) decides as in a bundle ----------


def _decide(conn: Any, tenant: int, path: str, op: timer_rules.Schedule | timer_rules.Cancel
            ) -> store.Outcome:
    """``op`` alone (the single-timer functions) or in a bundle beside another timer's op (the
    set-based statements)."""
    with conn.transaction():
        if path == "alone":
            if isinstance(op, timer_rules.Cancel):
                return store.cancel(conn, tenant, op.queue, op.key, op.txn)
            return store.schedule(conn, tenant, op, notify_within_ms=0)
        if isinstance(op, timer_rules.Cancel):
            return store.cancel_many(conn, tenant, [
                op, timer_rules.Cancel(op.queue, f"{op.key}-nobody", None)])[0]
        return store.schedule_many(conn, tenant, [op, timer(op.queue, f"{op.key}-beside",
                                                            60_000, 0)], notify_within_ms=0)[0]


def _row(url: str, key: str) -> dict[str, Any] | None:
    rows = sql(url, "SELECT txn, message_id, payload, payload_zstd, payload_bytes, attempts, "
                    "deliver_at, claim_token FROM queen.timers WHERE timer_key = %s", (key,))
    return rows[0] if rows else None


@pytest.mark.parametrize("path", ["alone", "bundle"])
def test_one_timer_alone_is_decided_and_stored_as_in_a_bundle(database_url: str,
                                                              path: str) -> None:
    with connect(database_url, autocommit=True) as conn:
        tenant = default_tenant(conn)
        before = datetime.now(UTC)
        first = _decide(conn, tenant, path, timer("fresh-q", "k", 60_000, {"v": 1}))
        row = _row(database_url, "k")
        assert first.status == "scheduled" and row is not None
        # (the id as its text, as the answer writes it)
        assert (first.txn, first.message_id, first.deliver_at) == (
            row["txn"], str(row["message_id"]), row["deliver_at"])
        assert first.message_id is not None and uuid.UUID(first.message_id).version == 7
        assert (bytes(row["payload"]), row["payload_zstd"], row["payload_bytes"]) == (
            b'{"v":1}', False, 7)
        # The queue of a new timer is created with it; the bytes are counted.
        assert sql(database_url, "SELECT count(*) AS n FROM queen.queues "
                                 "WHERE name = 'fresh-q'") == [{"n": 1}]
        beside = 0 if path == "alone" else 1  # (the bundle's other timer: a payload of 0)
        assert usage(database_url) == 7 + beside

        # A reschedule: a new timer under the old name, its budget whole again, its payload
        # compressed when that pays.
        sql(database_url, "UPDATE queen.timers SET attempts = 3 WHERE timer_key = 'k'")
        again = _decide(conn, tenant, path, timer("fresh-q", "k", 5_000, COMPRESSIBLE))
        row = _row(database_url, "k")
        assert again.status == "rescheduled" and row is not None
        assert again.message_id not in (None, first.message_id)
        assert (row["attempts"], row["payload_zstd"], str(row["message_id"])) == (
            0, True, again.message_id)
        assert timer_rules.unpack(bytes(row["payload"]), True) == COMPRESSIBLE
        assert again.deliver_at is not None and again.deliver_at > before
        assert usage(database_url) == row["payload_bytes"] + beside

        # Claimed by a sweeper: too_late for both, carrying the txn of the timer that stands.
        sql(database_url, "UPDATE queen.timers SET visible_at = now() - interval '1 s' "
                          "WHERE timer_key = 'k'")
        token = uuid.uuid4()
        assert [c.key for c in claim(conn, token, lease_ms=60_000).rows] == ["k"]
        late = _decide(conn, tenant, path, timer("fresh-q", "k", 5_000, 2))
        assert (late.status, late.txn) == ("too_late", again.txn)
        gone = _decide(conn, tenant, path, timer_rules.Cancel("fresh-q", "k", "mine"))
        assert (gone.status, gone.txn) == ("too_late", again.txn)
        assert store.release(conn, token) == 1

        cancelled = _decide(conn, tenant, path, timer_rules.Cancel("fresh-q", "k", "mine"))
        assert (cancelled.status, cancelled.txn) == ("cancelled", again.txn)
        assert _row(database_url, "k") is None
        assert usage(database_url) == beside
        absent = _decide(conn, tenant, path, timer_rules.Cancel("fresh-q", "k", "mine"))
        assert (absent.status, absent.ok, absent.txn) == ("absent", False, "mine")


def test_a_timer_alone_due_soon_wakes_the_sweepers_and_a_far_one_does_not(
        database_url: str) -> None:
    with connect(database_url, autocommit=True) as listener, \
            connect(database_url, autocommit=True) as conn:
        listener.execute(f"LISTEN {store.NOTIFY_CHANNEL}")
        tenant = default_tenant(conn)
        with conn.transaction():
            far = store.schedule(conn, tenant, timer("wake", "far", 60_000, 1),
                                 notify_within_ms=1000)
            soon = store.schedule(conn, tenant, timer("wake", "soon", 200, 1),
                                  notify_within_ms=1000)
        assert (far.status, soon.status) == ("scheduled", "scheduled")
        assert soon.deliver_at is not None
        payloads = [n.payload for n in listener.notifies(timeout=2, stop_after=1)]
    # The due instant in epoch microseconds (rounded up), for the soon one only.
    assert payloads == [str(int(-(-soon.deliver_at.timestamp() * 1_000_000 // 1)))]


def test_the_message_ids_of_a_bundle_are_distinct_version_7_uuids_of_their_instant(
        database_url: str) -> None:
    with connect(database_url, autocommit=True) as conn:
        tenant = default_tenant(conn)
        ids = []
        for call in range(2):
            start_ms = time.time_ns() // 1_000_000 - 5
            with conn.transaction():
                outcomes = store.schedule_many(
                    conn, tenant, [timer("ids", f"{call}-{i}", 60_000, i) for i in range(300)],
                    notify_within_ms=0)
            end_ms = time.time_ns() // 1_000_000 + 5
            for o in outcomes:
                assert o.message_id is not None
                # (the id as its text, as the answer writes it: PostgreSQL's spelling)
                assert o.message_id == str(uuid.UUID(o.message_id))
                mid = uuid.UUID(o.message_id)
                assert (mid.version, mid.variant) == (7, uuid.RFC_4122)
                assert start_ms <= int.from_bytes(mid.bytes[:6]) <= end_ms
            ids += [uuid.UUID(o.message_id) for o in outcomes if o.message_id is not None]
    assert len(set(ids)) == 600
    # Each call draws its own random bits: its ids share no tail with the other call's.
    tails = [{i.bytes[8:14] for i in ids[:300]}, {i.bytes[8:14] for i in ids[300:]}]
    assert not tails[0] & tails[1]


@pytest.mark.parametrize("txn", [None, "tab\there", 'quote"and\\backslash'])
def test_a_bundle_stores_names_and_payloads_array_input_would_read_otherwise(
        database_url: str, txn: str | None) -> None:
    """A bundle travels as array texts (store.timer_arrays): names and payloads holding what
    an array literal treats specially (quotes, backslashes, braces, commas, the word NULL,
    spaces, JSON escapes, a txn with a control character) are stored as they were given."""
    names = ['quo"te', "back\\slash", "{brace}", "a,b", "NULL", "null", " spaced ", "é/ü:日本"]
    payloads: list[Any] = [{"s": 'he said "hi"\n\\'}, "NULL", None, "{}", [",", "}"],
                           {"u": "\u2028é"}, 1.5, COMPRESSIBLE]
    schedules = [timer_rules.Schedule(queue="arr q", key=k, delay_ms=60_000, payload=p,
                                      partition="p{1}", txn=None if txn is None else f"{txn}{i}")
                 for i, (k, p) in enumerate(zip(names, payloads, strict=True))]
    with connect(database_url, autocommit=True) as conn, conn.transaction():
        outcomes = store.schedule_many(conn, default_tenant(conn), schedules,
                                       notify_within_ms=0)
    assert [(o.key, o.status) for o in outcomes] == [(k, "scheduled") for k in names]
    rows = {r["timer_key"]: r for r in sql(
        database_url, "SELECT timer_key, partition, txn, payload, payload_zstd, payload_bytes "
                      "FROM queen.timers WHERE queue = 'arr q'")}
    assert set(rows) == set(names)
    for s, o in zip(schedules, outcomes, strict=True):
        row = rows[s.key]
        assert row["partition"] == "p{1}" and row["txn"] == o.txn
        assert s.txn is None or row["txn"] == s.txn
        text = timer_rules.unpack_text(bytes(row["payload"]), row["payload_zstd"])
        assert text == log_store.to_json(s.payload) and row["payload_bytes"] == len(text.encode())
    assert rows["{brace}"]["payload_zstd"] is False and rows["é/ü:日本"]["payload_zstd"] is True

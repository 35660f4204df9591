"""The sweep's floor (schema/functions/timers.sql, queen.advance_sweep_floor): every sweep starts
at a floor below which nothing is pending, so a snapshot held open does not make each sweep step
through every timer fired since. What it must never do is leave a timer below it: a timer
scheduled (or rescheduled) into the past after the floor moved, or committed by a transaction
that wrote it before a sweep raised the floor, still fires once, at once."""

from __future__ import annotations

import json
import uuid
from datetime import UTC
from typing import Any

import psycopg

from queen_trio.timers import store

from .test_timer_races import connect, default_tenant, sql, timer

SWEEP = dict(broker="test", batch=500, lease_ms=60_000, max_payload=1 << 20)


def sweep(conn: psycopg.Connection[dict[str, Any]]) -> store.SweepResult:
    return store.sweep(conn, uuid.uuid4(), **SWEEP)  # type: ignore[arg-type]


def frames_of(url: str, key: str) -> int:
    (row,) = sql(url, "SELECT count(*) AS n FROM queen.frames WHERE meta->'timer'->>'key' = %s",
                 (key,))
    return row["n"]


def pending(url: str) -> set[str]:
    return {r["timer_key"] for r in sql(url, "SELECT timer_key FROM queen.timers")}


def raise_floor(conn: psycopg.Connection[dict[str, Any]]) -> None:
    """A far timer pending and a sweep: the floor is now the clock of that sweep."""
    tenant = default_tenant(conn)
    store.schedule(conn, tenant, timer("floor-far", uuid.uuid4().hex[:6], 3_600_000, 1),
                   notify_within_ms=0)
    sweep(conn)
    (row,) = conn.execute("SELECT queen.sweep_floor() > now() - interval '5 s' AS up").fetchall()
    assert row["up"], "the floor did not move up to the sweep's clock"


def test_a_timer_scheduled_into_the_past_after_the_floor_moved_fires_at_once(
    database_url: str,
) -> None:
    with connect(database_url, autocommit=True) as conn:
        raise_floor(conn)
        tenant = default_tenant(conn)
        out = store.schedule(conn, tenant, timer("floor", "an-hour-ago", -3_600_000, 2),
                             notify_within_ms=0)
        assert out.status == "scheduled"
        fired = sweep(conn)
    assert len(fired.fired) == 1
    assert frames_of(database_url, "an-hour-ago") == 1
    assert "an-hour-ago" not in pending(database_url)
    # The frame says the instant asked for, an hour ago, not the clock of the write.
    (row,) = sql(database_url, "SELECT meta->'timer'->>'deliverAt' AS at FROM queen.frames "
                               "WHERE meta->'timer'->>'key' = 'an-hour-ago'")
    assert out.deliver_at is not None
    assert row["at"] == out.deliver_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def test_a_far_timer_rescheduled_into_the_past_after_the_floor_moved_fires_once(
    database_url: str,
) -> None:
    with connect(database_url, autocommit=True) as conn:
        tenant = default_tenant(conn)
        store.schedule(conn, tenant, timer("floor", "moved", 86_400_000, "v1"),
                       notify_within_ms=0)
        raise_floor(conn)
        out = store.schedule(conn, tenant, timer("floor", "moved", -60_000, "v2"),
                             notify_within_ms=0)
        assert out.status == "rescheduled"
        sweep(conn)
        sweep(conn)
    assert frames_of(database_url, "moved") == 1
    (row,) = sql(database_url, "SELECT payload FROM queen.frames "
                               "WHERE meta->'timer'->>'key' = 'moved'")
    assert row["payload"] == "v2"
    assert "moved" not in pending(database_url)


def test_a_timer_written_before_a_sweep_and_committed_after_it_fires(database_url: str) -> None:
    """The writer's transaction is in progress in the sweep's snapshot: the floor stays at its
    start, and the timer, due before the sweep's clock, is found by the next sweep."""
    with connect(database_url, autocommit=True) as sweeper, connect(database_url) as writer:
        tenant = default_tenant(writer)
        store.schedule(writer, tenant, timer("floor", "slow-commit", 0, 3), notify_within_ms=0)
        raise_floor(sweeper)  # sees nothing of the writer's timer
        assert "slow-commit" not in pending(database_url)
        writer.commit()
        sweep(sweeper)
    assert frames_of(database_url, "slow-commit") == 1
    assert "slow-commit" not in pending(database_url)


def test_an_idle_sweep_under_a_held_snapshot_steps_over_no_fired_timers(
    database_url: str,
) -> None:
    """25,000 timers fired while a REPEATABLE READ snapshot is held: their index entries cannot
    be cleaned, and a sweep starting at the beginning of timers_visible visited them all
    (about 500 shared buffers, and growing with every fire). From the floor: a handful."""
    with connect(database_url, autocommit=True) as conn, connect(database_url) as held:
        held.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        held.execute("SELECT count(*) FROM queen.tenants").fetchone()
        tenant = default_tenant(conn)
        for r in range(50):
            with conn.transaction():
                store.schedule_many(conn, tenant, [timer("churn", f"c{r}-{i}", 0, i)
                                                   for i in range(500)], notify_within_ms=0)
            assert len(sweep(conn).fired) == 500
        assert not pending(database_url)
        (dead,) = conn.execute("SELECT count(*) AS n FROM queen.frames").fetchall()
        assert dead["n"] == 25_000
        plan = conn.execute(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT * FROM queen.sweep_timers("
            "%s, 'test', 500, 60000, 1048576, true, NULL)", (uuid.uuid4(),)).fetchone()
        top = json.loads(plan["QUERY PLAN"])[0]["Plan"] if isinstance(
            plan["QUERY PLAN"], str) else plan["QUERY PLAN"][0]["Plan"]
        buffers = top["Shared Hit Blocks"] + top["Shared Read Blocks"]
        held.rollback()
    assert buffers < 100, f"an idle sweep touched {buffers} shared buffers"


WRITE_DUE = """
INSERT INTO queen.timers (tenant_id, queue, timer_key, partition, txn, payload, payload_zstd,
                          payload_bytes, deliver_at, visible_at)
SELECT tenant_id, %(queue)s, %(prefix)s || lpad(g::text, 6, '0'), 'Default', 't' || g,
       convert_to('{"i":' || g || '}', 'UTF8'), false, 7, d.at, d.at
FROM queen.tenants, generate_series(%(lo)s::integer, %(hi)s::integer) AS g,
     LATERAL (SELECT now() + %(s)s * interval '1 s'
                     + greatest(g - %(spread_from)s::integer, 0) * interval '10 microseconds'
                     AS at) d
WHERE name = 'default'"""


def idle_sweep_buffers(url: str) -> int:
    """Shared buffers of one sweep with nothing due, on a new connection (so that its statements
    are planned afresh, as on a broker's new connection)."""
    with connect(url, autocommit=True) as conn:
        plan = conn.execute(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT * FROM queen.sweep_timers("
            "%s, 'test', 500, 60000, 1048576, true, NULL)", (uuid.uuid4(),)).fetchone()
    top = plan["QUERY PLAN"][0]["Plan"]
    return int(top["Shared Hit Blocks"] + top["Shared Read Blocks"])


def test_a_burst_at_one_instant_fires_once_and_no_sweep_grows_with_what_it_fired(
    database_url: str,
) -> None:
    """Timers pending far ahead and analyzed (the table's statistics say nothing is due soon),
    then a burst of 20,000 due within 0.1 s, half of them at one instant, drained by sweeps of
    500: each fired once, in order. Until the next vacuum, the drained timers' index entries
    stay at the low end of timers_visible. A sweep planned its scans from the floor with the
    bounds as constants, and the planner looked up the index's actual lowest value past every
    one of those entries, in each: an idle sweep touched about 460 more shared buffers after
    these 20,000 (at 10⁷ pending, a 10⁶ burst drained slower as it went, issue 31). Given as
    parameters of the plan, the bounds are not looked up: the sweep costs the same after."""
    with connect(database_url, autocommit=True) as conn:
        conn.execute("ALTER TABLE queen.timers SET (autovacuum_enabled = off)")
        conn.execute(WRITE_DUE, {"queue": "far", "prefix": "far-", "lo": 1, "hi": 5000,
                                 "s": 30 * 86400, "spread_from": 0})
        conn.execute("ANALYZE queen.timers")
        before = idle_sweep_buffers(database_url)
        # The first half due at one instant, the rest 10 µs apart after it (a burst written
        # for longer than its lead: queen.timers_visible_above_floor raises each to its clock).
        conn.execute(WRITE_DUE, {"queue": "burst", "prefix": "b-", "lo": 1, "hi": 20_000,
                                 "s": 2, "spread_from": 10_000})
        (one,) = conn.execute("SELECT count(DISTINCT visible_at) AS n FROM queen.timers "
                              "WHERE queue = 'burst'").fetchall()
        assert one["n"] == 10_001
        conn.execute("SELECT pg_sleep(2.1)")
        fired = 0
        for _ in range(45):
            n = len(sweep(conn).fired)
            fired += n
            if not n:
                break
        after = idle_sweep_buffers(database_url)
    assert fired == 20_000
    rows = sql(database_url, "SELECT meta->'timer'->>'key' AS key FROM queen.frames "
                             "ORDER BY partition_id, \"offset\"")
    assert [r["key"] for r in rows] == [f"b-{g:06d}" for g in range(1, 20_001)]
    assert {r["queue"] for r in sql(database_url, "SELECT DISTINCT queue FROM queen.timers")} \
        == {"far"}
    assert after < before + 60, f"an idle sweep: {before} shared buffers before, {after} after"


def _floor_after_advance(conn: psycopg.Connection[dict[str, Any]], set_to_ms: int) -> float:
    """The floor set ``set_to_ms`` from the clock (negative: behind it), then advanced, both in
    one message (microseconds apart in the server, however loaded the machine): how far
    (seconds) the floor the advance answers is behind the clock read after it."""
    cur = conn.execute(
        "SELECT setval('queen.timer_sweep_floor', (extract(epoch FROM clock_timestamp())"
        f" * 1000000)::bigint + {set_to_ms * 1000}); "
        "SELECT extract(epoch FROM clock_timestamp() - queen.advance_sweep_floor())::float8"
        " AS behind")
    assert cur.nextset()  # the second statement's answer
    (row,) = cur.fetchall()
    return float(row["behind"])


def test_a_floor_raised_moments_ago_is_left_where_it_is_and_an_old_or_future_one_is_moved(
    database_url: str,
) -> None:
    """Raising the floor reads every backend's state (most of a small sweep's bookkeeping):
    under a steady flow, where sweeps come 10 ms apart, a floor less than 50 ms behind the
    clock is left as it is. One further behind is raised to the clock, and one ahead of the
    clock (the clock stepped back) is brought down to it, as at every sweep before."""
    with connect(database_url, autocommit=True) as conn:
        tenant = default_tenant(conn)
        store.schedule(conn, tenant, timer("floor-far", "far", 3_600_000, 1),
                       notify_within_ms=0)
        # (sweep_floor() answers a millisecond below what was set.)
        fresh = _floor_after_advance(conn, -5)
        assert 0.005 <= fresh < 0.5, f"a floor 5 ms behind was moved: {fresh * 1000:.1f} ms"
        old = _floor_after_advance(conn, -60_000)
        assert old < 0.5, f"a floor a minute behind was left {old:.3f} s behind"
        ahead = _floor_after_advance(conn, 3_600_000)
        assert 0 <= ahead < 0.5, f"a floor an hour ahead was left at {ahead:.3f} s"


def test_a_timer_scheduled_into_the_past_under_a_fresh_floor_fires_at_once(
    database_url: str,
) -> None:
    """The floor left where it is by a sweep is still below every timer written since: one
    scheduled an hour into the past right after the floor moved fires at the next sweep."""
    with connect(database_url, autocommit=True) as conn:
        tenant = default_tenant(conn)
        _floor_after_advance(conn, -1)
        store.schedule(conn, tenant, timer("floor", "past-under-fresh", -3_600_000, 1),
                       notify_within_ms=0)
        fired = sweep(conn)
    assert [at for _, at in fired.fired] and frames_of(database_url, "past-under-fresh") == 1
    assert "past-under-fresh" not in pending(database_url)

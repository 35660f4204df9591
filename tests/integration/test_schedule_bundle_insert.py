"""queen.schedule_timer_list's path for a bundle of new names (schema/functions/timers.sql): one
plain INSERT whose own unique check is the look for stored names, bounded by a 1 ms
lock_timeout against a sweeper's uncommitted change; what a caller sees of it, against a real
PostgreSQL."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import random
import uuid

import pytest

from queen_trio.timers import store

from .test_timer_races import LOCK_GUARD, _hold, connect, default_tenant, sql, timer


def _pkey_scans(conn: object) -> int:
    """Index scans of the timers' primary key so far in the current transaction."""
    row = conn.execute(  # type: ignore[attr-defined]
        "SELECT pg_stat_get_xact_numscans('queen.timers_pkey'::regclass) AS n").fetchone()
    return int(row["n"])


def test_a_bundle_of_new_names_looks_up_none_of_them(database_url: str) -> None:
    """No probe of the primary key per timer before the INSERT (it cost a seventh of the
    statement): the INSERT's unique check is the look."""
    with connect(database_url, autocommit=True) as conn, conn.transaction():
        tenant = default_tenant(conn)
        before = _pkey_scans(conn)
        outcomes = store.schedule_many(conn, tenant, [
            timer("q", f"new-{i}", 60_000, i) for i in range(50)], notify_within_ms=0)
        assert _pkey_scans(conn) == before
    assert {o.status for o in outcomes} == {"scheduled"}
    assert sql(database_url, "SELECT count(*) AS n FROM queen.timers") == [{"n": 50}]


def test_a_stored_name_late_in_a_bundle_leaves_nothing_of_the_first_try(
    database_url: str,
) -> None:
    """The INSERT fails at the bundle's last timer, already stored: every timer is decided
    again, each once, and only the final rows and bytes are counted."""
    with connect(database_url, autocommit=True) as conn:
        tenant = default_tenant(conn)
        with conn.transaction():
            (first,) = store.schedule_many(conn, tenant, [timer("q", "old", 60_000, "old")],
                                           notify_within_ms=0)
        with conn.transaction():
            outcomes = store.schedule_many(conn, tenant, [
                *(timer("q", f"new-{i}", 60_000, i) for i in range(20)),
                timer("q", "old", 120_000, "again")], notify_within_ms=0)
    assert [o.status for o in outcomes] == ["scheduled"] * 20 + ["rescheduled"]
    assert outcomes[-1].message_id != first.message_id
    assert len({o.message_id for o in outcomes}) == 21
    rows = sql(database_url, "SELECT timer_key, convert_from(payload, 'UTF8') AS p, message_id "
                             "FROM queen.timers ORDER BY timer_key")
    assert [(r["timer_key"], r["p"]) for r in rows] == [
        *sorted((f"new-{i}", str(i)) for i in range(20)), ("old", '"again"')]
    assert {str(r["message_id"]) for r in rows} == {o.message_id for o in outcomes}
    (used,) = sql(database_url, "SELECT coalesce(sum(bytes), 0)::bigint AS b "
                                "FROM queen.usage_deltas")
    assert used["b"] == sum(len(str(i)) for i in range(20)) + len('"again"')


def test_the_callers_lock_timeout_stands_after_a_bundle_whichever_path_it_took(
    database_url: str,
) -> None:
    """The 1 ms bound is the INSERT's alone: after a bundle of new names, one meeting a stored
    name and one meeting a timer a sweeper is firing, the session's lock_timeout is its own."""
    with connect(database_url, autocommit=True) as a, connect(database_url, autocommit=True) as b:
        tenant = default_tenant(a)
        with a.transaction():
            store.schedule_many(a, tenant, [timer("q", "k", -1_000, 1)], notify_within_ms=0)
        b.execute("SET lock_timeout = '2900ms'")
        with b.transaction():
            assert {o.status for o in store.schedule_many(b, tenant, [
                timer("q", "n1", 60_000, 1), timer("q", "n2", 60_000, 2)],
                notify_within_ms=0)} == {"scheduled"}
            assert b.execute("SHOW lock_timeout").fetchone()["lock_timeout"] == "2900ms"
        with b.transaction():
            assert [o.status for o in store.schedule_many(b, tenant, [
                timer("q", "n3", 60_000, 3), timer("q", "n1", 60_000, 4)],
                notify_within_ms=0)] == ["scheduled", "rescheduled"]
            assert b.execute("SHOW lock_timeout").fetchone()["lock_timeout"] == "2900ms"
        _hold(a, tenant, "fire_uncommitted")
        try:
            with b.transaction():
                assert [o.status for o in store.schedule_many(b, tenant, [
                    timer("q", "n4", 60_000, 5), timer("q", "k", 60_000, 6)],
                    notify_within_ms=0)] == ["scheduled", "too_late"]
                assert b.execute("SHOW lock_timeout").fetchone()["lock_timeout"] == "2900ms"
        finally:
            a.execute("ROLLBACK")
        assert b.execute("SHOW lock_timeout").fetchone()["lock_timeout"] == "2900ms"


def test_concurrent_bundles_of_partly_stored_names_in_opposite_orders_never_deadlock(
    database_url: str,
) -> None:
    """Bundles racing over names some of which are stored and some new, each in its own
    order, while another connection keeps firing-style deletes of stored names under way:
    every bundle completes (no deadlock, no lock timeout reaching the caller), every name is
    stored once, and each answer is one a schedule may give."""
    with connect(database_url, autocommit=True) as conn, conn.transaction():
        tenant = default_tenant(conn)
        store.schedule_many(conn, tenant, [timer("race", f"k{i}", 60_000, "seed")
                                           for i in range(0, 200, 2)], notify_within_ms=0)
    keys = [f"k{i}" for i in range(200)]

    def bundles(seed: int) -> list[store.Outcome]:
        rng = random.Random(seed)
        out: list[store.Outcome] = []
        with connect(database_url, autocommit=True) as conn:
            conn.execute(f"SET lock_timeout = '{LOCK_GUARD}'")
            for _ in range(6):
                order = rng.sample(keys, 120)
                if seed % 2:
                    order.reverse()
                with conn.transaction():
                    out += store.schedule_many(
                        conn, tenant, [timer("race", k, 60_000, seed) for k in order],
                        notify_within_ms=0)
        return out

    def deleter() -> int:
        # A sweeper's fire, slowed down: a stored row deleted, held uncommitted a while.
        done = 0
        rng = random.Random(99)
        with connect(database_url, autocommit=True) as conn:
            conn.execute(f"SET lock_timeout = '{LOCK_GUARD}'")
            for _ in range(15):
                key = rng.choice(keys)
                with conn.transaction():
                    conn.execute("DELETE FROM queen.timers t USING (SELECT ctid FROM "
                                 "queen.timers WHERE queue = 'race' AND timer_key = %s "
                                 "FOR UPDATE SKIP LOCKED) x WHERE t.ctid = x.ctid", (key,))
                    conn.execute("SELECT pg_sleep(0.01)")
                done += 1
        return done

    with concurrent.futures.ThreadPoolExecutor(5) as pool:
        fired = pool.submit(deleter)
        results = list(pool.map(bundles, range(4)))
        assert fired.result() == 15
    for outcomes in results:
        assert len(outcomes) == 6 * 120
        assert {o.status for o in outcomes} <= {"scheduled", "rescheduled", "too_late"}
    rows = sql(database_url, "SELECT timer_key, count(*) AS n FROM queen.timers "
                             "GROUP BY timer_key")
    assert {r["n"] for r in rows} == {1}


@pytest.mark.parametrize("zone", ["Etc/UTC", "Europe/Berlin", "America/St_Johns"])
def test_a_bundle_of_new_names_answers_the_ids_and_instants_it_stored(
    database_url: str, zone: str
) -> None:
    """A bundle of new names is answered by one row that the broker expands (attempt 0): each
    timer's message id and due instant in its answer are the ones stored, in the session's
    zone, whatever the delays (past, now, across a change of summer time), and the txns the
    ones sent or minted."""
    delays = [-5_000, 0, 1, 999, 3_600_000, 120 * 86_400_000, 200 * 86_400_000 + 7, 0]
    with connect(database_url, autocommit=True) as conn:
        conn.execute(f"SET TimeZone = '{zone}'")
        tenant = default_tenant(conn)
        with conn.transaction():
            schedules = [timer("q", f"t{i}", d, {"i": i}) for i, d in enumerate(delays)]
            schedules[3] = dataclasses.replace(schedules[3], txn="my-own-txn")
            outcomes = store.schedule_many(conn, tenant, schedules, notify_within_ms=0)
        rows = {r["timer_key"]: r for r in conn.execute(
            "SELECT timer_key, message_id::text AS message_id, deliver_at, txn "
            "FROM queen.timers").fetchall()}
    assert [o.status for o in outcomes] == ["scheduled"] * len(delays)
    assert outcomes[3].txn == "my-own-txn"
    for o in outcomes:
        row = rows[o.key]
        assert (o.message_id, o.deliver_at, o.txn) == (
            row["message_id"], row["deliver_at"], row["txn"]), o.key
        assert o.deliver_at is not None
        assert o.deliver_at.utcoffset() == row["deliver_at"].utcoffset(), o.key
        assert uuid.UUID(o.message_id).version == 7
    assert len({o.message_id for o in outcomes}) == len(delays)

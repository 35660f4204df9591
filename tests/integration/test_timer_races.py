"""Timer races against a real PostgreSQL and real broker processes (docs/internals.md, "How a
timer fires").

What every test here defends is the one promise of the feature: a due timer becomes exactly one
frame in the log — never two, never none — whatever else happens at the same time (a cancel or
a reschedule racing the claim, a claim that expired under a slow sweeper, several brokers
sweeping one database, a broker SIGKILLed or frozen mid-burst, PostgreSQL restarted mid-run).

The first group drives the store functions directly over psycopg connections, the way the
sweeper and the API do, so the interleavings are chosen by the test rather than by luck. The
second group runs real ``python -m queen_trio serve`` processes (marked ``slow``).
"""

from __future__ import annotations

import concurrent.futures
import functools
import multiprocessing
import os
import random
import re
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import trio
from psycopg.rows import dict_row

from queen_trio.db.rows import DictConnection
from queen_trio.server import BrokerHandle
from queen_trio.timers import rules as timer_rules
from queen_trio.timers import store
from queen_trio.timers.rules import Schedule

from ..brokers import BrokerProcess, running_brokers
from ..timer_ops import timer_op

API = "/api/v1"
LOCK_GUARD = "3s"  # a statement that blocks on a row lock fails after this instead of hanging


# -- helpers ----------------------------------------------------------------------------------


def connect(url: str, **kwargs: Any) -> DictConnection:
    return psycopg.connect(url, row_factory=dict_row, **kwargs)


def sql(url: str, query: str, params: Any = None) -> list[dict[str, Any]]:
    with connect(url, autocommit=True) as conn:
        cur = conn.execute(query, params)
        return cur.fetchall() if cur.description else []


async def asql(url: str, query: str, params: Any = None) -> list[dict[str, Any]]:
    """``sql`` off the event loop (a broker may be running in this trio run)."""
    return await trio.to_thread.run_sync(sql, url, query, params)


def default_tenant(conn: DictConnection) -> int:
    return conn.execute("SELECT tenant_id FROM queen.tenants WHERE name = 'default'").fetchone()[
        "tenant_id"]


def timer(queue: str, key: str, delay_ms: int, payload: Any = None) -> Schedule:
    return Schedule(queue=queue, key=key, delay_ms=delay_ms, payload=payload,
                    partition="Default", txn=None)


def schedule_many(conn: DictConnection, tenant_id: int, queue: str, keys: list[str],
                  delay_ms: int) -> None:
    with conn.transaction():
        for key in keys:
            out = store.schedule(conn, tenant_id, timer(queue, key, delay_ms, key),
                                 notify_within_ms=1000)  # as the API does: NOTIFY if soon
            assert out.status == "scheduled"


def fire(conn: DictConnection, token: uuid.UUID, rows: list[store.Claimed]) -> store.FireResult:
    with conn.transaction():
        return store.fire(conn, token, rows, ceilings={}, max_attempts=5, backoff_ms=1000)


def claim(conn: DictConnection, token: uuid.UUID, lease_ms: int, batch: int = 1000,
          broker: str = "test") -> store.SweepResult:
    with conn.transaction():
        return store.claim(conn, token, broker, batch, lease_ms)


def fired_keys(url: str) -> Counter[str]:
    """How many frames each timer key produced, over the whole log."""
    rows = sql(url, "SELECT meta->'timer'->>'key' AS key, count(*) AS n FROM queen.frames "
                    "GROUP BY 1")
    return Counter({r["key"]: r["n"] for r in rows})


def assert_exactly_once(fired: Counter[str], expected: set[str]) -> None:
    duplicated = {k: n for k, n in fired.items() if n > 1}
    missing = expected - set(fired)
    unexpected = set(fired) - expected
    assert not duplicated, f"{len(duplicated)} timers fired more than once, e.g. " \
                           f"{sorted(duplicated.items())[:10]}"
    assert not missing, f"{len(missing)} timers never fired, e.g. {sorted(missing)[:10]}"
    assert not unexpected, f"frames for keys never scheduled: {sorted(unexpected)[:10]}"


async def poll_until(check: Callable[[], Awaitable[Any]], within: float,
                     every: float = 0.05) -> Any:
    """Await ``check`` until it returns something truthy; trio.TooSlowError after ``within``
    seconds."""
    with trio.fail_after(within):
        while True:
            result = await check()
            if result:
                return result
            await trio.sleep(every)


async def count(url: str, query: str) -> int:
    return (await asql(url, query))[0]["n"]


NO_TIMERS = "SELECT count(*) AS n FROM queen.timers"


def expire_leases(conn: DictConnection) -> None:
    with conn.transaction():
        conn.execute("UPDATE queen.timers SET visible_at = now() - interval '1 s'")


# -- claim vs cancel / reschedule (store level, no broker) ------------------------------------


@pytest.mark.parametrize("after_expiry", ["cancel", "reschedule"])
def test_a_live_claim_makes_cancel_and_reschedule_too_late_until_its_lease_expires(
    database_url: str, after_expiry: str
) -> None:
    with connect(database_url, autocommit=True) as conn:  # each block below is one transaction
        tenant = default_tenant(conn)
        with conn.transaction():
            out = store.schedule(conn, tenant, timer("q", "k", -1000, {"v": 1}),
                                 notify_within_ms=1000)
        assert out.status == "scheduled"
        token = uuid.uuid4()
        claimed = claim(conn, token, lease_ms=60_000)
        assert [c.key for c in claimed.rows] == ["k"]

        with conn.transaction():
            cancel = store.cancel(conn, tenant, "q", "k", None)
        assert (cancel.status, cancel.ok, cancel.txn) == ("too_late", False, out.txn)
        with conn.transaction():
            again = store.schedule(conn, tenant, timer("q", "k", 5_000, {"v": 2}),
                                   notify_within_ms=1000)
        assert (again.status, again.ok) == ("too_late", False)
        # Neither touched the row: same txn, same claim.
        (row,) = sql(database_url, "SELECT txn, claim_token FROM queen.timers")
        assert (row["txn"], row["claim_token"]) == (out.txn, token)

        expire_leases(conn)  # the claimer "died": its lease is over
        with conn.transaction():
            if after_expiry == "cancel":
                assert store.cancel(conn, tenant, "q", "k", None).status == "cancelled"
            else:
                again = store.schedule(conn, tenant, timer("q", "k", 60_000, {"v": 2}),
                                       notify_within_ms=1000)
                assert again.status == "rescheduled"
        # The late claimer wakes and fires with its old token: nothing is appended.
        late = fire(conn, token, claimed.rows)
        assert (late.fired, late.lost) == ([], 1)
        assert sql(database_url, "SELECT count(*) AS n FROM queen.frames") == [{"n": 0}]
        remaining = sql(database_url, "SELECT claim_token FROM queen.timers")
        assert remaining == ([] if after_expiry == "cancel" else [{"claim_token": None}])


# -- a row locked by an open transaction: cancel/schedule never wait --------------------------


def _hold(conn: DictConnection, tenant: int, how: str) -> uuid.UUID | None:
    """Leave ``conn`` inside a transaction that holds the row lock of q/k."""
    if how == "select_for_update":
        conn.execute("BEGIN")
        conn.execute("SELECT 1 FROM queen.timers WHERE timer_key = 'k' FOR UPDATE")
        return None
    token = uuid.uuid4()
    if how == "claim_uncommitted":  # a sweeper in the middle of its claim statement's txn
        conn.execute("BEGIN")
        assert len(store.claim(conn, token, "A", 10, 60_000).rows) == 1
        return token
    # "fire_uncommitted": claim committed, the fire (DELETE + append) still open
    rows = claim(conn, token, lease_ms=60_000).rows
    conn.execute("BEGIN")
    assert len(store.fire(conn, token, rows, ceilings={}, max_attempts=5,
                          backoff_ms=1000).fired) == 1
    return token


@pytest.mark.parametrize("how", ["select_for_update", "claim_uncommitted", "fire_uncommitted"])
def test_a_locked_row_answers_too_late_at_once_and_never_blocks(
    database_url: str, how: str
) -> None:
    with connect(database_url, autocommit=True) as a, connect(database_url, autocommit=True) as b:
        tenant = default_tenant(a)
        with a.transaction():
            out = store.schedule(a, tenant, timer("q", "k", -1000, 1), notify_within_ms=0)
        b.execute(f"SET lock_timeout = '{LOCK_GUARD}'")
        token = _hold(a, tenant, how)
        try:
            for attempt in ("cancel", "schedule", "cancel"):
                started = time.perf_counter()
                with b.transaction():
                    if attempt == "cancel":
                        answer = store.cancel(b, tenant, "q", "k", None)
                    else:
                        answer = store.schedule(b, tenant, timer("q", "k", 10, 2),
                                                notify_within_ms=0)
                elapsed = time.perf_counter() - started
                assert (answer.status, answer.txn) == ("too_late", out.txn), attempt
                assert elapsed < 0.2, f"{attempt} took {elapsed * 1000:.0f} ms behind a lock"
        finally:
            a.execute("ROLLBACK")
        with b.transaction():
            after = store.cancel(b, tenant, "q", "k", None).status
        if how == "fire_uncommitted":
            # The claim itself was committed and is still live: too_late until released.
            assert after == "too_late"
            assert token is not None
            with a.transaction():
                assert store.release(a, token) == 1
            with b.transaction():
                after = store.cancel(b, tenant, "q", "k", None).status
        assert after == "cancelled"
    assert sql(database_url, "SELECT count(*) AS n FROM queen.frames") == [{"n": 0}]


@pytest.mark.parametrize("how", ["select_for_update", "claim_uncommitted", "fire_uncommitted"])
def test_a_bundle_meeting_a_timer_being_fired_answers_too_late_at_once(
    database_url: str, how: str
) -> None:
    """A bundle of new names goes in by one plain INSERT (queen.schedule_timers); one name of it
    stored and held by a sweeper still answers too_late at once, the others scheduled, where
    that INSERT would have waited for the fire's commit."""
    with connect(database_url, autocommit=True) as a, connect(database_url, autocommit=True) as b:
        tenant = default_tenant(a)
        with a.transaction():
            out = store.schedule(a, tenant, timer("q", "k", -1000, 1), notify_within_ms=0)
        b.execute(f"SET lock_timeout = '{LOCK_GUARD}'")
        _hold(a, tenant, how)
        try:
            started = time.perf_counter()
            with b.transaction():
                answers = store.schedule_many(b, tenant, [
                    timer("q", "fresh", 60_000, 2), timer("q", "k", 10, 3)], notify_within_ms=0)
            elapsed = time.perf_counter() - started
        finally:
            a.execute("ROLLBACK")
    assert [(o.key, o.status, o.txn == out.txn) for o in answers] == [
        ("fresh", "scheduled", False), ("k", "too_late", True)]
    assert elapsed < 0.2, f"the bundle took {elapsed * 1000:.0f} ms behind a lock"
    assert [r["timer_key"] for r in sql(database_url, "SELECT timer_key FROM queen.timers "
                                                      "ORDER BY timer_key")] == ["fresh", "k"]


# -- a lost claim appends nothing -------------------------------------------------------------


@pytest.mark.parametrize("late_fire", ["after_new_fire", "before_new_fire"])
def test_a_sweeper_whose_claim_was_taken_over_appends_nothing(
    database_url: str, late_fire: str
) -> None:
    keys = [f"t{i}" for i in range(25)]
    with connect(database_url, autocommit=True) as a, connect(database_url, autocommit=True) as b:
        tenant = default_tenant(a)
        schedule_many(a, tenant, "lost", keys, -100)
        token_a = uuid.uuid4()
        claimed_a = claim(a, token_a, lease_ms=300, broker="A")
        assert len(claimed_a.rows) == len(keys)
        assert claim(b, uuid.uuid4(), lease_ms=300, broker="B").rows == []  # A's lease is live
        give_up = time.monotonic() + 5
        while sql(database_url, "SELECT 1 FROM queen.timers WHERE visible_at > now()"):
            assert time.monotonic() < give_up, "a 300 ms lease never expired"
            time.sleep(0.02)  # A is "stuck" past its lease
        token_b = uuid.uuid4()
        claimed_b = claim(b, token_b, lease_ms=30_000, broker="B")
        assert sorted(c.key for c in claimed_b.rows) == sorted(keys)
        if late_fire == "before_new_fire":
            late = fire(a, token_a, claimed_a.rows)
            assert (late.fired, late.lost) == ([], len(keys))
        fresh = fire(b, token_b, claimed_b.rows)
        assert (len(fresh.fired), fresh.lost) == (len(keys), 0)
        if late_fire == "after_new_fire":
            late = fire(a, token_a, claimed_a.rows)
            assert (late.fired, late.lost) == ([], len(keys))
    assert_exactly_once(fired_keys(database_url), set(keys))
    assert sql(database_url, "SELECT count(*) AS n FROM queen.timers") == [{"n": 0}]


# -- sweepers racing each other and a canceller (store level, processes) ----------------------


def _sweep_until_empty(database_url: str, name: str, seconds: float) -> int:
    """One sweeper process: claim (small batches, so claims interleave) and fire until nothing
    is left; returns how many timers it fired. A process of its own, like a broker: the payload
    codec of queen_trio.timers.rules is not shared between sweepers."""
    fired = 0
    stop_at = time.monotonic() + seconds
    with connect(database_url, autocommit=True) as c:
        while time.monotonic() < stop_at:
            token = uuid.uuid4()
            got = claim(c, token, lease_ms=30_000, batch=37, broker=name)
            if got.rows:
                result = fire(c, token, got.rows)
                assert result.lost == 0 and not result.failed, result
                fired += len(result.fired)
            elif got.next_due is None:
                return fired
    raise TimeoutError(f"{name} still sweeping after {seconds}s")


def _worker_pid(linger: float) -> int:
    time.sleep(linger)  # so that every worker of the pool gets one
    return os.getpid()


def test_racing_sweepers_and_a_canceller_keep_exactly_once(database_url: str) -> None:
    """Four sweeper processes claim and fire while a thread cancels random keys. Every cancel
    answer must agree with the log: cancelled ⇒ no frame; too_late or absent ⇒ exactly one
    frame (these sweepers never fail)."""
    n = 1500
    keys = [f"r{i}" for i in range(n)]
    with connect(database_url, autocommit=True) as conn:
        tenant = default_tenant(conn)
        schedule_many(conn, tenant, "race", keys, -10)
    answers: dict[str, str] = {}

    def canceller() -> None:
        rnd = random.Random(7)
        with connect(database_url, autocommit=True) as c:
            c.execute(f"SET lock_timeout = '{LOCK_GUARD}'")
            for key in rnd.sample(keys, 400):
                with c.transaction():
                    answers[key] = store.cancel(c, tenant, "race", key, None).status

    # Forked (cheap; no connection is open in this process at that moment), and warmed up so
    # that all four are running before the race starts.
    forked = multiprocessing.get_context("fork")
    with concurrent.futures.ProcessPoolExecutor(4, mp_context=forked) as pool:
        assert len(set(pool.map(_worker_pid, [0.1] * 4))) == 4
        sweepers = [pool.submit(_sweep_until_empty, database_url, f"S{i}", 30) for i in range(4)]
        give_up = time.monotonic() + 10
        while not sql(database_url, "SELECT 1 FROM queen.frames LIMIT 1"):
            assert time.monotonic() < give_up, "the sweepers never fired anything"
            time.sleep(0.005)
        with concurrent.futures.ThreadPoolExecutor(1) as threads:
            threads.submit(canceller).result(timeout=40)  # …while they sweep
        fired_by = {f"S{i}": f.result(timeout=40) for i, f in enumerate(sweepers)}
    cancelled = {k for k, s in answers.items() if s == "cancelled"}
    assert set(answers.values()) <= {"cancelled", "too_late", "absent"}
    fired = fired_keys(database_url)
    assert_exactly_once(fired, set(keys) - cancelled)
    assert sum(fired_by.values()) == n - len(cancelled)
    assert sql(database_url, "SELECT count(*) AS n FROM queen.timers") == [{"n": 0}]
    print(f"\ncancel answers {Counter(answers.values())}, fired per sweeper {fired_by}")


# -- a dead claimer: a running (in-process) broker takes over at lease expiry -----------------


async def test_a_dead_claimers_rows_are_fired_once_by_a_running_broker(
    broker: BrokerHandle, database_url: str
) -> None:
    keys = [f"d{i}" for i in range(50)]

    def claim_and_die() -> tuple[float, float, int]:
        # Schedule (already due) and claim in one transaction: the running broker cannot see
        # the rows before they carry our 1 s claim, and we never fire them.
        with connect(database_url, autocommit=True) as conn:
            tenant = default_tenant(conn)
            with conn.transaction():
                for key in keys:
                    store.schedule(conn, tenant, timer("dead", key, -50, key),
                                   notify_within_ms=10_000)
                got = store.claim(conn, uuid.uuid4(), "dead-claimer", 1000, 1000)
                clock = conn.execute(
                    "SELECT extract(epoch FROM clock_timestamp())::float8 AS claimed_at, "
                    "extract(epoch FROM max(visible_at))::float8 AS lease_end "
                    "FROM queen.timers").fetchone()
            return clock["claimed_at"], clock["lease_end"], len(got.rows)

    claimed_at, lease_end, n = await trio.to_thread.run_sync(claim_and_die)
    # The lease runs from the claim (read just before claimed_at): 1 s, less a moment (a
    # clean-clone CI run once saw 147 ms between the two clock reads on a busy VM).
    assert n == len(keys) and 0.75 < lease_end - claimed_at <= 1.0
    await poll_until(lambda: _none_left(database_url), within=6)
    rows = await asql(database_url, "SELECT extract(epoch FROM created_at)::float8 AS at "
                                    "FROM queen.frames")
    assert_exactly_once(await trio.to_thread.run_sync(fired_keys, database_url), set(keys))
    first, last = min(r["at"] for r in rows), max(r["at"] for r in rows)
    # Both instants are PostgreSQL's clock: the fire started after the lease ended…
    assert first >= lease_end, f"fired {lease_end - first:.3f}s before the dead claim's lease ended"
    # …and not long after (the broker sleeps at most MAX_SLEEP = 1 s before looking again).
    assert last - claimed_at <= 3.0, f"fired {last - claimed_at:.3f}s after a 1 s claim"


# -- several broker processes on one database (slow) ------------------------------------------


async def _schedule_over_http(
    brokers: list[BrokerProcess], queue: str, total: int, delays: list[int], bundle: int = 500,
) -> None:
    """POST /transaction bundles, spread round-robin over the brokers, one in flight each."""
    bundles = [list(range(start, min(start + bundle, total)))
               for start in range(0, total, bundle)]

    async def worker(b: BrokerProcess, mine: list[list[int]]) -> None:
        async with httpx.AsyncClient(base_url=b.url, timeout=60) as http:
            for ids in mine:
                body = {"timers": [timer_op(queue, f"k{i}", delays[i], i) for i in ids]}
                r = await http.post(f"{API}/transaction", json=body)
                assert r.status_code == 200, f"{b.name}: {r.status_code} {r.text[:500]}"
                assert {t["status"] for t in r.json()["results"]} == {"scheduled"}

    async with trio.open_nursery() as nursery:
        for i, b in enumerate(brokers):
            nursery.start_soon(worker, b, bundles[i::len(brokers)])


class BrokerDied(AssertionError):
    """A broker process exited while it should have been serving."""


async def _none_left(url: str, brokers: Sequence[BrokerProcess] = ()) -> bool:
    for b in brokers:
        if not b.alive:
            raise BrokerDied(f"{b.name} exited with code {b.returncode}; stderr:\n{b.stderr()}")
    return await count(url, NO_TIMERS) == 0


async def _wait_until_no_timers(url: str, within: float, brokers: list[BrokerProcess]) -> None:
    try:
        await poll_until(lambda: _none_left(url, brokers), within, every=0.1)
    except trio.TooSlowError:
        left = (await asql(url, "SELECT count(*) AS n, count(claim_token) AS claimed, "
                                "max(attempts) AS attempts, min(visible_at) AS visible_min, "
                                "queen.sweep_floor() AS floor, clock_timestamp() AS now "
                                "FROM queen.timers"))[0]
        details = "\n".join(f"--- {b.name} (alive={b.alive}):\n{b.stderr(2000)}" for b in brokers)
        # Who holds or waits for what: a sweeper whose every statement times out is blocked
        # or starved, and this says which.
        sessions = await asql(url, """
            SELECT a.pid, a.application_name, a.state, a.wait_event_type, a.wait_event,
                   round(extract(epoch FROM clock_timestamp() - a.query_start)::numeric, 2)
                       AS running_s,
                   pg_blocking_pids(a.pid) AS blocked_by, left(a.query, 80) AS query
            FROM pg_stat_activity a
            WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()""")
        raise AssertionError(f"timers still pending after {within}s: {left}\n{details}\n"
                             "--- sessions:\n" + "\n".join(map(str, sessions))) from None


@pytest.mark.slow
@pytest.mark.parametrize("n_brokers", [2, 3])
async def test_several_brokers_share_a_burst_and_fire_each_timer_once(
    database_url: str, n_brokers: int
) -> None:
    total = 20_000
    rnd = random.Random(n_brokers)
    delays = [rnd.randrange(0, 2001) for _ in range(total)]
    env = {"QUEEN_SWEEPER_BATCH": "200"}
    async with running_brokers(database_url, n_brokers, env=env) as brokers:
        started = trio.current_time()
        await _schedule_over_http(brokers, "burst", total, delays)
        scheduled_in = trio.current_time() - started
        await _wait_until_no_timers(database_url, 60, brokers)
        drained_in = trio.current_time() - started
        assert_exactly_once(await trio.to_thread.run_sync(fired_keys, database_url),
                            {f"k{i}" for i in range(total)})
        async with httpx.AsyncClient(timeout=10) as http:
            per_broker = [await b.metric(http, "queen_timers_fired_total") for b in brokers]
        assert sum(per_broker) == total, per_broker
        if n_brokers == 3:
            assert sum(1 for n in per_broker if n > 0) >= 2, per_broker
        codes = [await b.terminate() for b in brokers]
        assert codes == [0] * n_brokers, [(b.name, b.returncode, b.stderr(2000))
                                          for b in brokers]
        print(f"\n{n_brokers} brokers: scheduled {total} in {scheduled_in:.1f}s, all fired "
              f"after {drained_in:.1f}s, per broker {per_broker}")


async def test_a_backlog_fired_in_grown_batches_keeps_offsets_dense_and_fires_each_once(
    database_url: str
) -> None:
    """A burst over three partitions, swept by a broker whose batches grow from 50 to 800
    while the backlog lasts: every timer is in the log once, each partition's offsets run
    without a gap and end at its next_offset, each partition's frames are in the order of
    expiry (one instant: by key), no frame is stamped before its deliverAt, and sweeps larger
    than the base batch were made."""
    total, queue = 3000, "grown"
    env = {"QUEEN_SWEEPER_BATCH": "50", "QUEEN_SWEEPER_BACKLOG_BATCH": "800"}
    keys = [f"k{i:05d}" for i in range(total)]
    async with running_brokers(database_url, 1, env=env) as brokers:
        def schedule() -> None:
            with connect(database_url, autocommit=True) as conn:
                tenant = default_tenant(conn)
                outcomes = store.schedule_many(conn, tenant, [
                    Schedule(queue=queue, key=k, delay_ms=500, payload={"k": k},
                             partition=f"p{i % 3}", txn=None)
                    for i, k in enumerate(keys)], notify_within_ms=1000)
            assert [o.status for o in outcomes] == ["scheduled"] * total
        await trio.to_thread.run_sync(schedule)
        await _wait_until_no_timers(database_url, 60, brokers)
        async with httpx.AsyncClient(timeout=10) as http:
            text = (await http.get(f"{brokers[0].url}/metrics")).text
    assert_exactly_once(await trio.to_thread.run_sync(fired_keys, database_url), set(keys))
    rows = sql(database_url, """
        SELECT p.name AS partition, p.next_offset, array_agg(f."offset" ORDER BY f."offset")
                   AS offsets,
               array_agg(f.meta->'timer'->>'key' ORDER BY f."offset") AS keys,
               bool_and(f.created_at >= (f.meta->'timer'->>'deliverAt')::timestamptz)
                   AS stamped_after_due
        FROM queen.frames f JOIN queen.partitions p USING (partition_id)
        JOIN queen.queues q USING (queue_id) WHERE q.name = %(q)s GROUP BY 1, 2 ORDER BY 1""",
               {"q": queue})
    assert [r["partition"] for r in rows] == ["p0", "p1", "p2"]
    for r in rows:
        first = r["offsets"][0]
        assert r["offsets"] == list(range(first, first + total // 3)), r["partition"]
        assert r["next_offset"] == r["offsets"][-1] + 1
        assert r["keys"] == sorted(r["keys"]), f"{r['partition']}: not in the order of expiry"
        assert r["stamped_after_due"]
    buckets = {float(le): float(n) for le, n in re.findall(
        r'^queen_sweeper_claim_batch_size_bucket\{le="([^"]+)"\} (\S+)$', text, re.M)
        if le != "+Inf"}
    count = float(re.search(r"^queen_sweeper_claim_batch_size_count (\S+)$", text, re.M)[1])
    assert count - buckets[50.0] > 0, "no sweep took more than the base batch"


# -- a broker SIGKILLed or frozen (SIGSTOP) mid-burst (slow) ----------------------------------


BURST_ENV = {"QUEEN_SWEEPER_LEASE_MS": "1500", "QUEEN_SWEEPER_BATCH": "200"}
LIVE_CLAIM_AND_FRAMES = (
    "SELECT (EXISTS (SELECT 1 FROM queen.frames) AND EXISTS (SELECT 1 FROM queen.timers "
    "WHERE claim_token IS NOT NULL AND visible_at > now()))::int AS n"
)
FRAMES_AND_PENDING = (
    "SELECT (EXISTS (SELECT 1 FROM queen.frames) AND EXISTS (SELECT 1 FROM queen.timers))::int AS n"
)
ANY_FRAME = "SELECT count(*) AS n FROM (SELECT 1 FROM queen.frames LIMIT 1) AS f"
AT_STOP = ("SELECT count(*) AS pending, count(*) FILTER (WHERE claim_token IS NOT NULL AND "
           "visible_at > now()) AS claimed FROM queen.timers")


# Which sweeper path fires a burst: small JSON payloads are fired by PostgreSQL inside the sweep
# statement; compressed ones are claimed under a lease and fired by the broker.
FIRE_PATHS = ["postgres", "broker"]


def _burst_payload(key: str, path: str) -> Any:
    return key if path == "postgres" else {"key": key, "padding": "abcdefgh" * 16}


def _schedule_burst(database_url: str, queue: str, keys: list[str], path: str,
                    already: int = 0) -> None:
    """Every timer due at the same instant, 300 ms from now, scheduled as one bundle would be
    (one store.schedule_many call: one statement, one transaction, one NOTIFY); ``already``:
    timers scheduled into the queue before."""
    with connect(database_url, autocommit=True) as conn:
        tenant = default_tenant(conn)
        timers = [timer(queue, key, 300, _burst_payload(key, path)) for key in keys]
        assert all(timer_rules.pack(t.payload)[2] == (path == "broker") for t in timers[:3])
        with conn.transaction():
            outcomes = store.schedule_many(conn, tenant, timers, notify_within_ms=1000)
            # One now() for the whole statement: every timer is due at the same instant.
            assert len({o.deliver_at for o in outcomes}) == 1
        assert [o.status for o in outcomes] == ["scheduled"] * len(keys)
        # (On a slow machine the first sweeps may already have fired some: count both.)
        (row,) = sql(database_url,
                     "SELECT (SELECT count(*) FROM queen.timers WHERE queue = %(q)s) + "
                     "(SELECT count(*) FROM queen.frames f JOIN queen.partitions p "
                     "USING (partition_id) JOIN queen.queues q USING (queue_id) "
                     "WHERE q.name = %(q)s) AS n", {"q": queue})
        assert row["n"] == len(keys) + already


async def _wait_mid_burst(database_url: str, path: str) -> None:
    """Until A has fired something and (broker path) holds a live claim on more, or
    (postgres path) has more to fire: it is mid-burst."""
    mid_burst = LIVE_CLAIM_AND_FRAMES if path == "broker" else FRAMES_AND_PENDING
    await poll_until(lambda: count(database_url, mid_burst), within=15, every=0.002)


@pytest.mark.slow
@pytest.mark.parametrize("path", FIRE_PATHS)
async def test_a_broker_killed_mid_burst_loses_and_duplicates_nothing(
    database_url: str, path: str
) -> None:
    total = 10_000  # a backlog that takes the broker a while, so the kill lands mid-burst
    keys = [f"x{i}" for i in range(total)]
    async with running_brokers(database_url, 1, env=BURST_ENV, names=["A"]) as (a,):
        await trio.to_thread.run_sync(_schedule_burst, database_url, "killed", keys, path)
        await _wait_mid_burst(database_url, path)
        a.kill()  # SIGKILL, mid-burst
        at_kill = (await asql(database_url, AT_STOP))[0]
        assert at_kill["pending"] > 0, "A drained the whole burst before it could be killed"
        async with running_brokers(database_url, 1, env=BURST_ENV, names=["B"]) as (b,):
            await _wait_until_no_timers(database_url, 30, [b])
            assert_exactly_once(await trio.to_thread.run_sync(fired_keys, database_url),
                                set(keys))
            assert await b.terminate() == 0, b.stderr()
    print(f"\nat SIGKILL: {at_kill}")


@pytest.mark.slow
async def test_a_backlog_too_large_for_the_lease_still_drains(database_url: str) -> None:
    """A sweep's statements must end within the lease (the sweeper connections'
    statement_timeout). A backlog grows the batch until a sweep, or the broker's fire of what it
    claimed, runs out of that time; asked for as many again, every cycle timed out again and
    nothing more fired (20,000 timers under a 300 ms lease stayed at 19,000 for a minute). After
    a timeout the sweeper asks for half as many."""
    total = 10_000
    keys = [f"n{i}" for i in range(total)]
    # Batches of 200, 800, 3,200, then the rest: no sweep of these payloads claims and fires
    # 3,200 in 100 ms here (at a 300 ms lease, 3,200 timed out every cycle).
    env = {"QUEEN_SWEEPER_LEASE_MS": "100", "QUEEN_SWEEPER_BATCH": "200",
           "QUEEN_SWEEPER_BACKLOG_BATCH": "20000"}
    async with running_brokers(database_url, 1, env=env, names=["A"]) as (a,):
        await trio.to_thread.run_sync(_schedule_burst, database_url, "narrow", keys, "broker")
        # (3 s here; 20-30 s for 20,000 timers beside six busy loops at load 7)
        await _wait_until_no_timers(database_url, 90, [a])
        assert_exactly_once(await trio.to_thread.run_sync(fired_keys, database_url), set(keys))
        assert "sweeps now ask for at most" in a.stderr()
        assert await a.terminate() == 0, a.stderr()


SWEEPER_IN_TRANSACTION = (
    "SELECT count(*) AS n FROM pg_stat_activity WHERE datname = current_database() "
    "AND application_name = 'queen-trio-sweeper' AND xact_start IS NOT NULL"
)


async def _sweeper_idle(url: str) -> bool:
    return await count(url, SWEEPER_IN_TRANSACTION) == 0


SWEEPER_WAITING_ON_A_LOCK = (
    "SELECT count(*) AS n FROM pg_stat_activity WHERE datname = current_database() "
    "AND application_name = 'queen-trio-sweeper' AND wait_event_type = 'Lock'"
)


async def _freeze_mid_fire(database_url: str, broker: BrokerProcess,
                           schedule: Callable[[], None]) -> None:
    """SIGSTOP the broker in the middle of a fire transaction, deterministically.

    The test holds the log partition's row lock; the broker's next fire deletes its claimed
    rows and then blocks on that lock while appending. Once its sweeper connection is seen
    waiting, the broker is frozen and the lock released: the server finishes the statement,
    and the broker's fire transaction now sits open (rows deleted, frames not yet appended),
    its client frozen — until the server ends the session.

    The partition exists once the first frames are in (the caller's first timer); ``schedule``
    (the burst) runs once it is locked, so that the burst's first fire blocks on it, however
    fast the broker (or slow this test) is: a burst fired whole before the lock was taken
    could not be frozen."""
    await poll_until(lambda: count(database_url, ANY_FRAME), within=15, every=0.005)

    def lock_partitions() -> DictConnection:
        holder = connect(database_url, autocommit=True)
        holder.execute("BEGIN")
        holder.execute("SELECT 1 FROM queen.partitions FOR UPDATE")
        return holder

    holder = await trio.to_thread.run_sync(lock_partitions)
    try:
        await trio.to_thread.run_sync(schedule)
        await poll_until(lambda: count(database_url, SWEEPER_WAITING_ON_A_LOCK), within=10,
                         every=0.005)
        os.kill(broker.pid, signal.SIGSTOP)
    finally:
        await trio.to_thread.run_sync(holder.close)  # rolls back: the lock is released


@pytest.mark.slow
@pytest.mark.parametrize("path", FIRE_PATHS)
async def test_a_broker_frozen_mid_fire_is_taken_over_and_appends_nothing_on_waking(
    database_url: str, path: str
) -> None:
    """A broker frozen mid-fire (SIGSTOP, a stalled VM) must not pin its rows past the
    lease (docs/internals.md, "How a timer fires"): the server ends its open fire transaction
    (broker path; on the postgres path the fire is one statement, which the server finishes without
    its frozen client), another broker takes the rows over, and the frozen one, when it
    wakes, appends nothing. (That it also survives waking is checked by
    test_a_broker_frozen_between_statements_of_a_fire_survives_waking.)"""
    total = 3_000
    keys = [f"f{i}" for i in range(total)]
    expected = {*keys, "first"}
    lease_s = int(BURST_ENV["QUEEN_SWEEPER_LEASE_MS"]) / 1000
    async with running_brokers(database_url, 1, env=BURST_ENV, names=["A"]) as (a,):
        await trio.to_thread.run_sync(_schedule_burst, database_url, "frozen", ["first"], path)
        try:
            await _freeze_mid_fire(database_url, a, functools.partial(
                _schedule_burst, database_url, "frozen", keys, path, already=1))
            frozen_at = trio.current_time()
            at_stop = (await asql(database_url, AT_STOP))[0]
            assert at_stop["pending"] > 0, "A drained the whole burst before it could be frozen"
            # The server ends the frozen transaction within about a lease…
            await poll_until(lambda: _sweeper_idle(database_url), within=lease_s + 3,
                             every=0.02)
            ended_after = trio.current_time() - frozen_at
            # …so another broker takes every row over while A is still frozen.
            async with running_brokers(database_url, 1, env=BURST_ENV, names=["B"]) as (b,):
                await _wait_until_no_timers(database_url, 30, [b])
                assert_exactly_once(await trio.to_thread.run_sync(fired_keys, database_url),
                                    expected)
                os.kill(a.pid, signal.SIGCONT)
                await trio.sleep(1.5)  # A wakes and finds its transaction gone
                assert_exactly_once(await trio.to_thread.run_sync(fired_keys, database_url),
                                    expected)  # A appended nothing
                a_survived = a.alive
                assert await b.terminate() == 0, b.stderr()
        finally:
            if a.alive:
                os.kill(a.pid, signal.SIGCONT)
    assert ended_after <= lease_s + 1.0
    print(f"\nat SIGSTOP: {at_stop}; frozen transaction ended after {ended_after:.2f}s; "
          f"A survived waking: {a_survived}")


def _check_alive(broker: BrokerProcess, when: str = "") -> None:
    if not broker.alive:
        raise BrokerDied(f"{broker.name} exited with {broker.returncode}{when}; stderr:\n"
                         f"{broker.stderr()}")


# The sweeper backend is idle inside a transaction whose last statement was its BEGIN, and has
# been since before `stopped_after` (a database timestamp taken just before SIGSTOP): the
# broker had long read that answer and was busy in Python (a fire unpacks every claimed payload
# between its BEGIN and its DELETE) when it was frozen.
SWEEPER_FROZEN_BETWEEN_STATEMENTS = (
    "SELECT count(*) AS n FROM pg_stat_activity WHERE datname = current_database() "
    "AND application_name = 'queen-trio-sweeper' AND state = 'idle in transaction' "
    "AND query = 'BEGIN' AND state_change < %(stopped_after)s - interval '2 ms'"
)


async def _freeze_between_statements(database_url: str, broker: BrokerProcess,
                                     survived: int) -> None:
    """SIGSTOP the broker while its sweeper is in the Python part of a fire transaction, as a
    GC pause, a starved CPU or a stalled VM would: stop, let the server settle, look; if the
    moment was not that one, resume and try again a few milliseconds later."""
    rnd = random.Random()
    with trio.fail_after(20):
        while True:
            _check_alive(broker, f" after waking from {survived} freeze(s)")
            before = (await asql(database_url, "SELECT clock_timestamp() AS t"))[0]["t"]
            os.kill(broker.pid, signal.SIGSTOP)
            await trio.sleep(0.02)
            if (await asql(database_url, SWEEPER_FROZEN_BETWEEN_STATEMENTS,
                           {"stopped_after": before}))[0]["n"]:
                return
            os.kill(broker.pid, signal.SIGCONT)
            await trio.sleep(rnd.uniform(0.001, 0.02))


def _schedule_heavy_burst(database_url: str, queue: str, keys: list[str]) -> None:
    """Due at once, each with a ~20 kB payload (a few hundred bytes once compressed): a fire of
    a batch of them spends tens of milliseconds in Python between its BEGIN and its DELETE."""
    padding = [{"i": i, "v": "abcdefgh"} for i in range(800)]
    with connect(database_url, autocommit=True) as conn:
        tenant = default_tenant(conn)
        timers = [timer(queue, key, 0, {"key": key, "padding": padding}) for key in keys]
        assert timer_rules.pack(timers[0].payload)[2]  # compressed: the broker fires it
        with conn.transaction():
            outcomes = store.schedule_many(conn, tenant, timers, notify_within_ms=0)
        assert {o.status for o in outcomes} == {"scheduled"}


FREEZES = 3


@pytest.mark.slow
async def test_a_broker_frozen_between_statements_of_a_fire_survives_waking(
    database_url: str,
) -> None:
    """Freeze one broker (a few times) while its sweeper is between two statements of a fire,
    each time until the server has ended that transaction; the broker must wake and carry on
    (the trouble is transient: the sweeper hands its claims back, spends no attempt and
    sweeps again; see Sweeper._fire and Sweeper._loop), and no timer may fire twice or get
    lost.

    Regression: the server's idle_in_transaction_session_timeout surfaces as SQLSTATE 25P03
    (an InternalError, not an OperationalError); before 1ec5d0a it escaped the sweeper and the
    broker exited with code 1 on the first wake-up."""
    keys = [f"z{i}" for i in range(2_000)]  # a backlog that outlasts the freezes
    lease_ms = 500
    # MAX_SLEEP is also the pause after a transient failure: keep it short so that the
    # broker is back at work soon after each wake-up.
    env = {"QUEEN_SWEEPER_LEASE_MS": str(lease_ms), "QUEEN_SWEEPER_BATCH": "100",
           "QUEEN_SWEEPER_MAX_SLEEP_MS": "100"}
    async with running_brokers(database_url, 1, env=env, names=["A"]) as (a,):
        await trio.to_thread.run_sync(_schedule_heavy_burst, database_url, "freezes", keys)
        try:
            for survived in range(FREEZES):
                await _freeze_between_statements(database_url, a, survived)
                # The server ends the frozen transaction (after one lease).
                await poll_until(lambda: _sweeper_idle(database_url), within=lease_ms / 1000 + 3,
                                 every=0.02)
                os.kill(a.pid, signal.SIGCONT)
                await trio.sleep(0.2)  # a crash shows within milliseconds of waking
                _check_alive(a, f" on waking from freeze #{survived + 1} (it had survived "
                                f"{survived})")
        finally:
            if a.alive:
                os.kill(a.pid, signal.SIGCONT)
        # The freezes did what they are for: the server ended A's transactions under it.
        # (psycopg reports it as the server's error, or, when the socket is already closed
        # as it sends the next statement, as a closed connection.)
        noticed = a.stderr(100_000)
        assert ("idle-in-transaction timeout" in noticed
                or "server closed the connection unexpectedly" in noticed), noticed
        assert await a.terminate() == 0, a.stderr()
    # Stopped mid-backlog: every timer is either fired exactly once or still pending.
    fired = await trio.to_thread.run_sync(fired_keys, database_url)
    pending = {r["timer_key"] for r in await asql(database_url,
                                                  "SELECT timer_key FROM queen.timers")}
    assert not {k: n for k, n in fired.items() if n > 1}
    assert not pending & set(fired)
    assert pending | set(fired) == set(keys)


# -- the payload codec under concurrent requests ---------------------------------------------


CODEC_ROUND_TRIPS = """
import sys, threading
from queen_trio.timers import rules

payloads = [[{"i": i, "t": t, "v": "abcdefgh"} for i in range(2000)] for t in range(4)]
problems = []

def work(t):
    for _ in range(50):
        try:
            blob, _, compressed = rules.pack(payloads[t])
            if rules.unpack(blob, compressed) != payloads[t]:
                problems.append("a payload came back different")
        except Exception as exc:
            problems.append(repr(exc))

threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(f"{len(problems)} problems; first: {problems[:3]}")
sys.exit(1 if problems else 0)
"""

def test_the_timer_payload_codec_is_safe_to_use_from_several_threads() -> None:
    """The broker packs and unpacks payloads in its database worker threads, concurrently.
    Four threads round-trip payloads through rules.pack and rules.unpack, in a child process
    because what this used to find is a segmentation fault.

    Regression: before d7613fd one module-level ZstdCompressor/ZstdDecompressor (not
    thread-safe) served every thread; this child died with SIGSEGV six times out of six."""
    child = subprocess.run([sys.executable, "-c", CODEC_ROUND_TRIPS], capture_output=True,
                           text=True, timeout=60, cwd=Path(__file__).resolve().parents[2])
    assert child.returncode == 0, (
        f"exit code {child.returncode} (-11 = SIGSEGV); stdout: {child.stdout.strip()[-500:]}; "
        f"stderr: {child.stderr.strip()[-500:]}")


class CodecRace(AssertionError):
    """Concurrent requests damaged a timer or the broker."""


@pytest.mark.slow
def test_concurrent_schedules_and_peeks_through_one_broker_keep_every_payload(
    database_url: str,
) -> None:
    """Six clients schedule large timers (~500 kB payloads) through one broker at the same
    time, then peek at them while the sweeper fires them. Every request must be answered 200
    (found: false for a peek at a timer already fired), the broker must stay up, no timer may
    spend an attempt (MAX_ATTEMPTS=1 would dead-letter it) and every frame must carry its
    payload intact.

    Regression: before d7613fd the shared zstd codec made this fail about four runs in five
    (broker SIGSEGV, 500 'cannot compress: Context should be init first', healthy timers
    dead-lettered with 'decompression error: Dictionary is corrupted'). Runs under its own
    trio.run so that a failure reaches pytest unwrapped (CodecRace/BrokerDied)."""
    trio.run(_concurrent_schedules_and_peeks, database_url)


async def _concurrent_schedules_and_peeks(database_url: str) -> None:
    workers, bundles, per_bundle, entries = 6, 2, 3, 20_000
    padding = [{"i": i, "v": "abcdefgh"} for i in range(entries)]
    keys_of = {w: [f"w{w}-{j}-{i}" for j in range(bundles) for i in range(per_bundle)]
               for w in range(workers)}
    expected = {k for keys in keys_of.values() for k in keys}
    problems: list[str] = []
    env = {"QUEEN_SWEEPER_MAX_ATTEMPTS": "1"}
    async with running_brokers(database_url, 1, env=env, names=["broker"]) as (b,):

        async def scheduler(w: int, http: httpx.AsyncClient) -> None:
            keys = keys_of[w]
            for j in range(bundles):
                mine = keys[j * per_bundle:(j + 1) * per_bundle]
                r = await http.post(f"{API}/transaction", json={"timers": [
                    timer_op("big", key, 1500, {"w": w, "padding": padding})
                    for key in mine]})
                if r.status_code != 200:
                    problems.append(f"schedule {mine}: {r.status_code} {r.text[:200]}")

        async def peeker(w: int, http: httpx.AsyncClient) -> None:
            # Peeks decompress in the API's threads, while the sweeper decompresses to fire.
            with trio.move_on_after(3.0):
                while True:
                    for key in keys_of[w]:
                        r = await http.get(f"{API}/timers/big/{key}")
                        if r.status_code == 200 and r.json()["found"]:
                            got = r.json()["data"]
                            if not (isinstance(got, dict) and got.get("w") == w
                                    and len(got.get("padding", ())) == entries):
                                problems.append(f"peek {key}: payload damaged")
                        elif r.status_code != 200:
                            problems.append(f"peek {key}: {r.status_code} {r.text[:200]}")
                    if not (await asql(database_url, NO_TIMERS))[0]["n"]:
                        return

        async def client(w: int, phase: Callable[..., Awaitable[None]]) -> None:
            try:
                async with httpx.AsyncClient(base_url=b.url, timeout=30) as http:
                    await phase(w, http)
            except httpx.HTTPError as exc:
                problems.append(f"client {w}: {exc!r}")

        for phase in (scheduler, peeker):
            async with trio.open_nursery() as nursery:
                for w in range(workers):
                    nursery.start_soon(client, w, phase)
            await trio.sleep(0.2)
            if not b.alive:
                raise CodecRace(f"the broker died (exit code {b.returncode}; -11 = SIGSEGV) "
                                f"under concurrent requests: {problems[:3]}; stderr:\n"
                                f"{b.stderr(3000)}")
            if problems:
                raise CodecRace(f"{len(problems)} requests failed: {problems[:5]}; stderr:\n"
                                f"{b.stderr(3000)}")
        await _wait_until_no_timers(database_url, 30, [b])
        dead = await asql(database_url, "SELECT transaction_id, error FROM queen.dead_letters")
        if dead:
            raise CodecRace(f"{len(dead)} healthy timers were dead-lettered: {dead[:3]}")
        rows = await asql(database_url, "SELECT meta->'timer'->>'key' AS key, "
                                        "(payload->>'w')::int AS w, "
                                        "jsonb_array_length(payload->'padding') AS n "
                                        "FROM queen.frames")
        damaged = [r for r in rows
                   if (r["w"], r["n"]) != (int(r["key"][1:].split("-")[0]), entries)]
        if damaged:
            raise CodecRace(f"{len(damaged)} frames carry a damaged payload: {damaged[:3]}")
        assert_exactly_once(await trio.to_thread.run_sync(fired_keys, database_url), expected)
        assert await b.terminate() == 0, b.stderr()


# -- PostgreSQL restarted mid-run (slow) ------------------------------------------------------


@pytest.mark.slow
async def test_a_postgres_restart_mid_run_spends_no_attempt_and_loses_nothing(
    tmp_path: Path,
) -> None:
    """The broker must heal by itself: pool and LISTEN connection reconnect, transient trouble
    spends no attempt (MAX_ATTEMPTS=1 would turn a spent attempt into a dead letter), and every
    timer is fired exactly once. A short lease bounds the wait for rows whose claim was
    committed just before the restart and whose release failed while the server was down.

    Regression: before 1ec5d0a the tenant directory's refresh let DatabaseUnavailable escape
    and the broker exited with code 1 within a second of the restart."""
    from queen_trio.embedded import EmbeddedPostgres

    server = EmbeddedPostgres(tmp_path / "pg", database="queen",
                              server_settings={"fsync": "off"})
    total = 2_000
    rnd = random.Random(6)
    delays = [rnd.randrange(0, 3001) for _ in range(total)]
    env = {"QUEEN_SWEEPER_MAX_ATTEMPTS": "1", "QUEEN_SWEEPER_BATCH": "200",
           "QUEEN_SWEEPER_LEASE_MS": "1500"}
    try:
        url = await trio.to_thread.run_sync(server.start)
        async with running_brokers(url, 1, env=env, names=["broker"]) as (b,):
            started = trio.current_time()
            await _schedule_over_http([b], "restart", total, delays)
            await trio.sleep(max(0.0, started + 1.0 - trio.current_time()))
            before = (await asql(url, "SELECT count(*) AS n FROM queen.timers"))[0]["n"]
            await trio.to_thread.run_sync(server.restart)
            restarted_at = trio.current_time()
            assert before > 0, "every timer fired before the restart; nothing was tested"
            await _wait_until_no_timers(url, 30, [b])
            healed_in = trio.current_time() - restarted_at
            assert_exactly_once(await trio.to_thread.run_sync(fired_keys, url),
                                {f"k{i}" for i in range(total)})
            dead = await asql(url, "SELECT transaction_id, error FROM queen.dead_letters")
            assert dead == [], f"transient trouble spent attempts: {dead[:5]}"
            # …and says so: /health is 200 again (pool, listener and sweeper all up).
            async with httpx.AsyncClient(base_url=b.url, timeout=5) as http:
                with trio.fail_after(10):
                    while True:
                        if not b.alive:
                            raise BrokerDied(f"exited with {b.returncode}; stderr:\n"
                                             f"{b.stderr()}")
                        if (await http.get("/health")).status_code == 200:
                            break
                        await trio.sleep(0.1)
            assert await b.terminate() == 0, b.stderr()
            print(f"\n{before} timers pending at the restart; all fired {healed_in:.1f}s after")
    finally:
        await trio.to_thread.run_sync(server.stop)

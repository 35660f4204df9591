"""A lone schedule and a lone cancel sent straight through libpq (``Database.lone_row``, issue
32) against a real PostgreSQL: the same answers and errors as the same statement through
psycopg's cursor (``run_autocommit``), and the bridge's contracts (a cancelled call's connection
never goes back to the pool; a read-only server is "database unavailable")."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest
import trio

from queen_trio.db import Database
from queen_trio.db.bridge import LoneStatement
from queen_trio.errors import DatabaseUnavailable
from queen_trio.timers import store
from queen_trio.timers.rules import Schedule
from queen_trio.timers.store import Outcome

from .test_timer_races import connect, default_tenant


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[Database]:
    async with Database(database_url, max_size=2) as database:
        yield database


def _tenant(url: str) -> int:
    with connect(url, autocommit=True) as conn:
        return default_tenant(conn)


def _timer(key: str, delay_ms: int = 3_600_000, payload: Any = None, txn: str | None = None,
           queue: str = "lone") -> Schedule:
    return Schedule(queue=queue, key=key, delay_ms=delay_ms, payload=payload,
                    partition="Default", txn=txn)


def _paths(db: Database, tenant: int) -> dict[str, tuple[
        Callable[[Schedule], Awaitable[Outcome]],
        Callable[[str, str, str | None], Awaitable[Outcome]]]]:
    """(schedule, cancel) as they were (psycopg's cursor) and as they are (libpq)."""
    return {
        "cursor": (
            lambda s: db.run_autocommit(store.schedule, tenant, s, notify_within_ms=1000),
            lambda q, k, t: db.run_autocommit(store.cancel, tenant, q, k, t)),
        "libpq": (
            lambda s: store.schedule_lone(db, tenant, s, notify_within_ms=1000),
            lambda q, k, t: store.cancel_lone(db, tenant, q, k, t)),
    }


def _shape(o: Outcome, key_prefix: str) -> tuple[Any, ...]:
    """An outcome with what differs between two runs (minted ids, instants) made comparable."""
    return (o.status, o.queue, o.key.removeprefix(key_prefix), o.partition,
            None if o.txn is None else (o.txn if o.txn.startswith("given") else "minted"),
            None if o.message_id is None else len(o.message_id),
            None if o.deliver_at is None else o.deliver_at.utcoffset())


async def test_lone_answers_are_the_cursors_answers(db: Database, database_url: str) -> None:
    tenant = _tenant(database_url)
    seen: dict[str, list[tuple[Any, ...]]] = {}
    for name, (schedule, cancel) in _paths(db, tenant).items():
        p = f"{name}-"
        before = trio.current_time()
        first = await schedule(_timer(p + "a", payload={"v": "é\n\\\"x"}))
        answers = [
            first,
            await schedule(_timer(p + "a", payload="again")),  # rescheduled
            await schedule(_timer(p + "b", 60_000, txn="given-1", payload=[1, 2, 3])),
            await schedule(_timer(p + "big", payload="x" * 200_000)),  # compressed, large
            await cancel("lone", p + "a", None),  # cancelled, with its stored txn
            await cancel("lone", p + "a", "given-echo"),  # absent now: echoes the given txn
            await cancel("lone", p + "never", None),  # absent, no txn
            await cancel("other", p + "b", None),  # another queue's: absent
        ]
        assert first.deliver_at is not None
        assert (first.deliver_at - (first.deliver_at - timedelta(hours=1))).total_seconds() > 0
        # too_late: the row locked by a (pretend) firing sweeper
        with connect(database_url) as holder:
            holder.execute("SELECT 1 FROM queen.timers WHERE timer_key = %s FOR UPDATE",
                           (p + "b",))
            answers.append(await schedule(_timer(p + "b", payload=1)))
            answers.append(await cancel("lone", p + "b", None))
            holder.rollback()
        answers.append(await cancel("lone", p + "b", None))  # cancelled, its given txn
        seen[name] = [_shape(o, p) for o in answers]
        assert [o.status for o in answers] == [
            "scheduled", "rescheduled", "scheduled", "scheduled", "cancelled", "absent",
            "absent", "absent", "too_late", "too_late", "cancelled"]
        assert answers[5].txn == "given-echo" and answers[10].txn == "given-1"
        assert answers[4].txn == answers[1].txn and answers[8].txn == "given-1"
        # the instant is the server's now() + delay, in UTC
        assert first.deliver_at.utcoffset() == timedelta(0)
        assert abs((first.deliver_at - answers[1].deliver_at).total_seconds()) < 60  # type: ignore[operator]
        del before
    assert seen["libpq"] == seen["cursor"]
    # What was stored is the same too.
    with connect(database_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT timer_key, convert_from(CASE WHEN payload_zstd THEN ''::bytea ELSE payload "
            "END, 'UTF8') AS p, payload_zstd, partition, payload_bytes FROM queen.timers "
            "WHERE queue = 'lone' ORDER BY timer_key").fetchall()
    by_path = {name: [{**r, "timer_key": r["timer_key"].removeprefix(f"{name}-")}
                      for r in rows if r["timer_key"].startswith(f"{name}-")]
               for name in ("cursor", "libpq")}
    assert by_path["libpq"] == by_path["cursor"] and len(by_path["cursor"]) == 1


async def test_lone_errors_are_the_cursors_errors(db: Database, database_url: str) -> None:
    tenant = _tenant(database_url)
    raised: dict[str, list[tuple[type[BaseException], str | None, str]]] = {}
    for name, (_, _) in _paths(db, tenant).items():
        missing = tenant + 10_000
        (schedule, cancel) = _paths(db, missing)[name]
        errors: list[tuple[type[BaseException], str | None, str]] = []
        with pytest.raises(psycopg.Error) as caught:  # FOREIGN KEY: no such tenant
            await schedule(_timer("x"))
        errors.append((type(caught.value), caught.value.sqlstate, str(caught.value)))
        assert (await cancel("lone", "x", None)).status == "absent"
        with pytest.raises(psycopg.DataError) as bad:  # NUL in text: refused before sending
            await cancel("lone", "a\x00b", None)
        errors.append((type(bad.value), bad.value.sqlstate, str(bad.value)))
        raised[name] = errors
        # Errors leave the pool serving, with no connection lost.
        assert (await _paths(db, tenant)[name][1]("lone", "y", None)).status == "absent"
        assert db.statistics().discarded_total == 0
    assert raised["libpq"] == raised["cursor"]
    assert raised["cursor"][0][1] == "23503"


READ_ONLY_TIMERS = """
CREATE OR REPLACE FUNCTION public.lone_fenced() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'cannot write: fenced' USING ERRCODE = 'read_only_sql_transaction'; END $$;
CREATE TRIGGER fenced BEFORE INSERT OR UPDATE OR DELETE ON queen.timers
FOR EACH STATEMENT EXECUTE FUNCTION public.lone_fenced();
"""


async def test_a_read_only_server_is_unavailable_and_its_connection_closed(
        database_url: str) -> None:
    tenant = _tenant(database_url)
    said: dict[str, list[str]] = {}
    for name in ("cursor", "libpq"):
        said[name] = []
        async with Database(database_url, max_size=1) as db:
            schedule, cancel = _paths(db, tenant)[name]
            for call in (lambda s=schedule: s(_timer("ro")),
                         lambda c=cancel: c("lone", "ro", None)):
                await schedule(_timer("ro"))  # (a pending timer: the cancel has to write)
                with connect(database_url, autocommit=True) as admin:
                    # a server fenced under us: every write to the timers fails with 25006
                    admin.execute(READ_ONLY_TIMERS)
                try:
                    with pytest.raises(DatabaseUnavailable, match="read-only") as caught:
                        await call()
                finally:
                    with connect(database_url, autocommit=True) as admin:
                        admin.execute("DROP TRIGGER fenced ON queen.timers")
                said[name].append(str(caught.value))
                assert db.statistics().size == 0  # closed, never back in the pool
    assert said["libpq"] == said["cursor"]


async def test_a_cancelled_lone_call_leaves_no_connection_in_the_pool(
        db: Database, database_url: str) -> None:
    slow = LoneStatement("SELECT pg_sleep(%(s)s::float8), 1")
    async with db.connection() as conn:
        victim = conn.backend_pid
    started = trio.current_time()
    with trio.move_on_after(0.3):
        await db.lone_row(slow, {"s": "30"})
    assert trio.current_time() - started < 5
    assert db.statistics().discarded_total == 1
    async with db.connection() as conn:
        assert conn.backend_pid != victim
    # and the server was asked to stop it
    with connect(database_url, autocommit=True) as admin:
        for _ in range(100):
            row = admin.execute("SELECT state FROM pg_stat_activity WHERE pid = %s",
                                (victim,)).fetchone()
            if row is None or row["state"] != "active":
                break
            await trio.sleep(0.05)
        else:
            pytest.fail("the cancelled statement kept running on the server")
    # a lone call still runs, on another connection
    assert await db.lone_row(slow, {"s": "0"}) == [b"", b"1"]


async def test_a_lone_statement_deallocated_meanwhile_is_prepared_again(db: Database) -> None:
    statement = LoneStatement("SELECT %(v)s::int + 1")
    assert await db.lone_row(statement, {"v": "1"}) == [b"2"]
    async with db.connection() as conn:  # (psycopg does this after some rollbacks)
        await conn.execute("DEALLOCATE ALL")
    assert await db.lone_row(statement, {"v": "2"}) == [b"3"]
    assert db.statistics().discarded_total == 0

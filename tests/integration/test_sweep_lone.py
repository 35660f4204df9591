"""The sweeper's cycle statement sent straight through libpq (``store.sweep_lone`` over
``Database.lone_rows``, issue 32) against a real PostgreSQL: the same answer as the same
statement through psycopg's cursor (``store.sweep`` in ``run_autocommit``), for timers
PostgreSQL fires, timers claimed for the broker, the next timer's clock row and a pop handed
the fire; and ``lone_rows``' typed rows and errors are a cursor's."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest

from queen_trio.db import Database
from queen_trio.db.bridge import LoneStatement
from queen_trio.log import store as log_store
from queen_trio.log.rules import PopRequest
from queen_trio.timers import store
from queen_trio.timers.store import NextDue, SweepResult

from .test_pop_fire_wait import GROUP, connect, primed
from .test_timer_races import timer


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[Database]:
    async with Database(database_url, max_size=2) as database:
        yield database


Sweep = Callable[..., Awaitable[SweepResult]]


def _paths(db: Database) -> dict[str, Sweep]:
    """The sweep as it was sent (psycopg's cursor) and as the sweeper sends it now (libpq)."""

    async def cursor(*args: Any, **kwargs: Any) -> SweepResult:
        return await db.run_autocommit(store.sweep, *args, **kwargs)

    async def libpq(*args: Any, **kwargs: Any) -> SweepResult:
        return await store.sweep_lone(db, *args, **kwargs)

    return {"cursor": cursor, "libpq": libpq}


def _shape(result: SweepResult, now: float) -> dict[str, Any]:
    """What a sweep answered, with the instants made comparable between two runs."""
    assert isinstance(result.db_now, float) and abs(result.db_now - now) < 60
    return {
        "fired": [(tenant, type(at), at.utcoffset()) for tenant, at in result.fired],
        "claimed": [(c.tenant_id, c.queue.split("-")[0], c.key, c.partition, len(c.txn),
                     type(c.payload), c.payload_zstd, c.payload_bytes, type(c.deliver_at),
                     c.attempts, type(c.due_at)) for c in result.rows],
        "next_due": None if result.next_due is None else round(result.next_due - now, -1),
        "upcoming": None if result.upcoming is None else (
            result.upcoming.tenant_id, result.upcoming.queue.split("-")[0],
            result.upcoming.partition, result.upcoming.due == result.next_due),
        "popped": None if result.popped is None or result.popped.batch is None else [
            (log_store.payload_value(m), m.meta["timer"]["key"])
            for m in result.popped.batch.messages],
    }


async def test_a_lone_sweep_answers_as_the_cursors_sweep(db: Database,
                                                         database_url: str) -> None:
    seen: dict[str, list[dict[str, Any]]] = {}
    for name, sweep in _paths(db).items():
        with connect(database_url) as conn:
            conn.execute("DELETE FROM queen.timers")
            tenant = primed(conn, f"popped-{name}")
            now = conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8 AS t"
                               ).fetchone()["t"]
            with conn.transaction():
                store.schedule_many(conn, tenant, [
                    timer(f"plain-{name}", "a", -20, {"v": "é\n\\\"x"}),
                    timer(f"plain-{name}", "b", -10, [1, 2, 3]),
                    timer(f"zstd-{name}", "big", -5, "x" * 200_000),  # claimed for the broker
                    timer(f"later-{name}", "c", 60_000, 1),  # the clock row's next timer
                ], notify_within_ms=None)
        answers = []
        token = uuid.uuid4()
        first = await sweep(token, "test", 10, 60_000, max_payload=1 << 20)
        answers.append(_shape(first, now))
        assert [c.key for c in first.rows] == ["big"] and len(first.fired) == 2
        assert first.next_due is not None and 59 < first.next_due - now < 61
        # the claimed row, fired by the broker as the sweeper does
        fired = await db.run_transaction(store.fire, token, first.rows, ceilings={},
                                         max_attempts=5, backoff_ms=1000)
        assert [c.key for c in fired.fired] == ["big"]
        # not_before in the past: at once; a batch of one
        answers.append(_shape(await sweep(uuid.uuid4(), "test", 1, 60_000,
                                          max_payload=1 << 20, not_before=now - 1.0), now))
        # a pop handed the fire, in the fire's transaction
        with connect(database_url) as conn, conn.transaction():
            store.schedule_many(conn, tenant, [timer(f"popped-{name}", "p", -10, {"n": 1})],
                                notify_within_ms=None)
        leased = PopRequest(queue=f"popped-{name}", partition=None, group=GROUP, batch=10,
                            wait=True, timeout_ms=5000, auto_ack=False)
        handed = await sweep(uuid.uuid4(), "test", 10, 60_000, max_payload=1 << 20,
                             fire_lock=NextDue(tenant, f"popped-{name}", "Default", 0.0),
                             pop=leased)
        assert handed.popped is not None and handed.popped.batch is not None
        assert handed.popped.batch.lease_id is not None
        answers.append(_shape(handed, now))
        seen[name] = answers
    assert seen["libpq"] == seen["cursor"]
    assert seen["libpq"][2]["popped"] == [({"n": 1}, "p")]
    assert [len(a["fired"]) for a in seen["libpq"]] == [2, 0, 1]


async def test_lone_rows_are_typed_as_a_cursors(db: Database) -> None:
    query = ("SELECT %(n)s::int + g AS n, %(t)s::text || g AS t, now() AS at, NULL::bytea, "
             "'\\x00ff'::bytea AS b, 1.5::float8 AS f, '{\"k\": [1]}'::jsonb AS j "
             "FROM generate_series(1, %(rows)s::int) AS g")
    values: dict[str, str | bytes | None] = {"n": "40", "t": "é-", "rows": "3"}
    async with db.connection() as conn:
        by_cursor = [tuple(r.values()) for r in await conn.fetch(
            query, {"n": 40, "t": "é-", "rows": 3})]
    for binary in (False, True):
        statement = LoneStatement(query)
        rows = await db.lone_rows(statement, statement.params(values), binary=binary)
        assert [r[:2] + r[3:] for r in rows] == [r[:2] + r[3:] for r in by_cursor]
        assert rows[0][:2] == (41, "é-1") and rows[0][4] == b"\x00\xff"
        assert rows[0][6] == {"k": [1]}
        assert isinstance(rows[0][2], datetime) and rows[0][2].utcoffset() == timedelta(0)
    assert await db.lone_rows(statement, statement.params({**values, "rows": "0"})) == []
    with pytest.raises(psycopg.errors.DivisionByZero):
        await db.lone_rows(LoneStatement("SELECT 1 / %(z)s::int"), ["0"])
    # the pool's connections are fine afterwards
    assert await db.lone_rows(LoneStatement("SELECT %(v)s::int"), ["7"]) == [(7,)]

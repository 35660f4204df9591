"""The pool's limits against a real PostgreSQL: a bounded wait for a connection (a 503 with
Retry-After over HTTP), a maximum connection lifetime and an idle limit.

The bounds are small (fractions of a second) and the waits around them wide, so that the tests
hold on a loaded machine."""

from __future__ import annotations

import re
import uuid
from collections.abc import Awaitable, Callable

import httpx
import psycopg
import pytest
import trio

from queen_trio.config import Settings
from queen_trio.db import Database
from queen_trio.errors import PoolExhausted
from queen_trio.server import BrokerHandle, run_broker

from ..conftest import replace_settings


def _backends(url: str, application_name: str) -> set[int]:
    """The server's sessions of one pool (each test names its pool)."""
    with psycopg.connect(url, autocommit=True) as admin:
        rows = admin.execute("SELECT pid FROM pg_stat_activity WHERE application_name = %s",
                             (application_name,)).fetchall()
    return {pid for (pid,) in rows}


async def _until(check: Callable[[], Awaitable[bool]], timeout: float = 10.0) -> None:
    with trio.fail_after(timeout):
        while not await check():
            await trio.sleep(0.05)


async def _pid(db: Database) -> int:
    async with db.connection() as conn:
        return int(await conn.fetchval("SELECT pg_backend_pid()"))


async def test_a_task_waits_at_most_the_bounded_wait_then_is_refused(database_url: str) -> None:
    async with Database(database_url, max_size=1, acquire_timeout_s=0.3) as db:
        async with db.connection():
            started = trio.current_time()
            with pytest.raises(PoolExhausted, match="1 database connections stayed busy"):
                async with db.connection():
                    pass  # never reached
            waited = trio.current_time() - started
        assert 0.25 <= waited < 5
        stats = db.statistics()
        assert (stats.exhausted_total, stats.waiting, stats.in_use) == (1, 0, 0)
        # A connection that comes back within the bound is handed over as before.
        async with trio.open_nursery() as nursery:
            held = trio.Event()

            async def hold_briefly() -> None:
                async with db.connection():
                    held.set()
                    await trio.sleep(0.05)

            nursery.start_soon(hold_briefly)
            await held.wait()
            assert await _pid(db) > 0
        assert db.statistics().exhausted_total == 1


async def test_an_exhausted_pool_answers_503_with_retry_after(settings: Settings) -> None:
    tight = replace_settings(settings, db_pool_size=1, db_pool_wait_ms=300)
    async with trio.open_nursery() as nursery:
        broker: BrokerHandle = await nursery.start(run_broker, tight)
        async with httpx.AsyncClient(base_url=broker.url, timeout=30) as http:
            async with broker.context.db.connection():  # the pool's only connection
                r = await http.get("/api/v1/resources/queues")
            assert r.status_code == 503, r.text
            assert r.headers["Retry-After"] == "1"
            body = r.json()
            assert (body["ok"], body["error"]) == (False, "database_busy")
            assert "stayed busy" in body["message"]
            # The connection is back: the same request is served.
            assert (await http.get("/api/v1/resources/queues")).status_code == 200
            # Operators see it (background work may have been refused meanwhile too).
            metrics = (await http.get("/metrics")).text
            exhausted = re.search(r"^queen_db_pool_exhausted_total (\S+)$", metrics, re.M)
            assert exhausted is not None and float(exhausted[1]) >= 1, metrics[:2000]
            assert 'queen_db_pool_closed_total{reason="idle"}' in metrics
        broker.shutdown()


async def test_a_connection_past_its_lifetime_is_closed_not_reused(database_url: str) -> None:
    name = f"lifetime-{uuid.uuid4().hex[:8]}"
    async with Database(database_url, max_size=1, max_lifetime_s=0.5,
                        application_name=name) as db:
        first = await _pid(db)
        assert await _pid(db) == first  # young: reused
        await trio.sleep(1.0)
        second = await _pid(db)  # old while idle: closed when taken, a fresh one opened
        assert second != first
        assert db.statistics().closed_lifetime_total == 1
        # Old when it comes back: closed then, the pool is left empty.
        async with db.connection():
            await trio.sleep(1.0)
        stats = db.statistics()
        assert (stats.closed_lifetime_total, stats.size, stats.idle) == (2, 0, 0)

        async def server_let_them_go() -> bool:
            return not _backends(database_url, name) & {first, second}

        await _until(server_let_them_go)


async def test_connections_idle_past_the_limit_are_closed_at_the_next_use(
        database_url: str) -> None:
    name = f"idle-{uuid.uuid4().hex[:8]}"
    async with Database(database_url, max_size=3, max_idle_s=0.5,
                        application_name=name) as db:
        async with db.connection(), db.connection(), db.connection():
            pass  # a burst: three connections
        assert db.statistics().idle == 3
        assert len(_backends(database_url, name)) == 3
        await _pid(db)  # used again at once: nothing is idle long enough
        assert db.statistics().closed_idle_total == 0
        await trio.sleep(1.0)
        await _pid(db)  # the next use closes the three, and opens one
        stats = db.statistics()
        assert (stats.closed_idle_total, stats.size, stats.idle) == (3, 1, 1)

        async def one_left() -> bool:
            return len(_backends(database_url, name)) == 1

        await _until(one_left)

"""The trio⇄psycopg pool against a real PostgreSQL: transactions, bounds, cancellation."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator

import psycopg
import pytest
import trio
import trio.testing

from queen_trio.db import Database
from queen_trio.db.rows import DictConnection
from queen_trio.errors import DatabaseUnavailable


def _admin(url: str) -> psycopg.Connection:
    return psycopg.connect(url, autocommit=True)


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[Database]:
    async with Database(database_url, max_size=3) as database:
        async with database.connection() as conn:
            await conn.execute("CREATE TABLE items (id int PRIMARY KEY, note text)")
        yield database


async def _count(db: Database) -> int:
    async with db.connection() as conn:
        return await conn.fetchval("SELECT count(*) FROM items")


async def test_queries_return_dict_rows(db: Database) -> None:
    async with db.connection() as conn:
        assert await conn.execute("INSERT INTO items VALUES (1, 'a'), (2, 'b')") == 2
        assert await conn.fetch("SELECT id, note FROM items ORDER BY id") == [
            {"id": 1, "note": "a"},
            {"id": 2, "note": "b"},
        ]
        assert await conn.fetchrow("SELECT note FROM items WHERE id = %s", (2,)) == {"note": "b"}
        assert await conn.fetchrow("SELECT note FROM items WHERE id = 99") is None
        assert await conn.fetchval("SELECT max(id) FROM items") == 2


async def test_transaction_commits_on_success_and_rolls_back_on_error(db: Database) -> None:
    async with db.transaction() as tx:
        await tx.execute("INSERT INTO items VALUES (1, 'kept')")
    with pytest.raises(RuntimeError):
        async with db.transaction() as tx:
            await tx.execute("INSERT INTO items VALUES (2, 'dropped')")
            raise RuntimeError("boom")
    with pytest.raises(psycopg.errors.UniqueViolation):
        async with db.transaction() as tx:
            await tx.execute("INSERT INTO items VALUES (3, 'dropped too')")
            await tx.execute("INSERT INTO items VALUES (1, 'duplicate')")
    assert await _count(db) == 1
    assert db.statistics().discarded_total == 0  # failed transactions still return clean


async def test_statements_in_a_transaction_share_one_backend(db: Database) -> None:
    async with db.transaction() as tx:
        await tx.execute("INSERT INTO items VALUES (1, 'x')")
        # Another connection must not see the row before commit.
        async with db.connection() as other:
            assert await other.fetchval("SELECT count(*) FROM items") == 0
        assert await tx.fetchval("SELECT count(*) FROM items") == 1
    assert await _count(db) == 1


async def test_run_does_a_whole_transaction_in_one_hop(db: Database) -> None:
    def insert_two(raw: DictConnection, first: int) -> int:
        raw.execute("INSERT INTO items VALUES (%s, 'a'), (%s, 'b')", (first, first + 1))
        return raw.execute("SELECT count(*) AS n FROM items").fetchone()["n"]

    assert await db.run_transaction(insert_two, 10) == 2

    def fails(raw: DictConnection) -> None:
        raw.execute("INSERT INTO items VALUES (20, 'gone')")
        raise ValueError("nope")

    with pytest.raises(ValueError):
        await db.run_transaction(fails)
    assert await _count(db) == 2


async def test_pool_never_exceeds_its_size(db: Database, database_url: str) -> None:
    peak = 0

    async def worker() -> None:
        nonlocal peak
        async with db.connection() as conn:
            peak = max(peak, db.statistics().in_use)
            await conn.execute("SELECT pg_sleep(0.05)")

    async with trio.open_nursery() as nursery:
        for _ in range(12):
            nursery.start_soon(worker)
        await trio.sleep(0.02)
        assert db.statistics().waiting > 0
        with _admin(database_url) as admin:
            backends = admin.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND application_name = 'queen-trio'"
            ).fetchone()[0]
        assert backends <= 3
    assert peak == 3
    stats = db.statistics()
    assert (stats.in_use, stats.waiting, stats.size) == (0, 0, 3)


async def test_cancelled_statement_returns_at_once_and_the_server_stops_it(
    db: Database, database_url: str
) -> None:
    async with db.connection() as conn:
        victim_pid = conn.backend_pid
    started = trio.current_time()
    with trio.move_on_after(0.2):
        async with db.connection() as conn:
            assert conn.backend_pid == victim_pid
            await conn.execute("SELECT pg_sleep(30)")
    assert trio.current_time() - started < 1.0
    # The server was asked to cancel: the backend is idle or gone within moments, not in 30 s.
    with _admin(database_url) as admin:
        for _ in range(50):
            state = admin.execute(
                "SELECT state FROM pg_stat_activity WHERE pid = %s", (victim_pid,)
            ).fetchone()
            if state is None or state[0] != "active":
                break
            trio_sleep_blocking(0.02)
        else:
            pytest.fail("the cancelled statement kept running on the server")
    # The abandoned connection never comes back; the pool still serves.
    assert db.statistics().discarded_total >= 1
    async with db.connection() as conn:
        assert conn.backend_pid != victim_pid
        assert await conn.fetchval("SELECT 1") == 1


def trio_sleep_blocking(seconds: float) -> None:
    import time

    time.sleep(seconds)


async def test_cancellation_inside_a_transaction_rolls_it_back(db: Database) -> None:
    with trio.move_on_after(0.2):
        async with db.transaction() as tx:
            await tx.execute("INSERT INTO items VALUES (1, 'never committed')")
            await trio.sleep(10)  # cancelled here, between statements
    assert await _count(db) == 0
    # The connection went back clean (rolled back), not discarded.
    async with db.connection() as conn:
        assert not conn.in_transaction


async def test_cancelled_mid_statement_in_a_transaction_commits_nothing(db: Database) -> None:
    with trio.move_on_after(0.2):
        async with db.transaction() as tx:
            await tx.execute("INSERT INTO items VALUES (1, 'never committed')")
            await tx.execute("SELECT pg_sleep(30)")
    assert await _count(db) == 0


async def test_run_cancelled_mid_statement_logs_no_failed_rollback(
        db: Database, caplog: pytest.LogCaptureFixture) -> None:
    """A request whose client left while its one-hop transaction ran (the SDK's consume()
    drops its lease lookup when a handler ends first): the pool discards the busy connection,
    so psycopg's attempt to roll back on it cannot work and is not worth a WARNING."""
    def slow(raw: DictConnection) -> None:
        raw.execute("INSERT INTO items VALUES (1, 'never committed')")
        raw.execute("SELECT pg_sleep(30)")

    with caplog.at_level("WARNING"), trio.move_on_after(0.2):
        await db.run_transaction(slow)
    assert [r.getMessage() for r in caplog.records if r.name.startswith("psycopg")] == []
    assert await _count(db) == 0


async def test_unshielded_commit_is_abandoned_when_cancelled_first(db: Database) -> None:
    with trio.CancelScope() as scope:
        async with db.transaction() as tx:
            await tx.execute("INSERT INTO items VALUES (1, 'cancelled')")
            scope.cancel()
    assert await _count(db) == 0


async def test_a_backend_terminated_mid_use_is_unavailable_then_replaced(
    db: Database, database_url: str
) -> None:
    with pytest.raises(DatabaseUnavailable):
        async with db.connection() as conn:
            pid = conn.backend_pid
            with _admin(database_url) as admin:
                admin.execute("SELECT pg_terminate_backend(%s, 2000)", (pid,))
            await conn.fetchval("SELECT 1")
    async with db.connection() as conn:
        assert conn.backend_pid != pid
        assert await conn.fetchval("SELECT 1") == 1


async def test_a_connection_whose_server_went_away_while_idle_is_never_handed_out(
    db: Database, database_url: str
) -> None:
    """After a crash or a failover, idle connections to the old server are replaced when
    taken from the pool, not discovered dead by a request (which would answer 503)."""
    async with db.connection() as conn:
        pid = conn.backend_pid
    discarded = db.statistics().discarded_total
    with _admin(database_url) as admin:
        admin.execute("SELECT pg_terminate_backend(%s, 2000)", (pid,))  # waits for its exit
    await trio.sleep(0.05)  # for its goodbye to cross the loopback
    async with db.connection() as conn:
        assert conn.backend_pid != pid
        assert await conn.fetchval("SELECT 1") == 1
    assert db.statistics().discarded_total == discarded + 1


async def test_closed_pool_refuses_new_work(database_url: str) -> None:
    database = Database(database_url, max_size=1)
    async with database.connection() as conn:
        await conn.fetchval("SELECT 1")
    await database.aclose()
    with pytest.raises(DatabaseUnavailable):
        async with database.connection():
            pass


async def test_unreachable_server_is_database_unavailable() -> None:
    database = Database("postgresql://postgres@127.0.0.1:1/none", max_size=1)
    with pytest.raises(DatabaseUnavailable):
        async with database.connection():
            pass
    assert database.statistics().in_use == 0


async def test_statements_run_in_the_calling_task_and_leave_the_loop_free(db: Database) -> None:
    """The default bridge: psycopg's socket waits are trio's, so a slow statement costs no
    thread and other tasks keep running meanwhile."""
    ticks = 0
    ran_in: list[threading.Thread] = []

    def slow(raw: DictConnection) -> int:
        ran_in.append(threading.current_thread())
        return raw.execute("SELECT pg_sleep(0.3), 7").fetchone()["?column?"]

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await trio.sleep(0.01)
            ticks += 1

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ticker)
        async with db.connection() as conn:
            assert await conn.run_raw(slow) == 7
        nursery.cancel_scope.cancel()
    assert ran_in == [threading.main_thread()]
    assert ticks >= 15  # ~30 possible; a blocked loop would manage 0


async def test_a_free_connection_sends_the_statement_before_other_tasks_run(
        db: Database) -> None:
    """A call that finds a connection free sends its statement before any other ready task
    runs (no pass through the scheduler on the way: a lone call on an idle broker is not
    queued behind a sweeper cycle or a refresh); the wait for the answer lets them run. A
    call that must wait for a connection still lets the others run first."""
    ran: list[str] = []

    def statement(raw: DictConnection) -> int:
        ran.append("statement")
        return raw.execute("SELECT 1 AS one").fetchone()["one"]

    async def other() -> None:
        ran.append("other")

    for _ in range(20):  # (a pass through the scheduler runs the other first half the time)
        ran.clear()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(other)  # ready: runs at the calling task's next schedule point
            assert await db.run_autocommit(statement) == 1
        assert ran == ["statement", "other"]

    ran.clear()
    held = [await db._acquire() for _ in range(db.max_size)]  # every slot taken
    async with trio.open_nursery() as nursery:
        async def waiting() -> None:
            assert await db.run_autocommit(statement) == 1

        nursery.start_soon(waiting)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(other)
        await trio.testing.wait_all_tasks_blocked()
        assert ran == ["other"]  # the waiting call has sent nothing yet
        for conn in held:
            await db._release(conn)
    assert ran == ["other", "statement"]


async def test_run_in_a_worker_thread_uses_one(db: Database) -> None:
    ran_in: list[threading.Thread] = []

    def where(raw: DictConnection) -> int:
        ran_in.append(threading.current_thread())
        return raw.execute("SELECT 1 AS one").fetchone()["one"]

    assert await db.run_transaction_in_thread(where) == 1
    async with db.connection() as conn:
        assert await conn.run_raw_in_thread(where) == 1
    assert len(ran_in) == 2
    assert threading.main_thread() not in ran_in


async def test_a_cancelled_thread_call_returns_at_once_and_the_server_stops_it(
    db: Database, database_url: str
) -> None:
    async with db.connection() as conn:
        victim_pid = conn.backend_pid
    started = trio.current_time()
    with trio.move_on_after(0.2):
        async with db.connection() as conn:
            await conn.run_raw_in_thread(lambda raw: raw.execute("SELECT pg_sleep(30)"))
    assert trio.current_time() - started < 1.0
    with _admin(database_url) as admin:
        for _ in range(100):
            state = admin.execute(
                "SELECT state FROM pg_stat_activity WHERE pid = %s", (victim_pid,)
            ).fetchone()
            if state is None or state[0] != "active":
                break
            trio_sleep_blocking(0.02)
        else:
            pytest.fail("the cancelled statement kept running on the server")
    async with db.connection() as conn:
        assert conn.backend_pid != victim_pid


async def test_a_statement_larger_than_the_socket_buffers_goes_through(db: Database) -> None:
    """Writing a big query blocks on the socket: the write waits (and read-or-write waits)
    are handed to trio as well."""
    big = "x" * (24 * 1024 * 1024)
    async with db.connection() as conn:
        assert await conn.fetchval("SELECT length(%s::text)", (big,)) == len(big)
        echoed = await conn.fetchval("SELECT %s::text || 'y'", (big,))
    assert len(echoed) == len(big) + 1 and echoed.endswith("xy")


async def test_a_connection_given_back_inside_a_transaction_is_rolled_back_and_kept(
        db: Database) -> None:
    """A connection handed back with a transaction open (a BEGIN its borrower never ended)
    is rolled back and kept: the next borrower gets it in autocommit, without the row."""
    async with db.connection() as conn:
        pid = conn.backend_pid
        await conn.execute("BEGIN")
        await conn.execute("INSERT INTO items VALUES (1, 'never committed')")
        assert conn.in_transaction
    async with db.connection() as conn:
        assert conn.backend_pid == pid and not conn.in_transaction
        await conn.execute("INSERT INTO items VALUES (2, 'autocommit')")
    assert await _count(db) == 1
    stats = db.statistics()
    assert (stats.discarded_total, stats.connects_total, stats.in_use) == (0, 1, 0)

"""Brokers find the writable server and never write through a read-only one.

A multi-host URL whose first host is down (a closed port) must serve from the second: the
pool, the LISTEN connection and a whole broker, whose /health says where it is. A read-only
server is what a standby not yet promoted, or a demoted primary, looks like; here it is made
with ``ALTER DATABASE … SET default_transaction_read_only = on`` on the test's own database,
which libpq's ``target_session_attrs=read-write`` refuses at connect as it would a standby.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import psycopg
import pytest
import trio
from psycopg import sql
from psycopg.conninfo import make_conninfo

from queen_trio.config import Settings, load_settings
from queen_trio.db import MISSED, Database, Listener
from queen_trio.db.migrations import apply_migrations
from queen_trio.errors import DatabaseUnavailable
from queen_trio.server import BrokerHandle, run_broker

from ..helpers import eventually
from ..pgserver import url_params, with_dbname
from .test_log import API
from .test_timers import wait_for_messages


def closed_port() -> int:
    """A local TCP port nothing listens on (connection refused, at once)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def multi_host(url: str, *, as_url: bool) -> str:
    """``url`` with a dead host listed before the real one, as a URL or as key=value."""
    p = url_params(url)
    dead = closed_port()
    if as_url:
        auth = p["user"] + (f":{p['password']}" if p.get("password") else "")
        return (f"postgresql://{auth}@127.0.0.1:{dead},{p['host']}:{p['port']}/{p['dbname']}"
                "?target_session_attrs=read-write")
    return make_conninfo(url, host=f"127.0.0.1,{p['host']}", port=f"{dead},{p['port']}")


@contextmanager
def black_hole() -> Iterator[int]:
    """A local TCP port that accepts connections (the kernel completes the handshake) and
    never answers: what a stalled host or a half-open firewall looks like to libpq."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1024)  # never accept()ed: connects succeed, nothing is ever read or said
        yield s.getsockname()[1]


@contextmanager
def read_only_spell(url: str) -> Iterator[None]:
    """The test database's server turns read-only for new sessions (existing ones are ended,
    as a failover ends them), and back when the block ends."""
    name = url_params(url)["dbname"]
    with psycopg.connect(with_dbname(url, "postgres"), autocommit=True) as admin:
        admin.execute(sql.SQL("ALTER DATABASE {} SET default_transaction_read_only = on")
                      .format(sql.Identifier(name)))
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                      "WHERE datname = %s AND pid <> pg_backend_pid()", (name,))
        try:
            yield
        finally:
            admin.execute(sql.SQL("ALTER DATABASE {} RESET default_transaction_read_only")
                          .format(sql.Identifier(name)))


def _notify(url: str, channel: str, payload: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_notify(%s, %s)", (channel, payload))


# -- a dead first host ---------------------------------------------------------------------------


@pytest.mark.parametrize("as_url", [True, False], ids=["url", "conninfo"])
async def test_pool_and_listener_skip_an_unreachable_first_host(
    database_url: str, as_url: bool
) -> None:
    url = multi_host(database_url, as_url=as_url)
    real = url_params(database_url)
    async with Database(url, max_size=2) as db:
        async with db.connection() as conn:
            assert conn.server == (real["host"], int(real["port"]))
            await conn.execute("CREATE TABLE t (x int)")
            assert await conn.execute("INSERT INTO t VALUES (1)") == 1  # writes go through
    listener = Listener(url, ["alpha"])
    async with trio.open_nursery() as nursery:
        await nursery.start(listener.run)
        with listener.subscribe("alpha") as rx:
            await trio.to_thread.run_sync(_notify, database_url, "alpha", "here")
            with trio.fail_after(2):
                item = await rx.receive()
            assert item is not MISSED and item.payload == "here"
        nursery.cancel_scope.cancel()


async def test_a_broker_on_a_multi_host_url_serves_and_says_which_server(
    database_url: str,
) -> None:
    real = url_params(database_url)
    settings = Settings(database_url=multi_host(database_url, as_url=True), port=0,
                        graceful_timeout_ms=1000, db_pool_size=3, sweeper_max_sleep_ms=200)
    async with trio.open_nursery() as nursery:
        broker: BrokerHandle = await nursery.start(run_broker, settings)
        async with httpx.AsyncClient(base_url=broker.url, timeout=10) as http:
            r = await http.get("/health")
            assert r.status_code == 200, r.text
            assert r.json()["server"] == {"host": real["host"], "port": int(real["port"]),
                                          "inRecovery": False}
            r = await http.put(f"{API}/timers/ha/first", json={"delayMs": 0, "payload": 1})
            assert r.json()["status"] == "scheduled"
            assert len(await wait_for_messages(http, "ha", 1)) == 1  # and it fired
        broker.shutdown()


async def test_a_first_host_that_never_answers_delays_start_up_by_the_connect_timeout(
    database_url: str,
) -> None:
    """Every connection tries the silent host first (migrations, the pool, the sweeper's
    pool, the listener): each gives up after QUEEN_DB_CONNECT_TIMEOUT_S and moves on, instead
    of libpq's 130 s."""
    p = url_params(database_url)
    with black_hole() as port:
        url = make_conninfo(database_url, host=f"127.0.0.1,{p['host']}",
                            port=f"{port},{p['port']}")
        settings = load_settings({"QUEEN_DATABASE_URL": url, "QUEEN_PORT": "0",
                                  "QUEEN_DB_POOL_SIZE": "2", "QUEEN_DB_CONNECT_TIMEOUT_S": "2"})
        started = trio.current_time()
        async with trio.open_nursery() as nursery:
            with trio.fail_after(60):  # about 4 connections x 2 s; wide for a loaded machine
                broker: BrokerHandle = await nursery.start(run_broker, settings)
            took = trio.current_time() - started
            async with httpx.AsyncClient(base_url=broker.url, timeout=30) as http:
                # /health gives the database 2 s; when its pool must open a connection, the
                # silent host alone takes the 2 s connect timeout (the services may hold both
                # pooled connections just after start-up), so it is asked again, as a load
                # balancer would.
                with trio.fail_after(30):
                    while (r := await http.get("/health")).status_code != 200:
                        await trio.sleep(0.5)
                assert r.json()["server"]["port"] == int(p["port"])
            broker.shutdown()
    print(f"\nstart-up past a silent first host: {took:.1f} s")


# -- a read-only server --------------------------------------------------------------------------


@pytest.mark.parametrize("form", ["url", "conninfo", "multi-host"])
async def test_a_read_only_server_is_refused_at_connect(database_url: str, form: str) -> None:
    """No target_session_attrs in the URL: the broker asks for read-write itself."""
    p = url_params(database_url)
    url = {
        "url": f"postgresql://{p['user']}@{p['host']}:{p['port']}/{p['dbname']}",
        "conninfo": make_conninfo(database_url),
        "multi-host": multi_host(database_url, as_url=False),
    }[form]
    with read_only_spell(database_url):
        db = Database(url, max_size=1)
        with pytest.raises(DatabaseUnavailable, match="read-only"):
            async with db.connection():
                pass
        assert db.statistics().read_only_refused_total == 1
        assert db.statistics().in_use == 0
        with pytest.raises(psycopg.OperationalError, match="read-only"):
            await Listener(url, ["alpha"]).run()
        with pytest.raises(psycopg.OperationalError, match="read-only"):
            apply_migrations(url)
    # Writable again: the same pool connects.
    async with db.connection() as conn:
        assert await conn.fetchval("SELECT 1") == 1
    await db.aclose()


async def test_with_target_session_attrs_any_the_server_is_still_checked(
    database_url: str,
) -> None:
    """libpq skips its check with ``any`` (one host): the broker looks at what the server
    reported itself and drops the connection all the same."""
    with read_only_spell(database_url):
        db = Database(make_conninfo(database_url, target_session_attrs="any"), max_size=1)
        with pytest.raises(DatabaseUnavailable, match="read-only"):
            async with db.connection():
                pass
        assert db.statistics().read_only_refused_total == 1


async def test_a_pooled_connection_whose_server_turned_read_only_is_never_reused(
    database_url: str,
) -> None:
    async with Database(database_url, max_size=1) as db:
        async with db.connection() as conn:
            await conn.execute("CREATE TABLE t (x int)")
            # The session now reports itself read-only, as every session of a primary fenced
            # with default_transaction_read_only (and a reload) does.
            await conn.execute("SET default_transaction_read_only = on")
            fenced = conn.backend_pid
        async with db.connection() as conn:  # dropped before anything is sent through it
            assert conn.backend_pid != fenced
            assert await conn.execute("INSERT INTO t VALUES (1)") == 1
        assert db.statistics().read_only_dropped_total == 1

        # A write that meets a read-only transaction (SQLSTATE 25006) gets no answer but
        # "unavailable", and its connection is closed rather than returned.
        with pytest.raises(DatabaseUnavailable, match="read-only"):
            async with db.transaction() as tx:
                await tx.execute("SET TRANSACTION READ ONLY")
                refused = tx.backend_pid
                await tx.execute("INSERT INTO t VALUES (2)")
        stats = db.statistics()
        assert (stats.read_only_dropped_total, stats.in_use, stats.idle) == (2, 0, 0)
        async with db.connection() as conn:
            assert conn.backend_pid != refused
            assert await conn.fetch("SELECT x FROM t") == [{"x": 1}]


async def test_the_listener_waits_for_a_writable_server_then_says_missed(
    database_url: str,
) -> None:
    listener = Listener(database_url, ["alpha"], reconnect_initial_s=0.02, reconnect_max_s=0.1)
    async with trio.open_nursery() as nursery:
        await nursery.start(listener.run)
        with listener.subscribe("alpha") as rx:
            with read_only_spell(database_url):
                await eventually(lambda: _true(not listener.connected))
                # It keeps trying; every server that answers is refused.
                await eventually(lambda: _true(listener.statistics().read_only_refused_total
                                               >= 2))
                assert not listener.connected
            with trio.fail_after(5):
                assert await rx.receive() is MISSED  # back: whatever was sent meanwhile is lost
            await trio.to_thread.run_sync(_notify, database_url, "alpha", "after")
            with trio.fail_after(2):
                item = await rx.receive()
            assert item is not MISSED and item.payload == "after"
        nursery.cancel_scope.cancel()


async def _true(value: bool) -> bool:
    return value


@pytest.fixture
def settings(database_url: str) -> Settings:
    return Settings(database_url=database_url, port=0, graceful_timeout_ms=1000, db_pool_size=3,
                    sweeper_min_sleep_ms=5, sweeper_max_sleep_ms=300)


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{name} not in /metrics")


async def test_a_read_only_spell_is_503_for_clients_and_costs_timers_no_attempt(
    broker: BrokerHandle, http: httpx.AsyncClient, database_url: str
) -> None:
    r = await http.put(f"{API}/timers/spell/before", json={"delayMs": 300, "payload": "b"})
    assert r.status_code == 200
    with read_only_spell(database_url):
        # Every request: a clean 503 (its connection was ended, or the server refused).
        for _ in range(3):
            r = await http.put(f"{API}/timers/spell/during", json={"delayMs": 0, "payload": 1})
            assert r.status_code == 503
            body: dict[str, Any] = r.json()
            assert (body["ok"], body["error"]) == (False, "database_unavailable")
            assert r.headers["retry-after"] == "1"  # trouble of the moment: come back
        r = await http.get("/health")
        assert r.status_code == 503
        assert r.json()["server"] is None and "read-only" in r.json()["message"]
        await trio.sleep(0.6)  # "before" falls due; the sweeper meets the read-only server
        text = (await http.get("/metrics")).text
        assert _metric(text, 'queen_db_read_only_connections_total{event="refused"}') >= 2
        assert _metric(text, 'queen_timers_failures_total{kind="transient"}') >= 1
    # Writable again: everything heals by itself and the timer fires, no attempt spent.
    with trio.fail_after(5):
        while (await http.get("/health")).status_code != 200:
            await trio.sleep(0.05)
    got = await wait_for_messages(http, "spell", 1)
    assert [m["data"] for m in got] == ["b"]
    text = (await http.get("/metrics")).text
    assert _metric(text, 'queen_timers_failures_total{kind="permanent"}') == 0
    r = await http.put(f"{API}/timers/spell/after", json={"delayMs": 0, "payload": 2})
    assert r.status_code == 200

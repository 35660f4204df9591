"""A new connection's warm-up (queen_trio/timers/warmup.py) against a real PostgreSQL: it runs
every fire and pop path it is for, with the outcomes those paths give a user, and leaves nothing
behind, not even when a user's timer is due while it runs; a warm-up that fails leaves the
connection usable; a broker warms the connections of both its pools."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import psycopg
import pytest
import trio
from psycopg.rows import dict_row

from queen_trio.log import rotation
from queen_trio.log import store as log_store
from queen_trio.server import BrokerHandle
from queen_trio.timers import store, warmup
from queen_trio.timers.rules import Schedule

from .test_timer_races import default_tenant

TABLES = ("timers", "frames", "queues", "partitions", "cursors", "usage_deltas",
          "dead_letters")


@pytest.fixture
def raw(database_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(database_url, autocommit=True, row_factory=dict_row) as conn:
        yield conn


def _rows(conn: psycopg.Connection[Any]) -> dict[str, int]:
    return {t: conn.execute(f"SELECT count(*) AS n FROM queen.{t}").fetchone()["n"]
            for t in TABLES}


def _recording(monkeypatch: pytest.MonkeyPatch, module: Any, name: str,
               seen: list[tuple[str, Any]]) -> None:
    original: Callable[..., Any] = getattr(module, name)

    def recorded(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        seen.append((name, result))
        return result

    monkeypatch.setattr(module, name, recorded)


def test_warm_up_runs_each_path_and_leaves_nothing(
        raw: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, Any]] = []
    for module, name in ((store, "sweep"), (log_store, "pop"), (log_store, "pop_head"),
                         (log_store, "settle_pop_head"), (store, "cancel")):
        _recording(monkeypatch, module, name, seen)
    before = _rows(raw)

    took = warmup.warm(raw)

    # The paths as a streaming consumer meets them: the first fire creates the partition and
    # the consumer's cursor and hands it the frame; the API's pops find that batch leased and
    # its settlement completes it; the next fire pops its frame, and the last settles that
    # batch and pops its own, in the same statement.
    sweeps = [r for name, r in seen if name == "sweep"]
    assert [len(s.fired) for s in sweeps] == [1, 1, 1]
    assert all(s.popped is not None and s.popped.batch is not None for s in sweeps)
    assert sweeps[2].settled is True
    head = next(r for name, r in seen if name == "pop_head")
    assert head is not None and head.batch is None  # (leased: nothing to pop, no fallback)
    general = next(r for name, r in seen if name == "pop")
    assert general.batch is None
    settled = next(r for name, r in seen if name == "settle_pop_head")
    assert settled is not None and [a.status for a in settled.results] == ["completed"]
    cancelled = next(r for name, r in seen if name == "cancel")
    assert cancelled.status == "cancelled"  # (the lone schedule's timer)
    assert 0 < took < 5

    assert _rows(raw) == before
    assert raw.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert not [k for k in rotation._after if k[1].startswith(warmup.QUEUE_PREFIX)]


def test_a_users_due_timer_is_left_to_the_sweeper(
        raw: psycopg.Connection[Any], database_url: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The warm-up's sweeps take only its own timers, and leave the floor where a user's due
    timer is still seen: the next sweep fires it, once."""
    tenant = default_tenant(raw)
    store.schedule(raw, tenant, Schedule("orders", "o-1", 0, {"n": 1}, "Default", None),
                   notify_within_ms=None)

    seen: list[tuple[str, Any]] = []
    _recording(monkeypatch, store, "sweep", seen)
    with psycopg.connect(database_url, autocommit=True, row_factory=dict_row) as other:
        warmup.warm(other)

    # (Each of its sweeps fired one of its own timers, not the user's.)
    assert [len(s.fired) for _, s in seen] == [1, 1, 1]
    assert raw.execute("SELECT timer_key FROM queen.timers").fetchall() == [
        {"timer_key": "o-1"}]
    assert _rows(raw)["frames"] == 0
    swept = store.sweep(raw, uuid.uuid4(), "test", 10, 30_000, max_payload=1 << 20)
    assert len(swept.fired) == 1
    frames = raw.execute("SELECT payload FROM queen.frames").fetchall()
    assert frames == [{"payload": {"n": 1}}]
    assert raw.execute("SELECT count(*) AS n FROM queen.timers").fetchone() == {"n": 0}


def test_a_failed_warm_up_leaves_the_connection_usable(raw: psycopg.Connection[Any],
                                                       caplog: pytest.LogCaptureFixture) -> None:
    raw.execute("SET default_transaction_read_only = on")  # every write fails
    with caplog.at_level(logging.DEBUG, logger=warmup.__name__):
        warmup.warm(raw)
    assert any("warm-up of a new connection failed" in r.getMessage() and "read-only" in
               r.getMessage() for r in caplog.records)
    assert raw.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert raw.execute("SELECT 1 AS one").fetchone() == {"one": 1}


def test_a_bug_in_the_warm_up_is_logged_and_leaves_nothing(
        raw: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(store, "sweep", broken)
    before = _rows(raw)
    with caplog.at_level(logging.DEBUG, logger=warmup.__name__):
        warmup.warm(raw)
    (failed,) = [r for r in caplog.records if "failed" in r.getMessage()]
    assert failed.levelno == logging.WARNING and failed.exc_info is not None
    assert raw.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert _rows(raw) == before


def test_without_a_default_tenant_it_does_nothing(raw: psycopg.Connection[Any]) -> None:
    raw.execute("UPDATE queen.tenants SET name = 'renamed' WHERE name = 'default'")
    before = _rows(raw)
    warmup.warm(raw)
    assert _rows(raw) == before


@pytest.fixture
def warm_ups(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """The warm-ups' log, from before the broker starts (the ``broker`` fixture's setup)."""
    with caplog.at_level(logging.DEBUG, logger=warmup.__name__):
        yield caplog


async def test_a_broker_warms_both_pools_and_shows_nothing(
        warm_ups: pytest.LogCaptureFixture, broker: BrokerHandle, http: httpx.AsyncClient,
        database_url: str) -> None:
    # The API's first connection is opened (and warmed) at start; the sweeper's at its
    # first cycle.
    with psycopg.connect(database_url, autocommit=True) as conn:
        warmed = {r[0] for r in conn.execute(
            "SELECT application_name FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name LIKE 'queen-trio%'")}
    assert {"queen-trio", "queen-trio-sweeper"} <= warmed
    with trio.move_on_after(10):  # (the sweeper's, as its first cycle opens it)
        while sum("warmed a new connection" in m for m in _messages(warm_ups)) < 2:
            await trio.sleep(0.05)
    messages = _messages(warm_ups)
    assert sum("warmed a new connection" in m for m in messages) >= 2, messages
    assert not [m for m in messages if "failed" in m]
    queues = (await http.get("/api/v1/resources/queues")).json()
    assert not [q for q in _names(queues) if q.startswith(warmup.QUEUE_PREFIX)]


def _messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in (*caplog.get_records("setup"), *caplog.records)]


def _names(answer: Any) -> list[str]:
    items = answer.get("queues", answer) if isinstance(answer, dict) else answer
    return [q["name"] for q in items]

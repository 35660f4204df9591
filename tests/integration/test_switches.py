"""Runtime switches (kv_enabled, timers_schedule_enabled, timers_fire_enabled) against a real
PostgreSQL: what every paused route answers, the routes that are never paused, a paused fire
that loses nothing and fires each timer once at the resume, a CLI flip that two brokers on one
database apply within a second, and Queen's own client (queen-mq) meeting a paused surface."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import uuid
from collections import Counter
from typing import Any

import httpx
import psycopg
import pytest
import trio
from psycopg.rows import dict_row

from queen_trio.server import BrokerHandle
from tests.brokers import BrokerProcess, running_brokers
from tests.timer_ops import timer_op

from .test_queen_mq import _quiet_signals  # noqa: F401 (a fixture)

queen = pytest.importorskip("queen")

SWITCHES = "/api/v1/system/kv-timers"


def sql(url: str, query: str, params: Any = None) -> list[dict[str, Any]]:
    with psycopg.connect(url, row_factory=dict_row, autocommit=True) as conn:
        return conn.execute(query, params).fetchall()


def name() -> str:
    return "q-" + uuid.uuid4().hex[:8]


async def run_cli(database_url: str, *args: str) -> tuple[int, str, str]:
    env = {**os.environ, "QUEEN_DATABASE_URL": database_url}
    env.pop("QUEEN_LOG_LEVEL", None)
    done = await trio.run_process([sys.executable, "-m", "queen_trio", "switches", *args],
                                  env=env, capture_stdout=True, capture_stderr=True,
                                  check=False)
    return done.returncode, done.stdout.decode(), done.stderr.decode()


def assert_paused(r: httpx.Response, code: str, status: int = 503) -> None:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["error"] == code and body["reason"] == code and body["ok"] is False, body
    if status == 503:
        assert r.headers["Retry-After"] == "1"
    else:  # inside a transaction: permanent, nothing to wait for
        assert "Retry-After" not in r.headers


async def flip(http: httpx.AsyncClient, **switches: bool) -> dict[str, Any]:
    r = await http.post(SWITCHES, json=switches)
    assert r.status_code == 200, r.text
    return r.json()


async def schedule(http: httpx.AsyncClient, q: str, keys: list[str], delay_ms: int) -> None:
    r = await http.post("/api/v1/timers",
                        json={"operations": [timer_op(q, k, delay_ms, {"k": k}) for k in keys]})
    assert r.status_code == 200, r.text
    assert [x["status"] for x in r.json()["results"]] == ["scheduled"] * len(keys)


def pending(url: str, q: str) -> int:
    return sql(url, "SELECT count(*) AS n FROM queen.timers WHERE queue = %s", (q,))[0]["n"]


def fired(url: str, q: str) -> Counter[str]:
    """How many frames each timer key has in the log."""
    return Counter(r["key"] for r in sql(
        url, "SELECT f.meta->'timer'->>'key' AS key FROM queen.frames f "
             "JOIN queen.partitions p USING (partition_id) JOIN queen.queues USING (queue_id) "
             "WHERE queen.queues.name = %s", (q,)))


# -- every paused route, and the ones that never are ------------------------------------------


async def test_paused_routes_answer_503_and_the_never_paused_ones_keep_working(
    broker: BrokerHandle, http: httpx.AsyncClient, database_url: str,
) -> None:
    q = name()
    await schedule(http, q, ["keep", "gone"], 3_600_000)
    assert (await flip(http, kv=False, timersSchedule=False)) | {"message": ""} == {
        "kvEnabled": False, "timersScheduleEnabled": False, "timersFireEnabled": True,
        "switches": {"kv_enabled": False, "timers_schedule_enabled": False,
                     "timers_fire_enabled": True}, "message": ""}
    assert sql(database_url, "SELECT name, enabled FROM queen.runtime_switches ORDER BY name") \
        == [{"name": "kv_enabled", "enabled": False},
            {"name": "timers_fire_enabled", "enabled": True},
            {"name": "timers_schedule_enabled", "enabled": False}]

    put = {"op": "put", "ns": "n", "key": "k", "value": 1, "forever": True}
    assert_paused(await http.post("/api/v1/kv", json={"operations": [put]}), "kv_disabled")
    assert_paused(await http.post("/api/v1/kv", json=[{"op": "get", "ns": "n", "key": "k"}]),
                  "kv_disabled")
    assert_paused(await http.get("/api/v1/kv/n/k"), "kv_disabled")
    assert_paused(await http.put("/api/v1/kv/n/k", json={"value": 1, "forever": True}),
                  "kv_disabled")
    assert_paused(await http.delete("/api/v1/kv/n/k"), "kv_disabled")
    assert_paused(await http.post("/api/v1/locks", json=[
        {"op": "acquire", "name": "l", "ttlSeconds": 30}]), "kv_disabled")
    assert_paused(await http.post("/api/v1/timers", json=[timer_op(q, "new", 1000)]),
                  "timers_disabled")
    assert_paused(await http.post("/api/v1/timers", json=[  # a mixed batch: refused whole
        timer_op(q, "keep", 1000, op="reschedule"), timer_op(q, "gone", 0, op="cancel")]),
        "timers_disabled")
    assert_paused(await http.put(f"/api/v1/timers/{q}/new", json={"delay": "1h"}),
                  "timers_disabled")
    # Inside a transaction: 403, permanent, and nothing of the bundle is written.
    push = {"type": "push", "items": [{"queue": q, "payload": {"n": 1}}]}
    assert_paused(await http.post("/api/v1/transaction", json={"operations": [push],
                                                                "kv": [put]}),
                  "kv_disabled", 403)
    assert_paused(await http.post("/api/v1/transaction", json={
        "operations": [push], "timers": [timer_op(q, "new", 1000)]}), "timers_disabled", 403)
    assert sql(database_url, "SELECT count(*) AS n FROM queen.frames")[0]["n"] == 0
    assert sql(database_url, "SELECT count(*) AS n FROM queen.kv")[0]["n"] == 0

    # Never paused: cancels (DELETE, a batch of cancels only, a bundle's cancel) and reads.
    r = await http.delete(f"/api/v1/timers/{q}/gone")
    assert (r.status_code, r.json()["status"]) == (200, "cancelled")
    r = await http.post("/api/v1/timers", json=[timer_op(q, "never", 0, op="cancel")])
    assert (r.status_code, r.json()["results"][0]["status"]) == (200, "absent")
    r = await http.post("/api/v1/transaction", json={
        "operations": [push], "timers": [timer_op(q, "never", 0, op="cancel")]})
    assert r.status_code == 200 and r.json()["success"] is True, r.text
    r = await http.get(f"/api/v1/timers/{q}/keep")
    assert (r.status_code, r.json()["found"]) == (200, True)
    r = await http.get(f"/api/v1/timers/{q}")
    assert (r.status_code, [t["timerKey"] for t in r.json()["rows"]]) == (200, ["keep"])
    r = await http.get(f"/api/v1/timers/{q}", params={"mode": "count", "prefix": "k"})
    assert (r.status_code, r.json()["count"]) == (200, 1)
    # The operator sees the state, and /metrics has it.
    r = await http.get(SWITCHES)
    assert r.json()["switches"] == {"kv_enabled": False, "timers_schedule_enabled": False,
                                    "timers_fire_enabled": True}
    text = (await http.get("/metrics")).text
    assert 'queen_switch_enabled{switch="kv_enabled"} 0.0' in text
    assert 'queen_switch_enabled{switch="timers_fire_enabled"} 1.0' in text

    await flip(http, kv=True, timersSchedule=True)
    r = await http.post("/api/v1/kv", json={"operations": [put]})
    assert r.status_code == 200 and r.json()["results"][0]["applied"] is True, r.text
    r = await http.post("/api/v1/timers", json=[timer_op(q, "new", 3_600_000)])
    assert r.status_code == 200 and r.json()["results"][0]["status"] == "scheduled"
    r = await http.post("/api/v1/transaction", json={"operations": [push], "kv": [
        {**put, "key": "k2"}], "timers": [timer_op(q, "newer", 3_600_000)]})
    assert r.status_code == 200 and r.json()["success"] is True, r.text
    assert 'queen_switch_enabled{switch="kv_enabled"} 1.0' in (await http.get("/metrics")).text


async def test_the_operator_route_refuses_a_bad_body(http: httpx.AsyncClient) -> None:
    for body, code in (({}, "missing_field"), ({"kv": "off"}, "invalid_field"),
                       ({"kv": False, "push": False}, "unknown_field")):
        r = await http.post(SWITCHES, json=body)
        assert (r.status_code, r.json()["error"]) == (400, code), r.text
    assert (await http.get(SWITCHES)).json()["kvEnabled"] is True  # nothing was changed


# -- a paused fire ---------------------------------------------------------------------------


async def test_a_paused_fire_loses_nothing_and_fires_each_timer_once_at_the_resume(
    broker: BrokerHandle, http: httpx.AsyncClient, database_url: str,
) -> None:
    q = name()
    await flip(http, timersFire=False)
    keys = [f"t{i}" for i in range(20)]
    await schedule(http, q, keys[:10], 0)  # due at once
    await schedule(http, q, keys[10:], 200)
    wakeups_before = _wakeups((await http.get("/metrics")).text)
    await trio.sleep(1.5)  # well past every due instant, and past the sweeper's longest sleep
    assert pending(database_url, q) == 20
    assert fired(database_url, q) == Counter()
    # It waits for the resume rather than wake for the due timers (no spinning).
    assert _wakeups((await http.get("/metrics")).text) - wakeups_before <= 2
    # Reads and cancels still work while the fire is paused.
    r = await http.delete(f"/api/v1/timers/{q}/t0")
    assert r.json()["status"] == "cancelled"

    await flip(http, timersFire=True)
    with trio.fail_after(10):
        while pending(database_url, q):
            await trio.sleep(0.05)
    assert fired(database_url, q) == Counter({k: 1 for k in keys[1:]})
    r = await http.get(f"/api/v1/pop/queue/{q}", params={"batch": 100, "wait": "false",
                                                         "autoAck": "true"})
    assert sorted(m["data"]["k"] for m in r.json()["messages"]) == sorted(keys[1:])


async def test_a_pause_answered_mid_drain_means_nothing_more_fires_until_the_resume(
    broker: BrokerHandle, http: httpx.AsyncClient, database_url: str,
) -> None:
    """The pause's answer is the line: a backlog draining when the operator pauses stops, and
    not one more frame is appended after the answer (a cycle in flight at the flip, even one
    draining in the worker thread, ends before it), until the resume fires the rest once."""
    q = name()
    await flip(http, timersFire=False)
    n, bundle = 12_000, 250
    for at in range(0, n, bundle):
        await schedule(http, q, [f"b{i}" for i in range(at, at + bundle)], 0)
    await flip(http, timersFire=True)
    with trio.fail_after(30):
        while not frames(database_url, q):
            await trio.sleep(0.002)
    await flip(http, timersFire=False)
    at_answer = frames(database_url, q)
    await trio.sleep(1.0)
    assert frames(database_url, q) == at_answer, "a frame was appended after the pause's answer"
    assert pending(database_url, q) == n - at_answer > 0, "the drain was over before the pause"

    await flip(http, timersFire=True)
    with trio.fail_after(60):
        while pending(database_url, q):
            await trio.sleep(0.05)
    assert fired(database_url, q) == Counter({f"b{i}": 1 for i in range(n)})


def frames(url: str, q: str) -> int:
    return sql(url, "SELECT count(*) AS n FROM queen.frames f JOIN queen.partitions p "
                    "USING (partition_id) JOIN queen.queues USING (queue_id) "
                    "WHERE queen.queues.name = %s", (q,))[0]["n"]


def _wakeups(metrics: str) -> float:
    return sum(float(line.split()[-1]) for line in metrics.splitlines()
               if line.startswith("queen_sweeper_wakeups_total"))


# -- two brokers, the CLI ----------------------------------------------------------------------


async def _until(predicate: Any, within: float) -> float:
    """Seconds until ``await predicate()`` is true; fails after ``within``."""
    started = time.monotonic()
    with trio.fail_after(within):
        while not await predicate():
            await trio.sleep(0.01)
    return time.monotonic() - started


async def test_a_cli_flip_reaches_two_brokers_on_one_database_within_a_second(
    database_url: str,
) -> None:
    q = name()
    async with running_brokers(database_url, 2) as brokers, httpx.AsyncClient(timeout=10) as h:

        async def kv_status(b: BrokerProcess) -> int:
            r = await h.post(f"{b.url}/api/v1/kv", json=[{"op": "get", "ns": "n", "key": "k"}])
            return r.status_code

        async def all_kv(status: int) -> bool:
            return all([await kv_status(b) == status for b in brokers])

        assert await all_kv(200)
        code, out, err = await run_cli(database_url, "pause", "kv", "timers-fire")
        assert code == 0, err
        assert "kv_enabled               PAUSED" in out and "every broker" in err
        seen = await _until(lambda: all_kv(503), within=1.0)
        for b in brokers:
            assert_paused(await h.post(f"{b.url}/api/v1/kv", json=[
                {"op": "get", "ns": "n", "key": "k"}]), "kv_disabled")
            assert 'queen_switch_enabled{switch="kv_enabled"} 0.0' in (
                await h.get(f"{b.url}/metrics")).text

        # Both sweepers hold: timers due now stay pending.
        for i, b in enumerate(brokers):
            r = await h.post(f"{b.url}/api/v1/timers", json=[
                timer_op(q, f"b{i}-{j}", 0, {"j": j}) for j in range(10)])
            assert r.status_code == 200, r.text
        await trio.sleep(1.5)
        assert pending(database_url, q) == 20 and fired(database_url, q) == Counter()

        code, out, err = await run_cli(database_url, "--json")
        assert code == 0 and json.loads(out) == {
            "kv_enabled": False, "timers_schedule_enabled": True, "timers_fire_enabled": False}
        code, out, err = await run_cli(database_url, "resume", "kv_enabled", "timers_fire")
        assert code == 0, err
        back = await _until(lambda: all_kv(200), within=1.0)
        with trio.fail_after(10):
            while pending(database_url, q):
                await trio.sleep(0.05)
        assert fired(database_url, q) == Counter(
            {f"b{i}-{j}": 1 for i in range(2) for j in range(10)})
    print(f"CLI flip seen by both brokers after {seen * 1000:.0f} ms (pause), "
          f"{back * 1000:.0f} ms (resume)")


async def test_the_cli_refuses_an_unknown_switch(database_url: str) -> None:
    code, _, err = await run_cli(database_url, "pause", "push")
    assert code == 2 and "no switch 'push'" in err
    assert sql(database_url, "SELECT bool_and(enabled) AS on FROM queen.runtime_switches") \
        == [{"on": True}]


# -- Queen's own client ------------------------------------------------------------------------


async def test_queen_mq_meets_a_paused_surface_as_it_expects(
    broker: BrokerHandle, http: httpx.AsyncClient,
) -> None:
    """queen-mq retries a 5xx (its retry_attempts, with back-off), then raises its typed error
    carrying the code and Retry-After; a paused rider in a transaction (403) is not retried."""
    q = name()
    await flip(http, kv=False, timersSchedule=False)

    async def refused() -> list[Any]:
        c = queen.Queen(url=broker.url, retry_attempts=1, timeout_millis=10_000)
        try:
            out: list[tuple[Any, ...]] = []
            for call in (lambda: c.kv.put("n", "k", 1, forever=True),
                         lambda: c.timers.schedule(q, "k", {"a": 1}, delay_ms=60_000)):
                try:
                    await call()
                except queen.errors.QueenHttpError as exc:
                    out.append((type(exc).__name__, exc.status, exc.code,
                                exc.retry_after_seconds))
            try:
                await c.transaction().kv.put("n", "k", 1, forever=True).commit()
            except Exception as exc:  # queen-mq raises the 403 as it arrives (not retried)
                out.append((type(exc).__name__, str(exc)))
            return out
        finally:
            await c.close()

    assert await trio.to_thread.run_sync(asyncio.run, refused()) == [
        ("KvError", 503, "kv_disabled", 1.0), ("TimerError", 503, "timers_disabled", 1.0),
        ("HTTPStatusError", "kv_disabled")]

    # With its default retries, a pause shorter than its back-off is not even seen.
    async def retried() -> Any:
        c = queen.Queen(url=broker.url, retry_attempts=3, retry_delay_millis=500,
                        timeout_millis=10_000)
        try:
            return await c.kv.put("n", "k", {"v": 1}, forever=True)
        finally:
            await c.close()

    async with trio.open_nursery() as nursery:
        async def resume_soon() -> None:
            await trio.sleep(0.2)
            await flip(http, kv=True)
        nursery.start_soon(resume_soon)
        put = await trio.to_thread.run_sync(asyncio.run, retried())
    assert put["value"] == {"v": 1}


async def test_a_switch_changed_by_hand_in_psql_is_seen_within_a_second(
    broker: BrokerHandle, http: httpx.AsyncClient, database_url: str,
) -> None:
    """No NOTIFY is sent then: the broker's half-second re-read finds it."""
    async def kv_status() -> int:
        return (await http.get("/api/v1/kv/n/k")).status_code

    sql(database_url, "UPDATE queen.runtime_switches SET enabled = false "
                      "WHERE name = 'kv_enabled' RETURNING name")
    await _until(lambda: _is(kv_status, 503), within=1.0)
    sql(database_url, "DELETE FROM queen.runtime_switches WHERE name = 'kv_enabled' "
                      "RETURNING name")
    await _until(lambda: _is(kv_status, 200), within=1.0)  # no row: on


async def _is(status: Any, expected: int) -> bool:
    return await status() == expected

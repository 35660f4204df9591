"""Queen's reads by offset and partition discovery, retention as a user sees it and
maxWaitTimeSeconds eviction, through Queen's own client (``queen-mq`` 2.6.0), and the JSON 404s
of the surfaces this broker does not serve."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
import trio

from queen_trio.server import BrokerHandle

from .test_queen_mq import _quiet_signals, name, run

queen = pytest.importorskip("queen")
__all__ = ["_quiet_signals"]
API = "/api/v1"


# -- fetch ------------------------------------------------------------------------------------


async def test_fetch_reads_by_offset_without_a_lease(broker: BrokerHandle) -> None:
    q = name()

    async def flow(c: Any) -> None:
        await c.queue(q).partition("eu").push([{"transactionId": f"t{i}", "data": {"n": i}}
                                               for i in range(5)])
        await c.queue(q).partition("us").push([{"data": {"n": 9}}])
        read = await c.queue(q).fetch(["eu", "us", "nobody"])
        eu = read["eu"]
        assert [r["offset"] for r in eu["records"]] == [0, 1, 2, 3, 4]
        assert [r["payload"] for r in eu["records"]] == [{"n": i} for i in range(5)]
        assert [r["transactionId"] for r in eu["records"]] == [f"t{i}" for i in range(5)]
        assert all(r["ts"].endswith("Z") for r in eu["records"])
        assert (eu["highWatermark"], eu["logStartOffset"], eu["nextOffset"]) == (5, 0, 5)
        assert [r["payload"] for r in read["us"]["records"]] == [{"n": 9}]
        assert read["nobody"]["records"] == [] and read["nobody"]["highWatermark"] == 0
        # From an offset, and again: the same answer (nothing was leased or moved).
        later = await c.queue(q).fetch("eu", offsets={"eu": 3})
        assert [r["offset"] for r in later["eu"]["records"]] == [3, 4]
        assert (await c.queue(q).fetch("eu", offsets={"eu": 3})) == later
        # A pop still gets everything: the fetches moved no cursor.
        msgs = await c.queue(q).partition("eu").batch(10).wait(False).pop()
        assert [m["data"]["n"] for m in msgs] == [0, 1, 2, 3, 4]

    await run(broker, flow)


async def test_fetch_pages_by_bytes_and_answers_each_entrys_bounds(
    broker: BrokerHandle, http: httpx.AsyncClient,
) -> None:
    q = name()
    big = "x" * 1000
    r = await http.post(f"{API}/push", json={"items": [
        {"queue": q, "payload": {"i": i, "pad": big}} for i in range(30)]})
    assert r.status_code == 201
    # 30 records of ~1 KB with a 5 KB budget: the client asks again until the high watermark.
    read = await run(broker, lambda c: c.queue(q).fetch("Default", max_bytes=5000))
    assert [rec["payload"]["i"] for rec in read["Default"]["records"]] == list(range(30))
    # One raw call: the budget cuts the answer, never below one record.
    one = (await http.post(f"{API}/fetch", json={"entries": [
        {"queue": q, "partition": "Default", "offset": 0, "maxBytes": 1}]})).json()
    assert [rec["offset"] for rec in one["entries"][0]["records"]] == [0]
    some = (await http.post(f"{API}/fetch", json={"entries": [
        {"queue": q, "offset": 10, "maxBytes": 5000}]})).json()["entries"][0]
    assert [rec["offset"] for rec in some["records"]] == [10, 11, 12, 13]
    assert (some["partition"], some["highWatermark"], some["logStartOffset"]) == \
        ("Default", 30, 0)
    assert "error" not in some


async def test_fetch_errors_per_entry_and_bad_requests(http: httpx.AsyncClient) -> None:
    q = name()
    await http.post(f"{API}/push", json={"items": [{"queue": q, "payload": i} for i in range(3)]})
    r = await http.post(f"{API}/fetch", json={"entries": [
        {"queue": q, "offset": 3},           # caught up: valid and empty
        {"queue": q, "offset": 4},           # past the high watermark
        {"queue": "no-such-queue", "offset": 0},
    ]})
    assert r.status_code == 200
    caught_up, past, unknown = r.json()["entries"]
    assert caught_up["records"] == [] and "error" not in caught_up
    assert (past["error"], past["highWatermark"], past["logStartOffset"]) == \
        ("OFFSET_OUT_OF_RANGE", 3, 0)
    assert unknown["error"] == "UNKNOWN_TOPIC_OR_PARTITION"
    assert (await http.post(f"{API}/fetch", json={"entries": []})).json() == {"entries": []}
    for body, code in [
        ({"entries": [{"queue": q, "offset": -1}]}, "invalid_field"),
        ({"entries": [{"queue": q}]}, "missing_field"),
        ({"entries": [{"offset": 0}]}, "missing_field"),
        ({"entries": [{"queue": q, "offset": 0, "colour": 1}]}, "unknown_field"),
        ({"entries": [{"queue": q, "offset": 0}] * 1025}, "too_many_entries"),
        ({"entries": "all"}, "invalid_field"),
    ]:
        r = await http.post(f"{API}/fetch", json=body)
        assert r.status_code == 400, body
        assert r.json()["error"] == code, (body, r.text)


async def test_a_parked_fetch_answers_when_a_record_arrives(
    broker: BrokerHandle, http: httpx.AsyncClient,
) -> None:
    q = name()
    await http.post(f"{API}/push", json={"items": [{"queue": q, "payload": 0}]})
    got: dict[str, Any] = {}

    async def parked() -> None:
        started = trio.current_time()
        r = await http.post(f"{API}/fetch", json={"maxWaitMs": 20_000, "entries": [
            {"queue": q, "offset": 1}]})
        got["answer"] = r.json()["entries"][0]
        got["after_s"] = trio.current_time() - started

    async with trio.open_nursery() as nursery:
        nursery.start_soon(parked)
        await trio.sleep(0.5)
        await http.post(f"{API}/push", json={"items": [{"queue": q, "payload": 1}]})
    assert [rec["payload"] for rec in got["answer"]["records"]] == [1]
    assert 0.4 < got["after_s"] < 15


# -- partitions changed -----------------------------------------------------------------------


async def test_changed_since_lists_partitions_and_what_moved(broker: BrokerHandle) -> None:
    q = name()

    async def flow(c: Any) -> None:
        for p in ("b", "a", "c"):
            await c.queue(q).partition(p).push([{"data": {"p": p}}, {"data": {"p": p}}])
        every = await c.queue(q).changed_since()
        assert [p["name"] for p in every["partitions"]] == ["a", "b", "c"]
        assert all((p["lastOffset"], p["logStart"]) == (1, 0) for p in every["partitions"])
        assert every["safeTime"] is not None
        await asyncio.sleep(0.05)
        mark = datetime.now(UTC)
        await asyncio.sleep(0.05)
        await c.queue(q).partition("b").push([{"data": {"p": "b"}}])
        moved = await c.queue(q).changed_since(mark)
        assert [(p["name"], p["lastOffset"]) for p in moved["partitions"]] == [("b", 2)]
        # safeTime lags now(): passing it as the next since sees at least what moved after it.
        assert datetime.fromisoformat(moved["safeTime"]) < datetime.now(UTC)
        again = await c.queue(q).changed_since(moved["safeTime"])
        assert "b" in [p["name"] for p in again["partitions"]]
        # A queue that does not exist has none.
        assert (await c.queue(name()).changed_since())["partitions"] == []

    await run(broker, flow)


async def test_changed_pages_with_an_opaque_cursor(http: httpx.AsyncClient) -> None:
    q = name()
    await http.post(f"{API}/push", json={"items": [
        {"queue": q, "partition": f"p{i:02d}", "payload": i} for i in range(7)]})
    since = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
    for mode in ({}, {"since": since}):
        names: list[str] = []
        after = None
        pages = 0
        while True:
            entry = {"queue": q, "limit": 3, **mode, **({"after": after} if after else {})}
            r = (await http.post(f"{API}/partitions/changed", json={"entries": [entry]})).json()
            page = r["entries"][0]
            names += [p["name"] for p in page["partitions"]]
            pages += 1
            after = page["next"]
            if after is None:
                break
        assert sorted(names) == [f"p{i:02d}" for i in range(7)] and len(names) == 7, mode
        assert pages == 3
    # A cursor of the other mode is refused by name, not restarted quietly.
    first = (await http.post(f"{API}/partitions/changed", json={"entries": [
        {"queue": q, "limit": 3}]})).json()["entries"][0]
    wrong = (await http.post(f"{API}/partitions/changed", json={"entries": [
        {"queue": q, "since": since, "after": first["next"]}]})).json()
    assert wrong["entries"][0] == {"queue": q, "error": "BAD_CURSOR"}
    # An empty batch answers the watermark alone.
    only = (await http.post(f"{API}/partitions/changed", json={"entries": []})).json()
    assert only["entries"] == [] and only["safeTimeDegraded"] is False
    for body, code in [({"entries": [{"queue": q, "since": "yesterday"}]}, "invalid_timestamp"),
                       ({"entries": [{"queue": q}] * 65}, "too_many_entries"),
                       ({"entries": [{"queue": q, "after": 5}]}, "invalid_field")]:
        r = await http.post(f"{API}/partitions/changed", json=body)
        assert (r.status_code, r.json()["error"]) == (400, code), body


async def test_safe_time_waits_for_an_open_write(
    broker: BrokerHandle, http: httpx.AsyncClient, database_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A transaction still open pins safeTime at or before its start: what it writes can never
    land below a safeTime a reader already acted on."""
    import psycopg

    from queen_trio.log import reads

    # A 1-second guard instead of 5: the property is the same, the wait past it shorter.
    monkeypatch.setattr(reads, "SAFE_TIME_GUARD_S", 1)
    with psycopg.connect(database_url) as held:
        started = held.execute("SELECT now()").fetchone()[0]  # opens a transaction
        await trio.sleep(1.5)  # past the guard
        r = (await http.post(f"{API}/partitions/changed", json={"entries": []})).json()
        assert datetime.fromisoformat(r["safeTime"]) <= started
        held.rollback()
    r = (await http.post(f"{API}/partitions/changed", json={"entries": []})).json()
    assert datetime.fromisoformat(r["safeTime"]) > started


# -- retention and eviction, as a user sees them ----------------------------------------------


async def log_start_reaches(c: Any, q: str, offset: int, within_s: float) -> None:
    """Wait until the Default partition's log starts at ``offset`` (housekeeping dropped what
    was before it); fail if it has not within ``within_s``."""
    deadline = asyncio.get_running_loop().time() + within_s
    while (start := (await c.queue(q).fetch("Default"))["Default"]["logStartOffset"]) != offset:
        assert asyncio.get_running_loop().time() < deadline, (q, start, offset)
        await asyncio.sleep(0.1)


async def test_a_pop_never_returns_a_message_older_than_retention_seconds(
    broker: BrokerHandle,
) -> None:
    """retentionSeconds applies to messages not yet sealed into a segment (a part-filled head
    is sealed only after QUEEN_SEGMENT_MAX_AGE_MS, ten minutes)."""
    q = name()

    async def flow(c: Any) -> None:
        await c.queue(q).config({"retentionSeconds": 2, "retentionEnabled": True}).create()
        await c.queue(q).push([{"data": {"n": i}} for i in range(20)])
        # retentionSeconds + housekeeping rounds (1 s apart), with a wide margin: the log's
        # start moves past the 20 within 8 s.
        await log_start_reaches(c, q, 20, within_s=8)
        await c.queue(q).push([{"data": {"n": "fresh"}}])
        msgs = await c.queue(q).batch(100).wait(False).pop()
        assert [m["data"]["n"] for m in msgs] == ["fresh"]
        read = await c.queue(q).fetch("Default")
        assert read["Default"]["logStartOffset"] == 20
        assert [r["payload"]["n"] for r in read["Default"]["records"]] == ["fresh"]

    await run(broker, flow)


async def test_max_wait_time_evicts_messages_that_waited_too_long(broker: BrokerHandle) -> None:
    """maxWaitTimeSeconds as Queen: a message that has waited longer is dropped, not
    dead-lettered, for every consumer group; a fresh one is served."""
    q, calm = name(), name()

    async def flow(c: Any) -> None:
        created = await c.queue(q).config({"maxWaitTimeSeconds": 2}).create()
        assert created["options"]["maxWaitTimeSeconds"] == 2
        assert "maxWaitTimeSeconds" not in created["ignored"]
        await c.queue(calm).create()  # no maxWaitTimeSeconds: nothing is evicted
        for queue in (q, calm):
            await c.queue(queue).push([{"data": {"n": i}} for i in range(5)])
        fast = await c.queue(q).group("fast").batch(3).wait(False).pop()
        await c.ack(fast, True, {"group": "fast"})  # fast has had 0-2; slow nothing yet
        await log_start_reaches(c, q, 5, within_s=8)  # evicted by a housekeeping round
        await c.queue(q).push([{"data": {"n": "fresh"}}])
        for group in ("fast", "slow"):
            got = await c.queue(q).group(group).batch(10).wait(False).pop()
            assert [m["data"]["n"] for m in got] == ["fresh"], group
        assert (await c.queue(q).fetch("Default"))["Default"]["logStartOffset"] == 5
        assert (await c.queue(q).dlq().limit(10).get())["messages"] == []
        kept = await c.queue(calm).batch(10).wait(False).pop()
        assert [m["data"]["n"] for m in kept] == [0, 1, 2, 3, 4]

    await run(broker, flow)


# -- what is not served -----------------------------------------------------------------------


@pytest.mark.parametrize(("method", "path", "code"), [
    ("POST", "/api/v1/ephemeral/push", "ephemeral_unsupported"),
    ("POST", "/api/v1/ephemeral/configure", "ephemeral_unsupported"),
    ("GET", "/api/v1/ephemeral/queues", "ephemeral_unsupported"),
    ("DELETE", "/api/v1/ephemeral/queue/q", "ephemeral_unsupported"),
    ("POST", "/streams/v1/queries", "streams_unsupported"),
    ("POST", "/streams/v1/cycle", "streams_unsupported"),
    ("GET", "/api/v1/system/maintenance", "maintenance_unsupported"),
    ("POST", "/api/v1/system/maintenance", "maintenance_unsupported"),
    ("POST", "/api/v1/system/maintenance/pop", "maintenance_unsupported"),
])
async def test_unsupported_surfaces_answer_a_json_404_saying_why(
    http: httpx.AsyncClient, method: str, path: str, code: str,
) -> None:
    r = await http.request(method, path, json={})
    assert r.status_code == 404
    body = r.json()
    assert (body["error"], body["ok"]) == (code, False)
    assert "not supported" in body["message"] or "no maintenance mode" in body["message"]


async def test_queen_mq_ephemeral_calls_fail_with_its_unsupported_error(
    broker: BrokerHandle,
) -> None:
    async def flow(c: Any) -> str:
        try:
            await c.ephemeral.push("q", {"n": 1})
        except queen.EphemeralError as exc:
            return str(exc.code)
        return "no error"

    assert await run(broker, flow) == queen.EPHEMERAL_UNSUPPORTED

"""Timers on Queen's wire, driven through Queen's own client (``queen-mq`` 2.6.0, unchanged)
against a broker and a real PostgreSQL, plus the refusals queen-mq never lets reach the wire
(it checks some fields itself), sent by hand.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
import uuid
from collections import Counter
from typing import Any

import httpx
import psycopg
import pytest
import trio
import zstandard
from psycopg.rows import dict_row

from queen_trio.config import Settings
from queen_trio.server import BrokerHandle

from .test_queen_mq import _quiet_signals, name, run  # noqa: F401 (_quiet_signals: a fixture)

queen = pytest.importorskip("queen")
TimerError = pytest.importorskip("queen.errors").TimerError
ops = pytest.importorskip("queen.timers.ops")

API = "/api/v1"
HORIZON_S = 3600


@pytest.fixture
def settings(database_url: str) -> Settings:
    return Settings(database_url=database_url, port=0, graceful_timeout_ms=1000, db_pool_size=5,
                    sweeper_min_sleep_ms=5, sweeper_max_sleep_ms=500,
                    timers_max_horizon_s=HORIZON_S)


def sql(url: str, query: str, params: Any = None) -> list[dict[str, Any]]:
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        cur = conn.execute(query, params)
        return cur.fetchall() if cur.description else []


async def asql(url: str, query: str, params: Any = None) -> list[dict[str, Any]]:
    return await trio.to_thread.run_sync(sql, url, query, params)


async def pop_until(c: Any, queue: str, n: int = 1, timeout_s: float = 10.0) -> list[Any]:
    """What a Queen user does: pop until ``n`` messages came (the client runs in asyncio)."""
    got: list[Any] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < n and time.monotonic() < deadline:
        got += await (c.queue(queue).batch(n).commit_on_delivery().wait(True).timeout_millis(1000)
                      .pop())
    return got


def claim_all(url: str) -> None:
    """What a sweeper's claim does to every pending timer: a token, and invisible for an hour."""
    sql(url, "UPDATE queen.timers SET claim_token = gen_random_uuid(), "
             "visible_at = now() + interval '1 hour'")


# -- schedule, fire, the promised message id --------------------------------------------------


async def test_a_schedule_promises_the_message_id_the_fired_frame_carries(
    broker: BrokerHandle,
) -> None:
    q = name()

    async def flow(c: Any) -> tuple[Any, list[Any]]:
        res = await c.timers.schedule(q, "trial-ending:42", {"accountId": 42}, delay_ms=300)
        return res, await pop_until(c, q)

    res, messages = await run(broker, flow)
    assert (res["ok"], res["status"], res["queue"], res["timerKey"]) == (
        True, "scheduled", q, "trial-ending:42")
    assert uuid.UUID(res["messageId"]).version == 7
    # (a version 7 UUID starts with its minting instant, in Unix milliseconds)
    assert abs(int(res["messageId"][:13].replace("-", ""), 16) / 1000 - time.time()) < 600
    assert res["deliverAt"].endswith("Z") and res["txn"]
    (m,) = messages
    assert m["id"] == res["messageId"]  # the id promised at schedule time
    assert m["transactionId"] == res["txn"]  # the txn the client minted
    assert m["data"] == {"accountId": 42}  # the JSON the client encoded


async def test_reschedule_is_an_upsert_that_replaces_payload_id_and_instant(
    broker: BrokerHandle, database_url: str
) -> None:
    q = name()

    async def flow(c: Any) -> tuple[Any, Any, Any, list[Any]]:
        first = await c.timers.schedule(q, "k", {"v": 1}, delay_ms=600_000)
        again = await c.timers.schedule(q, "k", {"v": 2}, delay_ms=600_000)
        moved = await c.timers.reschedule(q, "k", {"v": 3}, delay_ms=200)
        return first, again, moved, await pop_until(c, q)

    first, again, moved, messages = await run(broker, flow)
    assert (first["status"], again["status"], moved["status"]) == (
        "scheduled", "rescheduled", "rescheduled")
    assert len({first["messageId"], again["messageId"], moved["messageId"]}) == 3
    assert moved["deliverAt"] < first["deliverAt"]
    assert [(m["data"], m["id"]) for m in messages] == [({"v": 3}, moved["messageId"])]
    assert await asql(database_url, "SELECT count(*) AS n FROM queen.frames") == [{"n": 1}]


async def test_a_delay_in_the_past_fires_at_once(broker: BrokerHandle) -> None:
    q = name()

    async def flow(c: Any) -> list[Any]:
        await c.timers.schedule(q, "past", {"late": True}, delay_ms=-10_000)
        return await pop_until(c, q, timeout_s=5)

    assert [m["data"] for m in await run(broker, flow)] == [{"late": True}]


async def test_payloads_in_base64_and_zstd_and_bytes_arrive_as_the_json_encoded(
    broker: BrokerHandle,
) -> None:
    q = name()
    doc = {"events": [{"type": "booking.held", "n": i, "note": "café ☃"} for i in range(40)]}
    compressed = zstandard.ZstdCompressor().compress(json.dumps(doc).encode())

    async def flow(c: Any) -> tuple[list[Any], list[Any]]:
        results = await c.timers.batch([
            ops.schedule(q, "plain", doc, delay_ms=-1, txn="t-plain"),
            ops.schedule(q, "zstd", compressed, delay_ms=-1, payload_zstd=True, txn="t-zstd"),
            ops.schedule(q, "bytes", b'["already", "json"]', delay_ms=-1, txn="t-bytes"),
            ops.schedule(q, "string", "just a string", delay_ms=-1, txn="t-string"),
        ])
        return results, await pop_until(c, q, 4)

    results, messages = await run(broker, flow)
    assert [r["status"] for r in results] == ["scheduled"] * 4
    by_txn = {m["transactionId"]: m["data"] for m in messages}
    assert by_txn == {"t-plain": doc, "t-zstd": doc, "t-bytes": ["already", "json"],
                      "t-string": "just a string"}


# -- peek, list, count ------------------------------------------------------------------------


async def test_peek_a_hit_and_a_miss(broker: BrokerHandle) -> None:
    q = name()

    async def flow(c: Any) -> tuple[Any, Any, Any]:
        res = await c.timers.schedule(q, "a/b c", {"v": 1}, delay_ms=600_000, partition="eu")
        return res, await c.timers.peek(q, "a/b c"), await c.timers.peek(q, "never")

    res, hit, miss = await run(broker, flow)
    assert dict(miss) == {"found": False, "queue": q, "timerKey": "never"} and not miss
    assert hit["found"] is True and hit
    assert {k: hit[k] for k in ("queue", "timerKey", "partition", "txn", "messageId",
                                "deliverAt", "attempts", "lastError", "claimed", "encrypted",
                                "payloadZstd")} == {
        "queue": q, "timerKey": "a/b c", "partition": "eu", "txn": res["txn"],
        "messageId": res["messageId"], "deliverAt": res["deliverAt"], "attempts": 0,
        "lastError": None, "claimed": False, "encrypted": False, "payloadZstd": False}
    assert json.loads(base64.b64decode(hit["payload"])) == {"v": 1}  # as stored
    assert hit["data"] == {"v": 1}
    assert hit["createdAt"] and hit["updatedAt"]


async def test_list_is_a_keyset_page_with_a_clamped_limit(broker: BrokerHandle) -> None:
    q = name()
    keys = [f"k{i:04d}" for i in range(1005)]

    async def flow(c: Any) -> dict[str, Any]:
        for start in range(0, len(keys), 256):
            await c.timers.batch([ops.schedule(q, k, {"k": k}, delay_ms=600_000)
                                  for k in keys[start:start + 256]])
        first = await c.timers.list(q, limit=2)
        second = await c.timers.list(q, after=first["nextAfter"], limit=2)
        return {
            "first": first, "second": second,
            "all": await c.timers.list_all(q, limit=300),
            "zero": await c.timers.list(q, limit=0),
            "huge": await c.timers.list(q, limit=50_000),
            "default": await c.timers.list(q),
        }

    got = await run(broker, flow)
    first, second = got["first"], got["second"]
    assert [r["timerKey"] for r in first["rows"]] == ["k0000", "k0001"]
    assert (first["truncated"], first["nextAfter"]) == (True, "k0001")
    assert [r["timerKey"] for r in second["rows"]] == ["k0002", "k0003"]
    assert [r["timerKey"] for r in got["all"]] == keys
    assert len(got["zero"]["rows"]) == 1  # clamped up, never refused
    assert (len(got["huge"]["rows"]), got["huge"]["truncated"]) == (1000, True)  # clamped down
    assert len(got["default"]["rows"]) == 100
    row = first["rows"][0]
    assert row["queue"] == q and row["messageId"] and "payload" not in row
    async with httpx.AsyncClient(base_url=broker.url) as http:
        r = await http.get(f"{API}/timers/{q}", params={"limit": "lots"})
        assert len(r.json()["rows"]) == 100
        last = await http.get(f"{API}/timers/{q}", params={"after": "k1003"})
        assert last.json() == {"rows": [last.json()["rows"][0]], "truncated": False,
                               "nextAfter": None}


async def test_count_by_prefix(broker: BrokerHandle) -> None:
    q = name()

    async def flow(c: Any) -> None:
        await c.timers.batch([ops.schedule(q, k, 1, delay_ms=600_000)
                              for k in ("laravel:1", "laravel:2", "other:1", "laravel%_")])

    await run(broker, flow)
    async with httpx.AsyncClient(base_url=broker.url) as http:
        async def count(prefix: str) -> Any:
            return (await http.get(f"{API}/timers/{q}",
                                   params={"mode": "count", "prefix": prefix})).json()

        assert await count("laravel:") == {"queue": q, "prefix": "laravel:", "count": 2}
        assert (await count("laravel%"))["count"] == 1  # % is a byte, not a wildcard
        assert (await count("nothing"))["count"] == 0
        for params in ({"mode": "count"}, {"mode": "count", "prefix": "x" * 129},
                       {"mode": "count", "prefix": "a", "limit": "5"}, {"mode": "sum"}):
            r = await http.get(f"{API}/timers/{q}", params=params)
            assert (r.status_code, r.json()["error"]) == (400, "timers_bad_request"), params


# -- cancel -----------------------------------------------------------------------------------


async def test_cancel_answers_cancelled_absent_and_too_late(
    broker: BrokerHandle, database_url: str
) -> None:
    q = name()

    async def schedule_and_cancel(c: Any) -> tuple[Any, Any, Any, Any]:
        res = await c.timers.schedule(q, "c1", {"v": 1}, delay_ms=600_000, txn="stored-txn")
        cancelled = await c.timers.cancel(q, "c1", txn="whatever-i-say")
        absent = await c.timers.cancel(q, "c1", txn="my-txn")
        held = await c.timers.schedule(q, "held", 1, delay_ms=600_000)
        return res, cancelled, absent, held

    res, cancelled, absent, held = await run(broker, schedule_and_cancel)
    assert dict(cancelled) == {"ok": True, "status": "cancelled", "queue": q, "timerKey": "c1",
                               "txn": "stored-txn"}
    assert dict(absent) == {"ok": False, "status": "absent", "queue": q, "timerKey": "c1",
                            "txn": "my-txn"} and not absent
    claim_all(database_url)

    async def too_late(c: Any) -> tuple[Any, Any, Any]:
        return (await c.timers.cancel(q, "held"),
                await c.timers.reschedule(q, "held", 2, delay_ms=5),
                await c.timers.peek(q, "held"))

    late_cancel, late_reschedule, peeked = await run(broker, too_late)
    assert (late_cancel["status"], late_cancel["ok"]) == ("too_late", False)
    assert (late_reschedule["status"], late_reschedule["ok"]) == ("too_late", False)
    assert "messageId" not in late_reschedule
    assert peeked["claimed"] is True and peeked["messageId"] == held["messageId"]


async def test_a_cancel_racing_the_fire_is_too_late_or_absent_never_both_effects(
    broker: BrokerHandle, database_url: str
) -> None:
    """Rounds of timers come due together while a Queen client cancels all of them around
    their instant, one by one (DELETE) and in batches (POST), until some cancels won and some
    lost (the cancels start earlier or later each round, to find the instant on a machine of
    any speed). Every answer must agree with the log: cancelled means no frame; too_late or
    absent means exactly one frame."""
    q = name()
    per_round, delay_ms = 40, 300

    async def flow(c: Any) -> dict[str, str]:
        answers: dict[str, str] = {}
        lead_ms = 60
        for r in range(16):
            keys = [f"r{r:02d}-{i:02d}" for i in range(per_round)]
            await c.timers.batch([ops.schedule(q, k, {"k": k}, delay_ms=delay_ms)
                                  for k in keys])
            await asyncio.sleep(max(0, delay_ms - lead_ms) / 1000)

            async def single(k: str) -> None:
                answers[k] = (await c.timers.cancel(q, k))["status"]

            async def batched(chunk: list[str]) -> None:
                results = await c.timers.batch([ops.cancel(q, k) for k in chunk])
                answers.update({k: res["status"] for k, res in zip(chunk, results, strict=True)})

            half = per_round // 2
            await asyncio.gather(*(single(k) for k in keys[:half]),
                                 *(batched(keys[i:i + 4]) for i in range(half, per_round, 4)))
            verdicts = set(answers.values())
            if "cancelled" in verdicts and verdicts - {"cancelled"}:
                break
            won = sum(answers[k] == "cancelled" for k in keys)
            lead_ms += 25 if won < per_round // 2 else -25  # too late: start sooner
        return answers

    answers = await run(broker, flow)
    with trio.fail_after(15):  # whatever was not cancelled fires
        while (await asql(database_url, "SELECT count(*) AS n FROM queen.timers"))[0]["n"]:
            await trio.sleep(0.05)
    frames = Counter(r["key"] for r in await asql(
        database_url, "SELECT meta->'timer'->>'key' AS key FROM queen.frames"))
    assert set(answers.values()) <= {"cancelled", "too_late", "absent"}
    for k, verdict in answers.items():
        assert frames[k] == (0 if verdict == "cancelled" else 1), (k, verdict, frames[k])
    assert set(frames) <= set(answers)
    verdicts = Counter(answers.values())
    assert verdicts["cancelled"] and len(verdicts) > 1, verdicts  # it was a race
    print(f"\ncancel answers {verdicts}")


# -- the batch --------------------------------------------------------------------------------


async def test_a_batch_mixes_schedules_and_cancels_and_answers_in_input_order(
    broker: BrokerHandle,
) -> None:
    q = name()

    async def flow(c: Any) -> tuple[list[Any], list[Any]]:
        await c.timers.batch([ops.schedule(q, k, 1, delay_ms=600_000) for k in ("x", "y")])
        results = await c.timers.batch([
            ops.schedule(q, "b", {"b": 1}, delay_ms=600_000),
            ops.cancel(q, "x", txn="mine"),
            ops.schedule(q, "a", {"a": 1}, delay_ms=600_000, reschedule=True),
            ops.cancel(q, "nothing", txn="t-n"),
            ops.schedule(q, "y", {"y": 2}, delay_ms=600_000),
        ])
        return results, (await c.timers.list(q))["rows"]

    results, rows = await run(broker, flow)
    assert [(r["timerKey"], r["status"]) for r in results] == [
        ("b", "scheduled"), ("x", "cancelled"), ("a", "scheduled"), ("nothing", "absent"),
        ("y", "rescheduled")]
    assert results[3]["txn"] == "t-n"
    assert [r["timerKey"] for r in rows] == ["a", "b", "y"]


async def test_the_same_key_twice_in_one_call_is_a_400_and_writes_nothing(
    broker: BrokerHandle, database_url: str
) -> None:
    q = name()

    async def flow(c: Any) -> Any:
        with pytest.raises(TimerError) as info:
            await c.timers.batch([ops.schedule(q, "other", {}, delay_ms=1000),
                                  ops.schedule(q, "dup:1", {}, delay_ms=1000),
                                  ops.cancel(q, "dup:1")])
        return info.value

    error = await run(broker, flow)
    assert (error.status, error.code, error.reason) == (400, "timers_bad_request",
                                                        "duplicate_timer")
    assert await asql(database_url, "SELECT count(*) AS n FROM queen.timers") == [{"n": 0}]


async def test_a_timer_past_the_horizon_is_a_403(broker: BrokerHandle, database_url: str) -> None:
    q = name()

    async def flow(c: Any) -> Any:
        with pytest.raises(TimerError) as info:
            await c.timers.schedule(q, "far", 1, delay_ms=HORIZON_S * 1000 + 1)
        return info.value

    error = await run(broker, flow)
    assert (error.status, error.code) == (403, "timer_horizon_exceeded")
    async with httpx.AsyncClient(base_url=broker.url) as http:
        r = await http.put(f"{API}/timers/{q}/far", json={"delayMs": HORIZON_S * 1000 + 1,
                                                          "payload": 1})
        assert (r.status_code, r.json()["error"]) == (403, "timer_horizon_exceeded")
    assert await asql(database_url, "SELECT count(*) AS n FROM queen.timers") == [{"n": 0}]


def _op(**changes: Any) -> dict[str, Any]:
    return {**ops.schedule("q", "k", {"v": 1}, delay_ms=1000, txn="t"), **changes}


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ({"operations": [_op(producerSub="billing-service")]}, "server_owned_field"),
        ({"operations": [_op(messageId=str(uuid.uuid4()))]}, "server_owned_field"),
        ({"operations": [_op(_messageId=str(uuid.uuid4()))]}, "server_owned_field"),
        ({"operations": [_op(tenantId="acme")]}, "server_owned_field"),
        ({"operations": [_op(deliverAt="2030-01-01T00:00:00Z")]}, "server_owned_field"),
        ({"operations": [_op(attempts=0)]}, "server_owned_field"),
        ({"operations": [_op(color="red")]}, "unknown_field"),
        ({"operations": [_op(op="snooze")]}, "invalid_operation"),
        ({"operations": [_op(txn=None)]}, "missing_field"),
        ({"operations": [_op(delayMs="30m")]}, "invalid_delay"),
        ({"operations": [_op(payload="not base64!")]}, "invalid_payload"),
        ({"operations": [_op(payload=base64.b64encode(b"{oops").decode())]}, "invalid_payload"),
        ({"operations": [_op(payload=base64.b64encode(b'{"x": NaN}').decode())]},
         "invalid_payload"),
        ({"operations": [_op(payload=base64.b64encode(b'"\\u0000"').decode())]},
         "invalid_payload"),
        ({"operations": [_op(payload=base64.b64encode(b'"\\ud800"').decode())]},
         "invalid_payload"),
        ({"operations": [_op(payload=base64.b64encode(b"1e999").decode())]}, "invalid_payload"),
        ({"operations": [_op(payloadZstd=True)]}, "invalid_payload"),  # not zstd
        ({"operations": [_op(encrypted=True)]}, "encryption_unsupported"),
        ({"operations": [_op(queue="bad/queue")]}, "invalid_queue"),
        ({"operations": [_op(timerKey="")]}, "invalid_key"),
        ({"operations": [_op(timerKey=f"k{i}") for i in range(257)]}, "too_many_operations"),
        ({"operations": [_op()], "extra": 1}, "unknown_field"),
        ({"operations": {"op": "schedule"}}, "invalid_body"),
    ],
)
async def test_bad_operations_are_refused_by_name_and_nothing_is_written(
    http: httpx.AsyncClient, database_url: str, body: dict[str, Any], reason: str
) -> None:
    # A good operation first: the whole call is refused, not only the bad one.
    if isinstance(body.get("operations"), list) and reason != "too_many_operations":
        body = {**body, "operations": [_op(timerKey="fine"), *body["operations"]]}
    r = await http.post(f"{API}/timers", json=body)
    assert r.status_code == 400, r.text
    answer = r.json()
    assert (answer["error"], answer["reason"], answer["ok"]) == ("timers_bad_request", reason,
                                                                  False)
    assert answer["detail"]
    assert await asql(database_url, "SELECT count(*) AS n FROM queen.timers") == [{"n": 0}]


async def test_a_bare_array_is_a_batch_too(http: httpx.AsyncClient) -> None:
    r = await http.post(f"{API}/timers", json=[_op(timerKey="bare")])
    assert r.status_code == 200 and r.json()["results"][0]["status"] == "scheduled"
    r = await http.post(f"{API}/timers", json=[])
    assert r.json() == {"results": []}


async def test_a_payload_over_the_ceiling_is_a_413_compressed_or_not(
    http: httpx.AsyncClient, database_url: str
) -> None:
    big = json.dumps("x" * (1024 * 1024)).encode()
    for op in (_op(payload=base64.b64encode(big).decode()),
               _op(payload=base64.b64encode(zstandard.ZstdCompressor().compress(big)).decode(),
                   payloadZstd=True)):
        r = await http.post(f"{API}/timers", json={"operations": [op]})
        assert (r.status_code, r.json()["error"]) == (413, "payload_too_large"), r.text
    assert await asql(database_url, "SELECT count(*) AS n FROM queen.timers") == [{"n": 0}]


async def test_the_storage_gate_refuses_schedules_with_403_and_never_a_cancel(
    broker: BrokerHandle, database_url: str
) -> None:
    q = name()

    async def schedule(c: Any) -> Any:
        return await c.timers.schedule(q, "stop-me", 1, delay_ms=600_000)

    await run(broker, schedule)
    await asql(database_url, "UPDATE queen.tenants SET max_stored_bytes = 0 "
                             "WHERE name = 'default'")

    async def flow(c: Any) -> tuple[Any, Any, Any]:
        deadline = time.monotonic() + 5  # plans reach the broker within a second
        refused = None
        while refused is None:
            try:
                await c.timers.schedule(q, "new", 1, delay_ms=600_000)
            except TimerError as exc:
                refused = exc
            assert time.monotonic() < deadline, "the gate never closed"
            await asyncio.sleep(0.1)
        with pytest.raises(TimerError) as mixed:
            await c.timers.batch([ops.schedule(q, "new2", 1, delay_ms=1000),
                                  ops.cancel(q, "stop-me")])
        return refused, mixed.value, await c.timers.cancel(q, "stop-me")

    refused, mixed, cancelled = await run(broker, flow)
    assert refused.status == 403 and mixed.status == 403  # Queen never answers 507
    assert cancelled["status"] == "cancelled"
    async with httpx.AsyncClient(base_url=broker.url) as http:
        r = await http.put(f"{API}/timers/{q}/k", json={"delayMs": 1, "payload": 1})
        assert r.status_code == 403
        r = await http.post(f"{API}/timers", json=[ops.cancel(q, "new")])
        assert r.status_code == 200  # a batch of cancels alone is never gated


# -- the transaction rider --------------------------------------------------------------------


async def test_a_timer_rides_a_bundle_and_fires_with_its_promised_id(
    broker: BrokerHandle,
) -> None:
    q, audit = name(), name()

    async def flow(c: Any) -> tuple[Any, list[Any], list[Any]]:
        res = await (c.transaction()
                     .queue(audit).push([{"data": {"event": "held"}}])
                     .timer(q).key("b1").payload({"bookingId": "b1"}).after_ms(200).schedule()
                     .commit())
        return res, await pop_until(c, q), await c.queue(audit).batch(5).wait(False).pop()

    res, fired, audited = await run(broker, flow)
    assert res["success"] is True
    timer = res["results"][-1]
    assert (timer["type"], timer["status"], timer["timerKey"], timer["index"]) == (
        "timer", "scheduled", "b1", len(res["results"]) - 1)
    assert [(m["id"], m["data"]) for m in fired] == [(timer["messageId"], {"bookingId": "b1"})]
    assert [m["data"] for m in audited] == [{"event": "held"}]


async def test_a_claimed_timer_is_too_late_in_its_result_and_the_bundle_commits(
    broker: BrokerHandle, database_url: str
) -> None:
    q, side = name(), name()

    async def schedule(c: Any) -> None:
        await c.timers.schedule(q, "firing", 1, delay_ms=600_000)
        await c.timers.schedule(q, "pending", 1, delay_ms=600_000)

    await run(broker, schedule)
    claim_all(database_url)
    sql(database_url, "UPDATE queen.timers SET claim_token = NULL, visible_at = deliver_at "
                      "WHERE timer_key = 'pending'")

    async def flow(c: Any) -> tuple[Any, list[Any]]:
        res = await (c.transaction()
                     .queue(side).push([{"data": "side effect"}])
                     .timer(q).key("nothing-here").cancel()
                     .timer(q).key("firing").cancel()
                     .timer(q).key("pending").cancel()
                     .timer(q).key("firing-2").payload(2).after_ms(600_000).schedule()
                     .commit())
        return res, await c.queue(side).batch(5).wait(False).pop()

    res, pushed = await run(broker, flow)
    assert res["success"] is True
    assert [(t["timerKey"], t["status"]) for t in res["results"] if t.get("type") == "timer"] == [
        ("nothing-here", "absent"), ("firing", "too_late"), ("pending", "cancelled"),
        ("firing-2", "scheduled")]
    assert [m["data"] for m in pushed] == ["side effect"]  # the bundle committed


async def test_bad_timers_in_a_bundle_are_queens_400_and_commit_nothing(
    http: httpx.AsyncClient, database_url: str
) -> None:
    q = name()
    push = {"type": "push", "items": [{"queue": q, "payload": 1}]}
    for timers, reason in (
        ([_op(queue=q, timerKey="a"), _op(queue=q, timerKey="a")], "duplicate_timer"),
        ([_op(queue=q, producerSub="me")], "server_owned_field"),
        ([{"action": "schedule", "queue": q, "key": "k", "delayMs": 1, "payload": 1}],
         "invalid_operation"),  # the shape this broker used to take
    ):
        r = await http.post(f"{API}/transaction", json={"operations": [push], "timers": timers})
        assert r.status_code == 400, r.text
        assert (r.json()["error"], r.json()["reason"]) == ("timers_bad_request", reason)
    r = await http.post(f"{API}/transaction", json={
        "operations": [push], "timers": [_op(queue=q, delayMs=HORIZON_S * 1000 + 1)]})
    assert (r.status_code, r.json()["error"]) == (403, "timer_horizon_exceeded")
    assert await asql(database_url, "SELECT count(*) AS n FROM queen.timers") == [{"n": 0}]
    assert await asql(database_url, "SELECT count(*) AS n FROM queen.frames") == [{"n": 0}]

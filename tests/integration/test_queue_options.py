"""Queen's configure options over real HTTP: what is applied (maxSize, retryDelay,
ttl / retentionSeconds, completedRetentionSeconds, retentionEnabled), what is echoed, what is
ignored or refused, and the settable message ceiling (QUEEN_MAX_MESSAGE_BYTES)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import trio

from queen_trio.config import ONE_MIB, Settings
from queen_trio.server import BrokerHandle, run_broker

from ..conftest import replace_settings
from .test_log import ack, frames, pop, push
from .test_plans import plan_loaded, set_plan
from .test_segments import apply_retention, backdate, seal_all, sql, where_frames_are

API = "/api/v1"

# Every option Queen's configure echoes (lib/schema/procedures/012_configure.sql), plus ours.
QUEEN_ECHOED = {"priority", "leaseTime", "retryLimit", "retryDelay", "maxSize", "ttl",
                "deadLetterQueue", "dlqAfterMaxRetries", "delayedProcessing", "windowBuffer",
                "retentionSeconds", "completedRetentionSeconds", "retentionEnabled",
                "encryptionEnabled", "maxWaitTimeSeconds"}


async def configure(http: httpx.AsyncClient, queue: str, **options: Any) -> dict[str, Any]:
    r = await http.post(f"{API}/configure", json={"queue": queue, "options": options})
    assert r.status_code == 200, r.text
    return r.json()


def assert_error(r: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body = r.json()
    assert (body["ok"], body["error"]) == (False, code)
    return body


# -- echo, ignored, refused --------------------------------------------------------------------


async def test_configure_echoes_every_queen_option_and_names_what_it_ignores(
    http: httpx.AsyncClient,
) -> None:
    # What queen-mq's QueueBuilder.create() sends at its defaults: nothing to ignore.
    body = await configure(http, "plain", leaseTime=300, retryLimit=3, priority=0,
                           delayedProcessing=0, windowBuffer=0, maxSize=0, retentionSeconds=0,
                           completedRetentionSeconds=0, encryptionEnabled=False)
    assert QUEEN_ECHOED <= set(body["options"])
    assert body["options"]["retainUntilConsumed"] is False
    assert (body["configured"], body["queue"], body["ignored"], body["unknown"]) == (
        True, "plain", [], [])
    assert body["partitionId"] and (body["namespace"], body["task"]) == ("", "")

    r = await http.post(f"{API}/configure", json={
        "queue": "fancy", "namespace": "billing", "task": "invoices",
        "options": {"priority": 7, "windowBuffer": 5, "maxWaitTimeSeconds": 60,
                    "dlqAfterMaxRetries": True, "shardCount": 3, "leaseTime": 30,
                    "maxSize": 10, "retryDelay": 250, "ttl": 86400,
                    "completedRetentionSeconds": 3600, "retentionEnabled": True}})
    assert r.status_code == 200, r.text
    body = r.json()
    assert sorted(body["ignored"]) == sorted(["priority",
                                              "dlqAfterMaxRetries", "shardCount", "namespace",
                                              "task"])
    assert body["unknown"] == ["shardCount"]
    o = body["options"]
    assert (o["priority"], o["windowBuffer"], o["maxWaitTimeSeconds"]) == (7, 5, 60)
    assert (o["leaseTime"], o["maxSize"], o["retryDelay"], o["ttl"]) == (30, 10, 250, 86400)
    assert (o["completedRetentionSeconds"], o["retentionEnabled"]) == (3600, True)
    assert (body["namespace"], body["task"]) == ("billing", "invoices")

    # The applied ones are stored: the resources routes show them.
    detail = (await http.get(f"{API}/resources/queues/fancy")).json()["options"]
    assert (detail["maxSize"], detail["retryDelay"], detail["ttl"]) == (10, 250, 86400)
    assert (detail["completedRetentionSeconds"], detail["retentionEnabled"]) == (3600, True)
    listed = {q["name"]: q for q in (await http.get(f"{API}/resources/queues")).json()["queues"]}
    assert listed["fancy"]["options"]["maxSize"] == 10
    assert (detail["windowBuffer"], listed["fancy"]["options"]["windowBuffer"]) == (5, 5)
    assert listed["plain"]["options"]["retryDelay"] == 0


@pytest.mark.parametrize(
    ("options", "code"),
    [
        ({"maxSize": -1}, "invalid_option"),
        ({"maxSize": "10"}, "invalid_option"),
        ({"retryDelay": 1.5}, "invalid_option"),
        ({"ttl": -5}, "invalid_option"),
        ({"windowBuffer": -1}, "invalid_option"),
        ({"windowBuffer": "2"}, "invalid_option"),
        ({"completedRetentionSeconds": True}, "invalid_option"),
        ({"retentionEnabled": "yes"}, "invalid_option"),
        ({"priority": "high"}, "invalid_option"),
        ({"encryptionEnabled": True}, "encryption_key_missing"),  # this broker has no key
        ({"encryptionEnabled": "no"}, "invalid_option"),
    ],
)
async def test_bad_option_values_are_a_400_naming_the_option(
    http: httpx.AsyncClient, options: dict[str, Any], code: str
) -> None:
    r = await http.post(f"{API}/configure", json={"queue": "bad", "options": options})
    body = assert_error(r, 400, code)
    assert next(iter(options)) in body["message"]
    assert (await http.get(f"{API}/resources/queues/bad")).status_code == 404


# -- maxSize ----------------------------------------------------------------------------------


async def test_max_size_refuses_a_push_that_would_pass_it_and_writes_nothing(
    http: httpx.AsyncClient, database_url: str
) -> None:
    await configure(http, "capped", maxSize=3)
    await push(http, "capped", [1, 2])
    # Two items into the capped queue and one elsewhere, in one push: refused whole.
    r = await http.post(f"{API}/push", json={"items": [
        {"queue": "other", "payload": "x"},
        {"queue": "capped", "payload": 3, "partition": "p2"},
        {"queue": "capped", "payload": 4},
    ]})
    body = assert_error(r, 409, "queue_full")
    assert (body["queue"], body["maxSize"], body["depth"], body["pushing"]) == ("capped", 3, 2, 2)
    assert len(frames(database_url, "capped")) == 2
    assert frames(database_url, "other") == []

    await push(http, "capped", [3])  # exactly at the limit
    assert_error(await http.post(f"{API}/push", json={"items": [
        {"queue": "capped", "payload": 4}]}), 409, "queue_full")
    # A re-sent transactionId appends nothing, so it is not refused.
    first = frames(database_url, "capped")[0][2]
    again = await http.post(f"{API}/push", json={"items": [
        {"queue": "capped", "payload": 1, "transactionId": first}]})
    assert again.status_code == 201 and again.json()[0]["status"] == "duplicate"

    # Consuming (queue mode) makes room; other consumer groups do not count.
    group = await pop(http, "capped", consumerGroup="audit", batch=3, autoAck=True)
    assert len(group["messages"]) == 3
    assert_error(await http.post(f"{API}/push", json={"items": [
        {"queue": "capped", "payload": 4}]}), 409, "queue_full")
    got = await pop(http, "capped", batch=2)
    for m in got["messages"]:
        await ack(http, m)
    await push(http, "capped", [4, 5])
    assert len(frames(database_url, "capped")) == 5


async def test_max_size_refusal_aborts_a_transaction_bundle(
    http: httpx.AsyncClient, database_url: str
) -> None:
    await configure(http, "tiny", maxSize=1)
    r = await http.post(f"{API}/transaction", json={"operations": [
        {"type": "push", "items": [{"queue": "tiny", "payload": 1},
                                   {"queue": "tiny", "payload": 2}]}],
        "kv": [{"op": "put", "ns": "n", "key": "k", "value": 1, "forever": True}]})
    assert_error(r, 409, "queue_full")
    assert frames(database_url, "tiny") == []
    assert (await http.get(f"{API}/kv/n/k")).json()["found"] is False


async def test_concurrent_pushes_never_pass_max_size(
    http: httpx.AsyncClient, database_url: str
) -> None:
    await configure(http, "race", maxSize=10)
    statuses: list[int] = []

    async def one(i: int) -> None:
        r = await http.post(f"{API}/push", json={"items": [
            {"queue": "race", "payload": i, "partition": f"p{i % 4}"}]})
        statuses.append(r.status_code)

    async with trio.open_nursery() as nursery:
        for i in range(20):
            nursery.start_soon(one, i)
    assert sorted(statuses) == [201] * 10 + [409] * 10
    assert len(frames(database_url, "race")) == 10


# -- retryDelay -------------------------------------------------------------------------------


async def test_retry_delay_spaces_redelivery_of_a_failed_message(
    http: httpx.AsyncClient,
) -> None:
    await configure(http, "slowretry", retryDelay=700, retryLimit=5)
    await configure(http, "fastretry", retryLimit=5)
    await push(http, "slowretry", ["a", "b"])
    await push(http, "fastretry", ["a"])

    fast = (await pop(http, "fastretry"))["messages"][0]
    await ack(http, fast, "failed")
    assert (await pop(http, "fastretry"))["messages"][0]["retryCount"] == 1  # at once

    first = (await pop(http, "slowretry"))["messages"][0]
    failed_at = time.monotonic()
    await ack(http, first, "failed", error="boom")
    assert await pop(http, "slowretry") is None  # held: not "a" again, and not "b" past it
    other = await pop(http, "slowretry", consumerGroup="g2")  # another group is not held
    assert other["messages"][0]["data"] == "a"

    again = await pop(http, "slowretry", wait=True, timeout=5000)
    waited = time.monotonic() - failed_at
    assert again["messages"][0]["data"] == "a" and again["messages"][0]["retryCount"] == 1
    assert 0.7 <= waited < 3.0
    await ack(http, again["messages"][0])
    nxt = await pop(http, "slowretry")  # a completed ack holds nothing
    assert nxt["messages"][0]["data"] == "b"


# -- ttl / retentionSeconds / completedRetentionSeconds / retentionEnabled --------------------


async def test_ttl_expires_messages_like_retention_seconds(
    http: httpx.AsyncClient, database_url: str
) -> None:
    await configure(http, "ttlq", ttl=60)
    await configure(http, "both", ttl=7200, retentionSeconds=60)  # the smaller one counts
    await configure(http, "keepall", ttl=7200)  # an hour-old frame is within 2 h
    for q in ("ttlq", "both", "keepall"):
        await push(http, q, [{"i": i} for i in range(10)])
        backdate(database_url, q)
        assert seal_all(database_url, q) == 2
    assert [(d.segments, d.log_start) for d in apply_retention(database_url, "ttlq")] == [(2, 10)]
    assert [(d.segments, d.log_start) for d in apply_retention(database_url, "both")] == [(2, 10)]
    assert apply_retention(database_url, "keepall") == []
    assert await pop(http, "ttlq") is None


async def test_completed_retention_drops_only_what_every_group_consumed(
    http: httpx.AsyncClient, database_url: str
) -> None:
    await configure(http, "done", completedRetentionSeconds=60)
    await push(http, "done", [{"i": i} for i in range(10)])
    backdate(database_url, "done")
    seal_all(database_url, "done")
    assert apply_retention(database_url, "done") == []  # no consumer yet: nothing consumed
    got = await pop(http, "done", batch=7, autoAck=True)
    assert len(got["messages"]) == 7
    dropped = apply_retention(database_url, "done")
    assert [(d.segments, d.log_start) for d in dropped] == [(1, 5)]  # 0-4; 5-9 is not done
    _, segments = where_frames_are(database_url, "done")
    assert segments == [(5, 9)]


async def test_retention_enabled_false_keeps_everything(
    http: httpx.AsyncClient, database_url: str
) -> None:
    body = await configure(http, "kept", retentionSeconds=60, ttl=60, retentionEnabled=False)
    assert body["options"]["retentionEnabled"] is False
    await push(http, "kept", [1, 2, 3, 4, 5])
    backdate(database_url, "kept")
    seal_all(database_url, "kept")
    assert apply_retention(database_url, "kept") == []
    # Enabled again (the default), the same ages apply.
    await configure(http, "kept", retentionSeconds=60)
    assert [d.log_start for d in apply_retention(database_url, "kept")] == [5]


# -- the message ceiling ----------------------------------------------------------------------


def _message(size: int) -> str:
    """A JSON string payload of exactly ``size`` bytes (quotes included)."""
    return "x" * (size - 2)


async def test_a_message_over_16_mib_is_refused_by_default(http: httpx.AsyncClient) -> None:
    r = await http.post(f"{API}/push", json={"items": [
        {"queue": "big", "payload": _message(16 * ONE_MIB + 1)}]})
    assert_error(r, 413, "payload_too_large")
    r = await http.post(f"{API}/push", json={"items": [
        {"queue": "big", "payload": _message(16 * ONE_MIB)}]})
    assert r.status_code == 201, r.text
    got = await pop(http, "big")
    assert len(got["messages"][0]["data"]) == 16 * ONE_MIB - 2
    # A timer's payload stays within min(1 MiB, the plan's ceiling).
    r = await http.put(f"{API}/timers/big/t1", json={
        "delayMs": 60_000, "payload": _message(ONE_MIB + 1)})
    assert_error(r, 413, "payload_too_large")


@pytest.fixture
async def big_broker(settings: Settings) -> AsyncIterator[BrokerHandle]:
    async with trio.open_nursery() as nursery:
        handle: BrokerHandle = await nursery.start(
            run_broker, replace_settings(settings, max_message_bytes=4 * ONE_MIB))
        yield handle
        handle.shutdown()


async def test_the_setting_raises_the_ceiling_and_a_plan_lowers_it(
    big_broker: BrokerHandle, database_url: str
) -> None:
    async with httpx.AsyncClient(base_url=big_broker.url, timeout=30) as http:
        r = await http.post(f"{API}/push", json={"items": [
            {"queue": "big", "payload": _message(2 * ONE_MIB)}]})
        assert r.status_code == 201, r.text
        got = await pop(http, "big")
        assert len(got["messages"][0]["data"]) == 2 * ONE_MIB - 2
        r = await http.post(f"{API}/push", json={"items": [
            {"queue": "big", "payload": _message(4 * ONE_MIB + 1)}]})
        assert_error(r, 413, "payload_too_large")

        # Timers keep min(1 MiB, plan ceiling) whatever the setting says.
        r = await http.put(f"{API}/timers/big/t1", json={
            "delayMs": 60_000, "payload": _message(ONE_MIB + 1)})
        assert_error(r, 413, "payload_too_large")

        # A plan lowers it for its tenant; removing the lowering restores the setting.
        set_plan(database_url, max_message_bytes=1000)
        await plan_loaded(big_broker, max_message_bytes=1000)
        r = await http.post(f"{API}/push", json={"items": [
            {"queue": "big", "payload": _message(1001)}]})
        assert_error(r, 413, "payload_too_large")
        set_plan(database_url, max_message_bytes=None, set_message=True)
        await plan_loaded(big_broker, max_message_bytes=None)
        r = await http.post(f"{API}/push", json={"items": [
            {"queue": "big", "payload": _message(3 * ONE_MIB)}]})
        assert r.status_code == 201, r.text
    rows = sql(database_url, "SELECT max_message_bytes FROM queen.tenants WHERE name = 'default'")
    assert rows == [{"max_message_bytes": None}]

"""Queen's consumer-group and admin read routes over real HTTP: list / get / lagging
/ delete / seek a group, DLQ paging both ways, the operators' read routes, tenant isolation."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import psycopg
import pytest
import trio

from queen_trio.config import Settings

from ..conftest import replace_settings
from .test_log import ack, pop, push
from .test_segments import EAGER, seal_all
from .test_tenancy import auth_broker, http_a, http_b, tokens  # noqa: F401 (fixtures)

API = "/api/v1"


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """Housekeeping stays out of the way: the tests seal by hand."""
    return replace_settings(settings, housekeeping_interval_ms=3_600_000)


def sql(url: str, query: str, params: Any = None) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(query, params)


def backdate(url: str, queue: str, hours: float, below_offset: int | None = None) -> None:
    sql(url, "UPDATE queen.frames f SET created_at = f.created_at - make_interval(secs => %s) "
             "FROM queen.partitions p JOIN queen.queues q USING (queue_id) "
             "WHERE f.partition_id = p.partition_id AND q.name = %s "
             "AND (%s::bigint IS NULL OR f.\"offset\" < %s)",
        (hours * 3600, queue, below_offset, below_offset))


async def group_detail(http: httpx.AsyncClient, group: str) -> dict[str, Any]:
    r = await http.get(f"{API}/consumer-groups/{group}")
    assert r.status_code == 200, r.text
    return r.json()


async def seek(http: httpx.AsyncClient, group: str, queue: str, body: Any) -> httpx.Response:
    return await http.post(f"{API}/consumer-groups/{group}/queues/{queue}/seek", json=body)


# -- consumer groups --------------------------------------------------------------------------


async def test_list_get_and_lagging_groups(http: httpx.AsyncClient, database_url: str) -> None:
    await push(http, "cg", [1, 2, 3])
    got = await pop(http, "cg", batch=2, consumerGroup="g1")
    await ack(http, got["messages"][0])  # offset 0 done, 1 still leased

    groups = (await http.get(f"{API}/consumer-groups")).json()
    assert [(g["name"], g["queueName"], g["members"], g["totalLag"], g["partitionsWithLag"])
            for g in groups] == [("g1", "cg", 1, 2, 1)]
    assert groups[0]["state"] == "Stable" and groups[0]["topics"] == ["cg"]

    detail = await group_detail(http, "g1")
    (part,) = detail["cg"]["partitions"]
    assert (part["partition"], part["committed"], part["offsetLag"], part["leaseActive"]) == (
        "Default", 0, 2, True)
    assert part["leaseExpiresAt"] is not None and 0 <= part["timeLagSeconds"] < 60
    assert await group_detail(http, "nobody") == {}

    # The oldest unconsumed message is two hours old: lagging at the default threshold (1 h).
    backdate(database_url, "cg", 2)
    lagging = (await http.get(f"{API}/consumer-groups/lagging")).json()
    assert [(x["consumer_group"], x["queue_name"], x["partition_name"], x["offset_lag"])
            for x in lagging] == [("g1", "cg", "Default", 2)]
    assert 7190 <= lagging[0]["time_lag_seconds"] <= 7300 and lagging[0]["lag_hours"] >= 1.99
    r = await http.get(f"{API}/consumer-groups/lagging", params={"minLagSeconds": 10_000})
    assert r.json() == []
    groups = (await http.get(f"{API}/consumer-groups")).json()
    assert groups[0]["state"] == "Lagging" and groups[0]["maxTimeLag"] >= 7190


async def test_the_backlog_is_counted_where_no_group_has_read_yet(
        http: httpx.AsyncClient) -> None:
    """A queue nobody consumed yet lists no group (as Queen's server: groups are made by
    pops) and its 20 messages are pending; once a group has read the queue, a partition it
    has not popped yet lags by all its messages (committed -1: nothing done there)."""
    await push(http, "orders", list(range(20)))
    assert (await http.get(f"{API}/consumer-groups")).json() == []
    (q,) = (await http.get(f"{API}/resources/queues")).json()["queues"]
    assert q["messages"] == {"total": 20, "pending": 20, "processing": 0}

    got = await pop(http, "orders", batch=20, consumerGroup="billing", autoAck=True)
    assert len(got["messages"]) == 20
    await push(http, "orders", list(range(5)), partition="eu")
    (g,) = (await http.get(f"{API}/consumer-groups")).json()
    assert (g["name"], g["members"], g["totalLag"], g["partitionsWithLag"]) == (
        "billing", 2, 5, 1)
    parts = {p["partition"]: p for p in (await group_detail(http, "billing"))["orders"][
        "partitions"]}
    assert (parts["eu"]["committed"], parts["eu"]["offsetLag"], parts["eu"]["leaseActive"],
            parts["eu"]["lastConsumedAt"]) == (-1, 5, False, None)
    assert (parts["Default"]["committed"], parts["Default"]["offsetLag"]) == (19, 0)
    (q,) = (await http.get(f"{API}/resources/queues")).json()["queues"]
    assert q["messages"] == {"total": 25, "pending": 5, "processing": 0}


async def test_seek_to_end_offset_and_timestamp(http: httpx.AsyncClient, database_url: str) -> None:
    await push(http, "sk", list(range(6)))
    got = await pop(http, "sk", batch=2, consumerGroup="g")

    # To the end: the live lease is cleared, its holder's acks are refused.
    r = await seek(http, "g", "sk", {"toEnd": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["success"], body["seekToEnd"], body["partitionsUpdated"]) == (True, True, 1)
    assert (body["partitions"][0]["committed"], body["partitions"][0]["leaseCleared"]) == (5, True)
    m = got["messages"][0]
    r = await http.post(f"{API}/ack", json={"transactionId": m["transactionId"],
                                            "partitionId": m["partitionId"],
                                            "leaseId": m["leaseId"], "consumerGroup": "g"})
    assert r.status_code == 200
    assert [(v["success"], v["code"]) for v in r.json()] == [(False, "lease_lost")]
    assert await pop(http, "sk", consumerGroup="g") is None

    # To an offset: the next pop starts there (committed = offset - 1).
    r = await seek(http, "g", "sk", {"offset": 4, "partition": "Default"})
    assert r.json()["partitions"][0]["committed"] == 3
    got = await pop(http, "sk", batch=10, consumerGroup="g", autoAck=True)
    assert [m["data"] for m in got["messages"]] == [4, 5]

    # To a timestamp: past every message created at or before it, sealed ones too.
    backdate(database_url, "sk", 2, below_offset=3)  # offsets 0-2 two hours old
    assert seal_all(database_url, "sk", EAGER) == 2  # 0-4, 5
    at = (datetime.now(UTC) - timedelta(hours=1)).isoformat().replace("+00:00", "Z")
    r = await seek(http, "g", "sk", {"timestamp": at})
    assert r.status_code == 200, r.text
    assert r.json()["partitions"][0]["committed"] == 2
    got = await pop(http, "sk", batch=10, consumerGroup="g", autoAck=True)
    assert [m["data"] for m in got["messages"]] == [3, 4, 5]
    # Before everything: back to the start; a new group is created by a seek.
    r = await seek(http, "fresh", "sk", {"timestamp": "2000-01-01T00:00:00Z"})
    assert r.json()["partitions"][0]["committed"] == -1
    got = await pop(http, "sk", batch=10, consumerGroup="fresh", autoAck=True)
    assert [m["data"] for m in got["messages"]] == list(range(6))


async def test_delete_a_group_everywhere_or_on_one_queue(http: httpx.AsyncClient) -> None:
    await push(http, "d1", [1])
    await push(http, "d2", [1])
    for q in ("d1", "d2"):
        await pop(http, q, consumerGroup="g", autoAck=True)
    r = await http.delete(f"{API}/consumer-groups/g/queues/d1",
                          params={"deleteMetadata": "false"})
    assert r.json() == {"success": True, "consumerGroup": "g", "queueName": "d1",
                        "deletedPartitions": 1, "metadataDeleted": False}
    assert list(await group_detail(http, "g")) == ["d2"]
    # The group starts afresh on d1: from the beginning.
    got = await pop(http, "d1", consumerGroup="g", autoAck=True)
    assert [m["data"] for m in got["messages"]] == [1]
    r = await http.delete(f"{API}/consumer-groups/g")
    assert r.json() == {"success": True, "consumerGroup": "g", "deletedPartitions": 2,
                        "metadataDeleted": True}
    assert await group_detail(http, "g") == {}
    assert (await http.delete(f"{API}/consumer-groups/g")).json()["deletedPartitions"] == 0


@pytest.mark.parametrize(("method", "path", "body", "status", "code"), [
    ("POST", "/consumer-groups/g/queues/q/seek", None, 400, "invalid_seek"),
    ("POST", "/consumer-groups/g/queues/q/seek", {"toEnd": True, "offset": 1}, 400,
     "invalid_seek"),
    ("POST", "/consumer-groups/g/queues/q/seek", {"toEnd": "yes"}, 400, "invalid_seek"),
    ("POST", "/consumer-groups/g/queues/q/seek", {"timestamp": "soon"}, 400,
     "invalid_timestamp"),
    ("POST", "/consumer-groups/g/queues/q/seek", {"timestamp": 12}, 400, "invalid_timestamp"),
    ("POST", "/consumer-groups/g/queues/q/seek", {"offset": -1}, 400, "invalid_offset"),
    ("POST", "/consumer-groups/g/queues/q/seek", {"offset": 99}, 400, "invalid_offset"),
    ("POST", "/consumer-groups/g/queues/q/seek", [1], 400, "invalid_body"),
    ("POST", "/consumer-groups/g/queues/nope/seek", {"toEnd": True}, 404, "queue_not_found"),
    ("POST", "/consumer-groups/g/queues/q/seek", {"offset": 0, "partition": "zz"}, 404,
     "partition_not_found"),
    ("POST", "/consumer-groups/a%20b/queues/q/seek", {"toEnd": True}, 400,
     "invalid_consumer_group"),
    ("GET", "/consumer-groups/a%20b", None, 400, "invalid_consumer_group"),
    ("DELETE", "/consumer-groups/g/queues/a%20b", None, 400, "invalid_queue"),
    ("DELETE", "/consumer-groups/g?deleteMetadata=maybe", None, 400, "invalid_parameter"),
    ("GET", "/consumer-groups/lagging?minLagSeconds=-1", None, 400, "invalid_parameter"),
    ("GET", "/dlq?cursor=3&offset=2", None, 400, "invalid_parameter"),
    ("GET", "/dlq?from=yesterday", None, 400, "invalid_timestamp"),
    ("GET", "/messages?status=lost", None, 400, "invalid_parameter"),
    ("GET", "/messages?limit=0", None, 400, "invalid_parameter"),
    ("GET", "/messages/not-a-uuid/t1", None, 400, "invalid_partition_id"),
    ("GET", "/messages/00000000-0000-0000-0000-000000000000/t1", None, 404,
     "message_not_found"),
    ("GET", "/resources/partitions?queue=a%20b", None, 400, "invalid_queue"),
    ("GET", "/status?from=x", None, 400, "invalid_timestamp"),
])
async def test_bad_input_is_a_json_error(
    http: httpx.AsyncClient, method: str, path: str, body: Any, status: int, code: str
) -> None:
    await push(http, "q", [1])
    r = await http.request(method, API + path, json=body)
    assert (r.status_code, r.json()["error"]) == (status, code), r.text


# -- dead letters: offset pages and cursor pages ------------------------------------------------


async def test_dlq_pages_by_offset_and_by_cursor(http: httpx.AsyncClient) -> None:
    await push(http, "dq", [1, 2, 3])
    got = await pop(http, "dq", batch=3, consumerGroup="g")
    r = await http.post(f"{API}/ack/batch", json={"consumerGroup": "g", "acknowledgments": [
        {"transactionId": m["transactionId"], "partitionId": m["partitionId"],
         "leaseId": m["leaseId"], "status": "dlq", "error": "bad"} for m in got["messages"]]})
    assert [v["dlq"] for v in r.json()] == [True] * 3  # one call: a dlq releases the lease
    first = (await http.get(f"{API}/dlq", params={"queue": "dq", "limit": 2})).json()
    assert [d["data"] for d in first["messages"]] == [1, 2]
    assert first["pagination"] == {"limit": 2, "offset": 0, "total": 3, "next": first["next"]}
    assert first["total"] == 3 and first["next"] is not None
    by_offset = (await http.get(f"{API}/dlq", params={"queue": "dq", "limit": 2,
                                                       "offset": 2})).json()
    assert [d["data"] for d in by_offset["messages"]] == [3]
    assert by_offset["pagination"]["offset"] == 2 and by_offset["next"] is None
    by_cursor = (await http.get(f"{API}/dlq", params={"queue": "dq",
                                                       "cursor": first["next"]})).json()
    assert [d["data"] for d in by_cursor["messages"]] == [3]
    beyond = (await http.get(f"{API}/dlq", params={"queue": "dq", "offset": 10})).json()
    assert (beyond["messages"], beyond["total"]) == ([], 3)
    future = (await http.get(f"{API}/dlq", params={"from": "2999-01-01T00:00:00Z"})).json()
    assert future["total"] == 0


# -- operators' reads ---------------------------------------------------------------------------


async def test_overview_partitions_messages_and_status(
    http: httpx.AsyncClient, database_url: str
) -> None:
    await push(http, "ops", ["a", "b", "c", "d"])
    await push(http, "ops", ["x"], partition="p2")
    got = await pop(http, "ops", "Default", batch=2)  # queue mode: a, b leased
    await ack(http, got["messages"][0])  # a completed
    bad = await pop(http, "ops", "p2", consumerGroup="g")
    await ack(http, bad["messages"][0], "dlq", error="nope")
    first_of_g = await pop(http, "ops", "Default", consumerGroup="g", batch=1)
    await ack(http, first_of_g["messages"][0])  # g past "a" too: "a" completed

    overview = (await http.get(f"{API}/resources/overview")).json()
    assert (overview["queues"], overview["partitions"]) == (1, 2)
    # A group's first pop of a queue gives it a cursor on every partition of it, so a message
    # is completed once every group is past it: "a" is, "x" is still owed to queue mode.
    assert overview["messages"] == {"total": 5, "pending": 3, "processing": 1,
                                    "completed": 1, "failed": 0, "deadLetter": 1}
    assert set(overview["lag"]) == {"time", "offset"}
    # The tenant's stored bytes against its plan's gate (none by default), folded each second.
    with trio.fail_after(5):
        while not overview["storage"]["usedBytes"]:
            await trio.sleep(0.1)
            overview = (await http.get(f"{API}/resources/overview")).json()
    assert overview["storage"]["usedBytes"] > 0
    assert (overview["storage"]["maxStoredBytes"], overview["storage"]["overGate"]) == (
        None, False)

    parts = (await http.get(f"{API}/resources/partitions", params={"queue": "ops"})).json()
    assert [(p["name"], p["messages"]["total"], p["messages"]["completed"])
            for p in parts["partitions"]] == [("Default", 4, 1), ("p2", 1, 0)]
    assert parts["pagination"] == {"limit": 100, "offset": 0, "total": 2}

    listing = (await http.get(f"{API}/messages", params={"queue": "ops"})).json()
    status = {m["transactionId"]: m["status"] for m in listing["messages"]}
    assert listing["pagination"]["total"] == 5
    by_data = {m["offset"]: m for m in listing["messages"] if m["partition"] == "Default"}
    assert [by_data[o]["status"] for o in range(4)] == [
        "completed", "processing", "pending", "pending"]
    assert status[bad["messages"][0]["transactionId"]] == "dead_letter"
    page = (await http.get(f"{API}/messages", params={"queue": "ops", "status": "pending",
                                                      "limit": 1})).json()
    assert len(page["messages"]) == 1 and page["pagination"]["total"] == 2

    # Sealed frames are listed too, with their own createdAt.
    assert seal_all(database_url, "ops", EAGER) == 2
    sealed = (await http.get(f"{API}/messages", params={"queue": "ops"})).json()
    assert sorted(m["transactionId"] for m in sealed["messages"]) == sorted(status)
    assert all(m["sealed"] and m["createdAt"] for m in sealed["messages"])

    m = got["messages"][1]
    one = (await http.get(f"{API}/messages/{m['partitionId']}/{m['transactionId']}")).json()
    assert (one["payload"], one["status"], one["queue"], one["offset"]) == (
        "b", "processing", "ops", 1)
    assert one["consumerGroups"][0]["name"] == "__QUEUE_MODE__"

    st = (await http.get(f"{API}/status")).json()
    assert st["messages"]["total"] == 5 and st["leases"]["active"] == 1
    assert st["deadLetterQueue"]["totalMessages"] == 1
    assert [q["name"] for q in st["queues"]] == ["ops"]


# -- tenant isolation ---------------------------------------------------------------------------


async def test_tenants_never_see_delete_or_seek_each_others_groups(
    http_a: httpx.AsyncClient, http_b: httpx.AsyncClient  # noqa: F811 (fixtures)
) -> None:
    await push(http_a, "secret", [1, 2])
    got = await pop(http_a, "secret", consumerGroup="g")
    await ack(http_a, got["messages"][0], "dlq")
    m = got["messages"][0]

    assert (await http_b.get(f"{API}/consumer-groups")).json() == []
    assert await group_detail(http_b, "g") == {}
    r = await http_b.get(f"{API}/consumer-groups/lagging", params={"minLagSeconds": 0})
    assert r.json() == []
    r = await http_b.delete(f"{API}/consumer-groups/g")
    assert r.json()["deletedPartitions"] == 0
    r = await http_b.delete(f"{API}/consumer-groups/g/queues/secret")
    assert r.json()["deletedPartitions"] == 0
    r = await seek(http_b, "g", "secret", {"toEnd": True})
    assert (r.status_code, r.json()["error"]) == (404, "queue_not_found")
    r = await http_b.get(f"{API}/messages/{m['partitionId']}/{m['transactionId']}")
    assert (r.status_code, r.json()["error"]) == (404, "message_not_found")
    listing = (await http_b.get(f"{API}/messages")).json()
    assert listing["messages"] == [] and listing["pagination"]["total"] == 0
    overview = (await http_b.get(f"{API}/resources/overview")).json()
    assert (overview["queues"], overview["messages"]["total"]) == (0, 0)
    assert (await http_b.get(f"{API}/resources/partitions")).json()["partitions"] == []
    assert (await http_b.get(f"{API}/status")).json()["messages"]["deadLetter"] == 0
    assert (await http_b.get(f"{API}/dlq")).json()["total"] == 0

    # A's group is untouched by all of that.
    (part,) = (await group_detail(http_a, "g"))["secret"]["partitions"]
    assert part["committed"] == 0
    assert (await http_a.get(f"{API}/dlq")).json()["total"] == 1

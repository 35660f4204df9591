"""Queen's pop parameters over HTTP: subscription modes of a new consumer group
(``subscriptionMode``, ``subscriptionFrom``) and multi-partition pops (``partitions``)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import httpx
import psycopg
import pytest
import trio

from queen_trio.db.rows import one
from queen_trio.server import BrokerHandle

from ..helpers import parked
from .test_log import API, ack, configure, pop, push


async def pop_all(http: httpx.AsyncClient, queue: str, **params: Any) -> list[dict]:
    """Pop (autoAck) until empty: the payloads the group gets."""
    got: list[dict] = []
    while (answer := await pop(http, queue, batch=100, autoAck=True, **params)) is not None:
        got += answer["messages"]
    return got


# -- subscription modes -----------------------------------------------------------------------


@pytest.mark.parametrize("params", [{"subscriptionMode": "new"}, {"subscriptionMode": "new-only"},
                                    {"subscriptionFrom": "now"}])
async def test_new_group_with_mode_new_sees_only_what_comes_after(
    http: httpx.AsyncClient, params: dict[str, str]
) -> None:
    await push(http, "ev", [{"old": 1}, {"old": 2}])
    await push(http, "ev", [{"old": 3}], partition="p2")
    assert await pop_all(http, "ev", consumerGroup="g", **params) == []
    await push(http, "ev", [{"new": 1}])
    await push(http, "ev", [{"new": 2}], partition="p2")
    await push(http, "ev", [{"new": 3}], partition="p3")  # a partition created since
    got = await pop_all(http, "ev", consumerGroup="g", **params)
    assert sorted(m["data"]["new"] for m in got) == [1, 2, 3]
    # the default (and subscriptionMode=all / subscriptionFrom=beginning) sees everything
    assert len(await pop_all(http, "ev", consumerGroup="all")) == 6
    assert len(await pop_all(http, "ev", consumerGroup="all2", subscriptionMode="all")) == 6
    assert len(await pop_all(http, "ev", consumerGroup="b", subscriptionFrom="beginning")) == 6


async def test_the_first_pop_on_an_empty_queue_subscribes_the_group(
    http: httpx.AsyncClient,
) -> None:
    """A consumer waiting for the first push must get it: the group subscribed when it first
    asked, not when a partition first had something for it."""
    await push(http, "ev", [{"old": 1}], partition="a")
    assert await pop(http, "ev", consumerGroup="g", subscriptionMode="new") is None
    await push(http, "ev", [{"new": 1}], partition="b")
    await push(http, "ev", [{"new": 2}], partition="a")
    got = await pop_all(http, "ev", consumerGroup="g", subscriptionMode="new")
    assert sorted(m["data"]["new"] for m in got) == [1, 2]


async def test_a_queue_deleted_and_made_again_is_new_to_a_subscribed_group(
    http: httpx.AsyncClient,
) -> None:
    """Deleting a queue forgets when its groups subscribed: under mode new, a group's first
    pop of the queue made again is its subscription, not the first pop of the old one."""
    assert await pop(http, "ev", consumerGroup="g", subscriptionMode="new") is None
    await push(http, "ev", [{"old": 1}])
    assert (await http.delete(f"{API}/resources/queues/ev")).status_code == 200
    await push(http, "ev", [{"before": 1}])  # before the group's first pop of the new queue
    assert await pop_all(http, "ev", consumerGroup="g", subscriptionMode="new") == []
    await push(http, "ev", [{"after": 1}])
    got = await pop_all(http, "ev", consumerGroup="g", subscriptionMode="new")
    assert [m["data"] for m in got] == [{"after": 1}]


async def test_a_long_poll_with_mode_new_gets_the_push_that_wakes_it(
    broker: BrokerHandle, http: httpx.AsyncClient,
) -> None:
    await push(http, "ev", [{"old": 1}])
    answer: dict = {}

    async def waiter() -> None:
        answer["r"] = await pop(http, "ev", consumerGroup="g", subscriptionMode="new",
                                wait=True, timeout=5000)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await parked(broker)
        await push(http, "ev", [{"new": 1}])
    assert [m["data"] for m in answer["r"]["messages"]] == [{"new": 1}]


async def test_subscription_from_a_timestamp(http: httpx.AsyncClient, database_url: str) -> None:
    await push(http, "ev", [{"n": 1}, {"n": 2}])
    await trio.sleep(0.05)
    with psycopg.connect(database_url) as conn:
        (since,) = one(conn.execute("SELECT clock_timestamp()"))
    await trio.sleep(0.05)
    await push(http, "ev", [{"n": 3}, {"n": 4}])
    stamp = since.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")
    got = await pop_all(http, "ev", consumerGroup="g", subscriptionFrom=stamp)
    assert [m["data"]["n"] for m in got] == [3, 4]
    later = (since + dt.timedelta(days=1)).isoformat()
    assert await pop_all(http, "ev", consumerGroup="h", subscriptionFrom=later) == []
    await push(http, "ev", [{"n": 5}])  # the end was where h started: it sees what follows
    assert [m["data"]["n"] for m in await pop_all(http, "ev", consumerGroup="h",
                                                  subscriptionFrom=later)] == [5]
    earlier = (since - dt.timedelta(days=1)).isoformat()
    assert len(await pop_all(http, "ev", consumerGroup="i", subscriptionFrom=earlier)) == 5


async def test_an_existing_group_and_queue_mode_are_not_moved(http: httpx.AsyncClient) -> None:
    await push(http, "ev", [{"n": 1}, {"n": 2}])
    first = await pop(http, "ev", consumerGroup="g", batch=1, autoAck=True)
    assert first["messages"][0]["data"] == {"n": 1}
    got = await pop_all(http, "ev", consumerGroup="g", subscriptionMode="new")
    assert [m["data"]["n"] for m in got] == [2]
    # queue mode distributes work: a subscription would lose messages, so it does not apply
    assert len(await pop_all(http, "ev", subscriptionMode="new")) == 2


@pytest.mark.parametrize(("key", "raw", "code"), [
    ("subscriptionMode", "latest", "invalid_subscription_mode"),
    ("subscriptionMode", "NEW", "invalid_subscription_mode"),
    ("subscriptionFrom", "yesterday", "invalid_subscription_from"),
    ("subscriptionFrom", "2025-01-01T00:00:00", "invalid_subscription_from"),  # no time zone
    ("subscriptionFrom", "2025-13-01T00:00:00Z", "invalid_subscription_from"),
    ("partitions", "0", "invalid_parameter"),
    ("partitions", "101", "invalid_parameter"),
    ("partitions", "two", "invalid_parameter"),
])
async def test_bad_pop_parameters_are_400(
    http: httpx.AsyncClient, key: str, raw: str, code: str
) -> None:
    for method, path in [("GET", f"{API}/pop/queue/q"), ("POST", f"{API}/pop/queue/q"),
                         ("GET", f"{API}/pop/queue/q/partition/p")]:
        r = await http.request(method, path, params={"consumerGroup": "g", key: raw})
        assert r.status_code == 400, (method, path, r.text)
        assert r.json()["error"] == code


# -- multi-partition pop ----------------------------------------------------------------------


async def test_one_pop_takes_several_partitions_under_one_lease(
    http: httpx.AsyncClient, database_url: str,
) -> None:
    for p in ("a", "b", "c"):
        await push(http, "mp", [{"p": p, "i": i} for i in range(3)], partition=p)
    answer = await pop(http, "mp", consumerGroup="g", batch=100, partitions=3)
    messages = answer["messages"]
    assert len(messages) == 9
    assert answer["partitionId"] is None
    lease = answer["leaseId"]
    parts = {e["partition"]: e for e in answer["partitions"]}
    assert sorted(parts) == ["a", "b", "c"] and all(e["messages"] == 3 for e in parts.values())
    # Queen's shape: one lease for the whole pop, on every message and every partition
    assert lease and {m["leaseId"] for m in messages} == {lease}
    assert {e["leaseId"] for e in parts.values()} == {lease}
    assert len({e["leaseExpiresAt"] for e in parts.values()}) == 1
    for p in ("a", "b", "c"):
        mine = [m for m in messages if m["partition"] == p]
        assert [m["data"]["i"] for m in mine] == [0, 1, 2]  # order within a partition
        assert {m["partitionId"] for m in mine} == {parts[p]["partitionId"]}
    # one extension renews every partition the lease holds
    r = await http.post(f"{API}/lease/{lease}/extend", json={"seconds": 600})
    assert r.status_code == 200 and _first(r.json())["success"] is True, r.text
    assert _lease_rows(database_url, lease) == {"a": True, "b": True, "c": True}
    with psycopg.connect(database_url) as conn:
        left = conn.execute(
            "SELECT min(lease_expires_at - now()) FROM queen.cursors WHERE lease_id = %s",
            (lease,)).fetchone()[0]
    assert left > dt.timedelta(seconds=500)
    # acks under the lease act on each partition; a finished partition is released alone
    for m in messages:
        if m["partition"] != "c":
            assert (await ack(http, m))["success"] is True
    assert _lease_rows(database_url, lease) == {"a": False, "b": False, "c": True}
    assert await pop(http, "mp", consumerGroup="g", partitions=3) is None
    # a nack (retry) under the lease releases its partition for redelivery
    c0 = next(m for m in messages if m["partition"] == "c")
    assert (await ack(http, c0, "retry"))["success"] is True
    again = await pop(http, "mp", consumerGroup="g", batch=100, partitions=3)
    assert [m["data"]["i"] for m in again["messages"]] == [0, 1, 2]
    assert again["leaseId"] != lease


def _first(body: Any) -> dict:
    """The (first) item of an answer that is a list of items or one object."""
    return body[0] if isinstance(body, list) else body


def _lease_rows(database_url: str, lease: str) -> dict[str, bool]:
    """Partition name -> whether the lease is live there, for every cursor holding it."""
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT p.name, c.lease_expires_at > now() FROM queen.cursors c "
            "JOIN queen.partitions p USING (partition_id) WHERE c.lease_id = %s",
            (lease,)).fetchall()
    return {name: bool(live) for name, live in rows}


async def test_a_multi_partition_lease_expires_for_every_partition(
    http: httpx.AsyncClient,
) -> None:
    await configure(http, "mpx", leaseTime=1)
    for p in ("a", "b"):
        await push(http, "mpx", [{"p": p}], partition=p)
    first = await pop(http, "mpx", consumerGroup="g", batch=10, partitions=2)
    assert len(first["messages"]) == 2
    assert await pop(http, "mpx", consumerGroup="g", batch=10, partitions=2) is None
    await trio.sleep(1.5)
    # the lease ran out: both partitions are handed out again, under a new lease
    second = await pop(http, "mpx", consumerGroup="g", batch=10, partitions=2)
    assert sorted(m["partition"] for m in second["messages"]) == ["a", "b"]
    assert second["leaseId"] != first["leaseId"]
    assert {m["retryCount"] for m in second["messages"]} == {0}  # an expiry spends no retry
    # the expired lease can no longer be extended, nor ack anything
    r = await http.post(f"{API}/lease/{first['leaseId']}/extend", json={"seconds": 60})
    assert r.status_code >= 400 or _first(r.json())["success"] is False, r.text
    stale = await http.post(f"{API}/ack", json={
        "transactionId": first["messages"][0]["transactionId"],
        "partitionId": first["messages"][0]["partitionId"],
        "leaseId": first["leaseId"], "consumerGroup": "g"})
    assert stale.status_code == 409 or _first(stale.json())["success"] is False, stale.text
    for m in second["messages"]:
        assert (await ack(http, m))["success"] is True
    assert await pop(http, "mpx", consumerGroup="g", batch=10, partitions=2) is None


async def test_the_batch_is_shared_and_one_partition_answers_as_before(
    http: httpx.AsyncClient,
) -> None:
    for p in ("a", "b", "c"):
        await push(http, "mp", [{"p": p, "i": i} for i in range(3)], partition=p)
    answer = await pop(http, "mp", consumerGroup="g", batch=4, partitions=3)
    assert len(answer["messages"]) == 4 and len(answer["partitions"]) == 2
    # N=1 or absent: the single-partition answer, unchanged (no "partitions")
    single = await pop(http, "mp", consumerGroup="h", batch=10)
    assert "partitions" not in single and single["leaseId"] is not None
    assert len({m["partition"] for m in single["messages"]}) == 1
    # the partition route takes one partition whatever N is
    named = await pop(http, "mp", "a", consumerGroup="k", batch=10, partitions=3)
    assert {m["partition"] for m in named["messages"]} == {"a"}
    # one partition found for a multi-partition pop: its lease at the top as well
    await push(http, "solo", [1, 2])
    one = await pop(http, "solo", consumerGroup="g", batch=10, partitions=5)
    assert one["leaseId"] == one["partitions"][0]["leaseId"] == one["messages"][0]["leaseId"]


async def test_two_consumers_of_a_group_never_share_a_partition(
    http: httpx.AsyncClient,
) -> None:
    for p in ("a", "b", "c", "d"):
        await push(http, "mp", [{"p": p, "i": i} for i in range(2)], partition=p)
    first = await pop(http, "mp", consumerGroup="g", batch=100, partitions=2)
    second = await pop(http, "mp", consumerGroup="g", batch=100, partitions=3)
    a = {m["partition"] for m in first["messages"]}
    b = {m["partition"] for m in second["messages"]}
    assert len(a) == 2 and len(b) == 2 and not a & b
    assert await pop(http, "mp", consumerGroup="g", partitions=3) is None
    # another group is another cursor: it gets them all
    other = await pop(http, "mp", consumerGroup="o", batch=100, partitions=4)
    assert len(other["messages"]) == 8


async def test_settle_and_pop_takes_the_same_parameters(http: httpx.AsyncClient) -> None:
    for p in ("a", "b"):
        await push(http, "mp", [{"p": p}], partition=p)
    r = await http.post(f"{API}/pop/queue/mp", params={"consumerGroup": "g", "batch": "10",
                                                       "partitions": "2"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert len(body["messages"]) == 2 and len(body["partitions"]) == 2
    acks = [{"transactionId": m["transactionId"], "partitionId": m["partitionId"],
             "leaseId": m["leaseId"]} for m in body["messages"]]
    r = await http.post(f"{API}/pop/queue/mp",
                        params={"consumerGroup": "g", "partitions": "2"},
                        json={"consumerGroup": "g", "acknowledgments": acks})
    body = r.json()
    assert body["acks"]["completed"] == 2 and body["messages"] == [] and body["partitions"] == []
    await push(http, "mp", [{"new": 1}])
    r = await http.post(f"{API}/pop/queue/mp",
                        params={"consumerGroup": "n", "subscriptionMode": "new"})
    assert r.json()["messages"] == []


async def test_deleting_a_group_with_its_metadata_makes_it_subscribe_afresh(
    http: httpx.AsyncClient,
) -> None:
    assert await pop(http, "ev", consumerGroup="g", subscriptionMode="new") is None
    await push(http, "ev", [{"n": 1}])
    # Without its metadata the group keeps its subscription instant: a new first pop after
    # the delete starts there, so the message pushed since is delivered again.
    r = await http.delete(f"{API}/consumer-groups/g", params={"deleteMetadata": "false"})
    assert r.json()["metadataDeleted"] is False
    got = await pop_all(http, "ev", consumerGroup="g", subscriptionMode="new")
    assert [m["data"] for m in got] == [{"n": 1}]
    # With it (the default), the group subscribes afresh at its next pop: nothing older.
    r = await http.delete(f"{API}/consumer-groups/g")
    assert r.json()["metadataDeleted"] is True
    assert await pop(http, "ev", consumerGroup="g", subscriptionMode="new") is None
    await push(http, "ev", [{"n": 2}])
    got = await pop_all(http, "ev", consumerGroup="g", subscriptionMode="new")
    assert [m["data"] for m in got] == [{"n": 2}]

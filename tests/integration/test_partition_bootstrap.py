"""A queue of many partitions, as Queen's JavaScript client's bootstrap tests build one: a push
into each new partition, then a consumer group's first pass over all of them. A group's first
pop of the queue creates its cursors on every partition in one statement, each where the
group starts there (the beginning, or its subscription), so its next pops find them ready."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import httpx
import psycopg
import trio

from queen_trio.client import Client, Message

from . import test_sdk
from .test_log import API, pop, push

settings, queen = test_sdk.settings, test_sdk.queen  # the SDK fixtures


async def push_each(http: httpx.AsyncClient, queue: str, partitions: int, tag: str) -> None:
    """One message into each partition p-0 … p-(n-1), in one push (the partitions it creates
    are created in one statement)."""
    r = await http.post(f"{API}/push", json={"items": [
        {"queue": queue, "partition": f"p-{i}", "payload": {"id": i, "tag": tag}}
        for i in range(partitions)]})
    assert r.status_code == 201, r.text
    assert [a["status"] for a in r.json()] == ["queued"] * partitions


def cursors(database_url: str, queue: str, group: str) -> int:
    with psycopg.connect(database_url) as conn:
        [(n,)] = conn.execute(
            "SELECT count(*) FROM queen.cursors c JOIN queen.partitions p USING (partition_id)"
            " JOIN queen.queues q USING (queue_id) WHERE q.name = %s AND c.consumer_group = %s",
            (queue, group)).fetchall()
    return int(n)


async def drain(http: httpx.AsyncClient, queue: str, **params: str) -> list[dict]:
    """Pop one message at a time and ack it, until a pop finds nothing."""
    got = []
    while (answer := await pop(http, queue, batch=1, wait=False, **params)) is not None:
        [message] = answer["messages"]
        got.append(message["data"])
        r = await http.post(f"{API}/ack", json={
            "transactionId": message["transactionId"], "partitionId": message["partitionId"],
            "leaseId": message["leaseId"], "status": "completed",
            **({"consumerGroup": params["consumerGroup"]} if "consumerGroup" in params else {})})
        assert r.status_code == 200, r.text
    return got


async def test_a_groups_first_pop_creates_its_cursors_on_every_partition(
    http: httpx.AsyncClient, database_url: str,
) -> None:
    await push_each(http, "boot-all", 40, "old")
    first = await pop(http, "boot-all", batch=1, wait=False, consumerGroup="g")
    assert len(first["messages"]) == 1
    assert cursors(database_url, "boot-all", "g") == 40  # one statement, not one per pop
    # The group still gets every message once, each partition's from its beginning.
    rest = await drain(http, "boot-all", consumerGroup="g")
    assert len(rest) == 39  # the first pop's lease is still live: its message is not here
    assert sorted(m["id"] for m in [first["messages"][0]["data"], *rest]) == list(range(40))
    # Queue mode is a group like any other.
    assert sorted(m["id"] for m in await drain(http, "boot-all")) == list(range(40))
    assert cursors(database_url, "boot-all", "__QUEUE_MODE__") == 40


async def test_a_new_mode_group_starts_every_partition_after_what_was_there(
    http: httpx.AsyncClient, database_url: str,
) -> None:
    await push_each(http, "boot-new", 30, "old")
    assert await pop(http, "boot-new", batch=1, wait=False, consumerGroup="gn",
                     subscriptionMode="new") is None
    assert cursors(database_url, "boot-new", "gn") == 30
    await push_each(http, "boot-new", 30, "new")
    got = await drain(http, "boot-new", consumerGroup="gn", subscriptionMode="new")
    assert sorted(m["id"] for m in got) == list(range(30))
    assert {m["tag"] for m in got} == {"new"}


async def test_a_group_subscribing_from_an_instant_starts_every_partition_there(
    http: httpx.AsyncClient,
) -> None:
    await push_each(http, "boot-ts", 30, "old")
    await trio.sleep(0.05)
    cutoff = datetime.now(UTC).isoformat()
    await trio.sleep(0.05)
    await push_each(http, "boot-ts", 30, "new")
    # Partition p-0 has a third, newer message: the group starts at its "new" one, not after.
    await push(http, "boot-ts", [{"id": 0, "tag": "newer"}], partition="p-0")
    got = await drain(http, "boot-ts", consumerGroup="gt", subscriptionFrom=cutoff)
    assert sorted(m["id"] for m in got) == [0, *range(30)]
    assert sorted(m["tag"] for m in got) == ["new"] * 30 + ["newer"]


async def test_bootstrap_of_many_partitions_through_the_sdk(queen: Client) -> None:
    """The JS bootstrap test's shape, small: a push into each of 100 new partitions, 50 at a
    time, then a queue-mode drain and a group's first pass through consume(). (5,000 took
    minutes before the one-statement push and the group's cursors in one statement:
    bench/partition_bootstrap.py measures it.) The bound is wide: a loaded machine."""
    n = 100
    started = time.monotonic()

    async def one(j: int) -> None:
        await queen.push("boot-sdk", {"id": j}, partition=f"p-{j}")

    for i in range(0, n, 50):
        async with trio.open_nursery() as nursery:
            for j in range(i, i + 50):
                nursery.start_soon(one, j)
    seen: dict[str, list[int]] = {"queue": [], "group": []}
    for key, group in (("queue", None), ("group", "boot-g")):

        def handler(message: Message, key: str = key) -> None:
            seen[key].append(message.data["id"])

        await queen.consume("boot-sdk", handler, group=group, concurrency=10, batch=1,
                            idle_timeout="3s")
    assert sorted(seen["queue"]) == list(range(n))
    assert sorted(seen["group"]) == list(range(n))
    assert time.monotonic() - started < 300

"""Queen 2's pop semantics over HTTP: a pop's ``leaseSeconds``, the queue's ``windowBuffer``,
``conflation`` (last-value delivery) and pop ``autopilot`` (the broker sizes the pop)."""

from __future__ import annotations

import datetime as dt

import httpx
import psycopg
import pytest
import trio

from .test_log import API, ack, configure, pop, push


def _lease_left(database_url: str, lease: str) -> dt.timedelta:
    with psycopg.connect(database_url) as conn:
        return conn.execute(
            "SELECT min(lease_expires_at - now()) FROM queen.cursors WHERE lease_id = %s",
            (lease,)).fetchone()[0]


# -- leaseSeconds -----------------------------------------------------------------------------


@pytest.mark.parametrize("partitions", [1, 2])
async def test_a_pops_lease_seconds_replace_the_queues_lease_time(
    http: httpx.AsyncClient, database_url: str, partitions: int,
) -> None:
    await configure(http, "ls", leaseTime=300)
    await push(http, "ls", [1], partition="a")
    await push(http, "ls", [2], partition="b")
    short = await pop(http, "ls", consumerGroup="g", batch=10, partitions=partitions,
                      leaseSeconds=1)
    assert _lease_left(database_url, short["leaseId"]) <= dt.timedelta(seconds=1)
    await trio.sleep(1.5)
    again = await pop(http, "ls", consumerGroup="g", batch=10, partitions=2)
    assert {m["transactionId"] for m in again["messages"]} >= {
        m["transactionId"] for m in short["messages"]}
    # 0 (Queen's "the queue's") and absent: the queue's leaseTime
    other = await pop(http, "ls", consumerGroup="h", batch=10, leaseSeconds=0)
    assert _lease_left(database_url, other["leaseId"]) > dt.timedelta(seconds=200)


@pytest.mark.parametrize("raw", ["-1", "86401", "ten", "1.5"])
async def test_bad_lease_seconds_are_400(http: httpx.AsyncClient, raw: str) -> None:
    r = await http.get(f"{API}/pop/queue/ls", params={"leaseSeconds": raw})
    assert r.status_code == 400 and r.json()["error"] == "invalid_parameter", r.text


# -- windowBuffer -----------------------------------------------------------------------------


async def test_window_buffer_holds_a_partition_until_its_newest_message_is_that_old(
    http: httpx.AsyncClient,
) -> None:
    r = await http.post(f"{API}/configure", json={"queue": "wb", "options": {"windowBuffer": 2}})
    assert r.status_code == 200 and r.json()["options"]["windowBuffer"] == 2, r.text
    assert "windowBuffer" not in r.json()["ignored"]
    await push(http, "wb", [1, 2, 3])
    await push(http, "wb", [9], partition="calm")
    assert await pop(http, "wb", batch=10) is None
    assert await pop(http, "wb", "Default", batch=10) is None
    await trio.sleep(1.2)
    await push(http, "wb", [4])  # a new message restarts the partition's window
    await trio.sleep(1.2)
    # "calm" has settled; Default has not (its newest message is 1.2 s old)
    got = await pop(http, "wb", batch=10, partitions=2)
    assert [m["data"] for m in got["messages"]] == [9]
    await trio.sleep(1.2)
    got = await pop(http, "wb", batch=10)
    assert [m["data"] for m in got["messages"]] == [1, 2, 3, 4]
    listed = (await http.get(f"{API}/resources/queues/wb")).json()
    assert listed["options"]["windowBuffer"] == 2


async def test_a_waiting_pop_is_served_when_the_window_passes(http: httpx.AsyncClient) -> None:
    await configure(http, "wbw", windowBuffer=1)
    await push(http, "wbw", ["x"])
    start = trio.current_time()
    got = await pop(http, "wbw", batch=10, wait=True, timeout=10_000)
    assert [m["data"] for m in got["messages"]] == ["x"]
    assert 0.5 <= trio.current_time() - start < 8


# -- conflation -------------------------------------------------------------------------------


async def test_conflation_delivers_only_the_newest_message_of_each_partition(
    http: httpx.AsyncClient, database_url: str,
) -> None:
    await push(http, "cf", [{"v": i} for i in range(50)], partition="x")
    await push(http, "cf", [{"v": i} for i in range(3)], partition="y")
    got = await pop(http, "cf", consumerGroup="w", conflation=True, batch=10)
    assert got["conflation"] is True
    assert sorted((m["partition"], m["data"]["v"]) for m in got["messages"]) == [
        ("x", 49), ("y", 2)]
    assert len({m["leaseId"] for m in got["messages"]}) == 1
    for m in got["messages"]:
        assert (await ack(http, m))["success"] is True
    # everything behind the newest is retired: nothing left for the group
    r = await http.get(f"{API}/pop/queue/cf", params={"consumerGroup": "w", "conflation": "true"})
    assert r.status_code == 200 and r.json() == {**r.json(), "messages": [], "conflation": True}
    # a newer push is delivered; another group still sees every message
    await push(http, "cf", [{"v": 50}, {"v": 51}], partition="x")
    again = await pop(http, "cf", consumerGroup="w", conflation=True, batch=10)
    assert [m["data"]["v"] for m in again["messages"]] == [51]
    plain = await pop(http, "cf", consumerGroup="audit", batch=100, partitions=2)
    assert len(plain["messages"]) == 55 and "conflation" not in plain


async def test_a_conflated_message_not_acked_comes_back_newest_first(
    http: httpx.AsyncClient,
) -> None:
    await configure(http, "cfl", leaseTime=1)
    await push(http, "cfl", [1, 2, 3])
    first = await pop(http, "cfl", "Default", consumerGroup="w", conflation=True)
    assert [m["data"] for m in first["messages"]] == [3]
    await push(http, "cfl", [4])
    await trio.sleep(1.5)  # the lease runs out, the handler never acked
    second = await pop(http, "cfl", "Default", consumerGroup="w", conflation=True)
    assert [m["data"] for m in second["messages"]] == [4]


async def test_a_groups_policy_holds_until_the_group_is_deleted_with_its_metadata(
    http: httpx.AsyncClient,
) -> None:
    """Queen's rule: the group's first pop registers its conflation; a pop asking otherwise is
    answered under the stored policy, with ``conflationConflict`` (on an empty answer too, a
    200 rather than a 204); deleting the group with its metadata lets it register afresh."""
    assert (await http.get(f"{API}/pop/queue/cpol", params={"consumerGroup": "g"})
            ).status_code == 204  # registered without conflation
    r = await http.get(f"{API}/pop/queue/cpol",
                       params={"consumerGroup": "g", "conflation": "true"})
    assert r.status_code == 200 and r.json()["conflationConflict"] is True
    assert "conflation" not in r.json()
    await push(http, "cpol", [1, 2, 3])
    got = await pop(http, "cpol", consumerGroup="g", conflation=True, batch=10)
    assert [m["data"] for m in got["messages"]] == [1, 2, 3]
    assert got["conflationConflict"] is True
    r = await http.delete(f"{API}/consumer-groups/g/queues/cpol")
    assert r.status_code == 200 and r.json()["metadataDeleted"] is True
    await push(http, "cpol", [4])
    again = await pop(http, "cpol", consumerGroup="g", conflation=True, batch=10)
    assert [m["data"] for m in again["messages"]] == [4]
    assert again["conflation"] is True and "conflationConflict" not in again
    # now conflating: a pop that says nothing is conflated too, and told nothing more
    await push(http, "cpol", [5, 6])
    r = await http.get(f"{API}/pop/queue/cpol", params={"consumerGroup": "g", "batch": "10"})
    # the group's lease on its partition is still held: nothing, and said so as Queen does
    assert r.status_code == 200 and r.json()["messages"] == [] and r.json()["conflation"]
    await ack(http, again["messages"][0])
    plain = await pop(http, "cpol", consumerGroup="g", batch=10)
    assert [m["data"] for m in plain["messages"]] == [6] and plain["conflation"] is True


@pytest.mark.parametrize(("params", "code"), [
    ({"conflation": "true"}, "conflation_requires_consumer_group"),
    ({"conflation": "true", "consumerGroup": "g", "autoAck": "true"}, "conflation_with_auto_ack"),
    ({"conflation": "maybe", "consumerGroup": "g"}, "invalid_parameter"),
    ({"autopilot": "yes"}, "invalid_parameter"),
])
async def test_refused_conflation_and_autopilot_parameters(
    http: httpx.AsyncClient, params: dict[str, str], code: str,
) -> None:
    r = await http.get(f"{API}/pop/queue/cfx", params=params)
    assert r.status_code == 400 and r.json()["error"] == code, r.text


# -- autopilot --------------------------------------------------------------------------------


async def test_autopilot_sizes_what_the_client_left_unset(http: httpx.AsyncClient) -> None:
    for p in ("a", "b", "c", "d"):
        await push(http, "ap", [{"p": p, "i": i} for i in range(5)], partition=p)
    # nothing set: one consumer takes every ready partition, under one lease
    got = await pop(http, "ap", consumerGroup="g", autopilot=True)
    assert got["autopilot"]["batch"] == 100 and got["autopilot"]["partitions"] >= 4
    assert len(got["messages"]) == 20 and len({m["leaseId"] for m in got["messages"]}) == 1
    # a pinned width is the client's: partitions=1 stays one partition, the batch is sized
    one = await pop(http, "ap", consumerGroup="h", autopilot=True, partitions=1)
    assert one["autopilot"] == {"partitions": 1, "batch": 100}
    assert len({m["partition"] for m in one["messages"]}) == 1 and len(one["messages"]) == 5
    # a pinned batch is the client's too
    two = await pop(http, "ap", consumerGroup="k", autopilot=True, batch=7)
    assert two["autopilot"]["batch"] == 7 and len(two["messages"]) == 7
    # without autopilot nothing is echoed, and the old defaults hold
    plain = await pop(http, "ap", consumerGroup="m")
    assert "autopilot" not in plain and len(plain["messages"]) == 1

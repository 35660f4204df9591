"""Parked long-polls wake when something becomes poppable for them, and only then
(queen_trio/log/wakeups.py): a lease running out, a group deleted on every queue,
notifications lost while the LISTEN connection was down; and the bounds on how many may wait
(429 per tenant, 503 per broker). The crowd of 3,000 is in tests/load/test_parked_polls.py."""

from __future__ import annotations

import re
import time
import uuid
from typing import Any

import httpx
import psycopg
import pytest
import trio
from psycopg.rows import dict_row

from queen_trio.config import Settings
from queen_trio.log import store as log_store
from queen_trio.server import BrokerHandle, run_broker

from ..conftest import replace_settings
from .test_log import configure, pop, push

API = "/api/v1"


def looks(text: str) -> dict[str, float]:
    """queen_longpoll_looks_total by reason, from a /metrics answer."""
    return {m[0]: float(m[1]) for m in
            re.findall(r'^queen_longpoll_looks_total\{reason="(\w+)"\} (\S+)$', text, re.M)}


async def metrics(http: httpx.AsyncClient) -> str:
    return (await http.get("/metrics")).text


async def waiting(http: httpx.AsyncClient) -> float:
    found = re.search(r"^queen_longpoll_waiters (\S+)$", await metrics(http), re.M)
    assert found is not None
    return float(found[1])


async def until_waiting(http: httpx.AsyncClient, n: int) -> None:
    with trio.fail_after(10):
        while await waiting(http) < n:
            await trio.sleep(0.02)


class Timed:
    """A long poll run in the background: its answer and when it came."""

    def __init__(self) -> None:
        self.answer: dict[str, Any] | None = None
        self.at: float | None = None

    async def pop(self, http: httpx.AsyncClient, queue: str, params: dict[str, Any]) -> None:
        self.answer = await pop(http, queue, wait=True, **params)
        self.at = time.monotonic()


async def test_a_parked_pop_takes_a_message_once_its_lease_runs_out_without_polling(
    http: httpx.AsyncClient,
) -> None:
    await configure(http, "lapse", leaseTime=2)
    await push(http, "lapse", ["x"])
    taken = await pop(http, "lapse")  # its consumer dies: nobody acks
    leased_at = time.monotonic()
    before = looks(await metrics(http))
    poll = Timed()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(poll.pop, http, "lapse", {"timeout": 15000})
    assert poll.answer is not None and poll.at is not None
    # Redelivered after its lease ran out, spending no retry (Queen counts only failed acks).
    assert [(m["data"], m["retryCount"]) for m in poll.answer["messages"]] == [("x", 0)]
    assert poll.answer["leaseId"] != taken["leaseId"]
    assert 1.9 <= poll.at - leased_at < 6.0
    # It looked once, when the lease ended: not once a second while it waited.
    after = looks(await metrics(http))
    assert {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)} \
        == {"due": 1}


async def test_deleting_a_group_on_every_queue_wakes_its_parked_pops(
    http: httpx.AsyncClient,
) -> None:
    """The group's live lease goes with its cursors: a pop of the group parked behind that
    lease (60 s) can take the message at once."""
    await configure(http, "regroup", leaseTime=60)
    await push(http, "regroup", ["again"])
    assert (await pop(http, "regroup", consumerGroup="g")) is not None
    poll = Timed()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(poll.pop, http, "regroup", {"consumerGroup": "g", "timeout": 15000})
        await until_waiting(http, 1)
        deleted_at = time.monotonic()
        r = await http.delete(f"{API}/consumer-groups/g")
        assert r.status_code == 200 and r.json()["deletedPartitions"] == 1, r.text
    assert poll.answer is not None and poll.at is not None
    assert [m["data"] for m in poll.answer["messages"]] == ["again"]
    assert poll.at - deleted_at < 5.0


async def test_a_push_whose_notification_was_lost_reaches_the_parked_pop_after_a_reconnect(
    broker: BrokerHandle, http: httpx.AsyncClient, database_url: str,
) -> None:
    """The push commits while the LISTEN connection is gone, so its NOTIFY reaches nobody;
    once the listener is back (MISSED), every lane looks once."""
    await configure(http, "deaf")
    listener = broker.context.listener
    poll = Timed()
    before = looks(await metrics(http))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(poll.pop, http, "deaf", {"timeout": 20000})
        await until_waiting(http, 1)
        pid = listener.backend_pid
        pushed_at = time.monotonic()

        def push_while_deaf() -> None:
            with psycopg.connect(database_url, row_factory=dict_row) as conn:
                tenant = conn.execute("SELECT tenant_id FROM queen.tenants WHERE name = "
                                      "'default'").fetchone()["tenant_id"]
                log_store.append(conn, tenant, [log_store.NewFrame(
                    "deaf", "Default", "unheard", f"txn-{uuid.uuid4()}")])
                with psycopg.connect(database_url, autocommit=True) as admin:
                    admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
                # The commit sends the NOTIFY now, before the listener can be back.

        await trio.to_thread.run_sync(push_while_deaf)
    assert poll.answer is not None and poll.at is not None
    assert [m["data"] for m in poll.answer["messages"]] == ["unheard"]
    assert poll.at - pushed_at < 10.0  # not at its timeout, nor at the safety net (>= 30 s)
    assert listener.statistics().reconnects_total >= 1
    after = looks(await metrics(http))
    assert after["missed"] - before.get("missed", 0) >= 1


@pytest.mark.parametrize(("bounds", "status", "error", "scope"), [
    ({"longpoll_max_parked_per_tenant": 2}, 429, "too_many_waiting_pops", "tenant"),
    ({"longpoll_max_parked": 2}, 503, "broker_waiting_pops_full", "broker"),
])
async def test_a_pop_past_a_bound_on_waiting_pops_is_refused_and_others_are_served(
    settings: Settings, bounds: dict[str, int], status: int, error: str, scope: str,
) -> None:
    params = {"wait": "true", "timeout": "20000"}
    async with trio.open_nursery() as nursery:
        handle: BrokerHandle = await nursery.start(run_broker,
                                                   replace_settings(settings, **bounds))
        async with httpx.AsyncClient(base_url=handle.url, timeout=30) as http:
            answers: list[int] = []

            async def park() -> None:
                r = await http.get(f"{API}/pop/queue/crowded", params=params)
                answers.append(r.status_code)

            async def refused() -> None:
                r = await http.get(f"{API}/pop/queue/crowded", params=params)
                assert r.status_code == status, r.text
                assert r.headers["Retry-After"] == "1"
                assert (r.json()["error"], r.json()["limit"]) == (error, 2)

            async with trio.open_nursery() as polls:
                for _ in range(2):
                    polls.start_soon(park)
                await until_waiting(http, 2)
                await refused()
                # A pop that finds a message is answered whatever the bounds.
                await push(http, "elsewhere", ["ready"])
                got = await pop(http, "elsewhere", wait=True, timeout=20000)
                assert got is not None and got["messages"][0]["data"] == "ready"
                # Settled on a pop that may not wait: the acks stand, and the answer says so.
                done = got["messages"][0]
                r = await http.post(f"{API}/pop/queue/crowded", params=params, json={
                    "acknowledgments": [{"transactionId": done["transactionId"],
                                         "partitionId": done["partitionId"],
                                         "leaseId": done["leaseId"]}]})
                assert r.status_code == 200, r.text
                assert (r.json()["messages"], r.json()["acks"]["completed"]) == ([], 1)
                assert r.json()["waitRefused"] == {"status": status, "error": error,
                                                   "message": r.json()["waitRefused"]["message"],
                                                   "limit": 2}
                # One waiting pop is answered: its place is free for another, and no more.
                await push(http, "crowded", ["one"])
                with trio.fail_after(10):
                    while answers != [200]:
                        await trio.sleep(0.02)
                polls.start_soon(park)
                await until_waiting(http, 2)
                await refused()
                polls.cancel_scope.cancel()
            text = await metrics(http)
            assert re.search(rf'^queen_longpoll_refused_total\{{scope="{scope}"\}} 3\.0$', text,
                             re.M), text
        handle.shutdown()

"""Tenant plans over real HTTP: the message ceiling, the storage gate, the request-rate quota,
and the ``never_refused`` exemption."""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator
from typing import Any

import httpx
import psycopg
import pytest
import trio
from psycopg.rows import dict_row
from quart import Blueprint

from queen_trio.api import create_app
from queen_trio.api.tenancy import current_tenant_id, enforce_storage_gate, never_refused
from queen_trio.config import Settings
from queen_trio.db.rows import DictConnection
from queen_trio.server import BrokerHandle, run_broker
from queen_trio.tenants import store

from ..conftest import replace_settings
from ..helpers import eventually

API = "/api/v1"


# -- helpers ----------------------------------------------------------------------------------


def connect(database_url: str) -> DictConnection:
    return psycopg.connect(database_url, row_factory=dict_row, autocommit=True)


def set_plan(database_url: str, name: str = "default", **plan: Any) -> None:
    with connect(database_url) as raw:
        store.set_plan(raw, name, **plan)


async def plan_loaded(broker: BrokerHandle, **expected: Any) -> None:
    """Wait until the broker's tenant directory holds the default tenant's new plan."""
    directory = broker.context.tenants

    async def loaded() -> bool:
        plan = directory.plan(directory.default_tenant_id)
        return all(getattr(plan, k) == v for k, v in expected.items())

    await eventually(loaded, timeout=2.0)


async def run_cli(database_url: str, *args: str) -> tuple[int, str, str]:
    env = {**os.environ, "QUEEN_DATABASE_URL": database_url, "QUEEN_LOG_LEVEL": "WARNING"}
    done = await trio.run_process(
        [sys.executable, "-m", "queen_trio", "tenants", *args],
        env=env, capture_stdout=True, capture_stderr=True, check=False,
    )
    # The first line on stderr names the database; the rest is the command's own.
    first, _, err = done.stderr.decode().partition("\n")
    assert first.startswith("queen-trio: database: "), first
    return done.returncode, done.stdout.decode(), err


def text_of(size: int) -> str:
    """A JSON string payload that encodes to exactly ``size`` bytes (quotes included)."""
    return "x" * (size - 2)


async def push(http: httpx.AsyncClient, queue: str, payload: Any) -> httpx.Response:
    return await http.post(f"{API}/push", json={"items": [{"queue": queue, "payload": payload}]})


def assert_error(r: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body = r.json()
    assert (body["ok"], body["error"]) == (False, code)
    return body


# -- message ceiling --------------------------------------------------------------------------


async def test_the_message_ceiling_refuses_big_payloads_and_follows_the_cli(
    broker: BrokerHandle, http: httpx.AsyncClient, database_url: str
) -> None:
    set_plan(database_url, max_message_bytes=100)
    await plan_loaded(broker, max_message_bytes=100)

    assert_error(await push(http, "q", text_of(200)), 413, "payload_too_large")
    assert_error(await push(http, "q", text_of(101)), 413, "payload_too_large")
    assert (await http.get(f"{API}/resources/queues")).json() == {"queues": []}
    assert (await push(http, "q", text_of(50))).status_code == 201
    assert (await push(http, "q", text_of(100))).status_code == 201
    # One item over the ceiling refuses the whole push.
    r = await http.post(f"{API}/push", json={"items": [
        {"queue": "q", "payload": text_of(10)}, {"queue": "q", "payload": text_of(200)}]})
    assert_error(r, 413, "payload_too_large")

    assert_error(await http.put(f"{API}/kv/ns/big", json={"value": text_of(200),
                                                          "forever": True}),
                 413, "payload_too_large")
    assert (await http.get(f"{API}/kv/ns/big")).json()["found"] is False
    r = await http.put(f"{API}/kv/ns/small", json={"value": text_of(50), "forever": True})
    assert r.status_code == 200

    r = await http.post(f"{API}/transaction", json={
        "operations": [{"type": "push", "items": [{"queue": "q", "payload": text_of(200)}]}],
        "kv": [{"op": "put", "ns": "ns", "key": "t", "value": 1, "forever": True}]})
    assert_error(r, 413, "payload_too_large")
    r = await http.post(f"{API}/transaction", json={"kv": [
        {"op": "put", "ns": "ns", "key": "t", "value": text_of(200), "forever": True}]})
    assert_error(r, 413, "payload_too_large")
    assert (await http.get(f"{API}/kv/ns/t")).json()["found"] is False
    detail = (await http.get(f"{API}/resources/queues/q")).json()
    assert detail["totals"]["messages"] == 2

    # A plan change through the CLI reaches the running broker within about a second.
    rc, out, err = await run_cli(database_url, "plan", "default", "--max-message-bytes", "300",
                                 "--json")
    assert rc == 0, err
    assert '"max_message_bytes": 300' in out
    changed_at = trio.current_time()

    async def accepted() -> bool:
        r = await push(http, "q", text_of(200))
        assert r.status_code in (201, 413), r.text
        return r.status_code == 201

    await eventually(accepted, timeout=2.0)
    assert trio.current_time() - changed_at < 1.5
    assert_error(await push(http, "q", text_of(301)), 413, "payload_too_large")
    r = await http.put(f"{API}/kv/ns/big", json={"value": text_of(200), "forever": True})
    assert r.status_code == 200

    # Out-of-range plan values are a usage error and change nothing.
    rc, _, err = await run_cli(database_url, "plan", "default", "--max-message-bytes", "0")
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    rc, _, err = await run_cli(database_url, "plan", "nobody", "--max-message-bytes", "10")
    assert rc == 4 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("queen-trio: tenant_not_found: "), err
    assert broker.context.tenants.message_ceiling(broker.context.tenants.default_tenant_id) == 300


# -- storage gate -----------------------------------------------------------------------------


async def test_the_storage_gate_refuses_writes_but_not_reads_acks_or_deletes(
    broker: BrokerHandle, http: httpx.AsyncClient, database_url: str
) -> None:
    set_plan(database_url, max_stored_bytes=300, set_stored=True)
    await plan_loaded(broker, max_stored_bytes=300)
    r = await http.put(f"{API}/kv/saga/k1", json={"value": "v", "forever": True})
    assert r.status_code == 200, r.text

    # Usage is folded once a second: keep pushing until the gate closes.
    pushed = 0
    with trio.fail_after(3.5):
        while (r := await push(http, "big", text_of(100))).status_code == 201:
            pushed += 1
            await trio.sleep(0.05)
    assert pushed >= 3  # 3 x 100 bytes are needed to reach 300
    body = assert_error(r, 403, "storage_full")
    assert "maxStoredBytes" in body["message"]

    # Every write that adds storage is refused, whatever the route.
    assert_error(await push(http, "other", 1), 403, "storage_full")
    assert_error(await http.put(f"{API}/kv/saga/k2", json={"value": 1, "forever": True}),
                 403, "storage_full")
    assert_error(await http.put(f"{API}/kv/saga/k1", json={"value": "w", "forever": True}),
                 403, "storage_full")
    assert_error(await http.post(f"{API}/kv", json=[
        {"op": "incr", "ns": "saga", "key": "n", "delta": 1, "forever": True}]),
        403, "storage_full")
    assert_error(await http.post(f"{API}/locks", json=[
        {"op": "acquire", "name": "job", "ttlSeconds": 30}]), 403, "storage_full")
    r = await http.post(f"{API}/transaction", json={"operations": [
        {"type": "push", "items": [{"queue": "big", "payload": 1}]}]})
    assert_error(r, 403, "storage_full")
    r = await http.post(f"{API}/transaction", json={"kv": [
        {"op": "delete", "ns": "saga", "key": "nothing"},
        {"op": "put", "ns": "saga", "key": "k3", "value": 1, "forever": True}]})
    assert_error(r, 403, "storage_full")

    # Reads, acks and deletes still work.
    r = await http.get(f"{API}/resources/queues")
    assert r.status_code == 200
    assert {q["name"]: q["messages"]["total"] for q in r.json()["queues"]} == {"big": pushed}
    assert (await http.get(f"{API}/resources/queues/big")).status_code == 200
    r = await http.get(f"{API}/kv/saga/k1")
    assert (r.status_code, r.json()["value"]) == (200, "v")
    assert (await http.get(f"{API}/kv/saga/k2")).json()["found"] is False
    r = await http.post(f"{API}/kv", json=[{"op": "delete", "ns": "saga", "key": "k9"},
                                           {"op": "check", "ns": "saga", "key": "k1",
                                            "expect": 0}])
    assert r.status_code == 200, r.text
    assert (await http.get(f"{API}/dlq")).status_code == 200
    r = await http.get(f"{API}/pop/queue/big", params={"batch": 2})
    assert r.status_code == 200, r.text
    first, second = r.json()["messages"]
    r = await http.post(f"{API}/ack", json={
        "transactionId": first["transactionId"], "partitionId": first["partitionId"],
        "leaseId": first["leaseId"], "status": "completed"})
    assert r.status_code == 200, r.text
    r = await http.post(f"{API}/lease/{second['leaseId']}/extend", json={"seconds": 30})
    assert r.status_code == 200, r.text
    r = await http.post(f"{API}/transaction", json={"operations": [
        {"type": "ack", "transactionId": second["transactionId"],
         "partitionId": second["partitionId"], "leaseId": second["leaseId"]}],
        "kv": [{"op": "delete", "ns": "saga", "key": "nothing"}]})
    assert r.status_code == 200, r.text
    r = await http.post(f"{API}/configure", json={"queue": "big", "options": {"retryLimit": 1}})
    assert r.status_code == 200, r.text

    # Deleting the queue frees its bytes: within ~2 s pushes work again.
    r = await http.delete(f"{API}/resources/queues/big")
    assert r.json()["existed"] is True
    deleted_at = trio.current_time()

    async def reopened() -> bool:
        r = await push(http, "small", 1)
        assert r.status_code in (201, 403), r.text
        return r.status_code == 201

    await eventually(reopened, timeout=3.0)
    assert trio.current_time() - deleted_at < 2.5
    r = await http.put(f"{API}/kv/saga/k2", json={"value": 2, "forever": True})
    assert r.status_code == 200

    # A gate of 0 refuses every write; -1 (through the CLI) removes the gate.
    set_plan(database_url, max_stored_bytes=0, set_stored=True)
    await plan_loaded(broker, max_stored_bytes=0)
    assert_error(await push(http, "small", 2), 403, "storage_full")
    rc, out, err = await run_cli(database_url, "plan", "default", "--max-stored-bytes", "-1")
    assert rc == 0, err
    # The client commands' style: `field  value` lines, none shown as -.
    assert "max_stored_bytes" in out and "null" not in out and "{" not in out
    assert [line.split() for line in out.splitlines() if line.startswith("max_stored")] == [
        ["max_stored_bytes", "-"]]

    async def ungated() -> bool:
        return (await push(http, "small", 3)).status_code == 201

    await eventually(ungated, timeout=2.0)
    for _ in range(5):
        assert (await push(http, "small", text_of(100))).status_code == 201
    r = await http.put(f"{API}/kv/saga/k4", json={"value": text_of(500), "forever": True})
    assert r.status_code == 200


async def test_storage_usage_is_counted_per_tenant(
    broker: BrokerHandle, http: httpx.AsyncClient, database_url: str
) -> None:
    """Another tenant's bytes never close the default tenant's gate."""
    with connect(database_url) as raw:
        store.create_tenant(raw, "heavy")
        heavy = store.tenant_id(raw, "heavy")
        # 10 kB stored by "heavy", as its writes would record it.
        raw.execute("INSERT INTO queen.usage_deltas (tenant_id, bytes) VALUES (%s, 10000)",
                    (heavy,))
    set_plan(database_url, max_stored_bytes=1000, set_stored=True)
    await plan_loaded(broker, max_stored_bytes=1000)

    async def folded() -> bool:
        plans = broker.context.tenants._plans  # noqa: SLF001 - the broker's view of usage
        return heavy in plans and plans[heavy].stored_bytes == 10000

    await eventually(folded, timeout=2.5)
    assert (await push(http, "mine", 1)).status_code == 201


# -- request-rate quota -----------------------------------------------------------------------


async def test_the_request_rate_quota_answers_429_with_retry_after(
    broker: BrokerHandle, http: httpx.AsyncClient, database_url: str
) -> None:
    set_plan(database_url, requests_per_second=5, set_rate=True)
    await plan_loaded(broker, requests_per_second=5)

    statuses = []
    retry_afters = []
    started = trio.current_time()
    for _ in range(20):
        r = await http.get(f"{API}/resources/queues")
        statuses.append(r.status_code)
        if r.status_code == 429:
            assert_error(r, 429, "rate_limited")
            value = r.headers["retry-after"]
            assert value.isdigit(), value
            retry_afters.append(int(value))
    elapsed = trio.current_time() - started
    assert set(statuses) == {200, 429}, statuses
    # A burst of 5, plus what refilled meanwhile at 5 a second.
    assert 5 <= statuses.count(200) <= 5 + int(elapsed * 5) + 1, (statuses, elapsed)
    assert statuses[:5] == [200] * 5
    assert all(1 <= v <= 2 for v in retry_afters), retry_afters

    # /health is not under the quota.
    assert (await http.get("/health")).status_code == 200
    # The quota covers writes too, and refuses them before they do anything: a push right
    # after a refused read (the bucket holds less than one request then; it refills one every
    # 200 ms, so on a loaded machine a push sent later may find one: then again).
    refused = None
    for attempt in range(5):
        while (await http.get(f"{API}/resources/queues")).status_code != 429:
            pass
        r = await push(http, f"limited-{attempt}", 1)
        if r.status_code != 201:
            assert_error(r, 429, "rate_limited")
            refused = f"limited-{attempt}"
            break
    assert refused is not None, "every push got through an exhausted quota"

    # After about a second the bucket has refilled.
    await trio.sleep(1.05)
    for _ in range(4):
        assert (await http.get(f"{API}/resources/queues")).status_code == 200
    queues = (await http.get(f"{API}/resources/queues")).json()["queues"]
    assert refused not in [q["name"] for q in queues], queues

    # Removing the quota lets any burst through.
    set_plan(database_url, requests_per_second=None, set_rate=True)
    await plan_loaded(broker, requests_per_second=None)
    for _ in range(30):
        assert (await http.get(f"{API}/resources/queues")).status_code == 200


# -- the never_refused exemption --------------------------------------------------------------


def probe_app(broker: BrokerHandle):  # type: ignore[no-untyped-def]
    """The broker's app plus two probe routes that both would add storage: one exempt."""
    app = create_app(broker.context)
    probe = Blueprint("probe", __name__, url_prefix="/api/v1/probe")

    @probe.post("/exempt")
    @never_refused
    async def exempt():  # type: ignore[no-untyped-def]
        enforce_storage_gate()
        return {"ok": True, "route": "exempt", "tenant": current_tenant_id()}

    @probe.post("/normal")
    async def normal():  # type: ignore[no-untyped-def]
        enforce_storage_gate()
        return {"ok": True, "route": "normal", "tenant": current_tenant_id()}

    app.register_blueprint(probe)
    return app


async def test_a_never_refused_route_passes_an_exhausted_quota(
    broker: BrokerHandle, database_url: str
) -> None:
    client = probe_app(broker).test_client()
    set_plan(database_url, requests_per_second=1, set_rate=True)
    await plan_loaded(broker, requests_per_second=1)

    statuses = [(await client.post("/api/v1/probe/normal")).status_code for _ in range(3)]
    assert statuses[-1] == 429 and 429 in statuses, statuses
    for _ in range(10):
        r = await client.post("/api/v1/probe/exempt")
        assert r.status_code == 200
        body = await r.get_json()
        assert body["route"] == "exempt"
        assert body["tenant"] == broker.context.tenants.default_tenant_id
    # The exempt calls took nothing from the quota, and the normal route is still refused.
    r = await client.post("/api/v1/probe/normal")
    assert r.status_code == 429
    assert int(r.headers["Retry-After"]) >= 1


async def test_a_never_refused_route_passes_a_full_storage_gate(
    broker: BrokerHandle, database_url: str
) -> None:
    client = probe_app(broker).test_client()
    set_plan(database_url, max_stored_bytes=0, set_stored=True)
    await plan_loaded(broker, max_stored_bytes=0)

    r = await client.post("/api/v1/probe/normal")
    assert r.status_code == 403
    assert (await r.get_json())["error"] == "storage_full"
    r = await client.post("/api/v1/probe/exempt")
    assert r.status_code == 200, await r.get_data()


@pytest.fixture
async def auth_broker(settings: Settings) -> AsyncIterator[BrokerHandle]:
    async with trio.open_nursery() as nursery:
        handle: BrokerHandle = await nursery.start(
            run_broker, replace_settings(settings, auth=True)
        )
        yield handle
        handle.shutdown()


async def test_never_refused_is_no_exemption_from_auth(
    auth_broker: BrokerHandle, database_url: str
) -> None:
    client = probe_app(auth_broker).test_client()
    for route in ("exempt", "normal"):
        r = await client.post(f"/api/v1/probe/{route}")
        assert r.status_code == 401
        assert (await r.get_json())["error"] == "unauthorized"
    with connect(database_url) as raw:
        token = store.create_token(raw, "default")
    r = await client.post("/api/v1/probe/exempt", headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200

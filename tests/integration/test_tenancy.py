"""Auth and tenant isolation over real HTTP with QUEEN_AUTH=on, and the ``tenants`` CLI."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator
from typing import Any

import httpx
import psycopg
import pytest
import trio
from psycopg.rows import dict_row

from queen_trio.config import Settings
from queen_trio.db.rows import DictConnection
from queen_trio.server import BrokerHandle, run_broker
from queen_trio.tenants import store

from ..conftest import replace_settings
from ..helpers import eventually, parked

API = "/api/v1"

# A token of the right shape whose prefix no tenant has.
UNKNOWN_TOKEN = "qt_" + "0" * 12 + "_" + "A" * 43


# -- helpers ----------------------------------------------------------------------------------


def connect(database_url: str) -> DictConnection:
    return psycopg.connect(database_url, row_factory=dict_row, autocommit=True)


def prefix_of(token: str) -> str:
    return token.split("_")[1]


async def run_cli(database_url: str, *args: str) -> tuple[int, str, str]:
    env = {**os.environ, "QUEEN_DATABASE_URL": database_url, "QUEEN_LOG_LEVEL": "WARNING"}
    env.pop("QUEEN_AUTH", None)
    done = await trio.run_process(
        [sys.executable, "-m", "queen_trio", "tenants", *args],
        env=env, capture_stdout=True, capture_stderr=True, check=False,
    )
    # The first line on stderr names the database; the rest is the command's own.
    first, _, err = done.stderr.decode().partition("\n")
    assert first.startswith("queen-trio: database: "), first
    return done.returncode, done.stdout.decode(), err


def client(broker: BrokerHandle, token: str | None) -> httpx.AsyncClient:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    return httpx.AsyncClient(base_url=broker.url, timeout=10, headers=headers)


def assert_unauthorized(r: httpx.Response) -> str:
    assert r.status_code == 401, r.text
    body = r.json()
    assert body["ok"] is False
    assert body["error"] == "unauthorized"
    assert set(body) == {"ok", "error", "message", "detail"}  # nothing saying why
    assert body["detail"] == body["message"]
    assert r.headers["www-authenticate"].lower().startswith("bearer")
    return body["message"]


def count_rows(database_url: str, table: str) -> int:
    with connect(database_url) as raw:
        return raw.execute(f"SELECT count(*) AS n FROM queen.{table}").fetchone()["n"]


# -- fixtures ---------------------------------------------------------------------------------


@pytest.fixture
def tokens(database_url: str) -> dict[str, str]:
    """Tenants alpha and beta, created before the broker starts, with their tokens."""
    with connect(database_url) as raw:
        store.create_tenant(raw, "alpha")
        store.create_tenant(raw, "beta")
        return {
            "A": store.create_token(raw, "alpha"),
            "B": store.create_token(raw, "beta"),
            "A2": store.create_token(raw, "alpha"),  # a second token, to revoke
        }


@pytest.fixture
async def auth_broker(
    settings: Settings, tokens: dict[str, str]
) -> AsyncIterator[BrokerHandle]:
    async with trio.open_nursery() as nursery:
        handle: BrokerHandle = await nursery.start(
            run_broker, replace_settings(settings, auth=True)
        )
        yield handle
        handle.shutdown()


@pytest.fixture
async def http_a(
    auth_broker: BrokerHandle, tokens: dict[str, str]
) -> AsyncIterator[httpx.AsyncClient]:
    async with client(auth_broker, tokens["A"]) as c:
        yield c


@pytest.fixture
async def http_b(
    auth_broker: BrokerHandle, tokens: dict[str, str]
) -> AsyncIterator[httpx.AsyncClient]:
    async with client(auth_broker, tokens["B"]) as c:
        yield c


# -- authentication ---------------------------------------------------------------------------


REQUESTS = [
    ("GET", f"{API}/resources/queues", None),
    ("POST", f"{API}/push", {"items": [{"queue": "orders", "payload": {"n": 1}}]}),
    ("PUT", f"{API}/kv/saga/k1", {"value": 1, "forever": True}),
    ("POST", f"{API}/kv", [{"op": "put", "ns": "saga", "key": "k", "value": 1, "forever": True}]),
    ("POST", f"{API}/locks", [{"op": "acquire", "name": "job", "ttlSeconds": 30}]),
    ("GET", f"{API}/kv/saga/k1", None),
    ("GET", f"{API}/pop/queue/orders", None),
    ("GET", f"{API}/dlq", None),
    ("POST", f"{API}/transaction",
     {"operations": [], "kv": [{"op": "put", "ns": "saga", "key": "k", "value": 1,
                                "forever": True}]}),
    ("DELETE", f"{API}/resources/queues/orders", None),
]


async def test_every_bad_credential_is_the_same_401(
    auth_broker: BrokerHandle, tokens: dict[str, str], database_url: str
) -> None:
    wrong_secret = f"qt_{prefix_of(tokens['A'])}_" + "B" * 43
    bad_headers: list[dict[str, str]] = [
        {},
        {"Authorization": ""},
        {"Authorization": "Basic x"},
        {"Authorization": "Basic YWxwaGE6c2VjcmV0"},
        {"Authorization": "Bearer"},
        {"Authorization": f"Bearer {UNKNOWN_TOKEN}"},
        {"Authorization": "Bearer garbage"},
        {"Authorization": f"Bearer {wrong_secret}"},
        {"Authorization": f"Bearer {tokens['A']}x"},
        {"Authorization": tokens["A"]},  # no scheme at all
    ]
    messages = set()
    async with httpx.AsyncClient(base_url=auth_broker.url, timeout=10) as anon:
        for headers in bad_headers:
            for method, path, body in REQUESTS:
                r = await anon.request(method, path, json=body, headers=headers)
                messages.add(assert_unauthorized(r))
        assert len(messages) == 1, messages
        # Nothing was written by any of them.
        for table in ("queues", "frames", "kv", "usage_deltas"):
            assert count_rows(database_url, table) == 0, table

        # /health stays open; /metrics (every tenant's figures) takes the operator's token.
        r = await anon.get("/health")
        assert r.status_code == 200 and r.json()["ok"] is True
        assert (await anon.get("/metrics")).status_code == 401

        # A good token is let in, whatever the case of the scheme.
        for scheme in ("Bearer", "bearer"):
            r = await anon.get(f"{API}/resources/queues",
                               headers={"Authorization": f"{scheme} {tokens['A']}"})
            assert r.status_code == 200, r.text
            assert r.json() == {"queues": []}


async def test_a_revoked_token_stops_working_within_a_second(
    auth_broker: BrokerHandle, tokens: dict[str, str], database_url: str
) -> None:
    async with client(auth_broker, tokens["A2"]) as revoked, client(auth_broker, tokens["A"]) as a:
        r = await revoked.get(f"{API}/resources/queues")
        assert r.status_code == 200  # verified, and now in the broker's token cache
        with connect(database_url) as raw:
            store.revoke_token(raw, prefix_of(tokens["A2"]))
        started = trio.current_time()

        async def refused() -> httpx.Response | None:
            r = await revoked.get(f"{API}/resources/queues")
            assert r.status_code in (200, 401), r.text
            return r if r.status_code == 401 else None

        r = await eventually(refused, timeout=2.0)
        assert trio.current_time() - started < 1.6
        message = assert_unauthorized(r)
        r = await revoked.post(f"{API}/push", json={"items": [{"queue": "q", "payload": 1}]})
        assert assert_unauthorized(r) == message
        # The same message as for a token that never existed.
        async with client(auth_broker, UNKNOWN_TOKEN) as unknown:
            assert assert_unauthorized(await unknown.get(f"{API}/resources/queues")) == message
        # The tenant's other token is unaffected.
        assert (await a.get(f"{API}/resources/queues")).status_code == 200
    assert count_rows(database_url, "frames") == 0


# -- isolation --------------------------------------------------------------------------------


async def run_scenario(http: httpx.AsyncClient, who: str, count: int) -> dict[str, Any]:
    """Push ``count`` messages to "orders", dead-letter the first, lease the second, write KV."""
    r = await http.post(f"{API}/configure", json={"queue": "orders", "options": {"retryLimit": 0}})
    assert r.status_code == 200, r.text
    r = await http.post(f"{API}/push", json={"items": [
        # The same client transactionId in both tenants: deduplication is per tenant.
        {"queue": "orders", "payload": {"who": who, "n": n},
         **({"transactionId": "shared-txn"} if n == 0 else {})}
        for n in range(count)
    ]})
    assert r.status_code == 201, r.text
    pushed = r.json()
    assert [p["status"] for p in pushed] == ["queued"] * count

    r = await http.get(f"{API}/pop/queue/orders", params={"batch": 1})
    assert r.status_code == 200, r.text
    first = r.json()["messages"][0]
    assert first["data"] == {"who": who, "n": 0}
    r = await http.post(f"{API}/ack", json={
        "transactionId": first["transactionId"], "partitionId": first["partitionId"],
        "leaseId": first["leaseId"], "status": "failed", "error": f"{who} failed",
    })
    assert r.status_code == 200, r.text
    assert r.json()[0]["dlq"] is True

    r = await http.get(f"{API}/pop/queue/orders", params={"batch": 1})
    assert r.status_code == 200, r.text
    leased = r.json()["messages"][0]
    assert leased["data"] == {"who": who, "n": 1}

    r = await http.get(f"{API}/dlq")
    (dead,) = r.json()["messages"]
    assert dead["data"] == {"who": who, "n": 0}

    for key in ("k1", f"only-{who}"):
        r = await http.put(f"{API}/kv/saga/{key}", json={"value": {"who": who}, "forever": True})
        assert r.status_code == 200, r.text
        assert r.json()["applied"] is True
    return {"pushed": pushed, "leased": leased, "dead": dead}


def ack_body(message: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"transactionId": message["transactionId"], "partitionId": message["partitionId"],
            "leaseId": message["leaseId"], "status": "completed", **extra}


async def test_two_tenants_never_see_each_other(
    http_a: httpx.AsyncClient, http_b: httpx.AsyncClient
) -> None:
    a = await run_scenario(http_a, "A", 3)
    b = await run_scenario(http_b, "B", 2)
    a_leased = a["leased"]
    assert a_leased["partitionId"] != b["leased"]["partitionId"]

    # Acking A's message with A's ids, one by one or in a batch: unknown to B (refused).
    for body in (ack_body(a_leased), ack_body(a_leased, leaseId=None),
                 ack_body(a_leased, status="failed"), ack_body(a_leased, status="dlq")):
        r = await http_b.post(f"{API}/ack", json={k: v for k, v in body.items() if v is not None})
        assert r.status_code == 200, r.text
        assert [(v["success"], v["code"]) for v in r.json()] == [(False, "unresolvable")]
    r = await http_b.post(f"{API}/ack/batch", json={"acknowledgments": [
        ack_body(b["leased"]), ack_body(a_leased)]})
    assert [(v["success"], v["code"]) for v in r.json()] == [(True, None),
                                                             (False, "unresolvable")]
    # A's message in B's own partition is just as unknown (and vice versa).
    r = await http_b.post(f"{API}/ack", json={"transactionId": a_leased["transactionId"],
                                              "partitionId": b["leased"]["partitionId"]})
    assert r.json()[0]["code"] == "unresolvable"

    # ... nor riding B's own pop (settle-and-pop): refused, and the pop sees only B's.
    r = await http_b.post(f"{API}/pop/queue/orders", params={"consumerGroup": "riders"},
                          json={"acknowledgments": [ack_body(a_leased)]})
    assert r.status_code == 200 and r.json()["acks"]["refused"] == 1
    assert [v["code"] for v in r.json()["ackRefused"]] == ["unresolvable"]
    assert all(m["data"]["who"] == "B" for m in r.json()["messages"])

    # Extending A's lease: not found for B.
    r = await http_b.post(f"{API}/lease/{a_leased['leaseId']}/extend", json={"seconds": 600})
    assert (r.json()["success"], r.json()["renewed"], r.json()["code"]) == (
        False, 0, "lease_not_found")

    # Replaying A's dead letter: not found for B.
    r = await http_b.post(f"{API}/dlq/{a['dead']['id']}/replay")
    assert (r.status_code, r.json()["error"]) == (404, "dead_letter_not_found")

    # B's listings show only B's things.
    r = await http_b.get(f"{API}/resources/queues")
    assert [(q["name"], q["messages"]["total"]) for q in r.json()["queues"]] == [("orders", 2)]
    r = await http_a.get(f"{API}/resources/queues")
    assert [(q["name"], q["messages"]["total"]) for q in r.json()["queues"]] == [("orders", 3)]
    detail = (await http_b.get(f"{API}/resources/queues/orders")).json()
    assert detail["totals"] == {"messages": 2, "deadLetters": 1}
    assert [p["id"] for p in detail["partitions"]] == [b["leased"]["partitionId"]]
    r = await http_b.get(f"{API}/dlq")
    assert [d["id"] for d in r.json()["messages"]] == [b["dead"]["id"]]
    for params in ({"queue": "orders"}, {"cursor": 0, "limit": 1000},
                   {"consumerGroup": "__QUEUE_MODE__"}):
        listed = (await http_b.get(f"{API}/dlq", params=params)).json()["messages"]
        assert all(d["data"]["who"] == "B" for d in listed), params

    # B pops only B's messages, in any consumer group.
    r = await http_b.get(f"{API}/pop/queue/orders", params={"batch": 10, "consumerGroup": "audit"})
    assert [m["data"] for m in r.json()["messages"]] == [{"who": "B", "n": 0}, {"who": "B", "n": 1}]
    r = await http_b.get(f"{API}/pop/queue/orders/partition/Default",
                         params={"batch": 10, "consumerGroup": "audit2"})
    assert all(m["data"]["who"] == "B" for m in r.json()["messages"])

    # KV: same key, independent values; A's own key is invisible to B.
    assert (await http_b.get(f"{API}/kv/saga/k1")).json()["value"] == {"who": "B"}
    assert (await http_a.get(f"{API}/kv/saga/k1")).json()["value"] == {"who": "A"}
    r = await http_b.get(f"{API}/kv/saga/only-A")
    assert (r.status_code, r.json()["found"]) == (200, False)
    r = await http_b.delete(f"{API}/kv/saga/only-A")
    assert r.status_code == 200 and r.json()["applied"] is False
    # Nor does a lock named alike: each tenant has its own queen-locks rows.
    lock = [{"op": "acquire", "name": "job", "ttlSeconds": 30}]
    r = await http_a.post(f"{API}/locks", json=lock)
    assert r.json()["results"][0]["acquired"] is True
    r = await http_b.post(f"{API}/locks", json=lock)
    assert r.json()["results"][0]["acquired"] is True

    # Transactions by B that touch A's message fail without effect.
    r = await http_b.post(f"{API}/transaction", json={"operations": [
        {"type": "push", "items": [{"queue": "orders", "payload": {"who": "B", "n": 99}}]},
        {"type": "ack", **ack_body(a_leased)},
    ], "kv": [
        {"op": "put", "ns": "saga", "key": "k1", "value": "overwritten", "forever": True},
        {"op": "delete", "ns": "saga", "key": "only-B"},
    ]})
    assert (r.status_code, r.json()["success"], r.json()["code"]) == (
        200, False, "unresolvable"), r.text
    assert r.json()["operation"] == 1
    r = await http_b.post(f"{API}/transaction", json={"operations": [
        {"type": "ack", "transactionId": a["dead"]["transactionId"],
         "partitionId": a["dead"]["partitionId"], "status": "completed"},
    ]})
    assert (r.status_code, r.json()["code"]) == (200, "unresolvable")
    assert (await http_b.get(f"{API}/kv/saga/k1")).json()["value"] == {"who": "B"}
    assert (await http_b.get(f"{API}/kv/saga/only-B")).json()["found"] is True
    r = await http_b.get(f"{API}/resources/queues")
    assert [(q["name"], q["messages"]["total"]) for q in r.json()["queues"]] == [("orders", 2)]
    # A KV delete of A's key inside B's transaction deletes nothing of A's.
    r = await http_b.post(f"{API}/transaction", json={"kv": [
        {"op": "delete", "ns": "saga", "key": "only-A"}]})
    assert r.status_code == 200 and r.json()["results"][0]["applied"] is False

    # B deletes its queue "orders": A's stays intact.
    r = await http_b.delete(f"{API}/resources/queues/orders")
    assert r.json() == {"deleted": True, "queue": "orders", "existed": True}
    r = await http_b.get(f"{API}/resources/queues/orders")
    assert (r.status_code, r.json()["error"]) == (404, "queue_not_found")
    assert (await http_b.get(f"{API}/dlq")).json()["messages"] == []
    detail = (await http_a.get(f"{API}/resources/queues/orders")).json()
    assert detail["totals"] == {"messages": 3, "deadLetters": 1}
    assert [p["id"] for p in detail["partitions"]] == [a_leased["partitionId"]]
    assert detail["partitions"][0]["groups"]["__QUEUE_MODE__"]["leased"] is True

    # Everything of A's still works for A, untouched by B's attempts.
    assert (await http_a.get(f"{API}/kv/saga/only-A")).json()["value"] == {"who": "A"}
    r = await http_a.post(f"{API}/lease/{a_leased['leaseId']}/extend", json={"seconds": 30})
    assert r.status_code == 200, r.text
    r = await http_a.post(f"{API}/ack", json=ack_body(a_leased))
    assert r.status_code == 200, r.text
    assert r.json()[0]["alreadyAcked"] is False and r.json()[0]["leaseReleased"] is True
    r = await http_a.post(f"{API}/dlq/{a['dead']['id']}/replay")
    assert r.status_code == 200, r.text
    r = await http_a.get(f"{API}/pop/queue/orders", params={"batch": 10})
    assert [m["data"] for m in r.json()["messages"]] == [{"who": "A", "n": 2}, {"who": "A", "n": 0}]
    # ... and B cannot replay its own, now deleted, dead letter any more, nor A's replayed one.
    assert (await http_b.post(f"{API}/dlq/{b['dead']['id']}/replay")).status_code == 404
    assert (await http_b.post(f"{API}/dlq/{a['dead']['id']}/replay")).status_code == 404


async def test_pushes_and_long_polls_wake_only_their_own_tenant(
    auth_broker: BrokerHandle, http_a: httpx.AsyncClient, http_b: httpx.AsyncClient
) -> None:
    got: dict[str, httpx.Response] = {}

    async def wait_b() -> None:
        got["b"] = await http_b.get(f"{API}/pop/queue/orders",
                                    params={"wait": "true", "timeout": 700})

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait_b)
        await parked(auth_broker)
        r = await http_a.post(f"{API}/push", json={"items": [{"queue": "orders", "payload": "A"}]})
        assert r.status_code == 201
    assert got["b"].status_code == 204  # A's push neither woke nor fed B's pop
    r = await http_a.get(f"{API}/pop/queue/orders")
    assert r.json()["messages"][0]["data"] == "A"


# -- the CLI ----------------------------------------------------------------------------------


async def test_tenants_cli_creates_lists_issues_and_revokes(
    auth_broker: BrokerHandle, database_url: str
) -> None:
    rc, out, err = await run_cli(database_url, "create", "acme")
    assert (rc, out.strip()) == (0, "created tenant acme"), err

    rc, out, err = await run_cli(database_url, "create", "acme")
    assert rc == 4  # refused, with the error code printed
    assert out == ""
    assert len(err.strip().splitlines()) == 1, err
    assert "acme" in err and "exists" in err

    rc, out, err = await run_cli(database_url, "create", "Bad Name")
    assert rc == 4 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("queen-trio: invalid_tenant: "), err

    rc, out, err = await run_cli(database_url, "token", "create", "nobody", "--json")
    assert rc == 4 and out == ""
    assert len(err.strip().splitlines()) == 1 and "nobody" in err, err
    assert err.startswith("queen-trio: tenant_not_found: "), err

    rc, out, err = await run_cli(database_url, "token", "create", "acme", "--json")
    assert rc == 0, err
    issued = json.loads(out)
    assert set(issued) == {"tenant", "token"} and issued["tenant"] == "acme"
    token = issued["token"]
    assert token.startswith("qt_")

    rc, out, err = await run_cli(database_url, "list", "--json")
    assert rc == 0, err
    listed = {t["name"]: t for t in json.loads(out)}
    assert {"default", "alpha", "beta", "acme"} <= set(listed)
    assert listed["acme"]["active_tokens"] == 1
    assert listed["alpha"]["active_tokens"] == 2
    assert listed["acme"]["max_message_bytes"] is None  # the broker's ceiling, not lowered
    assert listed["acme"]["max_stored_bytes"] is None
    assert listed["acme"]["requests_per_second"] is None

    async with client(auth_broker, token) as acme, client(auth_broker, None) as anon:
        # The token works at once, before the broker's next plan refresh.
        r = await acme.get(f"{API}/resources/queues")
        assert (r.status_code, r.json()) == (200, {"queues": []}), r.text
        r = await acme.post(f"{API}/push", json={"items": [{"queue": "orders", "payload": 1}]})
        assert r.status_code == 201, r.text
        assert [q["name"] for q in (await acme.get(f"{API}/resources/queues")).json()["queues"]] \
            == ["orders"]

        rc, out, err = await run_cli(database_url, "token", "revoke", prefix_of(token))
        assert (rc, out.strip()) == (0, "revoked"), err
        revoked_at = trio.current_time()

        async def refused() -> httpx.Response | None:
            r = await acme.get(f"{API}/resources/queues")
            return r if r.status_code == 401 else None

        r = await eventually(refused, timeout=2.0)
        assert trio.current_time() - revoked_at < 1.6
        reference = assert_unauthorized(await anon.get(f"{API}/resources/queues"))
        assert assert_unauthorized(r) == reference

    rc, out, err = await run_cli(database_url, "token", "revoke", prefix_of(token))
    assert rc == 4 and len(err.strip().splitlines()) == 1, err
    rc, out, err = await run_cli(database_url, "list", "--json")
    assert {t["name"]: t for t in json.loads(out)}["acme"]["active_tokens"] == 0


async def test_a_token_for_a_brand_new_tenant_works_at_once(
    auth_broker: BrokerHandle, database_url: str
) -> None:
    """A tenant created while the broker runs (CLI or store) must not get 500s until the next
    plan refresh: its token is valid the moment it is printed."""
    statuses = []
    for n in range(3):
        with connect(database_url) as raw:
            store.create_tenant(raw, f"fresh{n}")
            token = store.create_token(raw, f"fresh{n}")
        async with client(auth_broker, token) as fresh:
            r = await fresh.get(f"{API}/resources/queues")
            statuses.append((r.status_code, r.json().get("error")))
    assert statuses == [(200, None)] * 3


async def test_multi_partition_and_subscription_pops_stay_in_their_tenant(
    http_a: httpx.AsyncClient, http_b: httpx.AsyncClient
) -> None:
    """Same queue, partition and group names in two tenants: a multi-partition pop and a
    subscription (its recorded instant too) see only their own tenant's messages."""
    async def push(http: httpx.AsyncClient, who: str, partitions: str) -> None:
        r = await http.post(f"{API}/push", json={"items": [
            {"queue": "shared", "partition": p, "payload": {"who": who}} for p in partitions]})
        assert r.status_code == 201, r.text

    async def pop(http: httpx.AsyncClient, **params: str) -> list[dict[str, Any]]:
        r = await http.get(f"{API}/pop/queue/shared",
                           params={"batch": "100", "partitions": "3", "autoAck": "true",
                                   **params})
        assert r.status_code in (200, 204), r.text
        return [] if r.status_code == 204 else r.json()["messages"]

    await push(http_a, "A", "abc")
    assert await pop(http_b, consumerGroup="g", subscriptionMode="new") == []  # B subscribes
    await push(http_a, "A", "abc")
    await push(http_b, "B", "ab")
    got = await pop(http_b, consumerGroup="g", subscriptionMode="new")
    assert sorted(m["partition"] for m in got) == ["a", "b"]
    assert {m["data"]["who"] for m in got} == {"B"}
    since = await pop(http_b, consumerGroup="h", subscriptionFrom="2000-01-01T00:00:00Z")
    assert [m["data"]["who"] for m in since] == ["B", "B"]
    # A's group of the same name has no subscription of B's: it subscribes now, sees nothing old
    assert await pop(http_a, consumerGroup="g", subscriptionMode="new") == []
    everything = await pop(http_a, consumerGroup="all")
    assert len(everything) == 6 and {m["data"]["who"] for m in everything} == {"A"}
    assert len({m["partition"] for m in everything}) == 3


async def test_reads_by_offset_stay_in_their_tenant(
    http_a: httpx.AsyncClient, http_b: httpx.AsyncClient
) -> None:
    """Another tenant's queue reads exactly like one that does not exist."""
    r = await http_a.post(f"{API}/push", json={"items": [
        {"queue": "mine", "payload": {"who": "A"}}]})
    assert r.status_code == 201
    fetch = {"entries": [{"queue": "mine", "offset": 0}]}
    own = (await http_a.post(f"{API}/fetch", json=fetch)).json()["entries"][0]
    assert [rec["payload"] for rec in own["records"]] == [{"who": "A"}]
    other = (await http_b.post(f"{API}/fetch", json=fetch)).json()["entries"][0]
    ghost = (await http_b.post(f"{API}/fetch", json={"entries": [
        {"queue": "ghost", "offset": 0}]})).json()["entries"][0]
    assert other == {**ghost, "queue": "mine"}
    assert other["error"] == "UNKNOWN_TOPIC_OR_PARTITION" and other["records"] == []
    changed = {"entries": [{"queue": "mine"}]}
    assert (await http_a.post(f"{API}/partitions/changed", json=changed)).json()[
        "entries"][0]["partitions"][0]["name"] == "Default"
    assert (await http_b.post(f"{API}/partitions/changed", json=changed)).json()[
        "entries"] == [{"queue": "mine", "error": "UNKNOWN_TOPIC_OR_PARTITION"}]


async def test_ops_routes_take_no_token_and_the_document_says_who_does(
    auth_broker: BrokerHandle,
) -> None:
    async with httpx.AsyncClient(base_url=auth_broker.url) as anonymous:
        for path in ("/health", "/openapi.json"):
            assert (await anonymous.get(path)).status_code == 200, path
        for path in ("/metrics", "/metrics/prometheus", f"{API}/resources/queues"):
            assert (await anonymous.get(path)).status_code == 401, path
        doc = (await anonymous.get("/openapi.json")).json()
    for path, operations in doc["paths"].items():
        for op in operations.values():
            if path.startswith(("/api/", "/metrics")):
                assert op["security"] == [{"bearer": []}, {}], path
                assert "401" in op["responses"], path
                # A timer's cancel is never refused by the quota; everything else may be (and
                # /metrics for a flood of wrong tokens).
                assert ("429" in op["responses"]) == (op["operationId"] != "cancelTimer"), path
            else:
                assert op["security"] == [], path
    gated = {op["operationId"] for ops in doc["paths"].values() for op in ops.values()
             if "storage_full" in op["responses"].get("403", {}).get("description", "")}
    # Queen's 403 for the storage gate, never 507.
    assert gated == {"kvBatch", "kvPut", "locks", "transaction", "push", "timersBatch",
                     "scheduleTimer"}
    assert not any("507" in op["responses"] for ops in doc["paths"].values()
                   for op in ops.values())


# -- /metrics is the operator's; each tenant has its own figures ------------------------------


async def test_metrics_take_the_operators_token_and_each_tenant_counts_its_own(
    settings: Settings, tokens: dict[str, str], database_url: str,
) -> None:
    with connect(database_url) as raw:
        store.create_tenant(raw, "ops")
        ops_token = store.create_token(raw, "ops")
    settings = replace_settings(settings, auth=True, operator_tenant="ops",
                                sweeper_max_sleep_ms=100)
    async with trio.open_nursery() as nursery:
        broker: BrokerHandle = await nursery.start(run_broker, settings)
        async with client(broker, tokens["A"]) as a, client(broker, tokens["B"]) as b, \
                client(broker, ops_token) as ops, client(broker, None) as anon:
            # Every tenant's figures: the operator's token only.
            assert_unauthorized(await anon.get("/metrics"))
            r = await a.get("/metrics")
            assert r.status_code == 403 and r.json()["error"] == "forbidden", r.text
            assert "QUEEN_OPERATOR_TENANT=ops" in r.json()["message"]
            assert "/api/v1/stats" in r.json()["message"]
            for path in ("/metrics", "/metrics/prometheus"):
                r = await ops.get(path)
                assert r.status_code == 200 and "queen_messages_pushed_total" in r.text, path

            # alpha: 3 pushed, 2 popped, 1 acked, 2 timers fired (one by PostgreSQL, one
            # compressed and so fired by the broker); beta: 5 pushed and 1 timer.
            r = await a.post(f"{API}/push", json={"items": [
                {"queue": "orders", "payload": n} for n in range(3)]})
            assert r.status_code == 201
            r = await b.post(f"{API}/push", json={"items": [
                {"queue": "orders", "payload": n} for n in range(5)]})
            assert r.status_code == 201
            popped = (await a.get(f"{API}/pop/queue/orders", params={"batch": 2})).json()
            assert len(popped["messages"]) == 2
            r = await a.post(f"{API}/ack", json=ack_body(popped["messages"][0]))
            assert r.status_code == 200, r.text
            for who, key, payload in ((a, "small", 1), (a, "big", {"pad": "x" * 500}),
                                      (b, "other", 1)):
                r = await who.put(f"{API}/timers/t/{key}", json={"delayMs": 0,
                                                                 "payload": payload})
                assert r.status_code == 200, r.text

            async def fired(http: httpx.AsyncClient, n: int) -> dict[str, Any] | None:
                body = (await http.get(f"{API}/stats")).json()
                return body if body["timerFireLag"]["count"] == n else None

            mine = await eventually(lambda: fired(a, 2), timeout=10)
            theirs = await eventually(lambda: fired(b, 1), timeout=10)
        broker.shutdown()
    assert (mine["pushed"], mine["popped"], mine["acked"]) == (3, 2, 1)
    assert (theirs["pushed"], theirs["popped"], theirs["acked"]) == (5, 0, 0)
    assert mine["broker"] == theirs["broker"]
    assert mine["timerFireLag"]["buckets"]["+Inf"] == 2
    assert list(mine["timerFireLag"]["buckets"].values()) == sorted(
        mine["timerFireLag"]["buckets"].values())  # cumulative

"""A web page in the operator's browser must not write to a broker running with auth off:
requests shaped as a browser sends them for another origin's page are
refused, and so are requests for a host name that could have been rebound to 127.0.0.1.
Everything else keeps working: programs that are not browsers send neither Origin nor
Sec-Fetch-Site, and talk to 127.0.0.1 / localhost. (tests/e2e/test_ui_browser.py makes the
same attacks from a real chromium.)
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import psycopg
import pytest
import trio

from queen_trio.config import Settings
from queen_trio.server import BrokerHandle, run_broker

from ..conftest import replace_settings
from ..timer_ops import timer_op

API = "/api/v1"
EVIL = "http://evil.example"
# What fetch(url, {mode: "no-cors", method: "POST", body}) from another site sends.
NO_CORS = {"Content-Type": "text/plain;charset=UTF-8", "Origin": EVIL,
           "Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors"}

# (method, path, body): every write such a page could attempt, as a text/plain body.
WRITES: list[tuple[str, str, Any]] = [
    ("POST", f"{API}/push", {"items": [{"queue": "q", "payload": {"evil": 1}}]}),
    ("POST", f"{API}/transaction", {"operations": [], "kv": [
        {"op": "put", "ns": "ns", "key": "k", "value": 1, "forever": True}]}),
    ("POST", f"{API}/timers", [timer_op("q", "evil", 0, 1)]),
    ("POST", f"{API}/transaction", {"operations": [], "timers": [
        timer_op("q", "keep", 0, op="cancel")]}),
    ("POST", f"{API}/configure", {"queue": "q", "options": {"retryLimit": 0}}),
    ("GET", f"{API}/pop/queue/kept?autoAck=true", None),  # consumes: a write too
    ("PUT", f"{API}/kv/ns/k", {"value": 1, "forever": True}),
    ("DELETE", f"{API}/timers/q/keep", None),
]


def count(database_url: str, sql: str) -> int:
    with psycopg.connect(database_url, autocommit=True) as raw:
        row = raw.execute(sql).fetchone()
        assert row is not None
        return int(row[0])


async def seed(http: httpx.AsyncClient) -> None:
    """A pending timer "keep" and a message in queue "kept": an attack would remove them."""
    r = await http.put(f"{API}/timers/q/keep", json={"delayMs": 3_600_000, "payload": 1})
    assert r.status_code == 200, r.text
    r = await http.post(f"{API}/push", json={"items": [{"queue": "kept", "payload": 1}]})
    assert r.status_code == 201, r.text


def state(database_url: str) -> dict[str, int]:
    return {
        "frames": count(database_url, "SELECT count(*) FROM queen.frames"),
        "kv": count(database_url, "SELECT count(*) FROM queen.kv"),
        "timers": count(database_url, "SELECT count(*) FROM queen.timers WHERE timer_key='keep'"),
        "evil_timers": count(database_url,
                             "SELECT count(*) FROM queen.timers WHERE timer_key = 'evil'"),
        "committed": count(database_url,
                           "SELECT coalesce(sum(committed + 1), 0) FROM queen.cursors"),
        "queues": count(database_url, "SELECT count(*) FROM queen.queues"),
    }


def assert_refused(r: httpx.Response, code: str, header: str) -> None:
    assert r.status_code == 403, r.text
    body = r.json()
    assert (body["ok"], body["error"]) == (False, code), body
    assert header in body["message"], body


@pytest.mark.parametrize(("method", "path", "body"), WRITES,
                         ids=[f"{m} {p}" for m, p, _ in WRITES])
@pytest.mark.parametrize("headers", [
    NO_CORS,
    {**NO_CORS, "Sec-Fetch-Site": "same-site"},  # another port of the same host
    {"Content-Type": "text/plain", "Origin": EVIL},  # a browser without Sec-Fetch-*
    {"Content-Type": "application/x-www-form-urlencoded", "Origin": "null"},  # a sandbox
], ids=["cross-site", "same-site", "origin-only", "origin-null"])
async def test_a_write_from_another_origins_page_lands_nothing(
    broker: BrokerHandle, http: httpx.AsyncClient, database_url: str,
    method: str, path: str, body: Any, headers: dict[str, str],
) -> None:
    await seed(http)
    before = state(database_url)
    content = None if body is None else json.dumps(body).encode()
    r = await http.request(method, path, content=content, headers=headers)
    header = "Sec-Fetch-Site" if "Sec-Fetch-Site" in headers else "Origin"
    assert_refused(r, "cross_origin", header)
    assert state(database_url) == before


async def test_the_dashboard_and_programs_are_let_in(
    broker: BrokerHandle, http: httpx.AsyncClient, database_url: str,
) -> None:
    own = broker.url  # http://127.0.0.1:<port>
    allowed: list[dict[str, str]] = [
        {},  # curl, the SDK, the CLI, queen-mq: no Origin, no Sec-Fetch-Site
        {"Content-Type": "application/x-www-form-urlencoded"},  # curl -d, as in the README
        {"Origin": own, "Sec-Fetch-Site": "same-origin"},  # the dashboard
        {"Origin": own},  # the dashboard in a browser without Sec-Fetch-*
        {"Sec-Fetch-Site": "none"},  # typed into the address bar
        # Behind a TLS proxy the page's origin is https and the broker sees http.
        {"Origin": own.replace("http://", "https://")},
    ]
    for n, headers in enumerate(allowed):
        r = await http.post(f"{API}/push", headers=headers, content=json.dumps(
            {"items": [{"queue": "ok", "payload": n}]}).encode())
        assert r.status_code == 201, (headers, r.text)
    assert count(database_url, "SELECT count(*) FROM queen.frames") == len(allowed)
    # Reads of pages that are not the API are not refused for their origin (a link).
    r = await http.get("/health", headers=NO_CORS)
    assert r.status_code == 200, r.text


# -- Host: DNS rebinding -----------------------------------------------------------------------


async def request_as(broker: BrokerHandle, host: str, method: str = "GET",
                     path: str = f"{API}/resources/queues", **kw: Any) -> httpx.Response:
    async with httpx.AsyncClient(base_url=broker.url, timeout=10) as http:
        return await http.request(method, path, headers={"Host": host}, **kw)


async def test_a_rebound_host_name_is_refused_with_auth_off(
    broker: BrokerHandle, database_url: str,
) -> None:
    port = broker.url.rsplit(":", 1)[1]
    for host in (f"evil.example:{port}", "evil.example", f"localhost.evil.example:{port}",
                 f"127.0.0.1.nip.io:{port}", "localhost.", "a:b:c", "[::1"):
        for path in (f"{API}/resources/queues", "/ui", "/metrics", "/health"):
            r = await request_as(broker, host, path=path)
            assert_refused(r, "host_not_allowed", "Host")
        r = await request_as(broker, host, "POST", f"{API}/push", json={
            "items": [{"queue": "q", "payload": 1}]})
        assert_refused(r, "host_not_allowed", "QUEEN_ALLOWED_HOSTS")
    assert count(database_url, "SELECT count(*) FROM queen.frames") == 0
    for host in (f"127.0.0.1:{port}", "127.0.0.1", f"localhost:{port}", "LOCALHOST",
                 f"dash.localhost:{port}", f"[::1]:{port}", "10.1.2.3:80", "[fe80::1]"):
        r = await request_as(broker, host)
        assert r.status_code == 200, (host, r.text)


@pytest.fixture
async def broker_with(settings: Settings) -> AsyncIterator[Any]:
    async def start(nursery: trio.Nursery, **changes: Any) -> BrokerHandle:
        return await nursery.start(run_broker, replace_settings(settings, **changes))
    yield start


async def test_listed_host_names_and_auth_on(broker_with: Any) -> None:
    async with trio.open_nursery() as nursery:
        listed = await broker_with(nursery, allowed_hosts=("queen.example",))
        for host, status in (("queen.example:6632", 200), ("QUEEN.example", 200),
                             ("other.example", 403), ("localhost", 200)):
            assert (await request_as(listed, host)).status_code == status, host
        # Auth on: the token is the guard; no Host check unless a list is configured.
        with_auth = await broker_with(nursery, auth=True)
        assert (await request_as(with_auth, "evil.example")).status_code == 401
        anywhere = await broker_with(nursery, allowed_hosts=("*",))
        assert (await request_as(anywhere, "evil.example")).status_code == 200
        for b in (listed, with_auth, anywhere):
            b.shutdown()

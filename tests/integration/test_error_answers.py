"""Errors as Queen answers them, on every route family (log, timers, KV, locks, transactions,
admin): a table of requests, each kind of refusal provoked on each family it applies to, with
the status, the ``error`` code, Queen's ``detail``, and ``Retry-After`` on every 429 and 503.
Then the same refusals through ``queen-mq`` 2.6.0 itself: the exception Queen's client raises
for that status and code (its family's ``TimerError`` / ``KvError`` / ``LockError`` with
``.code``, a bare ``httpx.HTTPStatusError`` elsewhere).
"""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import psycopg
import pytest
import trio
from psycopg.rows import dict_row

from queen_trio.config import Settings
from queen_trio.server import BrokerHandle, run_broker
from queen_trio.tenants import store

from ..conftest import replace_settings
from ..timer_ops import timer_op
from .test_plans import plan_loaded, set_plan
from .test_queen_mq import _quiet_signals  # noqa: F401 (a fixture)

queen = pytest.importorskip("queen")
Queen = queen.Queen
API = "/api/v1"


@dataclasses.dataclass(frozen=True)
class Route:
    """One route of a family: a request that works, one that is malformed (and the code it
    answers), and, for the writes that add stored bytes, one too big for a 1 kB ceiling."""

    family: str
    method: str
    path: str
    good: Any = None
    bad: Any = None
    bad_code: str = ""
    big: Any = None
    gated: bool = False


_BIG = "x" * 2000
ROUTES = [
    Route("log", "POST", "/push", {"items": [{"queue": "q", "payload": 1}]},
          {"items": 5}, "invalid_items", {"items": [{"queue": "q", "payload": _BIG}]},
          gated=True),
    Route("timers", "POST", "/timers", {"operations": [timer_op("q", "k", 60_000, 1)]},
          {"operations": [timer_op("q", "k", 60_000, 1), timer_op("q", "k", 60_000, 2)]},
          "timers_bad_request", {"operations": [timer_op("q", "big", 60_000, _BIG)]},
          gated=True),
    Route("kv", "POST", "/kv",
          {"operations": [{"op": "put", "ns": "n", "key": "k", "value": 1, "forever": True}]},
          {"operations": [{"op": "put", "ns": "n", "key": "k", "value": 1}]},
          "kv_bad_request",
          {"operations": [{"op": "put", "ns": "n", "key": "k", "value": _BIG, "forever": True}]},
          gated=True),
    Route("locks", "POST", "/locks",
          {"operations": [{"op": "acquire", "name": "job", "ttlSeconds": 30}]},
          {"operations": [{"op": "acquire", "name": "job"}]}, "locks_bad_request", gated=True),
    Route("transactions", "POST", "/transaction",
          {"operations": [{"type": "push", "items": [{"queue": "q", "payload": 1}]}]},
          {"operations": [], "surprise": 1}, "unknown_field",
          {"operations": [{"type": "push", "items": [{"queue": "q", "payload": _BIG}]}]},
          gated=True),
    Route("admin", "POST", "/consumer-groups/g/queues/q/seek", {"toEnd": True},
          {"toEnd": "yes"}, "invalid_seek"),
]
READ = Route("admin", "GET", "/resources/queues")


async def send(http: httpx.AsyncClient, route: Route, body: Any,
               headers: dict[str, str] | None = None) -> httpx.Response:
    return await http.request(route.method, API + route.path, headers=headers,
                              json=body if route.method == "POST" else None)


def refused(r: httpx.Response, status: int, code: str, *, route: Route) -> dict[str, Any]:
    """Queen's error shape (error, detail) with ours (ok, message) beside it; Retry-After on
    exactly the "not now" statuses."""
    where = f"{route.family} {route.method} {route.path}"
    assert r.status_code == status, (where, r.status_code, r.text)
    body = r.json()
    assert (body["ok"], body["error"]) == (False, code), (where, body)
    assert isinstance(body["detail"], str) and body["detail"], (where, body)
    assert isinstance(body["message"], str) and body["message"], (where, body)
    if status in (429, 503):
        assert r.headers["retry-after"].isdigit(), (where, dict(r.headers))
        assert int(r.headers["retry-after"]) >= 1
    else:
        assert "retry-after" not in r.headers, (where, dict(r.headers))
    return body


async def queen_mq(broker: BrokerHandle, flow: Callable[[Any], Awaitable[Any]],
                   **options: Any) -> Any:
    """``flow(client)`` with a queen-mq client that retries nothing (a 429 is raised at once)."""
    async def main() -> Any:
        client = Queen(url=broker.url, retry_attempts=1, timeout_millis=10_000,
                       retry_429={"max_attempts": 1}, **options)
        try:
            return await flow(client)
        finally:
            await client.close()

    return await trio.to_thread.run_sync(asyncio.run, main())


# What queen-mq calls for each family, and the exception it raises on a refusal.
QUEEN_CALLS: dict[str, tuple[Callable[[Any], Awaitable[Any]], type]] = {
    "log": (lambda c: c.queue("q").push([{"data": 1}]), httpx.HTTPStatusError),
    "timers": (lambda c: c.timers.schedule("q", "k", 1, delay_ms=60_000), queen.TimerError),
    "kv": (lambda c: c.kv.put("n", "k", 1, forever=True), queen.KvError),
    "locks": (lambda c: c.locks.acquire("job", ttl_seconds=30), queen.LockError),
    "transactions": (lambda c: c.transaction().queue("q").push([{"data": 1}]).commit(),
                     httpx.HTTPStatusError),
    "admin": (lambda c: c.admin.list_queues(), httpx.HTTPStatusError),
}


async def queen_refusal(broker: BrokerHandle, family: str, status: int, code: str,
                        tries: int = 1, options: Callable[[], dict[str, Any]] = dict,
                        ) -> Exception:
    """The exception queen-mq raises for ``family``'s call (``tries`` attempts, each with a
    client made with ``options()``, until one is refused with ``status``), checked against
    what Queen's client raises for ``status`` and ``code``."""
    call, kind = QUEEN_CALLS[family]

    async def flow(c: Any) -> Exception | None:
        try:
            await call(c)
        except Exception as exc:  # noqa: BLE001 - what queen-mq raised is the subject
            return exc
        return None

    for _ in range(tries):
        exc = await queen_mq(broker, flow, **options())
        if getattr(getattr(exc, "response", None), "status_code", None) == status:
            break
    assert exc is not None, f"{family}: queen-mq was never refused in {tries} calls"
    assert isinstance(exc, kind), (family, repr(exc))
    assert isinstance(exc, httpx.HTTPStatusError)
    assert exc.response.status_code == status, (family, exc.response.text)
    if isinstance(exc, queen.QueenHttpError):  # its family's error: the code, the detail
        assert (exc.status, exc.code) == (status, code), (family, exc.code)
        assert exc.detail and str(exc).endswith(exc.detail)
    else:
        assert str(exc) == code  # queen-mq's text for a bare HTTP error is the body's error
    if status == 429:
        assert exc.retry_after_seconds is not None and exc.retry_after_seconds >= 1
    return exc


# -- 400: each family's own code, the precise one as reason --------------------------------


async def test_bad_input_answers_400_with_the_familys_code(http: httpx.AsyncClient) -> None:
    for route in ROUTES:
        body = refused(await send(http, route, route.bad), 400, route.bad_code, route=route)
        if route.bad_code.endswith("_bad_request"):  # Queen's surfaces: the precise code too
            assert isinstance(body["reason"], str) and body["reason"] != route.bad_code
    # Malformed JSON on Queen's surfaces is their family's code, with the reason.
    for family, path in (("timers", "/timers"), ("kv", "/kv"), ("locks", "/locks")):
        r = await http.post(API + path, content=b"{", headers={"content-type": "application/json"})
        body = refused(r, 400, f"{family}_bad_request", route=Route(family, "POST", path))
        assert body["reason"] == "malformed_json"
    # A route that does not exist: Queen's shape too.
    refused(await http.get(f"{API}/nowhere"), 404, "not_found", route=READ)


# -- 403: the storage gate on every write that adds bytes (Queen never answers 507) ------------


async def test_the_storage_gate_answers_403_on_every_family(
    broker: BrokerHandle, http: httpx.AsyncClient, database_url: str
) -> None:
    set_plan(database_url, max_stored_bytes=0, set_stored=True)
    await plan_loaded(broker, max_stored_bytes=0)
    for route in ROUTES:
        if route.gated:
            refused(await send(http, route, route.good), 403, "storage_full", route=route)
    assert (await send(http, READ, None)).status_code == 200  # reads still work
    for family in ("log", "timers", "kv", "locks", "transactions"):
        await queen_refusal(broker, family, 403, "storage_full")


# -- 413: a payload above the tenant's ceiling ------------------------------------------------


async def test_a_payload_above_the_ceiling_answers_413(
    broker: BrokerHandle, http: httpx.AsyncClient, database_url: str
) -> None:
    set_plan(database_url, max_message_bytes=1000)
    await plan_loaded(broker, max_message_bytes=1000)
    for route in ROUTES:
        if route.big is not None:
            refused(await send(http, route, route.big), 413, "payload_too_large", route=route)


# -- 429: the tenant's request-rate quota, with Retry-After, on every family ---------------


async def test_the_request_quota_answers_429_with_retry_after_on_every_family(
    broker: BrokerHandle, http: httpx.AsyncClient, database_url: str
) -> None:
    set_plan(database_url, requests_per_second=1, set_rate=True)
    await plan_loaded(broker, requests_per_second=1)
    for route in [*ROUTES, READ]:
        # One request a second: the first 429 comes within a few (however slow the machine).
        for _ in range(20):
            r = await send(http, route, route.good)
            if r.status_code == 429:
                break
        refused(r, 429, "rate_limited", route=route)
    for family in QUEEN_CALLS:
        await queen_refusal(broker, family, 429, "rate_limited", tries=20)


# -- 401 and the failed-authentication limiter (QUEEN_AUTH=on) --------------------------------


@pytest.fixture
async def auth_broker(settings: Settings) -> AsyncIterator[BrokerHandle]:
    async with trio.open_nursery() as nursery:
        handle: BrokerHandle = await nursery.start(
            run_broker, replace_settings(settings, auth=True, auth_failures_per_s=1))
        yield handle
        handle.shutdown()


async def test_auth_answers_401_then_429_with_retry_after_on_every_family(
    auth_broker: BrokerHandle, database_url: str
) -> None:
    with psycopg.connect(database_url, autocommit=True, row_factory=dict_row) as raw:
        token = store.create_token(raw, "default")
    async with httpx.AsyncClient(base_url=auth_broker.url, timeout=30) as http:
        for route in [*ROUTES, READ]:
            body = refused(await send(http, route, route.good), 401, "unauthorized",
                           route=route)
            assert "bearer" in body["detail"]
        for family in QUEEN_CALLS:
            await queen_refusal(auth_broker, family, 401, "unauthorized")
        # A good token still works.
        ok = await send(http, READ, None, {"Authorization": f"Bearer {token}"})
        assert ok.status_code == 200, ok.text
        # Well-formed wrong tokens (each a database lookup), past the limiter (1 a second,
        # bursts of 2): 429 with Retry-After.
        for route in ROUTES:
            for _ in range(10):
                r = await send(http, route, route.good, {"Authorization": f"Bearer {wrong()}"})
                if r.status_code == 429:
                    break
            refused(r, 429, "rate_limited", route=route)
        await queen_refusal(auth_broker, "kv", 429, "rate_limited", tries=10,
                            options=lambda: {"bearer_token": wrong()})


def wrong() -> str:
    """A token of the right shape that no tenant holds."""
    return f"qt_{secrets.token_hex(6)}_{secrets.token_urlsafe(32)}"


# -- bounds on waiting pops: 429 for a tenant, 503 for the broker, both with Retry-After -------


@pytest.mark.parametrize(("bound", "status", "code"), [
    ("longpoll_max_parked_per_tenant", 429, "too_many_waiting_pops"),
    ("longpoll_max_parked", 503, "broker_waiting_pops_full"),
])
async def test_a_pop_past_a_bound_on_waiting_pops_says_when_to_retry(
    settings: Settings, bound: str, status: int, code: str
) -> None:
    async with trio.open_nursery() as nursery:
        broker: BrokerHandle = await nursery.start(
            run_broker, replace_settings(settings, **{bound: 0}))
        async with httpx.AsyncClient(base_url=broker.url, timeout=30) as http:
            route = Route("log", "GET", "/pop/queue/q?wait=true&timeout=5000")
            refused(await send(http, route, None), status, code, route=route)
        broker.shutdown()

"""The ops endpoints and the uniform JSON error shape, over real HTTP."""

from __future__ import annotations

import re

import httpx
import psycopg
import trio
from psycopg import sql
from quart import Blueprint

from queen_trio.api import create_app
from queen_trio.api.errors import read_json_object
from queen_trio.db.migrations import latest_version
from queen_trio.server import BrokerHandle

from ..helpers import parked
from ..pgserver import url_params, with_dbname


async def test_health_reports_database_schema_and_services(
    http: httpx.AsyncClient, database_url: str
) -> None:
    r = await http.get("/health")
    assert r.status_code == 200
    where = url_params(database_url)
    assert r.json() == {
        "ok": True,
        "database": "up",
        "schemaVersion": latest_version(),
        "services": {"listener": "up", "sweeper": "up", "housekeeping": "up", "http": "up"},
        # The server the pool is on, and that it is the primary.
        "server": {"host": where["host"], "port": int(where["port"]), "inRecovery": False},
    }


async def test_health_is_503_while_the_database_is_unreachable(
    http: httpx.AsyncClient, database_url: str
) -> None:
    name = url_params(database_url)["dbname"]
    admin_url = with_dbname(database_url, "postgres")
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS false")
                      .format(sql.Identifier(name)))
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,)
        )
        try:
            r = await http.get("/health")
            assert r.status_code == 503
            body = r.json()
            assert (body["ok"], body["database"], body["error"]) == (
                False, "down", "database_unavailable"
            )
        finally:
            admin.execute(
                sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS true").format(sql.Identifier(name))
            )
    # The pool and the listener heal by themselves.
    with trio.fail_after(5):
        while (r := await http.get("/health")).status_code != 200:
            await trio.sleep(0.05)
    assert r.json()["services"] == {"listener": "up", "sweeper": "up", "housekeeping": "up",
                                    "http": "up"}


async def test_metrics_expose_process_pool_and_http_figures(http: httpx.AsyncClient) -> None:
    await http.get("/health")
    for path in ("/metrics", "/metrics/prometheus"):
        r = await http.get(path)
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/plain")
        text = r.text
        for family in (
            "process_resident_memory_bytes",
            'queen_db_pool_connections{state="idle"}',
            "queen_db_pool_max 5.0",
            "queen_listener_connected 1.0",
            'queen_http_requests_total{method="GET",route="/health",status="200"}',
            # by method too, and fire lag resolves below 1 ms
            'queen_http_request_seconds_count{method="GET",route="/health"}',
            'queen_timers_fire_lag_seconds_bucket{le="0.0005"}',
        ):
            assert family in text, family
        # One series per counter and histogram: no `_created` twin doubling them.
        assert [line for line in text.splitlines() if "_created" in line] == []


async def test_openapi_describes_every_route(broker: BrokerHandle, http: httpx.AsyncClient) -> None:
    r = await http.get("/openapi.json")
    assert r.status_code == 200
    doc = r.json()
    assert doc["openapi"].startswith("3.")
    app = create_app(broker.context)
    served = {
        re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", rule.rule)
        for rule in app.url_map.iter_rules()
        if rule.endpoint != "static"
    }
    assert served <= set(doc["paths"]), served - set(doc["paths"])


async def test_unknown_route_and_wrong_method_are_json_errors(http: httpx.AsyncClient) -> None:
    r = await http.get("/api/v1/nothing-here")
    assert r.status_code == 404
    assert r.json() == {
        "ok": False, "error": "not_found", "message": "no route for GET /api/v1/nothing-here",
        "detail": "no route for GET /api/v1/nothing-here",
    }
    r = await http.delete("/health")
    assert r.status_code == 405
    assert r.json()["error"] == "method_not_allowed"
    assert "GET" in r.headers["allow"]


async def test_malformed_json_is_a_400_with_a_code(broker: BrokerHandle) -> None:
    app = create_app(broker.context)
    echo = Blueprint("echo", __name__)

    @echo.post("/echo")
    async def _echo():  # type: ignore[no-untyped-def]
        return {"ok": True, "got": await read_json_object()}

    app.register_blueprint(echo)
    client = app.test_client()
    cases = [
        (b"{not json", "malformed_json"),
        (b"", "malformed_json"),
        (b"\xff\xfe", "malformed_json"),
        (b"[1, 2]", "invalid_body"),
        (b"[" * 100_000 + b"]" * 100_000, "malformed_json"),
    ]
    for body, code in cases:
        r = await client.post("/echo", data=body, headers={"content-type": "application/json"})
        assert r.status_code == 400, body[:20]
        assert (await r.get_json())["error"] == code
    r = await client.post("/echo", data=b'{"a": 1}')
    assert (await r.get_json()) == {"ok": True, "got": {"a": 1}}


async def test_an_oversized_body_is_refused_with_a_json_413(http: httpx.AsyncClient) -> None:
    body = b'{"items": [{"queue": "q", "payload": "' + b"x" * (65 * 1024 * 1024) + b'"}]}'
    r = await http.post("/api/v1/push", content=body,
                        headers={"content-type": "application/json"})
    assert r.status_code == 413
    assert r.json()["ok"] is False and r.json()["error"] == "payload_too_large"


async def test_shutdown_lets_an_in_flight_request_finish(settings) -> None:  # type: ignore[no-untyped-def]
    """A graceful stop refuses new connections but answers the request already in flight."""
    import time as _time

    from queen_trio.server import run_broker

    async with trio.open_nursery() as nursery:
        handle: BrokerHandle = await nursery.start(run_broker, settings)
        answers: list[int] = []

        async def long_poll() -> None:
            async with httpx.AsyncClient(base_url=handle.url, timeout=10) as client:
                r = await client.get("/api/v1/pop/queue/idle",
                                     params={"wait": "true", "timeout": "600"})
                answers.append(r.status_code)

        nursery.start_soon(long_poll)
        await parked(handle)
        started = _time.monotonic()
        handle.shutdown()
    assert answers == [204]
    assert _time.monotonic() - started < settings.graceful_timeout_ms / 1000 + 1.0
    async with httpx.AsyncClient(base_url=handle.url, timeout=2) as client:
        try:
            await client.get("/health")
        except httpx.TransportError:
            pass
        else:
            raise AssertionError("the stopped broker still answered")


async def test_shutdown_answers_a_parked_long_poll_at_once(settings) -> None:  # type: ignore[no-untyped-def]
    """A long-poll parked for far longer than the graceful timeout is answered 204 (nothing
    leased) when the broker stops, not cut off when the drain ends."""
    import time as _time

    from queen_trio.server import run_broker

    async with trio.open_nursery() as nursery:
        handle: BrokerHandle = await nursery.start(run_broker, settings)
        answers: list[int] = []

        async def long_poll() -> None:
            async with httpx.AsyncClient(base_url=handle.url, timeout=60) as client:
                r = await client.get("/api/v1/pop/queue/parked",
                                     params={"wait": "true", "timeout": "50000"})
                answers.append(r.status_code)

        nursery.start_soon(long_poll)
        await parked(handle)
        started = _time.monotonic()
        handle.shutdown()
    assert answers == [204]
    assert _time.monotonic() - started < 1.5


async def test_one_compact_json_style_and_no_content_type_on_empty_answers(
    http: httpx.AsyncClient,
) -> None:
    """Errors are compact JSON like the answers (they were once spaced), and a 204 long-poll
    does not say ``content-type: text/html`` (it once did)."""
    for r in (await http.get("/health"), await http.get("/api/v1/nope"),
              await http.put("/api/v1/timers/q/k", content=b"{")):
        assert r.headers["content-type"] == "application/json", r.headers
        assert ", " not in r.text and '": ' not in r.text, r.text
    r = await http.get("/api/v1/pop/queue/empty-q", params={"wait": "true", "timeout": "10"})
    assert r.status_code == 204 and r.content == b""
    assert "content-type" not in r.headers, r.headers

"""The lone schedule and cancel answered before Quart (queen_trio/api/fast.py) answer exactly
as Quart's routes do: the same requests sent both ways give the same statuses, headers, bodies
and metrics, and whatever the fast path must not decide still reaches Quart."""

from __future__ import annotations

import dataclasses
import json
import re
from collections import Counter
from typing import Any

import httpx
import psycopg
import pytest
import trio
from psycopg.rows import dict_row

from queen_trio.api import fast
from queen_trio.config import Settings
from queen_trio.server import BrokerHandle, run_broker
from queen_trio.tenants import store as tenant_store

from ..timer_ops import timer_op

TIMERS = "/api/v1/timers"
SWITCHES = "/api/v1/system/kv-timers"
HOUR_MS = 3_600_000


@pytest.fixture
def settings(database_url: str) -> Settings:
    return Settings(database_url=database_url, port=0, graceful_timeout_ms=1000, db_pool_size=5,
                    timers_max_horizon_s=7200)


def _ops(*ops: dict[str, Any]) -> dict[str, Any]:
    return {"json": {"operations": list(ops)}}


# (method, path, request options): run in order, each run starting with no timers in "fq".
REQUESTS: list[tuple[str, str, dict[str, Any]]] = [
    ("POST", TIMERS, _ops(timer_op("fq", "k1", HOUR_MS, {"a": 1}, txn="t-1"))),  # scheduled
    ("POST", TIMERS, _ops(timer_op("fq", "k1", HOUR_MS, {"a": 2}, txn="t-2"))),  # rescheduled
    ("POST", TIMERS, _ops(timer_op("fq", "k2", HOUR_MS, {"b": 1}, txn="t-3"),
                          {"op": "cancel", "queue": "fq", "timerKey": "k1"})),  # mixed
    ("POST", TIMERS, {"content": b"{", "headers": {"content-type": "application/json"}}),
    ("POST", TIMERS, _ops({"op": "explode", "queue": "fq", "timerKey": "k3"})),
    ("POST", TIMERS, _ops(timer_op("fq", "k3", 10 * HOUR_MS, {"c": 1}, txn="t-4"))),  # horizon
    ("POST", TIMERS, _ops(timer_op("bad$q", "k3", HOUR_MS, {"c": 1}, txn="t-5"))),
    ("POST", TIMERS, _ops()),  # nothing to do
    ("DELETE", f"{TIMERS}/fq/k1", {}),  # absent (the mixed batch cancelled it)
    ("DELETE", f"{TIMERS}/fq/k2", {}),  # cancelled
    ("DELETE", f"{TIMERS}/fq/k2", {}),  # absent
    ("DELETE", f"{TIMERS}/fq//slash", {}),  # a key starting with '/'
    ("DELETE", f"{TIMERS}/fq/{'x' * 600}", {}),  # key too long: 400 timers_bad_request
    ("DELETE", f"{TIMERS}/bad$q/k", {}),  # 400 invalid_queue
]


def _headers(r: httpx.Response, *, early: bool = False) -> list[tuple[bytes, bytes]]:
    """The answer's headers but its date; ``early`` (an answer that may leave before the
    server took in the whole body): not ``Connection`` either, which hypercorn adds when it
    has not, after as many scheduler passes as it happens to take, Quart's answer as well."""
    dropped = (b"date", b"connection") if early else (b"date",)
    return [(k, v) for k, v in r.headers.raw if k.lower() not in dropped]


def _normal(value: Any) -> Any:
    """An answer's JSON with what differs from one run to the next (minted ids, instants)
    replaced by whether it is there."""
    if isinstance(value, dict):
        return {k: (v is not None) if k in ("messageId", "deliverAt") else _normal(v)
                for k, v in value.items()}
    if isinstance(value, list):
        return [_normal(v) for v in value]
    return value


_COUNTED = re.compile(r'^(queen_http_requests_total\{[^}]*route="/api/v1/timers[^}]*\}|'
                      r'queen_timers_(?:scheduled|cancel)_total\{[^}]*\}|'
                      r'queen_auth_refused_total\{[^}]*\}) (\S+)$', re.M)


async def _counts(http: httpx.AsyncClient, headers: dict[str, str] | None = None
                  ) -> Counter[str]:
    text = (await http.get("/metrics", headers=headers)).text
    return Counter({name: float(value) for name, value in _COUNTED.findall(text)})


async def _run(http: httpx.AsyncClient) -> tuple[list[Any], Counter[str]]:
    before = await _counts(http)
    answers = []
    for method, path, options in REQUESTS:
        r = await http.request(method, path, **options)
        answers.append((method, path, r.status_code, _headers(r), _normal(r.json())))
    after = await _counts(http)
    after.subtract(before)
    return answers, +after


async def test_fast_routes_answer_and_count_as_quart_does(
        http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fast, "ENABLED", False)
    answered = fast.answered
    through_quart, quart_counts = await _run(http)
    assert fast.answered == answered

    monkeypatch.setattr(fast, "ENABLED", True)
    fast_answers, fast_counts = await _run(http)
    assert fast.answered == answered + len(REQUESTS)  # every one of them took the fast path

    for quart_answer, fast_answer in zip(through_quart, fast_answers, strict=True):
        assert fast_answer == quart_answer
    assert fast_counts == quart_counts
    statuses = [a[2] for a in fast_answers]
    assert statuses == [200, 200, 200, 400, 400, 403, 400, 200, 200, 200, 200, 200, 400, 400]
    assert [r["status"] for r in fast_answers[2][4]["results"]] == ["scheduled", "cancelled"]
    assert fast_answers[9][4]["status"] == "cancelled"
    assert fast_counts['queen_http_requests_total{method="DELETE",'
                       'route="/api/v1/timers/<queue>/<name:key>",status="200"}'] == 4


async def test_a_paused_schedule_is_refused_alike(
        http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch) -> None:
    r = await http.post(SWITCHES, json={"timersSchedule": False})
    assert r.status_code == 200, r.text
    answers = []
    for enabled in (False, True):
        monkeypatch.setattr(fast, "ENABLED", enabled)
        r = await http.post(TIMERS, **_ops(timer_op("fq", "p", HOUR_MS, {"a": 1}, txn="t-9")))
        answers.append((r.status_code, _headers(r), r.json()))
    assert answers[0] == answers[1]
    assert answers[1][0] == 503 and answers[1][2]["error"] == "timers_disabled"
    assert (b"retry-after", b"1") in answers[1][1]


async def test_what_the_fast_path_must_not_decide_reaches_quart(
        http: httpx.AsyncClient) -> None:
    answered = fast.answered
    body = _ops(timer_op("fq", "o", HOUR_MS, {"a": 1}, txn="t-10"))
    # Another origin's page: refused by Quart's hook, nothing scheduled.
    r = await http.post(TIMERS, headers={"Origin": "http://evil.example"}, **body)
    assert r.status_code == 403 and r.json()["error"] == "cross_origin"
    # A name the browser escaped, a query string: Quart decodes them.
    r = await http.post(TIMERS, **_ops(timer_op("fq", "a b", HOUR_MS, {"a": 1}, txn="t-11")))
    assert r.status_code == 200 and fast.answered == answered + 1
    r = await http.delete(f"{TIMERS}/fq/a%20b", params={"txn": "t-11"})
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    # A chunked body.
    async def chunks() -> Any:
        yield b'{"operations":'
        yield b"[]}"

    r = await http.post(TIMERS, content=chunks(),
                        headers={"content-type": "application/json"})
    assert r.status_code == 200 and r.json() == {"results": []}
    assert fast.answered == answered + 1


async def test_a_schedule_past_the_body_budget_is_refused_alike(
        database_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """While a slow upload holds all but 100 bytes of the budget, a one-timer schedule is
    answered 503 ``overloaded`` both ways, and schedules nothing."""
    mib = 1024 * 1024
    settings = Settings(database_url=database_url, port=0, graceful_timeout_ms=1000,
                        db_pool_size=5, http_body_buffer_bytes=8 * mib, max_message_bytes=mib)
    async with trio.open_nursery() as nursery:
        broker: BrokerHandle = await nursery.start(run_broker, settings)
        port = int(broker.url.rsplit(":", 1)[1])
        slow = await trio.open_tcp_stream("127.0.0.1", port)
        await slow.send_all(b"POST /api/v1/push HTTP/1.1\r\nHost: localhost\r\nContent-Type: "
                            b"application/json\r\nContent-Length: %d\r\n\r\n" % (8 * mib))
        await slow.send_all(b"x" * (8 * mib - 100))
        await trio.sleep(0.5)  # read by the broker: the push's handler asked for it at once
        answers = []
        async with httpx.AsyncClient(base_url=broker.url, timeout=10) as http:
            for enabled in (False, True):
                monkeypatch.setattr(fast, "ENABLED", enabled)
                answered = fast.answered
                r = await http.post(TIMERS, **_ops(timer_op("fq", "b", HOUR_MS, {"a": 1},
                                                            txn="t-20")))
                assert fast.answered == answered + enabled
                answers.append((r.status_code, _headers(r, early=True), r.json()))
            assert answers[0] == answers[1]
            assert answers[1][0] == 503 and answers[1][2]["error"] == "overloaded"
            assert (await http.get(f"{TIMERS}/fq/b")).json()["found"] is False
        # The same request whole in one write: answered on its connection's task (its body
        # taken as it came), refused alike.
        raw = []
        for inline in (False, True):
            monkeypatch.setattr(fast, "INLINE", inline)
            inline_before = fast.inline_answered
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            ((status, fields, body),) = await _exchange(stream, _raw_request(
                "POST", TIMERS, _ops(timer_op("fq", "c", HOUR_MS, {"a": 1}, txn="t-21"))))
            await stream.aclose()
            assert fast.inline_answered - inline_before == inline
            raw.append((status, [f for f in fields if not f.lower().startswith(b"connection:")],
                        body))
        assert raw[0] == raw[1]
        assert raw[1][0] == b"HTTP/1.1 503 " and raw[1][2]["error"] == "overloaded"
        async with httpx.AsyncClient(base_url=broker.url, timeout=10) as http:
            assert (await http.get(f"{TIMERS}/fq/c")).json()["found"] is False
        await slow.aclose()
        broker.shutdown()


@pytest.fixture
def tokens(database_url: str) -> dict[str, str]:
    with psycopg.connect(database_url, row_factory=dict_row, autocommit=True) as raw:
        tenant_store.create_tenant(raw, "alpha")
        return {"A": tenant_store.create_token(raw, "alpha")}


async def test_with_auth_on_the_token_selects_the_tenant_alike(
        settings: Settings, tokens: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """QUEEN_AUTH=on: a schedule and its cancel with a token, and both without one or with a
    wrong one (401, counted in queen_auth_refused), answer and count the same both ways; the
    cancels take the fast path."""
    requests: list[tuple[str, str, dict[str, str]]] = [
        ("POST", TIMERS, {"Authorization": f"Bearer {tokens['A']}"}),
        ("DELETE", f"{TIMERS}/fq/a", {"Authorization": f"Bearer {tokens['A']}"}),
        ("DELETE", f"{TIMERS}/fq/a", {"Authorization": f"Bearer {tokens['A']}"}),
        ("POST", TIMERS, {}),
        ("DELETE", f"{TIMERS}/fq/a", {"Authorization": "Bearer wrong"}),
    ]
    body = _ops(timer_op("fq", "a", HOUR_MS, {"a": 1}, txn="t-30"))["json"]
    async with trio.open_nursery() as nursery:
        broker: BrokerHandle = await nursery.start(run_broker,
                                                   dataclasses.replace(settings, auth=True,
                                                                       operator_tenant="alpha"))
        runs = []
        for enabled in (False, True):
            monkeypatch.setattr(fast, "ENABLED", enabled)
            answered = fast.answered
            async with httpx.AsyncClient(base_url=broker.url, timeout=10) as http:
                metrics = {"Authorization": f"Bearer {tokens['A']}"}
                before = await _counts(http, metrics)
                answers = []
                for method, path, headers in requests:
                    r = await http.request(method, path, headers=headers,
                                           json=body if method == "POST" else None)
                    answers.append((r.status_code, _headers(r, early=True),
                                    _normal(r.json())))
                after = await _counts(http, metrics)
            after.subtract(before)
            # The cancels: a schedule that could be refused before its body is read is
            # Quart's (fast.FastRoutes._never_refused_early).
            assert fast.answered == answered + (3 if enabled else 0)
            runs.append((answers, +after))
        for quart_run, fast_run in zip(runs[0][0], runs[1][0], strict=True):
            assert fast_run == quart_run
        assert runs[0][1] == runs[1][1]
        assert [a[0] for a in runs[1][0]] == [200, 200, 200, 401, 401]
        fast_answers = runs[1][0]
        assert fast_answers[0][2]["results"][0]["status"] == "scheduled"
        assert [a[2]["status"] for a in fast_answers[1:3]] == ["cancelled", "absent"]
        assert runs[1][1]['queen_auth_refused_total{reason="unauthorized"}'] == 2
        broker.shutdown()


def _raw_request(method: str, path: str, options: dict[str, Any], *,
                 extra: bytes = b"") -> bytes:
    """A request of REQUESTS as one piece of bytes (the SDK writes its head and body so)."""
    if "json" in options:
        body = json.dumps(options["json"]).encode()
    else:
        body = options.get("content", b"")
    sized = b"Content-Length: %d\r\n" % len(body) if method == "POST" else b""
    return (b"%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: */*\r\n%sContent-Type: "
            b"application/json\r\n%s\r\n" % (method.encode(), path.encode(), extra, sized)) + body


async def _exchange(stream: trio.SocketStream, request: bytes, answers: int = 1) -> list[Any]:
    """Send ``request`` in one write; read ``answers`` answers: (status line, headers but the
    date, normalised JSON), interim ones skipped."""
    await stream.send_all(request)
    buffer = b""
    out: list[Any] = []
    while len(out) < answers:
        while b"\r\n\r\n" not in buffer:
            chunk = await stream.receive_some(65536)
            assert chunk, "the broker closed the connection"
            buffer += chunk
        head, _, buffer = buffer.partition(b"\r\n\r\n")
        status, *fields = head.split(b"\r\n")
        if status.startswith(b"HTTP/1.1 1"):  # an interim answer (100 Continue)
            continue
        length = next(int(f.split(b":")[1]) for f in fields
                      if f.lower().startswith(b"content-length:"))
        while len(buffer) < length:
            buffer += await stream.receive_some(65536)
        body, buffer = buffer[:length], buffer[length:]
        out.append((status, [f for f in fields if not f.lower().startswith(b"date:")],
                    _normal(json.loads(body))))
    return out


async def test_a_request_read_whole_is_answered_alike_on_its_connection(
        broker: BrokerHandle, monkeypatch: pytest.MonkeyPatch) -> None:
    """A schedule or cancel whose head and body arrive in one read is answered on the
    connection's own task, byte for byte (but the date) as through h11 and ASGI, on one
    keep-alive connection; what it must not read (pipelined requests, an Expect, a folded
    header line, HTTP/1.0) still goes through h11 and answers alike."""
    port = int(broker.url.rsplit(":", 1)[1])
    odd = [
        # two requests in one write
        _raw_request("DELETE", f"{TIMERS}/fq/n1", {}) + _raw_request("DELETE", f"{TIMERS}/fq/n2",
                                                                     {}),
        _raw_request("POST", TIMERS, _ops(timer_op("fq", "e", HOUR_MS, {"a": 1}, txn="t-40")),
                     extra=b"Expect: 100-continue\r\n"),
        _raw_request("DELETE", f"{TIMERS}/fq/e", {}, extra=b"X-Folded: a\r\n b\r\n"),
        _raw_request("DELETE", f"{TIMERS}/fq/e", {}, extra=b"Connection: keep-alive, x\r\n"),
    ]
    runs = []
    for inline in (False, True):
        monkeypatch.setattr(fast, "INLINE", inline)
        before, inline_before = fast.answered, fast.inline_answered
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        # (every other one says "Connection: keep-alive", as httpx does)
        answers = [await _exchange(stream, _raw_request(
            *request, extra=b"Connection: keep-alive\r\n" if i % 2 else b""))
            for i, request in enumerate(REQUESTS)]
        inlined = fast.inline_answered - inline_before
        answers.append(await _exchange(stream, odd[0], answers=2))
        answers += [await _exchange(stream, request) for request in odd[1:]]
        assert fast.inline_answered - inline_before == inlined  # none of the odd ones
        await stream.aclose()
        old = await trio.open_tcp_stream("127.0.0.1", port)
        answers.append(await _exchange(old, _raw_request("DELETE", f"{TIMERS}/fq/x", {})
                                       .replace(b"HTTP/1.1", b"HTTP/1.0")))
        await old.aclose()
        assert fast.inline_answered - inline_before == inlined
        runs.append((answers, inlined, fast.answered - before))
    assert runs[1][0] == runs[0][0]
    assert runs[0][1] == 0 and runs[1][1] == len(REQUESTS)
    assert runs[0][2] == runs[1][2]  # the fast routes' own count: the same either way
    assert [a[0][0] for a in runs[1][0][:len(REQUESTS)]] == [
        b"HTTP/1.1 %d " % s for s in (200, 200, 200, 400, 400, 403, 400, 200, 200, 200, 200,
                                       200, 400, 400)]


async def test_an_answer_on_its_connection_is_counted_before_it_is_read(
        broker: BrokerHandle, monkeypatch: pytest.MonkeyPatch) -> None:
    """Answered on the connection's own task, a request's metrics are counted once its answer
    is written (the client waits for none of it), yet before anything else runs: a scrape
    sent on another connection as soon as the answer is read finds it counted, request by
    request the same counts as when the fast routes answer through ASGI."""
    port = int(broker.url.rsplit(":", 1)[1])
    runs = []
    async with httpx.AsyncClient(base_url=broker.url) as http:
        for inline in (False, True):
            monkeypatch.setattr(fast, "INLINE", inline)
            inline_before = fast.inline_answered
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            deltas = []
            for request in REQUESTS:
                before = await _counts(http)
                await _exchange(stream, _raw_request(*request))
                after = await _counts(http)
                after.subtract(before)
                deltas.append(+after)
            await stream.aclose()
            assert fast.inline_answered - inline_before == (len(REQUESTS) if inline else 0)
            runs.append(deltas)
    assert runs[1] == runs[0]
    assert all(runs[1])  # every request counted something at once
    assert runs[1][0]['queen_timers_scheduled_total{status="scheduled"}'] == 1


# -- a lone push ------------------------------------------------------------------------------

PUSH = "/api/v1/push"
_MINTED = ("offset", "messageId", "message_id", "transactionId", "transaction_id")


def _pushes(tag: str) -> list[tuple[str, str, dict[str, Any]]]:
    """Pushes onto "fp", run in order; ``tag`` keeps one run's transactionIds its own."""
    raw_json = {"headers": {"content-type": "application/json"}}
    return [
        ("POST", PUSH, {"json": {"items": [{"queue": "fp", "payload": {"a": 1}}]}}),
        ("POST", PUSH, {"json": {"items": [
            {"queue": "fp", "partition": "p1", "payload": [1, "x"], "transactionId": f"{tag}-1"},
            {"queue": "fp", "payload": None}]}}),
        ("POST", PUSH, {"json": {"items": [  # a duplicate of the one before
            {"queue": "fp", "partition": "p1", "payload": 2, "transactionId": f"{tag}-1"}]}}),
        ("POST", PUSH, {"json": {"items": []}}),  # 201 [], as Queen
        ("POST", PUSH, {"content": b"{", **raw_json}),  # 400 malformed_json
        ("POST", PUSH, {"content": b'{"items":[{"queue":"fp","payload":1e999}]}', **raw_json}),
        ("POST", PUSH, {"json": []}),  # 400 invalid_body
        ("POST", PUSH, {"json": {"items": [{"queue": "bad$q", "payload": 1}]}}),
        ("POST", PUSH, {"json": {"items": [{"queue": "fp"}]}}),  # 400 missing_field
        ("POST", PUSH, {"json": {"items": "all"}}),  # 400 invalid_items
    ]


def _normal_push(value: Any) -> Any:
    """A push answer with what each run mints (offsets, ids, its own transactionIds)
    replaced by whether it is there."""
    if isinstance(value, dict):
        return {k: (v is not None) if k in _MINTED else _normal_push(v)
                for k, v in value.items()}
    if isinstance(value, list):
        return [_normal_push(v) for v in value]
    return value


_PUSH_COUNTED = re.compile(r'^(queen_http_requests_total\{[^}]*route="/api/v1/push"[^}]*\}|'
                           r'queen_messages_pushed_total\{[^}]*\}) (\S+)$', re.M)


async def _push_counts(http: httpx.AsyncClient) -> Counter[str]:
    text = (await http.get("/metrics")).text
    return Counter({name: float(value) for name, value in _PUSH_COUNTED.findall(text)})


async def test_a_push_is_answered_and_counted_as_quart_does(
        http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch, database_url: str) -> None:
    runs = []
    for enabled in (False, True):
        monkeypatch.setattr(fast, "ENABLED", enabled)
        answered, before = fast.answered, await _push_counts(http)
        answers = []
        # (tags of one length: so are the answers)
        for method, path, options in _pushes("run-f" if enabled else "run-q"):
            r = await http.request(method, path, **options)
            answers.append((r.status_code, _headers(r), _normal_push(r.json())))
        after = await _push_counts(http)
        after.subtract(before)
        runs.append((answers, +after, fast.answered - answered))
    assert runs[1][0] == runs[0][0]
    assert runs[1][1] == runs[0][1]
    assert (runs[0][2], runs[1][2]) == (0, len(_pushes("")))  # all of them took the fast path
    answers = runs[1][0]
    assert [a[0] for a in answers] == [201, 201, 201, 201, 400, 400, 400, 400, 400, 400]
    assert [[i["status"] for i in a[2]] for a in answers[:4]] == [
        ["queued"], ["queued", "queued"], ["duplicate"], []]
    assert [a[2]["error"] for a in answers[4:]] == [
        "malformed_json", "invalid_json_value", "invalid_body", "invalid_queue",
        "missing_field", "invalid_items"]
    assert runs[1][1]['queen_messages_pushed_total{status="duplicate"}'] == 1
    # Each run stored its own three messages (the duplicate and the refused pushes none).
    with psycopg.connect(database_url, row_factory=dict_row) as conn:
        stored = conn.execute(
            "SELECT count(*) AS n FROM queen.frames f JOIN queen.partitions p USING "
            "(partition_id) JOIN queen.queues q USING (queue_id) WHERE q.name = 'fp'"
        ).fetchone()
    assert stored is not None and stored["n"] == 6


async def test_a_push_over_the_storage_gate_goes_to_quart(
        http: httpx.AsyncClient, broker: BrokerHandle, monkeypatch: pytest.MonkeyPatch) -> None:
    """Quart refuses it before reading its body; the fast path leaves it to Quart."""
    answered = fast.answered
    tenants = broker.context.tenants
    monkeypatch.setattr(tenants, "over_storage_gate", lambda tenant_id: True)
    r = await http.post(PUSH, json={"items": [{"queue": "fp", "payload": 1}]})
    assert (r.status_code, r.json()["error"]) == (403, "storage_full")
    assert fast.answered == answered


async def test_a_push_read_whole_is_answered_alike_on_its_connection(
        broker: BrokerHandle, monkeypatch: pytest.MonkeyPatch) -> None:
    port = int(broker.url.rsplit(":", 1)[1])
    runs = []
    for inline in (False, True):
        monkeypatch.setattr(fast, "INLINE", inline)
        inline_before = fast.inline_answered
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        answers = [(status, fields, _normal_push(body))
                   for request in _pushes("inl-1" if inline else "inl-0")
                   for status, fields, body in await _exchange(stream, _raw_request(*request))]
        await stream.aclose()
        runs.append((answers, fast.inline_answered - inline_before))
    assert runs[1][0] == runs[0][0]
    assert (runs[0][1], runs[1][1]) == (0, len(_pushes("")))
    assert [a[0] for a in runs[1][0]] == [b"HTTP/1.1 201 "] * 4 + [b"HTTP/1.1 400 "] * 6


# -- a lone ack -------------------------------------------------------------------------------

ACK = "/api/v1/ack"


async def _acks(http: httpx.AsyncClient, tag: str) -> list[tuple[int, Any, Any]]:
    """A message of "fa" pushed, popped and acknowledged, then acknowledgements a consumer
    gets wrong, each answer (status, headers, JSON with ``tag`` spelled TAG)."""
    txn = f"{tag}-a"
    r = await http.post(PUSH, json={"items": [{"queue": "fa", "payload": 1, "transactionId": txn}]})
    assert r.status_code == 201, r.text
    popped = (await http.get("/api/v1/pop/queue/fa", params={"wait": "false"})).json()
    (message,) = popped["messages"]
    good = {"transactionId": txn, "partitionId": message["partitionId"],
            "leaseId": message["leaseId"], "status": "completed"}
    requests: list[dict[str, Any]] = [
        {"json": good},
        {"json": good},  # again: already acknowledged
        {"json": {**good, "transactionId": f"{tag}-none"}},  # no such message
        {"json": {**good, "leaseId": "00000000-0000-4000-8000-000000000000"}},
        {"json": {**good, "status": "maybe"}},  # 400 invalid_status
        {"json": {"partitionId": message["partitionId"]}},  # 400 missing_field
        {"json": []},  # 400 invalid_body
        {"content": b"{", "headers": {"content-type": "application/json"}},  # 400
    ]
    out = []
    for options in requests:
        r = await http.post(ACK, **options)
        out.append((r.status_code, _headers(r), json.loads(r.text.replace(tag, "TAG"))))
    return out


async def test_an_ack_is_answered_and_counted_as_quart_does(
        http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch) -> None:
    counted = re.compile(r'^(queen_http_requests_total\{[^}]*route="/api/v1/ack"[^}]*\}|'
                         r'queen_acks_total\{[^}]*\}) (\S+)$', re.M)

    async def counts() -> Counter[str]:
        text = (await http.get("/metrics")).text
        return Counter({name: float(value) for name, value in counted.findall(text)})

    runs = []
    for enabled in (False, True):
        monkeypatch.setattr(fast, "ENABLED", enabled)
        answered, before = fast.answered, await counts()
        answers = await _acks(http, "run-f" if enabled else "run-q")
        after = await counts()
        after.subtract(before)
        runs.append((answers, +after, fast.answered - answered))
    assert runs[1][0] == runs[0][0]
    assert runs[1][1] == runs[0][1] and runs[1][1]
    assert runs[0][2] == 0 and runs[1][2] == 9  # its push and eight acks took the fast path
    answers = runs[1][0]
    assert [a[0] for a in answers] == [200] * 4 + [400] * 4
    assert [a[2][0]["success"] for a in answers[:4]] == [True, True, False, False]
    assert answers[1][2][0]["alreadyAcked"] is True
    assert [a[2]["error"] for a in answers[4:]] == [
        "invalid_status", "missing_field", "invalid_body", "malformed_json"]

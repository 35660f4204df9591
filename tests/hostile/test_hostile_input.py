"""Hostile input against a live broker process: generated timer and
transaction bodies, huge and deeply nested JSON, names that are not UTF-8 or not properly
percent-encoded, requests whose body arrives late, and slow-loris clients.

What a client may see is the contract: a JSON answer with a documented status (never a 500,
never a hang), and whatever the broker accepted it gives back unchanged.
"""

from __future__ import annotations

import base64
import json
import socket
import statistics
import string
import threading
import time
import urllib.parse
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from ..brokers import BrokerProcess
from ..pgserver import Databases
from .conftest import start_broker

API = "/api/v1"
ERROR_KEYS = {"ok", "error", "message", "detail"}

json_scalars = (st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
                | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=40))
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=10), inner, max_size=4),
                           max_leaves=20)
names = st.text(min_size=1, max_size=40)
FUZZ = settings(max_examples=120, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


def assert_error(r: httpx.Response, *statuses: int) -> dict[str, Any]:
    assert r.status_code in statuses, (r.status_code, r.text[:500])
    body = r.json()
    assert ERROR_KEYS <= set(body) and body["ok"] is False, body
    # A leaked traceback, not a client's own word echoed back (hypothesis once sent a field
    # named "Traceback", which the answer rightly names).
    assert "Traceback (most recent call last)" not in r.text
    return body


@pytest.fixture(scope="module")
def http(live_broker: BrokerProcess) -> Any:
    with httpx.Client(base_url=live_broker.url, timeout=10) as client:
        yield client


def quote(name: str) -> str:
    return urllib.parse.quote(name, safe="")


# -- generated bodies ---------------------------------------------------------------------------


timer_bodies = st.fixed_dictionaries({}, optional={
    "delayMs": st.integers(-(2**40), 2**40) | json_values,
    "payload": json_values,
    "partition": names | json_values,
    "txn": names | json_values,
    "deliverAt": st.text(max_size=30),
}) | json_values


# Keys a generated schedule was accepted for: hypothesis replays examples, and a timer of an
# earlier run of one (a negative delay: due at once) may be firing at that moment.
_SCHEDULED_KEYS: set[str] = set()


@FUZZ
@given(key=names, body=timer_bodies)
def test_generated_timer_schedules_answer_json_and_round_trip(
    http: httpx.Client, key: str, body: Any
) -> None:
    # A key of "." or ".." is a dot segment: the client removes it from the path before
    # sending (RFC 3986 5.2.4), so the PUT reaches /timers/fuzz or /timers, not a timer.
    assume(key not in (".", ".."))
    path = f"{API}/timers/fuzz/{quote(key)}"
    r = http.put(path, content=json.dumps(body))
    if r.status_code != 200:
        assert_error(r, 400, 403, 404, 413)
        return
    answer = r.json()
    if answer["status"] == "too_late":
        # Replacing a timer while it fires: only one this test scheduled before can be.
        assert key in _SCHEDULED_KEYS and answer["timerKey"] == key, answer
        return
    _SCHEDULED_KEYS.add(key)
    assert answer["status"] in ("scheduled", "rescheduled") and answer["timerKey"] == key
    peek = http.get(path)
    if peek.json()["found"]:  # (a short delay may have fired it already)
        assert peek.json()["data"] == body["payload"]
        assert peek.json()["txn"] == answer["txn"]
    cancel = http.delete(path)
    assert cancel.status_code == 200 and cancel.json()["status"] in ("cancelled", "absent",
                                                                       "too_late")


operations = st.fixed_dictionaries({"type": st.sampled_from(
    ["push", "ack", "kv.put", "kv.delete", "timer", "schedule", "bogus"]) | json_values},
    optional={"items": st.lists(st.fixed_dictionaries(
        {"queue": names, "payload": json_values}, optional={"transactionId": names}),
        max_size=3) | json_values,
        "namespace": names, "key": names, "value": json_values,
        "ttlSeconds": st.integers(-5, 10**12) | json_values,
        "transactionId": names, "partitionId": names, "status": names})
kv_ops = st.fixed_dictionaries({"op": st.sampled_from(
    ["get", "getMany", "getPrefix", "put", "putIfAbsent", "delete", "incr", "check"]) | names},
    optional={"ns": st.sampled_from(["ns", "ns-2"]) | names, "key": names,
              "keys": st.lists(names, max_size=3) | json_values, "prefix": names,
              "value": json_values, "ttlSeconds": st.integers(-5, 10**12) | json_values,
              "forever": st.booleans() | json_values, "expect": st.integers(-2, 10**20)
              | json_values, "required": st.booleans() | json_values,
              "delta": st.integers(-(2**70), 2**70) | st.floats(allow_nan=False)
              | json_values, "min": json_values, "max": json_values,
              "limit": st.integers(-5, 10**6) | json_values, "after": names})
lock_ops = st.fixed_dictionaries({"op": st.sampled_from(
    ["acquire", "renew", "release", "get"]) | names},
    optional={"name": st.sampled_from(["job", "gpu"]) | names,
              "ttlSeconds": st.integers(-5, 10**12) | json_values,
              "owner": names | json_values, "limit": st.integers(-1, 2000) | json_values,
              "token": st.integers(-1, 10**20) | json_values,
              "slot": st.integers(-1, 2000) | json_values})
payloads = st.builds(lambda v: base64.b64encode(json.dumps(v).encode()).decode(), json_values)
timer_entries = st.fixed_dictionaries(
    {"op": st.sampled_from(["schedule", "reschedule", "cancel"]) | names},
    optional={"queue": names, "timerKey": names, "delayMs": st.integers(-1000, 10**12),
              "payload": payloads | names | json_values, "payloadZstd": st.booleans(),
              "txn": names, "partition": names})


@FUZZ
@given(body=st.fixed_dictionaries({}, optional={
    "operations": st.lists(operations, max_size=4) | json_values,
    "kv": st.lists(kv_ops, max_size=4) | json_values,
    "timers": st.lists(timer_entries, max_size=4) | json_values,
    "requiredLeases": st.lists(names, max_size=2) | json_values}) | json_values)
def test_generated_transactions_answer_json_never_a_server_error(
    http: httpx.Client, body: Any
) -> None:
    r = http.post(f"{API}/transaction", content=json.dumps(body))
    if r.status_code == 200:
        answer = r.json()
        if answer["success"] is False:  # a required KV op that did not apply: an answer
            assert answer["reason"] == "kv_precondition" and answer["results"] == []
        else:
            timers = [t for t in answer["results"] if t["type"] == "timer"]
            assert len(timers) == len(body.get("timers") or [])
            assert len(answer["results"]) >= len(body.get("kv") or [])
    else:
        assert_error(r, 400, 403, 404, 409, 413)


@FUZZ
@given(ops=st.lists(kv_ops, max_size=5) | json_values)
def test_generated_kv_calls_answer_json_never_a_server_error(http: httpx.Client,
                                                             ops: Any) -> None:
    r = http.post(f"{API}/kv", content=json.dumps({"operations": ops}))
    if r.status_code == 200:
        answer = r.json()
        if "results" in answer:
            assert [x["index"] for x in answer["results"]] == list(range(len(ops)))
        else:
            assert answer["reason"] == "kv_precondition"
    else:
        assert_error(r, 400, 413)


@FUZZ
@given(ops=st.lists(lock_ops, max_size=4) | json_values)
def test_generated_lock_calls_answer_json_never_a_server_error(http: httpx.Client,
                                                               ops: Any) -> None:
    r = http.post(f"{API}/locks", content=json.dumps(ops))
    if r.status_code == 200:
        assert len(r.json()["results"]) == len(ops)
    else:
        assert_error(r, 400)


# -- huge and deeply nested JSON ----------------------------------------------------------------


def test_huge_bodies_are_refused_cleanly_and_the_connection_stays_usable(
    http: httpx.Client,
) -> None:
    big = json.dumps({"delayMs": 1, "payload": "x" * (9 * 1024 * 1024)})
    assert_error(http.put(f"{API}/timers/huge/k", content=big), 413)
    # Over the timer ceiling (1 MiB serialized) but under the request limit.
    over = json.dumps({"delayMs": 1, "payload": "x" * (1024 * 1024)})
    assert_error(http.put(f"{API}/timers/huge/k", content=over), 413)
    # 200,000 small keys: parsed, stored, given back.
    wide = {f"k{i}": i for i in range(200_000)}
    started = time.perf_counter()
    r = http.put(f"{API}/kv/huge/wide", json={"value": wide, "forever": True})
    assert_error(r, 413)  # a KV value is at most 64 KiB
    assert time.perf_counter() - started < 10
    assert http.get("/health").status_code == 200  # same client, same pool: still served


@pytest.mark.parametrize("depth", [100, 900, 5_000, 200_000])
def test_deeply_nested_json_is_accepted_whole_or_refused_with_a_400(
    http: httpx.Client, depth: int
) -> None:
    nested = "[" * depth + "]" * depth
    for path, body in ((f"{API}/timers/deep/d{depth}", '{"delayMs": 0, "payload": X}'),
                       (f"{API}/kv/deep/d{depth}", '{"value": X, "forever": true}'),
                       (f"{API}/push", '{"items": [{"queue": "deep", "payload": X}]}'),
                       (f"{API}/transaction", "X")):
        body = body.replace("X", nested)
        r = http.post(path, content=body) if path.endswith(("push", "transaction")) \
            else http.put(path, content=body)
        if r.status_code >= 300:
            assert_error(r, 400, 413)
    # A timer the broker accepted is delivered (the fire parses what the schedule stored).
    r = http.get(f"{API}/timers/deep/d{depth}")
    deadline = time.monotonic() + 5
    while r.json()["found"] and time.monotonic() < deadline:
        time.sleep(0.05)
        r = http.get(f"{API}/timers/deep/d{depth}")
    assert r.json()["found"] is False, r.text[:300]


# -- names: invalid UTF-8, bad percent-encoding, control characters -----------------------------


@pytest.mark.parametrize("raw", ["%FF", "%C3%28", "%E2%82", "%C0%AF", "%ED%A0%80", "ok%FF"])
def test_a_name_that_is_not_utf8_is_a_400_and_never_a_timer(http: httpx.Client, raw: str) -> None:
    for method, path in (("PUT", f"{API}/timers/names/{raw}"),
                         ("GET", f"{API}/timers/names/{raw}"),
                         ("DELETE", f"{API}/timers/names/{raw}"),
                         ("PUT", f"{API}/kv/ns/{raw}"),
                         ("GET", f"{API}/timers/{raw}")):
        r = http.request(method, path, json={"delayMs": 60_000, "payload": 1, "value": 1})
        assert_error(r, 400)
    listed = http.get(f"{API}/timers/names").json()["rows"]
    assert all("\ufffd" not in t["timerKey"] for t in listed), listed


@pytest.mark.parametrize("path", [f"{API}//timers/q/key", f"{API}/pop/queue//q"])
def test_a_doubled_slash_is_a_json_404_never_a_redirect(http: httpx.Client, path: str) -> None:
    """An empty name makes '//' in the path: no HTML redirect to another name, a JSON 404
    the client can read."""
    for method in ("PUT", "GET", "DELETE"):
        r = http.request(method, path, json={"delayMs": 60_000, "payload": 1, "value": 1})
        assert r.status_code in (404, 405), (method, path, r.status_code, r.text[:200])
        assert r.headers["content-type"].startswith("application/json")
        assert r.json()["ok"] is False


@pytest.mark.parametrize("path", [f"{API}/timers/q//key", f"{API}/kv/ns//key"])
def test_a_key_with_a_leading_slash_is_that_key(http: httpx.Client, path: str) -> None:
    """A key sent with an unencoded leading '/' names "/key": never a
    redirect, never the router's 404."""
    body = {"value": 1, "forever": True} if "/kv/" in path else {"delayMs": 60_000,
                                                                  "payload": 1}
    for method in ("PUT", "GET", "DELETE"):
        r = http.request(method, path, json=body if method == "PUT" else None)
        assert r.status_code == 200, (method, path, r.status_code, r.text[:200])
        assert r.headers["content-type"].startswith("application/json")
        assert r.json()["key" if "/kv/" in path else "timerKey"] == "/key"


def test_names_mean_their_decoded_text(http: httpx.Client) -> None:
    """Two paths name the same timer exactly when they decode to the same text."""
    table = [  # (as sent in the path, the key it names, the answer)
        ("%ZZ", "%ZZ", "scheduled"),  # not an escape: taken literally
        ("%", "%", "scheduled"),
        ("%25ZZ", "%ZZ", "rescheduled"),  # the same text as the first
        (quote("\ufffd"), "\ufffd", "scheduled"),  # a real U+FFFD is a name like any other
        (quote("a/b"), "a/b", "scheduled"),
        ("a/b", "a/b", "rescheduled"),
        (quote(" sp ace "), " sp ace ", "scheduled"),
        (quote("😀"), "😀", "scheduled"),
    ]
    got = []
    for sent, _, _ in table:
        r = http.put(f"{API}/timers/distinct/{sent}", json={"delayMs": 60_000, "payload": 1})
        assert r.status_code == 200, (sent, r.text)
        got.append((sent, r.json()["timerKey"], r.json()["status"]))
    assert got == table


@pytest.mark.parametrize("raw", ["%00", "%0A", "%1B", "%7F"])
def test_control_characters_in_keys_are_a_400(http: httpx.Client, raw: str) -> None:
    r = http.put(f"{API}/timers/names/x{raw}y", json={"delayMs": 1000, "payload": 1})
    assert assert_error(r, 400)["reason"] == "invalid_key"  # not the router's 404


def raw_request(port: int, data: bytes, *, then: bytes | None = None, pause: float = 0.0,
                timeout: float = 3.0, answers: int = 1, then_after_answer: bool = False,
                ) -> list[bytes]:
    """Send raw bytes (optionally in two parts: the second ``pause`` later, or once the head
    of an answer has come with ``then_after_answer``); return what came back before EOF, the
    end of the ``answers``-th JSON answer, or the timeout."""
    out: list[bytes] = []
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        if then is not None:
            if then_after_answer:
                try:
                    while b"\r\n\r\n" not in b"".join(out):
                        chunk = s.recv(65536)
                        if not chunk:
                            break
                        out.append(chunk)
                except TimeoutError:
                    out.append(b"<timeout>")
                    return out
            time.sleep(pause)
            s.sendall(then)
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                out.append(chunk)
                got = b"".join(out)
                if got.count(b"HTTP/1.1 ") >= answers and got.rstrip().endswith(b"}"):
                    break
        except TimeoutError:
            out.append(b"<timeout>")
    return out


def test_raw_non_utf8_bytes_in_the_path_are_refused(live_broker: BrokerProcess) -> None:
    body = b'{"delayMs": 60000, "payload": 1}'
    got = b"".join(raw_request(live_broker.port, b"PUT /api/v1/timers/names/\xff\xfe HTTP/1.1\r\n"
                               b"Host: localhost\r\nConnection: close\r\n"
                               b"Content-Type: application/json\r\n"
                               b"Content-Length: %d\r\n\r\n" % len(body) + body))
    status = got.split(b"\r\n", 1)[0]
    assert status.startswith(b"HTTP/1.1 4"), got[:300]
    assert_raw_json_error(got)


def assert_raw_json_error(got: bytes) -> dict[str, Any]:
    head, _, body = got.partition(b"\r\n\r\n")
    assert b"content-type: application/json" in head.lower(), got[:300]
    error = json.loads(body)
    assert ERROR_KEYS <= set(error) and error["ok"] is False, error
    return error


@pytest.mark.parametrize("target", [
    "/api/v1/timers/q/k?txn=01a2\u2026".encode(),  # a '…' pasted from a document
    b"/api/v1/timers/q?after=\xff",
])
def test_a_raw_non_ascii_byte_in_the_query_string_gets_a_json_error(
    live_broker: BrokerProcess, target: bytes
) -> None:
    """h11 refuses the request line and hypercorn used to answer an empty 400; the answer is
    now the broker's JSON error."""
    got = b"".join(raw_request(live_broker.port, b"DELETE " + target + b" HTTP/1.1\r\n"
                               b"Host: localhost\r\nConnection: close\r\n\r\n"))
    assert got.startswith(b"HTTP/1.1 400"), got[:300]
    assert assert_raw_json_error(got)["error"] == "bad_request"


# -- late bodies and slow clients ---------------------------------------------------------------


@pytest.mark.parametrize(("method", "path"), [
    ("QUERY", "/health"),  # 405 from the route table
    ("POST", "/api/v1/lease/0/extend"),  # 404 before the handler reads the body
    ("PATCH", "/api/v1/push"),
])
def test_an_early_answer_closes_the_connection_and_never_hangs(
    live_broker: BrokerProcess, method: str, path: str
) -> None:
    """Headers first, the body later (as many clients write them: here once the answer's head
    has come, so that it surely is decided before the body arrived, however loaded the
    machine), then a second request on the same connection. The answer is decided from the
    headers alone: it says ``Connection: close`` and the connection ends, so the client sends
    its next request on a new one, which is answered. Nothing hangs, and the late body is never
    taken for a request. (With the body 20 ms after the head, under load the broker sometimes
    had it before answering, and rightly kept the connection.)

    Regressions: before 0b05bb2 hypercorn never answered the next request (found by
    schemathesis); then, to avoid that, the broker read every body before admission, until
    bodies came to be read only when a handler asks (test_request_bodies.py)."""
    body = b'{"seconds": 5, "a": 1}'
    head = (f"{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    got = b"".join(raw_request(live_broker.port, head, then=body + b"GET /health HTTP/1.1\r\n"
                               b"Host: localhost\r\n\r\n", then_after_answer=True,
                               answers=2))
    assert b"<timeout>" not in got, got[-300:]
    answer_head = got.split(b"\r\n\r\n", 1)[0].lower()
    assert got.startswith(b"HTTP/1.1 4") and b"connection: close" in answer_head, got[:600]
    assert got.count(b"HTTP/1.1 ") == 1, got[:600]  # then EOF: the late body was not a request
    assert httpx.get(f"{live_broker.url}/health", timeout=5).status_code == 200


def test_slow_loris_clients_do_not_starve_others(live_broker: BrokerProcess,
                                                 http: httpx.Client) -> None:
    """120 connections trickle their headers, 30 more their bodies, one byte every 200 ms;
    meanwhile ordinary requests are answered as fast as ever. (The broker drops a connection
    that has not finished its headers after keep_alive_timeout, and a body not received
    within Quart's BODY_TIMEOUT with 408: see RELIABILITY.md.)"""
    stop = threading.Event()
    socks: list[socket.socket] = []

    def trickle(s: socket.socket, data: bytes) -> None:
        try:
            for b in data:
                if stop.wait(0.2):
                    return
                s.send(bytes([b]))
        except OSError:
            pass

    threads = []
    for i in range(150):
        s = socket.create_connection(("127.0.0.1", live_broker.port), timeout=5)
        socks.append(s)
        if i < 120:
            s.send(b"GET /health HTTP/1.1\r\nHo")
            data = b"st: x\r\n" + b"X-Slow: " + string.ascii_letters.encode() * 4
        else:
            s.send(b"PUT /api/v1/kv/slow/k HTTP/1.1\r\nHost: localhost\r\n"
                   b"Content-Length: 100000\r\nContent-Type: application/json\r\n\r\n{")
            data = b'"value": "' + b"x" * 1000
        t = threading.Thread(target=trickle, args=(s, data), daemon=True)
        t.start()
        threads.append(t)
    try:
        latencies = []
        for i in range(40):
            started = time.perf_counter()
            r = http.put(f"{API}/kv/fast/k{i}", json={"value": i, "forever": True})
            latencies.append(time.perf_counter() - started)
            assert r.status_code == 200, r.text
            time.sleep(0.05)
        # Starved, a request would wait for the trickles (tens of seconds) or time out; a
        # loaded machine (two test workers at load ~10) puts single requests at up to ~1 s.
        assert statistics.median(latencies) < 0.5, sorted(latencies)
        assert max(latencies) < 3.0, sorted(latencies)[-5:]
        print(f"\n150 slow-loris connections open: 40 requests, max {max(latencies) * 1000:.0f} ms")
    finally:
        stop.set()
        for s in socks:
            s.close()
        for t in threads:
            t.join(2)
    assert live_broker.alive and http.get("/health").status_code == 200


@pytest.fixture(scope="module")
def impatient_broker(databases: Databases) -> Iterator[BrokerProcess]:
    """A broker with 2-second slow-client limits (75 s and 60 s by default), so the cut-offs
    themselves can be watched."""
    yield from start_broker(databases, "impatient", env={"QUEEN_HTTP_IDLE_TIMEOUT_S": "2",
                                                         "QUEEN_HTTP_BODY_TIMEOUT_S": "2"})


def _trickle_until_closed(port: int, first: bytes, rest: bytes, limit_s: float
                          ) -> tuple[float, bytes]:
    """Send ``first``, then ``rest`` one byte every 100 ms; (seconds until the broker ended the
    connection, what it answered). A reset is an end too: a connection cut off while bytes
    the broker never read were in its buffer is reset by the kernel, and whether one arrives
    before the cut-off is timing."""
    started = time.monotonic()
    got = b""
    with socket.create_connection(("127.0.0.1", port), timeout=limit_s) as s:
        s.sendall(first)
        s.settimeout(0.1)
        for b in rest:
            try:
                chunk = s.recv(65536)
                if not chunk:
                    break  # closed by the broker
                got += chunk
                if b"\r\n\r\n" in got and got.rstrip().endswith(b"}"):
                    break  # answered
            except TimeoutError:
                pass
            except ConnectionResetError:
                break  # closed by the broker
            try:
                s.send(bytes([b]))
            except OSError:
                break
            if time.monotonic() - started > limit_s:
                break
    return time.monotonic() - started, got


def test_a_request_head_that_never_ends_is_cut_off(impatient_broker: BrokerProcess) -> None:
    elapsed, got = _trickle_until_closed(
        impatient_broker.port, b"GET /health HTTP/1.1\r\nHo",
        b"st: x\r\nX-Slow: " + b"a" * 200, limit_s=10)
    assert 1.5 <= elapsed < 5, (elapsed, got[:200])
    assert b"HTTP/1.1 200" not in got


def test_a_request_body_that_never_ends_is_answered_408(impatient_broker: BrokerProcess) -> None:
    elapsed, got = _trickle_until_closed(
        impatient_broker.port,
        b"PUT /api/v1/kv/slow/k HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100000\r\n"
        b"Content-Type: application/json\r\n\r\n{", b'"value": "' + b"x" * 1000, limit_s=10)
    assert 1.5 <= elapsed < 5, (elapsed, got[:200])
    assert got.startswith(b"HTTP/1.1 408"), got[:300]
    r = httpx.get(f"{impatient_broker.url}/api/v1/kv/slow/k", timeout=5)
    assert r.json()["found"] is False  # nothing half-written

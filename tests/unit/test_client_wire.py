"""The SDK's lean HTTP/1.1 client and transport (queen_trio/client/wire.py) against small real
servers on local sockets: the requests they write, answer framings, keep-alive reuse,
connections the server closed, cut-off answers and cancellation. Each behaviour is checked
through both doors: :class:`LeanClient` (what the SDK uses) and httpx over
:class:`LeanTransport`."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest
import trio

from queen_trio.client.wire import LeanClient, LeanTransport

Handler = Callable[[trio.SocketStream, int], Awaitable[None]]
Maker = Callable[..., Any]


def via_httpx(base_url: str = "", **options: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=base_url, transport=LeanTransport(), **options)


@pytest.fixture(params=[LeanClient, via_httpx], ids=["lean-client", "httpx-lean-transport"])
def client(request: pytest.FixtureRequest) -> Maker:
    """Makes a client: ``client(base_url, timeout=...)``."""
    return request.param


async def read_request(stream: trio.SocketStream, buffer: bytearray) -> bytes:
    """One request (head and Content-Length body) from the stream; '' at end of stream."""
    while b"\r\n\r\n" not in buffer:
        chunk = await stream.receive_some(65536)
        if not chunk:
            return b""
        buffer += chunk
    end = buffer.index(b"\r\n\r\n") + 4
    head = bytes(buffer[:end])
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    while len(buffer) < end + length:
        buffer += await stream.receive_some(65536)
    request = bytes(buffer[:end + length])
    del buffer[:end + length]
    return request


async def serve(nursery: trio.Nursery, handler: Handler) -> tuple[str, list[int]]:
    """A server on a free port; answers each connection with ``handler(stream, n)``, n the
    connection's number. Returns its URL and the list of connections accepted so far."""
    accepted: list[int] = []

    async def on_connection(stream: trio.SocketStream) -> None:
        accepted.append(len(accepted))
        await handler(stream, accepted[-1])

    listeners = await nursery.start(
        functools.partial(trio.serve_tcp, on_connection, 0, host="127.0.0.1"))
    port = listeners[0].socket.getsockname()[1]
    return f"http://127.0.0.1:{port}", accepted


def keep_alive(answers: list[bytes]) -> Handler:
    """Answer requests on each connection with the given raw answers, in turn."""
    async def handler(stream: trio.SocketStream, n: int) -> None:
        buffer = bytearray()
        for answer in answers:
            if not await read_request(stream, buffer):
                return
            await stream.send_all(answer)
        await stream.aclose()
    return handler


async def test_framings_content_length_chunked_no_body_and_close_delimited(client: Maker) -> None:
    answers = [
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n"
        b'{"ok":true}',
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\nx-trailer: 1\r\n\r\n",
        b"HTTP/1.1 204 No Content\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nuntil the end",
    ]
    async with trio.open_nursery() as nursery:
        url, accepted = await serve(nursery, keep_alive(answers))
        async with client(url) as http:
            r = await http.put("/a", json={"delayMs": 5})
            assert (r.status_code, r.json()) == (200, {"ok": True})
            r = await http.get("/b")
            assert r.text == "hello, world"
            r = await http.get("/c")
            assert (r.status_code, r.content) == (204, b"")
            r = await http.get("/d")
            assert r.text == "until the end"
        assert len(accepted) == 1  # one kept-alive connection carried all four
        nursery.cancel_scope.cancel()


async def test_a_connection_the_server_closed_while_idle_is_not_reused(client: Maker) -> None:
    once = [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"]  # then the server closes
    async with trio.open_nursery() as nursery:
        url, accepted = await serve(nursery, keep_alive(once))
        async with client(url) as http:
            for _ in range(3):
                assert (await http.get("/")).text == "ok"
                await trio.sleep(0.05)  # the server's close arrives while the connection idles
        assert len(accepted) == 3
        nursery.cancel_scope.cancel()


async def test_an_answer_cut_off_is_an_error_for_the_retry_policy_to_judge(client: Maker) -> None:
    async def dies(stream: trio.SocketStream, n: int) -> None:
        await read_request(stream, bytearray())
        if n == 1:
            await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\npartial")
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        url, _ = await serve(nursery, dies)
        async with client(url) as http:
            with pytest.raises(httpx.RemoteProtocolError, match="without sending an answer"):
                await http.post("/push", json={"items": []})
            with pytest.raises(httpx.RemoteProtocolError, match="mid-answer"):
                await http.post("/push", json={"items": []})
        nursery.cancel_scope.cancel()


async def test_a_cancelled_request_leaves_no_connection_behind_for_the_next(client: Maker) -> None:
    async def slow_then_fast(stream: trio.SocketStream, n: int) -> None:
        buffer = bytearray()
        while await read_request(stream, buffer):
            if n == 0:
                await trio.sleep(10)  # the first connection's answer never comes in time
            await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nfast")

    async with trio.open_nursery() as nursery:
        url, accepted = await serve(nursery, slow_then_fast)
        async with client(url) as http:
            with trio.move_on_after(0.2) as scope:
                await http.get("/long-poll")
            assert scope.cancelled_caught
            # The late answer must never be read as the next request's.
            assert (await http.get("/next")).text == "fast"
        assert len(accepted) == 2
        nursery.cancel_scope.cancel()


async def test_connect_errors_and_read_timeouts_are_httpx_errors(client: Maker) -> None:
    with trio.socket.socket() as s:
        await s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    async with client() as http:
        with pytest.raises(httpx.ConnectError):
            await http.get(f"http://127.0.0.1:{port}/")

    async def silent(stream: trio.SocketStream, n: int) -> None:
        await trio.sleep(10)

    async with trio.open_nursery() as nursery:
        url, _ = await serve(nursery, silent)
        async with client(url, timeout=httpx.Timeout(5.0, read=0.2)) as http:
            with pytest.raises(httpx.ReadTimeout):
                await http.get("/")
        nursery.cancel_scope.cancel()


async def test_the_lean_client_writes_a_plain_http11_request_with_a_compact_json_body() -> None:
    seen: list[bytes] = []

    async def record(stream: trio.SocketStream, n: int) -> None:
        buffer = bytearray()
        while request := await read_request(stream, buffer):
            seen.append(request)
            await stream.send_all(b"HTTP/1.1 429 Too Many Requests\r\nretry-after: 2\r\n"
                                  b"content-type: application/json\r\ncontent-length: 13\r\n"
                                  b'\r\n{"error":"x"}')

    async with trio.open_nursery() as nursery:
        url, _ = await serve(nursery, record)
        async with LeanClient(url + "/", headers={"Authorization": "Bearer t0k"}) as http:
            answer = await http.put("/api/v1/timers/q/caf%C3%A9 k\u00e9", params={
                "txn": "a b&c", "wait": True, "none": None}, json={"delayMs": 5, "p": "é"})
            await http.get(url + "/api/v1/pop/queue/q", params={"timeout": 10})
            await http.post("/api/v1/ack")
        nursery.cancel_scope.cancel()
    assert (answer.status_code, answer.json(), answer.reason_phrase) == (
        429, {"error": "x"}, "Too Many Requests")
    assert (answer.headers.get("Retry-After"), answer.headers["content-type"]) == (
        "2", "application/json")
    assert "X-Missing" not in answer.headers and answer.headers.get("x-missing") is None

    head, body = seen[0].split(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    # Escaped as httpx would: what was already escaped stays so, the rest is escaped once.
    assert lines[0] == (b"PUT /api/v1/timers/q/caf%C3%A9%20k%C3%A9?txn=a%20b%26c&wait=true&none="
                        b" HTTP/1.1")
    headers = dict(line.split(b": ", 1) for line in lines[1:])
    assert headers[b"Host"] == url.removeprefix("http://").encode()
    assert headers[b"Authorization"] == b"Bearer t0k"
    assert headers[b"Content-Type"] == b"application/json"
    assert int(headers[b"Content-Length"]) == len(body)
    assert body == '{"delayMs":5,"p":"é"}'.encode()
    assert seen[1].startswith(b"GET /api/v1/pop/queue/q?timeout=10 HTTP/1.1\r\n")
    assert b"Content-Length" not in seen[1] and b"Content-Type" not in seen[1]
    # A POST without a body says so, or the server would wait for one.
    assert b"\r\nContent-Length: 0\r\n" in seen[2]


async def test_the_lean_client_refuses_nan_before_anything_is_sent() -> None:
    async with LeanClient("http://127.0.0.1:9") as http:  # nothing is ever connected
        with pytest.raises(ValueError):
            await http.put("/x", json={"delayMs": float("nan")})

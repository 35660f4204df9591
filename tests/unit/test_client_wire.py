"""The SDK's lean HTTP/1.1 transport (queen_trio/client/wire.py) against small real servers
on local sockets: answer framings, keep-alive reuse, connections the server closed, cut-off
answers and cancellation."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable

import httpx
import pytest
import trio

from queen_trio.client.wire import LeanTransport

Handler = Callable[[trio.SocketStream, int], Awaitable[None]]


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


async def test_framings_content_length_chunked_no_body_and_close_delimited() -> None:
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
        async with httpx.AsyncClient(base_url=url, transport=LeanTransport()) as http:
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


async def test_a_connection_the_server_closed_while_idle_is_not_reused() -> None:
    once = [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"]  # then the server closes
    async with trio.open_nursery() as nursery:
        url, accepted = await serve(nursery, keep_alive(once))
        async with httpx.AsyncClient(base_url=url, transport=LeanTransport()) as http:
            for _ in range(3):
                assert (await http.get("/")).text == "ok"
                await trio.sleep(0.05)  # the server's close arrives while the connection idles
        assert len(accepted) == 3
        nursery.cancel_scope.cancel()


async def test_an_answer_cut_off_is_an_error_for_the_retry_policy_to_judge() -> None:
    async def dies(stream: trio.SocketStream, n: int) -> None:
        await read_request(stream, bytearray())
        if n == 1:
            await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\npartial")
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        url, _ = await serve(nursery, dies)
        async with httpx.AsyncClient(base_url=url, transport=LeanTransport()) as http:
            with pytest.raises(httpx.RemoteProtocolError, match="without sending an answer"):
                await http.post("/push", json={"items": []})
            with pytest.raises(httpx.RemoteProtocolError, match="mid-answer"):
                await http.post("/push", json={"items": []})
        nursery.cancel_scope.cancel()


async def test_a_cancelled_request_leaves_no_connection_behind_for_the_next() -> None:
    async def slow_then_fast(stream: trio.SocketStream, n: int) -> None:
        buffer = bytearray()
        while await read_request(stream, buffer):
            if n == 0:
                await trio.sleep(10)  # the first connection's answer never comes in time
            await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nfast")

    async with trio.open_nursery() as nursery:
        url, accepted = await serve(nursery, slow_then_fast)
        async with httpx.AsyncClient(base_url=url, transport=LeanTransport()) as http:
            with trio.move_on_after(0.2) as scope:
                await http.get("/long-poll")
            assert scope.cancelled_caught
            # The late answer must never be read as the next request's.
            assert (await http.get("/next")).text == "fast"
        assert len(accepted) == 2
        nursery.cancel_scope.cancel()


async def test_connect_errors_and_read_timeouts_are_httpx_errors() -> None:
    with trio.socket.socket() as s:
        await s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    async with httpx.AsyncClient(transport=LeanTransport()) as http:
        with pytest.raises(httpx.ConnectError):
            await http.get(f"http://127.0.0.1:{port}/")

    async def silent(stream: trio.SocketStream, n: int) -> None:
        await trio.sleep(10)

    async with trio.open_nursery() as nursery:
        url, _ = await serve(nursery, silent)
        async with httpx.AsyncClient(base_url=url, transport=LeanTransport(),
                                     timeout=httpx.Timeout(5.0, read=0.2)) as http:
            with pytest.raises(httpx.ReadTimeout):
                await http.get("/")
        nursery.cancel_scope.cancel()

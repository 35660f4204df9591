"""A lean HTTP/1.1 transport for httpx: the SDK's plain-``http://`` requests, keep-alive.

httpx's default transport (httpcore's connection pool) costs about a millisecond per request on
top of the socket when the process has been idle, which is the common case for a long-polling
consumer woken by a message: measured against an empty quart-trio route after 50 ms of quiet,
a raw socket answers in 1.6 ms p50, httpcore's pool in 2.7 ms, httpx.AsyncClient in 3.1 ms.
This transport speaks just the HTTP/1.1 the broker speaks (Content-Length or chunked answers,
keep-alive) on anyio sockets, so it runs under trio and asyncio like the rest of the client.
``https://`` URLs go to httpx's own transport.

A connection goes back to the pool only after a whole answer was read; one interrupted for any
reason (cancellation included) is closed, never reused. Before an idle connection is reused it
is polled: readable means the broker closed it meanwhile, and it is dropped (as httpcore does).
A request whose answer is cut off raises ``httpx.RemoteProtocolError``, and the client's retry
policy decides, by the call's idempotency, whether to send it again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import select

import anyio
import anyio.abc
import httpx

_MAX_IDLE_PER_HOST = 64
_CHUNK = 65536
_MAX_HEAD = 64 * 1024


class _Closed(Exception):
    """End of stream before any byte of the answer."""


@dataclasses.dataclass(eq=False)
class _Connection:
    stream: anyio.abc.SocketStream
    buffer: bytearray = dataclasses.field(default_factory=bytearray)

    async def fill(self) -> None:
        try:
            chunk = await self.stream.receive(_CHUNK)
        except (anyio.EndOfStream, anyio.BrokenResourceError, OSError) as exc:
            raise _Closed from exc
        self.buffer += chunk

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
            await self.stream.aclose()

    def closed_by_peer(self) -> bool:
        """An idle connection with something to read has been closed (or is talking
        nonsense): either way it must not carry a request."""
        sock = self.stream.extra(anyio.abc.SocketAttribute.raw_socket)
        try:
            readable, _, _ = select.select([sock], [], [], 0)
        except (OSError, ValueError):
            return True
        return bool(readable)


class LeanTransport(httpx.AsyncBaseTransport):
    def __init__(self) -> None:
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        self._fallback: httpx.AsyncHTTPTransport | None = None

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.scheme != "http":
            if self._fallback is None:
                self._fallback = httpx.AsyncHTTPTransport()
            return await self._fallback.handle_async_request(request)
        timeouts = request.extensions.get("timeout", {})
        head, body = _encode(request), await request.aread()
        address = (request.url.host, request.url.port or 80)
        reused = await self._take(address)
        if reused is not None:
            try:
                return await self._exchange(reused, address, head, body, timeouts, request)
            except _Closed:
                pass  # sending failed: the broker had closed it and never read this request
        conn = await self._connect(address, timeouts.get("connect"))
        try:
            return await self._exchange(conn, address, head, body, timeouts, request)
        except _Closed as exc:
            raise httpx.WriteError("the connection closed while sending", request=request) \
                from exc

    async def aclose(self) -> None:
        idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                await conn.aclose()
        if self._fallback is not None:
            await self._fallback.aclose()

    # -- internals ----------------------------------------------------------------------

    async def _take(self, address: tuple[str, int]) -> _Connection | None:
        conns = self._idle.get(address)
        while conns:
            conn = conns.pop()
            if not conn.closed_by_peer():
                return conn
            await conn.aclose()
        return None

    async def _give_back(self, address: tuple[str, int], conn: _Connection) -> None:
        conns = self._idle.setdefault(address, [])
        if len(conns) < _MAX_IDLE_PER_HOST and not conn.buffer:
            conns.append(conn)
        else:
            await conn.aclose()

    async def _connect(self, address: tuple[str, int], limit_s: float | None) -> _Connection:
        try:
            with anyio.fail_after(limit_s):
                stream = await anyio.connect_tcp(*address)
        except TimeoutError as exc:
            raise httpx.ConnectTimeout(f"connecting to {address[0]}:{address[1]} timed out") \
                from exc
        except OSError as exc:
            raise httpx.ConnectError(str(exc)) from exc
        return _Connection(stream)

    async def _exchange(self, conn: _Connection, address: tuple[str, int], head: bytes,
                        body: bytes, timeouts: dict, request: httpx.Request) -> httpx.Response:
        done = False
        try:
            try:
                with anyio.fail_after(timeouts.get("write")):
                    await conn.stream.send(head + body)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
                raise _Closed from exc
            except TimeoutError as exc:
                raise httpx.WriteTimeout("sending the request timed out", request=request) \
                    from exc
            try:
                with anyio.fail_after(timeouts.get("read")):
                    status, headers, content, keep = await _read_answer(conn, request)
            except TimeoutError as exc:
                raise httpx.ReadTimeout("no answer in time", request=request) from exc
            done = True
        finally:
            if not done:
                await conn.aclose()
        if keep:
            await self._give_back(address, conn)
        else:
            await conn.aclose()
        return httpx.Response(status, headers=headers, content=content, request=request,
                              extensions={"http_version": b"HTTP/1.1"})


def _encode(request: httpx.Request) -> bytes:
    target = request.url.raw_path
    lines = [request.method.encode() + b" " + target + b" HTTP/1.1"]
    lines += [name + b": " + value for name, value in request.headers.raw]
    return b"\r\n".join(lines) + b"\r\n\r\n"


async def _read_answer(conn: _Connection, request: httpx.Request
                       ) -> tuple[int, list[tuple[bytes, bytes]], bytes, bool]:
    buf = conn.buffer
    started = bool(buf)
    while (end := buf.find(b"\r\n\r\n")) < 0:
        if len(buf) > _MAX_HEAD:
            raise httpx.RemoteProtocolError("answer head too large", request=request)
        try:
            await conn.fill()
        except _Closed:
            what = "mid-answer" if started or buf else "without sending an answer"
            raise httpx.RemoteProtocolError(f"the server disconnected {what}",
                                            request=request) from None
        started = True
    head = bytes(buf[:end]).split(b"\r\n")
    del buf[:end + 4]
    try:
        version, code = head[0].split(b" ", 2)[:2]
        status = int(code)
    except ValueError:
        raise httpx.RemoteProtocolError(f"bad status line {head[0]!r}", request=request) \
            from None
    headers: list[tuple[bytes, bytes]] = []
    length: int | None = None
    chunked = False
    keep = version == b"HTTP/1.1"
    for line in head[1:]:
        name, _, value = line.partition(b":")
        name, value = name.strip(), value.strip()
        headers.append((name, value))
        lower = name.lower()
        if lower == b"content-length":
            length = int(value)
        elif lower == b"transfer-encoding":
            chunked = b"chunked" in value.lower()
        elif lower == b"connection":
            keep = keep and value.lower() != b"close"
    try:
        if request.method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            content = b""
        elif chunked:
            content = await _read_chunked(conn)
        elif length is not None:
            while len(buf) < length:
                await conn.fill()
            content = bytes(buf[:length])
            del buf[:length]
        else:  # delimited by the end of the connection
            with contextlib.suppress(_Closed):
                while True:
                    await conn.fill()
            content, keep = bytes(buf), False
            buf.clear()
    except _Closed:
        raise httpx.RemoteProtocolError("connection closed mid-answer", request=request) \
            from None
    return status, headers, content, keep


async def _read_chunked(conn: _Connection) -> bytes:
    buf, out = conn.buffer, bytearray()
    while True:
        while (end := buf.find(b"\r\n")) < 0:
            await conn.fill()
        size = int(bytes(buf[:end]).split(b";", 1)[0], 16)
        del buf[:end + 2]
        if size == 0:
            while (end := buf.find(b"\r\n")) != 0:  # trailers, then the final empty line
                if end < 0:
                    await conn.fill()
                else:
                    del buf[:end + 2]
            del buf[:2]
            return bytes(out)
        while len(buf) < size + 2:
            await conn.fill()
        out += buf[:size]
        del buf[:size + 2]

"""The SDK's HTTP/1.1 client: plain-``http://`` JSON requests on keep-alive connections.

General HTTP clients cost more per request than a broker round trip can afford, most of all
when the process has been idle, which is the common case for a long-polling consumer woken by
a message. Measured against an empty quart-trio route after 50 ms of quiet: a raw socket
answers in 1.6 ms p50, httpcore's pool in 2.7 ms, httpx.AsyncClient in 3.1 ms; and a client's
CPU per PUT to the broker is 0.15 ms on a bare trio socket, 0.45 ms through httpx.AsyncClient
on this module's pool. :class:`LeanClient` writes the request head itself and reads just the
HTTP/1.1 the broker speaks (Content-Length or chunked answers, keep-alive) on anyio sockets, so
it runs under trio and asyncio like the rest of the client. :class:`LeanTransport` offers the
same pool to code that wants an ``httpx.AsyncClient``. ``https://`` goes to httpx.

A connection goes back to the pool only after a whole answer was read; one interrupted for any
reason (cancellation included) is closed, never reused. Before an idle connection is reused it
is polled: readable means the broker closed it meanwhile, and it is dropped (as httpcore does).
A request whose answer is cut off raises ``httpx.RemoteProtocolError``, and the client's retry
policy decides, by the call's idempotency, whether to send it again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http
import json as _json
import select
from importlib import metadata
from typing import Any
from urllib.parse import quote, urlsplit

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


class _Pool:
    """Keep-alive connections by (host, port), and one request-answer exchange on them."""

    def __init__(self) -> None:
        self._idle: dict[tuple[str, int], list[_Connection]] = {}

    async def exchange(self, address: tuple[str, int], message: bytes, method: str,
                       limits: _Limits, request: httpx.Request | None = None) -> _Raw:
        """Send ``message`` (head and body) and read the answer, on an idle connection if
        one is still good, else on a new one."""
        reused = await self._take(address)
        if reused is not None:
            try:
                return await self._exchange(reused, address, message, method, limits, request)
            except _Closed:
                pass  # sending failed: the broker had closed it and never read this request
        conn = await self._connect(address, limits.connect)
        try:
            return await self._exchange(conn, address, message, method, limits, request)
        except _Closed as exc:
            raise httpx.WriteError("the connection closed while sending", request=request) \
                from exc

    async def aclose(self) -> None:
        idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                await conn.aclose()

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

    async def _exchange(self, conn: _Connection, address: tuple[str, int], message: bytes,
                        method: str, limits: _Limits, request: httpx.Request | None) -> _Raw:
        done = False
        try:
            try:
                with anyio.fail_after(limits.write):
                    await conn.stream.send(message)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
                raise _Closed from exc
            except TimeoutError as exc:
                raise httpx.WriteTimeout("sending the request timed out", request=request) \
                    from exc
            try:
                with anyio.fail_after(limits.read):
                    raw = await _read_answer(conn, method, request)
            except TimeoutError as exc:
                raise httpx.ReadTimeout("no answer in time", request=request) from exc
            done = True
        finally:
            if not done:
                await conn.aclose()
        if raw.keep:
            await self._give_back(address, conn)
        else:
            await conn.aclose()
        return raw


@dataclasses.dataclass(frozen=True, slots=True)
class _Limits:
    connect: float | None
    read: float | None
    write: float | None

    @classmethod
    def of(cls, timeout: float | httpx.Timeout | None) -> _Limits:
        if timeout is None or isinstance(timeout, int | float):
            return cls(timeout, timeout, timeout)
        return cls(timeout.connect, timeout.read, timeout.write)


@dataclasses.dataclass(frozen=True, slots=True)
class _Raw:
    status: int
    headers: list[tuple[bytes, bytes]]
    content: bytes
    keep: bool


class LeanTransport(httpx.AsyncBaseTransport):
    """The lean connection pool behind httpx's interface, for code that wants an
    ``httpx.AsyncClient`` (the SDK itself goes through :class:`LeanClient`)."""

    def __init__(self) -> None:
        self._pool = _Pool()
        self._fallback: httpx.AsyncHTTPTransport | None = None

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.scheme != "http":
            if self._fallback is None:
                self._fallback = httpx.AsyncHTTPTransport()
            return await self._fallback.handle_async_request(request)
        timeouts = request.extensions.get("timeout", {})
        limits = _Limits(timeouts.get("connect"), timeouts.get("read"), timeouts.get("write"))
        message = _encode(request) + await request.aread()
        address = (request.url.host, request.url.port or 80)
        raw = await self._pool.exchange(address, message, request.method, limits, request)
        return httpx.Response(raw.status, headers=raw.headers, content=raw.content,
                              request=request, extensions={"http_version": b"HTTP/1.1"})

    async def aclose(self) -> None:
        await self._pool.aclose()
        if self._fallback is not None:
            await self._fallback.aclose()


class Headers:
    """An answer's headers: ``get`` by name, any case."""

    __slots__ = ("raw",)

    def __init__(self, raw: list[tuple[bytes, bytes]]) -> None:
        self.raw = raw

    def get(self, name: str, default: str | None = None) -> str | None:
        wanted = name.lower().encode("latin-1")
        for key, value in self.raw:
            if key.lower() == wanted:
                return value.decode("latin-1")
        return default

    def __getitem__(self, name: str) -> str:
        value = self.get(name)
        if value is None:
            raise KeyError(name)
        return value

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.get(name) is not None


class Answer:
    """What :class:`LeanClient` got back: the parts of ``httpx.Response`` the SDK reads."""

    __slots__ = ("content", "headers", "status_code")

    def __init__(self, status_code: int, headers: Headers, content: bytes) -> None:
        self.status_code = status_code
        self.headers = headers
        self.content = content

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    @property
    def reason_phrase(self) -> str:
        try:
            return http.HTTPStatus(self.status_code).phrase
        except ValueError:
            return ""

    @property
    def is_success(self) -> bool:
        return 200 <= self.status_code < 300

    def json(self) -> Any:
        return _json.loads(self.content)

    def __repr__(self) -> str:
        return f"<Answer [{self.status_code}]>"


# What may stay unescaped in a request target: RFC 3986's reserved and unreserved characters
# and '%' (paths arrive already percent-encoded; this only escapes what slipped through).
_TARGET_SAFE = "!#$%&'()*+,/:;=?@[]~"


class LeanClient:
    """The SDK's HTTP client: requests with JSON bodies, sent over :class:`_Pool`'s keep-alive
    connections with no per-request machinery beyond writing the head and reading the
    answer. ``https://`` goes to an ``httpx.AsyncClient``.

    It takes the subset of ``httpx.AsyncClient``'s interface the SDK and the benches use:
    ``request(method, url, params=, json=, timeout=)``, the verb shortcuts, ``aclose()``;
    ``url`` is absolute or relative to ``base_url``. Transport failures raise the same
    ``httpx.TransportError`` subclasses as httpx, so a retry policy written for httpx judges
    them alike.
    """

    def __init__(self, base_url: str = "", *, headers: dict[str, str] | None = None,
                 timeout: float | httpx.Timeout = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self._headers = dict(headers or {})
        self._fixed = "".join(f"{name}: {value}\r\n" for name, value in {
            "Accept": "*/*", "User-Agent": _USER_AGENT, **self._headers}.items())
        self._timeout = timeout
        self._pool = _Pool()
        self._origins: dict[str, tuple[tuple[str, int], str, str] | None] = {}
        self._fallback: httpx.AsyncClient | None = None

    async def request(self, method: str, url: str, *, params: dict[str, Any] | None = None,
                      json: Any = None,
                      timeout: float | httpx.Timeout | None = None,  # noqa: ASYNC109 - httpx's
                      ) -> Answer | httpx.Response:
        if self.base_url and not url.startswith(("http://", "https://")):
            url = self.base_url + url
        limit = self._timeout if timeout is None else timeout
        origin = self._origin(url)
        if origin is None:
            return await self._secure(method, url, params, json, limit)
        address, host, rest = origin
        target = rest if rest.isascii() and " " not in rest else quote(rest, safe=_TARGET_SAFE)
        if params:
            target += ("&" if "?" in target else "?") + _query(params)
        if json is None:  # as httpx: no body, not a JSON null
            body, typed = b"", ""
        else:
            body = _json.dumps(json, ensure_ascii=False, separators=(",", ":"),
                               allow_nan=False).encode()
            typed = "Content-Type: application/json\r\n"
        sized = f"Content-Length: {len(body)}\r\n" if body or method in _BODY_METHODS else ""
        head = f"{method} {target} HTTP/1.1\r\nHost: {host}\r\n{self._fixed}{typed}{sized}\r\n"
        raw = await self._pool.exchange(address, head.encode("latin-1") + body, method,
                                        _Limits.of(limit))
        return Answer(raw.status, Headers(raw.headers), raw.content)

    async def get(self, url: str, **options: Any) -> Answer | httpx.Response:
        return await self.request("GET", url, **options)

    async def put(self, url: str, **options: Any) -> Answer | httpx.Response:
        return await self.request("PUT", url, **options)

    async def post(self, url: str, **options: Any) -> Answer | httpx.Response:
        return await self.request("POST", url, **options)

    async def delete(self, url: str, **options: Any) -> Answer | httpx.Response:
        return await self.request("DELETE", url, **options)

    async def aclose(self) -> None:
        await self._pool.aclose()
        if self._fallback is not None:
            await self._fallback.aclose()

    async def __aenter__(self) -> LeanClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _origin(self, url: str) -> tuple[tuple[str, int], str, str] | None:
        """(address, Host header, path and query) of a plain-HTTP URL; None for https."""
        scheme, _, after = url.partition("://")
        authority, slash, rest = after.partition("/")
        if authority not in self._origins:
            self._origins[authority] = None if scheme != "http" else _address(authority)
        known = self._origins[authority]
        if known is None:
            return None
        return known[0], known[1], slash + rest if slash else "/"

    async def _secure(self, method: str, url: str, params: dict[str, Any] | None, body: Any,
                      limit: float | httpx.Timeout) -> httpx.Response:
        if self._fallback is None:
            self._fallback = httpx.AsyncClient(headers=self._headers)
        return await self._fallback.request(method, url, params=params, json=body,
                                            timeout=limit)


def _version() -> str:
    try:
        return metadata.version("queen-trio")
    except metadata.PackageNotFoundError:
        return "0"


_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
_USER_AGENT = f"queen-trio-python/{_version()}"


def _address(authority: str) -> tuple[tuple[str, int], str, str]:
    parsed = urlsplit(f"http://{authority}")
    if parsed.hostname is None:
        raise httpx.UnsupportedProtocol(f"no host in http://{authority}")
    return (parsed.hostname, parsed.port or 80), authority, ""


def _query(params: dict[str, Any]) -> str:
    def text(value: Any) -> str:
        if value is True or value is False:
            return "true" if value else "false"
        return "" if value is None else str(value)
    return "&".join(f"{quote(str(name), safe='')}={quote(text(value), safe='')}"
                    for name, value in params.items())


def _encode(request: httpx.Request) -> bytes:
    target = request.url.raw_path
    lines = [request.method.encode() + b" " + target + b" HTTP/1.1"]
    lines += [name + b": " + value for name, value in request.headers.raw]
    return b"\r\n".join(lines) + b"\r\n\r\n"


async def _read_answer(conn: _Connection, method: str, request: httpx.Request | None) -> _Raw:
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
        if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
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
    return _Raw(status, headers, content, keep)


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

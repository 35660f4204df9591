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
An answer is read as h11 reads it, and whatever h11 would refuse (a bad status or header line,
a bad chunk line or a chunk's data not followed by CRLF, a Content-Length that is not one
number, a Transfer-Encoding other than ``chunked``, a ``101``), like an answer cut off, raises
``httpx.RemoteProtocolError`` and closes the connection; the client's retry policy decides, by
the call's idempotency, whether to send the request again. Interim ``1xx`` answers are skipped.

A request that cannot be written as given raises before anything is sent, as httpx does: a
method or header name that is not a token, or a header value with a CR, LF or NUL, raises
``httpx.LocalProtocolError`` (:class:`LeanClient` checks its headers when it is made); a URL
with an ASCII control character raises ``httpx.InvalidURL``; a JSON body holding what JSON or
the broker cannot carry (NaN, an infinity, U+0000, an unpaired surrogate) raises
:class:`queen_trio.strict_json.JsonRefused`, a ValueError naming the value's path.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http
import math
import re
import select
import socket
import threading
import time
from importlib import metadata
from typing import Any, cast
from urllib.parse import quote, urlsplit

import anyio
import anyio.abc
import httpx
import trio

from .. import strict_json

_MAX_IDLE_PER_HOST = 64
_CHUNK = 65536
_MAX_HEAD = 64 * 1024
_TRIO_STREAMS = "anyio._backends._trio"  # the module of anyio's socket streams under trio


class _Closed(Exception):
    """End of stream before any byte of the answer."""


class _TimedOut(Exception):
    """A blocking connection's wait outlasted its exchange's deadline (:class:`_Deadline`)."""


@dataclasses.dataclass(eq=False)
class _Connection:
    stream: anyio.abc.SocketStream
    buffer: bytearray = dataclasses.field(default_factory=bytearray)
    _socket: Any = None  # the raw socket, looked up once (anyio builds its attributes per call)
    # A poll object with the socket registered, made once: a zero-timeout look through it
    # costs a quarter of a select() call, which builds its descriptor sets every time.
    _poller: Any = None
    # Under trio, the raw socket, read and written here with trio's own waits: anyio's trio
    # stream adds a pass through the scheduler after each write and read that went through
    # at once (trio's socket methods do), and its guards, on every call. (Under asyncio the
    # socket belongs to the event loop's transport: always through the stream.)
    direct: Any = None

    async def fill(self, *, wait: bool = False) -> None:
        """Read what has arrived, or wait for something; ``wait``: nothing can have arrived
        yet (a request was just sent), so wait before reading."""
        sock = self.direct
        if sock is None:
            try:
                chunk = await self.stream.receive(_CHUNK)
            except (anyio.EndOfStream, anyio.BrokenResourceError, OSError) as exc:
                raise _Closed from exc
        else:
            while True:
                if wait:
                    await trio.lowlevel.wait_readable(sock)
                try:
                    chunk = sock.recv(_CHUNK)
                except BlockingIOError:
                    wait = True
                    continue
                except OSError as exc:
                    raise _Closed from exc
                if not chunk:
                    raise _Closed
                break
        self.buffer += chunk

    async def send_at_once(self, data: bytes) -> bytes:
        """Write what the socket takes of ``data`` without waiting (under trio; a check for
        cancellation first); answers the rest, to :meth:`send`."""
        sock = self.direct
        if sock is None or not data:
            return data
        await trio.lowlevel.checkpoint_if_cancelled()
        try:
            return data[sock.send(data):]
        except BlockingIOError:
            return data

    async def send(self, data: bytes) -> None:
        sock = self.direct
        if sock is None:
            await self.stream.send(data)
            return
        view = memoryview(data)
        while view:
            try:
                view = view[sock.send(view):]
            except BlockingIOError:
                await trio.lowlevel.wait_writable(sock)

    def cancel_scope(self, limit_s: float | None) -> Any:
        """A scope ending ``limit_s`` from now (trio's own under trio: anyio's costs twice)."""
        if self.direct is None:
            return anyio.CancelScope(deadline=_deadline(limit_s))
        return trio.CancelScope(deadline=self.deadline(limit_s))

    def deadline(self, limit_s: float | None) -> float:
        if self.direct is None:
            return _deadline(limit_s)
        return math.inf if limit_s is None else trio.current_time() + limit_s

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
            await self.stream.aclose()

    def closed_by_peer(self) -> bool:
        """An idle connection with something to read has been closed (or is talking
        nonsense): either way it must not carry a request."""
        poller = self._poller
        try:
            if poller is None:
                sock = self._socket
                if sock is None:
                    sock = self._socket = self.stream.extra(
                        anyio.abc.SocketAttribute.raw_socket)
                poller = select.poll()
                poller.register(sock, select.POLLIN)
                self._poller = poller
            # Readable, at its end, in error or no longer open (POLLHUP, POLLERR and POLLNVAL
            # come whatever was asked): not to be used.
            return bool(poller.poll(0))
        except (OSError, ValueError):
            return True


class _Pool:
    """Keep-alive connections by (host, port), and one request-answer exchange on them."""

    def __init__(self) -> None:
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        # What the idle lists are taken from and given back under: nothing here (one event
        # loop's tasks cannot interleave between a look and a pop); a lock for the blocking
        # pool, whose calls may come from several threads.
        self._lock: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()

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
        with self._lock:
            idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                await conn.aclose()

    async def _take(self, address: tuple[str, int]) -> _Connection | None:
        while True:
            with self._lock:
                conns = self._idle.get(address)
                if not conns:
                    return None
                conn = conns.pop()
            if not conn.closed_by_peer():
                return conn
            await conn.aclose()

    async def _give_back(self, address: tuple[str, int], conn: _Connection) -> None:
        with self._lock:
            conns = self._idle.setdefault(address, [])
            if len(conns) < _MAX_IDLE_PER_HOST and not conn.buffer:
                conns.append(conn)
                return
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
        conn = _Connection(stream)
        if type(stream).__module__ == _TRIO_STREAMS:
            conn.direct = conn._socket = stream.extra(anyio.abc.SocketAttribute.raw_socket)
        return conn

    async def _exchange(self, conn: _Connection, address: tuple[str, int], message: bytes,
                        method: str, limits: _Limits, request: httpx.Request | None) -> _Raw:
        done = reading = False
        try:
            try:
                rest = await conn.send_at_once(message)
            except OSError as exc:
                raise _Closed from exc
            # One scope for both limits (a scope costs more than the rest of a small send):
            # its deadline moves from the write's to the read's once the request is out.
            reading = not rest
            with conn.cancel_scope(limits.read if reading else limits.write) as limit:
                if not reading:
                    try:
                        await conn.send(rest)
                    except (anyio.BrokenResourceError, anyio.ClosedResourceError,
                            OSError) as exc:
                        raise _Closed from exc
                    reading = True
                    limit.deadline = conn.deadline(limits.read)
                raw = await _read_answer(conn, method, request, sent=True)
                done = True
            if not done:  # the scope's own deadline passed
                if reading:
                    raise httpx.ReadTimeout("no answer in time", request=request)
                raise httpx.WriteTimeout("sending the request timed out", request=request)
        finally:
            if not done:
                await conn.aclose()
        if raw.keep:
            await self._give_back(address, conn)
        else:
            await conn.aclose()
        return raw


@dataclasses.dataclass(eq=False)
class _BlockingConnection(_Connection):
    """A connection of the sync client (``LeanClient(blocking=True)``): a blocking socket,
    each wait bounded by what is left of its exchange's deadline (:class:`_Deadline`). Its
    coroutines never suspend, so the SDK's sync facade runs them to the end in one step
    (client/blocking.py), and an idle process wakes from its own ``recv``, not through an
    event loop's."""

    deadline_at: float = math.inf  # time.monotonic()'s; set by the exchange's _Deadline

    async def fill(self, *, wait: bool = False) -> None:
        try:
            self.direct.settimeout(self._left())
            chunk = self.direct.recv(_CHUNK)
        except TimeoutError:
            raise _TimedOut from None
        except OSError as exc:
            raise _Closed from exc
        if not chunk:
            raise _Closed
        self.buffer += chunk

    async def send_at_once(self, data: bytes) -> bytes:
        return data  # (all of it through send, under the write's deadline)

    async def send(self, data: bytes) -> None:
        try:
            self.direct.settimeout(self._left())
            self.direct.sendall(data)
        except TimeoutError:  # (an OSError: the caller would take it for a closed socket)
            raise _TimedOut from None

    def cancel_scope(self, limit_s: float | None) -> _Deadline:
        return _Deadline(self, self.deadline(limit_s))

    def deadline(self, limit_s: float | None) -> float:
        return math.inf if limit_s is None else time.monotonic() + limit_s

    async def aclose(self) -> None:
        with contextlib.suppress(OSError):
            self.direct.close()

    def _left(self) -> float | None:
        if self.deadline_at == math.inf:
            return None
        left = self.deadline_at - time.monotonic()
        if left <= 0:
            raise _TimedOut
        return left


class _Deadline:
    """What a cancel scope is to :meth:`_Pool._exchange`, for a blocking connection: the
    deadline its waits keep (``deadline``, movable), and a wait that outlasted it caught on
    the way out, as a scope catches its own cancellation (the exchange then raises the
    timeout of the phase it was in)."""

    __slots__ = ("conn",)

    def __init__(self, conn: _BlockingConnection, deadline: float) -> None:
        self.conn = conn
        conn.deadline_at = deadline

    @property
    def deadline(self) -> float:
        return self.conn.deadline_at

    @deadline.setter
    def deadline(self, value: float) -> None:
        self.conn.deadline_at = value

    def __enter__(self) -> _Deadline:
        return self

    def __exit__(self, kind: type[BaseException] | None, *rest: object) -> bool:
        return kind is _TimedOut


class _BlockingPool(_Pool):
    """:class:`_Pool` over blocking sockets, for the sync client, whose calls may come from
    several threads at once: the idle lists are taken from and given back under a lock."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()

    async def _connect(self, address: tuple[str, int], limit_s: float | None) -> _Connection:
        try:
            sock = socket.create_connection(address, timeout=limit_s)
        except TimeoutError as exc:
            raise httpx.ConnectTimeout(f"connecting to {address[0]}:{address[1]} timed out") \
                from exc
        except OSError as exc:
            raise httpx.ConnectError(str(exc)) from exc
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # (as anyio's)
        return _BlockingConnection(cast(Any, None), direct=sock, _socket=sock)


def _deadline(limit_s: float | None) -> float:
    return math.inf if limit_s is None else anyio.current_time() + limit_s


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


@dataclasses.dataclass(slots=True)  # not frozen: a frozen __init__ costs 0.45 µs an answer
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
        return strict_json.loads(self.content)

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

    ``blocking=True``: the sync client's (:class:`~queen_trio.client.SyncClient`). The same
    requests and answers over blocking sockets, each wait bounded by the timeout, from any
    thread; its coroutines never suspend, so they are run to the end in one step
    (client/blocking.py) and need no event loop; ``https://`` goes to an ``httpx.Client``.
    """

    def __init__(self, base_url: str = "", *, headers: dict[str, str] | None = None,
                 timeout: float | httpx.Timeout = 10.0, blocking: bool = False) -> None:
        self.base_url = base_url.rstrip("/")
        self._headers = dict(headers or {})
        fixed = {"Accept": "*/*", "User-Agent": _USER_AGENT, **self._headers}
        for name, value in fixed.items():
            if _TEXT_TOKEN.fullmatch(name) is None or _TEXT_UNSAFE.search(str(value)):
                raise httpx.LocalProtocolError(f"illegal header {name!r}: {value!r}")
        self._fixed = "".join(f"{name}: {value}\r\n" for name, value in fixed.items())
        self._timeout = timeout
        self._pool = _BlockingPool() if blocking else _Pool()
        self._origins: dict[str, tuple[tuple[str, int], str, str] | None] = {}
        self._fallback: httpx.AsyncClient | None = None
        self._blocking_fallback: httpx.Client | None = None
        self._made_once = threading.Lock()
        self._blocking = blocking
        # The limits of the last timeout asked for (the same object call after call).
        self._limits: tuple[float | httpx.Timeout, _Limits] | None = None

    async def request(self, method: str, url: str, *, params: dict[str, Any] | None = None,
                      json: Any = None, content: bytes | None = None,
                      timeout: float | httpx.Timeout | None = None,  # noqa: ASYNC109 - httpx's
                      ) -> Answer | httpx.Response:
        """``json``: a body to encode (strictly: :func:`queen_trio.strict_json.dumps`);
        ``content``: a JSON body already encoded. None (both): no body."""
        if json is not None:
            content = strict_json.dumps(json)
        if self.base_url and not url.startswith(("http://", "https://")):
            url = self.base_url + url
        limit = self._timeout if timeout is None else timeout
        origin = self._origin(url)
        if origin is None:
            return await self._secure(method, url, params, content, limit)
        address, host, rest = origin
        if method not in _METHODS and _TEXT_TOKEN.fullmatch(method) is None:
            raise httpx.LocalProtocolError(f"illegal method {method!r}")
        if rest.isascii() and rest.isprintable() and " " not in rest:
            target = rest
        elif _CONTROL.search(rest):
            raise httpx.InvalidURL(f"invalid non-printable ASCII character in URL {url!r}")
        else:
            target = quote(rest, safe=_TARGET_SAFE)
        if params:
            target += ("&" if "?" in target else "?") + _query(params)
        if content is None:  # as httpx: no body, not a JSON null
            body, typed = b"", ""
        else:
            body, typed = content, "Content-Type: application/json\r\n"
        sized = f"Content-Length: {len(body)}\r\n" if body or method in _BODY_METHODS else ""
        head = f"{method} {target} HTTP/1.1\r\nHost: {host}\r\n{self._fixed}{typed}{sized}\r\n"
        limits = self._limits
        if limits is None or limits[0] is not limit:
            limits = self._limits = (limit, _Limits.of(limit))
        raw = await self._pool.exchange(address, head.encode("latin-1") + body, method,
                                        limits[1])
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
        if self._blocking_fallback is not None:
            self._blocking_fallback.close()
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

    async def _secure(self, method: str, url: str, params: dict[str, Any] | None,
                      content: bytes | None, limit: float | httpx.Timeout) -> httpx.Response:
        headers = None if content is None else {"Content-Type": "application/json"}
        if self._blocking:
            with self._made_once:  # (calls may come from several threads at once)
                if self._blocking_fallback is None:
                    self._blocking_fallback = httpx.Client(headers=self._headers)
            return self._blocking_fallback.request(method, url, params=params, content=content,
                                                   timeout=limit, headers=headers)
        if self._fallback is None:
            self._fallback = httpx.AsyncClient(headers=self._headers)
        return await self._fallback.request(method, url, params=params, content=content,
                                            timeout=limit, headers=headers)


def _version() -> str:
    try:
        return metadata.version("queen-trio")
    except metadata.PackageNotFoundError:
        return "0"


_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
# What a request must not carry: text that would end its line or its head early.
_TEXT_TOKEN = re.compile(r"[-!#$%&'*+.^_`|~0-9a-zA-Z]+")
_TEXT_UNSAFE = re.compile(r"[\x00\r\n]")
_UNSAFE = re.compile(rb"[\x00\r\n]")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_BAD_TARGET = re.compile(rb"[^\x21-\x7e]")
_USER_AGENT = f"queen-trio-python/{_version()}"


def _address(authority: str) -> tuple[tuple[str, int], str, str]:
    if _CONTROL.search(authority):
        raise httpx.InvalidURL(f"invalid non-printable ASCII character in URL "
                               f"http://{authority}")
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
    """The request's head, refused (``httpx.LocalProtocolError``, as httpx's own transport
    raises) if it could not be read back as the request it is."""
    method, target = request.method.encode(), request.url.raw_path
    if _TOKEN.fullmatch(method) is None:
        raise httpx.LocalProtocolError(f"illegal method {request.method!r}", request=request)
    if _BAD_TARGET.search(target):
        raise httpx.LocalProtocolError(f"illegal request target {target!r}", request=request)
    for name, value in request.headers.raw:
        if _TOKEN.fullmatch(name) is None or _UNSAFE.search(value):
            raise httpx.LocalProtocolError(f"illegal header {name!r}: {value!r}",
                                           request=request)
    lines = [method + b" " + target + b" HTTP/1.1"]
    lines += [name + b": " + value for name, value in request.headers.raw]
    return b"\r\n".join(lines) + b"\r\n\r\n"


# The answer's grammar, as h11 reads it (RFC 9112 with h11's leniencies: LF alone ends a head
# line, a status line may lack its reason, obs-fold continues a header line, a chunk line may
# carry extensions and trailing blanks). A head line keeps the CR before its LF, hence ``\r?``.
_TOKEN = re.compile(rb"[-!#$%&'*+.^_`|~0-9a-zA-Z]+")
_STATUS_LINE = re.compile(rb"HTTP/([0-9]\.[0-9]) ([0-9]{3})(?: [^\x00\n\r\x0b\x0c]*)?\r?")
_FIELD = (rb"(" + _TOKEN.pattern + rb"):[ \t]*((?:[^\x00\s]+(?:[ \t]+[^\x00\s]+)*)?)[ \t]*")
_FIELD_LINE = re.compile(_FIELD + rb"\r?")
_UNFOLDED_FIELD_LINE = re.compile(_FIELD)  # CRs already taken off
_CHUNK_LINE = re.compile(rb"([0-9A-Fa-f]{1,20})(?:;[^\n]*)?[ \t]*")  # before its CRLF
_HEAD_END = re.compile(rb"\n\r?\n")
_FOLD = re.compile(rb"[ \t]+")
_MAX_LENGTH_DIGITS = 20
_FRAMING = frozenset({b"content-length", b"transfer-encoding", b"connection"})
# Header names seen valid, lowercased: a line is then checked without a regex. Bounded, so a
# server making up names cannot grow it.
_NAMES: dict[bytes, bytes] = {}
_MAX_NAMES = 512
_CR_FOR_SUSPECTS = bytes.maketrans(b"\x00\x0b\x0c", b"\r\r\r")


def _take_head(buf: bytearray, start: int) -> bytes | None:
    """The lines before the first empty one, each with its LF (and CR if any), taken off
    ``buf`` with that empty line; None while it has not arrived, searching on from ``start``."""
    if buf and buf[0] in b"\r\n" and buf.startswith((b"\n", b"\r\n")):
        del buf[:1 if buf[0] == 10 else 2]
        return b""
    end = _HEAD_END.search(buf, start)
    if end is None:
        return None
    head = bytes(buf[:end.start() + 1])
    del buf[:end.end()]
    return head


async def _read_head(conn: _Connection, request: httpx.Request | None, started: bool, *,
                     wait: bool = False) -> bytes:
    """A head (or the trailers of a chunked body), read to its empty line; ``wait``: nothing
    of it can have arrived yet."""
    buf = conn.buffer
    searched = 0
    while (head := _take_head(buf, searched)) is None:
        if len(buf) > _MAX_HEAD:
            raise httpx.RemoteProtocolError("answer head too large", request=request)
        searched = max(0, len(buf) - 2)
        try:
            await conn.fill(wait=wait)
            wait = False
        except _Closed:
            what = "mid-answer" if started or buf else "without sending an answer"
            raise httpx.RemoteProtocolError(f"the server disconnected {what}",
                                            request=request) from None
        started = True
    return head


def _fields(head: bytes, lines: list[bytes], request: httpx.Request | None,
            ) -> tuple[list[tuple[bytes, bytes]], list[tuple[bytes, bytes]]]:
    """The header lines of ``head`` as (name, value) pairs, and the framing ones among them
    (name lowercased), read as h11 reads them. The common case costs no regex: a line is valid
    when its name is a token and what follows the colon holds no NUL, CR (but one at the end),
    LF, VT or FF, which ``head`` is checked for at once (they all count as a CR not before an
    LF)."""
    if head.translate(_CR_FOR_SUSPECTS).count(b"\r") == head.count(b"\r\n"):
        fields: list[tuple[bytes, bytes]] = []
        framing: list[tuple[bytes, bytes]] = []
        for line in lines:
            name, colon, value = line.partition(b":")
            lower = _NAMES.get(name)
            if lower is None:
                if _TOKEN.fullmatch(name) is None:
                    break  # or an obs-fold line: read one by one below
                lower = name.lower()
                if len(_NAMES) < _MAX_NAMES:
                    _NAMES[name] = lower
            if not colon:
                break
            value = value.strip(b" \t\r")
            fields.append((name, value))
            if lower in _FRAMING:
                framing.append((lower, value))
        else:
            return fields, framing
    fields = _checked_fields(lines, request)
    return fields, [(name.lower(), value) for name, value in fields
                    if name.lower() in _FRAMING]


def _checked_fields(lines: list[bytes],
                    request: httpx.Request | None) -> list[tuple[bytes, bytes]]:
    """Header lines read one by one: obs-fold continuations joined to their line by a space,
    the first line that h11 would refuse refused."""
    grammar = _FIELD_LINE
    if any(line.startswith((b" ", b"\t")) for line in lines):
        grammar, unfolded = _UNFOLDED_FIELD_LINE, []
        for line in lines:
            if line.endswith(b"\r"):
                line = line[:-1]
            fold = _FOLD.match(line)
            if fold is None:
                unfolded.append(line)
            elif unfolded:
                unfolded[-1] += b" " + line[fold.end():]
            else:
                raise httpx.RemoteProtocolError("continuation line at start of headers",
                                                request=request)
        lines = unfolded
    fields: list[tuple[bytes, bytes]] = []
    for line in lines:
        field = grammar.fullmatch(line)
        if field is None:
            raise httpx.RemoteProtocolError(f"bad header line {line!r}", request=request)
        fields.append((field[1], field[2]))
    return fields


def _framing(framing: list[tuple[bytes, bytes]],
             request: httpx.Request | None) -> tuple[int | None, bool, bool]:
    """(Content-Length, chunked, Connection: close) from the framing headers, checked as h11
    does: at most one Transfer-Encoding, and it is ``chunked``; every Content-Length (a header
    may list copies) the same number, of at most 20 digits."""
    length: bytes | None = None
    chunked = close = False
    for name, value in framing:
        if name == b"content-length":
            if not value.isdigit():
                values = {v.strip() for v in value.split(b",")}
                value = values.pop() if len(values) == 1 else b""
            if not value.isdigit() or len(value) > _MAX_LENGTH_DIGITS:
                raise httpx.RemoteProtocolError("bad Content-Length", request=request)
            if length is not None and length != value:
                raise httpx.RemoteProtocolError("conflicting Content-Length headers",
                                                request=request)
            length = value
        elif name == b"transfer-encoding":
            if chunked:
                raise httpx.RemoteProtocolError("more than one Transfer-Encoding",
                                                request=request)
            if value.lower() != b"chunked":
                raise httpx.RemoteProtocolError(f"unsupported Transfer-Encoding {value!r}",
                                                request=request)
            chunked = True
        elif b"close" in value.lower():  # Connection
            close = close or b"close" in [v.strip() for v in value.lower().split(b",")]
    return None if length is None else int(length), chunked, close


async def _read_answer(conn: _Connection, method: str, request: httpx.Request | None, *,
                       sent: bool = False) -> _Raw:
    """The answer to the request just sent, read as h11 would: whatever h11 refuses raises
    ``httpx.RemoteProtocolError`` (and the caller closes the connection). Interim (1xx)
    answers are skipped; a ``101`` is refused, as no upgrade was asked for."""
    buf = conn.buffer
    started = bool(buf)
    while True:
        head = _take_head(buf, 0)
        if head is None:
            head = await _read_head(conn, request, started, wait=sent and not buf)
        started = True
        lines = head.split(b"\n")
        status_line = _STATUS_LINE.fullmatch(lines[0]) if head else None
        if status_line is None:
            raise httpx.RemoteProtocolError(f"bad status line {lines[0]!r}", request=request)
        version, status = status_line[1], int(status_line[2])
        del lines[0], lines[-1]  # the status line, and the empty one after the last LF
        headers, framing = _fields(head, lines, request)
        length, chunked, close = _framing(framing, request)
        if status >= 200:
            break
        if status < 100 or status == 101:
            raise httpx.RemoteProtocolError(f"unexpected status {status}", request=request)
    keep = not close and version >= b"1.1"
    try:
        if status in (204, 304) or method == "HEAD" or (method == "CONNECT" and status < 300):
            content = b""
        elif chunked:  # Transfer-Encoding wins over Content-Length
            content = await _read_chunked(conn, request)
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
        raise httpx.RemoteProtocolError("the server disconnected mid-answer",
                                        request=request) from None
    return _Raw(status, headers, content, keep)


async def _read_chunked(conn: _Connection, request: httpx.Request | None) -> bytes:
    """A chunked body, as h11 reads it: hex sizes of at most 20 digits (extensions ignored),
    CRLF after each chunk's data, trailers checked and dropped."""
    buf, out = conn.buffer, bytearray()
    while True:
        while (end := buf.find(b"\r\n")) < 0:
            if len(buf) > _MAX_HEAD:
                raise httpx.RemoteProtocolError("chunk line too long", request=request)
            await conn.fill()
        size_line = _CHUNK_LINE.fullmatch(buf, 0, end)
        if size_line is None:
            raise httpx.RemoteProtocolError(f"bad chunk line {bytes(buf[:end])!r}",
                                            request=request)
        size = int(size_line[1], 16)
        del buf[:end + 2]
        if size == 0:
            break
        while len(buf) < size + 2:
            await conn.fill()
        if buf[size:size + 2] != b"\r\n":
            raise httpx.RemoteProtocolError("no CRLF after a chunk's data", request=request)
        out += buf[:size]
        del buf[:size + 2]
    trailers = await _read_head(conn, request, True)
    _framing(_fields(trailers, trailers.split(b"\n")[:-1], request)[1], request)  # checked
    return bytes(out)

"""The hottest lone calls answered before Quart: a schedule, a cancel, a push.

Quart's request machinery (a request context, its hooks, two tasks per request, the Response
object) costs the broker more CPU than a one-timer schedule's own work and its statement
(issue 32: one schedule or cancel through the SDK on an idle broker). :class:`FastRoutes` sits
in front of the Quart app as hypercorn's ASGI app and answers two routes itself:

- ``POST /api/v1/timers`` with a ``Content-Length`` body of at most :data:`MAX_BODY` bytes;
- ``DELETE /api/v1/timers/{queue}/{key}`` without a body or a query string;
- ``POST /api/v1/push`` as the timers' POST, while the tenant is under its storage gate
  (Quart refuses one over it before reading the body);
- ``POST /api/v1/ack`` (one acknowledgement) as the timers' POST.

It runs the very functions Quart's routes run (:func:`.timers.apply_batch`,
:func:`.timers.cancel_one`, :func:`.log.apply_push`, :func:`.log.apply_ack`), the same admission
(:func:`.tenancy.admit_tenant`), body budget and timeout (:class:`.bodies.RequestBody`), error
answers (:func:`.errors.exception_answer`, :func:`.errors.family_answer`) and metrics
(``queen_http_requests`` by the routes' own rule).
With QUEEN_AUTH=on the bearer token selects a cancel's tenant as Quart's hook does
(:func:`.tenancy.bearer_tenant`). Whatever it would have to decide differently from Quart goes
to Quart untouched, before anything is read or done: a schedule that could be refused before
its body is read (auth on, a request-rate quota), a request from a web page (``Origin``,
``Sec-Fetch-Site``) or for a host this broker may refuse, a path with percent-escapes, a query
string, a DELETE with a body, a chunked or larger body, debug mode.
tests/integration/test_fast_routes.py sends the same requests both ways and compares the
answers, headers and metrics.
"""

from __future__ import annotations

import functools
import os
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any, cast

import h11
import trio
from hypercorn.events import Closed, Event, RawData, Updated
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.typing import ASGIReceiveCallable, ASGISendCallable, HTTPScope, Scope
from quart_trio import QuartTrio
from werkzeug.exceptions import RequestTimeout

from ..context import BrokerContext
from ..errors import RequestError
from ..models import codec
from ..models import log as log_models
from . import bodies
from .common import Chores
from .connections import ASGI_SEND
from .errors import (
    ErrorAnswer,
    error_headers,
    error_json,
    exception_answer,
    family_answer,
    http_error_answer,
    object_via,
)
from .log import apply_ack, apply_push
from .origin import HostPolicy
from .tenancy import admit_tenant, bearer_tenant, storage_gate
from .timers import apply_batch, cancel_one
from .transaction import apply_transaction

#: Off: every request goes through Quart (tests compare the two paths).
ENABLED = True
#: The largest body answered here: a one-timer schedule is a few hundred bytes; a larger
#: request's own work outweighs what Quart costs.
MAX_BODY = 64 * 1024
#: Off: a whole request read by hypercorn still goes through h11 and ASGI (tests compare).
INLINE = True
#: Requests answered here, in this process (for tests and diagnostics); of them, those
#: answered on the connection's task (:meth:`FastRoutes.inline`).
answered = 0
inline_answered = 0

_TIMERS = "/api/v1/timers"
_PUSH = "/api/v1/push"
_ACK = "/api/v1/ack"
_TRANSACTION = "/api/v1/transaction"
#: The one query a transaction answered here may carry: the SDK's, for a bundle of timers.
_COMPACT_QUERY = b"answer=compact"
_CANCEL_PREFIX = _TIMERS + "/"
_FAMILY = "timers_bad_request"  # the timers blueprint's 400 code (install_family_errors)
_JSON = (b"content-type", b"application/json")
_DELEGATED_HEADERS = frozenset({b"origin", b"sec-fetch-site", b"transfer-encoding"})
_Handler = Callable[[ASGIReceiveCallable, ASGISendCallable], Awaitable[None]]


class FastRoutes:
    """The ASGI app hypercorn serves: the two routes here, everything else to ``app``."""

    def __init__(self, app: QuartTrio, broker: BrokerContext) -> None:
        install()
        self.app = app
        self.broker = broker
        self.hosts = HostPolicy.from_settings(broker.settings)
        self.body_timeout: float | None = app.config["BODY_TIMEOUT"]
        self.body_limit: int | None = app.config["MAX_CONTENT_LENGTH"]
        self.budget: bodies.BodyBudget = app.extensions[bodies.BUDGET]
        rules = {rule.endpoint: rule.rule for rule in app.url_map.iter_rules()}
        self.batch_rule, self.cancel_rule = rules["timers.batch"], rules["timers.cancel"]
        self.transaction_rule = rules["transaction.transaction"]
        self.push_rule = rules["log.push"]
        self.ack_rule = rules["log.ack"]

    async def __call__(self, scope: Scope, receive: ASGIReceiveCallable,
                       send: ASGISendCallable) -> None:
        if scope["type"] == "http" and ENABLED:
            handler = self._handler(scope)
            if handler is not None:
                await handler(receive, send)
                return
        elif scope["type"] == "websocket":
            # A streaming pop's WebSocket is then sent and received on hypercorn's side
            # without Quart's wrappers (api/connections.py DirectWebSocket).
            cast(dict[str, Any], scope)[ASGI_SEND] = send
        await self.app(scope, receive, send)

    def _handler(self, scope: HTTPScope, whole: bytes | None = None) -> _Handler | None:
        """What answers the request here, or None: Quart does. ``whole``: the body, read
        already (a request answered on its connection's task)."""
        method = scope["method"]
        if method == "POST" and scope["path"] == _TIMERS and self._never_refused_early():
            length = self._plain(scope, body=True)
            if length is not None:
                return functools.partial(self._batch, scope, length=length, whole=whole)
        elif (method == "POST" and scope["path"] == _PUSH and self._never_refused_early()
              and not self.broker.tenants.over_storage_gate(
                  self.broker.tenants.default_tenant_id)):
            length = self._plain(scope, body=True)
            if length is not None:
                return functools.partial(self._push, scope, length=length, whole=whole)
        elif method == "POST" and scope["path"] == _ACK and self._never_refused_early():
            length = self._plain(scope, body=True)
            if length is not None:
                return functools.partial(self._ack, scope, length=length, whole=whole)
        elif (method == "POST" and scope["path"] == _TRANSACTION and whole is None
              and scope["query_string"] == _COMPACT_QUERY and self._never_refused_early()):
            length = self._plain(scope, body=True, query=_COMPACT_QUERY,
                                 most=self.body_limit)
            if length is not None:
                return functools.partial(self._transaction, scope, length=length)
        elif method == "DELETE" and scope["path"].startswith(_CANCEL_PREFIX):
            queue, _, key = scope["path"][len(_CANCEL_PREFIX):].partition("/")
            if queue and key and self._plain(scope, body=False) is not None:
                return functools.partial(self._cancel, scope, queue=queue, key=key)
        return None

    async def inline(self, protocol: H11Protocol, data: bytes) -> bool:
        """Answer ``data``, hypercorn's read of an idle HTTP/1.1 connection, here on the
        connection's own task if it is one whole request for these routes that h11 would read
        as it is; False (nothing read, nothing sent) hands it to hypercorn as it came.

        hypercorn would parse it with h11, start a task for the app and pass the body and the
        answer through ASGI messages and h11 again: more of the broker's CPU per schedule than
        the route's own work, and scheduler passes before the statement leaves. The answer is
        written as hypercorn writes it (the same bytes: tests/integration/test_fast_routes.py),
        and the connection's bookkeeping is hypercorn's (idle clock, requests counted)."""
        connection = protocol.connection
        if (not (ENABLED and INLINE) or type(connection) is not h11.Connection
                or connection.our_state is not h11.IDLE or connection.their_state is not h11.IDLE
                or connection.trailing_data[0] or protocol.context.terminated.is_set()
                or protocol.keep_alive_requests + 1 >= protocol.config.keep_alive_max_requests
                or protocol.config.server_names):
            return False
        request = whole_request(data)
        if request is None:
            return False
        method, path, headers, body = request
        scope: Any = {"type": "http", "http_version": "1.1", "method": method, "path": path,
                      "raw_path": path.encode("ascii"), "query_string": b"",
                      "headers": headers, "client": protocol.client}
        handler = self._handler(scope, body)
        if handler is None:
            return False
        global inline_answered
        inline_answered += 1
        await protocol.send(Updated(idle=False))
        answer = _Written(protocol, body)
        await handler(answer.receive, answer.send)
        protocol.keep_alive_requests += 1
        await protocol.context.mark_request()
        if protocol.context.terminated.is_set():  # shutting down: as hypercorn, close it
            await protocol.send(Closed())
        else:
            await protocol.send(Updated(idle=True))
        return True

    def _never_refused_early(self) -> bool:
        """Whether a POST can be refused before its body is read (a token, a request-rate
        quota): then Quart answers it. Hypercorn closes a connection answered before the
        body was taken in, and Quart answers a few scheduler passes later than this would,
        so a body that came with its head keeps its connection there, and only there."""
        if self.broker.settings.auth:
            return False
        tenants = self.broker.tenants
        return tenants.plan(tenants.default_tenant_id).requests_per_second is None

    def _plain(self, scope: HTTPScope, *, body: bool, query: bytes = b"",
               most: int | None = MAX_BODY) -> int | None:
        """The request's Content-Length (0: none) when nothing about it needs Quart, else
        None. ``query``: the one query string allowed; ``most``: the largest body (None: the
        app's limit alone)."""
        raw = scope.get("raw_path") or b""
        if scope["query_string"] != query or b"%" in raw or not raw.isascii() or self.app.debug:
            return None
        length, host = 0, None
        for name, value in scope["headers"]:
            if name in _DELEGATED_HEADERS:
                return None
            if name == b"content-length":
                if not value.isdigit() or length:
                    return None
                length = int(value)
            elif name == b"host":
                if host is not None:
                    return None
                host = value.decode("latin-1")
        if not self.hosts.allows(host):
            return None
        if body:
            limit = most if self.body_limit is None else min(most or self.body_limit,
                                                              self.body_limit)
            return length if 0 < length and (limit is None or length <= limit) else None
        return 0 if length == 0 else None

    async def _batch(self, scope: HTTPScope, receive: ASGIReceiveCallable,
                     send: ASGISendCallable, *, length: int, whole: bytes | None = None
                     ) -> None:
        async def apply(tenant_id: int, raw: bytes, later: Chores) -> bytes:
            return codec.encode(await apply_batch(self.broker, tenant_id, raw, later)) + b"\n"

        await self._with_body(scope, receive, send, length=length, whole=whole, apply=apply,
                              path=_TIMERS, rule=self.batch_rule, family=_FAMILY)

    async def _push(self, scope: HTTPScope, receive: ASGIReceiveCallable,
                    send: ASGISendCallable, *, length: int, whole: bytes | None = None) -> None:
        async def apply(tenant_id: int, raw: bytes, later: Chores) -> bytes:
            # (The gate again: it may have closed since the request was routed here.)
            storage_gate(self.broker, tenant_id)
            body = object_via(raw, log_models.PUSH_DECODER)
            ceiling = self.broker.tenants.message_ceiling(tenant_id)
            return codec.encode(await apply_push(self.broker, tenant_id, body, ceiling,
                                                 later)) + b"\n"

        await self._with_body(scope, receive, send, length=length, whole=whole, apply=apply,
                              path=_PUSH, rule=self.push_rule, ok=201)

    async def _ack(self, scope: HTTPScope, receive: ASGIReceiveCallable,
                   send: ASGISendCallable, *, length: int, whole: bytes | None = None) -> None:
        async def apply(tenant_id: int, raw: bytes, later: Chores) -> bytes:
            body = object_via(raw, log_models.ACK_DECODER)
            return codec.encode(await apply_ack(self.broker, tenant_id, body, later)) + b"\n"

        await self._with_body(scope, receive, send, length=length, whole=whole, apply=apply,
                              path=_ACK, rule=self.ack_rule)

    async def _with_body(self, scope: HTTPScope, receive: ASGIReceiveCallable,
                         send: ASGISendCallable, *, length: int, whole: bytes | None,
                         apply: Callable[[int, bytes, Chores], Awaitable[bytes]], path: str,
                         rule: str,
                         family: str | None = None, ok: int = 200) -> None:
        """A POST whose body ``apply`` answers, for the request's tenant (``ok`` its status;
        ``family``: the 400 code of the route's blueprint, install_family_errors). ``whole``:
        the body, already read (answered on the connection's task): taken as :meth:`_read`
        takes a last message, without its timeout's cancel scope."""
        started = time.perf_counter()
        later: Chores = []
        held = 0  # bytes of ``whole`` taken from the budget here
        body: bodies.RequestBody | None = None
        try:
            try:
                tenant_id = await self._tenant(scope)
                admit_tenant(self.broker, tenant_id)
                if whole is not None and self.budget.take(len(whole)):
                    # What a RequestBody does with a whole body its limit allows (``_plain``
                    # checked the length), without its events: held against the budget
                    # until the request ends.
                    held, raw = len(whole), whole
                else:
                    body = bodies.RequestBody(length, self.body_limit)
                    body.budget = self.budget
                    if whole is not None:
                        body.append(whole)  # refused by the budget: answered now
                        if not body.finished:
                            body.set_complete()
                    elif not await self._read(receive, body):
                        return  # the client went away: Quart answers nothing either
                    raw = body.whole()
                answer: bytes | ErrorAnswer = await apply(tenant_id, raw, later)
            finally:
                if held:
                    self.budget.give(held)
                if body is not None:
                    body.clear()
        except RequestError as exc:
            answer = exception_answer(exc, "POST", path)
            if family is not None:
                answer = family_answer(family, answer)
        except RequestTimeout as exc:
            answer = http_error_answer(exc, "POST", path)
        except Exception as exc:  # noqa: BLE001 - answered as Quart's handler answers it
            answer = exception_answer(exc, "POST", path)
        await self._answer(send, rule, "POST", answer, started, ok, later)

    async def _transaction(self, scope: HTTPScope, receive: ASGIReceiveCallable,
                           send: ASGISendCallable, *, length: int) -> None:
        """``POST /api/v1/transaction?answer=compact`` (the SDK's bundles of timers): what
        Quart's route does (:func:`.transaction.apply_transaction`), its body read as
        :meth:`_batch` reads one."""
        started = time.perf_counter()
        status = 200
        body = bodies.RequestBody(length, self.body_limit)
        body.budget = self.budget
        try:
            try:
                tenant_id = await self._tenant(scope)
                admit_tenant(self.broker, tenant_id)
                if not await self._read(receive, body):
                    return  # the client went away: Quart answers nothing either
                model, status = await apply_transaction(self.broker, tenant_id, body.whole(),
                                                        compact=True)
                answer: bytes | ErrorAnswer = codec.encode(model) + b"\n"
            finally:
                body.clear()
        except RequestError as exc:
            answer = exception_answer(exc, "POST", _TRANSACTION)
        except RequestTimeout as exc:
            answer = http_error_answer(exc, "POST", _TRANSACTION)
        except Exception as exc:  # noqa: BLE001 - answered as Quart's handler answers it
            answer = exception_answer(exc, "POST", _TRANSACTION)
        await self._answer(send, self.transaction_rule, "POST", answer, started, status)

    async def _tenant(self, scope: HTTPScope) -> int:
        """The request's tenant, as Quart's before-request hook finds it (admit_request)."""
        if not self.broker.settings.auth:
            return self.broker.tenants.default_tenant_id
        authorization = next((value.decode("latin-1") for name, value in scope["headers"]
                              if name == b"authorization"), None)
        client = scope.get("client") or ("<local>", 0)  # Quart's Remote-Addr
        return await bearer_tenant(self.broker, authorization, client[0])

    async def _read(self, receive: ASGIReceiveCallable, body: bodies.RequestBody) -> bool:
        """The whole body into ``body`` (its limit and the budget apply), within the body
        timeout (else RequestTimeout, a 408 as Quart answers); False if the client left."""
        timeout = float("inf") if self.body_timeout is None else self.body_timeout
        with trio.move_on_after(timeout) as scope:
            while True:
                message: Any = await receive()
                if message["type"] != "http.request":
                    return False  # http.disconnect
                body.append(message.get("body", b""))
                if body.finished:  # refused (the budget): answered now, as Quart does
                    return True
                if not message.get("more_body", False):
                    body.set_complete()
                    return True
        assert scope.cancelled_caught
        raise RequestTimeout()

    async def _cancel(self, scope: HTTPScope, receive: ASGIReceiveCallable,
                      send: ASGISendCallable, *, queue: str, key: str) -> None:
        started = time.perf_counter()
        later: Chores = []
        path = _CANCEL_PREFIX + queue + "/" + key
        try:
            tenant_id = await self._tenant(scope)
            answer: bytes | ErrorAnswer = codec.encode(await cancel_one(
                self.broker, tenant_id, queue, key, None, later)) + b"\n"
        except RequestError as exc:
            answer = family_answer(_FAMILY, exception_answer(exc, "DELETE", path))
        except Exception as exc:  # noqa: BLE001 - answered as Quart's handler answers it
            answer = exception_answer(exc, "DELETE", path)
        await self._answer(send, self.cancel_rule, "DELETE", answer, started, later=later)

    async def _answer(self, send: ASGISendCallable, rule: str, method: str,
                      answer: bytes | ErrorAnswer, started: float, ok: int = 200,
                      later: Chores | None = None) -> None:
        """Send the answer as Quart's Response would (Content-Type, Content-Length, then the
        error's own headers), and count it as the app's after-request hook does.

        ``later``: the request's bookkeeping (its metrics), done once the answer is written
        on the connection's task (:class:`_Written`): the client waits for none of it, and it
        is done before anything else runs (no pass through the scheduler between the write
        and it), so a metrics scrape that follows the answer still finds it counted.
        Otherwise it is done before the answer leaves, as it was."""
        global answered
        answered += 1
        if isinstance(answer, ErrorAnswer):
            status = answer.status
            content = error_json(answer.code, answer.message, **answer.extra)
            extra = [(name.lower().encode("latin-1"), value.encode("latin-1"))
                     for name, value in error_headers(status, answer.headers).items()]
        else:
            status, content, extra = ok, answer, []
        headers = [_JSON, (b"content-length", str(len(content)).encode()), *extra]
        chores = [] if later is None else later
        chores.append(functools.partial(self.broker.metrics.count_http, rule, method, status,
                                        time.perf_counter() - started))
        written = getattr(send, "__self__", None)
        if type(written) is _Written:
            written.after = chores
        else:
            for chore in chores:
                chore()
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": content, "more_body": False})



class _Written:
    """The ASGI ``receive`` and ``send`` of a request answered on its connection's task: the
    body as one message, the answer written as hypercorn writes it (its head, with hypercorn's
    own headers after the app's, and the body in one write)."""

    __slots__ = ("after", "body", "protocol", "status", "headers")

    def __init__(self, protocol: H11Protocol, body: bytes) -> None:
        self.protocol, self.body = protocol, body
        self.status, self.headers = 500, b""
        self.after: Chores = []  # done once the answer has been handed to the socket

    async def receive(self) -> Any:
        return {"type": "http.request", "body": self.body, "more_body": False}

    async def send(self, message: Any) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            self.headers = b"".join(
                b"%s: %s\r\n" % field for field in
                [*message["headers"], *self.protocol.config.response_headers("h11")])
            return
        data = b"HTTP/1.1 %d \r\n%s\r\n%s" % (self.status, self.headers,
                                                message.get("body", b""))
        rest = _write_at_once(self.protocol, data)
        # Before any await: what a later request of this client could read (a metric) is up
        # to date before this task lets another run; the client's whole answer, when the
        # socket took only part of it, comes after that too.
        for chore in self.after:
            chore()
        if rest:
            await self.protocol.send(RawData(rest))


def _write_at_once(protocol: H11Protocol, data: bytes) -> bytes:
    """Write what the socket takes of ``data`` now, if hypercorn's plain-TCP connection is
    free to be written (its send lock free); answers what is left for hypercorn's own write
    (all of it when nothing could be written here, on any error included: that write meets
    it again and handles it as hypercorn does).

    hypercorn's write takes the send lock, enters two shielded scopes and trio's stream
    guards before the bytes leave, then passes through the scheduler: on a lone call's path
    (the client waits for these bytes) that cost more than the route's own answer. Nothing
    awaits between the lock's check and the write, so no other write can interleave."""
    server = getattr(protocol.send, "__self__", None)
    if type(server) is not TCPServer or server.send_lock.locked():
        return data
    stream: Any = server.stream  # (typed as TLS's by hypercorn, whatever it is)
    if type(stream) is not trio.SocketStream:  # (TLS: hypercorn's own write)
        return data
    try:
        sent = os.write(stream.socket.fileno(), data)
    except OSError:  # (BlockingIOError included: the socket's buffer is full)
        return data
    return data[sent:]


# A request h11 reads as it is, in the plainest spelling: the request line, then header lines
# (a token, a colon, a value of visible ASCII with single spaces or tabs inside), CRLF each.
# Anything else (obs-fold, control bytes, bare LFs, 8-bit text) is left to h11.
_REQUEST_LINE = re.compile(rb"(POST|DELETE) (/[\x21-\x7e]*) HTTP/1\.1")
_HEADER_LINE = re.compile(
    rb"([-!#$%&'*+.^_`|~0-9a-zA-Z]+):[ \t]*([\x21-\x7e](?:[ \t]?[\x21-\x7e])*)?[ \t]*")
# Whatever h11 or hypercorn would act on besides the request itself (but "Connection:
# keep-alive", which HTTP/1.1 means anyway: httpx sends it).
_LEFT_TO_H11 = frozenset({b"connection", b"expect", b"upgrade", b"transfer-encoding"})
_MAX_HEAD = 16 * 1024  # h11's own bound on a head
# Header lines seen valid, as read: a client sends the same few again and again. Bounded, so
# a client making lines up cannot grow it.
_LINES: dict[bytes, tuple[bytes, bytes]] = {}
_MAX_LINES = 512


def whole_request(data: bytes) -> tuple[str, str, list[tuple[bytes, bytes]], bytes] | None:
    """(method, path, headers as h11 gives them: names lowercased, body) of ``data`` if it is
    exactly one HTTP/1.1 POST or DELETE, head and whole body (by its Content-Length), with no
    query string and no percent-escape, spelled so that h11 reads it as it is; else None."""
    end = data.find(b"\r\n\r\n")
    if end < 0 or end > _MAX_HEAD:
        return None
    lines = data[:end].split(b"\r\n")
    line = _REQUEST_LINE.fullmatch(lines[0])
    if line is None or b"?" in line[2] or b"%" in line[2]:
        return None
    headers: list[tuple[bytes, bytes]] = []
    length, sized, hosts = 0, False, 0
    for raw in lines[1:]:
        known = _LINES.get(raw)
        if known is None:
            field = _HEADER_LINE.fullmatch(raw)
            if field is None:
                return None
            known = field[1].lower(), field[2] or b""
            if len(_LINES) < _MAX_LINES:
                _LINES[raw] = known
        name, value = known
        if name in _LEFT_TO_H11 and not (name == b"connection"
                                         and value.lower() == b"keep-alive"):
            return None
        if name == b"content-length":
            if sized or not value.isdigit() or len(value) > 20:
                return None
            length, sized = int(value), True
        elif name == b"host":
            hosts += 1
        headers.append((name, value))
    body = data[end + 4:]
    if hosts != 1 or len(body) != length:
        return None
    return line[1].decode("ascii"), line[2].decode("ascii"), headers, body


_ORIGINAL_HANDLE = H11Protocol.handle


async def _handle(self: H11Protocol, event: Event) -> None:
    """hypercorn's ``H11Protocol.handle``, with what :meth:`FastRoutes.inline` answers taken
    first."""
    if type(event) is RawData and self.stream is None:
        routes = getattr(self.app, "app", None)  # (hypercorn's ASGIWrapper of the app)
        if type(routes) is FastRoutes and await routes.inline(self, event.data):
            return
    await _ORIGINAL_HANDLE(self, event)


def install() -> None:
    """Let :class:`FastRoutes` answer whole requests on hypercorn's connection tasks
    (idempotent; only a connection whose app is a FastRoutes is affected)."""
    if H11Protocol.handle is not _handle:
        H11Protocol.handle = _handle  # type: ignore[method-assign]

"""The hottest timer routes answered before Quart: a lone schedule and a lone cancel.

Quart's request machinery (a request context, its hooks, two tasks per request, the Response
object) costs the broker more CPU than a one-timer schedule's own work and its statement
(issue 32: one schedule or cancel through the SDK on an idle broker). :class:`FastRoutes` sits
in front of the Quart app as hypercorn's ASGI app and answers two routes itself:

- ``POST /api/v1/timers`` with a ``Content-Length`` body of at most :data:`MAX_BODY` bytes;
- ``DELETE /api/v1/timers/{queue}/{key}`` without a body or a query string.

It runs the very functions Quart's routes run (:func:`.timers.apply_batch`,
:func:`.timers.cancel_one`), the same admission (:func:`.tenancy.admit_tenant`), body budget
and timeout (:class:`.bodies.RequestBody`), error answers (:func:`.errors.exception_answer`,
:func:`.errors.family_answer`) and metrics (``queen_http_requests`` by the routes' own rule).
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

import time
from typing import Any

import trio
from hypercorn.typing import ASGIReceiveCallable, ASGISendCallable, HTTPScope, Scope
from quart_trio import QuartTrio
from werkzeug.exceptions import RequestTimeout

from ..context import BrokerContext
from ..errors import RequestError
from ..models import codec
from . import bodies
from .errors import (
    ErrorAnswer,
    error_headers,
    error_json,
    exception_answer,
    family_answer,
    http_error_answer,
)
from .origin import HostPolicy
from .tenancy import admit_tenant, bearer_tenant
from .timers import apply_batch, cancel_one

#: Off: every request goes through Quart (tests compare the two paths).
ENABLED = True
#: The largest body answered here: a one-timer schedule is a few hundred bytes; a larger
#: request's own work outweighs what Quart costs.
MAX_BODY = 64 * 1024
#: Requests answered here, in this process (for tests and diagnostics).
answered = 0

_TIMERS = "/api/v1/timers"
_CANCEL_PREFIX = _TIMERS + "/"
_FAMILY = "timers_bad_request"  # the timers blueprint's 400 code (install_family_errors)
_JSON = (b"content-type", b"application/json")
_DELEGATED_HEADERS = frozenset({b"origin", b"sec-fetch-site", b"transfer-encoding"})


class FastRoutes:
    """The ASGI app hypercorn serves: the two routes here, everything else to ``app``."""

    def __init__(self, app: QuartTrio, broker: BrokerContext) -> None:
        self.app = app
        self.broker = broker
        self.hosts = HostPolicy.from_settings(broker.settings)
        self.body_timeout: float | None = app.config["BODY_TIMEOUT"]
        self.body_limit: int | None = app.config["MAX_CONTENT_LENGTH"]
        self.budget: bodies.BodyBudget = app.extensions[bodies.BUDGET]
        rules = {rule.endpoint: rule.rule for rule in app.url_map.iter_rules()}
        self.batch_rule, self.cancel_rule = rules["timers.batch"], rules["timers.cancel"]

    async def __call__(self, scope: Scope, receive: ASGIReceiveCallable,
                       send: ASGISendCallable) -> None:
        if scope["type"] == "http" and ENABLED:
            method = scope["method"]
            if method == "POST" and scope["path"] == _TIMERS and self._never_refused_early():
                length = self._plain(scope, body=True)
                if length is not None:
                    await self._batch(scope, receive, send, length)
                    return
            elif method == "DELETE" and scope["path"].startswith(_CANCEL_PREFIX):
                queue, _, key = scope["path"][len(_CANCEL_PREFIX):].partition("/")
                if queue and key and self._plain(scope, body=False) is not None:
                    await self._cancel(scope, send, queue, key)
                    return
        await self.app(scope, receive, send)

    def _never_refused_early(self) -> bool:
        """Whether a POST can be refused before its body is read (a token, a request-rate
        quota): then Quart answers it. Hypercorn closes a connection answered before the
        body was taken in, and Quart answers a few scheduler passes later than this would,
        so a body that came with its head keeps its connection there, and only there."""
        if self.broker.settings.auth:
            return False
        tenants = self.broker.tenants
        return tenants.plan(tenants.default_tenant_id).requests_per_second is None

    def _plain(self, scope: HTTPScope, *, body: bool) -> int | None:
        """The request's Content-Length (0: none) when nothing about it needs Quart, else
        None."""
        raw = scope.get("raw_path") or b""
        if scope["query_string"] or b"%" in raw or not raw.isascii() or self.app.debug:
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
            limit = MAX_BODY if self.body_limit is None else min(MAX_BODY, self.body_limit)
            return length if 0 < length <= limit else None
        return 0 if length == 0 else None

    async def _batch(self, scope: HTTPScope, receive: ASGIReceiveCallable,
                     send: ASGISendCallable, length: int) -> None:
        started = time.perf_counter()
        body = bodies.RequestBody(length, self.body_limit)
        body.budget = self.budget
        try:
            try:
                tenant_id = await self._tenant(scope)
                admit_tenant(self.broker, tenant_id)
                if not await self._read(receive, body):
                    return  # the client went away: Quart answers nothing either
                raw = body.whole()
                answer: bytes | ErrorAnswer = codec.encode(
                    await apply_batch(self.broker, tenant_id, raw)) + b"\n"
            finally:
                body.clear()
        except RequestError as exc:
            answer = family_answer(_FAMILY, exception_answer(exc, "POST", _TIMERS))
        except RequestTimeout as exc:
            answer = http_error_answer(exc, "POST", _TIMERS)
        except Exception as exc:  # noqa: BLE001 - answered as Quart's handler answers it
            answer = exception_answer(exc, "POST", _TIMERS)
        await self._answer(send, self.batch_rule, "POST", answer, started)

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

    async def _cancel(self, scope: HTTPScope, send: ASGISendCallable, queue: str,
                      key: str) -> None:
        started = time.perf_counter()
        path = _CANCEL_PREFIX + queue + "/" + key
        try:
            tenant_id = await self._tenant(scope)
            answer: bytes | ErrorAnswer = codec.encode(await cancel_one(
                self.broker, tenant_id, queue, key, None)) + b"\n"
        except RequestError as exc:
            answer = family_answer(_FAMILY, exception_answer(exc, "DELETE", path))
        except Exception as exc:  # noqa: BLE001 - answered as Quart's handler answers it
            answer = exception_answer(exc, "DELETE", path)
        await self._answer(send, self.cancel_rule, "DELETE", answer, started)

    async def _answer(self, send: ASGISendCallable, rule: str, method: str,
                      answer: bytes | ErrorAnswer, started: float) -> None:
        """Send the answer as Quart's Response would (Content-Type, Content-Length, then the
        error's own headers), and count it as the app's after-request hook does."""
        global answered
        answered += 1
        if isinstance(answer, ErrorAnswer):
            status = answer.status
            content = error_json(answer.code, answer.message, **answer.extra)
            extra = [(name.lower().encode("latin-1"), value.encode("latin-1"))
                     for name, value in error_headers(status, answer.headers).items()]
        else:
            status, content, extra = 200, answer, []
        headers = [_JSON, (b"content-length", str(len(content)).encode()), *extra]
        self.broker.metrics.count_http(rule, method, status, time.perf_counter() - started)
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": content, "more_body": False})


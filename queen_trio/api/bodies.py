"""Request bodies: read only when a handler asks, held to the body limit and a broker-wide budget.

Quart buffers a request's body as it arrives, before any handler runs: 60 uploads without a
token held 8 MiB each until refused, and 60 with one as much, whatever else was in flight,
so uploads alone could exhaust the broker's memory. Here:

- nothing is read from a request with a body until its handler asks for it (``await
  request.body``, ``request.get_data()``), so admission (the token, the quota) comes first and a
  refused client's upload is never buffered: the client is held back by TCP meanwhile;
- the limit (``MAX_CONTENT_LENGTH``) is checked before each piece is kept, chunked or not: 413,
  and what was kept is dropped at once;
- every byte kept counts against one :class:`BodyBudget` per broker
  (``QUEEN_HTTP_BODY_BUFFER_BYTES``) until the request ends; past it the request is answered
  503 ``overloaded``, having done nothing, rather than the broker growing;
- once the answer starts, what still arrives is dropped (an answer sent before the body had all
  arrived closes the connection: queen_trio/api/connections.py).

The hooks are quart-trio's ``asgi_http_class`` and Quart's ``Request.body_class`` (pinned in
pyproject.toml; the contract is checked by tests/unit/test_hypercorn_hooks.py).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import trio
from hypercorn.typing import ASGIReceiveCallable, ASGISendCallable, ASGISendEvent
from quart import Quart
from quart_trio.asgi import TrioASGIHTTPConnection
from quart_trio.wrappers import TrioRequest
from werkzeug.exceptions import RequestEntityTooLarge

from .errors import ApiError

BUDGET = "queen_trio.body_budget"


class BodyBudget:
    """Bytes of request bodies held at once by one broker process."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0

    def take(self, size: int) -> bool:
        if self.held + size > self.limit:
            return False
        self.held += size
        return True

    def give(self, size: int) -> None:
        self.held -= size


class RequestBody:
    """Quart's request body (``Request.body_class``); see the module docstring.

    Iterating it gives the whole body as one piece: the broker reads JSON bodies whole.
    """

    def __init__(self, expected_content_length: int | None,
                 max_content_length: int | None) -> None:
        self.limit = max_content_length
        self.budget: BodyBudget | None = None
        self.wanted = trio.Event()  # a handler asked for the body, or the answer has started
        self._pieces: list[bytes] = []
        self._held = 0
        self._done = trio.Event()  # all received, or refused
        self._error: Exception | None = None
        self._dropping = False
        self._iterated = False
        if (expected_content_length is not None and max_content_length is not None
                and expected_content_length > max_content_length):
            self._refuse(RequestEntityTooLarge())

    # -- what quart-trio's connection calls, as the ASGI messages arrive -----------------------

    def append(self, data: bytes) -> None:
        if not data or self._dropping or self._error is not None:
            return
        if self.limit is not None and self._held + len(data) > self.limit:
            self._refuse(RequestEntityTooLarge())
        elif self.budget is not None and not self.budget.take(len(data)):
            self._refuse(ApiError(
                503, "overloaded", "the broker holds as many request bodies as "
                "QUEEN_HTTP_BODY_BUFFER_BYTES allows; retry", headers={"Retry-After": "1"}))
        else:
            self._pieces.append(data)
            self._held += len(data)

    def set_complete(self) -> None:
        self._done.set()

    def set_result(self, data: bytes) -> None:  # Quart's test request context
        self.append(data)
        self.set_complete()

    # -- what handlers use -----------------------------------------------------------------------

    def __await__(self) -> Generator[Any, None, bytes]:
        return self._read().__await__()

    def __aiter__(self) -> RequestBody:
        return self

    async def __anext__(self) -> bytes:
        if self._iterated:
            raise StopAsyncIteration
        self._iterated = True
        return await self._read()

    def clear(self) -> None:
        self._release()

    async def _read(self) -> bytes:
        self.wanted.set()
        await self._done.wait()
        return self.whole()

    @property
    def finished(self) -> bool:
        """All received, or refused (the limit, the budget): nothing more is kept."""
        return self._done.is_set()

    def whole(self) -> bytes:
        """The body once it has all arrived (or was refused: the refusal is raised), without
        a trip through the scheduler (:mod:`.fast` fills it itself)."""
        assert self.finished
        if self._error is not None:
            raise self._error
        whole = b"".join(self._pieces)
        self._pieces = [whole]  # read again (get_data twice): the same bytes, no new copy
        return whole

    # -- the connection's side -------------------------------------------------------------------

    def answer_started(self) -> None:
        """Drop whatever still arrives: the request has been answered."""
        self._dropping = True
        self.wanted.set()

    def _refuse(self, error: Exception) -> None:
        self._error = error
        self._release()
        self._done.set()

    def _release(self) -> None:
        self._pieces = []
        if self.budget is not None:
            self.budget.give(self._held)
        self._held = 0


class BrokerRequest(TrioRequest):
    body_class = RequestBody  # type: ignore[assignment]


class BodyHoldingConnection(TrioASGIHTTPConnection):
    """quart-trio's HTTP connection, with the body held back until it is wanted."""

    async def __call__(self, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        request = self._create_request_from_scope(send)
        body = request.body
        assert isinstance(body, RequestBody)
        body.budget = self.app.extensions[BUDGET]
        # An HTTP/1 request without Content-Length or Transfer-Encoding has no body; HTTP/2
        # (h2c) need not declare one: there, the method tells.
        if self.scope["http_version"] in ("1.0", "1.1"):
            declared = _declares_body(self.scope)
        else:
            declared = self.scope["method"] not in ("GET", "HEAD", "DELETE", "OPTIONS")
        if not declared:
            # Nothing to hold back: reading the empty body at once lets the client's
            # disconnect reach a parked long-poll.
            body.wanted.set()

        async def answer(message: ASGISendEvent) -> None:
            if message["type"] == "http.response.start":
                body.answer_started()
            await send(message)

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self.handle_messages, nursery, request, receive)
                nursery.start_soon(self.handle_request, nursery, request, answer)
        finally:
            body.clear()

    async def handle_messages(  # type: ignore[override]
        self, nursery: trio.Nursery, request: BrokerRequest, receive: ASGIReceiveCallable
    ) -> None:
        assert isinstance(request.body, RequestBody)
        await request.body.wanted.wait()
        await super().handle_messages(nursery, request, receive)


def _declares_body(scope: Any) -> bool:
    for name, value in scope["headers"]:
        if name == b"transfer-encoding" or (name == b"content-length" and value.strip() != b"0"):
            return True
    return False


def install(app: Quart, buffer_bytes: int) -> None:
    """Serve ``app``'s requests with held-back bodies and a budget of ``buffer_bytes``."""
    app.request_class = BrokerRequest
    app.asgi_http_class = BodyHoldingConnection
    app.extensions[BUDGET] = BodyBudget(buffer_bytes)

"""HTTP errors: one JSON shape; the statuses of the broker's own errors come from one mapping.

Every error answer is Queen's shape, ``{"error": "<snake_case_code>", "detail": "<text>"}``
(with ``reason`` where a generic code carries a precise one), and our own ``ok: false`` and
``message`` (the text again) beside it, which our SDK and dashboard read. queen-mq takes the
code from ``error`` and its exception's text from ``detail``. :func:`error_json` is the one
place that writes these bodies (:func:`error_response` for the app, :mod:`.protocol` for what
hypercorn refuses before the app); a 429 or a 503 always carries ``Retry-After`` (both mean
"not now": a quota, a bound of the moment, a database away), as Queen's clients expect.

Every error raised on purpose is a :class:`queen_trio.errors.RequestError` (one tree, drawn in
:mod:`queen_trio.errors`): a domain error (``ClientError`` kinds) with the status
:data:`queen_trio.errors.HTTP_STATUS` gives its class, or an :class:`ApiError` of the HTTP
layer with its own. Anything unexpected is logged with its traceback and answered 500
``internal_error``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable
from typing import Any

import msgspec
import psycopg
from quart import Blueprint, Quart, Response, request
from werkzeug.exceptions import HTTPException, MethodNotAllowed

from .. import strict_json
from ..errors import ApiError, DatabaseUnavailable, PoolExhausted, RequestError, http_status
from ..models import codec

# ApiError lives in the one tree (queen_trio.errors); the routes import it from here.
__all__ = ["ApiError", "ErrorAnswer", "error_body", "error_headers", "error_json",
           "error_response", "exception_answer", "family_answer", "install_error_handlers",
           "install_family_errors", "parse_json_body", "read_body_via", "read_json_body",
           "read_json_object", "read_object_via"]

log = logging.getLogger(__name__)


# json.dumps(body, separators=(",", ":")) without building a JSONEncoder per answer.
_COMPACT = json.JSONEncoder(separators=(",", ":"))


#: The statuses that mean "not now": their answer always says when to come back.
RETRY_LATER = (429, 503)
DEFAULT_RETRY_AFTER = "1"


def error_body(code: str, message: str, **extra: Any) -> dict[str, Any]:
    """Queen's ``error`` and ``detail`` (the text, unless ``extra`` gives its own), our ``ok``
    and ``message``."""
    return {"ok": False, "error": code, "message": message, "detail": message, **extra}


def error_json(code: str, message: str, **extra: Any) -> bytes:
    """The bytes of an error answer's body: compact, like every other answer (jsonify)."""
    return _COMPACT.encode(error_body(code, message, **extra)).encode()


def error_response(http_status: int, code: str, message: str, *,
                   headers: dict[str, str] | None = None, **extra: Any) -> Response:
    response = Response(error_json(code, message, **extra),
                        status=http_status, content_type="application/json")
    response.headers.update(error_headers(http_status, headers))
    return response


def error_headers(http_status: int, headers: dict[str, str] | None) -> dict[str, str]:
    """The headers an error answer carries beside its Content-Type: ``headers``, and
    ``Retry-After`` on a 429 or 503 that does not say when to come back."""
    out = dict(headers or {})
    if http_status in RETRY_LATER and not any(k.lower() == "retry-after" for k in out):
        out["Retry-After"] = DEFAULT_RETRY_AFTER
    return out


@dataclasses.dataclass(frozen=True, slots=True)
class ErrorAnswer:
    """An error answer before it becomes a response (Quart's, or :mod:`.fast`'s)."""

    status: int
    code: str
    message: str
    extra: dict[str, Any]
    headers: dict[str, str] | None = None

    def response(self) -> Response:
        return error_response(self.status, self.code, self.message, headers=self.headers,
                              **self.extra)


def family_answer(bad_request: str, answer: ErrorAnswer) -> ErrorAnswer:
    """A 400 of a family's routes (:func:`install_family_errors`): the family's code, the
    precise one as ``reason``."""
    if answer.status == 400 and answer.code != bad_request:
        return dataclasses.replace(answer, code=bad_request,
                                   extra={**answer.extra, "reason": answer.code})
    return answer


def request_error_answer(exc: RequestError) -> ErrorAnswer:
    return ErrorAnswer(exc.status, exc.code, exc.message, exc.extra, exc.headers)


def exception_answer(exc: Exception, method: str, path: str) -> ErrorAnswer:
    """The answer to an exception a handler raised that is not an HTTPException (logged
    here as its kind requires): a RequestError's own, 503 for database trouble of the
    moment, else 500 ``internal_error`` with the traceback logged."""
    if isinstance(exc, RequestError):
        return request_error_answer(exc)
    if isinstance(exc, PoolExhausted):
        log.warning("database pool exhausted during %s %s: %s", method, path, exc)
        return ErrorAnswer(http_status(type(exc)), "database_busy", str(exc), {})
    if isinstance(exc, DatabaseUnavailable):
        log.warning("database unavailable during %s %s: %s", method, path, exc)
        return ErrorAnswer(http_status(type(exc)), "database_unavailable",
                           "the database is unreachable; retry", {})
    if isinstance(exc, psycopg.OperationalError):
        # The pool turns a lost connection into DatabaseUnavailable; this is the rest of
        # psycopg's "operational" class (a statement cancelled by an operator, the server
        # shutting down): trouble of the moment, not of the request. Never a 500.
        log.warning("database trouble during %s %s: %s", method, path,
                    str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)
        return ErrorAnswer(503, "database_unavailable", "the database is unreachable; retry", {})
    log.error("unhandled error during %s %s", method, path, exc_info=exc)
    return ErrorAnswer(500, "internal_error", "the broker failed to handle this request", {})


_HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
    415: "unsupported_media_type",
    429: "too_many_requests",
}


async def read_json_body() -> Any:
    """The request body parsed by the broker's one JSON decoder (:mod:`queen_trio.strict_json`),
    or a 400: ``malformed_json`` (not UTF-8, not JSON), or ``invalid_json_value`` with the
    ``field`` path of a value JSON or PostgreSQL cannot carry (NaN, 1e999, "\\u0000"…)."""
    # cache=False: the bytes (and their share of the body budget) are given back as soon as
    # they are parsed; no route reads a body twice after parsing it.
    return parse_json_body(await request.get_data(cache=False, as_text=False))


def parse_json_body(raw: bytes | str) -> Any:
    """:func:`read_json_body` for a body already read (a route that tried a faster decoder
    first): the same answers."""
    if not raw:
        raise ApiError(400, "malformed_json", "the request body is empty; a JSON body is required")
    try:
        return strict_json.loads(raw, what="the request body")
    except strict_json.JsonRefused as exc:
        if exc.code == strict_json.INVALID_VALUE:
            raise ApiError(400, exc.code, exc.message, field=exc.path) from None
        raise ApiError(400, exc.code, exc.message) from None


async def read_json_object() -> dict[str, Any]:
    return _an_object(await read_json_body())


async def read_body_via(decoder: msgspec.json.Decoder[Any], *, optional: bool = False,
                        builtins: Callable[[Any], Any] = msgspec.to_builtins) -> Any:
    """:func:`read_json_body`, decoded through ``decoder``'s model first (:mod:`..models`):
    a body the model takes skips the strict walk; one it refuses takes the strict decoder, so
    the answers are the same (the route's rules then say what is wrong with it). ``optional``:
    an empty (or blank) body is ``{}``."""
    raw = await request.get_data(cache=False, as_text=False)
    return body_via(raw.encode() if isinstance(raw, str) else raw, decoder, optional=optional,
                    builtins=builtins)


def body_via(raw: bytes, decoder: msgspec.json.Decoder[Any], *, optional: bool = False,
             builtins: Callable[[Any], Any] = msgspec.to_builtins) -> Any:
    """:func:`read_body_via` for a body already read (:mod:`.fast`): the same answers."""
    if optional and not raw.strip():
        return {}
    decoded = codec.fast(raw, decoder)
    return parse_json_body(raw) if decoded is codec.FALLBACK else builtins(decoded)


async def read_object_via(decoder: msgspec.json.Decoder[Any], *, optional: bool = False,
                          builtins: Callable[[Any], Any] = msgspec.to_builtins
                          ) -> dict[str, Any]:
    """:func:`read_body_via` for a route whose body is a JSON object (anything else: 400
    ``invalid_body``)."""
    return _an_object(await read_body_via(decoder, optional=optional, builtins=builtins))


def object_via(raw: bytes, decoder: msgspec.json.Decoder[Any]) -> dict[str, Any]:
    """:func:`read_object_via` for a body already read (:mod:`.fast`)."""
    return _an_object(body_via(raw, decoder))


def _an_object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise ApiError(400, "invalid_body", "the request body must be a JSON object")
    return body


def http_error_answer(exc: HTTPException, method: str, path: str) -> ErrorAnswer:
    """The answer to one of Werkzeug's HTTP errors (a 404, a 408 for a body too slow…)."""
    status = exc.code or 500
    message = exc.description or exc.name
    if status == 404:
        message = f"no route for {method} {path}"
    return ErrorAnswer(status, _HTTP_CODES.get(status, "http_error"), message, {})


def install_family_errors(blueprint: Blueprint, bad_request: str) -> None:
    """Queen's surfaces answer every 400 of theirs with one family code (``timers_bad_request``,
    ``kv_bad_request``, ``locks_bad_request``) and the precise code as ``reason``: queen-mq
    raises its family's error (TimerError, KvError, LockError) with both."""

    @blueprint.errorhandler(RequestError)
    async def _family_request_error(exc: RequestError) -> Response:
        return family_answer(bad_request, request_error_answer(exc)).response()


def install_error_handlers(app: Quart) -> None:
    @app.errorhandler(RequestError)
    async def _request_error(exc: RequestError) -> Response:
        return request_error_answer(exc).response()

    @app.errorhandler(HTTPException)
    async def _http_error(exc: HTTPException) -> Response:
        response = http_error_answer(exc, request.method, request.path).response()
        if isinstance(exc, MethodNotAllowed) and exc.valid_methods:
            response.headers["Allow"] = ", ".join(sorted(exc.valid_methods))
        return response

    # (DatabaseUnavailable, PoolExhausted, psycopg.OperationalError and the unexpected:
    # one handler, as exception_answer sorts them; HTTPException has its own above.)
    @app.errorhandler(Exception)
    async def _unexpected(exc: Exception) -> Response:
        return exception_answer(exc, request.method, request.path).response()

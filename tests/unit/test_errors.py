"""Error statuses: every error the broker raises on purpose gets its HTTP status from the one
mapping, ``queen_trio.errors.HTTP_STATUS``, never from where it is raised; the domain's errors
and the HTTP layer's are one tree, answered by one writer of error JSON."""

from __future__ import annotations

import ast
import pathlib
from collections import defaultdict

import pytest
from quart import Response
from quart_trio import QuartTrio

import queen_trio
from queen_trio import errors
from queen_trio.api.errors import error_json, install_error_handlers
from queen_trio.api.protocol import protocol_error_body
from queen_trio.errors import (
    HTTP_STATUS,
    ApiError,
    ClientError,
    Conflict,
    DatabaseUnavailable,
    NotFound,
    PayloadTooLarge,
    QueenError,
    RequestError,
    ValidationError,
    http_status,
)

PACKAGE = pathlib.Path(queen_trio.__file__).parent


def _client_errors() -> list[type[ClientError]]:
    return [ClientError, *_subclasses(ClientError)]


def _subclasses(cls: type[ClientError]) -> list[type[ClientError]]:
    found: list[type[ClientError]] = []
    for sub in cls.__subclasses__():
        found += [sub, *_subclasses(sub)]
    return found


def _raised() -> list[tuple[str, int, type[ClientError], str | None, list[str]]]:
    """Every ``SomeClientError(...)`` call in the package (the client SDK aside, which has its
    own errors): (file, line, class, literal code or None, keyword names)."""
    kinds: dict[str, type[ClientError]] = {
        c.__name__: c for c in _client_errors()}
    calls: list[tuple[str, int, type[ClientError], str | None, list[str]]] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if "client" in path.relative_to(PACKAGE).parts[:1]:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.id if isinstance(func, ast.Name) else (
                func.attr if isinstance(func, ast.Attribute) else None)
            if name not in kinds:
                continue
            first = node.args[0] if node.args else None
            code = first.value if isinstance(first, ast.Constant) and isinstance(
                first.value, str) else None
            keywords = [k.arg for k in node.keywords if k.arg is not None]
            calls.append((str(path.relative_to(PACKAGE)), node.lineno, kinds[name], code,
                          keywords))
    return calls


def test_every_client_error_class_is_in_the_mapping() -> None:
    for cls in _client_errors():
        assert cls in HTTP_STATUS, f"{cls.__name__} has no entry in errors.HTTP_STATUS"
        assert 400 <= HTTP_STATUS[cls] < 500
        assert http_status(cls) == HTTP_STATUS[cls]


def test_the_statuses_clients_see() -> None:
    assert {cls.__name__: status for cls, status in HTTP_STATUS.items()} == {
        "ClientError": 400, "ValidationError": 400, "PayloadTooLarge": 413, "NotFound": 404,
        "Conflict": 409, "Forbidden": 403, "DatabaseUnavailable": 503,
    }


def test_an_error_status_is_its_class_status() -> None:
    assert ValidationError("some_code", "m").status == 400
    assert PayloadTooLarge("payload_too_large", "m").status == 413
    assert NotFound("no_queue", "m").status == 404
    assert Conflict("tenant_exists", "m").status == 409
    assert errors.Forbidden("timer_horizon_exceeded", "m").status == 403
    assert isinstance(PayloadTooLarge("payload_too_large", "m"), ValidationError)
    assert http_status(DatabaseUnavailable) == 503


def test_an_error_outside_the_mapping_is_a_500() -> None:
    assert http_status(QueenError) == 500
    assert http_status(errors.MigrationError) == 500


def test_the_status_cannot_be_set_where_an_error_is_raised() -> None:
    with pytest.raises(AttributeError):
        ValidationError("x", "y").status = 413  # type: ignore[misc]


def test_the_package_raises_only_mapped_classes_and_never_passes_a_status() -> None:
    calls = _raised()
    assert len(calls) > 50  # the walk found the package's errors
    for where, line, cls, _, keywords in calls:
        assert "status" not in keywords, f"{where}:{line} sets a status outside the mapping"
        assert cls in HTTP_STATUS, f"{where}:{line}: {cls.__name__} is not in HTTP_STATUS"


def test_each_error_code_answers_one_status() -> None:
    statuses: defaultdict[str, set[int]] = defaultdict(set)
    for _, _, cls, code, _ in _raised():
        if code is not None:
            statuses[code].add(http_status(cls))
    assert statuses["payload_too_large"] == {413}
    assert statuses["tenant_exists"] == {409}
    mixed = {code: s for code, s in statuses.items() if len(s) > 1}
    assert not mixed, f"codes raised with more than one status: {mixed}"


async def test_the_domain_and_the_http_layer_are_answered_by_one_writer() -> None:
    app = QuartTrio(__name__)
    install_error_handlers(app)
    raised: dict[str, RequestError] = {
        "/domain": Conflict("version_mismatch", "the version moved on", version=3),
        "/quota": ApiError(429, "rate_limited", "slow down", headers={"Retry-After": "7"}),
        "/paused": ApiError(503, "kv_paused", "the KV store is paused", reason="kv_paused"),
    }
    for path, exc in raised.items():
        async def route(exc: RequestError = exc) -> Response:
            raise exc
        app.add_url_rule(path, path, route)
    client = app.test_client()
    for path, exc in raised.items():
        answer = await client.get(path)
        assert isinstance(exc, QueenError)
        assert answer.status_code == exc.status
        assert await answer.get_data() == error_json(exc.code, exc.message, **exc.extra)
        assert answer.content_type == "application/json"
    assert (await client.get("/domain")).status_code == 409
    assert (await client.get("/quota")).headers["Retry-After"] == "7"
    assert (await client.get("/paused")).headers["Retry-After"] == "1"  # "not now" says when
    body = await (await client.get("/paused")).get_json()
    assert body == {"ok": False, "error": "kv_paused", "message": "the KV store is paused",
                    "detail": "the KV store is paused", "reason": "kv_paused"}
    # What hypercorn refuses before the app is written by the same function.
    assert protocol_error_body(431) == error_json(
        "headers_too_large", "the request headers are too large")

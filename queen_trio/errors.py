"""The broker's error tree: the one error system, from the stores to the HTTP answer.

::

    QueenError
     ├── ConfigError            a QUEEN_* setting is invalid; start-up stops with one line
     ├── ListenError            the HTTP address cannot be bound
     ├── DatabaseError          PostgreSQL trouble the broker could not hide
     │    ├── DatabaseUnavailable    connection refused or lost, pool closed (503)
     │    │    └── PoolExhausted          every connection stayed busy for the bounded wait (503)
     │    └── MigrationError         schema/ is inconsistent with the database
     ├── EmbeddedPostgresError  the embedded server could not be prepared or started
     └── RequestError           a request answered with a JSON error: status, code, message
          ├── ClientError            cannot be honoured as sent; the status is its class's
          │    ├── ValidationError        malformed or out-of-range input (400)
          │    │    └── PayloadTooLarge       a payload or value above its byte ceiling (413)
          │    ├── Forbidden              well-formed, but a limit refuses it whatever the
          │    │                          retry (403)
          │    ├── NotFound               the named resource does not exist for this tenant (404)
          │    └── Conflict               the resource is in a state that forbids it (409)
          └── ApiError               the HTTP layer's own refusals, with the status given where
                                     raised (401 unauthorized, 429 rate_limited, 503 paused, ...)

:data:`HTTP_STATUS` is the one mapping from the domain's kinds to HTTP statuses: a
:class:`ClientError`'s status is its class's, never set where it is raised. Every
:class:`RequestError` carries its stable snake_case ``code``, its ``message``, ``extra`` fields
of the body and ``headers`` of the answer; :mod:`queen_trio.api.errors` answers each, and is
the one place that writes error JSON.
"""

from __future__ import annotations

from typing import Any


class QueenError(Exception):
    """Base class of every error raised on purpose by queen-trio."""


class ConfigError(QueenError):
    """A ``QUEEN_*`` variable has a value the broker cannot run with."""

    def __init__(self, variable: str, value: str, expected: str) -> None:
        self.variable = variable
        self.value = value
        self.expected = expected
        super().__init__(f"{variable}={value!r} is not valid: expected {expected}")


class ListenError(QueenError):
    """The HTTP address cannot be bound (already in use, not permitted)."""


class DatabaseError(QueenError):
    """PostgreSQL trouble that reached the broker's own code."""


class DatabaseUnavailable(DatabaseError):
    """The database cannot be reached right now; retrying later may work."""


class PoolExhausted(DatabaseUnavailable):
    """Every pool connection stayed busy for the whole bounded wait; retrying later may work."""


class MigrationError(DatabaseError):
    """The migration files and the database's migration record disagree."""


class EmbeddedPostgresError(QueenError):
    """The embedded PostgreSQL server could not be initialised or started."""


class RequestError(QueenError):
    """A request answered with a JSON error (:func:`queen_trio.api.errors.error_response`):
    ``status``, the stable snake_case ``code``, the ``message``, ``extra`` fields of the body,
    ``headers`` of the answer (a 429 or a 503 gains ``Retry-After`` there if it has none)."""

    def __init__(self, code: str, message: str, *, headers: dict[str, str] | None = None,
                 **extra: Any) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.headers = dict(headers or {})
        self.extra = extra

    @property
    def status(self) -> int:
        """The HTTP status this error is answered with (from :data:`HTTP_STATUS`)."""
        return http_status(type(self))


class ClientError(RequestError):
    """The client's request cannot be honoured as sent; the API answers a 4xx with ``code``."""


class ApiError(RequestError):
    """A refusal of the HTTP layer (authentication, quotas, paused features, request framing)
    whose status is given where it is raised, as HTTP knows it: ``ApiError(429, code, message,
    headers=..., **extra)``. The domain's refusals are :class:`ClientError` kinds instead."""

    def __init__(self, status: int, code: str, message: str, *,
                 headers: dict[str, str] | None = None, **extra: Any) -> None:
        super().__init__(code, message, headers=headers, **extra)
        self._status = status

    @property
    def status(self) -> int:
        return self._status


class ValidationError(ClientError):
    """Malformed or out-of-range input."""


class PayloadTooLarge(ValidationError):
    """A payload or value is above its byte ceiling (code ``payload_too_large``)."""


class Forbidden(ClientError):
    """Well-formed, but refused by a limit that no retry gets past (a timer beyond the horizon)."""


class NotFound(ClientError):
    """The named resource does not exist for this tenant."""


class Conflict(ClientError):
    """The resource is in a state that forbids the request."""


#: The HTTP status of each kind of error the API answers on purpose; every class that can
#: reach a client is listed itself (tests/unit/test_errors.py holds the package to that).
#: Other errors are answered 500 ``internal_error``.
HTTP_STATUS: dict[type[QueenError], int] = {
    ClientError: 400,
    ValidationError: 400,
    PayloadTooLarge: 413,
    Forbidden: 403,
    NotFound: 404,
    Conflict: 409,
    DatabaseUnavailable: 503,
}


def http_status(kind: type[QueenError]) -> int:
    """The status :data:`HTTP_STATUS` gives ``kind`` (or its nearest listed base class)."""
    for cls in kind.__mro__:
        status = HTTP_STATUS.get(cls)
        if status is not None:
            return status
    return 500

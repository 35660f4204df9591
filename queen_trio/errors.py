"""The broker's error tree.

::

    QueenError
     ├── ConfigError            a QUEEN_* setting is invalid; start-up stops with one line
     ├── DatabaseError          PostgreSQL trouble the broker could not hide
     │    ├── DatabaseUnavailable    connection refused, lost, or pool closed (transient)
     │    └── MigrationError         schema/ is inconsistent with the database
     ├── EmbeddedPostgresError  the embedded server could not be prepared or started
     └── ClientError            the request cannot be honoured as sent (maps to a 4xx)
          ├── ValidationError        malformed or out-of-range input (400, 413 for size)
          ├── NotFound               the named resource does not exist for this tenant (404)
          └── Conflict               the resource is in a state that forbids it (409)

HTTP-facing errors live in :mod:`queen_trio.api.errors`; they map domain errors to a status
and a stable snake_case code in exactly one place.
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


class DatabaseError(QueenError):
    """PostgreSQL trouble that reached the broker's own code."""


class DatabaseUnavailable(DatabaseError):
    """The database cannot be reached right now; retrying later may work."""


class MigrationError(DatabaseError):
    """The migration files and the database's migration record disagree."""


class EmbeddedPostgresError(QueenError):
    """The embedded PostgreSQL server could not be initialised or started."""


class ClientError(QueenError):
    """The client's request cannot be honoured as sent; the API answers a 4xx with ``code``."""

    status = 400

    def __init__(self, code: str, message: str, *, status: int | None = None, **extra: Any):
        super().__init__(message)
        self.code = code
        self.message = message
        self.extra = extra
        if status is not None:
            self.status = status


class ValidationError(ClientError):
    status = 400


class NotFound(ClientError):
    status = 404


class Conflict(ClientError):
    status = 409

"""Which database errors mean "the database is in trouble right now" rather than "this request
or this timer is wrong". Background services retry on them; the sweeper spends no attempt."""

from __future__ import annotations

import psycopg
from psycopg import errors as pg

from ..errors import DatabaseUnavailable

TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    DatabaseUnavailable,
    psycopg.OperationalError,  # connection lost, server unreachable
    pg.ConnectionException,  # SQLSTATE class 08
    pg.OperatorIntervention,  # class 57: admin shutdown, crash shutdown, query canceled…
    pg.IdleInTransactionSessionTimeout,  # the server ended a transaction we left open
    pg.SerializationFailure,
    pg.DeadlockDetected,
    pg.LockNotAvailable,
    OSError,
)


def is_transient(exc: BaseException) -> bool:
    return isinstance(exc, TRANSIENT_ERRORS)

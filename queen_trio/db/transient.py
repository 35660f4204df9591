"""Which database errors mean "the database is in trouble right now" rather than "this request
or this timer is wrong". Background services retry on them; the sweeper spends no attempt."""

from __future__ import annotations

import psycopg
from psycopg import errors as pg

from ..errors import DatabaseUnavailable

TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    DatabaseUnavailable,
    # connection lost, server unreachable; psycopg also files admin/crash shutdown and
    # query_canceled (SQLSTATE class 57) under OperationalError
    psycopg.OperationalError,
    pg.ConnectionException,  # SQLSTATE class 08
    pg.OperatorIntervention,  # the rest of class 57
    pg.IdleInTransactionSessionTimeout,  # the server ended a transaction we left open
    pg.SerializationFailure,
    pg.DeadlockDetected,
    pg.LockNotAvailable,
    OSError,
)


def is_transient(exc: BaseException) -> bool:
    return isinstance(exc, TRANSIENT_ERRORS)

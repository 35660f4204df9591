"""Which database errors mean "the database is in trouble right now" rather than "this request
or this timer is wrong". Background services retry on them; the sweeper spends no attempt.

A read-only server is such trouble too: during a failover a broker may reach a standby not yet
promoted, or a demoted primary (SQLSTATE 25006, read_only_sql_transaction). The pool drops
such a connection and reports :class:`DatabaseUnavailable`; the error is listed here as well
for the connections outside the pool (the LISTEN connection)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import NoReturn

import psycopg
import trio
from psycopg import errors as pg

from ..errors import DatabaseUnavailable

log = logging.getLogger(__name__)

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
    pg.ReadOnlySqlTransaction,  # 25006: a standby, or a primary turned read-only
    OSError,
)

#: Errors that mean the connection's server cannot take writes: the connection is dropped.
READ_ONLY_ERRORS: tuple[type[BaseException], ...] = (pg.ReadOnlySqlTransaction,)


def is_transient(exc: BaseException) -> bool:
    return isinstance(exc, TRANSIENT_ERRORS)


async def every(interval_s: float, step: Callable[[], Awaitable[object]], *, what: str,
                at_once: bool = False) -> NoReturn:
    """A background service's loop: ``step()`` every ``interval_s`` (the first one at once
    with ``at_once``). A transient database error is logged and the next round tries again;
    any other error ends the loop, and with it the broker's nursery."""
    if not at_once:
        await trio.sleep(interval_s)
    while True:
        try:
            await step()
        except TRANSIENT_ERRORS as exc:
            log.warning("%s skipped: %s", what, str(exc).strip())
        await trio.sleep(interval_s)

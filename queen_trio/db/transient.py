"""Which database errors mean "the database is in trouble right now" rather than "this request
or this timer is wrong". Background services retry on them; the sweeper spends no attempt.

Any other error a background service meets (a row it cannot process, a bug) is logged at ERROR
with its traceback, counted in ``queen_background_errors_total{service}``, and the service goes
on after a back-off (:func:`survived`, :func:`every` and the services built on it,
:class:`Periodic`, :class:`Shunned`): one bad row or tenant never stops a service, and with
it the broker's nursery.

A read-only server is such trouble too: during a failover a broker may reach a standby not yet
promoted, or a demoted primary (SQLSTATE 25006, read_only_sql_transaction). The pool drops
such a connection and reports :class:`DatabaseUnavailable`; the error is listed here as well
for the connections outside the pool (the LISTEN connection)."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, NoReturn

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


def timed_out(exc: BaseException) -> bool:
    """Whether ``exc`` is a statement the server cancelled (SQLSTATE 57014): its
    ``statement_timeout`` ran out, or an operator cancelled it. Transient, but the same work
    asked for again may take as long again."""
    return isinstance(exc, pg.QueryCanceled)


#: Counts one error of a background service that was not transient trouble, by the service's
#: name (the broker's: BrokerMetrics.count_background_error).
CountError = Callable[[str], None]

#: After errors that are not transient, a service (or one item of its work) waits at most this
#: long before it tries again.
BACKOFF_MAX_S = 60.0


def backoff_s(failures: int, first_s: float, cap_s: float = BACKOFF_MAX_S) -> float:
    """How long to wait after ``failures`` failures in a row: ``first_s`` after none or one,
    doubling with each further one, at most ``cap_s`` (but never less than ``first_s``)."""
    return max(first_s, min(cap_s, first_s * 2 ** min(max(failures - 1, 0), 30)))


def describe(exc: BaseException) -> str:
    """One line for an error: the server's message, detail and SQLSTATE for an error
    PostgreSQL answered (without the statement text psycopg adds), else the exception's type
    and first line."""
    if isinstance(exc, psycopg.Error) and exc.sqlstate:
        detail = exc.diag.message_detail
        return (f"{exc.diag.message_primary or type(exc).__name__}"
                f"{f' ({detail})' if detail else ''} [SQLSTATE {exc.sqlstate}]")
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def survived(logger: logging.Logger, service: str, what: str, exc: BaseException,
             count: CountError | None) -> None:
    """``service`` met ``exc`` while doing ``what`` (which names the row or tenant, if any), and
    goes on: logged at ERROR and counted. With the traceback, so that a bug is never hidden,
    unless PostgreSQL answered the error (its message and SQLSTATE say what it was)."""
    answered = isinstance(exc, psycopg.Error) and exc.sqlstate is not None
    logger.error("%s failed (%s goes on): %s", what, service, describe(exc),
                 exc_info=None if answered else exc)
    if count is not None:
        count(service)


async def refresh_on_notify(
    changes: trio.MemoryReceiveChannel[Any], refresh: Callable[[], Awaitable[None]], *,
    period_s: float, logger: logging.Logger, service: str, what: str,
    count: CountError | None,
) -> None:
    """Call ``refresh`` after each message on ``changes`` (a LISTEN subscription: a NOTIFY, or
    word that some were missed) and at least every ``period_s``, forever. A transient error
    keeps the last state until the next try; any other is :func:`survived` and backed off."""
    failures = 0  # refreshes in a row that failed with something not transient
    while True:
        with trio.move_on_after(period_s):
            await changes.receive()
        try:
            await refresh()
            failures = 0
        except TRANSIENT_ERRORS as exc:
            logger.warning("%s not refreshed: %s", what, str(exc).strip())
        except Exception as exc:
            failures += 1
            survived(logger, service, f"the refresh of {what}", exc, count)
            await trio.sleep(backoff_s(failures, period_s) - period_s)


class Shunned:
    """The items (partitions, tenants…) a background service failed on: each is left alone for
    a while, twice as long after each further failure in a row (up to BACKOFF_MAX_S), and
    forgotten once it succeeds. The service goes on with the others meanwhile."""

    def __init__(self, first_s: float) -> None:
        self._first_s = first_s
        self._items: dict[Hashable, tuple[int, float]] = {}  # failures in a row, until

    def waiting(self, item: Hashable) -> bool:
        entry = self._items.get(item)
        return entry is not None and time.monotonic() < entry[1]

    def failed(self, item: Hashable) -> float:
        """Record a failure; answers how long the item is now left alone (seconds)."""
        failures = self._items.get(item, (0, 0.0))[0] + 1
        delay = backoff_s(failures, self._first_s)
        self._items[item] = (failures, time.monotonic() + delay)
        return delay

    def succeeded(self, item: Hashable) -> None:
        self._items.pop(item, None)


async def every(interval_s: float, step: Callable[[], Awaitable[object]], *, what: str,
                service: str, count_error: CountError | None = None,
                at_once: bool = False, logger: logging.Logger | None = None) -> NoReturn:
    """A background service's loop: ``step()`` every ``interval_s`` (the first one at once
    with ``at_once``). A transient database error is logged (on ``logger``, the service's) and
    the next round tries again. Any other error is :func:`survived`, and the rounds back off
    (``interval_s``, doubling, up to BACKOFF_MAX_S) until one succeeds."""
    logger = logger or log
    if not at_once:
        await trio.sleep(interval_s)
    failures = 0  # rounds in a row that failed with something not transient
    while True:
        try:
            await step()
            failures = 0
        except TRANSIENT_ERRORS as exc:
            logger.warning("%s skipped: %s", what, str(exc).strip())
        except Exception as exc:
            failures += 1
            survived(logger, service, what, exc, count_error)
        await trio.sleep(backoff_s(failures, interval_s))


@dataclasses.dataclass(frozen=True, slots=True)
class PeriodicStatistics:
    rounds: int
    failed_rounds: int  # transient trouble or an error it survived
    last_round_at: float | None  # trio clock


class Periodic:
    """The service ``name`` (queen_trio/services.py): ``step()`` every ``interval_s`` (the
    first one at once with ``at_once``), as :func:`every` loops: ``what`` names a round in its
    log lines, ``count_error`` counts the errors it survives."""

    def __init__(self, name: str, interval_s: float, step: Callable[[], Awaitable[object]], *,
                 what: str, count_error: CountError | None = None, at_once: bool = False,
                 logger: logging.Logger | None = None) -> None:
        self.name = name
        self.interval_s = interval_s
        self._step = step
        self._what = what
        self._count_error = count_error
        self._at_once = at_once
        self._logger = logger
        self._rounds = self._failed = 0
        self._last_round_at: float | None = None
        self._alive = False

    @property
    def alive(self) -> bool:
        return self._alive

    def statistics(self) -> PeriodicStatistics:
        return PeriodicStatistics(self._rounds, self._failed, self._last_round_at)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        self._alive = True
        try:
            task_status.started()
            await every(self.interval_s, self._round, what=self._what, service=self.name,
                        count_error=self._count_error, at_once=self._at_once,
                        logger=self._logger)
        finally:
            self._alive = False

    async def _round(self) -> None:
        self._rounds += 1
        self._last_round_at = trio.current_time()
        try:
            await self._step()
        except Exception:
            self._failed += 1
            raise

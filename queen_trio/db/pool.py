"""The connection pool: which :class:`~queen_trio.db.bridge.Connection` a task gets, how long
it may wait for one, and how long a connection is kept.

Connections are opened lazily up to ``max_size``; tasks beyond that wait their turn in FIFO
order, at most ``acquire_timeout_s``: past it the task gets :class:`PoolExhausted` (a 503
``database_busy`` with ``Retry-After`` to HTTP clients) instead of queueing without end. A
connection older than ``max_lifetime_s`` is closed when it comes back instead of being reused
(a server-side leak or a changed setting never lives for ever), and one idle in the pool for
``max_idle_s`` is closed at the pool's next use (a burst's connections do not stay open all
night). How a connection is driven from trio: :mod:`queen_trio.db.bridge`.

Transactions:

* Leaving a :meth:`Database.transaction` block with an exception (cancellation included) rolls
  back inside a bounded shield; if the rollback cannot finish, the connection is discarded
  and the server rolls back when it sees the socket close.

Read-only servers (a standby not yet promoted, a demoted or fenced primary): connections ask
for ``target_session_attrs=read-write`` (:func:`~queen_trio.db.conninfo.broker_conninfo`), so
libpq refuses such a server at connect and tries the URL's next host; a pooled connection
whose server turned read-only is dropped before anything is sent through it.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import psycopg
import trio
from psycopg import pq
from psycopg.rows import dict_row

from ..errors import DatabaseUnavailable, PoolExhausted
from .bridge import Connection, LoneStatement, TrioWaitConnection
from .conninfo import broker_conninfo, is_read_only_refusal

log = logging.getLogger(__name__)

T = TypeVar("T")

_ROLLBACK_TIMEOUT_S = 5.0


@dataclasses.dataclass(frozen=True, slots=True)
class PoolStatistics:
    max_size: int
    size: int
    idle: int
    in_use: int
    waiting: int
    connects_total: int
    discarded_total: int
    # Connect attempts libpq refused because every server that answered was read-only, and
    # connections dropped because their server turned out to be read-only.
    read_only_refused_total: int = 0
    read_only_dropped_total: int = 0
    # Tasks that waited acquire_timeout_s in vain; connections closed for their age or idleness.
    exhausted_total: int = 0
    closed_lifetime_total: int = 0
    closed_idle_total: int = 0


def _run_transaction(raw: psycopg.Connection[Any], fn: Callable[..., T], args: tuple) -> T:
    with raw.transaction():
        return fn(raw, *args)


class Database:
    """A bounded pool of :class:`Connection` objects for one PostgreSQL database.

    Connections are opened lazily up to ``max_size``; tasks beyond that wait their turn in
    FIFO order, for at most ``acquire_timeout_s`` (None: without end). A connection that failed,
    was cancelled mid-call, or was left inside a transaction is discarded rather than returned;
    one older than ``max_lifetime_s`` is closed when it comes back, one idle longer than
    ``max_idle_s`` at the pool's next use (None: never). ``on_connect`` runs on each new
    connection, in the thread that opened it, before its first use (the broker's warm-up).
    """

    def __init__(
        self,
        conninfo: str,
        *,
        max_size: int = 10,
        acquire_timeout_s: float | None = None,
        max_lifetime_s: float | None = None,
        max_idle_s: float | None = None,
        application_name: str = "queen-trio",
        session_settings: dict[str, str] | None = None,
        on_read_only: Callable[[str], None] | None = None,
        on_connect: Callable[[psycopg.Connection[Any]], object] | None = None,
    ) -> None:
        if max_size < 1:
            raise ValueError("max_size must be at least 1")
        # Always asking for a writable server (several hosts: the first writable one), each
        # host's attempt bounded by a connect timeout.
        self.conninfo = broker_conninfo(conninfo)
        # Told "refused" (a connect found only read-only servers) or "dropped" (a connection's
        # server turned out read-only); for the metrics.
        self._on_read_only_event = on_read_only
        self.max_size = max_size
        self._acquire_timeout_s = math.inf if acquire_timeout_s is None else acquire_timeout_s
        self._max_lifetime_s = math.inf if max_lifetime_s is None else max_lifetime_s
        self._max_idle_s = math.inf if max_idle_s is None else max_idle_s
        self._application_name = application_name
        self._session_settings = dict(session_settings or {})
        # Run on each new connection before its first use, in the thread that opened it (the
        # broker's warm-up of its plans: queen_trio/timers/warmup.py).
        self._on_connect = on_connect
        self._slots = trio.Semaphore(max_size)
        self._threads = trio.CapacityLimiter(max_size + 2)
        self._idle: list[Connection] = []
        self._in_use = 0
        self._waiting = 0
        self._connects = 0
        self._discarded = 0
        self._read_only_refused = 0
        self._read_only_dropped = 0
        self._exhausted = 0
        self._closed_lifetime = 0
        self._closed_idle = 0
        self._closed = False

    def statistics(self) -> PoolStatistics:
        return PoolStatistics(
            max_size=self.max_size,
            size=len(self._idle) + self._in_use,
            idle=len(self._idle),
            in_use=self._in_use,
            waiting=self._waiting,
            connects_total=self._connects,
            discarded_total=self._discarded,
            read_only_refused_total=self._read_only_refused,
            read_only_dropped_total=self._read_only_dropped,
            exhausted_total=self._exhausted,
            closed_lifetime_total=self._closed_lifetime,
            closed_idle_total=self._closed_idle,
        )

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[Connection]:
        """Borrow an autocommit connection: each statement commits on its own."""
        conn = await self._acquire()
        try:
            yield conn
        finally:
            await self._release(conn)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Connection]:
        """Borrow a connection inside ``BEGIN … COMMIT``; any exception rolls back."""
        conn = await self._acquire()
        try:
            conn._begin_pending = True
            try:
                yield conn
            except BaseException:
                await self._rollback(conn)
                raise
            await self._commit(conn)
        finally:
            await self._release(conn)

    async def run_transaction(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``fn(raw_psycopg_connection, *args, **kwargs)`` as one transaction, in this
        task (its socket waits are trio's)."""
        if kwargs:
            fn = functools.partial(fn, **kwargs)
        # What ``async with self.connection()`` does, without an async generator per call.
        conn = await self._acquire()
        try:
            return await conn._call(_run_transaction, fn, args)
        finally:
            await self._release(conn)

    async def run_transaction_in_thread(self, fn: Callable[..., T], *args: Any,
                                        **kwargs: Any) -> T:
        """Like :meth:`run_transaction`, in a worker thread: for work with real CPU between
        statements."""
        if kwargs:
            fn = functools.partial(fn, **kwargs)
        async with self.connection() as conn:
            return await conn._call(_run_transaction, fn, args, in_thread=True)

    async def run_autocommit(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``fn(raw_psycopg_connection, *args, **kwargs)`` in autocommit, in this task.

        For a function that sends exactly one statement: the statement is its own transaction,
        which saves the BEGIN and COMMIT round trips of :meth:`run_transaction`. Cancellation is
        as safe as for any statement: PostgreSQL commits it whole or not at all.
        """
        if kwargs:
            fn = functools.partial(fn, **kwargs)
        conn = await self._acquire()  # as in run_transaction()
        try:
            return await conn._call(fn, *args)
        finally:
            await self._release(conn)

    async def lone_row(self, statement: LoneStatement, values: dict[str, str | bytes | None],
                       binary: bool = False) -> list[bytes | None] | None:
        """Run one statement in autocommit straight through libpq (:meth:`Connection.lone_row`):
        its first row's values as text, or None. For the hottest lone statements only."""
        conn = await self._acquire()  # as in run_transaction()
        try:
            return await conn.lone_row(statement, statement.params(values), binary)
        finally:
            await self._release(conn)

    async def lone_rows(self, statement: LoneStatement, values: Sequence[str | bytes | None],
                        binary: bool = False) -> list[tuple[Any, ...]]:
        """Every row of one statement run in autocommit straight through libpq, as typed
        tuples (:meth:`Connection.lone_rows`): the sweeper's cycle. ``values`` in the order of
        ``statement.names``."""
        conn = await self._acquire()  # as in run_transaction()
        try:
            return await conn.lone_rows(statement, values, binary)
        finally:
            await self._release(conn)

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            conn._close()

    async def __aenter__(self) -> Database:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- internals ----------------------------------------------------------------------

    async def _commit(self, conn: Connection) -> None:
        if conn._begin_pending:  # nothing was executed: there is nothing to commit
            conn._begin_pending = False
            return
        await conn._call(_commit)

    async def _rollback(self, conn: Connection) -> None:
        conn._begin_pending = False
        if not conn.usable or not conn.in_transaction:
            return
        with trio.move_on_after(_ROLLBACK_TIMEOUT_S, shield=True):
            try:
                await conn._call(_rollback)
                return
            except Exception:  # noqa: BLE001 - any failure here means: discard the connection
                log.debug("rollback failed; discarding the connection", exc_info=True)
        conn._close()

    async def _acquire(self) -> Connection:
        if self._closed:
            raise DatabaseUnavailable("the connection pool is closed")
        # A cancelled task takes nothing. A free connection is taken without a pass through
        # the scheduler (Semaphore.acquire yields even when a slot is free): the statement
        # leaves at once, and the wait for its answer is the call's schedule point. A lone
        # call on an idle broker otherwise let every ready task (a sweeper cycle, a
        # refresh) go first, and paid an epoll round before its statement left. A cancel
        # scope bounds the wait only when there is one: a scope per call costs more than the
        # rest of it.
        await trio.lowlevel.checkpoint_if_cancelled()
        try:
            self._slots.acquire_nowait()
        except trio.WouldBlock:
            await self._wait_for_a_slot()
        try:
            now = trio.current_time()
            self._close_idle(now)
            while self._idle:
                conn = self._idle.pop()
                # The checks read libpq's own state (no psycopg ConnectionInfo per look):
                # on a lone call's path they cost more than the rest of the pool's work.
                if conn.usable:
                    if _reports_read_only(conn):
                        # Its server reported itself read-only since (a fenced primary):
                        # drop it before anything is sent.
                        conn._drop_read_only()
                    elif conn.server_went_away():
                        # Its server is gone (a crash, a failover): a fresh connection, not
                        # a 503.
                        conn._close()
                    elif now - conn.opened_at >= self._max_lifetime_s:
                        self._closed_lifetime += 1
                        conn._close()
                        continue
                    else:
                        break
                self._discarded += 1
            else:
                conn = await self._connect()
        except BaseException:
            self._slots.release()
            raise
        self._in_use += 1
        return conn

    async def _wait_for_a_slot(self) -> None:
        self._waiting += 1
        try:
            with trio.move_on_after(self._acquire_timeout_s):
                await self._slots.acquire()
                return
        finally:
            self._waiting -= 1
        self._exhausted += 1
        raise PoolExhausted(f"all {self.max_size} database connections stayed busy for "
                            f"{self._acquire_timeout_s:g} s; retry")

    async def _release(self, conn: Connection) -> None:
        if not self._give_back(conn):
            await self._release_after_rollback(conn)

    def _give_back(self, conn: Connection) -> bool:
        """:meth:`_release` without a trip through the scheduler when nothing has to be
        rolled back (a connection left outside a transaction, or unusable): False, and
        nothing done, otherwise."""
        usable = conn.usable
        if usable and _in_transaction(conn):
            return False
        self._in_use -= 1
        try:
            self._put_back(conn, usable)
        finally:
            self._slots.release()
        return True

    async def _release_after_rollback(self, conn: Connection) -> None:
        self._in_use -= 1
        try:
            await self._rollback(conn)
            self._put_back(conn, conn.usable)
        finally:
            self._slots.release()

    def _put_back(self, conn: Connection, usable: bool) -> None:
        if usable:
            now = trio.current_time()
            if now - conn.opened_at >= self._max_lifetime_s:  # too old: closed, not reused
                self._closed_lifetime += 1
                conn._close()
                return
            if not self._closed:
                conn.released_at = now
                self._idle.append(conn)
                return
        else:
            self._discarded += 1
        conn._close()

    async def _connect(self) -> Connection:
        def connect() -> TrioWaitConnection:
            raw = TrioWaitConnection.connect(
                self.conninfo,
                autocommit=True,
                row_factory=dict_row,
                application_name=self._application_name,
            )
            for name, value in self._session_settings.items():
                raw.execute("SELECT set_config(%s, %s, false)", (name, value))
            if self._on_connect is not None:
                self._on_connect(raw)
            return raw

        try:
            raw = await trio.to_thread.run_sync(connect, abandon_on_cancel=True)
        except psycopg.OperationalError as exc:
            if is_read_only_refusal(exc):
                self._read_only("refused")
            raise DatabaseUnavailable(str(exc).strip()) from exc
        self._connects += 1
        conn = Connection(raw, self._threads, lambda: self._read_only("dropped"))
        reason = conn.read_only_reason
        if reason is not None:
            # Only with an explicit target_session_attrs other than read-write (libpq's check
            # is off then): the same verdict, from what the server reported at connect.
            self._read_only("refused")
            conn._close()
            raise DatabaseUnavailable(f"the database server is read-only ({reason}); "
                                      "waiting for a writable one")
        return conn

    def _close_idle(self, now: float) -> None:
        """Close the connections idle longer than max_idle_s: the oldest are first in the
        list (a connection goes back at its end, and the next task takes the newest)."""
        limit = now - self._max_idle_s
        while self._idle and self._idle[0].released_at <= limit:
            self._closed_idle += 1
            self._idle.pop(0)._close()

    def _read_only(self, event: str) -> None:
        if event == "refused":
            self._read_only_refused += 1
        else:
            self._read_only_dropped += 1
        if self._on_read_only_event is not None:
            self._on_read_only_event(event)


def _reports_read_only(conn: Connection) -> bool:
    """Whether ``conn``'s server has reported itself read-only (its ``read_only_reason``
    is not None), from libpq's record of the parameters the server reported."""
    pgconn = conn._raw.pgconn
    return (pgconn.parameter_status(b"in_hot_standby") == b"on"
            or pgconn.parameter_status(b"default_transaction_read_only") == b"on")


def _in_transaction(conn: Connection) -> bool:
    """``conn.in_transaction``, from libpq's state directly."""
    return conn._raw.pgconn.transaction_status != pq.TransactionStatus.IDLE


def _commit(raw: psycopg.Connection[Any]) -> None:
    raw.execute("COMMIT")


def _rollback(raw: psycopg.Connection[Any]) -> None:
    raw.execute("ROLLBACK")

"""The bridge between psycopg and trio: a psycopg connection driven from trio tasks.

psycopg's async API only runs on asyncio (psycopg issue #29). The bridge drives psycopg's *sync*
connections instead, through one private call (:meth:`Connection._call`), in one of two ways:

* **on the event loop** (the default): the call runs in the calling task, and every time
  psycopg would block on the socket it hands the wait to trio (``wait_readable`` /
  ``wait_writable``, through a greenback portal). psycopg's protocol code is sans-I/O, and every
  wait of a sync connection goes through :meth:`TrioWaitConnection.wait`, so this is the only
  place that has to know. No thread hop: at idle each hop cost this VM ~0.25 ms each way, on
  the path from a fired timer to a waiting consumer.
* **in a worker thread** (:meth:`Connection.run_raw_in_thread`): for work that spends real CPU
  between statements (sealing segments) or must not queue behind HTTP tasks for the event loop
  (the sweeper's back-to-back drain). psycopg releases the GIL while it waits on the socket.

* **straight through libpq** (:meth:`Connection.lone_row`, :meth:`Connection.lone_rows`): one
  autocommit statement, the hottest lone ones only (one schedule, one cancel, the sweeper's
  cycle): ``send_query_prepared`` and trio's waits on the socket, no cursor, no greenback
  portal; the answer's few values are read by the caller (``lone_rows``: loaded by psycopg's
  loaders, as a cursor's). The contracts below hold for it as for the others, and its errors
  are psycopg's own.

(The LISTEN side is trio-native as well: see :mod:`queen_trio.db.listener`. Which connection a
task gets, and for how long one is kept: :mod:`queen_trio.db.pool`.)

Cancellation contract:

* A cancelled statement returns control to trio at once. If it was still running on the
  server, the server is asked to cancel it; either way the connection is closed and never goes
  back to the pool, so nothing half-done can leak into another task. (A cancelled thread call is
  abandoned and its connection closed as soon as the thread lets go of it.)

Read-only servers: a connection whose server reports itself read-only, or whose statement fails
with SQLSTATE 25006, is closed and never reused, and the call raises
:class:`DatabaseUnavailable` (a 503 to HTTP clients, no attempt spent by the sweeper): nothing
is ever written through it.
"""

from __future__ import annotations

import json
import logging
import re
import select
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import greenback
import msgspec
import psycopg
import trio
from psycopg import abc as pg_abc
from psycopg import errors, pq
from psycopg.abc import PQGen
from psycopg.adapt import AdaptersMap, Transformer
from psycopg.types.json import set_json_loads
from psycopg.waiting import Ready, Wait

from ..errors import DatabaseUnavailable
from .conninfo import read_only_reason
from .transient import READ_ONLY_ERRORS


class _CancelledRollbackFilter(logging.Filter):
    """Drops psycopg's "error ignored in rollback" when a trio cancellation interrupted the
    statement: :meth:`Connection._call` then discards the connection, so the ROLLBACK psycopg
    tries first cannot be sent ("another command is already in progress") and nothing is
    lost by not saying so. Any other failed rollback is still logged."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith("error ignored in rollback"):
            return True
        failure = sys.exc_info()[1]  # the rollback's own error, raised while leaving the block
        return not isinstance(getattr(failure, "__context__", None), trio.Cancelled)


logging.getLogger("psycopg.transaction").addFilter(_CancelledRollbackFilter())

T = TypeVar("T")
R = TypeVar("R")
Params = Sequence[Any] | dict[str, Any] | None

_CANCEL_REQUEST_TIMEOUT_S = 2.0


class TrioWaitConnection(psycopg.Connection[dict[str, Any]]):
    """A sync psycopg connection whose socket waits belong to trio while a task drives it.

    psycopg runs every network operation of a sync connection as a generator that yields what
    it waits for; :meth:`wait` is where those generators are consumed. Called from a task with
    a greenback portal, the waits become trio waits and other tasks run meanwhile; called from
    a worker thread (or at connect time), psycopg's own blocking wait is used.
    """

    def wait(self, gen: PQGen[T], interval: float = 0.1, timeout: float | None = None) -> T:
        if greenback.has_portal():
            return greenback.await_(_wait_on_trio(gen, self.pgconn.socket, timeout))
        return super().wait(gen, interval, timeout)


async def _wait_on_trio(gen: PQGen[T], fileno: int, limit_s: float | None) -> T:
    """Consume psycopg's generator, each wait it yields a trio wait; psycopg's
    ``_WaitTimeout`` after ``limit_s``, as its own waits do (None, every statement's: no
    cancel scope, which costs more than the rest of a wait)."""
    if limit_s is None:
        return await _drive(gen, fileno)
    with trio.move_on_after(limit_s) as scope:
        return await _drive(gen, fileno)
    assert scope.cancelled_caught
    raise errors._WaitTimeout("wait timeout expired")


async def _drive(gen: PQGen[T], fileno: int) -> T:
    try:
        state = next(gen)
        while True:
            state = gen.send(await _ready(fileno, state))
    except StopIteration as done:
        return done.value


async def _ready(fileno: int, state: Wait) -> Ready:
    if state == Wait.R:
        await trio.lowlevel.wait_readable(fileno)
        return Ready.R
    if state == Wait.W:
        await trio.lowlevel.wait_writable(fileno)
        return Ready.W
    # Both (a large query still being written while the server already answers): whichever
    # comes first. Rare, so the cost of a nursery does not matter.
    ready = Ready.NONE

    async def one(wait: Callable[[int], Any], flag: Ready, cancel: trio.CancelScope) -> None:
        nonlocal ready
        await wait(fileno)
        ready = Ready(ready | flag)
        cancel.cancel()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(one, trio.lowlevel.wait_readable, Ready.R, nursery.cancel_scope)
        nursery.start_soon(one, trio.lowlevel.wait_writable, Ready.W, nursery.cancel_scope)
    return ready


class Connection:
    """A pooled connection as seen from trio.

    Calls run in the calling task, their socket waits handed to trio; :meth:`run_raw_in_thread`
    runs one in a worker thread instead.

    Rows come back as dicts. Obtain one from :meth:`Database.connection` (autocommit) or
    :meth:`Database.transaction`; never keep it beyond that block.
    """

    def __init__(self, raw: TrioWaitConnection, limiter: trio.CapacityLimiter,
                 on_read_only: Callable[[], None] = lambda: None):
        self._raw = raw
        #: trio.current_time() when it was opened, and when it last went back to the pool.
        self.opened_at = trio.current_time()
        self.released_at = self.opened_at
        self._limiter = limiter
        self._on_read_only = on_read_only
        self._state = threading.Lock()
        self._running = False
        self._abandoned = False
        self._begin_pending = False
        self._lone_prepared: set[bytes] = set()  # the LoneStatements prepared on this one
        self._loader: pg_abc.Transformer | None = None  # loads lone_rows' values

    @property
    def usable(self) -> bool:
        """Whether this connection may go back to the pool as it is."""
        return not (self._abandoned or self._raw.closed or self._raw.broken)

    @property
    def backend_pid(self) -> int:
        return self._raw.info.backend_pid

    @property
    def server(self) -> tuple[str, int]:
        """The host (name, address or socket directory) and port this connection reached:
        with a multi-host URL, the one that accepted it."""
        return self._raw.info.host, self._raw.info.port

    @property
    def where(self) -> str:
        """``dbname on host:port as user``, for a log line: the server that accepted this
        connection (one of a multi-host URL's), never a password."""
        info = self._raw.info
        return f"{info.dbname} on {info.host}:{info.port} as {info.user}"

    def server_went_away(self) -> bool:
        """For a connection idle in the pool: whether its server has closed it meanwhile (it
        crashed, was shut down, or ended the session). One zero-timeout poll of the socket;
        an idle connection has nothing to read unless the server said goodbye."""
        pgconn = self._raw.pgconn
        poller = select.poll()
        poller.register(pgconn.socket, select.POLLIN)
        for _ in range(3):  # the farewell message, then the end of the stream
            if not poller.poll(0):
                return False
            try:
                pgconn.consume_input()
            except psycopg.OperationalError:
                return True
            if pgconn.status == pq.ConnStatus.BAD:
                return True
        return False

    @property
    def read_only_reason(self) -> str | None:
        """Why this connection's server cannot take writes, as it last reported, or None."""
        return read_only_reason(self._raw.info)

    @property
    def in_transaction(self) -> bool:
        return self._raw.info.transaction_status != pq.TransactionStatus.IDLE

    async def execute(self, query: str, params: Params = None) -> int:
        """Run a statement; return the affected row count."""
        return await self._call(_execute, query, params)

    async def fetch(self, query: str, params: Params = None) -> list[dict[str, Any]]:
        return await self._call(_fetchall, query, params)

    async def fetchrow(self, query: str, params: Params = None) -> dict[str, Any] | None:
        return await self._call(_fetchone, query, params)

    async def fetchval(self, query: str, params: Params = None) -> Any:
        row = await self._call(_fetchone, query, params)
        return None if row is None else next(iter(row.values()))

    async def run_raw(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(raw_connection, *args)`` (several statements at once) in this task, in
        whatever transaction this connection is in: none of its own."""
        return await self._call(fn, *args)

    async def run_raw_in_thread(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(raw_connection, *args)`` in a worker thread."""
        return await self._call(fn, *args, in_thread=True)

    # -- the bridge ---------------------------------------------------------------------

    async def _call(self, fn: Callable[..., T], *args: Any, in_thread: bool = False) -> T:
        if not self.usable:
            raise DatabaseUnavailable("connection is closed")
        try:
            if in_thread:
                return await trio.to_thread.run_sync(
                    self._in_thread, fn, args, abandon_on_cancel=True, limiter=self._limiter
                )
            # As with a thread: a call whose task is already cancelled never starts.
            await trio.lowlevel.checkpoint_if_cancelled()
            return await greenback.with_portal_run_sync(self._in_task, fn, args)
        except trio.Cancelled:
            await self._abandon()
            raise
        except psycopg.Error as exc:
            self._raise_for(exc)
            raise

    def _raise_for(self, exc: psycopg.Error) -> None:
        """The bridge's answer to a statement's error, if it is not the error itself."""
        # Whatever the SQLSTATE (connection lost, admin shutdown, idle-in-transaction
        # timeout…), an error that leaves the connection unusable is "database unavailable".
        if self._raw.broken or self._raw.closed or self._raw.pgconn.status == pq.ConnStatus.BAD:
            raise DatabaseUnavailable(str(exc).strip()) from exc
        reason = self.read_only_reason
        if isinstance(exc, READ_ONLY_ERRORS) or reason is not None:
            # A standby, or a primary demoted or fenced under us: never write through it.
            self._drop_read_only()
            raise DatabaseUnavailable(
                f"the database server is read-only ({reason or str(exc).strip()}); "
                "waiting for a writable one") from exc

    async def lone_rows(self, statement: LoneStatement, params: Sequence[str | bytes | None],
                        binary: bool = False) -> list[tuple[Any, ...]]:
        """:meth:`lone_row` for a statement answering several rows of typed values: every row,
        as a tuple of values loaded as a cursor would load them (the connection's adapters),
        from text or, with ``binary``, binary results. For the sweeper's cycle statement, sent
        a hundred times a second under a steady flow: psycopg's cursor path cost the broker
        about twice the CPU of the statement's whole trip through libpq (issue 32)."""
        loaded = await self._lone(statement, params, binary, self._load_rows)
        return [] if loaded is None else loaded

    def _load_rows(self, result: pq.abc.PGresult) -> list[tuple[Any, ...]]:
        loader = self._loader
        if loader is None:
            # One per connection, kept: it remembers the loader it found for each type, as a
            # cursor executed again does. Its json and jsonb are decoded by msgspec.
            loader = self._loader = Transformer(_LoneContext(self._raw))
        loader.set_pgresult(result)
        return loader.load_rows(0, result.ntuples, tuple)

    async def lone_row(self, statement: LoneStatement, params: Sequence[str | bytes | None],
                       binary: bool = False) -> list[bytes | None] | None:
        """Run one statement in autocommit straight through libpq, in this task: its first
        row's values as the server wrote them (text, or binary with ``binary``), or None for no
        row. A ``str`` parameter goes as text, a ``bytes`` one in binary (its type then comes
        from the statement's cast).

        For the hottest lone statements (one schedule, one cancel): no cursor, no adaptation,
        no greenback portal, only trio's waits on the socket (issue 32: ~0.1-0.4 ms less of
        the broker's CPU per call than through :meth:`_call`). The contracts are
        :meth:`_call`'s: a cancelled call closes the connection, errors are psycopg's own
        (built from the server's answer), a read-only server's raise
        :class:`DatabaseUnavailable`. The statement is prepared on its first use on a
        connection, as psycopg's auto-prepare would after a few."""
        return await self._lone(statement, params, binary, _first_row)

    async def _lone(self, statement: LoneStatement, params: Sequence[str | bytes | None],
                    binary: bool, load: Callable[[pq.abc.PGresult], R]) -> R | None:
        """One statement straight through libpq: ``load`` of its first result with rows
        (None: it had none)."""
        if not self.usable:
            raise DatabaseUnavailable("connection is closed")
        pgconn = self._raw.pgconn
        # (libpq's own state, read directly: a psycopg ConnectionInfo per look cost more.)
        if self._begin_pending or pgconn.transaction_status != pq.TransactionStatus.IDLE:
            raise RuntimeError("lone_row runs in autocommit, outside any transaction")
        values: list[bytes | None] = []
        binary = False
        for value in params:
            if isinstance(value, str):
                if "\x00" in value:  # libpq would cut the text there
                    raise psycopg.DataError(
                        "PostgreSQL text fields cannot contain NUL (0x00) bytes")
                values.append(value.encode())
            else:
                binary = binary or value is not None
                values.append(value)
        # (None: every value as text.)
        formats = None if not binary else [
            pq.Format.BINARY if isinstance(v, bytes) else pq.Format.TEXT for v in params]
        await trio.lowlevel.checkpoint_if_cancelled()
        try:
            fileno = pgconn.socket
            for again in (False, True):
                if statement.name not in self._lone_prepared:
                    # Once per connection, as psycopg prepares a statement it has run a few
                    # times: PostgreSQL then parses and plans it once, not on every call.
                    pgconn.send_prepare(statement.name, statement.query)
                    await _lone_answer(self._raw, fileno, _first_row)
                    self._lone_prepared.add(statement.name)
                pgconn.send_query_prepared(
                    statement.name, values, param_formats=formats,
                    result_format=pq.Format.BINARY if binary else pq.Format.TEXT)
                try:
                    return await _lone_answer(self._raw, fileno, load)
                except errors.InvalidSqlStatementName:
                    # Deallocated meanwhile (psycopg sends DEALLOCATE ALL after some of its
                    # rollbacks): nothing ran; prepared again, then sent once more.
                    self._lone_prepared.discard(statement.name)
                    if again:
                        raise
            raise AssertionError("unreachable")
        except trio.Cancelled:
            await self._abandon()
            raise
        except psycopg.Error as exc:
            self._raise_for(exc)
            raise

    def _in_task(self, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
        if self._begin_pending:
            # Deferred BEGIN: rides the first statement's call instead of costing its own.
            self._raw.execute("BEGIN")
            self._begin_pending = False
        return fn(self._raw, *args)

    def _in_thread(self, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
        with self._state:
            if self._abandoned:
                raise DatabaseUnavailable("connection was abandoned before the call started")
            self._running = True
        try:
            if self._begin_pending:
                # Deferred BEGIN: rides the first statement's hop instead of costing its own.
                self._raw.execute("BEGIN")
                self._begin_pending = False
            return fn(self._raw, *args)
        finally:
            with self._state:
                self._running = False
                close_now = self._abandoned
            if close_now:
                self._raw.close()

    async def _abandon(self) -> None:
        """A call was cancelled: make sure this connection is never reused."""
        with self._state:
            self._abandoned = True
            running = self._running
        if running:
            # The thread still owns the socket and will close it when it returns; ask the
            # server to stop the statement so that happens soon.
            await self._ask_server_to_cancel()
            return
        if self._raw.pgconn.transaction_status == pq.TransactionStatus.ACTIVE:
            await self._ask_server_to_cancel()  # a statement was still running there
        self._raw.close()

    async def _ask_server_to_cancel(self) -> None:
        with trio.move_on_after(_CANCEL_REQUEST_TIMEOUT_S, shield=True):
            await trio.to_thread.run_sync(self._raw.cancel_safe, abandon_on_cancel=True)

    def _drop_read_only(self) -> None:
        self._on_read_only()
        self._close()

    def _close(self) -> None:
        with self._state:
            self._abandoned = True
            running = self._running
        if not running:
            self._raw.close()


async def _lone_answer(raw: psycopg.Connection[Any], fileno: int,
                       load: Callable[[pq.abc.PGresult], R]) -> R | None:
    """Flush what was sent, then read every result of it: ``load`` of the first result with
    rows (None: none had any), or the first error, raised as psycopg raises it."""
    pgconn = raw.pgconn
    while pgconn.flush():
        await trio.lowlevel.wait_writable(fileno)
    loaded: R | None = None
    failure: psycopg.Error | None = None
    while True:
        while pgconn.is_busy():
            await trio.lowlevel.wait_readable(fileno)
            pgconn.consume_input()
        result = pgconn.get_result()
        if result is None:
            break
        if result.status == pq.ExecStatus.TUPLES_OK:
            if loaded is None and result.ntuples:
                loaded = load(result)
        elif result.status != pq.ExecStatus.COMMAND_OK and failure is None:
            failure = errors.error_from_result(result, encoding=raw.info.encoding)
    if failure is not None:
        raise failure
    return loaded


class _LoneContext:
    """What :meth:`Connection.lone_rows` loads its values with: the connection's adapters,
    but json and jsonb decoded by :func:`_json_loads`."""

    def __init__(self, raw: psycopg.Connection[Any]) -> None:
        self.connection = raw
        self.adapters = AdaptersMap(raw.adapters)
        set_json_loads(_json_loads, self.adapters)


_MSGSPEC_LOADS = msgspec.json.decode


def _json_loads(data: bytes | str) -> Any:
    """``json.loads``, by msgspec (a third of its time: the sweeper's hand-over is a jsonb
    document per cycle), with the same values: what msgspec refuses (a number beyond a float,
    such as 1e400, which ``json.loads`` reads as inf; a lone surrogate escape) is read by
    ``json.loads`` itself."""
    try:
        return _MSGSPEC_LOADS(data)
    except (msgspec.DecodeError, RecursionError):
        return json.loads(data)


def _first_row(result: pq.abc.PGresult) -> list[bytes | None]:
    """The first row's values as the server wrote them."""
    return [result.get_value(0, col) for col in range(result.nfields)]


_PLACEHOLDER = re.compile(r"%\((\w+)\)[sbt]")


class LoneStatement:
    """A statement written with psycopg's ``%(name)s`` placeholders (one text for both
    paths), as libpq takes it for :meth:`Connection.lone_row`: ``$1``, ``$2``… and the
    parameters' names in that order. Casts stay the statement's; a ``str`` parameter is sent
    as text of unknown type (as a literal would be), a ``bytes`` one in binary (its type from
    the statement's cast or the function's signature)."""

    _count = 0

    def __init__(self, query: str):
        names: list[str] = []

        def number(match: re.Match[str]) -> str:
            if match.group(1) not in names:
                names.append(match.group(1))
            return f"${names.index(match.group(1)) + 1}"

        if "%%" in query:
            raise ValueError("a lone statement has no literal %")
        self.query = _PLACEHOLDER.sub(number, query).encode()
        self.names = tuple(names)
        LoneStatement._count += 1
        self.name = b"queen_lone_%d" % LoneStatement._count

    def params(self, values: dict[str, str | bytes | None]) -> list[str | bytes | None]:
        return [values[name] for name in self.names]


def _execute(raw: psycopg.Connection[Any], query: str, params: Params) -> int:
    return raw.execute(query, params).rowcount


def _fetchall(raw: psycopg.Connection[Any], query: str, params: Params) -> list[dict[str, Any]]:
    return raw.execute(query, params).fetchall()


def _fetchone(raw: psycopg.Connection[Any], query: str, params: Params) -> dict[str, Any] | None:
    return raw.execute(query, params).fetchone()

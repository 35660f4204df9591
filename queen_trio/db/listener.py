"""LISTEN/NOTIFY delivered to trio tasks, on a dedicated connection that heals itself.

The listening connection is a plain psycopg connection used through its libpq handle
(``conn.pgconn``): trio waits for its socket to become readable with
``trio.lowlevel.wait_readable``, then ``consume_input()`` and ``notifies()`` drain whatever
arrived. No worker thread sits between PostgreSQL and the woken task, so the bridge adds only a
scheduler hop to the wake-up.

A notification is a hint, never the only source of truth: after a reconnect every subscriber
receives :data:`MISSED` because notifications sent while the connection was down are gone, and a
subscriber that lets its buffer fill up receives :data:`MISSED` instead of the dropped ones.
Consumers re-read the database when they see it.

The connection asks for a writable server like every broker connection
(:func:`~queen_trio.db.conninfo.broker_conninfo`): NOTIFYs are only sent on the primary, so a
listener left on a standby would hear nothing. After a failover it keeps reconnecting, through
the URL's hosts in order, until the new primary accepts it.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import random
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, Final

import psycopg
import trio
from psycopg import pq, sql

from .conninfo import broker_conninfo, is_read_only_refusal, read_only_reason
from .transient import TRANSIENT_ERRORS, CountError, survived

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class Notification:
    channel: str
    payload: str
    pid: int


class _Missed(enum.Enum):
    """Marker: notifications may have been lost; re-read the state they describe.

    A one-member enum, so that ``item is MISSED`` narrows ``Notification | _Missed`` for
    mypy."""

    MISSED = "MISSED"

    def __repr__(self) -> str:
        return "MISSED"


MISSED: Final = _Missed.MISSED
#: What a subscriber is given: a notification, or MISSED.
Heard = Notification | _Missed


@dataclasses.dataclass(frozen=True, slots=True)
class ListenerStatistics:
    connected: bool
    connects_total: int
    reconnects_total: int
    notifications_total: int
    dropped_total: int
    subscribers: int
    read_only_refused_total: int = 0


@dataclasses.dataclass(eq=False)
class _Subscription:
    channel: str
    send: trio.MemorySendChannel[Notification | _Missed] | None
    missed: bool = False
    call: Callable[[Heard], None] | None = None


class _ReadOnlyServer(psycopg.OperationalError):
    """The LISTEN connection reached a server that cannot take writes."""


class Listener:
    """Holds one LISTEN connection for a fixed set of channels and fans notifications out.

    Start it with ``await nursery.start(listener.run)``; ``started()`` is reported once every
    channel is being listened to. Subscribe with ``with listener.subscribe(channel) as rx:``.
    """

    name = "listener"

    def __init__(
        self,
        conninfo: str,
        channels: Iterable[str],
        *,
        buffer_size: int = 256,
        reconnect_initial_s: float = 0.05,
        reconnect_max_s: float = 2.0,
        on_read_only: Callable[[str], None] | None = None,
        count_error: CountError | None = None,
    ) -> None:
        self.conninfo = broker_conninfo(conninfo)
        self._count_error = count_error
        self._on_read_only = on_read_only
        self._read_only_refused = 0
        self.channels = tuple(dict.fromkeys(channels))
        if not self.channels:
            raise ValueError("a Listener needs at least one channel")
        self._buffer_size = buffer_size
        self._reconnect_initial_s = reconnect_initial_s
        self._reconnect_max_s = reconnect_max_s
        self._subscriptions: dict[str, set[_Subscription]] = {c: set() for c in self.channels}
        self._raw: psycopg.Connection[Any] | None = None
        self._connects = 0
        self._notifications = 0
        self._dropped = 0

    # -- public API ---------------------------------------------------------------------

    @contextmanager
    def subscribe(
        self, channel: str
    ) -> Iterator[trio.MemoryReceiveChannel[Notification | _Missed]]:
        if channel not in self._subscriptions:
            raise ValueError(f"channel {channel!r} is not one this listener listens to")
        send, receive = trio.open_memory_channel[Notification | _Missed](self._buffer_size)
        sub = _Subscription(channel, send)
        self._subscriptions[channel].add(sub)
        try:
            yield receive
        finally:
            self._subscriptions[channel].discard(sub)
            send.close()

    @contextmanager
    def calling(self, channel: str, call: Callable[[Heard], None]
                ) -> Iterator[None]:
        """For the block, ``call`` each notification of ``channel`` (and :data:`MISSED`) as
        it is read, on the listener's task, in order: for a subscriber whose handling is
        quick and never waits (the long-poll lanes' wake-ups), without the hop to a task of
        its own that :meth:`subscribe` costs per notification. A ``call`` that raises is
        logged and counted; the next notification is delivered as usual."""
        if channel not in self._subscriptions:
            raise ValueError(f"channel {channel!r} is not one this listener listens to")
        sub = _Subscription(channel, None, call=call)
        self._subscriptions[channel].add(sub)
        try:
            yield
        finally:
            self._subscriptions[channel].discard(sub)

    def deliver_here(self, channel: str, payload: str) -> None:
        """Hand this process's subscribers of ``channel`` a notification of ``payload``, as if
        PostgreSQL had delivered it: for a wake-up only this broker needs (its own sweeper, of
        a timer it has just scheduled), without a NOTIFY's work at the commit."""
        self._dispatch(Notification(channel, payload, 0))

    @property
    def connected(self) -> bool:
        return self._raw is not None

    @property
    def backend_pid(self) -> int | None:
        """PID of the listening backend, for tests and diagnostics."""
        return None if self._raw is None else self._raw.info.backend_pid

    @property
    def alive(self) -> bool:
        """Listening now (between a lost connection and its replacement it is not)."""
        return self.connected

    def statistics(self) -> ListenerStatistics:
        return ListenerStatistics(
            connected=self.connected,
            connects_total=self._connects,
            reconnects_total=max(0, self._connects - 1),
            notifications_total=self._notifications,
            dropped_total=self._dropped,
            subscribers=sum(len(s) for s in self._subscriptions.values()),
            read_only_refused_total=self._read_only_refused,
        )

    async def run(
        self, *, task_status: trio.TaskStatus[Listener] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Listen until cancelled, reconnecting with jittered exponential backoff.

        The first connection must succeed (a broker that cannot LISTEN should not start);
        after that, connection loss is logged and healed.
        """
        raw = await self._connect()
        task_status.started(self)
        delay = self._reconnect_initial_s
        while True:
            try:
                await self._pump(raw)
            except psycopg.OperationalError as exc:
                log.warning("LISTEN connection lost (%s); reconnecting", str(exc).strip())
            except Exception as exc:
                # Something nobody foresaw: start again on a fresh connection.
                survived(log, "listener", "the LISTEN connection", exc, self._count_error)
            finally:
                self._raw = None
                raw.close()
            while True:
                await trio.sleep(delay * random.uniform(0.5, 1.0))
                try:
                    raw = await self._connect()
                except Exception as exc:
                    # Unreachable, still starting up, or only read-only servers answering
                    # (a failover in progress): the next attempt may find the new primary.
                    delay = min(delay * 2, self._reconnect_max_s)
                    if isinstance(exc, TRANSIENT_ERRORS):
                        log.warning("LISTEN reconnect failed (%s); retrying",
                                    str(exc).strip().splitlines()[0])
                    else:
                        survived(log, "listener", "a LISTEN reconnect", exc, self._count_error)
                    continue
                delay = self._reconnect_initial_s
                log.info("LISTEN connection re-established")
                self._broadcast_missed()
                break

    # -- internals ----------------------------------------------------------------------

    async def _connect(self) -> psycopg.Connection[Any]:
        listen = sql.SQL("; ").join(
            sql.SQL("LISTEN {}").format(sql.Identifier(channel)) for channel in self.channels)

        def connect() -> psycopg.Connection[Any]:
            raw = psycopg.connect(
                self.conninfo,
                autocommit=True,
                application_name="queen-trio-listener",
            )
            try:
                reason = read_only_reason(raw.info)
                if reason is not None:
                    # An explicit target_session_attrs that skips libpq's check: a standby
                    # would take the LISTEN and never deliver a NOTIFY.
                    raise _ReadOnlyServer(f"the database server is read-only ({reason})")
                # One round trip: the LISTENs commit together, before connect() returns.
                raw.execute(listen)
            except BaseException:
                raw.close()
                raise
            return raw

        try:
            raw = await trio.to_thread.run_sync(connect, abandon_on_cancel=True)
        except psycopg.OperationalError as exc:
            if isinstance(exc, _ReadOnlyServer) or is_read_only_refusal(exc):
                self._read_only_refused += 1
                if self._on_read_only is not None:
                    self._on_read_only("refused")
            raise
        self._raw = raw
        self._connects += 1
        return raw

    async def _pump(self, raw: psycopg.Connection[Any]) -> None:
        pgconn = raw.pgconn
        fd = pgconn.socket
        while True:
            # Anything already buffered by libpq is drained before waiting on the socket.
            self._drain(pgconn)
            await trio.lowlevel.wait_readable(fd)
            pgconn.consume_input()  # raises OperationalError once the server has gone
            if pgconn.status == pq.ConnStatus.BAD:
                raise psycopg.OperationalError("the server closed the LISTEN connection")

    def _drain(self, pgconn: pq.abc.PGconn) -> None:
        while (n := pgconn.notifies()) is not None:
            self._dispatch(Notification(n.relname.decode(), n.extra.decode(), n.be_pid))

    def _dispatch(self, item: Notification) -> None:
        self._notifications += 1
        for sub in self._subscriptions.get(item.channel, ()):
            self._offer(sub, item)

    def _broadcast_missed(self) -> None:
        for subs in self._subscriptions.values():
            for sub in subs:
                sub.missed = True
                self._offer(sub, None)

    def _offer(self, sub: _Subscription, item: Notification | None) -> None:
        if sub.call is not None:
            self._call(sub.call, item)
            return
        assert sub.send is not None
        try:
            if sub.missed:
                sub.send.send_nowait(MISSED)
                sub.missed = False
            if item is not None:
                sub.send.send_nowait(item)
        except trio.WouldBlock:
            sub.missed = True
            self._dropped += item is not None
        except trio.BrokenResourceError:
            pass  # the subscriber left; its context manager removes it

    def _call(self, call: Callable[[Heard], None],
              item: Notification | None) -> None:
        try:
            call(MISSED if item is None else item)
        except Exception as exc:
            survived(log, "listener", "a notification's subscriber", exc, self._count_error)

"""Fault injection for real brokers: a TCP proxy between a broker and PostgreSQL, and a ledger
that checks every timer against the log by txn.

- :class:`PgProxy` listens on loopback and relays each broker connection to PostgreSQL. A test
  can *stall* a connection (stop relaying, in one or both directions: the bytes wait in the
  kernel, nobody sees an error: a network partition, a stuck switch) and *resume* it, or *drop*
  it (both sides closed: a reset link). Which connection is which (pool, sweeper, listener)
  is learnt from ``pg_stat_activity``: the port the proxy connects from is the backend's
  ``client_port``.
- :class:`TimerBook` records what clients were told (scheduled, rescheduled, cancelled,
  absent, too_late, or nothing certain) and turns it into what the log must show: which txns
  went out exactly once, which never may, and which are either in the log once or still
  pending, never both and never neither.

Broker processes come from ``tests/brokers.py`` (SIGKILL via ``BrokerProcess.kill``, SIGSTOP
and SIGCONT via ``os.kill``); PostgreSQL restarts use ``queen_trio.embedded.EmbeddedPostgres``.
Everything here runs in the test's trio run: never block it (use ``asql``, which runs in a
thread), or the proxy stalls for real.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import psycopg
import trio
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import dict_row

# -- SQL against the test database (off the event loop) --------------------------------------


def sql(url: str, query: str, params: Any = None) -> list[dict[str, Any]]:
    with psycopg.connect(url, row_factory=dict_row, autocommit=True) as conn:
        cur = conn.execute(query, params)
        return cur.fetchall() if cur.description else []


async def asql(url: str, query: str, params: Any = None) -> list[dict[str, Any]]:
    return await trio.to_thread.run_sync(sql, url, query, params)


async def poll_until(check: Callable[[], Awaitable[Any]], within: float,
                     every: float = 0.02) -> Any:
    """Await ``check`` until it returns something truthy; trio.TooSlowError after ``within``."""
    with trio.fail_after(within):
        while True:
            result = await check()
            if result:
                return result
            await trio.sleep(every)


# -- the proxy --------------------------------------------------------------------------------


_CHUNK = 65536
_ids = itertools.count(1)


@dataclasses.dataclass(eq=False)
class Link:
    """One relayed connection: broker ⇄ proxy ⇄ PostgreSQL."""

    id: int
    client: trio.SocketStream
    upstream: trio.SocketStream
    upstream_port: int  # our end of the upstream socket: pg_stat_activity.client_port
    # A direction relays while its event is set; cleared = stalled.
    to_server: trio.Event = dataclasses.field(default_factory=trio.Event)
    to_client: trio.Event = dataclasses.field(default_factory=trio.Event)
    closed: bool = False
    application_name: str | None = None

    def __post_init__(self) -> None:
        self.to_server.set()
        self.to_client.set()


class PgProxy:
    """A loopback TCP relay in front of one PostgreSQL server.

    Use as ``proxy = await nursery.start(PgProxy(url).run)``; ``proxy.url`` is ``url`` with
    host and port pointing at the proxy. Stalls are per direction: a cleared gate stops the
    relay of that direction after the chunk in hand (data already sent is delivered).
    """

    def __init__(self, database_url: str) -> None:
        params = conninfo_to_dict(database_url)
        self._upstream = (str(params.get("host") or "127.0.0.1"), int(params.get("port") or 5432))
        self._params = params
        self.links: list[Link] = []
        self.port: int | None = None
        self._stall_new = False

    @property
    def url(self) -> str:
        assert self.port is not None, "the proxy is not running"
        return make_conninfo("", **{**self._params, "host": "127.0.0.1", "port": str(self.port)})

    async def run(self, *,
                  task_status: trio.TaskStatus[PgProxy] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as nursery:
            task_status.started(self)
            await trio.serve_listeners(self._relay, listeners, handler_nursery=nursery)

    async def _relay(self, client: trio.SocketStream) -> None:
        try:
            upstream = await trio.open_tcp_stream(*self._upstream)
        except OSError:
            await client.aclose()
            return
        link = Link(next(_ids), client, upstream, upstream.socket.getsockname()[1])
        if self._stall_new:
            link.to_server = trio.Event()
            link.to_client = trio.Event()
        self.links.append(link)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._pump, link, client, upstream, "to_server", nursery)
                nursery.start_soon(self._pump, link, upstream, client, "to_client", nursery)
        finally:
            link.closed = True
            for stream in (client, upstream):
                with trio.move_on_after(1, shield=True):
                    await stream.aclose()

    @staticmethod
    async def _pump(link: Link, source: trio.SocketStream, sink: trio.SocketStream,
                    direction: str, nursery: trio.Nursery) -> None:
        try:
            while True:
                await getattr(link, direction).wait()
                data = await source.receive_some(_CHUNK)
                if not data:
                    break
                await getattr(link, direction).wait()
                await sink.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        nursery.cancel_scope.cancel()  # one side gone: the link is over

    # -- faults -------------------------------------------------------------------------

    def live(self, application_name: str | None = None) -> list[Link]:
        return [link for link in self.links if not link.closed
                and (application_name is None or link.application_name == application_name)]

    def stall(self, links: Iterable[Link] | None = None, *, to_server: bool = True,
              to_client: bool = True, new_ones: bool = False) -> None:
        """Stop relaying on ``links`` (default: every live link); ``new_ones`` stalls links
        opened from now on too."""
        for link in self.live() if links is None else links:
            if to_server:
                link.to_server = trio.Event()
            if to_client:
                link.to_client = trio.Event()
        self._stall_new = new_ones

    def resume(self) -> None:
        self._stall_new = False
        for link in self.links:
            link.to_server.set()
            link.to_client.set()

    async def drop(self, links: Iterable[Link]) -> None:
        """Close both sides of each link, as a reset network path would."""
        for link in list(links):
            link.closed = True
            for stream in (link.client, link.upstream):
                await stream.aclose()

    async def classify(self, direct_url: str) -> dict[str, list[Link]]:
        """Name each live link after its backend's application_name; {name: [links]}."""
        rows = await asql(direct_url, "SELECT client_port, application_name FROM "
                                      "pg_stat_activity WHERE client_port IS NOT NULL")
        names = {r["client_port"]: r["application_name"] for r in rows}
        found: dict[str, list[Link]] = {}
        for link in self.live():
            link.application_name = names.get(link.upstream_port, link.application_name)
            found.setdefault(link.application_name or "?", []).append(link)
        return found


# -- the ledger -------------------------------------------------------------------------------


class TimerBook:
    """What clients were told about each timer key, and what the log must therefore show.

    Each key must be driven by one client at a time (its answers then have a total order).
    ``in_force[key]`` is the txn of the timer the broker last said is pending (or being fired:
    too_late) for that key.
    """

    def __init__(self) -> None:
        self.in_force: dict[str, str | None] = {}
        self.must_fire: set[str] = set()  # went out: exactly once in the log, not pending
        self.never: set[str] = set()  # cancelled or replaced before its fire: never in the log
        self.uncertain: set[str] = set()  # keys with an answer lost (5xx, transport error)
        self.txns_of: dict[str, set[str]] = {}
        self.answers: Counter[str] = Counter()
        # Each key's answers in order (monotonic seconds, what, txn): a problem shows its story.
        self.history: dict[str, list[tuple[float, str, str | None]]] = {}
        self.key_of: dict[str, str] = {}  # every txn noted, by its key (_note)

    def _told(self, key: str, what: str, txn: str | None) -> None:
        self.history.setdefault(key, []).append((time.monotonic(), what, txn))

    def story(self, txn: str) -> str:
        """The answers given for the key ``txn`` was scheduled under, for a failure message."""
        key = self.key_of.get(txn)
        if key is None:
            return f"  (no answer recorded for {txn})"
        return "\n".join(f"  {key} @{at:.3f} {what} {t}" for at, what, t in self.history[key])

    def _note(self, key: str, txn: str | None) -> None:
        if txn:
            self.txns_of.setdefault(key, set()).add(txn)
            self.key_of[txn] = key

    def scheduled(self, key: str, txn: str, status: str, answered_txn: str | None) -> None:
        """A schedule with client txn ``txn`` answered ``status``."""
        self.answers[f"schedule:{status}"] += 1
        self._note(key, txn)
        self._told(key, f"schedule {txn} -> {status}", answered_txn)
        if key in self.uncertain:
            return
        prev = self.in_force.get(key)
        if status == "scheduled":
            assert answered_txn == txn, (key, txn, answered_txn)
            if prev is not None:
                self.must_fire.add(prev)  # it was no longer pending and was not cancelled
            self.in_force[key] = txn
        elif status == "rescheduled":
            assert answered_txn == txn, (key, txn, answered_txn)
            assert prev is not None, f"{key}: rescheduled, but nothing was pending"
            self.never.add(prev)
            self.in_force[key] = txn
        elif status == "too_late":
            # prev is being fired, which is not yet a delivery: a fire that rolls back (a
            # restart, a lost connection) hands the row back, and later answers say what
            # became of it (SPEC "too_late": the window ends with the claim).
            assert prev is not None and answered_txn == prev, (key, prev, answered_txn)
            self.never.add(txn)
        else:
            raise AssertionError(f"{key}: schedule answered {status!r}")

    def cancelled(self, key: str, status: str, answered_txn: str | None) -> None:
        self.answers[f"cancel:{status}"] += 1
        self._told(key, f"cancel -> {status}", answered_txn)
        if key in self.uncertain:
            return
        prev = self.in_force.get(key)
        if status == "cancelled":
            assert prev is not None and answered_txn == prev, (key, prev, answered_txn)
            self.never.add(prev)
            self.in_force[key] = None
        elif status == "absent":
            if prev is not None:
                self.must_fire.add(prev)
            self.in_force[key] = None
        elif status == "too_late":
            # As for a schedule: prev stays in force until an answer or the log settles it.
            assert prev is not None, f"{key}: too_late, but nothing was pending"
        else:
            raise AssertionError(f"{key}: cancel answered {status!r}")

    def lost_answer(self, key: str, txn: str | None = None, why: str = "") -> None:
        """The request may or may not have taken effect: from now on the key is only held
        to "at most once, never both"."""
        self.answers[f"unknown:{why}"] += 1
        self._note(key, txn)
        self._told(key, f"answer lost ({why})", txn)
        self.uncertain.add(key)

    def problems(self, log: Counter[str], pending: set[str]) -> list[str]:
        """Everything the log and the pending timers contradict, as readable lines."""
        out = []
        for txn, n in log.items():
            if n > 1:
                out.append(f"txn {txn} is in the log {n} times")
            if txn in pending:
                out.append(f"txn {txn} is both in the log and pending")
        for txn in sorted(self.must_fire):
            if log[txn] != 1:
                out.append(f"txn {txn} was reported gone (absent, or replaced by a new "
                           f"schedule) but is in the log {log[txn]} times")
        for txn in sorted(self.never):
            if log[txn] or txn in pending:
                out.append(f"txn {txn} was cancelled/replaced/refused but is "
                           f"{'in the log' if log[txn] else 'pending'}")
        for key, in_force in self.in_force.items():
            if key not in self.uncertain and in_force is not None and (log[in_force] == 1) == (
                    in_force in pending):
                out.append(f"{key}: txn {in_force} is {'both' if log[in_force] else 'neither'} "
                           f"in the log {'and' if log[in_force] else 'nor'} pending")
        known = {t for txns in self.txns_of.values() for t in txns}
        out += [f"txn {t} in the log was never scheduled" for t in log if t not in known]
        return out


async def log_by_txn(url: str) -> Counter[str]:
    """How many timer-made frames carry each txn (the log's head: these tests end before any
    seal)."""
    rows = await asql(url, "SELECT transaction_id AS txn, count(*) AS n FROM queen.frames "
                           "WHERE meta ? 'timer' GROUP BY 1")
    return Counter({r["txn"]: r["n"] for r in rows})


async def pending_txns(url: str) -> set[str]:
    return {r["txn"] for r in await asql(url, "SELECT txn FROM queen.timers")}


async def assert_ledger(url: str, book: TimerBook) -> Counter[str]:
    log, pending = await log_by_txn(url), await pending_txns(url)
    problems = book.problems(log, pending)
    if problems:
        txns = sorted({t for line in problems[:5] for t in line.split() if t in book.key_of})
        dead = await asql(url, "SELECT transaction_id, error FROM queen.dead_letters "
                               "WHERE transaction_id = ANY(%s)", [txns])
        stories = "\n".join(book.story(t) for t in txns)
        raise AssertionError(f"{len(problems)} problems, e.g.:\n" + "\n".join(problems[:15])
                             + f"\nwhat the clients were told:\n{stories}"
                             + f"\ndead letters of these txns: {dead}"
                             + f"\nnow (monotonic): {time.monotonic():.3f}")
    return log


def assert_each_once_or_pending(log: Counter[str], pending: set[str],
                                expected: set[str]) -> None:
    """Every txn of ``expected`` is in the log exactly once or still pending, never both and
    never neither; nothing else is in the log."""
    twice = {t: n for t, n in log.items() if n > 1}
    both = expected & pending & set(log)
    neither = expected - pending - set(log)
    stranger = set(log) - expected
    assert not (twice or both or neither or stranger), (
        f"in the log twice: {sorted(twice)[:5]} ({len(twice)}); both: {sorted(both)[:5]} "
        f"({len(both)}); neither: {sorted(neither)[:5]} ({len(neither)}); "
        f"unknown: {sorted(stranger)[:5]}")

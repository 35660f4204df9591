"""A parked pop waiting inside PostgreSQL for a timer about to fire into its queue
(queen.pop_head_after in schema/functions/log.sql): the lock an announced sweep holds until it
commits, the pop that queues behind it, and the whole path through the broker."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import httpx
import psycopg
import pytest
import trio
from psycopg.rows import dict_row

from queen_trio.config import Settings
from queen_trio.db.rows import DictConnection
from queen_trio.log import store as log_store
from queen_trio.log.rules import PopRequest
from queen_trio.log.wakeups import HANDOVER_WAIT_S
from queen_trio.server import run_broker
from queen_trio.timers import store as timer_store
from queen_trio.timers.store import NextDue

from ..conftest import replace_settings
from .test_timer_races import timer

GROUP = "workers"
RESULTS = ("handed_over", "handed_nothing", "handed_back", "delivered", "gave_up", "fallback")
FIRE_LOCK = "SELECT pg_try_advisory_xact_lock_shared(1363170306, queen.fire_lock_key(%s, %s)) AS ok"


def connect(url: str) -> DictConnection:
    return psycopg.connect(url, autocommit=True, row_factory=dict_row)


def tenant_of(conn: DictConnection) -> int:
    return conn.execute("SELECT tenant_id FROM queen.tenants WHERE name = 'default'"
                        ).fetchone()["tenant_id"]


def db_now(conn: DictConnection) -> float:
    return conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8 AS t"
                        ).fetchone()["t"]


def request(queue: str) -> PopRequest:
    return PopRequest(queue=queue, partition=None, group=GROUP, batch=10, wait=False,
                      timeout_ms=0, auto_ack=True)


def push(conn: DictConnection, tenant: int, queue: str, payload: Any) -> None:
    log_store.append(conn, tenant, [
        log_store.NewFrame(queue, "Default", payload, f"txn-{uuid.uuid4()}")])


def primed(conn: DictConnection, queue: str) -> int:
    """A queue whose group has a cursor (the first pop of a group is the general pop's)."""
    tenant = tenant_of(conn)
    with conn.transaction():
        push(conn, tenant, queue, "first")
    with conn.transaction():
        assert log_store.pop(conn, tenant, request(queue)).batch is not None
    return tenant


def in_thread(fn: Any, *args: Any, **kwargs: Any) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        started = time.monotonic()
        out["value"] = fn(*args, **kwargs)
        out["returned"] = time.monotonic()
        out["took"] = out["returned"] - started

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


def test_the_pop_queues_behind_the_fire_and_takes_its_frame_at_the_commit(
    database_url: str,
) -> None:
    with connect(database_url) as conn, connect(database_url) as firing, \
            connect(database_url) as popping:
        tenant = primed(conn, "q")
        with firing.transaction():
            # What an announced sweep does: hold the queue's fire lock, append, commit.
            firing.execute("SELECT pg_advisory_xact_lock(1363170306, queen.fire_lock_key(%s, %s))",
                           (tenant, "q"))
            push(firing, tenant, "q", {"fired": True})
            now = db_now(conn)
            thread, out = in_thread(log_store.pop_head_after, popping, tenant, request("q"),
                                    now, now + 5.0, sync_commit=False)
            time.sleep(0.3)
            assert thread.is_alive()  # queued behind the uncommitted fire
            committed = time.monotonic()
        thread.join(5)
        assert not thread.is_alive()
        got = out["value"]
        assert got is not None
        assert [log_store.payload_value(m) for m in got.batch.messages] == [{"fired": True}]
        assert out["returned"] - committed < 1.0


def test_with_no_fire_in_progress_the_pop_answers_at_the_due_instant(database_url: str) -> None:
    with connect(database_url) as conn:
        tenant = primed(conn, "q")
        due = db_now(conn) + 0.2
        got = log_store.pop_head_after(conn, tenant, request("q"), due, due + 5.0)
        assert got is not None and got.batch is None
        assert db_now(conn) - due < 1.0  # not held until give_up
        with conn.transaction():
            push(conn, tenant, "q", "later")
        got = log_store.pop_head_after(conn, tenant, request("q"), db_now(conn), db_now(conn))
        assert [log_store.payload_value(m) for m in got.batch.messages] == ["later"]


def test_a_fire_later_than_give_up_is_left_to_the_notify(database_url: str) -> None:
    with connect(database_url) as conn, connect(database_url) as firing:
        tenant = primed(conn, "q")
        with firing.transaction():
            firing.execute("SELECT pg_advisory_xact_lock(1363170306, queen.fire_lock_key(%s, %s))",
                           (tenant, "q"))
            now = db_now(conn)
            with conn.transaction():
                got = log_store.pop_head_after(conn, tenant, request("q"), now, now + 0.3)
                waited = db_now(conn) - now
                # The pop's own statements keep the session's lock timeout.
                assert conn.execute("SHOW lock_timeout").fetchone()["lock_timeout"] == "0"
            assert got is not None and got.batch is None
            assert 0.25 < waited < 2.0


def test_an_announced_sweep_holds_the_fire_lock_until_it_commits(database_url: str) -> None:
    with connect(database_url) as conn, connect(database_url) as sweeping, \
            connect(database_url) as other:
        tenant = primed(conn, "q")
        due = timer("q", "due", -10, {"n": 1})
        with conn.transaction():
            timer_store.schedule_many(conn, tenant, [due], notify_within_ms=0)
        announced = NextDue(tenant, "q", "Default", 0.0)
        with conn.transaction():
            # Hold the partition, so the sweep's append waits while it holds the fire lock.
            conn.execute("SELECT 1 FROM queen.partitions FOR UPDATE")
            thread, out = in_thread(timer_store.sweep, sweeping, uuid.uuid4(), "test", 10,
                                    60_000, max_payload=1 << 20, fire_lock=announced)
            time.sleep(0.3)
            assert thread.is_alive()
            assert other.execute(FIRE_LOCK, (tenant, "q")).fetchone()["ok"] is False
            assert other.execute(FIRE_LOCK, (tenant, "elsewhere")).fetchone()["ok"] is True
        thread.join(5)
        assert not thread.is_alive() and len(out["value"].fired) == 1
        assert other.execute(FIRE_LOCK, (tenant, "q")).fetchone()["ok"] is True
        # A second broker announcing the same fire never waits for the first's lock.
        with other.transaction():
            other.execute("SELECT pg_advisory_xact_lock(1363170306, queen.fire_lock_key(%s, %s))",
                          (tenant, "q"))
            started = time.monotonic()
            timer_store.sweep(sweeping, uuid.uuid4(), "test", 10, 60_000, max_payload=1 << 20,
                              fire_lock=announced)
            assert time.monotonic() - started < 1.0


async def _metric(http: httpx.AsyncClient, result: str) -> float:
    for line in (await http.get("/metrics")).text.splitlines():
        if line.startswith(f'queen_pop_fire_waits_total{{result="{result}"}}'):
            return float(line.split()[-1])
    return 0.0


async def _gauge(http: httpx.AsyncClient, name: str) -> float:
    """A metric without labels (or the sum of its samples), from /metrics."""
    return sum(float(line.split()[-1]) for line in (await http.get("/metrics")).text.splitlines()
               if line.startswith((f"{name} ", f"{name}{{")))


async def _gauge_is(http: httpx.AsyncClient, name: str, value: float, *,
                    at_least: bool = False) -> bool:
    got = await _gauge(http, name)
    return got >= value if at_least else got == value


async def _until(what: str, holds: Any, limit_s: float = 15.0) -> None:
    """Wait for a state the broker shows (a pop parked, a sweep held up), however loaded the
    machine: up to ``limit_s``."""
    with trio.move_on_after(limit_s):
        while not await holds():
            await trio.sleep(0.01)
        return
    raise AssertionError(f"not seen within {limit_s} s: {what}")


def _sweep_held_up(conn: DictConnection) -> bool:
    """The sweeper's fire waits for a lock (the partition the test holds)."""
    return conn.execute(
        "SELECT count(*) AS n FROM pg_stat_activity WHERE datname = current_database() "
        "AND application_name = 'queen-trio-sweeper' AND wait_event_type = 'Lock'"
    ).fetchone()["n"] > 0


def _sweep_popping_held_up(conn: DictConnection) -> bool:
    """The sweep that pops for a reserved pop (queen.sweep_timers_and_pop) waits for a lock:
    the sweeper reserved the parked pop for the fire, and the fire is held up."""
    return conn.execute(
        "SELECT count(*) AS n FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event_type = 'Lock' AND query LIKE '%%sweep%%_and_pop(%%'"
    ).fetchone()["n"] > 0


async def _ack(http: httpx.AsyncClient, message: dict[str, Any]) -> httpx.Response:
    return await http.post("/api/v1/ack", json={
        "transactionId": message["transactionId"], "partitionId": message["partitionId"],
        "leaseId": message["leaseId"], "status": "completed"})


async def _give_the_group_a_cursor(http: httpx.AsyncClient, pop_path: str) -> None:
    """Push, pop and ack one message: from then on pop_head (and so the fire's own pop) serves
    the group."""
    await http.post("/api/v1/push", json={"items": [{"queue": "q", "payload": 0}]})
    first = (await http.get(pop_path, params={"batch": "1"})).json()["messages"][0]
    assert (await _ack(http, first)).status_code == 200


async def _parked_pops_receive(
    http: httpx.AsyncClient, timers: int, until: Any = None, *, auto_ack: bool = True,
) -> list[dict[str, Any]]:
    """Park a pop, schedule a timer into its queue, take the frame (and ack it, without
    ``auto_ack``); ``timers`` times, or fewer once ``until()`` holds."""
    assert (await http.post("/api/v1/configure", json={"queue": "q"})).status_code == 200
    frames: list[dict[str, Any]] = []
    answer: dict[str, httpx.Response] = {}

    async def park() -> None:
        answer["pop"] = await http.get("/api/v1/pop/queue/q", params={
            "wait": "true", "timeout": "5000", "autoAck": str(auto_ack).lower()})

    for i in range(timers):

        async with trio.open_nursery() as nursery:
            nursery.start_soon(park)
            await trio.sleep(0.05)  # parked
            put = await http.put(f"/api/v1/timers/q/t{i}",
                                 json={"delayMs": 250, "payload": {"i": i}})
            assert put.status_code == 200
        assert answer["pop"].status_code == 200
        (message,) = answer["pop"].json()["messages"]
        assert message["timer"]["key"] == f"t{i}"
        assert message["createdAt"] >= put.json()["deliverAt"]
        if not auto_ack:
            assert (await _ack(http, message)).status_code == 200
        frames.append(message)
        if until is not None and await until():
            break
    return frames


async def test_parked_pops_are_handed_timer_frames_by_the_fire(http: httpx.AsyncClient) -> None:
    async def one_handed() -> bool:
        return await _metric(http, "handed_over") >= 1

    # Timing decides each one (a sweeper that wakes too late to look ahead, on a loaded
    # machine, reserves nobody and the NOTIFY serves the pop): up to ten.
    frames = await _parked_pops_receive(http, 10, until=one_handed, auto_ack=False)
    assert [f["data"] for f in frames] == [{"i": i} for i in range(len(frames))]
    outcomes = {r: await _metric(http, r) for r in RESULTS}
    # A parked pop is reserved for one fire at a time; the group's very first pop is the
    # general pop's, which the fire's own pop does not serve (handed_nothing); one took its
    # frame from the sweep; none was handed back; none waited behind the fire lock (a pop
    # parked here is always reserved instead).
    assert sum(outcomes.values()) <= len(frames)
    assert outcomes["handed_over"] == 1 and outcomes["handed_back"] == 0
    assert outcomes["delivered"] == outcomes["gave_up"] == 0


async def test_parked_autoack_pops_take_timer_frames_through_the_fire_lock(
    http: httpx.AsyncClient,
) -> None:
    async def one_delivered() -> bool:
        return await _metric(http, "delivered") >= 1

    # Timing decides each one (a sweep sent late leaves its pop to the NOTIFY): up to ten.
    frames = await _parked_pops_receive(http, 10, until=one_delivered)
    assert [f["data"] for f in frames] == [{"i": i} for i in range(len(frames))]
    waits = {r: await _metric(http, r) for r in RESULTS}
    # An autoAck pop is never reserved for a fire; it is told of its timer at most once (the
    # group's very first pop is the general pop's, which the fire lock does not serve), and one
    # took its frame at the commit.
    assert sum(waits.values()) <= len(frames)
    assert waits["delivered"] == 1
    assert waits["handed_over"] == waits["handed_nothing"] == waits["handed_back"] == 0


async def test_a_reserved_pop_that_gave_up_has_the_fires_batch_handed_back(
    settings: Settings,
) -> None:
    """The fire leased its frame to a pop that had stopped waiting (the sweep was held up past
    HANDOVER_WAIT_S): the sweeper releases the lease at once, no retry spent, and the next pop
    takes the message, long before the lease (300 s) would have expired."""
    async with trio.open_nursery() as nursery:
        handle = await nursery.start(run_broker, settings)
        async with httpx.AsyncClient(base_url=handle.url, timeout=20) as http:
            q = "/api/v1/pop/queue/q"
            await _give_the_group_a_cursor(http, q)
            answer: dict[str, httpx.Response] = {}

            async def parked_pop() -> None:
                answer["pop"] = await http.get(q, params={"wait": "true", "timeout": "15000"})

            assert settings.database_url is not None
            with connect(settings.database_url) as holder, \
                    connect(settings.database_url) as watcher:
                nursery.start_soon(parked_pop)
                await _until("the pop parked",
                             lambda: _gauge_is(http, "queen_longpoll_waiters", 1))
                looks = await _gauge(http, "queen_longpoll_looks_total")
                put = await http.put("/api/v1/timers/q/late", json={"delayMs": 300,
                                                                    "payload": "late"})
                assert put.status_code == 200
                with holder.transaction():
                    # The fire's append waits for the partition: the sweep is held up.
                    holder.execute("SELECT 1 FROM queen.partitions FOR UPDATE")
                    await _until("the sweep popping for the reserved pop, held up",
                                 lambda: trio.to_thread.run_sync(_sweep_popping_held_up,
                                                                 watcher))
                    # HANDOVER_WAIT_S after the due instant the pop stops waiting for the
                    # sweep and looks itself (counted as a parked pop's look).
                    await trio.sleep(HANDOVER_WAIT_S)
                    await _until("the reserved pop gave up on the hand-over", lambda: _gauge_is(
                        http, "queen_longpoll_looks_total", looks + 1, at_least=True))
                    await trio.sleep(0.2)
                    assert "pop" not in answer
                    held_until = time.monotonic()
            with trio.fail_after(10):
                while "pop" not in answer:
                    await trio.sleep(0.01)
            assert time.monotonic() - held_until < 5
            assert answer["pop"].status_code == 200
            (message,) = answer["pop"].json()["messages"]
            assert message["data"] == "late" and message["retryCount"] == 0
            assert await _metric(http, "handed_back") == 1
            assert await _metric(http, "handed_over") == 1
        handle.shutdown()


async def test_a_timer_the_floors_cycle_fires_is_handed_to_a_parked_pop(
    settings: Settings,
) -> None:
    """Under steady load (timers due closer together than QUEEN_SWEEPER_MIN_SLEEP_MS) every
    cycle is the floor's, not a timer's: it still tells the pops parked on the queue of the
    first timer it fires (as the last sweep answered it), and the sweep pops for one of them,
    instead of a NOTIFY waking a pop that then pops in a transaction of its own."""
    floor_s = 0.6
    slow = replace_settings(settings, sweeper_min_sleep_ms=int(floor_s * 1000))
    async with trio.open_nursery() as nursery:
        handle = await nursery.start(run_broker, slow)
        async with httpx.AsyncClient(base_url=handle.url, timeout=20) as http:
            q = "/api/v1/pop/queue/q"
            await _give_the_group_a_cursor(http, q)
            answer: dict[str, httpx.Response] = {}

            async def parked_pop() -> None:
                answer["pop"] = await http.get(q, params={"wait": "true", "timeout": "10000"})

            async with trio.open_nursery() as pops:
                pops.start_soon(parked_pop)
                await trio.sleep(0.05)
                # "first" has a cycle of its own; "second", due half a floor later, is fired
                # by the floor's cycle after it.
                for key, delay_ms in (("first", 400), ("second", 400 + int(floor_s * 500))):
                    put = await http.put(f"/api/v1/timers/q/{key}",
                                         json={"delayMs": delay_ms, "payload": key})
                    assert put.status_code == 200
            (message,) = answer["pop"].json()["messages"]
            assert message["data"] == "first"
            assert (await _ack(http, message)).status_code == 200
            handed = await _metric(http, "handed_over")
            async with trio.open_nursery() as pops:
                pops.start_soon(parked_pop)
            (message,) = answer["pop"].json()["messages"]
            assert message["data"] == "second"
            assert await _metric(http, "handed_over") == handed + 1
            assert await _metric(http, "handed_back") == 0
        handle.shutdown()


async def test_with_the_wait_off_parked_pops_hear_of_fires_by_notify(settings: Settings) -> None:
    plain = replace_settings(settings, pop_fire_wait_ms=0)
    async with trio.open_nursery() as nursery:
        handle = await nursery.start(run_broker, plain)
        async with httpx.AsyncClient(base_url=handle.url, timeout=10) as http:
            frames = await _parked_pops_receive(http, 2)
            assert len(frames) == 2
            for result in RESULTS:
                assert await _metric(http, result) == 0
        handle.shutdown()


async def test_a_reserved_pop_whose_client_left_has_the_fires_batch_handed_back(
    settings: Settings,
) -> None:
    """The consumer hangs up while the fire meant for its parked pop is under way: the fire
    still leases the frame to that pop, the sweeper finds it gone and releases the lease, and
    the next consumer gets the message at once, unretried."""
    async with trio.open_nursery() as nursery:
        handle = await nursery.start(run_broker, settings)
        async with httpx.AsyncClient(base_url=handle.url, timeout=20) as http:
            q = "/api/v1/pop/queue/q"
            await _give_the_group_a_cursor(http, q)
            assert settings.database_url is not None
            with connect(settings.database_url) as holder, \
                    connect(settings.database_url) as watcher:
                # Timing decides each one (a sweeper that wakes too late to look ahead, on a
                # loaded machine, reserves nobody and the NOTIFY serves the pop): up to five.
                for attempt in range(5):
                    key = f"orphan{attempt}"
                    leaving = trio.CancelScope()
                    answer: dict[str, httpx.Response] = {}

                    async def parked_pop(leaving: trio.CancelScope = leaving,
                                         answer: dict[str, httpx.Response] = answer) -> None:
                        async with httpx.AsyncClient(base_url=handle.url, timeout=20) as own:
                            with leaving:
                                answer["pop"] = await own.get(
                                    q, params={"wait": "true", "timeout": "15000"})

                    nursery.start_soon(parked_pop)
                    await _until("the pop parked",
                                 lambda: _gauge_is(http, "queen_longpoll_waiters", 1))
                    put = await http.put(f"/api/v1/timers/q/{key}",
                                         json={"delayMs": 300, "payload": key})
                    assert put.status_code == 200
                    with holder.transaction():
                        holder.execute("SELECT 1 FROM queen.partitions FOR UPDATE")
                        await _until("the fire's sweep held up", lambda: trio.to_thread.run_sync(
                            _sweep_held_up, watcher))
                        reserved = await trio.to_thread.run_sync(_sweep_popping_held_up,
                                                                 watcher)
                        if reserved:
                            leaving.cancel()  # the consumer hangs up (its connection closes)
                            await _until("the broker saw the consumer leave",
                                         lambda: _gauge_is(http, "queen_longpoll_waiters", 0))
                    if reserved:
                        break
                    with trio.fail_after(10):
                        while "pop" not in answer:
                            await trio.sleep(0.01)
                    (message,) = answer["pop"].json()["messages"]
                    assert (await _ack(http, message)).status_code == 200
                else:
                    raise AssertionError("the sweeper reserved the parked pop in no attempt")
            with trio.fail_after(10):
                while await _metric(http, "handed_back") < 1:
                    await trio.sleep(0.02)
            took = time.monotonic()
            again = await http.get(q, params={"wait": "true", "timeout": "5000"})
            # At once (without the hand-back: nothing, at the end of the 5 s wait).
            assert time.monotonic() - took < 3.0
            (message,) = again.json()["messages"]
            assert message["data"] == key and message["retryCount"] == 0
            assert await _metric(http, "handed_over") == 1
        handle.shutdown()


def test_the_sweep_pops_for_a_reserved_pop_in_the_fires_transaction(database_url: str) -> None:
    """queen.sweep_timers_and_pop: the frame, the timer's deletion and the pop's lease are one
    commit; released whole (the pop had gone), the message goes to the next pop unretried."""
    with connect(database_url) as conn, connect(database_url) as sweeping:
        tenant = primed(conn, "q")
        due = timer("q", "due", -10, {"n": 1})
        with conn.transaction():
            (scheduled,) = timer_store.schedule_many(conn, tenant, [due], notify_within_ms=0)
        leased = PopRequest(queue="q", partition=None, group=GROUP, batch=10, wait=True,
                            timeout_ms=5000, auto_ack=False)
        swept = timer_store.sweep(sweeping, uuid.uuid4(), "test", 10, 60_000,
                                  max_payload=1 << 20, fire_lock=NextDue(tenant, "q", "Default",
                                                                         0.0), pop=leased)
        assert len(swept.fired) == 1
        assert swept.popped is not None and swept.popped.batch is not None
        batch = swept.popped.batch
        assert [log_store.payload_value(m) for m in batch.messages] == [{"n": 1}]
        assert batch.lease_id is not None and batch.partition == "Default"
        assert batch.messages[0].meta == {"messageId": str(scheduled.message_id),
                                          "timer": {"key": "due", "deliverAt": ANY_TEXT}}
        # Exactly what the ordinary pop answers for the same frame, once released.
        assert log_store.pop_head(conn, tenant, leased).batch is None
        log_store.release_batch(conn, tenant, batch)
        again = log_store.pop_head(conn, tenant, leased)
        assert again is not None and again.batch is not None
        assert ([(m.offset, log_store.payload_value(m), m.created_at, m.meta)
                 for m in again.batch.messages]
                == [(m.offset, log_store.payload_value(m), m.created_at, m.meta)
                    for m in batch.messages])
        assert again.batch.lease_id != batch.lease_id


def test_a_sweep_with_nothing_for_the_pop_answers_so(database_url: str) -> None:
    with connect(database_url) as conn, connect(database_url) as sweeping:
        tenant = primed(conn, "q")
        swept = timer_store.sweep(sweeping, uuid.uuid4(), "test", 10, 60_000,
                                  max_payload=1 << 20,
                                  fire_lock=NextDue(tenant, "q", "Default", 0.0),
                                  pop=request("q"))
        assert swept.fired == [] and swept.popped == log_store.PopOutcome(None)
        # A group that never popped this queue: the general pop's case, nothing taken.
        fresh = PopRequest(queue="q", partition=None, group="newcomers", batch=10, wait=True,
                           timeout_ms=5000, auto_ack=False)
        swept = timer_store.sweep(sweeping, uuid.uuid4(), "test", 10, 60_000,
                                  max_payload=1 << 20,
                                  fire_lock=NextDue(tenant, "q", "Default", 0.0), pop=fresh)
        assert swept.popped is None


class _AnyText:
    def __eq__(self, other: object) -> bool:
        return isinstance(other, str) and other != ""


ANY_TEXT = _AnyText()


@pytest.mark.parametrize("drained", [False, True], ids=["sweep_and_pop", "stream_pop"])
def test_a_fire_leased_to_a_reserved_pop_commits_as_pops_do(database_url: str,
                                                            drained: bool) -> None:
    """QUEEN_POP_COMMIT reaches the sweeper's hand-over (queen.sweep_timers_and_pop, and
    queen.sweep_settle_and_pop for a stream's pop): under async the fire and its lease commit
    without waiting for the WAL flush, under sync at the server's level (here the operator's
    remote_apply), as every other pop's lease (seen from inside the transaction)."""
    with connect(database_url) as conn, connect(database_url) as sweeping:
        tenant = primed(conn, "q")
        sweeping.execute("SET synchronous_commit = remote_apply")
        leased = PopRequest(queue="q", partition=None, group=GROUP, batch=10, wait=True,
                            timeout_ms=5000, auto_ack=False)
        with conn.transaction():
            timer_store.schedule_many(conn, tenant, [timer("q", "due", -10, 1)],
                                      notify_within_ms=0)
        for pop_sync, level in ((False, "off"), (True, "remote_apply")):
            # (Rolled back: the same timer fires in both.)
            with sweeping.transaction(force_rollback=True):
                swept = timer_store.sweep(
                    sweeping, uuid.uuid4(), "test", 10, 60_000, max_payload=1 << 20,
                    fire_lock=NextDue(tenant, "q", "Default", 0.0), pop=leased,
                    drained=drained, pop_sync=pop_sync)
                assert len(swept.fired) == 1
                assert swept.popped is not None and swept.popped.batch is not None
                assert swept.popped.batch.lease_id is not None
                assert sweeping.execute("SHOW synchronous_commit").fetchone()[
                    "synchronous_commit"] == level

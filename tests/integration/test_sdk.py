"""The async SDK against a real broker: every call, its typed results and its errors."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import psycopg
import pytest
import trio

from queen_trio.client import (
    AckResult,
    AckStatus,
    BadRequest,
    Batch,
    Client,
    Conflict,
    Forbidden,
    KvEntry,
    KvPage,
    KvPrecondition,
    KvRows,
    KvWrite,
    Message,
    NotFound,
    PayloadTooLarge,
    PushResult,
    PushStatus,
    RetryPolicy,
    TimerInfo,
    TimerResult,
    TimerState,
    TimerStatus,
    TransactionRefused,
)
from queen_trio.config import Settings
from queen_trio.server import BrokerHandle

FAST_RETRY = RetryPolicy(retries=2, base_backoff_s=0.01, max_backoff_s=0.05)


@pytest.fixture
def settings(database_url: str) -> Settings:
    """A quick sweeper, a small timer payload ceiling and a one-hour horizon."""
    return Settings(database_url=database_url, port=0, graceful_timeout_ms=1000, db_pool_size=5,
                    sweeper_min_sleep_ms=5, sweeper_max_sleep_ms=200, sweeper_backoff_ms=20,
                    timers_max_horizon_s=3600, timers_max_payload_bytes=4096)


@pytest.fixture
async def queen(broker: BrokerHandle) -> AsyncIterator[Client]:
    async with Client(broker.url, retry=FAST_RETRY, timeout=10) as client:
        yield client


async def pop_one(queen: Client, queue: str, **options: Any) -> Message:
    batch = await queen.pop(queue, wait="3s", **options)
    assert len(batch) == 1, batch
    return batch.messages[0]


# -- timers -----------------------------------------------------------------------------------


async def test_schedule_reschedule_peek_cancel(queen: Client) -> None:
    timer = queen.timer("reminders").key("trial-ending:42")
    first = await timer.delay("30m").payload({"accountId": 42}).schedule()
    assert isinstance(first, TimerResult)
    wire: str = first.status  # a str, as a caller comparing to the wire has it
    assert first.ok and first.status is TimerStatus.SCHEDULED and wire == "scheduled"
    assert (first.queue, first.key, first.partition) == ("reminders", "trial-ending:42",
                                                         "Default")
    assert first.txn and isinstance(first.deliver_at, datetime)
    in_30m = datetime.now(UTC) + timedelta(minutes=30)
    assert abs((first.deliver_at - in_30m).total_seconds()) < 5

    again = await timer.delay(timedelta(hours=1)).payload({"v": 2}).partition("p1") \
                       .txn("my-txn").schedule()
    assert again.status is TimerStatus.RESCHEDULED and again.txn == "my-txn"
    assert again.partition == "p1"

    info = await timer.peek()
    assert isinstance(info, TimerInfo)
    assert (info.payload, info.txn, info.partition, info.state, info.attempts) == (
        {"v": 2}, "my-txn", "p1", TimerState.PENDING, 0)
    assert abs((info.deliver_at - (in_30m + timedelta(minutes=30))).total_seconds()) < 5

    cancelled = await timer.cancel(txn="my-txn")
    assert (cancelled.ok, cancelled.status, cancelled.txn) == (True, TimerStatus.CANCELLED,
                                                               "my-txn")
    # absent is a value, not an exception, and echoes the txn we gave.
    absent = await timer.cancel(txn="my-txn")
    assert (absent.ok, absent.status, absent.txn) == (False, TimerStatus.ABSENT, "my-txn")
    assert await timer.peek() is None


async def test_keys_with_slashes_colons_spaces_and_percent_signs(queen: Client) -> None:
    keys = ["a/b/c", "user:7 trial end", "100% sure?", "x#y&z=1", "ü/ñ", "a//b", "../up"]
    for key in keys:
        r = await queen.timer("odd-keys").key(key).delay("1h").payload(key).schedule()
        assert (r.status, r.key) == (TimerStatus.SCHEDULED, key)
    for key in keys:
        info = await queen.timer("odd-keys").key(key).peek()
        assert info is not None and info.key == key and info.payload == key
    listed = [t.key async for t in queen.timers("odd-keys").list()]
    assert sorted(listed) == sorted(keys)
    for key in keys:
        assert (await queen.timer("odd-keys").key(key).cancel()).status is TimerStatus.CANCELLED


async def test_list_walks_every_page(queen: Client) -> None:
    keys = [f"k{i:02d}" for i in range(7)]
    for key in keys:
        await queen.timer("many").key(key).delay("10m").payload(None).schedule()
    listing = queen.timers("many").list(page_size=3)
    pages = [page async for page in listing.pages()]
    assert [len(p.items) for p in pages] == [3, 3, 1]
    assert [t.key async for t in listing] == keys
    assert {(t.payload, t.state) async for t in queen.timers("many").list()} == {
        (None, TimerState.PENDING)}
    assert [t async for t in queen.timers("nothing-here").list()] == []


async def test_a_timer_fires_into_its_queue_with_its_txn(queen: Client) -> None:
    r = await queen.timer("fired").key("soon").delay("50ms").payload({"n": 1}).txn("t-1") \
                   .schedule()
    message = await pop_one(queen, "fired", auto_ack=True)
    assert (message.data, message.transaction_id) == ({"n": 1}, r.txn)
    assert message.timer is not None and message.timer.key == "soon"
    assert message.id == r.message_id  # promised when it was scheduled
    # Delivered: cancel now answers absent, and the echoed txn points at the message.
    late = await queen.timer("fired").key("soon").cancel(txn="t-1")
    assert late.status is TimerStatus.ABSENT and late.txn == message.transaction_id


async def test_invalid_timers_fail_before_any_request(queen: Client) -> None:
    timer = queen.timer("invalid")
    with pytest.raises(ValueError, match="duration"):
        timer.key("k").delay("1.5h")
    with pytest.raises(ValueError, match="delay"):
        timer.key("k").payload(1).schedule()
    with pytest.raises(ValueError, match="key"):
        timer.delay("1s").schedule()
    assert [t async for t in queen.timers("invalid").list()] == []


# -- the log ----------------------------------------------------------------------------------


async def test_push_pop_ack(queen: Client) -> None:
    first = await queen.push("orders", {"id": 1}, txn="order-1")
    assert (first.status, first.transaction_id, first.offset) == (PushStatus.QUEUED, "order-1", 0)
    repeat = await queen.push("orders", {"id": 1}, txn="order-1")
    assert repeat.status is PushStatus.DUPLICATE and repeat.offset is None
    more = await queen.push_many("orders", [{"id": 2}, {"id": 3}], partition="Default")
    assert [r.offset for r in more] == [1, 2]

    assert len(await queen.pop("empty-queue")) == 0
    batch = await queen.pop("orders", batch=10, wait="1s")
    assert isinstance(batch, Batch) and batch.lease_id is not None
    assert [m.data for m in batch] == [{"id": 1}, {"id": 2}, {"id": 3}]
    assert all(m.lease_id == batch.lease_id for m in batch)
    acks = [await queen.ack(m) for m in batch]
    assert [a.status for a in acks] == [AckStatus.COMPLETED] * 3
    assert acks[-1].lease_released and not acks[0].already_acked
    again = await queen.ack(batch.messages[0])
    assert again.already_acked
    assert len(await queen.pop("orders")) == 0


async def test_consumer_groups_and_partitions(queen: Client) -> None:
    await queen.push("events", "a", partition="p1")
    await queen.push("events", "b", partition="p2")
    only_p2 = await queen.pop("events", partition="p2", group="g1", auto_ack=True)
    assert [m.data for m in only_p2] == ["b"] and only_p2.lease_id is None
    rest = await queen.pop("events", group="g1", auto_ack=True)
    assert [m.data for m in rest] == ["a"]
    other_group = await queen.pop("events", group="g2", batch=5, auto_ack=True)
    assert len(other_group) == 1 and other_group.messages[0].consumer_group == "g2"


async def test_configure_extend_lease_and_failed_acks(queen: Client) -> None:
    config = await queen.configure("jobs", lease_time="2s", retry_limit=1)
    assert (config.lease_time_s, config.retry_limit, config.created) == (2, 1, True)
    evicting = await queen.configure("evicting", max_wait="1h")
    assert (evicting.max_wait_s, evicting.ignored) == (3600, ())
    await queen.push("jobs", {"job": 1})
    message = await pop_one(queen, "jobs")
    assert message.lease_id is not None
    expires = await queen.extend_lease(message.lease_id, 60)
    assert expires > datetime.now(UTC) + timedelta(seconds=50)

    failed = await queen.ack(message, AckStatus.FAILED, error="boom")
    assert failed.status is AckStatus.FAILED and failed.lease_released
    redelivered = await pop_one(queen, "jobs")
    assert redelivered.transaction_id == message.transaction_id
    assert redelivered.retry_count == 1
    dead = await queen.ack(redelivered, "failed", error="boom again")
    assert dead.dead_lettered


async def test_dead_letters_list_and_replay(queen: Client) -> None:
    await queen.configure("dl", retry_limit=0)
    for n in range(3):
        await queen.push("dl", {"n": n})
        message = await pop_one(queen, "dl")
        assert (await queen.ack(message, "failed", error=f"bad {n}")).dead_lettered
    letters = [d async for d in queen.dlq.list("dl", page_size=2)]
    assert [d.data for d in letters] == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert letters[0].error == "bad 0" and letters[0].consumer_group == "__QUEUE_MODE__"
    replayed = await queen.dlq.replay(letters[1].id)
    assert replayed.dead_letter_id == letters[1].id
    assert replayed.pushed.status is PushStatus.QUEUED
    again = await pop_one(queen, "dl", auto_ack=True)
    assert again.data == {"n": 1}
    with pytest.raises(NotFound) as missing:
        await queen.dlq.replay(999_999)
    assert (missing.value.status, missing.value.code) == (404, "dead_letter_not_found")


# -- KV ---------------------------------------------------------------------------------------


async def test_kv_get_put_delete(queen: Client) -> None:
    assert await queen.kv.get("saga", "b-1") is None
    put = await queen.kv.put("saga", "b-1", {"step": "held"}, ttl_seconds="1h")
    assert put and put.applied and put.expires_at is not None and put.version > 0
    assert abs((put.expires_at - datetime.now(UTC)).total_seconds() - 3600) < 5
    entry = await queen.kv.get("saga", "b-1")
    assert isinstance(entry, KvEntry) and entry.value == {"step": "held"}
    assert entry.version == put.version
    overwrite = await queen.kv.put("saga", "b-1", None, ttl_seconds=timedelta(days=1),
                                   expect=put.version)
    assert overwrite and overwrite.version > put.version
    stale = await queen.kv.put("saga", "b-1", 2, forever=True, expect=put.version)
    assert not stale and (stale.reason, stale.version) == ("version", overwrite.version)
    assert (await queen.kv.get("saga", "b-1")).value is None  # a stored null is not "absent"
    assert await queen.kv.delete("saga", "b-1")
    gone = await queen.kv.delete("saga", "b-1")
    assert isinstance(gone, KvWrite) and not gone and gone.reason == "absent"
    with pytest.raises(ValueError, match="whole number of seconds"):
        await queen.kv.put("saga", "b-1", 1, ttl_seconds="1500ms")
    with pytest.raises(ValueError, match="exactly one"):
        await queen.kv.put("saga", "b-1", 1)


async def test_kv_counters_claims_and_reads(queen: Client) -> None:
    assert await queen.kv.put_if_absent("dedup", "evt-1", True, ttl_seconds=60)
    lost = await queen.kv.put_if_absent("dedup", "evt-1", False, ttl_seconds=60)
    assert not lost and (lost.reason, lost.value) == ("exists", True)
    assert (await queen.kv.incr("rate", "acme", 2, max=3, ttl_seconds=60)).value == 2
    refused = await queen.kv.incr("rate", "acme", 2, max=3, ttl_seconds=60)
    assert not refused and refused.reason == "limit" and refused.value == 2
    assert await queen.kv.check("rate", "acme", expect=refused.version)
    many = await queen.kv.get_many("rate", ["acme", "nope"])
    assert isinstance(many, KvRows) and many.missing == ("nope",)
    assert [(e.namespace, e.key, e.value) for e in many.rows] == [("rate", "acme", 2)]
    for i in range(3):
        await queen.kv.put("walk", f"w/{i}", i, forever=True)
    page = await queen.kv.get_prefix("walk", "w/", limit=2)
    assert isinstance(page, KvPage) and [e.value for e in page.rows] == [0, 1]
    rest = await queen.kv.get_prefix("walk", "w/", after=page.next_after)
    assert [e.key for e in rest.rows] == ["w/2"] and not rest.truncated


# -- transactions -----------------------------------------------------------------------------


async def test_a_transaction_commits_ack_push_kv_and_timers_together(queen: Client) -> None:
    await queen.timer("bookings.expire").key("old").delay("1h").payload(None).schedule()
    await queen.push("bookings", {"bookingId": "b-7"})
    message = await pop_one(queen, "bookings")
    result = await (queen.transaction()
                    .ack(message)
                    .push("audit", {"event": "booking.held"}, txn="audit-b-7")
                    .kv.put("saga", "b-7", {"step": "held"}, ttl_seconds=86400)
                    .kv.delete("saga", "nothing")
                    .timer("bookings.expire").key("b-7").delay("15m").payload({"b": 7})
                    .schedule()
                    .timer("bookings.expire").key("old").cancel()
                    .commit())
    assert result and result.committed
    ack, pushed, put, deleted = result.results
    assert isinstance(ack, AckResult) and ack.status is AckStatus.COMPLETED
    assert ack.lease_released
    assert isinstance(pushed, PushResult) and pushed.transaction_id == "audit-b-7"
    assert isinstance(put, KvWrite) and put.applied and put.key == "b-7"
    assert isinstance(deleted, KvWrite)
    assert (deleted.namespace, deleted.key, deleted.applied) == ("saga", "nothing", False)
    assert [t.status for t in result.timers] == [TimerStatus.SCHEDULED, TimerStatus.CANCELLED]

    assert (await queen.kv.get("saga", "b-7")).value == {"step": "held"}
    assert (await queen.timer("bookings.expire").key("b-7").peek()).payload == {"b": 7}
    assert (await pop_one(queen, "audit", auto_ack=True)).data == {"event": "booking.held"}
    assert len(await queen.pop("bookings")) == 0


async def test_a_gate_that_loses_is_an_answer_and_commits_nothing(queen: Client) -> None:
    first = await queen.transaction().once("dedup", "b-8", ttl_seconds=60).push(
        "gated", 1).commit()
    again = await queen.transaction().push("gated", 2).once("dedup", "b-8",
                                                             ttl_seconds=60).commit()
    assert first and not again and again.results == ()
    assert again.precondition == KvPrecondition(1, "exists", again.precondition.version, True)
    assert [m.data for m in await queen.pop("gated", batch=10)] == [1]


async def test_a_failing_transaction_commits_nothing(queen: Client) -> None:
    await queen.push("tx-fail", 1)
    message = await pop_one(queen, "tx-fail")
    with pytest.raises(PayloadTooLarge) as too_big:
        await (queen.transaction()
               .ack(message)
               .kv.put("saga", "x", "written?", forever=True)
               .timer("tx-fail.t").key("k").delay("1m").payload("x" * 5000).schedule()
               .commit())
    assert too_big.value.status == 413
    assert await queen.kv.get("saga", "x") is None
    assert (await queen.ack(message)).already_acked is False  # the ack was rolled back too


async def test_a_bundle_refused_whole_raises_transaction_refused(queen: Client) -> None:
    """An ack under a lease that ran out refuses the bundle whole (200 success: false on
    Queen's wire): the SDK raises TransactionRefused, a Conflict, and nothing was written."""
    await queen.configure("tx-fenced", lease_time=1)
    await queen.push("tx-fenced", 1)
    message = await pop_one(queen, "tx-fenced")
    await trio.sleep(1.2)
    taken = await pop_one(queen, "tx-fenced")  # another consumer holds it now
    with pytest.raises(TransactionRefused) as refused:
        await (queen.transaction().push("tx-fenced-out", 1).ack(message)
               .kv.put("saga", "fenced", 1, forever=True).commit())
    error = refused.value
    assert isinstance(error, Conflict)
    assert (error.status, error.code, error.failed_index) == (200, "lease_lost", 1)
    assert "rolled back" in error.message
    assert len(await queen.pop("tx-fenced-out")) == 0
    assert await queen.kv.get("saga", "fenced") is None
    assert await queen.transaction().ack(taken).commit()  # its holder settles it


async def test_a_handler_whose_bundle_committed_nothing_leaves_the_ack_to_the_loop(
        queen: Client) -> None:
    """A handler's transaction that lost its once-only gate committed nothing, its ack
    included: the consume loop still settles the message (it was left stuck before, acked by
    nobody and redelivered forever)."""
    await queen.kv.put("once", "job-1", True, forever=True)  # another delivery did the work
    await queen.push("gated-consume", {"job": 1})

    async def handler(message: Message) -> None:
        done = await (queen.transaction().once("once", "job-1", forever=True)
                      .ack(message).push("gated-side", 1).commit())
        assert not done and done.precondition is not None

    stats = await queen.consume("gated-consume", handler, max_messages=1)
    assert (stats.settled_by_handler, stats.completed, stats.ack_errors) == (0, 1, 0)
    assert len(await queen.pop("gated-consume")) == 0
    assert len(await queen.pop("gated-side")) == 0


async def test_builders_are_reusable_and_immutable(queen: Client) -> None:
    base = queen.timer("reuse").delay("1h").payload("same")
    a = await base.key("a").schedule()
    b = await base.key("b").schedule()
    assert (a.key, b.key) == ("a", "b")
    tx = queen.transaction().kv.put("ns", "one", 1, forever=True)
    await tx.commit()
    await tx.kv.put("ns", "two", 2, forever=True).commit()  # tx itself holds only the first
    assert (await queen.kv.get("ns", "two")).value == 2
    with pytest.raises(ValueError, match="at least one"):
        queen.transaction().commit()
    with pytest.raises(TypeError, match="transaction"):
        queen.transaction().timer("q").key("k").peek()


# -- errors -----------------------------------------------------------------------------------


async def test_http_errors_carry_status_code_and_message(queen: Client) -> None:
    with pytest.raises(Forbidden) as beyond:
        await queen.timer("horizon").key("k").delay("2h").payload(1).schedule()
    assert (beyond.value.status, beyond.value.code) == (403, "timer_horizon_exceeded")
    assert "horizon" in beyond.value.message and beyond.value.body["ok"] is False

    with pytest.raises(BadRequest) as bad:
        await queen.timer("bad/queue").key("k").delay(0).payload(1).schedule()
    assert (bad.value.code, bad.value.reason) == ("timers_bad_request", "invalid_queue")

    with pytest.raises(PayloadTooLarge) as big:
        await queen.timer("big").key("k").delay(0).payload("x" * 5000).schedule()
    assert (big.value.status, big.value.code) == (413, "payload_too_large")

    await queen.push("never-popped", 1)
    stranger = Message("nope", "00000000-0000-0000-0000-000000000000", "never-popped",
                       "Default", 0, None, "__QUEUE_MODE__", 1, datetime.now(UTC), 0)
    with pytest.raises(NotFound) as unknown:
        await queen.ack(stranger)
    assert unknown.value.code == "unresolvable"

    await queen.configure("leases", lease_time=1)
    await queen.push("leases", 1)
    message = await pop_one(queen, "leases")
    await trio.sleep(1.1)
    with pytest.raises(Conflict) as expired:
        assert message.lease_id is not None
        await queen.extend_lease(message.lease_id, 5)
    assert (expired.value.status, expired.value.code) == (409, "lease_expired")


async def test_too_late_is_a_value_alone_and_in_a_bundle(
    queen: Client, database_url: str
) -> None:
    held = await queen.timer("claimed").key("firing").delay("10m").payload(1).schedule()
    # What a sweeper's claim does to the row: a token, and visible_at at the lease's end.
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("UPDATE queen.timers SET claim_token = gen_random_uuid(), "
                     "visible_at = now() + interval '1 hour'")
    late = await queen.timer("claimed").key("firing").cancel()
    assert (late.ok, late.status, late.txn) == (False, TimerStatus.TOO_LATE, held.txn)
    again = await queen.timer("claimed").key("firing").delay(5).payload(2).schedule()
    assert again.status is TimerStatus.TOO_LATE and not again.ok
    assert (await queen.timer("claimed").key("firing").peek()).state is TimerState.CLAIMED

    committed = await (queen.transaction().push("side", 1)
                       .timer("claimed").key("nothing-here").cancel()
                       .timer("claimed").key("firing").cancel()
                       .commit())
    assert [t.status for t in committed.timers] == [TimerStatus.ABSENT, TimerStatus.TOO_LATE]
    assert len(await queen.pop("side")) == 1  # verdicts: the bundle committed


def test_results_are_frozen() -> None:
    r = TimerResult(True, TimerStatus.SCHEDULED, "q", "k", "t")
    with pytest.raises(AttributeError):
        r.status = TimerStatus.ABSENT  # type: ignore[misc]


async def test_a_bundle_of_timers_stores_each_payload_and_answers_each_timer(
    queen: Client, database_url: str
) -> None:
    """A bundle of timers alone goes through the fast paths on both sides (the body encoded
    in C, the payloads decoded together, the answer decoded in C): every timer is stored
    with its payload's compact JSON and answered in order, whatever its payload holds."""
    payloads: list[Any] = [{"k": 0}, None, "é\n", [1, 2.5, {"a": None}], 2**70, 1e300,
                           -0.0, (1, 2), {"deep": [[[[{"x": "y"}]]]]}, True, {}]
    tx = queen.transaction()
    for i, payload in enumerate(payloads):
        tx = tx.timer("bulk").key(f"k{i}").delay("30m").payload(payload).schedule()
    tx = tx.timer("bulk").key("never-there").cancel(txn="t-gone")
    result = await tx.commit()
    assert [(t.key, t.status) for t in result.timers] == [
        *((f"k{i}", TimerStatus.SCHEDULED) for i in range(len(payloads))),
        ("never-there", TimerStatus.ABSENT)]
    assert result.timers[-1].txn == "t-gone" and result.timers[-1].deliver_at is None
    with psycopg.connect(database_url) as conn:
        rows: dict[str, str] = dict(conn.execute(
            "SELECT timer_key, convert_from(payload, 'UTF8') FROM "
                                 "queen.timers WHERE queue = 'bulk' AND NOT payload_zstd"
                                 ).fetchall())
        due: dict[str, Any] = dict(conn.execute("SELECT timer_key, deliver_at FROM queen.timers "
                                "WHERE queue = 'bulk'").fetchall())
    assert {k: json.loads(v) for k, v in rows.items()} == {
        f"k{i}": json.loads(json.dumps(p)) for i, p in enumerate(payloads)}
    assert rows["k3"] == '[1,2.5,{"a":null}]'  # compact, as every message is stored
    assert {t.key: t.deliver_at for t in result.timers[:-1]} == due


async def test_schedule_many_schedules_every_timer_of_a_bundle_in_one_commit(
    queen: Client, database_url: str
) -> None:
    """``transaction().schedule_many(queue, [(key, delay, payload), ...])``: every timer
    stored with its payload and partition, answered in order beside the bundle's other
    entries; a repeat reschedules them."""
    timers = [(f"many-{i}", "1h" if i % 2 else 3_600_000, {"i": i}) for i in range(300)]
    result = await (queen.transaction().push("many-side", {"x": 1})
                    .schedule_many("many", timers, partition="p1").commit())
    assert [(t.key, t.status, t.partition) for t in result.timers] == [
        (key, TimerStatus.SCHEDULED, "p1") for key, _, _ in timers]
    with psycopg.connect(database_url) as conn:
        rows: dict[str, str] = dict(conn.execute(
            "SELECT timer_key, convert_from(payload, 'UTF8') FROM queen.timers "
            "WHERE queue = 'many'").fetchall())
    assert rows == {key: json.dumps(p, separators=(",", ":")) for key, _, p in timers}
    again = await queen.transaction().schedule_many("many", timers[:3]).commit()
    assert [t.status for t in again.timers] == [TimerStatus.RESCHEDULED] * 3


async def test_a_bundles_payloads_are_judged_one_by_one_by_the_broker(
    broker: BrokerHandle, database_url: str
) -> None:
    """Raw bundles and batches whose payloads are JSON only together ("[1", "2]", "3,4"), or
    JSON but not compact: the broker refuses the first naming the payload, and stores the
    second compact, on both routes."""

    def op(key: str, payload: bytes) -> dict[str, Any]:
        return {"op": "schedule", "queue": "judged", "timerKey": key, "delayMs": 60_000,
                "txn": f"t-{key}", "payload": base64.b64encode(payload).decode()}

    trick = [op("a", b"1"), op("b", b"[1"), op("c", b"2]"), op("d", b"3,4")]
    loose = [op("e", b"1"), op("f", b' { "x" : [ 1 , "\\u00e9" ] } '), op("g", b"1e2")]
    async with httpx.AsyncClient(base_url=broker.url) as http:
        for path, wrap in (("/api/v1/transaction", lambda ops: {"timers": ops}),
                           ("/api/v1/timers", lambda ops: {"operations": ops})):
            refused = await http.post(path, json=wrap(trick))
            assert refused.status_code == 400, refused.text
            assert "[1].payload is not a JSON document" in refused.json()["message"]
            stored = await http.post(path, json=wrap(loose))
            assert stored.status_code == 200, stored.text
    with psycopg.connect(database_url) as conn:
        rows: dict[str, str] = dict(conn.execute(
            "SELECT timer_key, convert_from(payload, 'UTF8') FROM "
                                 "queen.timers WHERE queue = 'judged'").fetchall())
    assert rows == {"e": "1", "f": '{"x":[1,"é"]}', "g": "100.0"}

"""The SDK's builders and calls, without a broker: what each one would send, and whether the
clients may repeat it. A recording client returns the Call instead of executing it."""

from __future__ import annotations

import base64
import json
import os
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import zstandard

from queen_trio import strict_json
from queen_trio.client import AckStatus, Message, calls
from queen_trio.client.api import BaseClient
from queen_trio.client.builders import TransactionBuilder
from queen_trio.client.calls import Call
from queen_trio.models import codec

MID = "0192f1e4-7c3a-7000-8000-000000000001"  # a messageId: a UUID, as the models require


class Recorder(BaseClient[Any]):
    is_async = False

    def _call(self, call: Call[Any]) -> Call[Any]:
        return call


@pytest.fixture
def queen() -> Recorder:
    return Recorder("http://broker.test")


def message(lease: str | None = "lease-1") -> Message:
    return Message("txn-1", "pid-1", "bookings", "Default", 4, lease, "__QUEUE_MODE__",
                   {"b": 1}, datetime.now(UTC), 0)


# -- timers -----------------------------------------------------------------------------------


def b64(payload: Any) -> str:
    return base64.b64encode(json.dumps(payload, separators=(",", ":")).encode()).decode()


def test_schedule_posts_one_queen_operation(queen: Recorder) -> None:
    call = (queen.timer("reminders").key("trial-ending:42").delay("72h")
            .payload({"accountId": 42}).schedule())
    assert (call.method, call.path) == ("POST", "/api/v1/timers")
    (op,) = call.body["operations"]
    assert uuid.UUID(op.pop("txn"))  # minted by the client
    assert op == {"op": "schedule", "queue": "reminders", "timerKey": "trial-ending:42",
                  "payload": b64({"accountId": 42}), "delayMs": 259_200_000}
    assert call.idempotent  # an upsert by name
    answer = {"results": [{"ok": True, "status": "scheduled", "queue": "reminders",
                           "timerKey": "trial-ending:42", "txn": "t", "messageId": MID,
                           "deliverAt": "2030-01-01T00:00:00.000000Z", "partition": "Default"}]}
    result = call.parse(answer)
    assert (result.key, result.message_id, result.deliver_at.year) == ("trial-ending:42", MID,
                                                                       2030)


def test_partition_and_txn_travel_when_given(queen: Recorder) -> None:
    call = (queen.timer("q").key("k").delay(timedelta(seconds=1)).payload(None)
            .partition("eu").txn("t-9").schedule())
    assert call.body["operations"] == [{"op": "schedule", "queue": "q", "timerKey": "k",
                                        "payload": b64(None), "delayMs": 1000, "txn": "t-9",
                                        "partition": "eu"}]
    (op,) = queen.timer("q").key("k").delay(0).schedule().body["operations"]
    assert "partition" not in op and op["delayMs"] == 0


def test_a_payload_json_cannot_carry_is_refused_before_sending(queen: Recorder) -> None:
    with pytest.raises(ValueError):
        queen.timer("q").key("k").delay(0).payload(float("nan")).schedule()


def test_keys_travel_as_one_encoded_path_segment(queen: Recorder) -> None:
    call = queen.timer("q").key("a/b c?%#").cancel()
    assert call.path == "/api/v1/timers/q/a%2Fb%20c%3F%25%23"


def test_cancel_and_peek(queen: Recorder) -> None:
    cancel = queen.timer("q").key("k").cancel(txn="t-1")
    assert (cancel.method, cancel.params, cancel.idempotent) == ("DELETE", {"txn": "t-1"}, True)
    assert queen.timer("q").key("k").txn("t-2").cancel().params == {"txn": "t-2"}
    assert queen.timer("q").key("k").cancel().params is None
    peek = queen.timer("q").key("k").peek()
    assert peek.method == "GET"
    assert peek.parse({"found": False, "queue": "q", "timerKey": "k"}) is None
    hit = peek.parse({"found": True, "queue": "q", "timerKey": "k", "partition": "Default",
                      "txn": "t", "messageId": MID, "deliverAt": "2030-01-01T00:00:00Z",
                      "attempts": 0, "lastError": None, "claimed": True, "encrypted": False,
                      "producerSub": None, "createdAt": "2030-01-01T00:00:00Z",
                      "updatedAt": "2030-01-01T00:00:00Z",
                      "payload": base64.b64encode(zstandard.ZstdCompressor().compress(
                          b'{"v": 1}')).decode(), "payloadZstd": True})
    assert (hit.payload, hit.state, hit.message_id) == ({"v": 1}, "claimed", MID)


def test_list_pages_by_key(queen: Recorder) -> None:
    listing = queen.timers("q").list(page_size=50)
    assert listing._fetch(None).params == {"limit": 50}
    assert listing._fetch("k9").params == {"limit": 50, "after": "k9"}
    page = listing._fetch(None).parse({"rows": [], "truncated": True, "nextAfter": "k9"})
    assert page.next == "k9"
    assert listing._fetch(None).parse({"rows": [], "truncated": False,
                                       "nextAfter": None}).next is None


@pytest.mark.parametrize("build", [
    lambda q: q.timer("q").delay("1s").schedule(),           # no key
    lambda q: q.timer("q").key("k").payload(1).schedule(),   # no delay
    lambda q: q.timer("q").cancel(),                          # no key
    lambda q: q.timer("q").key(""),
    lambda q: q.timer("").key("k"),
    lambda q: q.timer("q").key("k").delay("15 minutes"),
    lambda q: q.timer("q").key("k").delay(1.5),
    lambda q: q.timer("q").key(42),
])
def test_incomplete_or_invalid_timers_fail_before_sending(queen: Recorder, build: Any) -> None:
    with pytest.raises(ValueError):
        build(queen)


def test_builders_are_immutable(queen: Recorder) -> None:
    base = queen.timer("q").delay("1s")
    one, two = base.key("one"), base.key("two")
    assert one.schedule().body["operations"][0]["timerKey"] == "one"
    assert two.schedule().body["operations"][0]["timerKey"] == "two"
    with pytest.raises(ValueError, match="key"):
        base.schedule()


# -- the log ----------------------------------------------------------------------------------


def test_push_is_repeatable_only_with_transaction_ids(queen: Recorder) -> None:
    without = queen.push("q", 1)
    assert without.body == {"items": [{"queue": "q", "payload": 1}]} and not without.idempotent
    assert queen.push("q", 1, txn="t", partition="p").idempotent
    assert queen.push_many("q", [1, 2], txns=["a", "b"]).idempotent
    assert not queen.push_many("q", [1, 2]).idempotent
    with pytest.raises(ValueError, match="one transactionId per payload"):
        queen.push_many("q", [1, 2], txns=["a"])


def test_pop_is_never_repeated_and_its_wait_extends_the_timeout(queen: Recorder) -> None:
    call = queen.pop("q", group="g", batch=5, wait="30s", auto_ack=True)
    assert call.path == "/api/v1/pop/queue/q" and not call.idempotent
    assert call.params == {"batch": 5, "consumerGroup": "g", "wait": "true",
                           "timeout": 30_000, "autoAck": "true"}
    assert call.extra_read_s == 30
    assert queen.pop("q", partition="p/1").path == "/api/v1/pop/queue/q/partition/p%2F1"


def test_ack_completed_is_repeatable_failed_is_not(queen: Recorder) -> None:
    done = queen.ack(message())
    assert done.body == {"transactionId": "txn-1", "partitionId": "pid-1",
                         "status": "completed", "consumerGroup": "__QUEUE_MODE__",
                         "leaseId": "lease-1"}
    assert done.idempotent
    failed = queen.ack(message(None), AckStatus.FAILED, error="x" * 3000)
    assert not failed.idempotent and "leaseId" not in failed.body
    assert len(failed.body["error"]) == 2000
    with pytest.raises(ValueError):
        queen.ack(message(), "finished")


def test_configure_and_lease_durations_are_whole_seconds(queen: Recorder) -> None:
    call = queen.configure("q", lease_time="5m", retry_limit=2, delayed_processing=0,
                           retention=timedelta(days=1), dead_letter_queue=False)
    assert call.body == {"queue": "q", "options": {
        "leaseTime": 300, "delayedProcessing": 0, "retentionSeconds": 86400, "retryLimit": 2,
        "deadLetterQueue": False}}
    assert queen.extend_lease("l-1", "2m").body == {"seconds": 120}
    with pytest.raises(ValueError):
        queen.extend_lease("l-1", "500ms")


def test_kv_calls_go_through_the_batch_route(queen: Recorder) -> None:
    put = queen.kv.put("saga", "b/1", {"s": 1}, ttl_seconds="1d")
    assert (put.method, put.path, put.body) == ("POST", "/api/v1/kv", {"operations": [
        {"op": "put", "ns": "saga", "key": "b/1", "value": {"s": 1}, "ttlSeconds": 86400}]})
    assert put.idempotent  # an unconditional put is an upsert
    assert queen.kv.put("saga", "k", None, forever=True).body["operations"] == [
        {"op": "put", "ns": "saga", "key": "k", "value": None, "forever": True}]
    claim = queen.kv.put_if_absent("saga", "k", 1, ttl_seconds=60)
    assert claim.body["operations"][0]["op"] == "putIfAbsent" and not claim.idempotent
    assert not queen.kv.put("saga", "k", 2, ttl_seconds=60, expect=7).idempotent
    assert queen.kv.get("saga", "k").body == {"operations": [{"op": "get", "ns": "saga",
                                                              "key": "k"}]}
    incr = queen.kv.incr("rate", "acme", 2, max=10, ttl_seconds=60)
    assert incr.body["operations"] == [{"op": "incr", "ns": "rate", "key": "acme", "delta": 2,
                                        "max": 10, "ttlSeconds": 60}]
    assert not incr.idempotent  # a repeat would count twice
    assert queen.kv.check("queen-locks", "job#0", expect=41).body["operations"] == [
        {"op": "check", "ns": "queen-locks", "key": "job#0", "expect": 41}]
    assert queen.kv.get_prefix("saga", "b/", limit=5, keys_only=True).body["operations"] == [
        {"op": "getPrefix", "ns": "saga", "prefix": "b/", "limit": 5, "keysOnly": True}]
    # A write declares its expiry, exactly once: there is no default to inherit.
    bads: list[dict[str, Any]] = [{}, {"ttl_seconds": 60, "forever": True}, {"ttl_seconds": 0}]
    for bad in bads:
        with pytest.raises(ValueError):
            queen.kv.put("saga", "k", 1, **bad)
    with pytest.raises(ValueError, match="expect"):
        queen.kv.put("saga", "k", 1, forever=True, expect=-1)


def test_dead_letter_calls(queen: Recorder) -> None:
    listing = queen.dlq.list("q", group="__timer__", page_size=10)
    assert listing._fetch("7").params == {"limit": 10, "queue": "q",
                                          "consumerGroup": "__timer__", "cursor": "7"}
    replay = queen.dlq.replay(7)
    assert (replay.path, replay.idempotent) == ("/api/v1/dlq/7/replay", False)


# -- transactions -----------------------------------------------------------------------------


def test_a_transaction_sends_operations_and_separate_kv_and_timers_arrays(
    queen: Recorder,
) -> None:
    m = message()
    call = (queen.transaction()
            .ack(m)
            .push("audit", {"event": "booking.held"})
            .once("dedup", "evt-1", ttl_seconds=3600)
            .kv.put("saga", "b-1", {"step": "held"}, ttl_seconds=86400)
            .kv.delete("saga", "old")
            .timer("bookings.expire").key("b-1").delay("15m").payload({"b": 1}).schedule()
            .timer("bookings.expire").key("b-0").cancel(txn="t-0")
            .commit())
    assert (call.method, call.path) == ("POST", "/api/v1/transaction")
    assert call.body == {
        "operations": [
            {"type": "ack", "transactionId": "txn-1", "partitionId": "pid-1",
             "status": "completed", "consumerGroup": "__QUEUE_MODE__", "leaseId": "lease-1"},
            {"type": "push", "items": [{"queue": "audit", "payload": {"event": "booking.held"}}]},
        ],
        "kv": [
            {"op": "putIfAbsent", "ns": "dedup", "key": "evt-1", "required": True, "value": True,
             "ttlSeconds": 3600},
            {"op": "put", "ns": "saga", "key": "b-1", "value": {"step": "held"},
             "ttlSeconds": 86400},
            {"op": "delete", "ns": "saga", "key": "old"},
        ],
        "timers": [
            {"op": "schedule", "queue": "bookings.expire", "timerKey": "b-1",
             "payload": b64({"b": 1}), "delayMs": 900_000, "txn": call.body["timers"][0]["txn"]},
            {"op": "cancel", "queue": "bookings.expire", "timerKey": "b-0", "txn": "t-0"},
        ],
    }
    assert call.settles == (m,)
    assert not call.idempotent  # the push has no transactionId
    assert queen.transaction().kv.put("n", "k", 1, forever=True).commit().body == {
        "operations": [], "kv": [{"op": "put", "ns": "n", "key": "k", "value": 1,
                                  "forever": True}]}


@pytest.mark.parametrize(("build", "repeatable"), [
    (lambda tx: tx.push("q", 1, txn="t"), True),
    (lambda tx: tx.push("q", 1), False),
    (lambda tx: tx.ack(message()), True),
    (lambda tx: tx.ack(message(), "failed"), False),
    (lambda tx: tx.kv.put("n", "k", 1, forever=True).kv.delete("n", "j"), True),
    (lambda tx: tx.once("n", "k", forever=True), False),
    (lambda tx: tx.kv.incr("n", "k", ttl_seconds=5), False),
    (lambda tx: tx.timer("q").key("k").delay(5).schedule().timer("q").key("j").cancel(), True),
])
def test_a_transaction_is_repeated_only_when_every_part_is(
    queen: Recorder, build: Any, repeatable: bool
) -> None:
    assert build(queen.transaction()).commit().idempotent is repeatable


def test_transaction_steps_return_transaction_builders(queen: Recorder) -> None:
    tx = queen.transaction()
    step = tx.timer("q").key("k").delay("1s").payload(1).schedule()
    assert isinstance(step, TransactionBuilder)  # and tx is still empty: commit refuses
    with pytest.raises(TypeError, match="transaction"):
        tx.timer("q").key("k").peek()
    with pytest.raises(ValueError, match="at least one"):
        tx.commit()


def test_urls_are_checked_and_token_becomes_a_bearer_header() -> None:
    with pytest.raises(ValueError, match="http"):
        Recorder("broker:6632")
    with pytest.raises(ValueError, match="at least one"):
        Recorder([])
    client = Recorder(["http://a/", "https://b"], token="qt_x_y")
    assert client.urls == ["http://a", "https://b"] and client.url == "http://a"
    assert client._headers == {"Authorization": "Bearer qt_x_y"}


def test_urls_and_token_default_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUEEN_URL", "http://one:1, http://two:2")
    monkeypatch.setenv("QUEEN_TOKEN", "qt_a_b")
    client = Recorder()
    assert client.urls == ["http://one:1", "http://two:2"]
    assert client._headers["Authorization"] == "Bearer qt_a_b"
    monkeypatch.delenv("QUEEN_URL")
    assert Recorder().urls == ["http://127.0.0.1:6632"]


def test_a_half_built_bundle_branches_without_sharing_its_later_entries(queen: Recorder) -> None:
    """Entries are chained, not copied (a 500-timer bundle was O(n²)): branches of one
    half-built bundle still each carry exactly their own entries, in the order added."""
    base = queen.transaction().push("q", {"n": 0}, txn="t0")
    for i in range(3):
        base = base.timer("q").key(f"k{i}").delay("1h").payload(i).schedule()
    left = base.timer("q").key("left").cancel().push("q", {"n": 1}, txn="t1")
    right = base.timer("q").key("right").delay(5).schedule()
    keys = [[t["timerKey"] for t in b.commit().body["timers"]] for b in (base, left, right)]
    assert keys == [["k0", "k1", "k2"], ["k0", "k1", "k2", "left"], ["k0", "k1", "k2", "right"]]
    assert [len(b.commit().body["operations"]) for b in (base, left, right)] == [1, 2, 1]
    assert base.commit().body["timers"][0]["delayMs"] == 3_600_000


def test_minted_txns_are_distinct_random_uuids(queen: Recorder) -> None:
    tx = queen.transaction()
    for i in range(200):
        tx = tx.timer("q").key(f"k{i}").delay(1).payload(i).schedule()
    txns = [t["txn"] for t in tx.commit().body["timers"]]
    assert len(set(txns)) == 200
    assert all(uuid.UUID(t).version == 4 and str(uuid.UUID(t)) == t for t in txns)


# -- the bundle's fast paths: what they send and read is what the strict paths do ---------------


def test_a_timer_bundle_is_sent_encoded_as_its_body(queen: Recorder) -> None:
    """A bundle of timers alone travels encoded in C (``content``): the same JSON as its body.
    A name JSON cannot carry leaves it to the transport's strict encoder, which refuses it
    naming the value, as before."""
    tx = queen.transaction()
    for i in range(3):
        tx = tx.timer("q").key(f"k{i}é").delay(5).payload({"i": i}).partition("p").schedule()
    call = tx.timer("q").key("gone").cancel(txn="t").commit()
    assert call.content is not None and json.loads(call.content) == call.body
    for bad in ("a\x00b", "\ud800"):
        call = queen.transaction().timer("q").key(bad).delay(5).schedule().commit()
        assert call.content is None
        with pytest.raises(strict_json.JsonRefused):
            strict_json.dumps(call.body)
    mixed = queen.transaction().push("q", 1.5).timer("q").key("k").delay(5).schedule().commit()
    assert mixed.content is None  # (operations and kv keep the strict encoder)
    single = queen.timer("q").key("k").delay(5).payload([1]).schedule()
    assert single.content is not None and json.loads(single.content) == single.body


class _Thing:
    pass


_DEEP: Any = 1
for _ in range(40):
    _DEEP = [_DEEP]


@pytest.mark.parametrize("payload", [
    None, True, 0, -7, 2**63, 2**70, 10**400, 1.5, -0.0, 1e300, 1e16, "é\n\"\\", "\x7f\u2028",
    {"a": [1, {"b": None}]}, [], {}, _DEEP,
    float("nan"), float("inf"), {"x": [float("-inf")]}, "a\x00b", {"k\x00": 1}, "\ud800",
    {"k": "\udc00"}, (1, 2), {1: "int key"}, {None: 1}, {1.5: 1}, {True: 1}, {"s": {1, 2}},
    datetime(2030, 1, 1, tzinfo=UTC), uuid.UUID(MID), b"bytes", _Thing(), AckStatus.COMPLETED,
])
def test_a_timer_payload_is_encoded_or_refused_as_strict_json_does(payload: Any) -> None:
    """Plain payloads are encoded by msgspec, the rest by strict_json: the same JSON value,
    or the same refusal (type and message, the path named from ``payload``)."""
    def outcome(encode: Any) -> Any:
        try:
            return "ok", json.loads(encode())
        except (ValueError, TypeError, RecursionError) as exc:
            return type(exc), str(exc)

    def strict() -> bytes:
        try:
            return strict_json.dumps(payload)
        except strict_json.JsonRefused as exc:  # as calls names it
            path = "payload" + (exc.path if exc.path.startswith("[") or not exc.path
                                else f".{exc.path}")
            raise strict_json.JsonRefused(exc.code, exc.message.replace(exc.path, path, 1)
                                          if exc.path else f"payload: {exc.message}",
                                          path) from None

    assert outcome(lambda: calls._payload_json(payload)) == outcome(strict)


def _answer(results: list[dict[str, Any]], **top: Any) -> bytes:
    return json.dumps({"success": True, "transactionId": "tx-1", "results": results,
                       **top}).encode()


def _timer_answer(i: int, **fields: Any) -> dict[str, Any]:
    return {"type": "timer", "index": i, "ok": True, "status": "scheduled", "queue": "q",
            "timerKey": f"k{i}", "txn": f"t{i}", "messageId": MID,
            "deliverAt": f"2030-01-01T00:00:00.{i:06d}Z", "partition": "Default", **fields}


@pytest.mark.parametrize("raw", [
    _answer([_timer_answer(0), _timer_answer(1, ok=False, status="too_late", messageId=None,
                                             deliverAt=None, partition=None),
             {"type": "timer", "index": 2, "ok": False, "status": "absent", "queue": "q",
              "timerKey": "gone", "txn": None}]),
    _answer([]),
    _answer([_timer_answer(0)], extra="ignored"),
    _answer([_timer_answer(0, messageId="not-a-uuid")]),
    _answer([_timer_answer(0, messageId=MID.upper())]),
    _answer([_timer_answer(0, deliverAt="2030-01-01")]),
    _answer([_timer_answer(0, status="fired")]),
    _answer([{"type": "kv", "index": 0, "op": "put", "applied": True, "version": 1}]),
    json.dumps({"success": False, "reason": "kv_precondition", "transactionId": "t",
                "failedIndex": 0, "kvReason": "version", "version": 2, "value": None,
                "results": []}).encode(),
    b'{"success": true, "transactionId": "t", "results": [], "x": "\\u0000"}',
    b"\xef\xbb\xbf" + _answer([_timer_answer(0)]),
    b"[]",
])
def test_a_timer_bundles_answer_decoded_in_c_reads_as_from_wire(queen: Recorder,
                                                                raw: bytes) -> None:
    """The answer to a bundle of timers alone is decoded by msgspec straight into its
    results: the same TransactionResult as the strict path, or it takes that path (which
    raises what it raised)."""
    try:
        count = len(json.loads(raw)["results"])
    except (ValueError, KeyError, TypeError):
        count = 1
    call = _timer_bundle(queen, count)
    assert call.fast is not None

    def outcome(read: Any) -> Any:
        try:
            return read()
        except Exception as exc:  # noqa: BLE001 - compared, not hidden
            return type(exc)

    quick = outcome(lambda: call.fast(raw))
    precise = outcome(lambda: call.parse(strict_json.loads(raw)))
    assert quick is codec.FALLBACK or quick == precise


def test_a_forked_child_mints_its_own_txns() -> None:
    """Txns are minted in batches; a forked child must not mint the ones its parent has
    in hand (the same transactionIds in two processes)."""
    calls.new_txn()  # the parent holds a batch
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.write(writer, calls.new_txn().encode())
        os._exit(0)
    os.close(writer)
    os.waitpid(pid, 0)
    with os.fdopen(reader) as pipe:
        child = pipe.read()
    assert child != calls.new_txn()
    assert uuid.UUID(child).version == 4


def _timer_bundle(queen: Recorder, count: int) -> Call[Any]:
    tx = queen.transaction()
    for i in range(max(count, 1)):
        tx = tx.timer("q").key(f"k{i}").delay(5).schedule()
    return tx.commit()


def test_a_timer_bundles_answer_is_read_in_c_when_it_answers_each_timer(
        queen: Recorder) -> None:
    """A committed answer with one result per timer sent is read by the quick path, into what
    the strict path makes of it; an answer with another count of results takes the strict
    path (which refuses it, as before)."""
    results = [_timer_answer(0), _timer_answer(1, ok=False, status="too_late",
                                               messageId=None, deliverAt=None, partition=None),
               {"type": "timer", "index": 2, "ok": False, "status": "absent", "queue": "q",
                "timerKey": "gone", "txn": None}]
    raw = _answer(results)
    call = _timer_bundle(queen, 3)
    assert call.fast is not None
    quick = call.fast(raw)
    assert quick is not codec.FALLBACK
    assert quick == call.parse(strict_json.loads(raw))
    assert quick.timers[0].message_id == MID
    assert quick.timers[0].deliver_at == datetime(2030, 1, 1, tzinfo=UTC)
    assert [t.status for t in quick.timers] == ["scheduled", "too_late", "absent"]
    assert _timer_bundle(queen, 4).fast(raw) is codec.FALLBACK  # type: ignore[misc]


def test_schedule_many_adds_what_the_builder_chain_adds_for_each_timer(queen: Recorder) -> None:
    """``schedule_many`` puts in the bundle the operations the per-timer chain puts there (in
    order, beside other entries), each checked alike before anything is sent."""
    timers: list[tuple[str, int | timedelta | str, Any]] = [
        ("k0", 5, {"i": 0}), ("k1", "2h", None), ("k2", timedelta(seconds=3), [1, "x"])]
    tx = queen.transaction().timer("q").key("first").delay(1).schedule()
    chain = tx
    for key, delay, payload in timers:
        chain = chain.timer("q").key(key).delay(delay).payload(payload).partition("p").schedule()
    many = tx.schedule_many("q", timers, partition="p").timer("q").key("last").cancel()
    chain = chain.timer("q").key("last").cancel()

    def ops(call: Call[Any]) -> list[dict[str, Any]]:
        return [{k: v for k, v in op.items() if k != "txn"} for op in call.body["timers"]]

    assert ops(many.commit()) == ops(chain.commit())
    txns = [op["txn"] for op in many.commit().body["timers"][1:4]]
    assert len(set(txns)) == 3 and all(uuid.UUID(t).version == 4 for t in txns)
    with pytest.raises(ValueError, match="timer key"):
        tx.schedule_many("q", [("ok", 5, 1), ("", 5, 1)])
    with pytest.raises(ValueError):
        tx.schedule_many("q", [("k", "soon", 1)])
    with pytest.raises(strict_json.JsonRefused):
        tx.schedule_many("q", [("k", 5, float("nan"))])
    with pytest.raises(ValueError, match="queue"):
        tx.schedule_many("", [("k", 5, 1)])

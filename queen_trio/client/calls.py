"""Every SDK operation as a :class:`Call`: what to send, whether a retry is safe, how to read
the answer. No I/O here: the async and sync clients both execute these same descriptions, so
request building and response parsing exist once.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import os
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from datetime import datetime, timedelta
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import msgspec

from .. import strict_json
from ..frozen import slotted_init
from ..models import codec
from ..models import log as wire_log
from ..models import timers as wire_timers
from . import models as m
from .durations import Duration, span_ms, ttl_seconds
from .errors import Conflict, NotFound

T = TypeVar("T")
API = "/api/v1"

# While a consumer's handler runs, the messages it settles itself (ack, or a committed
# transaction that acks it) are recorded here, so the consume loop does not ack them again.
settled_here: ContextVar[set[tuple[str, str]] | None] = ContextVar("settled_here", default=None)


@dataclasses.dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One HTTP exchange.

    ``idempotent``: repeating the request after a lost answer cannot change the outcome, so
    any failure may be retried. Otherwise only failures that prove the request was never
    processed (connection refused, 429) are.
    ``none_on``: error codes that mean "nothing there" and make the call return None.
    """

    method: str
    path: str
    parse: Callable[[Any], T]
    idempotent: bool
    params: dict[str, Any] | None = None
    body: Any = None
    none_on: frozenset[str] = frozenset()
    extra_read_s: float = 0.0  # long polls hold the answer back this long
    settles: tuple[m.Message, ...] = ()
    empty: Callable[[], T] | None = None  # the result of a 204 No Content
    # The answer's bytes straight to the result, or codec.FALLBACK (then ``parse`` takes the
    # strictly decoded JSON): for large answers, decoded in C.
    fast: Callable[[bytes], Any] | None = None
    # ``body`` already encoded, as strict_json.dumps would refuse or write it (None: the
    # transport encodes ``body``): a bundle of 500 timers, encoded in C.
    content: bytes | None = None


def segment(name: str) -> str:
    """A name as one URL path segment ('/' included: the broker decodes it back)."""
    return quote(name, safe="")


def _name(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a non-empty string, got {value!r}")
    return value


def _timer_path(queue: str, key: str) -> str:
    return f"{API}/timers/{segment(_name(queue, 'queue'))}/{segment(_name(key, 'timer key'))}"


# -- timers -----------------------------------------------------------------------------------


@slotted_init
@dataclasses.dataclass(frozen=True, slots=True)
class TimerSpec:
    """A complete schedule request, validated."""

    queue: str
    key: str
    delay_ms: int
    payload: Any = None
    partition: str | None = None
    txn: str | None = None

    def to_wire(self) -> dict[str, Any]:
        """One operation of Queen's timer wire. The client mints the txn when none is given:
        the message's transactionId is known before the answer, and a retry of the same call
        sends the same one."""
        raw = _payload_json(self.payload)
        wire: dict[str, Any] = {
            "op": "schedule", "queue": self.queue, "timerKey": self.key,
            "payload": base64.b64encode(raw).decode(), "delayMs": self.delay_ms,
            "txn": self.txn or new_txn(),
        }
        if self.partition is not None:
            wire["partition"] = self.partition
        return wire


def new_txn() -> str:
    """A random (version 4) UUID as text: what ``str(uuid.uuid4())`` gives (the same 122 bits
    from os.urandom), minted 128 at a time: one urandom call costs more here than formatting
    the text (a step of every timer of a bundle). ``list.pop`` is atomic, so threads never
    share one; a forked child drops the parent's (it would mint the same ones)."""
    try:
        return _TXNS.pop()
    except IndexError:
        _TXNS.extend(_mint_txns(_TXNS_AT_ONCE))
        return _TXNS.pop()


def new_txns(n: int) -> list[str]:
    """``n`` transactionIds for one bundle's timers: one random UUID (:func:`new_txn`) with
    0, 1, 2, … XORed into its last three hex digits, each one written by a single format
    (a bundle of 500 minted one by one cost its builder a third of its time). Distinct from
    each other, and from other bundles' by the other 110 random bits. Past 4,096 (more than
    a bundle holds), one by one."""
    if n > 4096 or n < 8:
        return [new_txn() for _ in range(n)]
    first = new_txn()
    prefix, bits = first[:33], int(first[33:], 16)
    return [f"{prefix}{bits ^ i:03x}" for i in range(n)]


def _mint_txns(n: int) -> list[str]:
    h = os.urandom(16 * n).hex()
    return [f"{h[i:i + 8]}-{h[i + 8:i + 12]}-4{h[i + 13:i + 16]}-{_VARIANT[h[i + 16]]}"
            f"{h[i + 17:i + 20]}-{h[i + 20:i + 32]}" for i in range(0, 32 * n, 32)]


_TXNS: list[str] = []
_TXNS_AT_ONCE = 128
# The variant's hex digit: its two high bits 10 (RFC 9562), the two low ones kept.
_VARIANT = {c: "89ab"[int(c, 16) & 3] for c in "0123456789abcdef"}
os.register_at_fork(after_in_child=_TXNS.clear)


def cancel_op(queue: str, key: str, txn: str | None) -> dict[str, Any]:
    """A cancel on Queen's timer wire (inside a bundle; alone, DELETE is the route)."""
    op = {"op": "cancel", "queue": _name(queue, "queue"), "timerKey": _name(key, "timer key")}
    if txn is not None:
        op["txn"] = txn
    return op


def _first_result(w: Any) -> m.TimerResult:
    (result,) = w["results"]
    return m.TimerResult.from_wire(result)


_TIMER_RESULTS = msgspec.json.Decoder(wire_timers.TimerResults)
_TIMER_RESULT = msgspec.json.Decoder(wire_timers.TimerResult)


def _first_result_fast(raw: bytes) -> Any:
    """:func:`_first_result` of the answer's bytes decoded in C (the strict decoder and a
    conversion cost a lone call more than the rest of reading its answer), or FALLBACK."""
    answer = codec.fast(raw, _TIMER_RESULTS)
    if answer is codec.FALLBACK or len(answer.results) != 1:
        return codec.FALLBACK
    return m.TimerResult.from_model(answer.results[0])


def _timer_result_fast(raw: bytes) -> Any:
    answer = codec.fast(raw, _TIMER_RESULT)
    return answer if answer is codec.FALLBACK else m.TimerResult.from_model(answer)


def schedule_timer(spec: TimerSpec) -> Call[m.TimerResult]:
    # An upsert by name: sending it twice leaves one timer, so a retry is safe.
    body = {"operations": [spec.to_wire()]}
    return Call("POST", f"{API}/timers", _first_result, True, body=body,
                content=_timer_body(body), fast=_first_result_fast)


def cancel_timer(queue: str, key: str, txn: str | None = None) -> Call[m.TimerResult]:
    # Idempotent: a repeated cancel answers absent where the first answered cancelled.
    return Call("DELETE", _timer_path(queue, key), m.TimerResult.from_wire, True,
                params=None if txn is None else {"txn": txn}, fast=_timer_result_fast)


def peek_timer(queue: str, key: str) -> Call[m.TimerInfo | None]:
    return Call("GET", _timer_path(queue, key),
                lambda w: m.TimerInfo.from_wire(w) if w["found"] else None, True)


def _page(items_field: str, item: Callable[[dict[str, Any]], T]) -> Callable[[Any], m.Page[T]]:
    return lambda w: m.Page(tuple(item(i) for i in w[items_field]), w.get("next"))


def list_timers(queue: str, limit: int, after: str | None) -> Call[m.Page[m.TimerInfo]]:
    params: dict[str, Any] = {"limit": limit}
    if after:
        params["after"] = after  # a timer key: the page starts after it
    return Call("GET", f"{API}/timers/{segment(_name(queue, 'queue'))}",
                lambda w: m.Page(tuple(m.TimerInfo.from_wire(r) for r in w["rows"]),
                                 w["nextAfter"] if w["truncated"] else None),
                True, params=params)


# -- the log ----------------------------------------------------------------------------------


def push_item(queue: str, payload: Any, partition: str | None, txn: str | None) -> dict[str, Any]:
    item: dict[str, Any] = {"queue": _name(queue, "queue"), "payload": payload}
    if partition is not None:
        item["partition"] = partition
    if txn is not None:
        item["transactionId"] = _name(txn, "txn")
    return item


def _push(items: Sequence[dict[str, Any]], parse: Callable[[Any], T]) -> Call[T]:
    if not items:
        raise ValueError("push needs at least one item")
    # Only client-chosen transactionIds make a repeated push recognisable as a duplicate.
    safe = all("transactionId" in i for i in items)
    return Call("POST", f"{API}/push", parse, safe, body={"items": list(items)})


def push(items: Sequence[dict[str, Any]]) -> Call[tuple[m.PushResult, ...]]:
    return _push(items, lambda w: tuple(m.PushResult.from_wire(r) for r in w))


def push_one(item: dict[str, Any]) -> Call[m.PushResult]:
    # The same request as push([item]); only the answer is read as one result.
    return _push([item], lambda w: m.PushResult.from_wire(w[0]))


def _pop_path(queue: str, partition: str | None) -> str:
    path = f"{API}/pop/queue/{segment(_name(queue, 'queue'))}"
    if partition is not None:
        path += f"/partition/{segment(partition)}"
    return path


def _pop_params(group: str | None, batch: int, wait: Duration | None,
                auto_ack: bool) -> tuple[dict[str, Any], float]:
    params: dict[str, Any] = {"batch": batch}
    wait_s = 0.0
    if group is not None:
        params["consumerGroup"] = group
    if wait is not None:
        wait_ms = span_ms(wait, "wait")
        params.update(wait="true", timeout=wait_ms)
        wait_s = wait_ms / 1000
    if auto_ack:
        params["autoAck"] = "true"
    return params, wait_s


def pop(queue: str, *, group: str | None, partition: str | None, batch: int,
        wait: Duration | None, auto_ack: bool) -> Call[m.Batch]:
    params, wait_s = _pop_params(group, batch, wait, auto_ack)
    # Not idempotent: a pop whose answer was lost has leased messages nobody will see until
    # the lease expires; retrying would only take the next ones.
    return Call("GET", _pop_path(queue, partition), m.Batch.from_wire, False, params=params,
                extra_read_s=wait_s, empty=m.Batch)


def settle_and_pop(queue: str, acks: Sequence[dict[str, Any]], *, group: str | None,
                   partition: str | None, batch: int,
                   wait: Duration | None) -> Call[m.SettledPop]:
    """Acknowledgements (``ack_entry`` dicts) applied first, then a pop, in one request."""
    params, wait_s = _pop_params(group, batch, wait, False)
    # Not idempotent, as a pop.
    return Call("POST", _pop_path(queue, partition), m.SettledPop.from_wire, False,
                params=params, body=compact_acks(acks), extra_read_s=wait_s,
                fast=m.SettledPop.from_bytes)


_SHARED = ("partitionId", "leaseId", "consumerGroup")


def compact_acks(entries: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """An acknowledgements body with what every entry shares (a batch settled whole: one
    partition, lease and group) said once at the top, and a completed entry as its
    transactionId alone."""
    if not entries:
        return {"acknowledgments": []}
    first = entries[0]
    shared = {k: first[k] for k in _SHARED
              if k in first and all(e.get(k) == first[k] and k in e for e in entries)}
    return {**shared, "acknowledgments": [
        {k: v for k, v in e.items()
         if k not in shared and not (k == "status" and v == "completed")}
        for e in entries]}


def ack_entry(message: m.Message, status: m.AckStatus | str, error: str | None) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "transactionId": message.transaction_id, "partitionId": message.partition_id,
        "status": m.AckStatus(status).value, "consumerGroup": message.consumer_group,
    }
    if message.lease_id is not None:
        entry["leaseId"] = message.lease_id
    if error is not None:
        entry["error"] = error[:2000]
    return entry


def ack_batch(entries: Sequence[dict[str, Any]]) -> Call[tuple[m.AckResult, ...]]:
    # Each entry gets its verdict (AckResult.refused); safe to repeat only when every entry
    # completes (see ack).
    return Call("POST", f"{API}/ack/batch",
                lambda w: tuple(m.AckResult.from_wire(r) for r in w),
                all(e["status"] == "completed" for e in entries),
                body={"acknowledgments": list(entries)})


def ack(message: m.Message, status: m.AckStatus | str, error: str | None) -> Call[m.AckResult]:
    entry = ack_entry(message, status, error)
    # Completing twice is answered alreadyAcked; a repeated "failed" would spend a retry.
    return Call("POST", f"{API}/ack", lambda w: _taken(m.AckResult.from_wire(w[0]), w[0]),
                entry["status"] == "completed", body=entry, settles=(message,))


# The broker answers a refused acknowledgement as a verdict (200, Queen's wire); one ack on
# its own is refused as an error, as the SDK raises for every refusal.
_REFUSED_STATUS = {"unresolvable": 404}


def _taken(result: m.AckResult, w: dict[str, Any]) -> m.AckResult:
    if result.refused is None:
        return result
    status = _REFUSED_STATUS.get(result.refused, 409)
    cls = NotFound if status == 404 else Conflict
    raise cls(status, result.refused, result.detail or w.get("error") or "", w)


def extend_lease(lease_id: str, seconds: int) -> Call[Any]:
    return Call("POST", f"{API}/lease/{segment(_name(lease_id, 'lease_id'))}/extend",
                _renewed, True, body={"seconds": seconds})


def _renewed(w: dict[str, Any]) -> Any:
    """The new expiry; a lease that renewed nothing (Queen answers that with 200) raises
    :class:`Conflict` ``lease_expired`` or :class:`NotFound` ``lease_not_found``."""
    r = msgspec.convert(w, wire_log.LeaseExtended)  # the broker's own model of it
    if not r.success:
        code = r.code or "lease_expired"
        cls = NotFound if code == "lease_not_found" else Conflict
        raise cls(404 if cls is NotFound else 409, code, r.error or code, w)
    return m.parse_time(r.newExpiresAt)


def configure(queue: str, options: dict[str, Any]) -> Call[m.QueueConfig]:
    return Call("POST", f"{API}/configure", m.QueueConfig.from_wire, True,
                body={"queue": _name(queue, "queue"), "options": options})


def list_queues() -> Call[list[dict[str, Any]]]:
    return Call("GET", f"{API}/resources/queues", lambda w: list(w["queues"]), True)


def queue_lease_seconds(queue: str) -> Call[int | None]:
    """The lease a pop of ``queue`` takes (None if the queue does not exist yet)."""
    return Call("GET", f"{API}/resources/queues/{segment(_name(queue, 'queue'))}",
                lambda w: w["options"]["leaseTime"], True,
                none_on=frozenset({"queue_not_found"}))


# -- dead letters -----------------------------------------------------------------------------


def list_dead_letters(queue: str | None, group: str | None, limit: int,
                      after: str | None) -> Call[m.Page[m.DeadLetter]]:
    params: dict[str, Any] = {"limit": limit}
    for name, value in (("queue", queue), ("consumerGroup", group), ("cursor", after)):
        if value is not None:
            params[name] = value
    return Call("GET", f"{API}/dlq", _page("messages", m.DeadLetter.from_wire), True,
                params=params)


def replay_dead_letter(dead_letter_id: int) -> Call[m.Replayed]:
    # Not idempotent: each replay appends the frame again.
    return Call("POST", f"{API}/dlq/{int(dead_letter_id)}/replay",
                lambda w: m.Replayed(w["replayed"], m.PushResult.from_wire(w)), False)


# -- KV ---------------------------------------------------------------------------------------
# Every KV call goes through POST /api/v1/kv, Queen's complete surface (the path routes are
# sugar for curl). An op is shaped once, here, for the standalone calls and the transaction's
# ``kv`` array alike.


def kv_expiry(ttl: Duration | None, forever: bool) -> dict[str, Any]:
    """Exactly one of a TTL and forever: a KV write never keeps the old expiry by default."""
    if forever and ttl is None:
        return {"forever": True}
    if ttl is None or forever:
        raise ValueError("a KV write needs exactly one of ttl_seconds=… (whole seconds, or a "
                         "timedelta / duration string) and forever=True")
    return {"ttlSeconds": ttl_seconds(ttl)}


def _expect(expect: int | None) -> dict[str, Any]:
    if expect is None:
        return {}
    if isinstance(expect, bool) or not isinstance(expect, int) or expect < 0:
        raise ValueError(f"expect must be a version (an int >= 0; 0: must not exist), "
                         f"got {expect!r}")
    return {"expect": expect}


def _number(value: Any, what: str) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{what} must be a number, got {value!r}")
    return value


def kv_op(op: str, namespace: str, key: str | None = None, **fields: Any) -> dict[str, Any]:
    """One KV op as the wire has it; ``required=True`` is sent, False left out."""
    wire: dict[str, Any] = {"op": op, "ns": _name(namespace, "namespace")}
    if key is not None:
        wire["key"] = _name(key, "key")
    if fields.pop("required", False):
        wire["required"] = True
    return {**wire, **fields}


def kv_put(namespace: str, key: str, value: Any, ttl: Duration | None, forever: bool = False,
           expect: int | None = None, required: bool = False) -> dict[str, Any]:
    return kv_op("put", namespace, key, value=value, **kv_expiry(ttl, forever),
                 **_expect(expect), required=required)


def kv_put_if_absent(namespace: str, key: str, value: Any, ttl: Duration | None,
                     forever: bool = False, required: bool = False) -> dict[str, Any]:
    return kv_op("putIfAbsent", namespace, key, value=value, **kv_expiry(ttl, forever),
                 required=required)


def kv_delete(namespace: str, key: str, expect: int | None = None,
              required: bool = False) -> dict[str, Any]:
    return kv_op("delete", namespace, key, **_expect(expect), required=required)


def kv_incr(namespace: str, key: str, delta: int | float, minimum: int | float | None,
            maximum: int | float | None, ttl: Duration | None, forever: bool = False,
            required: bool = False) -> dict[str, Any]:
    bounds = {name: _number(v, name) for name, v in (("min", minimum), ("max", maximum))
              if v is not None}
    return kv_op("incr", namespace, key, delta=_number(delta, "delta"), **bounds,
                 **kv_expiry(ttl, forever), required=required)


def kv_check(namespace: str, key: str, expect: int, required: bool = False) -> dict[str, Any]:
    return kv_op("check", namespace, key, **_expect(expect), required=required)


def kv_get_many(namespace: str, keys: Sequence[str]) -> dict[str, Any]:
    return kv_op("getMany", namespace, keys=[_name(k, "key") for k in keys])


def kv_get_prefix(namespace: str, prefix: str, after: str | None, limit: int | None,
                  keys_only: bool) -> dict[str, Any]:
    fields: dict[str, Any] = {"prefix": _name(prefix, "prefix")}
    if after:
        fields["after"] = after
    if limit is not None:
        fields["limit"] = limit
    if keys_only:
        fields["keysOnly"] = True
    return kv_op("getPrefix", namespace, **fields)


# A lost answer may be repeated when the repeat cannot change the outcome: reads, checks, an
# unconditional put (an upsert) or delete. A conditional write's repeat would report a loss
# it won, and an incr's would count twice.
def _repeatable(op: dict[str, Any]) -> bool:
    return op["op"] in ("get", "getMany", "getPrefix", "check") or (
        op["op"] in ("put", "delete") and "expect" not in op)


def kv(op: dict[str, Any]) -> Call[Any]:
    """One op through POST /api/v1/kv; the result is typed by its op (models.kv_result)."""
    return Call("POST", f"{API}/kv", lambda w: m.kv_result(op["ns"], w["results"][0]),
                _repeatable(op), body={"operations": [op]})


# -- locks ------------------------------------------------------------------------------------
# POST /api/v1/locks, Queen's wire. The SDK always sends an owner (minted per handle), which
# makes acquire and renew safe to repeat after a lost answer: the broker answers the permit
# that owner already holds.


def lock_op(op: str, name: str, **fields: Any) -> dict[str, Any]:
    """One locks operation as the wire has it (None fields left out)."""
    return {"op": op, "name": _name(name, "lock name"),
            **{k: v for k, v in fields.items() if v is not None}}


def lock(op: dict[str, Any]) -> Call[m.LockResult]:
    # A release's repeat would answer "lost" for the permit it released: never retried.
    return Call("POST", f"{API}/locks", lambda w: m.LockResult.from_wire(w["results"][0]),
                op["op"] != "release", body={"operations": [op]})


# -- bundles ----------------------------------------------------------------------------------


def transaction(operations: Sequence[dict[str, Any]], kv_ops: Sequence[dict[str, Any]],
                timers: Sequence[dict[str, Any]],
                acked: Sequence[m.Message]) -> Call[m.TransactionResult]:
    if not operations and not kv_ops and not timers:
        raise ValueError("a transaction needs at least one operation, KV op or timer")
    # Retrying a bundle whose answer was lost repeats every part of it: safe when each push
    # carries its own transactionId (the broker then reports duplicates), every ack completes
    # (a repeated "failed" would spend a retry) and every KV op is repeatable; timers are
    # upserts.
    safe = all(
        all("transactionId" in i for i in op["items"]) if op["type"] == "push"
        else op.get("status") == "completed"
        for op in operations
    ) and all(_repeatable(o) for o in kv_ops)
    ops, kv_list = list(operations), list(kv_ops)
    body: dict[str, Any] = {"operations": ops}
    if kv_list:
        body["kv"] = kv_list
    if timers:
        body["timers"] = list(timers)
    only_timers = not ops and not kv_list
    # A bundle that only schedules asks for the broker's compact answer (our extension: a few
    # hundred bytes where 500 results are ~115 KB), which _timers_answer expands into the same
    # results; a broker that does not know the flag answers in full, read as ever.
    compact = only_timers and all(t.get("op") == "schedule" for t in body["timers"])
    return Call("POST", f"{API}/transaction",
                functools.partial(_bundle_result, kv=kv_list,
                                  asked=body["timers"] if compact else None), safe,
                params=_COMPACT_PARAMS if compact else None, body=body,
                settles=tuple(acked),
                fast=functools.partial(_timers_answer, timers=body.get("timers", []),
                                       compact=compact) if only_timers else None,
                content=_timer_body(body) if only_timers else None)


_COMPACT_PARAMS = {"answer": "compact"}
_COMPACT = msgspec.json.Decoder(wire_timers.TransactionScheduled)
# A compact answer is a few hundred bytes (its transactionId and partition name are bounded);
# a longer one is the full answer, not decoded twice.
_COMPACT_MAX = 2048


def _bundle_result(w: Any, kv: list[dict[str, Any]], asked: list[dict[str, Any]] | None
                   ) -> m.TransactionResult:
    """A bundle's answer, strictly decoded: the compact one (``asked``: the timers of a bundle
    that asked for it) expanded as :func:`_timers_answer` does, any other read by
    ``from_wire``."""
    if asked and isinstance(w, dict) and "scheduled" in w and "results" not in w:
        done = msgspec.convert(w, wire_timers.TransactionScheduled)
        expanded = _expand(done.scheduled, asked)
        if expanded is codec.FALLBACK:
            raise msgspec.ValidationError(
                f"the compact answer counts {done.scheduled.count} timers, the bundle "
                f"{len(asked)}")
        result: m.TransactionResult = expanded
        return result
    return m.TransactionResult.from_wire(w, kv)


def _timers_answer(raw: bytes, timers: list[dict[str, Any]], compact: bool) -> Any:
    """The result of a bundle of ``timers`` alone: from the compact answer (every timer a new
    name, scheduled) if it asked for one (``compact``: they all schedule), or from the full
    one (:func:`m.timers_committed`); codec.FALLBACK for any other answer (a refusal, say:
    ``parse`` reads it)."""
    if compact and len(raw) <= _COMPACT_MAX:
        done = codec.fast(raw, _COMPACT)
        if done is not codec.FALLBACK:
            return _expand(done.scheduled, timers)
    return m.timers_committed(raw, len(timers))


def _expand(s: wire_timers.TimersScheduled, timers: list[dict[str, Any]]) -> Any:
    """The results the full answer lists, made from the compact one: timer i (from 1) has
    the message id ``messageIdBase`` with i XORed into its last 64 bits (as the broker minted
    it), is due ``now`` plus its delay (each distinct delay computed once) and is in its own
    partition or the default one; queue, key and txn as sent."""
    n = len(timers)
    if s.count != n:
        return codec.FALLBACK  # (not this bundle's answer: parse refuses it)
    base = str(s.message_id_base)
    head, tail = base[:19], base[19:23] + base[24:]
    if n < 4096:  # (i changes only the last three hex digits: one format each)
        prefix, bits = f"{head}{tail[:4]}-{tail[4:13]}", int(tail[13:], 16)
        ids = [f"{prefix}{bits ^ i:03x}" for i in range(1, n + 1)]
    else:
        low = int(tail, 16)
        ids = [f"{head}{t[:4]}-{t[4:]}" for t in (f"{low ^ i:016x}" for i in range(1, n + 1))]
    now = m.parse_time(s.now)
    dues: dict[int, datetime] = {}
    for t in timers:
        if t["delayMs"] not in dues:
            dues[t["delayMs"]] = now + timedelta(milliseconds=t["delayMs"])
    default, scheduled, result = s.default_partition, m.TimerStatus.SCHEDULED, m.TimerResult
    return m.TransactionResult((), tuple([
        result(True, scheduled, t["queue"], t["timerKey"], t["txn"],
               t.get("partition", default), dues[t["delayMs"]], message_id)
        for t, message_id in zip(timers, ids, strict=True)]))


def _timer_body(body: dict[str, Any]) -> bytes | None:
    """A body of timer operations (names and txns, base64 payloads, integer delays: no float,
    nothing but str, int, list and dict) encoded in C, or None when strict_json must encode it
    (and refuse it, naming the value): a U+0000 or an unpaired surrogate in a name, an integer
    past 64 bits."""
    try:
        raw = msgspec.json.encode(body)
    except (ValueError, TypeError, OverflowError):
        return None
    return None if b"\\u0000" in raw else raw


def health() -> Call[dict[str, Any]]:
    return Call("GET", "/health", lambda w: w, True)


__all__ = ["Call", "TimerSpec", "settled_here"]


def _payload_json(payload: Any) -> bytes:
    """A timer's payload as the JSON its base64 carries, refused (as the broker would) before
    sending, with the path named from the operation's ``payload``. A payload of plain JSON
    values (:func:`_plain`) is encoded in C; anything else by strict_json, which refuses it
    or writes it."""
    if _plain(payload, _PLAIN_DEPTH):
        try:
            raw = msgspec.json.encode(payload)
        except (ValueError, OverflowError):  # an unpaired surrogate, an int past 64 bits
            pass
        else:
            if b"\\u0000" not in raw:
                return raw
    try:
        return strict_json.dumps(payload)
    except strict_json.JsonRefused as exc:
        inner = exc.path
        path = "payload" + (inner if inner.startswith("[") or not inner else f".{inner}")
        message = (exc.message.replace(inner, path, 1) if inner
                   else f"payload: {exc.message}")
        raise strict_json.JsonRefused(exc.code, message, path) from None


_PLAIN_DEPTH = 16
_PLAIN_SCALARS = frozenset({str, int, bool, type(None)})


def _plain(value: Any, depth: int) -> bool:
    """Made of dict (str keys), list, str, int, bool, None and finite floats, exactly those
    types, nested at most ``depth`` deep: values that msgspec and strict_json write alike
    (the same JSON value; msgspec would write NaN as null, a datetime as text, which
    strict_json refuses)."""
    kind = type(value)
    if kind in _PLAIN_SCALARS:
        return True
    if kind is float:
        return bool(value - value == 0.0)  # finite (inf - inf and NaN - NaN are NaN)
    if depth == 0:
        return False
    if kind is dict:
        for k, v in value.items():
            if type(k) is not str or (type(v) not in _PLAIN_SCALARS and not _plain(v, depth - 1)):
                return False
        return True
    if kind is list:
        for v in value:
            if type(v) not in _PLAIN_SCALARS and not _plain(v, depth - 1):
                return False
        return True
    return False

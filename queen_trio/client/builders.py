"""The SDK's fluent builders (README, "Python SDK"), shared by the async and the sync client.

Builders are immutable: every step returns a new builder, so a half-built one can be reused
(``base = queen.timer("reminders")``, then ``base.key(a)…``, ``base.key(b)…``). Arguments are
checked as they are given (a bad duration raises ValueError at ``.delay()``), and what is
missing is reported by the final step, before any request.

The final step hands a validated request to the builder's *owner*: a client runs it (and
returns a result, or an awaitable of one for the async client); a transaction builder adds it
to the bundle and returns the transaction builder, so the chain goes on.
"""

from __future__ import annotations

import binascii
import dataclasses
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from operator import itemgetter
from typing import Any, Generic, Protocol, TypeVar

from ..frozen import slotted_init
from . import calls
from .calls import TimerSpec
from .durations import Duration, delay_ms
from .models import AckStatus, Message, Page, TransactionResult

# A guarded commit that met its own lock's renewal is sent again this many times at most.
GUARD_ATTEMPTS = 3

_tuple: Any = tuple.__new__
R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)
T = TypeVar("T")
_UNSET: Any = object()


class TimerOwner(Protocol[R_co]):
    def _timer_schedule(self, spec: TimerSpec) -> R_co: ...
    def _timer_cancel(self, queue: str, key: str, txn: str | None) -> R_co: ...


class TimerBuilder(tuple[Any, ...], Generic[R]):
    """``timer(queue).key(k).delay(d).payload(p)[.partition(p)][.txn(t)]`` then
    ``.schedule()``, ``.cancel()`` or (outside a transaction) ``.peek()``.

    (A tuple of its seven parts, not a frozen dataclass: each step of a 500-timer bundle's
    builders makes one, and a tuple is made at half the cost of setting seven slots.)"""

    __slots__ = ()

    def __new__(cls, owner: TimerOwner[R], queue: str, key: str | None = None,
                delay_ms: int | None = None, payload: Any = _UNSET,
                partition: str | None = None, txn: str | None = None) -> TimerBuilder[R]:
        return _tuple(cls, (owner, queue, key, delay_ms, payload, partition, txn))

    _owner: TimerOwner[R] = property(itemgetter(0))  # type: ignore[assignment]
    _queue: str = property(itemgetter(1))  # type: ignore[assignment]
    _key: str | None = property(itemgetter(2))  # type: ignore[assignment]
    _delay_ms: int | None = property(itemgetter(3))  # type: ignore[assignment]
    _payload: Any = property(itemgetter(4))
    _partition: str | None = property(itemgetter(5))  # type: ignore[assignment]
    _txn: str | None = property(itemgetter(6))  # type: ignore[assignment]

    def __repr__(self) -> str:
        names = ("queue", "key", "delay_ms", "payload", "partition", "txn")
        return "TimerBuilder(" + ", ".join(
            f"{name}={value!r}" for name, value in zip(names, self[1:], strict=True)
            if value is not None and value is not _UNSET) + ")"

    def key(self, key: str) -> TimerBuilder[R]:
        """The timer's name within its queue: 1-512 UTF-8 bytes; '/', ':' and spaces are fine."""
        owner, queue, _, delay, payload, partition, txn = self
        return _tuple(TimerBuilder, (owner, queue, calls._name(key, "timer key"), delay,
                                     payload, partition, txn))

    def delay(self, delay: Duration) -> TimerBuilder[R]:
        """How long from now (PostgreSQL's now) until it is due: int milliseconds, a
        timedelta, or a string such as "250ms", "30m", "72h", "1h30m". Zero or negative
        ("-5s") is legal, as on the wire: the timer fires on the first sweep cycle."""
        owner, queue, key, _, payload, partition, txn = self
        return _tuple(TimerBuilder, (owner, queue, key,
                                     delay if type(delay) is int else delay_ms(delay), payload,
                                     partition, txn))

    def payload(self, payload: Any) -> TimerBuilder[R]:
        """Any JSON value; it becomes the message's ``data``."""
        owner, queue, key, delay, _, partition, txn = self
        return _tuple(TimerBuilder, (owner, queue, key, delay, payload, partition, txn))

    def partition(self, partition: str) -> TimerBuilder[R]:
        owner, queue, key, delay, payload, _, txn = self
        return _tuple(TimerBuilder, (owner, queue, key, delay, payload,
                                     calls._name(partition, "partition"), txn))

    def txn(self, txn: str) -> TimerBuilder[R]:
        """The transactionId the message will carry (default: a fresh UUID, made here)."""
        owner, queue, key, delay, payload, partition, _ = self
        return _tuple(TimerBuilder, (owner, queue, key, delay, payload, partition,
                                     calls._name(txn, "txn")))

    def _required_key(self) -> str:
        if self._key is None:
            raise ValueError(f"timer on {self._queue!r}: call .key(...) first")
        return self._key

    def schedule(self) -> R:
        """Create the timer, or replace it if one of this name is pending (an upsert: safe to
        repeat, so the clients retry it). Answers ``scheduled``, ``rescheduled`` or
        ``too_late``. A repeat after the timer already fired makes a second message."""
        if self._delay_ms is None:
            raise ValueError(f"timer {self._key!r} on {self._queue!r}: call .delay(...) first")
        spec = TimerSpec(self._queue, self._required_key(), self._delay_ms,
                         None if self._payload is _UNSET else self._payload,
                         self._partition, self._txn)
        return self._owner._timer_schedule(spec)

    def cancel(self, txn: str | None = None) -> R:
        """Cancel by name (idempotent, so the clients retry it). Answers ``cancelled``,
        ``absent`` (no longer pending: maybe already delivered; the log is the authority) or
        ``too_late``. ``txn`` (default: the builder's ``.txn()``) is echoed back so you can
        look for it in the destination queue."""
        return self._owner._timer_cancel(self._queue, self._required_key(), txn or self._txn)

    def peek(self) -> Any:
        """The pending timer (:class:`TimerInfo`), or None if it is not pending."""
        peek = getattr(self._owner, "_timer_peek", None)
        if peek is None:
            raise TypeError("peek is not part of a transaction")
        return peek(self._queue, self._required_key())


@slotted_init
@dataclasses.dataclass(frozen=True, slots=True)
class _Chain(Generic[T]):
    """An immutable list that grows at its end in O(1), sharing what came before: a builder
    of a 500-timer bundle copied its whole tuple of entries at every step (O(n²)), and a
    half-built builder must stay reusable."""

    before: _Chain[T] | None
    last: T

    @staticmethod
    def items(chain: _Chain[T] | None) -> tuple[T, ...]:
        out: list[T] = []
        while chain is not None:
            out.append(chain.last)
            chain = chain.before
        out.reverse()
        return tuple(out)


@slotted_init
@dataclasses.dataclass(frozen=True, slots=True)
class TransactionBuilder(Generic[R]):
    """``transaction().ack(m).push(q, p).kv.put(…).timer(q).key(k)….schedule().commit()``:
    everything commits together or nothing does."""

    _commit: Callable[[calls.Call[Any]], R]
    _operations: _Chain[dict[str, Any]] | None = None
    _timers: _Chain[dict[str, Any]] | None = None
    _acked: tuple[Message, ...] = ()
    _kv: tuple[dict[str, Any], ...] = ()
    _guards: tuple[Any, ...] = ()
    _is_async: bool = True

    def ack(self, message: Message, status: AckStatus | str = AckStatus.COMPLETED, *,
            error: str | None = None) -> TransactionBuilder[R]:
        """Acknowledge a popped message (under its lease: a lost lease aborts the bundle)."""
        entry = {"type": "ack", **calls.ack_entry(message, status, error)}
        return dataclasses.replace(self, _operations=_Chain(self._operations, entry),
                                   _acked=(*self._acked, message))

    def push(self, queue: str, payload: Any, *, partition: str | None = None,
             txn: str | None = None) -> TransactionBuilder[R]:
        item = calls.push_item(queue, payload, partition, txn)
        return self._op({"type": "push", "items": [item]})

    @property
    def kv(self) -> _TransactionKv[R]:
        """KV ops applied first, in the bundle: ``.kv.put``, ``.put_if_absent``, ``.delete``,
        ``.incr``, ``.check``, ``.get``, ``.get_many``. ``required=True`` makes an op the
        bundle's gate: if it does not apply, nothing commits."""
        return _TransactionKv(self)

    def once(self, namespace: str, key: str, *, ttl_seconds: Duration | None = None,
             forever: bool = False, value: Any = True) -> TransactionBuilder[R]:
        """Commit only if nobody claimed ``key`` before (a required put_if_absent): a redelivered
        message's bundle then commits nothing and ``commit()`` answers ``committed`` False."""
        return self.kv.put_if_absent(namespace, key, value, ttl_seconds=ttl_seconds,
                                     forever=forever, required=True)

    def timer(self, queue: str) -> TimerBuilder[TransactionBuilder[R]]:
        # (TimerBuilder(self, queue), without __new__'s defaults: a step per timer of a bundle)
        return _tuple(TimerBuilder, (self, calls._name(queue, "queue"), None, None, _UNSET,
                                     None, None))

    def schedule_many(self, queue: str, timers: Iterable[tuple[str, Duration, Any]], *,
                      partition: str | None = None) -> TransactionBuilder[R]:
        """Many timers of one queue, ``(key, delay, payload)`` each, in this order: what
        ``.timer(queue).key(key).delay(delay).payload(payload)[.partition(partition)]
        .schedule()`` adds for each, checked alike, without a builder per timer (a bundle of
        500 costs the SDK a fraction of the chain's). Their answers come in ``commit()``'s
        ``timers``, in the same order."""
        chain = self._timers
        for entry in _schedule_entries(queue, timers, partition):
            chain = _Chain(chain, entry)
        return TransactionBuilder(self._commit, self._operations, chain, self._acked, self._kv,
                                  self._guards, self._is_async)

    def guard(self, lock: Any) -> TransactionBuilder[R]:
        """Commit only while ``lock`` (a held ``queen.lock(...)``, or a granted
        :class:`LockResult`) is still held: its guard goes first in the bundle's KV ops, read
        at ``commit()`` (a renew changes it). A lost lock commits nothing: ``committed``
        False, ``precondition.reason`` ``version`` or ``absent``."""
        if not callable(getattr(lock, "guard", None)) and not isinstance(
                getattr(lock, "guard", None), dict):
            raise TypeError("guard() takes a lock from queen.lock() or a granted LockResult")
        return dataclasses.replace(self, _guards=(*self._guards, lock))

    def commit(self) -> R:
        """Send the bundle. Retried after a lost answer only when that is safe: every pushed
        item carries its own ``txn`` and every ack is ``completed``. A guarded bundle that
        met its own lock's renewal (the token moved under it) is sent again with the new
        guard, a few times: nothing of it had committed."""
        if not self._guards:
            return self._commit(self._call())
        if self._is_async:
            return self._commit_guarded_async()  # type: ignore[return-value]
        return self._commit_guarded_sync()  # type: ignore[return-value]

    def _call(self) -> calls.Call[TransactionResult]:
        guards = tuple(g.guard() if callable(g.guard) else g.guard for g in self._guards)
        return calls.transaction(_Chain.items(self._operations), (*guards, *self._kv),
                                 _Chain.items(self._timers), self._acked)

    def _renewed_under_it(self, result: TransactionResult) -> bool:
        """Refused by a guard whose permit is still this handle's (same owner) at a newer
        version: its own renew landed first. The handle takes that version as its token."""
        why = result.precondition
        if why is None or why.reason != "version" or not isinstance(why.value, dict):
            return False
        mine = [g for g in self._guards if callable(getattr(g, "adopt", None))
                and g.held and g.owner == why.value.get("owner")]
        for handle in mine:
            handle.adopt(why.version)
        return bool(mine)

    async def _commit_guarded_async(self) -> TransactionResult:
        for _ in range(GUARD_ATTEMPTS - 1):
            result: TransactionResult = await self._commit(self._call())  # type: ignore[misc]
            if result.committed or not self._renewed_under_it(result):
                return result
        return await self._commit(self._call())  # type: ignore[misc]

    def _commit_guarded_sync(self) -> TransactionResult:
        for _ in range(GUARD_ATTEMPTS - 1):
            result: TransactionResult = self._commit(self._call())  # type: ignore[assignment]
            if result.committed or not self._renewed_under_it(result):
                return result
        return self._commit(self._call())  # type: ignore[return-value]

    def _op(self, entry: dict[str, Any]) -> TransactionBuilder[R]:
        return dataclasses.replace(self, _operations=_Chain(self._operations, entry))

    def _timer_schedule(self, spec: TimerSpec) -> TransactionBuilder[R]:
        return self._with_timer(spec.to_wire())

    def _timer_cancel(self, queue: str, key: str, txn: str | None) -> TransactionBuilder[R]:
        return self._with_timer(calls.cancel_op(queue, key, txn))

    def _with_timer(self, entry: dict[str, Any]) -> TransactionBuilder[R]:
        # (dataclasses.replace, without its introspection: a step per timer of a bundle)
        return TransactionBuilder(self._commit, self._operations, _Chain(self._timers, entry),
                                  self._acked, self._kv, self._guards, self._is_async)


def _schedule_entries(queue: str, timers: Iterable[tuple[str, Duration, Any]],
                      partition: str | None) -> list[dict[str, Any]]:
    """The wire operations :meth:`TimerSpec.to_wire` makes of each timer, in one loop."""
    queue = calls._name(queue, "queue")
    if partition is not None:
        partition = calls._name(partition, "partition")
    name, payload_json, b64 = calls._name, calls._payload_json, binascii.b2a_base64
    timers = timers if isinstance(timers, list | tuple) else list(timers)
    out = []
    for (key, delay, payload), txn in zip(timers, calls.new_txns(len(timers)), strict=True):
        wire = {"op": "schedule", "queue": queue, "timerKey": name(key, "timer key"),
                "payload": b64(payload_json(payload), newline=False).decode(),
                "delayMs": delay if type(delay) is int else delay_ms(delay), "txn": txn}
        if partition is not None:
            wire["partition"] = partition
        out.append(wire)
    return out


@dataclasses.dataclass(frozen=True, slots=True)
class _TransactionKv(Generic[R]):
    _tx: TransactionBuilder[R]

    def _add(self, op: dict[str, Any]) -> TransactionBuilder[R]:
        return dataclasses.replace(self._tx, _kv=(*self._tx._kv, op))

    def put(self, namespace: str, key: str, value: Any, *, ttl_seconds: Duration | None = None,
            forever: bool = False, expect: int | None = None,
            required: bool = False) -> TransactionBuilder[R]:
        return self._add(calls.kv_put(namespace, key, value, ttl_seconds, forever, expect,
                                      required))

    def put_if_absent(self, namespace: str, key: str, value: Any, *,
                      ttl_seconds: Duration | None = None, forever: bool = False,
                      required: bool = False) -> TransactionBuilder[R]:
        return self._add(calls.kv_put_if_absent(namespace, key, value, ttl_seconds, forever,
                                                required))

    def delete(self, namespace: str, key: str, *, expect: int | None = None,
               required: bool = False) -> TransactionBuilder[R]:
        return self._add(calls.kv_delete(namespace, key, expect, required))

    def incr(self, namespace: str, key: str, delta: int | float = 1, *,
             min: int | float | None = None, max: int | float | None = None,  # noqa: A002
             ttl_seconds: Duration | None = None, forever: bool = False,
             required: bool = False) -> TransactionBuilder[R]:
        return self._add(calls.kv_incr(namespace, key, delta, min, max, ttl_seconds, forever,
                                       required))

    def check(self, namespace: str, key: str, *, expect: int,
              required: bool = False) -> TransactionBuilder[R]:
        """A precondition on a key the bundle does not write (a lock's guard, say)."""
        return self._add(calls.kv_check(namespace, key, expect, required))

    def get(self, namespace: str, key: str) -> TransactionBuilder[R]:
        return self._add(calls.kv_op("get", namespace, key))

    def get_many(self, namespace: str, keys: Iterable[str]) -> TransactionBuilder[R]:
        return self._add(calls.kv_get_many(namespace, list(keys)))


class Listing(Generic[T]):
    """A listing fetched page by page (keyset cursors), lazily. Iterate it with ``async for``
    (async client) or ``for`` (sync client) to get items; ``.pages()`` gives whole pages."""

    def __init__(self, client: Any, fetch: Callable[[str | None], calls.Call[Page[T]]]) -> None:
        self._client = client
        self._fetch = fetch

    def pages(self) -> Any:
        return self._client._pages(self._fetch)

    def __aiter__(self) -> AsyncIterator[T]:
        if not self._client.is_async:
            raise TypeError("this listing belongs to a SyncClient: iterate it with `for`")
        return _async_items(self.pages())

    def __iter__(self) -> Iterator[T]:
        if self._client.is_async:
            raise TypeError("this listing belongs to an async Client: use `async for`")
        return (item for page in self.pages() for item in page.items)


async def _async_items(pages: AsyncIterator[Page[T]]) -> AsyncIterator[T]:
    async for page in pages:
        for item in page.items:
            yield item

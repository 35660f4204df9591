"""The operations both clients offer, written once over an abstract ``_call``.

``_call(call)`` returns the call's result for :class:`~queen_trio.client.SyncClient` and an
awaitable of it for :class:`~queen_trio.client.Client`; everything here just builds calls.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import Any, Generic, TypeVar

import httpx

from . import calls
from .builders import Listing, TimerBuilder, TransactionBuilder
from .calls import Call, TimerSpec
from .durations import Duration, span_ms, whole_seconds
from .locks import Locks
from .models import AckStatus, DeadLetter, Message, Page, TimerInfo
from .transport import Endpoints, Reply, RetryPolicy, Send, drive, exchange

R = TypeVar("R")
DEFAULT_URL = "http://127.0.0.1:6632"


def default_urls() -> list[str]:
    """``QUEEN_URL`` (comma-separated for several brokers) or the local default."""
    raw = os.environ.get("QUEEN_URL", "").strip()
    return [u.strip() for u in raw.split(",") if u.strip()] or [DEFAULT_URL]


class BaseClient(Generic[R]):
    """Configuration and operations shared by the async and the sync client.

    ``urls``: one base URL or a list (failover in order; the one that answered is kept),
    default ``QUEEN_URL`` or http://127.0.0.1:6632. ``token``: bearer token (default
    ``QUEEN_TOKEN``). ``timeout``: seconds or an :class:`httpx.Timeout` (long polls add their
    wait on top). ``retry``: a :class:`RetryPolicy`; only calls that are safe to repeat are
    retried after a lost answer (see :mod:`queen_trio.client.transport`).
    """

    is_async: bool

    def __init__(
        self, urls: str | Sequence[str] | None = None, *, token: str | None = None,
        timeout: float | httpx.Timeout = 10.0, retry: RetryPolicy | None = None,
    ) -> None:
        self._endpoints = Endpoints(default_urls() if urls is None else urls)
        token = token if token is not None else os.environ.get("QUEEN_TOKEN") or None
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._timeout = timeout if isinstance(timeout, httpx.Timeout) else httpx.Timeout(
            timeout, connect=min(timeout, 5.0))
        self._retry = retry or RetryPolicy()
        self._token = token

    def _options(self) -> dict[str, Any]:
        """What it takes to build an equivalent client (the sync consumer runs an async one)."""
        return {"urls": self.urls, "token": self._token, "timeout": self._timeout,
                "retry": self._retry}

    @property
    def urls(self) -> list[str]:
        """The base URLs, in the order given."""
        return list(self._endpoints.urls)

    @property
    def url(self) -> str:
        """The base URL the next request goes to (the last one that answered)."""
        return self._endpoints.urls[self._endpoints.preferred]

    # -- execution: the one path every call takes; each client supplies how to send a
    # request and how to sleep, and whether to await the result or run it to completion.

    def _call(self, call: Call[Any]) -> Any:
        raise NotImplementedError

    def _pages(self, fetch: Callable[[str | None], Call[Page[Any]]]) -> Any:
        raise NotImplementedError

    async def _send(self, step: Send) -> Reply:
        raise NotImplementedError

    async def _sleep(self, seconds: float) -> None:
        raise NotImplementedError

    async def _execute(self, call: Call[Any]) -> Any:
        steps = exchange(call, self._endpoints, self._retry, self._timeout)
        return await drive(steps, self._send, self._sleep)

    async def _walk(self, fetch: Callable[[str | None], Call[Page[Any]]]
                    ) -> AsyncIterator[Page[Any]]:
        cursor: str | None = None
        while True:
            page = await self._execute(fetch(cursor))
            yield page
            if not page.next:
                return
            cursor = page.next

    # -- timers ---------------------------------------------------------------------------

    def timer(self, queue: str) -> TimerBuilder[R]:
        """``queen.timer(q).key(k).delay("15m").payload(p).schedule()`` / ``.cancel()`` /
        ``.peek()``."""
        return TimerBuilder(self, calls._name(queue, "queue"))

    def timers(self, queue: str) -> TimerQueue:
        """The pending timers of one queue: ``queen.timers(q).list()``."""
        return TimerQueue(self, calls._name(queue, "queue"))

    def _timer_schedule(self, spec: TimerSpec) -> R:
        return self._call(calls.schedule_timer(spec))

    def _timer_cancel(self, queue: str, key: str, txn: str | None) -> R:
        return self._call(calls.cancel_timer(queue, key, txn))

    def _timer_peek(self, queue: str, key: str) -> Any:
        return self._call(calls.peek_timer(queue, key))

    # -- bundles --------------------------------------------------------------------------

    def transaction(self) -> TransactionBuilder[R]:
        """Acks, pushes, KV writes and timers committed together or not at all."""
        return TransactionBuilder(self._call, _is_async=self.is_async)

    # -- the log --------------------------------------------------------------------------

    def push(self, queue: str, payload: Any, *, partition: str | None = None,
             txn: str | None = None) -> Any:
        """Append one message; the result is a :class:`PushResult`. Retried after a lost
        answer only when ``txn`` is given (the broker then answers ``duplicate`` to a repeat);
        without it a lost answer raises :class:`BrokerUnreachable` with ``maybe_applied``."""
        return self._call(calls.push_one(calls.push_item(queue, payload, partition, txn)))

    def push_many(self, queue: str, payloads: Iterable[Any], *, partition: str | None = None,
                  txns: Iterable[str] | None = None) -> Any:
        """Append several messages in one request (a tuple of :class:`PushResult`).
        Retried like :meth:`push`: only if every message has its ``txn``."""
        payloads = list(payloads)
        ids: list[str | None] = list(txns) if txns is not None else [None] * len(payloads)
        if len(ids) != len(payloads):
            raise ValueError("txns must give one transactionId per payload")
        return self._call(calls.push([calls.push_item(queue, p, partition, t)
                                      for p, t in zip(payloads, ids, strict=True)]))

    def pop(self, queue: str, *, group: str | None = None, partition: str | None = None,
            batch: int = 1, wait: Duration | None = None, auto_ack: bool = False) -> Any:
        """Up to ``batch`` messages of one partition under a lease (a :class:`Batch`, empty if
        nothing is ready). ``wait`` long-polls up to that long. Never retried after a lost
        answer: the lease it took would hide the messages until it expires."""
        if batch < 1:
            raise ValueError("batch must be at least 1")
        return self._call(calls.pop(queue, group=group, partition=partition, batch=batch,
                                    wait=wait, auto_ack=auto_ack))

    def ack(self, message: Message, status: AckStatus | str = AckStatus.COMPLETED, *,
            error: str | None = None) -> Any:
        """Settle a popped message: ``completed`` (retried: acks are idempotent), ``failed``
        (redelivered up to the queue's retryLimit, then dead-lettered), ``retry`` or ``dlq``."""
        return self._call(calls.ack(message, status, error))

    def extend_lease(self, lease_id: str, seconds: Duration) -> Any:
        """Push a lease's expiry to now + ``seconds``; answers the new expiry (a datetime)."""
        return self._call(calls.extend_lease(lease_id, whole_seconds(seconds, "seconds",
                                                                     minimum=1)))

    def configure(self, queue: str, *, lease_time: Duration | None = None,
                  retry_limit: int | None = None, delayed_processing: Duration | None = None,
                  retention: Duration | None = None,
                  dead_letter_queue: bool | None = None, max_size: int | None = None,
                  retry_delay: Duration | None = None, ttl: Duration | None = None,
                  completed_retention: Duration | None = None,
                  retention_enabled: bool | None = None,
                  retain_until_consumed: bool | None = None,
                  max_wait: Duration | None = None) -> Any:
        """Create or reconfigure a queue (a :class:`QueueConfig`). Durations are whole
        seconds (ints count seconds), except ``retry_delay``: milliseconds (ints count
        milliseconds, strings such as ``"250ms"`` or ``"2s"`` convert). ``max_size``: the
        most unconsumed messages the queue holds (a push past it is refused, 409
        ``queue_full``). ``max_wait``: messages older than this are evicted (dropped).
        Omitted options take the broker's defaults."""
        options: dict[str, Any] = {}
        for wire, value in (("leaseTime", lease_time), ("delayedProcessing", delayed_processing),
                            ("retentionSeconds", retention), ("ttl", ttl),
                            ("completedRetentionSeconds", completed_retention),
                            ("maxWaitTimeSeconds", max_wait)):
            if value is not None:
                options[wire] = whole_seconds(value, wire)
        if retry_delay is not None:
            options["retryDelay"] = span_ms(retry_delay, "retry_delay")
        for wire, plain in (("retryLimit", retry_limit), ("deadLetterQueue", dead_letter_queue),
                            ("maxSize", max_size), ("retentionEnabled", retention_enabled),
                            ("retainUntilConsumed", retain_until_consumed)):
            if plain is not None:
                options[wire] = plain
        return self._call(calls.configure(queue, options))

    def queues(self) -> Any:
        """The tenant's queues, as ``GET /api/v1/resources/queues`` answers them (dicts: name,
        partitions, messages ``{total, pending, processing}``, options)."""
        return self._call(calls.list_queues())

    @property
    def kv(self) -> Kv[R]:
        """``queen.kv.get(ns, key)``, ``.put(ns, key, value, ttl_seconds=…)``,
        ``.put_if_absent``, ``.delete``, ``.incr``, ``.check``, ``.get_many``,
        ``.get_prefix``."""
        return Kv(self)

    @property
    def locks(self) -> Locks[R]:
        """The raw lock operations: ``queen.locks.acquire(name, ttl=…)``, ``.renew``,
        ``.release``, ``.get``. ``queen.lock(name, ttl=…)`` holds one for a block."""
        return Locks(self)

    @property
    def dlq(self) -> DeadLetters:
        """``queen.dlq.list(queue, group=…)`` and ``queen.dlq.replay(id)``."""
        return DeadLetters(self)

    def health(self) -> Any:
        return self._call(calls.health())


class TimerQueue:
    def __init__(self, client: BaseClient[Any], queue: str) -> None:
        self._client, self._queue = client, queue

    def list(self, *, page_size: int = 100) -> Listing[TimerInfo]:
        """Every pending timer of the queue in key order, fetched ``page_size`` at a time."""
        return Listing(self._client, lambda after: calls.list_timers(self._queue, page_size,
                                                                     after))


class Kv(Generic[R]):
    """KV state on Queen's wire (every call is ``POST /api/v1/kv``). A write declares its
    expiry: ``ttl_seconds=`` (whole seconds: an int, a timedelta or "1h") or ``forever=True``;
    it never keeps the old one. Writes answer a :class:`KvWrite` (truthy when it applied)."""

    def __init__(self, client: BaseClient[R]) -> None:
        self._client = client

    def _one(self, op: dict[str, Any]) -> Any:
        return self._client._call(calls.kv(op))

    def get(self, namespace: str, key: str) -> Any:
        """The :class:`KvEntry`, or None if the key does not exist (or expired)."""
        return self._one(calls.kv_op("get", namespace, key))

    def get_many(self, namespace: str, keys: Iterable[str]) -> Any:
        """:class:`KvRows`: the live keys among ``keys`` and the ``missing`` ones."""
        return self._one(calls.kv_get_many(namespace, list(keys)))

    def get_prefix(self, namespace: str, prefix: str, *, after: str | None = None,
                   limit: int | None = None, keys_only: bool = False) -> Any:
        """One :class:`KvPage` of the keys starting with ``prefix`` (non-empty), in byte
        order: up to ``limit`` (default 100, at most 1000), after the key ``after``."""
        return self._one(calls.kv_get_prefix(namespace, prefix, after, limit, keys_only))

    def put(self, namespace: str, key: str, value: Any, *, ttl_seconds: Duration | None = None,
            forever: bool = False, expect: int | None = None) -> Any:
        """Write a JSON value. With ``expect`` it is conditional: 0, the key must not exist;
        N, it must be at version N (a key that is not there is never created)."""
        return self._one(calls.kv_put(namespace, key, value, ttl_seconds, forever, expect))

    def put_if_absent(self, namespace: str, key: str, value: Any, *,
                      ttl_seconds: Duration | None = None, forever: bool = False) -> Any:
        """Write only if no live key is there: of concurrent callers exactly one applies, and
        the others learn its value and version."""
        return self._one(calls.kv_put_if_absent(namespace, key, value, ttl_seconds, forever))

    def delete(self, namespace: str, key: str, *, expect: int | None = None) -> Any:
        """Delete a key; not applied (``reason`` absent) when there was no live one."""
        return self._one(calls.kv_delete(namespace, key, expect))

    def incr(self, namespace: str, key: str, delta: int | float = 1, *,
             min: int | float | None = None, max: int | float | None = None,  # noqa: A002
             ttl_seconds: Duration | None = None, forever: bool = False) -> Any:
        """Add ``delta`` atomically. Past ``min`` or ``max`` it is refused (``reason``
        limit), never saturated. The expiry applies when the counter is created."""
        return self._one(calls.kv_incr(namespace, key, delta, min, max, ttl_seconds, forever))

    def check(self, namespace: str, key: str, *, expect: int) -> Any:
        """Is the key at version ``expect`` (0: not there)? Writes nothing."""
        return self._one(calls.kv_check(namespace, key, expect))


class DeadLetters:
    def __init__(self, client: BaseClient[Any]) -> None:
        self._client = client

    def list(self, queue: str | None = None, *, group: str | None = None,
             page_size: int = 100) -> Listing[DeadLetter]:
        """Dead letters, oldest first (group ``__timer__``: timers that could not be fired)."""
        return Listing(self._client,
                       lambda after: calls.list_dead_letters(queue, group, page_size, after))

    def replay(self, dead_letter_id: int) -> Any:
        """Push a dead letter's frame again (a :class:`Replayed`). Not retried: each replay
        appends. A timer's dead letter cannot be replayed (409)."""
        return self._client._call(calls.replay_dead_letter(dead_letter_id))

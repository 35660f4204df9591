"""The async client, over the lean HTTP/1.1 client of :mod:`.wire` on anyio sockets, so it
runs under trio and asyncio alike."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import anyio
import httpx

from . import consumer
from .api import BaseClient
from .durations import Duration
from .locks import Lock
from .models import Message
from .transport import Send
from .wire import Answer, LeanClient


class Client(BaseClient[Awaitable[Any]]):
    """``async with queen_trio.Client(url) as queen: await queen.timer(q)…schedule()``.

    Every call returns an awaitable; listings are ``async for`` iterables. One connection pool
    per client, reused by every call; close it with ``aclose()`` or by leaving the
    ``async with`` block. Constructor arguments: see :class:`BaseClient`.
    """

    is_async = True

    def __init__(self, urls: str | Sequence[str] | None = None, **options: Any) -> None:
        super().__init__(urls, **options)
        self._http = LeanClient(headers=self._headers, timeout=self._timeout)
        self._lease_cache: dict[str, int] = {}  # per queue, learnt by the consumer
        self._no_stream = False  # the broker answered a streaming pop 404: pop over HTTP

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    _call = BaseClient._execute
    _pages = BaseClient._walk

    async def _send(self, step: Send) -> Answer | httpx.Response:
        return await self._http.request(step.method, step.url, params=step.params,
                                        content=step.content, timeout=step.timeout)

    async def _sleep(self, seconds: float) -> None:
        await anyio.sleep(seconds)

    def lock(self, name: str, ttl: Duration, *, limit: int = 1,
             timeout: Duration | None = None, owner: str | None = None,
             renew: bool = True) -> Lock:
        """``async with queen.lock("name", ttl="30s") as lock:`` holds the lock for the block:
        waits for it up to ``timeout`` (None: as long as it takes; then
        :class:`LockNotAcquired`), renews it every ``ttl / 3`` while the block runs (unless
        ``renew`` is False), releases it on the way out, exception or not. ``limit`` N makes
        it one of N permits (a semaphore). ``lock.token`` is the fencing token;
        ``queen.transaction().guard(lock)`` commits only while it is held."""
        return Lock(self, name, ttl, limit=limit, timeout=timeout, owner=owner, renew=renew)

    async def consume(
        self, queue: str, handler: Callable[[Message], Awaitable[Any] | Any], *,
        group: str | None = None, concurrency: int = consumer.DEFAULT_CONCURRENCY,
        batch: int = consumer.DEFAULT_BATCH, partition: str | None = None,
        max_messages: int | None = None, idle_timeout: Duration | None = None,
        poll: Duration = "2s", renew_leases: bool = True, stream: bool = True,
    ) -> consumer.ConsumeStats:
        """Pop and handle messages until cancelled, until ``max_messages`` were handled, or
        until nothing arrived for ``idle_timeout``; returns what happened.

        Up to ``concurrency`` partitions of the queue are handled at once, each in order:
        a worker pops up to ``batch`` messages of one partition (a pop answers with what is
        ready and never waits for a full batch) and calls ``handler(message)`` (sync or
        async) on each in turn. While it runs, the batch's lease is renewed every third of
        the queue's leaseTime (unless ``renew_leases`` is False). A handler that returns
        settles the message ``completed``; one that raises settles it ``failed`` with the
        exception as its error, so the broker redelivers it up to the queue's retryLimit and
        then dead-letters it; the rest of that batch is given back untouched (no retry spent)
        so the partition stays in order. Settlements travel with the worker's next pop, one
        request per batch. A handler may settle its message itself (``ack``, or a
        transaction with ``.ack(message)``); the loop then leaves it alone. Network or broker
        trouble is logged and waited out; an API error on pop (a 401, a bad queue name) ends
        the loop by raising.

        Stopping lets long polls end by themselves (so after ``max_messages`` it can take up
        to ``poll``): a poll abandoned mid-way could still lease a message that nobody would
        then see until the lease expired. A batch that arrives after the stop is given back
        (no retry spent). Cancelling the loop from outside abandons polls, with that
        consequence, but still settles the messages whose handler finished (within 5 s) and
        gives back the rest of their batch, so only unfinished messages come again.

        ``stream`` (default): when the broker offers its streaming pop (a WebSocket, over
        ``http://``), one connection brings the batches as they become ready, at most
        ``concurrency`` at once, and takes their settlements back: no request per batch.
        Against a broker without it (the upgrade answered 404, asked once per client) or with
        ``stream=False``, the loop pops over HTTP as described above.
        """
        return await consumer.consume(
            self, queue, handler, group=group, concurrency=concurrency, batch=batch,
            partition=partition, max_messages=max_messages, idle_timeout=idle_timeout,
            poll=poll, renew_leases=renew_leases, stream=stream,
        )

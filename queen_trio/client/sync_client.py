"""The sync facade, for scripts and REPLs: the same builders and results, no ``await``."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import anyio
import httpx

from .api import BaseClient
from .async_client import Client
from .blocking import iterate_blocking, run_blocking
from .calls import Call
from .consumer import ConsumeStats, InThread
from .durations import Duration
from .locks import SyncLock
from .models import Message, Page
from .transport import Send
from .wire import Answer, LeanClient


class SyncClient(BaseClient[Any]):
    """``with queen_trio.SyncClient(url) as queen: queen.timer(q)…schedule()``.

    Runs the same request building, retry policy and response parsing as :class:`Client`,
    over the same lean HTTP/1.1 client in its blocking mode (client/wire.py: blocking
    sockets, no event loop to wake; ``https://`` through an :class:`httpx.Client`).
    Thread-safe for calls; do not call it from inside an event loop's thread (it blocks).
    """

    is_async = False

    def __init__(self, urls: str | Sequence[str] | None = None, **options: Any) -> None:
        super().__init__(urls, **options)
        self._http = LeanClient(headers=self._headers, timeout=self._timeout, blocking=True)

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        run_blocking(self._http.aclose())

    def _call(self, call: Call[Any]) -> Any:
        return run_blocking(self._execute(call))

    def _pages(self, fetch: Callable[[str | None], Call[Page[Any]]]) -> Iterator[Page[Any]]:
        return iterate_blocking(self._walk(fetch))

    async def _send(self, step: Send) -> Answer | httpx.Response:  # blocks; never suspends
        return await self._http.request(step.method, step.url, params=step.params,
                                        content=step.content, timeout=step.timeout)

    async def _sleep(self, seconds: float) -> None:  # blocks; never suspends
        time.sleep(seconds)  # noqa: ASYNC251 - the point: this coroutine never suspends

    def lock(self, name: str, ttl: Duration, *, limit: int = 1,
             timeout: Duration | None = None, owner: str | None = None,
             renew: bool = True) -> SyncLock:
        """:meth:`Client.lock` for ``with``: renewed by a thread of its own meanwhile."""
        return SyncLock(self, name, ttl, limit=limit, timeout=timeout, owner=owner,
                        renew=renew)

    def consume(self, queue: str, handler: Callable[[Message], Any], **options: Any
                ) -> ConsumeStats:
        """:meth:`Client.consume` for a plain function: blocks until the loop ends (give
        ``max_messages`` or ``idle_timeout``, or interrupt it). Each batch's handler calls run
        in a worker thread, one batch per ``concurrency`` at a time; they may use this
        client."""

        async def main() -> ConsumeStats:
            async with Client(**self._options()) as client:
                return await client.consume(queue, InThread(handler), **options)

        return anyio.run(main)

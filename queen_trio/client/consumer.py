"""The consume loop behind :meth:`Client.consume` (anyio: runs under trio and asyncio)."""

from __future__ import annotations

import dataclasses
import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import anyio

from . import calls
from .durations import Duration, delay_ms
from .errors import ApiError, BrokerUnreachable, Conflict, NotFound, RateLimited, ServerError
from .models import AckStatus, Batch, Message

if TYPE_CHECKING:
    from .async_client import Client

log = logging.getLogger("queen_trio.client")

DEFAULT_LEASE_S = 300  # the broker's default leaseTime, for a queue it does not know yet
_PASSING = (BrokerUnreachable, ServerError, RateLimited)  # waited out, never fatal


@dataclasses.dataclass(frozen=True, slots=True)
class ConsumeStats:
    handled: int = 0          # handler calls that finished (returned or raised)
    completed: int = 0        # acked completed by the loop
    failed: int = 0           # handler raised; acked failed
    settled_by_handler: int = 0  # the handler acked them itself
    ack_errors: int = 0       # the loop's ack was refused (e.g. lease lost) or not delivered
    leases_lost: int = 0      # a renewal found the lease gone


async def consume(
    client: Client, queue: str, handler: Callable[[Message], Awaitable[Any] | Any], *,
    group: str | None, concurrency: int, batch: int, partition: str | None,
    max_messages: int | None, idle_timeout: Duration | None, poll: Duration,
    renew_leases: bool,
) -> ConsumeStats:
    if concurrency < 1 or batch < 1:
        raise ValueError("concurrency and batch must be at least 1")
    if max_messages is not None and max_messages < 1:
        raise ValueError("max_messages must be at least 1")
    loop = _Loop(client, queue, handler, group=group, batch=batch, partition=partition,
                 max_messages=max_messages,
                 idle_s=None if idle_timeout is None else delay_ms(idle_timeout,
                                                                    "idle_timeout") / 1000,
                 poll_s=_positive_s(poll, "poll"), renew=renew_leases)
    async with anyio.create_task_group() as workers:
        for _ in range(concurrency):
            workers.start_soon(loop.worker)
    if loop.fatal is not None:
        raise loop.fatal  # as itself, not wrapped in the task group's ExceptionGroup
    return loop.stats


def _positive_s(value: Duration, what: str) -> float:
    ms = delay_ms(value, what)
    if ms <= 0:
        raise ValueError(f"{what} must be positive")
    return ms / 1000


class _Loop:
    def __init__(self, client: Client, queue: str, handler: Callable[[Message], Any], *,
                 group: str | None, batch: int, partition: str | None,
                 max_messages: int | None, idle_s: float | None, poll_s: float,
                 renew: bool) -> None:
        self.client, self.queue, self.handler = client, queue, handler
        self.group, self.batch, self.partition = group, batch, partition
        self.max_messages, self.idle_s, self.poll_s = max_messages, idle_s, poll_s
        self.renew = renew
        self.stats = ConsumeStats()
        self.stopping = False
        self.last_activity = anyio.current_time()
        self.fatal: ApiError | None = None

    def count(self, **increments: int) -> None:
        self.stats = dataclasses.replace(self.stats, **{
            k: getattr(self.stats, k) + v for k, v in increments.items()})

    def stop(self) -> None:
        """Pop no more. Handlers in progress finish, and pops in flight are not cancelled:
        a long poll abandoned by its client can still take a lease on the broker (if a message
        arrives before the broker notices), hiding that message until the lease expires. A
        pop that returns after the stop gives its batch straight back instead."""
        self.stopping = True

    async def worker(self) -> None:
        troubles = 0
        while not self.stopping:
            wait_s = self.poll_s
            if self.idle_s is not None:
                wait_s = min(wait_s, self.last_activity + self.idle_s - anyio.current_time())
                if wait_s <= 0:
                    self.stop()
                    return
            got: Batch | None = None
            try:
                got = await self.client.pop(self.queue, group=self.group,
                                            partition=self.partition, batch=self.batch,
                                            wait=max(1, int(wait_s * 1000)))
                troubles = 0
            except _PASSING as exc:
                troubles += 1
                log.warning("consume %s: pop failed (%s); retrying", self.queue, exc)
                await anyio.sleep(self.client._retry.backoff(min(troubles, 6)))
            except ApiError as exc:  # the request itself is wrong: retrying won't help
                self.fatal = self.fatal or exc
                self.stop()
            if got and self.stopping:
                await self.give_back(got)
            elif got:
                self.last_activity = anyio.current_time()
                await self.handle_batch(got)

    async def give_back(self, got: Batch) -> None:
        """Release a batch that arrived after the stop, without spending a retry."""
        if got.lease_id is None:  # auto-acked pops never happen here; nothing to release
            return
        try:
            await self.client.ack(got.messages[0], AckStatus.RETRY)  # releases the whole lease
        except (ApiError, BrokerUnreachable) as exc:
            log.warning("consume %s: could not give back a batch: %s", self.queue, exc)

    async def handle_batch(self, got: Batch) -> None:
        lease_s = await self.lease_seconds() if self.renew and got.lease_id else None
        async with anyio.create_task_group() as tasks:
            if lease_s is not None and got.lease_id is not None:
                tasks.start_soon(self.renew_lease, got.lease_id, lease_s)
            for message in got:
                await self.handle(message)
            tasks.cancel_scope.cancel()

    async def handle(self, message: Message) -> None:
        settled: set[tuple[str, str]] = set()
        token = calls.settled_here.set(settled)
        status, error = AckStatus.COMPLETED, None
        try:
            result = self.handler(message)
            if inspect.isawaitable(result):
                await result
        except Exception as exc:  # the handler's failure is the message's, not the loop's
            status, error = AckStatus.FAILED, f"{type(exc).__name__}: {exc}"
            log.warning("consume %s: handler failed on %s: %s", self.queue,
                        message.transaction_id, error, exc_info=True)
        finally:
            calls.settled_here.reset(token)
        failed = int(status is AckStatus.FAILED)
        if (message.partition_id, message.transaction_id) in settled:
            self.count(handled=1, failed=failed, settled_by_handler=1)
        else:
            try:
                await self.client.ack(message, status, error=error)
                self.count(handled=1, failed=failed, completed=1 - failed)
            except (ApiError, BrokerUnreachable) as exc:
                # The lease was lost or the broker is gone: the message comes back after its
                # lease expires, which is what at-least-once delivery means.
                log.warning("consume %s: ack of %s failed: %s", self.queue,
                            message.transaction_id, exc)
                self.count(handled=1, failed=failed, ack_errors=1)
        self.last_activity = anyio.current_time()
        if self.max_messages is not None and self.stats.handled >= self.max_messages:
            self.stop()

    async def lease_seconds(self) -> int:
        known = self.client._lease_cache.get(self.queue)
        if known is None:
            try:
                known = await self.client._call(calls.queue_lease_seconds(self.queue))
            except _PASSING:
                known = None
            known = known or DEFAULT_LEASE_S
            self.client._lease_cache[self.queue] = known
        return known

    async def renew_lease(self, lease_id: str, lease_s: int) -> None:
        while True:
            await anyio.sleep(max(lease_s / 3, 0.05))
            try:
                await self.client.extend_lease(lease_id, lease_s)
            except (Conflict, NotFound) as exc:
                log.warning("consume %s: lease %s lost: %s", self.queue, lease_id, exc)
                self.count(leases_lost=1)
                return
            except _PASSING as exc:
                log.warning("consume %s: lease %s not renewed: %s", self.queue, lease_id, exc)

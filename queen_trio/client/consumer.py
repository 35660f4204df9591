"""The consume loop behind :meth:`Client.consume` (anyio: runs under trio and asyncio).

How it spends requests, since that is what a consumer's latency and the broker's CPU go to:

* ``concurrency`` workers each take a batch of one partition (under that partition's lease, so
  partitions run in parallel and each one in order), run the handler on its messages one by
  one, and then owe the broker the batch's settlements. They pay them with their next pop: a
  ``POST`` pop carries the acknowledgements, so a batch costs one request, not one per message.
* One long poll at a time. Idle workers queue for the *poll slot* here rather than each parking
  a poll at the broker, where every parked poll is run again on every wake-up of the queue. A
  worker that owes settlements while another one polls sends them on a pop that does not wait
  (it takes whatever is ready now, from another partition or the next batch of its own).
* A worker keeps the slot while it handles its batch, so that while handlers are quick one
  worker settles and pops again in one request (a partition's next batch can only be leased
  once the previous one is settled: a second worker polling meanwhile would only wait and then
  race for it); it gives the slot up after ``SLOT_HOLD_S``, so that a slow handler never keeps
  the other partitions waiting.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import anyio.from_thread
import anyio.to_thread
import sniffio

from . import calls
from .durations import Duration, delay_ms, span_ms
from .errors import ApiError, BrokerUnreachable, Conflict, NotFound, RateLimited, ServerError
from .models import AckResult, AckStatus, Batch, Message, SettledPop
from .stream import FromBroker, NativePopStream, Owed, PopStream, StreamUnsupported

if TYPE_CHECKING:
    from .async_client import Client

log = logging.getLogger("queen_trio.client")

DEFAULT_CONCURRENCY = 4  # partitions handled at once
DEFAULT_BATCH = 500      # messages per pop: a pop answers with what is ready, never waits for more
DEFAULT_LEASE_S = 300    # the broker's default leaseTime, for a queue it does not know yet
SLOT_HOLD_S = 0.02       # how long a batch being handled keeps the poll slot
SETTLE_AT_EXIT_S = 5.0   # how long a stopping or cancelled worker may take to settle
_PASSING = (BrokerUnreachable, ServerError, RateLimited)  # waited out, never fatal
# A stream that brought nothing, not even its heartbeat (one per ``poll``), for this many
# polls (plus a margin) has lost its broker: it is closed and opened again.
STREAM_SILENT_POLLS = 3
STREAM_SILENT_MARGIN_S = 5.0


@dataclasses.dataclass(frozen=True, slots=True)
class ConsumeStats:
    handled: int = 0          # handler calls that finished (returned or raised)
    completed: int = 0        # acked completed by the loop (taken, or found done)
    failed: int = 0           # handler raised; acked failed
    settled_by_handler: int = 0  # the handler acked them itself
    ack_errors: int = 0       # the loop's ack was refused (e.g. lease lost) or not delivered
    leases_lost: int = 0      # a renewal found the lease gone
    requests: int = 0         # pops and settlements the loop sent


async def consume(
    client: Client, queue: str, handler: Callable[[Message], Awaitable[Any] | Any], *,
    group: str | None, concurrency: int, batch: int, partition: str | None,
    max_messages: int | None, idle_timeout: Duration | None, poll: Duration,
    renew_leases: bool, stream: bool = True,
) -> ConsumeStats:
    if concurrency < 1 or batch < 1:
        raise ValueError("concurrency and batch must be at least 1")
    if max_messages is not None and max_messages < 1:
        raise ValueError("max_messages must be at least 1")
    in_thread = isinstance(handler, InThread)
    if isinstance(handler, InThread):
        handler = handler.function
    loop = _Loop(client, queue, handler, group=group, batch=batch, partition=partition,
                 max_messages=max_messages,
                 idle_s=None if idle_timeout is None else span_ms(idle_timeout,
                                                                   "idle_timeout") / 1000,
                 poll_s=_positive_s(poll, "poll"), renew=renew_leases, in_thread=in_thread)
    if stream and not client._no_stream:
        try:
            await _Streaming(loop, concurrency).run()
        except StreamUnsupported as exc:
            # Asked once per client: later consume() calls pop over HTTP straight away.
            log.info("consume %s: %s; popping over HTTP", queue, exc)
            client._no_stream = True
        else:
            loop.stop()
    if not loop.stopping:
        async with anyio.create_task_group() as workers:
            for _ in range(concurrency):
                workers.start_soon(_Worker(loop).run)
    if loop.fatal is not None:
        raise loop.fatal  # as itself, not wrapped in the task group's ExceptionGroup
    return loop.stats


@dataclasses.dataclass(frozen=True, slots=True)
class InThread:
    """A plain function whose calls must not block the event loop: the loop runs each batch
    of them in a worker thread (:meth:`SyncClient.consume`)."""

    function: Callable[[Message], Any]

    def __call__(self, message: Message) -> Any:
        return self.function(message)


def _clock() -> Callable[[], float]:
    """The running event loop's clock, as ``anyio.current_time()`` reads it, without looking
    the backend up at every reading (a batch of one read it six times)."""
    if sniffio.current_async_library() == "trio":
        import trio

        return trio.current_time
    return asyncio.get_running_loop().time


def _positive_s(value: Duration, what: str) -> float:
    ms = delay_ms(value, what)
    if ms <= 0:
        raise ValueError(f"{what} must be positive")
    return ms / 1000


class _Loop:
    """What the workers of one consume() share."""

    def __init__(self, client: Client, queue: str, handler: Callable[[Message], Any], *,
                 group: str | None, batch: int, partition: str | None,
                 max_messages: int | None, idle_s: float | None, poll_s: float,
                 renew: bool, in_thread: bool = False) -> None:
        self.client, self.queue, self.handler = client, queue, handler
        self.in_thread = in_thread  # a plain function's batches run in a worker thread
        self.group, self.batch, self.partition = group, batch, partition
        self.max_messages, self.idle_s, self.poll_s = max_messages, idle_s, poll_s
        self.renew = renew
        self.counts = dict.fromkeys(ConsumeStats.__dataclass_fields__, 0)
        self.stopping = False
        self.now = _clock()
        self.last_activity = self.now()
        self.fatal: ApiError | None = None
        self.slot = anyio.Semaphore(1)

    @property
    def stats(self) -> ConsumeStats:
        return ConsumeStats(**self.counts)

    def count(self, **increments: int) -> None:
        counts = self.counts
        for k, v in increments.items():
            counts[k] += v

    def stop(self) -> None:
        """Pop no more. Handlers in progress finish, and pops in flight are not cancelled:
        a long poll abandoned by its client can still take a lease on the broker (if a message
        arrives before the broker notices), hiding that message until the lease expires. A
        pop that returns after the stop gives its batch straight back instead."""
        self.stopping = True

    def settled(self, entries: Sequence[dict[str, Any]], answer: SettledPop | None,
                error: Exception | None = None) -> None:
        """Count what the broker made of a worker's settlements."""
        if not entries:
            return
        if answer is not None:
            # A completion the broker found committed already (an offset commit past it, e.g.
            # by a handler's own transaction acking a later message) is done all the same.
            self.count(completed=answer.acks["completed"] + answer.acks.get("alreadyAcked", 0))
            if not answer.refused:
                return
            # Refused (the lease was lost, say): those messages come back, which is what
            # at-least-once delivery means.
            first = answer.refused[0]
            log.warning("consume %s: the broker refused %d of %d settlements: %s (%s)",
                        self.queue, len(answer.refused), len(entries), first.refused,
                        first.detail)
            self.count(ack_errors=sum(1 for r in answer.refused if r.status != "retry"))
            return
        # The broker is gone: the messages come back after their lease expires.
        log.warning("consume %s: settling %d messages failed: %s", self.queue, len(entries),
                    error)
        self.count(ack_errors=sum(1 for e in entries if e["status"] != "retry"))


class _Handling:
    """Around the handler calls of one batch (the context variable is set once per batch,
    :meth:`begin` readies it for each message): what the handler settled itself (``ack``, or
    a committed transaction that acks it) and how it ended. The handler's exception is the
    message's failure, not the loop's: it is recorded (:meth:`fail`) and swallowed."""

    def __init__(self, queue: str) -> None:
        self.queue = queue
        self.message: Message | None = None
        self.settled: set[tuple[str, str]] = set()
        self.status: AckStatus = AckStatus.COMPLETED
        self.error: str | None = None

    def __enter__(self) -> _Handling:
        self.token = calls.settled_here.set(self.settled)
        return self

    def __exit__(self, *exc: object) -> None:
        calls.settled_here.reset(self.token)

    def begin(self, message: Message) -> None:
        self.message = message
        if self.settled:  # what the previous message's handler settled is not this one's
            self.settled.clear()
        self.status, self.error = AckStatus.COMPLETED, None

    def fail(self, exc: Exception) -> None:
        assert self.message is not None
        self.status, self.error = AckStatus.FAILED, f"{type(exc).__name__}: {exc}"
        log.warning("consume %s: handler failed on %s: %s", self.queue,
                    self.message.transaction_id, self.error, exc_info=exc)


def _entries(owed: Sequence[Owed]) -> list[dict[str, Any]]:
    """What is owed as ``ack_entry`` dicts (a message alone stands for its completion)."""
    return [calls.ack_entry(o, AckStatus.COMPLETED, None) if isinstance(o, Message) else o
            for o in owed]


def _completions(owed: Sequence[Owed]) -> int:
    return sum(1 for o in owed if isinstance(o, Message) or o["status"] == "completed")


class _Worker:
    def __init__(self, loop: _Loop) -> None:
        self.loop = loop
        # Settlements of the last batch, not yet sent: a message handled and completed is owed
        # as itself (its ``ack_entry`` dict is built only if a request needs it: the stream
        # settles a batch completed whole by transactionIds alone), any other as its dict.
        self.owed: list[Owed] = []
        self.holding = False                  # this worker holds the poll slot
        # The batch being handled, for the watchdog (slot hand-over, lease renewal): a task
        # that lives as long as the worker, so that a batch costs no task of its own before
        # its first handler starts.
        self.current: Batch | None = None
        self.began = 0.0
        self.done = 0
        self.armed = anyio.Event()
        self.watching: anyio.CancelScope | None = None

    def release_slot(self) -> None:
        if self.holding:
            self.holding = False
            self.loop.slot.release()

    async def run(self) -> None:
        try:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(self.watchdog)
                await self._pop_and_handle()
                tasks.cancel_scope.cancel()
        finally:
            self.release_slot()
            if self.owed:
                # Handled messages are settled even when the loop is cancelled, so that only
                # the unhandled ones come back; bounded, since the broker may be gone.
                with anyio.CancelScope(shield=True), anyio.move_on_after(SETTLE_AT_EXIT_S):
                    await self.settle_now()

    async def _pop_and_handle(self) -> None:
        loop = self.loop
        troubles = 0
        while not loop.stopping:
            wait_s: float | None = loop.poll_s
            if loop.idle_s is not None:
                wait_s = min(loop.poll_s,
                             loop.last_activity + loop.idle_s - loop.now())
                if wait_s <= 0:
                    loop.stop()
                    return
            if not self.holding:
                if self.owed and loop.slot.value == 0:
                    wait_s = None  # another worker is polling: settle, take what is ready
                else:
                    await loop.slot.acquire()
                    self.holding = True
                    if loop.stopping:
                        return
            owed = _entries(self.owed)
            call = calls.settle_and_pop(
                loop.queue, owed, group=loop.group, partition=loop.partition,
                batch=loop.batch, wait=None if wait_s is None else max(1, int(wait_s * 1000)))
            try:
                answer: SettledPop = await loop.client._call(call)
                troubles = 0
            except _PASSING as exc:
                troubles += 1
                log.warning("consume %s: pop failed (%s); retrying", loop.queue, exc)
                self.release_slot()  # let another worker try meanwhile
                await anyio.sleep(loop.client._retry.backoff(min(troubles, 6)))
                continue
            except ApiError as exc:  # the request itself is wrong: retrying won't help
                loop.fatal = loop.fatal or exc
                loop.stop()
                return
            finally:
                loop.count(requests=1)
            self.owed = []
            loop.settled(owed, answer)
            got = answer.batch
            if not got:
                continue
            if loop.stopping:
                self.give_back(got)
                return
            loop.last_activity = loop.now()
            await self.handle_batch(got)

    def give_back(self, got: Batch) -> None:
        """Owe the broker a batch back whole, no retry spent (it arrived after the stop)."""
        self.owed += [calls.ack_entry(m, AckStatus.RETRY, None) for m in got]

    async def handle_batch(self, got: Batch) -> None:
        loop = self.loop
        messages = got.messages
        self.done = 0  # messages whose handler finished (their settlement is owed)
        self.current, self.began = got, loop.now()
        self.arm()
        try:
            if loop.in_thread:
                await anyio.to_thread.run_sync(self.handle_in_thread, messages)
            else:
                handler = loop.handler
                with _Handling(loop.queue) as handling:
                    for message in messages:
                        handling.begin(message)
                        try:
                            result = handler(message)
                            # (a plain function's None: no look at what it is)
                            if result is not None and inspect.isawaitable(result):
                                await result
                        except Exception as exc:  # the message's failure; cancellation is not
                            handling.fail(exc)
                        self.done += 1
                        if self.record(handling) or loop.stopping:
                            break
        finally:
            # After a failure (or the stop) the rest goes back untouched, no retry spent: the
            # partition's order holds (a failed message is redelivered before the ones after).
            self.current = None
            if self.watching is not None:
                self.watching.cancel()
            self.owed += [calls.ack_entry(m, AckStatus.RETRY, None)
                          for m in messages[self.done:]]
            loop.last_activity = loop.now()

    def arm(self) -> None:
        """A batch is in hand: tell the watchdog."""
        self.armed.set()

    async def watchdog(self) -> None:
        """While a batch is handled: give the poll slot up after ``SLOT_HOLD_S``, then renew
        the batch's lease every third of the queue's leaseTime. A batch handled sooner than
        this task gets to look at it costs nothing here."""
        while True:
            await self.armed.wait()
            self.armed = anyio.Event()
            got = self.current
            if got is None:
                continue  # that batch is over already
            with anyio.CancelScope() as scope:
                self.watching = scope
                await anyio.sleep_until(self.began + SLOT_HOLD_S)
                self.release_slot()
                if self.loop.renew and got.lease_id is not None:
                    await self.renew_lease(got.lease_id)
            self.watching = None

    def handle_in_thread(self, messages: Sequence[Message]) -> None:
        """A plain function's batch, in one worker thread: one hop per batch, not per
        message. A cancelled loop stops it before the next message."""
        handler = self.loop.handler
        with _Handling(self.loop.queue) as handling:
            for message in messages:
                anyio.from_thread.check_cancelled()
                handling.begin(message)
                try:
                    handler(message)
                except Exception as exc:
                    handling.fail(exc)
                self.done += 1
                if self.record(handling) or self.loop.stopping:
                    return

    def record(self, handling: _Handling) -> bool:
        """Owe the broker the handled message's settlement (unless the handler settled it
        itself); True if the handler raised."""
        loop, message = self.loop, handling.message
        assert message is not None
        failed = handling.status is AckStatus.FAILED
        counts = loop.counts
        counts["handled"] += 1
        if failed:
            counts["failed"] += 1
        if handling.settled and (message.partition_id, message.transaction_id) in handling.settled:
            counts["settled_by_handler"] += 1
        elif failed:
            self.owed.append(calls.ack_entry(message, handling.status, handling.error))
        else:
            self.owed.append(message)  # completed
        if loop.max_messages is not None and counts["handled"] >= loop.max_messages:
            loop.stop()
        return failed

    async def settle_now(self) -> None:
        """Send what is owed on its own (the loop is ending)."""
        owed, self.owed = _entries(self.owed), []
        try:
            results = await self.loop.client._call(calls.ack_batch(owed))
        except (ApiError, BrokerUnreachable) as exc:
            self.loop.settled(owed, None, exc)
        else:
            done = sum(1 for r in results if r.status == "completed" and r.refused is None)
            self.loop.settled(owed, SettledPop(Batch(), {"completed": done},
                                               tuple(r for r in results if r.refused)))
        finally:
            self.loop.count(requests=1)

    async def lease_seconds(self) -> int:
        client, queue = self.loop.client, self.loop.queue
        known = client._lease_cache.get(queue)
        if known is None:
            try:
                known = await client._call(calls.queue_lease_seconds(queue))
            except _PASSING:
                known = None
            known = known or DEFAULT_LEASE_S
            client._lease_cache[queue] = known
        return known

    async def renew_lease(self, lease_id: str, *, now: bool = False) -> None:
        """Every third of the queue's leaseTime (``now``: at once, then so), until cancelled
        or the lease is lost."""
        lease_s = await self.lease_seconds()  # off the handler's path: cached after the first
        while True:
            if not now:
                await anyio.sleep(max(lease_s / 3, 0.05))
            now = False
            try:
                await self.loop.client.extend_lease(lease_id, lease_s)
            except (Conflict, NotFound) as exc:
                log.warning("consume %s: lease %s lost: %s", self.loop.queue, lease_id, exc)
                self.loop.count(leases_lost=1)
                return
            except _PASSING as exc:
                log.warning("consume %s: lease %s not renewed: %s", self.loop.queue,
                            lease_id, exc)


class _Streaming:
    """consume() over the broker's streaming pop (client/stream.py): one connection brings
    the batches, at most ``concurrency`` out at once (each goes straight to an idle worker:
    none waits in a buffer while its lease runs), and takes each batch's settlements back.
    Reconnects after trouble (backoff, next broker URL); :class:`StreamUnsupported` from a
    broker without streams ends it, and consume() pops over HTTP instead."""

    def __init__(self, loop: _Loop, concurrency: int) -> None:
        self.loop, self.concurrency = loop, concurrency
        self.batches: _Batches = (_FutureBatches() if sniffio.current_async_library() == "asyncio"
                                  else _MemoryBatches(concurrency))
        self.busy = 0  # workers handling a batch
        self.troubles = 0  # streams ended since one last brought anything
        self.ended: BaseException | None = None

    async def run(self) -> None:
        loop = self.loop
        stream = await self.connect()  # a broker without streams says so before any work
        try:
            async with anyio.create_task_group() as workers:
                for _ in range(self.concurrency):
                    workers.start_soon(_StreamWorker(self, self.batches).run)
                try:
                    while stream is not None:
                        await self.read(stream)
                        await stream.aclose()
                        if loop.stopping:
                            break
                        # A stream that ends as it opens (a bound on waiting pops, a broker
                        # going away) is not opened again at once, nor for ever faster.
                        self.troubles += 1
                        await anyio.sleep(loop.client._retry.backoff(min(self.troubles, 6)))
                        stream = await self.connect()
                except (StreamUnsupported, ApiError) as exc:  # raised below, not in a group
                    self.ended = exc
                finally:
                    self.batches.close()
        finally:
            if stream is not None and not stream.closed:  # cancelled: end it in order
                loop.stop()
                with anyio.CancelScope(shield=True), anyio.move_on_after(SETTLE_AT_EXIT_S):
                    await self.drain(stream)
                await stream.aclose()
        if self.ended is not None:
            raise self.ended

    async def drain(self, stream: PopStream) -> None:
        """The loop was cancelled: the workers have sent what they owe on the stream (after a
        stop); read it to its end, so that those settlements are applied and whatever else
        was out is given back before consume() returns."""
        with contextlib.suppress(BrokerUnreachable):
            await stream.stop()
            while (got := await stream.receive()) is not None:
                await self.take(stream, got)

    async def connect(self) -> PopStream | None:
        """A stream, retrying what passes; None if the loop stopped meanwhile."""
        loop, client = self.loop, self.loop.client
        params: dict[str, Any] = {"batch": loop.batch, "inflight": self.concurrency,
                                  "timeout": max(1, int(loop.poll_s * 1000))}
        if loop.group is not None:
            params["consumerGroup"] = loop.group
        endpoints = client._endpoints
        troubles = 0
        while not loop.stopping:
            at = endpoints.preferred
            try:
                return await PopStream.open(endpoints.urls[at], loop.queue, loop.partition,
                                            params, client._headers, client._timeout.connect)
            except _PASSING as exc:
                troubles += 1
                endpoints.rotate(at)
                log.warning("consume %s: stream failed (%s); retrying", loop.queue, exc)
                await anyio.sleep(client._retry.backoff(min(troubles, 6)))
            except ApiError as exc:
                loop.fatal = loop.fatal or exc
                loop.stop()
            finally:
                loop.count(requests=1)
        return None

    async def read(self, stream: PopStream) -> None:
        """Hand the stream's batches to the workers and its verdicts to the loop, until the
        broker closes it (or it falls silent)."""
        if isinstance(stream, NativePopStream):
            await self.watch(stream)
            return
        loop = self.loop
        silent_s = loop.poll_s * STREAM_SILENT_POLLS + STREAM_SILENT_MARGIN_S
        heard = loop.now()
        try:
            while True:
                wait_s = await self._wait_s(stream, heard, silent_s)
                if wait_s <= 0:
                    log.warning("consume %s: the stream fell silent; reconnecting", loop.queue)
                    return
                got: FromBroker | None = None
                with anyio.move_on_after(wait_s) as waiting:
                    got = await stream.receive()
                if waiting.cancelled_caught:
                    continue
                if got is None:
                    return
                heard = loop.now()
                self.troubles = 0
                await self.take(stream, got)
        except BrokerUnreachable as exc:
            log.warning("consume %s: the stream broke (%s)", loop.queue, exc)

    async def _wait_s(self, stream: PopStream | NativePopStream, heard: float,
                      silent_s: float) -> float:
        """How long a read may wait for the broker now (0 or less: the stream fell silent,
        ``silent_s`` after it was last ``heard``). An idle timeout that has passed stops the
        loop; a stopping loop asks the stream for no more batches."""
        loop = self.loop
        now = loop.now()
        wait_s = heard + silent_s - now
        if loop.idle_s is not None and not loop.stopping:
            idle_left = loop.last_activity + loop.idle_s - now
            if idle_left <= 0 and self.busy == 0:
                loop.stop()
            wait_s = min(wait_s, max(idle_left, 0.01))
        if loop.stopping:
            await stream.stop()  # the broker closes once its pop has answered
        return wait_s

    async def watch(self, stream: NativePopStream) -> None:
        """:meth:`read` under asyncio: the stream hands each message to :meth:`take_now` as
        it arrives (no reader task woken per batch, no timeout set per message); this only
        wakes when the stream ends, falls silent, idles out, or every ``silent_s`` to look."""
        loop = self.loop
        silent_s = loop.poll_s * STREAM_SILENT_POLLS + STREAM_SILENT_MARGIN_S
        try:
            while stream.received:  # came with the upgrade's answer
                self.take_now(stream, stream.received.popleft())
            stream.on_message = self.take_now
            while True:
                wait_s = await self._wait_s(stream, stream.heard, silent_s)
                if wait_s <= 0:
                    log.warning("consume %s: the stream fell silent; reconnecting", loop.queue)
                    return
                if await stream.wait_ended(wait_s):
                    break
            if stream.error is not None:  # a message it could not read
                error, stream.error = stream.error, None
                raise error
        except BrokerUnreachable as exc:
            log.warning("consume %s: the stream broke (%s)", loop.queue, exc)

    def take_now(self, stream: NativePopStream, got: FromBroker) -> None:
        """:meth:`take`, called by the stream with each message as it arrives."""
        self.troubles = 0
        if got.pop is not None and got.seq is not None:
            loop = self.loop
            batch = Batch.from_model(got.pop)
            if loop.stopping:  # arrived after the stop: straight back, no retry spent
                stream.settle_nowait(got.seq, [calls.ack_entry(m, AckStatus.RETRY, None)
                                               for m in batch])
                return
            loop.last_activity = loop.now()
            self.busy += 1
            self.batches.put_nowait((stream, got.seq, batch))
        else:
            self.verdict(got)

    async def take(self, stream: PopStream, got: FromBroker) -> None:
        loop = self.loop
        if got.pop is not None and got.seq is not None:
            batch = Batch.from_model(got.pop)
            if loop.stopping:  # arrived after the stop: straight back, no retry spent
                await stream.settle(got.seq, [calls.ack_entry(m, AckStatus.RETRY, None)
                                              for m in batch])
                return
            loop.last_activity = loop.now()
            self.busy += 1  # a worker is free: at most `concurrency` batches are out
            await self.batches.put((stream, got.seq, batch))
        else:
            self.verdict(got)

    def verdict(self, got: FromBroker) -> None:
        loop = self.loop
        if got.ackRefused:  # counted as taken when sent: not those
            refused = [AckResult.from_model(a) for a in got.ackRefused]
            log.warning("consume %s: the broker refused %d settlements: %s (%s)", loop.queue,
                        len(refused), refused[0].refused, refused[0].detail)
            loop.count(completed=-sum(1 for r in refused if r.status == "completed"),
                       ack_errors=sum(1 for r in refused if r.status != "retry"))
        elif got.error is not None:
            log.warning("consume %s: the broker ends the stream: %s (%s)", loop.queue,
                        got.error, got.message)


class _StreamWorker(_Worker):
    """A worker whose batches come from the stream and whose settlements go back on it (or,
    the stream being gone, in an ack request)."""

    def __init__(self, streaming: _Streaming, batches: _Batches) -> None:
        super().__init__(streaming.loop)
        self.streaming, self.batches = streaming, batches
        self.source: tuple[PopStream, int] | None = None  # the batch in hand: its stream, seq
        self.dozing = True  # the watchdog waits for a batch (else it is timing one already)

    def arm(self) -> None:
        if self.dozing:
            self.armed.set()

    async def watchdog(self) -> None:
        """Renews the lease of a batch still in hand a third of the queue's leaseTime after it
        came (no poll slot to give up here). Not woken for every batch: armed by the first
        batch (the leaseTime is learnt then, cached by the client), it then wakes once per
        third of the leaseTime, or at the renewal instant of the batch in hand; at a steady
        trickle, a batch is settled long before."""
        loop = self.loop
        if not loop.renew:
            return
        # (Often over by the time this looks: a plain function's batch is handled before
        # this task runs again. Renewals are timed from the batches' own instants.)
        await self.armed.wait()
        self.dozing = False
        every = max(await self.lease_seconds() / 3, 0.05)
        while True:
            got, began = self.current, self.began
            if got is None or got.lease_id is None:
                # A batch that comes meanwhile is looked at no later than `every` after it
                # came, which is when its renewal is due.
                await anyio.sleep(every)
                continue
            if loop.now() < began + every:
                await anyio.sleep_until(began + every)
                continue  # the same batch, or a later one that is not due yet, or none
            with anyio.CancelScope() as scope:  # cancelled when the batch is over
                self.watching = scope
                await self.renew_lease(got.lease_id, now=True)
            self.watching = None

    async def _pop_and_handle(self) -> None:
        loop = self.loop
        get = self.batches.get
        while (item := await get()) is not None:
            stream, seq, got = item
            self.source = stream, seq
            try:
                await self.handle_batch(got)
            finally:
                self.streaming.busy -= 1
            await self.settle_batch(ending=loop.stopping)

    async def settle_now(self) -> None:
        """The loop is ending (cancelled, say): settle on the stream after a stop."""
        await self.settle_batch(ending=True)

    async def settle_batch(self, *, ending: bool) -> None:
        """What the batch in hand owes, on the stream it came from; ``ending``: after a stop,
        so that the broker pops nothing more that these settlements would free. In an ack
        request if the stream is gone."""
        source, self.source = self.source, None
        if source is not None and not source[0].closed:
            stream, seq = source
            owed, self.owed = self.owed, []
            try:
                if ending:
                    await stream.stop()
                await stream.settle(seq, owed)
                # Taken unless the broker says otherwise (_Streaming.take).
                self.loop.count(completed=_completions(owed))
                return
            except BrokerUnreachable:
                self.owed = owed
        if self.owed:
            await super().settle_now()


_Handed = tuple[PopStream, int, Batch]  # a batch for a worker: its stream, seq, messages


class _Batches:
    """The stream's batches, on their way to idle workers: each goes to one worker; once
    closed, ``get`` answers None when nothing is left."""

    def put_nowait(self, item: _Handed) -> None:
        raise NotImplementedError

    async def put(self, item: _Handed) -> None:
        raise NotImplementedError

    async def get(self) -> _Handed | None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class _MemoryBatches(_Batches):
    """Through an anyio memory object stream of ``concurrency`` places (under trio)."""

    def __init__(self, concurrency: int) -> None:
        self.sending, self.receiving = anyio.create_memory_object_stream[_Handed](concurrency)

    async def put(self, item: _Handed) -> None:
        try:  # (without a trip through the event loop: a worker is waiting for it)
            self.sending.send_nowait(item)
        except anyio.WouldBlock:
            await self.sending.send(item)

    async def get(self) -> _Handed | None:
        try:
            return await self.receiving.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            return None

    def close(self) -> None:
        self.sending.close()


class _FutureBatches(_Batches):
    """Under asyncio: a batch goes straight into the future an idle worker awaits (one wake-up
    of that worker, nothing else); one that finds no worker idle waits in order. At most
    ``inflight`` are out, which the broker keeps to."""

    def __init__(self) -> None:
        self.items: collections.deque[_Handed] = collections.deque()
        self.idle: collections.deque[asyncio.Future[_Handed | None]] = collections.deque()
        self.closed = False

    def put_nowait(self, item: _Handed) -> None:
        idle = self.idle
        while idle:
            waiter = idle.popleft()
            if not waiter.done():  # (a worker cancelled meanwhile is skipped)
                waiter.set_result(item)
                return
        self.items.append(item)

    async def put(self, item: _Handed) -> None:
        self.put_nowait(item)

    async def get(self) -> _Handed | None:
        if self.items:
            return self.items.popleft()
        if self.closed:
            return None
        waiter = asyncio.get_running_loop().create_future()
        self.idle.append(waiter)
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled() and waiter.result() is not None:
                self.items.appendleft(waiter.result())  # handed as it was cancelled
            raise

    def close(self) -> None:
        self.closed = True
        for waiter in self.idle:
            if not waiter.done():
                waiter.set_result(None)
        self.idle.clear()

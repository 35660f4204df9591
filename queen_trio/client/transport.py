"""Sending a :class:`~queen_trio.client.calls.Call`: failover across base URLs and retries
with jittered backoff, written once as a generator that yields what to do next
(:class:`Send` or :class:`Sleep`). The async and the sync client each drive it with their own
httpx client and sleep, so the policy cannot drift between the two.

What is retried:

* connection refused / connect timeout: the request never left, so any call is retried, on the
  next base URL first;
* 429: the broker refused before doing anything; retried after its Retry-After if that is
  within ``RetryPolicy.max_wait_s``;
* other transport errors (read timeout, connection dropped mid-answer) and 502/503/504: the
  request may have been applied, so only idempotent calls are retried (after a 503's
  Retry-After when it gives one within ``max_wait_s``, else the backoff).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Awaitable, Callable, Generator, Sequence
from typing import Any, Protocol, TypeVar

import httpx

from .. import strict_json
from ..models import codec
from .calls import Call, settled_here
from .errors import BrokerUnreachable, RateLimited, error_from_response
from .models import TransactionResult

T = TypeVar("T")
_NEVER_SENT = (httpx.ConnectError, httpx.ConnectTimeout)
_GATEWAY = (502, 503, 504)
_rng = random.Random()


@dataclasses.dataclass(frozen=True, slots=True)
class RetryPolicy:
    """``retries`` extra attempts after the first, sleeping a random time in
    ``[0, min(max_backoff_s, base_backoff_s * 2**n)]`` before retry ``n`` (full jitter, so
    clients that failed together don't come back together)."""

    retries: int = 3
    base_backoff_s: float = 0.05
    max_backoff_s: float = 2.0
    max_wait_s: float = 10.0  # the longest Retry-After we are willing to honour

    def backoff(self, n: int, rng: random.Random | None = None) -> float:
        return (rng or _rng).uniform(0, min(self.max_backoff_s, self.base_backoff_s * 2**n))


NO_RETRIES = RetryPolicy(retries=0)


class Reply(Protocol):
    """What a driver sends back for a :class:`Send`: an ``httpx.Response``, or the lean
    client's :class:`~queen_trio.client.wire.Answer` (the same names)."""

    status_code: int

    @property
    def text(self) -> str: ...

    @property
    def reason_phrase(self) -> str: ...

    @property
    def headers(self) -> Any: ...

    @property
    def content(self) -> bytes: ...

    def json(self) -> Any: ...


@dataclasses.dataclass(frozen=True, slots=True)
class Send:
    method: str
    url: str
    params: dict[str, Any] | None
    content: bytes | None  # the JSON body, encoded once for every attempt
    timeout: httpx.Timeout


@dataclasses.dataclass(frozen=True, slots=True)
class Sleep:
    seconds: float


class Endpoints:
    """The base URLs in order of preference; after a failover the one that answered is
    preferred until it fails in turn."""

    def __init__(self, urls: str | Sequence[str]) -> None:
        listed = [urls] if isinstance(urls, str) else list(urls)
        if not listed:
            raise ValueError("at least one broker URL is needed")
        for url in listed:
            if not isinstance(url, str) or not url.startswith(("http://", "https://")):
                raise ValueError(f"broker URL {url!r} must start with http:// or https://")
        self.urls = [u.rstrip("/") for u in listed]
        self.preferred = 0

    def rotate(self, failed: int) -> None:
        if self.preferred == failed:
            self.preferred = (failed + 1) % len(self.urls)


def exchange(
    call: Call[T], endpoints: Endpoints, policy: RetryPolicy, timeout: httpx.Timeout
) -> Generator[Send | Sleep, Reply | None, T | None]:
    """Run ``call`` to its result, yielding each request to send and each pause to take.

    The driver sends the :class:`Reply` to a :class:`Send` back in, or throws the
    :class:`httpx.TransportError` it raised. A body JSON or the broker cannot carry (NaN, an
    infinity, U+0000, an unpaired surrogate) raises :class:`~queen_trio.strict_json.JsonRefused`
    (a ValueError naming the value's path) before anything is sent; answers are decoded by the
    same strict decoder as the broker's requests.
    """
    content = call.content if call.content is not None else (
        None if call.body is None else strict_json.dumps(call.body))
    if call.extra_read_s:
        timeout = httpx.Timeout(timeout.connect, read=(timeout.read or 0) + call.extra_read_s,
                                write=timeout.write, pool=timeout.pool)
    causes: list[BaseException] = []
    tried: set[int] = set()
    # Every URL gets one chance even when retries are few.
    attempts = max(policy.retries + 1, len(endpoints.urls))
    for attempt in range(attempts):
        index = endpoints.preferred
        tried.add(index)
        send = Send(call.method, endpoints.urls[index] + call.path, call.params, content,
                    timeout)
        try:
            response = yield send
        except httpx.TransportError as exc:
            causes.append(exc)
            never_sent = isinstance(exc, _NEVER_SENT)
            endpoints.rotate(index)  # whatever the retry, the next attempt goes elsewhere
            if not (never_sent or call.idempotent) or attempt + 1 == attempts:
                raise _unreachable(call, causes, maybe_applied=not never_sent) from exc
            if endpoints.preferred in tried:  # a fresh URL is tried at once, a known one later
                yield Sleep(policy.backoff(attempt))
            continue
        assert response is not None
        status = response.status_code
        if status < 300:
            if status == 204 and call.empty is not None:
                result = call.empty()
            else:  # (parse raises for a verdict that refuses, e.g. a refused ack)
                quick = codec.FALLBACK if call.fast is None else call.fast(response.content)
                result = (call.parse(strict_json.loads(response.content))
                          if quick is codec.FALLBACK else quick)
            if not isinstance(result, TransactionResult) or result.committed:
                _record_settled(call)  # (a bundle that committed nothing settled nothing)
            return result
        error = error_from_response(response)
        if error.code in call.none_on:
            return None
        last = attempt + 1 == attempts
        if isinstance(error, RateLimited) and not last:
            wait = error.retry_after if error.retry_after is not None else policy.backoff(attempt)
            if wait <= policy.max_wait_s:
                yield Sleep(wait)
                continue
        if status in _GATEWAY and call.idempotent and not last:
            endpoints.rotate(index)
            asked = error.retry_after  # a 503 says when to come back
            yield Sleep(asked if asked is not None and asked <= policy.max_wait_s
                        else policy.backoff(attempt))
            continue
        raise error
    raise AssertionError("unreachable: the last attempt returns or raises")


def _record_settled(call: Call[Any]) -> None:
    settled = settled_here.get()
    if settled is not None:
        settled.update((msg.partition_id, msg.transaction_id) for msg in call.settles)


def _unreachable(call: Call[Any], causes: list[BaseException], *,
                 maybe_applied: bool) -> BrokerUnreachable:
    last = causes[-1]
    what = f"{call.method} {call.path}"
    if maybe_applied and not call.idempotent:
        message = (f"{what}: the connection failed after the request was sent ({last!r}); it "
                   "may or may not have been applied, and it is not safe to retry blindly")
    else:
        message = f"{what}: no broker answered after {len(causes)} attempt(s); last: {last!r}"
    return BrokerUnreachable(message, causes, maybe_applied=maybe_applied and not call.idempotent)


@dataclasses.dataclass(frozen=True, slots=True)
class Finished:
    value: Any


def _resume(
    steps: Generator[Send | Sleep, Any, Any], outcome: Reply | Exception | None
) -> Send | Sleep | Finished:
    """Feed the outcome of the previous step (a response, a transport error, or None after a
    sleep or at the start) and get the next step."""
    try:
        if isinstance(outcome, Exception):
            return steps.throw(outcome)
        return steps.send(outcome)
    except StopIteration as done:
        return Finished(done.value)


async def drive(
    steps: Generator[Send | Sleep, Any, T],
    send: Callable[[Send], Awaitable[Reply]],
    sleep: Callable[[float], Awaitable[None]],
) -> T:
    """Carry out :func:`exchange`'s steps with the client's own ``send`` and ``sleep``."""
    outcome: Reply | Exception | None = None
    while True:
        step = _resume(steps, outcome)
        if isinstance(step, Finished):
            return step.value
        if isinstance(step, Sleep):
            await sleep(step.seconds)
            outcome = None
            continue
        try:
            outcome = await send(step)
        except httpx.TransportError as exc:
            outcome = exc

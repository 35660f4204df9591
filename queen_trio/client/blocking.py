"""Running the SDK's coroutines to completion without an event loop.

The sync client executes the very same coroutines as the async one, with a sender and a sleep
that block instead of suspending. Such a coroutine never yields to an event loop, so one
``send(None)`` runs it to the end. This keeps a single copy of the retry and paging logic.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Coroutine, Iterator
from typing import Any, TypeVar

T = TypeVar("T")


def run_blocking(coro: Coroutine[Any, Any, T]) -> T:
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise RuntimeError("a blocking client step tried to suspend: it needs an event loop")


def iterate_blocking(items: AsyncIterator[T]) -> Iterator[T]:
    while True:
        try:
            yield run_blocking(items.__anext__())  # type: ignore[arg-type]
        except StopAsyncIteration:
            return

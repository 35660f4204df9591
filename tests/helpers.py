"""Small helpers shared by test modules."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import trio

T = TypeVar("T")


async def eventually(check: Callable[[], Awaitable[T | None]], timeout: float = 2.0) -> T:
    """Poll ``check`` until it returns something truthy, for at most ``timeout`` seconds."""
    with trio.fail_after(timeout):
        while True:
            result = await check()
            if result:
                return result
            await trio.sleep(0.05)

"""Small helpers shared by test modules."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import trio

if TYPE_CHECKING:
    from queen_trio.server import BrokerHandle

T = TypeVar("T")


async def eventually(check: Callable[[], Awaitable[T | None]], timeout: float = 2.0) -> T:
    """Poll ``check`` until it returns something truthy, for at most ``timeout`` seconds."""
    with trio.fail_after(timeout):
        while True:
            result = await check()
            if result:
                return result
            await trio.sleep(0.05)


async def parked(handle: BrokerHandle, n: int = 1, timeout: float = 10.0) -> None:
    """Return once ``n`` long-polls wait on the in-process broker ``handle`` (found nothing and
    parked), rather than sleep for a guess at how long that takes."""
    with trio.fail_after(timeout):
        while handle.context.wakeups.statistics().parked < n:
            await trio.sleep(0.01)


def explained(conn: Any, action: Callable[[], T]) -> tuple[T, list[str]]:
    """What ``action`` answers, and the plans of every statement it runs on the psycopg
    connection ``conn``, nested ones included (auto_explain, as notices)."""
    plans: list[str] = []
    conn.add_notice_handler(lambda d: plans.append(d.message_primary or ""))
    conn.execute("LOAD 'auto_explain'")
    for name, value in (("log_min_duration", "0"), ("log_nested_statements", "on"),
                        ("log_level", "notice")):
        conn.execute(f"SET auto_explain.{name} = {value}")
    answer = action()
    conn.execute("RESET auto_explain.log_min_duration")
    return answer, plans

"""Locks and semaphores (``POST /api/v1/locks``): the raw operations, and a held lock that
renews itself.

::

    async with queen.lock("daily-report", ttl="30s", timeout="1m") as lock:
        ...                                          # renewed in the background meanwhile
        await queen.transaction().guard(lock).push("reports", report).commit()

A permit expires if nobody renews it, and nobody tells a holder that was paused past its
lifetime. So a lock alone never makes two holders impossible; what makes their *work*
exclusive is the fencing ``token`` (it only rises on a lock: a resource that refuses a token
lower than the highest it has seen refuses a replaced holder) and, inside the broker, a
transaction guarded by the lock: it commits only while the permit is still this holder's.
A renew rewrites the permit, so the token changes at every renew: read ``lock.token`` when
you use it.
"""

from __future__ import annotations

import dataclasses
import math
import os
import random
import secrets
import socket
import threading
import time
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import anyio

from . import calls
from .durations import Duration, span_ms, ttl_seconds
from .errors import LockNotAcquired, LockNotHeld, QueenClientError
from .models import LockResult

if TYPE_CHECKING:
    from .api import BaseClient
    from .async_client import Client
    from .sync_client import SyncClient

R = TypeVar("R")
RELEASE_WITHIN_S = 5.0  # the release on leaving a block: bounded, so a dead broker cannot hang it


def mint_owner() -> str:
    """A holder's identity: host, process and a random part, one per handle."""
    return f"{socket.gethostname()[:100]}:{os.getpid()}:{secrets.token_hex(6)}"


class Locks(Generic[R]):
    """The four operations as the broker speaks them, with no state kept (the caller carries
    the token): ``queen.locks.acquire(name, ttl=…)``, ``.renew``, ``.release``, ``.get``.
    Each answers a :class:`LockResult`. ``queen.lock(name, …)`` is what most code wants."""

    def __init__(self, client: BaseClient[R]) -> None:
        self._client = client

    def acquire(self, name: str, *, ttl: Duration, owner: str | None = None,
                limit: int = 1) -> R:
        """Take a permit (``limit`` > 1: a semaphore of that many; every caller of one name
        passes the same limit). Not acquired is an answer (``reason`` held or contended)."""
        return self._client._call(calls.lock(calls.lock_op(
            "acquire", name, ttlSeconds=ttl_seconds(ttl, "ttl"), owner=owner,
            limit=None if limit == 1 else limit)))

    def renew(self, name: str, token: int, *, ttl: Duration, slot: int = 0,
              owner: str | None = None) -> R:
        """Extend a permit to now + ``ttl``; answers a new token, or ``reason`` lost."""
        return self._client._call(calls.lock(calls.lock_op(
            "renew", name, token=token, ttlSeconds=ttl_seconds(ttl, "ttl"), slot=slot,
            owner=owner)))

    def release(self, name: str, token: int, *, slot: int = 0) -> R:
        return self._client._call(calls.lock(calls.lock_op("release", name, token=token,
                                                           slot=slot)))

    def get(self, name: str) -> R:
        """Who holds the lock now (``holders``; falsy when nobody does)."""
        return self._client._call(calls.lock(calls.lock_op("get", name)))


class _Permit:
    """What a handle holds, shared by the async and the sync one."""

    def __init__(self, name: str, ttl: Duration, limit: int, timeout: Duration | None,
                 owner: str | None, renew: bool) -> None:
        self.name = name
        self.ttl_s = ttl_seconds(ttl, "ttl")
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"limit must be an int >= 1, got {limit!r}")
        self.limit = limit
        self.timeout_s = None if timeout is None else span_ms(timeout, "timeout") / 1000
        self.owner = owner or mint_owner()
        self.renews = renew
        self.granted: LockResult | None = None
        self.lost = False

    @property
    def held(self) -> bool:
        return self.granted is not None and not self.lost

    @property
    def token(self) -> int:
        return self._holding().token or 0

    @property
    def slot(self) -> int:
        return self._holding().slot or 0

    def guard(self) -> dict[str, Any]:
        """The KV op a transaction puts first to commit only while the permit is held."""
        guard = self._holding().guard
        assert guard is not None
        return guard

    def adopt(self, token: int) -> None:
        """The broker holds this handle's permit at ``token`` (a renew of ours whose answer
        has not reached us yet, seen by a guarded commit): hold it at that token."""
        held = self._holding()
        if token > (held.token or 0) and held.guard is not None:
            self.granted = dataclasses.replace(held, token=token,
                                               guard={**held.guard, "expect": token})

    def _holding(self) -> LockResult:
        if self.granted is None or self.lost:
            raise LockNotHeld(f"lock {self.name!r} is not held by this handle"
                              + (" (it was lost)" if self.lost else ""))
        return self.granted

    def poll_s(self) -> float:
        """Between attempts to acquire: a fraction of the lifetime, jittered so that waiters
        do not knock together."""
        return min(1.0, self.ttl_s / 4) * random.uniform(0.5, 1.0)

    def renew_every_s(self) -> float:
        return self.ttl_s / 3

    def refused(self, last: LockResult | None) -> LockNotAcquired:
        return LockNotAcquired(self.name, self.timeout_s, () if last is None else last.holders)

    def kept(self, result: LockResult) -> None:
        if result:
            self.granted = result
        else:
            self.lost = True


class Lock(_Permit):
    """A lock held by an async :class:`~queen_trio.client.Client` (``async with
    queen.lock(...) as lock``): acquired on entry (retrying until ``timeout``, None: no
    bound; :class:`LockNotAcquired` past it), renewed every third of ``ttl`` by a task of its
    own while the block runs, released on leaving it, whatever the exit. ``token``, ``slot``
    and ``guard()`` are the current permit's; ``held`` turns False if a renew finds the
    permit lost (it expired, or someone else has it), and the block is not interrupted:
    guard what must not happen twice."""

    def __init__(self, client: Client, name: str, ttl: Duration, *, limit: int = 1,
                 timeout: Duration | None = None, owner: str | None = None,
                 renew: bool = True) -> None:
        super().__init__(name, ttl, limit, timeout, owner, renew)
        self._locks: Locks[Any] = Locks(client)
        self._tasks: anyio.abc.TaskGroup | None = None
        self._stop = anyio.Event()

    async def acquire(self) -> Lock:
        """Take the permit (what entering the block does, without the renewing task)."""
        deadline = None if self.timeout_s is None else time.monotonic() + self.timeout_s
        while True:
            result = await self._locks.acquire(self.name, ttl=self.ttl_s, owner=self.owner,
                                               limit=self.limit)
            if result:
                self.granted, self.lost = result, False
                return self
            wait = self.poll_s()
            if deadline is not None and time.monotonic() + wait > deadline:
                raise self.refused(result)
            await anyio.sleep(wait)

    async def renew(self) -> bool:
        """Renew now; False (and ``held`` False) if the permit was lost."""
        held = self._holding()
        result = await self._locks.renew(self.name, held.token or 0, ttl=self.ttl_s,
                                         slot=self.slot, owner=self.owner)
        self.kept(result)
        return bool(result)

    async def release(self) -> None:
        """Give the permit back (nothing to do if it was lost)."""
        if self.held:
            held = self._holding()
            self.granted = None
            await self._locks.release(self.name, held.token or 0, slot=held.slot or 0)

    async def _keep(self) -> None:
        # Stopped by an event, not cancelled: a renew in flight finishes, so the release that
        # follows names the token the broker holds. A renew that fails for the network is
        # tried again at the next tick; once the lifetime has passed without one, it is lost.
        renewed_at = time.monotonic()
        while self.held:
            with anyio.move_on_after(self.renew_every_s()):
                await self._stop.wait()
            if self._stop.is_set():
                return
            try:
                await self.renew()
                renewed_at = time.monotonic()
            except QueenClientError:
                if time.monotonic() - renewed_at >= self.ttl_s:
                    self.lost = True

    async def __aenter__(self) -> Lock:
        await self.acquire()
        if self.renews:
            self._stop = anyio.Event()
            self._tasks = anyio.create_task_group()
            await self._tasks.__aenter__()
            self._tasks.start_soon(self._keep)
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            if self._tasks is not None:
                self._stop.set()
                await self._tasks.__aexit__(None, None, None)
                self._tasks = None
        finally:
            with anyio.move_on_after(RELEASE_WITHIN_S, shield=True):
                try:
                    await self.release()
                except QueenClientError:
                    pass  # it expires by itself


class SyncLock(_Permit):
    """:class:`Lock` for a :class:`~queen_trio.client.SyncClient` (``with queen.lock(...)``),
    renewed by a thread of its own while the block runs."""

    def __init__(self, client: SyncClient, name: str, ttl: Duration, *, limit: int = 1,
                 timeout: Duration | None = None, owner: str | None = None,
                 renew: bool = True) -> None:
        super().__init__(name, ttl, limit, timeout, owner, renew)
        self._locks: Locks[Any] = Locks(client)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def acquire(self) -> SyncLock:
        deadline = None if self.timeout_s is None else time.monotonic() + self.timeout_s
        while True:
            result = self._locks.acquire(self.name, ttl=self.ttl_s, owner=self.owner,
                                         limit=self.limit)
            if result:
                self.granted, self.lost = result, False
                return self
            wait = self.poll_s()
            if deadline is not None and time.monotonic() + wait > deadline:
                raise self.refused(result)
            time.sleep(wait)

    def renew(self) -> bool:
        held = self._holding()
        result = self._locks.renew(self.name, held.token or 0, ttl=self.ttl_s,
                                   slot=self.slot, owner=self.owner)
        self.kept(result)
        return bool(result)

    def release(self) -> None:
        if self.held:
            held = self._holding()
            self.granted = None
            self._locks.release(self.name, held.token or 0, slot=held.slot or 0)

    def _keep(self) -> None:
        renewed_at = time.monotonic()
        while self.held and not self._stop.wait(self.renew_every_s()):
            try:
                self.renew()
                renewed_at = time.monotonic()
            except QueenClientError:
                if time.monotonic() - renewed_at >= self.ttl_s:
                    self.lost = True

    def __enter__(self) -> SyncLock:
        self.acquire()
        if self.renews:
            self._stop.clear()
            self._thread = threading.Thread(target=self._keep, name=f"lock:{self.name}",
                                            daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=max(RELEASE_WITHIN_S, math.ceil(self.ttl_s)))
            self._thread = None
        try:
            self.release()
        except QueenClientError:
            pass  # it expires by itself

"""The broker's view of tenants: who a bearer token is, each tenant's plan and usage, and the
request-rate quota.

Plans and stored-byte figures are reloaded every second, and at once when the CLI changes a plan
(it NOTIFYs ``queen_tenants``), so a plan change reaches every running broker within a second.
Verified tokens are remembered for the same second, so a revoked token stops working within a
second too, without a database round trip on every request. Failed lookups are limited per
client address before they reach the database (:mod:`queen_trio.tenants.failures`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time

import trio

from ..db import Database, Listener
from ..db.transient import CountError, refresh_on_notify
from . import store, tokens
from .failures import FailedAuthLimiter
from .store import PLANS_CHANNEL, Plan

_REFRESH_S = 1.0
log = logging.getLogger(__name__)
_TOKEN_CACHE_S = 1.0


@dataclasses.dataclass
class _Bucket:
    tokens: float
    stamp: float


class AuthThrottled(Exception):
    """Too many failed authentications from this client address: retry after ``wait_s``."""

    def __init__(self, wait_s: float) -> None:
        super().__init__(f"retry after {wait_s:.3f} s")
        self.wait_s = wait_s


@dataclasses.dataclass(frozen=True, slots=True)
class TenantStatistics:
    plans: int  # tenants whose plan is loaded
    tokens: int  # tokens verified and remembered
    refreshes: int
    last_refresh_at: float | None  # trio clock


class TenantDirectory:
    """Plans, usage and verified tokens of every tenant; as a service (``run``) it reloads
    them on each NOTIFY of a plan change (from ``listener``) and at least every few seconds."""

    name = "tenants"

    def __init__(self, db: Database, default_tenant_id: int, listener: Listener, *,
                 max_message_bytes: int = 1024 * 1024, auth_failures_per_s: int = 10,
                 count_error: CountError | None = None) -> None:
        self._listener = listener
        self._alive = False
        self._refreshes = 0
        self._last_refresh_at: float | None = None
        self._max_message_bytes = max_message_bytes
        self._count_error = count_error
        self._db = db
        self.default_tenant_id = default_tenant_id
        self._plans: dict[int, Plan] = {}
        # token -> (tenant, verified until). Kept past that instant: a token verified once
        # is re-checked without spending its client's failure budget.
        self._tokens: dict[str, tuple[int, float]] = {}
        self._failures = FailedAuthLimiter(auth_failures_per_s)
        self._lookups: dict[str, trio.Event] = {}  # tokens being looked up now
        self._buckets: dict[int, _Bucket] = {}
        self.loaded = trio.Event()

    # -- the service ----------------------------------------------------------------------

    @property
    def alive(self) -> bool:
        return self._alive

    def statistics(self) -> TenantStatistics:
        return TenantStatistics(len(self._plans), len(self._tokens), self._refreshes,
                                self._last_refresh_at)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        await self.refresh()
        self._alive = True
        try:
            with self._listener.subscribe(PLANS_CHANNEL) as changes:
                task_status.started()
                # A plan changed (or MISSED): reload now. On an error the broker keeps serving
                # with the plans it has: a tenant row it cannot load never stops it.
                await refresh_on_notify(changes, self.refresh, period_s=_REFRESH_S, logger=log,
                                        service=self.name, what="tenant plans and usage",
                                        count=self._count_error)
        finally:
            self._alive = False

    async def refresh(self) -> None:
        plans = await self._db.run_transaction(store.fold_usage_and_load_plans)
        self._plans = {p.tenant_id: p for p in plans}
        self._refreshes += 1
        self._last_refresh_at = trio.current_time()
        self.loaded.set()

    # -- questions the API asks -----------------------------------------------------------

    def plan(self, tenant_id: int) -> Plan:
        plan = self._plans.get(tenant_id)
        if plan is None:  # created since the last refresh (at most a second ago): defaults
            plan = Plan(tenant_id, "", None, None, None, 0)
        return plan

    def tenant_named(self, name: str) -> int | None:
        """The id of the tenant called ``name`` (as of the last plan refresh), or None."""
        return next((p.tenant_id for p in self._plans.values() if p.name == name), None)

    async def authenticate(self, token: str, client: str = "") -> int | None:
        """The tenant of a bearer token, or None; :class:`AuthThrottled` when ``client`` (its
        address) has failed too often to be worth a database lookup now."""
        now = time.monotonic()
        cached = self._tokens.get(token)
        if cached is not None and cached[1] > now:
            return cached[0]
        if tokens.parse(token) is None:  # malformed: no row could match
            return None
        pending = self._lookups.get(token)
        if pending is not None:
            # The same token is being looked up already (a client's first burst of requests):
            # share that answer rather than spend a lookup, and a failure-bucket slot, each.
            await pending.wait()
            cached = self._tokens.get(token)
            if cached is not None:
                return cached[0]
            # It failed (known bad now: no lookup), or met trouble: ask on our own account.
            return await self.authenticate(token, client)
        if cached is None:
            if self._failures.known_bad(token):
                return None
            wait = self._failures.take(client)
            if wait is not None:
                raise AuthThrottled(wait)
        done = self._lookups[token] = trio.Event()
        try:
            tenant_id = await self._db.run_transaction(store.tenant_for_token, token)
        finally:
            del self._lookups[token]
            done.set()
        if tenant_id is None:
            self._tokens.pop(token, None)  # revoked: from now on, like any bad token
            self._failures.failed(token)
            return None
        if cached is None:
            self._failures.succeeded(client)
        if len(self._tokens) > 10_000:
            self._tokens.clear()
        self._tokens[token] = (tenant_id, now + _TOKEN_CACHE_S)
        return tenant_id

    def admit(self, tenant_id: int) -> float | None:
        """Take one request from the tenant's quota: None if admitted, else seconds to wait.

        A token bucket per tenant and per broker, refilled at the plan's rate with one second
        of burst.
        """
        rate = self.plan(tenant_id).requests_per_second
        if rate is None:
            return None
        now = time.monotonic()
        bucket = self._buckets.get(tenant_id)
        if bucket is None:
            bucket = self._buckets[tenant_id] = _Bucket(float(rate), now)
        bucket.tokens = min(float(rate), bucket.tokens + (now - bucket.stamp) * rate)
        bucket.stamp = now
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return None
        return (1.0 - bucket.tokens) / rate

    def over_storage_gate(self, tenant_id: int) -> bool:
        plan = self.plan(tenant_id)
        return plan.max_stored_bytes is not None and plan.stored_bytes >= plan.max_stored_bytes

    def message_ceiling(self, tenant_id: int) -> int:
        """QUEEN_MAX_MESSAGE_BYTES, or the tenant's plan's maxMessageBytes if lower."""
        plan = self.plan(tenant_id).max_message_bytes
        if plan is None:
            return self._max_message_bytes
        return min(self._max_message_bytes, plan)


def retry_after_header(seconds: float) -> str:
    return str(max(1, math.ceil(seconds)))

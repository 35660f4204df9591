"""Which tenant a request belongs to, and whether its plan lets the request in.

Every ``/api/`` request passes :func:`admit_request` before its handler: with QUEEN_AUTH=on the
bearer token selects the tenant (401 otherwise, with no hint why; 429 with Retry-After, before
any database lookup, for an address whose tokens failed too often); then the tenant's
request-rate quota applies (429 with Retry-After). ``/metrics`` shows every tenant's figures:
with auth on it takes a token of the operator tenant (:func:`require_operator`). Handlers that
add stored bytes call :func:`enforce_storage_gate` (403 ``storage_full`` past
``maxStoredBytes`` on every route, as Queen answers its occupancy quotas). A view decorated
with :func:`never_refused` skips quota and gate: cancelling a timer must always be possible,
or a tenant over its limits could not stop messages it no longer wants.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import trio
from quart import Request, current_app, g, request

from ..context import BrokerContext
from ..errors import Forbidden
from ..tenants.directory import AuthThrottled, retry_after_header
from ..tenants.tokens import bearer
from .common import broker as _broker
from .errors import ApiError

F = TypeVar("F", bound=Callable[..., object])
_NEVER_REFUSED = "_queen_never_refused"


def never_refused(view: F) -> F:
    """Exempt a route from the request-rate quota and the storage gate (not from auth)."""
    setattr(view, _NEVER_REFUSED, True)
    return view



async def admit_request(req: Request, broker: BrokerContext) -> None:
    """``req`` and ``broker``: the request and the app's broker (the hook has them at hand)."""
    rule = req.url_rule
    if rule is None or not req.path.startswith("/api/"):
        return
    if broker.settings.auth:
        tenant_id = await _bearer_tenant(req, broker)
    else:
        tenant_id = broker.tenants.default_tenant_id
    g.tenant_id = tenant_id
    if getattr(current_app.view_functions.get(rule.endpoint), _NEVER_REFUSED, False):
        return
    admit_tenant(broker, tenant_id)


def admit_tenant(broker: BrokerContext, tenant_id: int) -> None:
    """Take one request from the tenant's request-rate quota, or refuse it (429)."""
    wait = broker.tenants.admit(tenant_id)
    if wait is not None:
        raise ApiError(429, "rate_limited", "the tenant's request-rate quota is exhausted",
                       headers={"Retry-After": retry_after_header(wait)})


async def _bearer_tenant(req: Request, broker: BrokerContext) -> int:
    return await bearer_tenant(broker, req.headers.get("Authorization"), req.remote_addr or "")


async def bearer_tenant(broker: BrokerContext, authorization: str | None,
                        remote_addr: str) -> int:
    """The tenant of a request's ``Authorization`` header (QUEEN_AUTH=on), or its refusal:
    401, or 429 for an address whose tokens failed too often (answered after a pause)."""
    token = bearer(authorization)
    try:
        tenant_id = (None if token is None
                     else await broker.tenants.authenticate(token, remote_addr))
    except AuthThrottled as exc:
        broker.metrics.auth_refused.labels("throttled").inc()
        retry_after = retry_after_header(exc.wait_s)
        # Answered once that delay has passed: a connection that floods wrong tokens then
        # costs one cheap answer a second, not a core spent answering it back to back.
        await trio.sleep(int(retry_after))
        raise ApiError(429, "rate_limited",
                       "too many failed authentications from this address; retry later",
                       headers={"Retry-After": retry_after}) from None
    if tenant_id is None:
        broker.metrics.auth_refused.labels("unauthorized").inc()
        raise ApiError(401, "unauthorized", "a valid bearer token is required",
                       headers={"WWW-Authenticate": 'Bearer realm="queen-trio"'})
    return tenant_id


async def require_operator(req: Request, broker: BrokerContext) -> None:
    """With QUEEN_AUTH=on: a token of the operator tenant (QUEEN_OPERATOR_TENANT), else 401
    (no valid token) or 403 (another tenant's)."""
    if not broker.settings.auth:
        return
    tenant_id = await _bearer_tenant(req, broker)
    operator = broker.settings.operator_tenant
    if operator is None or broker.tenants.tenant_named(operator) != tenant_id:
        which = f"QUEEN_OPERATOR_TENANT={operator}" if operator else \
            "QUEEN_OPERATOR_TENANT, which is not set"
        raise ApiError(403, "forbidden",
                       f"{req.path} shows every tenant's figures: it takes a token of the "
                       f"operator tenant ({which}); a tenant's own figures are at "
                       "/api/v1/stats")


def _exempt() -> bool:
    view = current_app.view_functions.get(request.endpoint or "")
    return bool(getattr(view, _NEVER_REFUSED, False))


def current_tenant_id() -> int:
    return g.tenant_id


def enforce_storage_gate() -> None:
    """Refuse a write that would add storage while the tenant is over its gate: a
    :class:`~queen_trio.errors.Forbidden` (403; Queen never answers 507), a limit no retry gets
    past until something is consumed or deleted."""
    if not _exempt():
        storage_gate(_broker(), g.tenant_id)


def storage_gate(broker: BrokerContext, tenant_id: int) -> None:
    """:func:`enforce_storage_gate` for a route that is not exempt, outside a request context
    (:mod:`.fast`)."""
    if broker.tenants.over_storage_gate(tenant_id):
        raise Forbidden("storage_full",
                        "the tenant's stored bytes are at its plan's maxStoredBytes; reads, "
                        "acks and deletes still work")


def message_ceiling() -> int:
    return _broker().tenants.message_ceiling(g.tenant_id)

"""What a paused surface answers (:mod:`queen_trio.switches`), and the operator's route that
shows and flips the switches: ``GET|POST /api/v1/system/kv-timers`` (Queen's).

On the routes a pause is 503 with ``Retry-After: 1`` and the code ``kv_disabled`` or
``timers_disabled`` (in ``error`` and in ``reason``): come back later. Inside a transaction it
is 403 with the same code, permanent on purpose (a bundle retried in a loop against a paused
cell would be a storm on the hot path).
"""

from __future__ import annotations

from typing import Any

import trio
from quart import Blueprint, Response, request

from .. import switches
from ..context import BrokerContext
from ..switches import KV, TIMERS_FIRE, TIMERS_SCHEDULE
from .common import broker as _broker
from .common import json_response
from .errors import ApiError, read_json_object
from .tenancy import require_operator

switch_routes = Blueprint("switches", __name__, url_prefix="/api/v1/system")
# The longest a pause's answer waits for this broker's sweeper cycle in flight to end (a fire
# is bounded by its own 10 s; a cycle normally ends in milliseconds).
FIRE_SETTLE_S = 15.0

_PAUSED = {
    KV: ("kv_disabled", "the KV surface is paused by an operator (kv_enabled is off); retry "
                        "later"),
    TIMERS_SCHEDULE: ("timers_disabled", "scheduling timers is paused by an operator "
                                         "(timers_schedule_enabled is off); cancels and reads "
                                         "still work; retry later"),
}


def paused(name: str, *, status: int = 503) -> ApiError:
    code, message = _PAUSED[name]
    headers = {"Retry-After": str(switches.RETRY_AFTER_S)} if status == 503 else None
    return ApiError(status, code, message, headers=headers, reason=code)


# The checks take the broker the handler has fetched already: an attribute read, where one
# more look-up of the app's broker (a context-variable proxy) would cost more than the check.
def require_kv(broker: BrokerContext) -> None:
    """503 ``kv_disabled`` while the KV surface is paused."""
    if not broker.switches.kv:
        raise paused(KV)


def require_timers_schedule(broker: BrokerContext) -> None:
    """503 ``timers_disabled`` while scheduling timers is paused."""
    if not broker.switches.timers_schedule:
        raise paused(TIMERS_SCHEDULE)


# -- the operator's route ---------------------------------------------------------------------

# The body's fields (Queen's), each independent: an omitted one is left as it is.
_FIELDS = {"kv": KV, "timersSchedule": TIMERS_SCHEDULE, "timersFire": TIMERS_FIRE}


def _state_wire(state: dict[str, bool]) -> dict[str, Any]:
    return {"kvEnabled": state[KV], "timersScheduleEnabled": state[TIMERS_SCHEDULE],
            "timersFireEnabled": state[TIMERS_FIRE], "switches": state}


@switch_routes.get("/kv-timers")
async def show() -> Response:
    """The switches as the database has them now (what every broker applies within a
    second)."""
    broker = _broker()
    await require_operator(request._get_current_object(), broker)  # type: ignore[attr-defined]
    state = await broker.db.run_autocommit(switches.read)
    return json_response(_state_wire(state))


@switch_routes.post("/kv-timers")
async def flip() -> Response:
    broker = _broker()
    await require_operator(request._get_current_object(), broker)  # type: ignore[attr-defined]
    body = await read_json_object()
    unknown = set(body) - set(_FIELDS)
    if unknown:
        raise ApiError(400, "unknown_field",
                       f"this route takes kv, timersSchedule and timersFire, not "
                       f"{', '.join(sorted(unknown))}")
    if not body:
        raise ApiError(400, "missing_field",
                       "at least one of kv, timersSchedule, timersFire (boolean) is required")
    changes = {}
    for field, value in body.items():
        if not isinstance(value, bool):
            raise ApiError(400, "invalid_field", f"{field} must be true or false",
                           field=field)
        changes[_FIELDS[field]] = value
    state = await broker.db.run_transaction(switches.set_switches, changes)
    broker.switches.adopt(state)  # this broker at once; the others on the NOTIFY
    if not state[TIMERS_FIRE]:
        # A cycle this broker's sweeper started before the flip may still fire; the answer
        # waits for it, so nothing scheduled after a "paused" answer fires through this broker.
        # (Bounded: a cycle ends within its statement and its fire's own bounds.)
        with trio.move_on_after(FIRE_SETTLE_S):
            await broker.switches.fire_settled()
    return json_response({**_state_wire(state), "message": (
        "runtime switches updated; every broker applies them within a second"
        if state[TIMERS_FIRE] else
        "TIMER FIRE IS PAUSED: nothing is lost (due timers stay pending and fire, each once, "
        "when it is resumed), but no timer is being delivered")})

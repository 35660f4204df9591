"""Which tenant a request belongs to.

With QUEEN_AUTH=off (the only mode so far) every request is the ``default`` tenant; bearer-token
resolution replaces this function's body when authentication lands, and every route already
asks it.
"""

from __future__ import annotations

from quart import current_app

from ..context import BrokerContext


def current_tenant_id() -> int:
    broker: BrokerContext = current_app.config["BROKER"]
    return broker.default_tenant_id

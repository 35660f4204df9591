"""Operations of Queen's timer wire, as queen-mq builds them, for tests that send them by hand
(``POST /api/v1/timers`` and a transaction's ``timers`` array)."""

from __future__ import annotations

import base64
import json
from typing import Any


def timer_op(queue: str, key: str, delay_ms: int, payload: Any = None, *, op: str = "schedule",
             **extra: Any) -> dict[str, Any]:
    """One operation; a cancel takes no payload and no delay. ``txn`` defaults to one derived
    from the queue and key (the client mints it)."""
    if op == "cancel":
        return {"op": op, "queue": queue, "timerKey": key, **extra}
    return {"op": op, "queue": queue, "timerKey": key, "delayMs": delay_ms,
            "payload": base64.b64encode(json.dumps(payload).encode()).decode(),
            "txn": extra.pop("txn", f"txn-{queue}-{key}"), **extra}

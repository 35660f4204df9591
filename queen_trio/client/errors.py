"""What the SDK raises.

::

    QueenClientError
     ├── BrokerUnreachable     no broker answered (every URL tried, retries spent)
     ├── LockNotAcquired       ``queen.lock(...)`` did not get the lock within its timeout
     ├── LockNotHeld           a held lock's token or guard asked of a handle holding none
     └── ApiError              the broker answered with a JSON error: .status, .code, .message
          │                        (.reason: the precise code under a generic one, e.g.
          │                        "duplicate_timer" under "timers_bad_request")
          ├── BadRequest          400  the request was malformed or out of range
          ├── Unauthorized        401  missing or unknown bearer token
          ├── Forbidden           403  a limit no retry gets past (a timer beyond the horizon)
          │    └── StorageFull    403  the tenant's storage gate (code storage_full)
          ├── NotFound            404  no such message, lease, key, dead letter …
          ├── Conflict            409  the resource's state forbids it
          │    └── TransactionRefused  a transaction refused whole by the state it found (an
          │                        ack under a lost lease, a required lease not live): the
          │                        broker answers 200 success: false, as Queen's; .code the
          │                        reason, .failed_index the refused ack; nothing was written
          ├── PayloadTooLarge     413  above the message or timer payload ceiling
          ├── RateLimited         429  a quota or bound of the moment (``.retry_after`` seconds)
          └── ServerError         5xx  the broker or its database is in trouble (a 503 has
                                       ``.retry_after`` too)

Answers that are verdicts rather than failures are values, never exceptions: a cancel that
finds nothing is ``TimerStatus.ABSENT``, one that came too late is ``TimerStatus.TOO_LATE``,
peeking at a timer that is not pending or reading a missing KV key returns ``None``.
Invalid arguments (a bad duration, a schedule without a key) raise :class:`ValueError` before
any request is sent; so does a payload or value that JSON or the broker cannot carry (NaN, an
infinity, U+0000, an unpaired surrogate): :class:`queen_trio.strict_json.JsonRefused`, whose
``path`` names the value (``items[0].payload.price``). An integer beyond the range of a double
is refused by the broker instead (:class:`BadRequest`, code ``invalid_json_value``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .transport import Reply


class QueenClientError(Exception):
    """Base class of every error the SDK raises on purpose (ValueError aside)."""


class BrokerUnreachable(QueenClientError):
    """No broker answered. ``.causes`` holds the transport error of each attempt;
    ``.maybe_applied`` is True when a request that is not safe to repeat was sent and its
    answer lost (e.g. a push without transactionIds): it may or may not have taken effect."""

    def __init__(self, message: str, causes: list[BaseException], *,
                 maybe_applied: bool = False) -> None:
        super().__init__(message)
        self.causes = causes
        self.maybe_applied = maybe_applied


class LockNotAcquired(QueenClientError):
    """The lock stayed held by others for the whole ``timeout``; ``.holders`` says by whom
    (as the last attempt saw them)."""

    def __init__(self, name: str, timeout_s: float | None, holders: Any) -> None:
        super().__init__(f"lock {name!r} not acquired within {timeout_s}s: held by "
                         f"{[h.owner for h in holders] or 'others'}")
        self.name = name
        self.holders = tuple(holders)


class LockNotHeld(QueenClientError):
    """A handle that holds no permit (never acquired, released, or lost) was asked for its
    token or guard."""


class ApiError(QueenClientError):
    """The broker refused the request; ``code`` is its stable snake_case error code (the
    body's ``error``), ``message`` its text (``message``, else Queen's ``detail``)."""

    def __init__(self, status: int, code: str, message: str, body: dict[str, Any]) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.body = body
        reason = body.get("reason")
        self.reason: str | None = reason if isinstance(reason, str) else None

    @property
    def retry_after(self) -> float | None:
        """Seconds the broker asked us to wait (its ``Retry-After``), if it said."""
        value = self.body.get("retryAfter")
        return float(value) if isinstance(value, int | float) else None


class BadRequest(ApiError):
    pass


class Unauthorized(ApiError):
    pass


class NotFound(ApiError):
    pass


class Forbidden(ApiError):
    pass


class Conflict(ApiError):
    pass


class TransactionRefused(Conflict):
    """The broker refused the bundle whole: nothing of it was written (its acks, pushes, KV
    ops and timers). ``code`` says why (``lease_lost``, ``unresolvable``,
    ``already_committed``, ``not_delivered``), ``failed_index`` is the refused ack's place in
    the flat results (None when a required lease was not live). Queen answers this 200
    ``success: false`` (``status`` is 200), and its client raises it too; a lost KV
    precondition is an answer instead (:attr:`TransactionResult.precondition`)."""

    def __init__(self, body: dict[str, Any]) -> None:
        code, text = body.get("code"), body.get("error")
        super().__init__(200, code if isinstance(code, str) else "transaction_refused",
                         text if isinstance(text, str) else "the transaction was refused",
                         body)
        index = body.get("failedIndex")
        self.failed_index: int | None = index if isinstance(index, int) else None


class PayloadTooLarge(ApiError):
    pass


class RateLimited(ApiError):
    pass


class StorageFull(Forbidden):
    pass


class ServerError(ApiError):
    pass


_BY_STATUS: dict[int, type[ApiError]] = {
    400: BadRequest, 401: Unauthorized, 403: Forbidden, 404: NotFound, 409: Conflict,
    413: PayloadTooLarge, 429: RateLimited,
}


def error_from_response(response: Reply) -> ApiError:
    """The exception for a non-2xx answer, whether or not its body is the broker's JSON."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        body = {"message": response.text[:500]}
    retry_after = response.headers.get("Retry-After")
    if retry_after is not None and "retryAfter" not in body:
        try:
            body["retryAfter"] = float(retry_after)
        except ValueError:
            pass
    status = response.status_code
    cls = _BY_STATUS.get(status, ServerError if status >= 500 else ApiError)
    error = body.get("error")
    code = error if isinstance(error, str) else f"http_{status}"
    if code == "storage_full" and status == 403:  # the storage gate
        cls = StorageFull
    message = body.get("message")
    if not isinstance(message, str):
        message = body.get("detail")
    if not isinstance(message, str):
        message = response.reason_phrase
    return cls(status, code, message, body)

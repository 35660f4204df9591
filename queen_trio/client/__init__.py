"""The Python SDK: :class:`Client` (async; trio or asyncio) and :class:`SyncClient`.

::

    async with queen_trio.Client("http://127.0.0.1:6632") as queen:
        r = await queen.timer("reminders").key("trial-ending:42").delay("72h") \\
                       .payload({"accountId": 42}).schedule()

See README.md ("Python SDK") for the tour, docs/sdk.md for the rest, and
:mod:`queen_trio.client.errors` for the exceptions.
"""

from .api import DEFAULT_URL
from .async_client import Client
from .consumer import ConsumeStats
from .durations import delay_ms, format_ms, ttl_seconds
from .errors import (
    ApiError,
    BadRequest,
    BrokerUnreachable,
    Conflict,
    Forbidden,
    LockNotAcquired,
    LockNotHeld,
    NotFound,
    PayloadTooLarge,
    QueenClientError,
    RateLimited,
    ServerError,
    StorageFull,
    TransactionRefused,
    Unauthorized,
)
from .locks import Lock, SyncLock
from .models import (
    AckResult,
    AckStatus,
    Batch,
    DeadLetter,
    KvEntry,
    KvPage,
    KvPrecondition,
    KvRows,
    KvWrite,
    LockHolder,
    LockResult,
    Message,
    Page,
    PushResult,
    PushStatus,
    QueueConfig,
    Replayed,
    TimerInfo,
    TimerMark,
    TimerResult,
    TimerState,
    TimerStatus,
    TransactionResult,
)
from .sync_client import SyncClient
from .transport import NO_RETRIES, RetryPolicy

__all__ = [
    "DEFAULT_URL", "NO_RETRIES", "AckResult", "AckStatus", "ApiError", "BadRequest", "Batch",
    "BrokerUnreachable", "Client", "Conflict", "ConsumeStats", "DeadLetter", "Forbidden",
    "KvEntry", "KvPage", "KvPrecondition", "KvRows", "KvWrite", "Lock", "LockHolder",
    "LockNotAcquired", "LockNotHeld", "LockResult", "Message", "NotFound", "Page",
    "PayloadTooLarge", "PushResult", "PushStatus", "QueenClientError", "QueueConfig",
    "RateLimited", "Replayed", "RetryPolicy", "ServerError", "StorageFull", "SyncClient",
    "SyncLock",
    "TimerInfo", "TimerMark", "TimerResult", "TimerState", "TimerStatus", "TransactionRefused",
    "TransactionResult", "Unauthorized", "delay_ms", "format_ms", "ttl_seconds",
]

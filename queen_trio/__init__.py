"""queen-trio: a PostgreSQL-backed message broker on trio with durable, cancellable timers.

Every name of the Python SDK (:mod:`queen_trio.client`) is importable from here too:
``from queen_trio import Client, ApiError, TimerStatus``.
"""

from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING

try:
    __version__ = version("queen-trio")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"

if TYPE_CHECKING:
    from .client import (
        DEFAULT_URL,
        NO_RETRIES,
        AckResult,
        AckStatus,
        ApiError,
        BadRequest,
        Batch,
        BrokerUnreachable,
        Client,
        Conflict,
        ConsumeStats,
        DeadLetter,
        Forbidden,
        KvEntry,
        KvPage,
        KvPrecondition,
        KvRows,
        KvWrite,
        Lock,
        LockHolder,
        LockNotAcquired,
        LockNotHeld,
        LockResult,
        Message,
        NotFound,
        Page,
        PayloadTooLarge,
        PushResult,
        PushStatus,
        QueenClientError,
        QueueConfig,
        RateLimited,
        Replayed,
        RetryPolicy,
        ServerError,
        StorageFull,
        SyncClient,
        SyncLock,
        TimerInfo,
        TimerMark,
        TimerResult,
        TimerState,
        TimerStatus,
        TransactionRefused,
        TransactionResult,
        Unauthorized,
        delay_ms,
        format_ms,
        ttl_seconds,
    )

# The SDK's names (queen_trio.client.__all__, which tests/unit/test_client_exports.py checks
# against this) and the version.
__all__ = [
    "AckResult",
    "AckStatus",
    "ApiError",
    "BadRequest",
    "Batch",
    "BrokerUnreachable",
    "Client",
    "Conflict",
    "ConsumeStats",
    "DEFAULT_URL",
    "DeadLetter",
    "Forbidden",
    "KvEntry",
    "KvPage",
    "KvPrecondition",
    "KvRows",
    "KvWrite",
    "Lock",
    "LockHolder",
    "LockNotAcquired",
    "LockNotHeld",
    "LockResult",
    "Message",
    "NO_RETRIES",
    "NotFound",
    "Page",
    "PayloadTooLarge",
    "PushResult",
    "PushStatus",
    "QueenClientError",
    "QueueConfig",
    "RateLimited",
    "Replayed",
    "RetryPolicy",
    "ServerError",
    "StorageFull",
    "SyncClient",
    "SyncLock",
    "TimerInfo",
    "TimerMark",
    "TimerResult",
    "TimerState",
    "TimerStatus",
    "TransactionRefused",
    "TransactionResult",
    "Unauthorized",
    "delay_ms",
    "format_ms",
    "ttl_seconds",
    "__version__",
]


def __getattr__(name: str) -> object:
    # The SDK is imported on first use, so the broker's own imports stay as they were.
    if name in __all__:
        from . import client

        return getattr(client, name)
    raise AttributeError(f"module 'queen_trio' has no attribute {name!r}")

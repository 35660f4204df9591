"""queen-trio: a PostgreSQL-backed message broker on trio with durable, cancellable timers."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("queen-trio")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"

__all__ = ["Client", "SyncClient", "__version__"]


def __getattr__(name: str) -> object:
    # The SDK is imported on first use, so the broker's own imports stay as they were.
    if name in ("Client", "SyncClient"):
        from . import client

        return getattr(client, name)
    raise AttributeError(f"module 'queen_trio' has no attribute {name!r}")

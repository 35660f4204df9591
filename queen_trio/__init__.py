"""queen-trio: a PostgreSQL-backed message broker on trio with durable, cancellable timers."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("queen-trio")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]

"""PostgreSQL access for trio: the connection pool, the LISTEN connection and migrations."""

from .bridge import Connection
from .listener import MISSED, Listener, Notification
from .pool import Database, PoolStatistics

__all__ = ["MISSED", "Connection", "Database", "Listener", "Notification", "PoolStatistics"]

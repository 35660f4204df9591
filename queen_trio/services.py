"""One way to run a long-lived background service.

Every service the broker runs (the list in server.py) is a :class:`Service`: a ``name`` (its
label in ``queen_background_errors_total{service}``, and its key on /health where it is
reported there), ``alive`` (started and not ended), ``statistics()`` (what it has done so far),
and ``run()``, started with ``await nursery.start(service.run)`` in the broker's one nursery:
it reports ``started`` once it serves and runs until cancelled. What a service needs (the
database, the LISTEN connection, the metrics) is given to its constructor.

A service that does one step every so often is a :class:`Periodic` around that step: its
loop and how it meets errors are :func:`~queen_trio.db.transient.every`'s (both live
beside the errors they retry on).
"""

from __future__ import annotations

from typing import Any, Protocol

import trio

from .db.transient import Periodic, PeriodicStatistics


class Service(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def alive(self) -> bool: ...

    def statistics(self) -> object: ...

    async def run(self, *, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED
                  ) -> None: ...


__all__ = ["Periodic", "PeriodicStatistics", "Service"]

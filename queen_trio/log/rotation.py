"""Where each consumer group's next pop of a queue starts looking: after the partition this
broker last served it (queen.pop_walk, schema/functions/log.sql, walks the queue's partitions
by name from there and around).

Kept in memory, not in the database: a pointer written by every pop would be a row rewritten
per pop, which behind a held snapshot leaves a version per pop for the next pops to step over
(the ready set of an earlier branch did exactly that). Losing it costs nothing but the order:
a broker that restarts, or a key pushed out of the table, starts again from the first name;
several brokers each keep their own, and each serves every partition in turn.

Pops run in worker threads; a dict's get and set are atomic, and two pops racing to set the
same key leave one of two fresh values, either of which is a fine place to start.
"""

from __future__ import annotations

# Keys kept at most (tenant, queue, group); the oldest set goes first past this.
_CAPACITY = 50_000

_after: dict[tuple[int, str, str], str] = {}


def start_after(tenant_id: int, queue: str, group: str) -> str | None:
    """The partition the group's last pop of the queue served here (None: start at the
    first name)."""
    return _after.get((tenant_id, queue, group))


def served(tenant_id: int, queue: str, group: str, partition: str) -> None:
    """The group's pop of the queue served ``partition``: the next one starts after it."""
    key = (tenant_id, queue, group)
    _after.pop(key, None)  # (re-inserted last: the dict's order is the order of last use)
    _after[key] = partition
    if len(_after) > _CAPACITY:
        try:
            del _after[next(iter(_after))]
        except (KeyError, StopIteration, RuntimeError):
            pass  # another thread changed it meanwhile: the next call trims


def forget(tenant_id: int, queue: str, group: str) -> None:
    """Drop what the group's pops of the queue left here (a queue that never was: a
    connection's warm-up, queen_trio/timers/warmup.py)."""
    _after.pop((tenant_id, queue, group), None)

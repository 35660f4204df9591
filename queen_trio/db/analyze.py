"""Fresh planner statistics for tables that have outgrown theirs.

A connection keeps its plans: psycopg prepares the statements it runs often, PL/pgSQL caches
the plans of its functions, and either settles on one generic plan. A plan made while a table
held a handful of rows reads the table whole (a sequential scan is then the cheapest), and it
is kept until the table's statistics change, which autovacuum does up to a minute
(``autovacuum_naptime``) after the table has grown. A broker that starts on an empty database
and then takes a burst would pop, ack and fire through sequential scans of ever larger tables
for that minute: in a probe (50,000 frames pushed after a dozen pop-and-ack rounds on an
empty log), one more round took 240 ms instead of a few.

So every few seconds each broker asks PostgreSQL to analyze the queen tables that now hold more
than twice the rows their statistics describe (queen.analyze_grown_tables, in
schema/functions/ops.sql). ANALYZE invalidates every plan that depends on the table, on every
connection; a growing table is analyzed once per doubling, a steady one never. (A cancel's or a
peek's look-ups do not wait for this: :func:`queen_trio.timers.store._planned_now` plans them
at each use.)

Why not ``enable_seqscan = off`` on the functions instead, as queen.schedule_timers has for its
per-timer probes (schema/functions/timers.sql): tried on the fire's functions, it replaced the
sequential scans of small tables with full scans of an unrelated index (queen.partitions walked
by its primary key, a name filter on every entry), which is worse than a sequential scan once
the table is large, and it made an idle single-timer sweep slower.
"""

from __future__ import annotations

import logging
from typing import Any

from . import queries
from .pool import Database
from .rows import DictConnection
from .transient import CountError, Periodic

Q = queries.load("ops")
log = logging.getLogger(__name__)

ANALYZE_INTERVAL_S = 2.0
# Below this many rows more than its statistics say, a table is not worth an ANALYZE.
SLACK_ROWS = 1000


def analyze_grown_tables(raw: DictConnection,
                         slack: int = SLACK_ROWS) -> list[dict[str, Any]]:
    """ANALYZE every queen table that outgrew its statistics; the tables analyzed."""
    rows = raw.execute(Q.analyze_grown_tables, {"slack": slack}).fetchall()
    for row in rows:
        log.info("analyzed %s: %d rows, statistics had %d", row["table_name"],
                 row["live_rows"], max(row["rows_before"], 0))
    return rows


def analyzer(db: Database, *, interval_s: float = ANALYZE_INTERVAL_S,
             count_error: CountError | None = None) -> Periodic:
    """The service: :func:`analyze_grown_tables` every ``interval_s``."""
    return Periodic("analyzer", interval_s, lambda: db.run_transaction(analyze_grown_tables),
                    what="statistics check", count_error=count_error)

"""Timers written straight into ``queen.timers`` in SQL (generate_series), for the scale
benches (``bench.timer_scale``, ``bench.burst_scan``): ten million rows in a minute or two,
where the broker's own statement takes an hour on this machine."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable

import psycopg

FILL_CONNECTIONS = 2
SQL_FILL_CHUNK = 500_000
SQL_FILL = """
WITH tenant AS (SELECT tenant_id FROM queen.tenants WHERE name = 'default'),
queue AS (
    INSERT INTO queen.queues (tenant_id, name) SELECT tenant_id, %(queue)s FROM tenant
    ON CONFLICT (tenant_id, name) DO NOTHING
), rows AS (
    INSERT INTO queen.timers (tenant_id, queue, timer_key, partition, txn, message_id,
                              payload, payload_zstd, payload_bytes, deliver_at, visible_at)
    SELECT t.tenant_id, %(queue)s, %(prefix)s || '-' || lpad(g::text, 7, '0'), 'Default',
           u.id::text, u.id, convert_to(p.text, 'UTF8'), false, octet_length(p.text), d.at, d.at
    FROM tenant t, generate_series(%(lo)s::bigint, %(hi)s::bigint - 1) AS g,
         LATERAL (SELECT '{"i":' || g || '}' AS text) p,
         -- time-ordered as the broker mints them (uuid7: the clock's milliseconds first), not
         -- random: a txn is a key of the log's frames_transaction index
         LATERAL (SELECT (lpad(to_hex((extract(epoch FROM clock_timestamp()) * 1000)::bigint),
                               12, '0') || '7' || substr(md5(g::text || random()::text), 1, 19)
                         )::uuid AS id) u,
         LATERAL (SELECT now() + make_interval(secs => (%(base_ms)s + %(step_ms)s * g) / 1000.0)
                  AS at) d
    RETURNING payload_bytes
)
INSERT INTO queen.usage_deltas (tenant_id, bytes)
SELECT (SELECT tenant_id FROM tenant), sum(payload_bytes) FROM rows"""


def sql_fill(url: str, queue: str, count: int, *, base_ms: int, step_ms: int, prefix: str,
             chunk: int = SQL_FILL_CHUNK, connections: int = FILL_CONNECTIONS) -> float:
    """``count`` timers in SQL (generate_series), rows of the shape queen.schedule_timers
    writes (a plain JSON payload, a txn and a message id each): due ``base_ms + step_ms * i``
    from each statement's start. ``chunk`` rows a statement on ``connections`` connections;
    timers/s. For the 10^7 fill, which the broker's statement takes an hour to write on this
    machine."""
    t0 = time.perf_counter()

    def worker(part: int) -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            for lo in range(part * chunk, count, chunk * connections):
                hi = min(count, lo + chunk)
                conn.execute(SQL_FILL, {"queue": queue, "prefix": prefix, "lo": lo,
                                        "hi": hi, "base_ms": base_ms, "step_ms": step_ms})
                print(f"  {prefix}: rows {lo:,}-{hi:,} written, "
                      f"{hi / (time.perf_counter() - t0):,.0f}/s", file=sys.stderr)

    in_parts(connections, worker)
    return count / (time.perf_counter() - t0)


def in_parts(parts: int, worker: Callable[[int], None]) -> None:
    """``worker(0)`` … ``worker(parts - 1)`` on threads of their own (a connection each), all
    to their end; the first exception raised in any is raised here."""
    errors: list[BaseException] = []

    def run(part: int) -> None:
        try:
            worker(part)
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(p,)) for p in range(parts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]

-- Reads by offset and partition discovery (queen_trio/log/reads.py): Queen's POST /api/v1/fetch
-- and POST /api/v1/partitions/changed. Read-only: no lease, no cursor, nothing written.

-- name: fetch_bounds
-- Each asked (queue, partition), in order: whether the queue exists for this tenant, and the
-- partition's id and bounds (none yet: an empty log).
SELECT w.i, q.queue_id, p.partition_id, coalesce(p.log_start, 0) AS log_start,
       coalesce(p.next_offset, 0) AS high
FROM unnest(%(queues)s::text[], %(partitions)s::text[]) WITH ORDINALITY AS w(queue, partition, i)
LEFT JOIN queen.queues q ON q.tenant_id = %(tenant_id)s AND q.name = w.queue
LEFT JOIN queen.partitions p ON p.queue_id = q.queue_id AND p.name = w.partition
ORDER BY w.i

-- name: safe_time
-- The instant no frame still to be committed can be stamped at or before: frames carry their
-- writer's transaction start (created_at DEFAULT now()), so the oldest transaction open in any
-- other session is a floor under every created_at to come; `guard_s` covers the lag with which
-- a session that just began shows in pg_stat_activity. A session of a role this one may not
-- see is masked (state and xact_start both null): then nothing can be said, and the answer
-- falls back to now() - floor_s, marked degraded. Read before any table (reads.py): each later
-- statement sees a later snapshot, so a partition the answer misses was written at or after it.
WITH s AS MATERIALIZED (
    SELECT a.xact_start, a.state
    FROM pg_stat_activity a
    WHERE a.pid <> pg_backend_pid()
      AND (a.backend_type = 'client backend' OR a.backend_type IS NULL)
)
SELECT CASE WHEN m.masked > 0 THEN now() - make_interval(secs => %(floor_s)s)
            ELSE least(now() - make_interval(secs => %(guard_s)s),
                       coalesce((SELECT min(x.xact_start) FROM s x), now())) END AS safe_time,
       m.masked > 0 AS degraded
FROM (SELECT count(*) AS masked FROM s WHERE s.state IS NULL AND s.xact_start IS NULL) m

-- name: queue_id
SELECT queue_id FROM queen.queues WHERE tenant_id = %(tenant_id)s AND name = %(name)s

-- name: partitions_by_name
-- Every partition of a queue, by name, from after `after` (a page of the full enumeration).
-- A partition's last write is the creation time of its last frame (head, else the segment
-- ending there); when retention dropped everything, the partition's own creation.
SELECT p.partition_id, p.name, p.next_offset - 1 AS last_offset, p.log_start, w.at
FROM queen.partitions p
CROSS JOIN LATERAL (SELECT coalesce(
    (SELECT f.created_at FROM queen.frames f
     WHERE f.partition_id = p.partition_id AND f."offset" = p.next_offset - 1),
    (SELECT s.last_created_at FROM queen.segments s
     WHERE s.partition_id = p.partition_id AND s.last_offset = p.next_offset - 1),
    p.created_at) AS at) w
WHERE p.queue_id = %(queue_id)s
  AND (%(after)s::text IS NULL OR p.name > %(after)s)
ORDER BY p.name
LIMIT %(limit)s

-- name: partitions_since
-- The partitions of a queue last written at or after `since`, by (last write, name), from
-- after the cursor (`after_at`, `after`). The last write is computed per partition (no column
-- keeps it): a pass costs one probe of each partition of the queue.
SELECT p.partition_id, p.name, p.next_offset - 1 AS last_offset, p.log_start, w.at
FROM queen.partitions p
CROSS JOIN LATERAL (SELECT coalesce(
    (SELECT f.created_at FROM queen.frames f
     WHERE f.partition_id = p.partition_id AND f."offset" = p.next_offset - 1),
    (SELECT s.last_created_at FROM queen.segments s
     WHERE s.partition_id = p.partition_id AND s.last_offset = p.next_offset - 1),
    p.created_at) AS at) w
WHERE p.queue_id = %(queue_id)s
  AND w.at >= %(since)s
  AND (%(after_at)s::timestamptz IS NULL OR (w.at, p.name) > (%(after_at)s, %(after)s::text))
ORDER BY w.at, p.name
LIMIT %(limit)s

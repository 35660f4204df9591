-- Log housekeeping (queen_trio/log/housekeeping.py): sealing the head into segments, and
-- retention. Reads of segments are in log.sql with the rest of the read path.

-- name: seal_candidates
-- Partitions whose oldest head frame is past min_age and which hold a full segment of such
-- frames (probed at one offset: created_at grows with the offset), a segment's worth of bytes,
-- or a frame past max_age (a quiet partition). The byte check reads at most max_frames rows of
-- a partition and only runs when the cheap checks did not already decide.
SELECT p.partition_id
FROM queen.partitions p
CROSS JOIN LATERAL (
    SELECT f."offset", f.created_at FROM queen.frames f
    WHERE f.partition_id = p.partition_id ORDER BY f."offset" LIMIT 1
) h
WHERE h.created_at <= now() - make_interval(secs => %(min_age_s)s)
  AND CASE
        WHEN h.created_at <= now() - make_interval(secs => %(max_age_s)s) THEN true
        WHEN EXISTS (SELECT 1 FROM queen.frames f
                     WHERE f.partition_id = p.partition_id
                       AND f."offset" = h."offset" + %(max_frames)s - 1
                       AND f.created_at <= now() - make_interval(secs => %(min_age_s)s))
            THEN true
        ELSE (SELECT sum(f.size_bytes) FROM queen.frames f
              WHERE f.partition_id = p.partition_id
                AND f."offset" >= h."offset" AND f."offset" < h."offset" + %(max_frames)s
                AND f.created_at <= now() - make_interval(secs => %(min_age_s)s)
             ) >= %(max_bytes)s
      END
ORDER BY h.created_at
LIMIT %(limit)s

-- name: try_lock_partition
-- One housekeeper at a time per partition (brokers share the database); the others skip it.
SELECT pg_try_advisory_xact_lock(%(lock_space)s, hashtext(%(partition_id)s::text)) AS locked

-- name: head_to_seal
-- The head's oldest frames. Offsets are taken under the partition row lock and committed with
-- next_offset, so every frame this snapshot sees is below the committed next_offset: nothing
-- here is still being written. JSON stays text: a segment stores it as the head does. Offsets
-- are dense, so the first max_frames frames are an offset range: never more rows are read,
-- however long the head and whatever plan is chosen.
SELECT f."offset", f.transaction_id, f.payload::text AS payload_json, f.size_bytes,
       (extract(epoch FROM f.created_at) * 1000000)::bigint AS created_us,
       f.meta::text AS meta_json, p.tenant_id, p.head_start, p.now_us
FROM (
    SELECT p.tenant_id, p.next_offset,
           -- where the head must start: right after the last segment
           coalesce((SELECT max(s.last_offset) + 1 FROM queen.segments s
                     WHERE s.partition_id = p.partition_id), p.log_start) AS head_start,
           (extract(epoch FROM now()) * 1000000)::bigint AS now_us
    FROM queen.partitions p
    WHERE p.partition_id = %(partition_id)s
    OFFSET 0  -- computed once, not once per frame
) p
JOIN queen.frames f
  ON f.partition_id = %(partition_id)s
 AND f."offset" >= p.head_start
 AND f."offset" < least(p.next_offset, p.head_start + %(max_frames)s)
ORDER BY f."offset"

-- name: insert_segment
INSERT INTO queen.segments (partition_id, first_offset, last_offset, tenant_id, frame_count,
                            raw_bytes, stored_bytes, first_created_at, last_created_at,
                            transaction_ids, transaction_hashes, codec, data)
SELECT %(partition_id)s, %(first_offset)s, %(last_offset)s, %(tenant_id)s, %(frame_count)s,
       %(raw_bytes)s, octet_length(%(data)b::bytea), %(first_created_at)s, %(last_created_at)s,
       t.ids, ARRAY(SELECT hashtextextended(x, 0) FROM unnest(t.ids) AS x), %(codec)s,
       %(data)b::bytea
FROM (SELECT %(transaction_ids)b::text[] AS ids) AS t
RETURNING stored_bytes

-- name: delete_sealed_head
DELETE FROM queen.frames
WHERE partition_id = %(partition_id)s AND "offset" BETWEEN %(first_offset)s AND %(last_offset)s

-- name: retention_candidates
-- Partitions whose oldest segment retention may drop (queen.segment_droppable in
-- schema/functions/ops.sql: retentionSeconds / ttl, completedRetentionSeconds,
-- maxWaitTimeSeconds).
SELECT p.partition_id
FROM queen.queues q
JOIN queen.partitions p USING (queue_id)
CROSS JOIN LATERAL (
    SELECT s.last_offset, s.last_created_at FROM queen.segments s
    WHERE s.partition_id = p.partition_id ORDER BY s.first_offset LIMIT 1
) oldest
WHERE ((q.retention_enabled AND (q.retention_s > 0 OR q.ttl_s > 0 OR q.completed_retention_s > 0))
       OR q.max_wait_s > 0)
  AND queen.segment_droppable(q, p.partition_id, oldest.last_offset, oldest.last_created_at)
LIMIT %(limit)s

-- name: droppable_segments
-- Retention's decision for one partition, under its row lock (log_start changes with it).
SELECT s.first_offset, s.last_offset, s.frame_count, p.log_start, p.tenant_id
FROM queen.partitions p
JOIN queen.queues q USING (queue_id)
JOIN queen.segments s ON s.partition_id = p.partition_id
WHERE p.partition_id = %(partition_id)s
  AND queen.segment_droppable(q, p.partition_id, s.last_offset, s.last_created_at)
ORDER BY s.first_offset
FOR NO KEY UPDATE OF p

-- name: advance_log_start
UPDATE queen.partitions SET log_start = %(log_start)s
WHERE partition_id = %(partition_id)s AND log_start < %(log_start)s

-- name: drop_segments
-- Only segments log_start has passed (the immutability trigger checks it too).
DELETE FROM queen.segments
WHERE partition_id = %(partition_id)s AND last_offset < %(log_start)s
RETURNING stored_bytes

-- name: head_cut_candidates
-- Partitions with nothing retained before their head (every segment dropped, or none yet)
-- whose oldest head frame retention may drop: data not yet sealed ages out like sealed data.
SELECT p.partition_id
FROM queen.queues q
JOIN queen.partitions p USING (queue_id)
CROSS JOIN LATERAL (
    SELECT f."offset", f.created_at FROM queen.frames f
    WHERE f.partition_id = p.partition_id ORDER BY f."offset" LIMIT 1
) h
WHERE ((q.retention_enabled AND (q.retention_s > 0 OR q.ttl_s > 0 OR q.completed_retention_s > 0))
       OR q.max_wait_s > 0)
  AND h."offset" = p.log_start
  -- No rule drops a frame younger than the queue's shortest limit: most partitions stop here,
  -- before the function is called.
  AND h.created_at <= now() - make_interval(secs => least(
        nullif(q.retention_s, 0), nullif(q.ttl_s, 0), nullif(q.completed_retention_s, 0),
        nullif(q.max_wait_s, 0)))
  AND queen.segment_droppable(q, p.partition_id, h."offset", h.created_at)
LIMIT %(limit)s

-- name: droppable_head
-- The head's oldest frames from log_start, each with the newest creation time of the run up to
-- it (a run is aged by its newest frame, as a segment is), under the partition's row lock
-- (log_start changes with it). At most max_frames rows: an offset range.
WITH p AS (
    SELECT p.partition_id, p.log_start, p.tenant_id, p.queue_id
    FROM queen.partitions p
    WHERE p.partition_id = %(partition_id)s
    FOR NO KEY UPDATE
)
SELECT f."offset", f.size_bytes, p.log_start, p.tenant_id, p.queue_id,
       max(f.created_at) OVER (ORDER BY f."offset") AS newest
FROM p
JOIN queen.frames f
  ON f.partition_id = p.partition_id
 AND f."offset" >= p.log_start AND f."offset" < p.log_start + %(max_frames)s
ORDER BY f."offset"

-- name: run_droppable
-- Retention's verdict on the head run from log_start to `offset` (queen.segment_droppable).
SELECT queen.segment_droppable(q, %(partition_id)s, %(offset)s, %(newest)s) AS droppable
FROM queen.queues q
WHERE q.queue_id = %(queue_id)s

-- name: drop_head
DELETE FROM queen.frames
WHERE partition_id = %(partition_id)s AND "offset" < %(log_start)s
